"""What every name-server processor can reach: settings, the route table, the KV config, and
the Remoting server's bookkeeping."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from broker.namesrv.config import NamesrvConfig
from broker.namesrv.kv import KVConfig
from broker.namesrv.routes import RouteTable
from broker.remoting.server import ServerState
from broker.store.files import atomic_write


@dataclass
class NamesrvContext:
    """Shared name-server state, owned by :func:`broker.namesrv.app.serve_namesrv`."""

    config: NamesrvConfig
    routes: RouteTable
    kv: KVConfig = field(default_factory=KVConfig)
    #: Connections, requests in flight and counters of the name server's Remoting server.
    server: ServerState = field(default_factory=ServerState)
    #: Serializes KV file writes so that the last change is the one on disk.
    kv_lock: trio.Lock = field(default_factory=trio.Lock)
    #: Seconds on the clock that registrations and expiry are judged by; trio's by default,
    #: so ``autojump_clock`` moves it. A test may pass its own to control expiry alone.
    clock: Callable[[], float] = trio.current_time

    def now(self) -> float:
        """The clock the route table runs on (:attr:`clock`)."""
        return self.clock()

    async def persist_kv(self) -> None:
        """Write the KV config to its file (if it has one), off the event loop."""
        path = self.config.kv_config_path
        if path is None:
            return
        data = self.kv.to_json()
        async with self.kv_lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            await trio.to_thread.run_sync(atomic_write, path, data)
