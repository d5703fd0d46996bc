"""The Remoting server, for the broker and the name server alike: accept connections, read
requests, run them, write replies.

Theory of operation (hypercorn's shape: one server module around a sans-IO protocol):
:func:`serve_remoting` runs ``trio.serve_listeners`` with :func:`handle_stream`, which serves
one already-open stream (tests hand it one end of ``trio.testing.memory_stream_pair()``).
A :class:`~protocol.connection.RemotingConnection` turns the bytes into events; this task
reads and runs the requests, one writer task per connection batches the replies
(``broker.remoting.connection``), and both live in one nursery per connection. What the
server runs is a :class:`Dispatcher`: the broker and the name server each pass their
:class:`~broker.remoting.dispatch.Registry` bound to their context (:class:`BoundRegistry`).
With ACL on, the :class:`BoundRegistry` holds a :data:`Guard` (``broker.acl.AclGuard``) that
every request passes before its processor runs: the one place where requests are
authenticated and authorised. A refused request is answered ``NO_PERMISSION`` on its opaque
(a oneway one is dropped) and the connection goes on.

A request that may wait (a long poll, a send waiting for its fsync in SYNC mode) gets a task
of its own, so it never holds up the requests behind it; every other request runs right here
in the reader, because a task per request costs more than most requests do, and the replies
of one burst of such requests (what one ``receive_some`` brought) leave in one write.

Malformed input never crashes anything: a bad header in a well-delimited frame, or an
oversize frame whose header could be read, is answered with an error on its opaque and the
connection stays open; broken framing closes the connection, as RocketMQ's Netty decoder does.

What the server keeps about its connections lives in a :class:`ServerState`: the open
connections, the requests in flight, counters (:meth:`ServerState.statistics`), and
:meth:`ServerState.wait_drained` for a graceful stop, which the caller bounds with a cancel
scope.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, NoReturn, Protocol, TypeVar

import trio

from broker.logs import get_logger
from broker.peers import PeerCounts, peer_of
from broker.remoting.connection import Connection, encode_reply, run_writer
from broker.remoting.dispatch import LATER, Later, Registry
from broker.sockio import SocketReader, raw_socket
from broker.tls import TlsPolicy
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.connection import (
    NEED_DATA,
    Closed,
    Event,
    Malformed,
    RemotingConnection,
    Request,
    Role,
)
from protocol.errors import ProtocolError
from protocol.frame import DEFAULT_MAX_FRAME_SIZE

_log = get_logger("server")
RECEIVE_SIZE = 65536
#: How soon an idle connection found busy writing or running is looked at again.
_IDLE_RECHECK_S = 1.0
#: Replies the reader holds at most before it writes them (bounds a burst's memory).
_MAX_HELD = 16
Ctx = TypeVar("Ctx")
ListenerT = TypeVar("ListenerT", bound=trio.abc.Listener[Any])


# ------------------------------------------------------------------ what the server runs
#: ``guard(peer, cmd)``: None if the request may run, else the reply that refuses it.
Guard = Callable[[str, RemotingCommand], RemotingCommand | None]


async def _answer(reply: RemotingCommand | None) -> RemotingCommand | None:
    return reply


class Dispatcher(Protocol):
    """What a Remoting server runs its requests with."""

    def dispatch(self, conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand | None]:
        """Run ``cmd`` and return its reply (None: no reply, for oneway requests)."""

    def may_wait(self, code: int) -> bool:
        """Whether a request with ``code`` may wait long enough to need a task of its own."""

    def answer_now(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Later | None:
        """The reply of a request that may wait, when it need not (found without waiting);
        :data:`~broker.remoting.dispatch.LATER` when it must (then dispatch it in a task)."""

    def queue_bound_s(self, code: int) -> float:
        """How long a request with ``code`` may wait in line (read but not yet started)
        before it is answered SYSTEM_BUSY instead of run (math.inf: no bound)."""

    @property
    def grouped(self) -> frozenset[int]:
        """Codes whose consecutive requests in one read run together (:meth:`answer_group`)."""

    def answer_group(
        self, conn: Connection, cmds: Sequence[RemotingCommand]
    ) -> list[RemotingCommand | None]:
        """The replies, in order, of consecutive requests of one :attr:`grouped` code (None:
        no reply), found without waiting."""

    @property
    def durable_grouped(self) -> frozenset[int]:
        """Storing codes whose consecutive requests are stored in the reader and wait for
        one fsync together (SYNC mode; :meth:`store_group`)."""

    def store_group(
        self, conn: Connection, cmds: Sequence[RemotingCommand]
    ) -> tuple[int, Coroutine[Any, Any, list[RemotingCommand | None]]]:
        """Store consecutive requests of one :attr:`durable_grouped` code now, in order:
        how many it took, and the coroutine of their replies (after their fsync)."""

    @property
    def shortest_queue_bound_s(self) -> float:
        """The least of :meth:`queue_bound_s` over every code (a cheap first test)."""

    def connection_closed(self, conn: Connection) -> None:
        """``conn`` is gone: forget whatever was kept about it (the broker's consumers)."""


class BoundRegistry(Generic[Ctx]):
    """A :class:`~broker.remoting.dispatch.Registry` bound to its server's context: the
    :class:`Dispatcher` the broker and the name server run.

    Args:
        registry: request code → handler.
        ctx: what every handler is handed.
        sync: SYNC flush mode: storing requests wait for an fsync, so they get a task too.
        on_close: told about each connection that closes.
        guard: with ACL on, asked about every request before its handler (see the module
            docstring).
        state: the server's bookkeeping, which counts the requests the guard refused.
        send_queue_wait_s: how long a storing request (a send) may wait in line before it
            is answered SYSTEM_BUSY (RocketMQ's ``waitTimeMillsInSendQueue``: 200 ms).
        queue_wait_s: the same for every other request (RocketMQ's pull queue: 5 s).
    """

    def __init__(
        self,
        registry: Registry[Ctx],
        ctx: Ctx,
        *,
        sync: bool = False,
        on_close: Callable[[Connection], None] | None = None,
        guard: Guard | None = None,
        state: ServerState | None = None,
        send_queue_wait_s: float = math.inf,
        queue_wait_s: float = math.inf,
    ) -> None:
        self.registry = registry
        self.ctx = ctx
        self.sync = sync
        self._on_close = on_close
        self.guard = guard
        self._state = state
        # Asked once per request: a set lookup, not two calls through the registry.
        self._waiting = frozenset(registry.parking | (registry.storing if sync else set()))
        self._storing = frozenset(registry.storing)
        self._send_queue_wait_s = send_queue_wait_s
        self._queue_wait_s = queue_wait_s
        self.shortest_queue_bound_s = min(send_queue_wait_s, queue_wait_s)
        self.grouped = frozenset(registry.groups) - self._waiting
        self.durable_grouped = frozenset(registry.durable) if sync else frozenset()

    def dispatch(self, conn: Connection, cmd: RemotingCommand) -> Awaitable[RemotingCommand | None]:
        """Run the handler of ``cmd.code`` (errors become error replies), unless the guard
        refuses it. Returns the registry's coroutine itself: no coroutine frame of its own
        per request."""
        if self.guard is not None and (refusal := self._refusal(conn, cmd)) is not None:
            return _answer(None if cmd.is_oneway else refusal)
        return self.registry.dispatch(self.ctx, conn, cmd)

    def _refusal(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        """The guard's refusal of ``cmd`` (counted), or None when it may run."""
        assert self.guard is not None
        refusal = self.guard(conn.peer, cmd)
        if refusal is not None and self._state is not None:
            self._state.denied += 1
        return refusal

    def may_wait(self, code: int) -> bool:
        """Parking codes, and storing codes in SYNC mode."""
        return code in self._waiting

    def answer_now(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Later | None:
        """The registry's quick handler of ``cmd.code``, unless the guard refuses ``cmd``
        (then the refusal, as :meth:`dispatch` answers it)."""
        if self.guard is not None and (refusal := self._refusal(conn, cmd)) is not None:
            return None if cmd.is_oneway else refusal
        return self.registry.answer_now(self.ctx, conn, cmd)

    def store_group(
        self, conn: Connection, cmds: Sequence[RemotingCommand]
    ) -> tuple[int, Coroutine[Any, Any, list[RemotingCommand | None]]]:
        """The registry's :meth:`~broker.remoting.dispatch.Registry.store_group`; the guard's
        refusals answered in their places."""
        if self.guard is None:
            return self.registry.store_group(self.ctx, conn, cmds)
        return self.registry.store_group(self.ctx, conn, cmds, lambda cmd: self._refusal(conn, cmd))

    def answer_group(
        self, conn: Connection, cmds: Sequence[RemotingCommand]
    ) -> list[RemotingCommand | None]:
        """The registry's group handler over those of ``cmds`` the guard lets run; the
        others get its refusal (as :meth:`dispatch` answers them), in their places."""
        if self.guard is None:
            return self.registry.answer_group(self.ctx, conn, cmds)
        refusals = [self._refusal(conn, cmd) for cmd in cmds]
        allowed = [cmd for cmd, refusal in zip(cmds, refusals, strict=True) if refusal is None]
        answers = iter(self.registry.answer_group(self.ctx, conn, allowed) if allowed else [])
        return [
            next(answers) if refusal is None else None if cmd.is_oneway else refusal
            for cmd, refusal in zip(cmds, refusals, strict=True)
        ]

    def queue_bound_s(self, code: int) -> float:
        """``send_queue_wait_s`` for storing codes, ``queue_wait_s`` for the rest."""
        return self._send_queue_wait_s if code in self._storing else self._queue_wait_s

    def connection_closed(self, conn: Connection) -> None:
        """Pass the news on to ``on_close``."""
        if self._on_close is not None:
            self._on_close(conn)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one server allows (the broker's and the name server's settings of these names)."""

    #: Connections beyond this are closed at once.
    max_connections: int = 4096
    #: Largest frame accepted (and sent), length field included.
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: Replies queued per connection before handlers wait (back-pressure).
    write_queue: int = 256
    #: Requests of one connection that may wait (long polls; stores in SYNC mode) running at
    #: once; beyond it a request is answered SYSTEM_BUSY at once, so memory stays bounded.
    max_waiting_per_connection: int = 64
    #: A connection that sends nothing and has nothing running or unsent for this long is
    #: closed (None: never).
    idle_timeout_s: float | None = 120.0
    #: Connections from one source address beyond this are closed at once (None: no cap).
    max_connections_per_ip: int | None = 1024
    #: Reply bytes one connection may have unsent (its client is not reading them) before
    #: its requests that may wait are answered SYSTEM_BUSY like those past
    #: ``max_waiting_per_connection``: the frame count alone does not bound memory when
    #: replies are large pulls.
    max_unsent_bytes: int = 16 * 1024 * 1024

    @classmethod
    def of(cls, config: _LimitSettings) -> ServerLimits:
        """The limits a broker or name-server config sets (the last two only a broker's)."""
        idle = getattr(config, "idle_timeout_s", 120.0)
        return cls(
            config.max_connections,
            config.max_frame_size,
            config.write_queue,
            getattr(config, "max_waiting_per_connection", 64),
            idle if idle and idle > 0 else None,
            config.max_connections_per_ip or None,
            getattr(config, "max_unsent_bytes_per_connection", 16 * 1024 * 1024),
        )


class _LimitSettings(Protocol):
    @property
    def max_connections(self) -> int: ...
    @property
    def max_frame_size(self) -> int: ...
    @property
    def write_queue(self) -> int: ...
    @property
    def max_connections_per_ip(self) -> int: ...


# ------------------------------------------------------------------ bookkeeping
@dataclass(frozen=True, slots=True)
class ServerStatistics:
    """A snapshot of one server's counters (:meth:`ServerState.statistics`)."""

    #: Connections open now.
    connections: int
    #: Connections served since the start.
    accepted: int
    #: Connections closed at once because ``max_connections`` were open.
    refused: int
    #: Requests running now (including parked long polls).
    in_flight: int
    #: Requests run since the start.
    requests: int
    #: Malformed frames read (answered when their opaque could be read).
    malformed: int
    #: Connections closed because their framing broke.
    broken_framing: int
    #: Frames queued or being written on all connections.
    unsent: int
    #: Requests the ACL refused (answered NO_PERMISSION, or dropped when oneway).
    denied: int = 0
    #: Connections served over TLS since the start.
    tls: int = 0
    #: Requests answered SYSTEM_BUSY (their connection had too many waiting).
    busy: int = 0
    #: Connections closed for idleness.
    idle_closed: int = 0
    #: Connections closed at once because their source address had
    #: ``max_connections_per_ip`` open.
    refused_per_ip: int = 0
    #: Requests answered SYSTEM_BUSY because they waited in line past their bound.
    shed: int = 0
    #: Connections closed before their first request (TLS: first-byte deadline, failed
    #: handshake, plaintext where enforced).
    tls_refused: int = 0


class ServerState:
    """The transport bookkeeping of one server, shared by all its connections.

    ``open_connections`` and ``in_flight`` are what a graceful stop waits on: it is drained
    when no request runs and every connection has written all it was given.
    """

    def __init__(self) -> None:
        self.open_connections: set[Connection] = set()
        self.in_flight = 0
        self.accepted = 0
        self.refused = 0
        self.requests = 0
        self.malformed = 0
        self.broken_framing = 0
        self.denied = 0
        #: Connections served over TLS since the start.
        self.tls = 0
        #: Requests answered SYSTEM_BUSY: their connection had too many waiting.
        self.busy = 0
        #: Connections closed for idleness.
        self.idle_closed = 0
        #: Connections refused by the per-address cap, and requests shed after waiting in
        #: line too long.
        self.refused_per_ip = 0
        self.shed = 0
        #: Connections closed before their first request: silent past the first-byte
        #: deadline, a failed handshake, or plaintext where TLS is enforced.
        self.tls_refused = 0
        self.per_ip = PeerCounts()
        # Tasks in wait_drained; empty (and so free to poke) except during a stop.
        self._drain_waiters = trio.lowlevel.ParkingLot()

    @property
    def connections(self) -> int:
        """Connections open now."""
        return len(self.open_connections)

    def opened(self, conn: Connection) -> None:
        """``conn`` was accepted."""
        self.open_connections.add(conn)
        self.accepted += 1

    def closed(self, conn: Connection) -> None:
        """``conn`` ended; what it had not written is no longer waited for."""
        self.open_connections.discard(conn)
        self.poke()

    def request_started(self) -> None:
        """A request starts running."""
        self.in_flight += 1
        self.requests += 1

    def request_finished(self) -> None:
        """A request finished (its reply, if any, is handed to its connection)."""
        self.in_flight -= 1
        self.poke()

    def drained(self) -> bool:
        """No request is running and every reply has been handed to its socket."""
        return self.in_flight == 0 and all(c.idle for c in self.open_connections)

    def poke(self) -> None:
        """Something that :meth:`drained` depends on went down: wake the waiters if it now
        holds. Costs one check while nobody waits, so connections call it on every write."""
        if self._drain_waiters and self.drained():
            self._drain_waiters.unpark_all()

    async def wait_drained(self) -> None:
        """Wait until :meth:`drained` (no polling: woken by :meth:`poke`); bound it with a
        cancel scope, since a parked long poll or a client that stops reading never drains.
        """
        while not self.drained():  # bounded by the caller's cancel scope
            await self._drain_waiters.park()

    def refusal_counts(self) -> dict[str, int]:
        """Every refusal counted so far, by reason (plain integer reads: safe from another
        thread, such as the Prometheus exporter's)."""
        return {
            "connection_limit": self.refused,
            "per_ip_limit": self.refused_per_ip,
            "tls_handshake": self.tls_refused,
            "idle": self.idle_closed,
            "broken_framing": self.broken_framing,
            "malformed": self.malformed,
            "waiting_limit": self.busy,
            "queue_wait": self.shed,
            "acl": self.denied,
        }

    def statistics(self) -> ServerStatistics:
        """The counters now."""
        return ServerStatistics(
            connections=self.connections,
            accepted=self.accepted,
            refused=self.refused,
            in_flight=self.in_flight,
            requests=self.requests,
            malformed=self.malformed,
            broken_framing=self.broken_framing,
            unsent=sum(c.unsent for c in self.open_connections),
            denied=self.denied,
            tls=self.tls,
            busy=self.busy,
            idle_closed=self.idle_closed,
            refused_per_ip=self.refused_per_ip,
            shed=self.shed,
            tls_refused=self.tls_refused,
        )


# ------------------------------------------------------------------ serving
async def serve_remoting(
    dispatcher: Dispatcher,
    listeners: list[ListenerT],
    limits: ServerLimits,
    state: ServerState,
    *,
    tls: TlsPolicy | None = None,
    task_status: trio.TaskStatus[list[ListenerT]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve Remoting on ``listeners`` until cancelled; reports them when listening. With
    ``tls``, each connection is first told TLS or plaintext by its first byte (and refused
    as its mode says, :class:`broker.tls.TlsPolicy`)."""
    await trio.serve_listeners(
        partial(handle_stream, dispatcher, limits, state, tls=tls),
        listeners,
        task_status=task_status,
    )


async def handle_stream(
    dispatcher: Dispatcher,
    limits: ServerLimits,
    state: ServerState,
    stream: trio.abc.Stream,
    *,
    tls: TlsPolicy | None = None,
) -> None:
    """Serve one connection until it closes, its framing breaks, or the server stops; the
    stream is always closed."""
    if state.connections >= limits.max_connections:
        state.refused += 1
        _log.warning("connection refused: limit reached", limit=limits.max_connections)
        await stream.aclose()
        return
    peer = peer_of(stream)
    if not state.per_ip.admit(peer, limits.max_connections_per_ip):
        state.refused_per_ip += 1
        _log.warning("connection refused: per-address limit reached", peer=peer,
                     limit=limits.max_connections_per_ip)  # fmt: skip
        await trio.aclose_forcefully(stream)
        return
    try:
        await _serve_stream(dispatcher, limits, state, stream, peer, tls)
    finally:
        state.per_ip.release(peer)


async def _serve_stream(
    dispatcher: Dispatcher,
    limits: ServerLimits,
    state: ServerState,
    stream: trio.abc.Stream,
    peer: str,
    tls: TlsPolicy | None,
) -> None:
    if tls is not None:
        served, is_tls = await tls.accept(stream)
        if served is None:
            state.tls_refused += 1
            await trio.aclose_forcefully(stream)
            return
        stream = served
        state.tls += is_tls
    send, receive = trio.open_memory_channel[bytes](limits.write_queue)
    protocol = RemotingConnection(Role.SERVER, max_frame_size=limits.max_frame_size)
    sock = raw_socket(stream)
    conn = Connection(peer, send, stream, protocol, on_idle=state.poke, sock=sock)
    state.opened(conn)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_writer, conn, stream, receive)
            if limits.idle_timeout_s is not None:
                nursery.start_soon(_watch_idle, state, conn, limits.idle_timeout_s, nursery)
            try:
                await _read_requests(dispatcher, limits, state, conn, stream, sock, nursery)
            finally:
                nursery.cancel_scope.cancel()
    except* (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the peer went away while we were writing
    finally:
        conn.closed = True
        protocol.close()
        state.closed(conn)
        dispatcher.connection_closed(conn)
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _watch_idle(
    state: ServerState, conn: Connection, idle_s: float, nursery: trio.Nursery
) -> None:
    """Close ``conn`` once it has been silent for ``idle_s``: no request read, no waiting
    request answered, nothing waiting or unsent, and its reader parked in a read. A task of
    its own that sleeps until the next possible deadline, so a read costs the reader only
    two attribute writes (a cancel scope around every read cost ~5 µs)."""
    while True:  # one wake-up per idle_s at most; ends with its connection
        await trio.sleep_until(conn.last_active + idle_s)
        now = trio.current_time()
        if conn.waiting:
            conn.last_active = now  # a parked poll: its answer moves last_active again
        elif conn.unsent or not conn.reading:
            # A frame on its way (a notification to a silent client) or a request being
            # run: look again shortly instead of granting a whole new timeout, so a silent
            # connection still closes within idle_s + a little.
            await trio.sleep(_IDLE_RECHECK_S)
        elif now >= conn.last_active + idle_s:
            state.idle_closed += 1
            _log.info("closing idle connection", peer=conn.peer, idle_s=idle_s)
            # The reader is parked in receive_some, so no request is cut short.
            nursery.cancel_scope.cancel()
            return


async def _read_requests(
    dispatcher: Dispatcher,
    limits: ServerLimits,
    state: ServerState,
    conn: Connection,
    stream: trio.abc.ReceiveStream,
    sock: trio.socket.SocketType | None,
    nursery: trio.Nursery,
) -> None:
    data: bytes | bytearray
    reader = None if sock is None else SocketReader(sock, RECEIVE_SIZE)
    while True:
        conn.reading = True
        try:
            if reader is not None:  # one syscall, no scheduler round after a wait
                data = await reader.receive_some()
            else:
                data = await stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            conn.reading = False
        conn.last_active = received_at = trio.current_time()
        conn.protocol.receive_data(data)
        more = await _run_requests(dispatcher, limits, state, conn, nursery, received_at)
        await conn.flush()  # the burst's replies, before a close too
        if not more:
            return


async def _run_requests(
    dispatcher: Dispatcher,
    limits: ServerLimits,
    state: ServerState,
    conn: Connection,
    nursery: trio.Nursery,
    received_at: float,
) -> bool:
    """Run every complete request of what was read at ``received_at``; False when the
    connection must close. A request that waited in line past its bound (the requests
    before it in the same read took that long) is answered SYSTEM_BUSY instead."""
    protocol = conn.protocol
    shortest_bound = dispatcher.shortest_queue_bound_s
    grouped = dispatcher.grouped
    durable_grouped = dispatcher.durable_grouped
    after: Event | None = None  # read past a group of requests: handled next
    while True:
        try:
            event = protocol.next_event() if after is None else after
        except ProtocolError as exc:
            state.broken_framing += 1
            _log.info("closing connection on bad framing", peer=conn.peer, error=str(exc))
            return False
        after = None
        if event is NEED_DATA:
            return True
        if type(event) is Request:  # the common case first
            cmd = event.command
            waited = trio.current_time() - received_at
            if waited > shortest_bound and waited > (bound := dispatcher.queue_bound_s(cmd.code)):
                state.shed += 1
                _refuse_busy(conn, cmd, _in_line(waited, bound))
            elif cmd.code in grouped:
                after = _run_group(dispatcher, state, conn, cmd, received_at)
            elif not dispatcher.may_wait(cmd.code):
                await _run_inline(dispatcher, state, conn, cmd)
            elif (over := _over_connection_cap(limits, conn)) is not None:
                state.busy += 1
                _refuse_busy(conn, cmd, over)
            elif cmd.code in durable_grouped:
                after = _store_group(dispatcher, limits, state, conn, nursery, cmd, received_at)
            elif not _answer_now(dispatcher, state, conn, cmd):
                conn.waiting += 1
                nursery.start_soon(_run_request, dispatcher, state, conn, cmd, received_at)
            if len(conn.held) >= _MAX_HELD:  # bounds what one read can pile up
                await conn.flush()
        elif isinstance(event, Malformed):
            state.malformed += 1
            answer = protocol.answer_malformed(event)
            if answer is not None:
                conn.hold(answer)
        elif isinstance(event, Closed):
            return False
        # Responses: answers to our oneway notifications, nothing to do.


def _over_connection_cap(limits: ServerLimits, conn: Connection) -> str | None:
    """Why a request of ``conn`` that may wait must be refused now (None: run it): too
    many of its requests wait already, or its client leaves too many reply bytes unread."""
    if conn.waiting >= limits.max_waiting_per_connection:
        return (
            f"system busy: {conn.waiting} requests of this connection wait "
            f"(limit {limits.max_waiting_per_connection})"
        )
    if conn.unsent_bytes >= limits.max_unsent_bytes:
        return (
            f"system busy: {conn.unsent_bytes} bytes of replies to this connection are "
            f"unread (limit {limits.max_unsent_bytes})"
        )
    return None


def _in_line(waited_s: float, bound_s: float) -> str:
    # RocketMQ's words (TIMEOUT_CLEAN_QUEUE), which its clients' logs and operators know.
    return (
        f"[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: "
        f"{waited_s * 1000:.0f}ms, limit {bound_s * 1000:.0f}ms"
    )


def _refuse_busy(conn: Connection, cmd: RemotingCommand, remark: str) -> None:
    """Answer ``cmd`` SYSTEM_BUSY with the burst's replies (a oneway one is dropped)."""
    if not cmd.is_oneway:
        conn.hold(encode_reply(conn.protocol, cmd, cmd.response(ResponseCode.SYSTEM_BUSY, remark)))


async def _run_inline(
    dispatcher: Dispatcher, state: ServerState, conn: Connection, cmd: RemotingCommand
) -> None:
    """Run a request in the reader; its reply is held for the burst's write."""
    state.request_started()
    try:
        reply = await dispatcher.dispatch(conn, cmd)
        if reply is not None and not cmd.is_oneway and not conn.closed:
            conn.hold(encode_reply(conn.protocol, cmd, reply))
    finally:
        state.request_finished()


def _run_group(
    dispatcher: Dispatcher,
    state: ServerState,
    conn: Connection,
    first: RemotingCommand,
    received_at: float,
) -> Event | None:
    """Run ``first`` together with the requests of its code right behind it in what was read
    (at most ``_MAX_HELD``; one past its queue bound is left for the caller to refuse), in
    the reader; their replies are held for the burst's write, in order. Returns the event
    read past them (None: nothing more was complete), which the caller handles next."""
    cmds, after = _same_code_behind(dispatcher, conn, first, received_at, _MAX_HELD)
    for _ in cmds:
        state.request_started()
    try:
        replies = dispatcher.answer_group(conn, cmds)
        for cmd, reply in zip(cmds, replies, strict=True):
            if reply is not None and not cmd.is_oneway and not conn.closed:
                conn.hold(encode_reply(conn.protocol, cmd, reply))
    finally:
        for _ in cmds:
            state.request_finished()
    return after


def _same_code_behind(
    dispatcher: Dispatcher,
    conn: Connection,
    first: RemotingCommand,
    received_at: float,
    most: int,
) -> tuple[list[RemotingCommand], Event | None]:
    """``first`` and the requests of its code right behind it in what was read, at most
    ``most`` in all; one past its queue bound is left for the caller to refuse. Returns them
    and the event read past them (None: nothing more was complete), which the caller
    handles next."""
    protocol = conn.protocol
    cmds = [first]
    while len(cmds) < most:  # bounded
        try:
            event = protocol.next_event()
        except ProtocolError:
            break  # broken framing: the caller's next read raises it again
        if event is NEED_DATA:
            break
        if type(event) is Request and event.command.code == first.code:
            waited = trio.current_time() - received_at
            if waited <= dispatcher.queue_bound_s(first.code):
                cmds.append(event.command)
                continue
        return cmds, event
    return cmds, None


def _store_group(
    dispatcher: Dispatcher,
    limits: ServerLimits,
    state: ServerState,
    conn: Connection,
    nursery: trio.Nursery,
    first: RemotingCommand,
    received_at: float,
) -> Event | None:
    """SYNC mode: ``first`` and the requests of its code right behind it (as many as the
    connection may still have waiting, at most ``_MAX_HELD``) stored now, in the reader, in
    the order they came; one task waits for their fsync and writes their replies in one go
    (a task, an fsync wait and a write per send cost more than the send). Those the store
    hands back (a delayed or half message) get a task each, as before. Returns the event
    read past them, which the caller handles next."""
    room = min(_MAX_HELD, limits.max_waiting_per_connection - conn.waiting)
    cmds, after = _same_code_behind(dispatcher, conn, first, received_at, max(1, room))
    taken, replies = dispatcher.store_group(conn, cmds)
    conn.waiting += len(cmds)
    if taken:
        for _ in range(taken):
            state.request_started()
        nursery.start_soon(_settle_group, state, conn, cmds[:taken], replies)
    else:
        replies.close()
    for cmd in cmds[taken:]:
        nursery.start_soon(_run_request, dispatcher, state, conn, cmd, received_at)
    return after


async def _settle_group(
    state: ServerState,
    conn: Connection,
    cmds: list[RemotingCommand],
    replies: Coroutine[Any, Any, list[RemotingCommand | None]],
) -> None:
    """Wait for a stored group's fsync, then write its replies (counted in ``conn.waiting``
    by its starter)."""
    try:
        answers = await replies
        await conn.send_responses(zip(cmds, answers, strict=True))
    finally:
        conn.waiting -= len(cmds)
        conn.last_active = trio.current_time()
        for _ in cmds:  # only once the replies are handed over (see _run_request)
            state.request_finished()


def _answer_now(
    dispatcher: Dispatcher, state: ServerState, conn: Connection, cmd: RemotingCommand
) -> bool:
    """Answer a request that may wait, in the reader, when its answer is ready (a pull of a
    queue with messages to read): a task per such request cost more than the request. Its
    reply is held for the burst's write. False when it must wait after all (a task runs it).
    """
    reply = dispatcher.answer_now(conn, cmd)
    if reply is LATER:
        return False
    state.request_started()
    try:
        if reply is not None and not cmd.is_oneway and not conn.closed:
            conn.hold(encode_reply(conn.protocol, cmd, reply))
    finally:
        state.request_finished()
    return True


async def _run_request(
    dispatcher: Dispatcher,
    state: ServerState,
    conn: Connection,
    cmd: RemotingCommand,
    received_at: float,
) -> None:
    """Run a request in a task of its own (counted in ``conn.waiting`` by its starter); it
    writes its reply itself. A task that starts only past the request's queue bound (an
    overloaded event loop) answers SYSTEM_BUSY instead."""
    state.request_started()
    try:
        waited, bound = trio.current_time() - received_at, dispatcher.queue_bound_s(cmd.code)
        if waited > bound:
            state.shed += 1
            reply: RemotingCommand | None = cmd.response(
                ResponseCode.SYSTEM_BUSY, _in_line(waited, bound)
            )
        else:
            reply = await dispatcher.dispatch(conn, cmd)
        if reply is not None and not cmd.is_oneway:
            await conn.send_response(cmd, reply)
    finally:
        conn.waiting -= 1
        conn.last_active = trio.current_time()
        # Only once the reply is handed over: a graceful stop waits for in_flight == 0 and
        # then for the writers to drain.
        state.request_finished()
