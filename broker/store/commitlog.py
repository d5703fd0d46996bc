"""The commit log: every record of every topic, appended to fixed-size segment files.

Theory of operation:

* Segments are ``segment_size`` bytes, named by their 20-digit start offset, aligned to
  multiples of ``segment_size`` and preallocated (``posix_fallocate``) when first written, so
  a full disk shows up as an error when a segment is created, not as a torn record later.
  A record never straddles segments: when it would not fit with room for a blank marker, the
  rest of the segment becomes a blank marker (RocketMQ's ``BLANK_MAGIC_CODE``) and the record
  goes to the next segment.
* ``end`` is where the next record goes. Appends go to ``_tail``, an in-memory copy of the
  log's newest bytes ``[_tail.start, end)`` in chunks (:mod:`broker.store.tail`), whose end
  is ``end``: recent reads never touch the disk. Bytes below ``written`` have been handed
  to the OS (``os.pwrite``); ``write_out`` moves the rest and
  returns the descriptors to ``fsync`` — the caller may fsync them in a worker thread while
  this thread keeps appending, so descriptors stay open until :meth:`close`. A segment stays
  "unsynced" (its descriptor is returned by every ``write_out``) until :meth:`synced` says an
  fsync that covered its last write succeeded: bytes written out by a call whose descriptors
  were dropped, or whose fsync failed, are never taken for durable.
* The tail is trimmed a chunk at a time to at least ``tail_cache_bytes``, never past
  ``written``: unwritten bytes live only in memory, and a failed write (ENOSPC, EIO) keeps
  them there for a retry.
* :meth:`scan` walks records from an offset, validating each (:func:`check_record`), for
  recovery and re-dispatch; :meth:`truncate` cuts the log after a crash so that stale bytes
  beyond the new end can never be mistaken for records later.
"""

from __future__ import annotations

import bisect
import itertools
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from broker.store.api import StoreCorruptError
from broker.store.record import BLANK_SIZE, blank_marker, check_record
from broker.store.tail import TailCache, chunk_size_for

_NAME_DIGITS = 20
_SCAN_CHUNK = 4 * 1024 * 1024
_SIZE = struct.Struct(">i")


def size_at(buf: bytes | bytearray, pos: int) -> int:
    """The size field of the record (or blank) starting at ``buf[pos:]``."""
    size: int = _SIZE.unpack_from(buf, pos)[0]
    return size


def segment_name(start: int) -> str:
    """RocketMQ's ``offset2FileName``: the start offset, 20 digits, zero padded."""
    return f"{start:0{_NAME_DIGITS}d}"


class ScanItem(NamedTuple):
    """One valid record found by :meth:`CommitLog.scan` (``data`` is the whole record)."""

    offset: int
    data: bytes


class ScanEnd(NamedTuple):
    """Where a scan stopped and why (``"end of data"`` when the log simply ends)."""

    offset: int
    reason: str


