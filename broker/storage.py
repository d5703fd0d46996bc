"""The trio side of the store: group commit, periodic flush and checkpoints.

``MessageStore`` is synchronous and never blocks on fsync by itself; this module owns the
tasks that do. One flusher task runs group commits: whenever puts are waiting for
durability (SYNC mode) or the flush interval has passed (ASYNC mode), it writes the log out,
fsyncs in a worker thread and then wakes every put whose record is now durable — one fsync for
however many producers are waiting. A checkpoint task advances the recovery checkpoint.
A retention task deletes expired segments daily or when the disk fills. All are owned by
the nursery of :func:`serve_storage`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, TypeVar

import trio

from broker.logs import get_logger
from broker.offload import Offload, run_in_thread
from broker.store.api import FlushMode, MessageToStore, PutResult, PutStatus
from broker.store.checkpoint import Checkpoint
from broker.store.store import MessageStore
from broker.store.tickets import CheckpointTicket, FlushTicket

T = TypeVar("T")


_log = get_logger("storage")


@dataclass(frozen=True, slots=True)
class StorageStatistics:
    """A snapshot of a :class:`Storage`'s counters (:meth:`Storage.statistics`)."""

    #: Group commits completed (flushes; a checkpoint's own fsyncs are not counted).
    fsyncs: int
    #: Flushes and checkpoints that failed with a disk error (their waiting puts failed).
    disk_errors: int
    #: Puts waiting now for their record to become durable.
    waiting: int


@dataclass(slots=True)
class _Waiter:
    end: int
    event: trio.Event = field(default_factory=trio.Event)
    ok: bool = False


