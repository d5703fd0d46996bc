"""Subscription-group bodies: a consumer group's broker-side configuration.

* ``UPDATE_AND_CREATE_SUBSCRIPTIONGROUP`` (200) carries a :class:`SubscriptionGroupConfig`;
  ``GET_SUBSCRIPTIONGROUP_CONFIG`` (352) answers one;
* ``GET_ALL_SUBSCRIPTIONGROUP_CONFIG`` (201) answers a :class:`SubscriptionGroupWrapper`,
  which is also the shape of a broker's ``config/subscriptionGroup.json``.

Field names and defaults are those of RocketMQ's ``SubscriptionGroupConfig`` (a group with no
configuration behaves as one with the defaults). The fields trimq does not interpret
(``groupRetryPolicy``, ``subscriptionDataSet``, and whatever a newer RocketMQ adds) are kept
as parsed JSON in :attr:`SubscriptionGroupConfig.extra` and written back unchanged, so a
configuration passes through trimq without losing anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Self

from protocol.bodies._fields import INT32, Fields, JsonBody, as_int, as_text
from protocol.bodies.broker import DataVersion

#: ``SubscriptionGroupConfig`` defaults.
DEFAULT_RETRY_QUEUE_NUMS: Final = 1
DEFAULT_RETRY_MAX_TIMES: Final = 16
DEFAULT_WHICH_BROKER_WHEN_CONSUME_SLOWLY: Final = 1
DEFAULT_CONSUME_TIMEOUT_MINUTE: Final = 15

#: The JSON names read into typed fields (everything else goes to ``extra``).
KNOWN_FIELDS: Final = frozenset(
    {
        "groupName",
        "consumeEnable",
        "consumeFromMinEnable",
        "consumeBroadcastEnable",
        "consumeMessageOrderly",
        "retryQueueNums",
        "retryMaxTimes",
        "brokerId",
        "whichBrokerWhenConsumeSlowly",
        "notifyConsumerIdsChangedEnable",
        "groupSysFlag",
        "consumeTimeoutMinute",
        "attributes",
    }
)


@dataclass(frozen=True, slots=True)
class SubscriptionGroupConfig(JsonBody):
    """``SubscriptionGroupConfig``: one consumer group's configuration on one broker."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    #: The group consumes in order: gRPC clients are told ``fifo`` and pop orderly.
    consume_message_orderly: bool = False
    retry_queue_nums: int = DEFAULT_RETRY_QUEUE_NUMS
    #: Redeliveries before a message goes to ``%DLQ%group``.
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    broker_id: int = 0
    which_broker_when_consume_slowly: int = DEFAULT_WHICH_BROKER_WHEN_CONSUME_SLOWLY
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = DEFAULT_CONSUME_TIMEOUT_MINUTE
    attributes: Mapping[str, str] = field(default_factory=dict)
    #: Fields kept as parsed JSON and written back as they came (see the module docstring).
    extra: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object; absent and ``null`` fields keep Java's defaults."""
        f = Fields(obj, path)
        assert isinstance(obj, dict)  # Fields checked it
        return cls(
            group_name=f.text("groupName"),
            consume_enable=f.boolean("consumeEnable", True),
            consume_from_min_enable=f.boolean("consumeFromMinEnable", True),
            consume_broadcast_enable=f.boolean("consumeBroadcastEnable", True),
            consume_message_orderly=f.boolean("consumeMessageOrderly"),
            retry_queue_nums=f.int32("retryQueueNums", DEFAULT_RETRY_QUEUE_NUMS),
            retry_max_times=f.int32("retryMaxTimes", DEFAULT_RETRY_MAX_TIMES),
            broker_id=f.int64("brokerId"),
            which_broker_when_consume_slowly=f.int64(
                "whichBrokerWhenConsumeSlowly", DEFAULT_WHICH_BROKER_WHEN_CONSUME_SLOWLY
            ),
            notify_consumer_ids_changed_enable=f.boolean("notifyConsumerIdsChangedEnable", True),
            group_sys_flag=f.int32("groupSysFlag"),
            consume_timeout_minute=f.int32("consumeTimeoutMinute", DEFAULT_CONSUME_TIMEOUT_MINUTE),
            attributes={key: as_text(v, at) for key, v, at in f.entries("attributes")},
            extra={k: v for k, v in obj.items() if k not in KNOWN_FIELDS and v is not None},
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object (Java's names; the kept fields after the typed ones)."""
        return {
            "groupName": self.group_name,
            "consumeEnable": self.consume_enable,
            "consumeFromMinEnable": self.consume_from_min_enable,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "consumeMessageOrderly": self.consume_message_orderly,
            "retryQueueNums": self.retry_queue_nums,
            "retryMaxTimes": self.retry_max_times,
            "brokerId": self.broker_id,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
            "groupSysFlag": self.group_sys_flag,
            "consumeTimeoutMinute": self.consume_timeout_minute,
            "attributes": dict(self.attributes),
            **{k: v for k, v in self.extra.items() if k not in KNOWN_FIELDS},
        }


@dataclass(frozen=True, slots=True)
class SubscriptionGroupWrapper(JsonBody):
    """``SubscriptionGroupWrapper``: every group of a broker by name, the (5.x) per-group
    forbidden table (group → topic → bits; kept, not enforced) and the data version."""

    subscription_group_table: Mapping[str, SubscriptionGroupConfig] = field(default_factory=dict)
    forbidden_table: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    data_version: DataVersion = field(default_factory=DataVersion)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        version, at = f.get("dataVersion")
        forbidden: dict[str, dict[str, int]] = {}
        for group, topics, where in f.entries("forbiddenTable"):
            Fields(topics, where)  # an object, or a FieldError naming it
            assert isinstance(topics, dict)
            forbidden[group] = {
                topic: as_int(bits, f"{where}[{topic}]", INT32)
                for topic, bits in topics.items()
                if bits is not None
            }
        return cls(
            subscription_group_table={
                name: SubscriptionGroupConfig.from_obj(value, where)
                for name, value, where in f.entries("subscriptionGroupTable")
            },
            forbidden_table=forbidden,
            data_version=DataVersion() if version is None else DataVersion.from_obj(version, at),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "subscriptionGroupTable": {
                k: v.to_obj() for k, v in self.subscription_group_table.items()
            },
            "forbiddenTable": {k: dict(v) for k, v in self.forbidden_table.items()},
            "dataVersion": self.data_version.to_obj(),
        }
