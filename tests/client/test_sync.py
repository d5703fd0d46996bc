"""The thread-backed sync facades: same names, blocking calls, usable from several threads."""

from __future__ import annotations

import threading
import time

import pytest

from client import sync
from client.config import ClientConfig
from client.errors import ClientClosedError
from client.message import Message, ReceivedMessage
from tests.client.harness import BrokerThread

pytestmark = pytest.mark.integration


def test_sync_producer_and_simple_consumer(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """Send from three threads through one facade, receive and ack with the blocking consumer."""
    with (
        sync.SimpleConsumer(
            config, group="sg", subscription={"ST": "*"}, consume_from="first", backend=backend
        ) as consumer,
        sync.Producer(config, backend=backend) as producer,
    ):
        receipts: list[str] = []

        def sender(n: int) -> None:
            for i in range(5):
                receipts.append(producer.send(Message("ST", f"{n}-{i}".encode())).message_id)

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(receipts) == 15
        got = []
        for _ in range(20):  # bounded
            got += consumer.receive(32, 30, await_duration=1)
            if len(got) >= 15:
                break
        assert {m.message_id for m in got} == set(receipts)
        for m in got:
            consumer.ack(m)
        later = consumer.change_invisible_duration  # same names as the async class
        assert callable(later)


def test_sync_facade_outside_with_raises(config: ClientConfig) -> None:
    """Calling before start() is a clear error, not a hang."""
    producer = sync.Producer(config)
    with pytest.raises(ClientClosedError):
        producer.send(Message("ST", b"x"))
    producer.start()
    try:
        assert producer.send(Message("ST", b"x")).queue.topic == "ST"
    finally:
        producer.close()
    producer.close()  # idempotent


def test_sync_push_consumer(broker: BrokerThread, config: ClientConfig) -> None:
    """A blocking push consumer with a plain function as listener gets every message."""
    from client.push import ConsumeResult

    seen: list[bytes] = []
    done = threading.Event()

    def listener(message: ReceivedMessage) -> ConsumeResult:
        seen.append(message.body)
        if len(seen) >= 10:
            done.set()
        return ConsumeResult.SUCCESS

    with (
        sync.Producer(config) as producer,
        sync.PushConsumer(
            config, group="spg", subscription={"SP": "*"}, listener=listener, consume_from="first"
        ) as consumer,
    ):
        for i in range(10):
            producer.send(Message("SP", f"p{i}".encode()))
        assert done.wait(20)
        for _ in range(100):  # bounded: the counters follow the listener threads' returns
            if consumer.statistics().consumed >= 10:
                break
            time.sleep(0.05)
        assert consumer.statistics().consumed >= 10
    assert sorted(seen) == sorted(f"p{i}".encode() for i in range(10))
