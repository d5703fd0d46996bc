"""Pops belong to the master (docs/design.md §13): on a replica, POP_MESSAGE, ACK_MESSAGE,
BATCH_ACK_MESSAGE and CHANGE_MESSAGE_INVISIBLETIME, and gRPC's ReceiveMessage, AckMessage
and ChangeInvisibleDuration are refused with the reason, and no lease is ever taken there.
Receipts come from real pops on the master. Every wait is on a condition, bounded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from broker.app import BrokerHandle
from broker.core.pop import POP_ON_REPLICA
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.grpc import schema
from protocol.grpc.codes import Code
from tests.broker.client import open_client
from tests.broker.grpc.client import GrpcClient, Reply, open_grpc_client, receive_request
from tests.broker.ha.support import (
    CATCH_UP_S,
    follower,
    ha_addr,
    open_master,
    open_replica,
    send,
    wait_caught_up,
)
from tests.broker.pop_client import ack, batch_ack, change_invisible, pop

TOPIC = "PoppedOnMaster"
GROUP = "pop_group"
TEST_S = 60


def refused(reply: RemotingCommand) -> None:
    assert reply.code == ResponseCode.SERVICE_NOT_AVAILABLE, (reply.code, reply.remark)
    assert reply.remark == POP_ON_REPLICA


async def no_lease_on(master: BrokerHandle, replica: BrokerHandle) -> None:
    """The replica's in-flight table is the master's mirror (META_POP), nothing of its own:
    the refused requests took, acked or changed no lease there."""
    with trio.fail_after(CATCH_UP_S):
        await follower(replica).wait_until(
            lambda _: replica.broker.pop.table.snapshot() == master.broker.pop.table.snapshot()
        )
    assert replica.broker.pop.statistics().acked == 0


async def test_remoting_pops_acks_and_changes_on_a_replica_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master:
            async with open_client(master.port) as client:
                for i in range(3):
                    reply = await send(client, TOPIC, f"k{i}", b"body %d" % i)
                    assert reply.code == ResponseCode.SUCCESS, reply.remark
                _, popped = await pop(client, GROUP, TOPIC, queue_id=0)
                assert len(popped) == 3
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                await wait_caught_up(master, replica)
                async with open_client(replica.port) as on_replica:
                    reply, none = await pop(on_replica, GROUP, TOPIC, queue_id=0, poll_ms=1000)
                    refused(reply)
                    assert none == []
                    refused(await ack(on_replica, GROUP, popped[0]))
                    refused(await batch_ack(on_replica, GROUP, popped[1:]))
                    changed, _ = await change_invisible(on_replica, GROUP, popped[2], 0)
                    refused(changed)
                await no_lease_on(master, replica)
            # The master's leases are untouched by the refused requests: its acks still work.
            async with open_client(master.port) as client:
                assert (await ack(client, GROUP, popped[0])).code == ResponseCode.SUCCESS


async def receive(client: GrpcClient) -> list[Any]:
    """One ReceiveMessage; its responses."""
    req = receive_request(TOPIC, GROUP, invisible_s=60, poll_s=None)
    req.long_polling_timeout.nanos = 300_000_000
    reply: Reply = await client.server_streaming("ReceiveMessage", req, grpc_timeout="10S")
    assert reply.status == 0, (reply.status, reply.message)
    return list(reply.decode(schema.ReceiveMessageResponse))


def handles(responses: list[Any]) -> list[Any]:
    return [r.message for r in responses if r.WhichOneof("content") == "message"]


async def test_grpc_receive_ack_and_change_on_a_replica_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m", grpc_port=0) as master:
            async with open_client(master.port) as client:
                reply = await send(client, TOPIC, "k", b"body")
                assert reply.code == ResponseCode.SUCCESS, reply.remark
            async with open_grpc_client(master.grpc_port) as on_master:
                (message,) = handles(await receive(on_master))
            async with (
                open_replica(tmp_path / "r", ha_addr(master), grpc_port=0) as replica,
                open_grpc_client(replica.grpc_port) as on_replica,
            ):
                await wait_caught_up(master, replica)
                (answer,) = [r for r in await receive(on_replica) if r.WhichOneof("content")]
                assert answer.status.code == Code.INTERNAL_SERVER_ERROR, answer
                assert answer.status.message == POP_ON_REPLICA
                acked = schema.AckMessageRequest()
                acked.group.name, acked.topic.name = GROUP, TOPIC
                entry = acked.entries.add()
                entry.message_id = message.system_properties.message_id
                entry.receipt_handle = message.system_properties.receipt_handle
                ack_answer = (await on_replica.unary("AckMessage", acked)).one(
                    schema.AckMessageResponse
                )
                assert ack_answer.status.message == POP_ON_REPLICA, ack_answer
                change = schema.ChangeInvisibleDurationRequest()
                change.group.name, change.topic.name = GROUP, TOPIC
                change.receipt_handle = message.system_properties.receipt_handle
                change.message_id = message.system_properties.message_id
                change.invisible_duration.seconds = 5
                change_answer = (await on_replica.unary("ChangeInvisibleDuration", change)).one(
                    schema.ChangeInvisibleDurationResponse
                )
                assert change_answer.status.code == Code.INTERNAL_SERVER_ERROR, change_answer
                assert change_answer.status.message == POP_ON_REPLICA
                await no_lease_on(master, replica)
