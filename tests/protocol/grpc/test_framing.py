"""gRPC framing: messages in any split, grpc-timeout, grpc-message and the GOAWAY splitter."""

from __future__ import annotations

import itertools
import math
import re
import struct

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from hyperframe.frame import DataFrame, GoAwayFrame, PingFrame, WindowUpdateFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import ProtocolError
from protocol.grpc.framing import (
    CONNECTION_PREFACE,
    DEFAULT_MAX_MESSAGE_SIZE,
    FrameSplitter,
    GoAway,
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


# ---------------------------------------------------------------- FrameSplitter


def frame(ftype: int, payload: bytes, *, flags: int = 0, stream_id: int = 0) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + struct.pack(">BBI", ftype, flags, stream_id)
        + (payload)
    )


def goaway(last: int, code: int, debug: bytes = b"", *, reserved: bool = False) -> bytes:
    last_word = last | (0x80000000 if reserved else 0)
    return frame(0x7, struct.pack(">II", last_word, code) + debug)


def split_all(splitter: FrameSplitter, chunks: list[bytes]) -> tuple[bytes, list[GoAway]]:
    out: list[bytes] = []
    goaways: list[GoAway] = []
    for chunk in chunks:
        data, found = splitter.receive_data(chunk)
        out.append(data)
        goaways.extend(found)
    return b"".join(out), goaways


def test_splitter_withholds_goaway() -> None:
    settings_frame = frame(0x4, b"")
    ga = goaway(7, 0, b"bye")
    data = frame(0x0, b"hello", flags=0x1, stream_id=1)
    wire = CONNECTION_PREFACE + settings_frame + ga + data
    splitter = FrameSplitter()
    out, found = splitter.receive_data(wire)
    assert out == CONNECTION_PREFACE + settings_frame + data
    assert found == [GoAway(last_stream_id=7, error_code=0, debug_data=b"bye")]
    assert splitter.buffered == 0


def test_splitter_byte_by_byte_never_passes_goaway_bytes() -> None:
    head = CONNECTION_PREFACE + frame(0x1, b"HDRS", flags=0x4, stream_id=1)
    ga = goaway(1, 2, b"debug")
    tail = frame(0x0, b"body", stream_id=1)
    splitter = FrameSplitter()
    outputs = [splitter.receive_data(bytes((b,))) for b in head + ga + tail]
    passed = b"".join(o for o, _ in outputs)
    assert passed == head + tail
    # While the GOAWAY arrives nothing is passed; it is reported on its last byte.
    during = outputs[len(head) : len(head) + len(ga)]
    assert all(o == b"" for o, _ in during)
    assert [g for _, gs in during for g in gs] == [GoAway(1, 2, b"debug")]
    # The preface passes byte by byte; a frame header is held until its 9th byte, and the
    # payload of a non-GOAWAY frame passes as it arrives.
    assert all(o == bytes((b,)) for (o, _), b in zip(outputs[:24], CONNECTION_PREFACE, strict=True))
    assert [o for o, _ in outputs[24:33]] == [b""] * 8 + [head[24:33]]
    assert outputs[33][0] == head[33:34]


def test_splitter_masks_reserved_bit_and_keeps_debug_data() -> None:
    splitter = FrameSplitter()
    _, found = splitter.receive_data(
        CONNECTION_PREFACE + goaway(5, 0xB, b"\x00\xff", reserved=True)
    )
    assert found == [GoAway(last_stream_id=5, error_code=0xB, debug_data=b"\x00\xff")]


def test_splitter_passes_goaways_h2_must_reject() -> None:
    short = frame(0x7, b"\x00\x00\x00\x01")  # payload < 8: FRAME_SIZE_ERROR in h2
    on_stream = frame(0x7, struct.pack(">II", 1, 0), stream_id=3)  # PROTOCOL_ERROR in h2
    too_long = frame(0x7, struct.pack(">II", 1, 0) + b"x" * 100)
    wire = CONNECTION_PREFACE + short + on_stream + too_long
    out, found = split_all(FrameSplitter(max_frame_size=50), split(wire, list(range(0, 200, 3))))
    assert out == wire
    assert found == []


def test_splitter_several_goaways_in_order() -> None:
    wire = CONNECTION_PREFACE + goaway(2**31 - 1, 0) + frame(0x6, b"12345678") + goaway(9, 0)
    out, found = FrameSplitter().receive_data(wire)
    assert out == CONNECTION_PREFACE + frame(0x6, b"12345678")
    assert found == [GoAway(2**31 - 1, 0, b""), GoAway(9, 0, b"")]


def test_splitter_accepts_memoryview_and_empty() -> None:
    splitter = FrameSplitter()
    assert splitter.receive_data(b"") == (b"", [])
    out, _ = splitter.receive_data(memoryview(CONNECTION_PREFACE + frame(0x4, b"")))
    assert out == CONNECTION_PREFACE + frame(0x4, b"")


