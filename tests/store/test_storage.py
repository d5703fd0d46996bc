"""The trio layer over the store: group commit, periodic flush, clean shutdown."""

from __future__ import annotations

import os
import time
from pathlib import Path

import trio

from broker.storage import Storage, serve_storage
from broker.store.api import FlushMode, GetStatus, MessageToStore
from broker.store.config import StoreConfig
from broker.store.store import MessageStore


def open_store(path: Path, mode: FlushMode, flush_interval_s: float = 0.5) -> MessageStore:
    cfg = StoreConfig(
        path, segment_size=1 << 20, flush_mode=mode, flush_interval_s=flush_interval_s
    )
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
            assert storage.fsyncs < 320  # group commit: far fewer fsyncs than puts
            nursery.cancel_scope.cancel()
    assert len(ends) == 320
    with MessageStore.open(store.config) as again:
        assert again.stats.recovered_records == 0  # serve_storage closed it cleanly
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


async def test_retention_runs_once_a_day_at_the_deletion_hour(tmp_path: Path) -> None:
    cfg = StoreConfig(tmp_path, segment_size=8192, cq_entries_per_file=16)
    store = MessageStore.open(cfg)
    for i in range(600):
        store.put_nowait(MessageToStore("T", 0, b"m%d" % i))
    store.checkpoint()
    old = time.time() - 100 * 3600
    for start in store.log.segment_starts[:2]:
        os.utime(cfg.commitlog_dir / f"{start:020d}", (old, old))
    storage = Storage(store)
    base = time.mktime((2026, 11, 22, cfg.delete_when_hour, 5, 0, 0, 0, -1))
    assert storage.retention_once(base - 3600) == 0 or store.disk_used_ratio() >= 0.75
    assert storage.retention_once(base) == 2  # the deletion hour: expired segments go
    for start in store.log.segment_starts[:1]:
        os.utime(cfg.commitlog_dir / f"{start:020d}", (old, old))
    if store.disk_used_ratio() < cfg.disk_max_used_ratio:
        assert storage.retention_once(base + 60) == 0  # already swept today
    store.close()
