"""The broker's one wall clock and its disk-usage probe, injected rather than read directly.

Wall time (epoch milliseconds) stamps stored messages and drives everything that must
survive a restart: pop leases, revive and delivery deadlines, the daily retention hour. Waits
use trio's clock instead (``trio.current_time``), so a test under ``autojump_clock`` moves
them; :class:`broker.deadlines.TrioWallClock` derives the wall clock from trio's, so such a
test moves both together. Nothing here imports trio: the synchronous store uses it too.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

#: ``probe(data_dir) -> used fraction`` of the file system holding ``data_dir``.
DiskProbe = Callable[[Path], float]


class Clock:
    """The real wall clock; subclasses override :meth:`time_ns` (tests, simulations)."""

    def time_ns(self) -> int:
        """Epoch nanoseconds."""
        return time.time_ns()

    def now_ms(self) -> int:
        """Epoch milliseconds, floored (stored timestamps, lease pop times)."""
        return self.time_ns() // 1_000_000

    def now_ms_f(self) -> float:
        """Epoch milliseconds with the fraction (sleeps until a deadline, latencies)."""
        return self.time_ns() / 1e6

    def now_s(self) -> float:
        """Epoch seconds (retention, runtime info)."""
        return self.time_ns() / 1e9


class ManualClock(Clock):
    """A wall clock that moves only when told to (synchronous tests)."""

    def __init__(self, start_ms: float) -> None:
        self._ns = int(start_ms * 1_000_000)

    def time_ns(self) -> int:
        """The set time."""
        return self._ns

    def advance(self, ms: float) -> None:
        """Move forward by ``ms`` milliseconds."""
        self._ns += int(ms * 1_000_000)

    def set_ms(self, ms: float) -> None:
        """Jump to epoch ``ms``."""
        self._ns = int(ms * 1_000_000)


#: The process's wall clock (the default everywhere).
SYSTEM_CLOCK = Clock()


def disk_used_ratio(path: Path) -> float:
    """Used fraction of the file system holding ``path`` (the default :data:`DiskProbe`)."""
    usage = shutil.disk_usage(path)
    return (usage.total - usage.free) / usage.total if usage.total else 0.0
