"""The analysis job: broker latency events (JSON Lines) -> Parquet tables, report, plots.

Usage (docs/design.md §10)::

    python -m analytics --input DIR [DIR ...] --output DIR [--master URL] [--glob PATTERN]
    spark-submit [--master URL] analytics/job.py --input DIR --output DIR

``--input`` directories are searched recursively for ``events-*.jsonl`` (the broker's hourly
files, ``broker/metrics.py``), so a directory holding several brokers' metrics dirs works.
The master is the one given by ``--master``, else by ``spark-submit``/``spark-defaults``, else
``local[*]`` (Spark's own default): it is never hard-coded. Output::

    OUT/report.md                      the Markdown report
    OUT/plots/*.png                    latency CDFs, throughput, wasted wake-ups
    OUT/<table>/                       Parquet: latency_percentiles, retry_delay,
                                       wasted_wakeups, throughput_per_second,
                                       throughput_per_minute, latency_histogram, bad_lines

Bad input lines are counted per reason (``transforms.BAD_REASONS``) and reported; they never
stop the job.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script (spark-submit analytics/job.py): find the package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import plots, transforms
from analytics.report import ReportData, Rows, render

#: Run as a script (``spark-submit analytics/job.py``) rather than as ``analytics.job``.
AS_SCRIPT = __package__ in (None, "")
APP_NAME = "trimq-analytics"
DEFAULT_GLOB = "events-*.jsonl"
#: Output tables and the columns each is sorted by (deterministic files for diffing).
TABLE_ORDER: dict[str, tuple[str, ...]] = {
    "latency_percentiles": transforms.PERCENTILE_KEYS,
    "retry_delay": ("kind", "wake_mode"),
    "wasted_wakeups": ("wake_mode", "group"),
    "throughput_per_second": ("bucket_start", "kind", "wake_mode"),
    "throughput_per_minute": ("bucket_start", "kind", "wake_mode"),
    "latency_histogram": ("kind", "wake_mode", "bin"),
    "bad_lines": ("reason",),
}
PLOTS = {
    "Latency CDF per wake mode": "plots/latency_cdf.png",
    "Throughput over time": "plots/throughput.png",
    "Wasted wake-ups by wake mode": "plots/wasted_wakeups.png",
}


def read_lines(spark: SparkSession, inputs: Sequence[str], glob: str = DEFAULT_GLOB) -> DataFrame:
    """Every line of every file named ``glob`` under ``inputs`` (recursively), as ``value``."""
    return (
        spark.read.option("recursiveFileLookup", "true")
        .option("pathGlobFilter", glob)
        .text(list(inputs))
    )


def tables(parsed: DataFrame) -> dict[str, DataFrame]:
    """The job's output tables from parsed lines (see :data:`TABLE_ORDER`)."""
    events = transforms.valid_events(parsed)
    return {
        "latency_percentiles": transforms.latency_percentiles(events),
        "retry_delay": transforms.retry_delay(events),
        "wasted_wakeups": transforms.wasted_wakeups(events),
        "throughput_per_second": transforms.throughput(events, 1),
        "throughput_per_minute": transforms.throughput(events, 60),
        "latency_histogram": transforms.latency_histogram(events),
        "bad_lines": transforms.bad_line_counts(parsed),
    }


def write_tables(lines: DataFrame, output: Path) -> None:
    """Parse once (kept in memory, spilling to disk), then write every table as Parquet."""
    parsed = transforms.parse_lines(lines).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        for name, df in tables(parsed).items():
            # One small file per table; repartition, not coalesce, so that the window sort
            # upstream keeps its parallelism.
            (
                df.repartition(1)
                .sortWithinPartitions(*TABLE_ORDER[name])
                .write.mode("overwrite")
                .parquet(str(output / name))
            )
    finally:
        parsed.unpersist()


def _rows(df: DataFrame) -> Rows:
    if "bucket_start" in df.columns:  # epoch seconds: no time zone in the report's hands
        df = df.withColumn("t", F.col("bucket_start").cast("double"))
    return [row.asDict() for row in df.collect()]


