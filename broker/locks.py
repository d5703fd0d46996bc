"""Queue locks of orderly consumers (RocketMQ's ``RebalanceLockManager``).

A (group, queue) is locked by one client id; the lock lives 60 s unless renewed (orderly
consumers renew every 20 s); a client locking what it already holds renews it; a lock held by
another client past its expiry can be taken. Queues are named by :class:`QueueName`, not by
a front end's wire type.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: ``rocketmq.broker.rebalance.lockMaxLiveTime``
LOCK_MAX_LIVE_S = 60.0


@dataclass(frozen=True, order=True, slots=True)
class QueueName:
    """One queue of a topic on one broker group (RocketMQ's ``MessageQueue``)."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass
class _Lock:
    client_id: str
    expires: float


@dataclass
class RebalanceLocks:
    """(group, queue) → holder, with expiry in ``trio.current_time()`` seconds."""

    locks: dict[tuple[str, QueueName], _Lock] = field(default_factory=dict)

    def try_lock(
        self, group: str, client_id: str, mqs: Iterable[QueueName], now: float
    ) -> list[QueueName]:
        """Lock (or renew) every queue that is free, expired or already ours."""
        granted = []
        for mq in mqs:
            held = self.locks.get((group, mq))
            if held is None or held.client_id == client_id or held.expires <= now:
                self.locks[(group, mq)] = _Lock(client_id, now + LOCK_MAX_LIVE_S)
                granted.append(mq)
        return granted

    def unlock(self, group: str, client_id: str, mqs: Iterable[QueueName]) -> None:
        """Release the queues ``client_id`` holds."""
        for mq in mqs:
            held = self.locks.get((group, mq))
            if held is not None and held.client_id == client_id:
                del self.locks[(group, mq)]

    def forget_topics(self, topics: Iterable[str]) -> int:
        """Drop every lock on the queues of ``topics`` (deleted: a re-created topic starts
        with free queues); returns how many were dropped."""
        names = set(topics)
        doomed = [ref for ref in self.locks if ref[1].topic in names]
        for ref in doomed:
            del self.locks[ref]
        return len(doomed)

    def is_locked(self, group: str, now: float) -> bool:
        """Whether ``group`` holds any live lock (orderly consumption in progress)."""
        return any(g == group and lock.expires > now for (g, _), lock in self.locks.items())
