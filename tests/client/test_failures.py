"""Failure paths of the transport against a real broker: timeouts and lost connections."""

from __future__ import annotations

import anyio
import pytest

from broker.app import BrokerHandle
from client.config import ClientConfig
from client.errors import ConnectionLostError, RequestTimeoutError
from client.instance import ClientInstance, open_instance
from client.message import Message
from client.producer import Producer
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.headers.pull import PullMessageRequestHeader, build_pull_sys_flag
from tests.client.harness import BrokerThread, run

pytestmark = pytest.mark.integration


async def four_messages(config: ClientConfig, topic: str) -> None:
    """Create ``topic`` (4 queues) with one message per queue: round-robin sends."""
    async with Producer(config) as producer:
        queues = {(await producer.send(Message(topic, b"x"))).queue.queue_id for _ in range(4)}
    assert queues == {0, 1, 2, 3}


def long_pull(instance: ClientInstance, topic: str, suspend_ms: int) -> RemotingCommand:
    """A pull of queue 0 past its one message: the broker parks it for ``suspend_ms``."""
    header = PullMessageRequestHeader(
        consumer_group="fg", topic=topic, queue_id=0, queue_offset=1, max_msg_nums=1,
        sys_flag=build_pull_sys_flag(commit_offset=False, suspend=True, subscription=True),
        commit_offset=0, suspend_timeout_millis=suspend_ms, subscription="*", sub_version=0,
    )  # fmt: skip
    return instance.request(RequestCode.PULL_MESSAGE, header.to_ext())


async def _timeout_keeps_connection(config: ClientConfig, address: str) -> None:
    await four_messages(config, "FT")
    async with open_instance(config) as (instance, _):
        start = anyio.current_time()
        with pytest.raises(RequestTimeoutError):
            await instance.remoting.invoke(address, long_pull(instance, "FT", 10_000), 0.3)
        assert anyio.current_time() - start < 2.0
        # The connection stays usable for other requests; the late reply is dropped.
        reply = await instance.remoting.invoke(
            address, instance.request(RequestCode.HEART_BEAT, body=b'{"clientID":"x"}')
        )
        assert reply.code == 0


def test_request_timeout(broker: BrokerThread, config: ClientConfig, backend: str) -> None:
    """A request without a reply in time raises RequestTimeoutError at its own deadline."""
    run(backend, _timeout_keeps_connection, config, broker.address)


async def _lost(config: ClientConfig, broker: BrokerThread) -> float:
    await four_messages(config, "FL")
    async with open_instance(config) as (instance, _):
        parked_at = 0.0
        error: ConnectionLostError | None = None

        async def kill_once_parked() -> None:
            nonlocal parked_at
            with anyio.fail_after(10):
                while not await anyio.to_thread.run_sync(broker.call, _parked):  # noqa: ASYNC110 (state on the broker thread)
                    await anyio.sleep(0.02)
            parked_at = anyio.current_time()
            await anyio.to_thread.run_sync(broker.kill)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kill_once_parked)
            try:
                await instance.remoting.invoke(
                    broker.address, long_pull(instance, "FL", 20_000), 30
                )
            except ConnectionLostError as exc:
                error = exc
        assert error is not None
        return anyio.current_time() - parked_at


def _parked(handle: BrokerHandle) -> int:
    return handle.statistics().core.pull_hub.parked


def test_connection_lost_fails_pending_at_once(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """A broker that dies under a parked request fails it promptly, not at its timeout."""
    assert run(backend, _lost, config, broker) < 5.0
