"""This broker's own route for a topic (what a broker started without name servers answers
to route queries, and what it registers with name servers), transport-neutral.

A topic that does not exist yet has the route it will have once a send creates it, when
auto-create is on and producers may write the name: both front ends' clients ask for a route
before their first send, and some never fall back to ``TBW102`` (ali-ons throws on
``TOPIC_NOT_EXIST``; the gRPC clients have no such fallback at all). With auto-create off, or
for a name no producer may write, there is no route and front ends answer
``TOPIC_NOT_EXIST`` / ``TOPIC_NOT_FOUND``.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.topics import PERM_READ_WRITE, TopicManager
from protocol.errors import IllegalNameError
from protocol.naming import (
    is_dlq_topic,
    is_retry_topic,
    is_send_allowed,
    is_system_topic,
    validate_topic,
)


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

    def __init__(
        self,
        topics: TopicManager,
        identity: BrokerIdentity,
        *,
        auto_create_queue_nums: int | None,
    ) -> None:
        """``auto_create_queue_nums``: the queues a send creates an unknown topic with (None:
        auto-create is off)."""
        self._topics = topics
        self._identity = identity
        self._auto_create_queue_nums = auto_create_queue_nums

    def route(self, topic: str) -> RouteView | None:
        """This broker's route for ``topic`` (as it will be, for a topic a send would create),
        or None if it has none."""
        config = self._topics.get(topic)
        me = self._identity
        if config is not None:
            queues = (config.read_queue_nums, config.write_queue_nums)
            perm, sys_flag = config.perm, config.topic_sys_flag
        elif self._would_create(topic):
            assert self._auto_create_queue_nums is not None
            queues = (self._auto_create_queue_nums, self._auto_create_queue_nums)
            perm, sys_flag = PERM_READ_WRITE, 0
        else:
            return None
        return RouteView(me.broker_name, me.cluster, me.address, *queues, perm, sys_flag)

    def _would_create(self, topic: str) -> bool:
        if self._auto_create_queue_nums is None or not is_send_allowed(topic):
            return False
        # Retry, dead-letter and system topics are the broker's to create, never a send's.
        if is_system_topic(topic) or is_retry_topic(topic) or is_dlq_topic(topic):
            return False
        try:
            validate_topic(topic)
        except IllegalNameError:
            return False
        return True
