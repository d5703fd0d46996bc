"""Popped, unacknowledged messages across a restart of ``python -m broker --flush sync``.

One scenario, ended by ``kill -9`` or by a graceful SIGTERM: six messages are popped (two
with a long invisible time before a checkpoint, so that they are in the journal's snapshot;
four with about 2 s after it, so that they are journal ops), one is acked and one gets a new
invisible time, then the broker stops. After the restart on the same data directory:

* every unacked short-lived message comes back exactly once, through the group's retry topic
  with reconsume times 1, and not before its deadline; the acked one never does;
* the receipts of the messages still invisible (the long ones, the changed one) still ack,
  and the receipt the change replaced is stale;
* after a second stop of the same kind, the next start has nothing in flight.

Every broker is a child process killed by its own pid (never by name) if it outlives its test;
every wait and loop is bounded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from protocol.codes import ResponseCode
from protocol.properties import (
    FIRST_POP_TIME,
    ORIGIN_TOPIC,
    REVIVE_DEADLINE_MS,
    UNIQ_KEY,
)
from protocol.receipt import RetryFlag
from tests.broker.client import BrokerClient, open_client
from tests.broker.pop_client import Popped, ack, change_invisible, pop
from tests.broker.test_pop import create_topic
from tests.broker.test_process import BrokerProcess
from tests.broker.test_restart import body_for, broker_process, kill9, now_ms, send_ok, sigterm

pytestmark = pytest.mark.e2e

TOPIC = "PopDurable"
GROUP = "pop_durable"
RETRY_TOPIC = f"%RETRY%{GROUP}+{TOPIC}"
SHORT_MS = 2_000  #: redelivered after the restart
LONG_MS = 60_000  #: still invisible when the test ends
KEYS = [f"pop-{i}" for i in range(6)]


def key_of(popped: Popped) -> str:
    return popped.msg.properties[UNIQ_KEY]


async def stop(broker: BrokerProcess, crash: bool) -> None:
    if crash:
        await kill9(broker)
    else:
        await sigterm(broker)


async def acked(client: BrokerClient, popped: Popped) -> bool:
    """Ack with ``popped``'s receipt: True on SUCCESS, False on NO_MESSAGE (anything else
    fails the test)."""
    reply = await ack(client, GROUP, popped)
    assert reply.code in (ResponseCode.SUCCESS, ResponseCode.NO_MESSAGE), reply.remark
    return reply.code == ResponseCode.SUCCESS


def journal_generations(pop_dir: Path) -> list[int]:
    """The generations of the pop journal files (a tiny local directory listing)."""
    return [int(p.suffix[1:]) for p in pop_dir.glob("journal.*")]


async def wait_for_snapshot_after(pop_dir: Path) -> None:
    """Wait until a checkpoint has rotated the pop journal onto a snapshot taken after now
    (callers bound it): the older generations are deleted once that snapshot is written."""
    newest = max(journal_generations(pop_dir))
    while True:  # bounded by the caller's deadline
        gens = journal_generations(pop_dir)
        if (pop_dir / "snapshot").exists() and gens and min(gens) > newest:
            return
        await trio.sleep(0.05)


async def run_scenario(data_dir: Path, *, crash: bool) -> None:
    # ------------------------------------------------------------ first run
    # A snapshot at every checkpoint: the first run must recover a snapshot plus the ops
    # journaled after it.
    async with broker_process(data_dir, flush="sync", pop_snapshot_min_bytes=0) as broker:
        async with open_client(broker.port) as client:
            await create_topic(client, TOPIC, queues=1)
            for key in KEYS:
                await send_ok(client, TOPIC, key)
            _, slow = await pop(client, GROUP, TOPIC, max_nums=2, invisible_ms=LONG_MS)
            assert [key_of(p) for p in slow] == KEYS[:2]
            with trio.fail_after(5):
                await wait_for_snapshot_after(data_dir / "pop")
            _, fast = await pop(client, GROUP, TOPIC, max_nums=4, invisible_ms=SHORT_MS)
            assert [key_of(p) for p in fast] == KEYS[2:]
            assert await acked(client, fast[0])
            reply, changed = await change_invisible(client, GROUP, fast[3], LONG_MS)
            assert reply.code == ResponseCode.SUCCESS and changed is not None
            # The stop comes long before the short deadlines.
            assert now_ms() < min(p.receipt.deadline_ms for p in fast) - 500
        await stop(broker, crash)

    # ------------------------------------------------------------ second run
    async with broker_process(data_dir, flush="sync") as broker:
        recovered = broker.find("pop state recovered")
        assert recovered is not None
        # In flight: the two slow ones, the changed one and the two unacked fast ones.
        assert recovered["leases"] == 5, recovered
        if not crash:
            assert recovered["ops"] == 0, recovered  # the final checkpoint covered all
        async with open_client(broker.port) as client:
            # Receipts from before the restart: the one the change replaced is stale, the
            # new one and those of still-invisible messages ack, an acked one is gone.
            stale = await ack(client, GROUP, fast[3])
            assert stale.code == ResponseCode.NO_MESSAGE and "stale" in (stale.remark or "")
            assert await acked(client, changed)
            assert await acked(client, slow[0])
            again = await ack(client, GROUP, fast[0])
            assert again.code == ResponseCode.NO_MESSAGE
            assert "no message in flight" in (again.remark or "")

            # The two unacked fast ones come back once each, after their deadlines.
            redelivered: dict[str, Popped] = {}
            for _ in range(20):  # bounded: one pop of at most 1 s per round
                if len(redelivered) == 2:
                    break
                reply, got = await pop(
                    client, GROUP, TOPIC, poll_ms=1_000, invisible_ms=LONG_MS, timeout=10
                )
                assert reply.code in (ResponseCode.SUCCESS, ResponseCode.POLLING_TIMEOUT)
                received = now_ms()
                for p in got:
                    key = key_of(p)
                    assert key not in redelivered, f"{key} redelivered twice"
                    redelivered[key] = p
                    (first,) = [f for f in fast if key_of(f) == key]
                    deadline = first.receipt.deadline_ms
                    assert received >= deadline and p.msg.store_timestamp >= deadline
                    assert int(p.msg.properties[REVIVE_DEADLINE_MS]) == deadline
                    assert p.msg.properties[FIRST_POP_TIME] == str(first.receipt.pop_time_ms)
            assert sorted(redelivered) == KEYS[3:5]
            for p in redelivered.values():
                assert p.real_topic == RETRY_TOPIC
                assert p.receipt.retry_flag is RetryFlag.RETRY_V2
                assert p.msg.topic == TOPIC and p.msg.properties[ORIGIN_TOPIC] == TOPIC
                assert p.msg.reconsume_times == 1
                assert p.msg.body == body_for(key_of(p))
            # Nothing else comes back: not the acked one, not those still invisible.
            reply, more = await pop(client, GROUP, TOPIC, poll_ms=700, timeout=10)
            assert reply.code == ResponseCode.POLLING_TIMEOUT and more == [], more
            # The redelivered messages' old receipts are over; their new ones and the last
            # still-invisible pre-restart receipt ack.
            for first in fast[1:3]:
                assert not await acked(client, first)
            for p in redelivered.values():
                assert await acked(client, p)
            assert await acked(client, slow[1])
        await stop(broker, crash)

    # ------------------------------------------------------------ third run
    async with broker_process(data_dir, flush="sync") as broker:
        recovered = broker.find("pop state recovered")
        assert recovered is not None and recovered["leases"] == 0, recovered
        async with open_client(broker.port) as client:
            reply, rest = await pop(client, GROUP, TOPIC, poll_ms=300, timeout=10)
            assert reply.code == ResponseCode.POLLING_TIMEOUT and rest == [], rest
        await sigterm(broker)


async def test_unacked_pops_are_redelivered_after_kill9(tmp_path: Path) -> None:
    with trio.fail_after(60):
        await run_scenario(tmp_path / "data", crash=True)


async def test_unacked_pops_are_redelivered_after_sigterm(tmp_path: Path) -> None:
    with trio.fail_after(60):
        await run_scenario(tmp_path / "data", crash=False)
