"""Interop: the official RocketMQ 5 Python client (``rocketmq-python-client`` 5.1.2, gRPC)
against trimq's gRPC front end, and across to trimq's own Remoting client.

The client runs as a driver subprocess (``grpc_py_driver.py``, in the client's own venv with
``-I`` and a scratch ``HOME``) that prints JSON lines; the broker runs in-process on
127.0.0.1 (any ports), one per test, with its log captured: no test may make it log an error.
Every wait is bounded; a new consumer group reads a young queue from its start (RocketMQ's
``getInitOffset``), so messages may be sent before a consumer's first receive.

1. Producer round trip: tags, several keys, user properties, a delayed message and a FIFO
   message group sent by the official producer are read back over Remoting intact, with the
   gRPC ``message_id`` as the Remoting msgId (``UNIQ_KEY``) and the receipts' offsets; the
   group is stored as RocketMQ's ``__SHARDINGKEY``, and a delayed message reaches the
   official consumer with its delivery time, type DELAY and no trimq-internal property.
2. The reverse: what trimq's Remoting producer sends, the official SimpleConsumer receives.
3. SimpleConsumer ack / change invisible duration / stale receipt handles / a too-short
   invisible time.
4. A parked long poll answers as soon as a message arrives.
5. PushConsumer: quick startup (settings answered), a failed message comes again with
   delivery_attempt 2, an always-failing one lands in ``%DLQ%group`` after max attempts.
   On a group made orderly (``updateSubGroup -o true``, before the consumer starts) the same
   consumer consumes in order: each message group strictly in send order, a failing message
   retried locally (the group's ``retryMaxTimes`` + 1 calls) while its group waits, then
   forwarded to ``%DLQ%group`` and acked; other groups go on meanwhile.
6. Start/shutdown cycles of every client kind leave nothing behind.
7. Transactions (the official producer's ``begin_transaction`` / ``TransactionChecker``): a
   committed half is consumed exactly once, intact, by the official consumer and over
   Remoting, a rolled-back one never; open transactions are checked back on the producer's
   Telemetry stream (``recover_orphaned_transaction_command``) and the checker's COMMIT
   publishes, ROLLBACK drops and an unknown answer leaves the half to the next check; after
   the producer crashed between its half and its decision, a new producer of the topic is
   asked and its answers hold.
8. SQL92 property filters (``FilterExpression(..., FilterType.SQL)``): a SimpleConsumer and
   a PushConsumer subscribed with ``region = 'eu' AND price > 10`` get exactly the messages
   the official producer sent that match (each once, tag and properties intact) and never
   the others, which the group's pop cursor moves past (a ``*`` consumer of another group
   gets all of them); a malformed expression is refused with ILLEGAL_FILTER_EXPRESSION; a
   parked receive is not woken by a message the expression rejects, and a matching one sent
   over Remoting (``TAGS`` in the expression too) wakes it at once.
9. ACL (a broker with ``acl_file``; the driver's ``--access-key``/``--secret-key`` are the
   client's ``Credentials``): every call the clients make carries ``authorization:
   MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time, Signature=<lower-case hex
   HMAC-SHA1 of x-mq-date-time>`` (the local time, labelled UTC). A producer account with
   PUB on the topic and a consumer account with SUB on the topic and the group send and
   receive every message once, intact, every call allowed (the broker's check is watched,
   not changed, to see what each call carried and got). A wrong secret (or no
   credential) is refused UNAUTHORIZED at the first call, the route query: the client logs
   the code and reason, but ``send`` raises a plain ``Exception`` ("failed to fetch topic:T
   route.", no code). A topic without PUB: no right at all fails the same way at the route
   query (FORBIDDEN in the log); SUB only gets the route, then each send attempt is refused
   and ``send`` raises ForbiddenException (40300). Nothing refused is stored; the client
   logs the refusals as ERROR lines without a traceback.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

from broker.core.send import SendRequest
from broker.core.transactions import TransactionStatistics
from broker.grpc.service import MessagingService
from broker.schedule import SCHEDULE_TOPIC, TIMER_SRC
from client.message import Message, ReceivedMessage
from client.producer import Producer
from client.simple_consumer import SimpleConsumer
from protocol.grpc.convert import SHARDING_KEY, SYSTEM_PROPERTY_NAMES
from protocol.message import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    MessageExt,
    decode_record,
)
from protocol.naming import dlq_topic
from protocol.properties import KEYS, REAL_TOPIC, TAGS, TRAN_MSG, UNIQ_KEY
from scripts.interop_setup import ClientEnv
from tests.interop.grpc_broker import (
    MESSAGE_ID,
    Running,
    grpc_broker,
    make_orderly,
    wait_until,
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
    pytest.mark.parametrize("client_env", [pytest.param("py-grpc", id="py-grpc")], indirect=True),
]

DRIVER = Path(__file__).resolve().parent / "grpc_py_driver.py"
#: Bounds (seconds) of one driver run and of whole tests.
RUN_TIMEOUT = 30.0
TEST_TIMEOUT = 60.0
#: Lines the client logs as ERROR for its own reasons, whatever the server answers:
#: - PushConsumer.reset_metric registers gauges on a meter provider that does not exist when
#:   the settings say ``metric.on = false`` (as the proxy's default answer does);
#: - ``shutdown()`` sets ``_init_settings_event`` to None while the Telemetry reader may
#:   still apply a settings answer (``reset_setting`` then calls ``None.is_set()``): a client
#:   shut down right after ``startup()`` races its own first settings reply;
#: - a PushConsumer's shutdown closes its channel while it still counts as running, so the
#:   receive in flight ends in a CancelledError (whose text is empty) logged as an error.
KNOWN_CLIENT_ERRORS = (
    re.compile(r"read stream from endpoints \S+ exception, 'NoneType' object has no "
               r"attribute '(get_meter|is_set)'$"),
    re.compile(r"process received message error, $"),
)  # fmt: skip

#: What the producer logs as ERROR when a send is refused (a plan's ``refused`` messages).
SEND_REFUSED = (
    re.compile(r"failed to send message to \S+, because of run out of attempt times"),
    re.compile(r"send message exception, topic: "),
)


# ------------------------------------------------------------------ the client's driver
@dataclass
class PyGrpc:
    """How the tests run the driver against one broker."""

    env: ClientEnv
    tmp: Path
    endpoint: str
    runs: list[DriverRun] = field(default_factory=list)
    #: More environment for the driver (TLS).
    extra_env: dict[str, str] = field(default_factory=dict)

    def _prepare(self, label: str, scenario: str, args: tuple[str, ...]) -> tuple[
        DriverRun, list[str], dict[str, str]
    ]:  # fmt: skip
        home = self.tmp / f"home-{label}"
        home.mkdir()
        run = DriverRun(label, self.tmp / f"{label}.err")
        self.runs.append(run)
        assert self.env.python is not None
        command = [str(self.env.python), "-I", str(DRIVER), scenario,
                   "--endpoint", self.endpoint, *args]  # fmt: skip
        return run, command, {**real_clock_environ(), "HOME": str(home), **self.extra_env}

    async def run(
        self,
        label: str,
        scenario: str,
        *args: str,
        allow: tuple[re.Pattern[str], ...] = (),
        clean: bool = True,
    ) -> DriverRun:
        """Run a scenario to its end (bounded) and check it ended cleanly (``allow``: the
        client's ERROR lines the scenario expects; ``clean=False``: the caller checks how it
        ended, e.g. a crash)."""
        run, command, env = self._prepare(label, scenario, args)
        await run_to_end(command, env, run, RUN_TIMEOUT)
        if clean:
            check_clean(run, allow)
        return run

    async def start(
        self, nursery: trio.Nursery, label: str, scenario: str, *args: str
    ) -> LiveDriver:
        """Start a long-running scenario (stopped by ``LiveDriver.stop``)."""
        run, command, env = self._prepare(label, scenario, args)
        live = LiveDriver(run)
        await nursery.start(live.serve, command, env)
        return live

    def plan_file(self, label: str, plan: list[dict[str, Any]]) -> str:
        """Write a driver's plan; its path."""
        path = self.tmp / f"{label}.json"
        path.write_text(json.dumps(plan))
        return str(path)

    async def produce(self, label: str, plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send ``plan`` with the official producer; its ``sent`` events in order."""
        allow = SEND_REFUSED if any(item.get("refused") for item in plan) else ()
        run = await self.run(label, "produce", "--plan", self.plan_file(label, plan), allow=allow)
        sent = sorted(run.of("sent") + run.of("refused"), key=lambda e: e["index"])
        assert [e["index"] for e in sent] == list(range(len(plan))), run.report()
        return sent


def check_clean(run: DriverRun, allow: tuple[re.Pattern[str], ...] = ()) -> None:
    """Exit 0, ``done`` with code 0, no traceback on stderr, no ERROR logged by the client
    but its known ones and those in ``allow``."""
    report = run.report()
    assert run.returncode == 0, report
    assert [e["code"] for e in run.of("done")] == [0], report
    assert not run.of("error"), report
    stderr = run.stderr_path.read_text(errors="replace")
    assert "Traceback" not in stderr, report
    (log,) = run.of("client_log")
    known = KNOWN_CLIENT_ERRORS + allow
    errors = [e for e in log["errors"] if not any(k.search(e) for k in known)]
    assert not errors and not log["traceback"], report


@pytest.fixture
def py_grpc(client_env: ClientEnv, tmp_path: Path) -> Callable[[Running], PyGrpc]:
    return lambda broker: PyGrpc(client_env, tmp_path, broker.endpoint)


# ------------------------------------------------------------------ Remoting side
async def receive_remoting(
    broker: Running, group: str, topic: str, count: int, within: float
) -> list[tuple[ReceivedMessage, int]]:
    """Receive ``count`` messages with trimq's SimpleConsumer (acking each); each with the
    broker's clock when it arrived."""
    got: list[tuple[ReceivedMessage, int]] = []
    async with SimpleConsumer(
        broker.remoting, group=group, subscription={topic: "*"}, consume_from="first"
    ) as consumer:
        with trio.move_on_after(within):
            while len(got) < count:
                batch = await consumer.receive(32, invisible_duration=30, await_duration=2)
                now = broker.now_ms()
                for msg in batch:
                    got.append((msg, now))
                    await consumer.ack(msg)
    assert len(got) == count, f"received {len(got)} of {count}: {[m.body for m, _ in got]}"
    return got


def user_properties(record: MessageExt) -> dict[str, str]:
    """The properties an application set: not those RocketMQ reserves, nor trimq's mark on
    a delivered scheduled message (``TIMER_SRC``, as RocketMQ's timer adds its own)."""
    return {
        k: v
        for k, v in record.properties.items()
        if k not in SYSTEM_PROPERTY_NAMES and k != TIMER_SRC
    }


# ------------------------------------------------------------------ 1. producer round trip
RT_TOPIC = "GrpcRoundTrip"
FIFO_GROUP = "order-42"
DELAY_S = 3


async def test_producer_round_trip_to_remoting(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """What the official producer sends is stored as a Remoting producer would store it."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            deliver_at_s = broker.now_ms() // 1000 + DELAY_S
            plan: list[dict[str, Any]] = [
                {"topic": RT_TOPIC, "body": "plain ✓", "tag": "TagA",
                 "keys": ["k-1", "order-1", "üser"], "properties": {"color": "red", "n": "1"}},
                {"topic": RT_TOPIC, "body": "second", "tag": "TagB", "keys": ["k-2"],
                 "properties": {"color": "blue"}},
                {"topic": RT_TOPIC, "body": "untagged"},
                {"topic": RT_TOPIC, "body": "later", "tag": "Delayed", "keys": ["k-delay"],
                 "deliver_at_s": deliver_at_s},
                {"topic": RT_TOPIC, "body": "fifo 1", "tag": "Fifo", "group": FIFO_GROUP},
                {"topic": RT_TOPIC, "body": "fifo 2", "tag": "Fifo", "group": FIFO_GROUP},
                {"topic": RT_TOPIC, "body": "fifo 3", "tag": "Fifo", "group": FIFO_GROUP},
            ]  # fmt: skip
            sent = await py.produce("producer", plan)
            ids = [e["message_id"] for e in sent]
            assert all(MESSAGE_ID.match(i) for i in ids) and len(set(ids)) == len(ids), sent

            got = await receive_remoting(broker, "rt-remoting", RT_TOPIC, len(plan), 25)
            by_id = {msg.message_id: (msg, now) for msg, now in got}
            assert set(by_id) == set(ids), "the Remoting msgId is not the gRPC message_id"
            for item, receipt in zip(plan, sent, strict=True):
                msg, arrived_ms = by_id[receipt["message_id"]]
                record = msg.record
                where = f"message {item['body']!r}: {record.properties}"
                assert msg.topic == record.topic == RT_TOPIC, where
                assert msg.body == item["body"].encode(), where
                assert record.properties[UNIQ_KEY] == receipt["message_id"], where
                assert msg.tag == item.get("tag"), where
                assert record.properties.get(TAGS) == item.get("tag"), where
                keys = item.get("keys", [])
                assert sorted(msg.keys) == sorted(keys), where
                if keys:  # the client sends a set: any order, space-joined
                    assert sorted(record.properties[KEYS].split(" ")) == sorted(keys), where
                else:
                    assert KEYS not in record.properties, where
                assert user_properties(record) == item.get("properties", {}), where
                assert msg.delivery_attempt == 1, where
                if "deliver_at_s" in item:
                    deliver_ms = deliver_at_s * 1000
                    # Delivered no earlier than asked (the broker's clock, loosely).
                    assert arrived_ms >= deliver_ms, (arrived_ms, deliver_ms)
                    assert record.store_timestamp >= deliver_ms - 1000, where
                else:
                    # The receipt's offset is the message's offset in its queue (a delayed
                    # message's receipt names where it waits, not where it is delivered).
                    assert msg.queue_offset == receipt["offset"], where
            fifo = [
                by_id[r["message_id"]][0] for i, r in zip(plan, sent, strict=True) if i.get("group")
            ]
            assert len({m.queue.queue_id for m in fifo}) == 1, "a message group spans queues"
            assert [m.queue_offset for m in fifo] == sorted(m.queue_offset for m in fifo)


async def test_message_group_is_stored_as_rocketmq_sharding_key(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """A FIFO message's group is stored where RocketMQ puts it (``__SHARDINGKEY``), so
    Remoting tools and a RocketMQ store agree with it."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            plan = [{"topic": RT_TOPIC, "body": "fifo", "group": FIFO_GROUP}]
            (sent,) = await py.produce("producer", plan)
            (record,) = broker.handle.broker.store.messages_by_key(RT_TOPIC, sent["message_id"])
            stored, _ = decode_record(record)
            assert stored.properties.get("__SHARDINGKEY") == FIFO_GROUP, stored.properties


async def test_delayed_message_reaches_simple_consumer_as_sent(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """A delayed message sent by the official producer reaches the official consumer with
    its delivery time, type DELAY and only the user properties it was sent with."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            deliver_at_s = broker.now_ms() // 1000 + 2
            plan = [{"topic": RT_TOPIC, "body": "later", "properties": {"color": "red"},
                     "deliver_at_s": deliver_at_s}]  # fmt: skip
            (sent,) = await py.produce("producer", plan)
            run = await py.run(
                "consumer", "receive", "--group", "delay-grpc", "--topic", RT_TOPIC,
                "--count", "1", "--within", "15",
            )  # fmt: skip
            (event,) = run.of("received")
            assert event["message_id"] == sent["message_id"], run.report()
            assert event["properties"] == {"color": "red"}, event
            assert event["delivery_timestamp"] == deliver_at_s * 1000, event
            assert event["message_type"] == 3, event  # DELAY


async def test_delivery_time_too_far_ahead_is_illegal_delivery_time(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """A delivery time past the broker's timer limit (3 days) is refused with
    ILLEGAL_DELIVERY_TIME, the v2 code for it (not BAD_REQUEST); nothing is stored."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            far_s = broker.now_ms() // 1000 + 4 * 86_400
            plan = [
                {"topic": RT_TOPIC, "body": "too late", "deliver_at_s": far_s, "refused": True},
                {"topic": RT_TOPIC, "body": "in time", "deliver_at_s": far_s - 2 * 86_400},
            ]
            refused, sent = await py.produce("producer", plan)
            assert refused["event"] == "refused" and sent["event"] == "sent", (refused, sent)
            assert refused["name"] == "ILLEGAL_DELIVERY_TIME", refused
            assert refused["type"] == "BadRequestException", refused
            store = broker.handle.broker.store
            assert not store.messages_by_key(SCHEDULE_TOPIC, "too late")
            assert sum(store.max_offset(SCHEDULE_TOPIC, q) for q in range(32)) == 1


# ------------------------------------------------------------------ 2. Remoting → official
REV_TOPIC = "GrpcFromRemoting"
#: Over the Remoting producer's 4 KiB compression threshold.
LARGE_BODY = "".join(f"{i:05d}:{i * 7919 % 10007:05d};" for i in range(600)).encode()


async def test_remoting_producer_to_simple_consumer(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """What trimq's Remoting producer sends, the official SimpleConsumer receives intact,
    with message_id = UNIQ_KEY; a large body the producer zlib-compressed is delivered
    inflated (IDENTITY: the Node client cannot read zlib marked GZIP)."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            messages = [
                Message(REV_TOPIC, "héllo ✓".encode(), tag="TagA", keys=["a-1", "a-2", "a-3"],
                        properties={"color": "red", "trace": "x y"}),
                Message(REV_TOPIC, b"second", tag="TagB", keys=["b-1"]),
                Message(REV_TOPIC, b"no tag, no keys", properties={"n": "3"}),
                Message(REV_TOPIC, LARGE_BODY, tag="Large", keys=["large"]),
            ]  # fmt: skip
            async with Producer(broker.remoting) as producer:
                receipts = [await producer.send(m) for m in messages]
            run = await py.run(
                "consumer", "receive", "--group", "rev-grpc", "--topic", REV_TOPIC,
                "--count", str(len(messages)), "--within", "20",
            )  # fmt: skip
            (large,) = broker.handle.broker.store.messages_by_key(REV_TOPIC, "large")
            assert decode_record(large)[0].sys_flag & 1, "the large body was not compressed"
            got = {e["message_id"]: e for e in run.of("received")}
            assert set(got) == {r.message_id for r in receipts}, run.report()
            assert len(run.of("acked")) == len(messages), run.report()
            for message, receipt in zip(messages, receipts, strict=True):
                event = got[receipt.message_id]
                assert event["topic"] == REV_TOPIC, event
                assert event["body"] == message.body.decode(), event
                assert event["tag"] == message.tag, event
                assert event["keys"] == sorted(message.keys), event
                assert event["properties"] == dict(message.properties), event
                assert event["delivery_attempt"] == 1 and not event["corrupted"], event
                assert event["message_type"] == 1, event  # NORMAL


# ------------------------------------------------------------------ 3. invisible time
INV_TOPIC = "GrpcInvisible"
INV_COUNT = 6


async def test_simple_consumer_ack_and_change_invisible(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """Half acked; the other half made visible again in 1 s: redelivered with
    delivery_attempt 2 and a new handle that acks, while the stale handles are refused
    (INVALID_RECEIPT_HANDLE); an invisible time under 10 s is ILLEGAL_INVISIBLE_TIME."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            async with Producer(broker.remoting) as producer:
                for i in range(INV_COUNT):
                    await producer.send(Message(INV_TOPIC, f"m{i}".encode(), keys=[f"k{i}"]))
            run = await py.run(
                "consumer", "invisible", "--group", "inv-grpc", "--topic", INV_TOPIC,
                "--count", str(INV_COUNT), "--within", "20",
            )  # fmt: skip
            report = run.report()
            first = run.of("received")
            assert len(first) == INV_COUNT, report
            assert all(e["delivery_attempt"] == 1 for e in first), report
            acked = {e["message_id"] for e in run.of("acked")}
            changed = {e["message_id"]: e for e in run.of("changed")}
            assert len(acked) == len(changed) == INV_COUNT // 2, report
            for event in changed.values():
                assert event["new_handle"] != event["old_handle"], report

            # The pre-change handle is refused as soon as the change is made.
            after_change = [e for e in run.of("stale_ack") if e["stage"] == "after change"]
            assert {e["message_id"] for e in after_change} == set(changed), report
            for event in after_change:
                assert not event["ok"] and event["code"] == 40013, report
                assert event["name"] == "INVALID_RECEIPT_HANDLE", report
                assert event["type"] == "BadRequestException", report

            # Redelivered (only the changed ones), attempt 2, with a handle of their own.
            again = run.of("redelivered")
            assert {e["message_id"] for e in again} == set(changed), report
            for event in again:
                assert event["delivery_attempt"] == 2, report
                old = changed[event["message_id"]]
                assert event["receipt_handle"] not in (old["old_handle"], old["new_handle"])
            # The new handle acks; both handles of the first delivery are refused.
            new_acks = run.of("new_ack")
            assert {e["message_id"] for e in new_acks} == set(changed), report
            assert all(e["ok"] for e in new_acks), report
            for event in run.of("stale_ack"):
                assert not event["ok"] and event["name"] == "INVALID_RECEIPT_HANDLE", report

            (short,) = run.of("short_invisible")
            assert not short["ok"] and short["code"] == 40011, report
            assert short["name"] == "ILLEGAL_INVISIBLE_TIME", report
            assert short["type"] == "BadRequestException", report

            # Nothing is left in flight (a revived lease goes once its copy is durable).
            await wait_until(
                "nothing in flight",
                lambda: broker.handle.statistics().core.pop.in_flight == 0,
                10,
            )


# ------------------------------------------------------------------ 4. long polling
POLL_TOPIC = "GrpcLongPoll"
POLL_GROUP = "poll-grpc"
AWAIT_S = 10


async def test_long_poll_answers_on_arrival(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """A receive parked with a 10 s await returns soon after another producer sends."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker, trio.open_nursery() as nursery:
            py = py_grpc(broker)
            await create_topic(broker.handle, POLL_TOPIC)
            live = await py.start(
                nursery, "consumer", "longpoll", "--group", POLL_GROUP, "--topic", POLL_TOPIC,
                "--await", str(AWAIT_S),
            )  # fmt: skip
            await live.wait_for("polling", lambda: bool(live.run.of("polling")), RUN_TIMEOUT)
            await wait_until("the receive parked", lambda: broker.parked(POLL_GROUP) > 0, 10)
            async with Producer(broker.remoting) as producer:
                receipt = await producer.send(Message(POLL_TOPIC, b"wake up", tag="T"))
            sent_at = trio.current_time()
            await live.wait_for("received", lambda: bool(live.run.of("received")), AWAIT_S + 5)
            answered_in = trio.current_time() - sent_at
            (event,) = live.run.of("received")
            assert [m["message_id"] for m in event["messages"]] == [receipt.message_id]
            # Loose bounds: the parked call answered on arrival, well before its 10 s.
            assert answered_in < 5, f"answered {answered_in:.1f} s after the send"
            assert event["seconds"] < AWAIT_S - 2, live.run.report()
            await live.stop()
            check_clean(live.run)


# ------------------------------------------------------------------ 5. push consumer
PUSH_TOPIC = "GrpcPush"
PUSH_GROUP = "push-grpc"
MAX_RECONSUME = 2  # max attempts 3


async def test_push_consumer_retry_and_dead_letter(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """PushConsumer: startup gets its settings at once; a message failed once comes back
    with delivery_attempt 2 and is acked; one always failed is delivered max-attempts times
    and then lands in %DLQ%group."""
    keys = ["ok-1", "fail-once-1", "fail-once-2", "fail-always-1"]
    with trio.fail_after(TEST_TIMEOUT):
        async with (
            grpc_broker(tmp_path, max_reconsume_times=MAX_RECONSUME) as broker,
            trio.open_nursery() as nursery,
        ):
            py = py_grpc(broker)
            await create_topic(broker.handle, PUSH_TOPIC)
            live = await py.start(
                nursery, "consumer", "push", "--group", PUSH_GROUP, "--topic", PUSH_TOPIC
            )
            await live.wait_for("started", lambda: bool(live.run.of("started")), RUN_TIMEOUT)
            (started,) = live.run.of("started")
            assert started["seconds"] < 5, live.run.report()  # no 10 s wait for settings

            async with Producer(broker.remoting) as producer:
                ids = {
                    key: (await producer.send(Message(PUSH_TOPIC, key.encode(), keys=[key])))
                    .message_id
                    for key in keys
                }  # fmt: skip
            dlq = dlq_topic(PUSH_GROUP)
            store = broker.handle.broker.store

            def attempts(key: str) -> list[tuple[int, bool]]:
                calls = [e for e in live.run.of("consumed") if e["key"] == key]
                return [(e["delivery_attempt"], e["failed"]) for e in calls]

            def settled() -> bool:
                return (
                    attempts("ok-1") == [(1, False)]
                    and attempts("fail-once-1") == [(1, True), (2, False)]
                    and attempts("fail-once-2") == [(1, True), (2, False)]
                    and bool(store.messages_by_key(dlq, "fail-always-1"))
                )

            # fail-always: nacked for 1 s, 5 s, 10 s (the settings' back-off): ~16 s.
            await live.wait_for("every outcome", settled, 40)
            assert attempts("fail-always-1") == [(n, True) for n in range(1, MAX_RECONSUME + 2)]
            (record,) = store.messages_by_key(dlq, "fail-always-1")
            dead, _ = decode_record(record)
            assert dead.topic == dlq and dead.body == b"fail-always-1"
            assert dead.properties[UNIQ_KEY] == ids["fail-always-1"]
            assert dead.reconsume_times == MAX_RECONSUME + 1
            for event in live.run.of("consumed"):
                assert event["message_id"] == ids[event["key"]], event
                assert event["topic"] == PUSH_TOPIC and not event["corrupted"], event
            assert broker.handle.statistics().core.pop.dead_lettered == 1
            # The dead-lettered lease is dropped once its DLQ copy is durable.
            await wait_until(
                "nothing in flight",
                lambda: broker.handle.statistics().core.pop.in_flight == 0,
                10,
            )
            await live.stop()
            check_clean(live.run)
            # Nothing more came meanwhile: 1 + 2 + 2 + 3 listener calls.
            assert len(live.run.of("consumed")) == 8, live.run.report()


FIFO_PUSH_TOPIC = "GrpcFifoPush"
FIFO_PUSH_GROUP = "fifo-push-grpc"
#: The group's retryMaxTimes: 3 listener calls (1 s, then 5 s apart) before the DLQ. The
#: broker's own limit stays 16, so the client's count shows the group's was used.
FIFO_RETRY_MAX = 2
#: Message groups and their keys in send order (the listener fails ``fail-always-*``).
FIFO_PLAN = {"A": ["a-0", "fail-always-a1", "a-2"], "B": ["b-0", "b-1", "b-2"]}
#: Sent while ``fail-always-a1`` is being retried: each must wait for its group's batch.
FIFO_LATE = {"A": "a-3", "B": "b-3"}


async def send_to_group_queue(broker: Running, topic: str, group: str, key: str) -> None:
    """Store a message of message group ``group`` in the queue its earlier messages are in
    (where the gRPC front end puts them), as an official FIFO producer's."""
    store = broker.handle.broker.store
    queue_id = decode_record(store.messages_by_key(topic, FIFO_PLAN[group][0])[0])[0].queue_id
    props = {SHARDING_KEY: group, KEYS: key, UNIQ_KEY: f"FIFO{key.upper()}"}
    outcome = await broker.handle.broker.sends.send(
        SendRequest(topic, key.encode(), props, queue_id)
    )
    assert outcome.result.ok, outcome


async def test_push_consumer_on_a_fifo_group(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """The official PushConsumer on an orderly group: messages of one message group are
    consumed strictly in send order; a failing one is retried locally retryMaxTimes + 1 times
    while the messages behind it (even those sent meanwhile) wait, then it lands in
    %DLQ%group and is acked; the other message group is not held up."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker, trio.open_nursery() as nursery:
            py = py_grpc(broker)
            await create_topic(broker.handle, FIFO_PUSH_TOPIC)
            await make_orderly(broker, FIFO_PUSH_GROUP, FIFO_RETRY_MAX)
            live = await py.start(
                nursery, "consumer", "push", "--group", FIFO_PUSH_GROUP, "--topic", FIFO_PUSH_TOPIC
            )
            await live.wait_for("started", lambda: bool(live.run.of("started")), RUN_TIMEOUT)
            plan = [
                {"topic": FIFO_PUSH_TOPIC, "body": key, "keys": [key], "group": group}
                for group, keys in FIFO_PLAN.items()
                for key in keys
            ]
            await py.produce("producer", plan)

            def calls(group: str) -> list[dict[str, Any]]:
                return [e for e in live.run.of("consumed") if e["message_group"] == group]

            await live.wait_for(
                "the first failure",
                lambda: any(e["key"] == "fail-always-a1" for e in calls("A")),
                RUN_TIMEOUT,
            )
            for group, key in FIFO_LATE.items():
                await send_to_group_queue(broker, FIFO_PUSH_TOPIC, group, key)
            late_sent_at = time.time()  # the driver stamps its events with this clock
            dlq = dlq_topic(FIFO_PUSH_GROUP)
            store = broker.handle.broker.store

            def settled() -> bool:
                return (
                    len(calls("A")) == len(FIFO_PLAN["A"]) + FIFO_RETRY_MAX + 1
                    and len(calls("B")) == len(FIFO_PLAN["B"]) + 1
                    and bool(store.messages_by_key(dlq, "fail-always-a1"))
                )

            # fail-always-a1: called, then 1 s and 5 s later again (the group's back-off).
            await live.wait_for("every message consumed", settled, 30)
            report = live.run.report()
            attempts = [e["key"] for e in calls("A")]
            assert attempts == [
                "a-0", *["fail-always-a1"] * (FIFO_RETRY_MAX + 1), "a-2", "a-3"
            ], report  # fmt: skip
            assert [e["key"] for e in calls("B")] == ["b-0", "b-1", "b-2", "b-3"], report
            # Local retries: the broker delivered each message once.
            for event in live.run.of("consumed"):
                assert event["delivery_attempt"] == 1 and not event["corrupted"], event
                assert event["failed"] == event["key"].startswith("fail-always-"), event
                assert event["message_type"] == 2, event  # FIFO
            # The late messages were in the broker well before the failing one's last call:
            # its queue held a-3 back until a-2 was done, while b-3 came at once.
            failures = [e for e in calls("A") if e["failed"]]
            (b3,) = [e for e in calls("B") if e["key"] == "b-3"]
            (a2,) = [e for e in calls("A") if e["key"] == "a-2"]
            assert failures[0]["at"] < late_sent_at < failures[-1]["at"] < a2["at"], report
            assert late_sent_at < b3["at"] < failures[-1]["at"], report

            (record,) = store.messages_by_key(dlq, "fail-always-a1")
            dead, _ = decode_record(record)
            assert dead.topic == dlq and dead.body == b"fail-always-a1"
            assert dead.properties[UNIQ_KEY] == calls("A")[1]["message_id"]
            await wait_until(
                "nothing in flight",
                lambda: broker.handle.statistics().core.pop.in_flight == 0,
                10,
            )
            await live.stop()
            check_clean(live.run)
            assert len(live.run.of("consumed")) == len(calls("A")) + len(calls("B"))


# ------------------------------------------------------------------ 6. cycles
CYCLE_TOPIC = "GrpcCycles"
IDLE_TOPIC = "GrpcCyclesIdle"  # nothing is sent to it: receives park
#: In-process start/shutdown cycles per client kind, and PushConsumer processes stopped
#: while their receive is parked on the broker.
CYCLES: Mapping[str, int] = {"producer": 20, "simple": 20, "push": 5}
PARKED_PUSH_STOPS = 3


async def test_start_shutdown_cycles(py_grpc: Callable[[Running], PyGrpc], tmp_path: Path) -> None:
    """20 start/shutdown cycles of a Producer (one send each) and of a SimpleConsumer, 5 of
    a PushConsumer, and 3 PushConsumers shut down with a long poll parked, all against one
    broker at once: every process exits 0 without a traceback or an error of its own, the
    broker logs no error, and no client is left registered, parked or in a call."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            await create_topic(broker.handle, CYCLE_TOPIC)
            await create_topic(broker.handle, IDLE_TOPIC)
            runs: dict[str, DriverRun] = {}

            async def cycle(kind: str, count: int) -> None:
                runs[kind] = await py.run(
                    kind, "cycles", "--kind", kind, "--count", str(count),
                    "--topic", CYCLE_TOPIC, "--group", f"cycle-{kind}",
                )  # fmt: skip

            async def parked_stops() -> None:
                group = "cycle-parked"
                for i in range(PARKED_PUSH_STOPS):
                    async with trio.open_nursery() as nursery:
                        live = await py.start(
                            nursery, f"parked-{i}", "push", "--group", group,
                            "--topic", IDLE_TOPIC,
                        )  # fmt: skip
                        # Assignment comes after 1 s, then the receive parks.
                        await wait_until("a parked receive", lambda: broker.parked(group) > 0, 15)
                        await live.stop()
                    check_clean(live.run)
                    assert not live.run.of("consumed"), live.run.report()
                    await wait_until("the receive ended", lambda: broker.parked(group) == 0, 10)

            async with trio.open_nursery() as nursery:
                for kind, count in CYCLES.items():
                    nursery.start_soon(cycle, kind, count)
                nursery.start_soon(parked_stops)
            for kind, count in CYCLES.items():
                assert len(runs[kind].of("cycle")) == count, runs[kind].report()
            # Every producer cycle's message was stored.
            store = broker.handle.broker.store
            assert sum(store.max_offset(CYCLE_TOPIC, q) for q in range(4)) == CYCLES["producer"]
            clients = broker.handle.broker.clients
            for group in ("cycle-simple", "cycle-push", "cycle-parked"):
                assert clients.client_ids(group) == [], group
            grpc = broker.handle.grpc
            assert grpc is not None
            await wait_until("every call over", lambda: grpc.in_flight == 0, 10)
            assert grpc.broken == 0 and grpc.refused == 0, broker.handle.statistics()


async def test_tls_with_a_verified_certificate_and_plaintext_on_the_same_port(
    client_env: ClientEnv, tmp_path: Path
) -> None:
    """``tls_enable=True`` (the client verifies the certificate against its roots: a trustme
    CA here) and plaintext clients on one gRPC port, one store."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, roots = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(roots))
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path, tls_cert=cert, tls_key=key) as broker:
            tls_env = {"TRIMQ_DRIVER_TLS": "1", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(roots)}
            tls = PyGrpc(client_env, tmp_path, broker.endpoint, extra_env=tls_env)
            plain = PyGrpc(client_env, tmp_path, broker.endpoint)
            await tls.produce("tls-producer", [{"topic": "TlsTopic", "body": "over tls"}])
            await plain.produce("plain-producer", [{"topic": "TlsTopic", "body": "plain"}])
            run = await tls.run(
                "tls-consumer", "receive", "--group", "tls-group", "--topic", "TlsTopic",
                "--count", "2", "--within", "15",
            )  # fmt: skip
            assert sorted(e["body"] for e in run.of("received")) == ["over tls", "plain"]
            grpc = broker.handle.statistics().grpc
            assert grpc is not None and grpc.tls >= 2  # the producer's and the consumer's


# ------------------------------------------------------------------ 7. transactions
TX_TOPIC = "GrpcTransactions"
#: Fast check-backs: the first 1 s after the half is stored, then every second.
FAST_CHECKS: Mapping[str, Any] = {"transaction_immunity_s": 1, "transaction_check_interval_s": 1}
#: What the official producer logs when a check-back comes before its ``startup()`` is
#: over: its Telemetry stream (so its registration) starts with its routes, but it counts as
#: running only once its schedulers started; the check is dropped (the broker asks again a
#: check interval later). A producer taking over overdue halves may meet it.
CHECK_BEFORE_STARTED = (
    re.compile(r"on_recover_orphaned_transaction_command exception: unable to recover "
               r"orphaned transaction command because producer is not running$"),
)  # fmt: skip
#: Properties of the halves (and of the messages their commits publish).
TX_PROPERTIES = {"color": "red", "n": "1"}


def tx_message(
    body: str, key: str, local: str, check: str | list[str] = "unknown"
) -> dict[str, Any]:
    """A plan entry of the ``transact`` / ``checker`` scenarios."""
    return {"topic": TX_TOPIC, "body": body, "tag": "TagTx", "keys": [key, f"{key}-2"],
            "properties": TX_PROPERTIES, "local": local, "check": check}  # fmt: skip


def assert_as_sent(event: dict[str, Any], item: dict[str, Any], message_id: str) -> None:
    """A message the client received or was asked about is the plan entry as sent."""
    assert event["message_id"] == message_id, event
    assert event["topic"] == TX_TOPIC and event["body"] == item["body"], event
    assert event["tag"] == item["tag"] and event["keys"] == sorted(item["keys"]), event
    assert event["properties"] == item["properties"], event
    assert not event["corrupted"], event


def assert_checked_as_sent(
    run: DriverRun, plan: list[dict[str, Any]], ids: Mapping[str, str]
) -> None:
    """Every check-back named a planned half as it was sent (type TRANSACTION, no broker
    property among the user properties) and got the plan's answers in turn."""
    by_key = {item["keys"][0]: item for item in plan}
    for key, item in by_key.items():
        events = [e for e in run.of("checked") if e["key"] == key]
        planned = item["check"] if isinstance(item["check"], list) else [item["check"]]
        wanted = [planned[min(i, len(planned) - 1)] for i in range(len(events))]
        assert [e["answer"] for e in events] == wanted, run.report()
        for event in events:
            assert_as_sent(event, item, ids[key])
            assert event["message_type"] == 4, event  # TRANSACTION
    assert {e["key"] for e in run.of("checked")} <= set(by_key), run.report()


def transactions(broker: Running) -> TransactionStatistics:
    """The broker's transaction counters now."""
    return broker.handle.statistics().core.transactions


def stored_in(broker: Running, topic: str) -> int:
    """Messages stored in ``topic`` (all its queues)."""
    store = broker.handle.broker.store
    return sum(store.max_offset(topic, q) for q in range(8))


async def assert_consumed_once(
    py: PyGrpc, label: str, group: str, item: dict[str, Any], message_id: str
) -> None:
    """The official SimpleConsumer of a new group receives the message once, intact, and
    nothing else: a further long poll comes back empty."""
    run = await py.run(
        f"{label}-consumer", "receive", "--group", group, "--topic", TX_TOPIC, "--count", "1",
        "--within", "20",
    )  # fmt: skip
    (event,) = run.of("received")
    assert_as_sent(event, item, message_id)
    assert event["message_type"] == 1, event  # a commit publishes a NORMAL message
    assert event["delivery_attempt"] == 1, event
    after = await py.run(
        f"{label}-after", "longpoll", "--group", group, "--topic", TX_TOPIC, "--await", "3"
    )
    (event,) = after.of("received")
    assert event["messages"] == [], after.report()


async def test_transaction_commit_and_rollback(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """A committed transaction publishes its half once, intact (body, tag, keys, user
    properties, the message id), to the official consumer and over Remoting; a rolled-back
    one is never delivered. No check-back is needed."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            plan = [
                tx_message("committed ✓", "tx-commit", "commit"),
                tx_message("rolled back", "tx-rollback", "rollback"),
            ]
            run = await py.run("producer", "transact", "--plan", py.plan_file("producer", plan))
            report = run.report()
            sent = run.of("sent")
            assert [e["index"] for e in sent] == [0, 1], report
            ids = [e["message_id"] for e in sent]
            assert all(MESSAGE_ID.match(i) for i in ids) and ids[0] != ids[1], report
            tx_ids = [e["transaction_id"] for e in sent]
            assert all(tx_ids) and tx_ids[0] != tx_ids[1], report
            ended = run.of("ended")
            assert [(e["resolution"], e["code"]) for e in ended] == [
                ("commit", 20000), ("rollback", 20000)
            ], report  # fmt: skip
            assert not run.of("checked"), report
            stats = transactions(broker)
            assert (stats.prepared, stats.committed, stats.rolled_back) == (2, 1, 1), stats
            assert stats.pending == 0 and stats.checks == 0, stats

            await assert_consumed_once(py, "grpc", "tx-grpc", plan[0], ids[0])

            ((msg, _),) = await receive_remoting(broker, "tx-remoting", TX_TOPIC, 1, 20)
            record = msg.record
            assert msg.message_id == record.properties[UNIQ_KEY] == ids[0], record.properties
            assert msg.body == plan[0]["body"].encode() and msg.tag == "TagTx"
            assert sorted(msg.keys) == sorted(plan[0]["keys"])
            assert user_properties(record) == TX_PROPERTIES, record.properties
            assert record.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_COMMIT
            assert TRAN_MSG not in record.properties and REAL_TOPIC not in record.properties
            # One message in the topic: the commit's; the rolled-back half never got there.
            assert stored_in(broker, TX_TOPIC) == 1
            assert not broker.handle.broker.store.messages_by_key(TX_TOPIC, "tx-rollback")


async def test_open_transactions_are_checked_back(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """Transactions left open are checked back on the producer's Telemetry stream after
    the immunity, with the half as it was sent: the checker's COMMIT publishes the message
    (once), ROLLBACK drops it, and an unknown answer leaves the half to be asked again a
    check interval later (here: twice, then a rollback)."""
    plan = [
        tx_message("commit on check", "check-commit", "open", "commit"),
        tx_message("rollback on check", "check-rollback", "open", "rollback"),
        tx_message("unknown on check", "check-unknown", "open", ["unknown"] * 2 + ["rollback"]),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with (
            grpc_broker(tmp_path, **FAST_CHECKS) as broker,
            trio.open_nursery() as nursery,
        ):
            py = py_grpc(broker)
            live = await py.start(
                nursery, "producer", "transact", "--plan", py.plan_file("producer", plan)
            )
            await live.wait_for("waiting", lambda: bool(live.run.of("waiting")), RUN_TIMEOUT)
            sent = live.run.of("sent")
            ids = {item["keys"][0]: e["message_id"] for item, e in zip(plan, sent, strict=True)}

            def checks(key: str) -> list[dict[str, Any]]:
                return [e for e in live.run.of("checked") if e["key"] == key]

            def all_asked() -> bool:
                decided = checks("check-commit") and checks("check-rollback")
                return bool(decided) and len(checks("check-unknown")) >= 3

            def applied() -> bool:
                stats = transactions(broker)
                return stats.committed == 1 and stats.rolled_back == 2 and stats.pending == 0

            await live.wait_for("the check-backs", all_asked, 20)
            await wait_until("the checker's decisions", applied, 10)
            report = live.run.report()
            assert not live.run.of("ended"), report
            assert_checked_as_sent(live.run, plan, ids)
            # The first check comes after the immunity (1 s after the send began, loosely),
            # the third two intervals after the first (loosely: the client's clock).
            for item, event in zip(plan, sent, strict=True):
                first = checks(item["keys"][0])[0]
                assert first["at"] >= event["at"] + 0.5, report
            unknown = checks("check-unknown")
            assert unknown[2]["at"] >= unknown[0]["at"] + 1.0, report

            await assert_consumed_once(py, "grpc", "check-grpc", plan[0], ids["check-commit"])
            assert stored_in(broker, TX_TOPIC) == 1
            store = broker.handle.broker.store
            assert not store.messages_by_key(TX_TOPIC, "check-rollback")
            assert not store.messages_by_key(TX_TOPIC, "check-unknown")
            stats = transactions(broker)
            assert stats.checks == len(live.run.of("checked")) >= 5, stats
            # Nothing is undecided: no check-back can race the producer's shutdown.
            await live.stop()
            check_clean(live.run)


async def test_transaction_orphaned_by_a_crash_is_answered_by_a_new_producer(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """A producer dies between its half messages and its decisions: once it is gone, a new
    producer process of the topic (no sends of its own) is asked about the orphaned halves
    and its answers hold — COMMIT publishes one, ROLLBACK drops the other."""
    crashing = [
        tx_message("orphan to roll back", "orphan-rollback", "open"),
        tx_message("orphan to commit", "orphan-commit", "crash"),
    ]  # the crashing producer's checker would answer "unknown" (it should not be asked)
    answers = [
        {**crashing[0], "check": "rollback"},
        {**crashing[1], "check": "commit"},
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with (
            grpc_broker(tmp_path, **FAST_CHECKS) as broker,
            trio.open_nursery() as nursery,
        ):
            py = py_grpc(broker)
            path = py.plan_file("crashing", crashing)
            crashed = await py.run("crashing", "transact", "--plan", path, clean=False)
            report = crashed.report()
            assert crashed.returncode == 0, report
            assert [e["index"] for e in crashed.of("crashing")] == [1], report
            assert not crashed.of("done") and not crashed.of("ended"), report
            sent = zip(crashing, crashed.of("sent"), strict=True)
            ids = {item["keys"][0]: e["message_id"] for item, e in sent}
            clients = broker.handle.broker.clients
            await wait_until(
                "the crashed producer is gone", lambda: not clients.producer_ids(TX_TOPIC), 10
            )
            assert transactions(broker).pending == 2, transactions(broker)

            live = await py.start(
                nursery, "checker", "checker", "--plan", py.plan_file("checker", answers)
            )

            def asked() -> set[str]:
                return {e["key"] for e in live.run.of("checked")}

            await live.wait_for("both check-backs", lambda: len(asked()) == 2, 20)
            await wait_until(
                "the new producer's decisions", lambda: transactions(broker).pending == 0, 10
            )
            stats = transactions(broker)
            assert (stats.committed, stats.rolled_back) == (1, 1), stats
            assert_checked_as_sent(live.run, answers, ids)

            await assert_consumed_once(py, "grpc", "orphan-grpc", answers[1], ids["orphan-commit"])
            assert stored_in(broker, TX_TOPIC) == 1
            assert not broker.handle.broker.store.messages_by_key(TX_TOPIC, "orphan-rollback")
            await live.stop()
            check_clean(live.run, CHECK_BEFORE_STARTED)
            assert not live.run.of("sent"), live.run.report()


# ------------------------------------------------------------------ 8. SQL92 filters
SQL_TOPIC = "GrpcSql92"
SQL_EXPRESSION = "region = 'eu' AND price > 10"
#: (key, tag, user properties, whether SQL_EXPRESSION matches) of the messages sent.
SQL_MESSAGES: list[tuple[str, str | None, dict[str, str], bool]] = [
    ("eu-20", "TagA", {"region": "eu", "price": "20"}, True),
    ("eu-5", "TagA", {"region": "eu", "price": "5"}, False),
    ("us-50", "TagA", {"region": "us", "price": "50"}, False),
    ("eu-10", "TagB", {"region": "eu", "price": "10"}, False),  # not above 10
    ("eu-11", "TagB", {"region": "eu", "price": "11", "note": "x y ✓"}, True),
    ("bare", "TagA", {}, False),  # both properties absent: NULL, filtered out
    ("eu-no-price", None, {"region": "eu"}, False),
    # A string meeting an int is parsed as one (Integer.valueOf): "10.5" fails, no match.
    ("eu-10.5", "TagB", {"region": "eu", "price": "10.5"}, False),
    ("EU-30", "TagA", {"region": "EU", "price": "30"}, False),  # strings are case-sensitive
    ("eu-1000", None, {"region": "eu", "price": "1000"}, True),
]  # fmt: skip
SQL_MATCHING = {key for key, _, _, matches in SQL_MESSAGES if matches}
#: Malformed expressions: incomplete, and a string literal where ``>`` needs a number.
BAD_SQL = ("region = 'eu' AND", "price > 'ten'")


def sql_plan() -> list[dict[str, Any]]:
    """SQL_MESSAGES as a ``produce`` plan (the key is the body too)."""
    return [
        {"topic": SQL_TOPIC, "body": key, "keys": [key], "properties": properties,
         **({"tag": tag} if tag else {})}
        for key, tag, properties, _ in SQL_MESSAGES
    ]  # fmt: skip


def assert_matching_as_sent(
    events: list[dict[str, Any]], plan: list[dict[str, Any]], ids: Mapping[str, str]
) -> None:
    """``events`` are the matching messages, each once, as sent (tag, keys, properties)."""
    keys = [e["keys"][0] if e["keys"] else "" for e in events]
    assert sorted(keys) == sorted(SQL_MATCHING), events
    by_key = {item["keys"][0]: item for item in plan}
    for key, event in zip(keys, events, strict=True):
        item = by_key[key]
        assert event["message_id"] == ids[key], event
        assert event["topic"] == SQL_TOPIC and event["body"] == key, event
        assert event["tag"] == item.get("tag") and event["keys"] == [key], event
        assert event["properties"] == item["properties"], event
        assert event["delivery_attempt"] == 1 and not event["corrupted"], event


async def assert_cursor_past_all(broker: Running, group: str, topic: str) -> None:
    """The group's pop cursor reached the end of every queue of ``topic``: the messages the
    filter rejected were read past, never to be delivered to the group."""
    store = broker.handle.broker.store

    def past_all() -> bool:
        return all(
            store.offsets.query(group, topic, q) == store.max_offset(topic, q)
            for q in range(4)
            if store.max_offset(topic, q) > 0
        )

    await wait_until(f"{group}'s cursor at the end of {topic}", past_all, 10)


async def assert_all_stored(broker: Running, ids: Mapping[str, str]) -> None:
    """A ``*`` consumer of another group (over Remoting) gets every message sent: those the
    SQL92 consumers never saw were there to be delivered."""
    got = await receive_remoting(broker, "sql-everything", SQL_TOPIC, len(ids), 20)
    assert {msg.message_id for msg, _ in got} == set(ids.values())


async def test_sql92_simple_consumer(py_grpc: Callable[[Running], PyGrpc], tmp_path: Path) -> None:
    """A SimpleConsumer subscribed with an SQL92 expression receives exactly the matching
    messages, each once with its tag and properties; a further long poll comes back empty,
    and the group's cursor is past the rejected ones."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            plan = sql_plan()
            sent = await py.produce("producer", plan)
            ids = {item["keys"][0]: e["message_id"] for item, e in zip(plan, sent, strict=True)}
            group = "sql-simple"
            run = await py.run(
                "consumer", "receive", "--group", group, "--topic", SQL_TOPIC,
                "--filter-type", "SQL92", "--expression", SQL_EXPRESSION,
                "--count", str(len(SQL_MATCHING)), "--within", "20", "--drain",
            )  # fmt: skip
            report = run.report()
            assert_matching_as_sent(run.of("received"), plan, ids)
            assert len(run.of("acked")) == len(SQL_MATCHING), report
            (drained,) = run.of("drained")
            assert drained["messages"] == [], report
            await assert_cursor_past_all(broker, group, SQL_TOPIC)
            assert broker.in_flight() == 0
            await assert_all_stored(broker, ids)


async def test_sql92_push_consumer(py_grpc: Callable[[Running], PyGrpc], tmp_path: Path) -> None:
    """A PushConsumer subscribed with an SQL92 expression consumes exactly the matching
    messages, once each; once its cursor is past the rejected ones and its receives park
    again, nothing more comes."""
    group = "sql-push"
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker, trio.open_nursery() as nursery:
            py = py_grpc(broker)
            await create_topic(broker.handle, SQL_TOPIC)
            live = await py.start(
                nursery, "consumer", "push", "--group", group, "--topic", SQL_TOPIC,
                "--filter-type", "SQL92", "--expression", SQL_EXPRESSION,
            )  # fmt: skip
            await live.wait_for("started", lambda: bool(live.run.of("started")), RUN_TIMEOUT)
            plan = sql_plan()
            sent = await py.produce("producer", plan)
            ids = {item["keys"][0]: e["message_id"] for item, e in zip(plan, sent, strict=True)}

            def consumed() -> list[dict[str, Any]]:
                return live.run.of("consumed")

            await live.wait_for(
                "the matching messages", lambda: len(consumed()) >= len(SQL_MATCHING), 20
            )
            await assert_cursor_past_all(broker, group, SQL_TOPIC)
            await wait_until("every lease acked", lambda: broker.in_flight() == 0, 10)
            # A receive issued after all that finds nothing and parks.
            await wait_until("a parked receive", lambda: broker.parked(group) > 0, 25)
            # Each matching arrival woke at most one parked receive; the others woke none.
            hub = broker.handle.statistics().core.pop.hub
            assert hub.groups[group].wakeups <= len(SQL_MATCHING), hub
            await live.stop()
            check_clean(live.run)
            events = consumed()
            assert_matching_as_sent(events, plan, ids)
            assert not any(e["failed"] for e in events), live.run.report()
            await assert_all_stored(broker, ids)


async def test_sql92_malformed_expression_is_refused(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """A receive with an SQL92 expression that does not parse is refused with
    ILLEGAL_FILTER_EXPRESSION (the client's BadRequestException, whose text says what is
    wrong and where), promptly (no long poll), without an error or a traceback in the
    client's log or an error in the broker's."""
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker:
            py = py_grpc(broker)
            await create_topic(broker.handle, SQL_TOPIC)
            async with Producer(broker.remoting) as producer:
                await producer.send(
                    Message(SQL_TOPIC, b"eu", properties={"region": "eu", "price": "20"})
                )
            runs: dict[str, DriverRun] = {}

            async def refused(index: int, expression: str) -> None:
                runs[expression] = await py.run(
                    f"bad-{index}", "refused", "--group", f"sql-bad-{index}",
                    "--topic", SQL_TOPIC, "--filter-type", "SQL92", "--expression", expression,
                    "--await", "10",
                )  # fmt: skip

            async with trio.open_nursery() as nursery:
                for index, expression in enumerate(BAD_SQL):
                    nursery.start_soon(refused, index, expression)
            for run in runs.values():
                report = run.report()
                assert not run.of("received"), report
                (event,) = run.of("refused")
                assert event["type"] == "BadRequestException", report
                assert event["code"] == 40010 and event["name"] == "ILLEGAL_FILTER_EXPRESSION"
                assert "SQL92" in event["text"], report
                assert event["seconds"] < 5, report  # refused, not parked for 10 s
            # Nothing was handed out to anyone.
            assert broker.in_flight() == 0


async def test_sql92_parked_receive_woken_by_a_matching_remoting_message(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path
) -> None:
    """A SimpleConsumer's receive parked with an SQL92 expression (properties and ``TAGS``)
    is not woken by messages trimq's Remoting producer sends that the expression rejects;
    the matching one wakes it at once and arrives with its tag and properties intact."""
    group = "sql-parked"
    expression = f"{SQL_EXPRESSION} AND TAGS = 'Hot'"
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path) as broker, trio.open_nursery() as nursery:
            py = py_grpc(broker)
            await create_topic(broker.handle, SQL_TOPIC)
            live = await py.start(
                nursery, "consumer", "longpoll", "--group", group, "--topic", SQL_TOPIC,
                "--filter-type", "SQL92", "--expression", expression, "--await", str(AWAIT_S),
            )  # fmt: skip
            await live.wait_for("polling", lambda: bool(live.run.of("polling")), RUN_TIMEOUT)
            await wait_until("the receive parked", lambda: broker.parked(group) > 0, 10)

            def wakeups() -> int:
                return broker.handle.statistics().core.pop.hub.groups[group].wakeups

            rejected = [
                Message(SQL_TOPIC, b"us", tag="Hot", keys=["r-us"],
                        properties={"region": "us", "price": "50"}),
                Message(SQL_TOPIC, b"cold", tag="Cold", keys=["r-cold"],
                        properties={"region": "eu", "price": "50"}),
            ]  # fmt: skip
            matching = Message(
                SQL_TOPIC, "hot ✓".encode(), tag="Hot", keys=["r-hot", "r-2"],
                properties={"region": "eu", "price": "42", "lang": "py"},
            )  # fmt: skip
            async with Producer(broker.remoting) as producer:
                for message in rejected:
                    await producer.send(message)
                await trio.sleep(1)  # time to wake the receive, were it to be woken
                assert broker.parked(group) > 0 and wakeups() == 0, broker.handle.statistics()
                assert not live.run.of("received"), live.run.report()
                receipt = await producer.send(matching)
            sent_at = trio.current_time()
            await live.wait_for("received", lambda: bool(live.run.of("received")), AWAIT_S + 5)
            answered_in = trio.current_time() - sent_at
            (event,) = live.run.of("received")
            (got,) = event["messages"]
            assert got["message_id"] == receipt.message_id, event
            assert got["body"] == "hot ✓" and got["tag"] == "Hot", got
            assert got["keys"] == ["r-2", "r-hot"], got
            assert got["properties"] == dict(matching.properties), got
            assert answered_in < 5, f"answered {answered_in:.1f} s after the send"
            assert event["seconds"] < AWAIT_S - 2, live.run.report()
            assert wakeups() == 1, broker.handle.statistics()
            await live.stop()
            check_clean(live.run)


# ------------------------------------------------------------------ 9. ACL
ACL_TOPIC = "GrpcAcl"
#: A topic the producer account may only subscribe to: its route query passes, a send not.
ACL_SUB_ONLY_TOPIC = "GrpcAclSubOnly"
#: A topic the producer account has no right on at all.
ACL_OTHER_TOPIC = "GrpcAclOther"
ACL_GROUP = "acl-grpc"
PRODUCER_AK, PRODUCER_SK = "grpcprod", "grpc-producer-secret"
CONSUMER_AK, CONSUMER_SK = "grpccons", "grpc-consumer-secret"
GRPC_ACL = f"""\
globalWhiteRemoteAddresses: []
accounts:
  - accessKey: {PRODUCER_AK}
    secretKey: {PRODUCER_SK}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [{ACL_TOPIC}=PUB, {ACL_SUB_ONLY_TOPIC}=SUB]
  - accessKey: {CONSUMER_AK}
    secretKey: {CONSUMER_SK}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms: [{ACL_TOPIC}=SUB]
    groupPerms: [{ACL_GROUP}=SUB]
"""
UNAUTHORIZED, FORBIDDEN = 40100, 40300
#: The ``authorization`` metadata the 5.x clients send (the Python client's ``Signature`` in
#: lower-case hex, the Node client's in upper case).
AUTHORIZATION = re.compile(
    r"^MQv2-HMAC-SHA1 Credential=(?P<ak>[^,]*), SignedHeaders=x-mq-date-time, "
    r"Signature=(?P<signature>[0-9a-fA-F]{40})$"
)
#: ``x-mq-date-time`` (the Python client's local time labelled UTC; the Node client's UTC).
DATE_TIME = re.compile(r"^\d{8}T\d{6}Z$")


@dataclass(frozen=True)
class AclDecision:
    """One call the broker's ACL check decided: the RPC, the credential metadata the client
    sent, and the status code it was refused with (None: allowed)."""

    method: str
    authorization: str
    date_time: str
    code: int | None

    @property
    def access_key(self) -> str:
        found = AUTHORIZATION.match(self.authorization)
        return found["ak"] if found else ""


@pytest.fixture
def acl_decisions(monkeypatch: pytest.MonkeyPatch) -> list[AclDecision]:
    return watch_acl(monkeypatch)


def watch_acl(monkeypatch: pytest.MonkeyPatch) -> list[AclDecision]:
    """Every decision of the gRPC front end's ACL check from now on (for the test),
    recorded; the broker's own check runs unchanged: this only watches it."""
    decisions: list[AclDecision] = []
    check = MessagingService.denied

    def watched(self: MessagingService, call: Any, method: str, req: Any) -> Any:
        refused = check(self, call, method, req)
        metadata = call.metadata
        decisions.append(AclDecision(
            method, metadata.get("authorization", ""), metadata.get("x-mq-date-time", ""),
            None if refused is None else refused.code,
        ))  # fmt: skip
        return refused

    monkeypatch.setattr(MessagingService, "denied", watched)
    return decisions


def assert_signed(
    decisions: list[AclDecision], secrets: Mapping[str, str], upper: bool = False
) -> None:
    """Every call carried the client's credential metadata, signed as RocketMQ's proxy
    checks it: HMAC-SHA1 of ``x-mq-date-time`` under the account's secret (``secrets``: the
    secret each AccessKey's client signed with), in hex of the case the client writes."""
    assert decisions
    for decision in decisions:
        found = AUTHORIZATION.match(decision.authorization)
        assert found is not None, decision
        assert DATE_TIME.match(decision.date_time), decision
        secret = secrets[found["ak"]].encode()
        want = hmac.new(secret, decision.date_time.encode(), hashlib.sha1).hexdigest()
        assert found["signature"] == (want.upper() if upper else want), decision


def acl_args(access_key: str, secret_key: str) -> tuple[str, ...]:
    return ("--access-key", access_key, "--secret-key", secret_key)


def acl_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain_acl.yml"
    path.write_text(GRPC_ACL)
    return path


async def acl_produce(
    py: PyGrpc, label: str, plan: list[dict[str, Any]], args: tuple[str, ...]
) -> DriverRun:
    """The ``produce`` scenario with more ``args`` (credentials); its run, for the caller to
    check how it ended."""
    path = py.plan_file(label, plan)
    return await py.run(label, "produce", "--plan", path, *args, clean=False)


async def test_acl_producer_and_simple_consumer_with_their_accounts(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path, acl_decisions: list[AclDecision]
) -> None:
    """On a broker with ACL, the official producer signed as an account with PUB on the topic
    sends every message, and the official SimpleConsumer signed as an account with SUB on the
    topic and the group receives each once, intact (a further long poll finds nothing); every
    call both clients made (routes, settings, heartbeats, sends, receives, acks, termination)
    was signed and allowed; neither client logged an error."""
    plan = [
        {"topic": ACL_TOPIC, "body": f"acl ✓ {i}", "tag": "TagAcl", "keys": [f"acl-{i}"],
         "properties": {"n": str(i)}}
        for i in range(4)
    ]  # fmt: skip
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path, acl_file=acl_file(tmp_path)) as broker:
            py = py_grpc(broker)
            run = await acl_produce(py, "producer", plan, acl_args(PRODUCER_AK, PRODUCER_SK))
            check_clean(run)
            sent = run.of("sent")
            assert [e["index"] for e in sent] == list(range(len(plan))), run.report()
            ids = [e["message_id"] for e in sent]
            consumer = await py.run(
                "consumer", "receive", "--group", ACL_GROUP, "--topic", ACL_TOPIC,
                "--count", str(len(plan)), "--within", "20", "--drain", "--await", "3",
                *acl_args(CONSUMER_AK, CONSUMER_SK),
            )  # fmt: skip
            report = consumer.report()
            received = consumer.of("received")
            assert sorted(e["message_id"] for e in received) == sorted(ids), report
            by_id = {e["message_id"]: e for e in received}
            for item, receipt in zip(plan, sent, strict=True):
                event = by_id[receipt["message_id"]]
                assert event["topic"] == ACL_TOPIC and event["body"] == item["body"], event
                assert event["tag"] == item["tag"] and event["keys"] == item["keys"], event
                assert event["properties"] == item["properties"], event
                assert event["delivery_attempt"] == 1 and not event["corrupted"], event
            assert len(consumer.of("acked")) == len(plan), report
            (drained,) = consumer.of("drained")
            assert drained["messages"] == [], report
            assert stored_in(broker, ACL_TOPIC) == len(plan)
            await wait_until("every lease acked", lambda: broker.in_flight() == 0, 10)

            assert [d for d in acl_decisions if d.code is not None] == []
            assert_signed(acl_decisions, {PRODUCER_AK: PRODUCER_SK, CONSUMER_AK: CONSUMER_SK})
            methods = {(d.access_key, d.method) for d in acl_decisions}
            for method in ("QueryRoute", "Telemetry", "SendMessage"):
                assert (PRODUCER_AK, method) in methods, methods
            for method in ("QueryRoute", "Telemetry", "Heartbeat", "ReceiveMessage", "AckMessage"):
                assert (CONSUMER_AK, method) in methods, methods


def route_refused(topic: str, code: int, reason: str) -> tuple[re.Pattern[str], ...]:
    """What the producer logs as ERROR when its route query for ``topic`` is refused, at its
    startup (a topic it was created with) and at the send that needs the route: the v2 code
    and the broker's text, then the route lookup's own failure."""
    topic = re.escape(topic)
    return (
        re.compile(rf"query topic raise exception, {code}, {re.escape(reason)}$"),
        re.compile(rf"update topic: {topic} route raise exception when client startup$"),
        re.compile(rf"producer select topic:{topic} queue raise exception, "
                   rf"failed to fetch topic:{topic} route\.$"),
    )  # fmt: skip


def assert_logged(run: DriverRun, expected: tuple[re.Pattern[str], ...]) -> None:
    """The client's ERROR lines are exactly ``expected`` (each pattern at least once, no
    other line but the client's known ones) and its log has no traceback; the driver ended
    cleanly otherwise."""
    check_clean(run, expected)
    (log,) = run.of("client_log")
    for pattern in expected:
        assert any(pattern.search(line) for line in log["errors"]), (pattern, run.report())


async def test_acl_wrong_secret_is_unauthorized(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path, acl_decisions: list[AclDecision]
) -> None:
    """A producer signing with a wrong secret (and one with the driver's default, empty
    credentials) is refused UNAUTHORIZED from its first call: its route query. The client
    logs the code and the broker's reason but its ``send`` raises a plain ``Exception``
    ("failed to fetch topic:... route.", no code: the route lookup swallows the
    UnauthorizedException); it never gets as far as a SendMessage, and nothing is stored.
    Its log has the refusal's ERROR lines and no traceback."""
    plan = [{"topic": ACL_TOPIC, "body": "refused", "refused": True}]
    cases = {
        "wrong-secret": (acl_args(PRODUCER_AK, "not-the-secret"),
                         f"signature check failed for AccessKey '{PRODUCER_AK}'"),
        "no-credential": ((), "no MQv2-HMAC-SHA1 credential: the call needs one (ACL is on)"),
    }  # fmt: skip
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path, acl_file=acl_file(tmp_path)) as broker:
            py = py_grpc(broker)
            for label, (credentials, reason) in cases.items():
                before = len(acl_decisions)
                run = await acl_produce(py, label, plan, credentials)
                assert_logged(run, route_refused(ACL_TOPIC, UNAUTHORIZED, reason))
                (refused,) = run.of("refused")
                assert refused["type"] == "Exception" and refused["code"] is None, refused
                assert refused["text"] == f"failed to fetch topic:{ACL_TOPIC} route.", refused
                assert not run.of("sent"), run.report()
                # Two route queries (startup, send), each refused; nothing else was asked.
                decisions = acl_decisions[before:]
                assert [(d.method, d.code) for d in decisions] == [
                    ("QueryRoute", UNAUTHORIZED)
                ] * 2, decisions  # fmt: skip
                ak = "" if label == "no-credential" else PRODUCER_AK
                assert {d.access_key for d in decisions} == {ak}, decisions
            assert_signed(acl_decisions, {PRODUCER_AK: "not-the-secret", "": ""})
            assert stored_in(broker, ACL_TOPIC) == 0
            assert broker.handle.broker.topics.get(ACL_TOPIC) is None


async def test_acl_producer_without_pub_is_forbidden(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path, acl_decisions: list[AclDecision]
) -> None:
    """A producer account with PUB on its own topic only (the one it is created with):
    sends there go through, before and after refusals; a send to a topic it has no right on
    at all fails at the route query (FORBIDDEN in the client's log; ``send`` raises the
    plain "failed to fetch topic route" ``Exception``); a send to a topic it may only
    subscribe to gets its route, then every SendMessage attempt (the client's 3) is refused
    FORBIDDEN and ``send`` raises ForbiddenException (40300, the broker's reason). Nothing
    reaches the refused topics; the client logs the refusals' ERROR lines, no traceback."""
    plan: list[dict[str, Any]] = [
        {"topic": ACL_TOPIC, "body": "allowed before"},
        {"topic": ACL_OTHER_TOPIC, "body": "no right", "refused": True},
        {"topic": ACL_SUB_ONLY_TOPIC, "body": "sub only", "refused": True},
        {"topic": ACL_TOPIC, "body": "allowed after"},
    ]
    no_right = f"AccessKey '{PRODUCER_AK}' has no any permission on topic '{ACL_OTHER_TOPIC}'"
    no_pub = f"AccessKey '{PRODUCER_AK}' has no PUB permission on topic '{ACL_SUB_ONLY_TOPIC}'"
    logged = (
        *route_refused(ACL_OTHER_TOPIC, FORBIDDEN, no_right)[::2],  # not created with it
        *SEND_REFUSED,
    )
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path, acl_file=acl_file(tmp_path)) as broker:
            py = py_grpc(broker)
            args = ("--topics", ACL_TOPIC, *acl_args(PRODUCER_AK, PRODUCER_SK))
            run = await acl_produce(py, "producer", plan, args)
            assert_logged(run, logged)
            report = run.report()
            assert [e["index"] for e in run.of("sent")] == [0, 3], report
            other, sub_only = run.of("refused")
            assert other["index"] == 1 and other["type"] == "Exception", report
            assert other["text"] == f"failed to fetch topic:{ACL_OTHER_TOPIC} route.", report
            assert sub_only["index"] == 2 and sub_only["type"] == "ForbiddenException", report
            assert (sub_only["code"], sub_only["name"]) == (FORBIDDEN, "FORBIDDEN"), report
            assert sub_only["text"] == f"{FORBIDDEN}, {no_pub}", report

            assert stored_in(broker, ACL_TOPIC) == 2
            assert stored_in(broker, ACL_SUB_ONLY_TOPIC) == stored_in(broker, ACL_OTHER_TOPIC) == 0
            for topic in (ACL_OTHER_TOPIC, ACL_SUB_ONLY_TOPIC):
                assert broker.handle.broker.topics.get(topic) is None, topic

            assert_signed(acl_decisions, {PRODUCER_AK: PRODUCER_SK})
            refused = [(d.method, d.code) for d in acl_decisions if d.code is not None]
            # The client's periodic settings sync (1 s after startup) names every topic it has
            # a route for, the SUB-only one too: on a slow run that one is refused FORBIDDEN
            # (the client ignores a settings answer that is not OK, silently).
            telemetry = [d.code for d in acl_decisions if d.method == "Telemetry"]
            assert telemetry[0] is None and set(telemetry[1:]) <= {None, FORBIDDEN}, telemetry
            # One route query (the topic without rights), three send attempts (SUB-only).
            refused = [r for r in refused if r[0] != "Telemetry"]
            expected = [("QueryRoute", FORBIDDEN)] + [("SendMessage", FORBIDDEN)] * 3
            assert sorted(refused) == expected, acl_decisions
