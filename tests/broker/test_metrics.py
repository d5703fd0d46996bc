"""The latency-event writer (docs/design.md §8): schema, buffering, rotation, caps, errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker import metrics
from broker.metrics import (
    FIELD_NAMES,
    FIELDS,
    EventKind,
    MetricsWriter,
    ReadStats,
    is_valid_event,
    read_events,
)

PID = os.getpid()
T0 = datetime(2024, 1, 1, 10, 59, 59, 999000, tzinfo=UTC).timestamp() * 1000


class Clock:
    """A settable wall clock in epoch ms."""

    def __init__(self, now_ms: float = T0) -> None:
        self.now_ms = now_ms

    def __call__(self) -> float:
        return self.now_ms


def make(directory: Path | None, clock: Clock | None = None, **kw: Any) -> MetricsWriter:
    return MetricsWriter(
        directory, broker="broker-a", wake_mode="targeted", clock_ms=clock or Clock(), **kw
    )


def emit_store(writer: MetricsWriter, n: int, topic: str = "T") -> None:
    for i in range(n):
        writer.emit(EventKind.STORE, topic=topic, latency_ms=float(i), queue=i % 4)


def event_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("events-*.jsonl"))


def all_lines(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for f in event_files(directory)
        for line in f.read_text().split("\n")
        if line
    ]


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Wait in real time (worker threads do not follow the mock clock), at most ~2 s."""
    for _ in range(400):
        if predicate():
            return
        await trio.to_thread.run_sync(time.sleep, 0.005)
    raise AssertionError("condition not reached")


def test_schema_is_one_definition() -> None:
    assert FIELD_NAMES == (
        "v", "ts_ms", "kind", "broker", "topic", "group", "queue", "latency_ms", "wake_mode",
        "found", "retry_topic", "origin_topic", "reconsume_times",
    )  # fmt: skip
    assert dict(FIELDS)["found"] == "bool|null"
    assert [k.value for k in EventKind] == [
        "store", "pull_wait", "pop_wait", "wakeup", "revive", "redeliver", "ack", "e2e", "dlq",
    ]  # fmt: skip


def test_emit_flush_lines_parse_with_every_field(tmp_path: Path) -> None:
    modes = iter(["targeted", "topic"])
    writer = MetricsWriter(tmp_path, broker="b", wake_mode=lambda: next(modes), clock_ms=Clock())
    writer.emit(EventKind.STORE, topic="T", latency_ms=3, queue=1)
    writer.emit(
        EventKind.REDELIVER,
        topic="%RETRY%g+T",
        latency_ms=1.5,
        group="g",
        queue=0,
        found=True,
        retry_topic="%RETRY%g+T",
        origin_topic="T",
        reconsume_times=2,
    )
    assert writer.statistics().buffered == 2
    assert writer.flush_nowait() == 2
    (file,) = event_files(tmp_path)
    raw = [json.loads(line) for line in file.read_text().splitlines()]
    assert all(list(obj) == list(FIELD_NAMES) for obj in raw)
    assert all(is_valid_event(obj) for obj in raw)
    first, second = raw
    assert first == {
        "v": 1, "ts_ms": T0, "kind": "store", "broker": "b", "topic": "T", "group": None,
        "queue": 1, "latency_ms": 3.0, "wake_mode": "targeted", "found": None,
        "retry_topic": None, "origin_topic": None, "reconsume_times": None,
    }  # fmt: skip
    assert isinstance(first["latency_ms"], float) and isinstance(first["ts_ms"], float)
    assert second["wake_mode"] == "topic" and second["found"] is True
    assert (second["origin_topic"], second["reconsume_times"]) == ("T", 2)
    assert writer.statistics() == metrics.MetricsStatistics(
        written=2, dropped=0, write_errors=0, buffered=0, observer_errors=0
    )
    assert b" " not in file.read_bytes()  # compact separators


async def test_disabled_writer_is_a_noop(tmp_path: Path) -> None:
    writer = make(None)
    emit_store(writer, 10)
    assert not writer.enabled
    assert writer.flush_nowait() == 0
    assert writer.statistics() == metrics.MetricsStatistics(
        written=0, dropped=0, write_errors=0, buffered=0, observer_errors=0
    )
    with trio.fail_after(1):
        await writer.run()  # returns at once: nothing to do
    assert await trio.to_thread.run_sync(os.listdir, tmp_path) == []


def test_full_buffer_drops_and_counts(tmp_path: Path) -> None:
    writer = make(tmp_path, max_buffer=3)
    emit_store(writer, 5)
    assert (writer.statistics().buffered, writer.statistics().dropped) == (3, 2)
    assert writer.flush_nowait() == 3
    emit_store(writer, 1)  # room again after a flush
    assert writer.flush_nowait() == 1
    assert writer.statistics().dropped == 2 and writer.statistics().written == 4


def test_unserializable_event_is_dropped_not_written(tmp_path: Path) -> None:
    writer = make(tmp_path)
    writer.emit(EventKind.ACK, topic="T", latency_ms=math.nan)
    writer.emit(EventKind.ACK, topic="T", latency_ms=1.0)
    assert writer.flush_nowait() == 1
    assert writer.statistics().dropped == 1
    assert len(all_lines(tmp_path)) == 1


def test_one_file_per_utc_hour(tmp_path: Path) -> None:
    clock = Clock()
    writer = make(tmp_path, clock)
    emit_store(writer, 2)
    clock.now_ms += 1  # 11:00:00.000 UTC
    emit_store(writer, 3)
    assert writer.flush_nowait() == 5
    names = [f.name for f in event_files(tmp_path)]
    assert names == [
        f"events-broker-a-{PID}-2024010110.jsonl",
        f"events-broker-a-{PID}-2024010111.jsonl",
    ]
    assert [len(f.read_text().splitlines()) for f in event_files(tmp_path)] == [2, 3]


