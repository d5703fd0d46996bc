"""One client connection: many requests in flight, replies written as they are ready.

Theory of operation: the reader (``broker.remoting.server``) turns bytes into requests with
the connection's :class:`~protocol.connection.RemotingConnection` and runs them, a request
that may wait in a task of its own, so a parked long poll never holds up the requests behind
it. Replies are encoded by that same protocol object (on the request's opaque, in its
serialize type). The replies of the requests the reader runs itself are held (:meth:`hold`)
until the burst of requests that one ``receive_some`` brought is done, then written in one
``send_all`` (:meth:`flush`): no scheduling round and no syscall per request, and a reader
blocked in that write is the back-pressure on a client that stops reading. A request that
runs in a task of its own writes its reply straight to the socket when nothing else is
waiting to be written; otherwise it goes through a bounded channel to one writer task, which
sends whatever has queued up in one ``send_all``; when the channel is full, such handlers
wait: a slow reader slows only its own connection.

:attr:`Connection.unsent` counts the frames handed over and not yet written, whichever way
they go, so "every reply has left" is one comparison and the server hears (``on_idle``) the
moment it becomes true: a graceful stop waits for that instead of polling.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import trio

from broker.logs import get_logger
from broker.sockio import send_now
from protocol.codes import ResponseCode
from protocol.command import FLAG_RESPONSE, RemotingCommand
from protocol.connection import RemotingConnection, Role
from protocol.errors import EncodeError
from protocol.frame import encode_command

_log = get_logger("connection")
_ids = itertools.count(1)
#: Replies written in one send_all at most (bounds the burst after a stall).
_MAX_BATCH = 128
#: Most bytes the writer joins into one ``send_all`` (small frames still go out together).
_JOIN_BYTES = 256 * 1024


def _nothing() -> None:
    pass


@dataclass(eq=False)
class Connection:
    """A client connection as the processors see it."""

    peer: str
    #: Encoded frames for the writer task.
    send_channel: trio.MemorySendChannel[bytes]
    #: The socket, written directly when nothing is queued (saves a hop through the writer).
    stream: trio.abc.SendStream | None = None
    #: The protocol state: opaques of our notifications, encoding of replies.
    protocol: RemotingConnection = field(default_factory=lambda: RemotingConnection(Role.SERVER))
    #: Called each time the last unsent frame has been written.
    on_idle: Callable[[], None] = _nothing
    write_lock: trio.StrictFIFOLock = field(default_factory=trio.StrictFIFOLock)
    id: int = field(default_factory=lambda: next(_ids))
    closed: bool = False
    #: Frames queued or being written, not yet handed to the socket.
    unsent: int = 0
    #: Bytes of those frames: what a client that stops reading pins here (the server stops
    #: starting requests that may wait once it passes a bound).
    unsent_bytes: int = 0
    #: Requests of this connection running in tasks of their own (long polls, stores in
    #: SYNC mode): capped by the server, and a connection with any is never idle.
    waiting: int = 0
    #: When the connection last did something (a read, a waiting request answered), trio time.
    last_active: float = field(default_factory=trio.current_time)
    #: The reader is parked in a read (so closing the connection cuts no request short).
    reading: bool = False
    #: Replies held by the reader for its next :meth:`flush`.
    held: list[bytes] = field(default_factory=list)
    #: A plain TCP stream's socket, written with one non-blocking syscall before falling
    #: back to ``send_all`` (:mod:`broker.sockio`); None for TLS and memory streams.
    sock: trio.socket.SocketType | None = None

    @property
    def max_frame_size(self) -> int:
        """Largest frame accepted from this client (and sent to it)."""
        return self.protocol.max_frame_size

    @property
    def idle(self) -> bool:
        """Nothing is waiting to be written."""
        return self.unsent == 0

    async def send_response(self, request: RemotingCommand, reply: RemotingCommand) -> None:
        """Send ``reply`` to ``request``: straight to the socket when nothing else is unsent
        (one scheduling round less), else through the writer's queue (which batches a burst
        of replies into one write; waits while the queue is full: back-pressure)."""
        if self.closed:
            return
        await self._write(encode_reply(self.protocol, request, reply))

    async def send_responses(
        self, answered: Iterable[tuple[RemotingCommand, RemotingCommand | None]]
    ) -> None:
        """Send the replies of several requests (None: no reply) in one write, in order."""
        if self.closed:
            return
        protocol = self.protocol
        data = b"".join(
            [encode_reply(protocol, cmd, reply) for cmd, reply in answered if reply is not None]
        )
        if data:
            await self._write(data)

    def hold(self, data: bytes) -> None:
        """Keep an encoded frame for the reader's next :meth:`flush` (counted as unsent)."""
        self.held.append(data)
        self.unsent += 1
        self.unsent_bytes += len(data)

    async def flush(self) -> None:
        """Write the held frames in one ``send_all`` (after anything already being written:
        the write lock is FIFO).

        Raises:
            trio.BrokenResourceError, trio.ClosedResourceError: the peer went away.
        """
        held = self.held
        if not held:
            return
        self.held = []
        try:
            if self.stream is not None and not self.closed:
                await _send_locked(self.write_lock, self.stream, held, self.sock)
        finally:
            self.written(len(held), sum(map(len, held)))

    def notify_nowait(self, cmd: RemotingCommand) -> bool:
        """Queue a broker-initiated oneway request (its opaque from :meth:`next_opaque`)
        without waiting; False if it was dropped (a client too slow to read its replies does
        not get notifications either)."""
        if self.closed:
            return False
        try:
            data = encode_command(cmd)
        except EncodeError as exc:
            _log.warning("notification not encodable", code=cmd.code, error=str(exc))
            return False
        return self.write_nowait(data)

    def write_nowait(self, data: bytes) -> bool:
        """Queue an encoded frame without waiting; False if it was dropped (queue full or
        connection gone)."""
        if self.closed:
            return False
        try:
            self.send_channel.send_nowait(data)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        self.unsent += 1
        self.unsent_bytes += len(data)
        return True

    def next_opaque(self) -> int:
        """Opaque for a request the broker sends to this client."""
        return self.protocol.next_opaque()

    def written(self, frames: int, nbytes: int) -> None:
        """``frames`` of ``nbytes`` in all left for the socket (or were given up on)."""
        self.unsent -= frames
        self.unsent_bytes -= nbytes
        if not self.unsent:
            self.on_idle()

    async def _write(self, data: bytes) -> None:
        self.unsent += 1
        self.unsent_bytes += len(data)
        queued = False
        try:
            # unsent == 1: only this frame, so neither the writer nor another request is
            # writing (both hold unsent frames while they do); the lock still orders us
            # before anything queued while our send_all blocks.
            if self.unsent == 1 and self.stream is not None:
                await _send_locked(self.write_lock, self.stream, [data], self.sock)
            else:
                await self.send_channel.send(data)
                queued = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True
        finally:
            if not queued:  # written, failed or cancelled: the writer will never see it
                self.written(1, len(data))


