"""The commit log's chunked in-memory tail against a plain bytearray model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.tail import MAX_CHUNK, TailCache, chunk_size_for

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), st.lists(st.binary(max_size=40), max_size=4)),
        st.tuples(st.just("truncate"), st.integers(0, 1000)),
        st.tuples(st.just("drop"), st.integers(0, 1000)),
        st.tuples(st.just("read"), st.tuples(st.integers(0, 1000), st.integers(0, 90))),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 100), chunk_size=st.integers(1, 17), ops=_OPS)
def test_the_tail_reads_what_a_flat_buffer_would(
    start: int, chunk_size: int, ops: list[tuple[str, object]]
) -> None:
    tail = TailCache(start, chunk_size)
    model = bytearray()  # bytes [start, start + len(model)) of the log
    kept = start  # what the model says the cache still holds from
    for op, arg in ops:
        end = start + len(model)
        if op == "extend":
            assert isinstance(arg, list)
            assert tail.extend(tuple(arg)) == sum(map(len, arg))
            model += b"".join(arg)
        elif op == "truncate":
            assert isinstance(arg, int)
            cut = kept + arg % (end - kept + 1)
            tail.truncate(cut)
            del model[cut - start :]
        elif op == "drop":
            assert isinstance(arg, int)
            tail.drop_before(kept + arg % (end - kept + 1))
            assert kept <= tail.start <= end
            kept = tail.start
        else:
            assert isinstance(arg, tuple)
            pos, size = arg
            offset = kept + pos % (end - kept + 1)
            size = min(size, end - offset)
            expected = bytes(model[offset - start : offset + size - start])
            assert tail.read(offset, size) == expected
            assert b"".join(bytes(v) for v in tail.views(offset, offset + size)) == expected
        assert tail.end == start + len(model)


def test_dropping_keeps_the_chunk_that_is_being_filled() -> None:
    tail = TailCache(0, 8)
    tail.extend((b"a" * 20,))
    tail.drop_before(100)  # past the end: only whole chunks before the last go
    assert tail.start == 16
    assert tail.read(16, 4) == b"aaaa"
    tail.extend((b"b" * 3,))
    assert tail.read(18, 5) == b"aabbb"


def test_a_dropped_chunk_is_reused_for_the_next_one() -> None:
    tail = TailCache(0, 8)
    tail.extend((b"a" * 16,))
    oldest = tail._chunks[0]
    tail.drop_before(8)
    tail.extend((b"b" * 3,))  # past the full last chunk: a new chunk is needed
    assert tail._chunks[-1] is oldest  # already allocated and faulted in
    assert tail.read(8, 11) == b"a" * 8 + b"bbb"


def test_a_tail_that_starts_mid_chunk_reads_nothing_before_its_start() -> None:
    tail = TailCache(13, 8)
    tail.extend((b"xyz", b"0123456789"))
    assert (tail.start, tail.end) == (13, 26)
    assert tail.read(13, 13) == b"xyz0123456789"
    tail.drop_before(20)
    assert tail.start == 16
    assert tail.read(16, 10) == b"0123456789"


def test_truncate_outside_the_cache_is_refused() -> None:
    tail = TailCache(10, 4)
    tail.extend((b"abcdef",))
    with pytest.raises(ValueError, match="cannot truncate"):
        tail.truncate(17)
    with pytest.raises(ValueError, match="cannot truncate"):
        tail.truncate(9)


@pytest.mark.parametrize(
    ("cache", "chunk"), [(0, 4096), (2048, 4096), (64 << 20, MAX_CHUNK), (1 << 30, MAX_CHUNK)]
)
def test_chunk_size_follows_the_cache_size_within_bounds(cache: int, chunk: int) -> None:
    assert chunk_size_for(cache) == chunk
