"""The kernel timer behind the real-clock deadline loop (broker/timerfd.py): it wakes, never
before its time; a disarmed one stays quiet; the loop fires a real deadline through it, and
without it (no timerfd) through trio's timeouts. Only lower bounds on time are asserted: a
loaded machine makes wake-ups later, never earlier."""

from __future__ import annotations

import sys

import pytest
import trio

from broker.clock import SYSTEM_CLOCK
from broker.deadlines import DeadlineLoop
from broker.timerfd import TimerFd

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd")


@linux_only
async def test_an_armed_timer_wakes_no_earlier_than_asked() -> None:
    timer = TimerFd.open()
    assert timer is not None
    try:
        start = trio.current_time()
        timer.arm(0.005)
        with trio.fail_after(10):
            await timer.wait()
        assert trio.current_time() - start >= 0.005
    finally:
        timer.close()


@linux_only
async def test_a_disarmed_timer_does_not_wake() -> None:
    timer = TimerFd.open()
    assert timer is not None
    try:
        timer.arm(0.001)
        timer.disarm()
        with trio.move_on_after(0.05) as scope:
            await timer.wait()
        assert scope.cancelled_caught
    finally:
        timer.close()


class _Source:
    def __init__(self, deadline_ms: int) -> None:
        self.deadline_ms: int | None = deadline_ms
        self.fired_at_ms: float | None = None
        self.fired = trio.Event()

    def next_deadline_ms(self) -> int | None:
        return self.deadline_ms

    def fire_due(self, now_ms: int, nursery: trio.Nursery) -> None:
        self.fired_at_ms = SYSTEM_CLOCK.now_ms_f()
        self.deadline_ms = None
        self.fired.set()


async def _fired_at(loop: DeadlineLoop, ahead_ms: int) -> tuple[int, float]:
    """Run ``loop`` with one source due ``ahead_ms`` from now until it fires: (its
    deadline, when it fired), epoch ms."""
    source = _Source(SYSTEM_CLOCK.now_ms() + ahead_ms)
    deadline = source.deadline_ms
    assert deadline is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop.run, [source])
        with trio.fail_after(10):
            await source.fired.wait()
        nursery.cancel_scope.cancel()
    assert source.fired_at_ms is not None
    return deadline, source.fired_at_ms


@pytest.mark.parametrize("precise", [True, False])
async def test_the_loop_fires_a_real_deadline_not_before_it(precise: bool) -> None:
    deadline, fired_at = await _fired_at(DeadlineLoop(SYSTEM_CLOCK, precise=precise), 30)
    assert fired_at >= deadline


async def test_without_a_timerfd_the_loop_keeps_trios_timeouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(TimerFd, "open", classmethod(lambda cls: None))
    deadline, fired_at = await _fired_at(DeadlineLoop(SYSTEM_CLOCK, precise=True), 20)
    assert fired_at >= deadline
