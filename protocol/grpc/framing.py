"""gRPC over HTTP/2, sans-IO pieces: message framing, ``grpc-timeout`` and ``grpc-message``.

Standard library only: no sockets, no trio (:mod:`protocol.grpc.connection` uses them).

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
"""

from __future__ import annotations

import math
import re
import struct
from typing import Final, NoReturn

from protocol.errors import ProtocolError

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
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
_MAX_TIMEOUT_VALUE: Final = 99_999_999


def parse_timeout(value: str) -> float:
    """Parse a ``grpc-timeout`` header value (1 to 8 ASCII digits and a unit) into seconds.

    Units: ``H`` hours, ``M`` minutes, ``S`` seconds, ``m`` milliseconds, ``u`` microseconds,
    ``n`` nanoseconds. ``0`` of any unit is valid (the deadline has already passed).

    Raises:
        ValueError: the value does not match the grammar (empty, more than 8 digits,
            non-ASCII digits, signs, spaces, a missing or unknown unit).
    """
    # The grammar ``[0-9]{1,8}[HMSmun]`` without a regex (it runs per call): ASCII digits
    # only (str.isdigit alone takes other scripts' digits), a known unit last.
    digits, unit = value[:-1], value[-1:]
    seconds = _UNIT_SECONDS.get(unit)
    if seconds is None or not (0 < len(digits) <= 8 and digits.isascii() and digits.isdigit()):
        raise ValueError(f"malformed grpc-timeout {value!r}")
    return int(digits) * seconds


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
