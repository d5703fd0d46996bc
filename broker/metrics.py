"""Latency events as JSON Lines, written off the hot path (docs/design.md §8).

A request handler only appends a tuple to a list (:meth:`MetricsWriter.emit`); serializing and
writing happen later, in a worker thread, so measuring never slows or blocks what it measures.
When the buffer is full events are dropped and counted instead of back-pressuring requests.

:data:`FIELDS` is the one schema definition for the broker side (writer, Prometheus export,
reader checks). trio is imported only inside :meth:`MetricsWriter.run`, so the schema imports
without it. ``analytics/`` may not import ``broker`` (docs/design.md §2), so a reader there
mirrors it.
"""

from __future__ import annotations

import enum
import json
import math
import operator
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.clock import SYSTEM_CLOCK
from broker.logs import get_logger

if TYPE_CHECKING:
    from broker.offload import Offload

_log = get_logger("metrics")

SCHEMA_VERSION = 1
#: The schema, in line order: every line carries every field (``null`` when not applicable),
#: so readers such as Spark get a fixed schema. Types: ``int float str bool``, ``|null``.
FIELDS: tuple[tuple[str, str], ...] = (
    ("v", "int"),
    ("ts_ms", "float"),
    ("kind", "str"),
    ("broker", "str"),
    ("topic", "str"),
    ("group", "str|null"),
    ("queue", "int|null"),
    ("latency_ms", "float"),
    ("wake_mode", "str"),
    ("found", "bool|null"),
    ("retry_topic", "str|null"),
    ("origin_topic", "str|null"),
    ("reconsume_times", "int|null"),
)
FIELD_NAMES: tuple[str, ...] = tuple(name for name, _ in FIELDS)
#: One event line as a format string: ``{"v":{},"ts_ms":{},...}`` and a newline.
_LINE = "{{" + ",".join(f'"{name}":{{}}' for name in FIELD_NAMES) + "}}\n"
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "str": (str,),
    "bool": (bool,),
    "null": (type(None),),
}
_HOUR_MS = 3_600_000
#: Distinct names whose JSON text is cached.
_TEXT_CACHE = 10_000
_LOG_EVERY_S = 60.0
_Row = tuple[Any, ...]  # values in FIELDS order


class EventKind(enum.StrEnum):
    """What span ``latency_ms`` measures (docs/design.md §8 explains each)."""

    STORE = "store"
    PULL_WAIT = "pull_wait"
    POP_WAIT = "pop_wait"
    WAKEUP = "wakeup"
    REVIVE = "revive"
    REDELIVER = "redeliver"
    ACK = "ack"
    E2E = "e2e"
    DLQ = "dlq"


_STR: frozenset[type] = frozenset({str, EventKind, type(None)})
_INT: frozenset[type] = frozenset({int, type(None)})
#: The value types :meth:`MetricsWriter._encode_rows` takes, per field: exact types (a
#: subclass may print itself otherwise), one kind of number per field (1, 1.0 and True are
#: equal as dict keys, not as JSON), and only ``float`` or ``int`` in the two float fields.
_COLUMN_TYPES: tuple[frozenset[type], ...] = tuple(
    frozenset({int})
    if name == "v"
    else frozenset({float, int})
    if spec == "float"
    else frozenset({bool, type(None)})
    if spec.startswith("bool")
    else _INT
    if spec.startswith("int")
    else _STR
    for name, spec in FIELDS
)
_TS = FIELD_NAMES.index("ts_ms")
_LATENCY = FIELD_NAMES.index("latency_ms")
#: The fields a line template is cached by: all but the two floats.
_KEY_FIELDS = tuple(i for i in range(len(FIELDS)) if i not in (_TS, _LATENCY))


