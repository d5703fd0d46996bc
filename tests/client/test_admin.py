"""``trimq-admin`` against a real broker thread: every command, ``--json``, and error paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from client.admin import main
from client.config import ClientConfig
from client.simple_consumer import SimpleConsumer
from tests.client.harness import BrokerThread, broker_thread, run

pytestmark = pytest.mark.integration

TOPIC = "AdminT"
GROUP = "AdminG"
POP_GROUP = "AdminPopG"


class Cli:
    """Runs ``main`` in-process against one broker, capturing what it prints."""

    def __init__(self, address: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.address = address
        self.capsys = capsys

    def __call__(self, *args: str) -> tuple[int, str, str]:
        code = main(["-n", self.address, "--timeout", "5", *args])
        out, err = self.capsys.readouterr()
        assert "Traceback" not in err
        return code, out, err

    def ok(self, *args: str) -> str:
        code, out, err = self(*args)
        assert code == 0, err
        return out

    def json(self, *args: str) -> Any:
        return json.loads(self.ok("--json", *args))

    def fails(self, *args: str) -> str:
        code, out, err = self(*args)
        assert code == 1, out
        assert err.startswith("trimq-admin: error: ") and err.count("\n") == 1, err
        return err


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One broker for the read-mostly scenario (starting one costs ~0.3 s)."""
    with broker_thread(tmp_path_factory.mktemp("admin") / "broker") as running:
        yield running


@pytest.fixture
def cli(shared_broker: BrokerThread, capsys: pytest.CaptureFixture[str]) -> Cli:
    """The CLI pointed at the shared broker as its name server."""
    return Cli(shared_broker.address, capsys)


def _lag(cli: Cli) -> int:
    doc = cli.json("consumerProgress", "-g", GROUP, "-t", TOPIC)
    assert {"topic", "brokerName", "queueId", "brokerOffset", "consumerOffset", "diff"} <= set(
        doc["queues"][0]
    )
    return int(doc["diffTotal"])


async def _receive_all(config: ClientConfig) -> int:
    """Receive and ack every message of the topic as the pop group; how many arrived."""
    got = 0
    async with SimpleConsumer(
        config, group=POP_GROUP, subscription={TOPIC: "*"}, consume_from="first"
    ) as consumer:
        for _ in range(10):  # bounded
            batch = await consumer.receive(32, invisible_duration=30, await_duration=0.2)
            for message in batch:
                await consumer.ack(message)
            got += len(batch)
            if got >= 4:
                break
    return got


def test_topic_lifecycle_and_messages(cli: Cli, shared_broker: BrokerThread) -> None:
    """Create, inspect, send, consume, look up, measure lag, reset, and delete a topic."""
    out = cli.ok("updateTopic", "-t", TOPIC, "-b", shared_broker.address, "-r", "1", "-w", "1")
    assert f"create topic to {shared_broker.address} success." in out
    assert "TopicConfig [topicName=AdminT, readQueueNums=1, writeQueueNums=1, perm=RW-" in out
    created = cli.json("updateTopic", "-t", TOPIC, "-r", "1", "-w", "1", "-p", "6")
    assert created["brokers"] == [shared_broker.address]
    assert created["topicConfig"]["readQueueNums"] == 1

    assert TOPIC in cli.ok("topicList").split()
    assert TOPIC in cli.json("topicList")["topicList"]
    assert {"clusterName": "DefaultCluster", "topic": TOPIC} in cli.json("topicList", "-c")
    route = json.loads(cli.ok("topicRoute", "-t", TOPIC))  # JSON by default, like mqadmin
    assert route["queueDatas"][0]["readQueueNums"] == 1
    table = cli.ok("topicRoute", "-t", TOPIC, "-l")
    assert table.startswith("#ClusterName") and "Total:" in table

    before_send = int(time.time() * 1000) - 1
    sent = [
        cli.json("sendMessage", "-t", TOPIC, "-p", f"hello-{i}", "-c", "tagA", "-k", f"key{i}")
        for i in range(3)
    ]
    assert all(s["sendStatus"] == "SEND_OK" for s in sent)
    assert "#Broker Name" in cli.ok("sendMessage", "-t", TOPIC, "-p", "hello-3")

    status = cli.json("topicStatus", "-t", TOPIC)
    assert [(s["queueId"], s["minOffset"], s["maxOffset"]) for s in status] == [(0, 0, 4)]
    assert cli.ok("topicStatus", "-t", TOPIC).startswith("#Broker Name  #QID  #Min Offset")

    # Without -g nothing is committed: a second look shows the same messages.
    pulled = cli.json("consumeMessage", "-t", TOPIC, "-c", "10")
    assert [m["body"] for m in pulled] == ["hello-0", "hello-1", "hello-2", "hello-3"]
    assert "hello-0" in cli.ok("consumeMessage", "-t", TOPIC, "-c", "1")
    assert len(cli.json("consumeMessage", "-t", TOPIC, "-i", "0", "-o", "3")) == 1

    by_offset = cli.json("queryMsgById", "-i", sent[0]["offsetMsgId"])
    assert by_offset["body"] == "hello-0" and by_offset["topic"] == TOPIC
    assert "OffsetID:" in cli.ok("queryMsgById", "-i", sent[1]["offsetMsgId"])
    by_uniq = cli.json("queryMsgById", "-i", sent[2]["msgId"])
    assert by_uniq["body"] == "hello-2" and by_uniq["keys"] == ["key2"]
    by_key = cli.json("queryMsgByKey", "-t", TOPIC, "-k", "key1")
    assert [m["body"] for m in by_key] == ["hello-1"]
    assert "#Message ID" in cli.ok("queryMsgByKey", "-t", TOPIC, "-k", "key1")

    # A pull consumer (consumeMessage -g) commits what it printed: lag 4 → 3 → 0.
    cli.ok("consumeMessage", "-t", TOPIC, "-g", GROUP, "-c", "1")
    assert _lag(cli) == 3
    assert "Diff Total: 3" in cli.ok("consumerProgress", "-g", GROUP)
    assert len(cli.json("consumeMessage", "-t", TOPIC, "-g", GROUP)) == 3
    assert _lag(cli) == 0
    groups = cli.json("consumerProgress")
    assert {"group": GROUP, "count": 0, "diffTotal": 0} in groups

    reset = cli.json("resetOffsetByTime", "-g", GROUP, "-t", TOPIC, "-s", str(before_send))
    assert reset["offsets"] == [{"brokerName": "broker-a", "queueId": 0, "offset": 0}]
    assert _lag(cli) == 4
    out = cli.ok("resetOffsetByTime", "-g", GROUP, "-t", TOPIC, "-s", "now")
    assert "rollback consumer offset by specified group[AdminG]" in out
    assert _lag(cli) == 0

    # A pop consumer (SimpleConsumer) commits at pop: its lag is 0 once it received; a reset
    # moves its pop cursor back, so the lag reappears and it receives the messages again.
    assert run("asyncio", _receive_all, ClientConfig(namesrv_addr=cli.address)) == 4
    assert cli.json("consumerProgress", "-g", POP_GROUP)["diffTotal"] == 0
    cli.ok("resetOffsetByTime", "-g", POP_GROUP, "-t", TOPIC, "-s", str(before_send))
    assert cli.json("consumerProgress", "-g", POP_GROUP)["diffTotal"] == 4
    assert run("asyncio", _receive_all, ClientConfig(namesrv_addr=cli.address)) == 4

    deleted = cli.json("deleteTopic", "-t", TOPIC)
    assert deleted["brokers"] == ["broker-a"] and deleted["nameServer"] is False
    assert TOPIC not in cli.json("topicList")["topicList"]
    assert "topic 'AdminT' does not exist" in cli.fails("topicRoute", "-t", TOPIC)


