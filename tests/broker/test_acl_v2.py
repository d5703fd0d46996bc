"""ACL 2.0 files on the broker and the name server, over TCP: our clients allowed and refused
(NO_PERMISSION, the connection keeps working), prefix and Deny rules, an admin request on a
Cluster rule, the file reloaded (also from one format to the other), registrations with the
name server, the gRPC port (allowed and FORBIDDEN), and ``python -m broker.acl import``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import yaml

from broker.acl import AclGuard, load_rules, main
from client.config import ClientConfig
from client.errors import ClientError
from client.message import Message
from client.producer import Producer
from client.simple_consumer import SimpleConsumer
from protocol.acl import AclModel, authorize_request, sign
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import BrokerError
from protocol.grpc import schema
from protocol.grpc.codes import Code
from tests.broker.client import BrokerClient, open_broker, open_client
from tests.broker.grpc.client import open_grpc_client, send_request
from tests.broker.grpc.test_acl import signed as grpc_signed
from tests.broker.test_acl import (
    ACL,
    create_topic_cmd,
    expect_ok,
    expect_refused,
    send_to,
    stored,
    write_acl,
)
from tests.namesrv.support import open_namesrv, wait_until

pytestmark = pytest.mark.integration

TIMEOUT = 20
SECRETS = {
    "orders-app": "orders-secret",
    "reader01": "reader-secret",
    "ops-team": "ops-secret",
    "root-user": "root-secret",
    "retired1": "retired-secret",
    "broker01": "broker-secret",
}
ACL2 = """\
users:
  - {username: orders-app, password: orders-secret}
  - {username: reader01, password: reader-secret}
  - {username: ops-team, password: ops-secret}
  - {username: root-user, password: root-secret, userType: Super}
  - {username: retired1, password: retired-secret, userStatus: disable}
  - {username: broker01, password: broker-secret}
acls:
  - subject: User:orders-app
    policies:
      - entries:
          - {resource: [Topic:order*], actions: [Pub], decision: Allow}
          - {resource: [Topic:order-audit], actions: [All], decision: Deny}
  - subject: User:reader01
    policies:
      - entries:
          - {resource: [Topic:orders, Group:cg], actions: [Sub], decision: Allow}
      - policyType: Default
        entries:
          - {resource: ["*"], actions: [Get], decision: Allow}
  - subject: User:ops-team
    policies:
      - entries:
          - {resource: [Topic:orders], actions: [Create], decision: Allow}
          - {resource: [Cluster:*], actions: [Update], sourceIps: [10.0.0.0/8], decision: Allow}
  - subject: User:retired1
    policies:
      - entries:
          - {resource: ["*"], actions: [All], decision: Allow}
