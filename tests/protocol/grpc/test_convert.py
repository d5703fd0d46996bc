"""v2 messages ↔ stored properties and records (protocol.grpc.convert), without a broker."""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import EncodeError, ReceiptError, RecordError
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.grpc.convert import (
    SHARDING_KEY,
    MessageRejected,
    _response_bytes,
    decode_handle,
    delivered_response,
    encode_handle,
    general_response,
    java_hash,
    properties_of,
    to_message,
)
from protocol.grpc.wire import varint
from protocol.message import MessageExt, encode_record
from protocol.receipt import ExtraInfo, RetryFlag


def v2_message(**system: object) -> object:
    msg = schema.Message()
    msg.topic.name = "T"
    msg.body = b"body"
    msg.user_properties["color"] = "red"
    msg.system_properties.message_id = "01" + "AB" * 16
    for name, value in system.items():
        if name == "keys":
            msg.system_properties.keys.extend(value)
        else:
            setattr(msg.system_properties, name, value)
    return msg


def test_a_sent_message_is_stored_as_a_remoting_producer_would() -> None:
    props = properties_of(v2_message(tag="A", keys=["k1", "k2"], message_group="g1"))
    assert props == {
        "color": "red",
        "UNIQ_KEY": "01" + "AB" * 16,
        "TAGS": "A",
        "KEYS": "k1 k2",
        SHARDING_KEY: "g1",
    }
    assert SHARDING_KEY == "__SHARDINGKEY"  # RocketMQ's MessageConst.PROPERTY_SHARDING_KEY


@pytest.mark.parametrize(
    ("system", "user", "code"),
    [
        ({"tag": "a|b"}, {}, Code.ILLEGAL_MESSAGE_TAG),
        ({"tag": " "}, {}, Code.ILLEGAL_MESSAGE_TAG),
        ({"message_group": "x" * 64}, {}, Code.ILLEGAL_MESSAGE_GROUP),
        ({"message_id": ""}, {}, Code.ILLEGAL_MESSAGE_ID),
        ({}, {"UNIQ_KEY": "x"}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY),
    ],
)
def test_what_a_producer_may_not_send_is_named(
    system: dict[str, object], user: dict[str, str], code: Code
) -> None:
    msg = v2_message(**system)
    for k, v in user.items():
        msg.user_properties[k] = v  # type: ignore[attr-defined]
    with pytest.raises(MessageRejected) as err:
        properties_of(msg)
    assert err.value.code == code


def test_a_stored_record_is_delivered_with_id_tag_keys_digest_and_attempt() -> None:
    stored = MessageExt(
        "T", b"hello", {"UNIQ_KEY": "ID1", "TAGS": "A", "KEYS": "k1 k2", "color": "red",
                        "TIMER_SRC": "0:1", "POP_CK": "x"},
        queue_id=2, queue_offset=7, reconsume_times=1, born_timestamp=1_000, store_timestamp=2_500,
    )  # fmt: skip
    out = to_message(stored, receipt_handle="h", invisible_ms=30_000)
    system = out.system_properties
    assert (out.topic.name, out.body, dict(out.user_properties)) == (
        "T",
        b"hello",
        {"color": "red"},
    )
    assert (system.message_id, system.tag, list(system.keys)) == ("ID1", "A", ["k1", "k2"])
    assert system.body_digest.type == schema.DigestType.MD5
    assert system.body_digest.checksum == hashlib.md5(b"hello").hexdigest().upper()
    assert system.body_encoding == schema.Encoding.IDENTITY  # never 0: Python rejects it
    assert (system.queue_id, system.queue_offset, system.delivery_attempt) == (2, 7, 2)
    assert (system.receipt_handle, system.invisible_duration.seconds) == ("h", 30)
    assert system.store_timestamp.seconds == 2 and system.store_timestamp.nanos == 500_000_000
    assert system.message_type == schema.MessageType.NORMAL


def test_a_dead_letter_names_its_origin() -> None:
    dlq = MessageExt("%DLQ%g", b"x", {"ORIGIN_TOPIC": "T", "ORIGIN_MESSAGE_ID": "M1"})
    system = to_message(dlq).system_properties
    assert (system.dead_letter_queue.topic, system.dead_letter_queue.message_id) == ("T", "M1")
    assert not to_message(MessageExt("T", b"x", {"ORIGIN_TOPIC": "T"})).system_properties.HasField(
        "dead_letter_queue"
    )


