"""The daemon's GIL switch interval (broker/gil_tuning.py, ``--gil-switch-ms``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from broker.config import ConfigError, load


def _in_child(ms: float) -> tuple[float, float]:
    # In a child: the interval is process-wide, the test runner keeps its own.
    script = (
        "import sys; from broker.gil_tuning import tune_switch_interval; "
        f"before = tune_switch_interval({ms!r}); print(before, sys.getswitchinterval() * 1000)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    before, after = map(float, result.stdout.split())
    return before, after


def test_the_interval_is_set_in_milliseconds_and_the_old_one_returned() -> None:
    before, after = _in_child(0.5)
    assert before == pytest.approx(5.0)  # CPython's default
    assert after == pytest.approx(0.5)


def test_zero_leaves_the_interpreters_interval() -> None:
    assert _in_child(0) == pytest.approx((5.0, 5.0))


def test_the_daemon_defaults_to_half_a_millisecond_and_refuses_nonsense() -> None:
    assert load([]).gil_switch_ms == 0.5
    assert load(["--gil-switch-ms", "0"]).gil_switch_ms == 0
    for bad in ("-1", "1001"):
        with pytest.raises(ConfigError, match="gil_switch_ms"):
            load(["--gil-switch-ms", bad])
