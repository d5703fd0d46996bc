"""The gRPC server: accept connections (TLS or plaintext on one port), run each call in a task.

Theory of operation (the Remoting server's shape, :mod:`broker.remoting.server`):
:func:`serve_grpc` runs ``trio.serve_listeners`` with :func:`handle_grpc_stream`, which serves
one already-open stream (tests hand it one end of ``trio.testing.memory_stream_pair()``). A
connection whose first byte is 0x16 (a TLS ClientHello) is wrapped in ``trio.SSLStream`` with
ALPN ``h2``, anything else is plaintext HTTP/2 — the proxy's rule, so the Java/Go/C++ clients'
TLS default and the Python/Node clients' plaintext default work on the same port.

A :class:`~protocol.grpc.connection.GrpcConnection` turns the bytes into call events. One
nursery per connection holds the reader (this task) and one task per call; each call task runs
under a cancel scope whose deadline is the call's ``grpc-timeout`` and which the reader cancels
when the client resets the stream. What a call writes goes through the connection object and
out in :meth:`_Link.flush` (one writer at a time, FIFO); a call that has more queued than the
client's flow-control window admits waits (:meth:`_Link.wait_writable`), so a client that
stops reading holds only its own call.

What the server runs is a :class:`Service`: it maps a method path to a handler
(:mod:`broker.grpc.service`). A handler gets a :class:`Call` and the decoded request, and
writes its responses with :meth:`Call.send`; the call ends with the handler's status.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn, Protocol, TypeVar

import trio

from broker.logs import get_logger
from protocol.grpc.codes import GrpcStatus
from protocol.grpc.connection import (
    CallHalfClosed,
    CallMessage,
    CallReset,
    CallStarted,
    GrpcConnection,
    GrpcConnectionError,
    PeerGoingAway,
)

_log = get_logger("grpc")
RECEIVE_SIZE = 65536
#: Response bytes a call may have queued beyond the peer's window before it waits.
_HIGH_WATER = 256 * 1024
#: A client that says nothing for this long after connecting is dropped before TLS sniffing.
FIRST_BYTE_TIMEOUT_S = 10.0
ListenerT = TypeVar("ListenerT", bound=trio.abc.Listener[Any])


class GrpcError(Exception):
    """End a call with a gRPC status (transport-level: UNIMPLEMENTED, INVALID_ARGUMENT …)."""

    def __init__(self, status: GrpcStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Handler = Callable[["Call"], Awaitable[None]]


class Service(Protocol):
    """What the server runs its calls with."""

    def handler(self, path: str) -> Handler | None:
        """The handler of a method path, None when the method is unknown (UNIMPLEMENTED)."""

    def connection_closed(self, peer: str) -> None:
        """A connection ended (its calls are over)."""


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """What one gRPC server allows."""

    max_connections: int = 4096
    max_message_size: int = 4 * 1024 * 1024 + 64 * 1024
    max_concurrent_streams: int = 1000


@dataclass(slots=True)
class GrpcServerState:
    """Counters of one gRPC server (``statistics()``)."""

    connections: int = 0
    accepted: int = 0
    refused: int = 0
    calls: int = 0
    in_flight: int = 0
    broken: int = 0
    tls: int = 0

    def statistics(self) -> GrpcStatistics:
        """A snapshot."""
        return GrpcStatistics(
            self.connections,
            self.accepted,
            self.refused,
            self.calls,
            self.in_flight,
            self.broken,
            self.tls,
        )


@dataclass(frozen=True, slots=True)
class GrpcStatistics:
    """A snapshot of a gRPC server's counters."""

    connections: int
    accepted: int
    refused: int
    calls: int
    in_flight: int
    #: Connections closed because their HTTP/2 broke.
    broken: int
    #: Connections that spoke TLS.
    tls: int


