"""Frames: round trips in every header type, any split of the byte stream, and bad input."""

from __future__ import annotations

import itertools
import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.codes import RequestCode, ResponseCode, SerializeType
from protocol.command import RemotingCommand, request
from protocol.errors import (
    EncodeError,
    FrameError,
    FrameTooLargeError,
    HeaderError,
    ProtocolError,
)
from protocol.frame import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, encode_command
from protocol.header_codec import _general_json, _plain_json, encode_json
from tests.protocol.strategies import commands


def decode_all(data: bytes, cuts: list[int] | None = None, **kw: int) -> list[RemotingCommand]:
    """Feed ``data`` split at ``cuts`` and collect every command."""
    decoder = FrameDecoder(**kw)
    out: list[RemotingCommand] = []
    bounds = [0, *sorted({c for c in (cuts or []) if 0 < c < len(data)}), len(data)]
    for start, end in itertools.pairwise(bounds):
        decoder.feed(data[start:end])
        while (cmd := decoder.next_command()) is not None:
            out.append(cmd)
    assert decoder.buffered == 0
    return out


def raw_frame(stype: int, header: bytes, body: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) + (
        header + body
    )


def json_frame(header: dict[str, object], body: bytes = b"", newline: bool = False) -> bytes:
    text = json.dumps(header).encode() + (b"\n" if newline else b"")
    return raw_frame(SerializeType.JSON, text, body)


# ------------------------------------------------------------------ round trips
@given(commands())
def test_round_trip_every_serialize_type(cmd: RemotingCommand) -> None:
    assert decode_all(encode_command(cmd)) == [cmd]


@given(st.lists(commands(), min_size=1, max_size=6), st.lists(st.integers(0, 20_000), max_size=30))
def test_random_splits_give_the_same_commands(cmds: list[RemotingCommand], cuts: list[int]) -> None:
    stream = b"".join(encode_command(c) for c in cmds)
    assert decode_all(stream, cuts) == cmds


@given(st.lists(commands(), min_size=1, max_size=3))
def test_byte_at_a_time(cmds: list[RemotingCommand]) -> None:
    stream = b"".join(encode_command(c) for c in cmds)
    assert decode_all(stream, list(range(len(stream)))) == cmds


def test_response_uses_the_request_serialize_type() -> None:
    for stype in SerializeType:
        req = request(RequestCode.GET_MAX_OFFSET, opaque=7, serialize_type=stype)
        (got,) = decode_all(encode_command(req))
        resp = got.response(ResponseCode.SUCCESS, ext_fields={"offset": "42"})
        (back,) = decode_all(encode_command(resp))
        assert back.serialize_type is stype
        assert back.opaque == 7 and back.is_response and back.ext_fields == {"offset": "42"}


def test_oneway_and_response_flags() -> None:
    cmd = request(RequestCode.UNREGISTER_CLIENT, opaque=1, oneway=True)
    assert cmd.is_oneway and not cmd.is_response
    assert cmd.response().is_response and not cmd.response().is_oneway


def test_json_header_matches_what_java_brokers_send() -> None:
    resp = RemotingCommand(code=0, opaque=3, flag=1, version=121, ext_fields={"offset": "0"})
    frame = encode_command(resp)
    header = json.loads(frame[8:])
    assert header == {
        "code": 0,
        "language": "JAVA",
        "version": 121,
        "opaque": 3,
        "flag": 1,
        "remark": None,
        "extFields": {"offset": "0"},
        "serializeTypeCurrentRPC": "JSON",
    }


# ------------------------------------------------------------------ JSON leniency
def test_json_ext_numbers_booleans_and_null_become_strings() -> None:
    frame = json_frame(
        {
            "code": 310,
            "opaque": 2,
            "extFields": {"d": 4, "g": 1795306556772, "k": False, "x": 1.5, "n": None, "s": "v"},
        },
        newline=True,
    )
    (cmd,) = decode_all(frame)
    # null means "absent", as when Java decodes a custom header field.
    assert cmd.ext_fields == {"d": "4", "g": "1795306556772", "k": "false", "x": "1.5", "s": "v"}


