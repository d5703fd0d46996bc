"""The HTTP/2 wire (RFC 9113) as a gRPC server needs it: frame layout, codes, settings, and
the few header blocks a server writes.

Frames are built here as bytes; parsing and the connection's state live in
:mod:`protocol.grpc.connection`. Response header blocks never use HPACK's dynamic table:
``:status 200`` is a static-table index, the other fields are literals "without indexing"
(RFC 7541 §6.2.2), so encoding keeps no state and the common blocks are constants. Request
headers are decoded with the ``hpack`` library (the client's encoder does use the dynamic
table, so the decoder must follow it).
"""

from __future__ import annotations

import enum
import struct
from typing import Final

#: The client connection preface (RFC 9113 §3.4) that starts every inbound stream.
CONNECTION_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER: Final = struct.Struct(">IBI")  # (length(3) ‖ type(1)), flags, stream id
FRAME_HEADER_SIZE: Final = 9
_U32: Final = struct.Struct(">I")
_GOAWAY: Final = struct.Struct(">II")
_SETTING: Final = struct.Struct(">HI")

#: Largest flow-control window (RFC 9113 §6.9.1).
MAX_WINDOW: Final = 2**31 - 1
#: SETTINGS_MAX_FRAME_SIZE bounds (RFC 9113 §6.5.2).
MIN_MAX_FRAME_SIZE: Final = 16_384
MAX_MAX_FRAME_SIZE: Final = 2**24 - 1
#: Window and frame size before the peer's SETTINGS say otherwise.
DEFAULT_WINDOW: Final = 65_535


class FrameType(enum.IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class Flag:
    """Frame flags: plain ints, not an ``IntFlag`` (``flags & Flag.X`` with an enum builds a
    new enum member each time: ~1 µs on every frame read)."""

    END_STREAM: Final = 0x1  # DATA, HEADERS
    ACK: Final = 0x1  # SETTINGS, PING
    END_HEADERS: Final = 0x4
    PADDED: Final = 0x8
    PRIORITY: Final = 0x20


class ErrorCode(enum.IntEnum):
    """HTTP/2 error codes (RFC 9113 §7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


def code_name(code: int) -> str:
    """An error code as ``CANCEL (8)``."""
    try:
        return f"{ErrorCode(code).name} ({code})"
    except ValueError:
        return str(code)


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class ConnectionError_(Exception):
    """The peer broke HTTP/2 for the whole connection: answer with GOAWAY ``code``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ------------------------------------------------------------------ frames
def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame, header and payload."""
    return FRAME_HEADER.pack(len(payload) << 8 | ftype, flags, stream_id) + payload


def frame_header(ftype: int, flags: int, stream_id: int, length: int) -> bytes:
    """A frame's 9-byte header (its payload written after it)."""
    return FRAME_HEADER.pack(length << 8 | ftype, flags, stream_id)


def settings_frame(values: dict[Setting, int]) -> bytes:
    return frame(FrameType.SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in values.items()))


SETTINGS_ACK: Final = frame(FrameType.SETTINGS, Flag.ACK, 0)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(FrameType.GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def ping_ack(opaque: bytes) -> bytes:
    return frame(FrameType.PING, Flag.ACK, 0, opaque)


def headers_frames(stream_id: int, block: bytes, max_frame_size: int, *, end_stream: bool) -> bytes:
    """A header block as HEADERS (+ CONTINUATION frames when it exceeds the peer's frame
    size)."""
    first = block[:max_frame_size]
    rest = block[max_frame_size:]
    flags = (Flag.END_STREAM if end_stream else 0) | (0 if rest else Flag.END_HEADERS)
    out = [frame(FrameType.HEADERS, flags, stream_id, first)]
    while rest:
        piece, rest = rest[:max_frame_size], rest[max_frame_size:]
        out.append(frame(FrameType.CONTINUATION, 0 if rest else Flag.END_HEADERS, stream_id, piece))
    return b"".join(out)


def unpack_u32(payload: bytes) -> int:
    return int(_U32.unpack_from(payload)[0])


def unpack_goaway(payload: bytes) -> tuple[int, int]:
    last, code = _GOAWAY.unpack_from(payload)
    return last & 0x7FFFFFFF, code


def unpack_settings(payload: bytes) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), _SETTING.size)]


# ------------------------------------------------------------------ HPACK, encoding side
def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 §5.1) with ``first``'s high bits in its first byte."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header field "literal without indexing — new name" (RFC 7541 §6.2.2), no Huffman."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


#: ``:status: 200`` (static index 8) and ``content-type: application/grpc`` (static name 31).
RESPONSE_HEADERS_BLOCK: Final = b"\x88" + hpack_int(31, 4) + hpack_int(16, 7) + b"application/grpc"


def trailers_block(status: int, message: str = "") -> bytes:
    """``grpc-status`` and (when given) ``grpc-message``, already percent-encoded ASCII."""
    block = literal(b"grpc-status", str(int(status)).encode())
    if message:
        block += literal(b"grpc-message", message.encode("ascii", "replace"))
    return block


#: The trailers of a call that ended well: the most common block of all.
OK_TRAILERS_BLOCK: Final = trailers_block(0)
