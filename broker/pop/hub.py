"""Pop long polling (RocketMQ's ``PopLongPollingService``) with targeted wake-ups.

A pop that finds nothing parks here under ``(topic, group, queue id)`` (queue id -1: "any
queue") with its own deadline, a trio cancel scope at the call site: timeouts are exact and
answered directly, with no 20 ms scan and no re-run of the whole pop (weak spots 4, 5). As in
:mod:`broker.longpoll`, the caller's read and :meth:`PopHub.wait`'s registration happen in one
synchronous step, so no message can slip in between them.

The store calls :meth:`PopHub.arriving` for every dispatched message. What it wakes:

* a message on a normal topic wakes, for each group parked on that topic, exactly one waiter
  whose tag filter matches, the longest-parked among the group's keys ``-1`` and the message's
  queue. RocketMQ gives up at the first waiter whose filter does not match (weak spot 3); here
  that waiter is skipped and the next one is tried.
* a message on a pop retry topic wakes, in the default ``targeted`` mode, one waiter of the
  group that owns the retry topic only, found from ``ORIGIN_TOPIC`` and the name for V1 and V2
  names alike. RocketMQ 5 wakes every group of the original topic for a V2 name (weak spot 2)
  and nobody for a V1 name (weak spot 1, issue #9632); those behaviours stay selectable as
  ``topic`` and ``none`` so that the before/after experiment runs on one broker.

Waiters live in plain dicts with an index topic -> group -> queue ids, so an arrival costs the
groups parked on its topic plus the waiters inspected, never a scan of all keys. Nothing is
evicted behind anyone's back (weak spot 12): a waiter leaves only when woken, timed out or
cancelled, and empty keys are deleted at once.
"""

from __future__ import annotations

import enum
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any

import trio

from protocol.errors import IllegalNameError, PollingFullError
from protocol.naming import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    V1_SEPARATOR,
    is_pop_retry_topic_v2,
    parse_pop_retry_topic_v2,
    pop_retry_owner,
)
from protocol.properties import ORIGIN_TOPIC

#: A parking place: ``(topic, group, queue id)``.
PopKey = tuple[str, str, int]
#: A property (SQL92) filter over a message's properties.
PropertyMatch = Callable[[Mapping[str, str]], bool]
#: The queue id of a pop that takes from any queue of its topic.
ANY_QUEUE = -1
#: RocketMQ's ``popPollingSize`` and ``maxPopPollingSize``.
DEFAULT_MAX_PER_KEY = 1024
DEFAULT_MAX_TOTAL = 100_000


class WakeMode(enum.StrEnum):
    """Whom a message on a pop retry topic wakes."""

    #: Only the group owning the retry topic (trimq's default).
    TARGETED = "targeted"
    #: Every group parked on the original topic of a V2 name, nobody for V1 (RocketMQ 5).
    TOPIC = "topic"
    #: Nobody (RocketMQ's V1 behaviour: the retry waits for the poll timeout).
    NONE = "none"


class WakeReason(enum.StrEnum):
    """Why a parked pop was woken."""

    NEW = "new"
    RETRY = "retry"
    NOTIFY = "notify"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class Wakeup:
    """What woke a parked pop: handed back by :meth:`PopHub.wait` and passed to
    :meth:`PopHub.record_result` once the pop has re-read."""

    reason: WakeReason
    #: The group of the woken pop.
    group: str
    #: Topic and queue of the message (the retry topic for ``retry``); for ``notify`` the
    #: notified queue, for ``shutdown`` the waiter's own key.
    topic: str
    queue_id: int
    #: Consume-queue offset of the message, -1 when no message is involved.
    queue_offset: int
    #: ``trio.current_time()`` of the wake-up.
    time: float


@dataclass(frozen=True, slots=True)
class _Arrival:
    """The event a wake-up is for, kept so that it can be passed on (see ``PopHub.wait``)."""

    reason: WakeReason
    topic: str
    queue_id: int
    queue_offset: int
    #: The message's tags code; None means "ignore filters" (notify).
    tags_code: int | None
    #: The message's properties, for property (SQL92) filters; None: ignore them.
    properties: Mapping[str, str] | None = None


