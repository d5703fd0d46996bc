"""The pop in-flight table: which popped messages are invisible until when, as a pure state
machine with injected time (no trio, no I/O).

A *lease* is one popped, not yet acknowledged message of one consumer group, keyed by
``(group, topic, queue id, queue offset)`` where ``topic`` is the topic the message was read
from (the retry topic for a retried message). Its receipt is valid while the lease is
``INVISIBLE`` and its deadline (pop time + invisible time) has not passed. Legal moves are the
table :data:`MOVES`; everything else is an :class:`Outcome` value, never an exception.

Orderly pops add a :class:`OrderLock` per ``(group, topic, queue)``: the queue is blocked for
the group while one of its messages is invisible; after the deadline the same offsets are
popped again, in order, from the same queue. A pop repeating the lock's ``attemptId`` gets them
again at once (its previous response was lost).

Every mutation is reported to ``on_op`` as a msgpack-able list *before* it is applied, so a
journal can replay it (:meth:`InflightTable.apply`) after a restart, and a journal that cannot
write (``on_op`` raises) leaves the table unchanged; :meth:`snapshot` / :meth:`restore` cover
the rest.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

LeaseKey = tuple[str, str, int, int]  # (group, topic, queue id, queue offset)
QueueRef = tuple[str, str, int]  # (group, topic, queue id)
Op = list[Any]


class LeaseState(Enum):
    """Where a lease stands."""

    INVISIBLE = "invisible"  # popped, receipt valid until the deadline
    REVIVING = "reviving"  # deadline passed: being written to the retry topic or the DLQ


class Move(Enum):
    """What can happen to a lease."""

    ACK = "ack"
    CHANGE = "change"
    EXPIRE = "expire"
    REVIVED = "revived"
    RETRY = "retry"  # the revive write failed: try again later


#: Legal moves: (state, move) -> next state, ``None`` = the lease is gone.
MOVES: dict[tuple[LeaseState, Move], LeaseState | None] = {
    (LeaseState.INVISIBLE, Move.ACK): None,
    (LeaseState.INVISIBLE, Move.CHANGE): LeaseState.INVISIBLE,
    (LeaseState.INVISIBLE, Move.EXPIRE): LeaseState.REVIVING,
    (LeaseState.REVIVING, Move.REVIVED): None,
    (LeaseState.REVIVING, Move.RETRY): LeaseState.REVIVING,
}


class Outcome(Enum):
    """Result of an ack or a change of invisible time."""

    OK = "ok"
    #: No such message in flight for this group: never popped, already acked, or revived.
    UNKNOWN = "unknown"
    #: The receipt's deadline has passed: the message is (being) redelivered.
    EXPIRED = "expired"
    #: A newer receipt exists for this message (its invisible time was changed).
    STALE = "stale"


@dataclass(slots=True)
class Lease:
    """One popped, unacknowledged message."""

    group: str
    topic: str
    queue_id: int
    offset: int
    pop_time: int
    invisible_ms: int
    #: The topic consumers know the message by (``topic`` unless it is a retry topic).
    origin_topic: str
    order: bool = False
    #: How many times this message was popped before this pop (orderly pops count here;
    #: other messages carry ``RECONSUME_TIME`` in the record).
    consumed: int = 0
    state: LeaseState = LeaseState.INVISIBLE
    retry_at: int = 0
    #: Sequence number of the lease's newest deadline-heap entry; older entries are stale
    #: even when their due time is the same (a change to the same deadline, a re-pop).
    heap_seq: int = field(default=-1, compare=False, repr=False)

    @property
    def key(self) -> LeaseKey:
        """The table key."""
        return (self.group, self.topic, self.queue_id, self.offset)

    @property
    def deadline(self) -> int:
        """When the message becomes visible again, epoch ms."""
        return self.pop_time + self.invisible_ms

    @property
    def due_at(self) -> int:
        """When the deadline loop must look at it next."""
        return self.retry_at if self.state is LeaseState.REVIVING else self.deadline

    def to_list(self) -> list[Any]:
        """Wire form for journals and snapshots."""
        return [
            self.group,
            self.topic,
            self.queue_id,
            self.offset,
            self.pop_time,
            self.invisible_ms,
            self.origin_topic,
            self.order,
            self.consumed,
        ]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> Lease:
        """Inverse of :meth:`to_list`."""
        g, t, q, off, pop_time, invisible = row[:6]
        return cls(
            str(g),
            str(t),
            int(q),
            int(off),
            int(pop_time),
            int(invisible),
            origin_topic=str(row[6]),
            order=bool(row[7]),
            consumed=int(row[8]),
        )


@dataclass(slots=True)
class OrderLock:
    """An orderly queue held by one group: its popped offsets, in order."""

    offsets: list[int]
    attempt_id: str | None
    #: Times each offset was popped so far (RocketMQ's ``offsetConsumedCount``).
    counts: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class Expired:
    """A lease whose deadline passed (what the revive service acts on)."""

    lease: Lease


class InflightTable:
    """Leases, pop cursors and orderly locks (see the module docstring)."""

    def __init__(self, on_op: Callable[[Op], None] = lambda op: None) -> None:
        self.on_op = on_op
        self.leases: dict[LeaseKey, Lease] = {}
        #: Next offset a pop of (group, topic, queue) reads from.
        self.cursors: dict[QueueRef, int] = {}
        self.locks: dict[QueueRef, OrderLock] = {}
        #: Deadline entries ``(due, seq, keys)``: the leases of ``keys`` whose ``heap_seq`` is
        #: still ``seq`` and ``due_at`` still ``due`` are due then, in the list's order (the
        #: leases of one pop share an entry; a key of a lease acked, changed or revived since
        #: is stale, skipped and dropped from the list's front when met).
        self._heap: list[tuple[int, int, list[LeaseKey]]] = []
        self._seq = itertools.count()
        self.acked_count = 0
        self.revived_count = 0
        #: Grows with every journaled change (what a replica's copy of offsets watches).
        self.changes = 0

    def _op(self, op: Op) -> None:
        self.changes += 1
        self.on_op(op)

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.leases)

    def lowest_in_flight(self) -> dict[QueueRef, int]:
        """The smallest offset still in flight per (group, topic, queue) (what a replica's
        copy of the consumer offsets must not pass: docs/design.md §13)."""
        lowest: dict[QueueRef, int] = {}
        for group, topic, queue_id, offset in self.leases:
            ref = (group, topic, queue_id)
            if offset < lowest.get(ref, offset + 1):
                lowest[ref] = offset
        return lowest

    def cursor(self, group: str, topic: str, queue_id: int) -> int | None:
        """Where the next pop of this queue starts, if the group ever popped it."""
        return self.cursors.get((group, topic, queue_id))

    def blocked(self, group: str, topic: str, queue_id: int, now_ms: int) -> bool:
        """Whether an orderly queue still has an invisible message for ``group``."""
        lock = self.locks.get((group, topic, queue_id))
        if lock is None:
            return False
        return any(
            self._order_lease_invisible(group, topic, queue_id, o, now_ms) for o in lock.offsets
        )

    def _order_lease_invisible(
        self, group: str, topic: str, queue_id: int, offset: int, now_ms: int
    ) -> bool:
        lease = self.leases.get((group, topic, queue_id, offset))
        return lease is not None and lease.deadline > now_ms

    def order_lock(self, group: str, topic: str, queue_id: int) -> OrderLock | None:
        """The orderly lock of a queue, if held."""
        return self.locks.get((group, topic, queue_id))

    def next_deadline(self) -> int | None:
        """The earliest moment something expires, epoch ms."""
        heap, leases = self._heap, self.leases
        while heap:
            due, seq, keys = heap[0]
            for i, key in enumerate(keys):
                lease = leases.get(key)
                if lease is not None and lease.heap_seq == seq and lease.due_at == due:
                    del keys[:i]  # the stale ones before it
                    return due
            heapq.heappop(heap)  # every key stale: acked, changed or revived since
        return None

    # ------------------------------------------------------------------ moves
    def set_cursor(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Move a pop cursor (first pop of a queue, or an offset fixed after retention)."""
        self._op(["cur", group, topic, queue_id, offset])
        self._apply_cursor(group, topic, queue_id, offset)

    def popped(
        self,
        leases: Sequence[Lease],
        *,
        cursor: tuple[str, str, int, int] | None = None,
        attempt_id: str | None = None,
    ) -> None:
        """Record a pop: its leases, the queue cursor after it (``(group, topic, queue,
        next offset)``) and, for an orderly pop, the lock it takes."""
        self._op(
            [
                "pop",
                [lease.to_list() for lease in leases],
                list(cursor) if cursor else None,
                attempt_id,
            ]
        )
        self._apply_pop(leases, cursor, attempt_id)

    def popped_read(self, leases: Sequence[Lease], next_offset: int) -> None:
        """:meth:`popped` of what one read of one queue found (at least one lease), not
        orderly: ``leases`` share
        their group, topic, queue, pop time, invisible time and origin topic, none consumed
        before (what :meth:`popped` records with ``cursor=(group, topic, queue id,
        next_offset)``), journaled as one ``pops`` op: those fields once and the offsets,
        not a row per lease."""
        first = leases[0]
        g, t, q = first.group, first.topic, first.queue_id
        self._op(
            ["pops", g, t, q, first.pop_time, first.invisible_ms, first.origin_topic,
             [lease.offset for lease in leases], next_offset]
        )  # fmt: skip
        self._apply_pop(leases, (g, t, q, next_offset), None)

    def ack(self, key: LeaseKey, pop_time: int, now_ms: int) -> Outcome:
        """Acknowledge the message the receipt ``(key, pop_time)`` names."""
        outcome = self._check(key, pop_time, now_ms)
        if outcome is Outcome.OK:
            self._op(["ack", *key])
            self._apply_ack(key)
        return outcome

    def ack_many(self, receipts: Sequence[tuple[LeaseKey, int]], now_ms: int) -> list[Outcome]:
        """Acknowledge several ``(key, pop time)`` receipts with one journal op (a batch ack)."""
        return self.ack_many_leases(receipts, now_ms)[0]

    def ack_many_leases(
        self, receipts: Sequence[tuple[LeaseKey, int]], now_ms: int
    ) -> tuple[list[Outcome], list[Lease]]:
        """:meth:`ack_many`, and the lease of each receipt it acknowledged, in receipt order
        (a key twice in ``receipts``: its lease twice, as a lookup before the ack finds)."""
        check, ok = self._check, Outcome.OK
        outcomes = [check(key, pop_time, now_ms) for key, pop_time in receipts]
        done = [key for (key, _), o in zip(receipts, outcomes, strict=True) if o is ok]
        if not done:
            return outcomes, []
        self._op(["acks", done])  # msgpack packs a tuple as the list it was before
        leases = self.leases
        acked = [leases[key] for key in done]
        self._apply_acks(done)
        return outcomes, acked

    def ack_each(self, receipts: Sequence[tuple[LeaseKey, int]], now_ms: int) -> list[Outcome]:
        """Acknowledge ``(key, pop time)`` receipts as as many :meth:`ack` calls one after
        another would (a second receipt of a message acked earlier in the same call is
        ``UNKNOWN``), with one journal op: ``ack`` for one, ``acks`` for more."""
        return self.ack_each_leases(receipts, now_ms)[0]

    def ack_each_leases(
        self, receipts: Sequence[tuple[LeaseKey, int]], now_ms: int
    ) -> tuple[list[Outcome], list[Lease]]:
        """:meth:`ack_each`, and the leases it acknowledged, in receipt order."""
        outcomes: list[Outcome] = []
        done: list[LeaseKey] = []
        taken: set[LeaseKey] = set()
        for key, pop_time in receipts:
            outcome = Outcome.UNKNOWN if key in taken else self._check(key, pop_time, now_ms)
            if outcome is Outcome.OK:
                taken.add(key)
                done.append(key)
            outcomes.append(outcome)
        if len(done) == 1:
            self._op(["ack", *done[0]])
        elif done:
            self._op(["acks", done])
        acked = [self.leases[key] for key in done]  # each once (a repeat is UNKNOWN)
        self._apply_acks(done)
        return outcomes, acked

    def change(
        self, key: LeaseKey, pop_time: int, now_ms: int, invisible_ms: int
    ) -> tuple[Outcome, Lease | None]:
        """Give a message a new deadline ``now + invisible_ms`` and a new receipt (pop time
        ``now``); the old receipt becomes stale. The new pop time is at least one ms after
        the old one, so the two receipts always differ (a change in the same millisecond as
        the pop would otherwise leave the old receipt valid)."""
        outcome = self._check(key, pop_time, now_ms)
        if outcome is not Outcome.OK:
            return outcome, None
        stamp = max(now_ms, pop_time + 1)
        self._op(["chg", *key, stamp, invisible_ms])
        lease = self._apply_change(key, stamp, invisible_ms)
        return outcome, lease

    def extend(self, key: LeaseKey, pop_time: int, now_ms: int, deadline_ms: int) -> Outcome:
        """Move an invisible message's deadline to ``deadline_ms`` *keeping its receipt* (the
        pop time stays, the invisible time grows): auto-renewal for gRPC push consumers,
        whose handles must stay valid while they work. Journaled as a change to the same pop
        time, so a restart keeps the new deadline."""
        outcome = self._check(key, pop_time, now_ms)
        if outcome is not Outcome.OK:
            return outcome
        invisible_ms = max(0, deadline_ms - pop_time)
        self._op(["chg", *key, pop_time, invisible_ms])
        self._apply_change(key, pop_time, invisible_ms)
        return outcome

    def expire_due(self, now_ms: int, limit: int = 1024) -> list[Expired]:
        """Leases due by ``now``: non-orderly ones move to ``REVIVING`` (the caller writes
        them to the retry topic or DLQ, then calls :meth:`revived` or :meth:`retry_later`);
        orderly ones stay for the next pop of their queue and are returned so the caller can
        wake it (or dead-letter them)."""
        out: list[Expired] = []
        heap, leases = self._heap, self.leases
        while heap and len(out) < limit and heap[0][0] <= now_ms:
            due, seq, keys = heap[0]
            taken = 0
            for key in keys:
                if len(out) >= limit:
                    break
                taken += 1
                lease = leases.get(key)
                if lease is None or lease.heap_seq != seq or lease.due_at != due:
                    continue
                if not lease.order and lease.state is LeaseState.INVISIBLE:
                    lease.state = _move(lease.state, Move.EXPIRE)
                out.append(Expired(lease))
            if taken == len(keys):
                heapq.heappop(heap)
            else:
                del keys[:taken]
        return out

    def revived(self, key: LeaseKey) -> None:
        """The expired message was written to its retry topic or the DLQ: forget it."""
        lease = self.leases.get(key)
        if lease is None:
            return
        if not lease.order:
            _move(lease.state, Move.REVIVED)
        self._op(["rev", *key])
        self._apply_revived(key)

    def retry_later(self, key: LeaseKey, at_ms: int) -> None:
        """Writing the revived message failed: try again at ``at_ms`` (not journaled: after
        a restart the lease is simply due at once)."""
        lease = self.leases.get(key)
        if lease is None:
            return
        lease.state = _move(lease.state, Move.RETRY)
        lease.retry_at = at_ms
        self._push(lease)

    def forget_topics(self, topics: frozenset[str]) -> None:
        """Drop every lease read from or redelivering a message of ``topics``, and their
        cursors and orderly locks (the topics were deleted). Not journaled: there is no op
        for it, so the caller makes it durable with a snapshot (see
        :meth:`broker.pop.service.PopEngine.forget_topics`). Dropped leases' deadline-heap
        entries go stale and are skipped, as an acked lease's are."""
        stale = [
            key
            for key, lease in self.leases.items()
            if lease.topic in topics or lease.origin_topic in topics
        ]
        for key in stale:
            del self.leases[key]
        for ref in [ref for ref in self.cursors if ref[1] in topics]:
            del self.cursors[ref]
        for ref in [ref for ref in self.locks if ref[1] in topics]:
            del self.locks[ref]

    # ------------------------------------------------------------------ replay
    def apply(self, op: Sequence[Any]) -> None:
        """Replay one journaled op (no ``on_op`` call)."""
        kind = op[0]
        if kind == "pop":
            cursor = op[2]
            self._apply_pop(
                [Lease.from_list(r) for r in op[1]], tuple(cursor) if cursor else None, op[3]
            )
        elif kind == "pops":
            g, t, q, pop_time, invisible, origin = str(op[1]), str(op[2]), int(op[3]), *op[4:7]
            pop_time, invisible, origin = int(pop_time), int(invisible), str(origin)
            leases = [Lease(g, t, q, int(o), pop_time, invisible, origin) for o in op[7]]
            self._apply_pop(leases, (g, t, q, int(op[8])), None)
        elif kind == "ack":
            self._apply_ack(_key(op[1:5]))
        elif kind == "acks":
            for key in op[1]:
                self._apply_ack(_key(key))
        elif kind == "chg":
            if _key(op[1:5]) in self.leases:
                self._apply_change(_key(op[1:5]), int(op[5]), int(op[6]))
        elif kind == "rev":
            self._apply_revived(_key(op[1:5]))
        elif kind == "cur":
            self._apply_cursor(op[1], op[2], int(op[3]), int(op[4]))
        else:
            raise ValueError(f"unknown pop journal op {kind!r}")

    def snapshot(self) -> dict[str, Any]:
        """Everything needed to rebuild the table (leases being revived included)."""
        return {
            "leases": [lease.to_list() for lease in self.leases.values()],
            "cursors": [[*ref, off] for ref, off in self.cursors.items()],
            "locks": [
                [*ref, lock.offsets, lock.attempt_id, list(lock.counts.items())]
                for ref, lock in self.locks.items()
            ],
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Load a :meth:`snapshot` (into an empty table)."""
        for row in state.get("leases", ()):
            lease = Lease.from_list(row)
            self.leases[lease.key] = lease
            self._push(lease)
        for g, t, q, off in state.get("cursors", ()):
            self.cursors[(g, t, int(q))] = int(off)
        for g, t, q, offsets, attempt, counts in state.get("locks", ()):
            self.locks[(g, t, int(q))] = OrderLock(
                list(offsets), attempt, {int(o): int(c) for o, c in counts}
            )

    def replace(self, state: dict[str, Any]) -> None:
        """Become a :meth:`snapshot` of another table (a replica mirroring its master's:
        docs/design.md §13). Not journaled: the caller snapshots it."""
        self.leases.clear()
        self.cursors.clear()
        self.locks.clear()
        self._heap.clear()
        self.restore(state)
        self.changes += 1

    def keep_held(self, max_offset: Callable[[str, int], int]) -> int:
        """Fit the table to the messages this broker holds (``max_offset(topic, queue id)``:
        one past its last): leases of messages it lacks go (nothing here to redeliver), and
        cursors and orderly locks past them come back (a promoted replica whose log lagged
        its master's in-flight table). Journaled as cursor moves; returns the leases
        dropped. Dropped leases' heap entries go stale, as an acked lease's do."""
        gone = [k for k in self.leases if k[3] >= max_offset(k[1], k[2])]
        for key in gone:
            del self.leases[key]
        for (group, topic, queue_id), offset in list(self.cursors.items()):
            held = max_offset(topic, queue_id)
            if offset > held:
                self.set_cursor(group, topic, queue_id, held)
        for ref, lock in list(self.locks.items()):
            if any(offset >= max_offset(ref[1], ref[2]) for offset in lock.offsets):
                del self.locks[ref]
        return len(gone)

    # ------------------------------------------------------------------ internals
    def _check(self, key: LeaseKey, pop_time: int, now_ms: int) -> Outcome:
        lease = self.leases.get(key)
        if lease is None:
            return Outcome.UNKNOWN
        if lease.pop_time != pop_time:
            # An older receipt (changed since) or a newer one than we know (a receipt of a
            # pop before a restart that was never journaled cannot be: pops journal first).
            return Outcome.STALE if pop_time < lease.pop_time else Outcome.UNKNOWN
        # lease.deadline, inline (once per ack)
        if lease.state is not LeaseState.INVISIBLE or pop_time + lease.invisible_ms <= now_ms:
            return Outcome.EXPIRED
        return Outcome.OK

    def _push(self, lease: Lease) -> None:
        lease.heap_seq = next(self._seq)
        heapq.heappush(self._heap, (lease.due_at, lease.heap_seq, [lease.key]))

    def _apply_cursor(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.cursors[(group, topic, queue_id)] = offset

    def _apply_pop(
        self,
        leases: Iterable[Lease],
        cursor: tuple[Any, ...] | None,
        attempt_id: str | None,
    ) -> None:
        table, heap, seq = self.leases, self._heap, self._seq
        run: list[LeaseKey] = []  # the keys of the current heap entry (one per pop, usually)
        run_due = n = -1
        for lease in leases:
            key = (lease.group, lease.topic, lease.queue_id, lease.offset)  # lease.key
            due = lease.due_at
            earlier = table.get(key)
            if due != run_due or not run or (earlier is not None and earlier.heap_seq == n):
                # _push, for the leases due at the same time (a key twice in one entry would
                # be due twice: its second lease starts an entry of its own)
                run, run_due, n = [key], due, next(seq)
                heapq.heappush(heap, (due, n, run))
            else:
                run.append(key)
            table[key] = lease
            lease.heap_seq = n
            if lease.order:
                ref = (lease.group, lease.topic, lease.queue_id)
                lock = self.locks.get(ref)
                if lock is None:
                    lock = self.locks[ref] = OrderLock([], attempt_id)
                if lease.offset not in lock.offsets:
                    lock.offsets.append(lease.offset)
                lock.attempt_id = attempt_id
                lock.counts[lease.offset] = lease.consumed + 1
        if cursor is not None:
            g, t, q, off = cursor
            self.cursors[(g, t, int(q))] = max(int(off), self.cursors.get((g, t, int(q)), 0))

    def _apply_acks(self, keys: Iterable[LeaseKey]) -> None:
        """:meth:`_apply_ack` of each key (leases of ``keys`` in flight: the checked ones)."""
        leases = self.leases
        for key in keys:
            lease = leases.pop(key, None)
            if lease is None:
                continue
            self.acked_count += 1
            if lease.order:
                self._release_order(lease)

    def _apply_ack(self, key: LeaseKey) -> None:
        lease = self.leases.pop(key, None)
        if lease is None:
            return
        self.acked_count += 1
        self._release_order(lease)

    def _apply_change(self, key: LeaseKey, now_ms: int, invisible_ms: int) -> Lease:
        lease = self.leases[key]
        lease.state = _move(lease.state, Move.CHANGE)
        lease.pop_time, lease.invisible_ms = now_ms, invisible_ms
        self._push(lease)
        return lease

    def _apply_revived(self, key: LeaseKey) -> None:
        lease = self.leases.pop(key, None)
        if lease is None:
            return
        self.revived_count += 1
        self._release_order(lease)

    def _release_order(self, lease: Lease) -> None:
        """An orderly message is done: drop it from its lock; an empty lock frees the queue."""
        if not lease.order:
            return
        ref = (lease.group, lease.topic, lease.queue_id)
        lock = self.locks.get(ref)
        if lock is None:
            return
        if lease.offset in lock.offsets:
            lock.offsets.remove(lease.offset)
            lock.counts.pop(lease.offset, None)
        if not lock.offsets:
            del self.locks[ref]


def _move(state: LeaseState, move: Move) -> LeaseState:
    """The next state for a legal move; an illegal one is a bug in the caller."""
    key = (state, move)
    if key not in MOVES:
        raise AssertionError(f"illegal in-flight move {move.value} from {state.value}")
    nxt = MOVES[key]
    return state if nxt is None else nxt


def _key(parts: Sequence[Any]) -> LeaseKey:
    return (str(parts[0]), str(parts[1]), int(parts[2]), int(parts[3]))