def test_json_defaults_and_numeric_strings() -> None:
    (cmd,) = decode_all(json_frame({"code": "105", "opaque": "9"}))
    assert (cmd.code, cmd.opaque, cmd.flag, cmd.version, cmd.language) == (105, 9, 0, 0, "JAVA")
    assert cmd.ext_fields == {} and cmd.remark is None


@pytest.mark.parametrize(
    ("header", "opaque"),
    [
        (b"{not json", None),
        (b"[1,2]", None),
        (b'{"opaque": 5}', 5),
        (b'{"code": true, "opaque": 5}', 5),
        (b'{"code": 1e3, "opaque": 5}', 5),
        (b'{"code": 99999999999, "opaque": 5}', 5),
        (b'{"code": 1, "opaque": 5, "extFields": [1]}', 5),
        (b'{"code": 1, "opaque": 5, "extFields": {"a": [1]}}', 5),
        (b'{"code": 1, "opaque": 5, "remark": 3}', 5),
        (b'{"code": NaN, "opaque": 5}', None),
        (b'{"code": 1, "opaque": 5, "extFields": {"a": Infinity}}', None),
        (b'\xff\xfe{"code": 1}', None),
        (b"[" * 100_000, None),
    ],
)
def test_bad_json_header_is_a_recoverable_header_error(header: bytes, opaque: int | None) -> None:
    good = encode_command(request(RequestCode.HEART_BEAT, opaque=77))
    decoder = FrameDecoder()
    decoder.feed(raw_frame(SerializeType.JSON, header) + good)
    with pytest.raises(HeaderError) as info:
        decoder.next_command()
    assert not info.value.fatal
    assert info.value.opaque == opaque
    assert info.value.code == ResponseCode.INVALID_PARAMETER
    nxt = decoder.next_command()
    assert nxt is not None and nxt.opaque == 77  # the stream stayed in sync


# ------------------------------------------------------------------ binary header details
def test_binary_header_rejects_codes_that_do_not_fit_a_short() -> None:
    cmd = request(RequestCode.POP_MESSAGE, opaque=1, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(EncodeError, match="16-bit"):
        encode_command(cmd)


@pytest.mark.parametrize("stype", list(SerializeType))
@pytest.mark.parametrize(
    "fields",
    [
        {"remark": "\ud800"},  # a lone surrogate reaches us through a JSON '\ud800' escape
        {"ext_fields": {"k": "\udfff"}},
        {"ext_fields": {"\ud800": "v"}},
    ],
)
def test_lone_surrogates_are_an_encode_error(stype: SerializeType, fields: dict[str, Any]) -> None:
    # JSON and binary raised UnicodeEncodeError.
    with pytest.raises(EncodeError):
        encode_command(RemotingCommand(code=1, serialize_type=stype, **fields))


@pytest.mark.parametrize(
    "fields", [{"opaque": 2**31}, {"flag": -(2**31) - 1}, {"ext_fields": {"k": 1}}]
)
def test_binary_header_values_that_do_not_fit_are_an_encode_error(fields: dict[str, Any]) -> None:
    # Raised struct.error and AttributeError.
    with pytest.raises(EncodeError):
        encode_command(RemotingCommand(code=1, serialize_type=SerializeType.ROCKETMQ, **fields))


def test_binary_empty_remark_decodes_as_none() -> None:
    cmd = RemotingCommand(code=1, remark="", serialize_type=SerializeType.ROCKETMQ)
    (got,) = decode_all(encode_command(cmd))
    assert got.remark is None


@pytest.mark.parametrize(
    "header",
    [
        b"\x00\x01\x00",  # truncated fixed part
        struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">i", 10) + b"ab",  # remark overrun
        struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">ii", 0, 3) + b"\x00\x05a",
        struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">ii", 0, 0) + b"junk",
        struct.pack(">hbhii", 1, 0, 0, 5, 0) + struct.pack(">i", 2) + b"\xff\xff" + b"\0" * 4,
    ],
)
def test_bad_binary_header_is_a_header_error(header: bytes) -> None:
    with pytest.raises(HeaderError):
        decode_all(raw_frame(SerializeType.ROCKETMQ, header))


