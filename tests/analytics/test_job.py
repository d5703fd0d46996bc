"""The job end to end on a directory tree of event files: Parquet, report, plots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from analytics import job
from tests.analytics.events import BAD_COUNTS, write_tree

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent.parent


def test_job_writes_tables_report_and_plots(spark: SparkSession, tmp_path: Path) -> None:
    write_tree(tmp_path / "in")
    out = tmp_path / "out"
    report = job.run(spark, [str(tmp_path / "in")], out, command="python -m analytics …")
    assert report == out / "report.md"
    for name in job.TABLE_ORDER:
        assert list((out / name).glob("part-*.parquet")), name
    pct = spark.read.parquet(str(out / "latency_percentiles"))
    assert pct.filter("kind = 'redeliver' and wake_mode = 'targeted'").first()["p99_9"] == 999.0  # type: ignore[index]
    for path in job.PLOTS.values():
        png = (out / path).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000, path
    text = report.read_text()
    bad = sum(BAD_COUNTS.values())
    assert "2 event files" in text  # notes.txt and other.jsonl are not event files
    assert f"Lines: {1032 + bad}; valid events: 1032; bad lines: {bad}" in text
    assert "missing_field 2, not_json 4, unknown_kind 1, wrong_type 5, wrong_version 1" in text
    assert "| redeliver | targeted | 1000 | 500 | 900 | 990 | 999 | 1000 | 500 |" in text
    assert "| redeliver | none | 10 | 13005 | 13009 | 13010 | 13010 | 13010 | 13006 |" in text
    assert "| topic | other | 8 | 8 | 100.0% |" in text
    assert "| **topic** | **all** | 12 | 8 | 66.7% |" in text
    assert "| redeliver | targeted | 1000 | 10 | 100.0 | 100 | 1000 |" in text
    assert "2023-11-14 22:14:00 to 2023-11-14 22:16:01 UTC" in text
    assert "![Latency CDF per wake mode](plots/latency_cdf.png)" in text


def test_job_runs_as_a_script_and_checks_its_input(tmp_path: Path) -> None:
    """``spark-submit analytics/job.py`` runs the file as a script: it must find its package.
    (No JVM is started: --help and a missing input return before the session.)"""
    script = subprocess.run(
        [sys.executable, str(ROOT / "analytics" / "job.py"), "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert script.returncode == 0, script.stderr
    assert "--input" in script.stdout and "--master" in script.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "analytics", "--input", str(tmp_path / "nope"), "--output", "x"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "not a directory" in missing.stderr
