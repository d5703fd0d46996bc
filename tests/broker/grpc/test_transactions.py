"""Transactions through the gRPC front end, over TCP: a TRANSACTION send is a half message,
EndTransaction decides it by the transaction id the send returned, and the broker's
check-back reaches a producer as a ``recover_orphaned_transaction_command`` on its Telemetry
stream (the producer group of a gRPC half message is its topic, as in the proxy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from broker.halves import HALF_TOPIC
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.grpc.convert import decode_transaction_id, duration_ms
from protocol.message import decode_records
from protocol.properties import CHECK_IMMUNITY_TIME_IN_SECONDS, PGROUP, TRAN_MSG
from tests.broker.client import open_broker
from tests.broker.grpc.client import GrpcClient, open_grpc_client, send_request

pytestmark = pytest.mark.integration

TIMEOUT = 20
TOPIC = "GrpcTxn"
FAST_CHECKS = {"transaction_immunity_s": 0.3, "transaction_check_interval_s": 0.3}


def half_request(body: bytes, *, recovery_s: int | None = None) -> Any:
    req = send_request(TOPIC, body)
    system = req.messages[0].system_properties
    system.message_type = schema.MessageType.TRANSACTION
    if recovery_s is not None:
        system.orphaned_transaction_recovery_duration.seconds = recovery_s
    return req


async def send_half(client: GrpcClient, body: bytes, **kw: Any) -> Any:
    answer = (await client.unary("SendMessage", half_request(body, **kw))).one(
        schema.SendMessageResponse
    )
    assert answer.status.code == Code.OK, answer
    entry = answer.entries[0]
    assert entry.transaction_id
    return entry


async def end(client: GrpcClient, entry: Any, resolution: int, **fields: Any) -> Any:
    req = schema.EndTransactionRequest()
    req.topic.name = fields.get("topic", TOPIC)
    req.message_id = entry.message_id
    req.transaction_id = fields.get("transaction_id", entry.transaction_id)
    req.resolution = resolution
    req.source = fields.get("source", schema.TransactionSource.SOURCE_CLIENT)
    return (await client.unary("EndTransaction", req)).one(schema.EndTransactionResponse)


def published(handle: Any) -> list[bytes]:
    out: list[bytes] = []
    for queue_id in range(4):
        got = handle.broker.store.get(TOPIC, queue_id, 0, 32)
        out += [m.body for m in decode_records(got.body)] if got.body else []
    return sorted(out)


def producer_settings(topic: str) -> Any:
    command = schema.TelemetryCommand()
    settings = command.settings
    settings.client_type = schema.ClientType.PRODUCER
    settings.publishing.topics.add().name = topic
    return command


async def test_commit_publishes_rollback_drops_and_a_bad_id_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            route = (await client.unary("QueryRoute", _route(TOPIC))).one(schema.QueryRouteResponse)
            assert schema.MessageType.TRANSACTION in route.message_queues[0].accept_message_types
            committed = await send_half(client, b"commit me", recovery_s=30)
            rolled = await send_half(client, b"roll me back")
            assert published(handle) == []
            got = handle.broker.store.get(HALF_TOPIC, 0, 0, 32)
            halves = decode_records(got.body)
            assert [m.properties[PGROUP] for m in halves] == [TOPIC, TOPIC]
            assert halves[0].properties[TRAN_MSG] == "true"
            assert halves[0].properties[CHECK_IMMUNITY_TIME_IN_SECONDS] == "30"
            commit_offset, queue_offset = decode_transaction_id(committed.transaction_id)
            assert (commit_offset, queue_offset) == (halves[0].commit_log_offset, 0)

            R = schema.TransactionResolution
            assert (await end(client, committed, R.COMMIT)).status.code == Code.OK
            assert (await end(client, rolled, R.ROLLBACK)).status.code == Code.OK
            assert published(handle) == [b"commit me"]
            # Decided once: a late opposite decision changes nothing.
            assert (await end(client, committed, R.ROLLBACK)).status.code == Code.OK
            assert (await end(client, rolled, R.COMMIT)).status.code == Code.OK
            assert published(handle) == [b"commit me"]

            bad = await end(client, committed, R.COMMIT, transaction_id="not-ours")
            assert bad.status.code == Code.INVALID_TRANSACTION_ID
            wrong_topic = await send_half(client, b"other")
            refused = await end(client, wrong_topic, R.COMMIT, topic="SomeOtherTopic")
            assert refused.status.code != Code.OK
            unknown = await end(client, wrong_topic, R.TRANSACTION_RESOLUTION_UNSPECIFIED)
            assert unknown.status.code == Code.OK
            assert handle.broker.transactions.statistics().pending == 1


async def test_check_back_reaches_the_producer_on_its_telemetry_stream(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path, **FAST_CHECKS) as handle,
            open_grpc_client(handle.grpc_port) as client,
        ):
            entry = await send_half(client, b"asked about")
            async with client.open_call("Telemetry", grpc_timeout="8760H") as call:
                await call.send(producer_settings(TOPIC))
                answer = schema.TelemetryCommand.FromString(await call.receive())
                assert answer.status.code == Code.OK
                assert answer.settings.publishing.max_body_size > 0
                command = schema.TelemetryCommand.FromString(await call.receive())
                assert command.WhichOneof("command") == "recover_orphaned_transaction_command"
                recover = command.recover_orphaned_transaction_command
                assert recover.transaction_id == entry.transaction_id
                message = recover.message
                assert message.topic.name == TOPIC and message.body == b"asked about"
                assert message.system_properties.message_id == entry.message_id
                assert message.system_properties.message_type == schema.MessageType.TRANSACTION
                assert duration_ms(message.system_properties.invisible_duration) == 0
                answered = await end(
                    client, entry, schema.TransactionResolution.COMMIT,
                    source=schema.TransactionSource.SOURCE_SERVER_CHECK,
                )  # fmt: skip
                assert answered.status.code == Code.OK
                assert published(handle) == [b"asked about"]
                await call.close_send()
                await call.result()
            # The producer left with its stream: nobody is asked any more.
            assert handle.broker.clients.producer_channel(TOPIC) is None


def _route(topic: str) -> Any:
    req = schema.QueryRouteRequest()
    req.topic.name = topic
    return req
