"""The core pop service without a wire: PopBatch's per-message records and receipts are the
ones a Remoting client rebuilds from the same answer, and they ack through the core."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from broker.core.pop import PopBatch
from broker.pop import reader as reader_module
from broker.remoting.processors.pop import answer
from protocol.codes import RequestCode
from protocol.command import request
from protocol.headers.pop import INIT_MODE_MAX
from protocol.message import decode_record
from protocol.receipt import ExtraInfo, RetryFlag
from tests.broker.memory import MemoryBroker, open_memory_broker
from tests.broker.pop_client import popped_of
from tests.broker.test_pop import create_topic
from tests.broker.test_timers import send


async def pop_batch(broker: MemoryBroker, *, invisible_ms: int, poll_ms: int = 0) -> PopBatch:
    pops = broker.broker.pops
    return await pops.pop(pops.request("g", "T", -1, 32, invisible_ms), poll_ms=poll_ms)


def check_against_remoting(batch: PopBatch) -> None:
    """Each message's record and receipt equal what the Remoting answer of this very batch
    gives a Java client."""
    cmd = request(RequestCode.POP_MESSAGE, 1)
    remote = popped_of(answer(cmd, batch), "g")
    mine = batch.messages()
    assert [decode_record(m.record)[0] for m in mine] == [p.msg for p in remote]
    assert [m.receipt for m in mine] == [p.receipt for p in remote]


async def test_pop_batch_matches_the_remoting_answer_and_acks_through_the_core(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(30):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=2)
            for i in range(5):
                await send(client, "T", f"m{i}".encode())
            first = await pop_batch(broker, invisible_ms=1_000)
            assert len(first.messages()) == 5
            check_against_remoting(first)
            # Unacked: revived at the deadline into the retry topic, popped again from there.
            again = await pop_batch(broker, invisible_ms=60_000, poll_ms=5_000)
            retried = again.messages()
            assert len(retried) == 5
            assert all(m.receipt.retry_flag is RetryFlag.RETRY_V2 for m in retried)
            check_against_remoting(again)
            pops = broker.broker.pops
            for m in retried:  # a receipt handle survives its text form (gRPC's)
                receipt = ExtraInfo.decode(m.receipt.encode())
                pops.ack("g", "T", m.lease.queue_id, m.lease.offset, receipt)
            for _ in range(1_000):  # the original leases go once their copies are durable
                if broker.statistics().core.pop.in_flight == 0:
                    break
                await trio.sleep(0.01)
            assert broker.statistics().core.pop.in_flight == 0


async def test_a_change_to_zero_makes_the_message_visible_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A nack (invisible time 0, what the gRPC push consumers send): redelivered now, as a
    retry, not at the old deadline."""
    with trio.fail_after(30):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            await send(client, "T", b"m")
            (m,) = (await pop_batch(broker, invisible_ms=600_000)).messages()
            pops = broker.broker.pops
            t0 = trio.current_time()
            pops.change("g", "T", m.lease.queue_id, m.lease.offset, m.receipt, 0)
            (again,) = (await pop_batch(broker, invisible_ms=60_000, poll_ms=5_000)).messages()
            assert trio.current_time() - t0 < 1.0  # not the old 600 s deadline
            assert decode_record(again.record)[0].reconsume_times == 1


async def test_a_new_max_group_reads_a_young_queue_from_its_start_else_its_last_message(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ConsumeInitMode.MAX`` as RocketMQ's ``getInitOffset`` (the gRPC receive uses it): a
    queue whose first message is still "in memory" is read from 0, another from max − 1."""
    with trio.fail_after(30):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            for i in range(3):
                await send(client, "T", f"m{i}".encode())
            pops = broker.broker.pops
            young = pops.request("young", "T", -1, 32, 60_000, init_mode=INIT_MODE_MAX)
            got = (await pops.pop(young, poll_ms=0)).messages()
            assert [decode_record(m.record)[0].body for m in got] == [b"m0", b"m1", b"m2"]
            monkeypatch.setattr(reader_module, "HOT_LOG_BYTES", 0)
            old = pops.request("old", "T", -1, 32, 60_000, init_mode=INIT_MODE_MAX)
            got = (await pops.pop(old, poll_ms=0)).messages()
            assert [decode_record(m.record)[0].body for m in got] == [b"m2"]


async def test_auto_renewal_keeps_a_message_invisible_under_its_first_receipt(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """gRPC push consumers (auto_renew): the lease is extended in place past its invisible
    time, the original receipt still acks, nothing is redelivered meanwhile."""
    with trio.fail_after(3600):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            await send(client, "T", b"m")
            pops = broker.broker.pops
            batch = await pop_batch(broker, invisible_ms=60_000)
            pops.keep_invisible("client-1", batch)
            (m,) = batch.messages()
            # Ten minutes of work, ten times the invisible time: never visible meanwhile.
            again = await pop_batch(broker, invisible_ms=60_000, poll_ms=20_000)
            for _ in range(30):
                assert not again.found
                again = await pop_batch(broker, invisible_ms=60_000, poll_ms=20_000)
            assert broker.broker.pop.renewals.statistics().renewed >= 3
            pops.ack("g", "T", m.lease.queue_id, m.lease.offset, m.receipt)
            assert broker.broker.pop.renewals.statistics().tracked in (0, 1)


async def test_released_messages_come_back_within_a_second(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The client went away (its Telemetry stream ended): what it kept is visible at once."""
    with trio.fail_after(60):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            await send(client, "T", b"m")
            pops = broker.broker.pops
            pops.keep_invisible("client-1", await pop_batch(broker, invisible_ms=60_000))
            t0 = trio.current_time()
            assert pops.release("client-1") == 1
            (again,) = (await pop_batch(broker, invisible_ms=60_000, poll_ms=20_000)).messages()
            assert trio.current_time() - t0 <= 1.5
            assert decode_record(again.record)[0].reconsume_times == 1


async def test_a_pop_can_wait_for_a_topic_that_a_send_will_create(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A gRPC consumer started before the first send (its route is the planned one) parks
    until the send that creates the topic, not for its whole poll time."""
    with trio.fail_after(60):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            pops = broker.broker.pops
            assert not await pops.wait_for_topic("Later", "g", 2_000)  # nothing: times out
            async with trio.open_nursery() as nursery:
                t0 = trio.current_time()

                async def send_soon() -> None:
                    await trio.sleep(1)
                    await send(client, "Later", b"first")

                nursery.start_soon(send_soon)
                assert await pops.wait_for_topic("Later", "g", 10_000)
                assert trio.current_time() - t0 < 2