# ------------------------------------------------------------------ msgpack header details
@pytest.mark.parametrize(
    "header",
    [b"\xc1", b"\x93\x01\x02\x03", b"\x97\x01\xa1J\x00\x05\x00\xc0\x81\xa1k\x01", b"\x81\x01\x02"],
)
def test_bad_msgpack_header_is_a_header_error(header: bytes) -> None:
    with pytest.raises(HeaderError):
        decode_all(raw_frame(SerializeType.MSGPACK, header))


# ------------------------------------------------------------------ framing errors (fatal)
@pytest.mark.parametrize(
    "data",
    [
        struct.pack(">II", 2, 0),  # length shorter than the type|hlen word
        struct.pack(">II", 8, 0x07000004) + b"{}{}",  # unknown serialize type 7
        struct.pack(">II", 8, 10) + b"{}{}",  # header longer than the frame
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not RocketMQ at all
    ],
)
def test_broken_framing_is_fatal_and_sticky(data: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(data)
    with pytest.raises(FrameError) as first:
        decoder.next_command()
    assert first.value.fatal
    with pytest.raises(FrameError) as again:
        decoder.next_command()
    assert again.value is first.value


def test_eof_mid_frame_is_fatal() -> None:
    frame = encode_command(request(RequestCode.HEART_BEAT, opaque=1, body=b"x" * 100))
    decoder = FrameDecoder()
    decoder.feed(frame[:50])
    assert decoder.next_command() is None
    decoder.feed(b"")
    with pytest.raises(FrameError, match="mid-frame"):
        decoder.next_command()


def test_clean_eof_is_not_an_error() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_command(request(RequestCode.HEART_BEAT, opaque=1)))
    decoder.feed(b"")
    assert decoder.next_command() is not None
    assert decoder.next_command() is None


# ------------------------------------------------------------------ oversize frames
@pytest.mark.parametrize("stype", list(SerializeType))
@pytest.mark.parametrize("chunk", [1, 7, 4096, 10**6])
def test_oversize_frame_is_answerable_and_skipped(stype: SerializeType, chunk: int) -> None:
    limit = 4096
    big = request(RequestCode.SEND_MESSAGE, opaque=41, body=b"z" * 10_000, serialize_type=stype)
    after = request(RequestCode.HEART_BEAT, opaque=42, serialize_type=stype)
    stream = encode_command(big) + encode_command(after)
    decoder = FrameDecoder(max_frame_size=limit)
    errors: list[FrameTooLargeError] = []
    got: list[RemotingCommand] = []
    for start in range(0, len(stream), chunk):
        decoder.feed(stream[start : start + chunk])
        assert decoder.buffered <= limit + chunk  # the big body is never buffered whole
        while True:
            try:
                cmd = decoder.next_command()
            except FrameTooLargeError as exc:
                errors.append(exc)
                continue
            if cmd is None:
                break
            got.append(cmd)
    (err,) = errors
    assert not err.fatal
    assert (err.opaque, err.request_code, err.serialize_type) == (41, 10, stype)
    assert err.frame_size == len(encode_command(big)) and err.limit == limit
    assert err.code == ResponseCode.MESSAGE_ILLEGAL
    assert [c.opaque for c in got] == [42]


def test_oversize_frame_with_garbage_header_is_fatal() -> None:
    decoder = FrameDecoder(max_frame_size=64)
    decoder.feed(raw_frame(SerializeType.JSON, b"{garbage", b"x" * 100))
    with pytest.raises(FrameTooLargeError) as info:
        decoder.next_command()
    assert info.value.fatal and info.value.opaque is None


def test_default_limit_is_16_mib_including_the_length_field() -> None:
    assert DEFAULT_MAX_FRAME_SIZE == 16 * 1024 * 1024
    header = encode_command(request(RequestCode.SEND_MESSAGE, opaque=1))[8:]
    fits = DEFAULT_MAX_FRAME_SIZE - 8 - len(header)
    exact = raw_frame(SerializeType.JSON, header, b"b" * fits)
    assert len(exact) == DEFAULT_MAX_FRAME_SIZE
    (cmd,) = decode_all(exact)
    assert len(cmd.body) == fits
    with pytest.raises(FrameTooLargeError):
        decode_all(raw_frame(SerializeType.JSON, header, b"b" * (fits + 1)))


