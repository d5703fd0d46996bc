"""The HA link between a master and its replicas: frames, sans-IO (bytes in, events out).

docs/design.md §13. The replica opens a TCP connection to the master's HA port and speaks
first; the master answers with the commit log as raw bytes. All integers are big-endian.

Replica → master:

* ``HELLO`` once, first: ``kind u8 | version u16 | broker_id u32 | epoch u64 |
  name_len u16 | broker_name`` — who is asking (its group and id), and the newest master
  epoch it has accepted.
* ``REPORT`` any number of times: ``kind u8 | offset u64`` — "my commit log ends here"
  (RocketMQ's 8-byte ``maxPhyOffset`` report). The first one says where to stream from;
  every later one acknowledges every byte before ``offset`` (what sync replication counts).
  The replica sends its first report only after the master's ``EPOCHS`` (and after it cut
  its log back to where it agrees with the master's).

Master → replica:

* ``EPOCHS`` once, first, in answer to ``HELLO``: ``kind u8 | epoch u64 | end u64 |
  count u32 | crc32 u32 | count × (epoch u64 | start u64)`` — the master's epoch, where its
  log ends, and its epoch history (where each master epoch began in the log; RocketMQ 5's
  epoch exchange, Kafka's OffsetsForLeaderEpoch). ``crc32`` covers the entries.

* ``BATCH``: ``kind u8 | epoch u64 | offset u64 | master_end u64 | length u32 | crc32 u32 |
  bytes`` — ``length`` bytes of the master's log starting at ``offset`` (not aligned to
  records, as RocketMQ's), under the master's ``epoch``; ``master_end`` is how far the
  master's log reaches (the replica's lag); ``crc32`` covers the bytes, so a damaged batch
  is refused before it is appended. ``length`` 0 is a heartbeat.
* ``CONFIRM``: ``kind u8 | epoch u64 | offset u64`` — the master's confirmed offset: every
  byte before it is held by as many copies as a sync send needs (``--min-insync-replicas``;
  with async replication, every byte the master has streamed). A replica serves reads only
  of records that end at or before it, so a consumer never reads what a failover may take
  back (RocketMQ 5's ``confirmOffset``, Kafka's high watermark). It never goes back.
* ``REFUSED``: ``kind u8 | reason_len u16 | reason`` — the master will not serve this
  replica (another group, a log ahead of the master's); it closes the connection after.
* ``META``: ``kind u8 | epoch u64 | table u8 | length u32 | crc32 u32 | bytes`` — a whole
  snapshot of one metadata table as the master persists it (RocketMQ's SlaveSynchronize,
  over the HA link instead of admin requests): ``META_TOPICS`` (``topics.json``),
  ``META_GROUPS`` (``subscriptionGroup.json``), ``META_OFFSETS`` (``consumerOffset.json``),
  ``META_POP`` (the pop in-flight table, as the pop journal's snapshot).
  A table id the replica does not know is passed on (a newer master); the caller skips it.

The replica refuses an ``EPOCHS``, a batch or a snapshot from an epoch older than the one it
has accepted (a deposed master still streaming); a newer epoch is accepted and remembered by
the caller.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Final

from protocol.errors import ProtocolError

#: 2: the ``EPOCHS`` answer to ``HELLO`` (epoch histories, truncation to a common point).
VERSION: Final = 2
HELLO: Final = 0x01
REPORT: Final = 0x02
BATCH: Final = 0x11
REFUSED: Final = 0x12
META: Final = 0x13
EPOCHS: Final = 0x14
CONFIRM: Final = 0x15
#: ``META`` tables.
META_TOPICS: Final = 1
META_GROUPS: Final = 2
META_OFFSETS: Final = 3
#: The pop in-flight table (leases, cursors, orderly locks), msgpack as the pop journal's
#: snapshot.
META_POP: Final = 4
#: The largest batch a peer accepts: a bound on what one frame can make the reader buffer.
MAX_BATCH: Final = 8 * 1024 * 1024
MAX_NAME: Final = 1024
#: The largest metadata snapshot a replica accepts (an offset table of ~10⁶ queues).
MAX_META: Final = 64 * 1024 * 1024
#: The most epoch-history entries an ``EPOCHS`` frame may carry.
MAX_EPOCHS: Final = 65_536

_HELLO = struct.Struct(">BHIQH")
_REPORT = struct.Struct(">BQ")
_BATCH = struct.Struct(">BQQQII")
_REFUSED = struct.Struct(">BH")
_META = struct.Struct(">BQBII")
_EPOCHS = struct.Struct(">BQQII")
_EPOCH_ENTRY = struct.Struct(">QQ")
_CONFIRM = struct.Struct(">BQQ")


class HaProtocolError(ProtocolError):
    """The peer broke the HA protocol: the connection must close."""

    fatal = True


@dataclass(frozen=True, slots=True)
class Hello:
    """A replica introduces itself."""

    broker_name: str
    broker_id: int
    #: The newest master epoch the replica has accepted.
    epoch: int
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Report:
    """The replica's commit log ends at ``offset``."""

    offset: int


