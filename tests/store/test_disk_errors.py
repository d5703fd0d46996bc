"""A failing disk: ENOSPC and EIO from ``pwrite``, ``posix_fallocate`` and ``fsync``.

Puts answer ``DISK_ERROR`` (with the OS's reason) instead of raising or hanging, reads keep
serving what was stored, and once the disk recovers puts succeed again and the log is intact
— after a clean reopen and after a crash. The faults are injected through a stand-in for the
``os`` module of one store module at a time, so the rest of the store keeps its real disk.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import trio

import broker.store.commitlog as commitlog_module
import broker.store.store as store_module
from broker.storage import serve_storage
from broker.store.api import (
    FlushMode,
    GetStatus,
    MessageToStore,
    PutResult,
    PutStatus,
)
from broker.store.commitlog import segment_name
from broker.store.store import MessageStore
from tests.store.support import crash, read_queue, store_config

TOPIC = "Disk"
ERRORS = [errno.ENOSPC, errno.EIO]


class FaultyOs:
    """Stands in for ``os`` inside a store module; the ``*_error`` fields, when set, make the
    matching call fail with that errno. ``half_writes`` makes the next pwrites write only half
    of their bytes (a short write the caller must continue); ``error_after_half`` then turns
    into ``pwrite_error`` (part of a write landed, then the disk failed)."""

    def __init__(self) -> None:
        self.pwrite_error: int | None = None
        self.fallocate_error: int | None = None
        self.fsync_error: int | None = None
        self.half_writes = 0
        self.error_after_half: int | None = None
        self.failures = 0
        self.fsyncs = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _fail(self, code: int | None) -> None:
        if code is not None:
            self.failures += 1
            raise OSError(code, os.strerror(code))

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
        self._fail(self.pwrite_error)
        if self.half_writes and len(data) > 1:
            self.half_writes -= 1
            done = os.pwrite(fd, data[: len(data) // 2], offset)
            if not self.half_writes:
                self.pwrite_error, self.error_after_half = self.error_after_half, None
            return done
        return os.pwrite(fd, data, offset)

    def posix_fallocate(self, fd: int, offset: int, length: int) -> None:
        self._fail(self.fallocate_error)
        os.posix_fallocate(fd, offset, length)

    def fsync(self, fd: int) -> None:
        self._fail(self.fsync_error)
        os.fsync(fd)
        self.fsyncs += 1


@pytest.fixture
def log_faults(monkeypatch: pytest.MonkeyPatch) -> FaultyOs:
    """Faults in the commit log's writes and segment creation."""
    faults = FaultyOs()
    monkeypatch.setattr(commitlog_module, "os", faults)
    return faults


@pytest.fixture
def fsync_faults(monkeypatch: pytest.MonkeyPatch) -> FaultyOs:
    """Faults in the store's fsyncs (group commit and checkpoint)."""
    faults = FaultyOs()
    monkeypatch.setattr(store_module, "os", faults)
    return faults


