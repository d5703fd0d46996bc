"""The core pop service without a wire: PopBatch's per-message records and receipts are the
ones a Remoting client rebuilds from the same answer, and they ack through the core."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from broker.core.pop import PopBatch
from broker.remoting.processors.pop import answer
from protocol.codes import RequestCode
from protocol.command import request
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
