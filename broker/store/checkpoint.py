"""The store's recovery checkpoint: how far the log and every index were durable.

RocketMQ keeps three timestamps in a 4 KiB mmap page and recovers "from a bit before the
oldest of them"; this checkpoint records commit-log offsets instead, so recovery starts exactly
at ``safe_offset`` and the time it takes grows only with the unflushed tail.

File format (version 1), one ASCII header line then a compact JSON payload::

    trimq-checkpoint 1 <payload length> <crc32 of payload, 8 lowercase hex digits>\\n
    {"safe_offset":N,"clean":B,"min_offset":N,"written_at_ms":N,"queues":[[topic,qid,size],...]}

Every single-byte change and every truncation or extension is detected: a change inside the
payload breaks the CRC (CRC-32 catches every burst of up to 32 bits); a change in the header
breaks its strict pattern (the payload is pure ASCII JSON without a raw newline, so a damaged
newline cannot be found later) or changes one of the numbers, which then no longer matches.
Queue keys are a list of ``[topic, queue id, size]`` triples rather than joined strings, so
any character in a topic name is unambiguous.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeGuard

from broker.store.api import StoreCorruptError
from broker.store.files import atomic_write, read_optional

#: The encoding version this module writes and reads.
CHECKPOINT_VERSION: Final = 1

_MAGIC: Final = "trimq-checkpoint"
# Strict: no leading zeros, lowercase hex only, so each header has exactly one spelling and a
# changed byte can never be read as the same value.
_HEADER: Final = re.compile(
    rb"trimq-checkpoint (0|[1-9][0-9]{0,8}) (0|[1-9][0-9]{0,11}) ([0-9a-f]{8})"
)
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)

QueueKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A recovery checkpoint.

    Attributes:
        safe_offset: commit-log offset up to which the log, every consume queue and the key
            index were durable when this was written.
        clean: written by a clean close: nothing after ``safe_offset`` exists.
        queue_sizes: (topic, queue id) → max queue offset durable at ``safe_offset``.
        min_offset: first commit-log offset still held (after retention).
        written_at_ms: wall-clock time of writing, for operators.
        version: encoding version (only :data:`CHECKPOINT_VERSION` is written or read).
    """

    safe_offset: int
    clean: bool
    queue_sizes: Mapping[QueueKey, int] = field(hash=False)
    min_offset: int = 0
    written_at_ms: int = 0
    version: int = CHECKPOINT_VERSION

    def encode(self) -> bytes:
        """The file's bytes (header + payload); see the module docstring.

        Raises:
            ValueError: a negative offset/size, a non-``(str, int)`` key or an unknown version:
                :meth:`decode` would refuse it, so it is refused here.
        """
        self._check()
        queues = sorted([topic, qid, size] for (topic, qid), size in self.queue_sizes.items())
        payload = _ENCODER.encode(
            {
                "safe_offset": self.safe_offset,
                "clean": self.clean,
                "min_offset": self.min_offset,
                "written_at_ms": self.written_at_ms,
                "queues": queues,
            }
        ).encode("ascii")
        crc = zlib.crc32(payload)
        header = f"{_MAGIC} {self.version} {len(payload)} {crc:08x}\n".encode("ascii")
        return header + payload

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        """Parse :meth:`encode`'s output.

        Raises:
            ValueError: the bytes are damaged or of an unknown version (the message says why).
        """
        header, newline, payload = data.partition(b"\n")
        match = _HEADER.fullmatch(header)
        if not newline or match is None:
            raise ValueError("bad header line")
        version, length, crc = int(match[1]), int(match[2]), int(match[3], 16)
        if version != CHECKPOINT_VERSION:
            raise ValueError(f"unknown version {version} (this build reads {CHECKPOINT_VERSION})")
        if len(payload) != length:
            raise ValueError(f"payload is {len(payload)} bytes, header says {length}")
        if zlib.crc32(payload) != crc:
            raise ValueError("payload CRC mismatch")
        try:
            obj = json.loads(payload)
        except RecursionError:
            raise ValueError("payload is nested too deeply") from None
        return _from_payload(obj)

    def _check(self) -> None:
        # Refuse to write what load() would reject, so a bug shows up at save, not at restart.
        if self.version != CHECKPOINT_VERSION:
            raise ValueError(f"cannot encode checkpoint version {self.version}")
        counts = (self.safe_offset, self.min_offset, self.written_at_ms, *self.queue_sizes.values())
        if not all(_is_count(n) for n in counts):
            raise ValueError("offsets, sizes and the timestamp must be non-negative integers")
        if not all(isinstance(t, str) and type(qid) is int for t, qid in self.queue_sizes):
            raise ValueError("queue keys must be (topic: str, queue id: int)")

    def save(self, path: Path) -> None:
        """Write atomically and durably (see :func:`~broker.store.files.atomic_write`).

        Raises:
            ValueError: as :meth:`encode` (nothing is written).
            OSError: the write failed; the previous checkpoint is intact.
        """
        atomic_write(path, self.encode())

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        """The checkpoint at ``path``, or ``None`` when there is none.

        Raises:
            StoreCorruptError: the file is unreadable, damaged or of an unknown version; the
                caller decides what to do (the store falls back to a full scan).
        """
        try:
            data = read_optional(path)
        except OSError as exc:
            raise StoreCorruptError(f"cannot read checkpoint {path}: {exc}") from exc
        if data is None:
            return None
        try:
            return cls.decode(data)
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError included
            raise StoreCorruptError(f"checkpoint {path} is corrupt: {exc}") from None


def _from_payload(obj: object) -> Checkpoint:
    # Only reached with a matching CRC, i.e. bytes this module wrote; the checks guard
    # against a bug or a hand-edited file, not against random damage.
    if not isinstance(obj, dict):
        raise ValueError("payload is not an object")
    clean = obj.get("clean")
    if not isinstance(clean, bool):
        raise ValueError("'clean' is not a boolean")
    return Checkpoint(
        safe_offset=_offset(obj, "safe_offset"),
        clean=clean,
        queue_sizes=_queues(obj.get("queues")),
        min_offset=_offset(obj, "min_offset"),
        written_at_ms=_offset(obj, "written_at_ms"),
    )


def _offset(obj: dict[str, object], name: str) -> int:
    value = obj.get(name)
    if not _is_count(value):
        raise ValueError(f"{name!r} is not a non-negative integer")
    return value


def _queues(items: object) -> dict[QueueKey, int]:
    if not isinstance(items, list):
        raise ValueError("'queues' is not a list")
    sizes: dict[QueueKey, int] = {}
    for item in items:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and type(item[1]) is int
            and _is_count(item[2])
        ):
            raise ValueError(f"bad queue entry {item!r}")
        key = (item[0], item[1])
        if key in sizes:
            raise ValueError(f"duplicate queue entry {item!r}")
        sizes[key] = item[2]
    return sizes


def _is_count(value: object) -> TypeGuard[int]:
    return type(value) is int and value >= 0  # type() rejects bool, which is an int subclass
