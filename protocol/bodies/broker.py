"""Broker registration and admin statistics bodies.

* ``REGISTER_BROKER`` (103) sends :class:`RegisterBrokerBody` to the name server;
  ``UPDATE_AND_CREATE_TOPIC`` and the topic-config queries use :class:`TopicConfig` and
  :class:`TopicConfigSerializeWrapper`;
* ``GET_TOPIC_STATS_INFO`` (202) answers :class:`TopicStatsTable`;
* ``GET_CONSUME_STATS`` (208) answers :class:`ConsumeStats`.

The two statistics bodies are Java ``Map<MessageQueue, …>``. fastjson writes such a map with
each key serialized as a JSON object in key position, which is not standard JSON
(apache/rocketmq#3389 shows a broker's bytes)::

    {"offsetTable":{{"brokerName":"b","queueId":0,"topic":"t"}:{"lastUpdateTimestamp":0,
    "maxOffset":0,"minOffset":0}}}

Decoding accepts that form, the same key as a JSON string (what
:func:`~protocol.bodies.loads_lenient` turns it into, and what ``to_json(strict_json=True)``
writes for tools that need standard JSON), and ``MessageQueue.toString()`` text
(``MessageQueue [topic=t, brokerName=b, queueId=0]``, fastjson 2's
``WriteNonStringKeyAsString``). ``to_json()`` writes fastjson's form, so Java admin tools
read our answers as they read a Java broker's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Self, TypeVar

from protocol.bodies._fields import INT32, Fields, JsonBody, as_int, as_text
from protocol.bodies._json import dumps_text, loads_lenient
from protocol.bodies.consumer import MessageQueue
from protocol.bodies.route import PERM_READ_WRITE
from protocol.errors import FieldError

V = TypeVar("V", bound=JsonBody)


class TopicFilterType(IntEnum):
    """``common.TopicFilterType``; Java writes the name."""

    SINGLE_TAG = 0
    MULTI_TAG = 1


@dataclass(frozen=True, slots=True)
class TopicConfig(JsonBody):
    """A topic's configuration on one broker; defaults are ``TopicConfig.java``'s."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PERM_READ_WRITE
    topic_filter_type: TopicFilterType = TopicFilterType.SINGLE_TAG
    topic_sys_flag: int = 0
    order: bool = False
    attributes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            topic_name=f.text("topicName"),
            read_queue_nums=f.int32("readQueueNums", 16),
            write_queue_nums=f.int32("writeQueueNums", 16),
            perm=f.int32("perm", PERM_READ_WRITE),
            topic_filter_type=f.enum(
                "topicFilterType", TopicFilterType, TopicFilterType.SINGLE_TAG
            ),
            topic_sys_flag=f.int32("topicSysFlag"),
            order=f.boolean("order"),
            attributes={key: as_text(v, at) for key, v, at in f.entries("attributes")},
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type.name,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
            "attributes": dict(self.attributes),
        }


@dataclass(frozen=True, slots=True)
class DataVersion(JsonBody):
    """``DataVersion``: when and how often a broker's topic configuration changed."""

    timestamp: int = 0
    counter: int = 0
    state_version: int = 0

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object (``counter`` is an ``AtomicLong``: a number)."""
        f = Fields(obj, path)
        return cls(f.int64("timestamp"), f.int64("counter"), f.int64("stateVersion"))

    def next(self, now_ms: int) -> DataVersion:
        """The version after one more change at ``now_ms``."""
        return DataVersion(now_ms, self.counter + 1, self.state_version)

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "counter": self.counter,
            "stateVersion": self.state_version,
            "timestamp": self.timestamp,
        }


@dataclass(frozen=True, slots=True)
class TopicConfigSerializeWrapper(JsonBody):
    """Every topic of a broker, by name, with the configuration's data version."""

    topic_config_table: Mapping[str, TopicConfig] = field(default_factory=dict)
    data_version: DataVersion = DataVersion()

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object; static-topic mapping fields are ignored."""
        f = Fields(obj, path)
        version, at = f.get("dataVersion")
        return cls(
            topic_config_table={
                name: TopicConfig.from_obj(value, where)
                for name, value, where in f.entries("topicConfigTable")
            },
            data_version=DataVersion() if version is None else DataVersion.from_obj(version, at),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "topicConfigTable": {k: v.to_obj() for k, v in self.topic_config_table.items()},
            "dataVersion": self.data_version.to_obj(),
        }


@dataclass(frozen=True, slots=True)
class RegisterBrokerBody(JsonBody):
    """The body of ``REGISTER_BROKER`` (JSON form).

    RocketMQ brokers send a zlib-compressed binary form instead when the request header
    says ``compressed=true``; :func:`protocol.bodies.namesrv.decode_register_body` reads
    both forms and :func:`~protocol.bodies.namesrv.encode_register_body` writes both.
    """

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = TopicConfigSerializeWrapper()
    filter_server_list: tuple[str, ...] = ()

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        wrapper, at = f.get("topicConfigSerializeWrapper")
        return cls(
            topic_config_serialize_wrapper=(
                TopicConfigSerializeWrapper()
                if wrapper is None
                else TopicConfigSerializeWrapper.from_obj(wrapper, at)
            ),
            filter_server_list=f.texts("filterServerList"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "topicConfigSerializeWrapper": self.topic_config_serialize_wrapper.to_obj(),
            "filterServerList": list(self.filter_server_list),
        }


# ------------------------------------------------------------------ maps keyed by queue
_MQ_PREFIX = "MessageQueue [topic="
_QUEUE_ID = re.compile(r"-?[0-9]+")


def _queue_key(key: str, path: str) -> MessageQueue:
    """A ``MessageQueue`` map key in any of the forms the module docstring lists."""
    if key.startswith("{"):
        try:
            obj = loads_lenient(key)
        except FieldError:
            raise FieldError(f"{path}: queue key is not JSON", field=path) from None
        return MessageQueue.from_obj(obj, path)
    # rpartition, not a regex with two greedy groups: that backtracks quadratically over
    # repeated separators. The last separators split, as the greedy groups did.
    if key.startswith(_MQ_PREFIX) and key.endswith("]"):
        head, sep, qid = key[len(_MQ_PREFIX) : -1].rpartition(", queueId=")
        topic, sep2, broker = head.rpartition(", brokerName=")
        if sep and sep2 and _QUEUE_ID.fullmatch(qid):
            return MessageQueue(topic, broker, as_int(qid, path, INT32))
    raise FieldError(f"{path}: map key is not a MessageQueue", field=path)


def _read_queue_table(f: Fields, name: str, cls: type[V]) -> dict[MessageQueue, V]:
    return {_queue_key(key, at): cls.from_obj(value, at) for key, value, at in f.entries(name)}


def _queue_table_obj(table: Mapping[MessageQueue, V]) -> dict[str, object]:
    """The standard-JSON form: each key is the queue's JSON text."""
    return {dumps_text(mq.to_obj()): value.to_obj() for mq, value in table.items()}


