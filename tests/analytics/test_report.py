"""The Markdown report from rows (no Spark needed)."""

from __future__ import annotations

from analytics.report import ReportData, fmt_ms, render


def test_fmt_ms_precision_follows_size() -> None:
    assert [fmt_ms(v) for v in (2.345, 23.45, 234.5, None, float("nan"))] == [
        "2.35", "23.4", "234", "-", "-",
    ]  # fmt: skip


def test_empty_input_renders_without_tables_failing() -> None:
    data = ReportData(
        inputs=["d"], files=0, events=0, bad_lines={}, percentiles=[], retry_delay=[],
        wasted=[], per_second=[], per_minute=[],
    )  # fmt: skip
    text = render(data)
    assert "Lines: 0; valid events: 0; bad lines: 0 (none)" in text
    assert "Time span: no events" in text
