"""Protobuf's wire format, written by hand for the few messages trimq sends per call or per
delivered message (a ``ReceiveMessageResponse`` from a stored record, a
``SendMessageResponse``), where building protobuf objects field by field costs more than the
bytes themselves. Standard library only.

A field is its key (``field number << 3 | wire type`` as a varint: a constant per field,
spelled out by the callers) and its value: a varint (0), or a length and that many bytes (2).
Each caller's tests parse what it writes with the schema's classes and compare it with what
protobuf itself builds.
"""

from __future__ import annotations

from typing import Final

#: The one-byte varints, 0..127: every length under 128 and most small numbers.
VARINT1: Final = tuple(bytes((n,)) for n in range(128))


def varint(n: int) -> bytes:
    """The varint of an int32/int64/enum value (a negative one as its 64-bit two's
    complement: ten bytes, as protobuf writes it)."""
    if 0 <= n < 128:
        return VARINT1[n]
    if 0 < n < 0x4000:  # two octets: lengths of most messages, small offsets
        return bytes((n & 0x7F | 0x80, n >> 7))
    if n < 0:
        n &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while n > 0x7F:  # bounded: at most ten rounds for a 64-bit value
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def text_field(key: bytes, text: str) -> bytes:
    """A string field: its key, the length and the UTF-8 bytes of ``text``."""
    data = text.encode()
    size = len(data)
    return key + (VARINT1[size] if size < 128 else varint(size)) + data


def sub(key: bytes, body: bytes) -> bytes:
    """A length-delimited field (a sub-message, bytes): its key, the length, ``body``."""
    size = len(body)
    return key + (VARINT1[size] if size < 128 else varint(size)) + body
