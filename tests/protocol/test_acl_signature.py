"""ACL 1.0 request signatures (protocol.acl.signature): golden vectors, the text of JSON
scalars, ``_UNIQUE_KEY_QUERY``, and that any change to a signed byte is caught."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.acl import authorize_request, parse_ip, rules_from_obj
from protocol.acl.signature import (
    ACCESS_KEY,
    SIGNATURE,
    UNIQUE_KEY_QUERY,
    canonical_content,
    sign,
    signature_matches,
    signature_of,
)
from protocol.codes import SerializeType
from protocol.command import RemotingCommand, request
from protocol.frame import FrameDecoder
from protocol.header_codec import decode_json
from tests.protocol.captures import all_captures

SECRET = "12345678"


def test_rocketmq_signer_vector() -> None:
    # RocketMQ's AclSignerTest: HmacSHA1("12345678") over "RocketMQ", Base64.
    assert signature_of(b"RocketMQ", SECRET) == "IUc8rrO/0gDch8CjObLQsW2rsiA="


def _signed_captures() -> list[RemotingCommand]:
    out = []
    for cap in all_captures():
        if not cap.is_response:
            cmd = cap.decode()
            if SIGNATURE in cmd.ext_fields:
                out.append(cmd)
    return out


def test_client_cpp_frames_verify_byte_for_byte() -> None:
    """client-cpp 1.x and 2.1 sign every request, with an empty AccessKey and key when no
    credentials are set: their captured frames (sends with numeric JSON values, pulls,
    heartbeats with bodies) are golden vectors of the whole recipe."""
    signed = _signed_captures()
    assert len(signed) >= 18
    assert {cmd.code for cmd in signed} >= {10, 11, 14, 15, 34, 35, 38, 105, 310}
    for cmd in signed:
        assert cmd.ext_fields[ACCESS_KEY] == ""
        assert signature_matches(cmd, ""), (cmd.code, dict(cmd.ext_fields))
        assert not signature_matches(cmd, SECRET)


def test_json_scalars_are_signed_as_java_text() -> None:
    """ali-ons sends numbers and booleans as JSON scalars and signs their toString()."""
    header = {
        "code": 310,
        "extFields": {"b": "T", "d": 4, "k": False, "m": True, "AccessKey": "RocketMQ"},
        "flag": 0,
        "language": "NODE_JS",
        "opaque": 7,
        "version": 121,
    }
    decoded = decode_json(json.dumps(header).encode())
    cmd = RemotingCommand(*decoded, b"body", SerializeType.JSON)
    assert canonical_content(cmd.ext_fields, cmd.body, version=cmd.version) == (
        b"RocketMQ" + b"T" + b"4" + b"false" + b"true" + b"body"
    )
    # What ali-ons computes: values sorted by key, then the body.
    expected = base64.b64encode(
        hmac.new(SECRET.encode(), b"RocketMQT4falsetruebody", hashlib.sha1).digest()
    ).decode()
    signed = cmd._replace(ext_fields={**cmd.ext_fields, SIGNATURE: expected})
    assert signature_matches(signed, SECRET)


def test_unique_key_query_is_left_out_up_to_v4_9_3() -> None:
    ext = {"topic": "T", UNIQUE_KEY_QUERY: "true"}
    assert canonical_content(ext, b"", version=384) == b"T"
    assert canonical_content(ext, b"", version=0) == b"T"
    # Newer requests sign it like any field: "_UNIQUE_KEY_QUERY" sorts before "topic".
    assert canonical_content(ext, b"", version=385) == b"trueT"


def test_sign_adds_access_key_and_channel_and_replaces_a_signature() -> None:
    cmd = request(10, 1, {"topic": "T", SIGNATURE: "stale"}, b"x")
    signed = sign(cmd, "RocketMQ", SECRET, channel="ALIYUN")
    assert signed.ext_fields[ACCESS_KEY] == "RocketMQ"
    assert signed.ext_fields["OnsChannel"] == "ALIYUN"
    content = b"RocketMQ" + b"ALIYUN" + b"T" + b"x"
    assert signed.ext_fields[SIGNATURE] == signature_of(content, SECRET)
    assert signature_matches(signed, SECRET)
    assert not signature_matches(cmd, SECRET)
    assert cmd.ext_fields[SIGNATURE] == "stale"  # the original is left alone


def test_missing_or_foreign_signatures_fail_without_raising() -> None:
    cmd = request(10, 1, {"topic": "T", ACCESS_KEY: "RocketMQ"})
    assert not signature_matches(cmd, SECRET)
    for junk in ("", "é" * 28, "\udcff", "A" * 10_000):
        bad = cmd._replace(ext_fields={**cmd.ext_fields, SIGNATURE: junk})
        assert not signature_matches(bad, SECRET)


EXT = st.dictionaries(
    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12),
    st.text(max_size=30),
    min_size=1,
    max_size=8,
).filter(lambda d: SIGNATURE not in d)


@given(EXT, st.binary(max_size=200), st.data())
def test_any_change_to_a_value_or_the_body_fails(
    ext: dict[str, str], body: bytes, data: st.DataObject
) -> None:
    signed = sign(request(310, 1, ext, body), "RocketMQ", SECRET)
    assert signature_matches(signed, SECRET)
    key = data.draw(st.sampled_from(sorted(signed.ext_fields)))
    if key == SIGNATURE:
        return
    value = signed.ext_fields[key]
    changed = data.draw(st.text(max_size=30).filter(lambda v: v != value))
    tampered = signed._replace(ext_fields={**signed.ext_fields, key: changed})
    assert not signature_matches(tampered, SECRET)
    if body:
        i = data.draw(st.integers(0, len(body) - 1))
        flipped = body[:i] + bytes([body[i] ^ 0x01]) + body[i + 1 :]
        assert not signature_matches(signed._replace(body=flipped), SECRET)
    assert not signature_matches(signed._replace(body=body + b"!"), SECRET)
    assert not signature_matches(signed, SECRET + "x")


@pytest.mark.parametrize("version", [0, 121, 333, 384, 385, 500])
def test_sign_and_verify_agree_on_every_version(version: int) -> None:
    cmd = request(12, 1, {"topic": "T", UNIQUE_KEY_QUERY: "true"}, version=version)
    assert signature_matches(sign(cmd, "RocketMQ", SECRET), SECRET)


ACL_CAPTURES = Path(__file__).resolve().parent.parent / "fixtures" / "acl_captures"


def _acl_capture(path: Path) -> RemotingCommand:
    decoder = FrameDecoder()
    decoder.feed(bytes.fromhex(path.read_text().strip()))
    cmd = decoder.next_command()
    assert cmd is not None and decoder.buffered == 0
    return cmd


@pytest.mark.parametrize("client", ["ali-ons", "cpp-1.x", "cpp-2.1"])
def test_frames_signed_by_the_real_clients_verify(client: str) -> None:
    """Golden vectors: every request the real clients signed with AccessKey RocketMQ and
    SecretKey 12345678 (tests/fixtures/acl_captures/README.md) verifies with that secret
    only, and the broker's rules for that capture allow each one."""
    rules = rules_from_obj(
        {
            "accounts": [
                {
                    "accessKey": "RocketMQ",
                    "secretKey": 12345678,
                    "topicPerms": ["AclCaptureTopic=PUB|SUB"],
                    "groupPerms": ["acl_capture_consumer=SUB"],
                }
            ]
        }
    )
    frames = [_acl_capture(p) for p in sorted((ACL_CAPTURES / client).glob("*.hex"))]
    codes = {cmd.code for cmd in frames}
    assert codes >= {11, 14, 34, 35, 38, 105} and codes & {10, 310}
    for cmd in frames:
        assert cmd.ext_fields[ACCESS_KEY] == "RocketMQ"
        assert signature_matches(cmd, SECRET), (cmd.code, dict(cmd.ext_fields))
        assert not signature_matches(cmd, SECRET + "9")
        assert authorize_request(rules, cmd, parse_ip("127.0.0.1")) is None, cmd.code
        forged = cmd._replace(body=cmd.body + b" ")
        assert authorize_request(rules, forged, parse_ip("127.0.0.1")) is not None
