"""Pure DataFrame -> DataFrame steps of the analysis job: no I/O, no session creation.

Input is what ``spark.read.text`` gives (one ``value`` column, one line each); the steps are

1. :func:`parse_lines` — JSON -> the event columns plus ``bad_reason`` (null for a good line);
2. :func:`valid_events` / :func:`bad_line_counts` — split the two;
3. the tables: :func:`latency_percentiles` (exact, nearest rank), :func:`retry_delay`,
   :func:`wasted_wakeups`, :func:`throughput`, :func:`latency_histogram` (for CDF plots).

Exact percentiles: the events of a key are sorted once (one window, one shuffle) and the
value at rank ``ceil(p * n)`` is taken — the nearest-rank definition ``benchmarks/`` uses, so
the job's numbers and the benchmarks' hand-made tables agree. It costs a sort of all events,
which is fine at the scale of a broker's event files (10M events in about a minute on two
cores, docs/benchmarks.md); ``percentile_approx`` would save the sort, not the read.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from analytics.schema import (
    EVENT_SCHEMA,
    KINDS,
    REQUIRED,
    SCHEMA_VERSION,
    STRING_FIELDS,
)

#: Why a line was rejected, in the order the checks apply (the first that fails names it).
BAD_REASONS: tuple[str, ...] = (
    "not_json",  # not one JSON object (torn last line, garbage, two run together)
    "wrong_version",  # a ``v`` other than SCHEMA_VERSION: another schema, not ours to guess
    "wrong_type",  # a field of the wrong JSON type, or a non-finite number
    "missing_field",  # a non-nullable field absent or null
    "unknown_kind",  # ``kind`` not one of KINDS
)
#: The percentile table's key (docs/design.md §8).
PERCENTILE_KEYS: tuple[str, ...] = ("kind", "topic", "group", "wake_mode")
#: Reported percentiles as (column name, parts per 10 000): integers, so that the rank
#: ``ceil(p * n)`` is computed without floating-point error (0.999 * 1000 is not 999.0 in
#: every formula).
PERCENTILES: tuple[tuple[str, int], ...] = (
    ("p50", 5_000),
    ("p90", 9_000),
    ("p99", 9_900),
    ("p99_9", 9_990),
)
#: Log-spaced bins of :func:`latency_histogram`: this many per decade, from 1 µs.
BINS_PER_DECADE = 20
MIN_LATENCY_MS = 1e-3

_CORRUPT = "_corrupt_record"
# from_json reads with every field nullable (Spark ignores nullability there), plus a column
# that receives the raw line when a value does not fit its type (partial results, Spark >= 3).
_PARSE_SCHEMA = StructType(
    [StructField(f.name, f.dataType, nullable=True) for f in EVENT_SCHEMA.fields]
    + [StructField(_CORRUPT, StringType(), nullable=True)]
)
# Spark turns *any* JSON token into text for a StringType field ("topic": 5 -> "5"), so a
# string field whose value starts with neither a quote nor null is caught on the raw line. A
# key pattern cannot match inside a JSON string (its quotes would be escaped there).
_MISTYPED_STRING = r'"(?:' + "|".join(STRING_FIELDS) + r')"\s*:\s*[^"\sn]'


def _finite(col: Column) -> Column:
    return ~F.isnan(col) & (F.abs(col) != F.lit(float("inf")))


def _bad_reason() -> Column:
    line = F.col("_line")
    corrupt = F.col(_CORRUPT).isNotNull()
    # from_json reads the first JSON value and ignores what follows it, so two records run
    # together, or a record with trailing text, would pass as one: rejected here, as Python's
    # json.loads (the broker's own reader) rejects them. ("}{" inside a string value would be
    # a false alarm; the broker's names never hold braces.)
    trailing = ~F.rtrim(line).endswith("}") | line.contains("}{")
    version = F.col("v")
    wrong_type = (
        corrupt
        | line.rlike(_MISTYPED_STRING)
        | ~_finite(F.col("ts_ms"))
        | ~_finite(F.col("latency_ms"))
    )
    missing = F.lit(False)
    for name in REQUIRED:
        missing = missing | F.col(name).isNull()
    return (
        # json_object_keys re-parses, but only the rare corrupt lines reach it.
        F.when((corrupt & F.json_object_keys(line).isNull()) | trailing, "not_json")
        .when(version.isNotNull() & (version != SCHEMA_VERSION), "wrong_version")
        .when(wrong_type, "wrong_type")
        .when(missing, "missing_field")
        .when(~F.col("kind").isin(*KINDS), "unknown_kind")
    )


def parse_lines(lines: DataFrame) -> DataFrame:
    """Parse JSON lines (column ``value``) into the event columns plus ``bad_reason``.

    Blank lines are dropped, not counted (the broker's own reader skips them too); every other
    line becomes one row, good (``bad_reason`` null) or bad (one of :data:`BAD_REASONS`).
    """
    options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}
    parsed = (
        lines.select(F.col("value").alias("_line"))
        .filter(F.trim(F.col("_line")) != "")
        .select("_line", F.from_json("_line", _PARSE_SCHEMA, options).alias("_e"))
        .select("_line", "_e.*")
    )
    names = [f.name for f in EVENT_SCHEMA.fields]
    return parsed.select(*names, _bad_reason().alias("bad_reason"))


def valid_events(parsed: DataFrame) -> DataFrame:
    """The good rows of :func:`parse_lines`, with exactly the schema's columns."""
    return parsed.filter(F.col("bad_reason").isNull()).select(*EVENT_SCHEMA.fieldNames())


def bad_line_counts(parsed: DataFrame) -> DataFrame:
    """``reason, lines`` for every reason that occurred (no rows for a clean input)."""
    return (
        parsed.filter(F.col("bad_reason").isNotNull())
        .groupBy(F.col("bad_reason").alias("reason"))
        .agg(F.count(F.lit(1)).alias("lines"))
    )


def latency_percentiles(events: DataFrame, keys: Sequence[str] = PERCENTILE_KEYS) -> DataFrame:
    """Exact nearest-rank percentiles of ``latency_ms`` per ``keys``.

    Columns: ``keys``, ``n``, ``p50``, ``p90``, ``p99``, ``p99_9``, ``max``, ``mean`` (ms). The
    value of percentile p is the smallest latency with at least ``p * n`` values at or below it.
    """
    by_key = Window.partitionBy(*keys)
    # One sort serves both windows: (keys, latency) order also satisfies the partition-only one.
    ranked = events.select(
        *keys,
        "latency_ms",
        F.row_number().over(by_key.orderBy("latency_ms")).alias("_rank"),
        F.count(F.lit(1)).over(by_key).alias("_n"),
    )
    picks = [
        F.max(
            F.when(
                F.col("_rank") == F.expr(f"(_n * {parts} + 9999) div 10000"), F.col("latency_ms")
            )
        ).alias(name)
        for name, parts in PERCENTILES
    ]
    return ranked.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("n"),
        *picks,
        F.max("latency_ms").alias("max"),
        F.mean("latency_ms").alias("mean"),
    )


