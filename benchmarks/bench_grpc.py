"""The official RocketMQ 5 Python client against trimq's gRPC front end, side by side with the
same client against a do-nothing ``grpc.aio`` server in the same run.

What it shows: the official client's (``rocketmq-python-client`` 5.1.2, in
``.interop/py-grpc``) throughput against trimq, and trimq's server CPU per unary call and per
streamed message, next to the client's own ceiling measured against
``benchmarks/grpc_null_server.py`` (grpcio's C core, answers without storing anything). The
aims: server CPU ≤ 250 µs per unary call and ≤ 25 µs per streamed message; the official
client, not trimq, is the bottleneck (trimq/null close to 1).

Workloads (``benchmarks/grpc_bench_client.py``, one client process per server per round, in
the client's venv, ``HOME`` a scratch dir):

* ``send_sync``: ``producer.send`` one at a time (one SendMessage unary call each);
* ``send_async``: ``producer.send_async`` with a sliding window of ``--window`` in flight;
* ``receive_ack``: SimpleConsumer ``receive(32, …)`` + ``ack`` each (a ReceiveMessage stream
  per 32 messages and an AckMessage unary call per message);
* ``receive_only``: the same receives without acks, in another group: the cost of a
  streamed message (one stream per 32, amortised in). Its messages are invisible for an hour
  and acked after the timed loop (not measured): left in flight they would
  be revived, or checkpointed as leases, while later workloads are measured.

trimq runs as ``python -m broker --port 0 --grpc-port 0`` with its own data dir in a temp dir;
the receive topic of each round is pre-filled over Remoting (this repo's client,
``send_batch``) before the client starts. Server CPU is the delta of ``/proc/<pid>/stat``
utime+stime across each timed loop (the client waits for a ``go`` on stdin after setting up,
so start-up, routes and topic creation are outside it), divided by the messages of the loop;
the client process's CPU the same way. The two servers run side by side for the whole run
and are used in turn, round by round (the order alternating), so both see the same noise.
The derived ``ack`` row is (CPU of receive_ack − receive_only's CPU per message × messages)
/ acks: the cost of one AckMessage call.

``--baseline-root CHECKOUT`` runs a second trimq, the broker of another checkout (``base``),
side by side in the same run: the three servers take turns round by round (the order
rotating), and the report adds trimq's CPU against base's, round by round. On a shared
machine that is a fairer before/after than separate runs, whose noise differs.

``--profile FILE`` then records trimq under ``--profile-workloads`` (default ``send_sync``)
with py-spy (``--py-spy``, raw format, 200 Hz, ``--profile-seconds``) into
``FILE.<workload>.txt`` and prints the top self and inclusive costs.

Usage: python -m benchmarks.bench_grpc [--rounds 5] [--n-sync 2000] [--n-async 6000]
    [--n-recv 3008] [--profile /tmp/grpc-profile [--profile-gil]] [--broker-root CHECKOUT]
    [--baseline-root OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio

from benchmarks.bench_broker import proc_cpu_seconds, write_row
from client.config import ClientConfig
from client.message import Message
from client.producer import Producer

ROOT = Path(__file__).resolve().parent.parent
CLIENT_SCRIPT = ROOT / "benchmarks" / "grpc_bench_client.py"
NULL_SCRIPT = ROOT / "benchmarks" / "grpc_null_server.py"
PY_SPY = Path("/tmp/pyspy/bin/py-spy")
WORKLOADS = ("send_sync", "send_async", "receive_ack", "receive_only")
TARGETS = ("trimq", "base", "null")
STARTUP_TIMEOUT = 60.0
#: Aims of the issue, µs of server CPU.
AIM_UNARY_US = 250.0
AIM_STREAMED_US = 25.0
PREFILL_BATCH = 256
#: How long the idle servers' own CPU use is measured before the rounds.
IDLE_SECONDS = 3.0


# ---------------------------------------------------------------- machine
def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def proc_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds used so far by process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return float(total - idle), float(total)


# ---------------------------------------------------------------- processes
def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM the process we started (by its pid), SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def wait_for_line(path: Path, proc: subprocess.Popen[Any], marker: str) -> dict[str, Any]:
    """The first JSON line of ``path`` containing ``marker``, within STARTUP_TIMEOUT."""
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if marker in line:
                with suppress(ValueError):
                    fields: dict[str, Any] = json.loads(line)
                    return fields
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited: {path.read_text()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"no {marker!r} line within {STARTUP_TIMEOUT} s: {path}")


def official_client_python(given: Path | None) -> Path:
    """``given``, or the python of the official client's interop venv (made if missing)."""
    if given is not None:
        return given
    from scripts.interop_setup import ensure

    python = ensure("py-grpc").python
    assert python is not None
    return Path(python)


