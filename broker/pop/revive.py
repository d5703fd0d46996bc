"""Revive at the deadline: an unacknowledged popped message goes to its group's retry topic
(or the DLQ) the moment its invisible time ends.

A :class:`~broker.deadlines.DeadlineSource`: the broker's deadline loop wakes at the earliest
lease deadline (no 1 s revive rounds, no timer-wheel rounding, no "wait 2 s for ACKs": weak spot
6). For each expired lease the original record is copied to ``%RETRY%group+topic`` (or the V1
name) with ``ORIGIN_TOPIC``, ``ORIGIN_MESSAGE_ID``, ``1ST_POP_TIME``, ``REVIVE_DEADLINE_MS`` and
its reconsume count + 1, or to ``%DLQ%group`` once it was consumed the group's maximum number of
times (RocketMQ's revive never dead-letters: weak spot 9). The copy is dispatched at once, which
wakes the owning group's parked pop through the hub.

The lease is journaled as revived only once the copy is on disk (even in ASYNC flush mode), so
a crash in between revives it again (a duplicate) rather than losing it. Orderly leases are not
copied: their queue unblocks, the hub wakes one parked orderly pop of the group, and the same
messages are popped again in order (dead-lettered past the maximum).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from broker.clock import SYSTEM_CLOCK
from broker.logs import get_logger
from broker.metrics import EventKind, MetricsWriter
from broker.pop.hub import PopHub
from broker.pop.inflight import InflightTable, Lease, LeaseKey
from broker.storage import Storage
from broker.store.api import GetStatus, MessageToStore
from broker.topics import TopicManager
from protocol.errors import RecordError
from protocol.message import SYSFLAG_TRANSACTION_MASK, MessageExt, decode_record
from protocol.naming import dlq_topic, is_retry_topic
from protocol.properties import (
    CRC32,
    FIRST_POP_TIME,
    ORIGIN_MESSAGE_ID,
    ORIGIN_TOPIC,
    POP_CK,
    REVIVE_DEADLINE_MS,
    UNIQ_KEY,
)

_log = get_logger("revive")
#: After a failed write, try again this much later.
RETRY_DELAY_MS = 1_000
#: A graceful stop waits at most this long for revived copies to reach the disk.
COMMIT_GRACE_S = 5.0


class ReviveService:
    """Moves expired leases to retry topics or the DLQ (see the module docstring)."""

    def __init__(
        self,
        storage: Storage,
        topics: TopicManager,
        table: InflightTable,
        hub: PopHub,
        *,
        retry_topic: Callable[[str, str], str],
        max_reconsume: Callable[[str], int],
        metrics: MetricsWriter | None = None,
        poke: Callable[[], None] = lambda: None,
        clock_ms: Callable[[], int] = SYSTEM_CLOCK.now_ms,
    ) -> None:
        self.clock_ms = clock_ms
        self.storage = storage
        self.store = storage.store
        self.topics = topics
        self.table = table
        self.hub = hub
        self.retry_topic = retry_topic
        self.max_reconsume = max_reconsume
        self.metrics = metrics
        self.poke = poke
        #: What :meth:`next_deadline_ms` last answered (None: nothing, or never asked).
        self._told: int | None = None
        self.revived = 0
        self.dead_lettered = 0
        self.unblocked = 0

    def next_deadline_ms(self) -> int | None:
        """The earliest lease deadline (what the deadline loop asks each round; the answer is
        remembered for :meth:`new_deadline`)."""
        told = self._told = self.table.next_deadline()
        return told

    def new_deadline(self, deadline_ms: int) -> None:
        """A lease now ends at ``deadline_ms``: poke the deadline loop unless it wakes by then
        anyway. It sleeps until at most what this source last told it (the least of its
        sources' answers at the top of its round), so only an earlier deadline needs a poke;
        a pop into a table emptied by acks since that answer no longer wakes it for
        nothing."""
        if self._told is None or deadline_ms < self._told:
            self.poke()

    def fire_due(self, now_ms: int, nursery: trio.Nursery) -> None:
        """Copy every expired lease now; journal them once the copies are durable."""
        written: list[tuple[LeaseKey, int]] = []
        for expired in self.table.expire_due(now_ms):
            lease = expired.lease
            if lease.order and lease.consumed < self.max_reconsume(lease.group):
                self._unblock(lease)
                continue
            end = self._copy(lease, now_ms)
            if end is None:
                self.table.retry_later(lease.key, now_ms + RETRY_DELAY_MS)
            elif end >= 0:
                written.append((lease.key, end))
        if written:
            nursery.start_soon(self._commit, written)

    def _unblock(self, lease: Lease) -> None:
        """An orderly message's time is up: its queue is free again for the group."""
        self.unblocked += 1
        self.hub.notify(lease.topic, lease.group, lease.queue_id)

    def _copy(self, lease: Lease, now_ms: int) -> int | None:
        """Write the retry (or DLQ) copy; its end offset, -1 when there is nothing to copy
        (the lease is dropped), None when the write failed (retry later)."""
        got = self.store.get(lease.topic, lease.queue_id, lease.offset, 1)
        if got.status is not GetStatus.FOUND or got.offsets[0] != lease.offset:
            _log.warning(
                "expired pop lease has no message any more (retention?)",
                topic=lease.topic,
                queue=lease.queue_id,
                offset=lease.offset,
            )
            self._forget(lease.key)
            return -1
        try:
            msg, _ = decode_record(got.body)
        except RecordError as exc:
            _log.error("cannot decode expired pop message", error=str(exc), topic=lease.topic)
            self._forget(lease.key)
            return -1
        copy, dead = self._retry_copy(lease, msg)
        self.topics.ensure(copy.topic, 1)
        result = self.store.put_nowait(copy)
        if not result.ok:
            _log.warning(
                "revive write refused; will retry",
                topic=copy.topic,
                status=result.status.value,
                remark=result.remark,
            )
            return None
        self._record(lease, copy, dead, now_ms)
        return result.end_offset

    def _retry_copy(self, lease: Lease, msg: MessageExt) -> tuple[MessageToStore, bool]:
        props = {k: v for k, v in msg.properties.items() if k not in (CRC32, POP_CK)}
        props.setdefault(ORIGIN_TOPIC, lease.origin_topic)
        props.setdefault(ORIGIN_MESSAGE_ID, props.get(UNIQ_KEY) or msg.offset_msg_id)
        props.setdefault(FIRST_POP_TIME, str(lease.pop_time))
        props[REVIVE_DEADLINE_MS] = str(lease.deadline)
        consumed = lease.consumed if lease.order else msg.reconsume_times
        dead = consumed >= self.max_reconsume(lease.group)
        if dead:
            topic = dlq_topic(lease.group)
        elif is_retry_topic(lease.topic) and not lease.order:
            topic = lease.topic  # already a retry: stays in its retry topic
        else:
            topic = self.retry_topic(lease.group, lease.origin_topic)
        copy = MessageToStore(
            topic,
            0,
            msg.body,
            props,
            msg.flag,
            # A retry copy is no transaction's commit (only those carry the commit bits).
            msg.sys_flag & ~SYSFLAG_TRANSACTION_MASK,
            msg.born_timestamp,
            msg.born_host,
            consumed + 1,
        )
        return copy, dead

    def _record(self, lease: Lease, copy: MessageToStore, dead: bool, now_ms: int) -> None:
        if dead:
            self.dead_lettered += 1
        else:
            self.revived += 1
        if self.metrics is not None:
            self.metrics.emit(
                EventKind.DLQ if dead else EventKind.REVIVE,
                topic=lease.origin_topic,
                group=lease.group,
                queue=lease.queue_id,
                latency_ms=float(now_ms - lease.deadline),
                retry_topic=copy.topic,
                origin_topic=lease.origin_topic,
                reconsume_times=copy.reconsume_times,
            )

    async def _commit(self, written: list[tuple[LeaseKey, int]]) -> None:
        """Journal the leases as revived once their copies are durable."""
        end = max(e for _, e in written)
        ok = False
        with trio.CancelScope(shield=True), trio.move_on_after(COMMIT_GRACE_S):
            ok = await self.storage.wait_durable(end, even_async=True)
        if not ok:
            # The copies may be in the log after all: a later retry can duplicate, never lose.
            _log.warning("revived copies not confirmed durable; revive again later", n=len(written))
        retry_at = self.clock_ms() + RETRY_DELAY_MS
        for key, _ in written:
            if ok:
                self._forget(key)
            else:
                self.table.retry_later(key, retry_at)
        self.poke()

    def _forget(self, key: LeaseKey) -> None:
        """Journal a lease as done; if the journal refuses, keep it and try again later."""
        try:
            self.table.revived(key)
        except OSError as exc:
            _log.error("pop journal write failed; lease kept", error=str(exc))
            self.table.retry_later(key, self.clock_ms() + RETRY_DELAY_MS)
