"""Consumer-group bodies: the member list used for rebalancing, and queue locks.

* ``GET_CONSUMER_LIST_BY_GROUP`` (38) answers :class:`GetConsumerListByGroupResponseBody`;
  clients rebalance queues over this list (``reference/wire-facts.md``);
* ``LOCK_BATCH_MQ`` (41) sends :class:`LockBatchRequestBody` and is answered with
  :class:`LockBatchResponseBody` (the queues now locked by this client);
* ``UNLOCK_BATCH_MQ`` (42) sends :class:`UnlockBatchRequestBody` (its response has no body).

Property names follow ``remoting/.../protocol/body/*.java`` and
``common/.../message/MessageQueue.java``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from protocol.bodies._fields import Fields, JsonBody


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue(JsonBody):
    """One queue of a topic on one broker group; hashable, so it can key a mapping.

    Ordered like Java's ``MessageQueue.compareTo``: topic, then broker name, then queue id.
    All three fields are required when decoding: a lock on a guessed queue would be wrong.
    """

    topic: str
    broker_name: str
    queue_id: int

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            topic=f.text("topic"),
            broker_name=f.text("brokerName"),
            queue_id=f.int32("queueId", None),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object, fields in fastjson's (alphabetical) order.

        The order matters when a queue is written as a map key (``TopicStatsTable``): the
        key text is then byte-for-byte what a Java broker sends.
        """
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}


def _queues(f: Fields, name: str) -> tuple[MessageQueue, ...]:
    return tuple(MessageQueue.from_obj(item, at) for item, at in f.items(name))


@dataclass(frozen=True, slots=True)
class GetConsumerListByGroupResponseBody(JsonBody):
    """The client ids of a group's live consumers, as their heartbeats named them."""

    consumer_id_list: tuple[str, ...] = ()

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        return cls(consumer_id_list=Fields(obj, path).texts("consumerIdList"))

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {"consumerIdList": list(self.consumer_id_list)}


@dataclass(frozen=True, slots=True)
class _MqSetRequest(JsonBody):
    """The shared shape of the lock and unlock requests."""

    consumer_group: str
    client_id: str
    mq_set: tuple[MessageQueue, ...] = ()
    only_this_broker: bool = False

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            consumer_group=f.text("consumerGroup"),
            client_id=f.text("clientId"),
            mq_set=_queues(f, "mqSet"),
            only_this_broker=f.boolean("onlyThisBroker"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "consumerGroup": self.consumer_group,
            "clientId": self.client_id,
            "onlyThisBroker": self.only_this_broker,
            "mqSet": [mq.to_obj() for mq in self.mq_set],
        }


@dataclass(frozen=True, slots=True)
class LockBatchRequestBody(_MqSetRequest):
    """``LOCK_BATCH_MQ``: lock these queues of ``consumer_group`` for ``client_id``.

    With ``only_this_broker`` false a Java broker also forwards the lock to the other
    replicas of its group.
    """


@dataclass(frozen=True, slots=True)
class UnlockBatchRequestBody(_MqSetRequest):
    """``UNLOCK_BATCH_MQ``: release these queues held by ``client_id``."""


@dataclass(frozen=True, slots=True)
class LockBatchResponseBody(JsonBody):
    """The queues of a ``LOCK_BATCH_MQ`` request that are now locked by the requester."""

    lock_ok_mq_set: tuple[MessageQueue, ...] = ()

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        return cls(lock_ok_mq_set=_queues(Fields(obj, path), "lockOKMQSet"))

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {"lockOKMQSet": [mq.to_obj() for mq in self.lock_ok_mq_set]}
