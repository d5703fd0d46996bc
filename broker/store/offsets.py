"""Consumer offsets per (group, topic, queue id), persisted as RocketMQ's ``consumerOffset.json``.

The file has the shape Java's ``ConsumerOffsetManager`` writes,
``{"offsetTable":{"<topic>@<group>":{"<queueId>":offset}}}``, so a RocketMQ data directory's
offsets can be loaded and ours can be read by RocketMQ tools. Java's fastjson writes the inner
keys unquoted (``{0:12}``); we read that and write standard quoted keys, which Java reads too.

Splitting ``topic@group``: neither legal topic nor group names contain ``@`` (legal characters
are ``a-zA-Z0-9%-_|``, plus ``+`` in V2 pop retry topics), so for every legal pair splitting on
the first or the last ``@`` is the same. We split on the last one and refuse a group containing
``@`` at :meth:`ConsumerOffsets.commit`, so even a topic with an ``@`` still round-trips.

Persisting: :meth:`ConsumerOffsets.persist` writes synchronously. A trio caller that wants the
fsyncs off its event loop does it in two steps, keeping every table access on its own thread::

    if offsets.dirty:
        seen, data = offsets.changes, offsets.snapshot()              # event-loop thread
        await trio.to_thread.run_sync(offsets.write_snapshot, data)   # worker thread
        offsets.mark_persisted(seen)                                   # event-loop thread
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from broker.store.api import StoreCorruptError
from broker.store.files import atomic_write, read_optional
from protocol.bodies import loads_lenient
from protocol.errors import FieldError

#: The separator of the outer keys, as in Java's ``ConsumerOffsetManager.TOPIC_GROUP_SEPARATOR``.
TOPIC_GROUP_SEPARATOR: Final = "@"

_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)

# (topic, group) -> {queue id -> offset}
_Table = dict[tuple[str, str], dict[int, int]]


class ConsumerOffsets:
    """The committed offset of every (group, topic, queue id), loaded from and saved to ``path``.

    Not thread-safe: use it from one thread, except :meth:`write_snapshot`, which touches only
    the bytes it is given.

    Raises:
        StoreCorruptError: (at construction) the file exists but is unreadable or malformed;
            the message names the file. A missing file is an empty table.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._table: _Table = _load(path)
        # Change counters instead of a flag, so a write that raced with a commit cannot
        # mark that commit persisted (see mark_persisted).
        self._changes = 0
        self._persisted = 0

    # ------------------------------------------------------------------ updates

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record ``offset`` as the group's next offset to consume in the queue.

        An offset may move backwards (a consumer resetting its position). A negative offset is
        ignored: some clients (ali-ons) commit -1 for "no position yet", which must not erase a
        real one. Re-committing the same offset does not make the table dirty, so clients that
        commit every few seconds do not cause a rewrite each time.

        Raises:
            ValueError: ``group`` contains ``@`` (it could not be split back out of the file).
        """
        if TOPIC_GROUP_SEPARATOR in group:
            raise ValueError(f"group name {group!r} contains {TOPIC_GROUP_SEPARATOR!r}")
        if offset < 0:
            return
        queues = self._table.setdefault((topic, group), {})
        if queues.get(queue_id) != offset:
            queues[queue_id] = offset
            self._changes += 1

    def advance_from(self, snapshot: bytes) -> int:
        """Take every offset of another table's :meth:`snapshot` (the master's, on a
        replica) that is ahead of this one's; never move one back, so a snapshot that
        arrives late or from a lagging source cannot replay what consumers passed. Returns
        how many offsets moved.

        Raises:
            ValueError: ``snapshot`` is not a valid offsets file (nothing changed).
        """
        try:
            table = _parse(loads_lenient(snapshot))
        except FieldError as exc:
            raise ValueError(str(exc)) from None
        moved = 0
        for key, queues in table.items():
            mine = self._table.setdefault(key, {})
            for queue_id, offset in queues.items():
                if offset > mine.get(queue_id, -1):
                    mine[queue_id] = offset
                    moved += 1
        if moved:
            self._changes += 1
        return moved

    def remove_group(self, group: str) -> None:
        """Forget every offset of ``group`` (the group was deleted)."""
        self._remove([key for key in self._table if key[1] == group])

    def remove_topic(self, topic: str) -> None:
        """Forget every group's offsets on ``topic`` (the topic was deleted)."""
        self._remove([key for key in self._table if key[0] == topic])

    def _remove(self, keys: list[tuple[str, str]]) -> None:
        for key in keys:
            del self._table[key]
        if keys:
            self._changes += 1

    def clamp(self, topic: str, queue_id: int, min_offset: int, max_offset: int) -> None:
        """Pull every group's offset on the queue into ``[min_offset, max_offset]``.

        Called after recovery. Offsets and the log are flushed independently, so after a crash
        a group may have committed offset 100 while recovery kept only 90 messages; the next
        messages then get offsets 90…99 again and a consumer resuming at 100 would silently
        skip them. Pulling it back to the queue's max offset makes it read them. An offset
        below ``min_offset`` points at messages retention has deleted; raising it to the min
        lets a query answer a real position instead of one every pull would have to correct.

        Raises:
            ValueError: ``min_offset > max_offset``.
        """
        if min_offset > max_offset:
            raise ValueError(f"min offset {min_offset} > max offset {max_offset}")
        for (t, _group), queues in self._table.items():
            offset = queues.get(queue_id) if t == topic else None
            if offset is None:
                continue
            clamped = min(max(offset, min_offset), max_offset)
            if clamped != offset:
                queues[queue_id] = clamped
                self._changes += 1

    # ------------------------------------------------------------------ queries

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """The group's committed offset in the queue, or ``None`` if it never committed one."""
        queues = self._table.get((topic, group))
        return None if queues is None else queues.get(queue_id)

    def table(self, group: str, topic: str) -> dict[int, int]:
        """A copy of the group's offsets on ``topic``: queue id → offset (empty if none)."""
        return dict(self._table.get((topic, group), {}))

    def groups_of(self, topic: str) -> set[str]:
        """Groups with committed offsets on ``topic``."""
        return {g for (t, g), queues in self._table.items() if t == topic and queues}

    def topics_of(self, group: str) -> set[str]:
        """Topics ``group`` has committed offsets on."""
        return {t for (t, g), queues in self._table.items() if g == group and queues}

    # ------------------------------------------------------------------ persistence

    @property
    def dirty(self) -> bool:
        """True when the table changed since it was last persisted (or loaded)."""
        return self._changes != self._persisted

    @property
    def changes(self) -> int:
        """A counter that grows with every change; pass it to :meth:`mark_persisted`."""
        return self._changes

    def snapshot(self, caps: Mapping[tuple[str, str, int], int] | None = None) -> bytes:
        """The file content for the current table (standard JSON, deterministic order);
        with ``caps`` ((group, topic, queue id) → offset), each offset at most its cap (a
        replica's copy must not pass what is still in flight)."""
        limit = caps or {}
        offset_table = {
            f"{topic}{TOPIC_GROUP_SEPARATOR}{group}": {
                str(qid): min(queues[qid], limit.get((group, topic, qid), queues[qid]))
                for qid in sorted(queues)
            }
            for (topic, group), queues in sorted(self._table.items())
            if queues  # a pair whose queues were all cleared is not worth a line
        }
        return _ENCODER.encode({"offsetTable": offset_table}).encode("ascii")

    def write_snapshot(self, data: bytes) -> None:
        """Write bytes from :meth:`snapshot` to the file atomically; safe in a worker thread.

        Raises:
            OSError: the write failed; the previous file is intact.
        """
        atomic_write(self.path, data)

    def mark_persisted(self, changes: int) -> None:
        """Record that the snapshot taken when :attr:`changes` was ``changes`` is on disk.

        Changes made after that snapshot keep the table dirty.
        """
        self._persisted = max(self._persisted, changes)

    def persist(self) -> bool:
        """Write the file if the table is dirty; return whether it wrote.

        Raises:
            OSError: the write failed; the table stays dirty and the previous file is intact.
        """
        if not self.dirty:
            return False
        seen = self._changes
        self.write_snapshot(self.snapshot())
        self.mark_persisted(seen)
        return True


