"""The RocketMQ 5 gRPC schema (``apache.rocketmq.v2``), written as trimq's own table.

The official RocketMQ 5 clients speak ``apache.rocketmq.v2.MessagingService``. This module
is wire-compatible with apache/rocketmq-apis v2: the package, service, method, message,
field and enum names and numbers, the field types, labels and oneofs are the interface
facts the clients rely on. No upstream ``.proto`` file or generated ``_pb2`` code is copied:
the schema is the table below (:data:`ENUMS`, :data:`MESSAGES`, :data:`RPCS`), turned into a
``FileDescriptorProto`` at import, with map fields and proto3 ``optional`` fields laid out
the way protoc lays them out (so reflection sees the same shapes as the official classes).
``tests/interop/test_grpc_schema.py`` checks every entry against the official Python client.

Why a private pool (:data:`POOL`): the official client registers the same full names in
protobuf's default pool, and a pool refuses a second, different definition of a name. Ours
never touches the default pool, so both can live in one process (tests, tools) and nothing
outside trimq can change what our classes mean.

Public API: a class per message (``QueryRouteRequest``, ``Settings``, ...; dynamic classes,
typed ``Any``), ``Timestamp`` and ``Duration`` from the same pool (a field of our messages
only takes those), an ``IntEnum`` per enum (``Permission.READ_WRITE``; ``Code`` comes from
:mod:`protocol.grpc.codes`), :data:`METHODS` (HTTP/2 path -> :class:`Method`) for routing,
and :data:`POOL` / :data:`FILE` / :data:`SERVICE`.

Imports only the standard library and protobuf.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    duration_pb2,
    message_factory,
    timestamp_pb2,
)
from google.protobuf.descriptor import Descriptor, FileDescriptor, ServiceDescriptor
from google.protobuf.message import Message as ProtoMessage

from protocol.grpc.codes import Code

PACKAGE: Final = "apache.rocketmq.v2"
#: Our file's name in :data:`POOL`: a name of our own, so it never looks like an upstream file.
FILE_NAME: Final = "trimq/apache_rocketmq_v2.proto"
SERVICE_NAME: Final = f"{PACKAGE}.MessagingService"

_FDP = descriptor_pb2.FieldDescriptorProto
#: The ``FieldDescriptorProto.Type`` values (a distinct int type for the type checker).
_FieldType: TypeAlias = "descriptor_pb2.FieldDescriptorProto.Type.ValueType"
_TIMESTAMP_FILE: Final = timestamp_pb2.DESCRIPTOR
_DURATION_FILE: Final = duration_pb2.DESCRIPTOR


# ---------------------------------------------------------------- enums
# One IntEnum per protobuf enum: the descriptors are built from these classes, so code and
# wire share one set of names and numbers. Proto3 needs 0 first; value names are
# package-wide in protobuf (C++ scoping), hence the prefixed *_UNSPECIFIED names.


class TransactionResolution(enum.IntEnum):
    TRANSACTION_RESOLUTION_UNSPECIFIED = 0
    COMMIT = 1
    ROLLBACK = 2


class TransactionSource(enum.IntEnum):
    SOURCE_UNSPECIFIED = 0
    SOURCE_CLIENT = 1
    SOURCE_SERVER_CHECK = 2  # an EndTransaction answering our orphaned-transaction check


class Permission(enum.IntEnum):
    PERMISSION_UNSPECIFIED = 0
    NONE = 1
    READ = 2
    WRITE = 3
    READ_WRITE = 4


class FilterType(enum.IntEnum):
    FILTER_TYPE_UNSPECIFIED = 0
    TAG = 1
    SQL = 2


class AddressScheme(enum.IntEnum):
    ADDRESS_SCHEME_UNSPECIFIED = 0
    IPv4 = 1
    IPv6 = 2
    DOMAIN_NAME = 3


class MessageType(enum.IntEnum):
    MESSAGE_TYPE_UNSPECIFIED = 0
    NORMAL = 1
    FIFO = 2
    DELAY = 3
    TRANSACTION = 4
    LITE = 5
    PRIORITY = 6


class DigestType(enum.IntEnum):
    DIGEST_TYPE_UNSPECIFIED = 0
    CRC32 = 1
    MD5 = 2
    SHA1 = 3


class ClientType(enum.IntEnum):
    CLIENT_TYPE_UNSPECIFIED = 0
    PRODUCER = 1
    PUSH_CONSUMER = 2
    SIMPLE_CONSUMER = 3
    PULL_CONSUMER = 4
    LITE_PUSH_CONSUMER = 5
    LITE_SIMPLE_CONSUMER = 6


class Encoding(enum.IntEnum):
    ENCODING_UNSPECIFIED = 0  # the Python client rejects a delivered message with this
    IDENTITY = 1
    GZIP = 2


class Language(enum.IntEnum):
    LANGUAGE_UNSPECIFIED = 0
    JAVA = 1
    CPP = 2
    DOT_NET = 3
    GOLANG = 4
    RUST = 5
    PYTHON = 6
    PHP = 7
    NODE_JS = 8
    RUBY = 9
    OBJECTIVE_C = 10
    DART = 11
    KOTLIN = 12


class LiteSubscriptionAction(enum.IntEnum):
    PARTIAL_ADD = 0
    PARTIAL_REMOVE = 1
    COMPLETE_ADD = 2
    COMPLETE_REMOVE = 3


class QueryOffsetPolicy(enum.IntEnum):
    BEGINNING = 0
    END = 1
    TIMESTAMP = 2


class OffsetOptionPolicy(enum.IntEnum):
    """``OffsetOption.Policy``: nested in the message, so its values do not clash with
    :class:`QueryOffsetPolicy`'s."""

    LAST = 0
    MIN = 1
    MAX = 2


