"""One multiplexed Remoting connection on anyio (works under trio and asyncio).

Theory of operation: the protocol state lives in a sans-IO
:class:`~protocol.connection.RemotingConnection` (opaques, which requests await a reply,
decoding); this module is its anyio side. :meth:`Connection.request` has it encode the
request with a fresh ``opaque``, queues the frame (see :meth:`Connection._write`), and parks
on a slot keyed by that opaque. One reader task (:meth:`Connection.run`, owned by the
caller's task group) feeds what arrives to the protocol and fills the slots of the responses
it matches, so any number of requests — a 30 s long poll beside a send — share the
connection and their replies come back in whatever order the broker answers. Requests the
broker initiates (``NOTIFY_CONSUMER_IDS_CHANGED``, ``CHECK_TRANSACTION_STATE``…) go to an
``on_request`` callback; unknown ones are answered ``REQUEST_CODE_NOT_SUPPORTED`` so the
broker never waits on us. A reply that comes after its requester gave up is dropped.

Timeouts are cancel scopes at the call site of each request (``fail_after``), turned into
:class:`RequestTimeoutError`. When the connection ends (EOF, reset, a frame we cannot decode)
every waiting request fails at once with :class:`ConnectionLostError` instead of waiting out
its timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from client.errors import ConnectionLostError, RequestTimeoutError
from protocol.codes import ResponseCode, SerializeType
from protocol.command import RemotingCommand
from protocol.connection import (
    NEED_DATA,
    Closed,
    Malformed,
    RemotingConnection,
    Request,
    Response,
    Role,
)
from protocol.errors import ProtocolError

#: Called for each request the broker sends us; returns the reply, or None for none.
#: ``handler(request, address)``: answers a request the server sent (None: no answer).
RequestHandler = Callable[[RemotingCommand, str], Awaitable[RemotingCommand | None]]
_READ_SIZE = 256 * 1024
#: Queued bytes above which writers wait for the socket.
_MAX_OUTBOX = 4 * 1024 * 1024
#: A send that makes no progress this long fails the connection.
_SEND_STALL = 30.0


class _Slot:
    """Where the reader puts the reply of one pending request."""

    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.reply: RemotingCommand | None = None


class Connection:
    """One TCP connection to a broker or name server (see the module docstring).

    Args:
        stream: a connected byte stream; the connection owns and closes it.
        address: ``host:port``, for messages.
        serialize_type: header encoding of our requests (msgpack by default for our own
            broker; JSON for any RocketMQ server).
        on_request: handler for requests the server sends us.
        max_frame_size: largest frame accepted from the server.
    """

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        address: str,
        *,
        serialize_type: SerializeType = SerializeType.MSGPACK,
        on_request: RequestHandler | None = None,
        max_frame_size: int = 64 * 1024 * 1024,
    ) -> None:
        self.stream = stream
        self.address = address
        self.serialize_type = serialize_type
        self._on_request = on_request
        self._protocol = RemotingConnection(
            Role.CLIENT, max_frame_size=max_frame_size, serialize_type=serialize_type
        )
        #: Where the reader puts each awaited reply, by opaque (the protocol's pending ones).
        self._slots: dict[int, _Slot] = {}
        # Outgoing frames not yet written, and whether a task is writing them (see _write).
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._flushing = False
        self._drained = anyio.Event()
        self._closed = False
        self._error: str | None = None
        self._task_group: anyio.abc.TaskGroup | None = None

    @property
    def closed(self) -> bool:
        """True once the connection ended; a closed connection is never reused."""
        return self._closed

    # ------------------------------------------------------------------ requests
    async def request(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:  # noqa: ASYNC109
        """Send ``cmd`` and wait up to ``timeout`` seconds for its reply.

        Raises:
            RequestTimeoutError: no reply in time (the request may still have been applied).
            ConnectionLostError: the connection closed first.
        """
        self._check_open()
        opaque, data = self._protocol.send_request(cmd)
        slot = self._slots[opaque] = _Slot()
        try:
            with anyio.fail_after(timeout):
                await self._write(data)
                await slot.event.wait()
        except TimeoutError:
            raise RequestTimeoutError(
                f"no reply from {self.address} to request code {cmd.code} within {timeout:g} s"
            ) from None
        finally:
            del self._slots[opaque]
            self._protocol.abandon(opaque)  # a reply still to come is nobody's now
        if slot.reply is None:
            raise ConnectionLostError(f"connection to {self.address} lost: {self._error}")
        return slot.reply

    async def oneway(self, cmd: RemotingCommand, timeout: float) -> None:  # noqa: ASYNC109
        """Send ``cmd`` flagged oneway: the server sends no reply."""
        self._check_open()
        _, data = self._protocol.send_request(cmd, oneway=True)
        try:
            with anyio.fail_after(timeout):
                await self._write(data)
        except TimeoutError:
            raise RequestTimeoutError(f"oneway write to {self.address} timed out") from None

    async def _write(self, data: bytes) -> None:
        """Queue ``data``; the first writer writes everything queued, in one send per round.

        Concurrent requests (a producer's many tasks) thus share syscalls instead of taking
        turns on a lock. The send itself is shielded from the caller's cancel scope: a send
        cancelled half-way would leave a partial frame on the wire and break every other
        request; a peer that stops reading for ``_SEND_STALL`` seconds fails the connection
        instead. Writers wait while more than ``_MAX_OUTBOX`` bytes are queued (back-pressure).
        """
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if self._flushing:
            while self._flushing and self._outbox_bytes > _MAX_OUTBOX:  # bounded by the flusher
                await self._drained.wait()
            return
        self._flushing = True
        try:
            with anyio.CancelScope(shield=True):
                await self._flush()
        finally:
            self._flushing = False
            self._drained.set()
            self._drained = anyio.Event()
        if self._closed:
            raise ConnectionLostError(f"connection to {self.address} lost: {self._error}")

    async def _flush(self) -> None:
        while self._outbox and not self._closed:
            chunk = b"".join(self._outbox)
            self._outbox.clear()
            self._outbox_bytes = 0
            self._drained.set()
            self._drained = anyio.Event()
            try:
                with anyio.fail_after(_SEND_STALL):
                    await self.stream.send(chunk)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                self._fail(f"write failed: {exc!r}")
            except TimeoutError:
                self._fail(f"peer stopped reading for {_SEND_STALL:g} s")
                await self.stream.aclose()  # ends the reader too

    def _check_open(self) -> None:
        if self._closed:
            raise ConnectionLostError(f"connection to {self.address} is closed: {self._error}")

    # ------------------------------------------------------------------ reading
    async def run(self) -> None:
        """Read and dispatch frames until the connection ends; then fail what is pending.
        Start it in a task group that outlives the connection's use."""
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                await self._read_loop()
                tg.cancel_scope.cancel()
        finally:
            self._fail(self._error or "closed")
            with anyio.CancelScope(shield=True):
                await self.stream.aclose()

    async def _read_loop(self) -> None:
        while True:
            try:
                data = await self.stream.receive(_READ_SIZE)
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                data = b""
            except (anyio.BrokenResourceError, OSError) as exc:
                self._fail(f"read failed: {exc!r}")
                return
            self._protocol.receive_data(data)
            try:
                ended = self._take_events()
            except ProtocolError as exc:
                # The peer sent bytes we cannot frame: nothing after them can be trusted.
                ended = f"undecodable frame: {exc}"
            if ended is not None:
                self._fail(ended)
                return

    def _take_events(self) -> str | None:
        """Deliver every complete event; why the connection ended, once it has."""
        while True:  # bounded: every event consumes buffered bytes
            event = self._protocol.next_event()
            if event is NEED_DATA:
                return None
            if isinstance(event, Response):
                slot = self._slots[event.command.opaque]  # pending means its slot is there
                slot.reply = event.command
                slot.event.set()
            elif isinstance(event, Request):
                if self._task_group is not None:
                    self._task_group.start_soon(self._answer, event.command)
            elif isinstance(event, Malformed):
                # A response we cannot read leaves some request waiting for ever: give up
                # on the connection, as for broken framing.
                return f"undecodable frame: {event.error}"
            elif isinstance(event, Closed):
                return "closed by peer"
            # UnsolicitedResponse: its requester timed out and left.

    async def _answer(self, cmd: RemotingCommand) -> None:
        reply: RemotingCommand | None
        if self._on_request is None:
            reply = cmd.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not supported")
        else:
            reply = await self._on_request(cmd, self.address)
        if reply is None or cmd.is_oneway:
            return
        # A lost connection is reported by the reader; nothing to do here.
        with contextlib.suppress(ConnectionLostError):
            await self._write(self._protocol.send_response(cmd, reply))

    # ------------------------------------------------------------------ closing
    def _fail(self, reason: str) -> None:
        """Mark the connection dead and wake every waiting request (they raise)."""
        if not self._closed:
            self._closed = True
            self._error = reason
        for opaque in self._protocol.close():
            self._slots[opaque].event.set()

    async def aclose(self) -> None:
        """Close the stream; the reader then ends and pending requests fail."""
        self._fail("closed by client")
        await self.stream.aclose()