@dataclass(eq=False, slots=True)
class _Waiter:
    """One parked pop (hashable by identity: it is a key of its line's dict)."""

    key: PopKey
    tags_codes: frozenset[int] | None
    seq: int
    #: A property (SQL92) filter, None for none.
    property_match: PropertyMatch | None = None
    event: trio.Event = field(default_factory=trio.Event)
    wakeup: Wakeup | None = None
    #: Re-does the wake-up for another waiter if this one is cancelled before it runs.
    pass_on: Callable[[], bool] | None = None

    def matches(self, arrival: _Arrival) -> bool:
        tags_code = arrival.tags_code
        if tags_code is None:
            return True  # a notification: filters do not apply
        if self.tags_codes is not None and tags_code not in self.tags_codes:
            return False
        props = arrival.properties
        return self.property_match is None or props is None or self.property_match(props)


@dataclass(slots=True)
class _GroupCounters:
    parked: int = 0
    wakeups: int = 0
    wasted_wakeups: int = 0


@dataclass(frozen=True, slots=True)
class GroupStatistics:
    """One consumer group's part of :class:`PopHubStatistics`."""

    #: Pops of the group parked now.
    parked: int
    #: Wake-ups handed to the group's pops since the start.
    wakeups: int
    #: Wake-ups after which the re-read found nothing (or that went to a cancelled pop).
    wasted_wakeups: int


@dataclass(frozen=True, slots=True)
class PopHubStatistics:
    """A snapshot of a :class:`PopHub`'s counters (:meth:`PopHub.statistics`)."""

    wake_mode: WakeMode
    #: Pops parked now, and the distinct ``(topic, group, queue id)`` keys they park on.
    parked: int
    keys: int
    #: Wake-ups since the start, in total, wasted (see :meth:`PopHub.record_result`) and by
    #: reason (every :class:`WakeReason` is present).
    wakeups: int
    wasted_wakeups: int
    wakeups_by_reason: Mapping[WakeReason, int]
    #: Pop retry messages whose owner could not be found (they wake nobody).
    unowned_retry: int
    #: Retry/DLQ messages the wake mode sends nowhere (classic retry, ``none``, V1 in
    #: ``topic`` mode, dead letters).
    unrouted_retry: int
    #: Messages whose properties were unusable (not a mapping, bad ``ORIGIN_TOPIC``).
    bad_properties: int
    #: Wake-ups handed to another waiter because the woken one was cancelled first.
    passed_on: int
    #: Exceptions swallowed by :meth:`PopHub.arriving`, and the last one's ``repr``.
    arrival_errors: int
    last_error: str | None
    #: Per group, every group that ever parked, in name order.
    groups: Mapping[str, GroupStatistics]

    def as_json(self) -> dict[str, Any]:
        """The snapshot as plain JSON-able values (enum keys and values as strings)."""
        return {
            "wake_mode": str(self.wake_mode),
            "parked": self.parked,
            "keys": self.keys,
            "wakeups": self.wakeups,
            "wasted_wakeups": self.wasted_wakeups,
            "wakeups_by_reason": {str(k): v for k, v in self.wakeups_by_reason.items()},
            "unowned_retry": self.unowned_retry,
            "unrouted_retry": self.unrouted_retry,
            "bad_properties": self.bad_properties,
            "passed_on": self.passed_on,
            "arrival_errors": self.arrival_errors,
            "last_error": self.last_error,
            "groups": {
                group: {
                    "parked": stats.parked,
                    "wakeups": stats.wakeups,
                    "wasted_wakeups": stats.wasted_wakeups,
                }
                for group, stats in self.groups.items()
            },
        }


def _seq(waiter: _Waiter) -> int:
    return waiter.seq


