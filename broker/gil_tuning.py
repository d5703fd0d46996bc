"""The broker daemon's GIL switch interval (docs/design.md §12, "Latency tails").

The event loop runs on one thread, but a few worker threads run Python too: the metrics
writer formats its batch of events every 0.2 s, the checkpointer encodes and writes its
files, a flush finishes its fsync. When such a thread holds the GIL and the loop wakes (a
request arrives, a deadline passes), the loop waits for the GIL; CPython makes the holder
give it up only after the *switch interval*, 5 ms by default. Every wake-up that falls in
a worker's burst is then up to 5 ms late: a trio loop woken by another process while one
thread formats text for 20 ms every 0.2 s answered with a p99 of 5.3 ms at the default and
0.7 ms at 0.5 ms (docs/benchmarks.md). A short interval costs nothing while the loop runs
alone (only a thread that waits for the GIL asks for it); when both are busy they take
turns more often.

Only ``python -m broker`` applies this (``--gil-switch-ms``): tests and programs that
embed the broker keep the interpreter's own setting.
"""

from __future__ import annotations

import sys

__all__ = ["tune_switch_interval"]


def tune_switch_interval(ms: float) -> float:
    """Set the switch interval to ``ms`` milliseconds (0: leave the interpreter's own);
    the interval in force before, in milliseconds."""
    before = sys.getswitchinterval() * 1000
    if ms > 0:
        sys.setswitchinterval(ms / 1000)
    return before
