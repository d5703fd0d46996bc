"""broker.store.checkpoint: round trips, and every damage is detected, never misread."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.api import StoreCorruptError
from broker.store.checkpoint import CHECKPOINT_VERSION, Checkpoint

SAMPLE = Checkpoint(
    safe_offset=1_073_741_900,
    clean=False,
    queue_sizes={("TopicTest", 0): 250, ("%RETRY%g_1|x-y", 3): 7, ("rmq_sys_REVIVE_LOG_a", 1): 0},
    min_offset=1_073_741_824,
    written_at_ms=1_700_000_000_123,
)

counts = st.integers(min_value=0, max_value=2**63 - 1)
checkpoints = st.builds(
    Checkpoint,
    safe_offset=counts,
    clean=st.booleans(),
    queue_sizes=st.dictionaries(
        st.tuples(st.text(max_size=20), st.integers(min_value=-(2**31), max_value=2**31 - 1)),
        counts,
        max_size=20,
    ),
    min_offset=counts,
    written_at_ms=counts,
)


def _framed(payload: bytes, version: int = CHECKPOINT_VERSION) -> bytes:
    """A header with the right length and CRC around any payload."""
    crc = zlib.crc32(payload)
    return f"trimq-checkpoint {version} {len(payload)} {crc:08x}\n".encode() + payload


@given(checkpoints)
def test_encode_decode_round_trip(cp: Checkpoint) -> None:
    data = cp.encode()
    assert data.count(b"\n") == 1  # the header's newline is the only one (see module docs)
    assert data.isascii()
    assert Checkpoint.decode(data) == cp


def test_save_load_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    assert Checkpoint.load(path) is None
    SAMPLE.save(path)
    loaded = Checkpoint.load(path)
    assert loaded == SAMPLE
    assert loaded is not None
    assert hash(loaded) == hash(SAMPLE)  # queue_sizes is left out of the hash
    clean = Checkpoint(safe_offset=5, clean=True, queue_sizes={})
    clean.save(path)
    assert Checkpoint.load(path) == clean
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


def test_encoding_is_deterministic() -> None:
    reordered = dict(reversed(list(SAMPLE.queue_sizes.items())))
    other = Checkpoint(
        SAMPLE.safe_offset, SAMPLE.clean, reordered, SAMPLE.min_offset, SAMPLE.written_at_ms
    )
    assert other.encode() == SAMPLE.encode()


def test_every_single_byte_change_is_detected() -> None:
    data = SAMPLE.encode()
    undetected = []
    for i in range(len(data)):
        for value in range(256):
            if value == data[i]:
                continue
            damaged = data[:i] + bytes([value]) + data[i + 1 :]
            try:
                Checkpoint.decode(damaged)
            except ValueError:
                continue
            undetected.append((i, value))
    assert undetected == []


def test_every_truncation_and_extension_is_detected() -> None:
    data = SAMPLE.encode()
    for end in range(len(data)):
        with pytest.raises(ValueError):  # noqa: PT011 - any of the decode messages will do
            Checkpoint.decode(data[:end])
    for tail in (b"\n", b" ", b"0", b"\x00"):
        with pytest.raises(ValueError, match="payload is"):
            Checkpoint.decode(data + tail)


def test_corrupt_file_is_a_store_corrupt_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    SAMPLE.save(path)
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
    with pytest.raises(StoreCorruptError, match="CRC") as info:
        Checkpoint.load(path)
    assert str(path) in str(info.value)
    path.write_bytes(b"")
    with pytest.raises(StoreCorruptError, match="header"):
        Checkpoint.load(path)


def test_unknown_version_is_a_store_corrupt_error(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    path.write_bytes(_framed(b'{"anything":"new"}', version=2))
    with pytest.raises(StoreCorruptError, match="unknown version 2"):
        Checkpoint.load(path)


def test_unreadable_file_is_a_store_corrupt_error(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    with pytest.raises(StoreCorruptError, match="cannot read"):
        Checkpoint.load(tmp_path / "checkpoint")


_GOOD = {"safe_offset": 1, "clean": True, "min_offset": 0, "written_at_ms": 0, "queues": []}


@pytest.mark.parametrize(
    "payload",
    [
        b"[]",
        b"{not json",
        b"\xff\xfe",
        json.dumps({**_GOOD, "clean": 1}).encode(),
        json.dumps({**_GOOD, "safe_offset": -1}).encode(),
        json.dumps({**_GOOD, "safe_offset": True}).encode(),
        json.dumps({**_GOOD, "min_offset": 1.5}).encode(),
        json.dumps({k: v for k, v in _GOOD.items() if k != "written_at_ms"}).encode(),
        json.dumps({**_GOOD, "queues": {}}).encode(),
        json.dumps({**_GOOD, "queues": [["t", 0]]}).encode(),
        json.dumps({**_GOOD, "queues": [["t", "0", 1]]}).encode(),
        json.dumps({**_GOOD, "queues": [["t", 0, -1]]}).encode(),
        json.dumps({**_GOOD, "queues": [["t", 0, 1], ["t", 0, 2]]}).encode(),
        b"[" * 100_000,
    ],
)
def test_well_framed_but_malformed_payload_is_rejected(payload: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies with the defect
        Checkpoint.decode(_framed(payload))


def test_well_framed_valid_payload_is_accepted() -> None:
    assert Checkpoint.decode(_framed(json.dumps(_GOOD).encode())) == Checkpoint(
        safe_offset=1, clean=True, queue_sizes={}
    )


@pytest.mark.parametrize(
    "bad",
    [
        Checkpoint(safe_offset=-1, clean=True, queue_sizes={}),
        Checkpoint(safe_offset=0, clean=True, queue_sizes={("t", 0): -5}),
        Checkpoint(safe_offset=0, clean=True, queue_sizes={}, min_offset=-1),
        Checkpoint(safe_offset=0, clean=True, queue_sizes={}, version=2),
    ],
)
def test_unencodable_checkpoint_fails_at_save_not_at_restart(
    tmp_path: Path, bad: Checkpoint
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        bad.save(tmp_path / "checkpoint")
    assert not (tmp_path / "checkpoint").exists()
