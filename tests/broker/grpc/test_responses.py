"""Responses the gRPC service writes as bytes (broker.grpc.service.send_response,
broker.grpc.status.status_bytes) against the same responses built with protobuf, the way
the service built them before: the bytes parse to the same message, field presence
included, and are the same bytes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.grpc.service import SendResult, send_response
from broker.grpc.status import status, status_bytes
from protocol.grpc import schema
from protocol.grpc.codes import Code

_CODES = st.sampled_from([Code.OK, Code.BAD_REQUEST, Code.MESSAGE_BODY_EMPTY, Code.FORBIDDEN])
_TEXT = st.text(max_size=20)


def _protobuf_response(results: list[SendResult]) -> Any:
    """SendMessageResponse as the service built it with protobuf (an entry per result, the
    message id and offsets only on what it set)."""
    out = schema.SendMessageResponse()
    for result in results:
        entry = out.entries.add()
        entry.status.CopyFrom(status(result.code, result.message))
        if result.message_id:
            entry.message_id = result.message_id
        entry.offset = result.offset
        if result.transaction_id:
            entry.transaction_id = result.transaction_id
        if result.recall_handle:
            entry.recall_handle = result.recall_handle
    codes = {e.status.code for e in out.entries}
    first = out.entries[0].status
    out.status.CopyFrom(first if len(codes) == 1 else status(Code.MULTIPLE_RESULTS))
    return out


_RESULTS = st.builds(
    SendResult,
    _CODES,
    st.one_of(st.just(""), _TEXT),
    _TEXT,
    st.one_of(st.integers(0, 2**63 - 1), st.integers(-(2**63), -1), st.just(0)),
    _TEXT,
    _TEXT,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_RESULTS, min_size=1, max_size=4))
def test_a_send_response_written_by_hand_is_the_one_protobuf_builds(
    results: list[SendResult],
) -> None:
    ours = send_response(results)
    expected = _protobuf_response(results)
    assert schema.SendMessageResponse.FromString(ours) == expected
    assert ours == expected.SerializeToString()


def test_the_usual_answer_one_stored_message() -> None:
    results = [SendResult(Code.OK, "", "01ABCDEF", 1234)]
    parsed = schema.SendMessageResponse.FromString(send_response(results))
    assert (parsed.status.code, parsed.status.message) == (Code.OK, "OK")
    entry = parsed.entries[0]
    assert (entry.status.code, entry.message_id, entry.offset) == (Code.OK, "01ABCDEF", 1234)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(Code)), st.one_of(st.just(""), st.text(max_size=30)))
def test_a_status_written_by_hand_is_the_one_protobuf_builds(code: Code, message: str) -> None:
    assert status_bytes(code, message) == status(code, message).SerializeToString()
