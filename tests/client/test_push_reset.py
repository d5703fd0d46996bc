"""``trimq-admin resetOffsetByTime`` while a pull-mode push consumer runs: it consumes again."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest

from client.admin import main as admin_main
from client.admin.consumer import group_stats
from client.admin.session import open_admin
from client.config import ClientConfig
from client.message import Message, ReceivedMessage
from client.producer import Producer
from client.push import ConsumeResult, PushConsumer
from tests.client.harness import BrokerThread, run

pytestmark = pytest.mark.integration


async def wait_for(predicate: Callable[[], bool], within: float = 20.0) -> None:
    """Poll ``predicate`` every 50 ms, failing after ``within`` seconds."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 (a plain condition, no event to wait on)
            await anyio.sleep(0.05)


async def wait_committed(
    config: ClientConfig, group: str, topic: str, total: int, within: float = 20.0
) -> None:
    """Poll the broker (every 50 ms, at most ``within`` seconds) until ``group`` has
    committed the end of every queue of ``topic`` and those hold ``total`` messages."""
    async with open_admin(config) as admin:
        with anyio.fail_after(within):
            while True:
                offsets = (await group_stats(admin, group, topic)).values()
                if sum(o.broker_offset for o in offsets) == total and all(
                    o.consumer_offset == o.broker_offset for o in offsets
                ):
                    return
                await anyio.sleep(0.05)


async def _reset(config: ClientConfig, address: str) -> list[bytes]:
    seen: list[bytes] = []

    async def listener(message: ReceivedMessage) -> ConsumeResult:
        seen.append(message.body)
        return ConsumeResult.SUCCESS

    async with Producer(config) as producer:
        await producer.send(Message("RS", b"init"))  # the topic exists before the consumer
    await anyio.sleep(0.01)  # the reset point is after "init"
    start_ms = int(time.time() * 1000)
    async with PushConsumer(
        config, group="rsg", subscription={"RS": "*"}, listener=listener, mode="pull",
        long_poll=0.5, persist_interval=0.2, consume_from="first",
    ):  # fmt: skip
        async with Producer(config) as producer:
            for i in range(8):
                await producer.send(Message("RS", f"r{i}".encode()))
        await wait_for(lambda: len(seen) >= 9)
        # The reset is not forced: it moves back only offsets committed past its point, so
        # all 9 must be committed first (the consumer persists every 0.2 s).
        await wait_committed(config, "rsg", "RS", 9)
        argv = ["-n", address, "resetOffsetByTime", "-g", "rsg", "-t", "RS", "-s", str(start_ms)]
        assert await anyio.to_thread.run_sync(admin_main, argv) == 0
        await wait_for(lambda: len(seen) >= 17)
        await anyio.sleep(1.0)  # nothing more: the reset was not undone and redone
    return seen


def test_reset_offset_reaches_a_running_pull_consumer(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """The broker tells the consumer; it drops its position and consumes from the reset."""
    seen = run(backend, _reset, config, broker.address)
    first, again = seen[:9], seen[9:]
    wanted = sorted(f"r{i}".encode() for i in range(8))
    assert sorted(first) == sorted([b"init", *wanted]) and sorted(again) == wanted
