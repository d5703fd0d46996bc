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
import struct
import zlib
from collections.abc import Mapping
from typing import Any, Final, TypeVar

from protocol.errors import ReceiptError
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.grpc.wire import VARINT1, sub, text_field, varint
from protocol.message import (
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    MessageExt,
    decode_record,
)
from protocol.msgid import ip_from_bytes
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
    decode_properties,
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
        if value.isdigit() and value.isascii():  # "¹".isdigit(), but int() refuses it
            return int(value)
    return None


# ------------------------------------------------------------------ delivering, as bytes
def delivered_response(record: bytes, receipt: ExtraInfo, invisible_ms: int) -> bytes:
    """A popped record as a serialised ``ReceiveMessageResponse`` whose ``message`` is
    ``to_message(decode_record(record)[0], receipt_handle=encode_handle(receipt, its commit
    offset), invisible_ms=invisible_ms)``: what a receive streams per message.

    The common record (uncompressed, with a ``UNIQ_KEY``, no delivery time, not a dead
    letter) is written straight from the record's bytes in protobuf's wire format
    (:func:`_response_bytes`): no ``MessageExt``, no protobuf objects. Every other record,
    and any record the shortcut is not sure of, goes the general way (whose errors a
    malformed record raises). Both give the same message (the tests parse one against the
    other)."""
    fast = _response_bytes(record, receipt, invisible_ms)
    if fast is not None:
        return fast
    return general_response(record, receipt, invisible_ms)


def general_response(record: bytes, receipt: ExtraInfo, invisible_ms: int) -> bytes:
    """:func:`delivered_response` through ``decode_record`` and :func:`to_message`."""
    msg = decode_record(record)[0]
    response = schema.ReceiveMessageResponse()
    to_message(
        msg, receipt_handle=encode_handle(receipt, msg.commit_log_offset),
        invisible_ms=invisible_ms, out=response.message,
    )  # fmt: skip
    data: bytes = response.SerializeToString()
    return data


# The record's layout (protocol/message.py): everything from the total size to the body
# length, one struct per (born host, store host) address family; sys flag at offset 36.
_RECORD_FIXED: Final = tuple(
    struct.Struct(f">iIiiiqqiq{born}sIq{store}sIiqi")
    for born, store in ((4, 4), (16, 4), (4, 16), (16, 16))
)
_RECORD_START: Final = struct.Struct(">iI28xi")
_I16: Final = struct.Struct(">h")
#: Bounded caches (cleared when full): a broker delivers few topics and hosts.
_CACHE_LIMIT: Final = 1024
#: ``nanos`` (field 2 of Timestamp and Duration) of each millisecond remainder.
_NANOS: Final = tuple(
    b"" if ms == 0 else b"\x10" + varint(ms * 1_000_000) for ms in range(_MS_PER_S)
)
_SECONDS: dict[int, bytes] = {}


def _time_body(ms: int) -> bytes:
    """A ``Timestamp``/``Duration`` body of ``ms`` milliseconds (seconds, then nanos; zero
    fields left out), as ``to_message`` and ``set_duration`` fill them."""
    seconds, rest = divmod(ms, _MS_PER_S)
    if not seconds:
        return _NANOS[rest]
    return (_SECONDS.get(seconds) or _seconds_field(seconds)) + _NANOS[rest]


def _seconds_field(seconds: int) -> bytes:
    """Field 1 (``seconds``) of a Timestamp/Duration, remembered: a batch's timestamps
    mostly fall in the same few seconds."""
    return _remember(_SECONDS, seconds, b"\x08" + varint(seconds))


#: A topic's bytes as stored → (Message field 1 with it, whether it is a dead-letter topic);
#: None for bytes that are not UTF-8.
_TOPIC_FIELDS: dict[bytes, tuple[bytes, bool] | None] = {}
#: Born host IP bytes → SystemProperties field 8; (store IP bytes, port) → field 10.
_BORN_FIELDS: dict[bytes, bytes] = {}
_STORE_FIELDS: dict[tuple[bytes, int], bytes] = {}
#: Invisible time → SystemProperties field 15.
_INVISIBLE_FIELDS: dict[int, bytes] = {}

_K = TypeVar("_K")
_V = TypeVar("_V")


def _remember(cache: dict[_K, _V], key: _K, value: _V) -> _V:
    """``value`` stored under ``key`` in one of the bounded caches above (emptied when
    full: the hot path looks a key up itself and calls a ``_*_field`` only on a miss)."""
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _topic_field(raw: bytes) -> tuple[bytes, bool] | None:
    try:
        return _TOPIC_FIELDS[raw]
    except KeyError:
        pass
    try:
        topic = raw.decode()
    except UnicodeDecodeError:
        return _remember(_TOPIC_FIELDS, raw, None)
    field = sub(b"\x0a", text_field(b"\x12", topic) if topic else b"")
    return _remember(_TOPIC_FIELDS, raw, (field, is_dlq_topic(topic)))