#: Top-level enums of the package, by protobuf name (nested ones sit in their message).
ENUMS: Final[Mapping[str, type[enum.IntEnum]]] = {
    cls.__name__: cls
    for cls in (
        TransactionResolution,
        TransactionSource,
        Permission,
        FilterType,
        AddressScheme,
        MessageType,
        DigestType,
        ClientType,
        Encoding,
        Code,
        Language,
        LiteSubscriptionAction,
        QueryOffsetPolicy,
    )
}


# ---------------------------------------------------------------- the table
@dataclass(frozen=True, slots=True)
class Field:
    """One field: ``type`` is a scalar keyword (``string``, ``int32``, ...), ``map<K,V>``, a
    message or enum of this package (``Resource``, ``OffsetOption.Policy``) or a well-known
    type (``google.protobuf.Duration``).

    ``rep``: repeated. ``opt``: proto3 ``optional`` (explicit presence: a synthetic oneof in the
    descriptor, as protoc makes it). ``oneof``: the real oneof the field belongs to.
    """

    name: str
    number: int
    type: str
    rep: bool = False
    opt: bool = False
    oneof: str = ""

    def __post_init__(self) -> None:
        # protoc rejects these combinations; so does our table.
        if sum((self.rep, self.opt, bool(self.oneof))) > 1:
            raise ValueError(f"field {self.name}: repeated, optional and oneof exclude each other")


@dataclass(frozen=True, slots=True)
class MessageSpec:
    """One message: its fields in declaration order and its nested enums (by protobuf name)."""

    name: str
    fields: tuple[Field, ...]
    enums: Mapping[str, type[enum.IntEnum]] = field(default_factory=dict)


def _m(
    name: str, *fields: Field, enums: Mapping[str, type[enum.IntEnum]] | None = None
) -> MessageSpec:
    return MessageSpec(name, fields, dict(enums or {}))


_F = Field  # short, for the table
_DURATION = "google.protobuf.Duration"
_TIMESTAMP = "google.protobuf.Timestamp"