def test_splitter_is_linear() -> None:
    """A large frame fed in small chunks is passed through piece by piece, not re-buffered."""
    payload = bytes(2**24 - 1)  # the largest frame a 3-byte length allows
    wire = CONNECTION_PREFACE + frame(0x0, payload, stream_id=1)
    splitter = FrameSplitter()
    total = 0
    for start in range(0, len(wire), 65536):
        out, _ = splitter.receive_data(wire[start : start + 65536])
        total += len(out)
        assert splitter.buffered == 0
    assert total == len(wire)


@st.composite
def frame_streams(draw: st.DrawFn) -> tuple[bytes, bytes, list[GoAway]]:
    """A preface and random frames: (wire, wire without GOAWAYs, the GOAWAYs)."""
    wire = [CONNECTION_PREFACE]
    expected = [CONNECTION_PREFACE]
    goaways: list[GoAway] = []
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        if draw(st.booleans()):
            last = draw(st.integers(min_value=0, max_value=2**31 - 1))
            code = draw(st.integers(min_value=0, max_value=2**32 - 1))
            debug = draw(st.binary(max_size=40))
            reserved = draw(st.booleans())
            wire.append(goaway(last, code, debug, reserved=reserved))
            goaways.append(GoAway(last, code, debug))
        else:
            ftype = draw(st.integers(min_value=0, max_value=255))
            payload = draw(st.binary(max_size=60))
            stream_id = draw(st.integers(min_value=0, max_value=2**32 - 1))
            flags = draw(st.integers(min_value=0, max_value=255))
            if ftype == 0x7 and len(payload) >= 8 and stream_id & 0x7FFFFFFF == 0:
                stream_id = 1  # keep it a GOAWAY h2 must reject: passed through
            raw = frame(ftype, payload, flags=flags, stream_id=stream_id)
            wire.append(raw)
            expected.append(raw)
    return b"".join(wire), b"".join(expected), goaways


@settings(max_examples=200)
@given(
    stream=frame_streams(),
    cuts=st.lists(st.integers(min_value=0, max_value=1000), max_size=30),
)
def test_splitter_any_chunking(stream: tuple[bytes, bytes, list[GoAway]], cuts: list[int]) -> None:
    wire, expected, goaways = stream
    splitter = FrameSplitter()
    out, found = split_all(splitter, split(wire, cuts))
    assert out == expected
    assert found == goaways
    assert splitter.buffered == 0


# ---------------------------------------------------------------- with real h2

REQUEST_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/apache.rocketmq.v2.MessagingService/SendMessage"),
    (":authority", "localhost"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def open_call() -> tuple[bytes, h2.connection.H2Connection]:
    """A client's preface, SETTINGS and one open request stream (id 1); a fresh server."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, REQUEST_HEADERS)
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    server.data_to_send()
    return client.data_to_send(), server


def after_goaway() -> bytes:
    """What a client sends once it decided to shut down: GOAWAY, then finishes stream 1."""
    body = encode_message(b"request")
    ga = GoAwayFrame(0, last_stream_id=0, error_code=0, additional_data=b"client shutdown")
    data = DataFrame(1, body, flags=["END_STREAM"])
    return (
        ga.serialize()
        + WindowUpdateFrame(0, window_increment=1000).serialize()
        + (PingFrame(0, opaque_data=b"12345678").serialize() + data.serialize())
    )


def test_h2_stream_survives_withheld_goaway() -> None:
    opening, server = open_call()
    splitter = FrameSplitter()
    events: list[h2.events.Event] = []
    goaways: list[GoAway] = []
    wire = opening + after_goaway()
    for chunk in split(wire, list(range(0, len(wire), 7))):  # split mid-frame too
        data, found = splitter.receive_data(chunk)
        goaways.extend(found)
        events.extend(server.receive_data(data))
    assert goaways == [GoAway(last_stream_id=0, error_code=0, debug_data=b"client shutdown")]
    assert not any(isinstance(e, h2.events.ConnectionTerminated) for e in events)
    kinds = [type(e) for e in events]
    assert h2.events.RequestReceived in kinds
    received = [e for e in events if isinstance(e, h2.events.DataReceived)]
    assert [e.data for e in received] == [encode_message(b"request")]
    assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 1 for e in events)
    assert any(isinstance(e, h2.events.PingReceived) for e in events)

    decoder = MessageDecoder()
    for e in received:
        assert e.data is not None
        decoder.receive_data(e.data)
        server.acknowledge_received_data(e.flow_controlled_length, 1)
    assert decoder.next_message() == b"request"
    assert decoder.at_boundary

    # The server answers: headers, one message, then trailers with END_STREAM.
    server.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
    server.send_data(1, encode_message(b"reply"))
    server.send_headers(
        1, [("grpc-status", "0"), ("grpc-message", percent_encode("ok ✓"))], end_stream=True
    )
    # Then closes the connection itself.
    server.close_connection(last_stream_id=1)
    assert server.data_to_send()


def test_h2_without_splitter_breaks_on_goaway() -> None:
    """python-hyper/h2#1181. If this starts failing, h2 fixed it and the splitter may go."""
    opening, server = open_call()
    server.receive_data(opening)
    with pytest.raises(h2.exceptions.ProtocolError, match="CLOSED"):
        server.receive_data(after_goaway())
