"""Delayed and timer messages: the schedule (pure), and the timer service in a broker over
memory streams on trio's mock clock (exact delivery times, whatever the load)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from broker.deadlines import DeadlineLoop, DeadlineLoopStatistics
from broker.schedule import (
    LEVEL_MS,
    TIMER_QUEUE,
    TIMER_SRC,
    Due,
    Schedule,
    delivery_time,
    parse_src,
)
from broker.store.api import GetStatus
from broker.store.store import MessageStore
from broker.timers import TimerStatistics
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.send import SendMessageRequestHeader, send_header_to_v2_ext
from protocol.message import MessageExt, decode_records
from protocol.properties import encode_properties
from tests.broker.client import BrokerClient
from tests.broker.memory import MemoryBroker, open_memory_broker


# ------------------------------------------------------------------ the schedule (pure)
def test_levels_are_rocketmqs() -> None:
    assert LEVEL_MS[0] == 1_000
    assert LEVEL_MS[2] == 10_000
    assert LEVEL_MS[-1] == 7_200_000
    assert len(LEVEL_MS) == 18


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({}, None),
        ({"DELAY": "0"}, None),
        ({"DELAY": "1"}, (0, 1_000 + 1_000)),
        ({"DELAY": "3"}, (2, 1_000 + 10_000)),
        ({"DELAY": "99"}, (17, 1_000 + 7_200_000)),  # clamped to the last level
        ({"TIMER_DELIVER_MS": "5000"}, (TIMER_QUEUE, 5_000)),
        ({"TIMER_DELAY_SEC": "2"}, (TIMER_QUEUE, 3_000)),
        ({"TIMER_DELAY_MS": "250"}, (TIMER_QUEUE, 1_250)),
    ],
)
def test_delivery_time(props: dict[str, str], expected: tuple[int, int] | None) -> None:
    assert delivery_time(props, now_ms=1_000) == expected


@pytest.mark.parametrize("props", [{"DELAY": "x"}, {"TIMER_DELAY_SEC": str(4 * 86_400)}])
def test_bad_delivery_times_are_refused(props: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=r"."):
        delivery_time(props, now_ms=0)


def test_due_records_come_out_in_time_order_once() -> None:
    s = Schedule()
    assert s.add(Due(300, TIMER_QUEUE, 0))
    assert s.add(Due(100, TIMER_QUEUE, 1))
    assert not s.add(Due(100, TIMER_QUEUE, 1))  # already scheduled
    assert s.next_deadline() == 100
    assert s.pop_due(99) == []
    assert s.pop_due(300) == [Due(100, TIMER_QUEUE, 1), Due(300, TIMER_QUEUE, 0)]
    assert s.pending == 0


def test_progress_survives_a_snapshot_and_skips_delivered_records() -> None:
    s = Schedule()
    s.mark_delivered(TIMER_QUEUE, 1)  # out of order: the watermark waits for 0
    assert s.watermark(TIMER_QUEUE) == 0
    s.mark_delivered(TIMER_QUEUE, 0)
    s.mark_delivered(TIMER_QUEUE, 5)
    assert s.watermark(TIMER_QUEUE) == 2
    again = Schedule()
    again.load(s.snapshot())
    assert again.delivered(TIMER_QUEUE, 1)
    assert again.delivered(TIMER_QUEUE, 5)
    assert not again.delivered(TIMER_QUEUE, 3)
    assert not again.add(Due(10, TIMER_QUEUE, 5))
    assert again.add(Due(10, TIMER_QUEUE, 3))
    assert parse_src("18:42") == (18, 42)
    assert parse_src("x") is None


# ------------------------------------------------------------------ over TCP
async def send(client: BrokerClient, topic: str, body: bytes, **props: str) -> None:
    header = SendMessageRequestHeader(
        producer_group="pg", topic=topic, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=0, sys_flag=0, born_timestamp=1, flag=0,
        properties=encode_properties({"UNIQ_KEY": body.decode(), **props}),
    )  # fmt: skip
    reply = await client.call(RequestCode.SEND_MESSAGE_V2, send_header_to_v2_ext(header), body)
    assert reply.code == ResponseCode.SUCCESS, reply.remark


def delivered(store: MessageStore, topic: str) -> list[MessageExt]:
    got = store.get(topic, 0, 0, 32)
    return decode_records(got.body) if got.status is GetStatus.FOUND else []


async def wait_delivered(broker: MemoryBroker, topic: str, count: int) -> float:
    """Trio time at which ``count`` messages of ``topic`` are readable (1 ms steps: the mock
    clock makes them free; bounded at 10 virtual seconds)."""
    for _ in range(10_000):
        if len(delivered(broker.broker.store, topic)) >= count:
            break
        await trio.sleep(0.001)
    return trio.current_time()


async def test_timer_message_arrives_at_its_time_not_before(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            start = trio.current_time()
            await send(client, "Later", b"t1", TIMER_DELAY_MS="400")
            await send(client, "Later", b"d1", DELAY="1")  # level 1: 1 s
            assert delivered(broker.broker.store, "Later") == []
            # Exactly at their times (the wall clock follows trio's; 1 ms steps).
            assert await wait_delivered(broker, "Later", 1) - start == pytest.approx(0.4, abs=2e-3)
            assert await wait_delivered(broker, "Later", 2) - start == pytest.approx(1.0, abs=2e-3)
            msgs = delivered(broker.broker.store, "Later")
            assert [m.body for m in msgs] == [b"t1", b"d1"]
            for m in msgs:
                assert m.topic == "Later"
                assert "REAL_TOPIC" not in m.properties
                assert "TIMER_DELAY_MS" not in m.properties
                assert "DELAY" not in m.properties
                assert m.properties[TIMER_SRC]
            for _ in range(100):  # counted once its copy is durable, just after it is readable
                if broker.statistics().core.timers.delivered == 2:
                    break
                await trio.sleep(0.01)
            assert broker.statistics().core.timers == TimerStatistics(
                delivered=2, retried=0, pending=0, in_flight=0
            )


async def test_pending_timers_survive_a_restart_and_fire_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(15):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            start = trio.current_time()
            await send(client, "Later", b"early", TIMER_DELAY_MS="200")
            await send(client, "Later", b"after-restart", TIMER_DELAY_MS="1500")
            await wait_delivered(broker, "Later", 1)
            assert [m.body for m in delivered(broker.broker.store, "Later")] == [b"early"]
        # Stopped before the second fired; it must fire after the restart, at its time, once.
        async with open_memory_broker(tmp_path) as broker:
            assert await wait_delivered(broker, "Later", 2) - start == pytest.approx(1.5, abs=2e-3)
            await trio.sleep(5)  # a double fire would show up within this
            bodies = [m.body for m in delivered(broker.broker.store, "Later")]
            assert bodies == [b"early", b"after-restart"]
        async with open_memory_broker(tmp_path) as broker:
            await trio.sleep(5)
            assert len(delivered(broker.broker.store, "Later")) == 2  # nothing fired again


def test_snapshot_counts_deliveries_still_waiting_on_their_fsync() -> None:
    s = Schedule()
    s.mark_delivered(TIMER_QUEUE, 0)
    again = Schedule()
    again.load(s.snapshot(also_delivered=[(TIMER_QUEUE, 1), (0, 0)]))
    assert again.delivered(TIMER_QUEUE, 1)
    assert again.delivered(0, 0)
    assert not s.delivered(TIMER_QUEUE, 1)  # the live schedule is unchanged


# ------------------------------------------------------------------ the deadline loop
class OneDeadline:
    """A deadline source with one deadline, fired once."""

    def __init__(self, at_ms: int) -> None:
        self.at_ms: int | None = at_ms
        self.fired = trio.Event()

    def next_deadline_ms(self) -> int | None:
        return self.at_ms

    def fire_due(self, now_ms: int, nursery: trio.Nursery) -> None:
        self.at_ms = None
        self.fired.set()


async def test_deadline_loop_statistics_count_its_rounds() -> None:
    loop = DeadlineLoop()
    assert loop.statistics() == DeadlineLoopStatistics(rounds=0, sources=0)
    source = OneDeadline(loop.clock.now_ms() + 20)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop.run, [source])
            await source.fired.wait()
            await trio.sleep(0.01)
            stats = loop.statistics()
            assert stats.sources == 1 and stats.rounds >= 1
            loop.poke()
            await trio.sleep(0.01)
            assert loop.statistics().rounds > stats.rounds
            nursery.cancel_scope.cancel()
