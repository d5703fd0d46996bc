"""One consume queue: the index of one (topic, queue id) into the commit log.

Theory of operation
-------------------
Layout. An entry is 20 bytes, ``>qiq``: commit-log offset, record size, tags code. Files of
``entries_per_file`` entries are named, as in RocketMQ, by their starting *byte* offset (entry
index × 20) in 20 zero-padded digits. Not preallocated: a file's size says how many entries it
holds, so files are contiguous, only the last may be short (or empty), and a torn trailing
entry from a crash is cut off on open.

Memory vs disk. Entries ``[first file start, _written)`` are in the files (the OS has them;
durability is the caller's fsync). Entries ``[_written, max_offset)`` are the packed bytearray
``_tail``: :meth:`append` only extends it, no syscall. :meth:`write_out` pwrites the tail into
the files and drops bytes from memory only after their write succeeded, so an ``OSError``
(ENOSPC, EIO) loses nothing, and the retry rewrites the same bytes at the same positions.

Below ``min_offset``. Retention deletes whole files from the front, so ``min_offset`` is usually
a file start. :meth:`reset` can restart a queue at any offset: the first file's entries before
it are RocketMQ's blank entry ``(0, 2**31 - 1, 0)`` (``fillPreBlank``), never served, and open
skips them, so the offset survives a reopen. Nothing else about content is checked here: the
store re-validates entries against the commit log during recovery.

Threads. Everything runs on the caller's thread except fsync: the fds :meth:`write_out` returns
(files written or truncated, plus the directory when files were created or deleted) may be
fsynced by a worker thread while this thread keeps appending and writing out. Those fds stay open
until :meth:`truncate`, :meth:`reset`, :meth:`delete_files_before`, :meth:`close` or
:meth:`destroy` removes or closes them; no fsync may be in flight across those calls.
"""

from __future__ import annotations

import errno
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from broker.store.api import StoreClosedError, StoreCorruptError

ENTRY_SIZE = 20
_ENTRY = struct.Struct(">qiq")
_PACK = _ENTRY.pack
#: RocketMQ's pre-blank entry: a size no record can have, so it cannot be mistaken for one.
_BLANK = (0, 0x7FFFFFFF, 0)
_BLANK_BYTES = _ENTRY.pack(*_BLANK)

Entry = tuple[int, int, int]


def _pwrite_all(fd: int, data: bytes | bytearray, position: int) -> None:
    """Write all of ``data`` at ``position``; a short write is continued, an error raised."""
    done = 0
    while done < len(data):  # each pass advances or raises, so the loop is bounded
        n = os.pwrite(fd, data[done:] if done else data, position + done)
        if n <= 0:
            raise OSError(errno.EIO, "pwrite made no progress")
        done += n


