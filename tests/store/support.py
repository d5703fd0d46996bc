"""Helpers shared by the store's contract, stateful, crash-consistency and disk-error tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from broker.store.api import FlushMode, GetResult, GetStatus
from broker.store.config import StoreConfig
from broker.store.store import MessageStore
from protocol.message import decode_records

#: Upper bound on the reads :func:`read_queue` makes (every test queue is far shorter).
MAX_READS = 10_000


def store_config(
    path: Path,
    mode: FlushMode = FlushMode.ASYNC,
    *,
    segment_size: int = 8192,
    cq_entries_per_file: int = 8,
    max_message_size: int = 4 * 1024 * 1024,
) -> StoreConfig:
    """A small-segment configuration, so that a few dozen records roll segments and files.
    Its disk probe says the disk is empty: the machine's own disk (other work fills it) must
    not refuse puts or hurry retention here (tests of those inject their own probe)."""
    return StoreConfig(
        path,
        segment_size=segment_size,
        cq_entries_per_file=cq_entries_per_file,
        flush_mode=mode,
        max_message_size=max_message_size,
        disk_probe=_empty_disk,
    )


def _empty_disk(_: Path) -> float:
    return 0.0


@dataclass(slots=True)
class Clock:
    """An injectable ``clock_ms`` whose time moves only when a test says so."""

    now: int = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


def crash(store: MessageStore) -> None:
    """Simulate ``kill -9``: whatever was handed to the OS stays, nothing else is written.

    No flush, no checkpoint, the ``abort`` marker stays; buffered commit-log bytes and
    consume-queue entries die with the process. The descriptors, the key index and the
    directory lock are released, as the kernel would release them.
    """
    for cq in store._queues.values():
        cq._close_fds()
    store._release()
    store._closed = True  # a dead process writes nothing more: close() is now a no-op


def bodies(result: GetResult) -> list[bytes]:
    """Bodies of the messages a read returned."""
    return [m.body for m in decode_records(result.body, verify_crc=True)]


def read_queue(store: MessageStore, topic: str, queue_id: int, batch: int = 7) -> list[bytes]:
    """Every body the queue serves, from its min offset on, read in batches (none for an
    unknown queue); each record must be intact and carry its own queue, queue offset and
    commit-log offset."""
    out: list[bytes] = []
    offset = store.min_offset(topic, queue_id)
    for _ in range(MAX_READS):
        got = store.get(topic, queue_id, offset, batch)
        if got.status is not GetStatus.FOUND:
            ends = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)
            assert got.status in ends or (got.status, out) == (GetStatus.NO_MATCHED_LOGIC_QUEUE, [])
            return out
        assert got.offsets == tuple(range(offset, offset + got.count))
        records = decode_records(got.body, verify_crc=True)
        assert [m.queue_offset for m in records] == list(got.offsets)
        assert [m.commit_log_offset for m in records] == list(got.commit_log_offsets)
        assert all((m.topic, m.queue_id) == (topic, queue_id) for m in records)
        out += [m.body for m in records]
        offset = got.next_offset
    raise AssertionError("read_queue did not reach the end of the queue")
