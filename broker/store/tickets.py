"""Small records the store passes around: pending dispatches, flush and checkpoint tickets,
statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.store.checkpoint import Checkpoint
from broker.store.index import Batch


@dataclass(slots=True)
class Pending:
    """A record appended but not yet dispatched (SYNC mode waits for its fsync)."""

    end: int
    topic: str
    queue_id: int
    queue_offset: int
    offset: int
    size: int
    tags_code: int
    store_timestamp: int
    properties: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class FlushTicket:
    """One group commit in progress: what ``flush_sync`` must fsync, and up to where
    (``generation``: the commit log's write-out it covers, see ``CommitLog.synced``)."""

    target: int
    fds: tuple[int, ...]
    generation: int


@dataclass(frozen=True, slots=True)
class CheckpointTicket:
    """One checkpoint in progress (see the module docstring)."""

    flush: FlushTicket
    queue_fds: tuple[int, ...]
    checkpoint: Checkpoint
    offsets_snapshot: bytes | None
    offsets_changes: int
    index_rows: Batch


@dataclass(slots=True)
class StoreCounters:
    """The store's mutable counters, bumped in place on the put path; read them through
    ``MessageStore.statistics()``, which copies them into a :class:`StoreStatistics`."""

    puts: int = 0
    put_errors: int = 0
    listener_errors: int = 0
    checkpoints: int = 0
    recovered_records: int = 0
    recovery_stop_reason: str = ""
    recovery_scanned_from: int = -1
    last_disk_error: str = ""


@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """A snapshot of a ``MessageStore``'s counters (``MessageStore.statistics()``)."""

    #: Records appended since the store was opened.
    puts: int
    #: Puts refused with ``DISK_ERROR`` because the log could not be written out.
    put_errors: int
    #: Exceptions raised by the arrival listener (swallowed: dispatch carries on).
    listener_errors: int
    #: Checkpoints completed since the store was opened.
    checkpoints: int
    #: Records re-dispatched by recovery when the store was opened (0 after a clean close).
    recovered_records: int
    #: Why recovery's scan stopped ("" when there was no scan).
    recovery_stop_reason: str
    #: Commit-log offset recovery rescanned from; -1 when the store was closed cleanly.
    recovery_scanned_from: int
    #: The last disk error, as a put's ``DISK_ERROR`` remark ("" if none yet).
    last_disk_error: str
