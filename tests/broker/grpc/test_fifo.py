"""FIFO consumer groups over gRPC: whether a group consumes in order is its subscription-group
configuration (``consumeMessageOrderly``), as in the proxy, never the client's settings.

Against a real broker over TCP: the settings a consumer is answered (``fifo``, and
``max_attempts`` = the group's ``retryMaxTimes`` + 1), QueryAssignment (one assignment per
queue for a FIFO group, one with id -1 otherwise), and ReceiveMessage for any queue (-1)
popping orderly: each queue's messages come in queue order, and a queue with a message still
in flight gives nothing more until every message of its batch is acked (or forwarded to the
DLQ), while the other queues keep going.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import broker.grpc.service as service_module
from broker.app import BrokerHandle
from broker.core.send import SendRequest
from broker.groups import SubscriptionGroupConfig
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.grpc.convert import SHARDING_KEY
from protocol.naming import dlq_topic
from protocol.properties import UNIQ_KEY
from tests.broker.client import open_broker
from tests.broker.grpc.client import (
    GrpcClient,
    Reply,
    open_grpc_client,
    receive_request,
    settings_command,
)

pytestmark = pytest.mark.integration

TIMEOUT = 20
TOPIC = "FifoTopic"
FIFO = "FifoGroup"
PLAIN = "PlainGroup"


@pytest.fixture
def short_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long polls of a fraction of a second (the proxy's minimum is 5 s)."""
    monkeypatch.setattr(service_module, "MIN_POLL_MS", 100)
    monkeypatch.setattr(service_module, "POLL_MARGIN_MS", 200)


def configure(handle: BrokerHandle) -> None:
    """A 2-queue topic; FIFO is orderly with 2 retries, PLAIN has no configuration."""
    broker = handle.broker
    broker.topics.ensure(TOPIC, 2)
    broker.admin.update_group(SubscriptionGroupConfig(FIFO, consume_message_orderly=True,
                                                      retry_max_times=2))  # fmt: skip


async def send(handle: BrokerHandle, queue_id: int, body: str, group: str) -> None:
    """A message of message group ``group`` stored in ``queue_id`` (as a FIFO producer's)."""
    props = {SHARDING_KEY: group, UNIQ_KEY: f"id-{body}"}
    outcome = await handle.broker.sends.send(SendRequest(TOPIC, body.encode(), props, queue_id))
    assert outcome.result.ok


async def receive(client: GrpcClient, group: str = FIFO) -> tuple[int, list[Any]]:
    """One ReceiveMessage for any queue (-1), a short long poll: its status, its messages."""
    req = receive_request(TOPIC, group, invisible_s=60, poll_s=None)
    req.long_polling_timeout.nanos = 300_000_000
    reply: Reply = await client.server_streaming("ReceiveMessage", req, grpc_timeout="10S")
    assert reply.status == 0, (reply.status, reply.message)
    responses = reply.decode(schema.ReceiveMessageResponse)
    (status,) = [r.status.code for r in responses if r.WhichOneof("content") == "status"]
    return status, [r.message for r in responses if r.WhichOneof("content") == "message"]


def bodies(messages: list[Any]) -> list[str]:
    return [m.body.decode() for m in messages]


async def ack(client: GrpcClient, *messages: Any) -> None:
    req = schema.AckMessageRequest()
    req.group.name, req.topic.name = FIFO, TOPIC
    for m in messages:
        entry = req.entries.add()
        entry.message_id = m.system_properties.message_id
        entry.receipt_handle = m.system_properties.receipt_handle
    answer = (await client.unary("AckMessage", req)).one(schema.AckMessageResponse)
    assert answer.status.code == Code.OK, answer


async def settings_of(client: GrpcClient, group: str, *, fifo: bool) -> Any:
    """The settings a push consumer of ``group`` is answered (it claims ``fifo`` itself)."""
    command = settings_command(group, TOPIC)
    command.settings.client_type = schema.ClientType.PUSH_CONSUMER
    command.settings.subscription.fifo = fifo
    async with client.open_call("Telemetry", grpc_timeout="60S") as call:
        await call.send(command)
        answer = schema.TelemetryCommand.FromString(await call.receive())
        await call.close_send()
        await call.result()
    assert answer.status.code == Code.OK, answer
    return answer.settings


