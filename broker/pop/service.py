"""The pop engine: in-flight table + journal + reader + hub + revive, as the processors see it.

Opening it replays the journal (snapshot + ops since) into the table, so every unacked
message of a crashed broker is still due for redelivery; every checkpoint of the store
rotates the journal onto a fresh snapshot, so replay stays short.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.logs import get_logger
from broker.metrics import EventKind, MetricsWriter
from broker.pop.hub import PopHub, PopHubStatistics
from broker.pop.inflight import InflightTable, Lease, LeaseKey, Outcome
from broker.pop.journal import Journal
from broker.pop.reader import PopReader, PopRequest, PopResult
from broker.pop.renew import Renewals
from broker.pop.revive import ReviveService
from broker.storage import Storage
from broker.topics import TopicManager
from protocol.errors import IllegalNameError
from protocol.naming import V1RetryNames, pop_retry_topic_v1, pop_retry_topic_v2
from protocol.receipt import ExtraInfo

_log = get_logger("pop")


@dataclass
class PopEngine:
    """Everything pop (see the module docstring)."""

    table: InflightTable
    journal: Journal
    reader: PopReader
    hub: PopHub
    revive: ReviveService
    v1_names: V1RetryNames
    renewals: Renewals
    metrics: MetricsWriter | None = None
    #: The journal a snapshot waits for, at least; 0: a snapshot at every checkpoint.
    snapshot_min_bytes: int = 256 * 1024
    #: The table was replaced by a master's (not journaled): snapshot at the next checkpoint.
    _mirrored: bool = False

    @classmethod
    def open(
        cls,
        directory: Path,
        storage: Storage,
        topics: TopicManager,
        hub: PopHub,
        *,
        broker_name: str,
        retry_v2: bool,
        max_reconsume: Callable[[str], int],
        v1_names: V1RetryNames,
        metrics: MetricsWriter,
        poke: Callable[[], None],
        clock_ms: Callable[[], int],
        fsync: bool = False,
        snapshot_min_bytes: int = 256 * 1024,
    ) -> PopEngine:
        """Recover the table from ``directory`` and build the parts. ``v1_names`` is the
        hub's too (one owner table); ``poke`` tells the deadline loop of an earlier revive
        deadline."""
        journal, recovered = Journal.open(directory, fsync=fsync)
        table = InflightTable(on_op=journal.append)  # replay below does not journal again
        if recovered.state is not None:
            table.restore(recovered.state)
        for op in recovered.ops:
            table.apply(op)
        if recovered.torn_tail_bytes:
            _log.warning("pop journal had a torn tail", bytes=recovered.torn_tail_bytes)
        reader = PopReader(
            storage.store,
            topics,
            table,
            broker_name=broker_name,
            retry_v2=retry_v2,
            v1_names=v1_names,
        )
        revive = ReviveService(
            storage,
            topics,
            table,
            hub,
            retry_topic=reader.retry_topic,
            max_reconsume=max_reconsume,
            metrics=metrics,
            poke=poke,
            clock_ms=clock_ms,
        )
        _log.info(
            "pop state recovered",
            leases=len(table),
            cursors=len(table.cursors),
            ops=len(recovered.ops),
        )
        renewals = Renewals(table, poke)
        return cls(
            table, journal, reader, hub, revive, v1_names, renewals, metrics, snapshot_min_bytes
        )

    # ------------------------------------------------------------------ requests
    def pop_nowait(self, req: PopRequest, now_ms: int) -> PopResult:
        """Pop (see :meth:`PopReader.pop_nowait`); tells the revive loop about new deadlines."""
        result = self.reader.pop_nowait(req, now_ms)
        if result.found:
            after = self.table.next_deadline()
            if after is not None:
                self.revive.new_deadline(after)
            for reconsume, deadline in result.redelivered:
                if deadline is not None:
                    self.event(
                        EventKind.REDELIVER,
                        req,
                        latency_ms=float(now_ms - deadline),
                        reconsume_times=reconsume,
                    )
        return result

    def ack(self, key: LeaseKey, pop_time: int, now_ms: int) -> Outcome:
        """Acknowledge the receipt ``(key, pop_time)``; raises OSError when the journal
        cannot record it."""
        lease = self.table.leases.get(key)
        outcome = self.table.ack(key, pop_time, now_ms)
        if lease is not None and outcome is Outcome.OK:
            self._acked(lease, now_ms)
        return outcome

    def ack_many(self, receipts: list[tuple[LeaseKey, int]], now_ms: int) -> list[Outcome]:
        """Batch ack ``(key, pop time)`` receipts: one journal op; raises OSError when the
        journal cannot record it (then nothing changed)."""
        return self._ack_with(self.table.ack_many_leases, receipts, now_ms)

    def ack_each(self, receipts: list[tuple[LeaseKey, int]], now_ms: int) -> list[Outcome]:
        """Acknowledge ``(key, pop time)`` receipts as one :meth:`ack` after another would,
        in one journal op (:meth:`InflightTable.ack_each`); raises OSError when the journal
        cannot record it (then nothing changed)."""
        return self._ack_with(self.table.ack_each_leases, receipts, now_ms)

    def _ack_with(
        self,
        ack: Callable[[list[tuple[LeaseKey, int]], int], tuple[list[Outcome], list[Lease]]],
        receipts: list[tuple[LeaseKey, int]],
        now_ms: int,
    ) -> list[Outcome]:
        """Run a table's multi-receipt ``ack`` (one that also returns the leases it
        acknowledged), then what :meth:`_acked` does for each of them, in order: their
        latency events (one buffer call), an orderly queue's release."""
        outcomes, acked = ack(receipts, now_ms)
        if self.metrics is not None:
            self.metrics.emit_each(
                EventKind.ACK,
                [
                    (lease.origin_topic, lease.group, lease.queue_id, now_ms - lease.pop_time)
                    for lease in acked
                ],
            )
        for lease in acked:
            if lease.order:
                self._order_acked(lease)
        return outcomes

    def _acked(self, lease: Lease, now_ms: int) -> None:
        """After an ack: its latency event, and an orderly queue's release."""
        if self.metrics is not None:
            self.metrics.emit(
                EventKind.ACK,
                topic=lease.origin_topic,
                group=lease.group,
                queue=lease.queue_id,
                latency_ms=float(now_ms - lease.pop_time),
            )
        if lease.order:
            self._order_acked(lease)

    def _order_acked(self, lease: Lease) -> None:
        """An orderly queue whose last message was acked is free: wake one parked orderly
        pop of the group."""
        if self.table.order_lock(lease.group, lease.topic, lease.queue_id) is None:
            self.hub.notify(lease.topic, lease.group, lease.queue_id)

    def change(
        self, key: LeaseKey, receipt: ExtraInfo, now_ms: int, invisible_ms: int
    ) -> tuple[Outcome, Lease | None]:
        """Change invisible time; raises OSError when the journal cannot record it."""
        outcome, lease = self.table.change(key, receipt.pop_time_ms, now_ms, invisible_ms)
        if lease is not None:
            self.revive.poke()
        return outcome, lease

    def event(
        self,
        kind: EventKind,
        req: PopRequest,
        *,
        latency_ms: float,
        found: bool | None = None,
        reconsume_times: int | None = None,
    ) -> None:
        """Record a latency event of one pop request."""
        if self.metrics is not None:
            self.metrics.emit(
                kind,
                topic=req.topic,
                group=req.group,
                queue=req.queue_id if req.queue_id >= 0 else None,
                latency_ms=latency_ms,
                found=found,
                reconsume_times=reconsume_times,
            )

    # ------------------------------------------------------------------ topic state (admin)
    def reset_cursor(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """An offset reset: move the group's pop cursor on a queue to ``offset``. A group that
        never popped the queue has no cursor and starts from its committed offset anyway (the
        reset moved that), so none is created."""
        if self.table.cursor(group, topic, queue_id) is not None:
            self.table.set_cursor(group, topic, queue_id, offset)

    def retry_topics_of(self, topic: str) -> list[str]:
        """The pop retry topics that may hold redeliveries of ``topic``: for every group that
        popped it, the V2 name and the V1 name if that group owns it."""
        groups = {group for group, name, _ in self.table.cursors if name == topic}
        groups |= {
            lease.group for lease in self.table.leases.values() if lease.origin_topic == topic
        }
        names: list[str] = []
        for group in sorted(groups):
            with suppress(IllegalNameError):  # a "+" in a name: it popped with V1 names
                names.append(pop_retry_topic_v2(group, topic))
            v1 = pop_retry_topic_v1(group, topic)
            if self.v1_names.owner(v1) == (group, topic):
                names.append(v1)
        return names

    def forget_topics(self, topics: Collection[str]) -> Callable[[], None]:
        """Drop all pop state of deleted topics: leases read from them or redelivering their
        messages, cursors, orderly locks, and the V1 retry names among them. Without this a
        group's cursor outlives the topic, sits above a re-created queue's max offset, and
        the group receives nothing until the new queue passes it.

        The table has no journal op for a drop, so the drop is made durable the way a
        checkpoint is: the journal rotates onto a snapshot taken now. Returns that
        snapshot's writer (sync, then write; for a worker thread, as
        :meth:`before_checkpoint`'s): until it has run, a crash brings the state back.

        Raises:
            OSError: the journal cannot rotate (the drop has happened in memory).
        """
        gone = frozenset(topics)
        self.table.forget_topics(gone)
        for name in gone:
            owner = self.v1_names.owner(name)
            if owner is not None:
                self.v1_names.unregister(*owner)
        return self._snapshot_now()

    # ------------------------------------------------------------------ replication
    def mirror(self, state: dict[str, Any]) -> None:
        """A replica: the master's in-flight table (leases, cursors, orderly locks) replaces
        this one, made durable by the next checkpoint's snapshot (docs/design.md §13)."""
        self.table.replace(state)
        self._mirrored = True

    def adopt_replicated(self) -> None:
        """A replica becomes master: keep what its log holds of the mirrored table (see
        :meth:`InflightTable.keep_held`) and have the revive loop look at its deadlines —
        a message popped and not acked on the old master comes back at its deadline here,
        an acked one never."""
        dropped = self.table.keep_held(self.reader.store.max_offset)
        self._mirrored = True
        self.revive.poke()
        _log.info("pop state adopted", leases=len(self.table), dropped=dropped,
                  cursors=len(self.table.cursors))  # fmt: skip

    # ------------------------------------------------------------------ persistence
    def before_checkpoint(self) -> Callable[[], None]:
        """Main thread: start a new journal generation on a snapshot of the table once the
        journal has grown past what the snapshot costs; the returned writer, in the
        checkpoint's worker thread, first makes the journal durable (older generations
        included: a power loss must not leave a torn file that a snapshot does not cover)
        and then stores the snapshot.

        A snapshot costs every lease in flight, the journal only the ops since the last one:
        snapshotting every checkpoint (each second) made a broker with many messages in
        flight spend its time re-encoding the same leases. So the snapshot waits until the
        journal holds at least ``snapshot_min_bytes`` and as many bytes as
        :data:`SNAPSHOT_BYTES_PER_LEASE` per lease: its cost is spread over at least as many
        ops, and a restart replays a journal no longer than a few snapshots."""
        if self._mirrored:  # a mirrored table has no ops in the journal: snapshot it
            self._mirrored = False
            return self._snapshot_now()
        wanted = max(self.snapshot_min_bytes, SNAPSHOT_BYTES_PER_LEASE * len(self.table))
        if self.snapshot_min_bytes and self.journal.size < wanted:
            return self.journal.sync
        return self._snapshot_now()

    def _snapshot_now(self) -> Callable[[], None]:
        write = self.journal.rotate(self.table.snapshot())

        def sync_then_write() -> None:
            self.journal.sync()
            write()

        return sync_then_write

    def close(self) -> None:
        """Write a last snapshot and close the journal (after the store's final checkpoint,
        so a clean restart replays nothing)."""
        if self.journal.size or self._mirrored:
            self.journal.sync()
            self.journal.rotate(self.table.snapshot())()
        self.journal.close()

    def statistics(self) -> PopStatistics:
        """A snapshot of the pop state's counters (the hub's included)."""
        return PopStatistics(
            in_flight=len(self.table),
            cursors=len(self.table.cursors),
            acked=self.table.acked_count,
            revived=self.revive.revived,
            dead_lettered=self.revive.dead_lettered,
            hub=self.hub.statistics(),
        )


#: The journal a snapshot waits for per lease in flight, at least (a lease's journal ops take
#: about this much; see :meth:`PopEngine.before_checkpoint`).
SNAPSHOT_BYTES_PER_LEASE = 64


@dataclass(frozen=True, slots=True)
class PopStatistics:
    """What :meth:`PopEngine.statistics` reports."""

    #: Leases not yet acked or revived.
    in_flight: int
    #: (group, topic, queue) pop cursors.
    cursors: int
    acked: int
    #: Leases copied to a retry topic at their deadline, and those dead-lettered instead.
    revived: int
    dead_lettered: int
    hub: PopHubStatistics
