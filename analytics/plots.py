"""PNG plots of the job's tables (matplotlib, Agg).

Figures are built with ``matplotlib.figure.Figure`` and saved through the Agg canvas, never
through ``pyplot``: no global figure state, no GUI backend picked from the environment, so the
job runs the same on a headless cluster node and inside a test process.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from analytics.report import Rows, kind_order, mode_order

#: At most about this many points per throughput line; longer spans get wider buckets.
MAX_POINTS = 2_000
DPI = 110


def _save(fig: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches the Agg canvas to the figure
    fig.savefig(path, dpi=DPI)


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def latency_cdf(histogram: Rows, path: Path, min_ms: float) -> None:
    """One panel per kind: the empirical CDF of latency per wake mode, log x-axis.

    ``histogram`` rows are ``kind, wake_mode, upper_ms, events`` (see
    ``transforms.latency_histogram``); the curve passes through (upper_ms, fraction ≤ upper_ms).
    """
    series: dict[str, dict[str, list[tuple[float, int]]]] = defaultdict(lambda: defaultdict(list))
    for r in histogram:
        series[r["kind"]][r["wake_mode"]].append((r["upper_ms"], r["events"]))
    kinds = sorted(series, key=kind_order)
    cols = max(1, min(3, len(kinds)))
    rows = max(1, math.ceil(len(kinds) / cols))
    fig = Figure(figsize=(5.2 * cols, 3.9 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, kind in zip(axes, kinds, strict=False):
        for mode in sorted(series[kind], key=mode_order):
            points = sorted(series[kind][mode])
            total = sum(n for _, n in points)
            xs, ys, seen = [points[0][0] / 10 ** (1 / 20)], [0.0], 0
            for upper, n in points:
                seen += n
                xs.append(upper)
                ys.append(seen / total)
            # Steps: the CDF is exact at each bin's upper edge and flat until the next bin.
            ax.plot(xs, ys, drawstyle="steps-post", label=f"{mode} (n={total})")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # short ranges would label every minor tick
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{kind}")
        ax.set_xlabel(f"latency (ms, log scale; ≤ {min_ms:g} ms drawn at {min_ms:g})")
        ax.set_ylabel("fraction of events ≤ latency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(title="wake mode", fontsize="small")
    for ax in axes[len(kinds) :]:
        ax.set_axis_off()
    if not kinds:
        _empty(axes[0], "no events")
    fig.suptitle("Latency CDF per event kind and wake mode")
    _save(fig, path)


def bucket_width(span: tuple[float, float] | None) -> int:
    """Seconds per point of the throughput plot: 1, or more when the span (first and last
    bucket start, epoch seconds) would need over :data:`MAX_POINTS` points."""
    if span is None:
        return 1
    return max(1, math.ceil((span[1] - span[0] + 1) / MAX_POINTS))


def throughput_over_time(series: Rows, width_s: int, path: Path) -> None:
    """Events per second over time, one line per wake mode (all kinds summed).

    ``series`` rows are ``t`` (bucket start, epoch s), ``wake_mode``, ``events`` per
    ``width_s`` seconds (``transforms.rebucket``). Buckets without events are drawn as 0 within
    each mode's own span: brokers of different modes may have run one after the other (as in
    the seed experiment).
    """
    by_mode: dict[str, dict[float, int]] = defaultdict(dict)
    for r in series:
        by_mode[r["wake_mode"]][r["t"]] = r["events"]
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.subplots()
    if by_mode:
        t0 = min(t for points in by_mode.values() for t in points)
        for mode in sorted(by_mode, key=mode_order):
            points = by_mode[mode]
            first, last = min(points), max(points)
            grid = [first + i * width_s for i in range(int((last - first) // width_s) + 1)]
            rates = [points.get(t, 0) / width_s for t in grid]
            ax.plot([t - t0 for t in grid], rates, linewidth=1, label=mode)
        ax.legend(title="wake mode")
        ax.set_title(f"Throughput over time (all event kinds, {width_s} s buckets)")
    else:
        _empty(ax, "no events")
        ax.set_title("Throughput over time")
    ax.set_xlabel("time since the first event (s)")
    ax.set_ylabel("events per second")
    ax.grid(True, alpha=0.3)
    _save(fig, path)


def wasted_wakeups(wasted: Rows, path: Path) -> None:
    """Stacked bars per wake mode: useful and wasted wake-ups, with the wasted ratio."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in wasted:
        totals[r["wake_mode"]][0] += r["wakeups"]
        totals[r["wake_mode"]][1] += r["wasted"]
    modes: Sequence[str] = sorted(totals, key=mode_order)
    fig = Figure(figsize=(6.5, 4.2), layout="constrained")
    ax = fig.subplots()
    if modes:
        useful = [totals[m][0] - totals[m][1] for m in modes]
        lost = [totals[m][1] for m in modes]
        ax.bar(modes, useful, label="found messages", color="tab:green")
        ax.bar(modes, lost, bottom=useful, label="wasted (found nothing)", color="tab:red")
        for i, m in enumerate(modes):
            ratio = lost[i] / totals[m][0] if totals[m][0] else 0.0
            ax.annotate(f"{ratio:.0%} wasted", (i, totals[m][0]), ha="center", va="bottom")
        ax.legend()
        ax.margins(y=0.15)
    else:
        _empty(ax, "no wakeup events")
    ax.set_xlabel("wake mode")
    ax.set_ylabel("wake-ups (count)")
    ax.set_title("Wake-ups of parked pops by wake mode")
    _save(fig, path)
