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
import broker.processors  # noqa: F401
from broker.config import BrokerConfig
from broker.consumers import ConsumerManager
from broker.context import BrokerContext
from broker.logs import get_logger
from broker.longpoll import PullHub
from broker.schedule import SCHEDULE_TOPIC
from broker.server import handle_connection
from broker.storage import serve_storage
from broker.store.store import MessageStore
from broker.timers import SCHEDULE_QUEUES, TimerService
from broker.topics import TopicManager

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

    async def stop(self) -> None:
        """Graceful stop: answer parked polls, drain, then let ``serve_broker`` close the
        store (flush + clean checkpoint)."""
        self.ctx.shutting_down.set()
        self.ctx.pull_hub.wake_all()
        for _ in range(int(DRAIN_SECONDS / 0.01)):  # bounded: at most DRAIN_SECONDS
            if self.ctx.drained():
                break
            await trio.sleep(0.01)
        self._cancel.cancel()


async def serve_broker(
    config: BrokerConfig, *, task_status: trio.TaskStatus[BrokerHandle] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a broker until cancelled or stopped; the store is always closed cleanly."""
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    port = listeners[0].socket.getsockname()[1]
    address = config.advertised(port)
    hub = PullHub()
    store = MessageStore.open(config.store_config(port), hub)
    topics = TopicManager(config.data_dir / "config" / "topics.json",
                          default_queue_nums=config.default_queue_nums)  # fmt: skip
    for topic, queue_ids in store.topics().items():
        topics.ensure_queues(topic, max(queue_ids) + 1)
    async with trio.open_nursery() as outer:
        storage = await outer.start(serve_storage, store)
        ctx = BrokerContext(config, store, storage, topics, ConsumerManager(), hub, address)
        ctx.timers = TimerService(storage, topics, config.data_dir / "config" / "schedule.json")
        topics.ensure_queues(SCHEDULE_TOPIC, SCHEDULE_QUEUES)
        ctx.timers.load()
        storage.before_checkpoint.append(ctx.timers.before_checkpoint)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ctx.timers.run)
                await nursery.start(
                    partial(trio.serve_listeners, partial(handle_connection, ctx), listeners)
                )
                _log.info("broker started", address=address, port=port,
                          data_dir=str(config.data_dir), flush=config.flush)  # fmt: skip
                task_status.started(BrokerHandle(port, address, ctx, scope))
        hub.wake_all()
        outer.cancel_scope.cancel()  # serve_storage flushes and closes the store
    _log.info("broker stopped", address=address)