@contextmanager
def trimq_server(
    work: Path, root: Path | None = None, name: str = "broker"
) -> Iterator[tuple[int, int, int]]:
    """``python -m broker`` (of checkout ``root``, default this one) on 127.0.0.1 with free
    Remoting and gRPC ports and a data dir in ``work`` (``name``-data, its log ``name``.log);
    yields (pid, port, grpc_port) from its started line; stopped by pid."""
    log_path = work / f"{name}.log"
    argv = [sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--grpc-port", "0", "--data-dir", str(work / f"{name}-data")]
    env = {**os.environ, "TRIMQ_SEGMENT_SIZE": str(256 * 1024 * 1024)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=root or ROOT, env=env, stdout=log, stderr=log)
    try:
        started = wait_for_line(log_path, proc, '"broker started"')
        yield proc.pid, int(started["port"]), int(started["grpc_port"])
    finally:
        stop(proc)


@contextmanager
def null_server(
    python: Path, env: dict[str, str], work: Path, size: int
) -> Iterator[tuple[int, int]]:
    """The do-nothing grpc.aio server in the client venv; yields (pid, port)."""
    log_path = work / "null-server.log"
    argv = [str(python), str(NULL_SCRIPT), "--port", "0", "--size", str(size)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdout=log, stderr=log)
    try:
        started = wait_for_line(log_path, proc, '"null server started"')
        yield proc.pid, int(started["port"])
    finally:
        stop(proc)


class ClientProcess:
    """``grpc_bench_client.py`` in the client venv, driven over stdin/stdout: its ``@@`` JSON
    events arrive through a reader thread, so every wait is bounded."""

    def __init__(self, python: Path, env: dict[str, str], work: Path, args: Sequence[str]):
        self.log = (work / "client.log").open("ab")
        self.proc = subprocess.Popen(
            [str(python), str(CLIENT_SCRIPT), "--stdin-go", *args],
            cwd=work,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.tail: collections.deque[str] = collections.deque(maxlen=20)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        out: IO[bytes] | None = self.proc.stdout
        assert out is not None
        for raw in out:
            line = raw.decode(errors="replace").rstrip("\n")
            if line.startswith("@@ "):
                self.events.put(json.loads(line[3:]))
            else:
                self.tail.append(line)
        self.events.put(None)

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        try:
            got = self.events.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"client: no {event!r} within {timeout} s") from None
        if got is None or got.get("event") != event:
            raise RuntimeError(f"client: expected {event!r}, got {got!r}; {list(self.tail)}")
        return got

    def go(self) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(b"go\n")
        stdin.flush()

    def close(self) -> None:
        if self.proc.stdin is not None:
            with suppress(OSError):
                self.proc.stdin.close()  # a client still waiting for "go" exits
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # our own child
            self.proc.wait(10)
        self.log.close()


# ---------------------------------------------------------------- pre-fill over Remoting
async def prefill(address: str, topic: str, n: int, size: int) -> None:
    body = b"x" * size
    async with Producer(ClientConfig(namesrv_addr=address, request_timeout=30.0)) as producer:
        sent = 0
        while sent < n:
            k = min(PREFILL_BATCH, n - sent)
            await producer.send_batch([Message(topic, body, tag="bench")] * k)
            sent += k


# ---------------------------------------------------------------- one session
@dataclass(frozen=True)
class Target:
    name: str
    pid: int
    endpoint: str
    #: A trimq's Remoting port (receive topics are pre-filled through it); None for null.
    remoting_port: int | None = None


def run_session(
    python: Path,
    env: dict[str, str],
    work: Path,
    target: Target,
    client_args: Sequence[str],
    workloads: Sequence[str],
    timeout: float,
    on_go: Callable[[str], None] | None = None,
    no_settle: bool = False,
) -> list[dict[str, Any]]:
    """One client process against ``target`` running ``workloads`` in turn; one row per
    workload with the server's and the client's CPU across its timed loop."""
    args = [*client_args, "--workloads", ",".join(workloads)]
    args += ["--no-settle"] if no_settle else []
    client = ClientProcess(python, env, work, args)
    rows: list[dict[str, Any]] = []
    try:
        for workload in workloads:
            ready = client.expect("ready", STARTUP_TIMEOUT)
            cpid = int(ready["pid"])
            s0, c0, m0 = proc_cpu_split(target.pid), proc_cpu_seconds(cpid), machine_busy()
            client.go()
            if on_go is not None:
                on_go(workload)
            result = client.expect("result", timeout)
            s1, c1, m1 = proc_cpu_split(target.pid), proc_cpu_seconds(cpid), machine_busy()
            if workload == "receive_only" and not no_settle:
                settled = client.expect("settled", timeout)
                if settled["failed"]:
                    print(f"[{target.name}] {settled['failed']} acks after receive_only failed")
            msgs = max(1, int(result["msgs"]))
            server = sum(s1) - sum(s0)
            seconds = float(result["seconds"])
            busy = (m1[0] - m0[0]) / max(1.0, m1[1] - m0[1]) * (os.cpu_count() or 1)
            rows.append(
                {
                    **result,
                    "target": target.name,
                    "server_cpu_s": server,
                    "server_us_per_msg": server * 1e6 / msgs,
                    "server_sys_share": (s1[1] - s0[1]) / server if server else 0.0,
                    "server_cores": server / seconds,
                    "client_us_per_msg": (c1 - c0) * 1e6 / msgs,
                    "client_cores": (c1 - c0) / seconds,
                    "machine_busy_cores": busy,
                }
            )
        client.expect("bye", 60)
    finally:
        client.close()
    return rows


# ---------------------------------------------------------------- report
def median_of(rows: Sequence[dict[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def ack_call_us(rows: Sequence[dict[str, Any]]) -> list[float]:
    """Per round: (receive_ack CPU − receive_only's per message × messages) / acks."""
    out = []
    by_round: dict[int, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for r in rows:
        by_round[int(r["round"])][str(r["workload"])] = r
    for per in by_round.values():
        if "receive_ack" in per and "receive_only" in per and per["receive_ack"]["acks"]:
            ack, only = per["receive_ack"], per["receive_only"]
            extra = ack["server_cpu_s"] - only["server_us_per_msg"] / 1e6 * ack["msgs"]
            out.append(extra * 1e6 / ack["acks"])
    return out


def fmt_runs(vals: Sequence[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in vals)


def print_report(rows: list[dict[str, Any]], workloads: Sequence[str]) -> None:
    def sel(target: str, workload: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["target"] == target and r["workload"] == workload]

    print()
    print("| workload | trimq msgs/s (runs) | null msgs/s (runs) | trimq / null "
          "| trimq server CPU µs/msg | null server CPU µs/msg "
          "| client CPU µs/msg trimq / null | trimq server cores (system share) |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---|---:|")
    for wl in workloads:
        t, n = sel("trimq", wl), sel("null", wl)
        tm, nm = median_of(t, "msgs_per_s"), median_of(n, "msgs_per_s")
        print(
            f"| {wl} | {tm:,.0f} ({fmt_runs([r['msgs_per_s'] for r in t])}) "
            f"| {nm:,.0f} ({fmt_runs([r['msgs_per_s'] for r in n])}) | {tm / nm:.2f} "
            f"| {median_of(t, 'server_us_per_msg'):.0f} | {median_of(n, 'server_us_per_msg'):.0f} "
            f"| {median_of(t, 'client_us_per_msg'):.0f} / {median_of(n, 'client_us_per_msg'):.0f} "
            f"| {median_of(t, 'server_cores'):.2f} ({median_of(t, 'server_sys_share'):.0%}) |"
        )
    if any(r["target"] == "base" for r in rows):
        print_baseline(rows, workloads)
    for target in TARGETS:
        acks = ack_call_us([r for r in rows if r["target"] == target])
        if acks:
            print(f"{target}: server CPU per AckMessage call (derived) µs: "
                  f"median {statistics.median(acks):.0f} (runs {fmt_runs(acks)})")  # fmt: skip
    unary = median_of(sel("trimq", "send_sync"), "server_us_per_msg")
    streamed = median_of(sel("trimq", "receive_only"), "server_us_per_msg")
    verdict = "met" if unary <= AIM_UNARY_US else "MISSED"
    print(f"aim: trimq server CPU per unary call (send_sync) {unary:.0f} µs "
          f"<= {AIM_UNARY_US:.0f}: {verdict}")  # fmt: skip
    verdict = "met" if streamed <= AIM_STREAMED_US else "MISSED"
    print(f"aim: trimq server CPU per streamed message (receive_only) {streamed:.0f} µs "
          f"<= {AIM_STREAMED_US:.0f}: {verdict}")  # fmt: skip
    for wl in workloads:
        ratio = median_of(sel("trimq", wl), "msgs_per_s") / median_of(sel("null", wl), "msgs_per_s")
        print(f"aim: client-bound {wl}: trimq/null {ratio:.2f}")


def print_baseline(rows: list[dict[str, Any]], workloads: Sequence[str]) -> None:
    """trimq against the baseline checkout's broker of the same run: server CPU per message
    round by round, and the ratio of the two in each round (they ran next to each other)."""
    by_key = {(r["target"], r["workload"], int(r["round"])): r for r in rows}
    print()
    print("| workload | trimq server CPU µs/msg (rounds) | base server CPU µs/msg (rounds) "
          "| trimq / base, per round | median trimq / base | trimq / null "
          "| base / null |")  # fmt: skip
    print("|---|---|---|---|---:|---:|---:|")
    for wl in workloads:
        rounds = sorted({k[2] for k in by_key if k[1] == wl})
        cpu = {
            t: [by_key[(t, wl, n)]["server_us_per_msg"] for n in rounds if (t, wl, n) in by_key]
            for t in TARGETS
        }
        paired = [
            by_key[("trimq", wl, n)]["server_us_per_msg"]
            / by_key[("base", wl, n)]["server_us_per_msg"]
            for n in rounds
            if ("trimq", wl, n) in by_key and ("base", wl, n) in by_key
        ]
        med = {t: statistics.median(v) if v else float("nan") for t, v in cpu.items()}
        print(
            f"| {wl} | {med['trimq']:.0f} ({fmt_runs(cpu['trimq'])}) "
            f"| {med['base']:.0f} ({fmt_runs(cpu['base'])}) "
            f"| {', '.join(f'{x:.2f}' for x in paired)} "
            f"| {statistics.median(paired) if paired else float('nan'):.2f} "
            f"| {med['trimq'] / med['null']:.2f} | {med['base'] / med['null']:.2f} |"
        )


# ---------------------------------------------------------------- profile
def frame_key(frame: str) -> str:
    """``func (path/file.py:123)`` -> ``func (file path without line)``, path shortened."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3", str(ROOT) + "/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{name} ({where})" if where else name


def area_of(key: str) -> str:
    """A package-level bucket of a frame key: ``h2``, ``trio``, ``broker/grpc``, ..."""
    where = key.rpartition(" (")[2].rstrip(")")
    parts = where.split("/")
    if parts[0] in ("broker", "protocol", "client") and len(parts) > 2:
        return "/".join(parts[:2])
    if parts[0].startswith(".") and len(parts) > 1:  # stdlib "/lib/python3.11/x.py"
        return "stdlib " + parts[1].removesuffix(".py")
    return parts[0].removesuffix(".py")


def summarize_profile(path: Path, top: int) -> str:
    """Top self and inclusive costs (and self by area) of a py-spy raw (collapsed) file."""
    self_: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    areas: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if " (" in f and not f.startswith("process ")]
        if not frames:
            continue
        total += n
        keys = [frame_key(f) for f in frames]
        self_[keys[-1]] += n
        areas[area_of(keys[-1])] += n
        for k in set(keys):
            incl[k] += n
    if not total:
        return f"{path}: no samples"
    lines = [f"{path}: {total} samples"]
    for title, counter in (("self by area", areas), ("self", self_), ("inclusive", incl)):
        lines.append(f"  top {title}:")
        for key, n in counter.most_common(top):
            lines.append(f"    {100 * n / total:5.1f} %  {key}")
    return "\n".join(lines)


# ---------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--size", type=int, default=128, help="body bytes")
    ap.add_argument("--n-sync", type=int, default=2000)
    ap.add_argument("--n-async", type=int, default=6000)
    ap.add_argument("--window", type=int, default=256, help="send_async futures in flight")
    ap.add_argument("--n-recv", type=int, default=3008, help="messages per receive workload")
    ap.add_argument("--max-seconds", type=float, default=40.0, help="bound of one timed loop")
    ap.add_argument("--client-python", type=Path, default=None,
                    help="python of the official client's venv (default: scripts.interop_setup "
                    "ensure('py-grpc'))")  # fmt: skip
    ap.add_argument(
        "--broker-root",
        type=Path,
        default=None,
        help="run the broker of this checkout (e.g. a clean git worktree)",
    )
    ap.add_argument(
        "--baseline-root",
        type=Path,
        default=None,
        help="also run this checkout's broker ('base') in the same run, in turn with the others",
    )
    ap.add_argument("--profile", type=Path, default=None, help="py-spy output prefix")
    ap.add_argument("--profile-workloads", default="send_sync")
    ap.add_argument("--profile-seconds", type=int, default=10)
    ap.add_argument("--py-spy", type=Path, default=PY_SPY)
    ap.add_argument(
        "--profile-gil",
        action="store_true",
        help="py-spy --gil: samples holding the GIL (Python CPU, not waits)",
    )
    ap.add_argument("--top", type=int, default=15, help="lines per profile table")
    ap.add_argument("--out", default=None, help="JSON-lines file for every row")
    args = ap.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    if unknown := set(workloads) - set(WORKLOADS):
        raise SystemExit(f"unknown workloads {sorted(unknown)}")
    python = official_client_python(args.client_python)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-grpc-")))
        home = work / "home"
        home.mkdir()
        env = {**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("PYTHONPATH", None)
        pid, port, grpc_port = stack.enter_context(trimq_server(work, args.broker_root))
        null_pid, null_port = stack.enter_context(null_server(python, env, work, args.size))
        targets = {
            "trimq": Target("trimq", pid, f"127.0.0.1:{grpc_port}", port),
            "null": Target("null", null_pid, f"127.0.0.1:{null_port}"),
        }
        if args.baseline_root is not None:
            base = stack.enter_context(trimq_server(work, args.baseline_root, "base"))
            targets["base"] = Target("base", base[0], f"127.0.0.1:{base[2]}", base[1])
            print(f"base: {args.baseline_root}, pid {base[0]} grpc {base[2]}", flush=True)
        print(f"trimq pid {pid} grpc {grpc_port} (remoting {port}); null server pid {null_pid} "
              f"port {null_port}; client {python}; loadavg {loadavg()}", flush=True)  # fmt: skip
        idle0 = {name: proc_cpu_seconds(t.pid) for name, t in targets.items()}
        time.sleep(IDLE_SECONDS)
        idle1 = {name: proc_cpu_seconds(t.pid) for name, t in targets.items()}
        idle = ", ".join(
            f"{name} {(idle1[name] - idle0[name]) / IDLE_SECONDS:.3f} cores" for name in targets
        )
        print(f"idle for {IDLE_SECONDS:.0f} s: {idle}", flush=True)
        common = ["--size", str(args.size), "--n-sync", str(args.n_sync)]
        common += ["--n-async", str(args.n_async), "--window", str(args.window)]
        common += ["--n-recv", str(args.n_recv), "--max-seconds", str(args.max_seconds)]
        timeout = args.max_seconds + 60
        receives = {"receive_ack", "receive_only"} & set(workloads)
        rows: list[dict[str, Any]] = []
        t_start = time.monotonic()
        names = [name for name in TARGETS if name in targets]
        for rnd in range(args.rounds):
            # Each server in turn; the order rotates (two servers: alternates) round by round.
            shift = rnd % len(names)
            order = names[shift:] + names[:shift]
            for name in order:
                target = targets[name]
                topic, recv_topic = f"bg_send_r{rnd}", f"bg_recv_r{rnd}"
                if target.remoting_port is not None and receives:
                    anyio.run(prefill, f"127.0.0.1:{target.remoting_port}", recv_topic,
                              args.n_recv + 64, args.size)  # fmt: skip
                client_args = [*common, "--endpoint", target.endpoint, "--topic", topic]
                client_args += ["--recv-topic", recv_topic, "--group", f"bg_r{rnd}"]
                session = run_session(python, env, work, target, client_args, workloads, timeout)
                for row in session:
                    row["round"] = rnd
                    print(f"[{name}] round {rnd} {row['workload']}: "
                          f"{row['msgs_per_s']:,.0f} msgs/s ({row['msgs']} msgs, "
                          f"{row['errors']} errors), server {row['server_us_per_msg']:.0f} µs/msg "
                          f"({row['server_cores']:.2f} cores, "
                          f"{row['server_sys_share']:.0%} system), client "
                          f"{row['client_us_per_msg']:.0f} µs/msg ({row['client_cores']:.2f} "
                          f"cores), machine busy {row['machine_busy_cores']:.2f} cores",
                          flush=True)  # fmt: skip
                    write_row(args.out, row)
                rows.extend(session)
            print(f"round {rnd} done at {time.monotonic() - t_start:.0f} s, "
                  f"loadavg {loadavg()}", flush=True)  # fmt: skip
        print_report(rows, workloads)
        print(f"loadavg at the end {loadavg()}", flush=True)
        if args.profile is not None:
            profile(args, python, env, work, targets["trimq"], port, common)


def profile(
    args: argparse.Namespace,
    python: Path,
    env: dict[str, str],
    work: Path,
    target: Target,
    port: int,
    common: list[str],
) -> None:
    """py-spy on trimq while one client runs each of ``--profile-workloads`` for about
    ``--profile-seconds`` (the loop is bounded by time, not by count)."""
    if not args.py_spy.exists():
        raise SystemExit(f"py-spy not found at {args.py_spy} (--py-spy)")
    seconds = args.profile_seconds
    chosen = [w for w in args.profile_workloads.split(",") if w]
    for workload in chosen:
        out = Path(f"{args.profile}.{workload}.txt")
        topic, recv_topic = f"bg_prof_{workload}", f"bg_prof_recv_{workload}"
        big = str(10**7)
        client_args = [*common, "--n-sync", big, "--n-async", big]
        client_args += ["--endpoint", target.endpoint, "--topic", topic, "--recv-topic", recv_topic]
        client_args += ["--group", f"bg_prof_{workload}", "--max-seconds", str(seconds + 3)]
        if workload.startswith("receive"):
            n = seconds * 8000  # more than the client can take in the time
            anyio.run(prefill, f"127.0.0.1:{port}", recv_topic, n, args.size)
            client_args += ["--n-recv", str(n)]
        spy: list[subprocess.Popen[bytes]] = []

        def start_spy(_: str, out: Path = out, spy: list[subprocess.Popen[bytes]] = spy) -> None:
            argv = [str(args.py_spy), "record", "--pid", str(target.pid), "--format", "raw"]
            argv += ["-o", str(out), "--rate", "200", "-d", str(seconds)]
            argv += ["--gil"] if args.profile_gil else []
            spy.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))

        rows = run_session(
            python,
            env,
            work,
            target,
            client_args,
            [workload],
            seconds + 60,
            on_go=start_spy,
            no_settle=workload == chosen[-1],  # nothing is measured after the last
        )
        for proc in spy:
            try:
                _, err = proc.communicate(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate(timeout=10)
            if proc.returncode:
                print(f"py-spy failed ({proc.returncode}): {err.decode(errors='replace')}")
        row = rows[0]
        print(f"\nprofile {workload}: {row['msgs_per_s']:,.0f} msgs/s, server "
              f"{row['server_us_per_msg']:.0f} µs/msg under py-spy", flush=True)  # fmt: skip
        if out.exists():
            print(summarize_profile(out, args.top), flush=True)


if __name__ == "__main__":
    main()
