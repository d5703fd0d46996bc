"""Interop: the official RocketMQ 5 Node client (``rocketmq-client-nodejs`` 1.0.8, gRPC on
``@grpc/grpc-js``) against trimq's gRPC front end, and across to trimq's own Remoting client.

The client runs as a driver subprocess (``grpc_node_driver.js``, ``NODE_PATH`` at its install
under ``.interop/``, a scratch ``HOME``) that prints JSON lines and leaves Node to exit by
itself once the client shut down, so an error the client's channel raises late (the
``Error: 14 UNAVAILABLE`` crash of a Telemetry stream whose trailers never came) shows as a
non-zero exit. The broker runs in-process on 127.0.0.1 (any ports), one per test, with its
log captured: no test may make it log an error. Every wait is bounded; a new consumer group
reads a young queue from its start, so messages may be sent before a consumer's first
receive.

1. Producer: ``startup()`` returns (it waits for the broker's settings on Telemetry); every
   send of messages with tags, keys, user properties and one FIFO message group has a
   receipt with a message id and the offset the broker stored it at, stored as a Remoting
   producer would store it (the group on one queue, in order, as ``__SHARDINGKEY``), and
   the official SimpleConsumer reads it back as sent.
2. SimpleConsumer across front ends: what trimq's Remoting producer sends arrives with
   message_id = ``UNIQ_KEY``, tag, keys, properties and body intact; ack, change invisible
   duration (redelivered with delivery_attempt 2; the replaced handle is refused); and what
   the Node producer sends, trimq's Remoting SimpleConsumer reads intact.
3. PushConsumer: startup returns; a message its listener fails once is nacked with 0 s,
   comes back promptly with delivery_attempt 2 and is acked; one it always fails lands in
   ``%DLQ%group`` after max attempts (the Node client never forwards it itself). On a group
   made orderly (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, before it starts) the broker's
   settings make it FIFO, and two message groups sent interleaved by the Node producer are
   each consumed once, strictly in send order.
4. Shutdown hygiene: 20 start/shutdown cycles each of Producer and SimpleConsumer and a few
   PushConsumers against one broker: every process exits 0, no client error, nothing left
   registered or in a call on the broker.
5. SQL92 property filters (``new FilterExpression(..., FilterType.SQL)``; the client does
   not export ``FilterType``, the driver takes the generated protocol module's): a
   SimpleConsumer subscribed with ``region = 'eu' AND price > 10`` receives exactly the
   matching messages the Node producer sent, each once with tag and properties intact, a
   further long poll comes back empty and the group's cursor is past the rejected ones; a
   malformed expression is refused with ILLEGAL_FILTER_EXPRESSION (the client's
   BadRequestException).
6. ACL (a broker with ``acl_file``; the driver's ``--access-key``/``--secret-key`` become the
   client's ``sessionCredentials``, which sign every call: ``authorization: MQv2-HMAC-SHA1
   Credential=<AK>, SignedHeaders=x-mq-date-time, Signature=<upper-case hex>``, the date in
   UTC): a producer account with PUB on the topic and a consumer account with SUB on the
   topic and the group send and receive every message once, intact, every call allowed. A
   wrong secret (or no ``sessionCredentials``: no ``authorization`` at all) is refused
   UNAUTHORIZED at the route query: ``startup()`` fails after its 3 tries, its Error's
   cause's cause the UnauthorizedException (40100). Without PUB on a topic, a send there
   raises ForbiddenException (40300): at the route query when the account has no right on
   the topic, at each send attempt when it may only subscribe. Nothing refused is stored; the
   client logs the refusals, with the stacks of the errors they raised, and exits cleanly.

Client bugs worked around in the driver (not broker matters): the push consumer's consume
services open their own file logger that shutdown never closes (Node would never exit; the
FIFO one keeps it private, so the driver hands them its own logger), and a
push consumer shut down within 1 s of startup runs its first assignment scan afterwards on
a fresh channel and receives for ever (so cycles wait for the first receive).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from client.message import Message, ReceivedMessage
from client.producer import Producer
from client.simple_consumer import SimpleConsumer
from protocol.grpc.convert import SHARDING_KEY, SYSTEM_PROPERTY_NAMES
from protocol.message import MessageExt, decode_record
from protocol.naming import dlq_topic
from protocol.properties import KEYS, TAGS, UNIQ_KEY
from scripts.interop_setup import ClientEnv
from tests.interop.grpc_broker import (
    MESSAGE_ID,
    Running,
    grpc_broker,
    make_orderly,
    wait_until,
)
from tests.interop.test_grpc_python import (
    ACL_GROUP,
    ACL_OTHER_TOPIC,
    ACL_SUB_ONLY_TOPIC,
    ACL_TOPIC,
    CONSUMER_AK,
    CONSUMER_SK,
    PRODUCER_AK,
    PRODUCER_SK,
    acl_file,
    assert_signed,
    watch_acl,
)
from tests.interop.test_interop import (
    DriverRun,
    LiveDriver,
    create_topic,
    real_clock_environ,
    run_to_end,
)

pytestmark = [
    pytest.mark.interop,
    pytest.mark.parametrize(
        "client_env", [pytest.param("node-grpc", id="node-grpc")], indirect=True
    ),
]

DRIVER = Path(__file__).resolve().parent / "grpc_node_driver.js"
#: Bounds (seconds) of one driver run and of whole tests.
RUN_TIMEOUT = 30.0
TEST_TIMEOUT = 60.0
#: A push consumer's shutdown waits for its receive in flight: a long poll of up to the
#: 20 s the broker's settings give (plus the 3 s request timeout and a 1 s pause).
PUSH_STOP_TIMEOUT = 40.0
INVALID_RECEIPT_HANDLE = 40013
#: A line of the driver's logger (an ISO timestamp first), as opposed to a continuation.
TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\dT")


# ------------------------------------------------------------------ the client's driver
class NodeLive(LiveDriver):
    """A long-running driver whose stop may take longer than ``LiveDriver.stop`` allows (a
    push consumer's shutdown waits for its long poll)."""

    async def stop_within(self, within: float) -> None:
        """Close stdin (the driver's signal to stop) and wait for the exit, bounded; the
        process is killed (by its pid) past that."""
        assert self.process is not None and self.process.stdin is not None
        await self.process.stdin.aclose()
        with trio.move_on_after(within):
            await self._done.wait()
        if not self._done.is_set():
            self.process.kill()
            with trio.move_on_after(5):
                await self._done.wait()
            pytest.fail(f"{self.run.label} did not stop in {within} s\n{self.run.report()}")


@dataclass
class NodeGrpc:
    """How the tests run the driver against one broker."""

    env: ClientEnv
    tmp: Path
    endpoint: str
    runs: list[DriverRun] = field(default_factory=list)

    def _prepare(self, label: str, mode: str, args: tuple[str, ...]) -> tuple[
        DriverRun, list[str], dict[str, str]
    ]:  # fmt: skip
        home = self.tmp / f"home-{label}"
        home.mkdir()
        run = DriverRun(label, self.tmp / f"{label}.err")
        self.runs.append(run)
        assert self.env.node_modules is not None
        command = ["node", str(DRIVER), mode, "--endpoints", self.endpoint, *args]
        environ = {
            **real_clock_environ(),
            "HOME": str(home),
            "NODE_PATH": str(self.env.node_modules),
        }
        return run, command, environ

    async def run(
        self, label: str, mode: str, *args: str, within: float = RUN_TIMEOUT
    ) -> DriverRun:
        """Run a mode to its end (bounded); the caller checks how it ended."""
        run, command, environ = self._prepare(label, mode, args)
        await run_to_end(command, environ, run, within)
        return run

    async def start(self, nursery: trio.Nursery, label: str, mode: str, *args: str) -> NodeLive:
        """Start a long-running mode (stopped by ``NodeLive.stop_within``)."""
        run, command, environ = self._prepare(label, mode, args)
        live = NodeLive(run)
        await nursery.start(live.serve, command, environ)
        return live

    async def produce(
        self, label: str, topic: str, plan: list[dict[str, Any]]
    ) -> tuple[DriverRun, list[dict[str, Any]]]:
        """Send ``plan`` with the official producer; the run and its ``sent`` events."""
        path = self.tmp / f"{label}.json"
        path.write_text(json.dumps({"messages": plan}, ensure_ascii=False))
        run = await self.run(label, "produce", "--topic", topic, "--plan", str(path))
        check_clean(run)
        sent = run.of("sent")
        assert [e["index"] for e in sent] == list(range(len(plan))), run.report()
        return run, sent


def client_errors(run: DriverRun) -> list[str]:
    """The ERROR lines the client logged (the driver's logger writes them to stderr)."""
    stderr = run.stderr_path.read_text(errors="replace")
    return [line for line in stderr.splitlines() if line.split(" ", 2)[1:2] == ["ERROR"]]


def check_clean(run: DriverRun) -> None:
    """Exit 0 after ``stopped``, no failure event, no crash and no ERROR the client logged."""
    report = run.report()
    assert run.returncode == 0, report
    assert run.of("stopped"), report
    for bad in ("error", "timeout", "receive_error"):
        assert not run.of(bad), report
    stderr = run.stderr_path.read_text(errors="replace")
    assert "UNAVAILABLE" not in stderr and "Error:" not in stderr, report
    assert not client_errors(run), report


@pytest.fixture
def node_grpc(client_env: ClientEnv, tmp_path: Path) -> Callable[[Running], NodeGrpc]:
    return lambda broker: NodeGrpc(client_env, tmp_path, broker.endpoint)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def user_properties(record: MessageExt) -> dict[str, str]:
    """The properties an application set (not those RocketMQ reserves)."""
    return {k: v for k, v in record.properties.items() if k not in SYSTEM_PROPERTY_NAMES}


async def receive_remoting(
    broker: Running, group: str, topic: str, count: int, within: float
) -> list[ReceivedMessage]:
    """Receive ``count`` messages with trimq's Remoting SimpleConsumer, acking each."""
    got: list[ReceivedMessage] = []
    async with SimpleConsumer(
        broker.remoting, group=group, subscription={topic: "*"}, consume_from="first"
    ) as consumer:
        with trio.move_on_after(within):
            while len(got) < count:
                for msg in await consumer.receive(32, invisible_duration=30, await_duration=2):
                    got.append(msg)
                    await consumer.ack(msg)
    assert len(got) == count, f"received {len(got)} of {count}: {[m.body for m in got]}"
    return got


# ------------------------------------------------------------------ 1. producer
PRODUCER_TOPIC = "NodeGrpcProduce"
FIFO_GROUP = "order-42"
PRODUCER_PLAN: list[dict[str, Any]] = [
    {"body": "plain ✓", "tag": "TagA", "keys": ["k-1", "order-1"],
     "properties": {"color": "red", "n": "1", "ünï": "cödé ✓"}},
    {"body": "second", "tag": "TagB", "keys": ["k-2"], "properties": {"color": "blue"}},
    {"body": "untagged, no keys"},
    {"body": "fifo 1", "tag": "Fifo", "keys": ["f-1"], "group": FIFO_GROUP},
    {"body": "fifo 2", "tag": "Fifo", "keys": ["f-2"], "group": FIFO_GROUP},
    {"body": "fifo 3", "tag": "Fifo", "keys": ["f-3"], "group": FIFO_GROUP},
]  # fmt: skip


async def test_producer_receipts_and_storage(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path
) -> None:
    """The official producer starts (its settings answered) and sends to a topic the first
    send creates; each receipt names its message and the offset the broker stored it at, the
    stored record is what a Remoting producer would have stored, and the official
    SimpleConsumer reads every message back as it was sent (message group included)."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            node = node_grpc(broker)
            run, sent = await node.produce("producer", PRODUCER_TOPIC, PRODUCER_PLAN)
            (started,) = run.of("started")
            assert started["startup_ms"] < 5000, run.report()
            ids = [e["message_id"] for e in sent]
            assert all(MESSAGE_ID.match(i) for i in ids) and len(set(ids)) == len(ids), sent

            store = broker.handle.broker.store
            stored: list[MessageExt] = []
            for item, receipt in zip(PRODUCER_PLAN, sent, strict=True):
                (record,) = store.messages_by_key(PRODUCER_TOPIC, receipt["message_id"])
                msg, _ = decode_record(record)
                stored.append(msg)
                where = f"{item}: {msg.properties}"
                assert msg.topic == PRODUCER_TOPIC and msg.body == item["body"].encode(), where
                assert msg.properties[UNIQ_KEY] == receipt["message_id"], where
                assert msg.queue_offset == receipt["offset"], where
                assert msg.properties.get(TAGS) == item.get("tag"), where
                keys = item.get("keys", [])
                if keys:
                    assert sorted(msg.properties[KEYS].split(" ")) == sorted(keys), where
                else:
                    assert KEYS not in msg.properties, where
                assert user_properties(msg) == item.get("properties", {}), where
                assert msg.properties.get(SHARDING_KEY) == item.get("group"), where
                assert msg.reconsume_times == 0, where
            fifo = [m for m, item in zip(stored, PRODUCER_PLAN, strict=True) if item.get("group")]
            assert len({m.queue_id for m in fifo}) == 1, "a message group spans queues"
            first = fifo[0].queue_offset
            assert [m.queue_offset for m in fifo] == list(range(first, first + len(fifo)))

            # Read back by the official SimpleConsumer: the same message, group included.
            run = await node.run(
                "consumer", "simple", "--topic", PRODUCER_TOPIC, "--group", "node-reader",
                "--count", str(len(PRODUCER_PLAN)), "--within", "20000",
            )  # fmt: skip
            check_clean(run)
            got = {e["message_id"]: e for e in run.of("received")}
            assert set(got) == set(ids) and len(run.of("received")) == len(ids), run.report()
            for item, receipt in zip(PRODUCER_PLAN, sent, strict=True):
                event = got[receipt["message_id"]]
                body = item["body"].encode()
                assert (event["body_len"], event["body_sha256"]) == (len(body), sha256(body))
                assert event["tag"] == item.get("tag", ""), event
                assert sorted(event["keys"]) == sorted(item.get("keys", [])), event
                assert event["properties"] == item.get("properties", {}), event
                assert event["message_group"] == item.get("group"), event
                assert event["offset"] == receipt["offset"] and event["attempt"] == 1, event


# ------------------------------------------------------------------ 2. across front ends
TO_NODE_TOPIC = "NodeGrpcFromRemoting"
TO_REMOTING_TOPIC = "NodeGrpcToRemoting"
CHANGE_KEY = "b-1"


async def test_simple_consumer_across_front_ends(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path
) -> None:
    """Remoting producer → official SimpleConsumer: ids, tags, keys, properties and bodies
    intact; ack; change invisible duration brings the message back with delivery_attempt 2
    and refuses the replaced handle. Official producer → trimq's Remoting SimpleConsumer:
    intact, with the gRPC message id as the Remoting msgId."""
    messages = [
        Message(TO_NODE_TOPIC, "héllo ✓".encode(), tag="TagA", keys=["a-1", "a-2", "a-3"],
                properties={"color": "red", "trace": "x y"}),
        Message(TO_NODE_TOPIC, b"second", tag="TagB", keys=[CHANGE_KEY]),
        Message(TO_NODE_TOPIC, b"no tag", keys=["c-1"], properties={"n": "3"}),
        Message(TO_NODE_TOPIC, bytes(range(256)) * 8, tag="Binary", keys=["d-1"]),
    ]  # fmt: skip
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            node = node_grpc(broker)
            async with Producer(broker.remoting) as producer:
                receipts = [await producer.send(m) for m in messages]
            run = await node.run(
                "consumer", "simple", "--topic", TO_NODE_TOPIC, "--group", "node-simple",
                "--count", str(len(messages)), "--change-key", CHANGE_KEY, "--within", "20000",
            )  # fmt: skip
            check_clean(run)
            report = run.report()
            received = run.of("received")
            by_id = {r.message_id: (m, r) for m, r in zip(messages, receipts, strict=True)}
            first = [e for e in received if e["attempt"] == 1]
            assert sorted(e["message_id"] for e in first) == sorted(by_id), report
            for event in received:
                message, receipt = by_id[event["message_id"]]
                assert event["topic"] == TO_NODE_TOPIC, event
                # google-protobuf's getter reads an absent optional tag as "".
                assert event["tag"] == (message.tag or ""), event
                assert sorted(event["keys"]) == sorted(message.keys), event
                assert event["properties"] == dict(message.properties), event
                assert (event["body_len"], event["body_sha256"]) == (
                    len(message.body),
                    sha256(message.body),
                ), event
                assert not event["corrupted"] and event["message_group"] is None, event
                assert event["offset"] == receipt.queue_offset, event
            again = [e for e in received if e["attempt"] != 1]
            assert [(e["key"], e["attempt"]) for e in again] == [(CHANGE_KEY, 2)], report
            (changed,) = run.of("changed")
            assert changed["new_handle"], report
            (stale,) = run.of("stale_ack")
            assert not stale["ok"] and stale["code"] == INVALID_RECEIPT_HANDLE, report
            assert sorted(e["message_id"] for e in run.of("acked")) == sorted(by_id), report
            await wait_until("every lease acked", lambda: broker.in_flight() == 0, 10)

            # The other way: the official producer, read back with trimq's Remoting client.
            plan: list[dict[str, Any]] = [
                {"body": "from node ✓", "tag": "TagN", "keys": ["n-1", "n-2"],
                 "properties": {"lang": "js", "ünï": "✓"}},
                {"body": "second", "keys": ["n-3"]},
                {"body": "grouped", "tag": "Fifo", "keys": ["n-4"], "group": FIFO_GROUP},
            ]  # fmt: skip
            _, sent = await node.produce("producer", TO_REMOTING_TOPIC, plan)
            got = await receive_remoting(broker, "remoting-reader", TO_REMOTING_TOPIC, 3, 20)
            by_msg_id = {m.message_id: m for m in got}
            assert set(by_msg_id) == {e["message_id"] for e in sent}, "msgId ≠ message_id"
            for item, node_receipt in zip(plan, sent, strict=True):
                msg = by_msg_id[node_receipt["message_id"]]
                where = f"{item}: {msg.properties}"
                assert msg.topic == TO_REMOTING_TOPIC and msg.body == item["body"].encode()
                assert msg.tag == item.get("tag"), where
                assert sorted(msg.keys) == sorted(item["keys"]), where
                assert user_properties(msg.record) == item.get("properties", {}), where
                assert msg.record.properties.get(SHARDING_KEY) == item.get("group"), where
                assert msg.queue_offset == node_receipt["offset"], where
                assert msg.delivery_attempt == 1, where


#: Over the Remoting producer's 4 KiB compression threshold: stored zlib-compressed.
LARGE_BODY = "".join(f"{i:05d}:{i * 7919 % 10007:05d};" for i in range(600)).encode()


async def test_compressed_remoting_body_to_simple_consumer(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path
) -> None:
    """A large body trimq's Remoting producer compressed reaches the official Node
    SimpleConsumer intact."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            node = node_grpc(broker)
            async with Producer(broker.remoting) as producer:
                receipt = await producer.send(Message(TO_NODE_TOPIC, LARGE_BODY, keys=["large"]))
            (record,) = broker.handle.broker.store.messages_by_key(TO_NODE_TOPIC, "large")
            assert decode_record(record)[0].sys_flag & 1, "the large body was not compressed"
            run = await node.run(
                "consumer", "simple", "--topic", TO_NODE_TOPIC, "--group", "node-large",
                "--count", "1", "--within", "10000",
            )  # fmt: skip
            check_clean(run)
            (event,) = run.of("received")
            assert event["message_id"] == receipt.message_id, event
            assert (event["body_len"], event["body_sha256"]) == (
                len(LARGE_BODY),
                sha256(LARGE_BODY),
            ), event


# ------------------------------------------------------------------ 3. push consumer
PUSH_TOPIC = "NodeGrpcPush"
PUSH_GROUP = "node-push"
PUSH_KEYS = ("p-0", "p-1", "p-2", "p-always")
FAIL_KEY = "p-1"
ALWAYS_FAIL_KEY = "p-always"
MAX_RECONSUME = 2  # max attempts 3


async def test_push_consumer_nack_and_redelivery(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path
) -> None:
    """The official PushConsumer starts (settings answered); the message its listener fails
    once is nacked (ChangeInvisibleDuration 0 s), comes back promptly with
    delivery_attempt 2 and is acked; one it always fails is delivered max-attempts times
    and then lands in %DLQ%group; nothing else is delivered twice; it shuts down cleanly
    with a long poll in flight."""
    with trio.fail_after(TEST_TIMEOUT):
        async with (
            grpc_broker(tmp_path, max_reconsume_times=MAX_RECONSUME) as broker,
            trio.open_nursery() as nursery,
        ):
            node = node_grpc(broker)
            await create_topic(broker.handle, PUSH_TOPIC)
            live = await node.start(
                nursery, "push", "push", "--topic", PUSH_TOPIC, "--group", PUSH_GROUP,
                "--fail-key", FAIL_KEY, "--always-fail-key", ALWAYS_FAIL_KEY,
            )  # fmt: skip
            await live.wait_for("started", lambda: bool(live.run.of("started")), RUN_TIMEOUT)
            (started,) = live.run.of("started")
            assert started["startup_ms"] < 5000, live.run.report()

            async with Producer(broker.remoting) as producer:
                ids = {
                    key: (await producer.send(Message(PUSH_TOPIC, key.encode(), keys=[key])))
                    .message_id
                    for key in PUSH_KEYS
                }  # fmt: skip

            def attempts(key: str) -> list[tuple[int, bool]]:
                calls = [e for e in live.run.of("consumed") if e["key"] == key]
                return [(e["attempt"], e["failed"]) for e in calls]

            expected = {
                "p-0": [(1, False)],
                "p-1": [(1, True), (2, False)],
                "p-2": [(1, False)],
                ALWAYS_FAIL_KEY: [(n, True) for n in range(1, MAX_RECONSUME + 2)],
            }
            dlq = dlq_topic(PUSH_GROUP)
            store = broker.handle.broker.store
            await live.wait_for(
                "every outcome",
                lambda: (
                    {k: attempts(k) for k in PUSH_KEYS} == expected
                    and bool(store.messages_by_key(dlq, ALWAYS_FAIL_KEY))
                ),
                20,
            )
            failed, retried = (e for e in live.run.of("consumed") if e["key"] == FAIL_KEY)
            # Nacked with 0 s: back at once, not after a back-off or the 60 s lease.
            assert retried["at_ms"] - failed["at_ms"] < 5000, live.run.report()
            for event in live.run.of("consumed"):
                assert event["message_id"] == ids[event["key"]], event
                assert event["topic"] == PUSH_TOPIC and not event["corrupted"], event
                assert event["body_sha256"] == sha256(event["key"].encode()), event
            (record,) = store.messages_by_key(dlq, ALWAYS_FAIL_KEY)
            dead, _ = decode_record(record)
            assert dead.body == ALWAYS_FAIL_KEY.encode(), dead
            assert dead.properties[UNIQ_KEY] == ids[ALWAYS_FAIL_KEY], dead
            assert dead.reconsume_times == MAX_RECONSUME + 1, dead
            # Leases end: acked, or dropped once the DLQ copy is durable.
            await wait_until("every lease over", lambda: broker.in_flight() == 0, 10)
            await live.stop_within(PUSH_STOP_TIMEOUT)
            check_clean(live.run)
            consumed = len(live.run.of("consumed"))
            assert consumed == 1 + 2 + 1 + MAX_RECONSUME + 1, live.run.report()
            assert broker.handle.broker.clients.client_ids(PUSH_GROUP) == []


FIFO_TOPIC = "NodeGrpcFifoPush"
FIFO_PUSH_GROUP = "fifo-push-node"
#: Message groups and their keys, each in send order; sent interleaved (a-0, b-0, a-1, ...).
FIFO_PLAN = {"A": [f"a-{i}" for i in range(5)], "B": [f"b-{i}" for i in range(5)]}


async def test_push_consumer_on_a_fifo_group(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path
) -> None:
    """The official PushConsumer on a group made orderly before it starts: the broker's
    settings make it FIFO (its FifoConsumeService), and the messages the Node producer sent
    in two message groups, interleaved, are each consumed once, every message group strictly
    in send order; every lease ends (acked) and it shuts down cleanly."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker, trio.open_nursery() as nursery:
            node = node_grpc(broker)
            await create_topic(broker.handle, FIFO_TOPIC)
            await make_orderly(broker, FIFO_PUSH_GROUP)
            live = await node.start(
                nursery, "push", "push", "--topic", FIFO_TOPIC, "--group", FIFO_PUSH_GROUP
            )
            await live.wait_for("started", lambda: bool(live.run.of("started")), RUN_TIMEOUT)
            (started,) = live.run.of("started")
            assert started["consume_service"] == "FifoConsumeService", live.run.report()

            order = [key for pair in zip(*FIFO_PLAN.values(), strict=True) for key in pair]
            group_of = {key: group for group, keys in FIFO_PLAN.items() for key in keys}
            plan = [{"body": key, "keys": [key], "group": group_of[key]} for key in order]
            _, sent = await node.produce("producer", FIFO_TOPIC, plan)
            ids = {order[e["index"]]: e["message_id"] for e in sent}
            for group in FIFO_PLAN:
                queues = {e["queue_id"] for e in sent if group_of[order[e["index"]]] == group}
                assert len(queues) == 1, f"message group {group} spans queues {queues}"

            def calls(group: str) -> list[dict[str, Any]]:
                return [e for e in live.run.of("consumed") if e["message_group"] == group]

            await live.wait_for(
                "every message consumed",
                lambda: len(live.run.of("consumed")) >= len(order),
                20,
            )
            await wait_until("every lease over", lambda: broker.in_flight() == 0, 10)
            report = live.run.report()
            for group, keys in FIFO_PLAN.items():
                consumed = calls(group)
                assert [e["key"] for e in consumed] == keys, report
                offsets = [e["offset"] for e in consumed]
                assert offsets == sorted(offsets), report
            for event in live.run.of("consumed"):
                assert event["message_id"] == ids[event["key"]], event
                assert event["attempt"] == 1 and not event["failed"], event
                assert not event["corrupted"], event
                assert event["body_sha256"] == sha256(event["key"].encode()), event
            await live.stop_within(PUSH_STOP_TIMEOUT)
            check_clean(live.run)
            assert len(live.run.of("consumed")) == len(order), live.run.report()
            assert broker.handle.broker.clients.client_ids(FIFO_PUSH_GROUP) == []


# ------------------------------------------------------------------ 4. shutdown hygiene
CYCLE_TOPIC = "NodeGrpcCycles"
#: (processes, cycles per process) per client kind: 20 cycles of producers and of simple
#: consumers, and a few push consumers (each stop waits for its long poll).
CYCLES: dict[str, tuple[int, int]] = {"producer": (4, 5), "simple": (4, 5), "push": (3, 1)}


async def test_start_shutdown_cycles(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path
) -> None:
    """Start/shutdown cycles of every client kind against one broker at once: every Node
    process exits 0 by itself (no ``Error: 14 UNAVAILABLE`` crash of a Telemetry stream cut
    before its trailers) without an error of its own; the broker logs no error and keeps no
    client registered, no call running and no connection broken."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            node = node_grpc(broker)
            await create_topic(broker.handle, CYCLE_TOPIC)
            runs: list[tuple[str, DriverRun]] = []

            async def cycles(kind: str, index: int, count: int) -> None:
                within = RUN_TIMEOUT + (PUSH_STOP_TIMEOUT if kind == "push" else 0)
                run = await node.run(
                    f"{kind}-{index}", "cycles", "--kind", kind, "--count", str(count),
                    "--topic", CYCLE_TOPIC, "--group", f"cycle-{kind}", within=within,
                )  # fmt: skip
                runs.append((kind, run))

            async with trio.open_nursery() as nursery:
                for kind, (processes, count) in CYCLES.items():
                    for index in range(processes):
                        nursery.start_soon(cycles, kind, index, count)
            assert len(runs) == sum(p for p, _ in CYCLES.values())
            for kind, run in runs:
                check_clean(run)
                assert len(run.of("cycle")) == CYCLES[kind][1], run.report()
            # Every producer cycle's message was stored.
            store = broker.handle.broker.store
            producer_cycles = CYCLES["producer"][0] * CYCLES["producer"][1]
            assert sum(store.max_offset(CYCLE_TOPIC, q) for q in range(4)) == producer_cycles
            clients = broker.handle.broker.clients
            for group in ("cycle-simple", "cycle-push"):
                assert clients.client_ids(group) == [], group
            grpc = broker.handle.grpc
            assert grpc is not None
            await wait_until("every call over", lambda: grpc.in_flight == 0, 10)
            await wait_until("every connection closed", lambda: grpc.connections == 0, 10)
            assert grpc.broken == 0 and grpc.refused == 0, broker.handle.statistics()


# ------------------------------------------------------------------ 5. SQL92 filters
SQL_TOPIC = "NodeGrpcSql92"
SQL_EXPRESSION = "region = 'eu' AND price > 10"
#: (key, tag, user properties, whether SQL_EXPRESSION matches) of the messages sent.
SQL_MESSAGES: list[tuple[str, str | None, dict[str, str], bool]] = [
    ("eu-20", "TagA", {"region": "eu", "price": "20"}, True),
    ("eu-5", "TagA", {"region": "eu", "price": "5"}, False),
    ("us-50", "TagB", {"region": "us", "price": "50"}, False),
    ("eu-10", "TagA", {"region": "eu", "price": "10"}, False),  # not above 10
    ("eu-11", None, {"region": "eu", "price": "11", "ünï": "✓"}, True),
    ("bare", "TagA", {}, False),  # both properties absent: NULL, filtered out
    ("eu-10.5", "TagB", {"region": "eu", "price": "10.5"}, False),  # not an int: no match
    ("eu-99", "TagB", {"region": "eu", "price": "99"}, True),
]  # fmt: skip
SQL_MATCHING = {key for key, _, _, matches in SQL_MESSAGES if matches}
ILLEGAL_FILTER_EXPRESSION = 40010


async def test_sql92_simple_consumer(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path
) -> None:
    """The official SimpleConsumer subscribed with an SQL92 expression receives exactly the
    matching messages (each once, tag, keys and properties intact); one more long poll comes
    back empty, the group's cursor is past the rejected messages, and a ``*`` consumer of
    another group gets them all."""
    group = "node-sql"
    plan: list[dict[str, Any]] = [
        {"body": key, "keys": [key], "properties": properties, **({"tag": tag} if tag else {})}
        for key, tag, properties, _ in SQL_MESSAGES
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            node = node_grpc(broker)
            _, sent = await node.produce("producer", SQL_TOPIC, plan)
            ids = {item["keys"][0]: e["message_id"] for item, e in zip(plan, sent, strict=True)}
            run = await node.run(
                "consumer", "simple", "--topic", SQL_TOPIC, "--group", group,
                "--filter-type", "SQL92", "--expression", SQL_EXPRESSION,
                "--count", str(len(SQL_MATCHING)), "--drain", "1", "--within", "20000",
            )  # fmt: skip
            check_clean(run)
            report = run.report()
            received = run.of("received")
            assert sorted(e["key"] for e in received) == sorted(SQL_MATCHING), report
            by_key = {item["keys"][0]: item for item in plan}
            for event in received:
                item = by_key[event["key"]]
                assert event["message_id"] == ids[event["key"]], event
                assert event["topic"] == SQL_TOPIC and event["keys"] == item["keys"], event
                assert event["tag"] == item.get("tag", ""), event
                assert event["properties"] == item["properties"], event
                body = item["body"].encode()
                assert (event["body_len"], event["body_sha256"]) == (len(body), sha256(body))
                assert event["attempt"] == 1 and not event["corrupted"], event
            assert len(run.of("acked")) == len(SQL_MATCHING), report
            (drained,) = run.of("drained")
            assert drained["messages"] == [], report

            store = broker.handle.broker.store

            def past_all() -> bool:
                return all(
                    store.offsets.query(group, SQL_TOPIC, q) == store.max_offset(SQL_TOPIC, q)
                    for q in range(4)
                    if store.max_offset(SQL_TOPIC, q) > 0
                )

            await wait_until("the cursor past every message", past_all, 10)
            assert broker.in_flight() == 0
            got = await receive_remoting(broker, "node-sql-all", SQL_TOPIC, len(plan), 20)
            assert {m.message_id for m in got} == set(ids.values())


async def test_sql92_malformed_expression_is_refused(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path
) -> None:
    """A receive with an SQL92 expression that does not parse is refused at once with
    ILLEGAL_FILTER_EXPRESSION: the client raises its BadRequestException (not retried),
    whose message says what is wrong; its one ERROR line is that failed receive, without a
    stack trace, and the process shuts down cleanly."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            node = node_grpc(broker)
            await create_topic(broker.handle, SQL_TOPIC)
            run = await node.run(
                "consumer", "simple", "--topic", SQL_TOPIC, "--group", "node-sql-bad",
                "--filter-type", "SQL92", "--expression", "region = 'eu' AND",
                "--count", "1", "--within", "10000",
            )  # fmt: skip
            report = run.report()
            assert run.returncode == 2 and run.of("stopped"), report
            (error,) = run.of("receive_error")
            assert error["code"] == ILLEGAL_FILTER_EXPRESSION, report
            assert error["type"] == "BadRequestException", report
            assert "SQL92" in error["message"], report
            assert not run.of("received") and not run.of("timeout"), report
            (line,) = client_errors(run)
            assert "Failed to receive messages" in line, report
            assert "error=BadRequestException: " in line and "40010" in line, report
            # The client logs the error with util.format's %s, which renders an Error with
            # its stack: the only stack in its log is that of the BadRequestException its
            # StatusChecker raised, right under that line; nothing else failed.
            stderr = run.stderr_path.read_text(errors="replace").splitlines()
            at = stderr.index(line)
            stack = list(itertools.takewhile(lambda s: not TIMESTAMPED.match(s), stderr[at + 1 :]))
            assert stack and "StatusChecker.check" in stack[0], report
            rest = stderr[: at + 1] + stderr[at + 1 + len(stack) :]
            assert not any(s.lstrip().startswith("at ") for s in rest), report
            assert "UNAVAILABLE" not in "\n".join(stderr), report
            assert broker.in_flight() == 0


# ------------------------------------------------------------------ 6. ACL
UNAUTHORIZED, FORBIDDEN = 40100, 40300
#: What the client's errors say before the broker's text (it never passes a request id).
NODE_PREFIX = "[request-id=undefined, response-code={code}] "
NO_CREDENTIAL = "no MQv2-HMAC-SHA1 credential: the call needs one (ACL is on)"


def credentials(access_key: str, secret_key: str) -> tuple[str, ...]:
    return ("--access-key", access_key, "--secret-key", secret_key)


async def acl_produce(
    node: NodeGrpc, label: str, plan: list[dict[str, Any]], *args: str
) -> DriverRun:
    """The ``produce`` mode to ACL_TOPIC with more ``args`` (credentials); the caller checks
    how it ended."""
    path = node.tmp / f"{label}.json"
    path.write_text(json.dumps({"messages": plan}, ensure_ascii=False))
    return await node.run(label, "produce", "--topic", ACL_TOPIC, "--plan", str(path), *args)


def stored_in(broker: Running, topic: str) -> int:
    store = broker.handle.broker.store
    return sum(store.max_offset(topic, q) for q in range(8))


def log_stacks(run: DriverRun) -> list[tuple[str, list[str]]]:
    """Each stack trace in the client's log (the continuation lines util.format writes for
    an Error), with the log line it belongs to."""
    stacks: list[tuple[str, list[str]]] = []
    head = ""
    for line in run.stderr_path.read_text(errors="replace").splitlines():
        if TIMESTAMPED.match(line):
            head = line
        elif line.lstrip().startswith("at "):
            if not stacks or stacks[-1][0] != head:
                stacks.append((head, []))
            stacks[-1][1].append(line.strip())
    return stacks


async def test_acl_producer_and_simple_consumer_with_their_accounts(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a broker with ACL, the official producer with ``sessionCredentials`` of an account
    with PUB on the topic starts (its settings answered) and sends every message, and the
    official SimpleConsumer with those of an account with SUB on the topic and the group
    receives each once, intact (a further long poll finds nothing): every call carried the
    credential (``Signature`` in upper-case hex, ``x-mq-date-time`` in UTC) and was allowed;
    both processes end cleanly, no client error."""
    decisions = watch_acl(monkeypatch)
    plan: list[dict[str, Any]] = [
        {"body": f"acl ✓ {i}", "tag": "TagAcl", "keys": [f"acl-{i}"],
         "properties": {"n": str(i)}}
        for i in range(4)
    ]  # fmt: skip
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path, acl_file=acl_file(tmp_path)) as broker:
            node = node_grpc(broker)
            run = await acl_produce(node, "producer", plan, *credentials(PRODUCER_AK, PRODUCER_SK))
            check_clean(run)
            sent = run.of("sent")
            assert [e["index"] for e in sent] == list(range(len(plan))), run.report()
            consumer = await node.run(
                "consumer", "simple", "--topic", ACL_TOPIC, "--group", ACL_GROUP,
                "--count", str(len(plan)), "--drain", "1", "--within", "20000",
                *credentials(CONSUMER_AK, CONSUMER_SK),
            )  # fmt: skip
            check_clean(consumer)
            report = consumer.report()
            received = consumer.of("received")
            assert sorted(e["message_id"] for e in received) == sorted(
                e["message_id"] for e in sent
            ), report  # fmt: skip
            by_id = {e["message_id"]: e for e in received}
            for item, receipt in zip(plan, sent, strict=True):
                event = by_id[receipt["message_id"]]
                body = item["body"].encode()
                assert (event["body_len"], event["body_sha256"]) == (len(body), sha256(body))
                assert event["topic"] == ACL_TOPIC and event["tag"] == item["tag"], event
                assert event["keys"] == item["keys"], event
                assert event["properties"] == item["properties"], event
                assert event["attempt"] == 1 and not event["corrupted"], event
            assert len(consumer.of("acked")) == len(plan), report
            (drained,) = consumer.of("drained")
            assert drained["messages"] == [], report
            assert stored_in(broker, ACL_TOPIC) == len(plan)
            await wait_until("every lease acked", lambda: broker.in_flight() == 0, 10)

            assert [d for d in decisions if d.code is not None] == []
            secrets = {PRODUCER_AK: PRODUCER_SK, CONSUMER_AK: CONSUMER_SK}
            assert_signed(decisions, secrets, upper=True)
            methods = {(d.access_key, d.method) for d in decisions}
            for method in ("QueryRoute", "Telemetry", "SendMessage"):
                assert (PRODUCER_AK, method) in methods, methods
            for method in ("QueryRoute", "Telemetry", "ReceiveMessage", "AckMessage"):
                assert (CONSUMER_AK, method) in methods, methods


