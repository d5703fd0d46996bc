"""A small gRPC test client on trio and h2: unary, server-streaming and bidi calls, resets and
raw frames, over TCP (plaintext or TLS) or any trio stream.

It is deliberately independent of the server's sans-IO layer: it frames and unframes gRPC
messages itself (5-byte prefix) and reads the status from the trailers, so a bug in
``protocol.grpc`` cannot cancel itself out here. One background task reads the connection and
files h2's events per stream; every wait is bounded (:attr:`GrpcClient.reply_timeout` or a
per-call ``timeout``), so a missing answer fails the test instead of hanging it.

Usage::

    async with open_grpc_client(port) as client:
        reply = await client.unary("QueryRoute", request)
        assert reply.status == 0
        async with client.open_call("Telemetry", grpc_timeout="10S") as call:
            await call.send(command)
            answer = await call.receive()
"""

from __future__ import annotations

import ssl
import struct
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from protocol.grpc import schema
from protocol.grpc.schema import SERVICE_NAME

#: How long a reply, a window or a close is awaited by default.
REPLY_TIMEOUT = 10.0
CLIENT_ID = "test-host@4242@0@grpc-test"
_PREFIX = struct.Struct(">BI")


def frame(payload: bytes, *, compressed: bool = False) -> bytes:
    """One gRPC length-prefixed message."""
    return _PREFIX.pack(1 if compressed else 0, len(payload)) + payload


def path_of(method: str) -> str:
    """``/apache.rocketmq.v2.MessagingService/<method>`` unless ``method`` is a path."""
    return method if method.startswith("/") else f"/{SERVICE_NAME}/{method}"


def payload_of(message: Any) -> bytes:
    """A protobuf message's bytes (bytes pass unchanged)."""
    if isinstance(message, bytes | bytearray):
        return bytes(message)
    data: bytes = message.SerializeToString()
    return data


class CallFailedError(Exception):
    """The connection ended before the call did."""


@dataclass(eq=False)
class ClientCall:
    """One call's state as the client sees it (filed by the reader)."""

    client: GrpcClient
    stream_id: int
    #: Response headers (the Trailers-Only HEADERS frame counts as headers and trailers).
    headers: dict[str, str] | None = None
    trailers: dict[str, str] | None = None
    #: Decoded response messages not yet taken by :meth:`receive`, and all of them.
    inbox: list[bytes] = field(default_factory=list)
    messages: list[bytes] = field(default_factory=list)
    #: The server's RST_STREAM code, if it reset the stream.
    reset_code: int | None = None
    #: The response stream ended (trailers, a reset or the connection's end).
    done: bool = False
    trailers_only: bool = False
    #: How many DATA bytes arrived after the trailers (must stay 0).
    data_after_trailers: int = 0
    _buf: bytearray = field(default_factory=bytearray)

    # ------------------------------------------------------------------ sending
    async def send(self, message: Any, *, end: bool = False) -> None:
        """Send one request message (and half-close with ``end``)."""
        await self.client.send_data(self.stream_id, frame(payload_of(message)), end=end)

    async def close_send(self) -> None:
        """Half-close: the client sends nothing more."""
        await self.client.send_data(self.stream_id, b"", end=True)

    async def reset(self, code: int = h2.errors.ErrorCodes.CANCEL) -> None:
        """RST_STREAM this call."""
        await self.client.reset(self.stream_id, code)

    # ------------------------------------------------------------------ receiving
    async def receive(self, timeout: float | None = None) -> bytes | None:  # noqa: ASYNC109
        """The next response message; None once the response stream ended."""
        with trio.fail_after(self.client.reply_timeout if timeout is None else timeout):
            while not self.inbox:
                if self.done:
                    return None
                await self.client.changed()
        return self.inbox.pop(0)

    async def wait_headers(self, timeout: float | None = None) -> dict[str, str]:  # noqa: ASYNC109
        """Wait for the response headers."""
        with trio.fail_after(self.client.reply_timeout if timeout is None else timeout):
            while self.headers is None:
                if self.done:
                    raise CallFailedError(f"stream {self.stream_id} ended without headers")
                await self.client.changed()
        return self.headers

    async def result(self, timeout: float | None = None) -> Reply:  # noqa: ASYNC109
        """Wait until the response stream ends; the call's outcome."""
        with trio.fail_after(self.client.reply_timeout if timeout is None else timeout):
            while not self.done:
                await self.client.changed()
        return self.reply()

    def reply(self) -> Reply:
        """The outcome so far."""
        trailers = self.trailers or {}
        status = trailers.get("grpc-status")
        return Reply(
            status=None if status is None else int(status),
            message=trailers.get("grpc-message", ""),
            messages=list(self.messages),
            headers=self.headers or {},
            trailers=trailers,
            trailers_only=self.trailers_only,
            reset_code=self.reset_code,
            data_after_trailers=self.data_after_trailers,
            partial=len(self._buf),
        )

    def _data(self, data: bytes) -> None:
        if self.trailers is not None:
            self.data_after_trailers += len(data)
        self._buf += data
        while len(self._buf) >= _PREFIX.size:
            flag, length = _PREFIX.unpack_from(self._buf)
            assert flag == 0, "the server never compresses"
            if len(self._buf) < _PREFIX.size + length:
                break
            message = bytes(self._buf[_PREFIX.size : _PREFIX.size + length])
            del self._buf[: _PREFIX.size + length]
            self.inbox.append(message)
            self.messages.append(message)


