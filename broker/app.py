"""``serve_broker``: one broker process — listener, store, flusher, checkpoints, processors.

Start order: bind the listener first (its port goes into every stored record's store host
and into routes), open and recover the store, then accept connections. Stop order
(:meth:`BrokerHandle.stop`, also on SIGTERM/SIGINT): refuse new work, answer every parked
pull, wait briefly for requests in flight, close connections, then flush, checkpoint and close
the store cleanly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import trio

# Registering the processors is a side effect of importing them.
import broker.remoting.processors  # noqa: F401
from broker.config import BrokerConfig
from broker.consumers import ConsumerManager
from broker.context import BrokerContext
from broker.deadlines import DeadlineLoop
from broker.logs import get_logger
from broker.longpoll import Arrivals, PullHub
from broker.metrics import MetricsWriter
from broker.pop.hub import PopHub, WakeMode
from broker.pop.service import PopService
from broker.prometheus import open_prometheus
from broker.registration import Registrar
from broker.remoting.server import handle_connection
from broker.schedule import SCHEDULE_TOPIC
from broker.storage import Storage, serve_storage
from broker.store.store import MessageStore
from broker.timers import SCHEDULE_QUEUES, TimerService
from broker.topics import TopicManager
from protocol.naming import V1RetryNames

_log = get_logger("broker")
#: How long a stop waits for requests in flight before cutting connections.
DRAIN_SECONDS = 2.0


@dataclass
class BrokerHandle:
    """A running broker (what ``nursery.start(serve_broker, config)`` returns)."""

    port: int
    address: str
    ctx: BrokerContext
    _cancel: trio.CancelScope
    #: Keeps the broker registered with its name servers (None without ``namesrv_addr``).
    registrar: Registrar | None = None
    #: Where Prometheus ``/metrics`` is served (None when ``prometheus_port`` is not set).
    prometheus_port: int | None = None

    async def stop(self) -> None:
        """Graceful stop: leave the name servers' routes, answer parked polls, drain, then
        let ``serve_broker`` close the store (flush + clean checkpoint)."""
        if self.registrar is not None:
            await self.registrar.stop()
        self.ctx.shutting_down.set()
        self.ctx.pull_hub.wake_all()
        if self.ctx.pop is not None:
            self.ctx.pop.hub.wake_all()
        for _ in range(int(DRAIN_SECONDS / 0.01)):  # bounded: at most DRAIN_SECONDS
            if self.ctx.drained():
                break
            await trio.sleep(0.01)
        self._cancel.cancel()


def open_pop(
    config: BrokerConfig,
    storage: Storage,
    topics: TopicManager,
    hub: PopHub,
    v1_names: V1RetryNames,
    metrics: MetricsWriter,
) -> PopService:
    """Recover the pop in-flight state (``<data-dir>/pop``) and wire the pop service."""
    return PopService.open(
        config.data_dir / "pop",
        storage,
        topics,
        hub,
        broker_name=config.broker_name,
        retry_v2=config.retry_naming == "v2",
        max_reconsume=lambda group: config.max_reconsume_times,
        fsync=config.flush == "sync",
        metrics=metrics,
        v1_names=v1_names,
    )


async def serve_broker(
    config: BrokerConfig, *, task_status: trio.TaskStatus[BrokerHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a broker until cancelled or stopped; the store is always closed cleanly."""
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    port = listeners[0].socket.getsockname()[1]
    address = config.advertised(port)
    hub = PullHub()
    v1_names = V1RetryNames()
    pop_hub = PopHub(WakeMode(config.wake_mode), v1_owner=v1_names.owner)
    store = MessageStore.open(config.store_config(port), Arrivals(hub, pop_hub))
    topics = TopicManager(config.data_dir / "config" / "topics.json",
                          default_queue_nums=config.default_queue_nums)  # fmt: skip
    for topic, queue_ids in store.topics().items():
        topics.ensure_queues(topic, max(queue_ids) + 1)
    async with trio.open_nursery() as outer:
        storage = await outer.start(serve_storage, store)
        ctx = BrokerContext(config, store, storage, topics, ConsumerManager(), hub, address)
        ctx.metrics = MetricsWriter(config.metrics_dir or config.data_dir / "metrics",
                                    broker=config.broker_name,
                                    wake_mode=lambda: pop_hub.wake_mode.value)  # fmt: skip
        deadlines = DeadlineLoop()
        ctx.timers = TimerService(storage, topics, config.data_dir / "config" / "schedule.json")
        ctx.timers.poke = deadlines.poke
        topics.ensure_queues(SCHEDULE_TOPIC, SCHEDULE_QUEUES)
        ctx.timers.load()
        storage.before_checkpoint.append(ctx.timers.before_checkpoint)
        ctx.pop = open_pop(config, storage, topics, pop_hub, v1_names, ctx.metrics)
        ctx.pop.revive.poke = deadlines.poke
        storage.before_checkpoint.append(ctx.pop.before_checkpoint)
        deadlines.add(ctx.timers)
        deadlines.add(ctx.pop.revive)
        prometheus = open_prometheus(config.host, config.prometheus_port, ctx.metrics)
        with trio.CancelScope() as scope:
            async with prometheus as prometheus_port, trio.open_nursery() as nursery:
                nursery.start_soon(deadlines.run)
                nursery.start_soon(ctx.metrics.run)
                await nursery.start(
                    partial(trio.serve_listeners, partial(handle_connection, ctx), listeners)
                )
                registrar = None
                if config.namesrv_addr:
                    registrar = Registrar(config, topics, address)
                    topics.on_change = registrar.poke
                    nursery.start_soon(registrar.run)
                _log.info("broker started", address=address, port=port,
                          data_dir=str(config.data_dir), flush=config.flush,
                          namesrv_addr=config.namesrv_addr)  # fmt: skip
                task_status.started(
                    BrokerHandle(port, address, ctx, scope, registrar, prometheus_port)
                )
        hub.wake_all()
        pop_hub.wake_all()
        outer.cancel_scope.cancel()  # serve_storage flushes, snapshots pop state, closes
    ctx.pop.close()
    _log.info("broker stopped", address=address)
