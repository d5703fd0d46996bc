"""How fast is the analytics job? Synthetic broker events, 1M and 10M, on ``local[2]``.

The events are generated *inside Spark* (``spark.range`` + seeded ``rand``/``randn`` columns,
serialized with ``to_json`` in ``broker.metrics.FIELDS`` order and every field present, as the
broker writes them), written as ``events-*.jsonl`` files, and reused by later runs of the
same size (``--work``). Generation is not timed. Each timed run is the job itself on those
files: read + parse + every table + Parquet writes (``job.write_tables``), then the report
and plots (``job.report``); the figures are wall time and events per second of the two
together, median over ``--runs``.

The mix (per event): store 20 %, pop_wait 20 %, wakeup 15 %, ack 30 %, revive 5 %,
redeliver 5 %, pull_wait 4.5 %, dlq 0.5 %; 3 brokers, one per wake mode; 4 topics, 8 groups;
log-normal latencies around a per-kind median (0.3 ms store ... 200 ms pop_wait; redeliveries
~13 s in wake mode ``none``, as in the seed experiment); wake-ups find messages 90 % of the
time (targeted) or 25 % (topic); one hour of timestamps.

Usage::

    python -m benchmarks.bench_analytics [--events 1000000,10000000] [--runs 3]
        [--master local[2]] [--driver-memory 3g] [--work /tmp/trimq-bench-analytics]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from analytics import job
from analytics.schema import FIELDS

T0_MS = 1_700_000_040_000.0
SPAN_MS = 3_600_000.0
#: (kind, share of events, median latency ms).
MIX: tuple[tuple[str, float, float], ...] = (
    ("store", 0.20, 0.3),
    ("pop_wait", 0.20, 200.0),
    ("wakeup", 0.15, 100.0),
    ("ack", 0.30, 50.0),
    ("revive", 0.05, 1.5),
    ("redeliver", 0.05, 3.0),
    ("pull_wait", 0.045, 150.0),
    ("dlq", 0.005, 1.5),
)
MODES = ("targeted", "topic", "none")
FILES = 16


def _pick(u: Column, kinds: Sequence[tuple[str, float, float]], index: int) -> Column:
    """The ``kinds[i][index]`` whose cumulative share interval holds ``u`` (uniform 0..1)."""
    edge = kinds[0][1]
    expr = F.when(u < edge, F.lit(kinds[0][index]))
    for entry in kinds[1:-1]:
        edge += entry[1]
        expr = expr.when(u < edge, F.lit(entry[index]))
    return expr.otherwise(F.lit(kinds[-1][index]))


def _pick_by_kind(kind: Column) -> Column:
    """The median latency (ms) of ``kind``."""
    expr = F.when(kind == MIX[0][0], F.lit(MIX[0][2]))
    for name, _, median in MIX[1:]:
        expr = expr.when(kind == name, F.lit(median))
    return expr


def generate(spark: SparkSession, n: int, directory: Path) -> None:
    """Write ``n`` synthetic events as ``FILES`` event files under ``directory``."""
    i = F.col("id")
    # Draw first, then derive: kind and its median must come from the same uniform draw.
    base = spark.range(n, numPartitions=FILES).select(
        "id",
        _pick(F.rand(1), MIX, 0).alias("kind"),
        F.rand(2).alias("u_slow"),
        F.randn(3).alias("z"),
        F.rand(4).alias("u_found"),
        F.element_at(F.array(*map(F.lit, MODES)), (i % 3 + 1).cast("int")).alias("mode"),
    )
    kind, mode = F.col("kind"), F.col("mode")
    median = _pick_by_kind(kind)
    slow = (mode == "none") & (kind == "redeliver")
    latency = F.when(slow, F.lit(13_000.0) + F.col("u_slow") * 800).otherwise(
        median * F.exp(F.col("z"))
    )
    found = F.when(kind != "wakeup", F.lit(None).cast("boolean")).otherwise(
        F.col("u_found") < F.when(mode == "topic", 0.25).otherwise(0.9)
    )
    retry = kind.isin("revive", "redeliver", "dlq")
    topic = F.concat(F.lit("Topic"), (i % 4).cast("string"))
    group = F.concat(F.lit("group"), ((i / 3).cast("long") % 8).cast("string"))
    columns = {
        "v": F.lit(1).cast("long"),
        "ts_ms": F.lit(T0_MS) + i * (SPAN_MS / n),
        "kind": kind,
        "broker": F.concat(F.lit("broker-"), mode),
        "topic": topic,
        "group": F.when(kind == "store", F.lit(None).cast("string")).otherwise(group),
        "queue": (i % 8).cast("long"),
        "latency_ms": latency,
        "wake_mode": mode,
        "found": found,
        "retry_topic": F.when(retry, F.concat(F.lit("%RETRY%"), group, F.lit("+"), topic)),
        "origin_topic": F.when(retry, topic),
        "reconsume_times": F.when(kind == "redeliver", (i % 3 + 1).cast("long")),
    }
    assert tuple(columns) == tuple(name for name, _ in FIELDS)
    line = F.to_json(F.struct(*[c.alias(k) for k, c in columns.items()]),
                     {"ignoreNullFields": "false"})  # fmt: skip
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base.select(line.alias("value")).write.text(str(tmp))
    for k, part in enumerate(sorted(tmp.glob("part-*.txt"))):
        nested = tmp / f"broker-{k % 3}" / "metrics"
        nested.mkdir(parents=True, exist_ok=True)
        part.rename(nested / f"events-broker-{k % 3}-{k}-2023111422.jsonl")
    tmp.rename(directory)


def run_once(spark: SparkSession, events: Path, out: Path) -> tuple[float, float]:
    """One timed job run: (tables seconds, report + plots seconds)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    started = time.perf_counter()
    lines = job.read_lines(spark, [str(events)])
    files = len(lines.inputFiles())
    job.write_tables(lines, out)
    tables = time.perf_counter() - started
    job.report(spark, [str(events)], out, files)
    return tables, time.perf_counter() - started - tables


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--events", default="1000000,10000000", help="comma list of sizes")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per size (median)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--driver-memory", default="3g")
    ap.add_argument("--shuffle-partitions", type=int, default=8)
    ap.add_argument("--work", type=Path, default=Path("/tmp/trimq-bench-analytics"))
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.events.split(",") if x.strip()]
    spark = (
        SparkSession.builder.master(args.master)
        .appName("trimq-bench-analytics")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", args.driver_memory)
        .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for n in sizes:
            events = args.work / f"events-{n}"
            if not events.is_dir():
                started = time.perf_counter()
                generate(spark, n, events)
                print(f"generated {n:,} events in {time.perf_counter() - started:.1f} s "
                      "(not timed below)", flush=True)  # fmt: skip
            size = sum(f.stat().st_size for f in events.rglob("events-*.jsonl"))
            walls = []
            for r in range(max(1, args.runs)):
                tables, report = run_once(spark, events, args.work / f"out-{n}")
                walls.append(tables + report)
                print(f"  {n:,} events ({size / 1e6:.0f} MB) run {r + 1}: tables {tables:.1f} s "
                      f"+ report {report:.1f} s = {walls[-1]:.1f} s, "
                      f"{n / walls[-1]:,.0f} events/s", flush=True)  # fmt: skip
            wall = statistics.median(walls)
            print(f"{n:,} events, {args.master}: median {wall:.1f} s, {n / wall:,.0f} events/s "
                  f"over {len(walls)} runs", flush=True)  # fmt: skip
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
