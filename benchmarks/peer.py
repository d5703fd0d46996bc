"""Run ``../shared/peer-bench/physical_limits.py`` inside a benchmark, so our figures and the
machine's physical limits are measured in the same session."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEER_BENCH = ROOT.parent / "shared" / "peer-bench"


def physical_limits(
    workload: str, *extra: str, runs: int = 1, timeout: float = 900
) -> list[dict[str, Any]]:
    """Run one ``physical_limits.py`` workload now; its result rows ([] when the peer-bench
    folder is not there)."""
    script = PEER_BENCH / "physical_limits.py"
    if not script.exists():
        return []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "machine.jsonl"
        argv = [sys.executable, str(script), "--workloads", workload, "--runs", str(runs)]
        argv += ["--quiet-wait", "0", "--out", str(out), *extra]
        subprocess.run(argv, cwd=PEER_BENCH, check=True, capture_output=True, timeout=timeout)
        return [json.loads(line) for line in out.read_text().splitlines()]
