"""What consumers depend on survives a promotion (docs/design.md §13): the pop in-flight
table reaches the replica (``META_POP``), so after the master stops and the replica is
promoted, a message popped and not acknowledged on the old master is popped again once its
invisible time is over — and only then — while acknowledged ones never come back; a delayed
message stored on the old master is delivered by the promoted replica at its time, once.

Time is a stepped wall clock shared by both brokers: leases and the delay are long (a
minute, an hour) and the test moves the clock past them instead of waiting. Real brokers on
loopback; every wait is on a condition, bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from broker.app import BrokerHandle, serve_broker
from broker.clock import Clock
from broker.config import BrokerConfig
from broker.pop.inflight import InflightTable, Lease
from protocol.codes import ResponseCode
from protocol.properties import TIMER_DELAY_MS
from tests.broker.client import TEST_SETTINGS, open_client
from tests.broker.ha.support import (
    CATCH_UP_S,
    NAME,
    follower,
    send,
    wait_caught_up,
)
from tests.broker.ha.test_metadata import wait_for
from tests.broker.pop_client import ack, pop
from tests.broker.test_restart import pull_queue

TOPIC = "PoppedAcrossPromotion"
DELAYED = "DelayedAcrossPromotion"
GROUP = "promotion_pop"
INVISIBLE_MS = 60_000
DELAY_MS = 3_600_000
TEST_S = 90


class SteppedClock(Clock):
    """The real clock plus an offset the test moves forward (never back)."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def time_ns(self) -> int:
        return super().time_ns() + self.offset_ns

    def advance(self, ms: int) -> None:
        self.offset_ns += ms * 1_000_000