@dataclass(frozen=True)
class Reply:
    """A call's outcome: grpc-status and grpc-message (still percent-encoded), the messages."""

    status: int | None
    message: str
    messages: list[bytes]
    headers: dict[str, str]
    trailers: dict[str, str]
    trailers_only: bool
    reset_code: int | None
    data_after_trailers: int = 0
    #: Bytes of an incomplete message left at the end (must be 0).
    partial: int = 0

    def decode(self, cls: Any) -> list[Any]:
        """The messages parsed as ``cls``."""
        return [cls.FromString(m) for m in self.messages]

    def one(self, cls: Any) -> Any:
        """The single message of a unary call, parsed as ``cls``; fails on a non-OK status."""
        assert self.status == 0, (self.status, self.message)
        assert len(self.messages) == 1, self.messages
        return cls.FromString(self.messages[0])


class GrpcClient:
    """One HTTP/2 connection to a gRPC server (see the module docstring)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        initial_window: int | None = None,
        connection_window: int | None = None,
        auto_ack: bool = True,
    ) -> None:
        self.stream = stream
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config)
        self.calls: dict[int, ClientCall] = {}
        #: Set when the server closed the connection (EOF, reset or a broken frame).
        self.closed = trio.Event()
        #: The server's GOAWAY, if any.
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.reply_timeout = REPLY_TIMEOUT
        #: Acknowledge received DATA at once (False: the test opens the windows itself).
        self.auto_ack = auto_ack
        self._initial_window = initial_window
        self._connection_window = connection_window
        #: The server's bytes h2 could not parse (a torn or broken stream), if any.
        self.error: h2.exceptions.ProtocolError | None = None
        self._changed = trio.Event()
        # Writes go through a writer task, in order; the reader never waits for one (a
        # reader blocked on a write can deadlock with a server that does the same).
        self._out: list[bytes] = []
        self._queued = 0
        self._written = 0
        self._has_out = trio.Event()
        self._progress = trio.Event()
        self._unacked: dict[int, int] = {}
        self._reading = trio.Event()
        self._reading.set()

    # ------------------------------------------------------------------ connection
    async def start(self) -> None:
        """Send the preface (with our settings)."""
        if self._initial_window is not None:
            self.h2.local_settings = h2.settings.Settings(
                client=True,
                initial_values={
                    h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: self._initial_window,
                },
            )
        self.h2.initiate_connection()
        if self._connection_window is not None:
            self.h2.increment_flow_control_window(self._connection_window - 65535)
        await self.flush()

    async def flush(self) -> None:
        """Write what h2 has queued."""
        await self._wait_written(self._queue())

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (frames h2 would not send, garbage)."""
        self._out.append(data)
        self._queued += len(data)
        self._has_out.set()
        await self._wait_written(self._queued)

    async def changed(self) -> None:
        """Wait for the next read (or the connection's end)."""
        if self.closed.is_set():
            raise CallFailedError("connection closed")
        await self._changed.wait()

    async def wait_closed(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """Wait until the server closes the connection."""
        with trio.fail_after(self.reply_timeout if timeout is None else timeout):
            await self.closed.wait()

    def pause_reading(self) -> None:
        """Stop reading the socket (the server's writes then block once buffers are full)."""
        if self._reading.is_set():
            self._reading = trio.Event()

    def resume_reading(self) -> None:
        """Read the socket again."""
        self._reading.set()

    async def open_window(self, stream_id: int) -> None:
        """Acknowledge what was received on ``stream_id`` (with ``auto_ack=False``)."""
        size = self._unacked.pop(stream_id, 0)
        if size:
            self.h2.acknowledge_received_data(size, stream_id)
            await self.flush()

    # ------------------------------------------------------------------ calls
    def headers_for(
        self,
        method: str,
        *,
        grpc_timeout: str | None = None,
        client_id: str | None = CLIENT_ID,
        metadata: Mapping[str, str] | None = None,
        overrides: Mapping[str, str | None] | None = None,
    ) -> list[tuple[str, str]]:
        """A gRPC request's headers; ``overrides`` replaces (None: drops) any of them."""
        headers: dict[str, str | None] = {
            ":method": "POST",
            ":scheme": "http",
            ":path": path_of(method),
            ":authority": "127.0.0.1",
            "content-type": "application/grpc",
            "te": "trailers",
        }
        if grpc_timeout is not None:
            headers["grpc-timeout"] = grpc_timeout
        if client_id is not None:
            headers["x-mq-client-id"] = client_id
        headers.update(metadata or {})
        headers.update(overrides or {})
        return [(k, v) for k, v in headers.items() if v is not None]

    async def start_call(
        self,
        method: str,
        *,
        grpc_timeout: str | None = None,
        client_id: str | None = CLIENT_ID,
        metadata: Mapping[str, str] | None = None,
        overrides: Mapping[str, str | None] | None = None,
        end: bool = False,
    ) -> ClientCall:
        """Send a call's headers (``end``: and half-close at once); its :class:`ClientCall`."""
        headers = self.headers_for(
            method,
            grpc_timeout=grpc_timeout,
            client_id=client_id,
            metadata=metadata,
            overrides=overrides,
        )
        sid = self.h2.get_next_available_stream_id()
        call = ClientCall(self, sid)
        self.calls[sid] = call
        self.h2.send_headers(sid, headers, end_stream=end)
        await self._wait_written(self._queue())
        return call

    async def start_call_raw(
        self, headers: list[tuple[bytes, bytes]], *, end: bool = False
    ) -> ClientCall:
        """Send headers exactly as given (bytes: ones h2 would not encode from text)."""
        sid = self.h2.get_next_available_stream_id()
        call = ClientCall(self, sid)
        self.calls[sid] = call
        self.h2.send_headers(sid, headers, end_stream=end)
        await self._wait_written(self._queue())
        return call

    @asynccontextmanager
    async def open_call(self, method: str, **kwargs: Any) -> AsyncIterator[ClientCall]:
        """A bidi/streaming call (see :meth:`start_call`); reset on exit if still open."""
        call = await self.start_call(method, **kwargs)
        try:
            yield call
        finally:
            if not call.done and not self.closed.is_set():
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(1),
                    suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                ):
                    await call.reset()

    async def call(
        self,
        method: str,
        *messages: Any,
        grpc_timeout: str | None = None,
        client_id: str | None = CLIENT_ID,
        metadata: Mapping[str, str] | None = None,
        overrides: Mapping[str, str | None] | None = None,
        wait: float | None = None,
    ) -> Reply:
        """Send ``messages`` and half-close; wait for the whole response (``wait`` bounds it)."""
        call = await self.start_call(
            method,
            grpc_timeout=grpc_timeout,
            client_id=client_id,
            metadata=metadata,
            overrides=overrides,
        )
        body = b"".join(frame(payload_of(m)) for m in messages)
        await self.send_data(call.stream_id, body, end=True)
        return await call.result(wait)

    async def unary(self, method: str, request: Any, **kwargs: Any) -> Reply:
        """A unary call."""
        return await self.call(method, request, **kwargs)

    async def server_streaming(self, method: str, request: Any, **kwargs: Any) -> Reply:
        """A server-streaming call: every message and the trailers."""
        return await self.call(method, request, **kwargs)

    async def send_data(self, stream_id: int, data: bytes, *, end: bool = False) -> None:
        """Send DATA on a stream within the server's windows (waits for them)."""
        view = memoryview(data)
        with trio.fail_after(self.reply_timeout):
            while True:
                room = min(
                    self.h2.local_flow_control_window(stream_id),
                    self.h2.max_outbound_frame_size,
                )
                take = min(room, len(view))
                last = take == len(view)
                if take or last:
                    self.h2.send_data(stream_id, bytes(view[:take]), end_stream=end and last)
                    view = view[take:]
                    await self._wait_written(self._queue())
                if not view:
                    return
                if not take:
                    await self.changed()  # no window: wait for the server's update

    async def reset(self, stream_id: int, code: int = h2.errors.ErrorCodes.CANCEL) -> None:
        """RST_STREAM ``stream_id``."""
        self.h2.reset_stream(stream_id, code)
        await self._wait_written(self._queue())

    # ------------------------------------------------------------------ writing
    def _queue(self) -> int:
        """Hand what h2 has to the writer; the total handed."""
        data = self.h2.data_to_send()
        if data:
            self._out.append(data)
            self._queued += len(data)
            self._has_out.set()
        return self._queued

    async def _wait_written(self, target: int) -> None:
        with trio.fail_after(self.reply_timeout):
            while self._written < target:
                if self.closed.is_set():
                    raise trio.ClosedResourceError("connection closed")
                await self._progress.wait()

    async def _write(self) -> None:
        try:
            while True:
                if not self._out:
                    await self._has_out.wait()
                    self._has_out = trio.Event()
                    continue
                data = b"".join(self._out)
                self._out.clear()
                await self.stream.send_all(data)
                self._written += len(data)
                self._progress.set()
                self._progress = trio.Event()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed.set()
            self._progress.set()

    # ------------------------------------------------------------------ reading
    async def _read(self) -> None:
        try:
            while True:
                await self._reading.wait()
                try:
                    data = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    self.error = exc
                    return
                for ev in events:
                    self._file(ev)
                self._queue()
                self._wake()
        finally:
            for call in self.calls.values():
                call.done = True
            self.closed.set()
            self._progress.set()
            self._wake()

    def _file(self, ev: h2.events.Event) -> None:
        sid = getattr(ev, "stream_id", None)
        call = self.calls.get(sid) if sid is not None else None
        if isinstance(ev, h2.events.ResponseReceived) and call is not None:
            call.headers = _headers(ev.headers)
            if ev.stream_ended is not None:
                call.trailers_only = True
                call.trailers = call.headers
        elif isinstance(ev, h2.events.DataReceived) and call is not None:
            size = ev.flow_controlled_length or 0
            if self.auto_ack and size:
                self.h2.acknowledge_received_data(size, ev.stream_id)
            elif size:
                self._unacked[ev.stream_id] = self._unacked.get(ev.stream_id, 0) + size
            call._data(ev.data or b"")
        elif isinstance(ev, h2.events.TrailersReceived) and call is not None:
            call.trailers = _headers(ev.headers)
        elif isinstance(ev, h2.events.StreamEnded) and call is not None:
            call.done = True
        elif isinstance(ev, h2.events.StreamReset) and call is not None:
            call.reset_code = int(ev.error_code or 0)
            call.done = True
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = ev

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