class CommitLog:
    """Segmented append-only log of stored records (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        segment_size: int,
        *,
        tail_cache_bytes: int = 64 * 1024 * 1024,
        preallocate: bool = True,
    ) -> None:
        if segment_size < 4096:
            raise ValueError("segment_size must be at least 4096 bytes")
        self.directory = directory
        self.segment_size = segment_size
        self.tail_cache_bytes = tail_cache_bytes
        self.preallocate = preallocate
        directory.mkdir(parents=True, exist_ok=True)
        self._starts = self._discover()
        self._fds: dict[int, int] = {}
        self.min_offset = self._starts[0] if self._starts else 0
        self.written = self.min_offset
        self._tail = TailCache(self.min_offset, chunk_size_for(tail_cache_bytes))
        #: segment start -> the ``write_generation`` that last wrote to it, until synced
        self._unsynced: dict[int, int] = {}
        self.write_generation = 0

    # ------------------------------------------------------------------ discovery
    def _discover(self) -> list[int]:
        starts = []
        for path in self.directory.iterdir():
            name = path.name
            if len(name) != _NAME_DIGITS or not (name.isdigit() and name.isascii()):
                continue  # temp files and the like are not segments
            start = int(name)
            if start % self.segment_size:
                raise StoreCorruptError(
                    f"commit-log segment {path} does not start at a multiple of the segment "
                    f"size {self.segment_size}: was the store written with another size?"
                )
            starts.append(start)
        starts.sort()
        for prev, nxt in itertools.pairwise(starts):
            if nxt != prev + self.segment_size:
                raise StoreCorruptError(
                    f"commit-log segments are not contiguous: {segment_name(prev)} is followed "
                    f"by {segment_name(nxt)}"
                )
        return starts

    @property
    def segment_starts(self) -> list[int]:
        """Start offsets of the segment files, oldest first."""
        return list(self._starts)

    @property
    def end(self) -> int:
        """Where the next record goes: the end of the in-memory tail."""
        return self._tail.end

    def set_end(self, end: int) -> None:
        """Declare where valid data ends (recovery's verdict); appends continue from there."""
        self.written = end
        self._tail.reset(end)
        if not self._starts:
            self.min_offset = end - end % self.segment_size

    # ------------------------------------------------------------------ appending
    def reserve(self, size: int) -> int:
        """Return where a record of ``size`` bytes will go, rolling the segment if needed.

        Raises:
            ValueError: the record cannot fit any segment.
        """
        if size + BLANK_SIZE > self.segment_size:
            raise ValueError(f"a record of {size} bytes does not fit a {self.segment_size} segment")
        remaining = self.segment_size - self.end % self.segment_size
        if size + BLANK_SIZE > remaining:
            self._tail.extend((blank_marker(remaining), bytes(remaining - BLANK_SIZE)))
        return self.end

    def append(self, data: bytes) -> None:
        """Append a record at :meth:`reserve`'s position (kept in memory until written out)."""
        self._tail.extend((data,))

    def append_parts(self, *parts: bytes) -> None:
        """Append a record given in parts (saves joining them first)."""
        self._tail.extend(parts)

    def unappend(self, offset: int) -> None:
        """Forget unwritten bytes from ``offset`` on (a put failed after reserving)."""
        if offset < self.written:
            raise ValueError("cannot unappend bytes already written")
        self._tail.truncate(offset)

    def write_out(self) -> list[int]:
        """Hand every appended byte to the OS; return the descriptors to fsync: those of
        every segment written since an fsync covering it was reported by :meth:`synced`.

        Raises:
            OSError: the disk refused (the bytes stay in memory; a later call retries).
        """
        self.write_generation += 1
        while self.written < self.end:
            start = self.written - self.written % self.segment_size
            stop = min(self.end, start + self.segment_size)
            fd = self._segment_fd(start, create=True)
            self._unsynced[start] = self.write_generation
            view = self._tail.view(self.written, stop)  # up to a chunk's end
            with view:
                done = os.pwrite(fd, view, self.written - start)
            self.written += done
        self._tail.drop_before(min(self.written, self.end - self.tail_cache_bytes))
        return [self._fds[start] for start in self._unsynced]

    def synced(self, generation: int) -> None:
        """The descriptors :meth:`write_out` returned when ``write_generation`` was
        ``generation`` have been fsynced: forget the segments not written since."""
        for start, written_by in list(self._unsynced.items()):
            if written_by <= generation:
                del self._unsynced[start]

    # ------------------------------------------------------------------ reading
    def read(self, offset: int, size: int) -> bytes | None:
        """The ``size`` bytes at ``offset``, or None outside ``[min_offset, end)`` or across
        a segment boundary (no record straddles one; the caller's size is not a record's)."""
        if offset < self.min_offset or offset + size > self.end or size < 0:
            return None
        if offset % self.segment_size + size > self.segment_size:
            return None
        if offset >= self._tail.start:
            return self._tail.read(offset, size)
        return self._pread(offset, size)

    def read_some(self, offset: int, max_size: int) -> bytes:
        """Up to ``max_size`` bytes from ``offset`` (fewer, never none, when ``offset`` is
        inside the log): the span stops at the end of the log, of the segment, and at the
        start of the in-memory tail, whose bytes may not be on disk yet (a span is read
        from one place). Raises ``ValueError`` outside ``[min_offset, end)``."""
        if not self.min_offset <= offset < self.end or max_size <= 0:
            raise ValueError(f"offset {offset} is outside [{self.min_offset}, {self.end})")
        stop = min(offset + max_size, self.end, offset - offset % self.segment_size
                   + self.segment_size)  # fmt: skip
        if offset < self._tail.start:
            stop = min(stop, self._tail.start)
        data = self.read(offset, stop - offset)
        assert data is not None  # inside the log and one segment
        return data

    def _pread(self, offset: int, size: int) -> bytes:
        start = offset - offset % self.segment_size
        fd = self._segment_fd(start, create=False)
        data = os.pread(fd, size, offset - start)
        if len(data) != size:
            raise StoreCorruptError(f"commit-log segment {segment_name(start)} is short")
        return data

    def _segment_fd(self, start: int, *, create: bool) -> int:
        fd = self._fds.get(start)
        if fd is not None:
            return fd
        path = self.directory / segment_name(start)
        if start not in self._starts:
            if not create:
                raise StoreCorruptError(f"commit-log segment {path.name} is missing")
            fd = self._create_segment(path)
            bisect.insort(self._starts, start)
        else:
            fd = os.open(path, os.O_RDWR)
        self._fds[start] = fd
        return fd

    def _create_segment(self, path: Path) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if self.preallocate:
                os.posix_fallocate(fd, 0, self.segment_size)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return fd

    # ------------------------------------------------------------------ recovery
    def scan(self, start: int) -> Iterator[ScanItem | ScanEnd]:
        """Yield every valid record on disk from ``start`` on, then one :class:`ScanEnd`.

        Blank markers are followed into the next segment. The scan stops at the first byte
        that is not a valid record: torn, corrupt, or simply the end of data. Reads go in
        chunks of a few MiB, so a scan costs what the data since ``start`` costs.
        """
        pos, chunk, chunk_pos = start, b"", start
        while True:
            seg = pos - pos % self.segment_size
            if seg not in self._starts:
                yield ScanEnd(pos, "end of data")
                return
            seg_end = seg + self.segment_size
            rel = pos - chunk_pos
            if len(chunk) - rel < BLANK_SIZE:
                chunk, chunk_pos, rel = self._pread_upto(seg, pos, _SCAN_CHUNK), pos, 0
            size = _SIZE.unpack_from(chunk, rel)[0] if len(chunk) - rel >= 4 else 0
            if rel + size > len(chunk) and chunk_pos + len(chunk) < seg_end:
                chunk, chunk_pos, rel = self._pread_upto(seg, pos, max(size, _SCAN_CHUNK)), pos, 0
            check = check_record(chunk, rel, pos)
            if check.size == 0:
                yield ScanEnd(pos, check.reason)
                return
            if check.blank:
                pos = seg_end
                continue
            yield ScanItem(pos, bytes(chunk[rel : rel + check.size]))
            pos += check.size

    def _pread_upto(self, seg: int, pos: int, size: int) -> bytes:
        size = min(size, seg + self.segment_size - pos)
        return os.pread(self._segment_fd(seg, create=False), size, pos - seg)

    def truncate(self, end: int) -> None:
        """Make ``end`` the end of the log: later segments are deleted and the rest of the
        last segment is zeroed (truncated and re-allocated), so stale records beyond the new
        end cannot reappear in a later recovery."""
        seg = end - end % self.segment_size
        for start in [s for s in self._starts if s > seg]:
            self._close_fd(start)
            (self.directory / segment_name(start)).unlink(missing_ok=True)
            self._starts.remove(start)
        if seg in self._starts:
            fd = self._segment_fd(seg, create=False)
            os.ftruncate(fd, end - seg)
            if self.preallocate:
                os.posix_fallocate(fd, 0, self.segment_size)
            os.fsync(fd)
        self.set_end(end)

    # ------------------------------------------------------------------ retention
    def delete_segments_before(self, offset: int) -> list[int]:
        """Delete whole segments that end at or before ``offset``, never the one holding
        ``end``; return the deleted start offsets."""
        active = self.end - self.end % self.segment_size
        doomed = [s for s in self._starts if s + self.segment_size <= offset and s < active]
        for start in doomed:
            self._close_fd(start)
            (self.directory / segment_name(start)).unlink(missing_ok=True)
            self._starts.remove(start)
        if doomed:
            self.min_offset = self._starts[0] if self._starts else self.end
        return doomed

    def expired_before(self, cutoff_s: float) -> int:
        """End of the oldest run of segments last modified before ``cutoff_s``: what
        retention may delete (:meth:`delete_segments_before` still spares the active one)."""
        upto = self.min_offset
        for start in self._starts:
            if self.segment_mtime(start) >= cutoff_s:
                break
            upto = start + self.segment_size
        return upto

    def segment_mtime(self, start: int) -> float:
        """Last modification time of a segment file (retention's age test)."""
        return (self.directory / segment_name(start)).stat().st_mtime

    # ------------------------------------------------------------------ shutdown
    def _close_fd(self, start: int) -> None:
        self._unsynced.pop(start, None)
        fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every descriptor (the caller writes out and fsyncs first)."""
        for start in list(self._fds):
            self._close_fd(start)
