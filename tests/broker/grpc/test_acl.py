"""ACL 1.0 on the gRPC port: the ``MQv2-HMAC-SHA1`` credential the official 5.x clients send,
checked against the same ``plain_acl.yml`` as the Remoting port. Each refusal is followed by an
allowed call on the same connection; a refused send stores nothing."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.acl.grpc import credential_of, signature_ok
from protocol.grpc import schema
from protocol.grpc.codes import Code
from tests.broker.client import open_broker
from tests.broker.grpc.client import (
    GrpcClient,
    open_grpc_client,
    receive_request,
    route_request,
    send_request,
)
from tests.broker.test_acl import ACL, SECRETS, write_acl

pytestmark = pytest.mark.integration

TIMEOUT = 20
DATE = "20261124T101443Z"


def signed(access_key: str, secret: str | None = None, *, date: str = DATE) -> dict[str, str]:
    """The metadata an official client signs a call with (hex in upper case: any case is
    accepted)."""
    key = (secret if secret is not None else SECRETS[access_key]).encode()
    digest = hmac.new(key, date.encode(), hashlib.sha1).hexdigest().upper()
    return {
        "x-mq-date-time": date,
        "authorization": f"MQv2-HMAC-SHA1 Credential={access_key}, "
        f"SignedHeaders=x-mq-date-time, Signature={digest}",
    }


def test_credential_parsing_and_signature() -> None:
    md = signed("producer1")
    assert credential_of(md)[0] == "producer1"
    assert signature_ok(md, credential_of(md)[1], "producer-secret")
    assert not signature_ok(md, credential_of(md)[1], "other")
    assert not signature_ok({}, credential_of(md)[1], "producer-secret")  # no date header
    assert credential_of({"authorization": "Basic abc"}) == ("", "")
    assert not signature_ok(md, "not-hex", "producer-secret")


async def send_code(client: GrpcClient, topic: str, md: dict[str, str]) -> int:
    reply = await client.unary("SendMessage", send_request(topic), metadata=md)
    code: int = reply.one(schema.SendMessageResponse).status.code
    return code


async def test_every_call_needs_a_credential_and_a_right(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path / "data", acl_file=acl) as handle,
            open_grpc_client(handle.grpc_port) as client,
        ):
            store = handle.broker.store
            # Refusals, each followed by an allowed call on the same connection.
            assert await send_code(client, "orders", {}) == Code.UNAUTHORIZED
            assert await send_code(client, "orders", signed("nobody12", "x")) == Code.UNAUTHORIZED
            wrong = signed("producer1", "wrong-secret")
            assert await send_code(client, "orders", wrong) == Code.UNAUTHORIZED
            assert await send_code(client, "other", signed("producer1")) == Code.FORBIDDEN
            assert store.max_offset("orders", 0) + store.max_offset("other", 0) == 0
            assert await send_code(client, "orders", signed("producer1")) == Code.OK
            # Any date-time works (no clock check), with its own signature.
            late = signed("producer1", date="20200101T000000Z")
            assert await send_code(client, "orders", late) == Code.OK

            route = await client.unary("QueryRoute", route_request("orders"), metadata={})
            assert route.one(schema.QueryRouteResponse).status.code == Code.UNAUTHORIZED
            route = await client.unary(
                "QueryRoute", route_request("orders"), metadata=signed("consumer1")
            )
            assert route.one(schema.QueryRouteResponse).status.code == Code.OK

            def receive(group: str) -> Any:
                return receive_request("orders", group, poll_s=5)

            refused = await client.server_streaming(
                "ReceiveMessage", receive("not-cg"), metadata=signed("consumer1")
            )
            [answer] = refused.decode(schema.ReceiveMessageResponse)
            assert answer.status.code == Code.FORBIDDEN
            assert "not-cg" in answer.status.message
            got = await client.server_streaming(
                "ReceiveMessage", receive("cg"), metadata=signed("consumer1")
            )
            statuses = [
                r.status.code
                for r in got.decode(schema.ReceiveMessageResponse)
                if r.WhichOneof("content") == "status"
            ]
            assert statuses == [Code.OK]
            assert handle.statistics().core.clients is not None


async def test_telemetry_settings_are_checked_per_command(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path / "data", acl_file=acl) as handle,
            open_grpc_client(handle.grpc_port) as client,
        ):

            def publishing(topic: str) -> Any:
                command = schema.TelemetryCommand()
                command.settings.client_type = schema.ClientType.PRODUCER
                command.settings.publishing.topics.add().name = topic
                return command

            async with client.open_call(
                "Telemetry", grpc_timeout="8760H", metadata=signed("producer1")
            ) as call:
                await call.send(publishing("other"))
                answer = schema.TelemetryCommand.FromString(await call.receive())
                assert answer.status.code == Code.FORBIDDEN
                await call.send(publishing("orders"))
                answer = schema.TelemetryCommand.FromString(await call.receive())
                assert answer.status.code == Code.OK and answer.HasField("settings")
                await call.close_send()
                await call.result()