#: Every message of the package: definition.proto's, then service.proto's, in their order.
MESSAGES: Final[tuple[MessageSpec, ...]] = (
    # -- topics, routes and addresses
    _m("FilterExpression", _F("type", 1, "FilterType"), _F("expression", 2, "string")),
    _m(
        "RetryPolicy",
        _F("max_attempts", 1, "int32"),
        _F("exponential_backoff", 2, "ExponentialBackoff", oneof="strategy"),
        _F("customized_backoff", 3, "CustomizedBackoff", oneof="strategy"),
    ),
    _m(
        "ExponentialBackoff",
        _F("initial", 1, _DURATION),
        _F("max", 2, _DURATION),
        _F("multiplier", 3, "float"),
    ),
    _m("CustomizedBackoff", _F("next", 1, _DURATION, rep=True)),
    _m("Resource", _F("resource_namespace", 1, "string"), _F("name", 2, "string")),
    _m("SubscriptionEntry", _F("topic", 1, "Resource"), _F("expression", 2, "FilterExpression")),
    _m("Address", _F("host", 1, "string"), _F("port", 2, "int32")),
    _m("Endpoints", _F("scheme", 1, "AddressScheme"), _F("addresses", 2, "Address", rep=True)),
    _m("Broker", _F("name", 1, "string"), _F("id", 2, "int32"), _F("endpoints", 3, "Endpoints")),
    _m(
        "MessageQueue",
        _F("topic", 1, "Resource"),
        _F("id", 2, "int32"),
        _F("permission", 3, "Permission"),
        _F("broker", 4, "Broker"),
        _F("accept_message_types", 5, "MessageType", rep=True),
    ),
    # -- messages
    _m("Digest", _F("type", 1, "DigestType"), _F("checksum", 2, "string")),
    _m(
        "SystemProperties",
        _F("tag", 1, "string", opt=True),
        _F("keys", 2, "string", rep=True),
        _F("message_id", 3, "string"),
        _F("body_digest", 4, "Digest"),
        _F("body_encoding", 5, "Encoding"),
        _F("message_type", 6, "MessageType"),
        _F("born_timestamp", 7, _TIMESTAMP),
        _F("born_host", 8, "string"),
        _F("store_timestamp", 9, _TIMESTAMP, opt=True),
        _F("store_host", 10, "string"),
        _F("delivery_timestamp", 11, _TIMESTAMP, opt=True),
        _F("receipt_handle", 12, "string", opt=True),
        _F("queue_id", 13, "int32"),
        _F("queue_offset", 14, "int64", opt=True),
        _F("invisible_duration", 15, _DURATION, opt=True),
        _F("delivery_attempt", 16, "int32", opt=True),
        _F("message_group", 17, "string", opt=True),
        _F("trace_context", 18, "string", opt=True),
        _F("orphaned_transaction_recovery_duration", 19, _DURATION, opt=True),
        _F("dead_letter_queue", 20, "DeadLetterQueue", opt=True),
        _F("lite_topic", 21, "string", opt=True),
        _F("priority", 22, "int32", opt=True),
    ),
    _m("DeadLetterQueue", _F("topic", 1, "string"), _F("message_id", 2, "string")),
    _m(
        "Message",
        _F("topic", 1, "Resource"),
        _F("user_properties", 2, "map<string,string>"),
        _F("system_properties", 3, "SystemProperties"),
        _F("body", 4, "bytes"),
    ),
    _m("Assignment", _F("message_queue", 1, "MessageQueue")),
    _m("Status", _F("code", 1, "Code"), _F("message", 2, "string")),
    # -- client settings (the Telemetry handshake)
    _m(
        "UA",
        _F("language", 1, "Language"),
        _F("version", 2, "string"),
        _F("platform", 3, "string"),
        _F("hostname", 4, "string"),
    ),
    _m(
        "Settings",
        _F("client_type", 1, "ClientType", opt=True),
        _F("access_point", 2, "Endpoints", opt=True),
        _F("backoff_policy", 3, "RetryPolicy", opt=True),
        _F("request_timeout", 4, _DURATION, opt=True),
        _F("publishing", 5, "Publishing", oneof="pub_sub"),
        _F("subscription", 6, "Subscription", oneof="pub_sub"),
        _F("user_agent", 7, "UA"),
        _F("metric", 8, "Metric"),
        # Added to the apis repo in May 2026; the 5.1.2 Python client does not have it.
        _F("client_properties", 9, "map<string,string>"),
    ),
    _m(
        "Publishing",
        _F("topics", 1, "Resource", rep=True),
        _F("max_body_size", 2, "int32"),
        _F("validate_message_type", 3, "bool"),
    ),
    _m(
        "Subscription",
        _F("group", 1, "Resource", opt=True),
        _F("subscriptions", 2, "SubscriptionEntry", rep=True),
        _F("fifo", 3, "bool", opt=True),
        _F("receive_batch_size", 4, "int32", opt=True),
        _F("long_polling_timeout", 5, _DURATION, opt=True),
        _F("lite_subscription_quota", 6, "int32", opt=True),
        _F("max_lite_topic_size", 7, "int32", opt=True),
    ),
    _m("Metric", _F("on", 1, "bool"), _F("endpoints", 2, "Endpoints", opt=True)),
    _m(
        "OffsetOption",
        _F("policy", 1, "OffsetOption.Policy", oneof="offset_type"),
        _F("offset", 2, "int64", oneof="offset_type"),
        _F("tail_n", 3, "int64", oneof="offset_type"),
        _F("timestamp", 4, "int64", oneof="offset_type"),
        enums={"Policy": OffsetOptionPolicy},
    ),
    # -- service.proto: routes and sending
    _m("QueryRouteRequest", _F("topic", 1, "Resource"), _F("endpoints", 2, "Endpoints")),
    _m(
        "QueryRouteResponse",
        _F("status", 1, "Status"),
        _F("message_queues", 2, "MessageQueue", rep=True),
    ),
    _m("SendMessageRequest", _F("messages", 1, "Message", rep=True)),
    _m(
        "SendResultEntry",
        _F("status", 1, "Status"),
        _F("message_id", 2, "string"),
        _F("transaction_id", 3, "string"),
        _F("offset", 4, "int64"),
        _F("recall_handle", 5, "string"),
    ),
    _m(
        "SendMessageResponse",
        _F("status", 1, "Status"),
        _F("entries", 2, "SendResultEntry", rep=True),
    ),
    _m(
        "QueryAssignmentRequest",
        _F("topic", 1, "Resource"),
        _F("group", 2, "Resource"),
        _F("endpoints", 3, "Endpoints"),
    ),
    _m(
        "QueryAssignmentResponse",
        _F("status", 1, "Status"),
        _F("assignments", 2, "Assignment", rep=True),
    ),
    # -- consuming
    _m(
        "ReceiveMessageRequest",
        _F("group", 1, "Resource"),
        _F("message_queue", 2, "MessageQueue"),
        _F("filter_expression", 3, "FilterExpression"),
        _F("batch_size", 4, "int32"),
        _F("invisible_duration", 5, _DURATION, opt=True),
        _F("auto_renew", 6, "bool"),
        _F("long_polling_timeout", 7, _DURATION, opt=True),
        _F("attempt_id", 8, "string", opt=True),
    ),
    _m(
        "ReceiveMessageResponse",
        _F("status", 1, "Status", oneof="content"),
        _F("message", 2, "Message", oneof="content"),
        _F("delivery_timestamp", 3, _TIMESTAMP, oneof="content"),
    ),
    _m(
        "AckMessageEntry",
        _F("message_id", 1, "string"),
        _F("receipt_handle", 2, "string"),
        _F("lite_topic", 3, "string", opt=True),
    ),
    _m(
        "AckMessageRequest",
        _F("group", 1, "Resource"),
        _F("topic", 2, "Resource"),
        _F("entries", 3, "AckMessageEntry", rep=True),
    ),
    _m(
        "AckMessageResultEntry",
        _F("message_id", 1, "string"),
        _F("receipt_handle", 2, "string"),
        _F("status", 3, "Status"),
    ),
    _m(
        "AckMessageResponse",
        _F("status", 1, "Status"),
        _F("entries", 2, "AckMessageResultEntry", rep=True),
    ),
    _m(
        "ForwardMessageToDeadLetterQueueRequest",
        _F("group", 1, "Resource"),
        _F("topic", 2, "Resource"),
        _F("receipt_handle", 3, "string"),
        _F("message_id", 4, "string"),
        _F("delivery_attempt", 5, "int32"),
        _F("max_delivery_attempts", 6, "int32"),
        _F("lite_topic", 7, "string", opt=True),
    ),
    _m("ForwardMessageToDeadLetterQueueResponse", _F("status", 1, "Status")),
    # -- client lifecycle and transactions
    _m(
        "HeartbeatRequest",
        _F("group", 1, "Resource", opt=True),
        _F("client_type", 2, "ClientType"),
    ),
    _m("HeartbeatResponse", _F("status", 1, "Status")),
    _m(
        "EndTransactionRequest",
        _F("topic", 1, "Resource"),
        _F("message_id", 2, "string"),
        _F("transaction_id", 3, "string"),
        _F("resolution", 4, "TransactionResolution"),
        _F("source", 5, "TransactionSource"),
        _F("trace_context", 6, "string"),
    ),
    _m("EndTransactionResponse", _F("status", 1, "Status")),
    # -- Telemetry commands
    _m("PrintThreadStackTraceCommand", _F("nonce", 1, "string")),
    _m("ReconnectEndpointsCommand", _F("nonce", 1, "string")),
    _m(
        "ThreadStackTrace",
        _F("nonce", 1, "string"),
        _F("thread_stack_trace", 2, "string", opt=True),
    ),
    _m("VerifyMessageCommand", _F("nonce", 1, "string"), _F("message", 2, "Message")),
    _m("VerifyMessageResult", _F("nonce", 1, "string")),
    _m(
        "RecoverOrphanedTransactionCommand",
        _F("message", 1, "Message"),
        _F("transaction_id", 2, "string"),
    ),
    _m("NotifyUnsubscribeLiteCommand", _F("lite_topic", 1, "string")),
    _m(
        "TelemetryCommand",
        _F("status", 1, "Status", opt=True),
        _F("settings", 2, "Settings", oneof="command"),
        _F("thread_stack_trace", 3, "ThreadStackTrace", oneof="command"),
        _F("verify_message_result", 4, "VerifyMessageResult", oneof="command"),
        _F(
            "recover_orphaned_transaction_command",
            5,
            "RecoverOrphanedTransactionCommand",
            oneof="command",
        ),
        _F("print_thread_stack_trace_command", 6, "PrintThreadStackTraceCommand", oneof="command"),
        _F("verify_message_command", 7, "VerifyMessageCommand", oneof="command"),
        _F("reconnect_endpoints_command", 8, "ReconnectEndpointsCommand", oneof="command"),
        _F("notify_unsubscribe_lite_command", 9, "NotifyUnsubscribeLiteCommand", oneof="command"),
    ),
    _m("NotifyClientTerminationRequest", _F("group", 1, "Resource", opt=True)),
    _m("NotifyClientTerminationResponse", _F("status", 1, "Status")),
    _m(
        "ChangeInvisibleDurationRequest",
        _F("group", 1, "Resource"),
        _F("topic", 2, "Resource"),
        _F("receipt_handle", 3, "string"),
        _F("invisible_duration", 4, _DURATION),
        _F("message_id", 5, "string"),
        _F("lite_topic", 6, "string", opt=True),
        _F("suspend", 7, "bool", opt=True),
    ),
    _m(
        "ChangeInvisibleDurationResponse",
        _F("status", 1, "Status"),
        _F("receipt_handle", 2, "string"),
    ),
    # -- pull and offsets (no official client calls them; trimq answers UNIMPLEMENTED)
    _m(
        "PullMessageRequest",
        _F("group", 1, "Resource"),
        _F("message_queue", 2, "MessageQueue"),
        _F("offset", 3, "int64"),
        _F("batch_size", 4, "int32"),
        _F("filter_expression", 5, "FilterExpression"),
        _F("long_polling_timeout", 6, _DURATION),
    ),
    _m(
        "PullMessageResponse",
        _F("status", 1, "Status", oneof="content"),
        _F("message", 2, "Message", oneof="content"),
        _F("next_offset", 3, "int64", oneof="content"),
    ),
    _m(
        "UpdateOffsetRequest",
        _F("group", 1, "Resource"),
        _F("message_queue", 2, "MessageQueue"),
        _F("offset", 3, "int64"),
    ),
    _m("UpdateOffsetResponse", _F("status", 1, "Status")),
    _m("GetOffsetRequest", _F("group", 1, "Resource"), _F("message_queue", 2, "MessageQueue")),
    _m("GetOffsetResponse", _F("status", 1, "Status"), _F("offset", 2, "int64")),
    _m(
        "QueryOffsetRequest",
        _F("message_queue", 1, "MessageQueue"),
        _F("query_offset_policy", 2, "QueryOffsetPolicy"),
        _F("timestamp", 3, _TIMESTAMP, opt=True),
    ),
    _m("QueryOffsetResponse", _F("status", 1, "Status"), _F("offset", 2, "int64")),
    # -- recall and lite topics
    _m("RecallMessageRequest", _F("topic", 1, "Resource"), _F("recall_handle", 2, "string")),
    _m("RecallMessageResponse", _F("status", 1, "Status"), _F("message_id", 2, "string")),
    _m(
        "SyncLiteSubscriptionRequest",
        _F("action", 1, "LiteSubscriptionAction"),
        _F("topic", 2, "Resource"),
        _F("group", 3, "Resource"),
        _F("lite_topic_set", 4, "string", rep=True),
        _F("version", 5, "int64", opt=True),
        _F("offset_option", 6, "OffsetOption", opt=True),
    ),
    _m("SyncLiteSubscriptionResponse", _F("status", 1, "Status")),
)


