"""``GrpcConnection``: the server side of one gRPC-over-HTTP/2 connection, sans-IO.

Theory of operation: ``h2`` keeps the HTTP/2 state (frames, HPACK, flow control, settings,
pings); this wraps it into gRPC calls, the way :mod:`protocol.connection` wraps Remoting
frames. The I/O layer feeds bytes to :meth:`receive_data`, acts on the events it returns and
writes :meth:`data_to_send` after every call. No sockets, no clocks, no tasks.

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
* **the peer's GOAWAY**: ``h2`` closes its whole state machine when it receives one
  (python-hyper/h2#1181), which would fail every call still open — the Node client sends
  GOAWAY while its Telemetry stream is half-open, and crashes when the connection then drops.
  A :class:`~protocol.grpc.framing.FrameSplitter` withholds GOAWAY frames from h2; the peer's
  intent comes out as :class:`PeerGoingAway`, new streams are refused from then on, and the
  open calls finish.

Broken HTTP/2 raises :class:`GrpcConnectionError`; :meth:`data_to_send` then holds h2's own
GOAWAY, and the connection is done.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from protocol.errors import TrimqError
from protocol.grpc.codes import GrpcStatus
from protocol.grpc.framing import (
    FrameSplitter,
    GrpcFramingError,
    MessageDecoder,
    encode_message,
    parse_timeout,
    percent_encode,
)

#: Largest message accepted in a request (the proxy's ``maxMessageSize`` is 4 MiB for a body;
#: a request carries a little more).
DEFAULT_MAX_MESSAGE_SIZE: Final = 4 * 1024 * 1024 + 64 * 1024
#: What each stream may send us before we acknowledge (h2's default is 64 KiB; a 4 MiB send
#: would otherwise take 64 round trips).
_INITIAL_WINDOW: Final = 1024 * 1024
_CONNECTION_WINDOW: Final = 16 * 1024 * 1024
_RESPONSE_HEADERS: Final = ((":status", "200"), ("content-type", "application/grpc"))


class GrpcConnectionError(TrimqError):
    """The peer broke HTTP/2; close the connection after writing :meth:`data_to_send`."""


@dataclass(frozen=True, slots=True)
class CallStarted:
    """A new call: answer it (or end it) on ``stream_id``."""

    stream_id: int
    #: ``/package.Service/Method``.
    path: str
    #: Request headers without the pseudo-headers, names lower-case (``x-mq-client-id`` …).
    metadata: dict[str, str]
    #: Seconds the client gives the call (``grpc-timeout``), None when it sets no deadline.
    timeout_s: float | None


@dataclass(frozen=True, slots=True)
class CallMessage:
    """One request message of a call."""

    stream_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class CallHalfClosed:
    """The client sent all its messages."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class CallReset:
    """The call is over from the client's side: stop working on it, write nothing more."""

    stream_id: int
    #: Why, for logs: the client's RST_STREAM code, or the framing error we answered.
    reason: str


@dataclass(frozen=True, slots=True)
class PeerGoingAway:
    """The client sent GOAWAY: no new calls; the open ones finish."""

    last_stream_id: int
    error_code: int


Event = CallStarted | CallMessage | CallHalfClosed | CallReset | PeerGoingAway


@dataclass(slots=True)
class _Stream:
    decoder: MessageDecoder
    #: Response bytes h2 could not take yet (flow control), oldest first.
    pending: deque[memoryview] = field(default_factory=deque)
    unsent: int = 0
    headers_sent: bool = False
    #: Trailers to send once ``pending`` is empty.
    trailers: list[tuple[str, str]] | None = None


