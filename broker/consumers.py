"""Consumer and producer groups of connected clients (RocketMQ's ``ConsumerManager``).

Heartbeats register a client id on its connection for every group it names; a consumer
group's membership change (a client joins, leaves, unregisters or its connection closes)
pushes ``NOTIFY_CONSUMER_IDS_CHANGED`` to every remaining member at once, so clients
rebalance without waiting for their 20 s poll (RocketMQ ``realTimeNotifyConsumerChange``).
Clients that never unregister (client-cpp 2.1) leave when their connection closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.remoting.connection import Connection
from protocol.bodies.heartbeat import ConsumerData, HeartbeatData, SubscriptionData
from protocol.codes import RequestCode
from protocol.command import request
from protocol.headers.client import NotifyConsumerIdsChangedRequestHeader


@dataclass
class GroupMember:
    """One client of a consumer group."""

    client_id: str
    connection: Connection
    data: ConsumerData


@dataclass
class ConsumerGroup:
    """The members of one consumer group and their subscriptions (last heartbeat wins)."""

    name: str
    members: dict[str, GroupMember] = field(default_factory=dict)

    def subscriptions(self) -> dict[str, SubscriptionData]:
        """Topic → subscription, over every member."""
        out: dict[str, SubscriptionData] = {}
        for member in self.members.values():
            for sub in member.data.subscription_data_set:
                out[sub.topic] = sub
        return out


class ConsumerManager:
    """Who consumes and produces on this broker."""

    def __init__(self) -> None:
        self.groups: dict[str, ConsumerGroup] = {}
        self.producers: dict[str, dict[str, Connection]] = {}
        self.notifications = 0

    def heartbeat(self, conn: Connection, data: HeartbeatData) -> list[str]:
        """Register a heartbeat; return the consumer groups it joined for the first time."""
        conn.client_ids.add(data.client_id)
        for producer in data.producer_data_set:
            self.producers.setdefault(producer.group_name, {})[data.client_id] = conn
        joined = []
        for consumer in data.consumer_data_set:
            group = self.groups.setdefault(consumer.group_name, ConsumerGroup(consumer.group_name))
            old = group.members.get(data.client_id)
            group.members[data.client_id] = GroupMember(data.client_id, conn, consumer)
            if old is None or old.connection is not conn:
                joined.append(consumer.group_name)
                self._notify(group)
        return joined

    def unregister(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None:
        """UNREGISTER_CLIENT: the client leaves the named groups."""
        if producer_group:
            self.producers.get(producer_group, {}).pop(client_id, None)
        if consumer_group:
            group = self.groups.get(consumer_group)
            if group is not None and group.members.pop(client_id, None) is not None:
                self._notify(group)

    def connection_closed(self, conn: Connection) -> None:
        """Every client on ``conn`` leaves every group."""
        for members in self.producers.values():
            for client_id in [c for c, m in members.items() if m is conn]:
                del members[client_id]
        for group in self.groups.values():
            gone = [c for c, m in group.members.items() if m.connection is conn]
            for client_id in gone:
                del group.members[client_id]
            if gone:
                self._notify(group)

    def client_ids(self, group: str) -> list[str]:
        """GET_CONSUMER_LIST_BY_GROUP: the group's client ids, sorted like RocketMQ does."""
        found = self.groups.get(group)
        return sorted(found.members) if found else []

    def groups_of_topic(self, topic: str) -> list[str]:
        """Consumer groups subscribed to ``topic``."""
        return [g.name for g in self.groups.values() if topic in g.subscriptions()]

    def _notify(self, group: ConsumerGroup) -> None:
        header = NotifyConsumerIdsChangedRequestHeader(consumer_group=group.name)
        sent: set[int] = set()
        for member in group.members.values():
            conn = member.connection
            if conn.id in sent:
                continue
            sent.add(conn.id)
            cmd = request(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                conn.next_opaque(),
                header.to_ext(),
                oneway=True,
                language="JAVA",
            )
            if conn.notify_nowait(cmd):
                self.notifications += 1