def _headers(raw: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw or ()}


@asynccontextmanager
async def attach_grpc_client(stream: trio.abc.Stream, **kwargs: Any) -> AsyncIterator[GrpcClient]:
    """A client on an open ``stream`` (preface sent, reading in the background); the stream
    is closed on exit."""
    client = GrpcClient(stream, **kwargs)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read)
            nursery.start_soon(client._write)
            await client.start()
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


def client_ssl_context(
    ca_pem: bytes | None = None, *, alpn: tuple[str, ...] = ("h2",)
) -> ssl.SSLContext:
    """A client TLS context trusting ``ca_pem`` (None: no verification at all)."""
    context = ssl.create_default_context()
    if ca_pem is None:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.load_verify_locations(cadata=ca_pem.decode("ascii"))
    context.set_alpn_protocols(list(alpn))
    return context


async def connect_tls(
    port: int,
    context: ssl.SSLContext,
    *,
    host: str = "127.0.0.1",
    server_hostname: str = "localhost",
) -> trio.SSLStream[trio.SocketStream]:
    """A TLS stream to ``host:port``, handshake done."""
    tcp = await trio.open_tcp_stream(host, port)
    stream = trio.SSLStream(tcp, context, server_hostname=server_hostname)
    try:
        await stream.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(tcp)
        raise
    return stream


