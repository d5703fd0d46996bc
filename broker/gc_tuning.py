"""The broker daemon's garbage-collector settings (docs/design.md §12, "Latency tails").

CPython 3.11 collects its oldest generation when it has grown by a quarter, scanning every
tracked object: with ~1,000 connections a broker tracks ~400,000 (~35 per parked long poll),
so each full collection stops the event loop for 0.3-0.9 s and the middle ones for ~50 ms —
the soak's control p99 (benchmarks/bench_soak.py, docs/benchmarks.md). Parked requests live
long enough to be promoted, so those pauses come steadily under load. The daemon therefore

- freezes what start-up built (modules, tables, the store's indexes: ~130,000 objects that
  live as long as the process) so no collection scans them again (``gc.freeze``);
- keeps young and middle collections small and frequent (promotion after 2 young ones),
  and runs a middle collection every ``YOUNG_INTERVAL_S`` from a task: 3.11 counts
  allocations *net of deallocations*, so while old parked polls die as fast as new
  requests are made the young generation is never "full" and grows to 100,000+ objects —
  a quiet soak measured young and middle collections of up to 180 ms of CPU each (median
  60 ms for the middle ones), the control p99's largest cause once full collections were
  gone. Collected every 0.1 s, they hold one tenth of a second's survivors;
- runs no automatic full collection, and instead one every ``gc_full_collect_s`` from a
  task of its own, logged with its duration: cycles that survive two young collections are
  freed then, so memory stays bounded while the pause comes at a known rate (one ~0.5 s
  pause per 10 min does not move a p99 of per-second samples).

Only ``python -m broker`` applies this: tests and embedders keep the interpreter's settings.
"""

from __future__ import annotations

import gc
import time

import structlog
import trio

__all__ = ["YOUNG_INTERVAL_S", "collect_periodically", "collect_young_periodically", "tune_gc"]

_log = structlog.get_logger(component="gc")

#: Young collections every 700 net allocations (CPython's default); a middle one every 2
#: young ones (default 10: fewer, larger ones).
_YOUNG, _MIDDLE = 700, 2
#: The old generation's threshold counts middle collections: this many never comes, so only
#: :func:`collect_periodically` runs a full collection.
_NEVER = 1 << 30
#: How often :func:`collect_young_periodically` collects the young and middle generations.
YOUNG_INTERVAL_S = 0.1


def tune_gc() -> int:
    """Collect once, freeze the survivors and set the thresholds; the number frozen."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(_YOUNG, _MIDDLE, _NEVER)
    return gc.get_freeze_count()


async def collect_periodically(interval_s: float) -> None:
    """Run a full collection every ``interval_s`` seconds (until cancelled)."""
    while True:
        await trio.sleep(interval_s)
        started = time.perf_counter()
        found = gc.collect()
        _log.info(
            "full collection",
            unreachable=found,
            pause_ms=round((time.perf_counter() - started) * 1000, 1),
        )


async def collect_young_periodically(interval_s: float = YOUNG_INTERVAL_S) -> None:
    """Collect the young and middle generations every ``interval_s`` seconds (until
    cancelled): what survives goes to the old generation, which only the full collection
    scans, so each pause is bounded by the objects made since the last one."""
    while True:
        await trio.sleep(interval_s)
        gc.collect(1)