def report(
    spark: SparkSession, inputs: Sequence[str], output: Path, files: int, command: str = ""
) -> Path:
    """Render ``report.md`` and the plots from the written tables; return the report path.

    Only small results reach the driver: the throughput tables are summarised and
    re-bucketed (at most ``plots.MAX_POINTS`` points per line) in Spark first.
    """

    def table(name: str) -> DataFrame:
        return spark.read.parquet(str(output / name))

    per_second = table("throughput_per_second")
    bounds = per_second.agg(
        F.min("bucket_start").cast("double"), F.max("bucket_start").cast("double")
    ).first()
    span = (bounds[0], bounds[1]) if bounds is not None and bounds[0] is not None else None
    width = plots.bucket_width(span)
    histogram = _rows(table("latency_histogram"))
    wasted = _rows(table("wasted_wakeups"))
    plots.latency_cdf(histogram, output / PLOTS["Latency CDF per wake mode"],
                      transforms.MIN_LATENCY_MS)  # fmt: skip
    series = _rows(transforms.rebucket(per_second, width))
    plots.throughput_over_time(series, width, output / PLOTS["Throughput over time"])
    plots.wasted_wakeups(wasted, output / PLOTS["Wasted wake-ups by wake mode"])
    summary = transforms.throughput_summary(per_second, table("throughput_per_minute"))
    data = ReportData(
        inputs=inputs,
        files=files,
        events=sum(r["events"] for r in histogram),
        bad_lines={r["reason"]: r["lines"] for r in _rows(table("bad_lines"))},
        percentiles=_rows(table("latency_percentiles")),
        retry_delay=_rows(table("retry_delay")),
        wasted=wasted,
        throughput=_rows(summary),
        span=span,
        plots=PLOTS,
        command=command,
    )
    path = output / "report.md"
    path.write_text(render(data))
    return path


def run(
    spark: SparkSession,
    inputs: Sequence[str],
    output: Path,
    *,
    glob: str = DEFAULT_GLOB,
    command: str = "",
) -> Path:
    """The whole job on a session; returns the report's path."""
    lines = read_lines(spark, inputs, glob)
    files = len(lines.inputFiles())
    output.mkdir(parents=True, exist_ok=True)
    write_tables(lines, output)
    return report(spark, inputs, output, files, command)


def build_parser() -> argparse.ArgumentParser:
    """The job's command line (docs/design.md §10)."""
    p = argparse.ArgumentParser(prog="python -m analytics", description=__doc__.split("\n")[0])
    p.add_argument("--input", nargs="+", required=True, metavar="DIR",
                   help="metrics directories, searched recursively")  # fmt: skip
    p.add_argument("--output", required=True, type=Path, metavar="DIR")
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    p.add_argument("--glob", default=DEFAULT_GLOB, help=f"file names (default {DEFAULT_GLOB})")
    return p


def session(master: str | None) -> SparkSession:
    """A session for the job: the master only when asked for, UTC for time buckets."""
    builder = SparkSession.builder.appName(APP_NAME).config("spark.sql.session.timeZone", "UTC")
    if master:
        builder = builder.master(master)
    return builder.getOrCreate()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m analytics`` and of ``spark-submit analytics/job.py``."""
    args = build_parser().parse_args(argv)
    missing = [i for i in args.input if not Path(i).is_dir()]
    if missing:
        print(f"analytics: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    started = time.monotonic()
    spark = session(args.master)
    spark.sparkContext.setLogLevel("WARN")  # spark-submit's INFO lines would bury the result
    try:
        prog = "spark-submit analytics/job.py" if AS_SCRIPT else "python -m analytics"
        command = f"{prog} {shlex.join(sys.argv[1:] if argv is None else argv)}"
        path = run(spark, args.input, args.output, glob=args.glob, command=command)
    finally:
        spark.stop()
    print(f"report: {path} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
