"""The pull processor's fast paths give exactly what the typed headers give (issue 15): the
request read straight from ``extFields``, and the response header written out."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.pull import PullRequest
from broker.remoting.processors.pull import (
    _plain_request,
    _response_ext,
    hold_ms,
    pull_request,
)
from broker.store.api import GetResult, GetStatus
from protocol.errors import FieldError
from protocol.headers.pull import PullMessageRequestHeader, PullMessageResponseHeader

#: What RocketMQ's Java push consumer writes.
JAVA_EXT = {
    "consumerGroup": "cg",
    "topic": "orders",
    "queueId": "3",
    "queueOffset": "1200",
    "maxMsgNums": "32",
    "sysFlag": "7",
    "commitOffset": "1100",
    "suspendTimeoutMillis": "15000",
    "subscription": "TagA || TagB",
    "subVersion": "1764000000123",
    "expressionType": "TAG",
    "bname": "broker-a",
}
FIELDS = sorted([*JAVA_EXT, "maxMsgBytes", "requestSource", "proxyFrowardClientId", "liteTopic"])
VALUES = [None, "", "0", "1", "2", "4", "7", "-1", "+3", "123456789", "1234567890",
          "999999999999999999", "9223372036854775808", "x", "٣", "SQL92"]  # fmt: skip


def _typed(ext: dict[str, str]) -> tuple[PullRequest, int] | FieldError:
    try:
        header = PullMessageRequestHeader.from_ext(ext)
    except FieldError as exc:
        return exc
    return pull_request(header), hold_ms(header)


def test_a_java_pull_takes_the_fast_path() -> None:
    fast = _plain_request(JAVA_EXT)
    assert fast is not None
    assert fast == _typed(JAVA_EXT)
    assert fast[0].commit_offset == 1100 and fast[1] == 15000


@settings(max_examples=400)
@given(st.dictionaries(st.sampled_from(FIELDS), st.sampled_from(VALUES), max_size=8))
def test_fast_path_is_none_or_the_typed_request(changes: dict[str, str | None]) -> None:
    ext = dict(JAVA_EXT)
    for key, value in changes.items():
        if value is None:
            ext.pop(key, None)
        else:
            ext[key] = value
    fast = _plain_request(ext)
    if fast is not None:
        assert fast == _typed(ext)


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_response_ext_is_the_typed_header(nxt: int, low: int, high: int) -> None:
    result = GetResult(GetStatus.FOUND, nxt, low, high)
    typed = PullMessageResponseHeader(
        suggest_which_broker_id=0, next_begin_offset=nxt, min_offset=low, max_offset=high
    ).to_ext()
    ours = _response_ext(result)
    assert ours == typed
    assert list(ours) == list(typed)
