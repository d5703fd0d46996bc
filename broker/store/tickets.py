"""Small records the store passes around: pending dispatches, flush and checkpoint tickets,
statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

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
class StoreStats:
    """Counters for ``statistics()``."""

    puts: int = 0
    put_errors: int = 0
    listener_errors: int = 0
    recovered_records: int = 0
    recovery_stop_reason: str = ""
    recovery_scanned_from: int = -1
    last_disk_error: str = ""
    extra: dict[str, int] = field(default_factory=dict)