def test_a_timer_delivered_copy_is_a_delay_message_with_its_time() -> None:
    system = to_message(MessageExt("T", b"x", {"TIMER_OUT_MS": "5000"})).system_properties
    assert system.message_type == schema.MessageType.DELAY
    assert system.delivery_timestamp.seconds == 5


def test_receipt_handles_carry_the_log_offset_and_remoting_receipts_pass() -> None:
    receipt = ExtraInfo(0, 1_000, 30_000, 0, RetryFlag.NORMAL, "broker-a", 1, 7)
    handle = encode_handle(receipt, 4096)
    assert handle == receipt.encode() + " 4096"
    assert decode_handle(handle) == (receipt, 4096)
    assert decode_handle(receipt.encode()) == (receipt, None)
    for bad in ("", "nonsense", receipt.encode() + " x"):
        with pytest.raises(ReceiptError):
            decode_handle(bad)


@pytest.mark.parametrize(
    "receipt",
    [
        ExtraInfo(2**63 - 1, -(2**63), 0, 2**31 - 1, RetryFlag.RETRY_V2, "b", -(2**31), 2**63 - 1),
        ExtraInfo(5, 1_000, 30_000, 999, RetryFlag.RETRY_V1, "broker-a", 3, None),
        ExtraInfo(5, 1_000, 30_000, 0, 1, "broker-a", 3, 9),  # type: ignore[arg-type]
    ],
)
def test_a_handle_formats_its_receipt_as_encode_does(receipt: ExtraInfo) -> None:
    # The handle's own formatting of a pop's receipt (no per-field calls) and encode agree.
    assert encode_handle(receipt, 77) == receipt.encode() + " 77"


@pytest.mark.parametrize(
    "receipt",
    [
        ExtraInfo(2**63, 1, 1, 0, RetryFlag.NORMAL, "b", 0, 0),
        ExtraInfo(1, 1, 1, 2**31, RetryFlag.NORMAL, "b", 0, 0),
        ExtraInfo(1, 1.5, 1, 0, RetryFlag.NORMAL, "b", 0, 0),  # type: ignore[arg-type]
        ExtraInfo(1, 1, 1, 0, RetryFlag.NORMAL, "a b", 0, 0),
        ExtraInfo(1, 1, 1, 0, True, "b", 0, 0),  # type: ignore[arg-type]
        ExtraInfo(1, 1, 1, 0, RetryFlag.NORMAL, "b", 0, True),
    ],
)
def test_a_handle_of_a_bad_receipt_fails_as_encode_does(receipt: ExtraInfo) -> None:
    with pytest.raises(EncodeError):
        encode_handle(receipt, 77)


def test_java_hash_is_string_hash_code() -> None:
    assert java_hash("") == 0
    assert java_hash("abc") == 96354
    assert java_hash("polygenelubricants") == -2147483648  # wraps like a Java int


def test_a_zlib_compressed_body_is_delivered_inflated() -> None:
    """Remoting producers compress with zlib; gRPC's GZIP means RFC 1952 to the Node client."""
    import zlib

    stored = MessageExt("T", zlib.compress(b"x" * 5000), {}, sys_flag=0x1)
    system = to_message(stored).system_properties
    assert to_message(stored).body == b"x" * 5000
    assert system.body_encoding == schema.Encoding.IDENTITY
    assert system.body_digest.checksum == hashlib.md5(b"x" * 5000).hexdigest().upper()
    broken = MessageExt("T", b"not zlib", {}, sys_flag=0x1)  # left as stored, marked GZIP
    assert to_message(broken).system_properties.body_encoding == schema.Encoding.GZIP


# ------------------------------------------------------------------ delivered as bytes
# delivered_response writes the common record's ReceiveMessageResponse straight from the
# record's bytes; general_response goes through decode_record, to_message and protobuf. The
# two must give the same message, field presence included (compared as parsed messages
# re-serialised deterministically: map entries sorted), and the same bytes when the message
# has at most one user property (protobuf's field order is ours).