class Producer:
    """Puts numbered messages over three queues and remembers the ones that were stored."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.sent = 0
        self.stored: list[tuple[int, bytes]] = []

    def next_message(self, size: int = 100) -> MessageToStore:
        self.sent += 1
        body = (b"msg-%d-" % self.sent).ljust(size, b".")
        return MessageToStore(TOPIC, self.sent % 3, body, {"KEYS": f"k{self.sent}"})

    def record(self, msg: MessageToStore, result: PutResult) -> PutResult:
        if result.ok:
            self.stored.append((msg.queue_id, msg.body))
        return result

    def put(self, size: int = 100) -> PutResult:
        msg = self.next_message(size)
        return self.record(msg, self.store.put_nowait(msg))

    def put_ok(self, n: int, size: int = 100) -> None:
        for _ in range(n):
            result = self.put(size)
            assert result.ok, result.remark

    def expected(self, queue_id: int) -> list[bytes]:
        return [body for q, body in self.stored if q == queue_id]

    def assert_served(self, store: MessageStore | None = None) -> None:
        store = store or self.store
        for q in range(3):
            assert read_queue(store, TOPIC, q) == self.expected(q)


def assert_disk_error(result: PutResult, code: int) -> None:
    assert result.status is PutStatus.DISK_ERROR
    assert not result.ok
    assert os.strerror(code) in result.remark, result.remark


def reopen(store: MessageStore, how: str) -> MessageStore:
    if how == "clean":
        store.close()
    else:
        crash(store)
    reopened = MessageStore.open(store.config)
    if how == "clean":
        assert reopened.statistics().recovered_records == 0
    return reopened


# ---------------------------------------------------------------------- commit-log writes


@pytest.mark.parametrize("how", ["clean", "crash"])
@pytest.mark.parametrize("code", ERRORS, ids=errno.errorcode.get)
def test_failed_flush_write_turns_puts_into_disk_errors(
    tmp_path: Path, log_faults: FaultyOs, code: int, how: str
) -> None:
    store = MessageStore.open(store_config(tmp_path))
    producer = Producer(store)
    producer.put_ok(6)
    store.flush()

    log_faults.pwrite_error = code
    producer.put_ok(3)  # appended in memory: the disk is not touched yet
    with pytest.raises(OSError, match=os.strerror(code)):
        store.flush()
    for _ in range(3):
        assert_disk_error(producer.put(), code)
    assert store.statistics().put_errors == 3
    producer.assert_served()  # reads go on: durable ones and the 3 still in memory

    log_faults.pwrite_error = None
    producer.put_ok(4)  # the first put retries the write-out, which now succeeds
    store.flush()
    producer.assert_served()
    store = reopen(store, how)
    producer.assert_served(store)
    producer.store = store
    producer.put_ok(2)
    producer.assert_served()
    store.close()


@pytest.mark.parametrize("code", ERRORS, ids=errno.errorcode.get)
def test_sync_mode_flush_begin_raises_and_nothing_is_dispatched(
    tmp_path: Path, log_faults: FaultyOs, code: int
) -> None:
    store = MessageStore.open(store_config(tmp_path, FlushMode.SYNC))
    producer = Producer(store)
    producer.put_ok(5)
    store.flush()
    durable = list(producer.stored)
    log_faults.pwrite_error = code
    producer.put_ok(2)
    with pytest.raises(OSError, match=os.strerror(code)):
        store.flush_begin()
    assert_disk_error(producer.put(), code)
    for q in range(3):  # only what is durable is readable; the other 2 wait in memory
        assert read_queue(store, TOPIC, q) == [b for qid, b in durable if qid == q]
    log_faults.pwrite_error = None
    producer.put_ok(3)
    store.flush()
    producer.assert_served()  # the held-back ones are dispatched once durable
    store = reopen(store, "clean")
    producer.assert_served(store)
    store.close()


@pytest.mark.parametrize("code", ERRORS, ids=errno.errorcode.get)
def test_write_out_past_the_threshold_surfaces_the_error_at_once(
    tmp_path: Path, log_faults: FaultyOs, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr(store_module, "WRITE_OUT_THRESHOLD", 1_000)  # each ~10th put writes
    store = MessageStore.open(store_config(tmp_path, segment_size=1 << 16))
    producer = Producer(store)
    producer.put_ok(20)
    assert store.log.written > 0  # written out without any flush
    log_faults.pwrite_error = code
    results = [producer.put() for _ in range(30)]
    statuses = [r.status for r in results]
    first_error = statuses.index(PutStatus.DISK_ERROR)
    assert first_error <= 12  # the write-out that failed was at most ~1 000 bytes away
    assert all(s is PutStatus.DISK_ERROR for s in statuses[first_error:])
    assert_disk_error(results[-1], code)
    assert store.statistics().last_disk_error
    producer.assert_served()
    log_faults.pwrite_error = None
    producer.put_ok(5)
    assert store.disk_error is None
    store.flush()
    store = reopen(store, "crash")
    producer.assert_served(store)
    store.close()


def test_short_writes_then_eio_never_corrupt_the_log(tmp_path: Path, log_faults: FaultyOs) -> None:
    store = MessageStore.open(store_config(tmp_path, segment_size=4096))
    producer = Producer(store)
    producer.put_ok(10, size=300)
    log_faults.half_writes = 3  # continued by write_out's loop
    producer.put_ok(10, size=300)
    store.flush()
    producer.put_ok(5, size=300)
    log_faults.half_writes, log_faults.error_after_half = 1, errno.EIO
    with pytest.raises(OSError, match=os.strerror(errno.EIO)):
        store.flush()  # half of the tail is in the file, a torn record
    assert_disk_error(producer.put(), errno.EIO)
    log_faults.pwrite_error = None
    producer.put_ok(5, size=300)  # the retry rewrites from where the write stopped
    store.flush()
    store = reopen(store, "crash")
    producer.assert_served(store)
    assert store.statistics().recovery_stop_reason == "end of data"  # no torn record anywhere
    store.close()


# ---------------------------------------------------------------------- fsync


@pytest.mark.parametrize("mode", [FlushMode.SYNC, FlushMode.ASYNC], ids=["sync", "async"])
def test_bytes_written_out_early_are_fsynced_by_the_next_flush(
    tmp_path: Path, fsync_faults: FaultyOs, monkeypatch: pytest.MonkeyPatch, mode: FlushMode
) -> None:
    """A put past ``WRITE_OUT_THRESHOLD`` writes the log out itself; the flush after it has
    nothing left to write, but must still fsync those bytes before calling them durable."""
    monkeypatch.setattr(store_module, "WRITE_OUT_THRESHOLD", 0)
    store = MessageStore.open(store_config(tmp_path, mode))
    producer = Producer(store)
    producer.put_ok(1)
    assert store.log.written == store.log.end  # already handed to the OS
    fsyncs = fsync_faults.fsyncs
    store.flush()
    assert fsync_faults.fsyncs > fsyncs
    assert store.durable_offset == store.log.end
    fsyncs = fsync_faults.fsyncs
    store.flush()
    assert fsync_faults.fsyncs == fsyncs  # nothing new: no fsync
    producer.assert_served()
    store.close()


@pytest.mark.parametrize("code", ERRORS, ids=errno.errorcode.get)
def test_a_failed_fsync_is_retried_not_forgotten(
    tmp_path: Path, fsync_faults: FaultyOs, code: int
) -> None:
    store = MessageStore.open(store_config(tmp_path, FlushMode.SYNC))
    producer = Producer(store)
    producer.put_ok(2)
    store.flush()
    durable_before = store.durable_offset
    producer.put_ok(2)
    fsync_faults.fsync_error = code
    for _ in range(3):  # every retry fsyncs again, and fails again
        with pytest.raises(OSError, match=os.strerror(code)):
            store.flush()
        with pytest.raises(OSError, match=os.strerror(code)):
            store.checkpoint()
    assert store.durable_offset == durable_before  # nothing became "durable"
    assert sum(store.max_offset(TOPIC, q) for q in range(3)) == 2  # nor readable
    fsync_faults.fsync_error = None
    store.flush()
    assert store.durable_offset == store.log.end
    producer.assert_served()
    store.close()


# ---------------------------------------------------------------------- new segments


def test_enospc_when_a_new_segment_is_preallocated(tmp_path: Path, log_faults: FaultyOs) -> None:
    store = MessageStore.open(store_config(tmp_path, segment_size=4096))
    producer = Producer(store)
    producer.put_ok(5, size=300)
    store.flush()
    log_faults.fallocate_error = errno.ENOSPC
    for _ in range(20):  # until a record needs the second segment
        producer.put_ok(1, size=300)
        if store.log.end > 4096:
            break
    assert store.log.end > 4096
    with pytest.raises(OSError, match=os.strerror(errno.ENOSPC)):
        store.flush()
    second = tmp_path / "commitlog" / segment_name(4096)
    assert not second.exists()  # no half-made segment left behind
    assert_disk_error(producer.put(), errno.ENOSPC)
    producer.assert_served()
    log_faults.fallocate_error = None
    producer.put_ok(3, size=300)
    store.flush()
    assert second.stat().st_size == 4096
    for how in ("crash", "clean"):
        store = reopen(store, how)
        producer.assert_served(store)
    store.close()


def test_close_on_a_failing_disk_keeps_what_was_durable(
    tmp_path: Path, log_faults: FaultyOs
) -> None:
    store = MessageStore.open(store_config(tmp_path))
    producer = Producer(store)
    producer.put_ok(6)
    store.flush()
    durable = list(producer.stored)
    log_faults.pwrite_error = errno.EIO
    producer.put_ok(2)
    with pytest.raises(OSError, match=os.strerror(errno.EIO)):
        store.flush()
    store.close()  # gives up on the unwritten tail quietly; the next open recovers
    log_faults.pwrite_error = None
    with MessageStore.open(store.config) as reopened:
        assert reopened.statistics().recovery_scanned_from >= 0  # not a clean close
        producer.stored = durable
        producer.assert_served(reopened)


# ---------------------------------------------------------------------- the trio layer


async def test_failing_fsync_answers_sync_puts_with_disk_error(
    tmp_path: Path, fsync_faults: FaultyOs
) -> None:
    store = MessageStore.open(store_config(tmp_path, FlushMode.SYNC))
    producer = Producer(store)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            storage = await nursery.start(serve_storage, store)
            msg = producer.next_message()
            assert producer.record(msg, await storage.put(msg)).ok

            fsync_faults.fsync_error = errno.EIO
            failed: list[PutResult] = []

            async def put_one() -> None:
                m = producer.next_message()
                failed.append(producer.record(m, await storage.put(m)))

            async with trio.open_nursery() as producers:
                for _ in range(10):
                    producers.start_soon(put_one)
            assert len(failed) == 10
            for result in failed:  # answered, not left hanging
                assert_disk_error(result, errno.EIO)
            assert fsync_faults.failures >= 1
            stats = storage.statistics()
            assert stats.disk_errors >= 1 and stats.waiting == 0

            fsync_faults.fsync_error = None
            msg = producer.next_message()
            result = producer.record(msg, await storage.put(msg))
            assert result.ok
            assert store.durable_offset >= result.end_offset
            nursery.cancel_scope.cancel()
    # Answered DISK_ERROR means "maybe not stored": those records stayed in the log and
    # became durable with the next fsync (at-least-once, like a producer's retry).
    with MessageStore.open(store.config) as reopened:
        assert reopened.statistics().recovered_records == 0  # serve_storage closed it cleanly
        served = read_queue(reopened, TOPIC, 0) + read_queue(reopened, TOPIC, 1)
        served += read_queue(reopened, TOPIC, 2)
        assert {body for _, body in producer.stored} <= set(served)
        assert len(served) == producer.sent


async def test_failing_write_answers_sync_puts_with_disk_error(
    tmp_path: Path, log_faults: FaultyOs
) -> None:
    store = MessageStore.open(store_config(tmp_path, FlushMode.SYNC))
    producer = Producer(store)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            storage = await nursery.start(serve_storage, store)
            log_faults.pwrite_error = errno.ENOSPC
            first = producer.next_message()
            assert_disk_error(await storage.put(first), errno.ENOSPC)  # flush_begin failed
            assert store.get(TOPIC, first.queue_id, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
            second = producer.next_message()
            assert_disk_error(await storage.put(second), errno.ENOSPC)  # refused up front
            log_faults.pwrite_error = None
            third = producer.next_message()
            assert producer.record(third, await storage.put(third)).ok
            assert store.get(TOPIC, first.queue_id, 0).status is GetStatus.FOUND
            nursery.cancel_scope.cancel()
    # The first was appended before the write failed and is written with the third
    # (at-least-once); the second never entered the log.
    with MessageStore.open(store.config) as reopened:
        served = {b for q in range(3) for b in read_queue(reopened, TOPIC, q)}
        assert served == {first.body, third.body}
