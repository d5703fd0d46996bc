"""The job's pure transforms on a synthetic event set with known answers (events.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from analytics import transforms
from analytics.schema import FIELDS
from tests.analytics.events import BAD_COUNTS, T0_MS, all_lines

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def parsed(spark: SparkSession) -> DataFrame:
    lines = spark.createDataFrame([(line,) for line in all_lines()], "value string")
    return transforms.parse_lines(lines).cache()


@pytest.fixture(scope="module")
def events(parsed: DataFrame) -> DataFrame:
    return transforms.valid_events(parsed).cache()


def rows(df: DataFrame, *keys: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r[k] for k in keys): r.asDict() for r in df.collect()}


def test_every_kind_of_bad_line_is_counted_and_blank_lines_skipped(
    parsed: DataFrame, events: DataFrame
) -> None:
    counts = {r["reason"]: r["lines"] for r in transforms.bad_line_counts(parsed).collect()}
    assert counts == BAD_COUNTS
    assert set(counts) == set(transforms.BAD_REASONS)
    assert events.count() == 1000 + 10 + 17 + 3 + 2
    assert events.columns == [name for name, _ in FIELDS]


def test_exact_nearest_rank_percentiles_per_key(events: DataFrame) -> None:
    got = rows(transforms.latency_percentiles(events), *transforms.PERCENTILE_KEYS)
    fast = got[("redeliver", "T", "g", "targeted")]
    assert (fast["n"], fast["p50"], fast["p90"], fast["p99"], fast["p99_9"], fast["max"]) == (
        1000, 500.0, 900.0, 990.0, 999.0, 1000.0,
    )  # fmt: skip
    assert fast["mean"] == pytest.approx(500.5)
    slow = got[("redeliver", "T", "g", "none")]
    assert [slow[k] for k in ("n", "p50", "p90", "p99", "p99_9", "max")] == [
        10, 13005.0, 13009.0, 13010.0, 13010.0, 13010.0,
    ]  # fmt: skip
    stores = got[("store", "T", None, "targeted")]  # a null group is a key of its own
    assert [stores[k] for k in ("n", "p50", "p90", "max")] == [3, 0.25, 2.0, 2.0]
    assert len(got) == 7


def test_retry_delay_and_wasted_wakeups(events: DataFrame) -> None:
    delay = rows(transforms.retry_delay(events), "kind", "wake_mode")
    assert set(delay) == {("redeliver", "targeted"), ("redeliver", "none"), ("revive", "targeted")}
    assert delay[("redeliver", "none")]["p50"] == 13005.0
    assert delay[("revive", "targeted")]["p50"] == 1.0
    wasted = rows(transforms.wasted_wakeups(events), "wake_mode", "group")
    assert {k: (v["wakeups"], v["wasted"], v["wasted_ratio"]) for k, v in wasted.items()} == {
        ("topic", "g"): (4, 0, 0.0),
        ("topic", "other"): (8, 8, 1.0),
        ("targeted", "g"): (5, 0, 0.0),
    }


def test_throughput_buckets_per_second_and_minute(events: DataFrame) -> None:
    def table(seconds: int) -> dict[tuple[float, str, str], int]:
        df = transforms.throughput(events, seconds)
        return {
            (r["t"] - T0_MS / 1000, r["kind"], r["wake_mode"]): r["events"]
            for r in df.selectExpr("cast(bucket_start as double) as t", "*").collect()
        }

    per_second = table(1)
    assert {k: n for k, n in per_second.items() if k[1] == "redeliver"} == {
        **{(float(s), "redeliver", "targeted"): 100 for s in range(10)},
        (61.0, "redeliver", "none"): 10,
    }
    assert per_second[(120.0, "wakeup", "topic")] == 12
    assert per_second[(120.0, "store", "targeted")] == 3
    assert table(60) == {
        (0.0, "redeliver", "targeted"): 1000,
        (60.0, "redeliver", "none"): 10,
        (120.0, "wakeup", "topic"): 12,
        (120.0, "wakeup", "targeted"): 5,
        (120.0, "store", "targeted"): 3,
        (120.0, "revive", "targeted"): 2,
    }
    rate = transforms.throughput(events, 60).filter("kind = 'redeliver' and wake_mode = 'none'")
    assert rate.first()["events_per_s"] == pytest.approx(10 / 60)  # type: ignore[index]


def test_throughput_summary_and_plot_series(events: DataFrame) -> None:
    per_second = transforms.throughput(events, 1)
    per_minute = transforms.throughput(events, 60)
    summary = rows(transforms.throughput_summary(per_second, per_minute), "kind", "wake_mode")
    fast = summary[("redeliver", "targeted")]
    assert [fast[k] for k in ("events", "busy_seconds", "peak_per_s", "peak_per_min")] == [
        1000, 10, 100, 1000,
    ]  # fmt: skip
    assert fast["mean_per_busy_s"] == 100.0
    assert summary[("wakeup", "topic")]["peak_per_min"] == 12
    series = transforms.rebucket(per_second, 60).selectExpr(
        "cast(bucket_start as double) as t", "wake_mode", "events"
    )
    assert {(r["t"] - T0_MS / 1000, r["wake_mode"]): r["events"] for r in series.collect()} == {
        (0.0, "targeted"): 1000,
        (60.0, "none"): 10,
        (120.0, "topic"): 12,
        (120.0, "targeted"): 5 + 3 + 2,
    }


def test_latency_histogram_bins_are_log_spaced_and_clamped(events: DataFrame) -> None:
    hist = transforms.latency_histogram(events).filter("kind = 'store'").collect()
    bins = {r["bin"]: (r["upper_ms"], r["events"]) for r in hist}
    per = transforms.BINS_PER_DECADE
    # 0 ms is clamped to 1 µs (bin -60); 0.25 ms is in (0.2239, 0.2512]; 2 in (1.995, 2.239]
    assert sorted(bins) == [-3 * per, -12, 7]
    assert bins[-3 * per] == (pytest.approx(transforms.MIN_LATENCY_MS), 1)
    assert bins[-12][0] == pytest.approx(10 ** (-12 / per)) and bins[7][1] == 1
    redeliver = transforms.latency_histogram(events).filter("kind = 'redeliver'")
    assert sum(r["events"] for r in redeliver.collect()) == 1010
