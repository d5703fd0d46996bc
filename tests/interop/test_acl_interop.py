"""Interop with ACL on: the three Remoting clients sign with RocketMQ ACL 1.0 credentials
(ali-ons ``accessKeyId``/``accessKeySecret``, the cpp wrappers' ``set_session_credentials``)
against a broker with ``--acl-file``.

Per client: with the right secret, a producer sends every message and a push consumer of a
permitted group receives them all; with a wrong secret, every request the producer makes is
refused (the broker counts exactly as many refusals as requests) and nothing is stored. The
drivers, their bounds and the client environments are :mod:`tests.interop.test_interop`'s.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import trio

from broker.app import BrokerHandle
from protocol.acl import sign
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.headers.admin import CreateTopicRequestHeader
from scripts.interop_setup import ClientEnv
from tests.broker.client import open_broker, open_client
from tests.interop.test_interop import (
    ALI_ONS,
    CPP_1X,
    CPP_21,
    PRODUCE_TIMEOUT,
    RECEIVE_TIMEOUT,
    Client,
    DriverRun,
    LiveDriver,
    Planned,
    body_of,
    run_to_end,
)

pytestmark = pytest.mark.interop

TOPIC = "InteropAclTopic"
PRODUCER_GROUP = "interop_acl_producer"
CONSUMER_GROUP = "interop_acl_consumer"
ACCESS_KEY, SECRET = "interop01", "interop-secret"
ADMIN, ADMIN_SECRET = "admin001", "admin-secret"
SCENARIO_TIMEOUT = 240.0
ACL = f"""\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: {ACCESS_KEY}
    secretKey: {SECRET}
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [{TOPIC}=PUB|SUB]
    groupPerms: [{CONSUMER_GROUP}=SUB]
  - accessKey: {ADMIN}
    secretKey: {ADMIN_SECRET}
    admin: true
"""


def write_plan(path: Path, messages: list[Planned]) -> Path:
    items = [{"key": m.key, "tag": m.tag, "body": m.body} for m in messages]
    path.write_text(json.dumps({"topic": TOPIC, "messages": items}))
    return path


def messages(prefix: str, count: int) -> list[Planned]:
    keys = [f"{prefix}-{i}" for i in range(count)]
    return [Planned(key, "TagA", body_of(key, "TagA")) for key in keys]


def stored(broker: BrokerHandle) -> int:
    return sum(broker.broker.store.max_offset(TOPIC, q) for q in range(4))


async def create_topic_as_admin(broker: BrokerHandle) -> None:
    header = CreateTopicRequestHeader(
        topic=TOPIC, default_topic="TBW102", read_queue_nums=4, write_queue_nums=4, perm=6,
        topic_filter_type="SINGLE_TAG", order=False,
    )  # fmt: skip
    create = request(RequestCode.UPDATE_AND_CREATE_TOPIC, 0, header.to_ext())
    cmd = sign(create, ADMIN, ADMIN_SECRET)
    async with open_client(broker.port) as client:
        reply = await client.request(cmd)
    assert reply.code == ResponseCode.SUCCESS, reply.remark


CASES = [
    pytest.param(ALI_ONS, "ali-ons", id="ali-ons"),
    pytest.param(CPP_1X, "cpp-1.x", id="rocketmq-0.4.4-cpp-1.x"),
    pytest.param(CPP_21, "cpp-2.1", id="rocketmq-python-cvs-2.1.0.3-cpp-2.1"),
]


@pytest.mark.parametrize(("client", "client_env"), CASES, indirect=["client_env"])
async def test_signed_produce_and_consume_and_a_wrong_secret_is_refused(
    client: Client, client_env: ClientEnv, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = client.environ(client_env, home)
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(textwrap.dedent(ACL))
    good = messages("ok", 4)

    def command(*args: str, secret: str = SECRET) -> list[str]:
        creds = ("--access-key", ACCESS_KEY, "--secret-key", secret)
        return client.command(client_env, *args, "--namesrv", address, *creds)

    with trio.fail_after(SCENARIO_TIMEOUT):
        async with open_broker(tmp_path / "data", acl_file=acl) as broker:
            address = f"127.0.0.1:{broker.port}"
            if client.create_topic:
                await create_topic_as_admin(broker)

            # The right secret: every message is sent...
            run = DriverRun(f"{client.name} producer", tmp_path / "produce.err")
            plan = write_plan(tmp_path / "plan.json", good)
            await run_to_end(command("produce", "--group", PRODUCER_GROUP, "--plan", str(plan)),
                             env, run, PRODUCE_TIMEOUT)  # fmt: skip
            assert run.returncode == 0 and run.of("done"), run.report()
            assert [e["key"] for e in run.of("sent")] == [m.key for m in good], run.report()
            assert all(e["status"] in (0, "SEND_OK") for e in run.of("sent")), run.report()
            assert stored(broker) == len(good)

            # ... and a consumer of the permitted group receives them all.
            args = ["consume", "--group", CONSUMER_GROUP, "--topic", TOPIC, "--expression", "*"]
            if not client.shutdown:
                args.append("--skip-shutdown")
            consumer = LiveDriver(DriverRun(f"{client.name} consumer", tmp_path / "consume.err"))
            async with trio.open_nursery() as nursery:
                await nursery.start(consumer.serve, command(*args), env)
                await consumer.wait_for(
                    "every message",
                    lambda: (
                        {e["key"] for e in consumer.run.of("received")} >= {m.key for m in good}
                    ),
                    RECEIVE_TIMEOUT,
                )
                await consumer.stop()
            for e in consumer.run.of("received"):
                want = {m.key: m for m in good}[e["key"]]
                assert e["body_sha256"] == want.sha256, consumer.run.report()
            assert broker.statistics().remoting.denied == 0

            # A wrong secret: every request is refused and nothing is stored.
            before = broker.statistics().remoting
            bad = DriverRun(f"{client.name} producer, wrong secret", tmp_path / "forged.err")
            plan = write_plan(tmp_path / "forged.json", messages("forged", 2))
            await run_to_end(
                command("produce", "--group", PRODUCER_GROUP, "--plan", str(plan),
                        secret="not-the-secret"),
                env, bad, PRODUCE_TIMEOUT,
            )  # fmt: skip
            after = broker.statistics().remoting
            assert not bad.of("sent"), bad.report()
            assert stored(broker) == len(good)
            requests, denied = after.requests - before.requests, after.denied - before.denied
            assert requests > 0 and denied == requests, (requests, denied, bad.report())
