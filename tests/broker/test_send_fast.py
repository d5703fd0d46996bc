"""The SEND_MESSAGE_V2 fast paths of the Remoting send processor give exactly what the typed
header gives (issue 15): the request read straight from ``extFields``, and the SEND_OK
header written without building the typed response header."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.remoting.processors.send import (
    _STATUS_CODES,
    _plain_v2_request,
    _reply,
    _stored_ext,
    _typed_request,
)
from broker.store.api import PutResult, PutStatus
from protocol.codes import RequestCode
from protocol.command import request
from protocol.errors import FieldError
from protocol.headers.send import SendMessageResponseHeader

PEER = "10.1.2.3:40404"
HOST = ("10.1.2.3", 40404)
#: What RocketMQ's Java producer writes for an ordinary send.
JAVA_EXT = {
    "a": "pg",
    "b": "orders",
    "c": "TBW102",
    "d": "4",
    "e": "2",
    "f": "0",
    "g": "1764000000123",
    "h": "0",
    "i": "UNIQ_KEY\x01AC1100\x02WAIT\x01true\x02",
    "j": "0",
    "k": "false",
    "m": "false",
    "n": "broker-a",
}
#: Values each field may take in the property test: absent (None), plain, and the edges
#: the typed header treats differently (signs, lengths, spellings).
VALUES = [None, "", "0", "7", "-1", "+3", "123456789", "1234567890", "2147483648",
          "999999999999999999", "9223372036854775808", "true", "FALSE", "1", "x", "٣"]  # fmt: skip


def _typed(ext: dict[str, str]) -> object:
    cmd = request(RequestCode.SEND_MESSAGE_V2, 1, ext, b"body")
    try:
        return _typed_request(cmd, PEER)
    except FieldError as exc:
        return exc


def test_a_java_header_takes_the_fast_path_and_matches_the_typed_one() -> None:
    fast = _plain_v2_request(JAVA_EXT, b"body", HOST)
    assert fast is not None
    assert fast == _typed(JAVA_EXT)


def test_an_empty_optional_number_is_left_to_the_typed_header() -> None:
    ext = {**JAVA_EXT, "l": ""}
    assert _plain_v2_request(ext, b"body", HOST) is None
    assert isinstance(_typed(ext), FieldError)


def test_optional_fields_absent() -> None:
    ext = {k: v for k, v in JAVA_EXT.items() if k not in "ijklmn"}
    fast = _plain_v2_request(ext, b"body", HOST)
    assert fast is not None
    assert fast == _typed(ext)
    assert fast.properties_text is None and fast.max_reconsume_times is None


@settings(max_examples=400)
@given(
    st.dictionaries(st.sampled_from(sorted("abcdefghijklmn")), st.sampled_from(VALUES), max_size=14)
)
def test_fast_path_is_none_or_the_typed_request(changes: dict[str, str | None]) -> None:
    ext = dict(JAVA_EXT)
    for key, value in changes.items():
        if value is None:
            ext.pop(key, None)
        else:
            ext[key] = value
    fast = _plain_v2_request(ext, b"body", HOST)
    if fast is not None:  # else the typed header decodes it, or refuses it
        assert fast == _typed(ext)


@given(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**40))
def test_stored_ext_is_the_typed_response_header(queue_id: int, offset: int, phys: int) -> None:
    result = PutResult(PutStatus.PUT_OK, phys, 200, offset, 1, "", ("127.0.0.1", 10911))
    typed = SendMessageResponseHeader(
        msg_id=result.msg_id, queue_id=queue_id, queue_offset=offset
    ).to_ext()
    ours = _stored_ext(result, queue_id)
    assert ours == typed
    assert list(ours) == list(typed)


def test_send_ok_reply_is_the_table_s() -> None:
    cmd = request(RequestCode.SEND_MESSAGE_V2, 9, JAVA_EXT, b"body")
    result = PutResult(PutStatus.PUT_OK, 4096, 200, 17, 1, "", ("127.0.0.1", 10911))
    assert result.stored
    expected = cmd.response(
        _STATUS_CODES[PutStatus.PUT_OK],
        None,
        SendMessageResponseHeader(msg_id=result.msg_id, queue_id=2, queue_offset=17).to_ext(),
    )
    assert _reply(cmd, result, 2) == expected