def _queue_table_fastjson(table: Mapping[MessageQueue, V]) -> str:
    """fastjson's form: each key is the queue's JSON object itself."""
    entries = (
        f"{dumps_text(mq.to_obj())}:{value.to_json().decode()}" for mq, value in table.items()
    )
    return "{" + ",".join(entries) + "}"


@dataclass(frozen=True, slots=True)
class TopicOffset(JsonBody):
    """The offset range of one queue and when it last received a message."""

    min_offset: int = 0
    max_offset: int = 0
    last_update_timestamp: int = 0

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(f.int64("minOffset"), f.int64("maxOffset"), f.int64("lastUpdateTimestamp"))

    def to_obj(self) -> dict[str, object]:
        """The JSON object, fields in fastjson's (alphabetical) order."""
        return {
            "lastUpdateTimestamp": self.last_update_timestamp,
            "maxOffset": self.max_offset,
            "minOffset": self.min_offset,
        }


@dataclass(frozen=True, slots=True)
class TopicStatsTable(JsonBody):
    """``GET_TOPIC_STATS_INFO``: the offset range of every queue of a topic."""

    offset_table: Mapping[MessageQueue, TopicOffset] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object (queue keys as JSON text or ``toString()``)."""
        return cls(_read_queue_table(Fields(obj, path), "offsetTable", TopicOffset))

    def to_obj(self) -> dict[str, object]:
        """The standard-JSON form (queue keys as JSON text)."""
        return {"offsetTable": _queue_table_obj(self.offset_table)}

    def to_json(self, *, strict_json: bool = False) -> bytes:
        """fastjson's form (queue objects as keys), or standard JSON with ``strict_json``."""
        if strict_json:
            return JsonBody.to_json(self)
        return f'{{"offsetTable":{_queue_table_fastjson(self.offset_table)}}}'.encode()


@dataclass(frozen=True, slots=True)
class OffsetWrapper(JsonBody):
    """A group's progress on one queue: broker end, committed and pulled offsets."""

    broker_offset: int = 0
    consumer_offset: int = 0
    pull_offset: int = 0
    last_timestamp: int = 0

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object (``pullOffset`` is new in RocketMQ 5)."""
        f = Fields(obj, path)
        return cls(
            f.int64("brokerOffset"),
            f.int64("consumerOffset"),
            f.int64("pullOffset"),
            f.int64("lastTimestamp"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object, fields in fastjson's (alphabetical) order."""
        return {
            "brokerOffset": self.broker_offset,
            "consumerOffset": self.consumer_offset,
            "lastTimestamp": self.last_timestamp,
            "pullOffset": self.pull_offset,
        }


@dataclass(frozen=True, slots=True)
class ConsumeStats(JsonBody):
    """``GET_CONSUME_STATS``: a group's progress on every queue of a topic, and its TPS."""

    offset_table: Mapping[MessageQueue, OffsetWrapper] = field(default_factory=dict)
    consume_tps: float = 0.0

    @property
    def total_diff(self) -> int:
        """``computeTotalDiff``: messages stored but not yet committed, over all queues."""
        return sum(o.broker_offset - o.consumer_offset for o in self.offset_table.values())

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object (queue keys as JSON text or ``toString()``)."""
        f = Fields(obj, path)
        return cls(_read_queue_table(f, "offsetTable", OffsetWrapper), f.number("consumeTps"))

    def to_obj(self) -> dict[str, object]:
        """The standard-JSON form (queue keys as JSON text)."""
        return {"consumeTps": self.consume_tps, "offsetTable": _queue_table_obj(self.offset_table)}

    def to_json(self, *, strict_json: bool = False) -> bytes:
        """fastjson's form (queue objects as keys), or standard JSON with ``strict_json``."""
        if strict_json:
            return JsonBody.to_json(self)
        tps = dumps_text(self.consume_tps)
        table = _queue_table_fastjson(self.offset_table)
        return f'{{"consumeTps":{tps},"offsetTable":{table}}}'.encode()
