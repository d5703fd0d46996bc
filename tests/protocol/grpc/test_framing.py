"""gRPC framing: messages in any split, grpc-timeout and grpc-message."""

from __future__ import annotations

import itertools
import math
import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError
from protocol.grpc.framing import (
    DEFAULT_MAX_MESSAGE_SIZE,
    GrpcFramingError,
    MessageDecoder,
    encode_message,
    format_timeout,
    parse_timeout,
    percent_decode,
    percent_encode,
)

RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13

TIMEOUT_GRAMMAR = re.compile(r"[0-9]{1,8}[HMSmun]")
UNIT_SECONDS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """Split ``data`` at the given positions (taken modulo its length, sorted)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def decode_all(data: bytes, cuts: list[int], **kw: int) -> tuple[list[bytes], MessageDecoder]:
    decoder = MessageDecoder(**kw)
    out: list[bytes] = []
    for chunk in split(data, cuts):
        decoder.receive_data(chunk)
        while (message := decoder.next_message()) is not None:
            out.append(message)
    return out, decoder


# ---------------------------------------------------------------- messages


def test_encode_message_layout() -> None:
    assert encode_message(b"") == b"\x00\x00\x00\x00\x00"
    assert encode_message(b"abc") == b"\x00\x00\x00\x00\x03abc"


def test_decoder_one_message_byte_by_byte() -> None:
    wire = encode_message(b"hello")
    decoder = MessageDecoder()
    assert decoder.at_boundary
    for i, byte in enumerate(wire):
        assert decoder.next_message() is None
        decoder.receive_data(bytes((byte,)))
        assert decoder.buffered == i + 1
        assert not decoder.at_boundary or i == len(wire) - 1
    assert decoder.next_message() == b"hello"
    assert decoder.next_message() is None
    assert decoder.at_boundary
    assert decoder.buffered == 0


def test_decoder_empty_messages_and_several_per_chunk() -> None:
    decoder = MessageDecoder()
    decoder.receive_data(encode_message(b"") + encode_message(b"x") + encode_message(b"")[:3])
    assert decoder.next_message() == b""
    assert decoder.next_message() == b"x"
    assert decoder.next_message() is None
    assert not decoder.at_boundary  # the stream would end mid-message
    assert decoder.buffered == 3
    decoder.receive_data(b"\x00\x00")
    assert decoder.next_message() == b""
    assert decoder.at_boundary


def test_decoder_ignores_empty_data() -> None:
    decoder = MessageDecoder()
    decoder.receive_data(b"")
    assert decoder.next_message() is None
    assert decoder.at_boundary


def test_decoder_accepts_exactly_the_limit() -> None:
    out, decoder = decode_all(encode_message(b"x" * 10), [], max_message_size=10)
    assert out == [b"x" * 10]
    assert decoder.at_boundary


def test_decoder_oversize_is_raised_from_the_prefix_alone() -> None:
    decoder = MessageDecoder(max_message_size=10)
    decoder.receive_data(b"\x00\x00\x00\x00\x0b")  # 11 bytes announced, none sent
    with pytest.raises(GrpcFramingError) as info:
        decoder.next_message()
    assert info.value.status == RESOURCE_EXHAUSTED
    assert "11" in info.value.message
    assert "10" in info.value.message
    assert isinstance(info.value, ProtocolError)
    # Sticky, and later bytes are not buffered.
    decoder.receive_data(b"x" * 100)
    assert decoder.buffered == 0
    with pytest.raises(GrpcFramingError) as again:
        decoder.next_message()
    assert again.value is info.value


def test_decoder_default_limit() -> None:
    decoder = MessageDecoder()
    assert decoder.max_message_size == DEFAULT_MAX_MESSAGE_SIZE == 4 * 1024 * 1024
    decoder.receive_data(struct.pack(">BI", 0, DEFAULT_MAX_MESSAGE_SIZE + 1))
    with pytest.raises(GrpcFramingError) as info:
        decoder.next_message()
    assert info.value.status == RESOURCE_EXHAUSTED


def test_decoder_compressed_flag_is_unimplemented() -> None:
    decoder = MessageDecoder()
    decoder.receive_data(b"\x01\x00\x00\x00\x02ab")
    with pytest.raises(GrpcFramingError) as info:
        decoder.next_message()
    assert info.value.status == UNIMPLEMENTED
    assert info.value.message == "compressed messages are not supported"
    assert "status=12" in repr(info.value)


def test_decoder_unknown_flag_is_internal() -> None:
    decoder = MessageDecoder()
    decoder.receive_data(b"\x02\x00\x00\x00\x00")
    with pytest.raises(GrpcFramingError) as info:
        decoder.next_message()
    assert info.value.status == INTERNAL


def test_decoder_rejects_negative_limit() -> None:
    with pytest.raises(ValueError, match="negative"):
        MessageDecoder(max_message_size=-1)


def test_decoder_many_small_messages_compacts() -> None:
    """Far more bytes than the compaction threshold pass through; the buffer stays small."""
    wire = encode_message(b"0123456789") * 20_000
    decoder = MessageDecoder()
    count = 0
    for start in range(0, len(wire), 4096 + 7):
        decoder.receive_data(wire[start : start + 4096 + 7])
        while decoder.next_message() == b"0123456789":
            count += 1
        assert len(decoder._buf) < 200_000  # consumed bytes are dropped, not kept
    assert count == 20_000
    assert decoder.at_boundary


@settings(max_examples=150)
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=20),
)
def test_decoder_any_chunking_round_trips(payloads: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(encode_message(p) for p in payloads)
    out, decoder = decode_all(wire, cuts)
    assert out == payloads
    assert decoder.at_boundary
    assert decoder.buffered == 0


# ---------------------------------------------------------------- grpc-timeout


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1H", 3600.0),
        ("2M", 120.0),
        ("30S", 30.0),
        ("100m", 0.1),
        ("250u", 0.00025),
        ("99999999n", 0.099999999),
        ("0S", 0.0),
        ("00000001S", 1.0),
    ],
)
def test_parse_timeout(value: str, seconds: float) -> None:
    assert parse_timeout(value) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize(
    "value",
    ["", "S", "1", "123456789S", "1s", "1h", "1 S", " 1S", "1S ", "-1S", "+1S", "1.5S", "1SS",
     "١S", "1S\n", "0x1S"],
)  # fmt: skip
def test_parse_timeout_rejects(value: str) -> None:
    with pytest.raises(ValueError, match="grpc-timeout"):
        parse_timeout(value)


@settings(max_examples=500)
@given(st.text(st.sampled_from("0123456789HMSmunsh ٠١²+-.\n"), max_size=11))
def test_parse_timeout_takes_exactly_the_grammar(value: str) -> None:
    if TIMEOUT_GRAMMAR.fullmatch(value):
        assert parse_timeout(value) == int(value[:-1]) * UNIT_SECONDS[value[-1]]
    else:
        with pytest.raises(ValueError, match="grpc-timeout"):
            parse_timeout(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0n"),
        (-5.0, "0n"),
        (1e-9, "1n"),
        (1e-12, "1n"),  # a positive timeout never becomes 0
        (0.05, "50000000n"),
        (0.1, "100000u"),
        (1.0, "1000000u"),
        (30.0, "30000000u"),
        (99_999.999, "99999999m"),
        (100_000.0, "100000S"),
        (100_000.0001, "100001S"),  # rounded up, never shorter
        (1e9, "16666667M"),
        (1e12, "99999999H"),  # 277 777 777.8 h: more than 8 digits, so clamped
    ],
)
def test_format_timeout(seconds: float, text: str) -> None:
    assert format_timeout(seconds) == text


def test_format_timeout_extremes() -> None:
    assert format_timeout(math.inf) == "99999999H"
    assert format_timeout(99_999_999 * 3600.0) == "99999999H"
    with pytest.raises(ValueError, match="NaN"):
        format_timeout(math.nan)


@settings(max_examples=300)
@given(
    st.one_of(
        st.floats(min_value=0.0, max_value=99_999_999 * 3600.0, allow_nan=False),
        st.floats(min_value=1e-10, max_value=1e3),
        st.integers(min_value=0, max_value=10**12).map(lambda ns: ns / 1e9),
    )
)
def test_timeout_round_trip(seconds: float) -> None:
    text = format_timeout(seconds)
    assert TIMEOUT_GRAMMAR.fullmatch(text), text
    unit = UNIT_SECONDS[text[-1]]
    parsed = parse_timeout(text)
    # Never shorter than asked (beyond float noise), and within one unit (plus the 1 ns
    # rounding of the input) of it.
    slack = 1e-9 + abs(seconds) * 1e-12
    assert parsed >= seconds - slack
    assert parsed - seconds <= unit + slack


# ---------------------------------------------------------------- grpc-message


@pytest.mark.parametrize(
    ("text", "encoded"),
    [
        ("", ""),
        ("plain text: ok!", "plain text: ok!"),
        ("100%", "100%25"),
        ("a\nb\tc", "a%0Ab%09c"),
        ("\x7f", "%7F"),
        ("é", "%C3%A9"),
        ("消息", "%E6%B6%88%E6%81%AF"),
        ("~ ", "~ "),
    ],
)
def test_percent_encode(text: str, encoded: str) -> None:
    assert percent_encode(text) == encoded
    assert percent_decode(encoded) == text


@pytest.mark.parametrize(
    ("encoded", "text"),
    [
        ("%", "%"),
        ("%4", "%4"),
        ("%zz", "%zz"),
        ("50% off", "50% off"),
        ("%c3%a9", "é"),  # lowercase hex is accepted
        ("%41%", "A%"),
        ("%%41", "%A"),
        ("%FF", "\ufffd"),  # invalid UTF-8 is replaced, never an error
        ("%E6%B6", "\ufffd"),
        ("é%20x", "é x"),  # raw non-ASCII passes through
    ],
)
def test_percent_decode_is_lenient(encoded: str, text: str) -> None:
    assert percent_decode(encoded) == text


def test_percent_encode_lone_surrogate() -> None:
    assert percent_encode("a\ud800b") == "a?b"


@settings(max_examples=300)
@given(st.text())
def test_percent_round_trip(text: str) -> None:
    encoded = percent_encode(text)
    assert all(0x20 <= ord(c) <= 0x7E for c in encoded)
    assert percent_decode(encoded) == text
