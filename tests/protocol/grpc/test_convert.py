"""v2 messages ↔ stored properties and records (protocol.grpc.convert), without a broker."""

from __future__ import annotations

import hashlib

import pytest

from protocol.errors import EncodeError, ReceiptError
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.grpc.convert import (
    SHARDING_KEY,
    MessageRejected,
    decode_handle,
    encode_handle,
    java_hash,
    properties_of,
    to_message,
)
from protocol.message import MessageExt
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
