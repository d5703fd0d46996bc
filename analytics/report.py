"""The Markdown report of the analysis job, rendered from the job's (small) output tables.

Everything here is plain Python over rows already collected from the Parquet tables, so the
report can be tested without Spark and always shows what the Parquet files hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from analytics.schema import KINDS, WAKE_MODES

#: One collected table row (``Row.asDict()``).
Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class ReportData:
    """What the report shows: the inputs, the counts and the job's tables (as rows)."""

    inputs: Sequence[str]
    files: int
    events: int
    bad_lines: Mapping[str, int]
    percentiles: Rows
    retry_delay: Rows
    wasted: Rows
    #: ``transforms.throughput_summary`` rows.
    throughput: Rows
    #: First and last per-second bucket start (epoch seconds); None without events.
    span: tuple[float, float] | None
    #: Plot file names relative to the report's directory, by title.
    plots: Mapping[str, str] = field(default_factory=dict)
    command: str = ""


def fmt_ms(value: float | None) -> str:
    """Milliseconds with precision that suits the size (as the hand-made tables in docs/)."""
    if value is None or math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _name(value: object) -> str:
    return "-" if value is None else str(value).replace("|", "\\|")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def mode_order(mode: object) -> tuple[int, str]:
    """Sort key: the broker's wake modes in their usual order, anything else after."""
    text = str(mode)
    return (WAKE_MODES.index(text) if text in WAKE_MODES else len(WAKE_MODES), text)


def kind_order(kind: object) -> tuple[int, str]:
    """Sort key: kinds in ``broker.metrics.EventKind`` order."""
    text = str(kind)
    return (KINDS.index(text) if text in KINDS else len(KINDS), text)


_PCT_HEADER = ("n", "p50", "p90", "p99", "p99.9", "max", "mean")


def _pct_cells(row: Mapping[str, Any]) -> list[str]:
    values = [row[k] for k in ("p50", "p90", "p99", "p99_9", "max", "mean")]
    return [str(row["n"]), *(fmt_ms(v) for v in values)]


def percentile_section(rows: Rows) -> list[str]:
    """Latency percentiles per kind × topic × group × wake mode."""

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (kind_order(r["kind"]), _name(r["topic"]), _name(r["group"]),
                mode_order(r["wake_mode"]))  # fmt: skip

    ordered = sorted(rows, key=key)
    body = (
        [r["kind"], _name(r["topic"]), _name(r["group"]), r["wake_mode"], *_pct_cells(r)]
        for r in ordered
    )
    return [
        "## Latency percentiles (ms) per kind × topic × group × wake mode",
        "",
        "Exact nearest-rank percentiles (the smallest latency with at least p·n events at or "
        "below it), computed over every event.",
        "",
        *_table(("kind", "topic", "group", "wake mode", *_PCT_HEADER), body),
    ]


def retry_section(rows: Rows) -> list[str]:
    """The seed's before/after: retry delay past the deadline by wake mode."""
    ordered = sorted(rows, key=lambda r: (r["kind"] != "redeliver", mode_order(r["wake_mode"])))
    body = ([r["kind"], r["wake_mode"], *_pct_cells(r)] for r in ordered)
    return [
        "## Retry delay past the deadline by wake mode (ms)",
        "",
        "`redeliver`: lease deadline → the retried message handed to a consumer (the pop that "
        "read it); `revive`: deadline → retry copy written. Whole milliseconds (the broker "
        "measures both as `now_ms − deadline`).",
        "",
        *_table(("kind", "wake mode", *_PCT_HEADER), body),
    ]


def wasted_section(rows: Rows) -> list[str]:
    """Wasted wake-ups per group and mode, with a total per mode."""
    ordered = sorted(rows, key=lambda r: (mode_order(r["wake_mode"]), _name(r["group"])))
    body = [
        [r["wake_mode"], _name(r["group"]), str(r["wakeups"]), str(r["wasted"]),
         f"{r['wasted_ratio']:.1%}"]
        for r in ordered
    ]  # fmt: skip
    totals: dict[str, list[int]] = {}
    for r in rows:
        total = totals.setdefault(r["wake_mode"], [0, 0])
        total[0] += r["wakeups"]
        total[1] += r["wasted"]
    for mode in sorted(totals, key=mode_order):
        woken, wasted = totals[mode]
        body.append([f"**{mode}**", "**all**", str(woken), str(wasted), f"{wasted / woken:.1%}"])
    return [
        "## Wasted wake-ups per group and wake mode",
        "",
        "A `wakeup` event is a parked pop woken by an arrival; it is wasted when the re-read "
        "found nothing for it (`found=false`).",
        "",
        *_table(("wake mode", "group", "wake-ups", "wasted", "wasted ratio"), body),
    ]


def throughput_section(summary: Rows) -> list[str]:
    """Per kind × wake mode: events, busy seconds, mean rate over them, peaks."""
    ordered = sorted(summary, key=lambda r: (kind_order(r["kind"]), mode_order(r["wake_mode"])))
    body = (
        [r["kind"], r["wake_mode"], str(r["events"]), str(r["busy_seconds"]),
         f"{r['mean_per_busy_s']:.1f}", str(r["peak_per_s"]), str(r["peak_per_min"])]
        for r in ordered
    )  # fmt: skip
    head = ("kind", "wake mode", "events", "busy seconds", "mean events/s (busy seconds)",
            "peak events/s", "peak events/min")  # fmt: skip
    return [
        "## Throughput",
        "",
        "Per-second and per-minute counts are in the `throughput_per_second` and "
        "`throughput_per_minute` tables (UTC-aligned buckets); a busy second has at least one "
        "event.",
        "",
        *_table(head, body),
    ]


def _span(span: tuple[float, float] | None) -> str:
    if span is None:
        return "no events"

    def utc(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")

    return f"{utc(span[0])} to {utc(span[1] + 1)} UTC"


def render(data: ReportData) -> str:
    """The whole report as Markdown."""
    bad = sum(data.bad_lines.values())
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(data.bad_lines.items())) or "none"
    lines = [
        "# trimq latency report",
        "",
        f"- Input: {', '.join(f'`{i}`' for i in data.inputs)} — {data.files} event files",
        f"- Lines: {data.events + bad}; valid events: {data.events}; bad lines: {bad} ({reasons})",
        f"- Time span: {_span(data.span)}",
    ]
    if data.command:
        lines.append(f"- Command: `{data.command}`")
    lines.append("")
    for section in (
        retry_section(data.retry_delay),
        wasted_section(data.wasted),
        percentile_section(data.percentiles),
        throughput_section(data.throughput),
    ):
        lines += [*section, ""]
    if data.plots:
        lines += ["## Plots", ""]
        for title, path in data.plots.items():
            lines += [f"![{title}]({path})", ""]
    return "\n".join(lines)