@dataclass(frozen=True, slots=True)
class Batch:
    """Bytes of the master's log from ``offset`` (empty: a heartbeat)."""

    epoch: int
    offset: int
    master_end: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Refused:
    """The master will not serve this replica, and why."""

    reason: str


@dataclass(frozen=True, slots=True)
class Meta:
    """A snapshot of one of the master's metadata tables (``META_*``)."""

    epoch: int
    table: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Epochs:
    """The master's epoch, log end and epoch history ((epoch, start) pairs, oldest first)."""

    epoch: int
    end: int
    history: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Confirm:
    """The master's confirmed offset (see ``CONFIRM``)."""

    epoch: int
    offset: int


ToMaster = Hello | Report
ToReplica = Batch | Refused | Meta | Epochs | Confirm


def encode_hello(hello: Hello) -> bytes:
    """A ``HELLO`` frame."""
    name = hello.broker_name.encode()
    if len(name) > MAX_NAME:
        raise ValueError(f"broker name of {len(name)} bytes is too long")
    return _HELLO.pack(HELLO, hello.version, hello.broker_id, hello.epoch, len(name)) + name


def encode_report(offset: int) -> bytes:
    """A ``REPORT`` frame."""
    return _REPORT.pack(REPORT, offset)


def encode_batch(epoch: int, offset: int, master_end: int, data: bytes) -> bytes:
    """A ``BATCH`` frame (``data`` empty: a heartbeat)."""
    if len(data) > MAX_BATCH:
        raise ValueError(f"a batch of {len(data)} bytes exceeds {MAX_BATCH}")
    crc = zlib.crc32(data)
    return _BATCH.pack(BATCH, epoch, offset, master_end, len(data), crc) + data


def encode_meta(epoch: int, table: int, data: bytes) -> bytes:
    """A ``META`` frame."""
    if len(data) > MAX_META:
        raise ValueError(f"a metadata snapshot of {len(data)} bytes exceeds {MAX_META}")
    return _META.pack(META, epoch, table, len(data), zlib.crc32(data)) + data


def encode_epochs(epochs: Epochs) -> bytes:
    """An ``EPOCHS`` frame."""
    if len(epochs.history) > MAX_EPOCHS:
        raise ValueError(f"an epoch history of {len(epochs.history)} entries exceeds {MAX_EPOCHS}")
    entries = b"".join(_EPOCH_ENTRY.pack(epoch, start) for epoch, start in epochs.history)
    head = _EPOCHS.pack(EPOCHS, epochs.epoch, epochs.end, len(epochs.history), zlib.crc32(entries))
    return head + entries


def encode_confirm(epoch: int, offset: int) -> bytes:
    """A ``CONFIRM`` frame."""
    return _CONFIRM.pack(CONFIRM, epoch, offset)


