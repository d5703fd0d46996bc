"""Interop driver for the official RocketMQ 5 Python client (``rocketmq-python-client``
5.1.2, gRPC): ``python -I grpc_py_driver.py SCENARIO --endpoint HOST:PORT [options]``.

It runs inside the client's throwaway environment (never the project's venv), with ``HOME``
set to a scratch directory (the client logs to ``~/logs/rocketmq_python``), and prints one
JSON object per line on stdout (``{"event": ..., ...}``). Every wait is bounded; a scenario
that meets something unexpected prints ``{"event": "error", ...}`` and exits 1.

Scenarios:

``produce --plan FILE``
    sends each message of the plan (a JSON list of ``{"topic", "body", "tag"?, "keys"?,
    "properties"?, "deliver_at_s"?, "group"?, "refused"?}``) with one Producer (created with
    the plan's topics, or ``--topics``); ``sent`` per message (``message_id``, ``offset``,
    the queue the client picked), or ``refused`` (the error) for those the plan expects to be
    refused.
``receive --group G --topic T --count N [--drain]``
    one SimpleConsumer: ``receive(32, --invisible)`` until N messages came (or ``--within``
    seconds passed), acking each; ``received`` per message (every field the client exposes).
    Prints ``polling`` before each receive call. With ``--drain``, one more receive (a long
    poll of ``--await`` seconds) afterwards: ``drained`` with what it got (acked too).
``refused --group G --topic T``
    one SimpleConsumer, one ``receive`` that should be refused (a malformed filter
    expression, say): ``refused`` with the error the client raised, or ``received`` with the
    messages if it was not.
``invisible --group G --topic T --count N``
    receive N, ack half; change the other half's invisible time to 1 s, try the stale
    (pre-change) handle, wait for the redelivery, ack it with its new handle, then try the
    old handles again; finally ``receive`` with an invisible time of 5 s (under the minimum).
``longpoll --group G --topic T --await S``
    one ``receive`` (long poll of S seconds) after ``polling``; ``received`` with how long it
    took.
``push --group G --topic T``
    a PushConsumer whose listener fails messages by key: ``fail-once-*`` on its first call
    for the message, ``fail-always-*`` every time, the others never; ``consumed`` per call.
    Runs until its standard input reaches end of file, then shuts down (``stopped``). Whether
    it consumes in order (FIFO) is the broker's answer to its settings: the scenario is the
    same for a FIFO group (whose consumer retries a failed message locally, then forwards it
    to the DLQ) and for a concurrent one (whose failed message is redelivered).
``cycles --kind producer|simple|push --count N``
    N start/shutdown cycles of one client kind (a producer sends one message per cycle).
``transact --plan FILE``
    one Producer with a TransactionChecker sends each message of the plan (``produce``'s
    fields, plus ``"local"``: ``commit`` (the default), ``rollback``, ``open`` or ``crash``,
    and ``"check"``: the checker's answer for the message's keys, ``commit``, ``rollback``
    or ``unknown`` (the default), or a list of answers to its successive checks, the last
    repeated) in a transaction of its own: ``sent`` (``message_id``, ``transaction_id``,
    ``offset``, ``at``: the wall clock when the send began), then ``ended`` (the
    EndTransaction status) for ``commit``/``rollback``; ``open`` leaves the transaction to
    the broker's check-back; ``crash`` prints ``crashing`` and exits at once
    (``os._exit(0)``: no shutdown, no ``client_log``, no ``done``), as a producer dying
    between its half message and its decision. The checker answers every check-back the
    broker sends: ``checked`` (``key``, ``answer``, ``at`` and every field of the message
    it was asked about). Runs until its standard input reaches end of file (checks may
    arrive meanwhile), then shuts down.
``checker --plan FILE``
    a Producer of the plan's topics that sends nothing: only its checker answers (as in
    ``transact``) until standard input reaches end of file; the producer that takes over
    from one that crashed.

The consumers subscribe to ``--topic`` with ``--expression`` (``*`` by default) of
``--filter-type`` ``TAG`` (the default) or ``SQL92`` (the client's ``FilterType.SQL``: an
SQL92 selector over the message's properties, ``TAGS`` standing for its tag).

Every client signs its calls with ``--access-key`` and ``--secret-key`` (an ACL account's;
``Credentials`` of empty strings by default, as for a broker without ACL).

Every scenario ends with ``client_log`` (the ERROR lines of the client's own log file, and
whether it has any traceback) and ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)
from rocketmq.grpc_protocol import Code, FilterType

_print_lock = threading.Lock()
#: Seconds the client gives each unary RPC.
REQUEST_TIMEOUT = 3


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed at once (listeners run on the client's threads)."""
    line = json.dumps({"event": event, **fields}, sort_keys=True)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class ScenarioError(Exception):
    """Something the scenario did not expect (reported as an ``error`` event)."""


