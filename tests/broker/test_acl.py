"""ACL 1.0 on the broker and the name server, over TCP: every refusal is NO_PERMISSION on the
request's opaque and the connection keeps working; refused requests store nothing; the file
is reloaded when it changes (a bad file keeps the rules in force); broker registrations need
credentials; our Producer and SimpleConsumer sign."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from broker.acl import AclFileError, AclGuard
from broker.app import BrokerHandle
from broker.config import ConfigError
from broker.config import load as load_broker_config
from broker.namesrv.config import load as load_namesrv_config
from client.admin import main as admin_main
from client.config import ClientConfig
from client.errors import ClientError
from client.message import Message
from client.producer import Producer
from client.simple_consumer import SimpleConsumer
from protocol.acl import authorize_request, sign
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import BrokerError
from protocol.headers.admin import CreateTopicRequestHeader
from tests.broker.client import BrokerClient, open_broker, open_client
from tests.broker.test_server import heartbeat_body, send_header, send_v2
from tests.client.harness import broker_thread
from tests.namesrv.support import open_namesrv, wait_until

pytestmark = pytest.mark.integration

TIMEOUT = 20
SECRETS = {
    "producer1": "producer-secret",
    "consumer1": "12345678",
    "admin001": "admin-secret",
    "nearby01": "nearby-secret",
    "faraway1": "faraway-secret",
    "broker01": "broker-secret",
}
ACL = """\
globalWhiteRemoteAddresses: [10.0.0.*]
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [orders=PUB]
  - accessKey: consumer1
    secretKey: 12345678
    topicPerms: [orders=SUB]
    groupPerms: [cg=SUB]
  - accessKey: admin001
    secretKey: admin-secret
    admin: true
  - accessKey: nearby01
    secretKey: nearby-secret
    whiteRemoteAddress: 127.0.0.1
    topicPerms: [orders=PUB]
  - accessKey: faraway1
    secretKey: faraway-secret
    whiteRemoteAddress: 10.9.9.*
    topicPerms: [orders=PUB]
  - accessKey: broker01
    secretKey: broker-secret
"""


def write_acl(path: Path, text: str) -> Path:
    """Replace the file in one step (a new inode, as editors and config tools do)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(textwrap.dedent(text))
    os.replace(tmp, path)
    return path


def signed(cmd: RemotingCommand, who: str, secret: str | None = None) -> RemotingCommand:
    return sign(cmd, who, SECRETS[who] if secret is None else secret)


def send_to(topic: str) -> RemotingCommand:
    return send_v2(send_header(topic))


def create_topic_cmd(topic: str) -> RemotingCommand:
    header = CreateTopicRequestHeader(
        topic=topic, default_topic="TBW102", read_queue_nums=4, write_queue_nums=4, perm=6,
        topic_filter_type="SINGLE_TAG", order=False,
    )  # fmt: skip
    return request(RequestCode.UPDATE_AND_CREATE_TOPIC, 0, header.to_ext())


def stored(broker: BrokerHandle, topic: str) -> int:
    return sum(broker.broker.store.max_offset(topic, q) for q in range(4))


async def expect_refused(client: BrokerClient, cmd: RemotingCommand, remark: str) -> None:
    reply = await client.request(cmd)
    assert reply.code == ResponseCode.NO_PERMISSION, (reply.code, reply.remark)
    assert reply.remark is not None and remark in reply.remark, reply.remark
    assert not any(secret in reply.remark for secret in SECRETS.values())


async def expect_ok(client: BrokerClient, cmd: RemotingCommand) -> RemotingCommand:
    reply = await client.request(cmd)
    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
    return reply


