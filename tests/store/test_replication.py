"""The store's side of replication: a replica's log is the master's, byte for byte, at the
same offsets, whatever the batches' cuts; its queues serve the same records (docs §13)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.store.api import FlushMode, GetStatus, MessageToStore, PutStatus, StoreError
from broker.store.config import StoreConfig
from broker.store.store import REPLICA_REFUSAL, MessageStore
from tests.store.support import crash, read_queue, store_config

TOPICS = ("TopicA", "TopicB")


def _replica_config(path: Path, mode: FlushMode = FlushMode.ASYNC) -> StoreConfig:
    return dataclasses.replace(store_config(path, mode), replica=True)


def _fill(master: MessageStore, bodies: list[bytes]) -> None:
    for i, body in enumerate(bodies):
        result = master.put_nowait(MessageToStore(TOPICS[i % 2], i % 3, body, {"TAGS": f"t{i}"}))
        assert result.ok


def _ship(master: MessageStore, replica: MessageStore, cuts: list[int], start: int = 0) -> None:
    """Stream the master's log into the replica in pieces cut at ``cuts``, as the HA link
    does (pieces not aligned to records; the replica keeps what it cannot take yet)."""
    offset, pending = start, bytearray()
    sizes = iter(cuts or [4096])
    for _ in range(100_000):
        if offset >= master.replicable_end:
            break
        chunk = master.log_bytes(offset, max(1, next(sizes, 4096)))
        pending += chunk
        taken = replica.append_replicated(offset + len(chunk) - len(pending), pending)
        del pending[:taken]
        offset += len(chunk)
    assert not pending
    assert replica.log.end == master.log.end


def _log(store: MessageStore) -> bytes:
    parts, pos = [], store.log.min_offset
    while pos < store.log.end:
        parts.append(store.log.read_some(pos, 1 << 20))
        pos += len(parts[-1])
    return b"".join(parts)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    bodies=st.lists(st.binary(min_size=0, max_size=1500), min_size=1, max_size=30),
    cuts=st.lists(st.integers(min_value=1, max_value=3000), max_size=40),
)
def test_a_replica_holds_the_masters_log_at_the_same_offsets(
    tmp_path_factory: pytest.TempPathFactory, bodies: list[bytes], cuts: list[int]
) -> None:
    root = tmp_path_factory.mktemp("repl")
    with (
        MessageStore.open(store_config(root / "m")) as master,
        MessageStore.open(_replica_config(root / "r")) as replica,
    ):
        _fill(master, bodies)
        _ship(master, replica, cuts)
        assert _log(replica) == _log(master)
        for topic in TOPICS:
            for queue_id in range(3):
                assert read_queue(replica, topic, queue_id) == read_queue(master, topic, queue_id)
                got_m = master.get(topic, queue_id, 0, 64)
                got_r = replica.get(topic, queue_id, 0, 64)
                assert got_r.body == got_m.body
                assert got_r.commit_log_offsets == got_m.commit_log_offsets


def test_a_replica_refuses_puts_and_bytes_at_the_wrong_offset(tmp_path: Path) -> None:
    with (
        MessageStore.open(store_config(tmp_path / "m")) as master,
        MessageStore.open(_replica_config(tmp_path / "r")) as replica,
    ):
        refused = replica.put_nowait(MessageToStore("TopicA", 0, b"x"))
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert refused.remark == REPLICA_REFUSAL
        _fill(master, [b"a" * 100, b"b" * 100])
        data = master.log_bytes(0, 10_000)
        with pytest.raises(StoreError, match="ends at 0"):
            replica.append_replicated(1, data[1:])
        broken = bytearray(data)
        broken[40] ^= 0xFF
        with pytest.raises(StoreError, match="offset 0"):
            replica.append_replicated(0, broken)
        assert replica.log.end == 0
        with pytest.raises(StoreError, match="only a replica"):
            master.append_replicated(master.log.end, b"")


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC])
def test_a_replica_restarted_after_a_crash_or_a_clean_close_continues_at_its_end(
    tmp_path: Path, mode: FlushMode
) -> None:
    with MessageStore.open(store_config(tmp_path / "m")) as master:
        _fill(master, [bytes([i]) * 700 for i in range(20)])
        replica = MessageStore.open(_replica_config(tmp_path / "r", mode))
        half = master.log_bytes(0, 6000)
        taken = replica.append_replicated(0, half)
        replica.flush()  # SYNC mode: dispatched once durable
        end = replica.log.end
        assert 0 < taken == end <= 6000
        crash(replica)
        replica = MessageStore.open(_replica_config(tmp_path / "r", mode))
        assert replica.log.end == end
        _ship(master, replica, [999], start=end)
        replica.flush()
        for topic in TOPICS:
            for queue_id in range(3):
                assert read_queue(replica, topic, queue_id) == read_queue(master, topic, queue_id)
        replica.close()
        replica = MessageStore.open(_replica_config(tmp_path / "r", mode))
        assert replica.log.end == master.log.end
        replica.close()


def test_sync_mode_streams_only_durable_bytes_and_signals_growth(tmp_path: Path) -> None:
    grew: list[int] = []
    with MessageStore.open(store_config(tmp_path / "m", FlushMode.SYNC)) as master:
        master.on_grow = lambda: grew.append(master.replicable_end)
        _fill(master, [b"x" * 10])
        assert master.replicable_end == 0 and grew == []
        master.flush()
        assert grew == [master.log.end] and master.replicable_end == master.log.end


def _diverged(tmp_path: Path, mode: FlushMode) -> tuple[MessageStore, MessageStore, int, int]:
    """A replica holding an old master's log — a shared prefix and a tail that the new
    master never got — and the new master: the prefix, then records of its own at the same
    offsets (it was a replica of the prefix, promoted). Returns both, the prefix's end and
    the replica's end."""
    with MessageStore.open(store_config(tmp_path / "old")) as old:
        _fill(old, [bytes([i]) * 300 for i in range(24)])
        prefix = old.log_bytes(0, 4000)
        replica = MessageStore.open(_replica_config(tmp_path / "r", mode))
        _ship(old, replica, [777])
        replica.flush()
    new = MessageStore.open(_replica_config(tmp_path / "new"))
    common = new.append_replicated(0, prefix)
    new.promote()
    for i in range(9):
        body = b"new" * (i + 50)
        assert new.put_nowait(MessageToStore(TOPICS[i % 2], i % 3, body, {"KEYS": f"n{i}"})).ok
    new.flush()
    return replica, new, common, replica.log.end


