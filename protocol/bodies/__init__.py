"""Typed JSON bodies of the Remoting protocol (sans-IO, standard library only).

Each body is a frozen dataclass with ``from_json(bytes) -> body`` and ``to_json() -> bytes``
(and ``from_obj``/``to_obj`` for already parsed JSON). Decoding reads JSON as Java's fastjson
writes it (bare map keys, enums by name or ordinal, numbers as strings) and raises only
:class:`~protocol.errors.FieldError`, naming the bad field by its JSON path; encoding writes
compact standard JSON that Java clients read.
"""

from __future__ import annotations

from protocol.bodies._fields import JsonBody
from protocol.bodies._json import dumps, loads_lenient
from protocol.bodies.ack import (
    MAX_BITSET_BYTES,
    RETRY_NORMAL,
    RETRY_V1,
    RETRY_V2,
    BatchAck,
    BatchAckMessageRequestBody,
    bitset_to_offsets,
    offsets_to_bitset,
)
from protocol.bodies.broker import (
    ConsumeStats,
    DataVersion,
    OffsetWrapper,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicFilterType,
    TopicOffset,
    TopicStatsTable,
)
from protocol.bodies.consumer import (
    GetConsumerListByGroupResponseBody,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    UnlockBatchRequestBody,
)
from protocol.bodies.heartbeat import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    HeartbeatData,
    MessageModel,
    ProducerData,
    SubscriptionData,
)
from protocol.bodies.namesrv import (
    NAMESPACE_ORDER_TOPIC_CONFIG,
    KVTable,
    body_crc32,
    decode_register_body,
    encode_register_body,
)
from protocol.bodies.route import (
    MASTER_ID,
    PERM_INHERIT,
    PERM_PRIORITY,
    PERM_READ,
    PERM_READ_WRITE,
    PERM_WRITE,
    BrokerData,
    ClusterInfo,
    QueueData,
    TopicList,
    TopicRouteData,
    is_inherited,
    is_readable,
    is_writeable,
    perm_to_string,
)

__all__ = [
    "MASTER_ID",
    "MAX_BITSET_BYTES",
    "NAMESPACE_ORDER_TOPIC_CONFIG",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_READ_WRITE",
    "PERM_WRITE",
    "RETRY_NORMAL",
    "RETRY_V1",
    "RETRY_V2",
    "BatchAck",
    "BatchAckMessageRequestBody",
    "BrokerData",
    "ClusterInfo",
    "ConsumeFromWhere",
    "ConsumeStats",
    "ConsumeType",
    "ConsumerData",
    "DataVersion",
    "GetConsumerListByGroupResponseBody",
    "HeartbeatData",
    "JsonBody",
    "KVTable",
    "LockBatchRequestBody",
    "LockBatchResponseBody",
    "MessageModel",
    "MessageQueue",
    "OffsetWrapper",
    "ProducerData",
    "QueueData",
    "RegisterBrokerBody",
    "SubscriptionData",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "TopicFilterType",
    "TopicList",
    "TopicOffset",
    "TopicRouteData",
    "TopicStatsTable",
    "UnlockBatchRequestBody",
    "bitset_to_offsets",
    "body_crc32",
    "decode_register_body",
    "dumps",
    "encode_register_body",
    "is_inherited",
    "is_readable",
    "is_writeable",
    "loads_lenient",
    "offsets_to_bitset",
    "perm_to_string",
]
