"""How late a trio loop wakes while a worker thread runs Python, by GIL switch interval
(docs/design.md §12, "Latency tails: worker threads and the GIL"; broker/gil_tuning.py).

A sender process writes a timestamped 24-byte record to a loopback TCP connection every
millisecond; this process's trio loop reads them and records, for each, how long after its
sending it was read (``time.perf_counter`` is the system's monotonic clock, shared by both
processes). Meanwhile a worker thread does what the broker's metrics writer does at load:
every ``--period-ms`` it formats text for ``--burst-ms``. Each ``--switch-ms`` value runs
``--runs`` times, interleaved; the table gives the medians of the runs' percentiles.

Usage: python -m benchmarks.bench_gil_wake [--switch-ms 5,0.5] [--runs 3] [--records 3000]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import threading
import time

import trio

RECORD = 24
_SENDER = r"""
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for _ in range(int(sys.argv[2])):
    time.sleep(0.001)
    s.sendall(("%.9f;" % time.perf_counter()).encode().ljust(24))
s.close()
"""


def _burst_worker(stop: threading.Event, period_s: float, burst_s: float) -> None:
    while not stop.wait(period_s):
        start = time.perf_counter()
        for _ in range(1_000_000):  # bounded; ends at burst_s
            if time.perf_counter() - start >= burst_s:
                break
            "{}:{}:{}".format(*[str(i) for i in range(3)])


async def _read_records(listener: socket.socket, records: int) -> list[float]:
    """Accept the sender and read its records; how late each was read (ms), sorted."""
    late: list[float] = []
    with trio.fail_after(records / 1000 * 5 + 30):
        conn, _ = await trio.socket.from_stdlib_socket(listener).accept()
        with conn:
            buf = b""
            for _ in range(records * 2):  # bounded: at least one record per read
                data = await conn.recv(65536)
                now = time.perf_counter()
                if not data:
                    break
                buf += data
                whole = len(buf) - len(buf) % RECORD
                for pos in range(0, whole, RECORD):
                    sent = float(buf[pos : pos + RECORD].split(b";")[0])
                    late.append((now - sent) * 1000)
                buf = buf[whole:]
    return sorted(late)


def one_run(records: int, period_s: float, burst_s: float) -> list[float]:
    """One run: the worker thread and the sender process started, the records read."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    stop = threading.Event()
    worker = threading.Thread(target=_burst_worker, args=(stop, period_s, burst_s), daemon=True)
    worker.start()
    sender = subprocess.Popen([sys.executable, "-c", _SENDER, str(port), str(records)])
    try:
        return trio.run(_read_records, listener, records)
    finally:
        stop.set()
        worker.join(timeout=5)
        if sender.poll() is None:
            sender.kill()
        sender.wait()
        listener.close()


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--switch-ms", default="5,0.5", help="comma list of intervals to compare")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--records", type=int, default=3000, help="records per run, 1 ms apart")
    ap.add_argument("--period-ms", type=float, default=200.0)
    ap.add_argument("--burst-ms", type=float, default=20.0)
    args = ap.parse_args()
    switches = [float(s) for s in args.switch_ms.split(",")]
    results: dict[float, list[tuple[float, float, float, float]]] = {s: [] for s in switches}
    default = sys.getswitchinterval()
    try:
        for run in range(args.runs):
            for switch in switches:
                sys.setswitchinterval(switch / 1000)
                late = one_run(args.records, args.period_ms / 1000, args.burst_ms / 1000)
                row = (_pct(late, 0.5), _pct(late, 0.99), _pct(late, 0.999), late[-1])
                results[switch].append(row)
                print(f"run {run} switch {switch} ms: p50 / p99 / p99.9 / max "
                      + " / ".join(f"{v:.2f}" for v in row) + " ms", flush=True)  # fmt: skip
    finally:
        sys.setswitchinterval(default)
    print(f"\nworker: {args.burst_ms} ms of Python every {args.period_ms} ms; "
          f"medians of {args.runs} runs of {args.records} records")  # fmt: skip
    print("| switch interval | wake p50 | p99 | p99.9 | max (ms) |\n|---:|---:|---:|---:|---:|")
    for switch, rows in results.items():
        med = [statistics.median(r[i] for r in rows) for i in range(4)]
        print(f"| {switch} ms | " + " | ".join(f"{v:.2f}" for v in med) + " |")


if __name__ == "__main__":
    main()
