"""A durable op journal with snapshots, so the pop in-flight table survives ``kill -9``.

Values are anything msgpack serialises (tuples come back as lists); their meaning is the
caller's. ``journal.<generation>`` files hold frames (big-endian ``u32 length``, ``u32 crc32``
of length and payload, msgpack payload); ``snapshot`` is one frame of ``{generation: G, state}``.
Recovery = newest snapshot + every journal file of generation >= G, in order: ``rotate`` opens
journal G before the snapshot tagged G exists, so a crash between them replays more, never less.
Synchronous (no trio): the owner thread appends; snapshot writes and syncs run in workers.
"""

from __future__ import annotations

import os
import re
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgpack

from broker.store.files import atomic_write, fsync_dir, read_optional

SNAPSHOT: Final = "snapshot"
MAX_FRAME: Final = 1 << 26  #: a longer length is corruption (a huge one would hide frames)
_HEADER: Final = struct.Struct(">II")
_JOURNAL_RE: Final = re.compile(r"journal\.(\d+)")
_APPEND_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC


class JournalUnusableError(OSError):
    """Closed, or a failed fsync/rollback left the tail uncertain (an OSError: a disk error)."""


@dataclass(frozen=True)
class Recovered:
    """What :meth:`Journal.open` found: apply ``ops`` in order on top of ``state``."""

    state: Any  #: the newest snapshot's state, or None when there is no snapshot
    ops: list[Any]  #: every op appended after that snapshot, in order
    generation: int  #: the snapshot's generation (0: none)
    files: list[Path]  #: journal files replayed, in order
    torn_tail_bytes: int  #: bytes cut off the last file's torn or corrupt tail


def _name(generation: int) -> str:
    return f"journal.{generation:010d}"


def _frame(payload: bytes) -> bytes:
    if not 0 < len(payload) <= MAX_FRAME:
        raise ValueError(f"journal frame of {len(payload)} bytes (limit {MAX_FRAME})")
    length = len(payload).to_bytes(4, "big")
    return length + zlib.crc32(payload, zlib.crc32(length)).to_bytes(4, "big") + payload


def _scan(data: bytes) -> tuple[list[Any], int, str | None]:
    """Decode frames: (values, end of the last good frame, why the scan stopped early or None)."""
    ops: list[Any] = []
    pos = 0
    while pos < len(data):  # bounded: pos grows by at least one header per round
        left = len(data) - pos
        length, crc = _HEADER.unpack_from(data, pos) if left >= _HEADER.size else (0, 0)
        end = pos + _HEADER.size + length
        if not 0 < length <= MAX_FRAME or end > len(data):
            return ops, pos, f"bad or incomplete frame ({left} bytes left, length {length})"
        payload = data[pos + _HEADER.size : end]
        if zlib.crc32(payload, zlib.crc32(data[pos : pos + 4])) != crc:
            return ops, pos, "CRC mismatch"
        try:
            ops.append(msgpack.unpackb(payload, raw=False, strict_map_key=False))
        except Exception as exc:  # msgpack raises many types; a CRC-valid frame never should
            return ops, pos, f"undecodable payload ({exc!r:.60})"
        pos = end
    return ops, pos, None


def _load_snapshot(path: Path) -> tuple[int, Any]:
    if (data := read_optional(path)) is None:
        return 0, None
    values, end, why = _scan(data)
    value = values[0] if why is None and len(values) == 1 else None
    if not (isinstance(value, dict) and isinstance(value.get("generation"), int)):
        why = why or "not one {generation, state} frame"
        raise ValueError(f"unreadable journal snapshot {path} at offset {end}: {why}")
    return value["generation"], value.get("state")


def _journal_files(directory: Path) -> dict[int, Path]:
    found = (_JOURNAL_RE.fullmatch(p.name) for p in directory.iterdir())
    return {int(m[1]): directory / m[0] for m in found if m is not None}


