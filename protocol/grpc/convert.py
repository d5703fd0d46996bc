"""v2 messages ↔ RocketMQ properties and records, sans-IO: what the proxy's ``GrpcConverter``
does, so that one store serves both front ends.

A message sent over gRPC is stored as a Remoting producer would store it (``UNIQ_KEY`` = the
client's ``message_id``, ``TAGS``, ``KEYS`` space-joined, ``__SHARDINGKEY`` = the message
group, ``TIMER_DELIVER_MS`` = the delivery time, the user properties as plain properties); a
stored record is delivered over gRPC with ``message_id`` = ``UNIQ_KEY`` (else the offset id),
its tag, keys and user properties, an MD5 body digest in upper-case hex (the one format both
official clients accept), ``body_encoding`` IDENTITY (a zlib-compressed body is inflated;
0 breaks the Python client) and
``delivery_attempt`` = reconsume times + 1.

A receipt handle is the pop receipt (:class:`~protocol.receipt.ExtraInfo`, eight fields)
followed by the message's commit-log offset, as the proxy's handles are: the offset is what a
dead-letter forward needs. A Remoting receipt (no offset) is accepted too.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Mapping
from typing import Any, Final

from protocol.errors import ReceiptError
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.message import MessageExt
from protocol.naming import is_dlq_topic
from protocol.properties import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    KEYS,
    ORIGIN_MESSAGE_ID,
    ORIGIN_TOPIC,
    RETRY_TOPIC,
    TAGS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_OUT_MS,
    TRAN_MSG,
    UNIQ_KEY,
    join_keys,
    split_keys,
)
from protocol.receipt import ExtraInfo, RetryFlag

#: RocketMQ's ``MessageConst.PROPERTY_SHARDING_KEY``: a FIFO message's group.
SHARDING_KEY: Final = "__SHARDINGKEY"
TRACE_CONTEXT: Final = "TRACE_CONTEXT"
DLQ_ORIGIN_TOPIC: Final = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID: Final = "DLQ_ORIGIN_MESSAGE_ID"
#: sysFlag bit of a compressed body.
COMPRESSED_FLAG: Final = 0x1

#: RocketMQ's reserved property names (``MessageConst.STRING_HASH_SET``) and trimq's own: a
#: delivered message's user properties are the others, and a producer may not set these.
SYSTEM_PROPERTY_NAMES: Final = frozenset(
    {
        "TRACE_ON", "MSG_REGION", KEYS, TAGS, "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC",
        "REAL_QID", TRAN_MSG, "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID",
        "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG", "MQ2_FLAG", "RECONSUME_TIME",
        UNIQ_KEY, "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK", "POP_CK_OFFSET",
        "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO",
        "INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME",
        "PUSH_REPLY_TIME", "CLUSTER", "MSG_TYPE", "__transactionId__", "TRANSACTION_CHECK_TIMES",
        CHECK_IMMUNITY_TIME_IN_SECONDS, SHARDING_KEY, TIMER_DELIVER_MS, TIMER_DELAY_SEC,
        "TIMER_DELAY_MS", TIMER_OUT_MS, "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES", "TIMER_DEL_UNIQKEY", "BORN_HOST", "BORN_TIMESTAMP",
        DLQ_ORIGIN_TOPIC, DLQ_ORIGIN_MESSAGE_ID, TRACE_CONTEXT, "INNER_NUM", "INNER_BASE",
        "__CRC32#", "ORIGIN_TOPIC", "REVIVE_DEADLINE_MS", "TIMER_SRC",
    }
)  # fmt: skip

_MS_PER_S: Final = 1000


# ------------------------------------------------------------------ time
def timestamp_ms(ts: Any) -> int:
    """A ``google.protobuf.Timestamp`` as epoch milliseconds."""
    return int(ts.seconds) * _MS_PER_S + int(ts.nanos) // 1_000_000


def set_timestamp(ts: Any, ms: int) -> None:
    """Fill a ``Timestamp`` from epoch milliseconds."""
    ts.seconds, ts.nanos = divmod(ms, _MS_PER_S)
    ts.nanos *= 1_000_000


def duration_ms(d: Any) -> int:
    """A ``google.protobuf.Duration`` as milliseconds."""
    return int(d.seconds) * _MS_PER_S + int(d.nanos) // 1_000_000


def set_duration(d: Any, ms: int) -> None:
    """Fill a ``Duration`` from milliseconds."""
    d.seconds, rest = divmod(ms, _MS_PER_S)
    d.nanos = rest * 1_000_000


# ------------------------------------------------------------------ sending
class MessageRejected(ValueError):
    """A message a producer may not send as it is; ``code`` is the v2 code to answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def properties_of(message: Any) -> dict[str, str]:
    """The properties a v2 ``Message`` is stored with (the proxy's mapping).

    Raises:
        MessageRejected: a reserved user-property name, a bad tag or message group, no
            message id.
    """
    system = message.system_properties
    props: dict[str, str] = {}
    for name, value in message.user_properties.items():
        if name in SYSTEM_PROPERTY_NAMES:
            raise MessageRejected(
                Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"property {name!r} is reserved for the broker",
            )
        props[name] = value
    if not system.message_id.strip():
        raise MessageRejected(Code.ILLEGAL_MESSAGE_ID, "message_id is empty")
    props[UNIQ_KEY] = system.message_id
    if system.HasField("tag"):
        if not system.tag.strip() or "|" in system.tag:
            raise MessageRejected(
                Code.ILLEGAL_MESSAGE_TAG, f"tag {system.tag!r} is blank or contains |"
            )
        props[TAGS] = system.tag
    if system.keys:
        props[KEYS] = join_keys(system.keys)
    if system.HasField("message_group"):
        _check_group(system.message_group)
        props[SHARDING_KEY] = system.message_group
    if system.HasField("delivery_timestamp"):
        props[TIMER_DELIVER_MS] = str(timestamp_ms(system.delivery_timestamp))
    if system.HasField("trace_context"):
        props[TRACE_CONTEXT] = system.trace_context
    if system.message_type == schema.MessageType.TRANSACTION:
        props[TRAN_MSG] = "true"
        if system.HasField("orphaned_transaction_recovery_duration"):
            seconds = duration_ms(system.orphaned_transaction_recovery_duration) // 1000
            props[CHECK_IMMUNITY_TIME_IN_SECONDS] = str(max(0, seconds))
    return props