class PopHub:
    """Parked pops by (topic, group, queue); the store's
    :class:`~broker.store.api.ArrivalListener` for pop consumers.

    ``v1_owner`` resolves a V1 retry topic name to its owning ``(group, topic)`` (the broker's
    :meth:`protocol.naming.V1RetryNames.owner`); it is only asked when a message carries no
    usable ``ORIGIN_TOPIC``.
    """

    def __init__(
        self,
        wake_mode: WakeMode = WakeMode.TARGETED,
        *,
        v1_owner: Callable[[str], tuple[str, str] | None] = lambda name: None,
        max_per_key: int = DEFAULT_MAX_PER_KEY,
        max_total: int = DEFAULT_MAX_TOTAL,
    ) -> None:
        self.wake_mode = WakeMode(wake_mode)
        self.max_per_key = max_per_key
        self.max_total = max_total
        self._v1_owner = v1_owner
        # Each line is a dict used as an insertion-ordered set: FIFO, O(1) removal.
        self._lines: dict[PopKey, dict[_Waiter, None]] = {}
        self._index: dict[str, dict[str, set[int]]] = {}
        self._groups: dict[str, _GroupCounters] = {}
        self._seqs = itertools.count()
        # Counters, read through statistics() (PopHubStatistics documents each).
        self._parked = 0
        self._wakeups = 0
        self._wasted_wakeups = 0
        self._wakeups_by_reason: dict[WakeReason, int] = dict.fromkeys(WakeReason, 0)
        self._unowned_retry = 0
        self._unrouted_retry = 0
        self._bad_properties = 0
        self._passed_on = 0
        self._arrival_errors = 0
        self._last_error: str | None = None

    # ------------------------------------------------------------------ parking
    async def wait(
        self,
        topic: str,
        group: str,
        queue_id: int,
        tags_codes: frozenset[int] | None,
        deadline: float,
        property_match: PropertyMatch | None = None,
    ) -> Wakeup | None:
        """Park a pop until a message for it arrives (the :class:`Wakeup`) or ``deadline``
        passes (None), in ``trio.current_time()`` seconds.

        Registers before its first checkpoint: call it in the same synchronous step as the
        read that found nothing. Raises :class:`PollingFullError` when the key already holds
        ``max_per_key`` waiters or the hub ``max_total``.
        """
        key = (topic, group, queue_id)
        line = self._lines.get(key)
        if line is not None and len(line) >= self.max_per_key:
            raise PollingFullError(
                f"{len(line)} pops of group {group!r} already wait on topic {topic!r}"
                f" queue {queue_id} (limit {self.max_per_key})"
            )
        if self._parked >= self.max_total:
            raise PollingFullError(f"{self._parked} pops already wait (limit {self.max_total})")
        waiter = _Waiter(key, tags_codes, next(self._seqs), property_match)
        self._add(waiter)
        try:
            with trio.move_on_at(deadline):
                await waiter.event.wait()
        except BaseException:
            # Cancelled from outside after the cancel was delivered but before this task ran,
            # while a message picked this waiter: give the wake-up to the next one in line
            # instead of leaving the message for a timeout.
            if waiter.pass_on is not None:
                self._passed_on += 1
                self._group(group).wasted_wakeups += 1
                self._wasted_wakeups += 1
                waiter.pass_on()
            raise
        finally:
            if waiter.wakeup is None:
                self._remove(waiter)
        # Woken and timed out in the same tick: report the wake-up, the message is there.
        return waiter.wakeup

    def _add(self, waiter: _Waiter) -> None:
        topic, group, queue_id = waiter.key
        self._lines.setdefault(waiter.key, {})[waiter] = None
        self._index.setdefault(topic, {}).setdefault(group, set()).add(queue_id)
        self._parked += 1
        self._group(group).parked += 1

    def _remove(self, waiter: _Waiter) -> None:
        topic, group, queue_id = waiter.key
        line = self._lines[waiter.key]
        del line[waiter]
        if not line:
            del self._lines[waiter.key]
            groups = self._index[topic]
            queue_ids = groups[group]
            queue_ids.discard(queue_id)
            if not queue_ids:
                del groups[group]
                if not groups:
                    del self._index[topic]
        self._parked -= 1
        self._group(group).parked -= 1

    def _group(self, group: str) -> _GroupCounters:
        stats = self._groups.get(group)
        if stats is None:
            stats = self._groups[group] = _GroupCounters()
        return stats

    # ------------------------------------------------------------------ waking
    def arriving(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        store_timestamp: int,
        properties: Mapping[str, str],
    ) -> None:
        """A message entered ``(topic, queue_id)``: wake whom the rules say (module docstring).

        Called synchronously from the store's dispatch, so it never raises: anything
        unexpected is counted in ``arrival_errors`` and the message simply wakes nobody.
        """
        try:
            if topic.startswith(RETRY_PREFIX):
                self._retry_arriving(topic, queue_id, queue_offset, tags_code, properties)
            elif topic.startswith(DLQ_PREFIX):
                self._unrouted_retry += 1
            else:
                self._new_arriving(topic, queue_id, queue_offset, tags_code, properties)
        except Exception as exc:
            self._arrival_errors += 1
            self._last_error = repr(exc)

    def _new_arriving(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        properties: Mapping[str, str],
    ) -> None:
        groups = self._index.get(topic)
        if not groups:
            return
        queues = (ANY_QUEUE,) if queue_id == ANY_QUEUE else (ANY_QUEUE, queue_id)
        arrival = _Arrival(WakeReason.NEW, topic, queue_id, queue_offset, tags_code, properties)
        for group in list(groups):
            self._wake_one(topic, group, queues, arrival)

    def _retry_arriving(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        properties: Mapping[str, str],
    ) -> None:
        arrival = _Arrival(WakeReason.RETRY, topic, queue_id, queue_offset, tags_code, properties)
        if self.wake_mode == WakeMode.TARGETED:
            owner = self._retry_owner(topic, properties)
            if owner is not None:
                group, origin = owner
                self._wake_one(origin, group, None, arrival)
        elif self.wake_mode == WakeMode.TOPIC and is_pop_retry_topic_v2(topic):
            try:
                _, origin = parse_pop_retry_topic_v2(topic)
            except IllegalNameError:
                self._unowned_retry += 1
                return
            for group in list(self._index.get(origin, ())):
                self._wake_one(origin, group, None, arrival)
        else:
            # ``none``; or ``topic`` with a V1/classic name, which RocketMQ passes through
            # unchanged as a topic nobody parks on.
            self._unrouted_retry += 1

    def _retry_owner(self, name: str, properties: Mapping[str, str]) -> tuple[str, str] | None:
        """``(group, original topic)`` owning retry topic ``name``; None (counted) if unknown
        or if ``name`` is a classic ``%RETRY%group`` topic."""
        origin = self._origin_topic(properties)
        if origin is not None:
            try:
                return pop_retry_owner(name, origin)
            except IllegalNameError:
                self._bad_properties += 1  # does not fit the name: fall back to the name
        if is_pop_retry_topic_v2(name):
            try:
                return parse_pop_retry_topic_v2(name)
            except IllegalNameError:
                self._unowned_retry += 1
                return None
        owner = self._v1_owner(name)
        if owner is not None:
            return owner
        if origin is None and V1_SEPARATOR not in name[len(RETRY_PREFIX) :]:
            self._unrouted_retry += 1  # %RETRY%group: classic retry, not a pop's
        else:
            # An unregistered V1 name; a classic retry topic of a group with '_' in its name
            # cannot be told from one and lands here too.
            self._unowned_retry += 1
        return None

    def _origin_topic(self, properties: object) -> str | None:
        # Typed as a mapping, but it comes from a decoded record: trust nothing.
        if not isinstance(properties, Mapping):
            self._bad_properties += 1
            return None
        origin: Any = properties.get(ORIGIN_TOPIC)
        if origin is None:
            return None
        if not isinstance(origin, str) or not origin:
            self._bad_properties += 1
            return None
        return origin

    def notify(self, topic: str, group: str, queue_id: int) -> bool:
        """Wake one pop of ``group`` on ``topic``, filters ignored: the longest-parked on key
        ``queue_id``, else on key -1. For an orderly queue whose lock was just released.
        Returns whether one was woken."""
        queues = (queue_id,) if queue_id == ANY_QUEUE else (queue_id, ANY_QUEUE)
        arrival = _Arrival(WakeReason.NOTIFY, topic, queue_id, -1, None)
        return self._wake_one(topic, group, queues, arrival, ordered=True)

    def wake_all(self) -> None:
        """Graceful stop: wake every parked pop now (reason ``shutdown``)."""
        now = trio.current_time()
        for line in list(self._lines.values()):
            for waiter in list(line):
                topic, group, queue_id = waiter.key
                self._fire(waiter, Wakeup(WakeReason.SHUTDOWN, group, topic, queue_id, -1, now))

    def _wake_one(
        self,
        topic: str,
        group: str,
        queues: tuple[int, ...] | None,
        arrival: _Arrival,
        *,
        ordered: bool = False,
    ) -> bool:
        """Wake the first waiter of ``group`` on ``topic`` that matches ``arrival``.

        ``queues`` are the keys to look at (None: all of the group's keys on the topic); they
        are merged by parking order, or taken one after the other when ``ordered``.
        """
        waiter = self._pick(topic, group, queues, arrival, ordered=ordered)
        if waiter is None:
            return False
        wakeup = Wakeup(
            arrival.reason,
            group,
            arrival.topic,
            arrival.queue_id,
            arrival.queue_offset,
            trio.current_time(),
        )
        self._fire(
            waiter, wakeup, partial(self._wake_one, topic, group, queues, arrival, ordered=ordered)
        )
        return True

    def _pick(
        self,
        topic: str,
        group: str,
        queues: tuple[int, ...] | None,
        arrival: _Arrival,
        *,
        ordered: bool,
    ) -> _Waiter | None:
        parked_on = self._index.get(topic, {}).get(group)
        if not parked_on:
            return None
        queue_ids: Iterable[int] = parked_on if queues is None else queues
        lines = [
            self._lines[(topic, group, queue_id)] for queue_id in queue_ids if queue_id in parked_on
        ]
        candidates: Iterator[_Waiter]
        if ordered or len(lines) == 1:
            candidates = itertools.chain.from_iterable(lines)
        else:
            candidates = heapq.merge(*lines, key=_seq)
        for waiter in candidates:
            if waiter.matches(arrival):
                return waiter  # iteration stops before anything is changed
        return None

    def _fire(
        self, waiter: _Waiter, wakeup: Wakeup, pass_on: Callable[[], bool] | None = None
    ) -> None:
        self._remove(waiter)
        waiter.wakeup = wakeup
        waiter.pass_on = pass_on
        waiter.event.set()
        self._wakeups += 1
        self._wakeups_by_reason[wakeup.reason] += 1
        self._group(wakeup.group).wakeups += 1

    # ------------------------------------------------------------------ accounting
    def record_result(self, wakeup: Wakeup, found: bool) -> None:
        """The pop woken by ``wakeup`` re-read and found messages or not; not is a wasted
        wake-up (a full pop run for nothing, what targeted wake-ups are meant to avoid)."""
        if not found:
            self._wasted_wakeups += 1
            self._group(wakeup.group).wasted_wakeups += 1

    def statistics(self) -> PopHubStatistics:
        """A snapshot of the counters, in total and per group."""
        groups = {
            group: GroupStatistics(c.parked, c.wakeups, c.wasted_wakeups)
            for group, c in sorted(self._groups.items())
        }
        return PopHubStatistics(
            wake_mode=self.wake_mode,
            parked=self._parked,
            keys=len(self._lines),
            wakeups=self._wakeups,
            wasted_wakeups=self._wasted_wakeups,
            wakeups_by_reason=MappingProxyType(dict(self._wakeups_by_reason)),
            unowned_retry=self._unowned_retry,
            unrouted_retry=self._unrouted_retry,
            bad_properties=self._bad_properties,
            passed_on=self._passed_on,
            arrival_errors=self._arrival_errors,
            last_error=self._last_error,
            groups=MappingProxyType(groups),
        )
