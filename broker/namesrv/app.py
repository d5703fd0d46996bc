"""``serve_namesrv``: one name-server process — listener, route table, expiry scan.

Connections are served with the broker's machinery: the same frame decoder, the same
:class:`~broker.remoting.connection.Connection` and writer task, the same malformed-input
answers (``broker.remoting.server.answer_malformed``), and a
:class:`~broker.remoting.dispatch.Registry` of its own
(:data:`broker.namesrv.processors.NAMESRV`). No name-server request waits for anything but a
small file write, so requests run in the reader task, in order.

Several name servers never talk to each other (as in RocketMQ): each knows what the brokers
told it, and brokers register with all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import trio

from broker.logs import get_logger
from broker.namesrv.config import NamesrvConfig
from broker.namesrv.context import NamesrvContext
from broker.namesrv.kv import KVConfig
from broker.namesrv.processors import NAMESRV
from broker.namesrv.routes import RouteTable
from broker.remoting.connection import Connection, run_writer
from broker.remoting.server import RECEIVE_SIZE, answer_malformed, peer_of
from broker.store.files import read_optional
from protocol.command import RemotingCommand
from protocol.errors import ProtocolError
from protocol.frame import FrameDecoder

_log = get_logger("namesrv")


@dataclass
class NamesrvHandle:
    """A running name server (what ``nursery.start(serve_namesrv, config)`` returns)."""

    port: int
    address: str
    ctx: NamesrvContext
    _cancel: trio.CancelScope

    def stop(self) -> None:
        """Stop serving (the route table is memory only: nothing to flush)."""
        self._cancel.cancel()


def load_kv(config: NamesrvConfig) -> KVConfig:
    """The persisted KV config, or an empty one.

    Raises:
        ValueError: the file exists but cannot be read as a KV config.
    """
    if config.kv_config_path is None:
        return KVConfig()
    data = read_optional(config.kv_config_path)
    if data is None:
        return KVConfig()
    try:
        return KVConfig.from_json(data)
    except ProtocolError as exc:
        raise ValueError(f"{config.kv_config_path}: unreadable KV config: {exc}") from None


async def scan_expired(ctx: NamesrvContext) -> None:
    """Drop brokers that stopped registering, every ``scan_interval_s``."""
    while True:
        await trio.sleep(ctx.config.scan_interval_s)
        for gone in ctx.routes.expire(ctx.now()):
            _log.warning("broker expired", broker=gone.broker_name, broker_id=gone.broker_id,
                         silent_s=round(ctx.now() - gone.last_update, 3))  # fmt: skip


async def handle_connection(ctx: NamesrvContext, stream: trio.SocketStream) -> None:
    """Serve one connection until it closes or the name server stops."""
    if ctx.connections >= ctx.config.max_connections:
        _log.warning("connection refused: limit reached", limit=ctx.config.max_connections)
        await stream.aclose()
        return
    ctx.connections += 1
    limit = ctx.config.max_frame_size
    send, receive = trio.open_memory_channel[RemotingCommand](ctx.config.write_queue)
    conn = Connection(peer_of(stream), send, stream, limit)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_writer, conn, stream, receive, limit)
            try:
                await _serve_requests(ctx, conn, stream)
            finally:
                nursery.cancel_scope.cancel()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the peer went away while we were writing
    finally:
        conn.closed = True
        ctx.connections -= 1
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _serve_requests(ctx: NamesrvContext, conn: Connection, stream: trio.SocketStream) -> None:
    decoder = FrameDecoder(ctx.config.max_frame_size)
    while True:
        try:
            data = await stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        decoder.feed(data)
        while True:
            try:
                cmd = decoder.next_command()
            except ProtocolError as exc:
                if exc.fatal:
                    _log.info("closing connection on bad framing", peer=conn.peer, error=str(exc))
                    return
                answer_malformed(conn, exc)
                continue
            if cmd is None:
                break
            if cmd.is_response:
                continue
            reply = await NAMESRV.dispatch(ctx, conn, cmd)
            if reply is not None:
                await conn.send(reply)
        if not data:
            return


async def serve_namesrv(
    config: NamesrvConfig,
    *,
    task_status: trio.TaskStatus[NamesrvHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a name server until cancelled or stopped."""
    ctx = NamesrvContext(config, RouteTable(expire_s=config.broker_expire_s), load_kv(config))
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    port = listeners[0].socket.getsockname()[1]
    address = f"{config.host}:{port}"
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scan_expired, ctx)
            await nursery.start(
                partial(trio.serve_listeners, partial(handle_connection, ctx), listeners)
            )
            _log.info("namesrv started", address=address, port=port,
                      broker_expire_s=config.broker_expire_s)  # fmt: skip
            task_status.started(NamesrvHandle(port, address, ctx, scope))
    _log.info("namesrv stopped", address=address)