def test_cluster_and_broker_status(cli: Cli, shared_broker: BrokerThread) -> None:
    """clusterList and brokerStatus show the broker and its runtime facts."""
    out = cli.ok("clusterList")
    header = "#Cluster Name #Broker Name #BID #Addr #Version #InTPS(LOAD) #OutTPS(LOAD)"
    assert " ".join(out.splitlines()[0].split()).startswith(header)
    assert "broker-a" in out and shared_broker.address in out
    (row,) = cli.json("clusterList")
    assert row["brokerName"] == "broker-a" and row["address"] == shared_broker.address
    assert row["runtimeInfo"]["brokerVersionDesc"].startswith("trimq-")
    status = cli.json("brokerStatus", "-b", shared_broker.address)[shared_broker.address]
    assert {"runtime", "commitLogDiskRatio", "earliestMessageTimeStamp"} <= set(status)
    assert "bootTimestamp" in cli.ok("brokerStatus", "-c", "DefaultCluster")
    assert "cluster 'Nope' does not exist" in cli.fails("brokerStatus", "-c", "Nope")


def test_expected_failures(cli: Cli, unused_tcp_port: int, capsys: Any) -> None:
    """Unknown topic or group, a dead address: exit 1 and one line on stderr."""
    assert "topic 'Nope' does not exist" in cli.fails("topicStatus", "-t", "Nope")
    assert "topic 'Nope' does not exist" in cli.fails("consumeMessage", "-t", "Nope")
    assert "has no offsets" in cli.fails("consumerProgress", "-g", "NoSuchGroup")
    assert "not found" in cli.fails("queryMsgById", "-i", "0" * 32)
    down = Cli(f"127.0.0.1:{unused_tcp_port}", capsys)
    err = down.fails("topicList")
    assert f"cannot connect to name server 127.0.0.1:{unused_tcp_port}" in err
    assert "cannot connect" in cli.fails("brokerStatus", "-b", f"127.0.0.1:{unused_tcp_port}")


@pytest.mark.parametrize(
    "argv",
    [
        ["updateTopic"],  # -t missing
        ["updateTopic", "-t", "T", "-p", "5"],
        ["resetOffsetByTime", "-g", "g", "-t", "T", "-s", "yesterday"],
        ["brokerStatus"],  # -b or -c required
        ["noSuchCommand"],
        ["--timeout", "0", "topicList"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Bad arguments are argparse's usage errors: exit 2, usage on stderr."""
    with pytest.raises(SystemExit) as exc:
        main(["-n", "127.0.0.1:1", *argv])
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_module_entry_point(shared_broker: BrokerThread) -> None:
    """``python -m client.admin`` prints help, and runs a real command."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    helped = subprocess.run(
        [sys.executable, "-m", "client.admin", "--help"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert helped.returncode == 0 and "clusterList" in helped.stdout
    env["NAMESRV_ADDR"] = shared_broker.address  # the fallback for -n
    listed = subprocess.run(
        [sys.executable, "-m", "client.admin", "--json", "clusterList"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)[0]["address"] == shared_broker.address