@dataclass(frozen=True, slots=True)
class Rpc:
    """One method of ``MessagingService`` in the table (message names, streaming flags)."""

    name: str
    request: str
    response: str
    client_streaming: bool = False
    server_streaming: bool = False


def _rpc(name: str, *, server_streaming: bool = False) -> Rpc:
    """The usual shape: ``<Name>Request`` in, ``<Name>Response`` out."""
    return Rpc(name, f"{name}Request", f"{name}Response", server_streaming=server_streaming)


#: ``MessagingService``'s methods, in the service's order.
RPCS: Final[tuple[Rpc, ...]] = (
    _rpc("QueryRoute"),
    _rpc("Heartbeat"),
    _rpc("SendMessage"),
    _rpc("QueryAssignment"),
    _rpc("ReceiveMessage", server_streaming=True),
    _rpc("AckMessage"),
    _rpc("ForwardMessageToDeadLetterQueue"),
    _rpc("PullMessage", server_streaming=True),
    _rpc("UpdateOffset"),
    _rpc("GetOffset"),
    _rpc("QueryOffset"),
    _rpc("EndTransaction"),
    Rpc("Telemetry", "TelemetryCommand", "TelemetryCommand", True, True),
    _rpc("NotifyClientTermination"),
    _rpc("ChangeInvisibleDuration"),
    _rpc("RecallMessage"),
    _rpc("SyncLiteSubscription"),
)