def test_encoder_can_refuse_frames_over_a_limit() -> None:
    cmd = request(RequestCode.SEND_MESSAGE, opaque=1, body=b"x" * 100)
    with pytest.raises(EncodeError, match="exceeds"):
        encode_command(cmd, max_frame_size=64)


# ------------------------------------------------------------------ fuzz
def drain(decoder: FrameDecoder, budget: int) -> None:
    """Pull commands until the decoder needs data or fails fatally; never loops forever."""
    for _ in range(budget):
        try:
            if decoder.next_command() is None:
                return
        except ProtocolError as exc:
            if exc.fatal:
                return
    raise AssertionError("decoder produced more results than its input allows")


@given(st.binary(max_size=4096), st.lists(st.integers(0, 4096), max_size=8), st.booleans())
def test_fuzz_arbitrary_bytes(data: bytes, cuts: list[int], eof: bool) -> None:
    decoder = FrameDecoder(max_frame_size=1024)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    budget = len(data) // 8 + 2  # every command or recoverable error consumes >= 8 bytes
    for start, end in itertools.pairwise(bounds):
        decoder.feed(data[start:end])
        drain(decoder, budget)
    if eof:
        decoder.feed(b"")
        drain(decoder, budget)


@given(st.sampled_from([0, 1, 0x4D]), st.binary(max_size=600), st.binary(max_size=64))
def test_fuzz_well_framed_garbage_headers(stype: int, header: bytes, body: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(raw_frame(stype, header, body))
    try:
        cmd = decoder.next_command()
    except ProtocolError as exc:
        assert not exc.fatal  # the frame itself was well formed
    else:
        assert cmd is not None and cmd.body == body


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
HEADER_KEYS = st.sampled_from(
    ["code", "opaque", "flag", "version", "language", "remark", "extFields", "other"]
)


@given(st.dictionaries(HEADER_KEYS, JSON_VALUES | st.text(alphabet="-+0123456789 ", max_size=12)))
def test_fuzz_json_headers_with_valid_json(header: dict[str, object]) -> None:
    """Structurally valid JSON with wrong types and odd numbers: a command or a HeaderError."""
    decoder = FrameDecoder()
    decoder.feed(json_frame(header))
    try:
        cmd = decoder.next_command()
    except ProtocolError as exc:
        assert isinstance(exc, HeaderError)
    else:
        assert cmd is not None


@pytest.mark.parametrize("value", ["--5", "+5", "-", "", " 5", "٣", "9" * 5000, "99999999999"])
def test_json_numeric_strings_are_strict(value: str) -> None:
    with pytest.raises(HeaderError):
        decode_all(json_frame({"code": value, "opaque": 1}))


@given(commands(), st.data())
def test_fuzz_mutated_valid_frames(cmd: RemotingCommand, data: st.DataObject) -> None:
    frame = bytearray(encode_command(cmd))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    decoder = FrameDecoder(max_frame_size=64 * 1024)
    decoder.feed(bytes(frame))
    decoder.feed(b"")
    drain(decoder, len(frame) // 8 + 2)


@given(
    st.dictionaries(st.text(max_size=12), st.text(max_size=24), max_size=8),
    st.none() | st.text(max_size=30),
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from(["JAVA", "CPP", "PYTHON", "GO"]),
)
def test_json_headers_written_by_formatting_are_what_json_writes(
    ext: dict[str, str], remark: str | None, opaque: int, language: str
) -> None:
    cmd = RemotingCommand(
        code=0, opaque=opaque, flag=1, language=language, remark=remark, ext_fields=ext
    )
    try:
        general = _general_json(cmd)
    except EncodeError:
        general = None  # lone surrogates: the fast path must not take them either
    plain = _plain_json(cmd)
    if plain is not None:
        assert plain == general
    assert (encode_json(cmd) if general is not None else None) == general


def test_typical_replies_take_the_formatting_path() -> None:
    reply = RemotingCommand(
        code=0, opaque=7, flag=1, ext_fields={"msgId": "7F00", "queueId": "3", "queueOffset": "9"}
    )
    assert _plain_json(reply) is not None
    assert _plain_json(RemotingCommand(code=0, remark='say "hi"')) is None
    assert _plain_json(RemotingCommand(code=0, ext_fields={"a": "line\nbreak"})) is None
