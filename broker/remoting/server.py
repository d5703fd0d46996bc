"""The TCP side: accept connections, decode frames, run requests, write replies.

One nursery per connection owns its writer task and one task per request (see
``broker.remoting.connection``). Malformed input never crashes anything: a bad header in a
well-delimited frame or an oversize frame whose header could be read is answered with an
error on its opaque and the connection stays open; broken framing closes the connection, as
RocketMQ's Netty decoder does.
"""

from __future__ import annotations

import trio

from broker.context import BrokerContext
from broker.logs import get_logger
from broker.remoting.connection import Connection, run_writer
from protocol.codes import SerializeType
from protocol.command import FLAG_RESPONSE, RemotingCommand
from protocol.errors import FrameTooLargeError, HeaderError, ProtocolError
from protocol.frame import FrameDecoder

_log = get_logger("server")
RECEIVE_SIZE = 65536


async def handle_connection(ctx: BrokerContext, stream: trio.SocketStream) -> None:
    """Serve one client connection until it closes or the broker stops."""
    if ctx.connections >= ctx.config.max_connections:
        _log.warning("connection refused: limit reached", limit=ctx.config.max_connections)
        await stream.aclose()
        return
    ctx.connections += 1
    peer = peer_of(stream)
    send, receive = trio.open_memory_channel[RemotingCommand](ctx.config.write_queue)
    conn = Connection(peer, send, stream, ctx.config.max_frame_size)
    ctx.open_connections.add(conn)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_writer, conn, stream, receive, ctx.config.max_frame_size)
            try:
                await _read_requests(ctx, conn, stream, nursery)
            finally:
                nursery.cancel_scope.cancel()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the peer went away while we were writing
    finally:
        conn.closed = True
        ctx.open_connections.discard(conn)
        ctx.connections -= 1
        ctx.consumers.connection_closed(conn)
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _read_requests(
    ctx: BrokerContext, conn: Connection, stream: trio.SocketStream, nursery: trio.Nursery
) -> None:
    decoder = FrameDecoder(ctx.config.max_frame_size)
    while True:
        try:
            data = await stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        decoder.feed(data)
        if not await _run_requests(ctx, conn, decoder, nursery) or not data:
            return


async def _run_requests(
    ctx: BrokerContext, conn: Connection, decoder: FrameDecoder, nursery: trio.Nursery
) -> bool:
    """Run every complete request; False when the connection must close.

    A request that may wait (a long poll, a send waiting for its fsync in SYNC mode) gets a
    task of its own, so it never holds up the requests behind it. Every other request is run
    right here, in the reader: a task per request costs more than most requests do."""
    sync = ctx.config.flush == "sync"
    while True:
        try:
            cmd = decoder.next_command()
        except ProtocolError as exc:
            if exc.fatal:
                _log.info("closing connection on bad framing", peer=conn.peer, error=str(exc))
                return False
            answer_malformed(conn, exc)
            continue
        if cmd is None:
            return True
        if cmd.is_response:
            continue  # answers to our oneway notifications: nothing to do
        if ctx.registry.may_wait(cmd.code, sync=sync):
            nursery.start_soon(_run_request, ctx, conn, cmd)
        else:
            # The last request of a burst writes its reply itself; earlier ones queue theirs
            # so that the writer sends the burst's replies in one write.
            await _run_request(ctx, conn, cmd, direct=decoder.buffered < 8)


async def _run_request(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand, *, direct: bool = True
) -> None:
    ctx.in_flight += 1
    try:
        reply = await ctx.registry.dispatch(ctx, conn, cmd)
        if reply is not None:
            await conn.send(reply, direct=direct)
    finally:
        # Only once the reply is queued: a graceful stop waits for in_flight == 0 and then
        # for the writers to drain their queues.
        ctx.in_flight -= 1


def answer_malformed(conn: Connection, exc: ProtocolError) -> None:
    """Answer a request whose header could not be decoded, on its opaque if known."""
    opaque = getattr(exc, "opaque", None)
    stype = getattr(exc, "serialize_type", None)
    if isinstance(exc, (HeaderError, FrameTooLargeError)) and opaque is not None:
        reply = RemotingCommand(
            code=exc.code,
            opaque=opaque,
            flag=FLAG_RESPONSE,
            remark=str(exc)[:512],
            serialize_type=SerializeType(stype) if stype in (0, 1, 0x4D) else SerializeType.JSON,
        )
        conn.notify_nowait(reply)


def peer_of(stream: trio.SocketStream) -> str:
    """``host:port`` of the other end, ``?`` when the socket cannot say."""
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
