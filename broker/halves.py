"""Transactional half messages, sans-IO: which halves are undecided, when each is checked
back next, and what must survive a restart. Time is passed in; nothing here reads a clock,
the store or a socket.

A half message is stored in queue 0 of :data:`HALF_TOPIC`, so its queue offset names it;
the producer's END_TRANSACTION names it by its commit-log offset, which the table maps back.
Decisions (commit, rollback, discard past the check limit) are recorded per queue offset as
a watermark (every half below it is decided) plus the decided offsets above it, exactly as
scheduled deliveries are (:mod:`broker.schedule`): decisions come in any order. Undecided
halves wait on one deadline heap for their next check-back: the first at store time + the
check immunity, then one per check interval. Check counts are part of the snapshot, so a
half asked 15 times is not asked 15 more after a restart.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable
from dataclasses import dataclass

from broker.schedule import Progress

#: Where half messages wait (RocketMQ's ``TransactionalMessageUtil.buildHalfTopic``).
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
#: Where rollback markers go (RocketMQ's op topic; our markers are one record per decision).
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
#: Where a half past the check limit is copied, as RocketMQ does: readable by admins.
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: A decision marker's property (op and discard records): ``"<queue offset>"`` of the half.
TRAN_OP = "TRAN_OP"


@dataclass(slots=True)
class Half:
    """One undecided half message."""

    queue_offset: int
    commit_offset: int
    #: The producer group asked on a check-back (``PGROUP``); empty: nobody can be asked.
    group: str
    #: Checks sent so far.
    checks: int = 0
    #: When the next check is due, epoch ms (a heap entry with another time is stale).
    due_ms: int = 0


class HalfTable:
    """Undecided halves, their check deadlines and the decisions (see the module docstring)."""

    def __init__(self) -> None:
        self._halves: dict[int, Half] = {}
        self._by_commit_offset: dict[int, int] = {}
        self._heap: list[tuple[int, int]] = []  # (due ms, queue offset)
        self._progress = Progress()
        #: Check counts restored from a snapshot, applied when the half is added.
        self._restored_checks: dict[int, int] = {}
        #: Halves being decided right now (a store write under way): not checked, not
        #: decided twice.
        self._deciding: set[int] = set()

    # ------------------------------------------------------------------ halves
    def add(self, half: Half, first_check_ms: int) -> bool:
        """Track an undecided half; False (ignored) when it is decided or known already."""
        if self._progress.done(half.queue_offset) or half.queue_offset in self._halves:
            return False
        half.checks = max(half.checks, self._restored_checks.pop(half.queue_offset, 0))
        self._halves[half.queue_offset] = half
        self._by_commit_offset[half.commit_offset] = half.queue_offset
        self._schedule(half, first_check_ms)
        return True

    def get(self, queue_offset: int) -> Half | None:
        """The undecided half at ``queue_offset``, if any."""
        return self._halves.get(queue_offset)

    def by_commit_offset(self, commit_offset: int) -> Half | None:
        """The undecided half stored at ``commit_offset``, if any."""
        queue_offset = self._by_commit_offset.get(commit_offset)
        return None if queue_offset is None else self._halves.get(queue_offset)

    def decided(self, queue_offset: int) -> bool:
        """Whether the half at ``queue_offset`` was committed, rolled back or discarded."""
        return self._progress.done(queue_offset)

    @property
    def watermark(self) -> int:
        """Every half below this queue offset is decided."""
        return self._progress.watermark

    @property
    def pending(self) -> int:
        """Undecided halves."""
        return len(self._halves)

    # ------------------------------------------------------------------ decisions
    def begin(self, queue_offset: int) -> Half | None:
        """Start deciding a half (its marker is being written): it is neither checked nor
        decided again meanwhile. None when it is not undecided, or already being decided."""
        half = self._halves.get(queue_offset)
        if half is None or queue_offset in self._deciding:
            return None
        self._deciding.add(queue_offset)
        return half

    def abort(self, queue_offset: int) -> None:
        """The decision could not be recorded: the half is undecided again."""
        self._deciding.discard(queue_offset)

    def decide(self, queue_offset: int) -> None:
        """Record a decision (also for markers found in the log after a crash)."""
        self._deciding.discard(queue_offset)
        half = self._halves.pop(queue_offset, None)
        if half is not None:
            self._by_commit_offset.pop(half.commit_offset, None)
        self._progress.mark(queue_offset)

    # ------------------------------------------------------------------ check-backs
    def next_deadline(self) -> int | None:
        """When the earliest check is due (epoch ms), or None."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int, limit: int = 1024) -> list[Half]:
        """Up to ``limit`` undecided halves whose check is due at ``now_ms``. Each is out of
        the heap until :meth:`reschedule`."""
        out: list[Half] = []
        while len(out) < limit:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now_ms:
                break
            _, queue_offset = heapq.heappop(self._heap)
            half = self._halves[queue_offset]
            half.due_ms = -1  # off the heap
            out.append(half)
        return out

    def reschedule(self, half: Half, at_ms: int) -> None:
        """Check ``half`` again at ``at_ms`` (if it is still undecided)."""
        if self._halves.get(half.queue_offset) is half:
            self._schedule(half, at_ms)

    def is_deciding(self, queue_offset: int) -> bool:
        """Whether a decision for the half is being written now."""
        return queue_offset in self._deciding

    def _schedule(self, half: Half, at_ms: int) -> None:
        half.due_ms = at_ms
        heapq.heappush(self._heap, (at_ms, half.queue_offset))

    def _drop_stale(self) -> None:
        """Drop heap entries of decided halves or superseded deadlines."""
        heap = self._heap
        while heap:
            due_ms, queue_offset = heap[0]
            half = self._halves.get(queue_offset)
            if half is not None and half.due_ms == due_ms:
                return
            heapq.heappop(heap)

    # ------------------------------------------------------------------ persistence
    def snapshot(self, also_decided: Iterable[int] = ()) -> bytes:
        """Decisions and check counts, for ``config/transactions.json``, counting
        ``also_decided`` queue offsets as decided without recording them here."""
        progress = self._progress.copy()
        for offset in also_decided:
            progress.mark(offset)
        checks = {str(q): h.checks for q, h in sorted(self._halves.items()) if h.checks}
        return json.dumps(
            {
                "version": 1,
                "watermark": progress.watermark,
                "decided_above": sorted(progress.done_above),
                "checks": checks,
            },
            separators=(",", ":"),
        ).encode()

    def load(self, data: bytes) -> None:
        """Restore what :meth:`snapshot` wrote (before any half is added).

        Raises:
            ValueError: the data is not a transaction snapshot.
        """
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise ValueError(f"not a transaction snapshot: {exc}") from None
        try:
            if not isinstance(obj, dict) or obj.get("version") != 1:
                raise ValueError("not a transaction snapshot")
            self._progress = Progress(int(obj["watermark"]), {int(x) for x in obj["decided_above"]})
            self._restored_checks = {int(q): int(n) for q, n in obj["checks"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a transaction snapshot: {exc!r}") from None
