"""``serve_namesrv``: one name-server process — listener, route table, expiry scan.

Connections are served by the broker's Remoting server
(:func:`broker.remoting.server.serve_remoting`: the same connections, writer tasks,
back-pressure and malformed-input answers) running a
:class:`~broker.remoting.dispatch.Registry` of its own
(:data:`broker.namesrv.processors.NAMESRV`). No name-server request waits for anything but a
small file write, so none is marked as parking: they run in the reader task, in order.

Several name servers never talk to each other (as in RocketMQ): each knows what the brokers
told it, and brokers register with all of them.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import trio

from broker.acl import AclGuard
from broker.logs import get_logger
from broker.namesrv.config import NamesrvConfig
from broker.namesrv.context import NamesrvContext
from broker.namesrv.kv import KVConfig
from broker.namesrv.processors import NAMESRV
from broker.namesrv.routes import RouteTable
from broker.remoting.server import BoundRegistry, ServerLimits, serve_remoting
from broker.store.files import read_optional
from broker.tls import TlsMode, TlsPolicy, server_context
from protocol.acl import authorize_namesrv
from protocol.errors import ProtocolError

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


async def serve_namesrv(
    config: NamesrvConfig,
    *,
    clock: Callable[[], float] = trio.current_time,
    task_status: trio.TaskStatus[NamesrvHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a name server until cancelled or stopped; ``clock`` (seconds) judges broker
    registrations and their expiry (see :attr:`NamesrvContext.clock`). With ``acl_file``,
    the requests that change the routes need credentials from it.

    Raises:
        broker.acl.AclFileError: the ACL file is not valid.
    """
    routes = RouteTable(expire_s=config.broker_expire_s)
    guard = None if config.acl_file is None else AclGuard(config.acl_file, authorize_namesrv)
    ctx = NamesrvContext(config, routes, load_kv(config), clock=clock)
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    port = listeners[0].socket.getsockname()[1]
    address = f"{config.host}:{port}"
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(scan_expired, ctx)
            tls = TlsPolicy(
                TlsMode(config.tls_mode),
                server_context(config.tls_cert, config.tls_key, now=_utc()),
            )
            await nursery.start(
                partial(serve_remoting, tls=tls),
                BoundRegistry(NAMESRV, ctx, guard=guard, state=ctx.server),
                listeners,
                ServerLimits.of(config),
                ctx.server,
            )
            _log.info("namesrv started", address=address, port=port,
                      broker_expire_s=config.broker_expire_s)  # fmt: skip
            task_status.started(NamesrvHandle(port, address, ctx, scope))
    _log.info("namesrv stopped", address=address)


def _utc() -> datetime.datetime:
    """Now, for a self-signed certificate's validity (the name server's injected clock is
    trio's monotonic one, which says nothing of the date)."""
    return datetime.datetime.now(tz=datetime.UTC)