# ---------------------------------------------------------------- table -> descriptors
_SCALARS: Final[Mapping[str, _FieldType]] = {
    "double": _FDP.TYPE_DOUBLE,
    "float": _FDP.TYPE_FLOAT,
    "int64": _FDP.TYPE_INT64,
    "uint64": _FDP.TYPE_UINT64,
    "int32": _FDP.TYPE_INT32,
    "uint32": _FDP.TYPE_UINT32,
    "bool": _FDP.TYPE_BOOL,
    "string": _FDP.TYPE_STRING,
    "bytes": _FDP.TYPE_BYTES,
}
_MAP: Final = re.compile(r"map<(\w+),\s*([\w.]+)>")


def _enum_names() -> frozenset[str]:
    nested = (f"{spec.name}.{name}" for spec in MESSAGES for name in spec.enums)
    return frozenset((*ENUMS, *nested))


_ENUM_NAMES: Final = _enum_names()


def _type_of(type_name: str) -> tuple[_FieldType, str]:
    """A field type as (``FieldDescriptorProto.Type``, fully qualified type name or "")."""
    if type_name in _SCALARS:
        return _SCALARS[type_name], ""
    # Anything else is a message or enum; the pool reports a name that resolves to neither.
    full = type_name if type_name.startswith("google.protobuf.") else f"{PACKAGE}.{type_name}"
    kind = _FDP.TYPE_ENUM if type_name in _ENUM_NAMES else _FDP.TYPE_MESSAGE
    return kind, f".{full}"


