"""Message records and the properties string: round trips, real captures, and bad input."""

from __future__ import annotations

import contextlib
import struct
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import EncodeError, ProtocolError, RecordError
from protocol.frame import FrameDecoder
from protocol.message import (
    BLANK_MAGIC,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6,
    MessageExt,
    body_crc32,
    decode_record,
    decode_records,
    encode_record,
    encode_records,
    peek_record,
)
from protocol.properties import (
    decode_properties,
    encode_properties,
    java_string_hash,
    join_keys,
    split_keys,
)

CAPTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
PROP_TEXT = st.text(
    st.characters(codec="utf-8", exclude_characters="\x01\x02"),
    min_size=1,
    max_size=16,
)
PROPERTIES = st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=8)
HOSTS = st.tuples(
    st.ip_addresses(v=4).map(str) | st.ip_addresses(v=6).map(str), st.integers(0, 0xFFFF)
)
# Short topics take magic V1; long ASCII or multi-byte ones need V2.
TOPICS = st.text(max_size=30) | st.text("abcé%|", min_size=100, max_size=300)


@st.composite
def messages(draw: st.DrawFn) -> MessageExt:
    """Messages whose derived fields (CRC, host bits) already agree with their content."""
    born, store = draw(HOSTS), draw(HOSTS)
    body = draw(st.binary(max_size=200))
    sys_flag = draw(INT32) & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    sys_flag |= SYSFLAG_BORNHOST_V6 if ":" in born[0] else 0
    sys_flag |= SYSFLAG_STOREHOST_V6 if ":" in store[0] else 0
    return MessageExt(
        topic=draw(TOPICS),
        body=body,
        properties=draw(PROPERTIES),
        queue_id=draw(INT32),
        flag=draw(INT32),
        queue_offset=draw(INT64),
        commit_log_offset=draw(INT64),
        sys_flag=sys_flag,
        born_timestamp=draw(INT64),
        born_host=born,
        store_timestamp=draw(INT64),
        store_host=store,
        reconsume_times=draw(INT32),
        prepared_transaction_offset=draw(INT64),
        body_crc=body_crc32(body),
    )