def encode_reply(
    protocol: RemotingConnection, request: RemotingCommand, reply: RemotingCommand
) -> bytes:
    """Encode ``reply`` to ``request``; a reply that cannot be encoded (too large, a field
    the header type cannot carry) becomes a plain SYSTEM_ERROR, so the client still hears."""
    try:
        return protocol.send_response(request, reply)
    except EncodeError as exc:
        _log.warning("reply not encodable", opaque=request.opaque, error=str(exc))
        fallback = RemotingCommand(
            code=ResponseCode.SYSTEM_ERROR,
            opaque=request.opaque,
            flag=FLAG_RESPONSE,
            remark="reply could not be encoded",
            serialize_type=request.serialize_type,
        )
        return protocol.send_response(request, fallback)


async def run_writer(
    conn: Connection, stream: trio.abc.SendStream, receive: trio.MemoryReceiveChannel[bytes]
) -> None:
    """Send queued frames, batching whatever is ready, until the channel closes.

    Raises:
        trio.BrokenResourceError, trio.ClosedResourceError: the peer went away; the
            connection's handler ends the connection on it.
    """
    async with receive:
        async for data in receive:
            frames = [data]
            while len(frames) < _MAX_BATCH:
                try:
                    frames.append(receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            try:
                await _send_locked(conn.write_lock, stream, frames, conn.sock)
            finally:
                conn.written(len(frames), sum(map(len, frames)))


async def _send_locked(
    lock: trio.StrictFIFOLock,
    stream: trio.abc.SendStream,
    frames: list[bytes],
    sock: trio.socket.SocketType | None,
) -> None:
    """:func:`_send_frames` holding ``lock``. A free lock is taken without ``acquire``'s
    scheduling round (``async with lock`` yields once even when nobody holds it): with one
    request in flight that round cost as much as the write itself, and ``send_all`` is a
    checkpoint anyway. A held lock is waited for in FIFO order as before."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
    try:
        await _send_frames(stream, frames, sock)
    finally:
        lock.release()


async def _send_frames(
    stream: trio.abc.SendStream, frames: list[bytes], sock: trio.socket.SocketType | None
) -> None:
    """Write ``frames`` in as few writes as possible, joining at most ``_JOIN_BYTES`` at a
    time: a batch of large pull replies is not copied whole next to its frames (a reader
    that stops reading would pin both). With ``sock``, each piece is first written with one
    non-blocking syscall; only what the socket did not take goes through ``send_all``."""
    for piece in _pieces(frames):
        sent = 0 if sock is None else send_now(sock, piece)
        if sent < len(piece):
            await stream.send_all(memoryview(piece)[sent:] if sent else piece)


def _pieces(frames: list[bytes]) -> Iterator[bytes]:
    """``frames`` joined into pieces of at most ``_JOIN_BYTES`` (a larger frame alone)."""
    if len(frames) == 1:
        yield frames[0]
        return
    chunk: list[bytes] = []
    size = 0
    for frame in frames:
        if chunk and size + len(frame) > _JOIN_BYTES:
            yield chunk[0] if len(chunk) == 1 else b"".join(chunk)
            chunk, size = [], 0
        chunk.append(frame)
        size += len(frame)
    yield chunk[0] if len(chunk) == 1 else b"".join(chunk)
