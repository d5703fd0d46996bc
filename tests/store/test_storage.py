"""The trio layer over the store: group commit, periodic flush, clean shutdown."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import trio

from broker.clock import ManualClock
from broker.storage import Storage, serve_storage
from broker.store.api import FlushMode, GetStatus, MessageToStore
from broker.store.config import StoreConfig
from broker.store.store import MessageStore


def open_store(path: Path, mode: FlushMode, flush_interval_s: float = 0.5) -> MessageStore:
    cfg = StoreConfig(
        path, segment_size=1 << 20, flush_mode=mode, flush_interval_s=flush_interval_s,
        disk_probe=lambda _: 0.0,  # the machine's own disk must not refuse puts here
    )  # fmt: skip
    return MessageStore.open(cfg)


async def test_sync_puts_share_fsyncs_and_are_durable_when_answered(tmp_path: Path) -> None:
    store = open_store(tmp_path, FlushMode.SYNC)
    ends: list[int] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            storage = await nursery.start(serve_storage, store)

            async def producer(i: int) -> None:
                for j in range(10):
                    result = await storage.put(MessageToStore("T", i % 4, b"%d-%d" % (i, j)))
                    assert result.ok
                    # Answered only once its bytes are fsynced (and dispatched to readers).
                    assert store.durable_offset >= result.end_offset
                    ends.append(result.end_offset)

            async with trio.open_nursery() as producers:
                for i in range(32):
                    producers.start_soon(producer, i)
            assert storage.statistics().fsyncs < 320  # group commit: far fewer fsyncs than puts
            nursery.cancel_scope.cancel()
    assert len(ends) == 320
    with MessageStore.open(store.config) as again:
        assert again.statistics().recovered_records == 0  # serve_storage closed it cleanly
        assert sum(again.max_offset("T", q) for q in range(4)) == 320


async def test_sync_mode_hides_messages_until_they_are_durable(tmp_path: Path) -> None:
    store = open_store(tmp_path, FlushMode.SYNC)
    store.put_nowait(MessageToStore("T", 0, b"not yet durable"))
    assert store.get("T", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    store.flush()
    assert store.get("T", 0, 0).status is GetStatus.FOUND
    store.close()


async def test_async_mode_flushes_on_its_interval(tmp_path: Path) -> None:
    store = open_store(tmp_path, FlushMode.ASYNC, flush_interval_s=0.05)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            storage = await nursery.start(serve_storage, store)
            result = await storage.put(MessageToStore("T", 0, b"x"))
            assert result.ok
            assert store.get("T", 0, 0).status is GetStatus.FOUND  # visible at once
            for _ in range(1000):  # bounded: the flusher runs every 50 ms
                if store.durable_offset >= result.end_offset:
                    break
                await trio.sleep(0.01)
            assert store.durable_offset >= result.end_offset
            nursery.cancel_scope.cancel()


#: Every retention test's "now": one fixed local instant at the deletion hour (04:05), so the
#: tests mean the same on any date.
BASE = time.mktime((2026, 11, 22, 4, 5, 0, 0, 0, -1))
OLD = BASE - 100 * 3600


def aged_store(path: Path, *, disk_used: float, **settings: Any) -> MessageStore:
    """A store of 600 small messages over many segments: the first two last written at
    :data:`OLD`, the others at :data:`BASE` (the kernel stamps files with the real date,
    which the tests must not depend on); the disk probe reports ``disk_used``."""
    # Writes are never refused here (disk_full_ratio 0): these tests are about retention.
    settings.setdefault("disk_full_ratio", 0)
    cfg = StoreConfig(path, segment_size=8192, cq_entries_per_file=16,
                      disk_probe=lambda _: disk_used, **settings)  # fmt: skip
    store = MessageStore.open(cfg)
    for i in range(600):
        store.put_nowait(MessageToStore("T", 0, b"m%d" % i))
    store.checkpoint()
    for n, start in enumerate(store.log.segment_starts):
        mtime = OLD if n < 2 else BASE
        os.utime(cfg.commitlog_dir / f"{start:020d}", (mtime, mtime))
    return store


def test_retention_runs_once_a_day_at_the_deletion_hour(tmp_path: Path) -> None:
    store = aged_store(tmp_path, disk_used=0.0)
    assert store.config.delete_when_hour == 4
    storage = Storage(store)
    assert storage.retention_once(BASE - 3600) == 0  # not the hour, disk not full
    assert storage.retention_once(BASE) == 2  # the deletion hour: expired segments go
    first = store.log.segment_starts[0]
    os.utime(store.config.commitlog_dir / f"{first:020d}", (OLD, OLD))
    assert storage.retention_once(BASE + 60) == 0  # already swept today
    assert storage.retention_once(BASE + 24 * 3600) == 1  # the next day's hour
    store.close()


def test_retention_sweeps_at_once_when_the_disk_is_full(tmp_path: Path) -> None:
    store = aged_store(tmp_path, disk_used=0.9)
    # Two hours past the deletion hour, but the disk is past 0.75 used.
    assert Storage(store).retention_once(BASE + 2 * 3600) == 2
    store.close()


async def test_retention_loop_reads_the_injected_clock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    clock = ManualClock(BASE * 1000)
    store = aged_store(tmp_path, disk_used=0.0, retention_check_interval_s=1.0, clock=clock)
    starts = store.log.segment_starts[:2]
    with trio.move_on_after(1.5):  # autojump: one retention round at t = 1 s
        await Storage(store).run_retention()
    assert store.log.min_offset == store.log.segment_starts[0] > starts[1]
    store.close()