_TEXT = st.text(st.characters(blacklist_characters="\x00\x01\x02", codec="utf-8"), max_size=12)
_NAME = st.text(
    st.characters(blacklist_characters="\x00\x01\x02", codec="utf-8"), min_size=1, max_size=12
)
_SYSTEM_NAMES = st.sampled_from(
    ["TAGS", "KEYS", "__SHARDINGKEY", "TRACE_CONTEXT", "TRAN_MSG", "TIMER_DELAY_SEC",
     "RECONSUME_TIME", "POP_CK", "MAX_OFFSET", "TIMER_DELIVER_MS", "TIMER_OUT_MS",
     "DLQ_ORIGIN_TOPIC", "ORIGIN_TOPIC"]
)  # fmt: skip
_HOSTS = st.sampled_from(
    [("127.0.0.1", 10911), ("10.1.2.3", 0), ("0.0.0.0", 65535), ("::1", 8081), ("fe80::2", 1)]
)
_INT32 = st.integers(-(2**31), 2**31 - 1)
_INT64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def _records(draw: st.DrawFn) -> MessageExt:
    props: dict[str, str] = {}
    if draw(st.booleans()):
        props["UNIQ_KEY"] = draw(_NAME)
    for name in draw(st.lists(_SYSTEM_NAMES, max_size=4)):
        props[name] = draw(_NAME)
    if "KEYS" in props and draw(st.booleans()):
        props["KEYS"] = " ".join(draw(st.lists(_NAME, max_size=3))) or "k"
    for name in draw(st.lists(_NAME, max_size=3)):
        props[name] = draw(_NAME)
    topic = draw(st.one_of(_TEXT, st.sampled_from(["T", "%DLQ%g", "%RETRY%g_T", "x" * 200])))
    return MessageExt(
        topic,
        draw(st.one_of(st.binary(max_size=40), st.just(b"y" * 300))),
        props,
        queue_id=draw(_INT32),
        queue_offset=draw(_INT64),
        commit_log_offset=draw(st.integers(0, 2**63 - 1)),
        sys_flag=draw(st.sampled_from([0, 0, 0x1, 0x2, 0x8])),
        born_timestamp=draw(st.one_of(_INT64, st.integers(0, 2**41))),
        born_host=draw(_HOSTS),
        store_timestamp=draw(st.one_of(_INT64, st.integers(0, 2**41))),
        store_host=draw(_HOSTS),
        reconsume_times=draw(st.one_of(_INT32, st.integers(0, 20))),
    )


_RECEIPTS = st.builds(
    ExtraInfo,
    st.integers(0, 2**40),
    st.integers(0, 2**42),
    st.integers(0, 2**31),
    st.sampled_from([0, 999]),
    st.sampled_from(list(RetryFlag)),
    st.sampled_from(["broker-a", "b"]),
    st.integers(0, 64),
    st.integers(0, 2**40),
)


def _same_response(record: bytes, receipt: ExtraInfo, invisible_ms: int) -> bytes:
    ours = delivered_response(record, receipt, invisible_ms)
    general = general_response(record, receipt, invisible_ms)
    parse = schema.ReceiveMessageResponse.FromString
    assert parse(ours) == parse(general)
    assert parse(ours).SerializeToString(deterministic=True) == parse(general).SerializeToString(
        deterministic=True
    )
    if len(parse(general).message.user_properties) <= 1:
        assert ours == general
    return ours


@settings(max_examples=400, deadline=None)
@given(_records(), _RECEIPTS, st.integers(0, 2**40))
def test_a_record_delivered_from_its_bytes_is_the_message_to_message_builds(
    msg: MessageExt, receipt: ExtraInfo, invisible_ms: int
) -> None:
    record = encode_record(msg)
    if msg.reconsume_times == 2**31 - 1:  # an attempt past int32: both refuse it alike
        with pytest.raises(ValueError, match="out of range"):
            general_response(record, receipt, invisible_ms)
        with pytest.raises(ValueError, match="out of range"):
            delivered_response(record, receipt, invisible_ms)
        return
    _same_response(record, receipt, invisible_ms)


