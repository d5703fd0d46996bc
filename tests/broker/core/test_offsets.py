"""OffsetService on a real store: the never-committed rule, checked commits, searches by time
and resets (committed offsets and pop cursors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.core.offsets import RESET_TO_END, Boundary, OffsetReset
from protocol.codes import ResponseCode
from protocol.errors import BrokerError
from tests.broker.core.support import core_broker, create, pop, put

G = "offsets_group"


def code_of(info: pytest.ExceptionInfo[BrokerError]) -> int | None:
    return info.value.code


async def test_never_committed_is_zero_while_message_zero_is_stored(tmp_path: Path) -> None:
    async with core_broker(tmp_path, segment_size=4096) as broker:
        create(broker, "T", 2)
        offsets = broker.offsets
        put(broker, "T", b"first")
        assert offsets.committed(G, "T", 0) == 0
        assert offsets.committed(G, "T", 1) == 0  # a queue that never held a message
        with pytest.raises(BrokerError) as info:
            offsets.committed(G, "T", 0, zero_if_never=False)  # 5.x: "maybe boot first"
        assert code_of(info) == ResponseCode.QUERY_NOT_FOUND
        for i in range(60):
            put(broker, "T", b"filler %d" % i + b"." * 200)
        await broker.storage.flush_once()
        assert broker.store.delete_expired(broker.clock.now_s() + 365 * 86400, scheduled=True)
        assert offsets.min_offset("T", 0) > 0
        with pytest.raises(BrokerError) as info:
            offsets.committed(G, "T", 0)  # message 0 is gone: the client picks its start
        assert code_of(info) == ResponseCode.QUERY_NOT_FOUND
        offsets.commit(G, "T", 0, 0)
        assert offsets.committed(G, "T", 0) == 0  # a real commit is always answered


async def test_commit_checks_the_queue_and_ignores_negative_offsets(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        create(broker, "T", 2)
        offsets = broker.offsets
        offsets.commit(G, "T", 1, 4)
        offsets.commit(G, "T", 1, -1)  # the JavaScript client's "no position yet"
        assert offsets.committed(G, "T", 1) == 4
        for topic, queue_id, code in (
            ("Nope", 0, ResponseCode.TOPIC_NOT_EXIST),
            ("T", 2, ResponseCode.INVALID_PARAMETER),
            ("T", -1, ResponseCode.INVALID_PARAMETER),
        ):
            with pytest.raises(BrokerError) as info:
                offsets.commit(G, topic, queue_id, 1)
            assert code_of(info) == code


async def test_search_by_time_lower_and_upper(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        create(broker, "T")
        for i in range(3):
            put(broker, "T", b"m%d" % i)
        offsets = broker.offsets
        first = offsets.earliest_store_time("T", 0)
        assert first > 0
        assert offsets.search("T", 0, 0, Boundary.LOWER) == 0
        assert offsets.search("T", 0, 2**62, Boundary.LOWER) == 3  # after all: the max
        # UPPER picks the last message of the millisecond, LOWER the first.
        lower = offsets.search("T", 0, first, Boundary.LOWER)
        upper = offsets.search("T", 0, first, Boundary.UPPER)
        assert lower == 0 and lower <= upper <= 2
        assert offsets.earliest_store_time("T", 1) == -1


async def test_reset_moves_offsets_and_existing_pop_cursors(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        create(broker, "T", 2)
        for i in range(3):
            put(broker, "T", b"m%d" % i)
        assert len(pop(broker, G, "T").leases) == 3  # the group's cursor on queue 0 is 3
        offsets = broker.offsets
        assert offsets.reset(OffsetReset(G, "T", timestamp=0, force=True)) == {0: 0, 1: 0}
        assert broker.pop.table.cursor(G, "T", 0) == 0
        assert broker.pop.table.cursor(G, "T", 1) is None  # never popped: no cursor made
        assert [lease.offset for lease in pop(broker, G, "T").leases] == [0, 1, 2]
        # Forward needs force; an explicit offset targets one queue.
        offsets.commit(G, "T", 0, 1)
        assert offsets.reset(OffsetReset(G, "T", RESET_TO_END, force=False)) == {0: 1, 1: 0}
        assert offsets.reset(OffsetReset(G, "T", RESET_TO_END, force=True)) == {0: 3, 1: 0}
        reset = OffsetReset(G, "T", timestamp=0, force=True, queue_id=0, offset=2)
        assert offsets.reset(reset) == {0: 2}
        assert offsets.committed(G, "T", 0) == 2


async def test_reset_refuses_unknown_topics_and_queues(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        create(broker, "T", 2)
        for reset, code in (
            (OffsetReset(G, "Nope", 0, True), ResponseCode.TOPIC_NOT_EXIST),
            (OffsetReset(G, "T", 0, True, queue_id=2), ResponseCode.INVALID_PARAMETER),
        ):
            with pytest.raises(BrokerError) as info:
                broker.offsets.reset(reset)
            assert code_of(info) == code