class _Link:
    """One connection's protocol object and socket, shared by its reader and call tasks."""

    def __init__(self, stream: trio.abc.Stream, protocol: GrpcConnection, peer: str) -> None:
        self.stream = stream
        self.protocol = protocol
        self.peer = peer
        self._lock = trio.StrictFIFOLock()
        # Woken after every read: the peer's window updates arrive that way.
        self._window = trio.Event()

    async def flush(self) -> None:
        """Write whatever the protocol has for the socket."""
        async with self._lock:
            data = self.protocol.data_to_send()
            if data:
                await self.stream.send_all(data)

    def windows_changed(self) -> None:
        """Bytes were read: wake the calls waiting for a window."""
        self._window.set()
        self._window = trio.Event()

    async def wait_writable(self, stream_id: int, high_water: int = _HIGH_WATER) -> None:
        """Wait until the call's queued bytes fit under ``high_water``."""
        for _ in range(1 << 30):  # bounded; each round waits for a read
            if self.protocol.unsent(stream_id) <= high_water:
                return
            await self._window.wait()


@dataclass(eq=False)
class Call:
    """One gRPC call as a handler sees it."""

    stream_id: int
    path: str
    metadata: dict[str, str]
    peer: str
    link: _Link
    #: Request messages; closed when the client half-closes.
    requests: trio.MemoryReceiveChannel[bytes]
    _requests_in: trio.MemorySendChannel[bytes]
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    reset: bool = False
    ended: bool = False

    @property
    def client_id(self) -> str:
        """``x-mq-client-id`` (empty when absent)."""
        return self.metadata.get("x-mq-client-id", "")

    async def request(self) -> bytes:
        """The one request message of a unary or server-streaming call.

        Raises:
            GrpcError: INTERNAL when the client sent none or more than one.
        """
        try:
            payload = await self.requests.receive()
        except trio.EndOfChannel:
            raise GrpcError(GrpcStatus.INTERNAL, "the request carries no message") from None
        try:
            await self.requests.receive()
        except trio.EndOfChannel:
            return payload
        raise GrpcError(GrpcStatus.UNIMPLEMENTED, "more than one request message on a unary call")

    def send_nowait(self, payload: bytes) -> None:
        """Queue a response message (written with the next flush)."""
        self.link.protocol.send_message(self.stream_id, payload)

    async def send(self, payload: bytes) -> None:
        """Write a response message; waits while the client's window is full."""
        self.send_nowait(payload)
        await self.link.flush()
        await self.link.wait_writable(self.stream_id)

    async def drain(self) -> None:
        """Write what is queued and wait until the client's window has taken all of it."""
        await self.link.flush()
        await self.link.wait_writable(self.stream_id, 0)

    def end_nowait(self, status: int = GrpcStatus.OK, message: str = "") -> None:
        """Queue the call's trailers (written with the next flush)."""
        if not self.ended:
            self.ended = True
            self.link.protocol.end_call(self.stream_id, status, message)