def _check_group(group: str) -> None:
    if not group or len(group.encode()) >= 64 or any(ord(c) < 0x20 for c in group):
        raise MessageRejected(
            Code.ILLEGAL_MESSAGE_GROUP,
            "message_group must be 1 to 63 bytes without control characters",
        )


def java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units), as the proxy hashes message groups."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


# ------------------------------------------------------------------ delivering
def message_type_of(props: Mapping[str, str]) -> schema.MessageType:
    """What kind of message stored properties describe."""
    if props.get(TRAN_MSG) == "true":
        return schema.MessageType.TRANSACTION
    if SHARDING_KEY in props:
        return schema.MessageType.FIFO
    if TIMER_DELIVER_MS in props or TIMER_DELAY_SEC in props or TIMER_OUT_MS in props:
        return schema.MessageType.DELAY
    return schema.MessageType.NORMAL


def to_message(
    msg: MessageExt,
    *,
    receipt_handle: str | None = None,
    invisible_ms: int = 0,
    out: Any = None,
) -> Any:
    """A stored record as a delivered v2 ``Message`` (filled into ``out`` when given, e.g. a
    response's ``message`` field: no copy).

    Runs once per delivered message: fields absent from the record are not touched (an
    unset field and one set to its default serialise alike), and each sub-message is
    looked up once (every attribute access on a protobuf message is a C call)."""
    if out is None:
        out = schema.Message()
    out.topic.name = msg.topic
    props = msg.properties
    names = SYSTEM_PROPERTY_NAMES
    user = [(k, v) for k, v in props.items() if k not in names]
    if user:
        out.user_properties.update(user)
    inflated = _inflated(msg) if msg.sys_flag & COMPRESSED_FLAG else None
    body = msg.body if inflated is None else inflated
    out.body = body
    system = out.system_properties
    if TAGS in props:
        system.tag = props[TAGS]
    if KEYS in props:
        system.keys.extend(split_keys(props[KEYS]))
    system.message_id = msg.msg_id
    digest = system.body_digest
    digest.type = schema.DigestType.MD5
    # The local ``body``: reading ``out.body`` back would copy it out of the message again.
    digest.checksum = hashlib.md5(body, usedforsecurity=False).hexdigest().upper()
    if inflated is None and msg.sys_flag & COMPRESSED_FLAG:
        system.body_encoding = schema.Encoding.GZIP
    else:
        system.body_encoding = schema.Encoding.IDENTITY
    system.message_type = message_type_of(props)
    born, stored = msg.born_timestamp, msg.store_timestamp
    born_ts, store_ts = system.born_timestamp, system.store_timestamp
    born_ts.seconds, born_ts.nanos = born // _MS_PER_S, born % _MS_PER_S * 1_000_000
    system.born_host = msg.born_host[0]
    store_ts.seconds, store_ts.nanos = stored // _MS_PER_S, stored % _MS_PER_S * 1_000_000
    system.store_host = _host_text(msg.store_host)
    if TIMER_DELIVER_MS in props or TIMER_OUT_MS in props:
        deliver_at = _delivery_ms(props)
        if deliver_at is not None:
            set_timestamp(system.delivery_timestamp, deliver_at)
    if receipt_handle is not None:
        system.receipt_handle = receipt_handle
        set_duration(system.invisible_duration, invisible_ms)
    system.queue_id = msg.queue_id
    system.queue_offset = msg.queue_offset
    system.delivery_attempt = msg.reconsume_times + 1
    if SHARDING_KEY in props:
        system.message_group = props[SHARDING_KEY]
    if TRACE_CONTEXT in props:
        system.trace_context = props[TRACE_CONTEXT]
    origin = _dead_letter_origin(msg.topic, props)
    if origin is not None:
        system.dead_letter_queue.topic, system.dead_letter_queue.message_id = origin
    return out