def retry_delay(events: DataFrame) -> DataFrame:
    """The seed's before/after table: how late retried messages were, per wake mode.

    ``redeliver`` is deadline -> the retried message handed to a consumer (the pop that read
    it), ``revive`` deadline -> the retry copy written; both in ms, per ``kind, wake_mode``.
    """
    retries = events.filter(F.col("kind").isin("redeliver", "revive"))
    return latency_percentiles(retries, ("kind", "wake_mode"))


def wasted_wakeups(events: DataFrame) -> DataFrame:
    """``wakeup`` events per ``wake_mode, group``: ``wakeups``, ``wasted`` (``found`` false:
    woken, re-read, nothing for it) and ``wasted_ratio``."""
    return (
        events.filter(F.col("kind") == "wakeup")
        .groupBy("wake_mode", "group")
        .agg(
            F.count(F.lit(1)).alias("wakeups"),
            F.count(F.when(~F.col("found"), True)).alias("wasted"),
        )
        .withColumn("wasted_ratio", F.col("wasted") / F.col("wakeups"))
    )


def throughput(events: DataFrame, seconds: int) -> DataFrame:
    """Events per ``seconds``-long bucket (UTC-aligned) per ``kind, wake_mode``: columns
    ``bucket_start`` (timestamp), ``kind``, ``wake_mode``, ``events``, ``events_per_s``.
    Buckets without events have no row."""
    width_ms = seconds * 1000
    start_ms = (F.floor(F.col("ts_ms") / width_ms) * width_ms).cast("long")
    return (
        events.groupBy(F.timestamp_millis(start_ms).alias("bucket_start"), "kind", "wake_mode")
        .agg(F.count(F.lit(1)).alias("events"))
        .withColumn("events_per_s", F.col("events") / F.lit(float(seconds)))
    )


def throughput_summary(per_second: DataFrame, per_minute: DataFrame) -> DataFrame:
    """Per ``kind, wake_mode`` from the two :func:`throughput` tables: ``events``,
    ``busy_seconds`` (seconds with at least one event), ``mean_per_busy_s``, ``peak_per_s``,
    ``peak_per_min``."""
    seconds = per_second.groupBy("kind", "wake_mode").agg(
        F.sum("events").alias("events"),
        F.count(F.lit(1)).alias("busy_seconds"),
        F.max("events").alias("peak_per_s"),
    )
    minutes = per_minute.groupBy("kind", "wake_mode").agg(F.max("events").alias("peak_per_min"))
    return seconds.join(minutes, ["kind", "wake_mode"]).withColumn(
        "mean_per_busy_s", F.col("events") / F.col("busy_seconds")
    )


def rebucket(per_second: DataFrame, width_s: int) -> DataFrame:
    """All kinds of a :func:`throughput` per-second table summed per ``wake_mode`` into
    ``width_s``-second buckets: ``bucket_start``, ``wake_mode``, ``events`` (a plot's series:
    a week of seconds would be too many points to draw, or to collect)."""
    start = F.floor(F.unix_seconds(F.col("bucket_start")) / width_s) * width_s
    return per_second.groupBy(F.timestamp_seconds(start).alias("bucket_start"), "wake_mode").agg(
        F.sum("events").alias("events")
    )


def latency_histogram(events: DataFrame) -> DataFrame:
    """Counts per ``kind, wake_mode`` and log-spaced latency bin: ``bin``, ``upper_ms``
    (values in (previous upper, upper_ms]; at most :data:`MIN_LATENCY_MS` go to the first),
    ``events``. Cumulated, these are the exact empirical CDF at the bin edges — enough for a
    log-x plot without sorting or collecting every event."""
    clamped = F.greatest(F.col("latency_ms"), F.lit(MIN_LATENCY_MS))
    index = F.ceil(F.log10(clamped) * BINS_PER_DECADE).cast("int")
    return (
        events.groupBy("kind", "wake_mode", index.alias("bin"))
        .agg(F.count(F.lit(1)).alias("events"))
        .withColumn("upper_ms", F.pow(F.lit(10.0), F.col("bin") / BINS_PER_DECADE))
    )
