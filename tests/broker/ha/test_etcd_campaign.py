"""The failover campaign's short version (``scripts/failover_campaign.py``, docs/ha.md):
two ``kill -9`` of the current master under producers and pop consumers, each restarted
as a replica; no SEND_OK message lost (stored, and received by the consumers), epochs
strictly rising. The long run (20+ kills) is not in CI."""

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
         "--out", str(out)],
        cwd=REPO, capture_output=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.exists(), done.stderr.decode(errors="replace")[-3000:]
    result = json.loads(out.read_text())
    assert result["kills"] == 2
    assert result["lost"] == 0, result["lost_sample"]
    assert result["acknowledged"] > 0
    assert result["epochs_rising"]
    # The pop consumers, drained at the end, received every acknowledged message.
    assert result["acknowledged_not_received"] == 0
    assert done.returncode == 0
    print(
        f"\ncampaign: {result['acknowledged']} acknowledged, {result['duplicates']} duplicates, "
        f"unavailable {result['unavailable_s']}, election {result['election_s']}"
    )