#: TLS to the broker (``TRIMQ_DRIVER_TLS=1``; the CA comes from
#: ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``, as the client verifies against system roots).
TLS = os.environ.get("TRIMQ_DRIVER_TLS") == "1"


#: ``--filter-type`` names: RocketMQ's expression types, the protocol's ``FilterType``.
FILTER_TYPES: dict[str, Any] = {"TAG": FilterType.TAG, "SQL92": FilterType.SQL}


def config(args: argparse.Namespace) -> ClientConfiguration:
    """The client's configuration: ``--endpoint`` and the credentials (``--access-key`` and
    ``--secret-key``; empty by default: the client still sends its ``authorization`` metadata,
    with an empty ``Credential``)."""
    credentials = Credentials(args.access_key, args.secret_key)
    return ClientConfiguration(args.endpoint, credentials, request_timeout=REQUEST_TIMEOUT)


def describe(msg: Any) -> dict[str, Any]:
    """Everything the client exposes of a received message."""
    body: bytes = msg.body or b""
    return {
        "message_id": msg.message_id,
        "topic": msg.topic,
        "tag": msg.tag,
        "keys": sorted(msg.keys),
        "properties": dict(msg.properties),
        "body": body.decode("utf-8", "replace"),
        "delivery_attempt": msg.delivery_attempt,
        "message_group": msg.message_group,
        "delivery_timestamp": msg.delivery_timestamp,
        "born_timestamp": msg.born_timestamp,
        "message_type": msg.message_type,
        "receipt_handle": msg.receipt_handle,
        "corrupted": msg.corrupted,
    }


def error_of(exc: BaseException) -> dict[str, Any]:
    """An exception as the test checks it: its class, v2 code and the code's name (if it
    has one) and text."""
    code = getattr(exc, "code", None)
    if not isinstance(code, int):
        return {"type": type(exc).__name__, "code": None, "name": None, "text": str(exc)}
    try:
        name = Code.Name(code)
    except ValueError:
        name = None
    return {"type": type(exc).__name__, "code": code, "name": name, "text": str(exc)}


def bounded(within: float) -> Callable[[], bool]:
    """A predicate: whether ``within`` seconds are left of a deadline that starts now."""
    deadline = time.monotonic() + within
    return lambda: time.monotonic() < deadline


# ------------------------------------------------------------------ scenarios
def produce(args: argparse.Namespace) -> None:
    plan = json.loads(Path(args.plan).read_text(encoding="utf-8"))
    topics = args.topics.split(",") if args.topics else sorted({item["topic"] for item in plan})
    producer = Producer(config(args), tuple(topics), tls_enable=TLS)
    started = time.monotonic()
    producer.startup()
    emit("started", seconds=time.monotonic() - started)
    try:
        for index, item in enumerate(plan):
            msg = message_of(item)
            if item.get("refused"):
                try:
                    producer.send(msg)
                except Exception as exc:
                    emit("refused", index=index, **error_of(exc))
                    continue
                raise ScenarioError(f"message {index} was sent; it should have been refused")
            receipt = producer.send(msg)
            emit("sent", index=index, message_id=receipt.message_id, offset=receipt.offset,
                 queue=receipt.message_queue.message_queue0().id)  # fmt: skip
    finally:
        producer.shutdown()


def message_of(item: dict[str, Any]) -> Message:
    """The message a plan entry describes."""
    msg = Message()
    msg.topic = item["topic"]
    msg.body = item["body"].encode()
    if item.get("tag"):
        msg.tag = item["tag"]
    if item.get("keys"):
        add_keys(msg, item["keys"])
    for name, value in item.get("properties", {}).items():
        msg.add_property(name, value)
    if item.get("deliver_at_s"):
        # 5.1.2 puts this value into Timestamp.seconds as it is (its docstring says
        # milliseconds): give it seconds.
        msg.delivery_timestamp = int(item["deliver_at_s"])
    if item.get("group"):
        msg.message_group = item["group"]
    return msg