# ---------------------------------------------------------------------- loading


def _load(path: Path) -> _Table:
    try:
        data = read_optional(path)
    except OSError as exc:
        raise StoreCorruptError(f"cannot read consumer offsets {path}: {exc}") from exc
    if data is None:
        return {}
    try:
        return _parse(loads_lenient(data))
    except (FieldError, ValueError) as exc:
        raise StoreCorruptError(f"consumer offsets file {path} is corrupt: {exc}") from None


def _parse(obj: object) -> _Table:
    """The table from parsed JSON; other top-level keys (``dataVersion`` …) are ignored."""
    if not isinstance(obj, dict):
        raise ValueError("the top level is not an object")
    offset_table = obj.get("offsetTable", {})
    if not isinstance(offset_table, dict):
        raise ValueError("'offsetTable' is not an object")
    table: _Table = {}
    for key, queues in offset_table.items():
        table[_split_key(key)] = _parse_queues(key, queues)
    return table


def _split_key(key: str) -> tuple[str, str]:
    topic, sep, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
    if not (sep and topic and group):
        raise ValueError(f"key {key!r} is not '<topic>@<group>'")
    return topic, group


def _parse_queues(key: str, queues: object) -> dict[int, int]:
    if not isinstance(queues, dict):
        raise ValueError(f"offsets of {key!r} are not an object")
    parsed: dict[int, int] = {}
    for qid_text, offset in queues.items():
        qid = _parse_int(qid_text)
        if qid is None or type(offset) is not int:
            raise ValueError(f"bad entry {qid_text!r}: {offset!r} under {key!r}")
        if offset >= 0:  # a -1 an older broker stored means "no position", as in commit()
            parsed[qid] = offset
    return parsed


def _parse_int(text: str) -> int | None:
    # int() alone would also take " 1", "1_0" and "+1"; a queue id is plain decimal.
    body = text.removeprefix("-")
    return int(text) if body.isascii() and body.isdigit() else None
