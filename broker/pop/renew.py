"""Auto-renewal of pop leases: the lease of a message a client is still working on is
extended in place (same receipt) shortly before its deadline, until the client acks it,
changes it, or goes away — then the message is released (visible again within a second).

This is what the RocketMQ 5 proxy does for gRPC push consumers (``auto_renew``): it renews
every handle that expires within 10 s with ``changeInvisibleTime`` on the schedule
1 m, 3 m, 5 m, 10 m, 30 m, 1 h, for up to 3 h, and swaps the client's handle for the renewed
one on ack. Here the broker owns the in-flight table, so the deadline moves and the client's
handle stays valid: no handle map, no swap.

A :class:`Renewals` is a deadline source of the broker's :class:`~broker.deadlines.DeadlineLoop`:
one heap of renew times, no scanning. Renewals are not journaled: after a restart a lease
keeps its last journaled deadline and is revived at it if the client has not acked by then.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Final

import trio

from broker.pop.inflight import InflightTable, LeaseKey, LeaseState, Outcome

#: A lease is renewed this long before its deadline (the proxy's 10 s).
RENEW_AHEAD_MS: Final = 10_000
#: Successive extensions, from the time of renewal (the proxy's renew policy).
RENEW_STEPS_MS: Final = (60_000, 180_000, 300_000, 600_000, 1_800_000, 3_600_000)
#: No renewal past this long after the pop (the proxy's 3 h).
MAX_RENEW_MS: Final = 3 * 3600 * 1000
#: A released message is visible again this soon.
RELEASE_MS: Final = 1_000
#: A renewal the journal could not record is tried again this much later.
RETRY_MS: Final = 1_000


@dataclass(slots=True)
class _Tracked:
    owner: Hashable
    #: The receipt's pop time: extensions keep it, so it is also when renewal started.
    pop_time: int
    renewals: int = 0


@dataclass(frozen=True, slots=True)
class RenewalStatistics:
    """Counters of a :class:`Renewals`."""

    tracked: int
    renewed: int
    released: int


class Renewals:
    """Leases kept invisible for their owners (see the module docstring)."""

    def __init__(self, table: InflightTable, poke: Callable[[], None]) -> None:
        self._table = table
        self._poke = poke
        self._tracked: dict[LeaseKey, _Tracked] = {}
        self._by_owner: dict[Hashable, set[LeaseKey]] = {}
        self._heap: list[tuple[int, int, LeaseKey]] = []
        self._seq = itertools.count()
        self._renewed = 0
        self._released = 0

    def track(self, owner: Hashable, keys: Iterable[LeaseKey]) -> None:
        """Keep ``keys`` (just popped for ``owner``) invisible until acked or released."""
        earliest = None
        for key in keys:
            lease = self._table.leases.get(key)
            if lease is None:
                continue
            self._tracked[key] = _Tracked(owner, lease.pop_time)
            self._by_owner.setdefault(owner, set()).add(key)
            due = lease.deadline - RENEW_AHEAD_MS
            heapq.heappush(self._heap, (due, next(self._seq), key))
            earliest = due if earliest is None else min(earliest, due)
        if earliest is not None:
            self._poke()

    def release(self, owner: Hashable, now_ms: int) -> int:
        """``owner`` went away: its messages become visible within :data:`RELEASE_MS`
        (their receipts stay valid until then). Returns how many were released."""
        count = 0
        for key in self._by_owner.pop(owner, set()):
            tracked = self._tracked.pop(key, None)
            if tracked is None:
                continue
            deadline = now_ms + RELEASE_MS
            lease = self._table.leases.get(key)
            if lease is None or lease.deadline <= deadline:
                continue
            if self._table.extend(key, tracked.pop_time, now_ms, deadline) is Outcome.OK:
                count += 1
        self._released += count
        if count:
            self._poke()
        return count

    # ------------------------------------------------------------------ deadline source
    def next_deadline_ms(self) -> int | None:
        """The next renewal."""
        return self._heap[0][0] if self._heap else None

    def fire_due(self, now_ms: int, nursery: trio.Nursery) -> None:
        """Renew every lease due for it; forget those acked, changed or revived."""
        while self._heap and self._heap[0][0] <= now_ms:
            _, _, key = heapq.heappop(self._heap)
            tracked = self._tracked.get(key)
            if tracked is None:
                continue
            lease = self._table.leases.get(key)
            current = (
                lease is not None
                and lease.pop_time == tracked.pop_time
                and lease.state is LeaseState.INVISIBLE
            )
            if not current or now_ms - tracked.pop_time >= MAX_RENEW_MS:
                self._forget(key, tracked)
                continue
            assert lease is not None
            step = RENEW_STEPS_MS[min(tracked.renewals, len(RENEW_STEPS_MS) - 1)]
            deadline = min(now_ms + step, tracked.pop_time + MAX_RENEW_MS)
            due = lease.deadline - RENEW_AHEAD_MS
            if deadline > lease.deadline:
                try:
                    outcome = self._table.extend(key, tracked.pop_time, now_ms, deadline)
                except OSError:  # the journal could not record it: nothing changed
                    outcome, due = None, now_ms + RETRY_MS
                if outcome is not None and outcome is not Outcome.OK:
                    self._forget(key, tracked)
                    continue
                if outcome is Outcome.OK:
                    tracked.renewals += 1
                    self._renewed += 1
                    due = deadline - RENEW_AHEAD_MS
            heapq.heappush(self._heap, (max(due, now_ms + 1), next(self._seq), key))

    def _forget(self, key: LeaseKey, tracked: _Tracked) -> None:
        del self._tracked[key]
        keys = self._by_owner.get(tracked.owner)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_owner[tracked.owner]

    def statistics(self) -> RenewalStatistics:
        """A snapshot."""
        return RenewalStatistics(len(self._tracked), self._renewed, self._released)