def add_keys(msg: Any, keys: list[str]) -> None:
    """``Message.keys`` is a property whose setter is declared ``keys(self, *keys)``, but an
    assignment passes the one value assigned (a list fails its ``strip()`` check); each
    assignment of one key adds it to the set."""
    for key in keys:
        msg.keys = key


def subscription(args: argparse.Namespace) -> dict[str, FilterExpression]:
    """The consumers' subscription: ``--topic`` with ``--expression`` of ``--filter-type``."""
    return {args.topic: FilterExpression(args.expression, FILTER_TYPES[args.filter_type])}


def simple_consumer(args: argparse.Namespace, await_s: int) -> SimpleConsumer:
    sub = subscription(args)
    consumer = SimpleConsumer(config(args), args.group, sub, await_duration=await_s, tls_enable=TLS)
    started = time.monotonic()
    consumer.startup()
    emit("started", seconds=time.monotonic() - started)
    return consumer


def receive_until(
    consumer: SimpleConsumer, wanted: Callable[[list[Any]], bool], invisible: int, within: float
) -> list[Any]:
    """Receive (one call at a time) until ``wanted(all received)`` or ``within`` seconds."""
    got: list[Any] = []
    left = bounded(within)
    while not wanted(got) and left():
        emit("polling")
        got += consumer.receive(32, invisible)
    return got


def receive(args: argparse.Namespace) -> None:
    consumer = simple_consumer(args, args.await_s)
    try:
        seen: set[str] = set()
        left = bounded(args.within)
        while len(seen) < args.count and left():
            emit("polling")
            for msg in consumer.receive(32, args.invisible):
                seen.add(msg.message_id)
                emit("received", **describe(msg))
                consumer.ack(msg)
                emit("acked", message_id=msg.message_id)
        if args.drain:
            emit("polling")
            started = time.monotonic()
            got = consumer.receive(32, args.invisible)
            emit("drained", seconds=time.monotonic() - started,
                 messages=[describe(m) for m in got])  # fmt: skip
            for msg in got:
                consumer.ack(msg)
    finally:
        consumer.shutdown()


def refused(args: argparse.Namespace) -> None:
    consumer = simple_consumer(args, args.await_s)
    try:
        emit("polling")
        started = time.monotonic()
        try:
            got = consumer.receive(32, args.invisible)
        except Exception as exc:
            emit("refused", seconds=time.monotonic() - started, **error_of(exc))
            return
        emit("received", messages=[describe(m) for m in got])
        for msg in got:
            consumer.ack(msg)
    finally:
        consumer.shutdown()