class Journal:
    """Use :meth:`open`. ``append``, ``rotate`` and ``close`` belong to the owner thread; the
    writer from ``rotate`` and :meth:`sync` may run in worker threads, but not after close."""

    def __init__(self, path: Path, gen: int, fd: int, size: int, fsync: bool, base: int) -> None:
        self.directory = path
        self.generation = gen  #: the generation appends go to
        self.size = size  #: bytes in the current generation's file
        self.appended = 0  #: ops appended through this object
        self._fd = fd
        self._fsync = fsync
        self._unusable: str | None = None
        self._retired: list[int] = []  # descriptors of earlier generations, not yet fsynced
        self._fd_lock = threading.Lock()  # held only briefly, to swap or dup descriptors
        self._sync_lock = threading.Lock()  # serialises sync() (never taken by the owner)
        self._snapshot_lock = threading.Lock()
        self._snapshot_generation = base
        #: (generation, size) the last completed sync covered: a sync finding the same and no
        #: retired descriptor has nothing to do (an idle broker's checkpoint, every second).
        self._synced: tuple[int, int] | None = None
        # One packer for the owner thread's appends: msgpack.packb builds one per call, which
        # cost more than the op's encoding (the same bytes: packb is Packer(...).pack).
        self._pack = msgpack.Packer(use_bin_type=True).pack

    @classmethod
    def open(cls, directory: Path, *, fsync: bool = False) -> tuple[Journal, Recovered]:
        """Recover ``directory`` (created if missing); appends continue in its last file, which
        keeps the file count bounded by rotations, not restarts (a torn tail is truncated and
        fsynced first). Raises ``OSError``, or ``ValueError`` naming the file and offset for an
        unreadable snapshot, a missing generation, or corruption in a journal file that is not
        the last: it was complete, and dropping frames could lose pops or revive acked ones."""
        directory.mkdir(parents=True, exist_ok=True)
        base, state = _load_snapshot(directory / SNAPSHOT)
        files = _journal_files(directory)
        for gen in [g for g in files if g < base]:  # covered by the snapshot; delete missed
            files.pop(gen).unlink(missing_ok=True)
        first = base or 1  # rotate creates journal.G before the snapshot tagged G exists
        gens = sorted(files) or [first]
        if gens != list(range(first, first + len(gens))) or (base and not files):
            found = gens if files else "none"
            raise ValueError(f"{directory}: journal generations from {first} have gaps ({found})")
        ops: list[Any] = []
        for gen in gens[:-1]:
            values, end, why = _scan(files[gen].read_bytes())
            if why is not None:
                raise ValueError(f"corrupt journal file {files[gen]} at offset {end}: {why}")
            ops += values
        last = directory / _name(gens[-1])
        fd = os.open(last, _APPEND_FLAGS | os.O_CREAT, 0o600)
        try:
            data = read_optional(last) or b""
            values, end, _why = _scan(data)
            ops += values
            torn = len(data) - end
            if torn:
                os.ftruncate(fd, end)
            if torn or gens[-1] not in files:
                os.fsync(fd)
                fsync_dir(directory)
        except BaseException:
            os.close(fd)
            raise
        recovered = Recovered(state, ops, base, sorted(files.values()), torn)  # padded names
        return cls(directory, gens[-1], fd, end, fsync, base), recovered

    def _check_usable(self) -> None:
        if self._unusable is not None:
            raise JournalUnusableError(f"journal {self.directory} unusable: {self._unusable}")

    def append(self, op: Any) -> None:
        """Hand ``op`` to the OS now (a kill -9 loses nothing; with ``fsync``, no power loss).

        On ``OSError`` nothing was appended: the failed write is truncated back, and the journal
        stays usable (a full disk may clear) unless that truncation or an fsync failed (the
        kernel may have dropped earlier dirty pages too): then appends and rotations raise
        :class:`JournalUnusableError` until a reopen rescans the disk."""
        frame = _frame(self._pack(op))
        self._check_usable()
        try:
            view = memoryview(frame)
            while view:  # bounded: every round writes at least one byte or raises
                written = os.write(self._fd, view)
                if written <= 0:
                    raise OSError(f"short write to {_name(self.generation)}")
                view = view[written:]
            if self._fsync:
                try:
                    os.fsync(self._fd)
                except OSError as exc:
                    self._unusable = f"fsync failed: {exc}"
                    raise
        except OSError:
            try:
                os.ftruncate(self._fd, self.size)
            except OSError as exc:
                self._unusable = f"cannot truncate a failed append: {exc}"
            raise
        self.size += len(frame)
        self.appended += 1

    def rotate(self, state: Any) -> Callable[[], None]:
        """Start the next generation now; return the writer (for a worker thread) of a snapshot
        of ``state``, which must reflect every op appended so far. ``state`` is serialised here,
        so the caller may change it at once. The writer replaces the snapshot atomically, then
        deletes older journal files; one finishing after a newer writer does nothing. On an
        error (``OSError``, or ``TypeError``/``ValueError`` for ``state``) nothing changed."""
        self._check_usable()
        new = self.generation + 1
        data = _frame(msgpack.packb({"generation": new, "state": state}, use_bin_type=True))
        fd = os.open(self.directory / _name(new), _APPEND_FLAGS | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            if self._fsync:  # acknowledged appends must not land in a file a crash forgets
                fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            raise
        with self._fd_lock:
            old, self._fd = self._fd, fd
            (os.close if self._fsync else self._retired.append)(old)  # fsynced, or sync() will
        self.generation, self.size = new, 0

        def write() -> None:
            with self._snapshot_lock:
                if new <= self._snapshot_generation:
                    return
                atomic_write(self.directory / SNAPSHOT, data)
                self._snapshot_generation = new
                for stale in [p for g, p in _journal_files(self.directory).items() if g < new]:
                    stale.unlink(missing_ok=True)  # covered by the snapshot

        return write

    def sync(self) -> None:
        """Make every append so far durable, older generations and new file entries too."""
        with self._sync_lock:
            with self._fd_lock:
                if self._fd < 0:
                    return  # closed
                at = (self.generation, self.size)  # appends so far: the fsync covers them
                if not self._retired and at == self._synced:
                    return
                fds, self._retired = [*self._retired, os.dup(self._fd)], []
            try:
                for fd in fds:  # bounded by the rotations since the last sync
                    os.fsync(fd)
                if len(fds) > 1:  # rotated since: the new file's entry must be durable too
                    fsync_dir(self.directory)
            except OSError as exc:  # a retried fsync may succeed with the pages already lost
                self._unusable = f"fsync failed: {exc}"
                raise
            finally:
                for fd in fds:
                    os.close(fd)
            self._synced = at

    def close(self) -> None:
        """Close the files (idempotent); later appends raise :class:`JournalUnusableError`."""
        with self._fd_lock:
            if self._fd < 0:
                return
            fds, self._retired, self._fd = [self._fd, *self._retired], [], -1
            self._unusable = "closed"
        for fd in fds:
            os.close(fd)
