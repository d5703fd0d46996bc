"""Orderly consumers' queue locks, with time passed in."""

from __future__ import annotations

from broker.locks import LOCK_MAX_LIVE_S, QueueName, RebalanceLocks

Q0 = QueueName("T", "broker-a", 0)
Q1 = QueueName("T", "broker-a", 1)


def test_first_locker_wins_and_renews() -> None:
    locks = RebalanceLocks()
    assert locks.try_lock("g", "c1", (Q0, Q1), now=0) == [Q0, Q1]
    assert locks.try_lock("g", "c2", (Q0, Q1), now=1) == []
    assert locks.try_lock("g", "c1", (Q0,), now=50) == [Q0]  # renewal
    # Q1 expired (locked at 0), Q0 was renewed at 50.
    assert locks.try_lock("g", "c2", (Q0, Q1), now=LOCK_MAX_LIVE_S + 1) == [Q1]


def test_groups_are_independent_and_unlock_needs_the_holder() -> None:
    locks = RebalanceLocks()
    assert locks.try_lock("g1", "c1", (Q0,), now=0) == [Q0]
    assert locks.try_lock("g2", "c2", (Q0,), now=0) == [Q0]
    locks.unlock("g1", "c2", (Q0,))  # not the holder: no effect
    assert locks.try_lock("g1", "c2", (Q0,), now=1) == []
    locks.unlock("g1", "c1", (Q0,))
    assert locks.try_lock("g1", "c2", (Q0,), now=2) == [Q0]
    assert locks.is_locked("g1", now=3)
    assert not locks.is_locked("g3", now=3)
    assert not locks.is_locked("g1", now=2 + LOCK_MAX_LIVE_S)


def test_forget_topics_drops_the_locks_of_deleted_topics_only() -> None:
    locks = RebalanceLocks()
    a0, a1, b0 = QueueName("A", "b", 0), QueueName("A", "b", 1), QueueName("B", "b", 0)
    assert locks.try_lock("g", "c1", [a0, a1, b0], now=0) == [a0, a1, b0]
    assert locks.forget_topics(["A"]) == 2
    # A re-created A's queues are free for another client at once; B's lock stays.
    assert locks.try_lock("g", "c2", [a0, b0], now=1) == [a0]
