"""Every frame captured from a real RocketMQ client decodes to what its name says."""

from __future__ import annotations

import json

import pytest

from protocol.codes import LanguageCode, SerializeType
from protocol.frame import FrameDecoder, encode_command
from tests.protocol.captures import CAPTURES, Capture, all_captures, capture

CAPTURED = all_captures()


def test_the_fixture_set_is_complete() -> None:
    assert len(CAPTURED) == 59
    assert len(INDEXED) == 56  # all but the three top-level first-request copies
    assert {c.client for c in CAPTURED} >= {"ali-ons", "cpp-client-1.x", "cpp-client-2.1"}


@pytest.mark.parametrize("cap", CAPTURED, ids=lambda c: c.path.name)
def test_capture_decodes_to_the_named_command(cap: Capture) -> None:
    cmd = cap.decode()
    assert cmd.serialize_type is SerializeType.JSON
    assert cmd.is_response == cap.is_response
    assert cmd.code == cap.code
    assert not cmd.is_oneway  # wire-facts: no client used the oneway flag
    assert cmd.language in LanguageCode.__members__
    assert all(type(k) is str and type(v) is str for k, v in cmd.ext_fields.items())


@pytest.mark.parametrize("cap", CAPTURED, ids=lambda c: c.path.name)
def test_capture_re_encodes_to_an_equivalent_frame(cap: Capture) -> None:
    cmd = cap.decode()
    decoder = FrameDecoder()
    decoder.feed(encode_command(cmd))
    assert decoder.next_command() == cmd


INDEXED = [c for c in CAPTURED if (CAPTURES / c.client / "frames.jsonl").exists()]


@pytest.mark.parametrize("cap", INDEXED, ids=lambda c: c.path.name)
def test_capture_matches_its_recorded_description(cap: Capture) -> None:
    """frames.jsonl describes each frame independently of our decoder; they must agree."""
    index = CAPTURES / cap.client / "frames.jsonl"
    rows = [json.loads(line) for line in index.read_text().splitlines() if line.strip()]
    (row,) = [r for r in rows if r["file"] == cap.path.name]
    cmd = cap.decode()
    assert row["frame_len"] == len(cap.raw)
    assert row["body_len"] == len(cmd.body)
    header = row["header"]
    assert header["code"] == cmd.code and header["opaque"] == cmd.opaque
    assert {
        k: str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in header.get("extFields", {}).items()
        if v is not None
    } == cmd.ext_fields


def test_first_request_of_ali_ons_byte_for_byte() -> None:
    cap = capture("ali-ons-first-request.hex")
    assert cap.raw[:8].hex() == "0000006900000065"
    cmd = cap.decode()
    assert (cmd.code, cmd.opaque, cmd.version, dict(cmd.ext_fields)) == (
        105,
        1,
        121,
        {"topic": "InteropTopic"},
    )


def test_cpp_header_ends_with_a_newline_counted_in_its_length() -> None:
    cap = capture("cpp-client-1.x-first-request.hex")
    header_len = int.from_bytes(cap.raw[5:8], "big")
    assert cap.raw[8 + header_len - 1 : 8 + header_len] == b"\n"
    cmd = cap.decode()
    assert cmd.opaque == 0 and cmd.language == "CPP"
    assert cmd.ext_fields["topic"] == "InteropTopic"


def test_numbers_and_booleans_in_ali_ons_send_become_strings() -> None:
    cmd = capture("ali-ons-02-10911-code310.hex").decode()
    assert cmd.ext_fields["d"] == "4" and cmd.ext_fields["k"] == "false"
    assert cmd.body == b"hello-0-1795306556754"
