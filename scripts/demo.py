"""``make demo``: the docker-compose demo topology as local processes, with a failover.

Starts, on loopback with free ports and data under ``--data-dir``:

- a one-member etcd (``scripts/etcd_local.py``; Debian's ``etcd-server``): enough to show
  the election; production runs three members (docs/ha.md), since with one the group
  masters fence themselves as soon as etcd is gone;
- a name server;
- for each of broker-a and broker-b a master (broker id 0) and a replica (broker id 1),
  ``--replication sync --min-insync-replicas 2 --etcd-endpoints …``: a SEND_OK means both
  brokers of the group hold the message, so the failover can lose none of them, and the
  demo checks that it did not.

It waits until each master has its replica in sync, creates the demo topic, runs the demo
producer, a push consumer that fails some messages on purpose and a simple consumer. After
``--kill-after`` seconds of producing it ``kill -9``s broker-a's master: broker-a's replica
is elected by itself through etcd (about the lease TTL, 3 s, later); the clients keep
going (sends move to broker-b meanwhile, every client follows the new master through the
name server). A sync group of one master and one replica then refuses sends (no replica
left to copy them), so the demo does what the operator would: it restarts the killed
broker as the new master's replica (``--broker-id 2``, its ``config/haRole`` removed:
docs/ha.md) and broker-a takes sends again once that replica is in sync.

The producer runs at least ``--seconds`` and ``--after-rejoin`` seconds past the rejoin,
the consumers ``--drain`` seconds more (longer, bounded, until the simple consumer has
received every SEND_OK message). Then it stops every process it started (by pid: SIGTERM,
then SIGKILL after a grace period), counts the dead letters, runs the analytics job over
the brokers' latency events and prints where the report is.

    python -m scripts.demo [--seconds 60] [--short] [--data-dir data/demo] [--no-analytics]

``--short`` is the mode the end-to-end test uses: a few seconds around the failover, a low
reconsume limit so dead letters appear quickly. The last line printed is a JSON summary;
its ``failover`` part has the kill → elected time (from the replica's "elected master" log
line), the messages acknowledged before and after the kill, and ``lost``: SEND_OK
messages the simple consumer never received (must be 0; the exit status is 1 otherwise).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scripts import etcd_local

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "DemoTopic"
PUSH_GROUP = "demo_push"
SIMPLE_GROUP = "demo_simple"
GROUPS = ("broker-a", "broker-b")
#: The group whose master the demo kills.
VICTIM = "broker-a"
#: The master lease (docs/ha.md): a killed master is replaced about this long after.
LEASE_TTL_S = 3
_PORT = re.compile(r'"port": ?(\d+)|port=(\d+)')
_START_TIMEOUT = 30.0
_STOP_GRACE = 15.0
#: Upper bound of a wait for a log line (an election, a replica in sync) on a loaded
#: 2-core machine; they usually take a few seconds.
_EVENT_TIMEOUT = 90.0
_SEGMENT_SIZE = 64 << 20
#: Upper bound of the clients' own run: they normally end on their stop file, much sooner.
_CLIENT_BOUND_S = 600.0
ETCD_MISSING = (
    "make demo needs etcd for the replicas' automatic failover, and `etcd` is not on PATH.\n"
    "Install it (Debian/Ubuntu: apt-get install etcd-server; `make unit` does it) and run "
    "make demo again."
)

Event = dict[str, Any]


@dataclass
class Proc:
    """A process this launcher started (and only those are ever signalled)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int = 0
    exit_code: int | None = field(default=None)


@dataclass
class Group:
    """One broker group: its master, its replica, and where the killed master rejoins."""

    name: str
    master: Proc
    replica: Proc
    rejoined: Proc | None = None


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


def log_events(proc: Proc) -> Iterator[Event]:
    """The JSON log lines of ``proc`` so far (a broker logs JSON when not on a terminal)."""
    for line in proc.log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield obj


def wait_event(
    proc: Proc, match: Callable[[Event], bool], what: str, timeout: float = _EVENT_TIMEOUT
) -> Event:
    """The first log line of ``proc`` that ``match``es, waiting for it (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded
        for event in log_events(proc):
            if match(event):
                return event
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited before {what}: see {proc.log}")
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name}: no {what} within {timeout} s (see {proc.log})")


def in_sync(*broker_ids: int) -> Callable[[Event], bool]:
    """Matches a master's "in-sync set" line that names every one of ``broker_ids``."""

    def match(event: Event) -> bool:
        members = event.get("members")
        return (
            event.get("event") == "in-sync set"
            and isinstance(members, list)
            and set(broker_ids) <= set(members)
        )

    return match


