"""Peer brokers for ``bench_broker``: Redis and RabbitMQ on loopback, the peer client venv, and
one round of a ``../shared/peer-bench`` script.

A server already answering on its port is used as it is and left running; one started here is
stopped at the end, by pid, with any ``epmd`` its Erlang node left behind. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEER_BENCH = ROOT.parent / "shared" / "peer-bench"
WORK_DIR = ROOT / ".bench-peers"  # gitignored
PEER_PYTHON = WORK_DIR / "venv" / "bin" / "python"
REDIS_PORT = 6390
RABBITMQ_PORT = 5672  # rabbitmq_bench.py connects here
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")

#: import name -> pip requirement (the versions measured in peer-bench's README).
PIP_REQUIREMENTS = {
    "redis": "redis==8.1.0",
    "hiredis": "hiredis==3.5.0",
    "aio_pika": "aio-pika==10.2.1",
}


# ---------------------------------------------------------------- installs
def apt_install(*packages: str) -> None:
    subprocess.run(["apt-get", "update"], check=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", *packages], check=True, timeout=1800)


def ensure_peer_venv(python: Path, modules: Sequence[str]) -> None:
    """Make ``python`` able to import ``modules``: create the default venv under
    :data:`WORK_DIR` if it is missing, then pip-install what it lacks."""
    if not python.exists():
        if python != PEER_PYTHON:
            raise SystemExit(f"peer python {python} does not exist")
        WORK_DIR.mkdir(exist_ok=True)
        venv = [sys.executable, "-m", "venv", str(python.parent.parent)]
        subprocess.run(venv, check=True, timeout=300)
    missing = [
        PIP_REQUIREMENTS[m]
        for m in modules
        if subprocess.run([python, "-c", f"import {m}"], capture_output=True, timeout=60).returncode
    ]
    if missing:
        print(f"installing {' '.join(missing)} into {python}", flush=True)
        pip = [str(python), "-m", "pip", "install", "-q", *missing]
        subprocess.run(pip, check=True, timeout=900)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def stop_pid(pid: int, grace: float = 10.0) -> None:
    """Give ``pid`` ``grace`` s to exit by itself, then SIGTERM it (10 s), then SIGKILL it."""
    for sig, wait in ((None, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if sig is not None:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive(pid):
            return


# ---------------------------------------------------------------- Redis
def redis_cli(port: int, *args: str) -> str:
    """``redis-cli -p port args…`` on loopback; its output ("" when it could not run)."""
    try:
        out = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.decode(errors="replace").strip()


def redis_ping(port: int = REDIS_PORT) -> bool:
    """True if a Redis answers on ``port``."""
    return redis_cli(port, "ping") == "PONG"


@contextmanager
def redis_daemon(port: int, prefix: str = "redis-", *, fsync: bool = False) -> Iterator[int]:
    """Start ``redis-server`` on loopback ``port`` without persistence (``fsync``: with an
    append-only file fsynced before every reply, ``appendfsync always``), wait until it
    answers, yield its pid; shut it down (then stop it by pid) at the end."""
    WORK_DIR.mkdir(exist_ok=True)
    rdir = Path(tempfile.mkdtemp(prefix=prefix, dir=WORK_DIR))
    argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    persist = (
        ["--appendonly", "yes", "--appendfsync", "always"] if fsync else ["--appendonly", "no"]
    )
    argv += [*persist, "--daemonize", "yes", "--dir", str(rdir)]
    argv += ["--pidfile", str(rdir / "redis.pid"), "--logfile", str(rdir / "redis.log")]
    subprocess.run(argv, check=True, timeout=30)
    pid = 0
    try:
        deadline = time.monotonic() + 10
        while not (pid and redis_ping(port)) and time.monotonic() < deadline:
            with suppress(OSError, ValueError):
                pid = int((rdir / "redis.pid").read_text())
            time.sleep(0.1)
        if not pid or not redis_ping(port):
            raise RuntimeError(f"redis-server on port {port} did not start within 10 s")
        yield pid
    finally:
        redis_cli(port, "shutdown", "nosave")
        if pid:
            stop_pid(pid, grace=5)
        shutil.rmtree(rdir, ignore_errors=True)


@contextmanager
def redis_server() -> Iterator[None]:
    """Use the Redis on :data:`REDIS_PORT`, starting it (and stopping it at the end) if needed."""
    if redis_ping():
        yield
        return
    if shutil.which("redis-server") is None:
        apt_install("redis-server", "redis-tools")
    with redis_daemon(REDIS_PORT):
        yield


# ---------------------------------------------------------------- RabbitMQ
def amqp_ping() -> bool:
    """True if an AMQP 0-9-1 broker answers the protocol header on :data:`RABBITMQ_PORT`."""
    try:
        with socket.create_connection(("127.0.0.1", RABBITMQ_PORT), timeout=2) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"  # a method frame: connection.start
    except OSError:
        return False


def epmd_pids(uid: int) -> set[int]:
    """Pids of the ``epmd`` processes owned by ``uid``."""
    pids = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if (
                Path(entry.path, "comm").read_text().strip() == "epmd"
                and entry.stat().st_uid == uid
            ):
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def rabbitmq_env(node_dir: Path) -> dict[str, str]:
    """peer-bench README's environment for a loopback-only node, its state under ``node_dir``."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": "/var/lib/rabbitmq",  # the Erlang cookie
        "RABBITMQ_CONFIG_FILE": str(node_dir / "rabbitmq"),
        "RABBITMQ_NODENAME": "rabbit@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_DIST_PORT": "25672",
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        "RABBITMQ_MNESIA_BASE": str(node_dir / "mnesia"),
        "RABBITMQ_LOG_BASE": str(node_dir / "log"),
    }