@asynccontextmanager
async def open_grpc_client(
    port: int | None,
    *,
    host: str = "127.0.0.1",
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str = "localhost",
    **kwargs: Any,
) -> AsyncIterator[GrpcClient]:
    """Connect a client over TCP (TLS with ``ssl_context``); closed on exit. ``port`` may be
    a ``BrokerHandle.grpc_port`` (None: the broker has no gRPC front end, a test error)."""
    assert port is not None, "no gRPC port"
    stream: trio.abc.Stream
    if ssl_context is None:
        stream = await trio.open_tcp_stream(host, port)
    else:
        stream = await connect_tls(port, ssl_context, host=host, server_hostname=server_hostname)
    async with attach_grpc_client(stream, **kwargs) as client:
        yield client


# ---------------------------------------------------------------- v2 requests
def send_request(topic: str, body: bytes = b"hello", tag: str = "TagA") -> Any:
    """A SendMessageRequest with one message, as the official clients build it."""
    req = schema.SendMessageRequest()
    message = req.messages.add()
    message.topic.name = topic
    message.body = body
    system = message.system_properties
    system.tag = tag
    system.message_id = uuid.uuid4().hex.upper() + "01"
    system.message_type = schema.MessageType.NORMAL
    system.body_encoding = schema.Encoding.IDENTITY
    return req


