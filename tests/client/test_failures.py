"""Failure paths of the transport against a real broker: timeouts and lost connections."""

from __future__ import annotations

import anyio
import pytest

from broker.app import BrokerHandle
from client.config import ClientConfig
from client.errors import ConnectionLostError, RequestTimeoutError
from client.instance import ClientInstance, open_instance
from client.message import Message, SendStatus
from client.producer import RETRY_CODES, Producer
from protocol.bodies.consumer import MessageQueue
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError
from protocol.headers.pull import PullMessageRequestHeader, build_pull_sys_flag
from protocol.headers.send import SendMessageResponseHeader
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


def test_slave_not_available_without_a_msgid_is_a_retryable_refusal() -> None:
    """Code 11 without a msgId: a sync-replication broker refused the message before its
    append, so another broker may take it (no duplicate); with a msgId it was stored and
    is a non-OK status (RocketMQ's classic SYNC_MASTER)."""
    cmd = RemotingCommand(code=RequestCode.SEND_MESSAGE_V2)
    queue = MessageQueue("T", "b", 0)
    refused = cmd.response(ResponseCode.SLAVE_NOT_AVAILABLE, "not enough replicas in sync")
    with pytest.raises(BrokerError) as caught:
        Producer._receipt(refused, queue, "U1")
    assert caught.value.code in RETRY_CODES
    header = SendMessageResponseHeader(msg_id="AB" * 16, queue_id=0, queue_offset=7)
    stored = cmd.response(ResponseCode.SLAVE_NOT_AVAILABLE, "stored", ext_fields=header.to_ext())
    assert Producer._receipt(stored, queue, "U1").status is SendStatus.SLAVE_NOT_AVAILABLE
