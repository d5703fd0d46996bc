"""The message record: the same bytes in the commit log and in PULL/POP response bodies.

Layout (big-endian, ``MessageDecoder.decode``; offsets for IPv4 hosts)::

     0 int32 total size      16 int32 flag             36 int32 sys flag
     4 int32 magic           20 int64 queue offset     40 int64 born timestamp
     8 int32 body CRC        28 int64 physical offset  48 born host: IP (4|16) + int32 port
    12 int32 queue id
    then: int64 store timestamp · store host IP (4|16) + int32 port · int32 reconsume times ·
    int64 prepared transaction offset · int32 body length + body · topic length (int8 for
    magic V1, int16 for V2) + topic · int16 properties length + properties

Sys-flag bits 0x10/0x20 say whether the born/store host is IPv6. Java reads every length as a
signed number, so a V1 topic holds at most 127 bytes, a V2 topic and the properties at most
32 767. Compressed bodies (sys flag bit 0) stay compressed here: records pass through as stored.

:func:`encode_record` derives what the bytes themselves determine (magic, host bits, CRC,
total size), so encoding is deterministic and ``decode_record(encode_record(m))[0] == m``
whenever ``m`` agrees with them. Decoding is strict: anything malformed is a
:class:`RecordError`, never a ``struct.error`` or ``UnicodeDecodeError``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import NamedTuple

from protocol.errors import EncodeError, RecordError
from protocol.msgid import encode_offset_msg_id, ip_from_bytes, ip_to_bytes
from protocol.properties import (
    KEYS,
    MAX_PROPERTIES_SIZE,
    TAGS,
    UNIQ_KEY,
    decode_properties,
    encode_properties,
    split_keys,
)

MESSAGE_MAGIC_V1 = 0xDAA320A7  # -626843481 as a Java int: 1-byte topic length
MESSAGE_MAGIC_V2 = 0xDAA320AB  # -626843477: 2-byte topic length
#: End-of-file filler in a commit-log file (``BLANK_MAGIC_CODE``); never a message.
BLANK_MAGIC = 0xCBD43194

# ``MessageSysFlag``
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_NOT_TYPE = 0x0
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_NEED_UNWRAP = 0x40
SYSFLAG_INNER_BATCH = 0x80
SYSFLAG_COMPRESSION_MASK = 0x700  # bits 8-10: the compression type
SYSFLAG_COMPRESSION_LZ4 = 0x100
SYSFLAG_COMPRESSION_ZSTD = 0x200
SYSFLAG_COMPRESSION_ZLIB = 0x300

_HOST_BITS = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
_INT32_MAX = 2**31 - 1
_INT16_MAX = 2**15 - 1

#: One struct per (born host, store host) address family, indexed by ``(sys_flag >> 4) & 3``,
#: covering everything from the total size up to and including the body length.
_FIXED = tuple(
    struct.Struct(f">iIiiiqqiq{born}sIq{store}sIiqi")
    for born, store in ((4, 4), (16, 4), (4, 16), (16, 16))
)
_HEAD = struct.Struct(">iIiiiqqiq")  # up to the born timestamp: the same for every family
_START = struct.Struct(">iI28xi")  # total size, magic and (at 36) the sys flag
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
#: Smallest valid record: IPv4 hosts, empty body, V1 empty topic, no properties.
MIN_RECORD_SIZE = _FIXED[0].size + 1 + 2
_TOPIC_LEN_V1 = tuple(bytes((n,)) for n in range(128))

Host = tuple[str, int]
Buffer = bytes | bytearray | memoryview


def body_crc32(body: bytes | bytearray | memoryview) -> int:
    """RocketMQ's ``UtilAll.crc32``: the CRC-32 of ``body`` with the sign bit cleared."""
    return zlib.crc32(body) & 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class MessageExt:
    """One stored message (``MessageExt``): user content plus the broker's bookkeeping.

    ``born_host``/``store_host`` are ``(IP text, port)``; IPv6 addresses decode to their
    compressed form. ``body_crc`` is what the record carries; :func:`encode_record` always
    writes the CRC of ``body``.
    """

    topic: str
    body: bytes = b""
    properties: Mapping[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    commit_log_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("0.0.0.0", 0)
    store_timestamp: int = 0
    store_host: Host = ("0.0.0.0", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0

    @property
    def tags(self) -> str | None:
        """The ``TAGS`` property, if any."""
        return self.properties.get(TAGS)

    @property
    def keys(self) -> list[str]:
        """The ``KEYS`` property split into its keys."""
        return split_keys(self.properties.get(KEYS))

    @property
    def offset_msg_id(self) -> str:
        """The broker's id of this record: store host + commit-log offset, in hex."""
        host, port = self.store_host
        return encode_offset_msg_id(host, port, self.commit_log_offset)

    @property
    def msg_id(self) -> str:
        """The id applications see: ``UNIQ_KEY``, else the offset id (as Java clients do)."""
        return self.properties.get(UNIQ_KEY) or self.offset_msg_id


class RecordHead(NamedTuple):
    """The fixed-offset fields of a record, read without decoding the rest."""

    total_size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    commit_log_offset: int
    sys_flag: int
    born_timestamp: int
    store_timestamp: int


# ------------------------------------------------------------------ encoding
def encode_record(msg: MessageExt) -> bytes:
    """Encode ``msg`` as a stored record.

    The magic (V2 when the UTF-8 topic exceeds 127 bytes), the host bits of the sys flag,
    the body CRC and the total size are computed, not taken from ``msg``.

    Raises:
        EncodeError: a field does not fit its wire type (topic over 32 767 bytes, properties
            over 32 767 bytes or with separators, bad address or port, integer overflow).
    """
    try:
        topic = msg.topic.encode()
        props = encode_properties(msg.properties).encode()
    except UnicodeEncodeError as exc:
        raise EncodeError(f"message topic or properties are not valid text: {exc}") from None
    born_ip, born_port = _host(msg.born_host)
    store_ip, store_port = _host(msg.store_host)
    sys_flag = msg.sys_flag & ~_HOST_BITS
    if len(born_ip) == 16:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if len(store_ip) == 16:
        sys_flag |= SYSFLAG_STOREHOST_V6
    fixed = _FIXED[(sys_flag >> 4) & 3]
    body = msg.body
    magic, topic_len = _topic_prefix(topic)
    if len(props) > MAX_PROPERTIES_SIZE:
        raise EncodeError(f"message properties of {len(props)} bytes exceed {MAX_PROPERTIES_SIZE}")
    total = fixed.size + len(body) + len(topic_len) + len(topic) + 2 + len(props)
    if total > _INT32_MAX:
        raise EncodeError(f"message record of {total} bytes is too large")
    try:
        head = fixed.pack(
            total, magic, zlib.crc32(body) & 0x7FFFFFFF, msg.queue_id, msg.flag,
            msg.queue_offset, msg.commit_log_offset, sys_flag, msg.born_timestamp,
            born_ip, born_port, msg.store_timestamp, store_ip, store_port,
            msg.reconsume_times, msg.prepared_transaction_offset, len(body),
        )  # fmt: skip
    except struct.error as exc:
        raise EncodeError(f"message field out of range: {exc}") from None
    return b"".join((head, body, topic_len, topic, _I16.pack(len(props)), props))


def encode_records(messages: Iterable[MessageExt]) -> bytes:
    """Concatenate the records of ``messages``, as a PULL or POP response body."""
    return b"".join([encode_record(m) for m in messages])


def _host(host: Host) -> tuple[bytes, int]:
    ip, port = host
    if type(port) is not int or not 0 <= port <= 0xFFFF:
        raise EncodeError(f"port {port!r} of host {ip!r} is outside 0..65535")
    return ip_to_bytes(ip), port


def _topic_prefix(topic: bytes) -> tuple[int, bytes]:
    size = len(topic)
    if size <= 127:
        return MESSAGE_MAGIC_V1, _TOPIC_LEN_V1[size]
    if size > _INT16_MAX:
        raise EncodeError(f"topic of {size} bytes exceeds {_INT16_MAX}")
    return MESSAGE_MAGIC_V2, _I16.pack(size)


# ------------------------------------------------------------------ decoding
def decode_record(
    buf: Buffer, offset: int = 0, *, verify_crc: bool = False
) -> tuple[MessageExt, int]:
    """Decode the record at ``offset``; return it and the offset just past it.

    Raises:
        RecordError: the record is truncated or malformed, or (with ``verify_crc``) its
            body does not match its CRC.
    """
    try:
        return _decode(buf, offset, verify_crc)
    except (struct.error, IndexError, ValueError) as exc:
        # ValueError covers UnicodeDecodeError and ipaddress's errors.
        raise RecordError(f"malformed message record at offset {offset}: {exc}") from None


def decode_records(body: Buffer, *, verify_crc: bool = False) -> list[MessageExt]:
    """Decode a concatenation of records (a PULL or POP response body)."""
    out: list[MessageExt] = []
    pos, end = 0, len(body)
    try:
        while pos < end:  # bounded: each record advances pos by at least MIN_RECORD_SIZE
            msg, pos = _decode(body, pos, verify_crc)
            out.append(msg)
    except (struct.error, IndexError, ValueError) as exc:
        raise RecordError(f"malformed message record at offset {pos}: {exc}") from None
    return out


def _decode(buf: Buffer, offset: int, verify_crc: bool) -> tuple[MessageExt, int]:
    total, magic, sys_flag = _check_start(buf, offset)
    fixed = _FIXED[(sys_flag >> 4) & 3]
    (
        _, _, crc, queue_id, flag, queue_offset, phys_offset, _, born_ts,
        born_ip, born_port, store_ts, store_ip, store_port, reconsume, prepared, body_len,
    ) = fixed.unpack_from(buf, offset)  # fmt: skip
    end = offset + total
    pos = offset + fixed.size
    if body_len < 0 or pos + body_len > end:
        raise RecordError(f"record at {offset}: body length {body_len} overruns the record")
    body = bytes(buf[pos : pos + body_len])
    pos += body_len
    if verify_crc and zlib.crc32(body) & 0x7FFFFFFF != crc:
        raise RecordError(f"record at {offset}: body does not match its CRC {crc}")
    topic, pos = _read_topic(buf, pos, end, magic)
    if pos + 2 > end:
        raise RecordError(f"record at {offset}: truncated before the properties length")
    (props_len,) = _I16.unpack_from(buf, pos)
    pos += 2
    if props_len < 0 or pos + props_len != end:
        raise RecordError(f"record at {offset}: total size {total} disagrees with its fields")
    properties = decode_properties(str(buf[pos:end], "utf-8")) if props_len else {}
    if born_port > 0xFFFF or store_port > 0xFFFF:
        raise RecordError(f"record at {offset}: a host port is outside 0..65535")
    msg = _message(
        topic, body, properties, queue_id, flag, queue_offset, phys_offset, sys_flag, born_ts,
        (ip_from_bytes(born_ip), born_port), store_ts, (ip_from_bytes(store_ip), store_port),
        reconsume, prepared, crc,
    )  # fmt: skip
    return msg, end


# A frozen dataclass's __init__ assigns every field through object.__setattr__, which was a
# third of the cost of decoding a small record. The slots' own descriptors store the same
# values directly; the round-trip tests compare against the ordinary constructor.
_Setter = Callable[[MessageExt, object], None]
_SETTERS: tuple[_Setter, ...] = tuple(vars(MessageExt)[f.name].__set__ for f in fields(MessageExt))
(
    _s_topic, _s_body, _s_props, _s_queue_id, _s_flag, _s_queue_offset, _s_phys, _s_sys_flag,
    _s_born_ts, _s_born_host, _s_store_ts, _s_store_host, _s_reconsume, _s_prepared, _s_crc,
) = _SETTERS  # fmt: skip


def _message(
    topic: str, body: bytes, properties: dict[str, str], queue_id: int, flag: int,
    queue_offset: int, phys_offset: int, sys_flag: int, born_ts: int, born_host: Host,
    store_ts: int, store_host: Host, reconsume: int, prepared: int, crc: int,
) -> MessageExt:  # fmt: skip
    """``MessageExt(...)`` with every field given positionally, without ``__setattr__``."""
    msg: MessageExt = object.__new__(MessageExt)
    _s_topic(msg, topic)
    _s_body(msg, body)
    _s_props(msg, properties)
    _s_queue_id(msg, queue_id)
    _s_flag(msg, flag)
    _s_queue_offset(msg, queue_offset)
    _s_phys(msg, phys_offset)
    _s_sys_flag(msg, sys_flag)
    _s_born_ts(msg, born_ts)
    _s_born_host(msg, born_host)
    _s_store_ts(msg, store_ts)
    _s_store_host(msg, store_host)
    _s_reconsume(msg, reconsume)
    _s_prepared(msg, prepared)
    _s_crc(msg, crc)
    return msg


def _check_start(buf: Buffer, offset: int) -> tuple[int, int, int]:
    """Total size, magic and sys flag of the record at ``offset``, once they are checked."""
    if offset < 0 or offset + MIN_RECORD_SIZE > len(buf):
        raise RecordError(f"no record at offset {offset} of a {len(buf)}-byte buffer")
    total, magic, sys_flag = _START.unpack_from(buf, offset)
    if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2:
        raise RecordError(f"record at {offset}: unknown magic code {magic:#010x}")
    if total < MIN_RECORD_SIZE or offset + total > len(buf):
        raise RecordError(f"record at {offset}: total size {total} is outside the buffer")
    return total, magic, sys_flag


def _read_topic(buf: Buffer, pos: int, end: int, magic: int) -> tuple[str, int]:
    if magic == MESSAGE_MAGIC_V1:
        size = buf[pos]  # Java reads a signed byte: 128..255 would be negative
        pos += 1
        if size > 127:
            raise RecordError(f"V1 topic length byte {size} is negative as a Java byte")
    else:
        (size,) = _I16.unpack_from(buf, pos)
        pos += 2
        if size < 0:
            raise RecordError(f"V2 topic length {size} is negative")
    if pos + size > end:
        raise RecordError(f"topic length {size} overruns the record")
    return str(buf[pos : pos + size], "utf-8"), pos + size


def peek_record(buf: Buffer, offset: int = 0) -> RecordHead:
    """Read the fixed-offset fields of the record at ``offset`` without decoding it.

    Checks the magic and that the total size is plausible, not that the whole record is
    in ``buf``: only the first 64 (IPv4) or 76 (IPv6 born host) bytes are needed.

    Raises:
        RecordError: too few bytes, a non-record magic (including :data:`BLANK_MAGIC`) or a
            total size below :data:`MIN_RECORD_SIZE`.
    """
    if offset < 0 or offset + _HEAD.size > len(buf):
        raise RecordError(f"no record header at offset {offset} of a {len(buf)}-byte buffer")
    head = _HEAD.unpack_from(buf, offset)
    total, magic, sys_flag = head[0], head[1], head[7]
    if magic != MESSAGE_MAGIC_V1 and magic != MESSAGE_MAGIC_V2:
        raise RecordError(f"record at {offset}: unknown magic code {magic:#010x}")
    if total < MIN_RECORD_SIZE:
        raise RecordError(f"record at {offset}: total size {total} is too small")
    ts_at = offset + _HEAD.size + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)
    if ts_at + 8 > len(buf):
        raise RecordError(f"record at {offset}: truncated before the store timestamp")
    (store_ts,) = _I64.unpack_from(buf, ts_at)
    return RecordHead._make((*head, store_ts))
