"""The key index: find messages by ``UNIQ_KEY`` or by any of their ``KEYS`` (mqadmin's
queryMsgByKey / queryMsgByUniqueKey).

Theory of operation. Writes are per message, queries are a rare admin action, so the index is
built for cheap writes:

* A row is 16 bytes: ``crc32(key)``, the record's commit-log offset, and a CRC of those 12
  bytes (so a torn or zeroed row is recognised). Hashes can collide and the topic is not in
  the row: lookups return candidate offsets and the store checks each record really is the
  topic's and carries the key.
* Rows live in one append-only file per commit-log segment, ``index/<segment start>.idx``,
  in commit-log order. Retention deletes a segment's file with the segment; a lookup reads the
  files newest first and finds the hash with ``bytes.find`` (C speed, tens of MB per ms).
* Dispatch calls :meth:`add` (main thread: pack a row into a buffer). A checkpoint
  :meth:`take` s the buffer, :meth:`write` s it from its worker thread (append + fsync, no GIL
  held while the kernel works) and :meth:`written` drops it; lookups see buffered, in-flight
  and written rows alike.
* Durability follows the checkpoint: rows of every record before ``safe_offset`` are fsynced
  before the checkpoint file is written. Recovery calls ``truncate_from(safe_offset)``, which
  cuts each file at its first row that is invalid or past the offset (a binary search: rows
  are appended in offset order and only a crashed append can leave a bad tail), and the
  re-dispatch of the records after it adds their rows again.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
import zlib
from pathlib import Path

_ROW = struct.Struct(">Iq")
_CHECKED = struct.Struct(">IqI")
ROW_SIZE = _CHECKED.size  # 16
_NAME_DIGITS = 20

#: A batch handed to the writer: (key, commit-log offset) in offset order.
Batch = list[tuple[str, int]]


def key_hash(key: str) -> int:
    """The 32-bit hash a row stores for ``key``."""
    return zlib.crc32(key.encode())


def _row(key: str, offset: int) -> bytes:
    head = _ROW.pack(zlib.crc32(key.encode()), offset)
    return head + (zlib.crc32(head)).to_bytes(4, "big")


class KeyIndex:
    """Key → commit-log offsets, one append-only file per commit-log segment."""

    def __init__(self, directory: Path, segment_size: int) -> None:
        self.directory = directory
        self.segment_size = segment_size
        directory.mkdir(parents=True, exist_ok=True)
        self._pending: Batch = []
        self._in_flight: list[Batch] = []
        self._lock = threading.Lock()  # file changes: writer thread vs main thread

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:0{_NAME_DIGITS}d}.idx"

    def segments(self) -> list[int]:
        """Segments that have an index file, oldest first."""
        out = []
        for path in self.directory.iterdir():
            stem, suffix = path.stem, path.suffix
            if suffix == ".idx" and len(stem) == _NAME_DIGITS and stem.isdigit() and stem.isascii():
                out.append(int(stem))
        return sorted(out)

    # ------------------------------------------------------------------ writing
    def add(self, key: str, offset: int) -> None:
        """Index one key of the record at ``offset`` (buffered until the next :meth:`take`).

        Only a list append: hashing and packing happen in :meth:`write`, in the checkpoint's
        worker thread, so neither puts nor checkpoints stall the event loop for them."""
        self._pending.append((key, offset))

    def take(self) -> Batch:
        """Main thread: hand the buffered rows to a writer (O(1)); they stay visible to
        lookups until :meth:`written`."""
        batch, self._pending = self._pending, []
        self._in_flight.append(batch)
        return batch

    def write(self, batch: Batch) -> None:
        """Worker thread: pack ``batch`` into rows, append them to their segments' files and
        fsync those."""
        packed = self._pack(batch)
        with self._lock:
            created = False
            for segment, rows in packed:
                path = self._path(segment)
                created = created or not path.exists()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    _write_all(fd, rows)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if created:
                _fsync_dir(self.directory)

    def _pack(self, batch: Batch) -> list[tuple[int, bytes]]:
        out = []
        size, start = self.segment_size, 0
        while start < len(batch):  # rows are in offset order: split them by segment
            segment = batch[start][1] - batch[start][1] % size
            stop = bisect.bisect_left(batch, segment + size, lo=start, key=_offset_of)
            out.append((segment, b"".join([_row(k, off) for k, off in batch[start:stop]])))
            start = stop
        return out

    def written(self, batch: Batch) -> None:
        """Main thread: ``batch`` (from :meth:`take`) is durable."""
        self._in_flight = [b for b in self._in_flight if b is not batch]

    # ------------------------------------------------------------------ reading
    def candidates(self, key: str, max_num: int) -> list[int]:
        """Offsets that may hold a record with ``key``, newest first (at most ``max_num``;
        hash collisions possible: the caller checks each record)."""
        pattern = key_hash(key).to_bytes(4, "big")
        found = {off for k, off in self._pending if k == key}
        for batch in self._in_flight:
            found.update(off for k, off in batch if k == key)
        for segment in reversed(self.segments()):
            if len(found) >= max_num:
                break
            with self._lock:
                data = _read(self._path(segment))
            found.update(_matches(data, pattern))
        return sorted(found, reverse=True)[:max_num]

    # ------------------------------------------------------------------ cutting
    def truncate_from(self, offset: int) -> None:
        """Forget rows of records at or past ``offset`` and any damaged tail (recovery)."""
        segment = offset - offset % self.segment_size
        self._pending = [(k, off) for k, off in self._pending if off < offset]
        for batch in self._in_flight:  # in place: written() finds batches by identity
            batch[:] = [(k, off) for k, off in batch if off < offset]
        with self._lock:
            for start in self.segments():
                if start > segment:
                    self._path(start).unlink()
                elif start == segment or _bad_tail(self._path(start)):
                    # Earlier files were completed by checkpoints; check their tails anyway.
                    _cut(self._path(start), offset)

    def delete_before(self, offset: int) -> None:
        """Delete the files of segments that end at or before ``offset`` (retention)."""
        with self._lock:
            for start in self.segments():
                if start + self.segment_size <= offset:
                    self._path(start).unlink()

    def close(self) -> None:
        """Nothing is held open; buffered rows are re-indexed by recovery."""


def _offset_of(row: tuple[str, int]) -> int:
    return row[1]


def _matches(data: bytes, pattern: bytes) -> list[int]:
    out = []
    pos = data.find(pattern)
    while pos != -1:
        if pos % ROW_SIZE == 0:
            out.append(_ROW.unpack_from(data, pos)[1])
            pos = data.find(pattern, pos + ROW_SIZE)
        else:
            pos = data.find(pattern, pos + 1)
    return out


def _valid_before(data: bytes, index: int, offset: int) -> bool:
    h, off, crc = _CHECKED.unpack_from(data, index * ROW_SIZE)
    return bool(off < offset and crc == zlib.crc32(_ROW.pack(h, off)))


def _bad_tail(path: Path) -> bool:
    size = path.stat().st_size
    if size % ROW_SIZE:
        return True
    if not size:
        return False
    with path.open("rb") as f:
        f.seek(size - ROW_SIZE)
        return not _valid_before(f.read(ROW_SIZE), 0, 2**63 - 1)


def _cut(path: Path, offset: int) -> None:
    """Truncate ``path`` at its first row that is damaged or at/past ``offset``."""
    data = _read(path)
    lo, hi = 0, len(data) // ROW_SIZE
    while lo < hi:  # rows valid-and-before form a prefix: binary search its end
        mid = (lo + hi) // 2
        if _valid_before(data, mid, offset):
            lo = mid + 1
        else:
            hi = mid
    if lo * ROW_SIZE != len(data):
        os.truncate(path, lo * ROW_SIZE)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