def encode_refused(reason: str) -> bytes:
    """A ``REFUSED`` frame."""
    text = reason.encode()[:MAX_NAME]
    return _REFUSED.pack(REFUSED, len(text)) + text


class _Reader:
    """An incremental byte buffer shared by both directions."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.closed = False

    def feed(self, data: bytes) -> None:
        if self.closed:
            raise HaProtocolError("data after the connection was declared broken")
        self._buf += data

    def available(self) -> int:
        return len(self._buf) - self._pos

    def peek_kind(self) -> int | None:
        return self._buf[self._pos] if self.available() else None

    def take(self, size: int) -> bytes:
        out = bytes(self._buf[self._pos : self._pos + size])
        self._pos += size
        if self._pos > 64 * 1024 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]  # compact in big steps: del is a memmove
            self._pos = 0
        return out

    def unpack(self, fmt: struct.Struct) -> tuple[int, ...] | None:
        if self.available() < fmt.size:
            return None
        return fmt.unpack_from(self._buf, self._pos)

    def fail(self, message: str) -> HaProtocolError:
        self.closed = True
        return HaProtocolError(message)


class MasterSide:
    """The master's end of one HA connection: replica bytes in, :data:`ToMaster` out.

    The first frame must be a ``HELLO``, every later one a ``REPORT``; offsets may never go
    backwards (a replica's log only grows while it stays connected).
    """

    def __init__(self) -> None:
        self._reader = _Reader()
        self.hello: Hello | None = None
        self.acked = -1

    def receive(self, data: bytes) -> list[ToMaster]:
        """Feed bytes; return every complete frame.

        Raises:
            HaProtocolError: the bytes are not a valid replica stream.
        """
        reader = self._reader
        reader.feed(data)
        events: list[ToMaster] = []
        while (kind := reader.peek_kind()) is not None:
            event = self._hello() if self.hello is None else self._report(kind)
            if event is None:
                break
            events.append(event)
        return events

    def _hello(self) -> Hello | None:
        reader = self._reader
        if reader.peek_kind() != HELLO:
            raise reader.fail(f"expected HELLO, got frame kind {reader.peek_kind()}")
        head = reader.unpack(_HELLO)
        if head is None:
            return None
        _, version, broker_id, epoch, name_len = head
        if version != VERSION:
            raise reader.fail(f"HA protocol version {version} is not {VERSION}")
        if name_len > MAX_NAME:
            raise reader.fail(f"broker name of {name_len} bytes is too long")
        if reader.available() < _HELLO.size + name_len:
            return None
        reader.take(_HELLO.size)
        try:
            name = reader.take(name_len).decode()
        except UnicodeDecodeError:
            raise reader.fail("broker name is not UTF-8") from None
        self.hello = Hello(name, broker_id, epoch, version)
        return self.hello

    def _report(self, kind: int) -> Report | None:
        reader = self._reader
        if kind != REPORT:
            raise reader.fail(f"expected REPORT, got frame kind {kind}")
        head = reader.unpack(_REPORT)
        if head is None:
            return None
        reader.take(_REPORT.size)
        offset = head[1]
        if offset < self.acked:
            raise reader.fail(f"replica offset went back from {self.acked} to {offset}")
        self.acked = offset
        return Report(offset)


class ReplicaSide:
    """The replica's end of one HA connection: master bytes in, :data:`ToReplica` out.

    Checks each batch's CRC, that batches follow each other without a gap, and that the
    epoch never falls below ``min_epoch`` (the newest the replica has accepted, which it
    raises as newer epochs arrive).
    """

    def __init__(self, min_epoch: int) -> None:
        self._reader = _Reader()
        self.min_epoch = min_epoch
        #: Where the next batch must start (None until the first one).
        self.next_offset: int | None = None

    def receive(self, data: bytes) -> list[ToReplica]:
        """Feed bytes; return every complete frame.

        Raises:
            HaProtocolError: a damaged or out-of-order batch, an older epoch, an unknown frame.
        """
        reader = self._reader
        reader.feed(data)
        events: list[ToReplica] = []
        while (kind := reader.peek_kind()) is not None:
            event = self._frame(kind)
            if event is None:
                break
            events.append(event)
        return events

    def _frame(self, kind: int) -> ToReplica | None:
        if kind == BATCH:
            return self._batch()
        if kind == META:
            return self._meta()
        if kind == EPOCHS:
            return self._epochs()
        if kind == CONFIRM:
            return self._confirm()
        return self._refused(kind)

    def _confirm(self) -> Confirm | None:
        reader = self._reader
        head = reader.unpack(_CONFIRM)
        if head is None:
            return None
        reader.take(_CONFIRM.size)
        _, epoch, offset = head
        if epoch < self.min_epoch:
            raise reader.fail(f"confirmed offset from epoch {epoch}, older than {self.min_epoch}")
        self.min_epoch = epoch
        return Confirm(epoch, offset)

    def _epochs(self) -> Epochs | None:
        reader = self._reader
        head = reader.unpack(_EPOCHS)
        if head is None:
            return None
        _, epoch, end, count, crc = head
        if count > MAX_EPOCHS:
            raise reader.fail(f"an epoch history of {count} entries exceeds {MAX_EPOCHS}")
        size = count * _EPOCH_ENTRY.size
        if reader.available() < _EPOCHS.size + size:
            return None
        reader.take(_EPOCHS.size)
        data = reader.take(size)
        if zlib.crc32(data) != crc:
            raise reader.fail("epoch history: CRC mismatch")
        if epoch < self.min_epoch:
            raise reader.fail(f"epoch history from epoch {epoch}, older than {self.min_epoch}")
        history = tuple((e, s) for e, s in _EPOCH_ENTRY.iter_unpack(data))
        self.min_epoch = epoch
        return Epochs(epoch, end, history)

    def _meta(self) -> Meta | None:
        reader = self._reader
        head = reader.unpack(_META)
        if head is None:
            return None
        _, epoch, table, length, crc = head
        if length > MAX_META:
            raise reader.fail(f"a metadata snapshot of {length} bytes exceeds {MAX_META}")
        if reader.available() < _META.size + length:
            return None
        reader.take(_META.size)
        data = reader.take(length)
        if zlib.crc32(data) != crc:
            raise reader.fail(f"metadata table {table}: CRC mismatch")
        if epoch < self.min_epoch:
            raise reader.fail(f"metadata from epoch {epoch}, older than {self.min_epoch}")
        self.min_epoch = epoch
        return Meta(epoch, table, data)

    def _batch(self) -> Batch | None:
        reader = self._reader
        head = reader.unpack(_BATCH)
        if head is None:
            return None
        _, epoch, offset, master_end, length, crc = head
        if length > MAX_BATCH:
            raise reader.fail(f"a batch of {length} bytes exceeds {MAX_BATCH}")
        if reader.available() < _BATCH.size + length:
            return None
        reader.take(_BATCH.size)
        data = reader.take(length)
        if zlib.crc32(data) != crc:
            raise reader.fail(f"batch at offset {offset}: CRC mismatch")
        if epoch < self.min_epoch:
            raise reader.fail(f"batch from epoch {epoch}, older than {self.min_epoch}")
        if self.next_offset is not None and offset != self.next_offset:
            raise reader.fail(f"batch at offset {offset}, expected {self.next_offset}")
        self.min_epoch = epoch
        self.next_offset = offset + length
        return Batch(epoch, offset, master_end, data)

    def _refused(self, kind: int) -> Refused | None:
        reader = self._reader
        if kind != REFUSED:
            raise reader.fail(f"unknown frame kind {kind}")
        head = reader.unpack(_REFUSED)
        if head is None:
            return None
        if reader.available() < _REFUSED.size + head[1]:
            return None
        reader.take(_REFUSED.size)
        return Refused(reader.take(head[1]).decode(errors="replace"))