def _plain_record(**props: str) -> MessageExt:
    return MessageExt(
        "T", b"hello", {"UNIQ_KEY": "ID1", "TAGS": "A", "KEYS": "k1 k2", "color": "red", **props},
        queue_id=2, queue_offset=7, commit_log_offset=4096, born_timestamp=1_000,
        store_timestamp=2_500, born_host=("10.0.0.1", 1), store_host=("127.0.0.1", 10911),
    )  # fmt: skip


_RECEIPT = ExtraInfo(5, 10_000, 30_000, 0, RetryFlag.NORMAL, "broker-a", 2, 7)


def test_the_common_record_takes_the_shortcut() -> None:
    for msg in (
        _plain_record(),
        _plain_record(__SHARDINGKEY="g", TRACE_CONTEXT="t", TRAN_MSG="true"),
        MessageExt("T", b"", {"UNIQ_KEY": "x"}),
    ):
        record = encode_record(msg)
        assert _response_bytes(record, _RECEIPT, 30_000) is not None
        _same_response(record, _RECEIPT, 30_000)


@pytest.mark.parametrize(
    "msg",
    [
        MessageExt("T", zlib.compress(b"hello"), {"UNIQ_KEY": "x"}, sys_flag=0x1),
        MessageExt("T", b"not zlib", {"UNIQ_KEY": "x"}, sys_flag=0x1),
        MessageExt("T", b"no unique key", {"TAGS": "A"}),
        _plain_record(TIMER_DELIVER_MS="5000"),
        _plain_record(TIMER_OUT_MS="5000"),
        _plain_record(DLQ_ORIGIN_TOPIC="T0", DLQ_ORIGIN_MESSAGE_ID="M0"),
        MessageExt("%DLQ%g", b"x", {"UNIQ_KEY": "x", "ORIGIN_TOPIC": "T"}),
        MessageExt("T", b"x", {"UNIQ_KEY": "x"}, reconsume_times=2**31 - 1),
    ],
    ids=[
        "zlib",
        "bad-zlib",
        "offset-id",
        "delivery-time",
        "timer-copy",
        "dlq-origin",
        "dlq-topic",
        "attempt-overflow",
    ],
)
def test_what_the_shortcut_leaves_goes_the_general_way(msg: MessageExt) -> None:
    record = encode_record(msg)
    assert _response_bytes(record, _RECEIPT, 30_000) is None
    if msg.reconsume_times == 2**31 - 1:  # an attempt past int32: protobuf refuses it
        with pytest.raises(ValueError, match="out of range"):
            delivered_response(record, _RECEIPT, 30_000)
        return
    _same_response(record, _RECEIPT, 30_000)


def _corrupt(record: bytes, at: int, value: bytes) -> bytes:
    return record[:at] + value + record[at + len(value) :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: r[:-1],  # truncated: the total size overruns
        lambda r: r[:40],  # shorter than any record
        lambda r: _corrupt(r, 4, b"\x00\x00\x00\x00"),  # bad magic
        lambda r: _corrupt(r, len(r) - 3, b"\xff"),  # properties not UTF-8
        lambda r: _corrupt(r, 84, b"\x7f\xff\xff\xff"),  # body length overruns
        lambda r: _corrupt(r, 94, b"\xff"),  # topic not UTF-8 (after "hello" and its length)
        lambda r: _corrupt(r, 52, b"\x00\x01\x00\x00"),  # born port over 65535
    ],
)
def test_a_malformed_record_fails_as_decoding_it_does(damage: Callable[[bytes], bytes]) -> None:
    record = damage(encode_record(_plain_record()))
    with pytest.raises(RecordError) as general:
        general_response(record, _RECEIPT, 30_000)
    with pytest.raises(RecordError) as ours:
        delivered_response(record, _RECEIPT, 30_000)
    assert str(ours.value) == str(general.value)


def test_a_record_with_trailing_bytes_is_delivered_as_decoding_reads_it() -> None:
    record = encode_record(_plain_record()) + b"junk"
    assert _response_bytes(record, _RECEIPT, 30_000) is None
    _same_response(record, _RECEIPT, 30_000)


@settings(max_examples=500)
@given(st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**16)))
def test_varints_are_protobufs(n: int) -> None:
    message = schema.SystemProperties()
    message.queue_offset = n  # field 14, int64: key 0x70, then the varint
    assert message.SerializeToString() == b"\x70" + varint(n)