#: ``host:port`` of the few store hosts a broker's records carry (one, mostly).
_HOST_TEXT: dict[tuple[str, int], str] = {}


def _host_text(host: tuple[str, int]) -> str:
    text = _HOST_TEXT.get(host)
    if text is None:
        text = f"{host[0]}:{host[1]}"
        if len(_HOST_TEXT) < 64:  # bounded: a broker stores with its own address
            _HOST_TEXT[host] = text
    return text


def _inflated(msg: MessageExt) -> bytes | None:
    """A compressed body, inflated: Remoting producers compress with zlib (RFC 1950), while
    ``body_encoding`` GZIP means RFC 1952 to the Node client (``gunzipSync`` throws on zlib
    and fails the whole receive). Delivered as IDENTITY instead; None when the body is not
    compressed or not valid zlib (then it goes as stored, marked GZIP)."""
    if not msg.sys_flag & COMPRESSED_FLAG:
        return None
    try:
        return zlib.decompress(msg.body)
    except zlib.error:
        return None


def _dead_letter_origin(topic: str, props: Mapping[str, str]) -> tuple[str, str] | None:
    """Where a dead letter came from: RocketMQ's ``DLQ_ORIGIN_*`` properties, or, on a
    message of a ``%DLQ%`` topic, the ``ORIGIN_TOPIC``/``RETRY_TOPIC`` and
    ``ORIGIN_MESSAGE_ID`` trimq's dead-lettering writes."""
    if DLQ_ORIGIN_TOPIC in props:
        return props[DLQ_ORIGIN_TOPIC], props.get(DLQ_ORIGIN_MESSAGE_ID, "")
    if not is_dlq_topic(topic):
        return None
    origin = props.get(ORIGIN_TOPIC) or props.get(RETRY_TOPIC)
    if origin is None:
        return None
    return origin, props.get(ORIGIN_MESSAGE_ID, "")


def _delivery_ms(props: Mapping[str, str]) -> int | None:
    """When a delayed message was due: ``TIMER_DELIVER_MS`` as sent, or ``TIMER_OUT_MS`` on
    the copy the timer delivered."""
    for name in (TIMER_DELIVER_MS, TIMER_OUT_MS):
        value = props.get(name, "")
        if value.isdigit():
            return int(value)
    return None


# ------------------------------------------------------------------ receipt handles
def encode_handle(receipt: ExtraInfo, commit_offset: int) -> str:
    """The receipt handle of a popped message: its receipt and its commit-log offset."""
    return f"{_receipt_text(receipt)} {commit_offset}"


#: Java's long and int ranges (``ExtraInfo.encode``'s checks); only ever tested against
#: a plain int (``in range`` of anything else would compare element by element).
_JAVA_LONG: Final = range(-(2**63), 2**63)
_JAVA_INT: Final = range(-(2**31), 2**31)


