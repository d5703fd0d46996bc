"""The Markdown report from rows (no Spark needed)."""

from __future__ import annotations

from analytics.plots import MAX_POINTS, bucket_width
from analytics.report import ReportData, fmt_ms, render


def test_fmt_ms_precision_follows_size() -> None:
    assert [fmt_ms(v) for v in (2.345, 23.45, 234.5, None, float("nan"))] == [
        "2.35", "23.4", "234", "-", "-",
    ]  # fmt: skip


def test_empty_input_renders_without_tables_failing() -> None:
    data = ReportData(
        inputs=["d"], files=0, events=0, bad_lines={}, percentiles=[], retry_delay=[],
        wasted=[], throughput=[], span=None,
    )  # fmt: skip
    text = render(data)
    assert "Lines: 0; valid events: 0; bad lines: 0 (none)" in text
    assert "Time span: no events" in text


def test_throughput_plot_buckets_widen_for_long_spans() -> None:
    assert bucket_width(None) == 1
    assert bucket_width((1000.0, 1000.0 + MAX_POINTS - 1)) == 1
    assert bucket_width((1000.0, 1000.0 + MAX_POINTS)) == 2
    assert bucket_width((0.0, 7 * 86400.0)) == 303  # a week: 303 s per point