class Storage:
    """Async facade over a :class:`MessageStore` (create with :func:`serve_storage`)."""

    def __init__(self, store: MessageStore, offload: Offload = run_in_thread) -> None:
        self.store = store
        self._offload = offload
        self._waiters: list[_Waiter] = []
        self._wake = trio.Event()
        self._fsyncs = 0
        self._disk_errors = 0
        self._swept: tuple[int, int] | None = None  # (year, day) of the last scheduled run
        #: Fsyncs running in worker threads now (a truncation waits until there are none).
        self._offloaded = 0
        self._quiet = trio.Event()
        #: The checkpoint file this object wrote last (its timestamp zeroed) and the store's
        #: checkpoint count after it: a checkpoint that would write the same finds it there.
        self._saved: tuple[Checkpoint, int] | None = None

    async def put(self, msg: MessageToStore) -> PutResult:
        """Store one message; in SYNC mode return only once it is durable.

        A failed fsync turns the answer into ``DISK_ERROR`` (the record stays in the log and
        may still be delivered: at-least-once, as with a producer retry).
        """
        result = self.store.put_nowait(msg)
        if not result.ok or await self.wait_durable(result.end_offset):
            return result
        return self.not_durable()

    async def put_many(self, msgs: Sequence[MessageToStore]) -> list[PutResult]:
        """Store messages back to back, as one unit (a batch send): nothing else is appended
        between them, so messages of one queue get consecutive queue offsets. Stops at the
        first refused message; in SYNC mode returns once the last one is durable (one wait,
        not one per message).

        Returns one result per stored message, plus a final failed one (the refusal, or
        ``DISK_ERROR`` when the fsync failed) unless every message was stored durably.
        """
        results: list[PutResult] = []
        for msg in msgs:  # no await in this loop: that is what keeps the batch together
            result = self.store.put_nowait(msg)
            results.append(result)
            if not result.ok:
                return results
        if results and not await self.wait_durable(results[-1].end_offset):
            results.append(self.not_durable())
        return results

    def not_durable(self) -> PutResult:
        """The answer to a put its fsync failed to make durable (the record stays in the log
        and may still be delivered: at-least-once, as with a producer retry)."""
        return PutResult(PutStatus.DISK_ERROR, remark=self.store.statistics().last_disk_error)

    async def wait_durable(self, end_offset: int, *, even_async: bool = False) -> bool:
        """Wait until the log is durable up to ``end_offset`` (at once in ASYNC mode unless
        ``even_async``, which asks for a flush now and waits for it); False when the fsync
        failed.

        ``even_async`` serves state kept outside the log that must never be ahead of it
        (a pop lease journaled as revived only once its retry copy is on disk).
        """
        if self.store.config.flush_mode is FlushMode.ASYNC and not even_async:
            return True
        if self.store.durable_offset >= end_offset:
            return True
        waiter = _Waiter(end_offset)
        self._waiters.append(waiter)
        self._wake.set()
        await waiter.event.wait()
        return waiter.ok

    async def flush_once(self) -> None:
        """One group commit: everything appended so far becomes durable."""
        store = self.store
        if await self._in_thread(
            store.flush_begin, store.flush_sync, store.flush_end, idle=self._nothing_to_sync
        ):
            self._fsyncs += 1

    def _nothing_to_sync(self, ticket: FlushTicket) -> bool:
        """Whether a flush has no descriptor to fsync and nothing to make durable (an idle
        or read-only broker's periodic flush): then it needs no worker thread."""
        return not ticket.fds and ticket.target <= self.store.durable_offset

    async def _in_thread(
        self,
        begin: Callable[[], T],
        sync: Callable[[T], None],
        end: Callable[[T], object],
        *,
        idle: Callable[[T], bool] | None = None,
    ) -> bool:
        """Run a store ``*_begin/_sync/_end`` triple, the blocking ``_sync`` in a worker
        thread (``offload``); then wake the puts it made durable, or fail them all on a disk
        error. A ticket ``idle`` says has nothing to sync skips the thread (and ``sync``)."""
        try:
            ticket = begin()
            if idle is None or not idle(ticket):
                self._offloaded += 1
                try:
                    await self._offload(partial(sync, ticket))
                finally:
                    self._offloaded -= 1
                    if not self._offloaded:
                        self._quiet.set()
                        self._quiet = trio.Event()
        except OSError as exc:
            self._disk_errors += 1
            self.store.note_disk_error(exc)
            self._release(ok=False)
            return False
        end(ticket)
        self._release(ok=True)
        return True

    async def truncate_to(self, offset: int) -> int:
        """Cut a replica's log back to ``offset`` (``MessageStore.truncate_to``; returns the
        bytes cut) once no fsync runs in a worker thread: a truncation closes the
        descriptors of the segments it deletes, which such an fsync may hold. It runs on
        the trio thread in one step, so no new fsync starts meanwhile (blocking, but rare:
        once per diverged handshake)."""
        while self._offloaded:  # each wait ends when an offloaded fsync returns
            await self._quiet.wait()
        self._saved = None  # the truncation writes a checkpoint file of its own
        return self.store.truncate_to(offset)

    def _release(self, *, ok: bool) -> None:
        durable = self.store.durable_offset
        keep: list[_Waiter] = []
        for w in self._waiters:
            if not ok or w.end <= durable:
                w.ok = ok
                w.event.set()
            else:
                keep.append(w)
        self._waiters = keep

    def statistics(self) -> StorageStatistics:
        """A snapshot of the counters."""
        return StorageStatistics(
            fsyncs=self._fsyncs, disk_errors=self._disk_errors, waiting=len(self._waiters)
        )

    async def run_flusher(self) -> None:
        """Group-commit loop: flush when puts wait (SYNC) or every interval (ASYNC)."""
        interval = self.store.config.flush_interval_s
        sync = self.store.config.flush_mode is FlushMode.SYNC
        while True:
            with trio.move_on_after(math.inf if sync else interval):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.flush_once()

    async def checkpoint_once(self, hooks: Sequence[CheckpointHook] = ()) -> None:
        """Advance the recovery checkpoint (fsyncs in a worker thread), first running the
        writers ``hooks`` return (see :data:`CheckpointHook`).

        A checkpoint that finds nothing to make durable (no log bytes, queue entries, key
        index rows or consumer offsets written since the last one) and would write the same
        file as the last one this object wrote, but for its timestamp, leaves that file
        alone (its ``atomic_write`` is two fsyncs and a rename, every second on an idle or
        pop-only broker); the hooks' writers still run."""
        store = self.store
        writers = [hook() for hook in hooks]
        skip = False

        def begin() -> CheckpointTicket:
            nonlocal skip
            ticket = store.checkpoint_begin()
            skip = self._unchanged(ticket)
            return ticket

        def sync(ticket: CheckpointTicket) -> None:
            for write in writers:
                write()
            if not skip:
                store.checkpoint_sync(ticket)

        def end(ticket: CheckpointTicket) -> None:
            store.checkpoint_end(ticket)
            self._saved = (_timeless(ticket.checkpoint), store.statistics().checkpoints)

        await self._in_thread(begin, sync, end)

    def _unchanged(self, ticket: CheckpointTicket) -> bool:
        """Whether ``ticket`` has nothing to write but a checkpoint file equal to the last
        one written through this object (no other checkpoint of the store since)."""
        saved = self._saved
        return (
            saved is not None
            and not ticket.flush.fds
            and ticket.flush.target <= self.store.durable_offset
            and not ticket.queue_fds
            and ticket.offsets_snapshot is None
            and not ticket.index_rows
            and saved[1] == self.store.statistics().checkpoints
            and saved[0] == _timeless(ticket.checkpoint)
        )

    def retention_once(self, now: float) -> int:
        """Delete expired segments if the disk is full past the ratio, or if this is the
        daily deletion hour and it has not run today."""
        local = time.localtime(now)
        day = (local.tm_year, local.tm_yday)
        scheduled = local.tm_hour == self.store.config.delete_when_hour and day != self._swept
        if scheduled:
            self._swept = day
        deleted = self.store.delete_expired(now, scheduled=scheduled)
        self._check_disk()
        return deleted

    def _check_disk(self) -> None:
        """Refuse writes while the disk is past ``disk_full_ratio`` (logged when it changes)."""
        was = self.store.disk_full
        now = self.store.check_disk()
        if (was is None) != (now is None):
            limit = self.store.config.disk_full_ratio
            if now is not None:
                _log.warning("disk full: writes refused", used=round(now, 3), limit=limit)
            else:
                _log.warning("disk space back: writes accepted", limit=limit)

    async def run_retention(self) -> None:
        """Retention loop."""
        while True:
            await trio.sleep(self.store.config.retention_check_interval_s)
            self.retention_once(self.store.config.clock.now_s())

    async def run_checkpointer(self, hooks: Sequence[CheckpointHook] = ()) -> None:
        """Checkpoint loop."""
        while True:
            await trio.sleep(self.store.config.checkpoint_interval_s)
            await self.checkpoint_once(hooks)

    async def serve(
        self,
        hooks: Sequence[CheckpointHook] = (),
        *,
        task_status: trio.TaskStatus[Storage] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run the flusher, checkpointer and retention tasks until cancelled; then flush,
        run ``hooks`` a last time and close the store cleanly (shielded). Started with
        itself."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.run_flusher)
                nursery.start_soon(self.run_checkpointer, hooks)
                nursery.start_soon(self.run_retention)
                task_status.started(self)
        finally:
            with trio.CancelScope(shield=True):
                await self.flush_once()
                for hook in hooks:
                    hook()()
                self.store.close()


def _timeless(checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` but for its timestamp (``written_at_ms``: for operators only)."""
    return dataclasses.replace(checkpoint, written_at_ms=0)


#: Called on the trio thread before each checkpoint; returns a blocking writer that runs in
#: the worker thread before the checkpoint file is written (state that must never be older
#: than the checkpoint, such as the timer service's progress or the pop journal's snapshot).
CheckpointHook = Callable[[], Callable[[], None]]


async def serve_storage(
    store: MessageStore,
    hooks: Sequence[CheckpointHook] = (),
    *,
    task_status: trio.TaskStatus[Storage] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a :class:`Storage` over ``store`` until cancelled (see :meth:`Storage.serve`)."""
    await Storage(store).serve(hooks, task_status=task_status)


K = TypeVar("K", bound=Hashable)


class PendingDurable(Generic[K]):
    """Records a service wrote and now waits to see durable, by the service's key (a timer
    delivery, a transaction's decision): a checkpoint taken meanwhile may already cover them
    — recovery would then not rescan the log for them — so the service's own progress must
    count the ones below the durable offset (:meth:`durable_keys`) as done."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._ends: dict[K, int] = {}

    async def wait(self, key: K, end_offset: int, *, even_async: bool = False) -> bool:
        """Wait until the record ending at ``end_offset`` is durable (see
        :meth:`Storage.wait_durable`), tracked under ``key`` meanwhile."""
        self._ends[key] = end_offset
        try:
            return await self._storage.wait_durable(end_offset, even_async=even_async)
        finally:
            del self._ends[key]

    def durable_keys(self) -> list[K]:
        """The keys whose records are durable already (for a checkpoint's snapshot)."""
        durable = self._storage.store.durable_offset
        return [key for key, end in self._ends.items() if end <= durable]

    def __contains__(self, key: object) -> bool:
        return key in self._ends

    def __len__(self) -> int:
        return len(self._ends)
