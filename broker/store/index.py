"""The key index: find messages by ``UNIQ_KEY`` or by any of their ``KEYS`` (mqadmin's
queryMsgByKey / queryMsgByUniqueKey), in SQLite instead of RocketMQ's 420 MB hash file.

Theory of operation:

* A row is ``(key_hash, offset)``: a 63-bit hash of ``topic#key`` (RocketMQ's index key) and
  the record's commit-log offset. Hashes can collide, so lookups return candidate offsets
  and the store checks each record really carries the key. Integer rows keep the insert cost
  low: inserts run in the checkpoint's worker thread, but binding parameters holds the GIL.
* Rows are inserted in commit-log order (dispatch order), so SQLite's rowid grows with the
  offset. Cutting the index back after a crash (:meth:`truncate_from`) and retention
  (:meth:`delete_before`) find the boundary rowid by binary search and delete a rowid range:
  their cost does not grow with the size of the index.
* Dispatch calls :meth:`add` (main thread: a list append). :meth:`take` hands the pending
  batch to the checkpoint, which :meth:`write` s it in one transaction from its worker thread;
  :meth:`written` drops it. Lookups see pending, in-flight and written rows alike.
* Durability follows the store's checkpoint: rows of every record before the checkpoint's
  ``safe_offset`` are committed before the checkpoint file is written. Recovery calls
  ``truncate_from(safe_offset)`` before re-dispatching the records after it, which adds their
  rows again, so no row is ever duplicated or left pointing past the log's end.
"""

from __future__ import annotations

import sqlite3
import threading
import zlib
from pathlib import Path

#: (key hash, commit-log offset)
Row = tuple[int, int]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS message_key (key_hash INTEGER NOT NULL, offset INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS message_key_hash ON message_key (key_hash)",
)


def key_hash(topic: str, key: str) -> int:
    """63-bit hash of RocketMQ's index key ``topic#key`` (stable across processes)."""
    data = f"{topic}#{key}".encode()
    return (zlib.crc32(data) << 31) ^ zlib.adler32(data)


class KeyIndex:
    """Persistent ``topic#key`` → commit-log offsets index (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = self._connect(path)
        for statement in _SCHEMA:
            self._writer.execute(statement)
        self._reader = self._connect(path)
        self._pending: list[Row] = []
        self._in_flight: list[list[Row]] = []
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

    def add(self, topic: str, key: str, offset: int) -> None:
        """Index one key of a dispatched record (in memory until the next :meth:`take`)."""
        self._pending.append((key_hash(topic, key), offset))

    def take(self) -> list[Row]:
        """Main thread: hand the pending rows to a writer; they stay visible to lookups."""
        rows, self._pending = self._pending, []
        self._in_flight.append(rows)
        return rows

    def write(self, rows: list[Row]) -> None:
        """Worker thread: commit ``rows`` in one transaction."""
        if not rows:
            return
        with self._write_lock:
            self._writer.execute("BEGIN")
            try:
                self._writer.executemany("INSERT INTO message_key VALUES (?, ?)", rows)
            except BaseException:
                self._writer.execute("ROLLBACK")
                raise
            self._writer.execute("COMMIT")

    def written(self, rows: list[Row]) -> None:
        """Main thread: ``rows`` (a batch from :meth:`take`) are committed."""
        self._in_flight = [batch for batch in self._in_flight if batch is not rows]

    def candidates(self, topic: str, key: str, max_num: int) -> list[int]:
        """Commit-log offsets that may hold ``topic``'s messages with ``key``, newest first
        (hash collisions possible: the caller checks each record)."""
        wanted = key_hash(topic, key)
        found = {off for h, off in self._pending if h == wanted}
        for batch in self._in_flight:
            found.update(off for h, off in batch if h == wanted)
        cur = self._reader.execute(
            "SELECT offset FROM message_key WHERE key_hash = ? ORDER BY offset DESC LIMIT ?",
            (wanted, max_num),
        )
        found.update(row[0] for row in cur)
        return sorted(found, reverse=True)

    def truncate_from(self, offset: int) -> None:
        """Forget rows of records at or past ``offset`` (recovery cuts the log there)."""
        self._pending = [r for r in self._pending if r[1] < offset]
        for batch in self._in_flight:  # in place: written() finds batches by identity
            batch[:] = [r for r in batch if r[1] < offset]
        with self._write_lock:
            rowid = self._first_rowid_at(offset)
            if rowid is not None:
                self._writer.execute("DELETE FROM message_key WHERE rowid >= ?", (rowid,))

    def delete_before(self, offset: int) -> None:
        """Forget rows of records before ``offset`` (retention deleted their segments)."""
        self._pending = [r for r in self._pending if r[1] >= offset]
        for batch in self._in_flight:  # in place: written() finds batches by identity
            batch[:] = [r for r in batch if r[1] >= offset]
        with self._write_lock:
            rowid = self._first_rowid_at(offset)
            if rowid is None:
                self._writer.execute("DELETE FROM message_key")
            else:
                self._writer.execute("DELETE FROM message_key WHERE rowid < ?", (rowid,))

    def _first_rowid_at(self, offset: int) -> int | None:
        """Smallest rowid whose offset >= ``offset`` (offsets grow with rowids): a binary
        search of O(log n) point queries; None when every row is below ``offset``."""
        db = self._writer
        bounds = db.execute("SELECT min(rowid), max(rowid) FROM message_key").fetchone()
        if bounds[0] is None:
            return None
        lo, hi = bounds[0], bounds[1] + 1
        while lo < hi:
            mid = (lo + hi) // 2
            row = db.execute(
                "SELECT rowid, offset FROM message_key WHERE rowid >= ? ORDER BY rowid LIMIT 1",
                (mid,),
            ).fetchone()
            if row is None or row[1] >= offset:
                hi = mid
            else:
                lo = row[0] + 1
        return lo if lo <= bounds[1] else None

    def close(self) -> None:
        """Close both connections (rows not yet written are re-indexed by recovery)."""
        self._reader.close()
        with self._write_lock:
            self._writer.close()
