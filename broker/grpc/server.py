"""The gRPC server: accept connections (TLS or plaintext on one port), run each call in a task.

Theory of operation (the Remoting server's shape, :mod:`broker.remoting.server`):
:func:`serve_grpc` runs ``trio.serve_listeners`` with :func:`handle_grpc_stream`, which serves
one already-open stream (tests hand it one end of ``trio.testing.memory_stream_pair()``). A
connection whose first byte is 0x16 (a TLS ClientHello) is wrapped in ``trio.SSLStream`` with
ALPN ``h2``, anything else is plaintext HTTP/2 — the proxy's rule, so the Java/Go/C++ clients'
TLS default and the Python/Node clients' plaintext default work on the same port.

A :class:`~protocol.grpc.connection.GrpcConnection` turns the bytes into call events. One
nursery per connection holds the reader, the writer and one task per call; each call task runs
under a cancel scope whose deadline is the call's ``grpc-timeout`` and which the reader cancels
when the client resets the stream. What a call writes goes through the connection object and
out through the writer task (:meth:`_Link.flush` hands it over and waits): only the writer
touches the socket, so a call cancelled mid-write cannot tear the byte stream every call
shares. A call that has more queued than the client's flow-control window admits waits
(:meth:`_Link.wait_writable`), so a client that stops reading holds only its own call.

A stop (the server's cancellation) is graceful per connection and bounded: that nursery is
shielded from it, and the connection's handler task first refuses new calls, ends the calls
that wait for the client (Telemetry) with UNAVAILABLE, gives the others a moment to answer (a
receive the broker's stop woke answers MESSAGE_NOT_FOUND), then sends GOAWAY and closes.

What the server runs is a :class:`Service`: it maps a method path to a handler
(:mod:`broker.grpc.service`). A handler gets a :class:`Call` and the decoded request, and
writes its responses with :meth:`Call.send`; the call ends with the handler's status.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn, Protocol, TypeVar

import trio

from broker.logs import get_logger
from broker.peers import PeerCounts, peer_of
from broker.sockio import SocketReader, raw_socket, send_now
from broker.tls import TlsPolicy
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
#: On a server stop: how long calls whose request is complete get to finish by themselves,
#: and how long the whole graceful close of a connection may take.
STOP_GRACE_S = 1.0
STOP_TIMEOUT_S = 2.0
#: How long a connection's last frames (GOAWAY) may take to write.
_LAST_WRITE_S = 1.0
#: Bytes queued for the writer beyond which the reader stops reading until they are out.
_READER_HIGH_WATER = 1024 * 1024
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

    def may_wait(self, path: str) -> bool:
        """Whether a call of ``path`` may wait (a long poll, a stream, an fsync) and so needs
        a task of its own; the others run in the reader once their request is complete."""


@dataclass(frozen=True, slots=True)
class GrpcLimits:
    """What one gRPC server allows."""

    max_connections: int = 4096
    max_message_size: int = 4 * 1024 * 1024 + 64 * 1024
    #: Calls one connection may have open at once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS:
    #: the clients queue further calls on their side; a stream beyond it is refused).
    max_concurrent_streams: int = 1000
    #: Connections from one source address beyond which new ones are closed (None: no cap).
    max_connections_per_ip: int | None = 1024
    #: A connection with no call open and none started or ended for this long is closed
    #: with GOAWAY (gRPC's ``max_connection_idle``; None: never). Pings do not count.
    idle_timeout_s: float | None = 120.0


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
    refused_per_ip: int = 0
    idle_closed: int = 0
    tls_refused: int = 0
    per_ip: PeerCounts = field(default_factory=PeerCounts)

    def refusal_counts(self) -> dict[str, int]:
        """Every refusal counted so far, by reason (safe to read from another thread)."""
        return {
            "connection_limit": self.refused,
            "per_ip_limit": self.refused_per_ip,
            "tls_handshake": self.tls_refused,
            "idle": self.idle_closed,
            "broken_http2": self.broken,
        }

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
            self.refused_per_ip,
            self.idle_closed,
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
    #: Connections closed at once: their source address had ``max_connections_per_ip``.
    refused_per_ip: int = 0
    #: Connections closed (GOAWAY) after ``idle_timeout_s`` without a call.
    idle_closed: int = 0


class _Link:
    """One connection's protocol object and socket, shared by its reader, writer and calls.

    Only the writer task (:meth:`run_writer`) writes to the socket. A write that a
    cancellation interrupts leaves the HTTP/2 byte stream torn (the protocol already handed
    the bytes over), so no call task ever writes itself: a call's deadline or reset could
    otherwise break every other call of the connection.
    """

    def __init__(self, stream: trio.abc.Stream, protocol: GrpcConnection, peer: str) -> None:
        self.stream = stream
        self.protocol = protocol
        self.peer = peer
        #: A plain TCP connection's socket, read and written with single non-blocking
        #: syscalls (:meth:`receive`, :meth:`take`); None for TLS and memory streams.
        self._socket = raw_socket(stream)
        self._reader = None if self._socket is None else SocketReader(self._socket, RECEIVE_SIZE)
        # Woken after every read: the peer's window updates arrive that way.
        self._window = trio.Event()
        #: Calls waiting on ``_window`` (none: a read need not make a new Event).
        self._window_waiters = 0
        self._out: list[bytes] = []
        self._queued = 0  # bytes handed to the writer, in total
        self._written = 0  # bytes the writer wrote, in total
        self._has_data = trio.Event()
        self._progress = trio.Event()
        #: The socket broke (or a write was cut): nothing more can be written.
        self.failed = False
        self._writing = False
        # Until the writer task ends (then what is left goes out with write_last).
        self._writer_alive = True

    @property
    def written(self) -> int:
        """Bytes the writer wrote, in total."""
        return self._written

    def take(self) -> int:
        """Hand what the protocol has for the socket to the writer; the total handed.

        When the writer has nothing queued or in progress, a plain TCP socket is written
        here at once: one non-blocking write, no task switch to the writer and back (a
        trio ``send_all`` also yields once after it). A write cannot be torn by a
        cancellation (it is synchronous); what the socket does not take goes to the writer,
        after which order is kept by queueing everything behind it."""
        data = self.protocol.data_to_send()
        if data:
            self._queued += len(data)
            if self._socket is not None and not self._out and not self._writing:
                data = self._write_now(self._socket, data)
            if data:
                self._out.append(data)
                self._has_data.set()
        return self._queued

    def _write_now(self, sock: trio.socket.SocketType, data: bytes) -> bytes:
        """Write what the socket takes without blocking; what is left for the writer."""
        if self.failed:
            return data  # the writer reports it (or is gone)
        try:
            sent = send_now(sock, data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return data  # the writer meets it again
        self._written += sent
        return data[sent:]

    async def receive(self) -> bytes | bytearray:
        """The next bytes from the peer, b"" at its end (``receive_some``'s contract): a
        plain TCP socket through :class:`broker.sockio.SocketReader` (one syscall, no
        scheduler pass after a wait, none of trio's per-call wrappers), anything else
        through the stream."""
        if self._reader is None:
            return await self.stream.receive_some(RECEIVE_SIZE)
        return await self._reader.receive_some()

    async def flush(self) -> None:
        """Write whatever the protocol has for the socket (wait until the writer did).

        Returns at once if the connection broke (its tasks are being cancelled) or the writer
        is gone (:meth:`write_last` sends the rest).
        """
        target = self.take()
        await trio.lowlevel.checkpoint()
        while self._written < target and self._writer_alive and not self.failed:
            await self._progress.wait()

    async def run_writer(self, on_failure: trio.CancelScope) -> None:
        """Write what :meth:`take` queues, in order, until cancelled; a broken socket cancels
        ``on_failure`` (the connection)."""
        try:
            while True:
                if not self._out:
                    await self._has_data.wait()
                    self._has_data = trio.Event()
                    continue
                data = b"".join(self._out)
                self._out.clear()
                self._writing = True
                await self.stream.send_all(data)
                self._writing = False
                self._written += len(data)
                self._wake_progress()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.failed = True
            self._wake_progress()
            on_failure.cancel()
        finally:
            if self._writing:  # cut mid-write: the byte stream is torn
                self.failed = True
            self._writer_alive = False
            self._wake_progress()

    async def write_last(self) -> None:
        """Write what is left after the writer stopped (the connection's last words)."""
        if self.failed:
            return
        self.take()
        data, self._out = b"".join(self._out), []
        if data:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.failed = True

    def _wake_progress(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    def windows_changed(self) -> None:
        """Bytes were read: wake the calls waiting for a window."""
        if self._window_waiters:
            self._window.set()
            self._window = trio.Event()

    async def wait_writable(self, stream_id: int, high_water: int = _HIGH_WATER) -> None:
        """Wait until the call's queued bytes fit under ``high_water``."""
        for _ in range(1 << 30):  # bounded; each round waits for a read
            if self.protocol.unsent(stream_id) <= high_water:
                return
            self._window_waiters += 1
            try:
                await self._window.wait()
            finally:
                self._window_waiters -= 1


@dataclass(eq=False)
class Call:
    """One gRPC call as a handler sees it."""

    stream_id: int
    path: str
    metadata: dict[str, str]
    peer: str
    link: _Link
    #: Request messages of a call with a task of its own; closed when the client
    #: half-closes. None for a call the reader runs itself (:attr:`payloads`).
    requests: trio.MemoryReceiveChannel[bytes] | None
    _requests_in: trio.MemorySendChannel[bytes] | None
    #: :attr:`scope`, made when first asked for (a quick call the reader runs never is).
    _scope: trio.CancelScope | None = None
    #: The request messages of a call the reader runs itself (complete when it runs).
    payloads: list[bytes] = field(default_factory=list)
    reset: bool = False
    ended: bool = False
    #: The client sent all its request messages.
    half_closed: bool = False
    #: Why the server cut the call short (the status to end it with), if it did.
    aborted: tuple[GrpcStatus, str] | None = None

    @property
    def scope(self) -> trio.CancelScope:
        """The call's cancel scope: its deadline (``grpc-timeout``), cancelled by a reset or
        an abort; a call with a task of its own runs in it."""
        if self._scope is None:
            self._scope = trio.CancelScope()
        return self._scope

    @property
    def client_id(self) -> str:
        """``x-mq-client-id`` (empty when absent)."""
        return self.metadata.get("x-mq-client-id", "")

    async def request(self) -> bytes:
        """The one request message of a unary or server-streaming call.

        Raises:
            GrpcError: INTERNAL when the client sent none or more than one.
        """
        if self.requests is None:
            payloads = self.payloads
        else:
            payloads = []
            async for payload in self.requests:  # bounded: the client half-closes
                payloads.append(payload)
                if len(payloads) > 1:
                    break
        if not payloads:
            raise GrpcError(GrpcStatus.INTERNAL, "the request carries no message")
        if len(payloads) > 1:
            # grpc-java's answer (INTERNAL, "More than one request messages for unary call").
            raise GrpcError(GrpcStatus.INTERNAL, "more than one request message on a unary call")
        return payloads[0]

    async def messages(self) -> AsyncIterator[bytes]:
        """The request messages as they arrive, until the client half-closes (streaming
        calls: Telemetry)."""
        if self.requests is None:
            for payload in self.payloads:
                yield payload
            return
        async for payload in self.requests:
            yield payload

    def send_nowait(self, payload: bytes) -> None:
        """Queue a response message (written with the next flush)."""
        self.link.protocol.send_message(self.stream_id, payload)

    def send_many_nowait(self, payloads: Iterable[bytes]) -> None:
        """Queue response messages in order (written with the next flush)."""
        self.link.protocol.send_messages(self.stream_id, payloads)

    def push_nowait(self, payload: bytes) -> bool:
        """Queue a message the server starts (a command on a Telemetry stream, from outside
        the call's task) and hand it to the writer now; False when the call or the
        connection is over. Unbounded by the window: such commands are rare and small."""
        if self.link.failed or not self.link.protocol.is_open(self.stream_id):
            return False
        self.send_nowait(payload)
        self.link.take()
        return True

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

    def abort(self, status: GrpcStatus, message: str) -> None:
        """Cancel the handler; the call ends with ``status`` (unless it ended already)."""
        if self.aborted is None:
            self.aborted = (status, message)
        self.scope.cancel()


async def serve_grpc(
    service: Service,
    listeners: list[ListenerT],
    limits: GrpcLimits,
    state: GrpcServerState,
    *,
    tls: TlsPolicy | None,
    task_status: trio.TaskStatus[list[ListenerT]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve gRPC on ``listeners`` until cancelled; reports them when listening.

    Cancelling it is a graceful stop of every connection (see :func:`handle_grpc_stream`).
    """
    await trio.serve_listeners(
        partial(handle_grpc_stream, service, limits, state, tls),
        listeners,
        task_status=task_status,
    )


async def handle_grpc_stream(
    service: Service,
    limits: GrpcLimits,
    state: GrpcServerState,
    tls: TlsPolicy | None,
    stream: trio.abc.Stream,
) -> None:
    """Serve one connection until it closes or breaks; the stream is always closed.

    Cancelling it stops the connection gracefully, bounded by :data:`STOP_TIMEOUT_S`: no new
    calls; calls still reading from the client (a Telemetry stream) end at once with
    UNAVAILABLE, the others (a unary call, a receive the stop woke) get up to
    :data:`STOP_GRACE_S` to finish by themselves; then GOAWAY, and the socket is closed.
    Nothing that one connection does (or suffers) escapes to the listener.
    """
    peer = peer_of(stream)
    if state.connections >= limits.max_connections:
        state.refused += 1
        await trio.aclose_forcefully(stream)
        return
    if not state.per_ip.admit(peer, limits.max_connections_per_ip):
        state.refused_per_ip += 1
        _log.warning("gRPC connection refused: per-address limit reached", peer=peer,
                     limit=limits.max_connections_per_ip)  # fmt: skip
        await trio.aclose_forcefully(stream)
        return
    state.connections += 1
    state.accepted += 1
    try:
        if tls is not None:
            served, is_tls = await tls.accept(stream)
            if served is None:
                state.tls_refused += 1
                return  # silent, broken, or plaintext where TLS is enforced
            stream = served
            state.tls += is_tls
        await _serve_connection(service, limits, state, stream, peer)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    except Exception:  # a bug of ours must take down this connection only
        state.broken += 1
        _log.exception("gRPC connection failed", peer=peer)
    finally:
        state.connections -= 1
        state.per_ip.release(peer)
        service.connection_closed(peer)
        await trio.aclose_forcefully(stream)


class _Connection:
    """One connection's tasks: the reader, the writer and a task per call, in a nursery
    that the server's cancellation does not reach (it is shielded): the handler task
    stops it gracefully first (:meth:`stop`), then cancels :attr:`scope`."""

    def __init__(
        self, service: Service, state: GrpcServerState, link: _Link, idle_timeout_s: float
    ) -> None:
        self.service = service
        self.state = state
        self.link = link
        self.idle_timeout_s = idle_timeout_s
        #: When a call last started or ended (trio time): idleness counts from there.
        self.last_active = trio.current_time()
        #: The reader is parked in a read (so ending the connection cuts no call short).
        self.reading = False
        self.calls: dict[int, Call] = {}
        self.scope = trio.CancelScope(shield=True)
        self.done = trio.Event()
        self._calls_changed = trio.Event()
        #: The reader's scope: cancelled when the client's GOAWAY has been drained.
        self._read_scope = trio.CancelScope()
        self._stopping = False

    async def run(self) -> None:
        """Serve until the peer leaves, the connection breaks or :attr:`scope` is cancelled."""
        link = self.link
        try:
            with self.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(link.run_writer, nursery.cancel_scope)
                    if self.idle_timeout_s != math.inf:
                        nursery.start_soon(self._watch_idle)
                    try:
                        with self._read_scope:
                            await _read(self.service, self.state, link, self.calls, nursery, self)
                        # Our last frames (the GOAWAY after a protocol error, ours after the
                        # client's), bounded: a peer that does not read gets no more time.
                        with trio.move_on_after(_LAST_WRITE_S):
                            if not link.protocol.closed and link.protocol.going_away:
                                link.protocol.close()
                            await link.flush()
                    finally:
                        nursery.cancel_scope.cancel()
        finally:
            self.done.set()

    async def _watch_idle(self) -> None:
        """End the connection (GOAWAY, then close) once no call has been open, started or
        ended for ``idle_timeout_s`` and the reader is parked in a read. A task of its own
        that sleeps until the next possible deadline: the reads pay nothing for it."""
        while True:  # one wake-up per idle_timeout_s at most; ends with the connection
            await trio.sleep_until(self.last_active + self.idle_timeout_s)
            now = trio.current_time()
            if self.calls or not self.reading:
                self.last_active = now  # a parked receive, a Telemetry stream, a call
            elif now >= self.last_active + self.idle_timeout_s:
                self.state.idle_closed += 1
                _log.info("closing idle gRPC connection", peer=self.link.peer,
                          idle_s=self.idle_timeout_s)  # fmt: skip
                self._read_scope.cancel()  # our GOAWAY (NO_ERROR) is written on the way out
                return

    def call_ended(self) -> None:
        """A call ended: wake :meth:`stop`; the last call after the client's GOAWAY ends the
        connection (the reader would otherwise wait for bytes that never come)."""
        if self._stopping:  # only a stop waits for it (no Event per call otherwise)
            self._calls_changed.set()
            self._calls_changed = trio.Event()
        self.last_active = trio.current_time()
        if self.link.protocol.going_away and not self.calls and not self._stopping:
            self._read_scope.cancel()

    async def stop(self) -> None:
        """A graceful stop (run shielded, under a deadline, by the handler task)."""
        protocol, link = self.link.protocol, self.link
        self._stopping = True
        protocol.going_away = True  # new streams are refused from now on
        for call in list(self.calls.values()):
            if call.requests is None:  # no task yet: its request never completed
                call.end_nowait(GrpcStatus.UNAVAILABLE, "broker stopping")
                del self.calls[call.stream_id]
            elif not call.half_closed:  # waits for the client (Telemetry): end it now
                call.abort(GrpcStatus.UNAVAILABLE, "broker stopping")
        with trio.move_on_after(STOP_GRACE_S):
            while self.calls:
                await self._calls_changed.wait()
        for call in list(self.calls.values()):
            call.abort(GrpcStatus.UNAVAILABLE, "broker stopping")
        while self.calls:  # they end at their next checkpoint
            await self._calls_changed.wait()
        await link.flush()  # the trailers, as far as the windows let them
        if not protocol.closed:
            protocol.close()
        await link.flush()


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
    link.take()
    idle_s = limits.idle_timeout_s if limits.idle_timeout_s is not None else math.inf
    connection = _Connection(service, state, link, idle_s)
    async with trio.open_nursery() as guard:
        guard.start_soon(connection.run)
        try:
            await connection.done.wait()
        finally:
            if not connection.done.is_set():  # the server stops
                with trio.CancelScope(shield=True) as bound:
                    bound.deadline = trio.current_time() + STOP_TIMEOUT_S
                    await connection.stop()
            connection.scope.cancel()
    # The writer is gone; what it had not written yet goes now, with our GOAWAY, bounded.
    if not protocol.closed:
        protocol.close()
    with trio.CancelScope(shield=True) as bound:
        bound.deadline = trio.current_time() + _LAST_WRITE_S
        await link.write_last()


async def _read(
    service: Service,
    state: GrpcServerState,
    link: _Link,
    calls: dict[int, Call],
    nursery: trio.Nursery,
    connection: _Connection,
) -> None:
    protocol = link.protocol
    while True:
        connection.reading = True
        try:
            data = await link.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            connection.reading = False
        if not data:
            return
        if protocol.closed:
            continue  # our GOAWAY is out: the peer's last frames mean nothing now
        try:
            events = protocol.receive_data(data)
        except GrpcConnectionError as exc:
            state.broken += 1
            _log.info("closing gRPC connection", peer=link.peer, error=str(exc))
            return  # our GOAWAY is written on the way out
        for ev in events:
            if isinstance(ev, CallMessage):
                call = calls.get(ev.stream_id)
                if call is not None:
                    _deliver(call, ev.payload)
            elif isinstance(ev, CallStarted):
                waits = service.may_wait(ev.path)
                call = _new_call(ev, link, with_task=waits)
                calls[ev.stream_id] = call
                state.calls += 1
                connection.last_active = trio.current_time()
                if waits:
                    nursery.start_soon(_run_call, service, state, connection, call, ev.timeout_s)
            elif isinstance(ev, CallHalfClosed):
                call = calls.get(ev.stream_id)
                if call is not None:
                    call.half_closed = True
                    if call._requests_in is None:
                        # Complete and quick: run it here (no task, no channel, no scope);
                        # its reply leaves with the others of this read.
                        await _run_inline(service, state, connection, call)
                    else:
                        call._requests_in.close()
            elif isinstance(ev, CallReset):
                call = calls.pop(ev.stream_id, None)
                if call is not None:
                    call.reset = True
                    call.scope.cancel()
                    connection.call_ended()
            elif isinstance(ev, PeerGoingAway):
                _log.debug("client going away", peer=link.peer, open_calls=len(calls))
        link.windows_changed()
        if link.take() - link.written > _READER_HIGH_WATER:
            await link.flush()  # a peer that sends (pings …) but does not read: wait for it
        if protocol.going_away and not calls:
            return


def _new_call(ev: CallStarted, link: _Link, *, with_task: bool) -> Call:
    if not with_task:
        return Call(ev.stream_id, ev.path, ev.metadata, link.peer, link, None, None)
    # Unbounded in count, bounded in bytes by the message-size limit per message and by the
    # connection's flow-control window: the client cannot send more than we acknowledge.
    send, receive = trio.open_memory_channel[bytes](1 << 20)
    return Call(ev.stream_id, ev.path, ev.metadata, link.peer, link, receive, send)


def _deliver(call: Call, payload: bytes) -> None:
    if call._requests_in is None:
        if len(call.payloads) < 2:  # a second one is an error already (Call.request)
            call.payloads.append(payload)
        return
    # A message after half-close cannot happen (the protocol refuses it); the channel's size is
    # bounded above.
    with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
        call._requests_in.send_nowait(payload)


async def _run_inline(
    service: Service, state: GrpcServerState, connection: _Connection, call: Call
) -> None:
    """Run a quick call in the reader: its request is complete, its handler does not wait
    (:meth:`Service.may_wait`), so no deadline can pass meanwhile."""
    state.in_flight += 1
    try:
        await _handle(service, call)
    finally:
        _call_done(state, connection, call)


async def _handle(service: Service, call: Call) -> None:
    """Run the call's handler and queue its trailers (errors become statuses)."""
    handler = service.handler(call.path)
    try:
        if handler is None:
            raise GrpcError(GrpcStatus.UNIMPLEMENTED, f"unknown method {call.path}")
        await handler(call)
        call.end_nowait()
    except GrpcError as exc:
        call.end_nowait(exc.status, exc.message)
    except Exception as exc:  # a handler bug must not take the connection down
        _log.exception("gRPC handler failed", path=call.path, peer=call.peer)
        call.end_nowait(GrpcStatus.INTERNAL, f"internal error: {type(exc).__name__}")


async def _run_call(
    service: Service,
    state: GrpcServerState,
    connection: _Connection,
    call: Call,
    timeout_s: float | None,
) -> None:
    state.in_flight += 1
    if timeout_s is not None:
        call.scope.deadline = trio.current_time() + timeout_s
    try:
        with call.scope:
            await _handle(service, call)
        if call.scope.cancelled_caught and not call.reset:
            if call.aborted is not None:
                call.end_nowait(*call.aborted)
            else:
                call.end_nowait(GrpcStatus.DEADLINE_EXCEEDED, "deadline exceeded")
        if not call.reset:
            await call.link.flush()
    finally:
        _call_done(state, connection, call)


def _call_done(state: GrpcServerState, connection: _Connection, call: Call) -> None:
    """A call's handler is over (however it ended): forget the call."""
    state.in_flight -= 1
    if connection.calls.get(call.stream_id) is call:
        del connection.calls[call.stream_id]
    connection.call_ended()
