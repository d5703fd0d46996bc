"""The seed experiment's gRPC consumers, run with the official RocketMQ 5 Python client.

Run by :mod:`benchmarks.seed_grpc` in the client's own venv (``.interop/py-grpc``, with
``-I`` and ``HOME`` set to a scratch directory); prints one JSON object per line on stdout.

``simple`` (the seed's experiment 5): per round, N messages are sent at once; the failing
SimpleConsumer group receives them (invisible ``--invisible-s``) and acks none, then keeps
receiving; each redelivered message is acked, and its time past the deadline (receive time
minus the deadline in its first receipt handle: pop time + invisible time) and since its
first pop are printed.

``push`` (experiments 3 and 4): a PushConsumer whose listener fails each message's first
delivery (the client then sets its invisible time to the first back-off step, 1 s) and
acks the redelivery; printed: time past that new deadline (failure time + 1 s) and since the
failure. ``--rate`` > 0 keeps a producer sending that many messages per second meanwhile
(experiment 4's steady sending).

``--others K`` other SimpleConsumer groups on the topic long-poll and ack everything (what
the "topic" wake mode wakes for nothing). Every loop is bounded by ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from rocketmq import (  # the official client (its own venv)
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)

#: The push consumer's first back-off step (the broker's settings: 1 s, 5 s, ...).
FIRST_BACKOFF_MS = 1000


def now_ms() -> float:
    return time.time() * 1000


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def handle_deadline_ms(handle: str) -> int:
    """pop time + invisible time, from a trimq receipt handle (``ckOffset popTime
    invisibleTime ...``)."""
    parts = handle.split(" ")
    return int(parts[1]) + int(parts[2])


def send_burst(producer: Any, topic: str, n: int, tag: str) -> None:
    for i in range(n):
        msg = Message()
        msg.topic = topic
        msg.body = f"{tag}-{i}".encode()
        msg.tag = "seed"
        producer.send(msg)


def run_others(cfg: Any, topic: str, k: int, stop: threading.Event, await_s: int) -> None:
    def loop(i: int) -> None:
        consumer = SimpleConsumer(
            cfg, f"seed_other_group_{i}", {topic: FilterExpression("*")}, await_duration=await_s
        )
        consumer.startup()
        try:
            for _ in range(100_000):  # bounded; ends at stop
                if stop.is_set():
                    break
                for m in consumer.receive(32, 15):
                    consumer.ack(m)
        finally:
            consumer.shutdown()

    for i in range(k):
        threading.Thread(target=loop, args=(i,), daemon=True).start()


def simple(args: argparse.Namespace, cfg: Any) -> None:
    producer = Producer(cfg, (args.topic,))
    producer.startup()
    consumer = SimpleConsumer(
        cfg, args.group, {args.topic: FilterExpression("*")}, await_duration=args.await_s
    )
    consumer.startup()
    end = time.monotonic() + args.deadline_s
    try:
        for rnd in range(args.rounds):
            send_burst(producer, args.topic, args.messages, f"r{rnd}")
            first: dict[str, tuple[int, float]] = {}
            while len(first) < args.messages and time.monotonic() < end:
                for m in consumer.receive(32, args.invisible_s):
                    first.setdefault(m.message_id, (handle_deadline_ms(m.receipt_handle), now_ms()))
            emit(kind="popped", round=rnd, messages=len(first))
            done: set[str] = set()
            while len(done) < len(first) and time.monotonic() < end:
                batch = consumer.receive(32, args.invisible_s)
                t = now_ms()  # when the batch arrived: the acks below take the client ~ms each
                for m in batch:
                    consumer.ack(m)
                    if m.message_id in first and m.message_id not in done:
                        done.add(m.message_id)
                        deadline, popped = first[m.message_id]
                        emit(kind="redelivered", round=rnd, past_deadline_ms=t - deadline,
                             since_first_ms=t - popped, attempt=m.delivery_attempt)  # fmt: skip
    finally:
        consumer.shutdown()
        producer.shutdown()


class _FailOnce(MessageListener):  # type: ignore[misc]
    def __init__(self, expected: int) -> None:
        self.failed: dict[str, float] = {}
        self.redelivered: set[str] = set()
        self.lock = threading.Lock()
        self.all_done = threading.Event()
        self.expected = expected

    def consume(self, message: Any) -> Any:
        t = now_ms()
        with self.lock:
            mid = message.message_id
            if not message.body.startswith(b"burst"):
                return ConsumeResult.SUCCESS  # the steady producer's messages
            if mid not in self.failed:
                self.failed[mid] = t
                return ConsumeResult.FAILURE
            if mid not in self.redelivered:
                self.redelivered.add(mid)
                emit(kind="redelivered", past_deadline_ms=t - self.failed[mid] - FIRST_BACKOFF_MS,
                     since_first_ms=t - self.failed[mid],
                     attempt=message.delivery_attempt)  # fmt: skip
                if len(self.redelivered) >= self.expected:
                    self.all_done.set()
            return ConsumeResult.SUCCESS


def push(args: argparse.Namespace, cfg: Any) -> None:
    producer = Producer(cfg, (args.topic,))
    producer.startup()
    total = args.messages * args.rounds
    listener = _FailOnce(total)
    consumer = PushConsumer(cfg, args.group, listener, {args.topic: FilterExpression("*")})
    consumer.startup()
    stop = threading.Event()
    if args.rate > 0:

        def steady() -> None:
            for i in range(1_000_000):  # bounded; ends at stop
                if stop.wait(1 / args.rate):
                    break
                msg = Message()
                msg.topic, msg.body, msg.tag = args.topic, f"live-{i}".encode(), "live"
                producer.send(msg)

        threading.Thread(target=steady, daemon=True).start()
    try:
        for rnd in range(args.rounds):
            before = len(listener.redelivered)
            send_burst(producer, args.topic, args.messages, f"burst{rnd}")
            end = time.monotonic() + args.deadline_s / args.rounds
            while len(listener.redelivered) < before + args.messages and time.monotonic() < end:
                time.sleep(0.2)
            emit(kind="round", round=rnd, redelivered=len(listener.redelivered) - before)
    finally:
        stop.set()
        consumer.shutdown()
        producer.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=("simple", "push"))
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--messages", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--invisible-s", type=int, default=10)
    ap.add_argument("--await-s", type=int, default=15)
    ap.add_argument("--others", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--deadline-s", type=float, default=240.0)
    args = ap.parse_args()
    cfg = ClientConfiguration(args.endpoint, Credentials("", ""), request_timeout=3)
    stop = threading.Event()
    run_others(cfg, args.topic, args.others, stop, args.await_s)
    try:
        simple(args, cfg) if args.scenario == "simple" else push(args, cfg)
    finally:
        stop.set()
    emit(kind="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