def is_valid_event(obj: object) -> bool:
    """Whether ``obj`` (a parsed line) has every field of :data:`FIELDS` with its type."""
    if not isinstance(obj, dict) or obj.get("kind") not in EventKind._value2member_map_:
        return False
    for name, spec in FIELDS:
        value = obj.get(name, ...)
        allowed = tuple(t for part in spec.split("|") for t in _PY_TYPES[part])
        # bool is an int subclass: only a "bool" field may hold one.
        if not isinstance(value, allowed) or (isinstance(value, bool) and "bool" not in spec):
            return False
    return bool(obj["v"] == SCHEMA_VERSION)


@dataclass
class ReadStats:
    """Counts from :func:`read_events`, so a caller can tell a clean file from a damaged one."""

    good: int = 0
    bad: int = 0


def read_events(path: Path, stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
    """Yield the valid events of a file (or of a directory's ``events-*.jsonl``, in name order).

    A crash can leave a torn last line, so bad lines are skipped and counted, never raised.
    """
    stats = stats if stats is not None else ReadStats()
    files = sorted(path.glob("events-*.jsonl")) if path.is_dir() else [path]
    for file in files:
        with file.open("rb") as f:
            for raw in f:
                if not raw.strip():
                    continue
                try:
                    obj: Any = json.loads(raw)
                except ValueError:
                    obj = None
                if is_valid_event(obj):
                    stats.good += 1
                    yield obj
                else:
                    stats.bad += 1


@dataclass(frozen=True, slots=True)
class MetricsStatistics:
    """A snapshot of a :class:`MetricsWriter`'s counters (:meth:`MetricsWriter.statistics`)."""

    #: Events written to the event files.
    written: int
    #: Events lost: the buffer was full (``max_buffer``) or their batch failed to write.
    dropped: int
    #: Batches whose write failed.
    write_errors: int
    #: Events buffered now, waiting for the next flush.
    buffered: int
    #: Exceptions raised by observers (``broker.prometheus``), swallowed.
    observer_errors: int


def _constant(value: str) -> Callable[[], str]:
    return lambda: value


class MetricsWriter:
    """Buffers events on the trio thread; writes them hourly-rotated and size-capped.

    Files are ``<dir>/events-<broker>-<pid>-<YYYYMMDDHH>[-<n>].jsonl`` (UTC hour of the event):
    the pid keeps two processes from interleaving lines in one file, ``-<n>`` continues a file
    that reached ``max_file_bytes``. When all event files in the directory exceed
    ``max_total_bytes``, this broker's oldest files are deleted.
    """

    def __init__(
        self,
        directory: Path | None,
        *,
        broker: str,
        wake_mode: Callable[[], str] | str,
        clock_ms: Callable[[], float] = SYSTEM_CLOCK.now_ms_f,
        max_buffer: int = 100_000,
        max_file_bytes: int = 64 * 1024 * 1024,
        max_total_bytes: int = 1024 * 1024 * 1024,
        offload: Offload | None = None,
    ) -> None:
        self.directory = directory
        #: Where file writes run (a worker thread unless injected; see broker.offload).
        self._offload_with = offload
        self.broker = broker
        self._wake_mode = wake_mode if callable(wake_mode) else _constant(wake_mode)
        self._clock_ms = clock_ms
        self.max_buffer = max_buffer
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self._buffer: list[_Row] = []
        self._text: dict[str, str] = {}  # JSON text of names seen (bounded)
        #: Line templates by the values of a row other than its floats (bounded).
        self._templates: dict[_Row, str] = {}
        self._lock = threading.Lock()  # one writer at a time: run()'s thread or flush_nowait()
        self._pid = os.getpid()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", broker) or "_"
        self._prefix = f"events-{safe}-{self._pid}-"
        self._own = re.compile(rf"events-{re.escape(safe)}-\d+-(\d{{10}})(?:-(\d+))?\.jsonl")
        self._parts: dict[int, tuple[int, int]] = {}  # hour -> (part, bytes in that part)
        self._current: Path | None = None
        self._written = 0
        self._dropped_full = 0  # touched only by the trio thread (emit)
        self._dropped_write = 0  # touched only under _lock
        self._write_errors = 0
        self._last_log = -_LOG_EVERY_S
        self._unlogged = 0
        #: Called with each batch as it is written, in the writer's thread and under its lock
        #: (``broker.prometheus`` counts the rows there, off the request path).
        self.observers: list[Callable[[list[_Row]], None]] = []
        self._observer_errors = 0

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def statistics(self) -> MetricsStatistics:
        """A snapshot of the counters."""
        return MetricsStatistics(
            written=self._written,
            dropped=self._dropped_full + self._dropped_write,
            write_errors=self._write_errors,
            buffered=len(self._buffer),
            observer_errors=self._observer_errors,
        )

    def emit(
        self,
        kind: EventKind,
        *,
        topic: str,
        latency_ms: float,
        group: str | None = None,
        queue: int | None = None,
        found: bool | None = None,
        retry_topic: str | None = None,
        origin_topic: str | None = None,
        reconsume_times: int | None = None,
    ) -> None:
        """Record one event: a tuple append, no JSON, no I/O; drop (counted) when full."""
        if self.directory is None:
            return
        if len(self._buffer) >= self.max_buffer:
            self._dropped_full += 1
            return
        self._buffer.append(
            (SCHEMA_VERSION, float(self._clock_ms()), kind, self.broker, topic, group, queue,
             float(latency_ms), self._wake_mode(), found, retry_topic, origin_topic,
             reconsume_times)
        )  # fmt: skip

    def emit_each(
        self, kind: EventKind, events: Sequence[tuple[str, str | None, int | None, float]]
    ) -> None:
        """:meth:`emit` of each ``(topic, group, queue, latency_ms)`` of ``events``, in order
        (a clock read each), in one call: the same rows, the same drops when full. The wake
        mode is read once (the caller does not change it between the events)."""
        if self.directory is None or not events:
            return
        room = self.max_buffer - len(self._buffer)
        if room < len(events):
            self._dropped_full += len(events) - max(room, 0)
            events = events[: max(room, 0)]
        # The wake mode once: nothing runs between these events that could change it (the
        # clock is read per event, as emit does).
        clock, wake_mode, broker = self._clock_ms, self._wake_mode(), self.broker
        self._buffer += [
            (SCHEMA_VERSION, float(clock()), kind, broker, topic, group, queue,
             float(latency_ms), wake_mode, None, None, None, None)
            for topic, group, queue, latency_ms in events
        ]  # fmt: skip

    def _take(self) -> list[_Row]:
        batch, self._buffer = self._buffer, []
        return batch

    def flush_nowait(self) -> int:
        """Write everything buffered now, on this thread; return how many events were written."""
        return self._write(self._take())

    async def run(self, interval: float = 0.2, *, stop_timeout: float = 5.0) -> None:
        """Flush every ``interval`` seconds in a worker thread until cancelled.

        On cancellation what is still buffered is written in a shielded scope, given at most
        ``stop_timeout`` seconds so a hung disk cannot hang the broker's shutdown.
        """
        import trio  # here, so that the schema above is importable without trio

        from broker.offload import run_in_thread

        offload = self._offload_with or run_in_thread
        if self.directory is None:
            return
        try:
            while True:
                await trio.sleep(interval)
                if self._buffer:
                    await offload(partial(self._write, self._take()))
        finally:
            batch = self._take()
            with trio.CancelScope(deadline=trio.current_time() + stop_timeout, shield=True):
                if batch:
                    await offload(partial(self._write, batch), abandon_on_cancel=True)

    def _write(self, batch: list[_Row]) -> int:
        if not batch or self.directory is None:
            return 0
        with self._lock:
            before, groups = self._written, self._by_hour(batch)
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                for hour, lines in groups.items():
                    self._write_hour(self.directory, hour, lines)
                self._enforce_total(self.directory)
            except OSError as exc:
                self._write_errors += 1
                count = sum(text.count("\n") for texts in groups.values() for text in texts)
                lost = count - (self._written - before)
                self._dropped_write += lost
                self._log_error(exc, lost)
            self._notify(batch)
            return self._written - before

    def _notify(self, batch: list[_Row]) -> None:
        for observe in tuple(self.observers):
            try:
                observe(batch)
            except Exception as exc:  # an observer's bug must not stop the event files
                self._observer_errors += 1
                n = self._observer_errors
                if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th ... time: no flood every flush
                    _log.warning("metrics observer failed", error=repr(exc), errors=n)

    def _by_hour(self, batch: list[_Row]) -> dict[int, list[str]]:
        """Serialize, grouped by the UTC hour of each event; an unserializable event is dropped.

        Each hour's lines come as one string when :meth:`_encode_rows` could take the whole
        batch (a list of one joined text: ``_write_hour`` splits it only at a size cap)."""
        fast = self._encode_batch(batch)
        if fast is not None:
            return fast
        groups: dict[int, list[str]] = {}
        for row in batch:
            try:
                line = self._encode(row)
            except (TypeError, ValueError):
                self._dropped_write += 1
                continue
            groups.setdefault(int(row[1] // _HOUR_MS), []).append(line)
        return groups

    def _encode_batch(self, batch: list[_Row]) -> dict[int, list[str]] | None:
        """:meth:`_by_hour` of a batch every value of which :meth:`_encode_rows` takes, each
        hour's lines as one text; None (nothing done) for any other batch."""
        try:
            columns = self._columns(batch)
            if columns is None:
                return None
            first, last = int(min(columns[_TS]) // _HOUR_MS), int(max(columns[_TS]) // _HOUR_MS)
            if first == last:
                return {first: [self._encode_rows(batch, columns)]}
            hours: dict[int, list[_Row]] = {}
            for row in batch:  # the hour changed within the batch: rare
                hours.setdefault(int(row[_TS] // _HOUR_MS), []).append(row)
            return {
                hour: [self._encode_rows(rows, list(zip(*rows, strict=True)))]
                for hour, rows in hours.items()
            }
        except (TypeError, ValueError, OverflowError):
            return None

    @staticmethod
    def _columns(batch: list[_Row]) -> list[tuple[Any, ...]] | None:
        """The batch's fields as columns, if :meth:`_encode_rows` takes every value: the
        types :data:`_COLUMN_TYPES` allows, finite numbers in the float fields."""
        if not batch or set(map(len, batch)) != {len(FIELDS)}:
            return None
        columns = list(zip(*batch, strict=True))
        for column, allowed in zip(columns, _COLUMN_TYPES, strict=True):
            if not set(map(type, column)) <= allowed:
                return None
        if all(map(math.isfinite, columns[_TS])) and all(map(math.isfinite, columns[_LATENCY])):
            return columns
        return None

    def _encode_rows(self, rows: list[_Row], columns: list[tuple[Any, ...]]) -> str:
        """The lines :meth:`_encode` writes for ``rows`` (``columns``: as :meth:`_columns`
        accepted them), joined, in C-level passes over the batch: per distinct set of
        values other than the two float fields a ``%`` template of the line (cached), filled
        with their ``repr`` (a float's JSON text, as :meth:`_encode` writes it; an int's
        too).

        Raises:
            ValueError: an int too long to print (as :meth:`_encode`).
        """
        templates = self._templates
        keys = list(zip(*[columns[i] for i in _KEY_FIELDS], strict=True))
        found = list(map(templates.get, keys))
        if None in found:
            for i, template in enumerate(found):
                if template is None:
                    template = templates.get(keys[i]) or self._template(rows[i])
                    if len(templates) >= _TEXT_CACHE:
                        templates.clear()
                    found[i] = templates[keys[i]] = template
        pairs = zip(columns[_TS], columns[_LATENCY], strict=True)
        return "".join(map(operator.mod, found, pairs))

    def _template(self, row: _Row) -> str:
        """The ``%`` template of ``row``'s line, ``%r`` in place of its two float fields."""
        texts = [self._value_text(value).replace("%", "%%") for value in row]
        texts[_TS] = texts[_LATENCY] = "%r"
        return _LINE.format(*texts)

    def _value_text(self, value: Any) -> str:
        """One value's JSON text, as :meth:`_encode` writes it."""
        return self._encode_values((value,))[0]

    def _encode(self, row: _Row) -> str:
        """One JSON line, field by field: names repeat, so their JSON text is cached, and a
        format string is ~4x cheaper than ``json.dumps`` of a dict (profiled: the writer was
        a fifth of the broker's CPU under a pop + batch-ack load)."""
        return _LINE.format(*self._encode_values(row))

    def _encode_values(self, row: _Row) -> list[str]:
        """The JSON text of each value of ``row`` (see :meth:`_encode`)."""
        text = self._text
        values = []
        for value in row:
            if value is None:
                values.append("null")
            elif value is True or value is False:
                values.append("true" if value else "false")
            elif isinstance(value, str):
                found = text.get(value)
                if found is None:
                    found = json.dumps(value)
                    if len(text) < _TEXT_CACHE:
                        text[value] = found
                values.append(found)
            elif isinstance(value, float):
                if not math.isfinite(value):
                    raise ValueError("not a finite number")
                values.append(repr(value))
            elif isinstance(value, int):
                values.append(str(value))
            else:
                raise TypeError(f"cannot encode {type(value).__name__}")
        return values

    def _path(self, directory: Path, hour: int, part: int) -> Path:
        stamp = time.strftime("%Y%m%d%H", time.gmtime(hour * 3600))
        return directory / f"{self._prefix}{stamp}{f'-{part}' if part else ''}.jsonl"

    def _resume(self, directory: Path, hour: int) -> tuple[int, int]:
        """Continue after existing parts: a restarted container broker often gets the same pid."""
        part = 0
        while self._path(directory, hour, part + 1).exists():
            part += 1
        path = self._path(directory, hour, part)
        return part, path.stat().st_size if path.exists() else 0

    def _write_hour(self, directory: Path, hour: int, texts: list[str]) -> None:
        """Append ``texts`` (each one or more whole lines) to the hour's file, a line that
        would take the file past ``max_file_bytes`` starting the next part (a text that fits
        whole goes in whole)."""
        part, size = self._parts.get(hour) or self._resume(directory, hour)
        chunk: list[str] = []
        count = 0  # lines in chunk
        for text in texts:  # ASCII only (ensure_ascii), so len() counts bytes
            if size + len(text) <= self.max_file_bytes:
                chunk.append(text)
                count += text.count("\n")
                size += len(text)
                continue
            for line in text.split("\n")[:-1]:
                line += "\n"
                if size and size + len(line) > self.max_file_bytes:
                    self._append(self._path(directory, hour, part), chunk, count)
                    part, size, chunk, count = part + 1, 0, [], 0
                chunk.append(line)
                count += 1
                size += len(line)
        self._append(self._path(directory, hour, part), chunk, count)
        self._parts = {h: p for h, p in self._parts.items() if h >= hour - 1}
        self._parts[hour] = (part, size)

    def _append(self, path: Path, chunk: list[str], count: int) -> None:
        if chunk:
            with path.open("ab") as f:
                f.write("".join(chunk).encode("ascii"))
            self._written += count
            self._current = path

    def _enforce_total(self, directory: Path) -> None:
        """Delete this broker's oldest files (never the one in use) while the total is over."""
        total, own = 0, []
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name.startswith("events-") and entry.name.endswith(".jsonl"):
                    st = entry.stat()
                    total += st.st_size
                    match = self._own.fullmatch(entry.name)
                    if match and Path(entry.path) != self._current:
                        key = (match[1], st.st_mtime_ns, int(match[2] or 0))
                        own.append((key, st.st_size, entry.path))
        for _key, size, path in sorted(own):
            if total <= self.max_total_bytes:
                break
            Path(path).unlink(missing_ok=True)
            total -= size

    def _log_error(self, exc: OSError, lost: int) -> None:
        """Log at most once a minute: a full disk would otherwise flood the log every flush."""
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            _log.warning(
                "metrics write failed", error=str(exc), dropped=lost, errors=self._unlogged
            )
            self._last_log, self._unlogged = now, 0