def route_request(topic: str) -> Any:
    """A QueryRouteRequest."""
    req = schema.QueryRouteRequest()
    req.topic.name = topic
    return req


def receive_request(
    topic: str,
    group: str,
    *,
    invisible_s: int = 30,
    poll_s: int | None = 20,
    auto_renew: bool = False,
) -> Any:
    """A SimpleConsumer's ReceiveMessageRequest (any queue, tag ``*``, batch 32); with
    ``auto_renew`` a PushConsumer's (no invisible duration)."""
    req = schema.ReceiveMessageRequest()
    req.group.name = group
    req.message_queue.topic.name = topic
    req.message_queue.id = -1
    req.filter_expression.type = schema.FilterType.TAG
    req.filter_expression.expression = "*"
    req.batch_size = 32
    if auto_renew:
        req.auto_renew = True
    else:
        req.invisible_duration.seconds = invisible_s
    if poll_s is not None:
        req.long_polling_timeout.seconds = poll_s
    return req


def settings_command(group: str, topic: str) -> Any:
    """A SimpleConsumer's Telemetry settings command."""
    command = schema.TelemetryCommand()
    settings = command.settings
    settings.client_type = schema.ClientType.SIMPLE_CONSUMER
    settings.subscription.group.name = group
    entry = settings.subscription.subscriptions.add()
    entry.topic.name = topic
    entry.expression.type = schema.FilterType.TAG
    entry.expression.expression = "*"
    return command


async def wait_parked(handle: Any, count: int = 1) -> None:
    """Until ``count`` pops are parked in the broker's hub (polled: the hub has no event to
    wait on; bounded by the caller's fail_after)."""
    hub = handle.broker.pops.engine.hub
    while hub.statistics().parked < count:  # noqa: ASYNC110
        await trio.sleep(0.005)
