"""Batch send bodies: the exact Java layout, round trips, and bad input."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.batch import MIN_ENTRY_SIZE, BatchEntry, decode_batch, encode_batch
from protocol.errors import EncodeError, ProtocolError, RecordError

PROP_TEXT = st.text(
    st.characters(codec="utf-8", exclude_characters="\x01\x02"), min_size=1, max_size=12
)
ENTRIES = st.builds(
    BatchEntry,
    body=st.binary(max_size=100),
    properties=st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=5),
    flag=st.integers(-(2**31), 2**31 - 1),
)


def java_entry(flag: int, body: bytes, props: str) -> bytes:
    """One message as Java's ``MessageDecoder.encodeMessage`` lays it out."""
    raw = props.encode()
    size = 4 + 4 + 4 + 4 + 4 + len(body) + 2 + len(raw)
    return (
        struct.pack(">iiiii", size, 0, 0, flag, len(body))
        + body
        + struct.pack(">h", len(raw))
        + raw
    )


def test_layout_matches_java() -> None:
    entries = [
        BatchEntry(b"hello", {"TAGS": "TagA", "KEYS": "k1 k2"}, flag=3),
        BatchEntry(b"", {}, flag=0),
    ]
    expected = java_entry(3, b"hello", "TAGS\x01TagA\x02KEYS\x01k1 k2\x02") + java_entry(0, b"", "")
    assert encode_batch(entries) == expected
    assert decode_batch(expected) == entries


@given(st.lists(ENTRIES, max_size=6))
def test_batch_round_trip(entries: list[BatchEntry]) -> None:
    body = encode_batch(entries)
    assert decode_batch(body) == entries
    assert decode_batch(memoryview(body)) == entries
    assert encode_batch(decode_batch(body)) == body


def test_empty_batch() -> None:
    assert encode_batch([]) == b""
    assert decode_batch(b"") == []


def test_magic_and_crc_are_ignored() -> None:
    # Java's decodeMessage skips both; clients write zeros but nothing checks it.
    data = bytearray(java_entry(1, b"x", "a\x01b\x02"))
    struct.pack_into(">iI", data, 4, -626843481, 0xFFFFFFFF)
    assert decode_batch(bytes(data)) == [BatchEntry(b"x", {"a": "b"}, flag=1)]


def patched(offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(java_entry(0, b"body", "k\x01v\x02"))
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


@pytest.mark.parametrize(
    "data",
    [
        b"\x00" * (MIN_ENTRY_SIZE - 1),  # shorter than a header
        patched(0, ">i", 5),  # total size below the minimum
        patched(0, ">i", 1_000),  # total size beyond the body
        patched(0, ">i", MIN_ENTRY_SIZE),  # total size shorter than its fields
        patched(16, ">i", -1),  # negative body length
        patched(16, ">i", 100),  # body overruns the message
        patched(24, ">h", -1),  # negative properties length
        patched(24, ">h", 2),  # properties shorter than the message
        patched(26, ">B", 0xFF),  # properties not UTF-8
        java_entry(0, b"body", "k\x01v\x02")[:-1],
        java_entry(0, b"body", "") + b"\x00\x00\x00",  # trailing partial message
    ],
)
def test_malformed_batches_raise_record_error(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode_batch(data)


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        (BatchEntry(b"", {"K": "v" * 40_000}), "exceed"),
        (BatchEntry(b"", {"K\x02": "v"}), "K"),
        (BatchEntry(b"", {"K": "\udc80"}), "text"),
        (BatchEntry(b"", {}, flag=2**31), "flag"),
    ],
)
def test_encode_batch_refuses(entry: BatchEntry, match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        encode_batch([entry])


@given(st.binary(max_size=512))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    try:
        decode_batch(data)
    except ProtocolError as exc:
        assert isinstance(exc, RecordError)


@given(st.lists(ENTRIES, min_size=1, max_size=3), st.data())
def test_fuzz_mutated_batches(entries: list[BatchEntry], data: st.DataObject) -> None:
    body = bytearray(encode_batch(entries))
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(RecordError):
        decode_batch(bytes(body[: data.draw(st.integers(0, len(body)))]))
    good = encode_batch(entries)
    with pytest.raises(RecordError):  # cutting inside the last message is always detected
        decode_batch(good[: data.draw(st.integers(len(good) - MIN_ENTRY_SIZE + 1, len(good) - 1))])