async def test_settings_and_assignments_follow_the_group_configuration(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            configure(handle)
            fifo = await settings_of(client, FIFO, fifo=False)
            assert fifo.subscription.fifo is True
            assert fifo.backoff_policy.max_attempts == 3  # retryMaxTimes 2, + 1
            # A client claiming FIFO for a group that is not orderly does not make it so.
            plain = await settings_of(client, PLAIN, fifo=True)
            assert plain.subscription.fifo is False
            assert plain.backoff_policy.max_attempts == handle.broker.config.max_reconsume_times + 1

            for group, ids in ((FIFO, [0, 1]), (PLAIN, [-1])):
                req = schema.QueryAssignmentRequest()
                req.topic.name, req.group.name = TOPIC, group
                answer = (await client.unary("QueryAssignment", req)).one(
                    schema.QueryAssignmentResponse
                )
                assert answer.status.code == Code.OK, answer
                assert [a.message_queue.id for a in answer.assignments] == ids, group

            # Made concurrent again: the next settings and assignments say so.
            handle.broker.admin.update_group(SubscriptionGroupConfig(FIFO))
            assert (await settings_of(client, FIFO, fifo=False)).subscription.fifo is False


async def test_orderly_receive_blocks_a_queue_until_its_batch_is_acked(
    tmp_path: Path, short_polls: None
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            configure(handle)
            for i in range(3):
                await send(handle, 0, f"a{i}", "A")
            for i in range(2):
                await send(handle, 1, f"b{i}", "B")

            status, first = await receive(client)
            assert status == Code.OK
            by_queue = {q: [m for m in first if m.system_properties.queue_id == q] for q in (0, 1)}
            assert bodies(by_queue[0]) == ["a0", "a1", "a2"]  # queue order
            assert bodies(by_queue[1]) == ["b0", "b1"]
            assert {m.system_properties.message_group for m in by_queue[0]} == {"A"}
            assert all(m.system_properties.delivery_attempt == 1 for m in first)

            await send(handle, 0, "a3", "A")
            await send(handle, 1, "b2", "B")
            status, blocked = await receive(client)  # both queues have messages in flight
            assert (status, blocked) == (Code.MESSAGE_NOT_FOUND, [])

            await ack(client, *by_queue[1])  # queue 1 is free again, queue 0 is not
            status, second = await receive(client)
            assert (status, bodies(second)) == (Code.OK, ["b2"])
            await ack(client, *second)

            await ack(client, by_queue[0][0])  # one of three: still blocked
            status, none = await receive(client)
            assert (status, none) == (Code.MESSAGE_NOT_FOUND, [])

            # The last of the batch goes to the DLQ (a FIFO push consumer's give-up): that
            # settles it too.
            await ack(client, by_queue[0][1])
            last = by_queue[0][2]
            req = schema.ForwardMessageToDeadLetterQueueRequest()
            req.group.name, req.topic.name = FIFO, TOPIC
            req.receipt_handle = last.system_properties.receipt_handle
            req.message_id = last.system_properties.message_id
            req.delivery_attempt, req.max_delivery_attempts = 3, 3
            answer = (await client.unary("ForwardMessageToDeadLetterQueue", req)).one(
                schema.ForwardMessageToDeadLetterQueueResponse
            )
            assert answer.status.code == Code.OK, answer
            (dead,) = handle.broker.store.messages_by_key(dlq_topic(FIFO), "id-a2")
            assert dead

            status, third = await receive(client)
            assert (status, bodies(third)) == (Code.OK, ["a3"])
            await ack(client, *third)
            assert handle.broker.statistics().pop.in_flight == 0


async def test_unacked_batch_comes_back_whole_and_in_order(
    tmp_path: Path, short_polls: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose lease runs out (no ack) is delivered again from its first message, in
    order, with delivery_attempt 2, before anything newer of its queue."""
    monkeypatch.setattr(service_module, "MIN_INVISIBLE_MS", 500)
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            configure(handle)
            for i in range(3):
                await send(handle, 0, f"a{i}", "A")
            req = receive_request(TOPIC, FIFO, poll_s=None)
            req.invisible_duration.seconds, req.invisible_duration.nanos = 0, 500_000_000
            req.long_polling_timeout.nanos = 300_000_000
            reply = await client.server_streaming("ReceiveMessage", req, grpc_timeout="10S")
            got = [r.message for r in reply.decode(schema.ReceiveMessageResponse)
                   if r.WhichOneof("content") == "message"]  # fmt: skip
            assert bodies(got) == ["a0", "a1", "a2"]
            await ack(client, got[0])
            await send(handle, 0, "a3", "A")
            again: list[Any] = []
            for _ in range(20):  # bounded: each empty receive waits 0.3 s
                _, again = await receive(client)
                if again:
                    break
            assert bodies(again) == ["a1", "a2"]
            assert [m.system_properties.delivery_attempt for m in again] == [2, 2]