def elected(event: Event) -> bool:
    return event.get("event") == "elected master"


def log_time(event: Event) -> float:
    """The Unix time of a log line (structlog's ISO UTC timestamp)."""
    stamp = str(event["timestamp"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


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


def sleep_until(when: float) -> None:
    """Sleep until monotonic time ``when`` (one sleep, not a loop)."""
    time.sleep(max(0.0, when - time.monotonic()))


def read_acked(path: Path) -> list[Event]:
    """The producer's SEND_OK lines ``{"n", "broker", "t"}`` (a torn last line skipped)."""
    found: list[Event] = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


def read_received(path: Path) -> set[int]:
    """The message numbers the simple consumer received."""
    if not path.exists():
        return set()
    return {int(n) for n in path.read_text().split() if n.isdigit()}


def wait_first_ack(producer: Proc, acked_file: Path, timeout: float = _EVENT_TIMEOUT) -> float:
    """The monotonic time the producer's first SEND_OK was seen (waited for, bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded
        if acked_file.exists() and acked_file.stat().st_size > 0:
            return time.monotonic()
        if producer.popen.poll() is not None:
            raise RuntimeError(f"the producer exited before any SEND_OK: see {producer.log}")
        time.sleep(0.1)
    raise RuntimeError(f"no SEND_OK within {timeout} s: see {producer.log}")


def broker_argv(
    name: str, broker_id: int, label: str, data: Path, namesrv: str, endpoints: str
) -> list[str]:
    """A broker of group ``name`` with automatic failover; ``label`` names its directories."""
    # Any free ports, the gRPC front end's and the HA port's too (--port 0 makes the HA
    # port any free one): four brokers cannot share 8081 or 10912.
    return [sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", "0",
            "--grpc-port", "0", "--broker-name", name, "--broker-id", str(broker_id),
            "--data-dir", str(data / label), "--namesrv-addr", namesrv,
            "--metrics-dir", str(data / "events" / label), "--register-interval-s", "5",
            "--replication", "sync", "--min-insync-replicas", "2",
            "--etcd-endpoints", endpoints,
            "--etcd-lease-ttl-s", str(LEASE_TTL_S)]  # fmt: skip


def fail_over(
    stack: ExitStack, group: Group, start: Callable[[str, int, str], Proc], data: Path
) -> dict[str, Any]:
    """``kill -9`` the group's master, wait for its replica's election, restart the killed
    broker as the new master's replica and wait until it is in sync."""
    killed = group.master
    kill_time = time.time()
    killed.popen.kill()  # SIGKILL to our own child, by its pid: no lease revoke, no flush
    killed.popen.wait(30)
    won = wait_event(group.replica, elected, "election")
    elected_s = log_time(won) - kill_time
    print(f"{group.name}: master killed; {group.replica.name} elected after {elected_s:.2f} s")
    # The operator's step (docs/ha.md): the old master's data comes back as a replica.
    # Without config/haRole and with a new broker id it follows the elected master,
    # cutting back any tail of its log nobody copied (none here: sync replication).
    (data / group.name / "config" / "haRole").unlink(missing_ok=True)
    group.rejoined = stack.enter_context(running(start(group.name, 2, group.name)))
    wait_started(group.rejoined, "broker started")
    back = wait_event(group.replica, in_sync(1, 2), "the rejoined replica in sync")
    rejoined_s = log_time(back) - kill_time
    print(f"{group.name}: the killed broker is back as a replica, in sync {rejoined_s:.2f} s "
          "after the kill")  # fmt: skip
    return {
        "group": group.name,
        "killed": killed.name,
        "killed_exit": killed.popen.returncode,
        "kill_time": kill_time,
        "new_master": group.replica.name,
        "epoch": won.get("epoch"),
        "elected_s": round(elected_s, 3),
        "rejoined": group.rejoined.name,
        "rejoined_in_sync_s": round(rejoined_s, 3),
    }


def traffic_report(failover: dict[str, Any], acked: list[Event], received: set[int]) -> None:
    """Add to ``failover`` what the producer and the simple consumer saw around the kill."""
    kill_time = float(failover["kill_time"])
    before = [a for a in acked if a["t"] < kill_time]
    after = [a for a in acked if a["t"] >= kill_time]
    per_broker: dict[str, int] = {}
    for a in after:
        per_broker[a["broker"]] = per_broker.get(a["broker"], 0) + 1
    back = [a["t"] for a in after if a["broker"] == failover["group"]]
    missing = sorted({int(a["n"]) for a in acked} - received)
    failover.update(
        sent_before_kill=len(before),
        sent_after_kill=len(after),
        sent_after_kill_per_broker=per_broker,
        # Kill → broker-a's first SEND_OK again (its new master needs its replica back).
        group_writes_again_s=round(min(back) - kill_time, 3) if back else None,
        acked=len(acked),
        received_distinct=len(received),
        lost=len(missing),
        lost_numbers=missing[:20],
    )


def run_demo(args: argparse.Namespace) -> dict[str, Any]:
    data: Path = args.data_dir
    shutil.rmtree(data, ignore_errors=True)
    logs, events = data / "logs", data / "events"
    logs.mkdir(parents=True)
    py = sys.executable
    summary: dict[str, Any] = {"data_dir": str(data)}
    stop_producer, stop_consumers = data / "stop-producer", data / "stop-consumers"
    acked_file, received_file = data / "acked.jsonl", data / "received.txt"
    began = time.monotonic()
    with ExitStack() as stack:
        etcd = etcd_local.EtcdCluster.start(data / "etcd", members=1)
        stack.callback(etcd.stop)
        ns = stack.enter_context(running(spawn(
            "namesrv", [py, "-m", "broker.namesrv", "--host", "127.0.0.1", "--port", "0"], logs
        )))  # fmt: skip
        namesrv = f"127.0.0.1:{wait_started(ns, 'namesrv started')}"

        def start(name: str, broker_id: int, label: str) -> Proc:
            argv = broker_argv(name, broker_id, label, data, namesrv, etcd.endpoints)
            # Settings without a flag: the broker's retry limit, low so that the DLQ shows;
            # 64 MiB commit-log segments instead of 1 GiB, so that five brokers' logs do
            # not claim 5 GiB of disk for a demo (the same in every broker of a group: a
            # replica copies its master's log byte for byte).
            env = {
                "TRIMQ_MAX_RECONSUME_TIMES": str(args.max_reconsume),
                "TRIMQ_SEGMENT_SIZE": str(_SEGMENT_SIZE),
            }
            log_name = f"{label}-rejoined" if broker_id > 1 else label
            return spawn(log_name, argv, logs, **env)

        # Masters enter the stack first so that they are stopped last: a replica whose
        # master stopped (revoking its lease) would win an election during the shutdown.
        masters = {n: stack.enter_context(running(start(n, 0, n))) for n in GROUPS}
        replicas = {n: stack.enter_context(running(start(n, 1, f"{n}-replica"))) for n in GROUPS}
        groups = {n: Group(n, masters[n], replicas[n]) for n in GROUPS}
        for proc in [*masters.values(), *replicas.values()]:
            wait_started(proc, "broker started")
        for group in groups.values():
            # A sync master refuses sends until its replica follows it.
            wait_event(group.master, in_sync(0, 1), "its replica in sync")
        summary["started_s"] = round(time.monotonic() - began, 2)
        common = ["--namesrv", namesrv, "--topic", TOPIC]
        setup = client("setup", ["setup", *common, "--brokers", "2", "--replicas", "1"], logs)
        if setup.popen.wait(_START_TIMEOUT * 2) != 0:
            raise RuntimeError(f"setup failed: {setup.log.read_text()[-2000:]}")
        bound = str(_CLIENT_BOUND_S)
        clients = [
            client("push-consumer", ["push-consume", *common, "--group", PUSH_GROUP,
                                     "--fail-every", "10", "--seconds", bound,
                                     "--stop-file", str(stop_consumers),
                                     "--retry-seconds", str(args.retry_seconds)], logs),
            client("simple-consumer", ["simple-consume", *common, "--group", SIMPLE_GROUP,
                                       "--seconds", bound, "--stop-file", str(stop_consumers),
                                       "--received-file", str(received_file)], logs),
        ]  # fmt: skip
        time.sleep(1.0)  # consumers subscribed before the first message
        producer = client("producer", ["produce", *common, "--rate", str(args.rate),
                                       "--seconds", bound, "--stop-file", str(stop_producer),
                                       "--acked-file", str(acked_file)], logs)  # fmt: skip
        clients.append(producer)
        for proc in clients:
            stack.enter_context(running(proc))
        # "After N seconds of producing" counts from the first SEND_OK: a loaded machine
        # can take seconds to start the producer's interpreter and connect.
        producing = wait_first_ack(producer, acked_file)
        # The kill comes after the replicas' first metadata copy since setup (every 3 s:
        # the topic, the groups' offsets), as in a cluster that has been up a while.
        sleep_until(producing + max(4.0, args.kill_after))
        failover = fail_over(stack, groups[VICTIM], start, data)
        sleep_until(max(producing + args.seconds, time.monotonic() + args.after_rejoin))
        stop_producer.touch()
        producer.popen.wait(_START_TIMEOUT * 2)
        acked = read_acked(acked_file)
        # Drain: at least --drain seconds (the push consumer's retries reach the DLQ), more
        # while the simple consumer still misses an acknowledged message (bounded).
        drained = time.monotonic() + args.drain
        deadline = drained + 60
        wanted = {int(a["n"]) for a in acked}
        simple = clients[1]
        while time.monotonic() < deadline and simple.popen.poll() is None:  # bounded
            if time.monotonic() >= drained and wanted <= read_received(received_file):
                break
            time.sleep(0.5)
        stop_consumers.touch()
        for proc in clients:
            proc.popen.wait(_START_TIMEOUT * 2)
            summary[proc.name] = last_json(proc)
        traffic_report(failover, acked, read_received(received_file))
        summary["failover"] = failover
        dlq = client(
            "dlq-count", ["count", "--namesrv", namesrv, "--topic", f"%DLQ%{PUSH_GROUP}"], logs
        )
        dlq.popen.wait(60)
        summary["dlq"] = last_json(dlq)
    # Every process stopped by the demo (the killed master is in failover.killed_exit).
    stopped = [ns, *replicas.values(), *clients]
    stopped += [g.rejoined for g in groups.values() if g.rejoined is not None]
    stopped += [m for m in masters.values() if m is not groups[VICTIM].master]
    summary["exit_codes"] = {p.name: p.exit_code for p in stopped}
    summary["events_dir"] = str(events)
    summary["demo_s"] = round(time.monotonic() - began, 2)
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
    ap.add_argument("--seconds", type=float, default=60.0, help="the producer runs this long")
    ap.add_argument("--kill-after", type=float, default=None,
                    help="kill broker-a's master after this many seconds of producing "
                         "(default: a third of --seconds, at least 4)")  # fmt: skip
    ap.add_argument("--after-rejoin", type=float, default=10.0,
                    help="the producer runs at least this long after the killed broker "
                         "is back in sync")  # fmt: skip
    ap.add_argument("--drain", type=float, default=20.0, help="consumers run this much longer")
    ap.add_argument("--rate", type=float, default=50.0, help="messages per second")
    ap.add_argument("--max-reconsume", type=int, default=3, help="then the DLQ")
    ap.add_argument("--retry-seconds", type=float, default=1.0, help="push consumer back-off")
    ap.add_argument("--short", action="store_true", help="a few seconds (the e2e test)")
    ap.add_argument("--no-analytics", action="store_true")
    args = ap.parse_args(argv)
    if args.short:
        args.seconds, args.drain, args.rate, args.after_rejoin = 6.0, 10.0, 40.0, 3.0
    if args.kill_after is None:
        args.kill_after = max(4.0, args.seconds / 3)
    if etcd_local.ETCD is None:
        print(ETCD_MISSING, file=sys.stderr)
        return 2
    summary = run_demo(args)
    print(f"events: {summary['events_dir']}")
    if "report" in summary:
        print(f"report: {summary['report']} (analytics exit {summary['analytics_exit']})")
    failover = summary["failover"]
    print(f"failover: {failover['new_master']} elected {failover['elected_s']} s after the "
          f"kill; {failover['lost']} of {failover['acked']} SEND_OK messages lost")  # fmt: skip
    line = json.dumps(summary, sort_keys=True)
    (args.data_dir / "summary.json").write_text(line + "\n")  # for a look afterwards
    print(line)
    if failover["lost"]:
        return 1
    return 0 if summary.get("analytics_exit", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
