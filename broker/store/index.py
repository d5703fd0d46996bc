"""The key index: find messages by ``UNIQ_KEY`` or by any of their ``KEYS`` (mqadmin's
queryMsgByKey / queryMsgByUniqueKey), in SQLite instead of RocketMQ's 420 MB hash file.

Theory of operation:

* Dispatch calls :meth:`KeyIndex.add` (main thread, cheap: a list append). Rows wait in
  ``_pending`` until the next checkpoint takes them (:meth:`take`) and writes them in one
  transaction from the worker thread (:meth:`write`, on its own connection, so SQLite's C code
  runs without the GIL); :meth:`written` then forgets them. Lookups see pending, in-flight and
  written rows alike.
* Durability follows the store's checkpoint: rows of every record before the checkpoint's
  ``safe_offset`` are committed before the checkpoint file is written. After a crash, rows at
  or past the recovered log end are deleted (:meth:`truncate_from`) and the re-dispatched
  records add theirs again (``INSERT OR IGNORE`` makes that idempotent).
* Retention deletes rows of deleted segments (:meth:`delete_before`).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

#: (topic, key, commit-log offset, store timestamp)
Row = tuple[str, str, int, int]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS message_key (
    topic TEXT NOT NULL,
    key TEXT NOT NULL,
    offset INTEGER NOT NULL,
    store_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, key, offset)
) WITHOUT ROWID
"""


class KeyIndex:
    """Persistent (topic, key) → commit-log offsets index."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = self._connect(path)
        self._writer.execute(_SCHEMA)
        self._reader = self._connect(path)
        self._pending: list[Row] = []
        self._in_flight: list[Row] = []
        self._write_lock = threading.Lock()

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        # check_same_thread=False: the writer is used from the checkpoint worker thread, one
        # call at a time (``_write_lock``). FULL: a committed transaction is on disk before the
        # store's checkpoint file claims it.
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def add(self, topic: str, key: str, offset: int, store_ms: int) -> None:
        """Index one key of a dispatched record (kept in memory until the next :meth:`take`)."""
        self._pending.append((topic, key, offset, store_ms))

    def take(self) -> list[Row]:
        """Main thread: hand the pending rows to a writer; they stay visible to lookups."""
        rows, self._pending = self._pending, []
        self._in_flight += rows
        return rows

    def write(self, rows: list[Row]) -> None:
        """Worker thread: commit ``rows`` in one transaction."""
        if not rows:
            return
        with self._write_lock:
            self._writer.execute("BEGIN")
            try:
                self._writer.executemany(
                    "INSERT OR IGNORE INTO message_key VALUES (?, ?, ?, ?)", rows
                )
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    def written(self, rows: list[Row]) -> None:
        """Main thread: ``rows`` are committed; stop holding them in memory."""
        done = set(rows)
        self._in_flight = [r for r in self._in_flight if r not in done]

    def lookup(
        self, topic: str, key: str, max_num: int, begin_ms: int = 0, end_ms: int = 2**63 - 1
    ) -> list[int]:
        """Commit-log offsets of ``topic``'s messages with ``key`` stored in
        ``[begin_ms, end_ms]``, newest first, at most ``max_num``."""
        found = {
            r[2]
            for r in (*self._pending, *self._in_flight)
            if r[0] == topic and r[1] == key and begin_ms <= r[3] <= end_ms
        }
        cur = self._reader.execute(
            "SELECT offset FROM message_key WHERE topic = ? AND key = ? "
            "AND store_ms BETWEEN ? AND ? ORDER BY offset DESC LIMIT ?",
            (topic, key, begin_ms, end_ms, max_num),
        )
        found.update(row[0] for row in cur)
        return sorted(found, reverse=True)[:max_num]

    def truncate_from(self, offset: int) -> None:
        """Forget rows of records at or past ``offset`` (recovery cut the log there)."""
        self._pending = [r for r in self._pending if r[2] < offset]
        self._in_flight = [r for r in self._in_flight if r[2] < offset]
        with self._write_lock:
            self._writer.execute("DELETE FROM message_key WHERE offset >= ?", (offset,))

    def delete_before(self, offset: int) -> None:
        """Forget rows of records before ``offset`` (retention deleted their segments)."""
        with self._write_lock:
            self._writer.execute("DELETE FROM message_key WHERE offset < ?", (offset,))

    def close(self) -> None:
        """Close both connections (unwritten rows are re-indexed by recovery)."""
        self._reader.close()
        with self._write_lock:
            self._writer.close()
