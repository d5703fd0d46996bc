"""``Storage.checkpoint_once`` leaves an unchanged checkpoint file alone, and writes every
changed one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import trio

from broker.storage import Storage
from broker.store.api import FlushMode, MessageToStore
from broker.store.checkpoint import Checkpoint
from broker.store.config import StoreConfig
from broker.store.store import MessageStore

T = TypeVar("T")


def open_store(path: Path, **kw: object) -> MessageStore:
    cfg = StoreConfig(
        path, segment_size=1 << 20, flush_mode=FlushMode.ASYNC,
        disk_probe=lambda _: 0.0, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return MessageStore.open(cfg)


async def inline(fn: Callable[[], T], /, *, abandon_on_cancel: bool = False) -> T:
    return fn()


class Saves:
    """Counts checkpoint files written (``Checkpoint.save``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = Checkpoint.save

        def save(cp: Checkpoint, path: Path) -> None:
            self.count += 1
            original(cp, path)

        monkeypatch.setattr(Checkpoint, "save", save)


async def test_unchanged_checkpoint_is_not_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves = Saves(monkeypatch)
    store = open_store(tmp_path)
    storage = Storage(store, offload=inline)
    ran: list[int] = []
    hooks = [lambda: lambda: ran.append(1)]
    await storage.checkpoint_once(hooks)  # the first one always writes
    assert saves.count == 1
    first = (tmp_path / "checkpoint").read_bytes()
    for _ in range(3):
        await storage.checkpoint_once(hooks)
    assert saves.count == 1 and (tmp_path / "checkpoint").read_bytes() == first
    assert ran == [1] * 4  # the hooks' writers run every time
    assert store.statistics().checkpoints == 4

    store.put_nowait(MessageToStore("T", 0, b"x"))  # a change: written
    await storage.checkpoint_once(hooks)
    assert saves.count == 2
    cp = Checkpoint.decode((tmp_path / "checkpoint").read_bytes())
    assert cp.safe_offset == store.log.end and cp.queue_sizes == {("T", 0): 1}
    await storage.checkpoint_once(hooks)
    assert saves.count == 2

    store.offsets.commit("g", "T", 0, 1)  # consumer offsets: written
    await storage.checkpoint_once(hooks)
    assert saves.count == 3
    store.checkpoint()  # another writer of the file: the next one writes again
    await storage.checkpoint_once(hooks)
    assert saves.count == 5
    store.close()


async def test_failed_checkpoint_is_not_taken_for_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves = Saves(monkeypatch)
    store = open_store(tmp_path)
    storage = Storage(store, offload=inline)
    await storage.checkpoint_once()
    store.put_nowait(MessageToStore("T", 0, b"x"))
    original = Checkpoint.save

    def fail(cp: Checkpoint, path: Path) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(Checkpoint, "save", fail)
    await storage.checkpoint_once()  # the disk error is counted, not raised
    assert storage.statistics().disk_errors == 1
    monkeypatch.setattr(Checkpoint, "save", original)
    saves = Saves(monkeypatch)
    await storage.checkpoint_once()
    assert saves.count == 1
    cp = Checkpoint.decode((tmp_path / "checkpoint").read_bytes())
    assert cp.queue_sizes == {("T", 0): 1}
    store.close()


async def test_serve_skips_idle_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves = Saves(monkeypatch)
    store = open_store(tmp_path, checkpoint_interval_s=0.01)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            storage = Storage(store)
            await nursery.start(storage.serve)
            for _ in range(2000):  # bounded: a checkpoint every 10 ms
                if store.statistics().checkpoints >= 10:
                    break
                await trio.sleep(0.01)
            assert store.statistics().checkpoints >= 10
            nursery.cancel_scope.cancel()
    assert saves.count <= 2  # the first periodic one, the clean close's


async def test_idle_flush_needs_no_thread(tmp_path: Path) -> None:
    calls: list[object] = []

    async def counting(fn: Callable[[], T], /, *, abandon_on_cancel: bool = False) -> T:
        calls.append(fn)
        return fn()

    store = open_store(tmp_path)
    storage = Storage(store, offload=counting)
    await storage.flush_once()  # nothing appended: no worker thread
    assert calls == [] and storage.statistics().fsyncs == 1
    result = store.put_nowait(MessageToStore("T", 0, b"x"))
    assert store.durable_offset < result.end_offset
    await storage.flush_once()
    assert len(calls) == 1 and store.durable_offset >= result.end_offset
    await storage.flush_once()  # durable already
    assert len(calls) == 1 and storage.statistics().fsyncs == 3
    await storage.checkpoint_once()  # a checkpoint still syncs in a thread (its hooks)
    assert len(calls) == 2
    store.close()
