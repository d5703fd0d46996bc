"""One deadline-driven task for everything that happens at a time: scheduled (delay/timer)
deliveries and pop revives.

Each source keeps its own heap and answers :meth:`DeadlineSource.next_deadline_ms`; the loop
sleeps until the earliest of them (or until a source :meth:`DeadlineLoop.poke`\\ s it about an
earlier one) and lets every due source fire. No scanning and no fixed tick, unlike RocketMQ's
100 ms schedule checks and 1 s revive rounds (weak spots 4 and 6). Firing is synchronous and
quick; a source that must wait (for an fsync) starts a task in the nursery it is given, so a
slow disk never delays another source's deadline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol

import trio

from broker.clock import SYSTEM_CLOCK, Clock
from broker.timerfd import TimerFd


class TrioWallClock(Clock):
    """A wall clock that advances with trio's clock: epoch ``origin_ms`` at trio time 0.

    Under ``trio.testing.MockClock`` (``autojump_clock``) leases, revive and delivery
    deadlines then move exactly as the waits do, so timing tests need no real-time margins.
    Call only from the trio thread.
    """

    def __init__(self, origin_ms: float) -> None:
        self._origin_ns = int(origin_ms * 1_000_000)

    def time_ns(self) -> int:
        """``origin + trio.current_time()`` in epoch nanoseconds."""
        return self._origin_ns + int(trio.current_time() * 1e9)


class DeadlineSource(Protocol):
    """Something with deadlines."""

    def next_deadline_ms(self) -> int | None:
        """The earliest pending deadline, epoch ms, or None."""

    def fire_due(self, now_ms: int, nursery: trio.Nursery) -> None:
        """Act on everything due by ``now_ms``; start tasks in ``nursery`` for waiting."""


@dataclass(frozen=True, slots=True)
class DeadlineLoopStatistics:
    """A snapshot of a :class:`DeadlineLoop`'s counters (:meth:`DeadlineLoop.statistics`)."""

    #: Wake-ups of the loop since :meth:`DeadlineLoop.run` started (a deadline came due or
    #: a source poked it).
    rounds: int
    #: Deadline sources served.
    sources: int


class DeadlineLoop:
    """Sleeps until the earliest deadline of its sources (see the module docstring)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, *, precise: bool = False) -> None:
        self.clock = clock
        #: Wake through a timerfd (:mod:`broker.timerfd`) where there is one, instead of
        #: trio's timeouts, which fire 1.0-1.3 ms late: for the real clock only (a test's
        #: virtual time moves trio's timeouts, not the kernel's).
        self.precise = precise
        self.sources: Sequence[DeadlineSource] = ()
        self._changed = trio.Event()
        self._rounds = 0

    def poke(self) -> None:
        """A source has a new (maybe earlier) deadline: recompute the sleep."""
        self._changed.set()

    def statistics(self) -> DeadlineLoopStatistics:
        """A snapshot of the counters."""
        return DeadlineLoopStatistics(rounds=self._rounds, sources=len(self.sources))

    def next_deadline_ms(self) -> int | None:
        """The earliest deadline of all sources."""
        deadlines = [d for s in self.sources if (d := s.next_deadline_ms()) is not None]
        return min(deadlines, default=None)

    async def run(self, sources: Sequence[DeadlineSource]) -> None:
        """Serve the deadlines of ``sources`` until cancelled. (The sources are given here,
        not to the constructor, because each is built with this loop's :meth:`poke`.)"""
        self.sources = tuple(sources)
        timer = TimerFd.open() if self.precise else None
        try:
            async with trio.open_nursery() as nursery:
                if timer is not None:
                    nursery.start_soon(self._ring, timer)
                await self._serve(nursery, timer)
        finally:
            if timer is not None:
                timer.close()

    async def _ring(self, timer: TimerFd) -> None:
        while True:  # ends with the loop's nursery
            await timer.wait()
            self.poke()

    async def _serve(self, nursery: trio.Nursery, timer: TimerFd | None) -> NoReturn:
        while True:
            deadline = self.next_deadline_ms()
            # A float "now": the integer clock floors it, which made every sleep start
            # up to 1 ms late (measured in the seed experiment).
            wait_s = float("inf") if deadline is None else (deadline - self.clock.now_ms_f()) / 1000
            if wait_s > 0:
                if timer is None:
                    with trio.move_on_after(wait_s):
                        await self._changed.wait()
                else:  # the timer pokes, as a source with an earlier deadline does
                    if math.isinf(wait_s):
                        timer.disarm()
                    else:
                        timer.arm(wait_s)
                    await self._changed.wait()
            self._changed = trio.Event()
            now = self.clock.now_ms()
            for source in self.sources:
                due = source.next_deadline_ms()
                if due is not None and due <= now:
                    source.fire_due(now, nursery)
            self._rounds += 1
            await trio.lowlevel.checkpoint()
