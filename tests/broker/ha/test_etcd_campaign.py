"""The failover campaign's short version (``scripts/failover_campaign.py``, docs/ha.md):
two ``kill -9`` of the current master under producers, pop consumers and a pull consumer
(a second group, resuming from its committed offsets on each new master), each killed
broker restarted as a replica; no SEND_OK message lost (stored, and received by both
groups), epochs strictly rising. The long run (20+ kills) is not in CI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.broker.ha.etcd_cluster import requires_etcd

pytestmark = requires_etcd

REPO = Path(__file__).resolve().parents[3]


def test_two_failovers_lose_no_acknowledged_message(tmp_path: Path) -> None:
    out = tmp_path / "campaign.json"
    # Its own processes (etcd, three brokers), each stopped by pid; bounded by the timeout.
    done = subprocess.run(
        [sys.executable, "-m", "scripts.failover_campaign", "--kills", "2", "--producers", "2",
         "--pull-consumers", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.exists(), done.stderr.decode(errors="replace")[-3000:]
    result = json.loads(out.read_text())
    assert result["kills"] == 2
    assert result["lost"] == 0, result["lost_sample"]
    assert result["acknowledged"] > 0
    assert result["epochs_rising"]
    # Each group, drained at the end, received every acknowledged message: the pop
    # consumers and the pull consumer (redeliveries allowed, losses not).
    assert result["acknowledged_not_received"] == 0
    pull = result["groups"]["pull"]
    assert pull["acknowledged_not_received"] == 0, pull["missing_sample"]
    assert done.returncode == 0
    print(
        f"\ncampaign: {result['acknowledged']} acknowledged, {result['duplicates']} duplicates, "
        f"unavailable {result['unavailable_s']}, election {result['election_s']}, pull "
        f"redelivered {pull['received_more_than_once']}, {result['seconds']} s"
    )
