"""The daemon's garbage-collector settings (broker/gc_tuning.py)."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from collections.abc import Awaitable, Callable

import trio
import trio.testing

from broker.gc_tuning import collect_periodically, collect_young_periodically


def test_tune_gc_freezes_start_up_objects_and_leaves_full_collections_to_the_task() -> None:
    # In a child: freezing and thresholds are process-wide, the test runner keeps its own.
    script = (
        "import gc; from broker.gc_tuning import tune_gc; "
        "frozen = tune_gc(); print(frozen, *gc.get_threshold())"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    frozen, young, middle, old = map(int, result.stdout.split())
    assert frozen > 1000  # what the imports built
    assert (young, middle) == (700, 2)
    assert old >= 1 << 30  # no automatic full collection


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def _freed_between(collector: Callable[[float], Awaitable[None]], interval_s: float,
                         before_s: float, after_s: float) -> tuple[bool, bool]:  # fmt: skip
    """Run ``collector(interval_s)`` alone (the automatic collector off) over a fresh
    cycle: whether the cycle is still alive ``before_s`` in, and ``after_s`` later."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        gc.collect()  # nothing older than the cycle below is left in the young generations
        cycle = _Cycle()
        alive = weakref.ref(cycle)
        del cycle
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collector, interval_s)
            await trio.sleep(before_s)
            alive_before = alive() is not None
            await trio.sleep(after_s)
            alive_after = alive() is not None
            nursery.cancel_scope.cancel()
        return alive_before, alive_after
    finally:
        if was_enabled:
            gc.enable()


async def test_collect_periodically_frees_cycles_at_its_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await _freed_between(collect_periodically, 600.0, 599, 2) == (True, False)


async def test_collect_young_periodically_frees_young_cycles_at_its_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert await _freed_between(collect_young_periodically, 0.1, 0.05, 0.1) == (True, False)