def sample(**changes: object) -> MessageExt:
    base = MessageExt(
        topic="TopicA",
        body=b"hello",
        properties={"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "AB" * 16},
        born_host=("10.0.0.1", 5000),
        store_host=("10.0.0.2", 10911),
        commit_log_offset=4096,
        store_timestamp=1_700_000_000_000,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def capture_body(relative: str) -> bytes:
    decoder = FrameDecoder()
    decoder.feed(bytes.fromhex("".join((CAPTURES / relative).read_text().split())))
    cmd = decoder.next_command()
    assert cmd is not None
    return cmd.body


# ------------------------------------------------------------------ round trips
@given(messages())
def test_record_round_trip(msg: MessageExt) -> None:
    data = encode_record(msg)
    assert decode_record(data, verify_crc=True) == (msg, len(data))
    assert encode_record(decode_record(data)[0]) == data


@given(st.lists(messages(), max_size=4), st.binary(max_size=20))
def test_concatenated_records_at_any_offset(msgs: list[MessageExt], prefix: bytes) -> None:
    body = encode_records(msgs)
    assert decode_records(body) == msgs
    pos, out = len(prefix), []
    buf = bytearray(prefix + body)  # a bytearray, as a store buffer may be
    while pos < len(buf):
        msg, pos = decode_record(buf, pos)
        out.append(msg)
    assert out == msgs


def test_empty_body_and_empty_properties() -> None:
    msg = sample(body=b"", properties={}, body_crc=0)
    data = encode_record(msg)
    assert len(data) == MIN_RECORD_SIZE + len("TopicA")
    assert decode_records(memoryview(data)) == [msg]
    assert decode_records(b"") == []


@pytest.mark.parametrize(
    ("topic", "magic"),
    [("t" * 127, MESSAGE_MAGIC_V1), ("t" * 128, MESSAGE_MAGIC_V2), ("é" * 64, MESSAGE_MAGIC_V2)],
)
def test_magic_follows_utf8_topic_length(topic: str, magic: int) -> None:
    data = encode_record(sample(topic=topic))
    assert struct.unpack_from(">I", data, 4)[0] == magic
    assert decode_record(data)[0].topic == topic


def test_derived_fields_are_computed() -> None:
    msg = sample(sys_flag=SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6 | 1, body_crc=12345)
    decoded, _ = decode_record(encode_record(msg))
    assert decoded.sys_flag == SYSFLAG_COMPRESSED  # host bits cleared for IPv4 hosts
    assert decoded.body_crc == zlib.crc32(b"hello") & 0x7FFFFFFF
    v6 = decode_record(encode_record(sample(born_host=("::1", 1), store_host=("fe80::2", 2))))[0]
    assert v6.sys_flag == SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
    assert (v6.born_host, v6.store_host) == (("::1", 1), ("fe80::2", 2))


def test_convenience_properties() -> None:
    msg = sample()
    assert (msg.tags, msg.keys, msg.msg_id) == ("TagA", ["k1", "k2"], "AB" * 16)
    assert msg.offset_msg_id == "0A00000200002A9F0000000000001000"
    bare = sample(properties={})
    assert (bare.tags, bare.keys, bare.msg_id) == (None, [], bare.offset_msg_id)


# ------------------------------------------------------------------ real captures
def test_ali_ons_pull_response_body() -> None:
    body = capture_body("ali-ons/ali-ons-18-10911-resp11-0.hex")
    assert len(body) == 145
    (msg,) = decode_records(body, verify_crc=True)
    assert msg.topic == "InteropTopic"
    assert msg.body == b"hello-1-1795306556777"
    assert msg.properties == {"TAGS": "TagA", "KEYS": "key-1"}
    assert (msg.queue_id, msg.queue_offset, msg.commit_log_offset) == (0, 0, 145)
    assert (msg.born_timestamp, msg.store_timestamp) == (1795306556777, 1795306556778)
    assert (msg.born_host, msg.store_host) == (("127.0.0.1", 54672), ("127.0.0.1", 10911))
    assert (msg.sys_flag, msg.flag, msg.reconsume_times, msg.body_crc) == (0, 0, 0, 0x083F88EF)
    assert msg.msg_id == "7F00000100002A9F0000000000000091"
    assert encode_record(msg) == body


def test_cpp_client_pull_response_body() -> None:
    body = capture_body("cpp-client-1.x/cpp-client-24-10911-resp11-0.hex")
    assert len(body) == 201
    (msg,) = decode_records(body, verify_crc=True)
    assert msg.topic == "InteropTopic"
    assert msg.body == b"hello-cpp-0-1795306581974"
    assert msg.properties == {
        "KEYS": "key-0",
        "TAGS": "TagA",
        "UNIQ_KEY": "0100007F00005D8F00005BD291710100",
        "WAIT": "true",
    }
    assert msg.msg_id == "0100007F00005D8F00005BD291710100"
    assert (msg.born_host, msg.store_host) == (("127.0.0.1", 45096), ("127.0.0.1", 10911))
    assert (msg.commit_log_offset, msg.body_crc) == (0, 0x39D5BB0F)
    assert peek_record(body).store_timestamp == msg.store_timestamp == 1795306581981
    assert encode_record(msg) == body


# ------------------------------------------------------------------ peek
@given(messages())
def test_peek_matches_decode(msg: MessageExt) -> None:
    data = encode_record(msg)
    head = peek_record(b"xx" + data[:80], 2)
    assert head.total_size == len(data)
    assert head.magic in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2)
    assert (head.queue_offset, head.commit_log_offset) == (msg.queue_offset, msg.commit_log_offset)
    assert (head.sys_flag, head.store_timestamp) == (msg.sys_flag, msg.store_timestamp)


def test_peek_rejects_blank_and_short() -> None:
    blank = struct.pack(">iI", 4000, BLANK_MAGIC) + bytes(80)
    with pytest.raises(RecordError, match="magic"):
        peek_record(blank)
    with pytest.raises(RecordError):
        peek_record(encode_record(sample())[:40])


# ------------------------------------------------------------------ encode errors
@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"properties": {"K": "x" * 40_000}}, "exceed"),
        ({"properties": {"bad\x01key": "v"}}, "bad"),
        ({"properties": {"K": "v\x02"}}, "'K'"),
        ({"topic": "t" * 40_000}, "topic"),
        ({"topic": "\ud800"}, "text"),
        ({"born_host": ("example.com", 1)}, "address"),
        ({"born_host": ("fe80::1%eth0", 1)}, "scope"),
        ({"store_host": ("10.0.0.1", 70_000)}, "port"),
        ({"queue_id": 2**31}, "range"),
        ({"queue_offset": -(2**63) - 1}, "range"),
    ],
)
def test_encode_refuses_what_does_not_fit(changes: dict[str, object], match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        encode_record(sample(**changes))


# ------------------------------------------------------------------ malformed input
def patched(offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(encode_record(sample()))
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


TOPIC_AT = 88 + len(b"hello")  # IPv4 hosts: fixed part, then the body


@pytest.mark.parametrize(
    "data",
    [
        patched(4, ">I", 0x12345678),  # unknown magic
        patched(4, ">I", BLANK_MAGIC),
        patched(0, ">i", 10),  # total size below the minimum
        patched(0, ">i", 10_000),  # total size beyond the buffer
        patched(84, ">i", -1),  # negative body length
        patched(84, ">i", 1_000),  # body overruns the record
        patched(TOPIC_AT, ">B", 200),  # V1 topic length is a signed byte
        patched(TOPIC_AT + 1, ">B", 0xFF),  # topic is not UTF-8
        patched(52, ">I", 70_000),  # born port out of range (IPv4 hosts: port at 52)
        patched(68, ">I", 70_000),  # store port
        patched(36, ">i", SYSFLAG_BORNHOST_V6),  # layout no longer matches the sizes
        encode_record(sample())[:-1],
        encode_record(sample()) + b"\x00",  # trailing byte: not a whole record
    ],
)
def test_malformed_records_raise_record_error(data: bytes) -> None:
    with pytest.raises(RecordError):
        decode_records(data)


def test_total_size_must_match_the_fields() -> None:
    data = bytearray(encode_record(sample()) + b"\x00")
    struct.pack_into(">i", data, 0, len(data))  # one spare byte inside the record
    with pytest.raises(RecordError, match="disagrees"):
        decode_record(data)


def test_crc_is_checked_only_on_request() -> None:
    data = bytearray(encode_record(sample()))
    data[88] ^= 0xFF  # first body byte
    assert decode_record(data)[0].body != b"hello"
    with pytest.raises(RecordError, match="CRC"):
        decode_record(data, verify_crc=True)


@given(st.binary(max_size=512), st.integers(0, 600))
def test_fuzz_arbitrary_bytes(data: bytes, offset: int) -> None:
    for call in (lambda: decode_records(data), lambda: decode_record(data, offset)):
        try:
            call()
        except ProtocolError as exc:
            assert isinstance(exc, RecordError)


@given(
    st.sampled_from([MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2]),
    st.binary(min_size=80, max_size=400),
    st.booleans(),
)
def test_fuzz_bytes_behind_a_plausible_header(magic: int, rest: bytes, exact: bool) -> None:
    # Random bytes rarely pass the magic check; this reaches the field checks behind it.
    size = 8 + len(rest) if exact else int.from_bytes(rest[:2], "big")
    data = struct.pack(">iI", size, magic) + rest
    try:
        decode_records(data, verify_crc=exact)
        peek_record(data)
    except ProtocolError as exc:
        assert isinstance(exc, RecordError)


@given(messages(), st.data())
def test_fuzz_mutated_records(msg: MessageExt, data: st.DataObject) -> None:
    good = bytearray(encode_record(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        good[data.draw(st.integers(0, len(good) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(good)))
    with contextlib.suppress(RecordError):
        decode_records(bytes(good[:cut]), verify_crc=data.draw(st.booleans()))
    with pytest.raises(RecordError):  # a strict prefix of a record is never a record
        decode_record(encode_record(msg)[: data.draw(st.integers(0, len(good) - 1))])


# ------------------------------------------------------------------ properties string
def java_string2message_properties(text: str) -> dict[str, str]:
    """Java's ``string2messageProperties``, transcribed literally (indexOf semantics)."""
    out: dict[str, str] = {}
    index, size = 0, len(text)
    while index < size:
        new_index = text.find("\x02", index)
        if new_index < 0:
            new_index = size
        if new_index - index >= 3:
            kv = text.find("\x01", index)
            if index < kv < new_index - 1:
                out[text[index:kv]] = text[kv + 1 : new_index]
        index = new_index + 1
    return out


@given(PROPERTIES)
def test_properties_round_trip(props: dict[str, str]) -> None:
    text = encode_properties(props)
    assert text == "".join(f"{k}\x01{v}\x02" for k, v in props.items())
    assert decode_properties(text) == props


@given(st.text(st.sampled_from("ab\x01\x02é"), max_size=40))
def test_decode_properties_matches_java(text: str) -> None:
    assert decode_properties(text) == java_string2message_properties(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("a\x01b", {"a": "b"}),  # no trailing separator
        ("\x01b\x02", {}),  # empty name
        ("a\x01\x02", {}),  # empty value
        ("ab\x02", {}),  # no name/value separator
        ("a\x01b\x01c\x02", {"a": "b\x01c"}),  # value is everything after the first \x01
        ("a\x011\x02a\x012\x02", {"a": "2"}),  # last one wins
        ("\x02\x02a\x01b\x02\x02", {"a": "b"}),
    ],
)
def test_decode_properties_java_cases(text: str, expected: dict[str, str]) -> None:
    assert decode_properties(text) == expected


@pytest.mark.parametrize(
    ("props", "match"),
    [
        ({"ok": "1", "k\x01": "v"}, "'k\\\\x01'"),
        ({"k": "v\x02w"}, "'k'"),
        ({"": "v"}, "empty"),
        ({"k": ""}, "'k' has an empty"),
    ],
)
def test_encode_properties_refuses_corrupting_pairs(props: dict[str, str], match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        encode_properties(props)


def test_real_send_properties_round_trip() -> None:
    text = "KEYS\x01key-0\x02TAGS\x01TagA\x02UNIQ_KEY\x017F0000012CBC5FB551D26C34FDDF0000\x02"
    assert encode_properties(decode_properties(text)) == text


def test_keys() -> None:
    assert split_keys(" a  b c ") == ["a", "b", "c"]
    assert split_keys(None) == split_keys("") == []
    assert join_keys(["a", "", "b"]) == "a b"


# ------------------------------------------------------------------ Java hash
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("TagA", 2598919),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -(2**31)),  # overflows to Integer.MIN_VALUE
        ("é", 0xE9),
        # U+1F600 is the surrogate pair D83D DE00: 0xD83D * 31 + 0xDE00.
        ("\U0001f600", 55357 * 31 + 56832),
        ("a\U0001f600", ((97 * 31 + 55357) * 31 + 56832)),
    ],
)
def test_java_string_hash(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


@given(st.text(max_size=50))
def test_java_string_hash_is_a_signed_int(text: str) -> None:
    units = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = h * 31 + int.from_bytes(units[i : i + 2], "big")
    h %= 2**32
    assert java_string_hash(text) == (h - 2**32 if h >= 2**31 else h)