def _assert_same(replica: MessageStore, master: MessageStore) -> None:
    assert _log(replica) == _log(master)
    for topic in TOPICS:
        for queue_id in range(3):
            assert read_queue(replica, topic, queue_id) == read_queue(master, topic, queue_id)
            assert replica.max_offset(topic, queue_id) == master.max_offset(topic, queue_id)


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC])
def test_a_diverged_replica_truncates_to_the_common_point_and_follows(
    tmp_path: Path, mode: FlushMode
) -> None:
    replica, new, common, end = _diverged(tmp_path, mode)
    replica.offsets.commit("g", TOPICS[0], 0, replica.max_offset(TOPICS[0], 0))
    assert 0 < common < end
    assert replica.truncate_to(common) == end - common
    assert replica.log.end == common
    assert replica.offsets.query("g", TOPICS[0], 0) == replica.max_offset(TOPICS[0], 0)
    _ship(new, replica, [333], start=common)
    replica.flush()
    _assert_same(replica, new)
    assert replica.messages_by_key(TOPICS[0], "n0") == new.messages_by_key(TOPICS[0], "n0")
    replica.close()
    replica = MessageStore.open(_replica_config(tmp_path / "r", mode))
    _assert_same(replica, new)
    crash(replica)
    replica = MessageStore.open(_replica_config(tmp_path / "r", mode))
    _assert_same(replica, new)
    replica.close()
    new.close()


@pytest.mark.parametrize("dies_in", ["queues", "index", "log"])
def test_a_crash_part_way_through_a_truncation_recovers_a_consistent_store(
    tmp_path: Path, dies_in: str
) -> None:
    """Killed after the checkpoint at the common point and before (part of) the cut: the
    store reopens consistent — what the cut did not reach is re-dispatched, never a queue
    entry pointing past the log — and the next truncation finishes the job."""
    replica, new, common, end = _diverged(tmp_path, FlushMode.ASYNC)

    def die(*_: object) -> None:
        raise SystemExit("killed")

    target = {"queues": replica._queues[(TOPICS[0], 0)], "index": replica.index,
              "log": replica.log}[dies_in]  # fmt: skip
    name = {"queues": "truncate", "index": "truncate_from", "log": "truncate"}[dies_in]
    setattr(target, name, die)
    with pytest.raises(SystemExit):
        replica.truncate_to(common)
    crash(replica)
    replica = MessageStore.open(_replica_config(tmp_path / "r"))
    assert replica.log.end in (common, end)
    for topic in TOPICS:
        for queue_id in range(3):
            read_queue(replica, topic, queue_id)  # every entry's record is there, in order
    replica.truncate_to(common)
    _ship(new, replica, [500], start=common)
    _assert_same(replica, new)
    replica.close()
    new.close()


def test_a_master_never_truncates(tmp_path: Path) -> None:
    with MessageStore.open(store_config(tmp_path / "m")) as master:
        _fill(master, [b"x" * 100] * 3)
        with pytest.raises(StoreError, match="only a replica"):
            master.truncate_to(0)
        assert master.log.end > 0


class _Arrivals:
    def __init__(self) -> None:
        self.offsets: list[tuple[str, int, int]] = []

    def arriving(self, topic: str, queue_id: int, queue_offset: int, *_: object) -> None:
        self.offsets.append((topic, queue_id, queue_offset))


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC])
def test_a_replica_reads_and_announces_only_up_to_the_confirmed_offset(
    tmp_path: Path, mode: FlushMode
) -> None:
    with MessageStore.open(store_config(tmp_path / "m")) as master:
        _fill(master, [bytes([i]) * 200 for i in range(12)])
        heard = _Arrivals()
        replica = MessageStore.open(_replica_config(tmp_path / "r", mode), heard)
        replica.confirm(0)
        _ship(master, replica, [1000])
        replica.flush()
        assert heard.offsets == []
        for queue_id in range(3):
            got = replica.get(TOPICS[0], queue_id, 0)
            assert (got.status, got.max_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 0)
            # Past the confirmed offset but held: caught up, never a reset backwards.
            ahead = replica.get(TOPICS[0], queue_id, 1)
            assert (ahead.status, ahead.next_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 1)
        half = master.get(TOPICS[0], 0, 0).commit_log_offsets[1]  # the second record's start
        replica.confirm(half)
        assert replica.get(TOPICS[0], 0, 0).count == 1
        assert replica.get(TOPICS[0], 0, 0, 32).count == 1
        # Every record before it, of any queue (records 0 to 5 of the 12), none after.
        assert len(heard.offsets) == 6
        assert (TOPICS[0], 0, 0) in heard.offsets and (TOPICS[0], 0, 1) not in heard.offsets
        replica.confirm(None)  # promoted: no limit
        for topic in TOPICS:
            for queue_id in range(3):
                assert read_queue(replica, topic, queue_id) == read_queue(master, topic, queue_id)
        assert len(heard.offsets) == 12
        replica.close()