async def test_each_refusal_keeps_the_connection_and_stores_nothing(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    pull = request(RequestCode.PULL_MESSAGE, 0, {"topic": "orders", "consumerGroup": "g2"})
    refusals = [
        (send_to("orders"), "no AccessKey"),
        (signed(send_to("orders"), "stranger", "whatever1"), "'stranger' is not in the ACL file"),
        (signed(send_to("orders"), "producer1", "wrong-secret"), "signature check failed"),
        (signed(send_to("other"), "producer1"), "no PUB permission on topic 'other'"),
        (signed(pull, "consumer1"), "'consumer1' has no SUB permission on group 'g2'"),
        (signed(create_topic_cmd("more"), "producer1"), "'producer1' is not admin"),
        # faraway1 is whitelisted at 10.9.9.*, not at this peer: its unsigned claim fails.
        (request(RequestCode.SEND_MESSAGE_V2, 0, {**send_to("orders").ext_fields,
                                                  "AccessKey": "faraway1"}, b"x"),
         "signature check failed for AccessKey 'faraway1'"),
    ]  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data", acl_file=acl) as broker:
            async with open_client(broker.port) as client:
                await expect_ok(client, signed(create_topic_cmd("orders"), "admin001"))
                for cmd, remark in refusals:
                    await expect_refused(client, cmd, remark)
                    await expect_ok(client, signed(send_to("orders"), "producer1"))
                # nearby01's own address (this one) stands in for its signature.
                claim = {**send_to("orders").ext_fields, "AccessKey": "nearby01"}
                await expect_ok(client, request(RequestCode.SEND_MESSAGE_V2, 0, claim, b"x"))
                assert not client.closed.is_set()
            assert stored(broker, "orders") == len(refusals) + 1
            assert broker.statistics().remoting.denied == len(refusals)
            assert stored(broker, "other") == 0 and "more" not in broker.broker.topics.names()


async def test_refused_oneway_requests_take_no_effect(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data", acl_file=acl) as broker:
            async with open_client(broker.port) as client:
                body = heartbeat_body("c@1", "cg", "orders")
                beat = request(RequestCode.HEART_BEAT, 71, body=body, oneway=True)
                await client.send(signed(beat, "consumer1", "wrong-secret"))
                other = send_to("other").ext_fields
                send = request(RequestCode.SEND_MESSAGE_V2, 72, other, b"x", oneway=True)
                await client.send(signed(send, "producer1"))
                members = request(
                    RequestCode.GET_CONSUMER_LIST_BY_GROUP, 0, {"consumerGroup": "cg"}
                )
                reply = await expect_ok(client, signed(members, "consumer1"))
                assert b"c@1" not in reply.body
                assert not client.has_reply(71) and not client.has_reply(72)
                # The same heartbeat, signed properly, does register the consumer.
                await client.send(signed(beat, "consumer1"))
                reply = await expect_ok(client, signed(members, "consumer1"))
                assert b"c@1" in reply.body
            assert stored(broker, "other") == 0


async def test_acl_off_ignores_credentials(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data") as broker, open_client(broker.port) as client:
            await expect_ok(client, send_to("orders"))
            await expect_ok(client, signed(send_to("orders"), "producer1", "wrong-secret"))
            assert stored(broker, "orders") == 2


async def test_the_file_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    other = signed(send_to("other"), "producer1")

    async def answer(client: BrokerClient, cmd: RemotingCommand) -> int:
        return (await client.request(cmd)).code

    async def until(client: BrokerClient, cmd: RemotingCommand, code: int) -> None:
        async def check() -> bool:
            return await answer(client, cmd) == code

        await wait_until(check, 10, every=0.2)

    with trio.fail_after(4 * TIMEOUT):
        async with open_broker(tmp_path / "data", acl_file=acl) as broker:
            async with open_client(broker.port) as client:
                assert await answer(client, other) == ResponseCode.NO_PERMISSION
                write_acl(acl, ACL.replace("[orders=PUB]", "[orders=PUB, other=PUB]", 1))
                await until(client, other, ResponseCode.SUCCESS)
                # A broken file is refused: the rules in force stay, and requests keep
                # being decided by them (it is looked at again within about a second).
                write_acl(acl, "accounts: [{accessKey: x}]\n")
                await trio.sleep(1.5)
                assert await answer(client, other) == ResponseCode.SUCCESS
                assert await answer(client, send_to("orders")) == ResponseCode.NO_PERMISSION
                # The global whitelist reaches this peer: no credentials needed any more.
                write_acl(acl, ACL.replace("[10.0.0.*]", "[127.0.0.1]"))
                await until(client, send_to("orders"), ResponseCode.SUCCESS)
                assert await answer(client, other) == ResponseCode.SUCCESS  # global: anything
            assert stored(broker, "other") >= 2


def test_guard_reloads_lazily_and_keeps_rules_when_the_file_breaks(tmp_path: Path) -> None:
    now = [0.0]
    clock: Callable[[], float] = lambda: now[0]  # noqa: E731
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    guard = AclGuard(acl, authorize_request, check_interval_s=1.0, clock=clock)
    other = signed(send_to("other"), "producer1")
    peer = "127.0.0.1:5555"
    assert guard(peer, other) is not None and guard.refused == 1
    write_acl(acl, ACL.replace("[orders=PUB]", "[orders=PUB, other=PUB]", 1))
    now[0] = 0.5
    assert guard(peer, other) is not None  # not looked at within the interval
    now[0] = 1.0
    assert guard(peer, other) is None and guard.reloads == 1
    for broken in ("accounts: [", "accounts: [{accessKey: shortk1, secretKey: 1}]", ""):
        write_acl(acl, broken) if broken else acl.unlink()
        now[0] += 1.0
        assert guard(peer, other) is None and guard.reloads == 1, broken
    refusal = guard(peer, send_to("orders"))
    assert refusal is not None and refusal.code == ResponseCode.NO_PERMISSION
    assert not guard.check_file()  # nothing changed since the last look


def test_a_bad_file_at_start_is_an_error_naming_it(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", "accounts:\n  - accessKey: producer1\n")
    with pytest.raises(AclFileError, match=r"plain_acl\.yml.*secretKey"):
        AclGuard(acl, authorize_request)
    with pytest.raises(AclFileError, match=r"missing\.yml"):
        AclGuard(tmp_path / "missing.yml", authorize_request)
    write_acl(acl, "accounts: [\n")
    with pytest.raises(AclFileError, match="not YAML"):
        AclGuard(acl, authorize_request)


async def test_name_server_registrations_need_credentials(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    with trio.fail_after(2 * TIMEOUT):
        async with open_namesrv(acl_file=acl) as ns:
            addr = ns.address
            async with open_broker(tmp_path / "good", namesrv_addr=addr, broker_name="good",
                                   acl_access_key="broker01",
                                   acl_secret_key="broker-secret") as good, \
                    open_broker(tmp_path / "bad", namesrv_addr=addr, broker_name="bad",
                                acl_access_key="broker01", acl_secret_key="not-the-secret",
                                register_interval_s=0.2) as bad, \
                    open_broker(tmp_path / "none", namesrv_addr=addr, broker_name="none",
                                register_interval_s=0.2) as none:  # fmt: skip
                for handle in (good, bad, none):
                    assert handle.registrar is not None

                async def settled() -> bool:
                    assert good.registrar and bad.registrar and none.registrar
                    return (
                        good.registrar.registered[addr] >= 1
                        and addr in bad.registrar.failing
                        and addr in none.registrar.failing
                    )

                await wait_until(settled, 10, every=0.05)
                assert bad.registrar is not None and none.registrar is not None
                assert bad.registrar.registered[addr] == 0 == none.registrar.registered[addr]
                assert ns.ctx.server.statistics().denied >= 2
                # Route queries stay open, unsigned.
                async with open_client(ns.port) as client:
                    reply = await client.call(RequestCode.GET_BROKER_CLUSTER_INFO)
                    assert reply.code == ResponseCode.SUCCESS
                    assert b'"good"' in reply.body and b'"bad"' not in reply.body
                    assert b'"none"' not in reply.body


async def test_our_producer_and_simple_consumer_sign(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    with trio.fail_after(2 * TIMEOUT):
        async with open_broker(tmp_path / "data", acl_file=acl) as broker:

            def config(who: str, secret: str | None = None) -> ClientConfig:
                return ClientConfig(
                    namesrv_addr=broker.address,
                    request_timeout=5.0,
                    backoff_initial=0.01,
                    access_key=who,
                    secret_key=SECRETS[who] if secret is None else secret,
                )

            producing, consuming = config("producer1"), config("consumer1")
            async with SimpleConsumer(
                consuming, group="cg", subscription={"orders": "*"}, consume_from="first"
            ) as consumer:
                async with Producer(producing) as producer:
                    for i in range(3):
                        await producer.send(Message("orders", f"m{i}".encode()))
                got: list[bytes] = []
                for _ in range(20):  # bounded
                    batch = await consumer.receive(32, invisible_duration=30, await_duration=1)
                    for message in batch:
                        got.append(message.body)
                        await consumer.ack(message)
                    if len(got) >= 3:
                        break
                assert sorted(got) == [b"m0", b"m1", b"m2"]
            # A wrong secret: every request is refused, nothing is stored.
            wrong = config("producer1", "not-the-secret")
            before = stored(broker, "orders")
            async with Producer(wrong) as producer:
                with pytest.raises((ClientError, BrokerError)) as info:
                    await producer.send(Message("orders", b"forged"))
            assert "signature check failed" in str(info.value), info.value
            # The consumer account may read "orders" but not write it.
            async with Producer(consuming) as producer:
                with pytest.raises((ClientError, BrokerError), match="no PUB permission"):
                    await producer.send(Message("orders", b"nope"))
            assert stored(broker, "orders") == before == 3


def test_settings_flags_and_environment(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    assert load_broker_config([], env={}).acl_file is None
    config = load_broker_config(["--acl-file", str(acl), "--acl-access-key", "broker01"],
                                env={"TRIMQ_ACL_SECRET_KEY": "broker-secret"})  # fmt: skip
    assert (config.acl_file, config.acl_access_key, config.acl_secret_key) == (
        acl, "broker01", "broker-secret",
    )  # fmt: skip
    assert load_broker_config([], env={"TRIMQ_ACL_FILE": str(acl)}).acl_file == acl
    with pytest.raises(ConfigError, match="go together"):
        load_broker_config(["--acl-access-key", "broker01"], env={})
    assert load_namesrv_config(["--acl-file", str(acl)], env={}).acl_file == acl
    assert load_namesrv_config([], env={"TRIMQ_NAMESRV_ACL_FILE": str(acl)}).acl_file == acl
    assert load_namesrv_config([], env={}).acl_file is None
    # The command line reads the file once: a bad one is a settings error naming it.
    bad = write_acl(tmp_path / "bad.yml", "accounts: [{accessKey: producer1}]")
    missing = tmp_path / "missing.yml"
    with pytest.raises(ConfigError, match=r"acl_file: .*missing\.yml"):
        load_broker_config(["--acl-file", str(missing)], env={})
    with pytest.raises(ConfigError, match="secretKey"):
        load_broker_config([], env={"TRIMQ_ACL_FILE": str(bad)})
    with pytest.raises(ConfigError, match=r"acl_file: .*missing\.yml"):
        load_namesrv_config(["--acl-file", str(missing)], env={})
    with pytest.raises(ConfigError, match="secretKey"):
        load_namesrv_config([], env={"TRIMQ_NAMESRV_ACL_FILE": str(bad)})


def test_client_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TRIMQ_SECRET_KEY", raising=False)
    assert ClientConfig().access_key is None
    monkeypatch.setenv("TRIMQ_ACCESS_KEY", "producer1")
    with pytest.raises(ValueError, match="go together"):
        ClientConfig()
    monkeypatch.setenv("TRIMQ_SECRET_KEY", "producer-secret")
    config = ClientConfig()
    assert (config.access_key, config.secret_key) == ("producer1", "producer-secret")
    assert "producer-secret" not in repr(config)


def test_admin_cli_signs_with_its_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRIMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("TRIMQ_SECRET_KEY", raising=False)
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    with broker_thread(tmp_path / "data", acl_file=acl) as broker:

        def admin(*args: str) -> tuple[int, str]:
            code = admin_main(["-n", broker.address, "--timeout", "5", *args])
            out, err = capsys.readouterr()
            assert "Traceback" not in err and "admin-secret" not in err
            return code, out + err

        create = ("updateTopic", "-t", "made", "-b", broker.address)
        code, text = admin(*create)
        assert code == 1 and "NO_PERMISSION" in text and "no AccessKey" in text, text
        code, text = admin("--access-key", "producer1", "--secret-key", "producer-secret", *create)
        assert code == 1 and "'producer1' is not admin" in text, text
        code, text = admin("--access-key", "admin001", "--secret-key", "admin-secret", *create)
        assert code == 0, text
        monkeypatch.setenv("TRIMQ_ACCESS_KEY", "admin001")
        monkeypatch.setenv("TRIMQ_SECRET_KEY", "admin-secret")
        code, text = admin("topicList")
        assert code == 0 and "made" in text, text
        with pytest.raises(SystemExit):
            admin_main(["--access-key", "admin001", "topicList"])
