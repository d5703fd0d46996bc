"""End to end: ``make demo`` in its short mode (a failover included), and the compose file
it mirrors."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yaml"


@pytest.mark.skipif(
    shutil.which("etcd") is None,
    reason="etcd is not installed (make unit installs Debian's etcd-server): the demo's "
    "replicas need it",
)
def test_demo_short_mode(tmp_path: Path) -> None:
    """etcd + name server + two groups of a master and a replica + three clients as
    processes: messages flow over both groups; broker-a's master is killed with -9, its
    replica is elected, the killed broker rejoins as a replica and broker-a takes sends
    again; no SEND_OK message is lost; retries and dead letters appear, the report is
    written (when the analytics extra is installed), every process the demo stopped exited
    0."""
    analytics = importlib.util.find_spec("pyspark") is not None
    argv = [sys.executable, "-m", "scripts.demo", "--short", "--data-dir", str(tmp_path / "demo")]
    if not analytics:
        argv.append("--no-analytics")
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(summary["exit_codes"].values()) == {0}, summary
    produced = summary["producer"]
    assert produced["sent"] > 0 and produced["failed"] == 0, produced
    assert set(produced["per_broker"]) == {"broker-a", "broker-b"}
    failover = summary["failover"]
    assert failover["killed_exit"] == -9
    assert failover["new_master"] == "broker-a-replica"
    # About the lease TTL (3 s); bounded generously for a loaded machine.
    assert 0 < failover["elected_s"] < 30, failover
    assert failover["sent_before_kill"] > 0 and failover["sent_after_kill"] > 0, failover
    # The rejoined replica brought broker-a's writes back (sync: it needs 2 copies).
    assert failover["group_writes_again_s"] is not None, failover
    assert failover["acked"] == produced["sent"]
    assert failover["lost"] == 0, failover
    # A failover redelivers what the replica's offset snapshot had not seen: duplicates.
    assert summary["simple-consumer"]["received"] >= produced["sent"]
    push = summary["push-consumer"]
    assert push["received"] > produced["sent"] and push["retried"] > 0
    assert summary["dlq"]["messages"] > 0
    events = list(Path(summary["events_dir"]).rglob("*.jsonl"))
    assert events, "the brokers wrote no latency events"
    if analytics:
        assert summary["analytics_exit"] == 0
        assert Path(summary["report"]).is_file()


def compose_config() -> dict[str, Any]:
    """docker/compose.yaml as ``docker-compose config`` resolves it (the failover profile's
    service included)."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (make test installs it with apt when it can)")
    done = subprocess.run(
        [exe, "-f", str(COMPOSE), "--profile", "failover", "config"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert isinstance(config, dict)
    return config


def flags(command: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line."""
    return {
        arg: command[i + 1]
        for i, arg in enumerate(command[:-1])
        if arg.startswith("--") and not command[i + 1].startswith("--")
    }


def test_compose_file_is_valid() -> None:
    """``docker-compose config`` (Debian's docker-compose) accepts docker/compose.yaml."""
    services = compose_config()["services"]
    for service in ("etcd", "namesrv", "broker-a", "broker-a-replica", "broker-b",
                    "broker-b-replica", "setup", "producer", "push-consumer",
                    "simple-consumer", "analytics"):  # fmt: skip
        assert service in services
    conditions = {
        c["condition"] for s in services.values() for c in s.get("depends_on", {}).values()
    }
    assert {"service_healthy", "service_completed_successfully"} <= conditions
    assert all("healthcheck" in services[s] for s in ("etcd", "namesrv", "broker-a-replica"))


def test_compose_groups_have_a_master_and_a_replica_through_etcd() -> None:
    """Each broker group is a master (id 0) and a replica (id 1) with the same
    --broker-name, distinct ids, the same replication flags and the etcd service's client
    URL; each broker waits for etcd to be healthy and advertises its own service name."""
    services = compose_config()["services"]
    etcd = flags(services["etcd"]["command"])
    endpoint = etcd["--advertise-client-urls"]
    assert endpoint == "http://etcd:2379"
    groups: dict[str, dict[int, str]] = {}
    for name, service in services.items():
        command = service.get("command") or []
        if not command or command[0] != "trimq-broker":
            continue
        args = flags(command)
        ids = groups.setdefault(args["--broker-name"], {})
        broker_id = int(args["--broker-id"])
        assert broker_id not in ids, f"{name} and {ids.get(broker_id)}: the same broker id"
        ids[broker_id] = name
        assert args["--etcd-endpoints"] == endpoint, name
        assert args["--replication"] == "sync" and args["--min-insync-replicas"] == "2", name
        assert args["--advertise"] == f"{name}:10911", name
        assert services[name]["depends_on"]["etcd"]["condition"] == "service_healthy", name
        assert "healthcheck" in service, name
    assert set(groups) == {"broker-a", "broker-b"}
    for name, ids in groups.items():
        assert ids[0] == name and ids[1] == f"{name}-replica", ids
    # The failover profile's rejoining broker reuses broker-a's data under a new id.
    rejoin = services["broker-a-rejoin"]
    assert "broker-a-data:/data" in " ".join(
        v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in rejoin["volumes"]
    )
    assert groups["broker-a"][2] == "broker-a-rejoin"
    # setup waits for the replicas (a sync master refuses sends without one).
    setup = services["setup"]
    assert {"broker-a-replica", "broker-b-replica"} <= set(setup["depends_on"])
    assert flags(setup["command"])["--replicas"] == "1"


def test_images_are_plain_pip_installs() -> None:
    """The images install this project with pip, nothing else of ours."""
    for name in ("Dockerfile", "Dockerfile.analytics"):
        text = (ROOT / "docker" / name).read_text()
        assert (
            "pip install --no-cache-dir ." in text
            or "pip install --no-cache-dir '.[analytics]'" in text
        )
