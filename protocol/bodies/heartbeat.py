"""``HEART_BEAT`` (34) body: ``HeartbeatData`` with its producer and consumer data.

Property names follow RocketMQ's ``remoting/.../protocol/heartbeat/*.java`` as fastjson
writes them (from getters, so ``isWithoutSub`` travels as ``withoutSub``).

Clients differ (``reference/wire-facts.md``), and every variant decodes:

* ali-ons (JavaScript) writes enums by name (``"CONSUME_PASSIVELY"``) and sends
  ``tagsSet``/``codeSet``;
* client-cpp writes enums as ordinals (``"consumeType":1``), omits ``tagsSet``, ``codeSet``,
  ``classFilterMode``, ``expressionType`` and ``unitMode``, and sends ``subVersion`` as a
  string;
* producer and consumer data may come in one heartbeat or in two.

We write enums by name, as Java's fastjson does; Java reads names and ordinals alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Self

from protocol.bodies._fields import INT32, Fields, JsonBody, as_int
from protocol.filters import EXPRESSION_TAG, SUB_ALL


class ConsumeType(IntEnum):
    """``heartbeat.ConsumeType``; values are the Java ordinals."""

    CONSUME_ACTIVELY = 0  # pull
    CONSUME_PASSIVELY = 1  # push
    CONSUME_POP = 2


class MessageModel(IntEnum):
    """``heartbeat.MessageModel``; ``LITE_SELECTIVE`` is new in RocketMQ 5."""

    BROADCASTING = 0
    CLUSTERING = 1
    LITE_SELECTIVE = 2


class ConsumeFromWhere(IntEnum):
    """``common.consumer.ConsumeFromWhere``; values 1-3 are deprecated in Java but kept
    so that the ordinals (which client-cpp sends) stay right."""

    CONSUME_FROM_LAST_OFFSET = 0
    CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST = 1
    CONSUME_FROM_MIN_OFFSET = 2
    CONSUME_FROM_MAX_OFFSET = 3
    CONSUME_FROM_FIRST_OFFSET = 4
    CONSUME_FROM_TIMESTAMP = 5


# SUB_ALL and EXPRESSION_TAG live with the tag syntax (protocol.filters); re-exported here.


@dataclass(frozen=True, slots=True)
class SubscriptionData(JsonBody):
    """One topic subscription of a consumer group.

    ``sub_version`` is a Java ``long`` (a millisecond timestamp); client-cpp sends it as a
    string and it is read as a number. A missing ``subString`` reads as ``"*"``.
    ``filter_class_source`` is only written when set: RocketMQ 5 no longer serializes it.
    """

    topic: str
    sub_string: str = SUB_ALL
    class_filter_mode: bool = False
    tags_set: tuple[str, ...] = ()
    code_set: tuple[int, ...] = ()
    sub_version: int = 0
    expression_type: str = EXPRESSION_TAG
    filter_class_source: str | None = None

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            topic=f.text("topic"),
            sub_string=f.text_or("subString", SUB_ALL),
            class_filter_mode=f.boolean("classFilterMode"),
            tags_set=f.texts("tagsSet"),
            code_set=tuple(as_int(code, at, INT32) for code, at in f.items("codeSet")),
            sub_version=f.int64("subVersion"),
            expression_type=f.text_or("expressionType", EXPRESSION_TAG),
            filter_class_source=f.opt_text("filterClassSource"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        obj: dict[str, object] = {
            "classFilterMode": self.class_filter_mode,
            "topic": self.topic,
            "subString": self.sub_string,
            "tagsSet": list(self.tags_set),
            "codeSet": list(self.code_set),
            "subVersion": self.sub_version,
            "expressionType": self.expression_type,
        }
        if self.filter_class_source is not None:
            obj["filterClassSource"] = self.filter_class_source
        return obj


@dataclass(frozen=True, slots=True)
class ConsumerData(JsonBody):
    """A consumer group as one client runs it.

    ``consumeType`` is required; a missing ``messageModel`` reads as ``CLUSTERING`` and a
    missing ``consumeFromWhere`` as ``CONSUME_FROM_LAST_OFFSET`` (the Java client defaults).
    """

    group_name: str
    consume_type: ConsumeType
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
    subscription_data_set: tuple[SubscriptionData, ...] = ()
    unit_mode: bool = False

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            group_name=f.text("groupName"),
            consume_type=f.enum("consumeType", ConsumeType),
            message_model=f.enum("messageModel", MessageModel, MessageModel.CLUSTERING),
            consume_from_where=f.enum(
                "consumeFromWhere", ConsumeFromWhere, ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
            ),
            subscription_data_set=tuple(
                SubscriptionData.from_obj(item, at) for item, at in f.items("subscriptionDataSet")
            ),
            unit_mode=f.boolean("unitMode"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object (enums by name)."""
        return {
            "groupName": self.group_name,
            "consumeType": self.consume_type.name,
            "messageModel": self.message_model.name,
            "consumeFromWhere": self.consume_from_where.name,
            "subscriptionDataSet": [sub.to_obj() for sub in self.subscription_data_set],
            "unitMode": self.unit_mode,
        }


@dataclass(frozen=True, slots=True)
class ProducerData(JsonBody):
    """A producer group as one client runs it."""

    group_name: str

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        return cls(group_name=Fields(obj, path).text("groupName"))

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {"groupName": self.group_name}


@dataclass(frozen=True, slots=True)
class HeartbeatData(JsonBody):
    """The body of ``HEART_BEAT``: who the client is and which groups it runs.

    ``clientID`` is required. ``heartbeatFingerprint`` and ``withoutSub`` are RocketMQ 5
    additions (a client whose subscriptions did not change may send ``withoutSub: true`` and
    omit them); older clients leave them out.
    """

    client_id: str
    producer_data_set: tuple[ProducerData, ...] = ()
    consumer_data_set: tuple[ConsumerData, ...] = ()
    heartbeat_fingerprint: int = 0
    without_sub: bool = False

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            client_id=f.text("clientID"),
            producer_data_set=tuple(
                ProducerData.from_obj(item, at) for item, at in f.items("producerDataSet")
            ),
            consumer_data_set=tuple(
                ConsumerData.from_obj(item, at) for item, at in f.items("consumerDataSet")
            ),
            heartbeat_fingerprint=f.int32("heartbeatFingerprint"),
            without_sub=f.boolean("withoutSub"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "clientID": self.client_id,
            "producerDataSet": [producer.to_obj() for producer in self.producer_data_set],
            "consumerDataSet": [consumer.to_obj() for consumer in self.consumer_data_set],
            "heartbeatFingerprint": self.heartbeat_fingerprint,
            "withoutSub": self.without_sub,
        }
