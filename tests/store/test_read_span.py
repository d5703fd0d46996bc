"""An unfiltered read takes its records in one span when they lie back to back (issue 15):
it must give exactly what the record-by-record loop gives, whatever the layout (queues
interleaved, segments rolled, part of the log only on disk, part only in memory)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store import reads
from broker.store.api import GetResult, MessageToStore
from broker.store.store import MessageStore
from tests.store.support import store_config

TOPIC = "span"


def _loop_read(
    store: MessageStore, queue_id: int, offset: int, count: int, max_bytes: int
) -> GetResult:
    """The same read through the record-by-record loop only."""
    span = reads._read_span
    reads._read_span = lambda *args: None
    try:
        return store.get(TOPIC, queue_id, offset, count, max_bytes=max_bytes)
    finally:
        reads._read_span = span


@settings(max_examples=100, deadline=None)
@given(
    puts=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 600)), min_size=1, max_size=80),
    write_out_every=st.integers(1, 30),
    tail=st.sampled_from([64 * 1024 * 1024, 2048]),
    reads_=st.lists(
        st.tuples(
            st.integers(0, 2), st.integers(0, 12), st.integers(1, 40), st.integers(1, 20_000)
        ),
        min_size=1,
        max_size=10,
    ),
)
def test_span_read_equals_the_record_loop(
    puts: list[tuple[int, int]],
    write_out_every: int,
    tail: int,
    reads_: list[tuple[int, int, int, int]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = dataclasses.replace(store_config(Path(tmp) / "s"), tail_cache_bytes=tail)
        store = MessageStore.open(config)
        try:
            for i, (queue_id, size) in enumerate(puts):
                store.put_nowait(MessageToStore(TOPIC, queue_id, b"b" * size))
                if i % write_out_every == 0:
                    store.flush()  # part of the log on disk, the tail trimmed
            for queue_id, offset, count, max_bytes in reads_:
                fast = store.get(TOPIC, queue_id, offset, count, max_bytes=max_bytes)
                assert fast == _loop_read(store, queue_id, offset, count, max_bytes)
        finally:
            store.close()


def test_one_queue_alone_is_read_in_one_span(tmp_path: Path) -> None:
    store = MessageStore.open(store_config(tmp_path / "s", segment_size=1 << 20))
    try:
        for _ in range(10):
            store.put_nowait(MessageToStore(TOPIC, 0, b"x" * 100))
        entries = store._queues[(TOPIC, 0)].entries(0, 32)
        assert reads._read_span(store.log, entries, 32, 1 << 20) is not None
        result = store.get(TOPIC, 0, 0, 32)
        assert result.offsets == tuple(range(10))
        assert result == _loop_read(store, 0, 0, 32, 4 * 1024 * 1024)
    finally:
        store.close()


@pytest.mark.parametrize("max_bytes", [1, 150, 350])
def test_max_bytes_still_gives_at_least_one(tmp_path: Path, max_bytes: int) -> None:
    store = MessageStore.open(store_config(tmp_path / "s", segment_size=1 << 20))
    try:
        for _ in range(5):
            store.put_nowait(MessageToStore(TOPIC, 0, b"x" * 100))
        fast = store.get(TOPIC, 0, 1, 32, max_bytes=max_bytes)
        assert fast == _loop_read(store, 0, 1, 32, max_bytes)
        assert len(fast.offsets) >= 1
    finally:
        store.close()


@pytest.mark.parametrize("tail", [64 * 1024 * 1024, 2048])
def test_a_span_across_segments_or_the_tail_start_is_read_record_by_record(
    tmp_path: Path, tail: int
) -> None:
    config = dataclasses.replace(store_config(tmp_path / "s"), tail_cache_bytes=tail)
    store = MessageStore.open(config)  # 8 KiB segments: ~12 of these records each
    try:
        for i in range(40):
            store.put_nowait(MessageToStore(TOPIC, 0, b"y" * 600))
            if i % 7 == 0:
                store.flush()
        for offset in range(0, 40, 3):
            fast = store.get(TOPIC, 0, offset, 32)
            assert fast == _loop_read(store, 0, offset, 32, 4 * 1024 * 1024)
            assert fast.count == min(32, 40 - offset)
    finally:
        store.close()