@contextmanager
def rabbitmq_server(start_timeout: float = 120.0) -> Iterator[None]:
    """Use the RabbitMQ on 127.0.0.1:5672; if none answers, run a node (as the rabbitmq user,
    state in a temporary dir) for the duration, then stop it and the epmd it started."""
    if amqp_ping():
        yield
        return
    if not (RABBITMQ_BIN / "rabbitmq-server").exists():
        apt_install("rabbitmq-server")
    # the Debian package's files belong to the rabbitmq user; run as it (we may be root)
    user = pwd.getpwnam("rabbitmq") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    WORK_DIR.mkdir(exist_ok=True)
    node_dir = Path(tempfile.mkdtemp(prefix="rabbitmq-", dir=WORK_DIR))
    conf = node_dir / "rabbitmq.conf"
    conf.write_text(
        f"listeners.tcp.default = 127.0.0.1:{RABBITMQ_PORT}\nloopback_users.guest = true\n"
    )
    for path in (node_dir, conf):
        os.chown(path, user.pw_uid, user.pw_gid)
    env = rabbitmq_env(node_dir)
    as_user: dict[str, Any] = {"user": user.pw_uid, "group": user.pw_gid, "env": env}
    epmd_before = epmd_pids(user.pw_uid)
    log_path = node_dir / "out.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(RABBITMQ_BIN / "rabbitmq-server")],
            cwd=node_dir,
            stdout=log,
            stderr=log,
            start_new_session=True,  # its own process group: beam.smp and helpers
            **as_user,
        )
    try:
        deadline = time.monotonic() + start_timeout
        while not amqp_ping() and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"rabbitmq-server exited: {log_path.read_text()[-2000:]}")
            time.sleep(0.25)
        if not amqp_ping():
            raise RuntimeError(f"RabbitMQ did not start within {start_timeout:.0f} s")
        print(f"rabbitmq pid {proc.pid} (node rabbit@localhost, {node_dir})", flush=True)
        yield
    finally:
        stop = [str(RABBITMQ_BIN / "rabbitmqctl"), "stop"]
        with suppress(subprocess.TimeoutExpired):
            subprocess.run(stop, cwd=node_dir, capture_output=True, timeout=60, **as_user)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the script's trap stops the node
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the group we created
                proc.wait(10)
        for pid in epmd_pids(user.pw_uid) - epmd_before:
            stop_pid(pid, grace=0)  # nothing else stops it
        shutil.rmtree(node_dir, ignore_errors=True)


# ---------------------------------------------------------------- peer rounds
@dataclass(frozen=True)
class Peer:
    script: str
    modules: tuple[str, ...]  # what its client imports
    server: Callable[[], AbstractContextManager[None]]  # keeps the server up while entered
    count_flag: str  # messages per read / prefetch, our --count
    extra: tuple[str, ...] = ()


PEERS: dict[str, Peer] = {
    "redis": Peer(
        "redis_streams_bench.py",
        ("redis", "hiredis"),
        redis_server,
        "--count",  # XREADGROUP COUNT
        ("--port", str(REDIS_PORT)),
    ),
    "rabbitmq": Peer("rabbitmq_bench.py", ("aio_pika",), rabbitmq_server, "--prefetch"),
}

#: The peer-bench workloads we compare with; both scripts use these names.
PEER_WORKLOADS = "produce_sync,produce_pipelined,consume_ack,e2e_latency"


def run_peer(
    name: str, peer_python: Path, size: int, options: Sequence[str], count: int
) -> dict[str, Any]:
    """One round (``--runs 1``) of peer ``name`` at ``size``: workload -> its result row.
    ``options`` are ours that the scripts take too; ``count`` is messages per read."""
    peer = PEERS[name]
    with tempfile.TemporaryDirectory(dir=WORK_DIR) as tmp:
        out = Path(tmp) / f"{name}.jsonl"
        argv = [str(peer_python), str(PEER_BENCH / peer.script), *peer.extra, "--runs", "1"]
        argv += ["--lat-runs", "1", "--sizes", str(size), "--workloads", PEER_WORKLOADS]
        argv += [*options, peer.count_flag, str(count), "--quiet-wait", "0", "--out", str(out)]
        done = subprocess.run(argv, cwd=PEER_BENCH, capture_output=True, timeout=900)
        if done.returncode:
            raise RuntimeError(f"{peer.script} exited {done.returncode}: {done.stderr[-1500:]!r}")
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {str(r["workload"]): r for r in rows}
