"""This broker's own route for a topic (what a broker started without name servers answers
to route queries, and what it registers with name servers), transport-neutral.

Unknown topics have no route; front ends answer ``TOPIC_NOT_EXIST`` like a name server does
(producers then ask for ``TBW102`` and send with it as their default topic, and the send
auto-creates the topic).
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.topics import TopicManager


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    """Who this broker is in its cluster: the master (id 0) of its broker name."""

    cluster: str
    broker_name: str
    #: ``host:port`` clients connect to.
    address: str


@dataclass(frozen=True, slots=True)
class RouteView:
    """One topic's queues on this broker and where to reach them."""

    broker_name: str
    cluster: str
    address: str
    read_queue_nums: int
    write_queue_nums: int
    #: RocketMQ's permission bits (``PERM_READ | PERM_WRITE`` …).
    perm: int
    topic_sys_flag: int


class RouteService:
    """Routes of the topics this broker holds."""

    def __init__(self, topics: TopicManager, identity: BrokerIdentity) -> None:
        self._topics = topics
        self._identity = identity

    def route(self, topic: str) -> RouteView | None:
        """This broker's route for ``topic``, or None if it does not hold it."""
        config = self._topics.get(topic)
        if config is None:
            return None
        me = self._identity
        return RouteView(
            broker_name=me.broker_name,
            cluster=me.cluster,
            address=me.address,
            read_queue_nums=config.read_queue_nums,
            write_queue_nums=config.write_queue_nums,
            perm=config.perm,
            topic_sys_flag=config.topic_sys_flag,
        )