def invisible(args: argparse.Namespace) -> None:
    consumer = simple_consumer(args, args.await_s)
    try:
        first = receive_until(consumer, lambda got: len(got) >= args.count, 15, args.within)
        for msg in first:
            emit("received", **describe(msg))
        if len(first) != args.count:
            raise ScenarioError(f"received {len(first)} messages, expected {args.count}")
        first.sort(key=lambda m: m.message_id)
        acked, changed = first[: args.count // 2], first[args.count // 2 :]
        for msg in acked:
            consumer.ack(msg)
            emit("acked", message_id=msg.message_id)
        originals: dict[str, str] = {}
        renewed: dict[str, str] = {}
        for msg in changed:
            originals[msg.message_id] = msg.receipt_handle
            consumer.change_invisible_duration(msg, 1)
            renewed[msg.message_id] = msg.receipt_handle
            emit("changed", message_id=msg.message_id, old_handle=originals[msg.message_id],
                 new_handle=msg.receipt_handle)  # fmt: skip
            emit("stale_ack", message_id=msg.message_id, stage="after change",
                 **try_ack(consumer, msg, originals[msg.message_id]))  # fmt: skip
        ids = set(originals)

        def all_back(got: list[Any]) -> bool:
            return ids <= {m.message_id for m in got}

        again = receive_until(consumer, all_back, 15, args.within)
        for msg in again:
            emit("redelivered", **describe(msg))
        for msg in again:
            if msg.message_id not in ids:
                continue
            for name, handle in (("original", originals), ("changed", renewed)):
                emit("stale_ack", message_id=msg.message_id, stage=f"redelivered, {name}",
                     **try_ack(consumer, msg, handle[msg.message_id]))  # fmt: skip
            emit("new_ack", message_id=msg.message_id,
                 **try_ack(consumer, msg, msg.receipt_handle))  # fmt: skip
        try:
            result = consumer.receive(32, 5)
            emit("short_invisible", ok=True, received=len(result))
        except Exception as exc:
            emit("short_invisible", ok=False, **error_of(exc))
    finally:
        consumer.shutdown()


def try_ack(consumer: SimpleConsumer, msg: Any, handle: str) -> dict[str, Any]:
    """Ack ``msg`` with ``handle`` (its own handle is put back afterwards)."""
    own = msg.receipt_handle
    msg.receipt_handle = handle
    try:
        consumer.ack(msg)
    except Exception as exc:
        return {"ok": False, **error_of(exc)}
    finally:
        msg.receipt_handle = own
    return {"ok": True}


def longpoll(args: argparse.Namespace) -> None:
    consumer = simple_consumer(args, args.await_s)
    try:
        emit("polling")
        started = time.monotonic()
        got = consumer.receive(32, 15)
        emit("received", seconds=time.monotonic() - started,
             messages=[describe(m) for m in got])  # fmt: skip
        for msg in got:
            consumer.ack(msg)
    finally:
        consumer.shutdown()


class KeyedListener(MessageListener):  # type: ignore[misc]
    """Fails ``fail-once-*`` keys on the first call for the message (a redelivery, or a FIFO
    consumer's local retry, succeeds) and ``fail-always-*`` always."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def consume(self, message: Any) -> Any:
        keys = sorted(message.keys)
        key = keys[0] if keys else ""
        with self._lock:
            first = message.message_id not in self._seen
            self._seen.add(message.message_id)
        fail = key.startswith("fail-always-") or (key.startswith("fail-once-") and first)
        emit("consumed", key=key, at=time.time(), failed=fail, **describe(message))
        return ConsumeResult.FAILURE if fail else ConsumeResult.SUCCESS


def push_consumer(args: argparse.Namespace) -> PushConsumer:
    sub = subscription(args)
    return PushConsumer(config(args), args.group, KeyedListener(), sub,
                        consumption_thread_count=4)  # fmt: skip


def push(args: argparse.Namespace) -> None:
    consumer = push_consumer(args)
    started = time.monotonic()
    consumer.startup()
    emit("started", seconds=time.monotonic() - started)
    try:
        sys.stdin.read()  # until the test closes our standard input
    finally:
        emit("stopping")
        consumer.shutdown()
        emit("stopped")


def cycles(args: argparse.Namespace) -> None:
    for i in range(args.count):
        t0 = time.monotonic()
        client: Any
        if args.kind == "producer":
            client = Producer(config(args), (args.topic,))
        elif args.kind == "simple":
            sub = {args.topic: FilterExpression("*")}
            client = SimpleConsumer(config(args), args.group, sub, await_duration=5)
        else:
            client = push_consumer(args)
        client.startup()
        t1 = time.monotonic()
        if args.kind == "producer":
            msg = Message()
            msg.topic, msg.body = args.topic, f"cycle {i}".encode()
            client.send(msg)
        t2 = time.monotonic()
        client.shutdown()
        emit("cycle", index=i, startup=t1 - t0, shutdown=time.monotonic() - t2)


#: A checker's answers by name (``unknown``: the client sends EndTransaction with the
#: resolution unspecified, which leaves the half message to a later check).
ANSWERS: dict[str, Any] = {
    "commit": TransactionResolution.COMMIT,
    "rollback": TransactionResolution.ROLLBACK,
    "unknown": TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED,
}


class PlannedChecker(TransactionChecker):  # type: ignore[misc]
    """Answers a check-back as the plan says for the message's keys (its first planned key
    in sorted order; ``unknown`` when none is planned): ``check`` is one answer, or a list of
    answers for the first, second, ... check of the message (the last one repeats). Runs on
    the client's check thread."""

    def __init__(self, plan: list[dict[str, Any]]) -> None:
        self._answers: dict[str, list[str]] = {}
        for item in plan:
            check = item.get("check", "unknown")
            for key in item.get("keys", []):
                self._answers[key] = [check] if isinstance(check, str) else list(check)
        self._asked: dict[str, int] = {}

    def check(self, message: Any) -> Any:
        keys = sorted(message.keys)
        planned = [k for k in keys if k in self._answers]
        key = planned[0] if planned else (keys[0] if keys else "")
        answers = self._answers.get(key, ["unknown"])
        asked = self._asked.get(key, 0)
        self._asked[key] = asked + 1
        answer = answers[min(asked, len(answers) - 1)]
        emit("checked", key=key, answer=answer, at=time.time(), **describe(message))
        return ANSWERS[answer]


