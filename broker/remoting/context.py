"""What a Remoting processor is handed: the complete :class:`~broker.core.broker.Broker`, the
Remoting server's bookkeeping, and each connection's channel in the client registry."""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.core.broker import Broker
from broker.remoting.channel import RemotingChannel
from broker.remoting.connection import Connection
from broker.remoting.server import ServerState


@dataclass(eq=False)
class BrokerContext:
    """The broker as its Remoting front end sees it."""

    broker: Broker
    server: ServerState
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
