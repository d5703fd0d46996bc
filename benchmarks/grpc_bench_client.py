"""The official RocketMQ 5 Python client (``rocketmq-python-client`` 5.1.2) driving one gRPC
endpoint, workload by workload, for ``bench_grpc``.

It runs in the client's venv (``.interop/py-grpc``), with ``HOME`` a scratch dir (the client
logs under ``~``). The workloads, each bounded by ``--n-*`` messages and ``--max-seconds``:

* ``send_sync``: ``producer.send(message)`` one at a time;
* ``send_async``: ``producer.send_async(message)`` with at most ``--window`` futures in
  flight (a sliding window: the oldest is waited for when the window is full);
* ``receive_ack``: SimpleConsumer ``receive(32, 30)``, then ``ack(message)`` for each, until
  ``--n-recv`` messages were received (the topic must hold them: ``bench_grpc`` pre-fills it);
* ``receive_only``: the same without the acks, in another group (what one streamed message
  costs, without a unary ack per message). Its messages are invisible for ``NOACK_INVISIBLE_S``
  and acked after the timed loop (unless ``--no-settle``): left
  in flight they would come back (revive) or be checkpointed during later workloads and
  charge the server's work to them.

The parent drives it over stdin/stdout so that it can sample the server's CPU exactly around
each timed loop: before a workload the client prints ``@@ {"event": "ready", ...}`` (clients
started, the first send done: routes and topic creation are not timed) and waits for a
``go`` line; after it, it prints ``@@ {"event": "result", ...}``. Lines without the ``@@``
prefix are not for the parent.

Usage: grpc_bench_client.py --endpoint 127.0.0.1:PORT --topic T [--recv-topic R] \
    [--workloads send_sync,send_async,receive_ack,receive_only] [--stdin-go]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)

WORKLOADS = ("send_sync", "send_async", "receive_ack", "receive_only")
#: What SimpleConsumer.receive asks for (the proxy's and trimq's cap).
BATCH = 32
INVISIBLE_S = 30
#: Invisible time of receive_only's messages: longer than a whole run.
NOACK_INVISIBLE_S = 3600
#: Threads acking receive_only's messages after its timed loop.
SETTLE_THREADS = 8
#: Long-poll of a receive that finds nothing (trimq's minimum): only after the topic ran dry.
AWAIT_S = 5


def emit(event: str, **fields: Any) -> None:
    print("@@ " + json.dumps({"event": event, **fields}), flush=True)


def message(topic: str, body: bytes) -> Any:
    m = Message()
    m.topic = topic
    m.body = body
    m.tag = "bench"
    return m


class Session:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.config = ClientConfiguration(args.endpoint, Credentials(), request_timeout=10)
        self.body = b"x" * args.size
        self.producer: Any = None
        self.consumers: list[Any] = []
        #: (consumer, message) received without ack, acked by settle()
        self.unacked: list[tuple[Any, Any]] = []

    def start_producer(self) -> Any:
        if self.producer is None:
            self.producer = Producer(self.config, (self.args.topic,))
            self.producer.startup()
            self.producer.send(message(self.args.topic, self.body))  # route, topic: not timed
        return self.producer

    def start_consumer(self, group: str) -> Any:
        consumer = SimpleConsumer(
            self.config,
            group,
            {self.args.recv_topic: FilterExpression()},
            await_duration=AWAIT_S,
        )
        consumer.startup()
        self.consumers.append(consumer)
        return consumer

    def close(self) -> None:
        for client in [self.producer, *self.consumers]:
            if client is not None:
                try:
                    client.shutdown()
                except Exception as exc:  # a failed shutdown must not hide the results
                    print(f"shutdown: {exc!r}", file=sys.stderr, flush=True)

    # ---------------------------------------------------------------- workloads
    def send_sync(self) -> dict[str, float]:
        producer, topic, n = self.start_producer(), self.args.topic, self.args.n_sync
        done = errors = 0
        self.go()
        t0 = time.perf_counter()
        deadline = t0 + self.args.max_seconds
        while done + errors < n and time.perf_counter() < deadline:
            try:
                producer.send(message(topic, self.body))
                done += 1
            except Exception:
                errors += 1
        dt = time.perf_counter() - t0
        return {"msgs": done, "errors": errors, "seconds": dt, "msgs_per_s": done / dt}

    def send_async(self) -> dict[str, float]:
        producer, topic, n = self.start_producer(), self.args.topic, self.args.n_async
        window: collections.deque[Any] = collections.deque()
        done = errors = 0

        def settle(future: Any) -> None:
            nonlocal done, errors
            try:
                future.result(timeout=self.args.max_seconds)
                done += 1
            except Exception:
                errors += 1

        self.go()
        t0 = time.perf_counter()
        deadline = t0 + self.args.max_seconds
        sent = 0
        while sent < n and time.perf_counter() < deadline:
            if len(window) >= self.args.window:
                settle(window.popleft())
            window.append(producer.send_async(message(topic, self.body)))
            sent += 1
        while window:
            settle(window.popleft())
        dt = time.perf_counter() - t0
        return {
            "msgs": done,
            "errors": errors,
            "seconds": dt,
            "msgs_per_s": done / dt,
            "window": self.args.window,
        }

    def _receive(self, group: str, ack: bool) -> dict[str, float]:
        consumer, n = self.start_consumer(group), self.args.n_recv
        invisible = INVISIBLE_S if ack else NOACK_INVISIBLE_S
        got = acked = calls = errors = 0
        self.go()
        t0 = time.perf_counter()
        deadline = t0 + self.args.max_seconds
        while got < n and time.perf_counter() < deadline:
            try:
                messages = consumer.receive(BATCH, invisible)
            except Exception:
                errors += 1
                continue
            calls += 1
            got += len(messages)
            if not ack:
                self.unacked += [(consumer, m) for m in messages]
            else:
                for m in messages:
                    try:
                        consumer.ack(m)
                        acked += 1
                    except Exception:
                        errors += 1
        dt = time.perf_counter() - t0
        return {
            "msgs": got,
            "acks": acked,
            "receive_calls": calls,
            "errors": errors,
            "seconds": dt,
            "msgs_per_s": got / dt,
        }

    def receive_ack(self) -> dict[str, float]:
        return self._receive(f"{self.args.group}_ack", ack=True)

    def receive_only(self) -> dict[str, float]:
        return self._receive(f"{self.args.group}_noack", ack=False)

    def settle(self) -> int:
        """Ack what receive_only left in flight (after its timed loop); the failures. With
        ``ack`` from a few threads: in 5.1.2 ``SimpleConsumer.ack_async`` returns None (and
        the future it drops is an ``asyncio.Future`` made off its loop)."""

        def ack(item: tuple[Any, Any]) -> bool:
            consumer, m = item
            try:
                consumer.ack(m)
            except Exception as exc:
                print(f"ack after receive_only: {exc!r}", file=sys.stderr, flush=True)
                return False
            return True

        with concurrent.futures.ThreadPoolExecutor(SETTLE_THREADS) as pool:
            failed = sum(not ok for ok in pool.map(ack, self.unacked, timeout=600))
        self.unacked.clear()
        return failed

    def go(self) -> None:
        """Tell the parent the timed loop is next; wait for its ``go`` (with ``--stdin-go``)."""
        emit("ready", pid=os.getpid())
        if self.args.stdin_go:
            line = sys.stdin.readline()
            if line.strip() != "go":
                raise SystemExit(f"expected 'go' on stdin, got {line!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--endpoint", required=True, help="host:port of the gRPC server")
    ap.add_argument("--topic", required=True, help="topic of the send workloads")
    ap.add_argument("--recv-topic", default="", help="pre-filled topic of the receives")
    ap.add_argument("--group", default="bench_grpc", help="prefix of the consumer groups")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--n-sync", type=int, default=2000)
    ap.add_argument("--n-async", type=int, default=5000)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--n-recv", type=int, default=3000)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--stdin-go", action="store_true", help="wait for 'go' before each loop")
    ap.add_argument(
        "--no-settle", action="store_true", help="leave receive_only's messages un-acked"
    )
    args = ap.parse_args()
    args.recv_topic = args.recv_topic or args.topic
    session = Session(args)
    runs: dict[str, Callable[[], dict[str, float]]] = {
        "send_sync": session.send_sync,
        "send_async": session.send_async,
        "receive_ack": session.receive_ack,
        "receive_only": session.receive_only,
    }
    try:
        for workload in [w for w in args.workloads.split(",") if w]:
            result = runs[workload]()
            emit("result", workload=workload, **result)
            if session.unacked and not args.no_settle:
                emit("settled", workload=workload, failed=session.settle())
    finally:
        session.close()
    emit("bye")
    sys.stdout.flush()
    os._exit(0)  # the client's scheduler threads are not all daemons


if __name__ == "__main__":
    main()
