"""PushConsumer against a real broker over TCP, in pop and pull mode, under trio and asyncio."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
import structlog

from client.config import ClientConfig
from client.instance import open_instance
from client.message import Message, ReceivedMessage
from client.producer import Producer, shard_queue
from client.push import ConsumeResult, PushConsumer, pull_api
from tests.client.harness import BrokerThread, run

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _default_logging() -> None:
    """Log through structlog's defaults: a test that configured structlog with pytest's
    captured stream (closed after that test) would make every later log call fail."""
    structlog.reset_defaults()


MODES = ("pop", "pull")
#: Short timers so retries are observed within a second or two.
FAST: dict[str, Any] = {
    "consume_from": "first", "long_poll": 1.0, "send_back_delay_level": 1,
    "retry_backoff_initial": 0.5, "rebalance_interval": 2.0, "persist_interval": 0.5,
    "shutdown_timeout": 5.0,
}  # fmt: skip


async def _send(config: ClientConfig, topic: str, n: int, key: Callable[[int], str | None]) -> None:
    async with Producer(config) as producer:
        for i in range(n):
            await producer.send(Message(topic, f"m{i}".encode()), sharding_key=key(i))


async def until(condition: Callable[[], bool], limit: float = 15.0) -> None:
    # Polls counters the consumer owns (no event to wait on); bounded by fail_after.
    with anyio.fail_after(limit):
        while not condition():  # noqa: ASYNC110
            await anyio.sleep(0.02)


# ---------------------------------------------------------------------- happy path + retries
async def _every_message_once(config: ClientConfig, mode: str) -> None:
    await _send(config, "PT1", 30, lambda i: None)
    # What the listener saw, checked below: an assert in a listener would only be caught
    # by the runtime and turned into a retry.
    seen: list[bytes] = []
    topics_attempts: set[tuple[str, int]] = set()

    def listener(m: ReceivedMessage) -> ConsumeResult:  # sync: runs in worker threads
        seen.append(m.body)
        topics_attempts.add((m.topic, m.delivery_attempt))
        return ConsumeResult.SUCCESS

    async with PushConsumer(
        config, group="PG1", subscription={"PT1": "*"}, listener=listener, mode=mode, **FAST
    ) as consumer:
        await until(lambda: len(seen) >= 30)
        await anyio.sleep(0.5)  # nothing more may come
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(30))
    assert topics_attempts == {("PT1", 1)}
    assert consumer.statistics().consumed == 30  # the final counts stay readable


@pytest.mark.parametrize("mode", MODES)
def test_every_message_consumed_once(
    broker: BrokerThread, config: ClientConfig, backend: str, mode: str
) -> None:
    """A happy sync listener gets every message exactly once."""
    run(backend, _every_message_once, config, mode)


async def _retries(config: ClientConfig, mode: str) -> None:
    await _send(config, "PT2", 10, lambda i: None)
    attempts: dict[bytes, list[int]] = {}
    topics: set[str] = set()  # checked below, not in the listener (see _every_message_once)
    done: set[bytes] = set()

    async def listener(m: ReceivedMessage) -> ConsumeResult:  # async: runs as a task
        attempts.setdefault(m.body, []).append(m.delivery_attempt)
        topics.add(m.topic)
        if m.delivery_attempt == 1 and m.body in (b"m1", b"m2"):
            return ConsumeResult.RETRY_LATER
        if m.delivery_attempt == 1 and m.body == b"m3":
            raise RuntimeError("listener failure")
        done.add(m.body)
        return ConsumeResult.SUCCESS

    async with PushConsumer(
        config, group="PG2", subscription={"PT2": "*"}, listener=listener, mode=mode, **FAST
    ) as consumer:
        await until(lambda: len(done) == 10)
        stats = consumer.statistics()
    assert topics == {"PT2"}  # retried ones too: their original topic
    for body in (b"m1", b"m2", b"m3"):
        assert attempts[body] == [1, 2]  # came back once, through the retry topic
    assert all(attempts[f"m{i}".encode()] == [1] for i in (0, 4, 5, 6, 7, 8, 9))
    assert (stats.consumed, stats.failed) == (10, 3)


@pytest.mark.parametrize("mode", MODES)
def test_failed_messages_come_back(
    broker: BrokerThread, config: ClientConfig, backend: str, mode: str
) -> None:
    """RETRY_LATER and exceptions send a message back; it returns (attempt 2, original
    topic) and then succeeds."""
    run(backend, _retries, config, mode)


# ---------------------------------------------------------------------- consume timeout
async def _consume_timeout(config: ClientConfig, mode: str) -> tuple[float, int | None]:
    await _send(config, "PT3", 1, lambda i: "k")
    started: list[float] = []
    attempts: list[int] = []
    release = threading.Event()

    def listener(m: ReceivedMessage) -> ConsumeResult:
        attempts.append(m.delivery_attempt)
        if m.delivery_attempt == 1:
            started.append(time.monotonic())
            # Held until the test has seen the timeout (whatever the machine's speed):
            # abandoned at the 1 s consume timeout, its result ignored.
            release.wait(30)
        return ConsumeResult.SUCCESS

    try:
        async with PushConsumer(
            config, group="PG3", subscription={"PT3": "*"}, listener=listener, mode=mode,
            **{**FAST, "consume_timeout": 1.0, "invisible_duration": 5.0},
        ) as consumer:  # fmt: skip
            await until(lambda: consumer.statistics().timed_out == 1, 5)
            fired = time.monotonic() - started[0]
            release.set()  # the abandoned call returns; its SUCCESS must count for nothing
            await until(lambda: len(attempts) >= 2)
            await anyio.sleep(0.2)
    finally:
        release.set()  # never leave a worker thread blocked
    assert attempts == [1, 2]
    committed = None
    if mode == "pull":
        async with open_instance(config) as (instance, _):
            route = await instance.route("PT3")
            mq = shard_queue(route.write_queues, "k")
            committed = await pull_api.query_offset(instance, "PG3", mq)
    return fired, committed


@pytest.mark.parametrize("mode", MODES)
def test_consume_timeout_at_its_own_deadline(
    broker: BrokerThread, config: ClientConfig, backend: str, mode: str
) -> None:
    """A listener running past consume_timeout (1 s) is given up at its own deadline — not
    at a periodic scan's next round (seed 003) — and the message is redelivered; in pull
    mode the committed offset moves past it."""
    fired, committed = run(backend, _consume_timeout, config, mode)
    # Not early; and well before anything periodic (RocketMQ's cleanExpireMsg runs every
    # 15 min) or the 5 s invisible time. The upper bound has room for a loaded machine's
    # thread and poll delays: what it separates is seconds from minutes.
    assert 0.95 <= fired < 4.0
    if mode == "pull":
        assert committed == 1
