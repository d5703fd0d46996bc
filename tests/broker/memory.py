"""A real broker served over memory streams, on trio's clock (for ``autojump_clock`` tests).

Everything is the production code — ``open_broker`` with its store on disk, the Remoting
server's ``handle_stream``, the processors — except the transport (``memory_stream_pair``)
and the clocks: the broker's wall clock is a :class:`~broker.deadlines.TrioWallClock`, so
leases, revive and delivery deadlines move with trio's (mock) clock exactly as the waits
do; blocking file work runs inline (:func:`broker.offload.run_inline`: under
``autojump_clock`` a task waiting for a worker thread counts as blocked and would let virtual
time race ahead); and the disk probe always says "empty". Tests that used to race the real
clock with small margins assert exact virtual times instead.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import trio.testing

from broker.app import BrokerHandleStatistics
from broker.config import BrokerConfig
from broker.core.broker import Broker, open_broker
from broker.deadlines import TrioWallClock
from broker.offload import Offload, run_inline
from broker.remoting.context import BrokerContext
from broker.remoting.processors import broker_dispatcher
from broker.remoting.server import BoundRegistry, ServerLimits, handle_stream
from tests.broker.client import TEST_SETTINGS, BrokerClient, attach_client

#: Epoch ms at trio time 0 (2027-01-15): any fixed instant will do; none is "today".
ORIGIN_MS = 1_800_000_000_000
#: The port the broker believes it listens on (it goes into records and routes).
PORT = 10911


@dataclass
class MemoryBroker:
    """A running in-memory broker; :meth:`connect` opens a client connection to it."""

    broker: Broker
    ctx: BrokerContext
    dispatcher: BoundRegistry[BrokerContext]
    limits: ServerLimits
    nursery: trio.Nursery

    def statistics(self) -> BrokerHandleStatistics:
        """The services' counters and the Remoting server's."""
        return BrokerHandleStatistics(self.broker.statistics(), self.ctx.server.statistics())

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[BrokerClient]:
        """A client on a new memory-stream connection, served by the broker's Remoting
        server; closed on exit."""
        client_end, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(
            handle_stream, self.dispatcher, self.limits, self.ctx.server, server_end
        )
        async with attach_client(client_end) as client:
            yield client


def memory_config(data_dir: Path, settings: Mapping[str, Any]) -> BrokerConfig:
    """The broker settings of a memory broker (the test settings over the defaults)."""
    merged = {**TEST_SETTINGS, **settings}
    return BrokerConfig(host="127.0.0.1", port=PORT, data_dir=data_dir, **merged)


@asynccontextmanager
async def open_memory_broker(
    data_dir: Path, *, offload: Offload = run_inline, **settings: Any
) -> AsyncIterator[MemoryBroker]:
    """Run a broker in ``data_dir`` served over memory streams, its wall clock on trio's
    (``ORIGIN_MS`` at trio time 0); on exit its connections close and it stops cleanly.
    ``offload`` runs its blocking file work (default: inline)."""
    config = memory_config(data_dir, settings)
    clock = TrioWallClock(ORIGIN_MS)
    async with open_broker(
        config, port=PORT, clock=clock, disk_probe=lambda _: 0.0, offload=offload
    ) as broker:
        dispatcher = broker_dispatcher(broker)
        ctx = dispatcher.ctx
        async with trio.open_nursery() as nursery:
            yield MemoryBroker(broker, ctx, dispatcher, ServerLimits.of(config), nursery)
            # The stop path of serve_broker: answer parked requests, then drop connections.
            broker.stop_parking()
            nursery.cancel_scope.cancel()