def line_size(tmp_path: Path) -> int:
    probe = make(tmp_path / "probe")
    emit_store(probe, 1)
    probe.flush_nowait()
    (file,) = event_files(tmp_path / "probe")
    return file.stat().st_size


def test_size_rotation_continues_in_numbered_parts(tmp_path: Path) -> None:
    size = line_size(tmp_path)
    writer = make(tmp_path, max_file_bytes=3 * size)
    emit_store(writer, 7)
    writer.flush_nowait()
    emit_store(writer, 3)  # the next flush continues in the last part, then rolls
    writer.flush_nowait()
    base = f"events-broker-a-{PID}-2024010110"
    files = {f.name: f for f in event_files(tmp_path)}
    assert sorted(files) == sorted(f"{base}{s}.jsonl" for s in ("", "-1", "-2", "-3"))
    assert all(f.stat().st_size <= 3 * size for f in files.values())
    assert len(all_lines(tmp_path)) == 10
    # Same pid after a restart (containers): a new writer appends after the existing parts.
    again = make(tmp_path, max_file_bytes=3 * size)
    emit_store(again, 1)
    again.flush_nowait()
    assert len(files[f"{base}-3.jsonl"].read_text().splitlines()) == 2


def test_total_cap_deletes_this_brokers_oldest_files(tmp_path: Path) -> None:
    size = line_size(tmp_path)
    other = tmp_path / "events-broker-b-1-2020010100.jsonl"
    other.write_text("x" * size)
    clock = Clock()
    writer = make(tmp_path, clock, max_total_bytes=4 * size)
    for _ in range(6):  # one line per hour, one file each
        emit_store(writer, 1)
        writer.flush_nowait()
        clock.now_ms += 3_600_000
    names = [f.name for f in event_files(tmp_path)]
    kept = [f"events-broker-a-{PID}-20240101{h}.jsonl" for h in (13, 14, 15)]
    assert names == sorted([*kept, other.name])  # other brokers' files are not ours to delete
    assert sum(f.stat().st_size for f in event_files(tmp_path)) <= 4 * size


def test_write_error_is_counted_not_raised(tmp_path: Path) -> None:
    target = tmp_path / "metrics"
    target.write_text("not a directory")
    writer = make(target)
    emit_store(writer, 3)
    writer.emit(EventKind.ACK, topic="T", latency_ms=math.inf)  # dropped once, not twice
    assert writer.flush_nowait() == 0
    assert writer.statistics() == metrics.MetricsStatistics(
        written=0, dropped=4, write_errors=1, buffered=0, observer_errors=0
    )
    target.unlink()
    emit_store(writer, 2)
    assert writer.flush_nowait() == 2  # recovers once the directory can be made


async def test_run_flushes_periodically(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    writer = make(tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run, 0.5)
        emit_store(writer, 3)
        await trio.sleep(0.25)
        assert writer.statistics().written == 0  # not before the interval
        await wait_until(lambda: writer.statistics().written == 3)
        assert trio.current_time() >= 0.5
        emit_store(writer, 2)
        await wait_until(lambda: writer.statistics().written == 5)
        nursery.cancel_scope.cancel()
    assert len(all_lines(tmp_path)) == 5


async def test_run_flushes_on_cancel(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    writer = make(tmp_path)
    with trio.move_on_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run, 60.0)
            await trio.sleep(1)
            emit_store(writer, 4)
            nursery.cancel_scope.cancel()
    assert writer.statistics().buffered == 0  # taken by the final flush
    await wait_until(lambda: writer.statistics().written == 4)
    assert len(all_lines(tmp_path)) == 4


class RecordingLog:
    def __init__(self) -> None:
        self.warnings: list[dict[str, Any]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.warnings.append({"event": event, **kw})


async def test_run_survives_write_errors_and_logs_once_a_minute(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = RecordingLog()
    monkeypatch.setattr(metrics, "_log", log)

    def failing_open(self: Path, *args: Any, **kw: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "open", failing_open)
    writer = make(tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run, 0.2)
        emit_store(writer, 3)
        await wait_until(lambda: writer.statistics().write_errors == 1)
        emit_store(writer, 2)
        await wait_until(lambda: writer.statistics().write_errors == 2)
        nursery.cancel_scope.cancel()
    assert (writer.statistics().dropped, writer.statistics().written) == (5, 0)
    assert len(log.warnings) == 1 and log.warnings[0]["dropped"] == 3


def test_read_events_skips_and_counts_bad_lines(tmp_path: Path) -> None:
    writer = make(tmp_path)
    emit_store(writer, 2)
    writer.flush_nowait()
    (file,) = event_files(tmp_path)
    good = file.read_text().splitlines()[0]
    wrong_type = json.dumps({**json.loads(good), "queue": "0"})
    unknown_kind = json.dumps({**json.loads(good), "kind": "nope"})
    with file.open("a") as f:
        f.write(f"garbage\n\n{wrong_type}\n{unknown_kind}\n[1]\n{good[:20]}")  # torn last line
    stats = ReadStats()
    assert len(list(read_events(tmp_path, stats))) == 2
    assert (stats.good, stats.bad) == (2, 5)
    assert len(list(read_events(file))) == 2


def test_schema_importable_without_trio() -> None:
    code = (
        "import sys; sys.modules['trio'] = None; import broker.metrics as m; print(len(m.FIELDS))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(len(FIELDS))
