"""Our client library and a third-party RocketMQ client through one broker, both directions.

* ali-ons produces (TagA/TagB, one ~6 KiB body it compresses) → our PushConsumer (pull mode,
  JSON headers) receives every message with its key, tag and intact body (inflated);
* our Producer sends (one ~6 KiB body we compress with zlib, as the Java producer does) →
  the ali-ons consumer, subscribed to TagA, receives exactly the TagA messages, intact.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio

from client.config import ClientConfig
from client.message import Message, ReceivedMessage
from client.producer import Producer
from client.push import ConsumeResult, PushConsumer
from scripts.interop_setup import ClientEnv
from tests.broker.client import open_broker
from tests.interop.test_interop import (
    ALI_ONS,
    PRODUCE_TIMEOUT,
    RECEIVE_TIMEOUT,
    DriverRun,
    LiveDriver,
    create_topic,
    plan,
    run_to_end,
    write_plan,
)

pytestmark = pytest.mark.interop
TOPIC = "InteropTopic"  # the topic the interop plans name
ALI = [pytest.param("ali-ons", id="ali-ons")]


@pytest.mark.parametrize("client_env", ALI, indirect=True)
async def test_ali_ons_produces_our_consumer_receives(
    client_env: ClientEnv, tmp_path: Path
) -> None:
    messages = plan(1)
    home = tmp_path / "home"
    home.mkdir()
    env = ALI_ONS.environ(client_env, home)
    with trio.fail_after(PRODUCE_TIMEOUT + RECEIVE_TIMEOUT):
        async with open_broker(tmp_path / "data") as broker:
            address = f"127.0.0.1:{broker.port}"
            await create_topic(broker, TOPIC)
            run = DriverRun("ali-ons producer", tmp_path / "produce.err")
            command = ALI_ONS.command(
                client_env, "produce", "--group", "ip", "--plan",
                str(write_plan(tmp_path / "plan.json", messages)), "--namesrv", address,
            )  # fmt: skip
            await run_to_end(command, env, run, PRODUCE_TIMEOUT)
            assert run.returncode == 0 and len(run.of("sent")) == len(messages), run.report()
            # Our push consumer (pull mode, JSON headers like any RocketMQ client).
            config = ClientConfig(namesrv_addr=address, serialize="json")
            got: dict[str, ReceivedMessage] = {}
            all_in = trio.Event()

            async def listener(message: ReceivedMessage) -> ConsumeResult:
                # async: it runs on the event loop, so setting the trio Event wakes the test
                got[message.keys[0]] = message
                if len(got) == len(messages):
                    all_in.set()
                return ConsumeResult.SUCCESS

            async with PushConsumer(
                config, group="ours", subscription={TOPIC: "*"}, listener=listener,
                mode="pull", consume_from="first", long_poll=2.0,
            ):  # fmt: skip
                with trio.move_on_after(RECEIVE_TIMEOUT):
                    await all_in.wait()
            assert set(got) == {m.key for m in messages}
            for planned in messages:
                m = got[planned.key]
                assert m.tag == planned.tag and m.topic == TOPIC and not m.corrupted
                assert m.body == planned.body.encode()
            assert any(m.record.sys_flag & 1 for m in got.values()), "nothing was compressed"


@pytest.mark.parametrize("client_env", ALI, indirect=True)
async def test_our_producer_ali_ons_consumer_receives(
    client_env: ClientEnv, tmp_path: Path
) -> None:
    messages = plan(1)
    home = tmp_path / "home"
    home.mkdir()
    env = ALI_ONS.environ(client_env, home)
    tag_a = {m.key for m in messages if m.tag == "TagA"}
    with trio.fail_after(PRODUCE_TIMEOUT + RECEIVE_TIMEOUT):
        async with open_broker(tmp_path / "data") as broker, trio.open_nursery() as nursery:
            address = f"127.0.0.1:{broker.port}"
            await create_topic(broker, TOPIC)
            driver = LiveDriver(DriverRun("ali-ons consumer", tmp_path / "consume.err"))
            command = ALI_ONS.command(
                client_env, "consume", "--group", "theirs", "--topic", TOPIC,
                "--expression", "TagA", "--namesrv", address,
            )  # fmt: skip
            await nursery.start(driver.serve, command, env)
            await driver.wait_for("start", lambda: bool(driver.run.of("started")), RECEIVE_TIMEOUT)
            await trio.sleep(1.0)  # its first rebalance and pulls are parked
            async with Producer(ClientConfig(namesrv_addr=address)) as producer:
                for m in messages:
                    await producer.send(Message(TOPIC, m.body.encode(), tag=m.tag, keys=[m.key]))
            await driver.wait_for(
                "every TagA message",
                lambda: {e["key"] for e in driver.run.of("received")} >= tag_a,
                RECEIVE_TIMEOUT,
            )
            await driver.stop()
            events = driver.run.of("received")
            assert {e["key"] for e in events} == tag_a, driver.run.report()
            by_key = {m.key: m for m in messages}
            for e in events:
                body = by_key[e["key"]].body.encode()
                assert (e["body_len"], e["body_sha256"]) == (
                    len(body),
                    hashlib.sha256(body).hexdigest(),
                )
                assert e["tag"] == "TagA"
            assert max(e["body_len"] for e in events) > 4096  # the compressed one came through
