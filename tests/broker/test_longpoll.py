"""Classic long polling: :class:`broker.longpoll.PullHub`'s waiting and its statistics."""

from __future__ import annotations

import trio
import trio.testing

from broker.longpoll import PullHub, PullHubStatistics


async def test_pull_hub_statistics_follow_parked_and_woken_pulls() -> None:
    hub = PullHub()
    assert hub.statistics() == PullHubStatistics(parked=0, queues=0, wakeups=0)
    woken: list[bool] = []

    async def pull(queue_id: int, tags_codes: frozenset[int] | None) -> None:
        woken.append(await hub.wait("T", queue_id, tags_codes, trio.current_time() + 5))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pull, 0, None)
            nursery.start_soon(pull, 0, frozenset({7}))
            nursery.start_soon(pull, 1, None)
            await trio.testing.wait_all_tasks_blocked()
            parked = hub.statistics()
            assert parked == PullHubStatistics(parked=3, queues=2, wakeups=0)
            hub.arriving("T", 0, 0, 3, 0, {})  # wakes the pull without a filter only
            await trio.testing.wait_all_tasks_blocked()
            assert hub.statistics() == PullHubStatistics(parked=2, queues=2, wakeups=1)
            assert parked.parked == 3  # a snapshot, not a view
            hub.wake_all()
    assert woken == [True, True, True]
    assert hub.statistics() == PullHubStatistics(parked=0, queues=0, wakeups=1)
