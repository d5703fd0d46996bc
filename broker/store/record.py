"""Stored records: RocketMQ's MessageExt layout plus a CRC over the whole record.

The record on disk is the record on the wire (``protocol.message`` decodes it), so a pull
response body is a slice of the commit log. RocketMQ's default recovery checks only the body
CRC; trimq always appends RocketMQ's own ``__CRC32#`` property (``enabledAppendPropCRC``):
the last 20 bytes of every record are ``__CRC32#\\x01`` + ten decimal digits + ``\\x02``, the
digits being ``crc32 & 0x7FFFFFFF`` of every byte before them. A flipped bit anywhere — header,
body, topic, properties or the digits themselves — fails :func:`check_record`. Clients see one
extra property, which they ignore.

Building a record is the put hot path, so it packs the fixed part with one precompiled
struct per host-address family instead of going through ``protocol.message.MessageExt``
(the store contract tests decode what it writes with ``protocol.message``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from typing import NamedTuple, Protocol

from protocol.errors import EncodeError
from protocol.message import (
    BLANK_MAGIC,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
)
from protocol.properties import CRC32, MAX_PROPERTIES_SIZE, encode_properties

CRC_TAIL_SIZE = len(CRC32) + 1 + 10 + 1  # RocketMQ's CRC32_RESERVED_LEN
_CRC_TAIL_PREFIX = CRC32.encode() + b"\x01"
_HOST_BITS = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
#: Fixed part up to and including the body length, one struct per (born, store) family.
_FIXED = tuple(
    struct.Struct(f">iIiiiqqiq{born}sIq{store}sIiqi")
    for born, store in ((4, 4), (16, 4), (4, 16), (16, 16))
)
_FIXED_SIZES = tuple(f.size for f in _FIXED)
_PREFIX = struct.Struct(">iI")
_PHYS = struct.Struct(">q")
_I16 = struct.Struct(">h")
#: End-of-segment marker: total size (the rest of the segment) + BLANK magic.
BLANK_SIZE = _PREFIX.size
_INT32_MAX = 2**31 - 1


def encode_props(properties: Mapping[str, str]) -> bytes:
    """Encode properties for storage: any incoming ``__CRC32#`` is dropped (it is recomputed).

    Raises:
        EncodeError: separators inside names or values, or not UTF-8 encodable.
    """
    if CRC32 in properties:
        properties = {k: v for k, v in properties.items() if k != CRC32}
    try:
        return encode_properties(properties).encode()
    except UnicodeEncodeError as exc:
        raise EncodeError(f"message properties are not valid text: {exc}") from None


class RecordParts(NamedTuple):
    """Where :func:`build_parts` put a record in the log, and its size."""

    offset: int
    total: int


class _Appendable(Protocol):
    """What :func:`build_parts` needs of the commit log."""

    segment_size: int

    @property
    def end(self) -> int: ...

    def reserve(self, size: int) -> int: ...

    def append_parts(self, *parts: bytes) -> None: ...


def build_parts(
    topic: tuple[bytes, int],
    props: bytes,
    body: bytes,
    born_ip: bytes,
    born_port: int,
    store_ip: bytes,
    store_port: int,
    queue_id: int,
    flag: int,
    queue_offset: int,
    sys_flag: int,
    born_timestamp: int,
    store_timestamp: int,
    reconsume_times: int,
    prepared_transaction_offset: int,
    log: _Appendable,
) -> RecordParts:
    """Append one record to ``log`` (rolling its segment if needed) without building the
    record as one bytes object first.

    Raises:
        EncodeError: a field does not fit its wire type or the record fits no segment.
    """
    prefix, magic = topic
    family = (len(born_ip) == 16) | ((len(store_ip) == 16) << 1)
    props_len = len(props) + CRC_TAIL_SIZE
    total = _FIXED_SIZES[family] + len(body) + len(prefix) + 2 + props_len
    if props_len > MAX_PROPERTIES_SIZE:
        raise EncodeError(f"message properties of {props_len} bytes exceed {MAX_PROPERTIES_SIZE}")
    offset = log.end
    if offset % log.segment_size + total + BLANK_SIZE > log.segment_size:
        try:
            offset = log.reserve(total)
        except ValueError as exc:
            raise EncodeError(str(exc)) from None
    try:
        head = _FIXED[family].pack(
            total, magic, zlib.crc32(body) & 0x7FFFFFFF, queue_id, flag, queue_offset, offset,
            (sys_flag & ~_HOST_BITS) | (family << 4), born_timestamp, born_ip, born_port,
            store_timestamp, store_ip, store_port, reconsume_times,
            prepared_transaction_offset, len(body),
        )  # fmt: skip
    except struct.error as exc:
        raise EncodeError(f"message field out of range: {exc}") from None
    rest = prefix + _I16.pack(props_len) + props
    crc = zlib.crc32(rest, zlib.crc32(body, zlib.crc32(head))) & 0x7FFFFFFF
    log.append_parts(head, body, rest, _CRC_TAIL_PREFIX, b"%010d\x02" % crc)
    return RecordParts(offset, total)


def topic_prefix(topic: str) -> tuple[bytes, int]:
    """The topic's length field + UTF-8 bytes, and the magic that goes with that length.

    Raises:
        EncodeError: the topic is not encodable or longer than 32 767 bytes.
    """
    try:
        data = topic.encode()
    except UnicodeEncodeError as exc:
        raise EncodeError(f"topic is not valid text: {exc}") from None
    if len(data) <= 127:
        return bytes((len(data),)) + data, MESSAGE_MAGIC_V1
    if len(data) > 0x7FFF:
        raise EncodeError(f"topic of {len(data)} bytes is too long")
    return _I16.pack(len(data)) + data, MESSAGE_MAGIC_V2


# ------------------------------------------------------------------ validation
class Check(NamedTuple):
    """What :func:`check_record` found at a position.

    ``size`` > 0 with ``blank`` False: a valid record of that size. ``blank``: the end-of-
    segment marker; ``size`` is the rest of the segment. ``size`` == 0: no record here (end
    of data, or damage: ``reason`` says which).
    """

    size: int
    blank: bool
    reason: str


END_OF_DATA = Check(0, False, "end of data")


def check_record(buf: bytes | bytearray | memoryview, pos: int, phys: int) -> Check:
    """Validate the record at ``buf[pos:]``, which must sit at commit-log offset ``phys``.

    Never raises: damage is reported as ``Check(0, …, reason)``. A record is valid when its
    length fits the buffer, its magic is known, its physical-offset field equals ``phys``,
    and its CRC tail matches every byte before it.
    """
    if len(buf) - pos < _PREFIX.size:
        return END_OF_DATA if not any(buf[pos:]) else Check(0, False, "torn record prefix")
    size, magic = _PREFIX.unpack_from(buf, pos)
    if size == 0 and magic == 0:
        return END_OF_DATA
    if magic == BLANK_MAGIC:
        return Check(size, True, "blank") if size >= BLANK_SIZE else Check(0, False, "bad blank")
    if magic not in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2):
        return Check(0, False, f"bad magic {magic:#x}")
    if size < _FIXED[0].size + CRC_TAIL_SIZE or pos + size > len(buf):
        return Check(0, False, f"record size {size} does not fit")
    if _PHYS.unpack_from(buf, pos + 28)[0] != phys:
        return Check(0, False, "physical offset field does not match the position")
    end = pos + size
    tail = bytes(buf[end - CRC_TAIL_SIZE : end])
    if not (tail.startswith(_CRC_TAIL_PREFIX) and tail.endswith(b"\x02")):
        return Check(0, False, "no CRC tail")
    digits = tail[len(_CRC_TAIL_PREFIX) : -1]
    if not (digits.isdigit() and digits.isascii()):
        return Check(0, False, "CRC digits are not decimal")
    crc = zlib.crc32(memoryview(buf)[pos : end - CRC_TAIL_SIZE])
    if crc & 0x7FFFFFFF != int(digits):
        return Check(0, False, "CRC mismatch")
    return Check(size, False, "ok")


def blank_marker(rest_of_segment: int) -> bytes:
    """The end-of-segment marker declaring ``rest_of_segment`` bytes unused."""
    return _PREFIX.pack(rest_of_segment, BLANK_MAGIC)
