"""Client-library throughput and latency: our Producer / consumers against our broker, side by
side with redis-py (Redis Streams) and aio-pika (RabbitMQ) in the same run.

Where ``bench_broker`` measures the broker with a bare Remoting client, this measures what an
application sees through ``client/`` (anyio on asyncio by default, ``--backend trio`` too):

* ``produce_sync``: ``await producer.send(msg)`` one at a time;
* ``produce_concurrent``: ``--window`` sends in flight at once from tasks of one producer
  (compared with Redis' pipelined XADD);
* ``produce_batch``: ``producer.send_batch`` of ``--batch`` messages;
* ``consume_simple``: drain a ``--backlog`` with ``SimpleConsumer.receive(--count)`` and one
  ``ack`` per message, the acks of a batch concurrently (vs XREADGROUP + XACK);
* ``consume_batch_ack``: the same with one ``ack_many`` per received batch;
* ``e2e_latency``: a producer at ``--rate`` msg/s with a monotonic timestamp in the body and
  a SimpleConsumer long-polling in a separate process (as the peers' consumers are); the first
  ``--warmup`` messages are dropped.

The broker runs as ``python -m broker`` in a subprocess; the peers run their scripts from
``../shared/peer-bench/`` with ``--runs 1`` after each of our rounds (see ``bench_broker``).

Usage: python -m benchmarks.bench_client [--runs 3] [--sizes 128] [--no-peer]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from benchmarks.bench_broker import (
    TS_BYTES,
    broker_process,
    lat_summary_ms,
    make_payload,
    peer_common_args,
    peer_round,
    print_table,
    proc_cpu_seconds,
    write_row,
)
from benchmarks.peers import PEER_BENCH, PEER_PYTHON, PEERS, ensure_peer_venv
from client.config import ClientConfig
from client.message import Message
from client.producer import Producer
from client.simple_consumer import SimpleConsumer

ROWS: list[tuple[str, str, str | None, str]] = [
    ("produce_sync", "msgs_per_s", "produce_sync", ""),
    ("produce_sync", "p50_ms", None, ""),
    ("produce_sync", "p99_ms", None, ""),
    ("produce_concurrent", "msgs_per_s", "produce_pipelined", ""),
    ("produce_batch", "msgs_per_s", "produce_pipelined", ""),
    ("consume_simple", "msgs_per_s", "consume_ack", ""),
    ("consume_batch_ack", "msgs_per_s", "consume_ack", ""),
    ("e2e_latency", "p50_ms", "e2e_latency", ""),
    ("e2e_latency", "p90_ms", "e2e_latency", ""),
    ("e2e_latency", "p99_ms", "e2e_latency", ""),
    ("e2e_latency", "max_ms", "e2e_latency", ""),
]


@dataclass(frozen=True)
class Params:
    address: str
    size: int
    n_sync: int
    n_pipe: int
    window: int
    batch: int
    backlog: int
    count: int
    rate: float
    e2e_seconds: float
    warmup: int
    max_seconds: float
    tag: str  # makes topics and groups unique per round

    def config(self) -> ClientConfig:
        return ClientConfig(namesrv_addr=self.address, request_timeout=30.0)

    def topic(self, workload: str) -> str:
        return f"bc_{workload}_{self.tag}"


async def produce_sync(p: Params) -> dict[str, float]:
    payload = make_payload(p.size)
    topic = p.topic("sync")
    lats: list[int] = []
    async with Producer(p.config()) as producer:
        await producer.send(Message(topic, payload))  # route + topic creation: not timed
        t0 = time.perf_counter()
        deadline = t0 + p.max_seconds
        while len(lats) < p.n_sync and time.perf_counter() < deadline:
            s = time.perf_counter_ns()
            await producer.send(Message(topic, payload))
            lats.append(time.perf_counter_ns() - s)
        dt = time.perf_counter() - t0
    return {"msgs": len(lats), "seconds": dt, "msgs_per_s": len(lats) / dt, **lat_summary_ms(lats)}


async def produce_concurrent(p: Params) -> dict[str, float]:
    payload = make_payload(p.size)
    topic = p.topic("conc")
    per_task = max(1, p.n_pipe // p.window)
    async with Producer(p.config()) as producer:
        await producer.send(Message(topic, payload))

        async def sender() -> None:
            for _ in range(per_task):  # bounded
                await producer.send(Message(topic, payload))

        t0 = time.perf_counter()
        with anyio.fail_after(p.max_seconds * 3):
            async with anyio.create_task_group() as tg:
                for _ in range(p.window):
                    tg.start_soon(sender)
        dt = time.perf_counter() - t0
    n = per_task * p.window
    return {"msgs": n, "seconds": dt, "msgs_per_s": n / dt, "window": p.window}


async def produce_batch(p: Params) -> dict[str, float]:
    payload = make_payload(p.size)
    topic = p.topic("batch")
    n = 0
    async with Producer(p.config()) as producer:
        await producer.send(Message(topic, payload))
        t0 = time.perf_counter()
        deadline = t0 + p.max_seconds
        while n < p.n_pipe and time.perf_counter() < deadline:
            await producer.send_batch([Message(topic, payload)] * p.batch)
            n += p.batch
        dt = time.perf_counter() - t0
    return {"msgs": n, "seconds": dt, "msgs_per_s": n / dt, "batch": p.batch}


async def consume_simple(p: Params, batch_ack: bool = False) -> dict[str, float]:
    payload = make_payload(p.size)
    topic = p.topic("consume_b" if batch_ack else "consume")
    async with Producer(p.config()) as producer:
        sent = 0
        while sent < p.backlog:  # the backlog (not timed)
            k = min(p.batch, p.backlog - sent)
            await producer.send_batch([Message(topic, payload)] * k)
            sent += k
    got = 0
    group = f"bc_group_{p.tag}{'_b' if batch_ack else ''}"
    async with SimpleConsumer(
        p.config(), group=group, subscription={topic: "*"}, consume_from="first"
    ) as consumer:
        t0 = time.perf_counter()
        deadline = t0 + p.max_seconds
        while got < p.backlog and time.perf_counter() < deadline:
            messages = await consumer.receive(p.count, 60.0, await_duration=1.0)
            if not messages:
                continue
            if batch_ack:
                await consumer.ack_many(messages)
            else:
                async with anyio.create_task_group() as tg:
                    for m in messages:
                        tg.start_soon(consumer.ack, m)
            got += len(messages)
        dt = time.perf_counter() - t0
    return {"msgs": got, "seconds": dt, "msgs_per_s": got / dt, "count": p.count}


async def consume_batch_ack(p: Params) -> dict[str, float]:
    return await consume_simple(p, batch_ack=True)


def _e2e_consumer(p: Params, n: int, backend: str, ready: Any, out: Any) -> None:
    async def main() -> list[int]:
        lats: list[int] = []
        async with SimpleConsumer(
            p.config(), group=f"bc_e2e_{p.tag}", subscription={p.topic("e2e"): "*"}
        ) as consumer:
            await consumer.receive(1, 60.0, await_duration=0)  # the group starts here
            ready.set()
            deadline = time.monotonic() + p.e2e_seconds + 30
            while len(lats) < n and time.monotonic() < deadline:
                messages = await consumer.receive(p.count, 60.0, await_duration=1.0)
                now = time.monotonic_ns()
                lats += [now - int.from_bytes(m.body[:TS_BYTES], "big") for m in messages]
                await consumer.ack_many(messages)
        return lats

    out.put(anyio.run(main, backend=backend))


async def e2e_latency(p: Params, backend: str) -> dict[str, float]:
    topic = p.topic("e2e")
    n = int(p.rate * p.e2e_seconds)
    filler = b"x" * (p.size - TS_BYTES)
    async with Producer(p.config()) as producer:
        await producer.send(Message(topic, filler + b"12345678"))  # creates the topic
        ctx = mp.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=_e2e_consumer, args=(p, n, backend, ready, out))
        proc.start()
        try:
            if not await anyio.to_thread.run_sync(ready.wait, 60):
                raise RuntimeError("e2e consumer did not start")
            await anyio.sleep(0.5)  # parked in its long poll
            t_start = time.monotonic()
            for i in range(n):
                delay = t_start + i / p.rate - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                body = time.monotonic_ns().to_bytes(TS_BYTES, "big") + filler
                await producer.send(Message(topic, body))
            send_dt = time.monotonic() - t_start
            lats: list[int] = await anyio.to_thread.run_sync(out.get, True, p.e2e_seconds + 60)
        finally:
            proc.join(30)
            if proc.is_alive():
                proc.kill()  # our own child
    res = lat_summary_ms(lats[p.warmup :])
    res.update({"rate_target": p.rate, "rate_achieved": n / send_dt, "received": len(lats)})
    return res


OURS: dict[str, Callable[..., Awaitable[dict[str, float]]]] = {
    "produce_sync": produce_sync,
    "produce_concurrent": produce_concurrent,
    "produce_batch": produce_batch,
    "consume_simple": consume_simple,
    "consume_batch_ack": consume_batch_ack,
    "e2e_latency": e2e_latency,
}


def count_of(p: Params, wl: str) -> int:
    return {
        "produce_sync": p.n_sync,
        "produce_concurrent": p.n_pipe,
        "produce_batch": p.n_pipe,
        "consume_simple": p.backlog,
        "consume_batch_ack": p.backlog,
        "e2e_latency": int(p.rate * p.e2e_seconds),
    }[wl]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="128")
    ap.add_argument("--workloads", default=",".join(OURS))
    ap.add_argument("--backend", default="asyncio", choices=("asyncio", "trio"))
    ap.add_argument("--n-sync", type=int, default=10000)
    ap.add_argument("--n-pipe", type=int, default=50000)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--backlog", type=int, default=50000)
    ap.add_argument("--count", type=int, default=32)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--e2e-seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    ap.add_argument("--out", default=None, help="JSON-lines file for every row")
    args = ap.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    peers = [] if args.no_peer else [n for n in args.peers.split(",") if n]
    peers = [n for n in peers if n in PEERS and (PEER_BENCH / PEERS[n].script).exists()]
    common = peer_common_args(args)
    if peers:
        ensure_peer_venv(args.peer_python, [m for n in peers for m in PEERS[n].modules])
    with ExitStack() as stack:
        pid, port = stack.enter_context(broker_process(verbose=True))
        for name in peers:
            stack.enter_context(PEERS[name].server())
        for size in [int(s) for s in args.sizes.split(",") if s]:
            ours: dict[str, list[dict[str, float]]] = {w: [] for w in workloads}
            cpu: dict[str, list[float]] = {w: [] for w in workloads}
            theirs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n in peers}
            for run in range(args.runs):
                for wl in workloads:
                    p = Params(
                        f"127.0.0.1:{port}", size, args.n_sync, args.n_pipe, args.window,
                        args.batch, args.backlog, args.count, args.rate, args.e2e_seconds,
                        args.warmup, args.max_seconds, f"{size}r{run}",
                    )  # fmt: skip
                    c0 = proc_cpu_seconds(pid)
                    extra = (args.backend,) if wl == "e2e_latency" else ()
                    res = anyio.run(OURS[wl], p, *extra, backend=args.backend)
                    cpu[wl].append((proc_cpu_seconds(pid) - c0) * 1e6 / count_of(p, wl))
                    ours[wl].append(res)
                    print(f"[trimq-client] {wl} size={size} run={run}: "
                          f"{ {k: round(v, 3) for k, v in res.items()} }", flush=True)  # fmt: skip
                    write_row(
                        args.out, {"peer": "trimq-client", "workload": wl, "size": size, **res}
                    )
                peer_round(theirs, args.peer_python, size, run, common, args.count, args.out)
            print_table(size, ours, theirs, cpu, ROWS)


if __name__ == "__main__":
    main()
