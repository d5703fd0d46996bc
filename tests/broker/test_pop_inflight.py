"""The pop in-flight table with injected time (plain ints, no trio): its moves and outcomes,
the lazily cleaned deadline heap, orderly locks, cursors, a failing journal hook, replay; then
a Hypothesis state machine that drives it, with a simulated revive service and restarts from a
real :class:`~broker.pop.journal.Journal`, against a model of where every message is."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.pop.inflight import (
    MOVES,
    InflightTable,
    Lease,
    LeaseKey,
    LeaseState,
    Move,
    Op,
    Outcome,
)
from broker.pop.journal import Journal

G, T = "g", "T"


def lease(
    offset: int,
    pop_time: int = 1_000,
    invisible_ms: int = 1_000,
    *,
    group: str = G,
    topic: str = T,
    queue_id: int = 0,
    order: bool = False,
    consumed: int = 0,
) -> Lease:
    return Lease(
        group,
        topic,
        queue_id,
        offset,
        pop_time,
        invisible_ms,
        origin_topic=T,
        order=order,
        consumed=consumed,
    )


def key(offset: int, *, group: str = G, topic: str = T, queue_id: int = 0) -> LeaseKey:
    return (group, topic, queue_id, offset)


def recording() -> tuple[InflightTable, list[Op]]:
    """A table whose journal hook keeps every op."""
    ops: list[Op] = []
    return InflightTable(on_op=ops.append), ops


def observe(table: InflightTable) -> tuple[Any, ...]:
    """Everything about a table that a move could change (``next_deadline`` only drops
    stale heap entries, which is not a change)."""
    return (
        sorted((k, v.to_list(), v.state.value, v.retry_at) for k, v in table.leases.items()),
        sorted(table.cursors.items()),
        sorted(
            (ref, list(lock.offsets), lock.attempt_id, sorted(lock.counts.items()))
            for ref, lock in table.locks.items()
        ),
        table.next_deadline(),
        table.acked_count,
        table.revived_count,
    )


def persistent(table: InflightTable) -> Any:
    """What a snapshot holds, in a canonical order, as msgpack returns it."""
    state = msgpack.unpackb(msgpack.packb(table.snapshot()), strict_map_key=False)
    return {name: sorted(rows) for name, rows in state.items()}


def rebuild(snapshot: Any, ops: list[Op]) -> InflightTable:
    """A fresh table from a snapshot (or None) and the ops after it, via msgpack."""
    table = InflightTable()
    if snapshot is not None:
        table.restore(msgpack.unpackb(msgpack.packb(snapshot), strict_map_key=False))
    for op in msgpack.unpackb(msgpack.packb(ops)):
        table.apply(op)
    return table


def refuse(op: Op) -> NoReturn:
    raise OSError(28, "No space left on device")


# ------------------------------------------------------------------ the moves table
def test_moves_table_is_the_documented_state_machine() -> None:
    assert MOVES == {
        (LeaseState.INVISIBLE, Move.ACK): None,
        (LeaseState.INVISIBLE, Move.CHANGE): LeaseState.INVISIBLE,
        (LeaseState.INVISIBLE, Move.EXPIRE): LeaseState.REVIVING,
        (LeaseState.REVIVING, Move.REVIVED): None,
        (LeaseState.REVIVING, Move.RETRY): LeaseState.REVIVING,
    }


def test_illegal_moves_are_caller_bugs_and_change_nothing() -> None:
    table, ops = recording()
    table.popped([lease(0)])
    before, n_ops = observe(table), len(ops)
    with pytest.raises(AssertionError, match="revived from invisible"):
        table.revived(key(0))  # not expired: the revive service never does this
    with pytest.raises(AssertionError, match="retry from invisible"):
        table.retry_later(key(0), 5_000)
    assert observe(table) == before and len(ops) == n_ops


# ------------------------------------------------------------------ ack
def test_ack_outcomes() -> None:
    table, ops = recording()
    table.popped([lease(0, pop_time=1_000, invisible_ms=1_000)])  # deadline 2000
    before = observe(table)
    assert table.ack(key(0, group="other"), 1_000, 1_500) is Outcome.UNKNOWN
    assert table.ack(key(1), 1_000, 1_500) is Outcome.UNKNOWN
    assert table.ack(key(0, topic="%RETRY%g+T"), 1_000, 1_500) is Outcome.UNKNOWN
    assert table.ack(key(0), 1_001, 1_500) is Outcome.UNKNOWN  # newer than any receipt
    assert table.ack(key(0), 999, 1_500) is Outcome.STALE
    assert table.ack(key(0), 1_000, 2_000) is Outcome.EXPIRED  # the deadline itself is over
    assert table.ack(key(0), 1_000, 9_000) is Outcome.EXPIRED
    assert observe(table) == before and len(ops) == 1  # only the pop was journaled

    assert table.ack(key(0), 1_000, 1_999) is Outcome.OK
    assert ops[-1] == ["ack", G, T, 0, 0]
    assert len(table) == 0 and table.acked_count == 1
    assert table.next_deadline() is None
    assert table.ack(key(0), 1_000, 1_999) is Outcome.UNKNOWN  # already acked
    assert len(ops) == 2


# ------------------------------------------------------------------ change
def test_change_gives_a_new_deadline_and_receipt_and_the_old_one_is_stale() -> None:
    table, ops = recording()
    table.popped([lease(0, pop_time=1_000, invisible_ms=1_000)])  # deadline 2000
    outcome, changed = table.change(key(0), 1_000, 1_500, 3_000)
    assert outcome is Outcome.OK and changed is not None
    assert (changed.pop_time, changed.invisible_ms, changed.deadline) == (1_500, 3_000, 4_500)
    assert ops[-1] == ["chg", G, T, 0, 0, 1_500, 3_000]
    assert table.next_deadline() == 4_500  # the entry for 2000 is stale and dropped
    assert table.expire_due(4_499) == []  # past the old deadline: nothing expires

    before = observe(table)
    assert table.ack(key(0), 1_000, 2_500) is Outcome.STALE
    assert table.change(key(0), 1_000, 2_500, 10) == (Outcome.STALE, None)
    assert table.change(key(0), 1_501, 2_500, 10) == (Outcome.UNKNOWN, None)
    assert table.change(key(0), 1_500, 4_500, 10) == (Outcome.EXPIRED, None)
    assert table.change(key(1), 1_500, 2_500, 10) == (Outcome.UNKNOWN, None)
    assert observe(table) == before and len(ops) == 2

    assert table.ack(key(0), 1_500, 4_499) is Outcome.OK


def test_extend_moves_the_deadline_under_the_same_receipt_and_replays() -> None:
    """Auto-renewal: the deadline moves, the pop time (the receipt) does not; journaled as a
    change to the same pop time, so a rebuilt table agrees."""
    table, ops = recording()
    table.popped([lease(0, pop_time=1_000, invisible_ms=1_000)])  # deadline 2000
    assert table.extend(key(0), 1_000, 1_900, 61_900) is Outcome.OK
    assert ops[-1] == ["chg", G, T, 0, 0, 1_000, 60_900]
    assert table.leases[key(0)].deadline == 61_900
    assert table.expire_due(61_899) == []
    assert rebuild(None, ops).leases[key(0)].to_list() == table.leases[key(0)].to_list()
    before = observe(table)
    assert table.extend(key(0), 999, 2_000, 90_000) is Outcome.STALE  # another receipt
    assert table.extend(key(1), 1_000, 2_000, 90_000) is Outcome.UNKNOWN
    assert observe(table) == before
    assert table.ack(key(0), 1_000, 61_000) is Outcome.OK  # the first receipt still acks


def test_a_change_in_the_pop_millisecond_still_makes_the_old_receipt_stale() -> None:
    """Receipts are named by pop time: a change gets a pop time at least one ms later than
    the receipt it replaces, even within the same millisecond (and twice in a row)."""
    table, ops = recording()
    table.popped([lease(0, pop_time=1_000, invisible_ms=1_000)])
    outcome, changed = table.change(key(0), 1_000, 1_000, 5_000)
    assert outcome is Outcome.OK and changed is not None
    assert (changed.pop_time, changed.deadline) == (1_001, 6_001)
    assert ops[-1] == ["chg", G, T, 0, 0, 1_001, 5_000]  # the journal replays the same stamp
    outcome, changed = table.change(key(0), 1_001, 1_000, 5_000)
    assert outcome is Outcome.OK and changed is not None and changed.pop_time == 1_002
    assert table.ack(key(0), 1_000, 1_000) is Outcome.STALE
    assert table.ack(key(0), 1_001, 1_000) is Outcome.STALE
    assert persistent(rebuild(None, ops)) == persistent(table)
    assert table.ack(key(0), 1_002, 1_000) is Outcome.OK


# ------------------------------------------------------------------ expire / revive / retry
def test_expire_revived_and_retry_later() -> None:
    table, ops = recording()
    table.popped([lease(0, pop_time=1_000, invisible_ms=1_000)])  # deadline 2000
    assert table.expire_due(1_999) == []
    (expired,) = table.expire_due(2_000)
    assert expired.lease.key == key(0) and expired.lease.state is LeaseState.REVIVING
    assert len(ops) == 1  # expiry is not journaled: a restart simply expires it again
    assert table.next_deadline() is None  # being revived: nothing due until retry_later
    assert table.expire_due(10_000) == []

    before = observe(table)
    assert table.ack(key(0), 1_000, 2_000) is Outcome.EXPIRED
    assert table.change(key(0), 1_000, 2_000, 1_000) == (Outcome.EXPIRED, None)
    assert observe(table) == before

    # The write to the retry topic failed: due again at the retry time, still REVIVING.
    table.retry_later(key(0), 5_000)
    assert table.next_deadline() == 5_000
    assert table.expire_due(4_999) == []
    (again,) = table.expire_due(5_000)
    assert again.lease.state is LeaseState.REVIVING and len(ops) == 1

    table.revived(key(0))
    assert ops[-1] == ["rev", G, T, 0, 0]
    assert len(table) == 0 and table.revived_count == 1 and table.acked_count == 0
    assert table.ack(key(0), 1_000, 5_000) is Outcome.UNKNOWN
    table.revived(key(0))  # twice (a duplicate commit): nothing happens, nothing journaled
    table.retry_later(key(0), 9_000)
    assert len(ops) == 2 and table.revived_count == 1 and table.next_deadline() is None


# ------------------------------------------------------------------ the deadline heap
def test_deadline_heap_order_and_lazy_deletion() -> None:
    table, _ = recording()
    # deadlines: 0 -> 3000, 1 -> 1000, 2 -> 2000, 3 -> 2000 (a tie, popped after 2)
    table.popped([lease(0, 1_000, 2_000), lease(1, 1_000, 0), lease(2, 1_000, 1_000)])
    table.popped([lease(3, 1_500, 500)])
    assert table.next_deadline() == 1_000
    assert table.ack(key(1), 1_000, 900) is Outcome.OK
    assert table.next_deadline() == 2_000
    outcome, _ = table.change(key(2), 1_000, 1_200, 3_800)  # 2000 -> 5000
    assert outcome is Outcome.OK
    assert table.next_deadline() == 2_000  # lease 3 still has 2000
    assert table.ack(key(3), 1_500, 1_900) is Outcome.OK
    assert table.next_deadline() == 3_000
    # Lazy deletion: next_deadline dropped the stale entries on its way to a live one.
    assert sorted(due for due, _, _ in table._heap) == [3_000, 5_000]

    expired = table.expire_due(10_000)
    assert [(e.lease.key, e.lease.deadline) for e in expired] == [
        (key(0), 3_000),
        (key(2), 5_000),
    ]
    assert table._heap == [] and table.next_deadline() is None


def test_ties_expire_in_pop_order_and_the_limit_is_respected() -> None:
    table, _ = recording()
    table.popped([lease(o, 1_000, 1_000) for o in (5, 3, 9, 1)])
    first = table.expire_due(2_000, limit=3)
    assert [e.lease.offset for e in first] == [5, 3, 9]
    assert table.next_deadline() == 2_000
    assert [e.lease.offset for e in table.expire_due(2_000)] == [1]


def test_a_lease_expires_once_even_when_its_deadline_is_in_the_heap_twice() -> None:
    """Regression: a change of invisible time (or a same-attempt orderly re-pop in the same
    millisecond) that lands on the same deadline left two heap entries that both looked
    live, so an orderly lease expired twice (the revive service then wrote two DLQ copies,
    or woke two pops for one unblocked queue)."""
    table, _ = recording()
    table.popped([lease(0, 1_000, 1_000, order=True)], attempt_id="a1")
    outcome, _ = table.change(key(0), 1_000, 1_500, 500)  # deadline 2000 again
    assert outcome is Outcome.OK
    table.popped([lease(1, 1_000, 1_000, queue_id=1, order=True)], attempt_id="b1")
    table.popped([lease(1, 1_000, 1_000, queue_id=1, order=True)], attempt_id="b1")  # lost reply
    table.popped([lease(2, 1_000, 1_000)])
    table.change(key(2), 1_000, 1_400, 600)  # non-orderly, same deadline
    expired = table.expire_due(2_000)
    assert sorted(e.lease.key for e in expired) == [key(0), key(2), key(1, queue_id=1)]
    assert table.expire_due(2_000) == [] and table.next_deadline() is None
    # The same for a revive retried twice at the same moment.
    table.retry_later(key(2), 3_000)
    table.retry_later(key(2), 3_000)
    assert [e.lease.key for e in table.expire_due(3_000)] == [key(2)]


# ------------------------------------------------------------------ orderly locks
def test_orderly_lock_blocks_until_the_deadline_then_the_same_offsets_come_back() -> None:
    table, ops = recording()
    table.popped(
        [lease(o, 1_000, 1_000, order=True) for o in (0, 1, 2)],
        cursor=(G, T, 0, 3),
        attempt_id="a1",
    )
    assert ops[-1][0] == "pop" and ops[-1][3] == "a1"
    lock = table.order_lock(G, T, 0)
    assert lock is not None
    assert (lock.offsets, lock.attempt_id, lock.counts) == ([0, 1, 2], "a1", {0: 1, 1: 1, 2: 1})
    assert table.cursor(G, T, 0) == 3
    assert table.blocked(G, T, 0, 1_999)
    assert not table.blocked(G, T, 0, 2_000)  # deadline over: the queue is free again
    assert not table.blocked("other", T, 0, 1_500) and not table.blocked(G, T, 1, 1_500)

    # Orderly leases expire to wake a pop, but stay INVISIBLE and keep the lock.
    expired = table.expire_due(2_000)
    assert [e.lease.offset for e in expired] == [0, 1, 2]
    assert all(e.lease.state is LeaseState.INVISIBLE for e in expired)
    assert table.order_lock(G, T, 0) is lock and len(table) == 3
    assert table.ack(key(1), 1_000, 2_000) is Outcome.EXPIRED

    # The next pop takes them again, in order, counted once more, with a new attempt id.
    table.popped(
        [lease(o, 2_500, 1_000, order=True, consumed=1) for o in (0, 1, 2)], attempt_id="a2"
    )
    lock = table.order_lock(G, T, 0)
    assert lock is not None
    assert (lock.offsets, lock.attempt_id, lock.counts) == ([0, 1, 2], "a2", {0: 2, 1: 2, 2: 2})
    assert table.blocked(G, T, 0, 3_000)
    assert table.ack(key(0), 1_000, 3_000) is Outcome.STALE

    assert table.ack(key(0), 2_500, 3_000) is Outcome.OK
    lock = table.order_lock(G, T, 0)
    assert lock is not None and lock.offsets == [1, 2] and 0 not in lock.counts
    assert table.blocked(G, T, 0, 3_000)
    # At the deadline both are dead-lettered (revived): the lock goes with the last one.
    assert [e.lease.offset for e in table.expire_due(3_500)] == [1, 2]
    table.revived(key(1))
    lock = table.order_lock(G, T, 0)
    assert lock is not None and lock.offsets == [2]
    assert table.ack(key(2), 2_500, 3_500) is Outcome.EXPIRED
    table.revived(key(2))
    assert table.order_lock(G, T, 0) is None and not table.blocked(G, T, 0, 3_600)
    assert len(table) == 0


def test_orderly_same_attempt_repop_keeps_the_lock_and_counts() -> None:
    table, _ = recording()
    table.popped([lease(o, 1_000, 1_000, order=True) for o in (4, 5)], attempt_id="a1")
    # The reply was lost; the client repeats attempt a1 at once: the reader hands the same
    # offsets out again with the same consume count (count - 1 = consumed 0).
    table.popped([lease(o, 1_200, 1_000, order=True) for o in (4, 5)], attempt_id="a1")
    lock = table.order_lock(G, T, 0)
    assert lock is not None
    assert (lock.offsets, lock.attempt_id, lock.counts) == ([4, 5], "a1", {4: 1, 5: 1})
    assert table.ack(key(4), 1_000, 1_300) is Outcome.STALE  # the lost reply's receipt
    assert table.ack(key(4), 1_200, 1_300) is Outcome.OK
    assert table.next_deadline() == 2_200
    assert table.blocked(G, T, 0, 1_300)
    assert table.ack(key(5), 1_200, 1_300) is Outcome.OK  # the last one acked: lock released
    assert table.order_lock(G, T, 0) is None and not table.blocked(G, T, 0, 1_300)


def test_orderly_pop_of_nothing_moves_the_cursor_without_a_lock() -> None:
    table, _ = recording()
    table.popped([], cursor=(G, T, 0, 7), attempt_id="a1")  # all filtered out
    assert table.cursor(G, T, 0) == 7 and table.order_lock(G, T, 0) is None


# ------------------------------------------------------------------ cursors
def test_cursors() -> None:
    table, ops = recording()
    assert table.cursor(G, T, 0) is None
    table.set_cursor(G, T, 0, 10)
    assert ops[-1] == ["cur", G, T, 0, 10] and table.cursor(G, T, 0) == 10
    table.popped([lease(10), lease(11)], cursor=(G, T, 0, 12))
    assert table.cursor(G, T, 0) == 12
    table.popped([lease(5)], cursor=(G, T, 0, 6))  # never moves a cursor back
    assert table.cursor(G, T, 0) == 12
    table.set_cursor(G, T, 0, 3)  # an explicit move may (an offset fixed after retention)
    assert table.cursor(G, T, 0) == 3
    table.popped([lease(0, group="other")], cursor=("other", T, 0, 1))
    table.popped([lease(0, queue_id=2)], cursor=(G, T, 2, 1))
    assert table.cursors == {(G, T, 0): 3, ("other", T, 0): 1, (G, T, 2): 1}
    assert table.cursor(G, "%RETRY%g+T", 0) is None


# ------------------------------------------------------------------ a failing journal
def test_a_journal_that_cannot_write_leaves_the_table_unchanged() -> None:
    table, _ = recording()
    table.set_cursor(G, T, 0, 0)
    table.popped(
        [lease(0, 1_000, 1_000), lease(1, 1_000, 1_000), lease(2, 1_000, 5_000)],
        cursor=(G, T, 0, 3),
    )
    table.popped(
        [lease(o, 1_000, 1_000, queue_id=1, order=True) for o in (0, 1)],
        cursor=(G, T, 1, 2),
        attempt_id="a1",
    )
    table.change(key(1), 1_000, 1_100, 2_000)
    table.expire_due(2_000)  # lease 0 is REVIVING now
    table.retry_later(key(0), 3_000)
    table.on_op = refuse
    before = observe(table)

    attempts: list[Callable[[], object]] = [
        lambda: table.set_cursor(G, T, 0, 99),
        lambda: table.set_cursor("new", T, 0, 0),
        lambda: table.popped([lease(3, 2_000, 1_000)], cursor=(G, T, 0, 4)),
        lambda: table.popped(
            [lease(2, 2_000, 1_000, queue_id=1, order=True)], cursor=(G, T, 1, 3), attempt_id="a2"
        ),
        lambda: table.popped([], cursor=(G, T, 0, 50)),
        lambda: table.ack(key(1), 1_100, 2_000),
        lambda: table.ack(key(2), 1_000, 2_000),
        lambda: table.change(key(2), 1_000, 2_000, 9_000),
        lambda: table.revived(key(0)),
    ]
    for attempt in attempts:
        with pytest.raises(OSError, match="No space"):
            attempt()
        assert observe(table) == before
    # Refused receipts never reach the journal, so they do not raise.
    assert table.ack(key(1), 1_000, 2_000) is Outcome.STALE
    assert table.ack(key(7), 1_000, 2_000) is Outcome.UNKNOWN
    assert table.change(key(0), 1_000, 2_000, 10) == (Outcome.EXPIRED, None)
    assert observe(table) == before
    # The disk clears: the same moves succeed.
    table.on_op = lambda op: None
    assert table.ack(key(1), 1_100, 2_000) is Outcome.OK
    table.revived(key(0))
    assert len(table) == 3


# ------------------------------------------------------------------ snapshot / restore / apply
def test_replay_and_snapshot_rebuild_the_table() -> None:
    table, ops = recording()
    table.set_cursor(G, T, 0, 0)
    table.popped([lease(o, 1_000, 1_000) for o in range(4)], cursor=(G, T, 0, 4))
    table.popped(
        [lease(o, 1_000, 500, queue_id=1, order=True) for o in (0, 1)],
        cursor=(G, T, 1, 2),
        attempt_id="a1",
    )
    table.ack(key(0), 1_000, 1_100)
    table.change(key(1), 1_000, 1_100, 4_000)
    middle, mark = table.snapshot(), len(ops)
    table.expire_due(2_000)  # 2, 3 REVIVING; orderly ones expired but kept
    table.revived(key(2))
    table.popped(
        [lease(o, 2_100, 1_000, queue_id=1, order=True, consumed=1) for o in (0, 1)],
        attempt_id="a2",
    )
    table.ack(key(0, queue_id=1), 2_100, 2_200)
    table.set_cursor("other", T, 0, 5)

    assert persistent(rebuild(None, ops)) == persistent(table)
    assert persistent(rebuild(middle, ops[mark:])) == persistent(table)
    restored = rebuild(table.snapshot(), [])
    assert persistent(restored) == persistent(table)
    # A lease being revived comes back INVISIBLE with its past deadline: due at once.
    assert restored.leases[key(3)].state is LeaseState.INVISIBLE
    assert restored.next_deadline() == 2_000
    assert [e.lease.key for e in restored.expire_due(2_000)] == [key(3)]
    lock = restored.order_lock(G, T, 1)
    assert lock is not None and (lock.offsets, lock.counts) == ([1], {1: 2})
    assert restored.ack(key(1), 1_100, 2_500) is Outcome.OK  # changed receipt survives


def test_apply_tolerates_ops_for_gone_leases_and_refuses_unknown_ops() -> None:
    table = InflightTable()
    for op in (["ack", G, T, 0, 1], ["chg", G, T, 0, 1, 5, 5], ["rev", G, T, 0, 1]):
        table.apply(op)
    assert observe(table) == observe(InflightTable())
    with pytest.raises(ValueError, match="unknown pop journal op 'zap'"):
        table.apply(["zap"])


# ================================================================== the state machine
GROUPS = ("A", "B")
MAX_RECONSUME = 2
RETRY_DELAY_MS = 1_000
START_MS = 1_700_000_000_000


def retry_topic(group: str) -> str:
    return f"%RETRY%{group}+{T}"


@dataclass
class Held:
    """The model of one lease: which message (its offset in ``T``) at which reconsume count."""

    msg: int
    reconsume: int
    pop_time: int
    invisible_ms: int
    reviving: bool = False
    retry_at: int = 0

    @property
    def deadline(self) -> int:
        return self.pop_time + self.invisible_ms

    @property
    def due(self) -> int:
        return self.retry_at if self.reviving else self.deadline


Receipt = tuple[LeaseKey, int]  # (lease key, pop time)


class PopTableMachine(RuleBasedStateMachine):
    """One topic ``T`` with an endless queue 0, two groups each with its own pop retry topic,
    a revive service that copies expired leases to the retry topic (reconsume + 1) or the DLQ
    (after ``MAX_RECONSUME``), and restarts that rebuild the table from its journal."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="trimq-pop-inflight-")
        self.directory = Path(self.tmp.name)
        self.journal, recovered = Journal.open(self.directory)
        assert recovered.state is None and recovered.ops == []
        self.table = InflightTable(on_op=self.journal.append)
        self.pending_writers: list[Callable[[], None]] = []
        self.now = START_MS
        # The model.
        self.held: dict[LeaseKey, Held] = {}
        self.cursors: dict[tuple[str, str], int] = {}
        self.acked: dict[str, set[int]] = {g: set() for g in GROUPS}
        self.dlq: dict[str, list[int]] = {g: [] for g in GROUPS}
        #: Each group's retry topic, queue 0: (message, reconsume times) per offset.
        self.retry_log: dict[str, list[tuple[int, int]]] = {g: [] for g in GROUPS}
        self.deliveries: Counter[tuple[str, int]] = Counter()
        #: When each message's last lease ended by expiry (no redelivery before that).
        self.visible_from: dict[tuple[str, int], int] = {}
        self.receipts: list[Receipt] = []

    def teardown(self) -> None:
        try:
            self.journal.close()
        finally:
            self.tmp.cleanup()

    # ------------------------------------------------------------------ helpers
    def msg_of(self, lease: Lease) -> int:
        """The original message (offset in ``T``) a lease of the real table is for."""
        if lease.topic == T:
            return lease.offset
        assert lease.topic == retry_topic(lease.group)
        return self.retry_log[lease.group][lease.offset][0]

    def in_flight(self, group: str) -> list[int]:
        return [self.msg_of(v) for v in self.table.leases.values() if v.group == group]

    def expected(self, key: LeaseKey, pop_time: int) -> Outcome:
        held = self.held.get(key)
        if held is None:
            return Outcome.UNKNOWN
        if pop_time != held.pop_time:
            return Outcome.STALE if pop_time < held.pop_time else Outcome.UNKNOWN
        if held.reviving or held.deadline <= self.now:
            return Outcome.EXPIRED
        return Outcome.OK

    def draw_receipt(self, data: st.DataObject, how: str) -> Receipt:
        """A current receipt, any receipt handed out so far (stale, acked, expired...), or
        one made wrong: another group, a pop time never handed out, an offset never popped."""
        if how == "current" and self.held:
            k = data.draw(st.sampled_from(sorted(self.held)), label="current")
            return k, self.held[k].pop_time
        (group, topic, queue_id, offset), pop_time = data.draw(
            st.sampled_from(self.receipts), label="receipt"
        )
        if how == "other_group":
            group = GROUPS[1 - GROUPS.index(group)]
        elif how == "newer":
            pop_time += 1
        elif how == "wrong_offset":
            offset += 1_000
        return (group, topic, queue_id, offset), pop_time

    # ------------------------------------------------------------------ rules
    @rule(
        group=st.sampled_from(GROUPS),
        from_retry=st.booleans(),
        n=st.integers(1, 4),
        invisible_ms=st.sampled_from([1, 500, 1_000]) | st.integers(1, 3_000),
    )
    def pop(self, group: str, from_retry: bool, n: int, invisible_ms: int) -> None:
        """A non-orderly pop of up to ``n`` messages from ``T`` or the group's retry topic,
        reading from the table's cursor (as the reader does)."""
        topic = retry_topic(group) if from_retry else T
        start = self.table.cursor(group, topic, 0)
        if start is None:
            self.table.set_cursor(group, topic, 0, 0)
            self.cursors[(group, topic)] = start = 0
        assert start == self.cursors[(group, topic)]
        end = min(start + n, len(self.retry_log[group])) if from_retry else start + n
        if end == start:
            return  # nothing to read: the reader records nothing
        flying = self.in_flight(group)
        leases = []
        for offset in range(start, end):
            msg, reconsume = self.retry_log[group][offset] if from_retry else (offset, 0)
            # Never handed out twice within a visibility window, nor after it was done with.
            assert msg not in flying, (group, msg)
            assert msg not in self.acked[group] and msg not in self.dlq[group]
            assert self.now >= self.visible_from.get((group, msg), 0)
            leases.append(Lease(group, topic, 0, offset, self.now, invisible_ms, origin_topic=T))
            self.held[(group, topic, 0, offset)] = Held(msg, reconsume, self.now, invisible_ms)
            self.receipts.append(((group, topic, 0, offset), self.now))
            self.deliveries[(group, msg)] += 1
        self.table.popped(leases, cursor=(group, topic, 0, end))
        self.cursors[(group, topic)] = end

    @precondition(lambda self: self.receipts)
    @rule(
        data=st.data(),
        how=st.sampled_from(["current", "current", "any", "other_group", "newer", "wrong_offset"]),
    )
    def ack(self, data: st.DataObject, how: str) -> None:
        k, pop_time = self.draw_receipt(data, how)
        expected = self.expected(k, pop_time)
        before, size = observe(self.table), self.journal.size
        assert self.table.ack(k, pop_time, self.now) is expected
        if expected is Outcome.OK:
            held = self.held.pop(k)
            self.acked[k[0]].add(held.msg)
        else:  # a refused receipt changes nothing and journals nothing
            assert observe(self.table) == before and self.journal.size == size

    @precondition(lambda self: self.receipts)
    @rule(
        data=st.data(),
        how=st.sampled_from(["current", "current", "any", "other_group", "newer"]),
        invisible_ms=st.integers(1, 3_000),
    )
    def change(self, data: st.DataObject, how: str, invisible_ms: int) -> None:
        k, pop_time = self.draw_receipt(data, how)
        expected = self.expected(k, pop_time)
        before, size = observe(self.table), self.journal.size
        outcome, changed = self.table.change(k, pop_time, self.now, invisible_ms)
        assert outcome is expected
        if expected is Outcome.OK:
            held = self.held[k]
            stamp = max(self.now, held.pop_time + 1)  # a new receipt, even in the same ms
            assert changed is not None
            assert (changed.pop_time, changed.deadline) == (stamp, stamp + invisible_ms)
            held.pop_time, held.invisible_ms = stamp, invisible_ms
            self.receipts.append((k, stamp))
        else:
            assert changed is None
            assert observe(self.table) == before and self.journal.size == size

    @rule(ms=st.integers(0, 2_500))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule()
    def advance_to_next_deadline(self) -> None:
        """Land exactly on a deadline (where receipts turn EXPIRED)."""
        due = self.table.next_deadline()
        if due is not None:
            self.now = max(self.now, due)

    @rule(data=st.data())
    def expire_and_revive(self, data: st.DataObject) -> None:
        """What the revive service does at ``now``: every due lease exactly once, in deadline
        order; its copy goes to the retry topic (reconsume + 1) or, after the maximum, to the
        DLQ, and the lease is journaled as revived, unless the write fails (retry later)."""
        expired = self.table.expire_due(self.now)
        keys = [e.lease.key for e in expired]
        assert len(keys) == len(set(keys)), keys
        assert sorted(keys) == sorted(k for k, h in self.held.items() if h.due <= self.now)
        dues = [self.held[k].due for k in keys]
        assert dues == sorted(dues)
        for k in keys:
            held = self.held[k]
            assert self.table.leases[k].state is LeaseState.REVIVING
            if data.draw(st.integers(0, 4), label="write fails") == 0:
                self.table.retry_later(k, self.now + RETRY_DELAY_MS)
                held.reviving, held.retry_at = True, self.now + RETRY_DELAY_MS
                continue
            group = k[0]
            if held.reconsume >= MAX_RECONSUME:
                self.dlq[group].append(held.msg)
            else:
                self.retry_log[group].append((held.msg, held.reconsume + 1))
            self.table.revived(k)
            del self.held[k]
            self.visible_from[(group, held.msg)] = held.deadline

    @rule(run_writer=st.booleans())
    def rotate(self, run_writer: bool) -> None:
        """A checkpoint: a new journal generation on a snapshot, whose writer may run now,
        later, or never (a crash first)."""
        writer = self.journal.rotate(self.table.snapshot())
        if run_writer:
            writer()
        else:
            self.pending_writers.append(writer)

    @precondition(lambda self: self.pending_writers)
    @rule(data=st.data())
    def run_pending_writer(self, data: st.DataObject) -> None:
        """A snapshot writer finishes late, maybe after a newer one (which makes it a no-op)."""
        index = data.draw(st.integers(0, len(self.pending_writers) - 1), label="writer")
        self.pending_writers.pop(index)()

    @rule()
    def restart(self) -> None:
        """Crash (unrun snapshot writers never run) and rebuild the table from the journal."""
        expected = persistent(self.table)
        self.journal.close()
        self.pending_writers.clear()
        self.journal, recovered = Journal.open(self.directory)
        table = InflightTable()
        if recovered.state is not None:
            table.restore(recovered.state)
        for op in recovered.ops:
            table.apply(op)
        table.on_op = self.journal.append
        assert persistent(table) == expected
        self.table = table
        for held in self.held.values():  # REVIVING is not journaled: due again at once
            held.reviving, held.retry_at = False, 0

    # ------------------------------------------------------------------ invariants
    @invariant()
    def table_matches_the_model(self) -> None:
        assert set(self.table.leases) == set(self.held)
        for k, lease in self.table.leases.items():
            held = self.held[k]
            assert (lease.pop_time, lease.invisible_ms) == (held.pop_time, held.invisible_ms)
            assert (lease.state is LeaseState.REVIVING) == held.reviving
        assert self.table.cursors == {(g, t, 0): off for (g, t), off in self.cursors.items()}
        assert self.table.locks == {}
        due = min((h.due for h in self.held.values()), default=None)
        assert self.table.next_deadline() == due

    @invariant()
    def every_message_is_in_exactly_one_place(self) -> None:
        """In flight, acked, in the retry backlog or in the DLQ: never lost, never twice."""
        for group in GROUPS:
            retry_cursor = self.table.cursor(group, retry_topic(group), 0) or 0
            backlog = [msg for msg, _ in self.retry_log[group][retry_cursor:]]
            places = [*self.in_flight(group), *self.acked[group], *backlog, *self.dlq[group]]
            assert sorted(places) == list(range(self.table.cursor(group, T, 0) or 0))

    @invariant()
    def dead_letters_exactly_after_the_maximum(self) -> None:
        for group in GROUPS:
            for msg in self.dlq[group]:
                assert self.deliveries[(group, msg)] == MAX_RECONSUME + 1
            retry_cursor = self.table.cursor(group, retry_topic(group), 0) or 0
            for msg, reconsume in self.retry_log[group][retry_cursor:]:
                assert 1 <= reconsume <= MAX_RECONSUME
                assert self.deliveries[(group, msg)] == reconsume
        for held in self.held.values():
            assert held.reconsume <= MAX_RECONSUME
        for k, held in self.held.items():
            assert self.deliveries[(k[0], held.msg)] == held.reconsume + 1


PopTableMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
TestPopTableMachine = PopTableMachine.TestCase


# ------------------------------------------------------------------ acks of one read together
RECEIPTS = st.lists(
    st.tuples(st.integers(0, 5), st.sampled_from([1_000, 999, 1_001]), st.booleans()),
    max_size=12,
)


@settings(max_examples=300)
@given(RECEIPTS, st.sampled_from([1_500, 2_000, 2_500]))
def test_ack_each_is_one_ack_after_another_in_one_op(
    acks: list[tuple[int, int, bool]], now: int
) -> None:
    """``ack_each`` gives the outcomes and the state of one ``ack`` after another (a second
    receipt of a message acked earlier in the call is UNKNOWN), with one journal op that
    replays to the same table; a failing journal leaves the table as it was."""
    receipts = [(key(offset, queue_id=int(other)), pop_time) for offset, pop_time, other in acks]

    def fresh() -> tuple[InflightTable, list[Op]]:
        table, ops = recording()
        table.popped([lease(o, invisible_ms=1_000 + 500 * o) for o in range(4)])
        table.popped([lease(o, queue_id=1) for o in range(2)])
        ops.clear()
        return table, ops

    one_by_one, _ = fresh()
    expected = [one_by_one.ack(k, t, now) for k, t in receipts]
    grouped, ops = fresh()
    before = persistent(grouped)
    assert grouped.ack_each(receipts, now) == expected
    assert observe(grouped) == observe(one_by_one)
    acked = expected.count(Outcome.OK)
    assert len(ops) == (1 if acked else 0)
    if acked == 1:
        assert ops[0][0] == "ack"
    assert persistent(rebuild(before, ops)) == persistent(grouped)
    failing, _ = fresh()
    failing.on_op = refuse
    if acked:
        with pytest.raises(OSError, match="No space"):
            failing.ack_each(receipts, now)
    assert persistent(failing) == before
