"""A 3-member etcd cluster on loopback for the failover tests (docs/ha.md).

Each member is an ``etcd`` process (Debian's 3.4, ``make test`` installs it) with its data
directory under the test's temp dir and free loopback ports; the fixture stops every
member it started by its pid (SIGTERM, then SIGKILL after a bound). Without ``etcd`` on
the PATH the tests that use it are skipped with that reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ETCD = shutil.which("etcd")
requires_etcd = pytest.mark.skipif(
    ETCD is None, reason="etcd is not installed (make test installs Debian's etcd-server)"
)

#: Upper bound for a cluster to elect its leader and answer (a slow machine; usually ~1 s).
START_BOUND_S = 60.0


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held open together while picked)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class EtcdCluster:
    """The members' client endpoints and processes."""

    root: Path
    client_ports: list[int]
    peer_ports: list[int]
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def endpoints(self) -> str:
        """For ``--etcd-endpoints``."""
        return ",".join(f"http://127.0.0.1:{p}" for p in self.client_ports)

    def start_member(self, index: int) -> None:
        assert ETCD is not None
        name = f"m{index}"
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(self.peer_ports))
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 (closed with the process)
        self.procs[index] = subprocess.Popen(
            [
                ETCD,
                "--name", name,
                "--data-dir", str(self.root / name),
                "--listen-client-urls", f"http://127.0.0.1:{self.client_ports[index]}",
                "--advertise-client-urls", f"http://127.0.0.1:{self.client_ports[index]}",
                "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[index]}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[index]}",
                "--initial-cluster", initial,
                "--initial-cluster-token", f"trimq-{self.root.name}",
                "--initial-cluster-state", "new",
                # Loopback: a short heartbeat keeps its own elections quick.
                "--heartbeat-interval", "100",
                "--election-timeout", "1000",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

    def kill_member(self, index: int) -> None:
        """``kill -9`` one member (by its pid)."""
        proc = self.procs.pop(index)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop every member this fixture started, by pid."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for index, proc in list(self.procs.items()):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            del self.procs[index]

    def wait_healthy(self) -> None:
        """Until every member answers /health with a leader (bounded)."""
        import urllib.request

        deadline = time.monotonic() + START_BOUND_S
        pending = set(range(len(self.client_ports)))
        while pending:  # bounded by the deadline
            for index in sorted(pending):
                url = f"http://127.0.0.1:{self.client_ports[index]}/health"
                try:
                    with urllib.request.urlopen(url, timeout=2) as reply:
                        if b'"true"' in reply.read():
                            pending.discard(index)
                except OSError:
                    pass
            if pending and time.monotonic() > deadline:
                logs = {p.name: p.read_text()[-800:] for p in self.root.glob("*.log")}
                raise AssertionError(f"etcd members {pending} not healthy: {logs}")
            if pending:
                time.sleep(0.1)


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """Three etcd members on loopback, stopped by pid after the test."""
    if ETCD is None:
        pytest.skip("etcd is not installed (make test installs Debian's etcd-server)")
    ports = free_ports(6)
    cluster = EtcdCluster(tmp_path / "etcd", ports[:3], ports[3:])
    cluster.root.mkdir()
    try:
        for index in range(3):
            cluster.start_member(index)
        cluster.wait_healthy()
        yield cluster
    finally:
        cluster.stop()