@asynccontextmanager
async def broker_at(data_dir: Path, clock: Clock, **settings: Any) -> AsyncIterator[BrokerHandle]:
    """A broker of :data:`NAME` on loopback running on ``clock``; stopped on exit."""
    config = BrokerConfig(
        host="127.0.0.1", port=0, data_dir=data_dir, broker_name=NAME,
        **{**TEST_SETTINGS, **settings},
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(partial(serve_broker, config, clock=clock))
        try:
            yield handle
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await handle.stop()


async def run_master(
    data_dir: Path,
    clock: Clock,
    stop: trio.Event,
    *,
    task_status: trio.TaskStatus[BrokerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with broker_at(data_dir, clock) as master:
        task_status.started(master)
        await stop.wait()


def mirrored(replica: BrokerHandle, in_flight: set[int], cursor: int) -> bool:
    table = replica.broker.pop.table
    offsets = {key[3] for key in table.leases if key[0] == GROUP and key[1] == TOPIC}
    return offsets == in_flight and table.cursor(GROUP, TOPIC, 0) == cursor


async def test_pop_leases_and_timers_survive_a_promotion(tmp_path: Path) -> None:
    clock = SteppedClock()
    with trio.fail_after(TEST_S):
        async with trio.open_nursery() as nursery:
            stop_master = trio.Event()
            master: BrokerHandle = await nursery.start(
                run_master, tmp_path / "m", clock, stop_master
            )
            ha = f"127.0.0.1:{master.ha_port}"
            async with broker_at(tmp_path / "r", clock, broker_id=1, ha_master_addr=ha) as replica:
                async with open_client(master.port) as client:
                    for i in range(3):
                        reply = await send(client, TOPIC, f"m{i}", f"m{i}".encode(), 0)
                        assert reply.code == ResponseCode.SUCCESS, reply.remark
                    later = {TIMER_DELAY_MS: str(DELAY_MS)}
                    reply = await send(client, DELAYED, "late", b"late", 0, later)
                    assert reply.code == ResponseCode.SUCCESS, reply.remark
                    reply, popped = await pop(
                        client, GROUP, TOPIC, queue_id=0, invisible_ms=INVISIBLE_MS
                    )
                    assert [p.msg.body for p in popped] == [b"m0", b"m1", b"m2"]
                    for p in (popped[0], popped[2]):
                        assert (await ack(client, GROUP, p)).code == ResponseCode.SUCCESS
                await wait_caught_up(master, replica)
                await wait_for(replica, lambda: mirrored(replica, {1}, 3))
                stop_master.set()
                await wait_for(replica, lambda: not follower(replica).statistics().connected)
                assert replica.broker.roles.promote() == 2
                async with open_client(replica.port) as client:
                    # m1 is invisible still; m0 and m2 were acknowledged: nothing to pop.
                    reply, again = await pop(client, GROUP, TOPIC, invisible_ms=INVISIBLE_MS)
                    assert again == [], [p.msg.body for p in again]
                    # Past m1's invisible time (and the delay): m1 comes back, only m1.
                    clock.advance(DELAY_MS + INVISIBLE_MS)
                    replica.broker.pop.revive.poke()
                    replica.broker.timers.poke()
                    redelivered = await pop_until_found(client)
                    assert [p.msg.body for p in redelivered] == [b"m1"]
                    assert redelivered[0].msg.reconsume_times == 1
                    await wait_delivered(replica)
                    assert [m.body for m in await pull_queue(client, DELAYED, 0)] == [b"late"]
                    reply, more = await pop(client, GROUP, TOPIC, invisible_ms=INVISIBLE_MS)
                    assert more == []


async def pop_until_found(client: Any) -> list[Any]:
    """A long-polling pop (woken by the revived copy's arrival), repeated until it finds."""
    with trio.fail_after(CATCH_UP_S):
        for _ in range(100):
            _, found = await pop(client, GROUP, TOPIC, invisible_ms=INVISIBLE_MS, poll_ms=5_000)
            if found:
                return found
    raise AssertionError("nothing popped")


async def wait_delivered(broker: BrokerHandle) -> None:
    store = broker.broker.store
    with trio.fail_after(CATCH_UP_S):
        while store.max_offset(DELAYED, 0) < 1:  # no await between the check and the park
            await broker.broker.pull_hub.wait(DELAYED, 0, None, trio.current_time() + CATCH_UP_S)


async def test_a_mirrored_pop_table_survives_the_replicas_restart(tmp_path: Path) -> None:
    clock = SteppedClock()
    with trio.fail_after(TEST_S):
        async with broker_at(tmp_path / "m", clock) as master:
            ha = f"127.0.0.1:{master.ha_port}"
            async with broker_at(tmp_path / "r", clock, broker_id=1, ha_master_addr=ha) as replica:
                async with open_client(master.port) as client:
                    for i in range(2):
                        reply = await send(client, TOPIC, f"m{i}", f"m{i}".encode(), 0)
                        assert reply.code == ResponseCode.SUCCESS, reply.remark
                    _, popped = await pop(client, GROUP, TOPIC, queue_id=0)
                    assert len(popped) == 2
                await wait_for(replica, lambda: mirrored(replica, {0, 1}, 2))
        # Both stopped; the replica comes back alone (its master is gone) with the table.
        async with broker_at(tmp_path / "r", clock, broker_id=1, ha_master_addr=ha) as replica:
            assert mirrored(replica, {0, 1}, 2)


def test_keep_held_fits_a_mirrored_table_to_the_log() -> None:
    """A promoted replica whose log lagged the master's in-flight table keeps only leases
    of messages it holds; cursors past its queues come back to their ends."""
    master = InflightTable()
    leases = [Lease(GROUP, TOPIC, 0, offset, 1_000, 60_000, TOPIC) for offset in range(5)]
    master.popped(leases, cursor=(GROUP, TOPIC, 0, 5))
    replica = InflightTable()
    replica.replace(master.snapshot())
    assert set(replica.leases) == set(master.leases)
    assert replica.keep_held(lambda topic, queue_id: 3) == 2
    assert sorted(k[3] for k in replica.leases) == [0, 1, 2]
    assert replica.cursor(GROUP, TOPIC, 0) == 3
    assert replica.next_deadline() == 61_000
