"""Delays, redelivery and invisibility through the client against a real broker."""

from __future__ import annotations

import time

import anyio
import pytest

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


async def _delays(config: ClientConfig) -> tuple[float, float]:
    async with SimpleConsumer(
        config, group="dg", subscription={"DT": "*"}, consume_from="first"
    ) as consumer:
        async with Producer(config) as producer:
            t0 = time.time()
            await producer.send(Message("DT", b"level1", delay_level=1))  # 1 s
            await producer.send(Message("DT", b"at", delivery_timestamp=t0 + 1.5))
            assert await consumer.receive(32, 30, await_duration=0) == []
        got = await receive_n(consumer, 2, 10)
        arrived = {m.body: time.time() - t0 for m in got}
        for m in got:
            await consumer.ack(m)
        return arrived[b"level1"], arrived[b"at"]


def test_delay_level_and_delivery_time(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """A delay-level-1 message arrives after ~1 s, a timed one at its delivery time."""
    level1, at = run(backend, _delays, config)
    assert 0.9 <= level1 < 4.0
    assert 1.4 <= at < 4.5


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


async def _ack_many(config: ClientConfig) -> None:
    async with SimpleConsumer(
        config, group="bg", subscription={"BT": "*"}, consume_from="first"
    ) as consumer:
        async with Producer(config) as producer:
            for i in range(40):  # round-robin: several queues
                await producer.send(Message("BT", str(i).encode()))
        got = await receive_n(consumer, 40, 10, invisible=2)
        assert len(got) == 40
        await consumer.ack_many(got)
        # Acked: nothing comes back after the invisible time.
        await anyio.sleep(2.5)
        assert await consumer.receive(32, 30, await_duration=0.5) == []


def test_ack_many(broker: BrokerThread, config: ClientConfig, backend: str) -> None:
    """One batch ack per broker acknowledges messages from several queues."""
    run(backend, _ack_many, config)
