"""What every processor can reach: configuration, store, topics, clients, long polling."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from broker.config import BrokerConfig
from broker.consumers import ConsumerManager
from broker.locks import RebalanceLocks
from broker.longpoll import PullHub
from broker.metrics import MetricsWriter
from broker.remoting.connection import Connection
from broker.storage import Storage
from broker.store.store import MessageStore
from broker.timers import TimerService

if TYPE_CHECKING:
    from broker.pop.service import PopService
from broker.topics import TopicManager


@dataclass
class BrokerContext:
    """Shared broker state, owned by :func:`broker.app.serve_broker`."""

    config: BrokerConfig
    store: MessageStore
    storage: Storage
    topics: TopicManager
    consumers: ConsumerManager
    pull_hub: PullHub
    #: ``host:port`` this broker puts into routes.
    address: str
    timers: TimerService | None = None
    pop: PopService | None = None
    metrics: MetricsWriter | None = None
    shutting_down: trio.Event = field(default_factory=trio.Event)
    rebalance_locks: RebalanceLocks = field(default_factory=RebalanceLocks)
    open_connections: set[Connection] = field(default_factory=set)
    connections: int = 0
    in_flight: int = 0
    #: Wall-clock time the broker started, epoch seconds (runtime info).
    started_at: float = field(default_factory=time.time)

    def drained(self) -> bool:
        """No request is running and every reply has been handed to its socket."""
        return self.in_flight == 0 and all(
            c.send_channel.statistics().current_buffer_used == 0 and not c.write_lock.locked()
            for c in self.open_connections
        )
