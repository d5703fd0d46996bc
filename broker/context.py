"""What a Remoting processor is handed: the complete :class:`~broker.core.broker.Broker` plus
the Remoting server's own bookkeeping (connections, requests in flight).

The forwarding properties keep the processors' ``ctx.store`` / ``ctx.topics`` … readable while
they are turned into thin adapters over ``broker.core``; every one of them forwards to a
service that always exists (nothing here is ``Optional``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from broker.config import BrokerConfig
from broker.core.broker import Broker
from broker.longpoll import PullHub
from broker.metrics import MetricsWriter
from broker.pop.service import PopEngine
from broker.remoting.channel import RemotingChannel
from broker.remoting.connection import Connection
from broker.remoting.dispatch import Registry
from broker.storage import Storage
from broker.store.store import MessageStore
from broker.timers import TimerService
from broker.topics import TopicManager


@dataclass(eq=False)
class BrokerContext:
    """The broker and the Remoting server's connection bookkeeping."""

    broker: Broker
    registry: Registry[BrokerContext]
    open_connections: set[Connection] = field(default_factory=set)
    connections: int = 0
    in_flight: int = 0
    #: The client registry's channel of each connection that sent a heartbeat.
    channels: dict[Connection, RemotingChannel] = field(default_factory=dict)

    def channel(self, conn: Connection) -> RemotingChannel:
        """The connection's channel in the client registry, made on first use."""
        found = self.channels.get(conn)
        if found is None:
            found = self.channels[conn] = RemotingChannel(conn, self.broker.config.broker_name)
        return found

    def connection_closed(self, conn: Connection) -> None:
        """Every client on ``conn`` leaves its groups (their other members are told)."""
        channel = self.channels.pop(conn, None)
        if channel is not None:
            self.broker.clients.channel_closed(channel)

    def drained(self) -> bool:
        """No request is running and every reply has been handed to its socket."""
        return self.in_flight == 0 and all(
            c.send_channel.statistics().current_buffer_used == 0 and not c.write_lock.locked()
            for c in self.open_connections
        )

    # ------------------------------------------------------------------ forwarding
    @property
    def config(self) -> BrokerConfig:
        """The broker's settings."""
        return self.broker.config

    @property
    def address(self) -> str:
        """``host:port`` put into routes."""
        return self.broker.address

    @property
    def store(self) -> MessageStore:
        """The storage engine."""
        return self.broker.store

    @property
    def storage(self) -> Storage:
        """The store's trio facade (durable puts)."""
        return self.broker.storage

    @property
    def topics(self) -> TopicManager:
        """The topic table."""
        return self.broker.topics

    @property
    def pull_hub(self) -> PullHub:
        """Parked pulls."""
        return self.broker.pull_hub

    @property
    def pop(self) -> PopEngine:
        """The pop service."""
        return self.broker.pop

    @property
    def timers(self) -> TimerService:
        """Delayed and timer messages."""
        return self.broker.timers

    @property
    def metrics(self) -> MetricsWriter:
        """Latency events."""
        return self.broker.metrics

    @property
    def shutting_down(self) -> trio.Event:
        """Set when the broker stops."""
        return self.broker.shutting_down

    @property
    def started_at(self) -> float:
        """Start time, epoch seconds."""
        return self.broker.started_at
