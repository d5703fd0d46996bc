"""Where the broker's time goes under one of ``bench_floor``'s loads: py-spy records the
broker process (``--gil``: CPU only, ``-f raw``: collapsed stacks) while this process runs
the load against it in a loop, then prints the top entries (inclusive and self).

Usage: python -m benchmarks.profile_floor {one,window,pull} [--size 128] [--seconds 10]
    [--out stacks.raw] [--broker-root OTHER_CHECKOUT] [--py-spy PATH] [--flush sync]
    [--threads]

py-spy is not a dependency of the project: install it into a scratch venv
(``python -m venv /tmp/pyspy && /tmp/pyspy/bin/pip install py-spy``) and pass its path.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import bench_floor
from benchmarks.bench_broker import broker_process, proc_cpu_seconds

BACKLOG = 32_000


def load(target: bench_floor.Target, workload: str, size: int) -> Callable[[float], int]:
    """One pass of ``workload`` against ``target`` (bounded by a deadline); returns the
    messages it carried."""

    def one_pass(deadline: float) -> int:
        if workload == "one":
            bench_floor.one_in_flight(target, size, 2000, deadline)
            return 2000
        if workload == "window":
            bench_floor.windowed(target, size, 10_000, 100, deadline)
            return 10_000
        bench_floor.pull(target, BACKLOG, deadline)
        return BACKLOG

    return one_pass


def top_entries(raw: Path, count: int) -> str:
    """The ``count`` biggest entries of a py-spy raw file, by inclusive and by self share."""
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        n = int(samples)
        total += n
        names = [_short(frame) for frame in stack.split(";")]
        own[names[-1]] += n
        for name in set(names):
            inclusive[name] += n
    lines = [f"{total} samples", "inclusive:"]
    lines += [f"{100 * c / total:5.1f} %  {name}" for name, c in inclusive.most_common(count)]
    lines += ["self:"]
    lines += [f"{100 * c / total:5.1f} %  {name}" for name, c in own.most_common(count)]
    return "\n".join(lines)


def _short(frame: str) -> str:
    """``fn (/path/to/file.py:12)`` as ``fn (file.py)``: one entry per function."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1]})" if where else name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=("one", "window", "pull"))
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=Path("profile_floor.raw"))
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--broker-root", type=Path, help="profile the broker of this checkout")
    parser.add_argument("--py-spy", default="/tmp/pyspy/bin/py-spy")
    parser.add_argument("--flush", choices=("async", "sync"), default="async")
    parser.add_argument(
        "--threads", action="store_true", help="every thread's CPU, not only the GIL holder's"
    )
    args = parser.parse_args()
    with broker_process(False, args.broker_root, "--flush", args.flush) as (pid, port):
        target = bench_floor.Target("trimq", pid, port)
        deadline = time.monotonic() + args.seconds + 300
        if args.workload == "pull":
            bench_floor.fill(target, args.size, BACKLOG, deadline)
        one_pass = load(target, args.workload, args.size)
        spy = subprocess.Popen(
            [args.py_spy, "record", *([] if args.threads else ["--gil"]), "-r", str(args.rate),
             "-d", str(args.seconds), "-p", str(pid), "-f", "raw", "-o", str(args.out),
             "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)  # py-spy attaches
        cpu, messages = proc_cpu_seconds(pid), 0
        end = time.monotonic() + args.seconds + 1
        while time.monotonic() < end:  # bounded by the clock
            messages += one_pass(deadline)
        used = proc_cpu_seconds(pid) - cpu
        spy.wait(timeout=60)
    print(f"{args.workload} {args.size} B: {messages} messages, "
          f"{used / messages * 1e6:.1f} µs of broker CPU each while recorded")  # fmt: skip
    print(top_entries(args.out, args.top))


if __name__ == "__main__":
    main()
