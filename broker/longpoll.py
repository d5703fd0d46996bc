"""Classic long polling (RocketMQ's ``PullRequestHoldService``), without periodic scans.

A pull that finds nothing parks here under its (topic, queue id) with its own deadline (a
cancel scope at the call site, so timeouts are exact). The store calls :meth:`arriving` when
it dispatches a message; every parked pull of that queue whose tag filter matches is woken
at once and re-reads. RocketMQ instead checks held pulls every 5 s (a 15 s pull may be held
20 s) and stops at the first waiter whose filter does not match.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from broker.store.api import ArrivalListener

QueueKey = tuple[str, int]


@dataclass(eq=False)
class PullWaiter:
    """One parked pull."""

    tags_codes: frozenset[int] | None
    #: A property (SQL92) filter over the arriving message's properties, None for none.
    property_match: Callable[[Mapping[str, str]], bool] | None = None
    event: trio.Event = field(default_factory=trio.Event)

    def matches(self, tags_code: int, properties: Mapping[str, str]) -> bool:
        if self.tags_codes is not None and tags_code not in self.tags_codes:
            return False
        return self.property_match is None or self.property_match(properties)


@dataclass(frozen=True, slots=True)
class PullHubStatistics:
    """A snapshot of a :class:`PullHub`'s counters (:meth:`PullHub.statistics`)."""

    #: Pulls parked now, and the queues they park on.
    parked: int
    queues: int
    #: Parked pulls woken by a matching message since the start (not by ``wake_all``).
    wakeups: int


class PullHub:
    """Parked pulls by queue; the store's :class:`~broker.store.api.ArrivalListener`."""

    def __init__(self) -> None:
        self._waiters: dict[QueueKey, list[PullWaiter]] = {}
        self._wakeups = 0
        self._parked = 0

    def statistics(self) -> PullHubStatistics:
        """A snapshot of the counters."""
        return PullHubStatistics(
            parked=self._parked, queues=len(self._waiters), wakeups=self._wakeups
        )

    async def wait(
        self,
        topic: str,
        queue_id: int,
        tags_codes: frozenset[int] | None,
        deadline: float,
        property_match: Callable[[Mapping[str, str]], bool] | None = None,
    ) -> bool:
        """Park until a matching message arrives on the queue (True) or ``deadline`` passes
        (False), in ``trio.current_time()`` seconds."""
        key = (topic, queue_id)
        waiter = PullWaiter(tags_codes, property_match)
        waiters = self._waiters.setdefault(key, [])
        waiters.append(waiter)
        self._parked += 1
        try:
            with trio.move_on_at(deadline):
                await waiter.event.wait()
        finally:
            self._parked -= 1
            if not waiter.event.is_set():
                waiters.remove(waiter)
            if not waiters and self._waiters.get(key) is waiters:
                del self._waiters[key]
        return waiter.event.is_set()

    def arriving(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        store_timestamp: int,
        properties: Mapping[str, str],
    ) -> None:
        """A message entered ``(topic, queue_id)``: wake every parked pull it matches."""
        waiters = self._waiters.get((topic, queue_id))
        if not waiters:
            return
        keep = []
        for waiter in waiters:
            if waiter.matches(tags_code, properties):
                waiter.event.set()
                self._wakeups += 1
            else:
                keep.append(waiter)
        waiters[:] = keep

    def wake_all(self) -> None:
        """Shutdown: answer every parked pull now."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.event.set()
            waiters.clear()


class Arrivals:
    """Fans the store's single arrival callback out to several hubs (pulls and pops)."""

    def __init__(self, *listeners: ArrivalListener) -> None:
        self.listeners = listeners

    def arriving(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        store_timestamp: int,
        properties: Mapping[str, str],
    ) -> None:
        """Tell every listener (each guards its own errors; the store guards the rest)."""
        for listener in self.listeners:
            listener.arriving(topic, queue_id, queue_offset, tags_code, store_timestamp, properties)
