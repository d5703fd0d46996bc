"""The master's view of its replicas: who is connected, how far each has acknowledged, and
the wait sync replication puts a send through (RocketMQ's ``GroupTransferService``).

A send in sync mode is first checked by :meth:`ReplicaSet.shortfall`: with fewer replicas
in sync (connected) than it needs it is refused *before* its append (SLAVE_NOT_AVAILABLE,
Kafka's NotEnoughReplicas), so a producer's retry cannot duplicate it. Once stored (and
durable as its flush mode says) it waits until ``needed`` replicas have reported a log end
at or past the record's end, and gives up after ``timeout_s`` (``TIMEOUT``,
FLUSH_SLAVE_TIMEOUT: the message stays stored, as in RocketMQ and Kafka). A replica that
drops out during that wait may come back within it. Everything here runs on the trio
thread; waits use trio's clock, so tests under a mock clock own time.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import trio


class SyncOutcome(enum.Enum):
    """What a sync-replication wait found."""

    OK = "OK"
    #: Too few replicas acknowledged in time (FLUSH_SLAVE_TIMEOUT, 12).
    TIMEOUT = "TIMEOUT"


@dataclass(frozen=True, slots=True)
class ReplicationPolicy:
    """``--replication``, ``--min-insync-replicas`` and ``--replica-timeout-ms``."""

    sync: bool = False
    #: Copies a sync send needs, the master's own included (RocketMQ ``inSyncReplicas``).
    min_insync_replicas: int = 1
    timeout_s: float = 3.0

    @property
    def needed(self) -> int:
        """Replica acknowledgements a sync send waits for (the master counts as one)."""
        return max(0, self.min_insync_replicas - 1) if self.sync else 0


@dataclass(slots=True)
class Replica:
    """One connected replica as the master sees it."""

    broker_id: int
    peer: str
    #: The replica's log end: every byte before it is on the replica.
    acked: int
    #: Unique per connection (a replica that reconnects is a new entry).
    serial: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """A replica in :class:`ReplicationStatistics`."""

    broker_id: int
    peer: str
    acked: int


@dataclass(frozen=True, slots=True)
class ReplicationStatistics:
    """A snapshot of :class:`ReplicaSet`'s state and counters."""

    replicas: tuple[ReplicaInfo, ...]
    #: The log end that ``needed`` replicas have acknowledged (-1: not enough connected).
    confirmed: int
    waiting: int
    sync_ok: int
    sync_timeouts: int
    #: Sync sends refused before their append: too few replicas in sync.
    sync_not_available: int


@dataclass(slots=True)
class _Waiter:
    end: int
    event: trio.Event = field(default_factory=trio.Event)


class ReplicaSet:
    """Connected replicas and the sends waiting for their acknowledgements."""

    def __init__(
        self, policy: ReplicationPolicy, on_confirmed: Callable[[int], None] | None = None
    ) -> None:
        self.policy = policy
        #: Told each new :attr:`high_water` while sync replication needs acknowledgements:
        #: a sync master's store serves reads only up to it (docs/design.md §13).
        self.on_confirmed = on_confirmed
        self._replicas: dict[int, Replica] = {}
        self._waiters: list[_Waiter] = []
        self._serials = itertools.count(1)
        self._ok = self._timeouts = self._not_available = 0
        self._changed = trio.Event()
        #: The largest offset ever confirmed (:meth:`confirmed` may fall back when a replica
        #: disconnects; what was once held by enough copies stays confirmed).
        self.high_water = 0
        self._raised = trio.Event()

    # ------------------------------------------------------------------ the HA server's side
    def connected(self, broker_id: int, peer: str, offset: int) -> Replica:
        """A replica connected, its log ending at ``offset``."""
        replica = Replica(broker_id, peer, offset, next(self._serials))
        self._replicas[replica.serial] = replica
        self._release()
        self._raise_high_water()
        self._change()
        return replica

    def acked(self, replica: Replica, offset: int) -> None:
        """``replica`` reports its log ending at ``offset``: release the sends it completes."""
        replica.acked = max(replica.acked, offset)
        self._release()
        self._raise_high_water()
        self._change()

    def _raise_high_water(self) -> None:
        confirmed = self.confirmed()
        if confirmed > self.high_water:
            self.high_water = confirmed
            if self.on_confirmed is not None and self.policy.needed:
                self.on_confirmed(confirmed)
            self._raised.set()
            self._raised = trio.Event()

    async def wait_high_water_above(self, offset: int) -> int:
        """Return :attr:`high_water` once it is past ``offset`` (callers bound the wait)."""
        while self.high_water <= offset:  # each pass waits for a raise
            await self._raised.wait()
        return self.high_water

    def disconnected(self, replica: Replica) -> None:
        """The replica's connection ended (its waiting sends run into their timeout)."""
        self._replicas.pop(replica.serial, None)
        self._change()

    def _change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_until(self, check: Callable[[ReplicationStatistics], bool]) -> None:
        """Return once ``check`` holds for the statistics (re-checked on every connect,
        acknowledgement, disconnect and new waiting send; callers bound the wait)."""
        while not check(self.statistics()):
            await self._changed.wait()

    def confirmed(self) -> int:
        """The largest log end ``needed`` replicas have all reached (-1 when fewer are
        connected; the master's own log when none are needed is not tracked here)."""
        needed = max(1, self.policy.needed)
        acks = sorted((r.acked for r in self._replicas.values()), reverse=True)
        return acks[needed - 1] if len(acks) >= needed else -1

    def _release(self) -> None:
        if not self._waiters:
            return
        confirmed = self.confirmed()
        keep: list[_Waiter] = []
        for waiter in self._waiters:
            if waiter.end <= confirmed:
                waiter.event.set()
            else:
                keep.append(waiter)
        self._waiters = keep

    # ------------------------------------------------------------------ the send path
    def shortfall(self) -> str | None:
        """Why a sync send must be refused before its append — too few replicas in sync
        (connected) — or None when it may go ahead (always in async mode)."""
        needed, in_sync = self.policy.needed, len(self._replicas)
        if in_sync >= needed:
            return None
        self._not_available += 1
        return (
            f"not enough replicas in sync: {in_sync} in sync, {needed} needed "
            f"(min-insync-replicas {self.policy.min_insync_replicas}, the master counts as "
            "one); the message was not stored"
        )

    async def wait_replicated(self, end_offset: int) -> SyncOutcome:
        """Wait until enough replicas hold the log up to ``end_offset`` (see the module
        docstring); at once ``OK`` in async mode."""
        if self.policy.needed == 0:
            return SyncOutcome.OK
        if self.confirmed() >= end_offset:
            self._ok += 1
            return SyncOutcome.OK
        waiter = _Waiter(end_offset)
        self._waiters.append(waiter)
        self._change()
        with trio.move_on_after(self.policy.timeout_s):
            await waiter.event.wait()
            self._ok += 1
            return SyncOutcome.OK
        if waiter in self._waiters:
            self._waiters.remove(waiter)
            self._change()
        self._timeouts += 1
        return SyncOutcome.TIMEOUT

    def statistics(self) -> ReplicationStatistics:
        """A snapshot (replicas by broker id)."""
        replicas = sorted(self._replicas.values(), key=lambda r: (r.broker_id, r.serial))
        return ReplicationStatistics(
            replicas=tuple(ReplicaInfo(r.broker_id, r.peer, r.acked) for r in replicas),
            confirmed=self.confirmed(),
            waiting=len(self._waiters),
            sync_ok=self._ok,
            sync_timeouts=self._timeouts,
            sync_not_available=self._not_available,
        )