def _born_field(ip: bytes) -> bytes:
    return _remember(_BORN_FIELDS, ip, text_field(b"\x42", ip_from_bytes(ip)))


def _store_field(ip: bytes, port: int) -> bytes:
    field = text_field(b"\x52", f"{ip_from_bytes(ip)}:{port}")
    return _remember(_STORE_FIELDS, (ip, port), field)


def _invisible_field(ms: int) -> bytes:
    return _remember(_INVISIBLE_FIELDS, ms, sub(b"\x7a", _time_body(ms)))


#: SystemProperties field 5 (IDENTITY) and field 6 per message type.
_IDENTITY_FIELD: Final = b"\x28" + varint(schema.Encoding.IDENTITY)
_TYPE_FIELDS: Final = {t: b"\x30" + varint(t) for t in schema.MessageType}
#: SystemProperties field 4 up to the checksum: Digest{type MD5, checksum: 32 hex digits}.
_MD5_DIGEST_HEAD: Final = b"\x22\x24\x08" + varint(schema.DigestType.MD5) + b"\x12\x20"


def _response_bytes(record: bytes, receipt: ExtraInfo, invisible_ms: int) -> bytes | None:
    """:func:`delivered_response`'s shortcut; None for a record it leaves to the general
    way. Fields go out in field-number order, each exactly when ``to_message`` sets it
    (a sub-message it touches is present even when empty, an optional field it assigns is
    present even when zero, a plain scalar only when not zero)."""
    size = len(record)
    if size < MIN_RECORD_SIZE:
        return None
    total, magic, sys_flag = _RECORD_START.unpack_from(record, 0)
    if total != size or sys_flag & COMPRESSED_FLAG:
        return None
    fixed = _RECORD_FIXED[(sys_flag >> 4) & 3]
    pos = fixed.size
    if size < pos:
        return None
    (
        _, _, _, queue_id, _, queue_offset, commit_offset, _, born_ts,
        born_ip, born_port, store_ts, store_ip, store_port, reconsume, _, body_len,
    ) = fixed.unpack_from(record, 0)  # fmt: skip
    body_at = pos
    pos += body_len
    if body_len < 0 or pos > size:
        return None
    if magic == MESSAGE_MAGIC_V1:
        topic_len = record[pos]
        pos += 1
        if topic_len > 127:
            return None
    elif magic == MESSAGE_MAGIC_V2:
        (topic_len,) = _I16.unpack_from(record, pos)
        pos += 2
        if topic_len < 0:
            return None
    else:
        return None
    if pos + topic_len + 2 > size:
        return None
    topic = _topic_field(bytes(record[pos : pos + topic_len]))
    pos += topic_len
    (props_len,) = _I16.unpack_from(record, pos)
    pos += 2
    if (
        topic is None or topic[1] or props_len < 0 or pos + props_len != size
        or born_port > 0xFFFF or store_port > 0xFFFF or reconsume >= _INT_MAX
    ):  # fmt: skip
        return None
    try:
        props = decode_properties(str(record[pos:size], "utf-8")) if props_len else {}
    except UnicodeDecodeError:
        return None
    message_id = props.get(UNIQ_KEY)
    if (
        not message_id or TIMER_DELIVER_MS in props or TIMER_OUT_MS in props
        or DLQ_ORIGIN_TOPIC in props
    ):  # fmt: skip
        return None
    v1 = VARINT1
    body = memoryview(record)[body_at : body_at + body_len]
    mid = message_id.encode()
    handle = f"{_receipt_text(receipt)} {commit_offset}".encode()
    n_mid, n_handle = len(mid), len(handle)
    head = text_field(b"\x0a", props[TAGS]) if TAGS in props else b""
    if KEYS in props:
        head += b"".join([text_field(b"\x12", key) for key in split_keys(props[KEYS])])
    # message_type_of(props) without its delivery-time tests (such records went above)
    if props.get(TRAN_MSG) == "true":
        kind = _TYPE_FIELDS[schema.MessageType.TRANSACTION]
    elif SHARDING_KEY in props:
        kind = _TYPE_FIELDS[schema.MessageType.FIFO]
    elif TIMER_DELAY_SEC in props:
        kind = _TYPE_FIELDS[schema.MessageType.DELAY]
    else:
        kind = _TYPE_FIELDS[schema.MessageType.NORMAL]
    tail = text_field(b"\x8a\x01", props[SHARDING_KEY]) if SHARDING_KEY in props else b""
    if TRACE_CONTEXT in props:
        tail += text_field(b"\x92\x01", props[TRACE_CONTEXT])
    seconds, rest = divmod(born_ts, _MS_PER_S)
    born = (
        (_SECONDS.get(seconds) or _seconds_field(seconds)) + _NANOS[rest]
        if seconds
        else _NANOS[rest]
    )
    seconds, rest = divmod(store_ts, _MS_PER_S)
    stored = (
        (_SECONDS.get(seconds) or _seconds_field(seconds)) + _NANOS[rest]
        if seconds
        else _NANOS[rest]
    )
    # SystemProperties: 1 tag, 2 keys (head), 3 message_id, 4 body_digest, 5 body_encoding,
    # 6 message_type, 7 born_timestamp, 8 born_host, 9 store_timestamp, 10 store_host,
    # 12 receipt_handle, 13 queue_id, 14 queue_offset, 15 invisible_duration,
    # 16 delivery_attempt, 17 message_group, 18 trace_context (tail). A timestamp's body is
    # under 128 bytes.
    attempt = reconsume + 1
    system = b"%b\x1a%b%b%b%b%b%b:%b%b%bJ%b%b%bb%b%b%b\x70%b%b\x80\x01%b%b" % (
        head,
        v1[n_mid] if n_mid < 128 else varint(n_mid), mid,
        _MD5_DIGEST_HEAD, hashlib.md5(body, usedforsecurity=False).hexdigest().upper().encode(),
        _IDENTITY_FIELD, kind,
        v1[len(born)], born, _BORN_FIELDS.get(born_ip) or _born_field(born_ip),
        v1[len(stored)], stored,
        _STORE_FIELDS.get((store_ip, store_port)) or _store_field(store_ip, store_port),
        v1[n_handle] if n_handle < 128 else varint(n_handle), handle,
        b"\x68" + varint(queue_id) if queue_id else b"",
        v1[queue_offset] if 0 <= queue_offset < 128 else varint(queue_offset),
        _INVISIBLE_FIELDS.get(invisible_ms) or _invisible_field(invisible_ms),
        v1[attempt] if 0 <= attempt < 128 else varint(attempt),
        tail,
    )  # fmt: skip
    n_system = len(system)
    # Message: 1 topic, 2 user_properties (one entry each), 3 system_properties, 4 body;
    # in ReceiveMessageResponse field 2, whose length goes in front (parts[1]) so the
    # message's bytes are joined once.
    parts: list[bytes | memoryview] = [b"\x12", b"", topic[0]]
    names = SYSTEM_PROPERTY_NAMES
    for name, value in props.items():
        if name not in names:
            k, v = name.encode(), value.encode()
            n_k, n_v = len(k), len(v)
            entry = b"\x0a%b%b\x12%b%b" % (
                v1[n_k] if n_k < 128 else varint(n_k), k,
                v1[n_v] if n_v < 128 else varint(n_v), v,
            )  # fmt: skip
            n_entry = len(entry)
            parts.append(b"\x12" + (v1[n_entry] if n_entry < 128 else varint(n_entry)))
            parts.append(entry)
    parts.append(b"\x1a" + (v1[n_system] if n_system < 128 else varint(n_system)))
    parts.append(system)
    if body_len:
        parts.append(b"\x22" + (v1[body_len] if body_len < 128 else varint(body_len)))
        parts.append(body)
    parts[1] = varint(sum(map(len, parts)) - 1)
    return b"".join(parts)