def _enum_proto(name: str, members: type[enum.IntEnum]) -> descriptor_pb2.EnumDescriptorProto:
    proto = descriptor_pb2.EnumDescriptorProto(name=name)
    for member in members:
        proto.value.add(name=member.name, number=member.value)
    return proto


def _map_entry_name(field_name: str) -> str:
    """protoc's name for a map's entry type: ``user_properties`` -> ``UserPropertiesEntry``."""
    return "".join(part.capitalize() for part in field_name.split("_")) + "Entry"


def _map_entry(name: str, key: str, value: str) -> descriptor_pb2.DescriptorProto:
    """A map's nested entry message, as protoc makes it: key = 1, value = 2, ``map_entry``."""
    entry = descriptor_pb2.DescriptorProto(name=name)
    entry.options.map_entry = True
    for number, (field_name, type_name) in enumerate((("key", key), ("value", value)), 1):
        kind, full = _type_of(type_name)
        proto = entry.field.add(name=field_name, number=number, label=_FDP.LABEL_OPTIONAL)
        proto.type = kind
        if full:  # set only for message and enum types: protobuf rejects it on scalars
            proto.type_name = full
    return entry


def _oneof_names(spec: MessageSpec) -> list[str]:
    """The message's oneofs as protoc orders them: the real ones in declaration order, then
    one synthetic ``_<field>`` per proto3 ``optional`` field, in field order."""
    real = dict.fromkeys(f.oneof for f in spec.fields if f.oneof)
    return [*real, *(f"_{f.name}" for f in spec.fields if f.opt)]


def _field_proto(
    spec: MessageSpec,
    fld: Field,
    oneofs: Mapping[str, int],
    message: descriptor_pb2.DescriptorProto,
) -> None:
    """Append ``fld`` to ``message`` (and, for a map, its entry type)."""
    proto = message.field.add(name=fld.name, number=fld.number, label=_FDP.LABEL_OPTIONAL)
    if fld.rep:
        proto.label = _FDP.LABEL_REPEATED
    if fld.oneof:
        proto.oneof_index = oneofs[fld.oneof]
    if fld.opt:
        proto.proto3_optional = True
        proto.oneof_index = oneofs[f"_{fld.name}"]
    if match := _MAP.fullmatch(fld.type):
        # A map is a repeated entry message on the wire and in the descriptor.
        entry = _map_entry(_map_entry_name(fld.name), match[1], match[2])
        message.nested_type.append(entry)
        proto.label = _FDP.LABEL_REPEATED
        proto.type = _FDP.TYPE_MESSAGE
        proto.type_name = f".{PACKAGE}.{spec.name}.{entry.name}"
        return
    proto.type, type_name = _type_of(fld.type)
    if type_name:
        proto.type_name = type_name


