"""LogGrowth: a replica writer waiting for the log to grow is woken by the next put."""

from __future__ import annotations

import trio
import trio.testing

from broker.ha.master import LogGrowth


async def test_a_taken_event_is_set_by_the_next_growth_and_replaced() -> None:
    growth = LogGrowth()
    first = growth.event()
    growth.notify()
    assert first.is_set()
    second = growth.event()
    assert second is not first
    assert not second.is_set()


async def test_growth_before_anyone_looks_leaves_the_next_event_unset() -> None:
    growth = LogGrowth()
    for _ in range(3):  # puts with no writer waiting: nothing to wake
        growth.notify()
    event = growth.event()
    assert not event.is_set()  # the writer reads the log after taking it, then waits
    growth.notify()
    assert event.is_set()


async def test_a_waiting_writer_wakes() -> None:
    growth = LogGrowth()
    woken = trio.Event()

    async def writer() -> None:
        await growth.event().wait()
        woken.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await trio.testing.wait_all_tasks_blocked()
        growth.notify()
        with trio.fail_after(5):
            await woken.wait()
