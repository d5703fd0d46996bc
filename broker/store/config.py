"""Store settings. Names and defaults follow RocketMQ's ``MessageStoreConfig`` where it has one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from broker.clock import SYSTEM_CLOCK, Clock, DiskProbe, disk_used_ratio
from broker.store.api import FlushMode

GIB = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Everything the storage engine needs to know.

    Attributes:
        data_dir: root of ``commitlog/``, ``consumequeue/``, ``config/``, ``checkpoint``…
        segment_size: commit-log segment size (``mappedFileSizeCommitLog``, 1 GiB).
        cq_entries_per_file: consume-queue file size in 20-byte entries (300 000).
        flush_mode: ``ASYNC`` (fsync on an interval) or ``SYNC`` (a put waits for its fsync).
        flush_interval_s: async fsync period (RocketMQ ``flushIntervalCommitLog`` is 0.5 s).
        checkpoint_interval_s: how often the recovery checkpoint is advanced; a crash rescans
            at most the data written since (RocketMQ forces its checkpoint only every 60 s).
        max_message_size: largest body accepted (``maxMessageSize``, 4 MiB).
        tail_cache_bytes: newest commit-log bytes kept in memory for reads.
        retention_hours: segments older than this may be deleted (``fileReservedTime``, 72).
        disk_max_used_ratio: past this disk usage, expired segments are deleted at once
            (``diskMaxUsedSpaceRatio``, 0.75).
        disk_full_ratio: at this disk usage or more, puts are refused (SERVICE_NOT_AVAILABLE)
            until space is freed; reads go on (RocketMQ's ``diskSpaceWarningLevelRatio``,
            0.90). Checked at open and with every retention check. 0: never.
        delete_when_hour: local hour of the daily scheduled deletion (``deleteWhen``, 04).
        retention_check_interval_s: how often the disk ratio is checked (RocketMQ: 10 s).
        preallocate: ``posix_fallocate`` new segments, so ENOSPC shows at creation.
        store_host: ``(ip, port)`` written into every record and its offset msgId.
        clock: the wall clock (store timestamps, retention); injected so tests own time.
        disk_probe: the disk-usage probe retention consults; injected so tests do not
            depend on how full the machine's disk is.
        replica: the store of a replica (docs/design.md §13): puts are refused (the log
            grows only by ``append_replicated``, the master's bytes at the master's offsets).
    """

    data_dir: Path
    segment_size: int = GIB
    cq_entries_per_file: int = 300_000
    flush_mode: FlushMode = FlushMode.ASYNC
    flush_interval_s: float = 0.5
    checkpoint_interval_s: float = 1.0
    max_message_size: int = 4 * 1024 * 1024
    tail_cache_bytes: int = 64 * 1024 * 1024
    retention_hours: float = 72.0
    disk_max_used_ratio: float = 0.75
    disk_full_ratio: float = 0.90
    delete_when_hour: int = 4
    retention_check_interval_s: float = 10.0
    preallocate: bool = True
    store_host: tuple[str, int] = ("127.0.0.1", 10911)
    replica: bool = False
    clock: Clock = field(default=SYSTEM_CLOCK, compare=False, repr=False)
    disk_probe: DiskProbe = field(default=disk_used_ratio, compare=False, repr=False)

    @property
    def commitlog_dir(self) -> Path:
        """``<data_dir>/commitlog``."""
        return self.data_dir / "commitlog"

    @property
    def consumequeue_dir(self) -> Path:
        """``<data_dir>/consumequeue``."""
        return self.data_dir / "consumequeue"

    @property
    def config_dir(self) -> Path:
        """``<data_dir>/config`` (consumer offsets and the like)."""
        return self.data_dir / "config"