async def serve_grpc(
    service: Service,
    listeners: list[ListenerT],
    limits: GrpcLimits,
    state: GrpcServerState,
    *,
    ssl_context: ssl.SSLContext | None,
    task_status: trio.TaskStatus[list[ListenerT]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve gRPC on ``listeners`` until cancelled; reports them when listening."""
    await trio.serve_listeners(
        partial(handle_grpc_stream, service, limits, state, ssl_context),
        listeners,
        task_status=task_status,
    )


async def handle_grpc_stream(
    service: Service,
    limits: GrpcLimits,
    state: GrpcServerState,
    ssl_context: ssl.SSLContext | None,
    stream: trio.abc.Stream,
) -> None:
    """Serve one connection until it closes or breaks; the stream is always closed."""
    peer = peer_of(stream)
    if state.connections >= limits.max_connections:
        state.refused += 1
        await stream.aclose()
        return
    state.connections += 1
    state.accepted += 1
    try:
        with trio.move_on_after(FIRST_BYTE_TIMEOUT_S) as sniff:
            tls = await _speaks_tls(stream)
        if sniff.cancelled_caught:
            return
        if tls:
            if ssl_context is None:
                _log.info("TLS connection refused: no certificate configured", peer=peer)
                return
            state.tls += 1
            stream = trio.SSLStream(stream, ssl_context, server_side=True)
        await _serve_connection(service, limits, state, stream, peer)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        state.connections -= 1
        service.connection_closed(peer)
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _speaks_tls(stream: trio.abc.Stream) -> bool:
    """Whether the first byte is a TLS handshake record (0x16), without consuming it."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return False  # memory streams in tests: plaintext
    first = await sock.recv(1, socket.MSG_PEEK)
    return bool(first) and first[0] == 0x16


async def _serve_connection(
    service: Service,
    limits: GrpcLimits,
    state: GrpcServerState,
    stream: trio.abc.Stream,
    peer: str,
) -> None:
    protocol = GrpcConnection(
        max_message_size=limits.max_message_size,
        max_concurrent_streams=limits.max_concurrent_streams,
    )
    link = _Link(stream, protocol, peer)
    protocol.initiate()
    await link.flush()
    calls: dict[int, Call] = {}
    async with trio.open_nursery() as nursery:
        try:
            await _read(service, state, link, calls, nursery)
        finally:
            nursery.cancel_scope.cancel()


async def _read(
    service: Service,
    state: GrpcServerState,
    link: _Link,
    calls: dict[int, Call],
    nursery: trio.Nursery,
) -> None:
    protocol = link.protocol
    while True:
        try:
            data = await link.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return
        try:
            events = protocol.receive_data(data)
        except GrpcConnectionError as exc:
            state.broken += 1
            _log.info("closing gRPC connection", peer=link.peer, error=str(exc))
            await link.flush()  # h2's GOAWAY
            return
        for ev in events:
            if isinstance(ev, CallMessage):
                call = calls.get(ev.stream_id)
                if call is not None:
                    _deliver(call, ev.payload)
            elif isinstance(ev, CallStarted):
                call = _new_call(ev, link)
                calls[ev.stream_id] = call
                state.calls += 1
                nursery.start_soon(_run_call, service, state, calls, call, ev.timeout_s)
            elif isinstance(ev, CallHalfClosed):
                call = calls.get(ev.stream_id)
                if call is not None:
                    call._requests_in.close()
            elif isinstance(ev, CallReset):
                call = calls.pop(ev.stream_id, None)
                if call is not None:
                    call.reset = True
                    call.scope.cancel()
            elif isinstance(ev, PeerGoingAway):
                _log.debug("client going away", peer=link.peer, open_calls=len(calls))
        link.windows_changed()
        await link.flush()
        if protocol.going_away and not calls:
            return


def _new_call(ev: CallStarted, link: _Link) -> Call:
    # Unbounded in count, bounded in bytes by the message-size limit per message and by the
    # connection's flow-control window: the client cannot send more than we acknowledge.
    send, receive = trio.open_memory_channel[bytes](1 << 20)
    return Call(ev.stream_id, ev.path, ev.metadata, link.peer, link, receive, send)


def _deliver(call: Call, payload: bytes) -> None:
    # A message after half-close cannot happen (h2 refuses it); the channel's size is
    # bounded above.
    with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
        call._requests_in.send_nowait(payload)


async def _run_call(
    service: Service,
    state: GrpcServerState,
    calls: dict[int, Call],
    call: Call,
    timeout_s: float | None,
) -> None:
    state.in_flight += 1
    if timeout_s is not None:
        call.scope.deadline = trio.current_time() + timeout_s
    try:
        with call.scope:
            handler = service.handler(call.path)
            try:
                if handler is None:
                    raise GrpcError(GrpcStatus.UNIMPLEMENTED, f"unknown method {call.path}")
                await handler(call)
                call.end_nowait()
            except GrpcError as exc:
                call.end_nowait(exc.status, exc.message)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise
            except Exception as exc:  # a handler bug must not take the connection down
                _log.exception("gRPC handler failed", path=call.path, peer=call.peer)
                call.end_nowait(GrpcStatus.INTERNAL, f"internal error: {type(exc).__name__}")
        if call.scope.cancelled_caught and not call.reset:
            call.end_nowait(GrpcStatus.DEADLINE_EXCEEDED, "deadline exceeded")
        if not call.reset:
            await call.link.flush()
    finally:
        state.in_flight -= 1
        calls.pop(call.stream_id, None)


def peer_of(stream: trio.abc.Stream) -> str:
    """``host:port`` of the other end, ``?`` when the stream is no socket or cannot say."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "?"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
