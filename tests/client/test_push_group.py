"""Push consumers together: two pull-mode consumers split a group's queues, the concurrency
bound holds, a graceful shutdown finishes in-flight work and hands the rest to the next
consumer, and the cache never exceeds ``max_cache_messages``."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import structlog

from client.config import ClientConfig
from client.message import Message, ReceivedMessage
from client.producer import Producer
from client.push import ConsumeResult, PushConsumer
from tests.client.harness import BrokerThread, run
from tests.client.test_push import FAST, until

pytestmark = pytest.mark.integration
MODES = ("pop", "pull")


@pytest.fixture(autouse=True)
def _default_logging() -> None:
    """See tests/client/test_push.py."""
    structlog.reset_defaults()


async def _send(config: ClientConfig, topic: str, bodies: list[str]) -> None:
    async with Producer(config) as producer:
        for body in bodies:
            await producer.send(Message(topic, body.encode()))


class Recorder:
    """An async listener that records what it got and how many calls ran at once."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.got: list[ReceivedMessage] = []
        self.started: list[bytes] = []
        self.running = self.peak = 0
        #: Set by the test as its consumer block ends; calls started after it are noted.
        self.exiting = False
        self.started_late: list[bytes] = []

    async def __call__(self, m: ReceivedMessage) -> ConsumeResult:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.started.append(m.body)
        if self.exiting:
            self.started_late.append(m.body)
        try:
            await anyio.sleep(self.delay)
        finally:
            self.running -= 1
        self.got.append(m)
        return ConsumeResult.SUCCESS


# ---------------------------------------------------------------------- two consumers
async def _split(config: ClientConfig) -> None:
    await _send(config, "PT5", ["warm-up"])  # the topic exists (4 queues) before they start
    one, two = Recorder(0.02), Recorder(0.02)
    # No periodic rebalance within the test: the split must come from the broker's
    # NOTIFY_CONSUMER_IDS_CHANGED when the second consumer's heartbeat arrives.
    options: dict[str, Any] = {**FAST, "consume_concurrency": 2, "rebalance_interval": 60.0}
    async with (
        PushConsumer(config, group="PG5", subscription={"PT5": "*"}, listener=one,
                     mode="pull", **options) as c1,
        PushConsumer(config, group="PG5", subscription={"PT5": "*"}, listener=two,
                     mode="pull", **options) as c2,
    ):  # fmt: skip

        def split() -> bool:
            q1 = {q for q in c1.assigned_queues if q.topic == "PT5"}
            q2 = {q for q in c2.assigned_queues if q.topic == "PT5"}
            return len(q1) == len(q2) == 2 and not q1 & q2

        await until(split, 10)
        await until(lambda: len(one.got) + len(two.got) >= 1)  # the warm-up message
        bodies = [f"m{i}" for i in range(40)]
        await _send(config, "PT5", bodies)
        await until(lambda: len(one.got) + len(two.got) >= 41)
        for consumer, recorder in ((c1, one), (c2, two)):
            mine = set(consumer.assigned_queues)
            assert recorder.got and all(m.queue in mine for m in recorder.got)
            assert recorder.peak <= 2 and consumer.statistics().peak_active_calls <= 2
    everything = sorted(m.body for m in one.got + two.got)
    assert everything == sorted(b.encode() for b in [*bodies, "warm-up"])


def test_two_pull_consumers_split_queues(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """Two pull-mode consumers of one group own two queues each (averaging, rebalanced on
    the broker's notification), together get every message once, and each runs at most
    consume_concurrency listener calls."""
    run(backend, _split, config)


# ---------------------------------------------------------------------- graceful shutdown
async def _shutdown(config: ClientConfig, mode: str) -> None:
    bodies = [f"m{i}" for i in range(10)]
    await _send(config, "PT6", bodies)
    first = Recorder(1.0)
    options: dict[str, Any] = {**FAST, "consume_concurrency": 2, "invisible_duration": 60}
    async with PushConsumer(
        config, group="PG6", subscription={"PT6": "*"}, listener=first, mode=mode, **options
    ):
        await until(lambda: len(first.started) >= 2)
        # From here the block ends: its exit marks the consumer closing before it awaits
        # anything, so a call seeing this flag was started after the exit began.
        first.exiting = True
    # Leaving the block waited for the calls in flight, and started no other. (Usually the
    # first two, whose 1 s calls were running; a slow machine may have finished them and
    # started more before the block ended: all of those must have finished too.)
    assert first.started_late == []
    assert sorted(m.body for m in first.got) == sorted(first.started)
    assert len(first.got) >= 2
    second = Recorder()
    async with PushConsumer(
        config, group="PG6", subscription={"PT6": "*"}, listener=second, mode=mode, **options
    ):
        # Pop: the 8 unconsumed were given back (else invisible for 60 s); pull: the
        # committed offsets stopped before them.
        await until(
            lambda: {m.body for m in first.got + second.got} >= {b.encode() for b in bodies}
        )


@pytest.mark.parametrize("mode", MODES)
def test_graceful_shutdown_hands_over(
    broker: BrokerThread, config: ClientConfig, backend: str, mode: str
) -> None:
    """On exit, in-flight listener calls finish; a second consumer of the group then gets
    everything the first did not consume."""
    run(backend, _shutdown, config, mode)


# ---------------------------------------------------------------------- flow control
async def _flow_control(config: ClientConfig, mode: str) -> int:
    bodies = [f"m{i}" for i in range(40)]
    await _send(config, "PT7", bodies)
    recorder = Recorder(0.01)
    seen_max = 0
    options: dict[str, Any] = {**FAST, "consume_concurrency": 2, "max_cache_messages": 4}
    async with PushConsumer(
        config, group="PG7", subscription={"PT7": "*"}, listener=recorder, mode=mode, **options
    ) as consumer:

        def sample() -> bool:
            nonlocal seen_max
            seen_max = max(seen_max, consumer.statistics().cached_messages)
            return len(recorder.got) >= 40

        await until(sample)
        peak = consumer.statistics().peak_cached_messages
    assert sorted(m.body for m in recorder.got) == sorted(b.encode() for b in bodies)
    assert seen_max <= 4
    return peak


@pytest.mark.parametrize("mode", MODES)
def test_cache_never_exceeds_limit(
    broker: BrokerThread, config: ClientConfig, backend: str, mode: str
) -> None:
    """With max_cache_messages=4 the consumer never holds more than 4 messages."""
    peak = run(backend, _flow_control, config, mode)
    assert 1 <= peak <= 4
