"""A 3-member etcd cluster on loopback (docs/ha.md), for the failover tests and the
failover campaign: each member an ``etcd`` process (Debian's 3.4; ``make test`` installs
it) with its data directory under ``root`` and free loopback ports, stopped by its own pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ETCD = shutil.which("etcd")
#: Upper bound for a cluster to elect its leader and answer (a slow machine; usually ~1 s).
START_BOUND_S = 60.0


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (held open together while picked)."""
    socks: list[socket.socket] = []
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

    @classmethod
    def start(cls, root: Path, members: int = 3) -> EtcdCluster:
        """Start ``members`` members under ``root`` and wait until each has a leader.

        Raises:
            FileNotFoundError: ``etcd`` is not installed.
            AssertionError: a member did not become healthy in time (its log is quoted).
        """
        if ETCD is None:
            raise FileNotFoundError("etcd is not installed (apt-get install etcd-server)")
        ports = free_ports(2 * members)
        cluster = cls(root, ports[:members], ports[members:])
        root.mkdir(parents=True, exist_ok=True)
        try:
            for index in range(members):
                cluster.start_member(index)
            cluster.wait_healthy()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @property
    def endpoints(self) -> str:
        """For ``--etcd-endpoints``."""
        return ",".join(f"http://127.0.0.1:{p}" for p in self.client_ports)

    def start_member(self, index: int) -> None:
        assert ETCD is not None
        name = f"m{index}"
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, p in enumerate(self.peer_ports))
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs[index] = subprocess.Popen(
                [
                    ETCD,
                    "--name", name,
                    "--data-dir", str(self.root / name),
                    "--listen-client-urls", f"http://127.0.0.1:{self.client_ports[index]}",
                    "--advertise-client-urls", f"http://127.0.0.1:{self.client_ports[index]}",
                    "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[index]}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{self.peer_ports[index]}",
                    "--initial-cluster", initial,
                    "--initial-cluster-token", f"trimq-{self.root.name}",
                    "--initial-cluster-state", "new",
                    # Loopback: a short heartbeat keeps etcd's own elections quick.
                    "--heartbeat-interval", "100",
                    "--election-timeout", "1000",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def kill_member(self, index: int) -> None:
        """``kill -9`` one member (by its pid)."""
        proc = self.procs.pop(index)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop every member started here, by pid (SIGTERM, then SIGKILL after 10 s)."""
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