# ------------------------------------------------------------------ receipt handles
def encode_handle(receipt: ExtraInfo, commit_offset: int) -> str:
    """The receipt handle of a popped message: its receipt and its commit-log offset."""
    return f"{_receipt_text(receipt)} {commit_offset}"


#: Java's long and int ranges (``ExtraInfo.encode``'s checks); only ever compared with a
#: plain int.
_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1


def _receipt_text(r: ExtraInfo) -> str:
    """``r.encode()``, for a receipt as a pop builds it (plain ints within Java's ranges, a
    :class:`RetryFlag`, a broker name without spaces) formatted here in one go: ``encode``
    checks each field in a call of its own, ~5 µs of every delivered message. Anything
    else goes through ``encode``, with its errors."""
    ck, pop, inv, qoff = r.ck_queue_offset, r.pop_time_ms, r.invisible_time_ms, r.queue_offset
    rq, qid, flag, name = r.revive_qid, r.queue_id, r.retry_flag, r.broker_name
    if (
        type(ck) is type(pop) is type(inv) is type(qoff) is type(rq) is type(qid) is int
        and type(flag) is RetryFlag and type(name) is str
        and _LONG_MIN <= ck <= _LONG_MAX and _LONG_MIN <= pop <= _LONG_MAX
        and _LONG_MIN <= inv <= _LONG_MAX and _LONG_MIN <= qoff <= _LONG_MAX
        and _INT_MIN <= rq <= _INT_MAX and _INT_MIN <= qid <= _INT_MAX
        and name and " " not in name
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
        if not (offset.isdigit() and offset.isascii()):
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
    if not ((queue + offset).isascii() and queue.isdigit() and offset.isdigit()):
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
        or not all(p.isdigit() and p.isascii() for p in parts[1:])
    ):
        raise ValueError("not a transaction id of this broker")
    return int(parts[1]), int(parts[2])
