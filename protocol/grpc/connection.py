"""``GrpcConnection``: the server side of one gRPC-over-HTTP/2 connection, sans-IO.

Theory of operation: this keeps the HTTP/2 state a gRPC server needs (RFC 9113: frames,
flow control, settings, pings; HPACK decoding with :mod:`protocol.grpc.hpack`, encoding
with constant blocks, :mod:`protocol.grpc.http2`) and turns it into gRPC calls, the way
:mod:`protocol.connection` does for Remoting frames. The I/O layer feeds bytes to
:meth:`receive_data`, acts on the events it returns and writes :meth:`data_to_send` after
every call. No sockets, no clocks, no tasks. (It replaced ``h2``, whose generic state machine
cost ~45 % of a unary call's CPU: events, per-frame objects, header validation and HPACK
encoding of the same response headers over and over.)

* **calls**: a request's HEADERS become :class:`CallStarted` (path, metadata, deadline from
  ``grpc-timeout``); its DATA become one :class:`CallMessage` per length-prefixed gRPC
  message; END_STREAM becomes :class:`CallHalfClosed`; RST_STREAM :class:`CallReset`. A call
  whose request breaks the gRPC framing (a compressed or oversize message, a stream ending
  mid-message, a malformed ``grpc-timeout``) is answered here with its status and comes out
  as :class:`CallReset`, so the I/O layer only ever stops the call's task.
* **responses**: :meth:`send_message` queues a message on the call's stream; what the peer's
  flow-control windows allow goes to h2 at once, the rest as the windows open (the events
  that open them are handled here). :meth:`end_call` sends the trailers after everything
  queued before them, or Trailers-Only when nothing was sent. :meth:`unsent` is what a call
  has queued beyond the windows: the I/O layer waits while it is large (back-pressure).
* **the peer's GOAWAY** comes out as :class:`PeerGoingAway`: new streams are refused from
  then on, and the open calls finish (the Node client sends GOAWAY while its Telemetry stream
  is half-open, and crashes if the connection then drops; ``h2`` used to close everything).
* **flow control**: request bytes are acknowledged (WINDOW_UPDATE) once half a window was
  read — every message is handed on whole and its size is capped; responses wait for the
  peer's windows.

Broken HTTP/2 raises :class:`GrpcConnectionError`; :meth:`data_to_send` then holds our
GOAWAY with the error code, and the connection is done. Errors confined to one stream reset
that stream (RST_STREAM) and end its call as :class:`CallReset`.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from protocol.errors import TrimqError
from protocol.grpc import http2
from protocol.grpc.codes import GrpcStatus
from protocol.grpc.framing import (
    GrpcFramingError,
    MessageDecoder,
    encode_message,
    parse_timeout,
    percent_encode,
)
from protocol.grpc.hpack import HpackDecoder, HpackError
from protocol.grpc.http2 import ErrorCode, Flag, FrameType, Setting

#: A gRPC message's prefix: compressed flag, length (:mod:`protocol.grpc.framing`).
_MESSAGE_PREFIX: Final = struct.Struct(">BI")
#: Largest message accepted in a request (the proxy's ``maxMessageSize`` is 4 MiB for a body;
#: a request carries a little more).
DEFAULT_MAX_MESSAGE_SIZE: Final = 4 * 1024 * 1024 + 64 * 1024
#: What each stream may send us before we acknowledge (the default 64 KiB would make a 4 MiB
#: send take 64 round trips).
_INITIAL_WINDOW: Final = 1024 * 1024
_CONNECTION_WINDOW: Final = 16 * 1024 * 1024
#: The largest frame we accept (advertised): big messages arrive in few frames.
_MAX_FRAME_SIZE: Final = 1024 * 1024
_MAX_HEADER_LIST_SIZE: Final = 64 * 1024
#: A header block's bytes (HEADERS + CONTINUATION) we collect before giving up on the peer.
_MAX_HEADER_BLOCK: Final = 256 * 1024
#: Characters of a status message sent (percent-encoded, at most 6 bytes each): clients
#: fail a call whose metadata exceeds their limit (8 KiB in gRPC C-core).
_MAX_STATUS_CHARS: Final = 600


class GrpcConnectionError(TrimqError):
    """The peer broke HTTP/2; close the connection after writing :meth:`data_to_send`."""


@dataclass(slots=True)
class CallStarted:
    """A new call: answer it (or end it) on ``stream_id``."""

    stream_id: int
    #: ``/package.Service/Method``.
    path: str
    #: Request headers without the pseudo-headers, names lower-case (``x-mq-client-id`` …).
    metadata: dict[str, str]
    #: Seconds the client gives the call (``grpc-timeout``), None when it sets no deadline.
    timeout_s: float | None


@dataclass(slots=True)
class CallMessage:
    """One request message of a call."""

    stream_id: int
    payload: bytes


@dataclass(slots=True)
class CallHalfClosed:
    """The client sent all its messages."""

    stream_id: int


@dataclass(slots=True)
class CallReset:
    """The call is over from the client's side: stop working on it, write nothing more."""

    stream_id: int
    #: Why, for logs: the client's RST_STREAM code, or the framing error we answered.
    reason: str


