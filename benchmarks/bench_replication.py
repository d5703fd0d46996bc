"""The cost of replication: send throughput of a master alone, with an asynchronous replica,
and in sync mode (``--replication sync --min-insync-replicas 2``), in one run.

Master and replica are ``python -m broker`` subprocesses on 127.0.0.1 (the replica
``--broker-id 1 --ha-master-addr``), each in a fresh data dir under ``.bench-peers/``; the
client is :mod:`benchmarks.bench_broker`'s: ``produce_sync`` (one SEND_MESSAGE_V2 in flight:
msgs/s, p50/p99) and ``produce_window`` (64 in flight on one connection). Every mode runs
``--runs`` times, in turns, so all see the same noise; the medians are printed.

Usage: python -m benchmarks.bench_replication [--runs 3] [--size 1024] [--count 3000]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import trio

from benchmarks.bench_broker import (
    Params,
    broker_subprocess,
    make_payload,
    produce_sync,
    produce_window,
    send_ext,
    with_conns,
)
from benchmarks.peers import WORK_DIR
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request

MODES = ("alone", "async", "sync")
NAME = "bench-ha"


def free_port() -> int:
    """A port free right now (the master's HA port must be known before it starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def brokers(mode: str) -> Iterator[int]:
    """Start the master (and a replica unless ``alone``); yield the master's port."""
    WORK_DIR.mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ha-", dir=WORK_DIR))
    ha_port = free_port()
    master_args = ["--broker-name", NAME, "--ha-port", str(ha_port)]
    if mode == "sync":
        master_args += ["--replication", "sync", "--min-insync-replicas", "2"]
    try:
        with ExitStack() as stack:
            _, port = stack.enter_context(
                broker_subprocess(root / "m", root / "m.log", *master_args)
            )
            if mode != "alone":
                stack.enter_context(broker_subprocess(
                    root / "r", root / "r.log", "--broker-name", NAME, "--broker-id", "1",
                    "--ha-master-addr", f"127.0.0.1:{ha_port}",
                ))  # fmt: skip
            yield port
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def until_send_ok(port: int, size: int) -> None:
    """In sync mode a send is SLAVE_NOT_AVAILABLE until the replica is connected."""

    async def run(pool: object) -> dict[str, float]:
        conn = await pool.open()  # type: ignore[attr-defined]
        cmd = request(RequestCode.SEND_MESSAGE_V2, 0, send_ext("BenchWarm", 0), make_payload(size))
        for _ in range(600):  # bounded: 30 s
            if (await conn.request(cmd)).code == ResponseCode.SUCCESS:
                return {}
            await trio.sleep(0.05)
        raise RuntimeError("the master never answered SEND_OK")

    await with_conns(port, run)


def measure(mode: str, args: argparse.Namespace, run: int) -> dict[str, float]:
    with brokers(mode) as port:
        p = Params(port=port, size=args.size, n_sync=args.count, n_pipe=args.count * 4,
                   batch=64, backlog=0, count=32, rate=0, e2e_seconds=0, warmup=0,
                   max_seconds=30, tag=f"{mode}{run}")  # fmt: skip
        trio.run(until_send_ok, port, args.size)
        one = trio.run(produce_sync, p)
        window = trio.run(produce_window, p)
    return {
        "sync_msgs_per_s": one["msgs_per_s"],
        "sync_p50_ms": one["p50_ms"],
        "sync_p99_ms": one["p99_ms"],
        "window64_msgs_per_s": window["msgs_per_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--count", type=int, default=3000)
    args = parser.parse_args()
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    started = time.monotonic()
    for run in range(args.runs):
        for mode in MODES:
            rows[mode].append(measure(mode, args, run))
            print(mode, run, rows[mode][-1], flush=True)
    print(f"\n{args.runs} runs, {args.size}-byte bodies, {time.monotonic() - started:.0f} s")
    keys = list(rows[MODES[0]][0])
    print("| mode | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for mode in MODES:
        medians = [statistics.median(r[k] for r in rows[mode]) for k in keys]
        print(
            f"| {mode} | "
            + " | ".join(f"{v:.2f}" if v < 100 else f"{v:.0f}" for v in medians)
            + " |"
        )


if __name__ == "__main__":
    main()
