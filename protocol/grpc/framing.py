"""gRPC over HTTP/2, sans-IO pieces: message framing, ``grpc-timeout``, ``grpc-message`` and
an inbound HTTP/2 frame splitter that keeps the peer's GOAWAY away from h2.

Standard library only: no sockets, no trio, no h2 (the server glues these to h2).

Message framing (gRPC "Length-Prefixed-Message")::

    uint8  compressed flag   0 = identity; 1 = compressed with the stream's grpc-encoding
    uint32 length            big-endian, payload bytes that follow
    payload                  one serialized protobuf message

trimq advertises no ``grpc-accept-encoding``, so a peer must never compress: a set flag is
answered with UNIMPLEMENTED, as grpc-go answers a compressed message it cannot decompress.

Errors carry plain gRPC status numbers (see ``protocol.grpc.codes.GrpcStatus``)::

    8   RESOURCE_EXHAUSTED   a message longer than the decoder's limit
    12  UNIMPLEMENTED        a compressed message
    13  INTERNAL             a compressed-flag byte other than 0 or 1

Why :class:`FrameSplitter` exists (python-hyper/h2#1181, see the gRPC front-end notes §5.2 a):
h2 moves its connection state machine to CLOSED when it *receives* a GOAWAY, so any later
frame on a stream that is still open (the client's DATA, END_STREAM, WINDOW_UPDATE …) raises
``h2.exceptions.ProtocolError``. Yet RFC 9113 §6.8 lets a GOAWAY's sender finish the streams
it already opened: a client's GOAWAY only promises that it opens no new streams. The server
therefore passes its inbound bytes through a splitter that withholds complete GOAWAY frames
from h2 and reports them to the caller, which then drains (finish the open calls, close).
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Final, NoReturn

from protocol.errors import ProtocolError

__all__ = [
    "CONNECTION_PREFACE",
    "DEFAULT_H2_MAX_FRAME_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FrameSplitter",
    "GoAway",
    "GrpcFramingError",
    "MessageDecoder",
    "encode_message",
    "format_timeout",
    "parse_timeout",
    "percent_decode",
    "percent_encode",
]

#: The default limit on one received message, as grpc-go and grpc-java (4 MiB).
DEFAULT_MAX_MESSAGE_SIZE: Final = 4 * 1024 * 1024

# gRPC status numbers used here (protocol.grpc.codes.GrpcStatus has the full enum).
_RESOURCE_EXHAUSTED: Final = 8
_UNIMPLEMENTED: Final = 12
_INTERNAL: Final = 13

_PREFIX: Final = struct.Struct(">BI")  # compressed flag, length
_PREFIX_SIZE: Final = _PREFIX.size  # 5
# Compact the decoder's buffer once this many consumed bytes sit in front of it (and they are
# at least half the buffer), so consumed bytes are moved at most a constant number of times.
_COMPACT_AT: Final = 64 * 1024


class GrpcFramingError(ProtocolError):
    """A gRPC message stream is malformed; the call must end with ``status``.

    A subclass of :class:`protocol.errors.ProtocolError` (``fatal``: the message stream of
    this call cannot continue; the HTTP/2 connection and its other streams are unaffected).

    Attributes:
        status: the gRPC status number to end the call with (8 RESOURCE_EXHAUSTED,
            12 UNIMPLEMENTED or 13 INTERNAL here; see ``protocol.grpc.codes.GrpcStatus``).
        message: the text for the ``grpc-message`` trailer (not yet percent-encoded).
    """

    fatal = True

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def __repr__(self) -> str:
        return f"GrpcFramingError(status={self.status}, message={self.message!r})"


def encode_message(payload: bytes) -> bytes:
    """Frame ``payload`` as one uncompressed gRPC message (flag 0, big-endian length).

    Raises:
        ValueError: the payload does not fit the 32-bit length field.
    """
    if len(payload) > 0xFFFFFFFF:
        raise ValueError(f"message of {len(payload)} bytes exceeds the 4 GiB gRPC frame limit")
    return _PREFIX.pack(0, len(payload)) + payload


class MessageDecoder:
    """Incremental decoder of one direction of one gRPC call's messages.

    Feed the DATA bytes of a stream with :meth:`receive_data` in any split, then call
    :meth:`next_message` until it returns ``None``. When the stream ends, check
    :attr:`at_boundary`: False means the peer ended mid-message, which the caller reports
    (grpc-go uses INTERNAL for it).

    Errors are sticky: once :meth:`next_message` raised, it raises the same error again, and
    :meth:`receive_data` discards further bytes.

    Args:
        max_message_size: the largest accepted payload in bytes (the 5-byte prefix is not
            counted, as in grpc-go's ``MaxRecvMsgSize``).
    """

    __slots__ = ("_buf", "_error", "_pos", "max_message_size")

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        if max_message_size < 0:
            raise ValueError("max_message_size must not be negative")
        self.max_message_size = max_message_size
        self._buf = bytearray()
        self._pos = 0  # start of the unconsumed bytes in _buf
        self._error: GrpcFramingError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a message."""
        return len(self._buf) - self._pos

    @property
    def at_boundary(self) -> bool:
        """True when no partial message is buffered (the stream may end here)."""
        return len(self._buf) == self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add DATA bytes received on the stream (any split; ``b""`` is ignored)."""
        if self._error is not None or not data:
            return
        pos = self._pos
        if pos >= _COMPACT_AT and pos * 2 >= len(self._buf):
            del self._buf[:pos]
            self._pos = 0
        self._buf += data

    def next_message(self) -> bytes | None:
        """Return the next complete payload, or ``None`` if more bytes are needed.

        Raises:
            GrpcFramingError: status 8 (RESOURCE_EXHAUSTED) for a length over
                ``max_message_size``, raised as soon as the prefix is read, before the body
                arrives; 12 (UNIMPLEMENTED) for a compressed message; 13 (INTERNAL) for a
                flag byte other than 0 or 1. The limit is checked first, as in grpc-go.
        """
        if self._error is not None:
            raise self._error
        buf, pos = self._buf, self._pos
        if len(buf) - pos < _PREFIX_SIZE:
            return None
        flag, length = _PREFIX.unpack_from(buf, pos)
        if length > self.max_message_size:
            self._fail(
                _RESOURCE_EXHAUSTED,
                f"received message larger than max ({length} vs. {self.max_message_size})",
            )
        if flag != 0:
            if flag == 1:
                self._fail(_UNIMPLEMENTED, "compressed messages are not supported")
            self._fail(_INTERNAL, f"received unexpected payload format {flag}")
        start = pos + _PREFIX_SIZE
        end = start + length
        if len(buf) < end:
            return None
        payload = bytes(buf[start:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
        return payload

    def _fail(self, status: int, message: str) -> NoReturn:
        self._error = GrpcFramingError(status, message)
        self._buf.clear()
        self._pos = 0
        raise self._error


# ---------------------------------------------------------------- grpc-timeout

#: Nanoseconds per ``grpc-timeout`` unit, most precise first.
_TIMEOUT_UNITS_NS: Final[tuple[tuple[str, int], ...]] = (
    ("n", 1),
    ("u", 1_000),
    ("m", 1_000_000),
    ("S", 1_000_000_000),
    ("M", 60_000_000_000),
    ("H", 3_600_000_000_000),
)
_UNIT_SECONDS: Final[dict[str, float]] = {
    "H": 3600.0,
    "M": 60.0,
    "S": 1.0,
    "m": 1e-3,
    "u": 1e-6,
    "n": 1e-9,
}
_TIMEOUT_RE: Final = re.compile(r"([0-9]{1,8})([HMSmun])")
_MAX_TIMEOUT_VALUE: Final = 99_999_999


def parse_timeout(value: str) -> float:
    """Parse a ``grpc-timeout`` header value (1 to 8 ASCII digits and a unit) into seconds.

    Units: ``H`` hours, ``M`` minutes, ``S`` seconds, ``m`` milliseconds, ``u`` microseconds,
    ``n`` nanoseconds. ``0`` of any unit is valid (the deadline has already passed).

    Raises:
        ValueError: the value does not match the grammar (empty, more than 8 digits,
            non-ASCII digits, signs, spaces, a missing or unknown unit).
    """
    match = _TIMEOUT_RE.fullmatch(value)
    if match is None:
        raise ValueError(f"malformed grpc-timeout {value!r}")
    digits, unit = match.groups()
    return int(digits) * _UNIT_SECONDS[unit]


def format_timeout(seconds: float) -> str:
    """Format ``seconds`` as a ``grpc-timeout`` value in the most precise unit that fits.

    The value is rounded to the nearest nanosecond, then rounded *up* to the unit (as grpc-go
    does), so the peer never sees a shorter deadline than ours. Zero and negative durations
    give ``"0n"``; durations beyond 99 999 999 hours (including infinity) are clamped to
    ``"99999999H"``.

    Raises:
        ValueError: ``seconds`` is NaN.
    """
    if math.isnan(seconds):
        raise ValueError("grpc-timeout cannot be NaN")
    if seconds <= 0:
        return "0n"
    if math.isinf(seconds) or seconds > _MAX_TIMEOUT_VALUE * 3600.0:
        return f"{_MAX_TIMEOUT_VALUE}H"
    nanos = max(1, round(seconds * 1e9))
    for unit, size in _TIMEOUT_UNITS_NS:
        count = -(-nanos // size)  # ceiling division
        if count <= _MAX_TIMEOUT_VALUE:
            return f"{count}{unit}"
    return f"{_MAX_TIMEOUT_VALUE}H"  # pragma: no cover - excluded by the range check above


# ---------------------------------------------------------------- grpc-message

# Bytes that stay literal: printable ASCII (0x20-0x7E) except '%' (0x25).
_NEEDS_ENCODING: Final = re.compile(rb"[^\x20-\x24\x26-\x7e]")
_ENCODED_BYTE: Final = re.compile(rb"%([0-9A-Fa-f]{2})")


def _encode_byte(match: re.Match[bytes]) -> bytes:
    return b"%%%02X" % match[0][0]


def _decode_byte(match: re.Match[bytes]) -> bytes:
    return bytes((int(match[1], 16),))


def percent_encode(text: str) -> str:
    """Percent-encode ``text`` for the ``grpc-message`` trailer.

    The text is encoded as UTF-8; every byte outside 0x20-0x7E, and ``%`` itself, becomes
    ``%XX`` (uppercase hex). Lone surrogates, which UTF-8 cannot carry, become ``?``.
    """
    data = text.encode("utf-8", "replace")
    if _NEEDS_ENCODING.search(data) is None:
        return data.decode("ascii")
    return _NEEDS_ENCODING.sub(_encode_byte, data).decode("ascii")


def percent_decode(text: str) -> str:
    """Decode a ``grpc-message`` value, leniently, as the gRPC spec asks.

    ``%XX`` (either case of hex) becomes the byte XX; a ``%`` not followed by two hex digits
    stays literally. The bytes are then decoded as UTF-8, with invalid sequences replaced
    by U+FFFD: a status message is never a reason to fail.
    """
    if "%" not in text:
        return text
    data = _ENCODED_BYTE.sub(_decode_byte, text.encode("utf-8", "replace"))
    return data.decode("utf-8", "replace")


# ---------------------------------------------------------------- HTTP/2 frame splitter

#: The client connection preface (RFC 9113 §3.4) that starts every inbound server stream.
CONNECTION_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_FRAME_HEADER: Final = struct.Struct(">IBI")  # 9 bytes: (length(3) ‖ type(1)), flags, stream id
_FRAME_HEADER_SIZE: Final = 9
_GOAWAY: Final = 0x7
_GOAWAY_FIXED: Final = struct.Struct(">II")  # last stream id, error code
#: SETTINGS_MAX_FRAME_SIZE's initial value (RFC 9113 §6.5.2), h2's default inbound limit.
DEFAULT_H2_MAX_FRAME_SIZE: Final = 16_384


@dataclass(frozen=True, slots=True)
class GoAway:
    """A GOAWAY frame the peer sent, withheld from h2 by :class:`FrameSplitter`.

    Attributes:
        last_stream_id: the highest stream id the peer may have processed (reserved bit
            cleared). For a client peer it concerns server-initiated streams, so a server
            mostly cares that the client will open no new streams.
        error_code: the HTTP/2 error code (0 NO_ERROR means a graceful shutdown).
        debug_data: opaque diagnostic bytes (often ASCII text).
    """

    last_stream_id: int
    error_code: int
    debug_data: bytes


class FrameSplitter:
    """Split the inbound byte stream of a server-side HTTP/2 connection, withholding GOAWAY.

    Feed every byte read from the socket to :meth:`receive_data` and hand the bytes it returns
    to ``h2.connection.H2Connection.receive_data``. The returned bytes are the input with
    complete GOAWAY frames cut out, in order; splits fall anywhere except inside a GOAWAY:

    * the 24-byte connection preface is passed through untouched (in whatever pieces it
      arrives; h2 validates it);
    * an incomplete 9-byte frame header is held back until it is complete;
    * a frame that is not a GOAWAY is passed through as its bytes arrive;
    * a GOAWAY frame is held back until complete, then returned as a :class:`GoAway`.

    A GOAWAY that h2 would reject anyway is passed through so h2 raises its own error (and
    the splitter never buffers an oversize frame): a payload shorter than 8 bytes
    (FRAME_SIZE_ERROR), a non-zero stream id (PROTOCOL_ERROR) or a length above
    ``max_frame_size`` (FRAME_SIZE_ERROR).

    The work is O(n) in the bytes fed; at most one frame header or one GOAWAY frame
    (``max_frame_size`` bytes) is buffered.

    Args:
        max_frame_size: the largest frame the connection accepts: h2's
            ``local_settings.max_frame_size``, 16 384 unless the server raised it.
    """

    __slots__ = ("_goaway", "_goaway_left", "_header", "_pass_left", "_preface_left", "_size")

    def __init__(self, *, max_frame_size: int = DEFAULT_H2_MAX_FRAME_SIZE) -> None:
        self._size = max_frame_size
        self._preface_left = len(CONNECTION_PREFACE)
        self._header = bytearray()  # a frame header still incomplete (< 9 bytes)
        self._pass_left = 0  # payload bytes of a non-GOAWAY frame still to pass through
        self._goaway = bytearray()  # a GOAWAY frame (header included) being collected
        self._goaway_left = 0  # payload bytes of that GOAWAY still to come

    @property
    def buffered(self) -> int:
        """Bytes held back: an incomplete frame header or an incomplete GOAWAY frame."""
        return len(self._header) + len(self._goaway)

    def receive_data(self, data: bytes | bytearray | memoryview) -> tuple[bytes, list[GoAway]]:
        """Take bytes read from the peer; return the bytes for h2 and the GOAWAYs withheld."""
        view = memoryview(data).cast("B")
        n = len(view)
        out: list[bytes | memoryview] = []
        goaways: list[GoAway] = []
        i = 0
        if self._preface_left:
            take = min(self._preface_left, n)
            self._preface_left -= take
            out.append(view[:take])
            i = take
        while i < n:
            if self._pass_left:
                take = min(self._pass_left, n - i)
                out.append(view[i : i + take])
                self._pass_left -= take
                i += take
            elif self._goaway_left:
                take = min(self._goaway_left, n - i)
                self._goaway += view[i : i + take]
                self._goaway_left -= take
                i += take
                if not self._goaway_left:
                    goaways.append(self._finish_goaway())
            else:
                i = self._read_header(view, i, out)
        return b"".join(out), goaways

    def _read_header(self, view: memoryview, i: int, out: list[bytes | memoryview]) -> int:
        """Read a frame header at ``view[i:]``; return the index after what was consumed."""
        n = len(view)
        if self._header or n - i < _FRAME_HEADER_SIZE:
            take = min(_FRAME_HEADER_SIZE - len(self._header), n - i)
            self._header += view[i : i + take]
            i += take
            if len(self._header) < _FRAME_HEADER_SIZE:
                return i
            header = bytes(self._header)
            self._header.clear()
        else:
            header = bytes(view[i : i + _FRAME_HEADER_SIZE])
            i += _FRAME_HEADER_SIZE
        word, _flags, stream_id = _FRAME_HEADER.unpack(header)
        length, ftype = word >> 8, word & 0xFF
        if (
            ftype == _GOAWAY
            and length >= _GOAWAY_FIXED.size
            and length <= self._size
            and stream_id & 0x7FFFFFFF == 0
        ):
            self._goaway += header
            self._goaway_left = length  # >= 8: receive_data's loop completes the frame
        else:
            out.append(header)
            self._pass_left = length
        return i

    def _finish_goaway(self) -> GoAway:
        frame = bytes(self._goaway)
        self._goaway.clear()
        last, code = _GOAWAY_FIXED.unpack_from(frame, _FRAME_HEADER_SIZE)
        return GoAway(
            last_stream_id=last & 0x7FFFFFFF,
            error_code=code,
            debug_data=frame[_FRAME_HEADER_SIZE + _GOAWAY_FIXED.size :],
        )