class ConsumeQueue:
    """The consume queue of one (topic, queue id); see the module docstring."""

    def __init__(
        self, directory: Path, topic: str, queue_id: int, *, entries_per_file: int = 300_000
    ) -> None:
        if entries_per_file < 1:
            raise ValueError(f"entries_per_file must be positive, got {entries_per_file}")
        self.topic = topic
        self.queue_id = queue_id
        self._dir = Path(directory)
        self._per_file = entries_per_file
        self._fds: dict[int, int] = {}  # file start (entry index) -> fd, opened lazily
        self._dirty: set[int] = set()  # fds written or truncated since the last write_out
        self._dir_dirty = False  # a file was created or deleted since the last write_out
        self._overrun = False  # a failed write may have left bytes past _written
        self._closed = False
        self._tail = bytearray()
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir_fd = os.open(self._dir, os.O_RDONLY)
        self._min = self._written = 0
        try:
            self._load()
        except BaseException:
            self._close_fds()  # a corrupt directory must not leak the fds opened so far
            raise
        self._max = self._written

    # ------------------------------------------------------------------ opening

    def _load(self) -> None:
        """Check the files are one contiguous run, cut a torn tail, find min and written."""
        starts, span, size = self._scan(), self._per_file * ENTRY_SIZE, 0
        for i, start in enumerate(starts):
            path = self._path(start)
            if i and start != starts[i - 1] + self._per_file:
                raise StoreCorruptError(f"{path}: a gap before it; files must be contiguous")
            size = path.stat().st_size
            if size > span:
                raise StoreCorruptError(f"{path}: {size} bytes, more than a file's {span}")
            if size < span and start != starts[-1]:
                # Power loss between checkpoints can keep a new file while the growth of the
                # one before it was lost. Everything past the short file is newer than the
                # last checkpoint, which recovery re-dispatches from the commit log anyway.
                for later in starts[i + 1 :]:
                    self._path(later).unlink()
                self._dir_dirty = True
                starts = starts[: i + 1]
                break
        if not starts:
            return
        last = starts[-1]
        if size % ENTRY_SIZE:  # a torn write: the partial entry was never acknowledged
            fd = self._fd(last)
            os.ftruncate(fd, size - size % ENTRY_SIZE)
            self._dirty.add(fd)
        self._written = last + size // ENTRY_SIZE
        self._min = self._skip_blanks(starts[0])

    def _scan(self) -> list[int]:
        """Sorted start entry indexes of the queue files (other names are ignored)."""
        span = self._per_file * ENTRY_SIZE
        starts = []
        for path in self._dir.iterdir():
            name = path.name
            if len(name) != 20 or not (name.isascii() and name.isdigit()):
                continue
            if int(name) % span:
                raise StoreCorruptError(
                    f"{path}: not a multiple of the file size {span} bytes"
                    " (was entries_per_file changed?)"
                )
            starts.append(int(name) // ENTRY_SIZE)
        return sorted(starts)

    def _skip_blanks(self, first: int) -> int:
        """First non-blank entry of the first file (blanks are a prefix): a binary search."""
        lo, hi = first, min(first + self._per_file, self._written)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._read(mid, mid + 1)[0] == _BLANK:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------------ bookkeeping

    @property
    def min_offset(self) -> int:
        """First queue offset still held."""
        return self._min

    @property
    def max_offset(self) -> int:
        """One past the last entry."""
        return self._max

    @property
    def buffered(self) -> int:
        """Entries appended but not yet written out."""
        return self._max - self._written

    def _path(self, start: int) -> Path:
        return self._dir / f"{start * ENTRY_SIZE:020d}"

    def _fd(self, start: int, *, create: bool = False) -> int:
        fd = self._fds.get(start)
        if fd is None:
            if self._closed:
                raise StoreClosedError(f"consume queue {self.topic}:{self.queue_id} is closed")
            fd = os.open(self._path(start), os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
            self._fds[start] = fd
            self._dir_dirty |= create
        return fd

    def _remove_file(self, start: int) -> None:
        self._path(start).unlink(missing_ok=True)
        fd = self._fds.pop(start, None)
        if fd is not None:
            self._dirty.discard(fd)
            os.close(fd)
        self._dir_dirty = True

    # ------------------------------------------------------------------ writing

    def append(self, commit_log_offset: int, size: int, tags_code: int) -> int:
        """Buffer one entry and return its queue offset (hot path: no syscall)."""
        self._tail += _PACK(commit_log_offset, size, tags_code)
        offset = self._max
        self._max = offset + 1
        return offset

    def append_at(
        self, queue_offset: int, commit_log_offset: int, size: int, tags_code: int
    ) -> None:
        """Recovery re-dispatch: append at ``max_offset``, accept an identical existing entry."""
        if queue_offset == self._max:
            self.append(commit_log_offset, size, tags_code)
            return
        wanted = (commit_log_offset, size, tags_code)
        if self._min <= queue_offset < self._max:
            held = self._entry(queue_offset)
            if held == wanted:
                return
            problem = f"holds {held}"
        else:
            problem = f"is outside [{self._min}, {self._max}]"
        raise StoreCorruptError(
            f"consume queue {self.topic}:{self.queue_id}: offset {queue_offset} {problem},"
            f" re-dispatch wants {wanted}"
        )

    def write_out(self) -> list[int]:
        """Hand buffered entries to the OS; return the fds to fsync (see the module docstring)."""
        while self._tail:  # each pass writes at least one entry
            self._write_one_file()
        fds = list(self._dirty)
        if self._dir_dirty:
            fds.append(self._dir_fd)
        self._dirty.clear()
        self._dir_dirty = False
        return fds

    def _write_one_file(self) -> None:
        """Write the part of the tail that falls in the file holding ``_written``."""
        written = self._written
        start = written - written % self._per_file
        count = min(start + self._per_file - written, len(self._tail) // ENTRY_SIZE)
        nbytes = count * ENTRY_SIZE
        fd = self._fd(start, create=written == start)
        data = self._tail if nbytes == len(self._tail) else self._tail[:nbytes]
        try:
            _pwrite_all(fd, data, (written - start) * ENTRY_SIZE)
        except OSError:
            # Part may have landed past _written. A retry rewrites it, but if truncate
            # shortens the tail first, those bytes would come back on reopen: cut them then.
            self._overrun = True
            raise
        # Only now is it safe to forget the bytes: the OS holds them.
        del self._tail[:nbytes]
        self._written = written + count
        self._dirty.add(fd)

    def sync(self) -> None:
        """Write out and fsync, on this thread."""
        for fd in self.write_out():
            os.fsync(fd)

    def truncate(self, max_offset: int) -> None:
        """Drop entries ``>= max_offset``; below ``min_offset`` it is :meth:`reset`.

        An offset at or past ``max_offset`` changes nothing.
        """
        if max_offset >= self._max:
            return
        if max_offset < self._min:
            self.reset(max_offset)
            return
        if max_offset >= self._written:
            del self._tail[(max_offset - self._written) * ENTRY_SIZE :]
            if self._overrun:
                self._cut_file(self._written)
        else:
            self._tail.clear()
            keep = max_offset - max_offset % self._per_file
            # Back to front, so a crash part-way still leaves a contiguous run of files.
            for start in reversed(range(keep + self._per_file, self._written + 1, self._per_file)):
                self._remove_file(start)
            self._cut_file(max_offset)
            self._written = max_offset
        self._max = max_offset

    def _cut_file(self, end: int) -> None:
        """Shorten the file holding entry ``end`` to end just before it."""
        start = end - end % self._per_file
        fd = self._fd(start, create=True)
        os.ftruncate(fd, (end - start) * ENTRY_SIZE)
        self._dirty.add(fd)
        self._overrun = False

    def reset(self, queue_offset: int) -> None:
        """Empty the queue and restart it at ``queue_offset`` (min == max == it).

        Deletes every file and creates the (empty) file that will hold ``queue_offset``; its
        entries before ``queue_offset`` are buffered blanks, written out like any append.
        """
        if queue_offset < 0:
            raise ValueError(f"queue offset must not be negative, got {queue_offset}")
        self._tail.clear()
        self._overrun = False  # every file goes
        first = self._min - self._min % self._per_file
        for start in reversed(range(first, self._written + 1, self._per_file)):
            self._remove_file(start)
        start = queue_offset - queue_offset % self._per_file
        self._fd(start, create=True)
        self._written = start
        self._tail += _BLANK_BYTES * (queue_offset - start)
        self._min = self._max = queue_offset

    def delete_files_before(self, commit_log_offset: int) -> int:
        """Retention: delete front files whose last entry points below ``commit_log_offset``.

        Only a file that is fully written out and followed by written entries is a candidate,
        so the file holding ``max_offset - 1`` (and a file on disk) always remains.
        """
        deleted = 0
        while True:  # min_offset rises by a file per pass, so this ends
            end = self._min - self._min % self._per_file + self._per_file
            if end >= self._written or self._entry(end - 1)[0] >= commit_log_offset:
                return deleted
            self._remove_file(end - self._per_file)
            self._min = end
            deleted += 1

    # ------------------------------------------------------------------ reading

    def _read(self, first: int, stop: int) -> list[Entry]:
        """Entries ``[first, stop)`` of one file, in one pread."""
        start = first - first % self._per_file
        nbytes = (stop - first) * ENTRY_SIZE
        data = os.pread(self._fd(start), nbytes, (first - start) * ENTRY_SIZE)
        if len(data) != nbytes:
            raise StoreCorruptError(
                f"{self._path(start)}: read {len(data)} of {nbytes} bytes at entry {first};"
                " the file was shortened behind the queue's back"
            )
        return list(_ENTRY.iter_unpack(data))

    def entries(self, queue_offset: int, max_count: int) -> list[Entry]:
        """Entries from ``queue_offset`` on, at most ``max_count``; element i is offset + i.

        Empty when ``queue_offset`` is outside ``[min_offset, max_offset)``.
        """
        if not self._min <= queue_offset < self._max or max_count <= 0:
            return []
        end = min(queue_offset + max_count, self._max)
        out: list[Entry] = []
        pos = queue_offset
        on_disk = min(end, self._written)
        while pos < on_disk:  # one pread per file touched
            stop = min(on_disk, pos - pos % self._per_file + self._per_file)
            out += self._read(pos, stop)
            pos = stop
        if pos < end:
            base = self._written
            tail = self._tail[(pos - base) * ENTRY_SIZE : (end - base) * ENTRY_SIZE]
            out += _ENTRY.iter_unpack(tail)
        return out

    def entry(self, queue_offset: int) -> Entry | None:
        """The entry at ``queue_offset``, or None outside ``[min_offset, max_offset)``."""
        got = self.entries(queue_offset, 1)
        return got[0] if got else None

    def _entry(self, queue_offset: int) -> Entry:  # for an offset known to be held
        return self.entries(queue_offset, 1)[0]

    def bisect(self, key: Callable[[Entry], int], target: int) -> int:
        """Smallest queue offset whose ``key(entry) >= target`` (``max_offset`` if none).

        ``key`` must be non-decreasing over the queue; it is called O(log n) times.
        """
        lo, hi = self._min, self._max
        while lo < hi:
            mid = (lo + hi) // 2
            if key(self._entry(mid)) < target:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def first_at_or_after(self, commit_log_offset: int) -> int:
        """Smallest queue offset whose entry's commit-log offset is ``>= commit_log_offset``."""
        return self.bisect(lambda e: e[0], commit_log_offset)

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Write out and close every fd (no fsync: durability is the store's decision)."""
        if self._closed:
            return
        try:
            self.write_out()
        finally:
            self._close_fds()

    def _close_fds(self) -> None:
        self._closed = True
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._dirty.clear()
        self._dir_dirty = False
        os.close(self._dir_fd)

    def destroy(self) -> None:
        """Close without writing out and delete the queue's directory (topic deletion)."""
        if not self._closed:
            self._close_fds()
        self._tail.clear()
        shutil.rmtree(self._dir, ignore_errors=False)
