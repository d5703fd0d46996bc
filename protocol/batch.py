"""The body of a batch send (SEND_BATCH_MESSAGE): several messages for one topic and queue.

Layout per message (``MessageDecoder.encodeMessage``), concatenated (``encodeMessages``)::

    int32 total size    this message's bytes: 20 + body length + 2 + properties length
    int32 magic         written as 0
    int32 body CRC      written as 0
    int32 flag          the user flag
    int32 body length + body
    int16 properties length + properties   (the properties string, UTF-8)

Topic and queue come from the request header. Java's reader skips the size, magic and CRC
and trusts the lengths; trimq ignores magic and CRC too (the broker computes the CRC) but
checks that every length fits, so a malformed body is a :class:`RecordError`, never a crash.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from protocol.errors import EncodeError, RecordError
from protocol.properties import MAX_PROPERTIES_SIZE, decode_properties, encode_properties

_HEAD = struct.Struct(">iiiii")  # total size, magic, body CRC, flag, body length
_I16 = struct.Struct(">h")
#: The smallest entry: empty body, no properties.
MIN_ENTRY_SIZE = _HEAD.size + 2
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BatchEntry:
    """One message of a batch: what a producer sets per message."""

    body: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0


def encode_batch(messages: Iterable[BatchEntry]) -> bytes:
    """Encode ``messages`` as a batch body, as Java's ``MessageDecoder.encodeMessages``.

    Raises:
        EncodeError: a message's properties cannot be encoded or exceed 32 767 bytes, its
            flag is not a Java int, or it is too large for the int32 size field.
    """
    parts: list[bytes] = []
    for entry in messages:  # bounded by the caller's sequence
        parts.extend(_encode_entry(entry))
    return b"".join(parts)


def _encode_entry(entry: BatchEntry) -> tuple[bytes, bytes, bytes, bytes]:
    try:
        props = encode_properties(entry.properties).encode()
    except UnicodeEncodeError as exc:
        raise EncodeError(f"batch message properties are not valid text: {exc}") from None
    if len(props) > MAX_PROPERTIES_SIZE:
        raise EncodeError(f"message properties of {len(props)} bytes exceed {MAX_PROPERTIES_SIZE}")
    body = entry.body
    total = MIN_ENTRY_SIZE + len(body) + len(props)
    if total > _INT32_MAX:
        raise EncodeError(f"batch message of {total} bytes is too large")
    try:
        head = _HEAD.pack(total, 0, 0, entry.flag, len(body))
    except struct.error as exc:
        raise EncodeError(f"batch message flag {entry.flag!r} is not a Java int: {exc}") from None
    return head, body, _I16.pack(len(props)), props


def decode_batch(body: bytes | bytearray | memoryview) -> list[BatchEntry]:
    """Decode a batch body into its messages (an empty body gives an empty list).

    Raises:
        RecordError: a message is truncated, its lengths disagree with its total size, or
            its properties are not UTF-8.
    """
    out: list[BatchEntry] = []
    pos, end = 0, len(body)
    try:
        while pos < end:  # bounded: each entry advances pos by at least MIN_ENTRY_SIZE
            entry, pos = _decode_entry(body, pos, end)
            out.append(entry)
    except (struct.error, ValueError) as exc:
        # ValueError covers UnicodeDecodeError.
        raise RecordError(f"malformed batch message at offset {pos}: {exc}") from None
    return out


def _decode_entry(
    buf: bytes | bytearray | memoryview, pos: int, end: int
) -> tuple[BatchEntry, int]:
    if pos + MIN_ENTRY_SIZE > end:
        raise RecordError(f"batch message at {pos}: {end - pos} bytes left, need a header")
    total, _magic, _crc, flag, body_len = _HEAD.unpack_from(buf, pos)
    stop = pos + total
    if total < MIN_ENTRY_SIZE or stop > end:
        raise RecordError(f"batch message at {pos}: total size {total} is outside the body")
    start = pos + _HEAD.size
    if body_len < 0 or start + body_len + 2 > stop:
        raise RecordError(f"batch message at {pos}: body length {body_len} overruns it")
    payload = bytes(buf[start : start + body_len])
    (props_len,) = _I16.unpack_from(buf, start + body_len)
    props_at = start + body_len + 2
    if props_len < 0 or props_at + props_len != stop:
        raise RecordError(f"batch message at {pos}: total size {total} disagrees with its fields")
    properties = decode_properties(str(buf[props_at:stop], "utf-8")) if props_len else {}
    return BatchEntry(payload, properties, flag), stop
