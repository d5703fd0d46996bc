"""One client connection: many requests in flight, replies written as they are ready.

Theory of operation: the reader (``broker.remoting.server``) decodes frames and starts one task
per request in the connection's nursery, so a parked long poll never holds up the requests
behind it. Every reply goes through a bounded channel to one writer task, which encodes and
sends whatever has queued up in one ``send_all`` (fewer syscalls under load). When the
channel is full, handlers wait: a slow reader slows only its own connection (back-pressure).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import trio

from broker.logs import get_logger
from protocol.codes import ResponseCode
from protocol.command import FLAG_RESPONSE, RemotingCommand
from protocol.errors import EncodeError
from protocol.frame import encode_command

_log = get_logger("connection")
_ids = itertools.count(1)
#: Replies written in one send_all at most (bounds the burst after a stall).
_MAX_BATCH = 128


@dataclass(eq=False)
class Connection:
    """A client connection as the processors see it."""

    peer: str
    send_channel: trio.MemorySendChannel[RemotingCommand]
    #: The socket, written directly when no reply is queued (saves a hop through the writer).
    stream: trio.abc.SendStream | None = None
    max_frame_size: int = 16 * 1024 * 1024
    write_lock: trio.StrictFIFOLock = field(default_factory=trio.StrictFIFOLock)
    id: int = field(default_factory=lambda: next(_ids))
    client_ids: set[str] = field(default_factory=set)
    closed: bool = False
    _opaques: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def send(self, cmd: RemotingCommand, *, direct: bool = True) -> None:
        """Send ``cmd``: straight to the socket when ``direct``, nothing is queued and nobody
        is writing (one scheduling round less per request), else through the writer's queue
        (which batches a burst of replies into one write; waits while the queue is full:
        back-pressure)."""
        if self.closed:
            return
        try:
            if (
                direct
                and self.stream is not None
                and not self.write_lock.locked()
                and self.send_channel.statistics().current_buffer_used == 0
            ):
                data = encode_reply(cmd, self.max_frame_size)
                async with self.write_lock:
                    await self.stream.send_all(data)
            else:
                await self.send_channel.send(cmd)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True

    def notify_nowait(self, cmd: RemotingCommand) -> bool:
        """Queue a broker-initiated oneway request without waiting; False if it was dropped
        (a client too slow to read its replies does not get notifications either)."""
        if self.closed:
            return False
        try:
            self.send_channel.send_nowait(cmd)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    def next_opaque(self) -> int:
        """Opaque for a request the broker sends to this client."""
        return next(self._opaques)


def encode_reply(cmd: RemotingCommand, max_frame_size: int) -> bytes:
    """Encode a reply; a reply that cannot be encoded becomes a plain SYSTEM_ERROR."""
    try:
        return encode_command(cmd, max_frame_size=max_frame_size)
    except EncodeError as exc:
        _log.warning("reply not encodable", opaque=cmd.opaque, error=str(exc))
        fallback = RemotingCommand(
            code=ResponseCode.SYSTEM_ERROR,
            opaque=cmd.opaque,
            flag=FLAG_RESPONSE,
            remark="reply could not be encoded",
            serialize_type=cmd.serialize_type,
        )
        return encode_command(fallback)


async def run_writer(
    conn: Connection,
    stream: trio.abc.SendStream,
    receive: trio.MemoryReceiveChannel[RemotingCommand],
    max_frame_size: int,
) -> None:
    """Send queued replies, batching whatever is ready, until the channel closes."""
    async with receive:
        async for cmd in receive:
            frames = [encode_reply(cmd, max_frame_size)]
            while len(frames) < _MAX_BATCH:
                try:
                    frames.append(encode_reply(receive.receive_nowait(), max_frame_size))
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            async with conn.write_lock:
                await stream.send_all(b"".join(frames))