def _receipt_text(r: ExtraInfo) -> str:
    """``r.encode()``, for a receipt as a pop builds it (plain ints within Java's ranges, a
    :class:`RetryFlag`, a broker name without spaces) formatted here in one go: ``encode``
    checks each field in a call of its own, ~5 µs of every delivered message. Anything
    else goes through ``encode``, with its errors."""
    ck, pop, inv, qoff = r.ck_queue_offset, r.pop_time_ms, r.invisible_time_ms, r.queue_offset
    rq, qid, flag, name = r.revive_qid, r.queue_id, r.retry_flag, r.broker_name
    if (
        type(ck) is int and ck in _JAVA_LONG
        and type(pop) is int and pop in _JAVA_LONG
        and type(inv) is int and inv in _JAVA_LONG
        and type(qoff) is int and qoff in _JAVA_LONG
        and type(rq) is int and rq in _JAVA_INT
        and type(qid) is int and qid in _JAVA_INT
        and type(flag) is RetryFlag
        and type(name) is str and name and " " not in name
    ):  # fmt: skip
        return f"{ck} {pop} {inv} {rq} {flag:d} {name} {qid} {qoff}"
    return r.encode()


def decode_handle(handle: str) -> tuple[ExtraInfo, int | None]:
    """A receipt handle's receipt and commit-log offset (None for a Remoting receipt).

    Raises:
        ReceiptError: not a receipt handle.
    """
    parts = handle.split(" ")
    if len(parts) == 9:
        offset = parts.pop()
        if not offset.isdigit():
            raise ReceiptError(f"receipt handle's commit-log offset is not a number: {offset!r}")
        return ExtraInfo.decode(" ".join(parts)), int(offset)
    return ExtraInfo.decode(handle), None


# ------------------------------------------------------------------ recall handles
_RECALL_VERSION: Final = "trimq1"


def encode_recall_handle(topic: str, queue_id: int, queue_offset: int, message_id: str) -> str:
    """The recall handle of a delayed message: where it waits (its queue and offset in
    SCHEDULE_TOPIC_XXXX), its topic and id; opaque to clients (base64, as RocketMQ's)."""
    text = f"{_RECALL_VERSION} {topic} {queue_id}:{queue_offset} {message_id}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_recall_handle(handle: str) -> tuple[str, int, int, str]:
    """(topic, queue id, queue offset, message id) of a recall handle.

    Raises:
        ValueError: not one of ours.
    """
    try:
        text = base64.urlsafe_b64decode(handle.encode()).decode()
    except (ValueError, UnicodeError):
        raise ValueError("recall handle is not base64 text") from None
    parts = text.split(" ")
    if len(parts) != 4 or parts[0] != _RECALL_VERSION:
        raise ValueError("not a recall handle of this broker")
    queue, _, offset = parts[2].partition(":")
    if not (queue.isdigit() and offset.isdigit()):
        raise ValueError("recall handle names no queue position")
    return parts[1], int(queue), int(offset), parts[3]


# ------------------------------------------------------------------ transaction ids
_TRANSACTION_VERSION: Final = "trimq1t"


def encode_transaction_id(commit_offset: int, queue_offset: int) -> str:
    """The transaction id of a half message: where it is stored (its commit-log offset and
    its queue offset in the half topic), so EndTransaction finds it without state kept per
    transaction (the proxy keeps a table); opaque to clients."""
    text = f"{_TRANSACTION_VERSION} {commit_offset} {queue_offset}"
    return base64.urlsafe_b64encode(text.encode()).decode()


def decode_transaction_id(transaction_id: str) -> tuple[int, int]:
    """(commit-log offset, queue offset) of a transaction id.

    Raises:
        ValueError: not one of ours.
    """
    try:
        text = base64.urlsafe_b64decode(transaction_id.encode()).decode()
    except (ValueError, UnicodeError):
        raise ValueError("transaction id is not base64 text") from None
    parts = text.split(" ")
    if (
        len(parts) != 3
        or parts[0] != _TRANSACTION_VERSION
        or not all(p.isdigit() for p in parts[1:])
    ):
        raise ValueError("not a transaction id of this broker")
    return int(parts[1]), int(parts[2])
