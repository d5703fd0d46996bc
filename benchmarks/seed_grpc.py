"""Seed 000's experiments 3–5 over gRPC, with the official RocketMQ 5 Python client.

The Remoting experiment (:mod:`benchmarks.seed_experiment`) drives pops by hand; this one
runs the consumers the seed measured: the official SimpleConsumer (experiment 5: 32 messages
at once, invisible 10 s, none acked) and PushConsumer (experiment 3: 32 at once, each failed
once; experiment 4: the same under a steady producer), against one broker subprocess per
``--wake-mode`` (targeted = the fix, topic = V2 before the fix, none = V1 before the fix).
The consumers run in the client's venv (:mod:`benchmarks.grpc_seed_client`); ``--others`` K
more groups long-poll the topic and ack everything.

Figures per row: the time past each retried message's deadline when the client got it
(client clock; the push consumer's deadline is its failure time + the 1 s first back-off, so
that figure includes the client's ChangeInvisibleDuration round trip), the time since the
first delivery (the seed's "time since first failure"), the broker's own ``redeliver``
latency (deadline → re-read by the woken pop, from its latency events), and the wasted
wake-ups (``wakeup`` events with ``found=false``).

Usage::

    python -m benchmarks.seed_grpc [--modes targeted,topic,none]
        [--experiments simple,push,push-steady] [--messages 32] [--rounds 2] [--others 2]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_broker import broker_subprocess
from benchmarks.seed_experiment import percentile
from broker.metrics import read_events
from scripts.interop_setup import ensure

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "benchmarks" / "grpc_seed_client.py"
MODES = ("targeted", "topic", "none")
EXPERIMENTS = {
    # name: (driver scenario, steady rate msg/s, the seed's experiment and figure)
    "simple": ("simple", 0.0, "exp. 5 (after): 14 ms from retry write, 13082 ms since 1st pop"),
    "push": ("push", 0.0, "exp. 3 (before the fix): 19973 ms since first failure"),
    "push-steady": ("push", 1.0, "exp. 4 (after): 8 ms from retry write, 3079 ms since failure"),
}
GROUP = "seed_grpc_group"
#: The longest one driver run may take.
DRIVER_TIMEOUT_S = 300.0


@dataclass
class Row:
    experiment: str
    mode: str
    past_deadline_ms: list[float] = field(default_factory=list)
    since_first_ms: list[float] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    broker_redeliver_ms: list[float] = field(default_factory=list)
    wakeups: int = 0
    wasted: int = 0
    seconds: float = 0.0


def grpc_port_of(log_path: Path) -> int:
    """The ``grpc_port`` of the broker's started line."""
    for line in log_path.read_text().splitlines():
        if "broker started" in line:
            return int(json.loads(line)["grpc_port"])
    raise RuntimeError("no started line")


def run_one(work: Path, experiment: str, mode: str, args: argparse.Namespace) -> Row:
    scenario, rate, _ = EXPERIMENTS[experiment]
    tag = f"{experiment}-{mode}"
    data_dir = work / tag
    metrics_dir = data_dir / "metrics"
    data_dir.mkdir(parents=True)
    env = ensure("py-grpc")
    assert env.python is not None
    row = Row(experiment, mode)
    broker_args = ("--grpc-port", "0", "--wake-mode", mode, "--metrics-dir", str(metrics_dir))
    log_path = work / f"{tag}.log"
    with broker_subprocess(data_dir, log_path, *broker_args, segment_size=64 << 20):
        port = grpc_port_of(log_path)
        home = work / f"{tag}-home"
        home.mkdir()
        argv = [
            str(env.python), "-I", str(DRIVER), scenario, "--endpoint", f"127.0.0.1:{port}",
            "--topic", f"SeedGrpc{experiment.replace('-', '')}", "--group", GROUP,
            "--messages", str(args.messages), "--rounds", str(args.rounds),
            "--others", str(args.others), "--rate", str(rate),
            "--deadline-s", str(DRIVER_TIMEOUT_S - 30),
        ]  # fmt: skip
        proc = subprocess.run(
            argv, env={**os.environ, "HOME": str(home)}, capture_output=True, text=True,
            timeout=DRIVER_TIMEOUT_S, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"driver failed ({proc.returncode}): {proc.stderr[-3000:]}")
        for line in proc.stdout.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("kind") == "redelivered":
                row.past_deadline_ms.append(float(event["past_deadline_ms"]))
                row.since_first_ms.append(float(event["since_first_ms"]))
                row.attempts.append(int(event["attempt"]))
    for e in read_events(metrics_dir):
        if e["kind"] == "redeliver" and e["group"] == GROUP:
            row.broker_redeliver_ms.append(float(e["latency_ms"]))
        elif e["kind"] == "wakeup":
            row.wakeups += 1
            row.wasted += e["found"] is False
    return row


def fmt(values: Sequence[float]) -> str:
    if not values:
        return "-"
    s = sorted(values)
    return f"{percentile(s, 50):.0f} / {percentile(s, 99):.0f} / {s[-1]:.0f}"


def table(rows: Sequence[Row]) -> str:
    out = [
        "| experiment | wake mode | retried | past deadline p50 / p99 / max (ms, client) "
        "| since first delivery p50 (ms) | broker redeliver p50 / p99 (ms) | wake-ups (wasted) "
        "| the seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        since = sorted(r.since_first_ms)
        redeliver = sorted(r.broker_redeliver_ms)
        broker = (
            f"{percentile(redeliver, 50):.1f} / {percentile(redeliver, 99):.1f}"
            if redeliver
            else "-"
        )
        out.append(
            f"| {r.experiment} | {r.mode} | {len(r.past_deadline_ms)} | {fmt(r.past_deadline_ms)} "
            f"| {percentile(since, 50):.0f} | {broker} | {r.wakeups} ({r.wasted}) "
            f"| {EXPERIMENTS[r.experiment][2]} |"
            if since
            else f"| {r.experiment} | {r.mode} | 0 | - | - | {broker} | {r.wakeups} ({r.wasted}) "
            f"| {EXPERIMENTS[r.experiment][2]} |"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--experiments", default=",".join(EXPERIMENTS))
    ap.add_argument("--messages", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--others", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="trimq-seed-grpc-") as tmp:
        for experiment in args.experiments.split(","):
            for mode in args.modes.split(","):
                print(f"[seed-grpc] {experiment} / {mode} ...", file=sys.stderr, flush=True)
                rows.append(run_one(Path(tmp), experiment, mode, args))
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))
    if args.json is not None:
        doc: list[dict[str, Any]] = [r.__dict__ for r in rows]
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
