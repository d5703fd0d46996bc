"""Small durable-file helpers of the store: atomic replace, the ``lock`` and ``abort`` files.

Everything here is synchronous and POSIX-only (``fcntl``, directory ``fsync``). The layout
follows RocketMQ's store root (``lock``, ``abort``, ``checkpoint`` side by side).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from broker.store.api import StoreError

#: Name of the file a running store holds an exclusive ``flock`` on (RocketMQ's ``lock``).
LOCK_FILE = "lock"
#: Name of the file that exists while a store is open (RocketMQ's ``abort``).
ABORT_FILE = "abort"


def fsync_dir(directory: Path) -> None:
    """Flush a directory's entries, so a file created, renamed or removed in it survives a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    The bytes go to a uniquely named temporary file in the same directory (a rename is atomic
    only within one file system), which is fsynced before ``os.replace`` so the rename can
    never expose a file whose data blocks are not yet on disk; the directory is fsynced last
    so the rename itself is durable when this returns.

    The new file has mode 0600 (``mkstemp``'s): store files are the broker's alone.

    Raises:
        OSError: nothing was replaced (or, if only the final directory fsync failed, the new
            content is in place but possibly not yet durable). No temporary file is left.
    """
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        # Also on KeyboardInterrupt: a stray temp file would accumulate in the data directory.
        with contextlib.suppress(FileNotFoundError):  # gone when only the dir fsync failed
            tmp.unlink()
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)  # may be short on signals or near a full disk
        view = view[written:]


def read_optional(path: Path) -> bytes | None:
    """The file's bytes, or ``None`` when it does not exist (other ``OSError`` propagate)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


class StateFile:
    """A small state file that checkpoints rewrite (schedule progress, transaction decisions,
    a replica's confirmed offset): :meth:`writer` skips bytes equal to what the file holds
    already — each write is an :func:`atomic_write`, two fsyncs and a rename, every second
    on a broker whose state did not move."""

    def __init__(self, path: Path, held: bytes | None = None) -> None:
        """``held``: what the file is known to hold (read at start-up), if anything."""
        self.path = path
        self._held = held

    def writer(self, data: bytes) -> Callable[[], None]:
        """The checkpoint writer of ``data`` (run in a worker thread): replaces the file
        with it, or does nothing when the file holds it already."""
        if data == self._held:
            return _unchanged

        def write() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, data)
            self._held = data

        return write


def _unchanged() -> None:
    """Nothing to write: the file holds these bytes already."""


class DirectoryLock:
    """An exclusive ``flock`` on ``<directory>/lock``, held while a store is open.

    It keeps two brokers (or two stores in one process: ``flock`` locks belong to the open
    file description, so a second ``open`` conflicts even in the same process) from ever
    writing one data directory. The kernel drops the lock when the holder dies, so a crashed
    broker never leaves a stale lock behind; the holder's PID is written into the file only
    so the error message can name it.

    The lock file is never deleted: unlinking it would let a process that had already opened
    the old inode lock that one while a newcomer locks a fresh file, and both would "hold" it.
    The descriptor is close-on-exec (PEP 446), so child processes do not inherit the lock.

    Acquired on construction; :meth:`release` (or leaving the ``with`` block) frees it.

    Raises:
        StoreError: the directory is locked by someone else, or the lock file cannot be
            opened or locked.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LOCK_FILE
        self._fd: int | None = self._acquire()

    def _acquire(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open lock file {self.path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise StoreError(
                f"store directory {self.directory} is already in use by another store "
                f"(lock file {self.path} held by pid {holder})"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock {self.path}: {exc}") from exc
        # The PID is only for error messages; a full disk must not fail the open.
        with contextlib.suppress(OSError):
            _overwrite(fd, f"{os.getpid()}\n".encode())
        return fd

    @property
    def held(self) -> bool:
        """True until :meth:`release`."""
        return self._fd is not None

    def release(self) -> None:
        """Free the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Clear our PID while still holding the lock: after unlocking, the file may
            # already carry the next holder's PID.
            os.ftruncate(fd, 0)
        except OSError:
            pass  # only the informational PID is stale; the lock is still released below
        finally:
            os.close(fd)  # closing the last descriptor of the description drops the flock

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _overwrite(fd: int, data: bytes) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_pid(fd: int) -> str:
    """The PID the holder wrote, as text for a message ("unknown" when unreadable)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


class AbortMarker:
    """RocketMQ's ``abort`` file: present while a store is open.

    :meth:`create` at open, :meth:`remove` at a clean close; if it :attr:`exists` when a store
    opens, the last run did not close cleanly and recovery must scan the tail. Both changes
    are made durable (file and directory fsync) because a marker lost in a crash would make
    the next start skip the recovery it needs.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / ABORT_FILE

    @property
    def exists(self) -> bool:
        """True when the last run did not close cleanly (or the store is open now)."""
        return self.path.exists()

    def create(self) -> None:
        """Mark the store open; the file holds this process's PID for the operator."""
        atomic_write(self.path, f"{os.getpid()}\n".encode())

    def remove(self) -> None:
        """Mark a clean close (idempotent)."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.directory)
