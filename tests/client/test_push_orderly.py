"""Orderly push consumption against a real broker: order per queue, SUSPEND retries the same
message, and the retry limit sends a poison message to ``%DLQ%group`` (seed 004)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import structlog

from client.config import ClientConfig
from client.instance import open_instance
from client.message import Message, ReceivedMessage
from client.producer import Producer
from client.push import ConsumeResult, PushConsumer, pull_api
from protocol.bodies.consumer import MessageQueue
from protocol.naming import dlq_topic
from protocol.properties import RETRY_TOPIC
from tests.client.harness import BrokerThread, run
from tests.client.test_push import FAST, until

pytestmark = pytest.mark.integration
KEYS = ("A", "B", "C")
PER_KEY = 6


@pytest.fixture(autouse=True)
def _default_logging() -> None:
    """See tests/client/test_push.py."""
    structlog.reset_defaults()


async def read_dlq(config: ClientConfig, group: str) -> list[ReceivedMessage]:
    """Every message in the group's DLQ (one queue), read with plain pulls."""
    topic = dlq_topic(group)
    async with open_instance(config) as (instance, _):
        route = await instance.route(topic)
        out: list[ReceivedMessage] = []
        for mq in route.read_queues:
            result = await pull_api.pull(
                instance, group, MessageQueue(topic, mq.broker_name, mq.queue_id), 0,
                max_messages=32, max_bytes=1 << 20, commit_offset=None, expression="*",
                suspend_ms=0,
            )  # fmt: skip
            out += result.messages
        return out


async def _orderly(config: ClientConfig, mode: str) -> None:
    group = f"PGO{mode}"
    async with Producer(config) as producer:
        for i in range(PER_KEY):
            for key in KEYS:  # interleaved sends; each key stays on its queue
                await producer.send(Message("PTO", f"{key}{i}".encode()), sharding_key=key)
    calls: list[tuple[str, int, int]] = []
    done: set[str] = set()

    async def listener(m: ReceivedMessage) -> ConsumeResult:
        body = m.body.decode()
        calls.append((body[0], int(body[1:]), m.delivery_attempt))
        await anyio.sleep(0.01)  # lets other queues interleave
        if body == "B3" and m.delivery_attempt < 3:
            return ConsumeResult.SUSPEND
        if body == "C2":
            return ConsumeResult.SUSPEND  # poison: always fails
        done.add(body)
        return ConsumeResult.SUCCESS

    options: dict[str, Any] = {**FAST, "suspend_interval": 0.3, "max_reconsume_times": 2}
    async with PushConsumer(
        config, group=group, subscription={"PTO": "*"}, listener=listener, mode=mode,
        orderly=True, **options,
    ) as consumer:  # fmt: skip
        await until(lambda: len(done) == len(KEYS) * PER_KEY - 1, 20)
        assert consumer.statistics().dead_lettered == 1
    for key in KEYS:
        seq = [(i, attempt) for k, i, attempt in calls if k == key]
        assert [i for i, _ in seq] == sorted(i for i, _ in seq)  # in order, retries in place
    b = [(i, a) for k, i, a in calls if k == "B"]
    assert [i for i, _ in b] == [0, 1, 2, 3, 3, 3, 4, 5]  # SUSPEND retried the same message
    c = [(i, a) for k, i, a in calls if k == "C"]
    assert [i for i, _ in c] == [0, 1, 2, 2, 2, 3, 4, 5]  # limit reached, moved on
    if mode == "pull":  # pop: the broker counts re-pops of a locked batch as attempts too
        assert [a for _, a in b[3:6]] == [a for _, a in c[2:5]] == [1, 2, 3]
    dead = await read_dlq(config, group)
    assert [m.body for m in dead] == [b"C2"]
    assert dead[0].properties.get(RETRY_TOPIC) == "PTO"  # where it came from


@pytest.mark.parametrize("mode", ["pull", "pop"])
def test_orderly_order_suspend_and_dlq(
    broker: BrokerThread, config: ClientConfig, backend: str, mode: str
) -> None:
    """Per sharding key, messages are consumed in send order; SUSPEND retries the same
    message; after max_reconsume_times the poison message lands in %DLQ%group and the
    queue goes on."""
    run(backend, _orderly, config, mode)