def _message_proto(spec: MessageSpec) -> descriptor_pb2.DescriptorProto:
    message = descriptor_pb2.DescriptorProto(name=spec.name)
    oneofs = _oneof_names(spec)
    for name in oneofs:
        message.oneof_decl.add(name=name)
    index = {name: i for i, name in enumerate(oneofs)}
    for fld in spec.fields:
        _field_proto(spec, fld, index, message)
    for name, members in spec.enums.items():
        message.enum_type.append(_enum_proto(name, members))
    return message


def _service_proto() -> descriptor_pb2.ServiceDescriptorProto:
    service = descriptor_pb2.ServiceDescriptorProto(name=SERVICE_NAME.rsplit(".", 1)[1])
    for rpc in RPCS:
        service.method.add(
            name=rpc.name,
            input_type=f".{PACKAGE}.{rpc.request}",
            output_type=f".{PACKAGE}.{rpc.response}",
            client_streaming=rpc.client_streaming,
            server_streaming=rpc.server_streaming,
        )
    return service


def file_descriptor_proto() -> descriptor_pb2.FileDescriptorProto:
    """The whole table as one proto3 ``FileDescriptorProto`` (a fresh copy on each call)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name=FILE_NAME,
        package=PACKAGE,
        syntax="proto3",
        dependency=[_TIMESTAMP_FILE.name, _DURATION_FILE.name],
    )
    for name, members in ENUMS.items():
        proto.enum_type.append(_enum_proto(name, members))
    proto.message_type.extend(_message_proto(spec) for spec in MESSAGES)
    proto.service.append(_service_proto())
    return proto


def _build_pool() -> descriptor_pool.DescriptorPool:
    """A pool of our own: the well-known types we use (protobuf's own files), then ours."""
    pool = descriptor_pool.DescriptorPool()
    for dependency in (_TIMESTAMP_FILE, _DURATION_FILE):
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(dependency.serialized_pb))
    pool.Add(file_descriptor_proto())
    return pool


#: The private descriptor pool holding the schema (never protobuf's default pool).
POOL: Final = _build_pool()
FILE: Final[FileDescriptor] = POOL.FindFileByName(FILE_NAME)
SERVICE: Final[ServiceDescriptor] = POOL.FindServiceByName(SERVICE_NAME)


def message_class(full_name: str) -> type[ProtoMessage]:
    """The class of a message of :data:`POOL` by full name (``apache.rocketmq.v2.Status``)."""
    descriptor: Descriptor = POOL.FindMessageTypeByName(full_name)
    return message_factory.GetMessageClass(descriptor)


def _cls(name: str) -> Any:
    # Any: the classes are made at run time, so a type checker cannot know their fields.
    return message_class(f"{PACKAGE}.{name}")


# ---------------------------------------------------------------- routing
@dataclass(frozen=True, slots=True)
class Method:
    """One ``MessagingService`` method as the server routes it."""

    name: str
    request: type[ProtoMessage]
    response: type[ProtoMessage]
    client_streaming: bool
    server_streaming: bool

    @property
    def path(self) -> str:
        """The HTTP/2 ``:path`` of a call: ``/apache.rocketmq.v2.MessagingService/<name>``."""
        return f"/{SERVICE_NAME}/{self.name}"


def _methods() -> dict[str, Method]:
    """From the service descriptor (not the table), so routing sees what the pool built."""
    methods = (
        Method(
            m.name,
            message_factory.GetMessageClass(m.input_type),
            message_factory.GetMessageClass(m.output_type),
            m.client_streaming,
            m.server_streaming,
        )
        for m in SERVICE.methods
    )
    return {method.path: method for method in methods}


#: HTTP/2 path -> method, for every method of ``MessagingService``.
METHODS: Final[Mapping[str, Method]] = _methods()


# ---------------------------------------------------------------- message classes
# The well-known types of POOL: a field of our messages takes only these (not timestamp_pb2's).
Timestamp: Any = message_class("google.protobuf.Timestamp")
Duration: Any = message_class("google.protobuf.Duration")