class GrpcConnection:
    """The gRPC server side of one HTTP/2 connection (see the module docstring)."""

    def __init__(
        self,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_concurrent_streams: int = 1000,
    ) -> None:
        config = h2.config.H2Configuration(
            client_side=False,
            # Bytes, decoded here: h2's own decoding raises UnicodeDecodeError out of
            # receive_data on a header that is not UTF-8 (any peer can send one).
            header_encoding=None,
            # Our own headers are well-formed; checking them costs ~10 % of a unary call.
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
            # h2's checks of request headers cost another ~8 % (profiled); what a gRPC call
            # needs of them (:method, :path, content-type, grpc-*) is checked here, and any
            # other header is only metadata.
            validate_inbound_headers=False,
            normalize_inbound_headers=False,
        )
        self._h2 = h2.connection.H2Connection(config)
        self._splitter = FrameSplitter()
        self._streams: dict[int, _Stream] = {}
        #: Streams with messages queued since the last data_to_send.
        self._dirty: set[int] = set()
        self._max_message_size = max_message_size
        self._max_concurrent_streams = max_concurrent_streams
        self.going_away = False
        self.closed = False

    # ------------------------------------------------------------------ connection
    def initiate(self) -> None:
        """Queue our connection preface (SETTINGS, a larger connection window)."""
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self._max_concurrent_streams,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _INITIAL_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
            },
        )
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(_CONNECTION_WINDOW - 65535)

    def data_to_send(self) -> bytes:
        """Bytes to write to the socket now (possibly empty). Messages queued since the last
        call go to h2 here, as few DATA frames as the windows allow (a receive's 32 messages
        are one frame, not 32)."""
        if self._dirty and not self.closed:  # after a GOAWAY h2 takes nothing more
            for sid in self._dirty:
                stream = self._streams.get(sid)
                if stream is not None:
                    self._pump(sid, stream)
        self._dirty.clear()
        return self._h2.data_to_send()

    @property
    def open_calls(self) -> int:
        """Calls not yet ended."""
        return len(self._streams)

    def close(self, error_code: int = 0) -> None:
        """Queue our GOAWAY (the last stream we saw); nothing more is sent after it (later
        :meth:`send_message` and :meth:`end_call` do nothing)."""
        if not self.closed:
            self.closed = True
            self._h2.close_connection(error_code)

    # ------------------------------------------------------------------ reading
    def receive_data(self, data: bytes | bytearray) -> list[Event]:
        """Feed bytes from the socket; returns what they mean, in order.

        Raises:
            GrpcConnectionError: the peer broke HTTP/2.
        """
        passed, goaways = self._splitter.receive_data(data)
        try:
            h2_events = self._h2.receive_data(passed) if passed else []
        except h2.exceptions.ProtocolError as exc:
            self.closed = True
            raise GrpcConnectionError(f"HTTP/2 protocol error: {exc}") from None
        out: list[Event] = []
        for ev in h2_events:
            self._handle(ev, out)
        for goaway in goaways:
            self.going_away = True
            out.append(PeerGoingAway(goaway.last_stream_id, goaway.error_code))
        self._pump_all()
        return out

    def _handle(self, ev: h2.events.Event, out: list[Event]) -> None:
        if isinstance(ev, h2.events.DataReceived):
            self._data(ev, out)
        elif isinstance(ev, h2.events.RequestReceived):
            self._request(ev, out)
        elif isinstance(ev, h2.events.StreamEnded):
            self._half_closed(ev.stream_id, out)
        elif isinstance(ev, h2.events.StreamReset):
            if self._streams.pop(ev.stream_id, None) is not None:
                out.append(CallReset(ev.stream_id, f"RST_STREAM {_code_name(ev.error_code)}"))
        elif isinstance(ev, h2.events.ConnectionTerminated):  # only if a GOAWAY slipped by
            self.going_away = True
            out.append(PeerGoingAway(ev.last_stream_id or 0, int(ev.error_code or 0)))
        # WindowUpdated / RemoteSettingsChanged: the pump after the batch uses the new
        # windows; pings and settings acks are answered by h2 itself.

    def _request(self, ev: h2.events.RequestReceived, out: list[Event]) -> None:
        sid = ev.stream_id
        headers = {_text(k): _text(v) for k, v in ev.headers or ()}
        if self.going_away:
            self._h2.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        self._streams[sid] = _Stream(MessageDecoder(self._max_message_size))
        problem = _check_request(headers)
        timeout_s: float | None = None
        if problem is None and "grpc-timeout" in headers:
            try:
                timeout_s = parse_timeout(headers["grpc-timeout"])
            except ValueError:
                problem = (GrpcStatus.INTERNAL, "malformed grpc-timeout")
        if problem is not None:
            self.end_call(sid, problem[0], problem[1])
            out.append(CallReset(sid, problem[1]))
            return
        metadata = {k: v for k, v in headers.items() if not k.startswith(":")}
        out.append(CallStarted(sid, headers[":path"], metadata, timeout_s))
        if ev.stream_ended:
            self._half_closed(sid, out)

    def _data(self, ev: h2.events.DataReceived, out: list[Event]) -> None:
        sid = ev.stream_id
        # Acknowledged at once: every message is handed on whole, and its size is capped.
        if ev.flow_controlled_length:
            self._h2.acknowledge_received_data(ev.flow_controlled_length, sid)
        stream = self._streams.get(sid)
        if stream is None or stream.trailers is not None:
            return  # a call we already ended: the client's late data means nothing
        try:
            stream.decoder.receive_data(ev.data or b"")
            while (payload := stream.decoder.next_message()) is not None:
                out.append(CallMessage(sid, payload))
        except GrpcFramingError as exc:
            self._fail(sid, exc.status, exc.message, out)

    def _half_closed(self, sid: int, out: list[Event]) -> None:
        stream = self._streams.get(sid)
        if stream is None or stream.trailers is not None:
            return
        if not stream.decoder.at_boundary:
            self._fail(sid, GrpcStatus.INTERNAL, "request ended in the middle of a message", out)
            return
        out.append(CallHalfClosed(sid))

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
        stream.pending.append(memoryview(data))
        stream.unsent += len(data)
        self._dirty.add(stream_id)  # pumped by data_to_send (or end_call), with the others

    def end_call(self, stream_id: int, status: int, message: str = "") -> None:
        """End a call with its status: trailers after the queued messages, or Trailers-Only
        (one HEADERS frame) when nothing was sent. Ending an ended call does nothing."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.trailers is not None or self.closed:
            return  # after our GOAWAY (or a broken connection) h2 sends nothing more
        trailers = [("grpc-status", str(int(status)))]
        if message:
            trailers.append(("grpc-message", percent_encode(message)))
        if not stream.headers_sent:
            stream.headers_sent = True
            stream.trailers = []
            self._finish(stream_id, [*_RESPONSE_HEADERS, *trailers])
            return
        stream.trailers = trailers
        self._pump(stream_id, stream)

    def unsent(self, stream_id: int) -> int:
        """Response bytes of a call still waiting for the peer's flow-control window."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.unsent

    def _start(self, sid: int, stream: _Stream) -> None:
        if not stream.headers_sent:
            stream.headers_sent = True
            self._h2.send_headers(sid, _RESPONSE_HEADERS)

    def _pump_all(self) -> None:
        for sid, stream in list(self._streams.items()):
            if stream.pending or stream.trailers:
                self._pump(sid, stream)

    def _pump(self, sid: int, stream: _Stream) -> None:
        """Hand h2 what the windows allow; the trailers once nothing is left."""
        h2conn = self._h2
        pending = stream.pending
        try:
            while pending:
                room = min(h2conn.local_flow_control_window(sid), h2conn.max_outbound_frame_size)
                if room <= 0:
                    return
                parts: list[memoryview] = []
                size = 0
                while pending and size < room:  # as many queued messages as one frame holds
                    chunk = pending[0]
                    take = room - size
                    if len(chunk) <= take:
                        pending.popleft()
                    else:
                        pending[0] = chunk[take:]
                        chunk = chunk[:take]
                    parts.append(chunk)
                    size += len(chunk)
                h2conn.send_data(sid, parts[0] if len(parts) == 1 else b"".join(parts))
                stream.unsent -= size
        except h2.exceptions.StreamClosedError:
            self._streams.pop(sid, None)  # reset under us: its events follow
            return
        if stream.trailers is not None:
            self._finish(sid, stream.trailers)

    def _finish(self, sid: int, headers: list[tuple[str, str]]) -> None:
        # Forgotten first: an ended call's late frames find no stream (see _data).
        self._streams.pop(sid, None)
        with contextlib.suppress(h2.exceptions.StreamClosedError):  # reset meanwhile
            self._h2.send_headers(sid, headers, end_stream=True)


def _code_name(code: int | None) -> str:
    """An HTTP/2 error code as ``CANCEL (8)`` (``str()`` of the IntEnum gives just ``8``)."""
    number = int(code or 0)
    try:
        return f"{h2.errors.ErrorCodes(number).name} ({number})"
    except ValueError:
        return str(number)


def _text(value: bytes | str) -> str:
    """A header name or value as text; bytes that are not UTF-8 become U+FFFD (gRPC metadata
    is ASCII, so only a broken or hostile peer sends them, and it gets no crash for it)."""
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


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
