"""Scheduled delivery, sans-IO: which scheduled records are pending, which are due, and what
must survive a restart. Time is passed in; nothing here reads a clock or touches a socket.

Delayed messages (``DELAY`` level 1..18) and timer messages (``TIMER_DELIVER_MS``,
``TIMER_DELAY_SEC``, ``TIMER_DELAY_MS``) are stored first in ``SCHEDULE_TOPIC_XXXX``
(queue ``level - 1`` for levels, :data:`TIMER_QUEUE` for timers), with ``REAL_TOPIC``,
``REAL_QID`` and the delivery time ``TIMER_OUT_MS``. :class:`Schedule` keeps one deadline heap
for all of them (exact deadlines, no scanning), and per queue a watermark (everything below it
was delivered) plus the delivered offsets above it (timers are delivered out of queue order).
A delivered copy carries ``TIMER_SRC`` (the scheduled record's queue and offset), so after a
crash the copies written since the last persisted state can be recognised in the log and are
not delivered twice.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from protocol.properties import (
    DELAY,
    REAL_QID,
    REAL_TOPIC,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: RocketMQ's ``messageDelayLevel``.
DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNITS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
LEVEL_MS: tuple[int, ...] = tuple(int(x[:-1]) * _UNITS[x[-1]] for x in DELAY_LEVELS.split())
MAX_LEVEL = len(LEVEL_MS)
#: Queue of SCHEDULE_TOPIC_XXXX holding timer messages (after the 18 level queues).
TIMER_QUEUE = MAX_LEVEL
#: RocketMQ's timer wheel accepts at most 3 days ahead (``timerMaxDelaySec``).
MAX_TIMER_DELAY_MS = 3 * 86_400_000
#: Property of a delivered copy: ``"<queue>:<queue offset>"`` of its scheduled record.
TIMER_SRC = "TIMER_SRC"


def level_delay_ms(level: int) -> int:
    """Delay of a level; levels above 18 are clamped, as RocketMQ does."""
    return LEVEL_MS[min(max(level, 1), MAX_LEVEL) - 1]


@dataclass(order=True, frozen=True)
class Due:
    """One scheduled record: when, and where it sits in SCHEDULE_TOPIC_XXXX."""

    deliver_ms: int
    queue_id: int
    queue_offset: int


@dataclass
class Progress:
    """Which offsets of one queue are done when they finish out of order: every offset
    below ``watermark``, and ``done_above`` beyond it (scheduled deliveries here, transaction
    decisions in :mod:`broker.halves`)."""

    watermark: int = 0
    done_above: set[int] = field(default_factory=set)

    def mark(self, offset: int) -> None:
        """Count ``offset`` as done."""
        if offset < self.watermark:
            return
        self.done_above.add(offset)
        while self.watermark in self.done_above:  # advance over a run of done offsets
            self.done_above.discard(self.watermark)
            self.watermark += 1

    def done(self, offset: int) -> bool:
        """Whether ``offset`` is done."""
        return offset < self.watermark or offset in self.done_above

    def copy(self) -> Progress:
        """An independent copy (for a snapshot)."""
        return Progress(self.watermark, set(self.done_above))


class Schedule:
    """Pending scheduled records and delivery progress (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[Due] = []
        self._queued: set[tuple[int, int]] = set()
        self._queues: dict[int, Progress] = {}

    # ------------------------------------------------------------------ progress
    def delivered(self, queue_id: int, queue_offset: int) -> bool:
        """Whether the scheduled record at this position was delivered already."""
        state = self._queues.get(queue_id)
        if state is None:
            return False
        return state.done(queue_offset)

    def mark_delivered(self, queue_id: int, queue_offset: int) -> None:
        """Record a delivery (also used for copies found in the log after a crash)."""
        self._queues.setdefault(queue_id, Progress()).mark(queue_offset)

    def watermark(self, queue_id: int) -> int:
        """Every scheduled record of the queue below this offset was delivered."""
        state = self._queues.get(queue_id)
        return state.watermark if state else 0

    # ------------------------------------------------------------------ deadlines
    def add(self, due: Due) -> bool:
        """Schedule a record unless it is delivered or already scheduled; True if added."""
        key = (due.queue_id, due.queue_offset)
        if key in self._queued or self.delivered(due.queue_id, due.queue_offset):
            return False
        self._queued.add(key)
        heapq.heappush(self._heap, due)
        return True

    def next_deadline(self) -> int | None:
        """Delivery time (ms) of the earliest pending record, or None."""
        return self._heap[0].deliver_ms if self._heap else None

    def pop_due(self, now_ms: int, limit: int = 1024) -> list[Due]:
        """Take up to ``limit`` records due at ``now_ms`` (earliest first)."""
        out: list[Due] = []
        while self._heap and self._heap[0].deliver_ms <= now_ms and len(out) < limit:
            due = heapq.heappop(self._heap)
            self._queued.discard((due.queue_id, due.queue_offset))
            out.append(due)
        return out

    def retry(self, due: Due, at_ms: int) -> None:
        """A delivery failed: try again at ``at_ms``."""
        self.add(Due(at_ms, due.queue_id, due.queue_offset))

    @property
    def pending(self) -> int:
        """Records waiting for their time."""
        return len(self._heap)

    # ------------------------------------------------------------------ persistence
    def snapshot(self, also_delivered: Iterable[tuple[int, int]] = ()) -> bytes:
        """The delivery progress, for ``config/schedule.json``, counting ``also_delivered``
        (queue, offset) pairs as delivered without recording them here."""
        states = {q: s.copy() for q, s in self._queues.items()}
        for queue_id, offset in also_delivered:
            states.setdefault(queue_id, Progress()).mark(offset)
        queues = {
            str(q): {"watermark": s.watermark, "done_above": sorted(s.done_above)}
            for q, s in sorted(states.items())
        }
        return json.dumps({"version": 1, "queues": queues}, separators=(",", ":")).encode()

    def load(self, data: bytes) -> None:
        """Restore progress written by :meth:`snapshot`.

        Raises:
            ValueError: the data is not a schedule snapshot.
        """
        obj = json.loads(data)
        if not isinstance(obj, dict) or obj.get("version") != 1:
            raise ValueError("not a schedule snapshot")
        for key, value in obj.get("queues", {}).items():
            state = Progress(int(value["watermark"]), {int(x) for x in value["done_above"]})
            self._queues[int(key)] = state


def parse_src(value: str) -> tuple[int, int] | None:
    """``TIMER_SRC`` → (queue id, queue offset), None when malformed."""
    queue, _, offset = value.partition(":")
    if (queue + offset).isascii() and queue.isdigit() and offset.isdigit():
        return int(queue), int(offset)
    return None


def delivery_time(properties: Mapping[str, str], now_ms: int) -> tuple[int, int] | None:
    """(queue id in SCHEDULE_TOPIC_XXXX, delivery ms) for a delayed or timer message, None
    for an ordinary one.

    Raises:
        ValueError: a delay or time that is not a number, or too far ahead.
    """
    level = properties.get(DELAY)
    if level and level != "0":
        n = int(level)
        return (min(max(n, 1), MAX_LEVEL) - 1, now_ms + level_delay_ms(n)) if n > 0 else None
    for name, scale, absolute in (
        (TIMER_DELIVER_MS, 1, True),
        (TIMER_DELAY_SEC, 1000, False),
        (TIMER_DELAY_MS, 1, False),
    ):
        raw = properties.get(name)
        if raw:
            at = int(raw) * scale + (0 if absolute else now_ms)
            if at - now_ms > MAX_TIMER_DELAY_MS:
                raise ValueError(f"{name}={raw} is more than 3 days ahead")
            return TIMER_QUEUE, at
    return None


#: Properties that ask for delayed delivery.
DELAY_PROPERTIES = (DELAY, TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS)
#: Properties of a scheduled record that its delivered copy must not carry.
TIMER_PROPERTIES = frozenset({*DELAY_PROPERTIES, TIMER_OUT_MS, REAL_TOPIC, REAL_QID})
