"""Delays, redelivery and invisibility through the client against a real broker."""

from __future__ import annotations

import time

import anyio
import pytest

from broker.app import BrokerHandle, BrokerHandleStatistics
from client.config import ClientConfig
from client.message import Message, ReceivedMessage
from client.pop import receipt_of
from client.producer import Producer
from client.simple_consumer import SimpleConsumer
from protocol.errors import NoMessageError
from tests.client.harness import BrokerThread, run

pytestmark = pytest.mark.integration


async def receive_n(
    consumer: SimpleConsumer, n: int, within: float, invisible: float = 30
) -> list[ReceivedMessage]:
    got: list[ReceivedMessage] = []
    with anyio.move_on_after(within):
        while len(got) < n:
            got += await consumer.receive(32, invisible, await_duration=0.5)
    return got


async def _delays(config: ClientConfig) -> tuple[int, int]:
    """How long after its send each delayed message became visible, and how late after its
    delivery time the timed one did, in broker milliseconds: a scheduled message becomes
    visible when its copy is stored, so the copy's store timestamp is that moment."""
    async with SimpleConsumer(
        config, group="dg", subscription={"DT": "*"}, consume_from="first"
    ) as consumer:
        async with Producer(config) as producer:
            await producer.send(Message("DT", b"level1", delay_level=1))  # 1 s
            at = time.time() + 1.5
            await producer.send(Message("DT", b"at", delivery_timestamp=at))
        got = await receive_n(consumer, 2, 15)
        copies = {m.body: m.record for m in got}
        for m in got:
            await consumer.ack(m)
    level1 = copies[b"level1"]
    # The copy keeps the original's born timestamp (the producer's clock, this machine's).
    return level1.store_timestamp - level1.born_timestamp, (
        copies[b"at"].store_timestamp - int(at * 1000)
    )


def test_delay_level_and_delivery_time(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """A delay-level-1 message becomes visible 1 s after its send, a timed one at its
    delivery time: never before (exact), and long before the next delay level (5 s)."""
    level1, late = run(backend, _delays, config)
    assert 1_000 <= level1 < 5_000
    assert 0 <= late < 3_500


async def _redelivery(config: ClientConfig) -> None:
    async with SimpleConsumer(
        config, group="rg", subscription={"RT": "*"}, consume_from="first"
    ) as consumer:
        async with Producer(config) as producer:
            await producer.send(Message("RT", b"again", tag="t1", keys=["k1"]))
        (first,) = await receive_n(consumer, 1, 5, invisible=1)
        assert first.delivery_attempt == 1
        # Not acked: it comes back after its invisible time, through the retry topic.
        (second,) = await receive_n(consumer, 1, 10, invisible=30)
        assert second.body == b"again" and second.topic == "RT" and second.tag == "t1"
        assert second.delivery_attempt == 2 and receipt_of(second).is_retry
        assert second.message_id == first.message_id
        with pytest.raises(NoMessageError):
            await consumer.ack(first)  # the first receipt is stale now
        # Keep it invisible longer: the old receipt is replaced by the new one.
        kept = await consumer.change_invisible_duration(second, 60)
        with pytest.raises(NoMessageError):
            await consumer.ack(second)
        await consumer.ack(kept)
        assert await receive_n(consumer, 1, 2.5) == []


def test_redelivery_and_change_invisible(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """An unacked message comes back with attempt 2 and its original topic; receipts rotate."""
    run(backend, _redelivery, config)


async def _ack_many(config: ClientConfig, broker: BrokerThread) -> None:
    async with SimpleConsumer(
        config, group="bg", subscription={"BT": "*"}, consume_from="first"
    ) as consumer:
        async with Producer(config) as producer:
            for i in range(40):  # round-robin: several queues
                await producer.send(Message("BT", str(i).encode()))
        # Invisible far longer than receiving takes: every receipt is still current.
        got = await receive_n(consumer, 40, 15, invisible=60)
        assert sorted(int(m.body) for m in got) == list(range(40))
        assert len({m.queue for m in got}) > 1
        await consumer.ack_many(got)
        # Acked, every one: no lease is left to bring a message back at its invisible time.
        pop = (await anyio.to_thread.run_sync(broker.call, _statistics)).core.pop
        assert (pop.acked, pop.in_flight, pop.revived) == (40, 0, 0)


def _statistics(handle: BrokerHandle) -> BrokerHandleStatistics:
    return handle.statistics()


def test_ack_many(broker: BrokerThread, config: ClientConfig, backend: str) -> None:
    """One batch ack per broker acknowledges messages from several queues."""
    run(backend, _ack_many, config, broker)