def transactional_producer(args: argparse.Namespace) -> tuple[Producer, list[dict[str, Any]]]:
    """A started Producer of the plan's topics (listed at construction: its settings name
    them, so the broker sends it their check-backs) with a :class:`PlannedChecker`."""
    plan = json.loads(Path(args.plan).read_text(encoding="utf-8"))
    topics = sorted({item["topic"] for item in plan})
    producer = Producer(config(args), tuple(topics), checker=PlannedChecker(plan),
                        tls_enable=TLS)  # fmt: skip
    started = time.monotonic()
    producer.startup()
    emit("started", seconds=time.monotonic() - started)
    return producer, plan


def transact(args: argparse.Namespace) -> None:
    producer, plan = transactional_producer(args)
    try:
        for index, item in enumerate(plan):
            transaction = producer.begin_transaction()
            sending_at = time.time()
            receipt = producer.send(message_of(item), transaction)
            emit("sent", index=index, message_id=receipt.message_id, at=sending_at,
                 transaction_id=receipt.transaction_id, offset=receipt.offset)  # fmt: skip
            local = item.get("local", "commit")
            if local == "crash":
                emit("crashing", index=index)
                os._exit(0)  # no shutdown: the broker sees the connection drop
            if local in ("commit", "rollback"):
                reply = transaction.commit() if local == "commit" else transaction.rollback()
                emit("ended", index=index, resolution=local, code=reply.status.code,
                     text=reply.status.message)  # fmt: skip
            elif local != "open":
                raise ScenarioError(f"message {index}: unknown local outcome {local!r}")
        emit("waiting")
        sys.stdin.read()  # until the test closes our standard input
    finally:
        emit("stopping")
        producer.shutdown()


def checker(args: argparse.Namespace) -> None:
    producer, _ = transactional_producer(args)
    try:
        emit("waiting")
        sys.stdin.read()
    finally:
        emit("stopping")
        producer.shutdown()


SCENARIOS: dict[str, Callable[[argparse.Namespace], None]] = {
    "produce": produce,
    "receive": receive,
    "refused": refused,
    "invisible": invisible,
    "longpoll": longpoll,
    "push": push,
    "cycles": cycles,
    "transact": transact,
    "checker": checker,
}


def client_log() -> None:
    """Report the ERROR lines (and any traceback) of the client's own log file."""
    path = Path(os.path.expanduser("~")) / "logs" / "rocketmq_python" / "rocketmq_client.log"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    errors = [line for line in text.splitlines() if "[ERROR]" in line]
    emit("client_log", errors=errors[:50], traceback="Traceback" in text, lines=text.count("\n"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--endpoint", required=True, help="HOST:PORT of the gRPC port")
    parser.add_argument("--access-key", default="", help="the ACL account's AccessKey")
    parser.add_argument("--secret-key", default="", help="the ACL account's SecretKey")
    parser.add_argument("--plan", help="produce, transact, checker: the JSON plan")
    parser.add_argument("--topics", help="produce: the Producer's topics (comma-separated)")
    parser.add_argument("--topic")
    parser.add_argument("--group")
    parser.add_argument("--expression", default="*")
    parser.add_argument("--filter-type", choices=sorted(FILTER_TYPES), default="TAG")
    parser.add_argument("--drain", action="store_true", help="receive: one more long poll")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--invisible", type=int, default=15, help="seconds")
    parser.add_argument("--await", dest="await_s", type=int, default=5, help="seconds")
    parser.add_argument("--within", type=float, default=30.0, help="seconds")
    parser.add_argument("--kind", choices=("producer", "simple", "push"), default="producer")
    args = parser.parse_args()
    code = 0
    try:
        SCENARIOS[args.scenario](args)
    except Exception as exc:
        emit("error", **error_of(exc), traceback=traceback.format_exc())
        code = 1
    client_log()
    emit("done", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
