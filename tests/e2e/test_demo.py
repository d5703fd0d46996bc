"""End to end: ``make demo`` in its short mode, and the compose file it mirrors."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_demo_short_mode(tmp_path: Path) -> None:
    """Name server + two brokers + three clients as processes: all healthy, messages flow
    over both brokers, retries and dead letters appear, the report is written (when the
    analytics extra is installed), every process is stopped with exit code 0."""
    analytics = importlib.util.find_spec("pyspark") is not None
    argv = [sys.executable, "-m", "scripts.demo", "--short", "--data-dir", str(tmp_path / "demo")]
    if not analytics:
        argv.append("--no-analytics")
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(summary["exit_codes"].values()) == {0}, summary
    produced = summary["producer"]
    assert produced["sent"] > 0 and produced["failed"] == 0
    assert set(produced["per_broker"]) == {"broker-a", "broker-b"}
    assert summary["simple-consumer"]["received"] == produced["sent"]
    push = summary["push-consumer"]
    assert push["received"] > produced["sent"] and push["retried"] > 0
    assert summary["dlq"]["messages"] > 0
    events = list(Path(summary["events_dir"]).rglob("*.jsonl"))
    assert events, "the brokers wrote no latency events"
    if analytics:
        assert summary["analytics_exit"] == 0
        assert Path(summary["report"]).is_file()


def test_compose_file_is_valid() -> None:
    """``docker-compose config`` (Debian's docker-compose) accepts docker/compose.yaml."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (make test installs it with apt when it can)")
    done = subprocess.run(
        [exe, "-f", str(ROOT / "docker" / "compose.yaml"), "config"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for service in ("namesrv", "broker-a", "broker-b", "producer", "push-consumer",
                    "simple-consumer", "analytics"):  # fmt: skip
        assert f"  {service}:" in done.stdout
    assert "service_healthy" in done.stdout and "service_completed_successfully" in done.stdout


def test_images_are_plain_pip_installs() -> None:
    """The images install this project with pip, nothing else of ours."""
    for name in ("Dockerfile", "Dockerfile.analytics"):
        text = (ROOT / "docker" / name).read_text()
        assert (
            "pip install --no-cache-dir ." in text
            or "pip install --no-cache-dir '.[analytics]'" in text
        )