async def test_acl_wrong_secret_is_unauthorized(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer whose ``sessionCredentials`` have a wrong secret (and one without
    ``sessionCredentials``, which sends no ``authorization`` at all) is refused UNAUTHORIZED
    at its first call, the route query; ``startup()`` tries it 3 times (1 s, then 2 s apart)
    and fails with an Error whose cause's cause is the UnauthorizedException (40100, the
    broker's reason). Nothing is stored. The client logs each refused query as an ERROR line
    (no stack) and the startup failure with the stack of that Error (util.format), nothing
    else; the process exits by itself (no UNAVAILABLE crash)."""
    decisions = watch_acl(monkeypatch)
    cases = {
        "wrong-secret": (credentials(PRODUCER_AK, "not-the-secret"),
                         f"signature check failed for AccessKey '{PRODUCER_AK}'"),
        "no-credential": ((), NO_CREDENTIAL),
    }  # fmt: skip
    plan = [{"body": "never sent"}]
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path, acl_file=acl_file(tmp_path)) as broker:
            node = node_grpc(broker)
            for label, (args, reason) in cases.items():
                before = len(decisions)
                run = await acl_produce(node, label, plan, *args)
                report = run.report()
                assert run.returncode == 4 and run.of("stopped"), report
                assert not run.of("started") and not run.of("sent"), report
                (failed,) = run.of("startup_failed")
                startup, fetch, cause = failed["errors"]
                assert startup["type"] == "Error", report
                assert startup["message"].startswith("Startup the rocketmq client failed"), report
                assert fetch["message"] == "Failed to fetch topic routes after 3 attempts", report
                assert cause["type"] == "UnauthorizedException", report
                assert cause["code"] == UNAUTHORIZED, report
                assert cause["message"] == NODE_PREFIX.format(code=UNAUTHORIZED) + reason
                assert failed["ms"] >= 2500, report  # the start-up's back-off: 1 s, 2 s

                mine = decisions[before:]
                assert [(d.method, d.code) for d in mine] == [
                    ("QueryRoute", UNAUTHORIZED)
                ] * 3, mine  # fmt: skip
                if args:
                    assert_signed(mine, {PRODUCER_AK: "not-the-secret"}, upper=True)
                else:
                    assert {d.authorization for d in mine} == {""}, mine

                # ERROR lines: each refused query, the start-up's verdict, then its Error.
                *refused, verdict, last = client_errors(run)
                assert len(refused) == 3, report
                for line in refused:
                    assert "Failed to fetch topic route, " in line, report
                    assert line.endswith(f"topic={ACL_TOPIC}, endpoints={broker.endpoint}, "
                                         f"error={cause['message']}"), report  # fmt: skip
                assert "Fetch topic route failed after 3 attempts" in verdict, report
                assert verdict.endswith(cause["message"]), report
                assert "ERROR Error: Startup the rocketmq client failed" in last, report
                ((head, stack),) = log_stacks(run)
                assert head == last and "Producer.startup" in stack[0], report
                assert "UNAVAILABLE" not in run.stderr_path.read_text(), report
            assert stored_in(broker, ACL_TOPIC) == 0
            assert broker.handle.broker.topics.get(ACL_TOPIC) is None


async def test_acl_producer_without_pub_is_forbidden(
    node_grpc: Callable[[Running], NodeGrpc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer account with PUB on its own topic only: sends there go through, before and
    after refusals; a send to a topic it has no right on at all fails at the route query
    with ForbiddenException (40300, the broker's reason); one to a topic it may only
    subscribe to gets its route, then each of the client's 3 attempts is refused FORBIDDEN
    and ``send`` raises ForbiddenException. Nothing reaches the refused topics. The client
    logs the refused route query (no stack) and the last refused attempt as ERROR lines, the
    attempts before as WARN, each attempt with the stack of its ForbiddenException (raised by
    the client's StatusChecker); the process ends cleanly."""
    decisions = watch_acl(monkeypatch)
    plan: list[dict[str, Any]] = [
        {"body": "allowed before"},
        {"body": "no right", "topic": ACL_OTHER_TOPIC, "refused": True},
        {"body": "sub only", "topic": ACL_SUB_ONLY_TOPIC, "refused": True},
        {"body": "allowed after"},
    ]
    no_right = f"AccessKey '{PRODUCER_AK}' has no any permission on topic '{ACL_OTHER_TOPIC}'"
    no_pub = f"AccessKey '{PRODUCER_AK}' has no PUB permission on topic '{ACL_SUB_ONLY_TOPIC}'"
    forbidden = NODE_PREFIX.format(code=FORBIDDEN)
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path, acl_file=acl_file(tmp_path)) as broker:
            node = node_grpc(broker)
            run = await acl_produce(node, "producer", plan, *credentials(PRODUCER_AK, PRODUCER_SK))
            report = run.report()
            assert run.returncode == 0 and run.of("stopped") and not run.of("error"), report
            assert [e["index"] for e in run.of("sent")] == [0, 3], report
            other, sub_only = run.of("refused")
            assert other["index"] == 1 and sub_only["index"] == 2, report
            assert other["errors"] == [
                {"type": "ForbiddenException", "code": FORBIDDEN, "message": forbidden + no_right}
            ], report  # fmt: skip
            assert sub_only["errors"] == [
                {"type": "ForbiddenException", "code": FORBIDDEN, "message": forbidden + no_pub}
            ], report  # fmt: skip

            assert stored_in(broker, ACL_TOPIC) == 2
            assert stored_in(broker, ACL_SUB_ONLY_TOPIC) == stored_in(broker, ACL_OTHER_TOPIC) == 0
            for topic in (ACL_OTHER_TOPIC, ACL_SUB_ONLY_TOPIC):
                assert broker.handle.broker.topics.get(topic) is None, topic

            assert_signed(decisions, {PRODUCER_AK: PRODUCER_SK}, upper=True)
            refused = sorted((d.method, d.code) for d in decisions if d.code is not None)
            assert refused == [("QueryRoute", FORBIDDEN)] + [("SendMessage", FORBIDDEN)] * 3

            route, last = client_errors(run)
            assert "Failed to fetch topic route" in route and route.endswith(no_right), report
            assert "Failed to send message(s) finally, run out of attempt times" in last, report
            assert f"topic={ACL_SUB_ONLY_TOPIC}" in last and no_pub in last, report
            stacks = log_stacks(run)
            assert [head.split(" ", 2)[1] for head, _ in stacks] == ["WARN", "WARN", "ERROR"]
            for head, stack in stacks:
                assert f"error=ForbiddenException: {forbidden}{no_pub}" in head, report
                assert stack[0].startswith("at StatusChecker.check "), report
            stderr = run.stderr_path.read_text(errors="replace")
            assert "UNAVAILABLE" not in stderr, report