@dataclass(slots=True)
class PeerGoingAway:
    """The client sent GOAWAY: no new calls; the open ones finish."""

    last_stream_id: int
    error_code: int


#: What :meth:`GrpcConnection.receive_data` reports. Plain records, never changed once made
#: (not frozen: a frozen dataclass's ``__init__`` costs three times as much, and a call
#: makes three of them).
Event = CallStarted | CallMessage | CallHalfClosed | CallReset | PeerGoingAway


@dataclass(slots=True)
class _Stream:
    decoder: MessageDecoder
    #: What the peer may still send on this stream before our next WINDOW_UPDATE.
    recv_window: int
    #: What we may still send on this stream (the peer's window).
    send_window: int
    #: Request bytes read but not yet acknowledged.
    unacked: int = 0
    #: The client sent END_STREAM (or the call was refused while it was still sending).
    remote_closed: bool = False
    #: Response bytes the windows did not allow yet, oldest first.
    pending: deque[bytes | memoryview] = field(default_factory=deque)
    unsent: int = 0
    headers_sent: bool = False
    #: Trailers block to send once ``pending`` is empty; set when the call ends.
    trailers: bytes | None = None


class GrpcConnection:
    """The gRPC server side of one HTTP/2 connection (see the module docstring)."""

    def __init__(
        self,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_concurrent_streams: int = 1000,
    ) -> None:
        self._decoder = HpackDecoder(max_header_list_size=_MAX_HEADER_LIST_SIZE)
        self._streams: dict[int, _Stream] = {}
        #: Streams with messages queued since the last data_to_send.
        self._dirty: set[int] = set()
        #: Frames and pieces of frames to write, in order (a split message's pieces are
        #: views of it).
        self._out: list[bytes | memoryview] = []
        self._buf = bytearray()
        self._preface_left = len(http2.CONNECTION_PREFACE)
        self._seen_settings = False
        #: The highest stream id the client opened (streams below it are closed or open).
        self._last_stream_id = 0
        #: A header block being continued: (stream id, END_STREAM, fragments, size).
        self._continued: tuple[int, bool, list[bytes], int] | None = None
        self._recv_window = _CONNECTION_WINDOW
        self._recv_unacked = 0
        self._send_window = http2.DEFAULT_WINDOW
        self._peer_initial_window = http2.DEFAULT_WINDOW
        self._peer_max_frame = http2.MIN_MAX_FRAME_SIZE
        self._max_message_size = max_message_size
        self._max_concurrent_streams = max_concurrent_streams
        self.going_away = False
        self.closed = False

    # ------------------------------------------------------------------ connection
    def initiate(self) -> None:
        """Queue our connection preface (SETTINGS, a larger connection window)."""
        self._out.append(
            http2.settings_frame(
                {
                    Setting.MAX_CONCURRENT_STREAMS: self._max_concurrent_streams,
                    Setting.INITIAL_WINDOW_SIZE: _INITIAL_WINDOW,
                    Setting.MAX_FRAME_SIZE: _MAX_FRAME_SIZE,
                    Setting.MAX_HEADER_LIST_SIZE: _MAX_HEADER_LIST_SIZE,
                }
            )
        )
        self._out.append(http2.window_update(0, _CONNECTION_WINDOW - http2.DEFAULT_WINDOW))

    def data_to_send(self) -> bytes:
        """Bytes to write to the socket now (possibly empty). Messages queued since the last
        call are framed here, in as few DATA frames as the windows allow (a receive's 32
        messages are one frame, not 32)."""
        if self._dirty and not self.closed:
            for sid in self._dirty:
                stream = self._streams.get(sid)
                if stream is not None:
                    self._pump(sid, stream)
        self._dirty.clear()
        out, self._out = self._out, []
        if len(out) == 1 and type(out[0]) is bytes:
            return out[0]
        return b"".join(out)

    @property
    def open_calls(self) -> int:
        """Calls not yet ended."""
        return len(self._streams)

    def close(self, error_code: int = 0) -> None:
        """Queue our GOAWAY (the last stream we saw); nothing more is sent after it (later
        :meth:`send_message` and :meth:`end_call` do nothing)."""
        if not self.closed:
            self.closed = True
            self._out.append(http2.goaway(self._last_stream_id, error_code))

    # ------------------------------------------------------------------ reading
    def receive_data(self, data: bytes | bytearray) -> list[Event]:
        """Feed bytes from the socket; returns what they mean, in order.

        Raises:
            GrpcConnectionError: the peer broke HTTP/2 (our GOAWAY is queued).
        """
        if self.closed:
            return []
        out: list[Event] = []
        try:
            self._receive(data, out)
        except http2.ConnectionError_ as exc:
            self.close(exc.code)
            raise GrpcConnectionError(
                f"HTTP/2 {http2.code_name(exc.code)}: {exc.message}"
            ) from None
        if self._send_window > 0:
            self._pump_all()
        return out

    def _receive(self, data: bytes | bytearray, out: list[Event]) -> None:
        buf = self._buf
        if not buf and not self._preface_left and type(data) is bytes:
            # Nothing buffered (the usual read: whole frames): the frames are read from
            # ``data`` itself, a payload copied once instead of twice; an incomplete last
            # frame waits in the buffer.
            pos = self._frames(data, 0, out)
            if pos < len(data):
                buf += data[pos:]
            return
        buf += data
        pos = 0
        if self._preface_left:
            pos = self._preface(buf)
            if self._preface_left:
                del buf[:pos]
                return
        del buf[: self._frames(buf, pos, out)]

    def _frames(self, source: bytes | bytearray, pos: int, out: list[Event]) -> int:
        """Handle the whole frames in ``source`` from ``pos``; the position after the last.
        (After an error the connection is closed and its buffer no longer read.)"""
        end = len(source)
        header = http2.FRAME_HEADER
        while end - pos >= 9:
            word, flags, sid = header.unpack_from(source, pos)
            length = word >> 8
            if length > _MAX_FRAME_SIZE:
                raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, f"frame of {length} bytes")
            if end - pos - 9 < length:
                break
            # bytes() of a bytes slice is that slice; of a buffer's, a copy it may keep
            payload = bytes(source[pos + 9 : pos + 9 + length])
            pos += 9 + length
            self._frame(word & 0xFF, flags, sid & 0x7FFFFFFF, payload, out)
        return pos

    def _preface(self, buf: bytearray) -> int:
        preface = http2.CONNECTION_PREFACE
        done = len(preface) - self._preface_left
        take = min(self._preface_left, len(buf))
        if bytes(buf[:take]) != preface[done : done + take]:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 preface")
        self._preface_left -= take
        return take

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if self._continued is not None and ftype != FrameType.CONTINUATION:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "header block interrupted")
        if not self._seen_settings:
            if ftype != FrameType.SETTINGS or flags & Flag.ACK:
                raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "no SETTINGS first")
            self._seen_settings = True
        handler = _HANDLERS.get(ftype)
        if handler is not None:  # unknown frame types are ignored (RFC 9113 §4.1)
            handler(self, flags, sid, payload, out)

    # --- DATA
    def _data(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if sid == 0:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        length = len(payload)
        self._recv_window -= length
        if self._recv_window < 0:
            raise http2.ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "connection window")
        self._recv_unacked += length
        if self._recv_unacked >= _CONNECTION_WINDOW // 2:
            self._out.append(http2.window_update(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        if flags & Flag.PADDED:
            payload = _unpad(payload)
        stream = self._streams.get(sid)
        if stream is None:
            if sid > self._last_stream_id:
                raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a call we already ended: the client's late data means nothing
        if stream.remote_closed:
            self._stream_error(sid, ErrorCode.STREAM_CLOSED, "DATA after END_STREAM", out)
            return
        stream.recv_window -= length
        if stream.recv_window < 0:
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR, "stream window", out)
            return
        end_stream = bool(flags & Flag.END_STREAM)
        if not end_stream:
            stream.unacked += length
            if stream.unacked >= _INITIAL_WINDOW // 2:
                self._out.append(http2.window_update(sid, stream.unacked))
                stream.recv_window += stream.unacked
                stream.unacked = 0
        if stream.trailers is None:
            decoder = stream.decoder
            if decoder.at_boundary and len(payload) >= 5:
                # The usual request: one whole uncompressed message in one frame, nothing
                # buffered before it. Taken as is (what the decoder would give); anything
                # else goes through the decoder, with its errors.
                flag, size = _MESSAGE_PREFIX.unpack_from(payload)
                if not flag and size == len(payload) - 5 and size <= decoder.max_message_size:
                    out.append(CallMessage(sid, payload[5:]))
                    if end_stream:
                        self._remote_end(sid, out)
                    return
            try:
                decoder.receive_data(payload)
                while (message := decoder.next_message()) is not None:
                    out.append(CallMessage(sid, message))
            except GrpcFramingError as exc:
                self._fail(sid, exc.status, exc.message, out)
        if end_stream:
            self._remote_end(sid, out)

    # --- HEADERS, CONTINUATION
    def _headers(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if sid == 0 or sid % 2 == 0:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        if flags & Flag.PADDED:
            payload = _unpad(payload)
        if flags & Flag.PRIORITY:
            if len(payload) < 5:
                raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "short PRIORITY")
            payload = payload[5:]
        end_stream = bool(flags & Flag.END_STREAM)
        if flags & Flag.END_HEADERS:
            self._header_block(sid, end_stream, payload, out)
        else:
            self._continued = (sid, end_stream, [payload], len(payload))

    def _continuation(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        continued = self._continued
        if continued is None or continued[0] != sid:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        _, end_stream, parts, size = continued
        parts.append(payload)
        size += len(payload)
        if size > _MAX_HEADER_BLOCK:
            raise http2.ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        if flags & Flag.END_HEADERS:
            self._continued = None
            self._header_block(sid, end_stream, b"".join(parts), out)
        else:
            self._continued = (sid, end_stream, parts, size)

    def _header_block(self, sid: int, end_stream: bool, block: bytes, out: list[Event]) -> None:
        # Decoded whatever becomes of the stream: HPACK's table must follow the client's.
        try:
            fields = self._decoder.decode(block)
        except HpackError as exc:
            raise http2.ConnectionError_(ErrorCode.COMPRESSION_ERROR, str(exc)) from None
        stream = self._streams.get(sid)
        if stream is not None:  # trailers on a request: they end it (gRPC sends none)
            if stream.remote_closed or not end_stream:
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, "bad request trailers", out)
            else:
                self._remote_end(sid, out)
            return
        if sid <= self._last_stream_id:
            self._out.append(http2.rst_stream(sid, ErrorCode.STREAM_CLOSED))
            return
        self._last_stream_id = sid
        if self.going_away or len(self._streams) >= self._max_concurrent_streams:
            self._out.append(http2.rst_stream(sid, ErrorCode.REFUSED_STREAM))
            return
        self._request(sid, dict(fields), end_stream, out)

    def _request(
        self, sid: int, headers: dict[str, str], end_stream: bool, out: list[Event]
    ) -> None:
        self._streams[sid] = _Stream(
            MessageDecoder(self._max_message_size), _INITIAL_WINDOW, self._peer_initial_window
        )
        problem = _check_request(headers)
        timeout_s: float | None = None
        if problem is None and "grpc-timeout" in headers:
            try:
                timeout_s = parse_timeout(headers["grpc-timeout"])
            except ValueError:
                problem = (GrpcStatus.INTERNAL, "malformed grpc-timeout")
        if problem is not None:
            if end_stream:
                self._streams[sid].remote_closed = True
            self._fail(sid, problem[0], problem[1], out)
            return
        metadata = {k: v for k, v in headers.items() if not k.startswith(":")}
        out.append(CallStarted(sid, headers[":path"], metadata, timeout_s))
        if end_stream:
            self._remote_end(sid, out)

    # --- the rest
    def _priority(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if sid == 0:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error(sid, ErrorCode.FRAME_SIZE_ERROR, "PRIORITY size", out)

    def _rst_stream(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if sid == 0:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM size")
        if sid > self._last_stream_id:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on an idle stream")
        stream = self._streams.pop(sid, None)
        self._dirty.discard(sid)
        if stream is not None:  # also an ended call whose response was still going out
            code = http2.unpack_u32(payload)
            out.append(CallReset(sid, f"RST_STREAM {http2.code_name(code)}"))

    def _settings(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if sid != 0:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & Flag.ACK:
            if payload:
                raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK size")
            return
        if len(payload) % 6:
            raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS size")
        for key, value in http2.unpack_settings(payload):
            self._setting(key, value)
        self._out.append(http2.SETTINGS_ACK)

    def _setting(self, key: int, value: int) -> None:
        if key == Setting.INITIAL_WINDOW_SIZE:
            if value > http2.MAX_WINDOW:
                raise http2.ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "initial window")
            delta = value - self._peer_initial_window
            self._peer_initial_window = value
            for stream in self._streams.values():
                stream.send_window += delta
                if stream.send_window > http2.MAX_WINDOW:
                    raise http2.ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "stream window")
        elif key == Setting.MAX_FRAME_SIZE:
            if not http2.MIN_MAX_FRAME_SIZE <= value <= http2.MAX_MAX_FRAME_SIZE:
                raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "max frame size")
            self._peer_max_frame = value
        elif key == Setting.ENABLE_PUSH and value > 1:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "enable push")
        # HEADER_TABLE_SIZE: our blocks never use the dynamic table; the others concern
        # what we would send and do not apply to a server's responses.

    def _push_promise(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")

    def _ping(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if sid != 0:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "PING size")
        if not flags & Flag.ACK:
            self._out.append(http2.ping_ack(payload))

    def _goaway(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if sid != 0:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY size")
        last, code = http2.unpack_goaway(payload)
        self.going_away = True
        out.append(PeerGoingAway(last, code))

    def _window_update(self, flags: int, sid: int, payload: bytes, out: list[Event]) -> None:
        if len(payload) != 4:
            raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE size")
        increment = http2.unpack_u32(payload) & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "zero window update")
            self._send_window += increment
            if self._send_window > http2.MAX_WINDOW:
                raise http2.ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "connection window")
            return
        if sid > self._last_stream_id:
            raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE on idle stream")
        stream = self._streams.get(sid)
        if stream is None:
            return
        if increment == 0:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, "zero window update", out)
            return
        stream.send_window += increment
        if stream.send_window > http2.MAX_WINDOW:
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR, "stream window", out)

    # --- streams ending
    def _remote_end(self, sid: int, out: list[Event]) -> None:
        stream = self._streams.get(sid)
        if stream is None:
            return
        stream.remote_closed = True
        if stream.trailers is not None:
            if not stream.pending:
                del self._streams[sid]  # ended by us before; now closed on both sides
            return
        if not stream.decoder.at_boundary:
            self._fail(sid, GrpcStatus.INTERNAL, "request ended in the middle of a message", out)
            return
        out.append(CallHalfClosed(sid))

    def _stream_error(self, sid: int, code: ErrorCode, message: str, out: list[Event]) -> None:
        """A stream broke HTTP/2: reset it; its call (if still running) is reset too."""
        self._out.append(http2.rst_stream(sid, code))
        stream = self._streams.pop(sid, None)
        self._dirty.discard(sid)
        if stream is not None and stream.trailers is None:
            out.append(CallReset(sid, f"{http2.code_name(code)}: {message}"))

    def _fail(self, sid: int, status: int, message: str, out: list[Event]) -> None:
        self.end_call(sid, status, message)
        out.append(CallReset(sid, message))

    # ------------------------------------------------------------------ writing
    def is_open(self, stream_id: int) -> bool:
        """Whether a call can still be sent messages (not ended, not reset)."""
        stream = self._streams.get(stream_id)
        return stream is not None and stream.trailers is None and not self.closed

    def send_message(self, stream_id: int, payload: bytes) -> None:
        """Queue one response message (the response headers go first, once)."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None or self.closed:
            return  # the call is over (reset by the client), or the connection: nothing to send
        self._start(stream_id, stream)
        data = encode_message(payload)
        stream.pending.append(data)
        stream.unsent += len(data)
        self._dirty.add(stream_id)  # pumped by data_to_send (or end_call), with the others

    def send_messages(self, stream_id: int, payloads: Iterable[bytes]) -> None:
        """Queue several response messages (a receive's batch) as :meth:`send_message` does
        each: the stream is looked up and checked once for all of them."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None or self.closed:
            return
        self._start(stream_id, stream)
        pending = stream.pending
        size = 0
        try:  # ``payloads`` may fail midway: what it gave before is queued and counted
            for payload in payloads:
                data = encode_message(payload)
                pending.append(data)
                size += len(data)
        finally:
            stream.unsent += size
            self._dirty.add(stream_id)

    def end_call(self, stream_id: int, status: int, message: str = "") -> None:
        """End a call with its status: trailers after the queued messages, or Trailers-Only
        (one HEADERS frame) when nothing was sent. Ending an ended call does nothing."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None or self.closed:
            return
        if status == GrpcStatus.OK and not message:
            block = http2.OK_TRAILERS_BLOCK
        else:
            text = (
                message if len(message) <= _MAX_STATUS_CHARS else message[:_MAX_STATUS_CHARS] + "…"
            )
            block = http2.trailers_block(status, percent_encode(text) if text else "")
        if not stream.headers_sent:
            stream.headers_sent = True
            stream.trailers = block
            self._finish(stream_id, stream, http2.RESPONSE_HEADERS_BLOCK + block)
            return
        stream.trailers = block
        self._pump(stream_id, stream)

    def unsent(self, stream_id: int) -> int:
        """Response bytes of a call still waiting for the peer's flow-control window."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.unsent

    def _start(self, sid: int, stream: _Stream) -> None:
        if not stream.headers_sent:
            stream.headers_sent = True
            self._out.append(
                http2.headers_frames(
                    sid, http2.RESPONSE_HEADERS_BLOCK, self._peer_max_frame, end_stream=False
                )
            )

    def _pump_all(self) -> None:
        for sid, stream in list(self._streams.items()):
            if stream.pending or (stream.trailers is not None and stream.headers_sent):
                self._pump(sid, stream)

    def _pump(self, sid: int, stream: _Stream) -> None:
        """Frame what the windows allow; the trailers once nothing is left."""
        pending = stream.pending
        out = self._out
        while pending:
            room = min(self._send_window, stream.send_window, self._peer_max_frame)
            if room <= 0:
                return
            parts: list[bytes | memoryview] = []
            size = 0
            while pending and size < room:  # as many queued messages as one frame holds
                chunk = pending[0]
                take = room - size
                if len(chunk) <= take:
                    pending.popleft()
                else:  # split (no copy): the rest waits for the window
                    view = memoryview(chunk)
                    pending[0] = view[take:]
                    chunk = view[:take]
                parts.append(chunk)
                size += len(chunk)
            out.append(http2.frame_header(FrameType.DATA, 0, sid, size))
            out += parts
            self._send_window -= size
            stream.send_window -= size
            stream.unsent -= size
        if stream.trailers is not None:
            self._finish(sid, stream, stream.trailers)

    def _finish(self, sid: int, stream: _Stream, block: bytes) -> None:
        self._out.append(http2.headers_frames(sid, block, self._peer_max_frame, end_stream=True))
        # Forgotten: a client still sending a request we answered may go on (its late frames
        # are read and ignored; the connection window is still given back). No RST_STREAM:
        # clients close their side once they have the trailers.
        self._streams.pop(sid, None)


_Handler = Callable[[GrpcConnection, int, int, bytes, list[Event]], None]
#: Frame type → handler (an int key: the type byte as read).
_HANDLERS: Final[dict[int, _Handler]] = {
    FrameType.DATA: GrpcConnection._data,
    FrameType.HEADERS: GrpcConnection._headers,
    FrameType.PRIORITY: GrpcConnection._priority,
    FrameType.RST_STREAM: GrpcConnection._rst_stream,
    FrameType.SETTINGS: GrpcConnection._settings,
    FrameType.PUSH_PROMISE: GrpcConnection._push_promise,
    FrameType.PING: GrpcConnection._ping,
    FrameType.GOAWAY: GrpcConnection._goaway,
    FrameType.WINDOW_UPDATE: GrpcConnection._window_update,
    FrameType.CONTINUATION: GrpcConnection._continuation,
}


def _unpad(payload: bytes) -> bytes:
    """A PADDED frame's content (RFC 9113 §6.1)."""
    if not payload:
        raise http2.ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "padded frame without length")
    pad = payload[0]
    if pad >= len(payload):
        raise http2.ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padding exceeds the frame")
    return payload[1 : len(payload) - pad]


def _check_request(headers: dict[str, str]) -> tuple[int, str] | None:
    """What makes a request no gRPC call, as (gRPC status, message)."""
    if headers.get(":method") != "POST":
        return GrpcStatus.UNIMPLEMENTED, f"method {headers.get(':method')} is not POST"
    if not headers.get("content-type", "").startswith("application/grpc"):
        return GrpcStatus.UNIMPLEMENTED, "content-type is not application/grpc"
    if not headers.get(":path", "").startswith("/"):
        return GrpcStatus.UNIMPLEMENTED, "no :path"
    encoding = headers.get("grpc-encoding", "identity")
    if encoding != "identity":
        return GrpcStatus.UNIMPLEMENTED, f"grpc-encoding {encoding} is not supported"
    return None
