"""``make demo``: the docker-compose demo topology as local processes.

Starts a name server and two brokers (loopback, free ports, data under ``--data-dir``), waits
until both brokers are registered, creates the demo topic on both, runs the demo producer,
a push consumer that fails some messages on purpose and a simple consumer for ``--seconds``,
stops every process it started (by pid: SIGTERM, then SIGKILL after a grace period), checks
that messages flowed, retries happened and dead letters exist, then runs the analytics job
over the brokers' latency events and prints where the report is.

    python -m scripts.demo [--seconds 60] [--short] [--data-dir data/demo] [--no-analytics]

``--short`` is the mode the end-to-end test uses: a few seconds, a low reconsume limit so
dead letters appear quickly. The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "DemoTopic"
PUSH_GROUP = "demo_push"
SIMPLE_GROUP = "demo_simple"
_PORT = re.compile(r'"port": ?(\d+)|port=(\d+)')
_START_TIMEOUT = 30.0
_STOP_GRACE = 15.0


@dataclass
class Proc:
    """A process this launcher started (and only those are ever signalled)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int = 0
    exit_code: int | None = field(default=None)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def spawn(name: str, argv: Sequence[str], logs: Path, **env: str) -> Proc:
    """Start ``argv`` with stdout+stderr to ``logs/name.log`` (``env`` added)."""
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(argv), cwd=ROOT, env={**_env(), **env}, stdout=out, stderr=out
        )
    return Proc(name, popen, log)


def wait_started(proc: Proc, marker: str, timeout: float = _START_TIMEOUT) -> int:
    """Wait for the process's ``marker`` log line; return the port it names."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited: {proc.log.read_text()[-2000:]}")
        for line in proc.log.read_text(errors="replace").splitlines():
            if marker in line and (m := _PORT.search(line)):
                proc.port = int(m[1] or m[2])
                return proc.port
        time.sleep(0.05)
    raise RuntimeError(f"{proc.name} did not log {marker!r} within {timeout} s")


def stop(proc: Proc) -> None:
    """SIGTERM our own child, wait, SIGKILL if it lingers."""
    if proc.popen.poll() is None:
        proc.popen.send_signal(signal.SIGTERM)
        try:
            proc.popen.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait(10)
    proc.exit_code = proc.popen.returncode


@contextmanager
def running(proc: Proc) -> Iterator[Proc]:
    """Stop ``proc`` when the block ends, however it ends."""
    try:
        yield proc
    finally:
        stop(proc)


def client(name: str, args: Sequence[str], logs: Path) -> Proc:
    return spawn(name, [sys.executable, "-m", "scripts.demo_clients", *args], logs)


def last_json(proc: Proc) -> dict[str, Any]:
    """The last JSON object line a demo client printed (its summary)."""
    for line in reversed(proc.log.read_text(errors="replace").splitlines()):
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("event") == "summary":
                return obj
    return {}


def run_demo(args: argparse.Namespace) -> dict[str, Any]:
    data: Path = args.data_dir
    shutil.rmtree(data, ignore_errors=True)
    logs, events = data / "logs", data / "events"
    logs.mkdir(parents=True)
    py = sys.executable
    summary: dict[str, Any] = {"data_dir": str(data)}
    with ExitStack() as stack:
        ns = stack.enter_context(running(spawn(
            "namesrv", [py, "-m", "broker.namesrv", "--host", "127.0.0.1", "--port", "0"], logs
        )))  # fmt: skip
        namesrv = f"127.0.0.1:{wait_started(ns, 'namesrv started')}"
        brokers = []
        for name in ("broker-a", "broker-b"):
            # Any free ports, the gRPC front end's too (two brokers cannot share 8081).
            argv = [py, "-m", "broker", "--host", "127.0.0.1", "--port", "0", "--grpc-port", "0",
                    "--broker-name", name, "--data-dir", str(data / name),
                    "--namesrv-addr", namesrv, "--metrics-dir", str(events / name),
                    "--register-interval-s", "5"]  # fmt: skip
            # The broker's retry limit (a setting without a flag): low, so the DLQ shows.
            limit = str(args.max_reconsume)
            proc = stack.enter_context(
                running(spawn(name, argv, logs, TRIMQ_MAX_RECONSUME_TIMES=limit))
            )
            wait_started(proc, "broker started")
            brokers.append(proc)
        common = ["--namesrv", namesrv, "--topic", TOPIC]
        setup = client("setup", ["setup", *common, "--brokers", "2"], logs)
        if setup.popen.wait(_START_TIMEOUT * 2) != 0:
            raise RuntimeError(f"setup failed: {setup.log.read_text()[-2000:]}")
        seconds = str(args.seconds)
        drain = str(args.seconds + args.drain)
        clients = [
            client("push-consumer", ["push-consume", *common, "--group", PUSH_GROUP,
                                     "--fail-every", "10", "--seconds", drain,
                                     "--retry-seconds", str(args.retry_seconds)], logs),
            client("simple-consumer", ["simple-consume", *common, "--group", SIMPLE_GROUP,
                                       "--seconds", drain], logs),
        ]  # fmt: skip
        time.sleep(1.0)  # consumers subscribed before the first message
        clients.append(client("producer", ["produce", *common, "--rate", str(args.rate),
                                           "--seconds", seconds], logs))  # fmt: skip
        for proc in clients:
            stack.enter_context(running(proc))
        deadline = time.monotonic() + args.seconds + args.drain + 60
        for proc in clients:
            proc.popen.wait(max(1.0, deadline - time.monotonic()))
            summary[proc.name] = last_json(proc)
        dlq = client(
            "dlq-count", ["count", "--namesrv", namesrv, "--topic", f"%DLQ%{PUSH_GROUP}"], logs
        )
        dlq.popen.wait(60)
        summary["dlq"] = last_json(dlq)
    summary["exit_codes"] = {p.name: p.exit_code for p in [ns, *brokers, *clients]}
    summary["events_dir"] = str(events)
    if not args.no_analytics:
        report = data / "report"
        done = subprocess.run(
            [py, "-m", "analytics", "--input", str(events), "--output", str(report)],
            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        (logs / "analytics.log").write_text(done.stdout + done.stderr)
        summary["analytics_exit"] = done.returncode
        summary["report"] = str(report / "report.md")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--data-dir", type=Path, default=ROOT / "data" / "demo")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long the producer runs")
    ap.add_argument("--drain", type=float, default=20.0, help="consumers run this much longer")
    ap.add_argument("--rate", type=float, default=50.0, help="messages per second")
    ap.add_argument("--max-reconsume", type=int, default=3, help="then the DLQ")
    ap.add_argument("--retry-seconds", type=float, default=1.0, help="push consumer back-off")
    ap.add_argument("--short", action="store_true", help="a few seconds (the e2e test)")
    ap.add_argument("--no-analytics", action="store_true")
    args = ap.parse_args(argv)
    if args.short:
        args.seconds, args.drain, args.rate = 4.0, 10.0, 40.0
    summary = run_demo(args)
    print(f"events: {summary['events_dir']}")
    if "report" in summary:
        print(f"report: {summary['report']} (analytics exit {summary['analytics_exit']})")
    print(json.dumps(summary, sort_keys=True))
    return 0 if summary.get("analytics_exit", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
