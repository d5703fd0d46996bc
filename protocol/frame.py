"""Remoting frames: an encoder and an incremental, sans-IO decoder.

Frame layout (all big-endian)::

    int32 length        everything after this field: 4 + header length + body length
    int32 type|hlen     high byte: serialize type; low 24 bits: header length
    header              JSON, ROCKETMQ binary or msgpack
    body                the rest

Theory of operation of :class:`FrameDecoder`: bytes are fed in any split; ``next_command``
returns one command per complete frame, ``None`` when it needs more bytes, or raises a
:class:`ProtocolError`. Errors come in two strengths:

* recoverable (``fatal`` False): the frame's extent was known, the decoder consumed it, and
  the stream is still in sync. ``HeaderError`` (bad header in a good frame) and a
  ``FrameTooLargeError`` whose header could be read (the decoder then discards the body as it
  arrives, so memory stays bounded) are recoverable; the caller answers the opaque with an
  error and keeps reading.
* fatal: the framing cannot be trusted (length < 4, header longer than the frame, unknown
  serialize type, EOF mid-frame). The decoder stays in the error state and raises the same
  error again; the caller must close the connection, as RocketMQ's Netty decoder does.

The size limit follows Netty's ``LengthFieldBasedFrameDecoder``: it bounds the whole frame
including the 4-byte length field (16 MiB by default, ``FRAME_MAX_LENGTH`` in RocketMQ).
"""

from __future__ import annotations

import struct
from typing import NoReturn

from protocol.codes import SerializeType
from protocol.command import RemotingCommand
from protocol.errors import EncodeError, FrameError, FrameTooLargeError, HeaderError, ProtocolError
from protocol.header_codec import DECODERS, ENCODERS

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
_PREFIX = struct.Struct(">II")
_MAX_HEADER = 0xFFFFFF
_MAX_LENGTH = 2**31 - 1  # Java reads the length as a signed int
_SERIALIZE_TYPES = {int(t): t for t in SerializeType}  # dict lookup: faster than the enum call


def encode_command(cmd: RemotingCommand, *, max_frame_size: int | None = None) -> bytes:
    """Encode ``cmd`` into one frame, using ``cmd.serialize_type`` for the header.

    Raises:
        EncodeError: the header cannot be encoded in that type, or the frame would exceed
            ``max_frame_size`` (when given) or the wire format's own limits.
    """
    encoder = ENCODERS.get(cmd.serialize_type)
    if encoder is None:
        raise EncodeError(f"unknown serialize type {cmd.serialize_type}")
    header = encoder(cmd)
    header_len = len(header)
    length = 4 + header_len + len(cmd.body)
    if header_len > _MAX_HEADER or length > _MAX_LENGTH:
        raise EncodeError(f"frame too large for the wire format ({length} bytes)")
    if max_frame_size is not None and length + 4 > max_frame_size:
        raise EncodeError(f"frame of {length + 4} bytes exceeds the limit of {max_frame_size}")
    prefix = _PREFIX.pack(length, (int(cmd.serialize_type) << 24) | header_len)
    return b"".join((prefix, header, cmd.body))


class FrameDecoder:
    """Incremental frame decoder: ``feed`` bytes, then call ``next_command`` until ``None``.

    Args:
        max_frame_size: largest accepted frame in bytes, length field included.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must allow at least the 8-byte prefix")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        self._skip = 0  # body bytes of an oversize frame still to discard
        self._eof = False
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed."""
        return len(self._buf) - self._pos

    @property
    def skipping(self) -> int:
        """Bytes of an oversize frame still to be discarded as they arrive."""
        return self._skip

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the peer; ``b""`` means the peer closed its side (EOF)."""
        if not data:
            self._eof = True
            return
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = data[dropped:]
            if not data:
                return
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_command(self) -> RemotingCommand | None:
        """Return the next complete command, or ``None`` if more bytes are needed.

        Raises:
            ProtocolError: see the module docstring for which errors are fatal.
        """
        if self._error is not None:
            raise self._error
        buf, pos = self._buf, self._pos
        avail = len(buf) - pos
        if avail < 8:
            if self._eof and (avail or self._skip):
                self._fail(FrameError(f"peer closed the connection mid-frame ({avail} bytes)"))
            return None
        length, word = _PREFIX.unpack_from(buf, pos)
        stype, header_len = word >> 24, word & 0xFFFFFF
        decoder = DECODERS.get(stype)
        if decoder is None or length < 4 or header_len > length - 4 or length > _MAX_LENGTH:
            self._check_prefix(length, stype, header_len)
        if length + 4 > self.max_frame_size:
            self._oversize(length, stype, header_len)
            return None
        end = pos + 4 + length
        if len(buf) < end:
            if self._eof:
                self._fail(FrameError(f"peer closed the connection mid-frame ({avail} bytes)"))
            return None
        body_start = pos + 8 + header_len
        header = buf[pos + 8 : body_start]
        body = bytes(buf[body_start:end])
        # Consume before decoding the header: a HeaderError then leaves the stream in sync.
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
        assert decoder is not None  # _check_prefix raised otherwise
        # Header's fields are in RemotingCommand's order, so the call is positional.
        return RemotingCommand(*decoder(header), body, _SERIALIZE_TYPES[stype])

    def _consume(self, end: int) -> None:
        if end == len(self._buf):
            self._buf.clear()
            self._pos = 0
        else:
            self._pos = end

    def _check_prefix(self, length: int, stype: int, header_len: int) -> None:
        if length < 4 or length > _MAX_LENGTH:
            self._fail(FrameError(f"frame length {length} is outside 4..{_MAX_LENGTH}"))
        if stype not in DECODERS:
            self._fail(FrameError(f"unknown header serialize type {stype}"))
        if header_len > length - 4:
            self._fail(FrameError(f"header length {header_len} exceeds frame length {length}"))

    def _oversize(self, length: int, stype: int, header_len: int) -> None:
        """Read the header of an oversize frame so it can be answered, then skip its body."""
        frame_size = length + 4
        limit = self.max_frame_size
        message = f"frame of {frame_size} bytes exceeds the limit of {limit}"
        if 8 + header_len > limit:
            self._fail(FrameTooLargeError(message, frame_size=frame_size, limit=limit))
        pos = self._pos
        if len(self._buf) - pos < 8 + header_len:
            if self._eof:
                self._fail(FrameTooLargeError(message, frame_size=frame_size, limit=limit))
            return
        try:
            h = DECODERS[stype](self._buf[pos + 8 : pos + 8 + header_len])
        except HeaderError:
            self._fail(FrameTooLargeError(message, frame_size=frame_size, limit=limit))
        available = len(self._buf) - pos
        self._skip = frame_size - min(frame_size, available)
        self._consume(pos + min(frame_size, available))
        raise FrameTooLargeError(
            message,
            frame_size=frame_size,
            limit=limit,
            opaque=h.opaque,
            serialize_type=stype,
            request_code=h.code,
            fatal=False,
        )

    def _fail(self, error: ProtocolError) -> NoReturn:
        self._error = error
        raise error