FilterExpression: Any = _cls("FilterExpression")
RetryPolicy: Any = _cls("RetryPolicy")
ExponentialBackoff: Any = _cls("ExponentialBackoff")
CustomizedBackoff: Any = _cls("CustomizedBackoff")
Resource: Any = _cls("Resource")
SubscriptionEntry: Any = _cls("SubscriptionEntry")
Address: Any = _cls("Address")
Endpoints: Any = _cls("Endpoints")
Broker: Any = _cls("Broker")
MessageQueue: Any = _cls("MessageQueue")
Digest: Any = _cls("Digest")
SystemProperties: Any = _cls("SystemProperties")
DeadLetterQueue: Any = _cls("DeadLetterQueue")
Message: Any = _cls("Message")
Assignment: Any = _cls("Assignment")
Status: Any = _cls("Status")
UA: Any = _cls("UA")
Settings: Any = _cls("Settings")
Publishing: Any = _cls("Publishing")
Subscription: Any = _cls("Subscription")
Metric: Any = _cls("Metric")
OffsetOption: Any = _cls("OffsetOption")

QueryRouteRequest: Any = _cls("QueryRouteRequest")
QueryRouteResponse: Any = _cls("QueryRouteResponse")
SendMessageRequest: Any = _cls("SendMessageRequest")
SendResultEntry: Any = _cls("SendResultEntry")
SendMessageResponse: Any = _cls("SendMessageResponse")
QueryAssignmentRequest: Any = _cls("QueryAssignmentRequest")
QueryAssignmentResponse: Any = _cls("QueryAssignmentResponse")
ReceiveMessageRequest: Any = _cls("ReceiveMessageRequest")
ReceiveMessageResponse: Any = _cls("ReceiveMessageResponse")
AckMessageEntry: Any = _cls("AckMessageEntry")
AckMessageRequest: Any = _cls("AckMessageRequest")
AckMessageResultEntry: Any = _cls("AckMessageResultEntry")
AckMessageResponse: Any = _cls("AckMessageResponse")
ForwardMessageToDeadLetterQueueRequest: Any = _cls("ForwardMessageToDeadLetterQueueRequest")
ForwardMessageToDeadLetterQueueResponse: Any = _cls("ForwardMessageToDeadLetterQueueResponse")
HeartbeatRequest: Any = _cls("HeartbeatRequest")
HeartbeatResponse: Any = _cls("HeartbeatResponse")
EndTransactionRequest: Any = _cls("EndTransactionRequest")
EndTransactionResponse: Any = _cls("EndTransactionResponse")
PrintThreadStackTraceCommand: Any = _cls("PrintThreadStackTraceCommand")
ReconnectEndpointsCommand: Any = _cls("ReconnectEndpointsCommand")
ThreadStackTrace: Any = _cls("ThreadStackTrace")
VerifyMessageCommand: Any = _cls("VerifyMessageCommand")
VerifyMessageResult: Any = _cls("VerifyMessageResult")
RecoverOrphanedTransactionCommand: Any = _cls("RecoverOrphanedTransactionCommand")
NotifyUnsubscribeLiteCommand: Any = _cls("NotifyUnsubscribeLiteCommand")
TelemetryCommand: Any = _cls("TelemetryCommand")
NotifyClientTerminationRequest: Any = _cls("NotifyClientTerminationRequest")
NotifyClientTerminationResponse: Any = _cls("NotifyClientTerminationResponse")
ChangeInvisibleDurationRequest: Any = _cls("ChangeInvisibleDurationRequest")
ChangeInvisibleDurationResponse: Any = _cls("ChangeInvisibleDurationResponse")
PullMessageRequest: Any = _cls("PullMessageRequest")
PullMessageResponse: Any = _cls("PullMessageResponse")
UpdateOffsetRequest: Any = _cls("UpdateOffsetRequest")
UpdateOffsetResponse: Any = _cls("UpdateOffsetResponse")
GetOffsetRequest: Any = _cls("GetOffsetRequest")
GetOffsetResponse: Any = _cls("GetOffsetResponse")
QueryOffsetRequest: Any = _cls("QueryOffsetRequest")
QueryOffsetResponse: Any = _cls("QueryOffsetResponse")
RecallMessageRequest: Any = _cls("RecallMessageRequest")
RecallMessageResponse: Any = _cls("RecallMessageResponse")
SyncLiteSubscriptionRequest: Any = _cls("SyncLiteSubscriptionRequest")
SyncLiteSubscriptionResponse: Any = _cls("SyncLiteSubscriptionResponse")