"""


def signed(cmd: RemotingCommand, who: str, secret: str | None = None) -> RemotingCommand:
    return sign(cmd, who, SECRETS[who] if secret is None else secret)


def client_config(port: int, who: str, secret: str | None = None) -> ClientConfig:
    return ClientConfig(
        namesrv_addr=f"127.0.0.1:{port}",
        request_timeout=5.0,
        backoff_initial=0.01,
        access_key=who,
        secret_key=SECRETS[who] if secret is None else secret,
    )


async def test_remoting_requests_under_a_2_0_file(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "acl.yml", ACL2)
    broker_config = request(RequestCode.UPDATE_BROKER_CONFIG, 0, {}, b"x=1")
    refusals = [
        (send_to("orders"), "no AccessKey"),
        (signed(send_to("orders"), "stranger", "whatever1"), "'stranger' is not in the ACL"),
        (signed(send_to("orders"), "orders-app", "wrong"), "signature check failed"),
        (signed(send_to("other"), "orders-app"), "no Pub permission on Topic 'other'"),
        (signed(send_to("order-audit"), "orders-app"), "denied by Topic:order-audit"),
        (signed(send_to("orders"), "retired1"), "'retired1' is disabled"),
        (signed(create_topic_cmd("more"), "ops-team"), "no Create permission on Topic 'more'"),
        # ops-team may change the broker's configuration from 10.0.0.0/8 only.
        (signed(broker_config, "ops-team"), "no Update permission on Cluster"),
    ]
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data", acl_file=acl) as broker:
            async with open_client(broker.port) as client:
                await expect_ok(client, signed(create_topic_cmd("orders"), "ops-team"))
                for cmd, remark in refusals:
                    await expect_refused(client, cmd, remark)
                    await expect_ok(client, signed(send_to("orders"), "orders-app"))
                await expect_ok(client, signed(send_to("order-events"), "orders-app"))
                # Traces pass once signed; a request naming no resource needs only that.
                await expect_ok(client, signed(send_to("RMQ_SYS_TRACE_TOPIC"), "reader01"))
                route = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 0, {"topic": "orders"})
                await expect_ok(client, signed(route, "reader01"))
                query = {"topic": "orders", "consumerGroup": "other", "queueId": "0"}
                offset = request(RequestCode.QUERY_CONSUMER_OFFSET, 0, query)
                # Get (the Default policy) answers an offset query: not found, not refused.
                reply = await client.request(signed(offset, "reader01"))
                assert reply.code != ResponseCode.NO_PERMISSION, reply.remark
                assert not client.closed.is_set()
            assert stored(broker, "orders") == len(refusals)
            assert stored(broker, "other") == 0 == stored(broker, "order-audit")
            assert broker.statistics().remoting.denied == len(refusals)
            assert "more" not in broker.broker.topics.names()


async def test_our_clients_sign_with_2_0_users(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "acl.yml", ACL2)
    with trio.fail_after(2 * TIMEOUT):
        async with open_broker(tmp_path / "data", acl_file=acl) as broker:
            producing = client_config(broker.port, "orders-app")
            consuming = client_config(broker.port, "reader01")
            async with SimpleConsumer(
                consuming, group="cg", subscription={"orders": "*"}, consume_from="first"
            ) as consumer:
                async with Producer(producing) as producer:
                    for i in range(3):
                        await producer.send(Message("orders", f"m{i}".encode()))
                    with pytest.raises((ClientError, BrokerError), match="no Pub permission"):
                        await producer.send(Message("other", b"refused"))
                    await producer.send(Message("orders", b"m3"))  # still working
                got: list[bytes] = []
                for _ in range(20):  # bounded
                    batch = await consumer.receive(32, invisible_duration=30, await_duration=1)
                    for message in batch:
                        got.append(message.body)
                        await consumer.ack(message)
                    if len(got) >= 4:
                        break
                assert sorted(got) == [b"m0", b"m1", b"m2", b"m3"]
            async with Producer(consuming) as producer:
                with pytest.raises((ClientError, BrokerError), match="no Pub permission"):
                    await producer.send(Message("orders", b"nope"))
            assert stored(broker, "orders") == 4 and stored(broker, "other") == 0


def test_the_guard_decides_by_the_file_it_last_read(tmp_path: Path) -> None:
    """A replaced file (atomic rename) decides the next request once looked at, whatever
    its format; a broken one keeps the rules in force."""
    now = [0.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    acl = write_acl(tmp_path / "acl.yml", ACL2)
    guard = AclGuard(acl, authorize_request, check_interval_s=1.0, clock=clock)
    assert isinstance(guard.rules, AclModel)
    other = signed(send_to("other"), "orders-app")
    peer = "127.0.0.1:5555"
    assert guard(peer, other) is not None
    write_acl(acl, ACL2.replace("Topic:order*]", "Topic:order*, Topic:other]"))
    now[0] = 1.0
    assert guard(peer, other) is None and guard.reloads == 1
    write_acl(acl, ACL2.replace("decision: Allow", "decision: Perhaps", 1))
    now[0] = 2.0
    assert guard(peer, other) is None and guard.reloads == 1  # broken: the rules stay
    # Back to plain_acl.yml: its accounts decide now.
    write_acl(acl, ACL)
    now[0] = 3.0
    assert guard(peer, other) is not None and guard.reloads == 2
    assert guard(peer, sign(send_to("orders"), "producer1", "producer-secret")) is None


async def test_the_file_is_reloaded_over_tcp(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "acl.yml", ACL2)
    other = signed(send_to("other"), "orders-app")

    async def answer(client: BrokerClient) -> int:
        return (await client.request(other)).code

    with trio.fail_after(2 * TIMEOUT):
        async with open_broker(tmp_path / "data", acl_file=acl) as broker:
            async with open_client(broker.port) as client:
                assert await answer(client) == ResponseCode.NO_PERMISSION
                write_acl(acl, ACL2.replace("Topic:order*]", "Topic:order*, Topic:other]"))

                async def allowed() -> bool:
                    return await answer(client) == ResponseCode.SUCCESS

                # The file is looked at no more than once a second.
                await wait_until(allowed, 10, every=0.1)
            assert stored(broker, "other") >= 1


async def test_name_server_registrations_under_a_2_0_file(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "acl.yml", ACL2)
    with trio.fail_after(2 * TIMEOUT):
        async with open_namesrv(acl_file=acl) as ns:
            addr = ns.address
            async with open_broker(tmp_path / "good", namesrv_addr=addr, broker_name="good",
                                   acl_access_key="broker01",
                                   acl_secret_key="broker-secret") as good, \
                    open_broker(tmp_path / "off", namesrv_addr=addr, broker_name="off",
                                acl_access_key="retired1", acl_secret_key="retired-secret",
                                register_interval_s=0.2) as off:  # fmt: skip

                async def settled() -> bool:
                    assert good.registrar is not None and off.registrar is not None
                    return good.registrar.registered[addr] >= 1 and addr in off.registrar.failing

                await wait_until(settled, 10, every=0.05)
                assert off.registrar is not None and off.registrar.registered[addr] == 0
            async with open_client(ns.port) as client:
                delete = request(RequestCode.DELETE_TOPIC_IN_NAMESRV, 0, {"topic": "orders"})
                await expect_refused(client, signed(delete, "broker01"), "Cluster")
                # A Super user passes (the name server does not serve the request).
                reply = await client.request(signed(delete, "root-user"))
                assert reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED, reply.remark
                put = request(RequestCode.PUT_KV_CONFIG, 0,
                              {"namespace": "n", "key": "k", "value": "v"})  # fmt: skip
                await expect_refused(client, put, "no AccessKey")
                await expect_ok(client, signed(put, "broker01"))


async def test_grpc_calls_under_a_2_0_file(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "acl.yml", ACL2)

    def md(who: str) -> dict[str, str]:
        return grpc_signed(who, SECRETS[who])

    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path / "data", acl_file=acl) as broker,
            open_grpc_client(broker.grpc_port) as client,
        ):

            async def send(topic: str, who: str) -> int:
                reply = await client.unary("SendMessage", send_request(topic), metadata=md(who))
                code: int = reply.one(schema.SendMessageResponse).status.code
                return code

            assert await send("other", "orders-app") == Code.FORBIDDEN
            assert await send("orders", "orders-app") == Code.OK
            assert await send("orders", "retired1") == Code.UNAUTHORIZED
            assert stored(broker, "orders") == 1 and stored(broker, "other") == 0


def test_import_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = write_acl(tmp_path / "plain_acl.yml", ACL.replace("[10.0.0.*]", "[]"))
    assert main(["import", str(plain)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "whiteRemoteAddress '127.0.0.1'" in err and "import again" in err
    # Without the whitelisted accounts, the file imports; the 2.0 file decides alike.
    lines = ACL.replace("[10.0.0.*]", "[]").split("  - accessKey: nearby01")[0]
    more = "  - accessKey: broker01\n    secretKey: broker-secret\n"
    plain = write_acl(tmp_path / "plain_acl.yml", lines + more)
    assert main(["import", str(plain)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("# ACL 2.0 rules imported from plain_acl.yml")
    converted = write_acl(tmp_path / "acl.yml", out)
    model = load_rules(converted)
    assert isinstance(model, AclModel) and set(model.users) == {
        "producer1", "consumer1", "admin001", "broker01"
    }  # fmt: skip
    assert yaml.safe_load(out)["users"][2]["userType"] == "Super"
    for path in (plain, converted):
        guard = AclGuard(path, authorize_request)
        peer = "127.0.0.1:1"
        assert guard(peer, sign(send_to("orders"), "producer1", "producer-secret")) is None
        assert guard(peer, sign(send_to("other"), "producer1", "producer-secret")) is not None
        create = sign(create_topic_cmd("x"), "admin001", "admin-secret")
        assert guard(peer, create) is None
    # A 2.0 file is not imported again; a missing file is an error, not a traceback.
    assert main(["import", str(converted)]) == 1
    assert "already an ACL 2.0 file" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "missing.yml")]) == 1
    assert "missing.yml" in capsys.readouterr().err
