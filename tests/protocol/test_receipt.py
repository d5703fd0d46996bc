"""Pop receipts (ExtraInfo) and the offset-info strings: round trips, Java examples, bad input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import EncodeError, ReceiptError
from protocol.receipt import (
    POP_ORDER_REVIVE_QUEUE,
    ExtraInfo,
    MsgOffsets,
    OrderCount,
    QueueKey,
    RetryFlag,
    StartOffset,
    build_msg_offset_info,
    build_order_count_info,
    build_start_offset_info,
    order_count_for,
    parse_msg_offset_info,
    parse_order_count_info,
    parse_start_offset_info,
    plain_receipt,
)

LONGS = st.integers(-(2**63), 2**63 - 1)
INTS = st.integers(-(2**31), 2**31 - 1)
FLAGS = st.sampled_from(RetryFlag)
BROKER_NAMES = st.text(min_size=1, max_size=30).filter(lambda s: " " not in s)
NORMAL, V1, V2 = RetryFlag.NORMAL, RetryFlag.RETRY_V1, RetryFlag.RETRY_V2


@st.composite
def receipts(
    draw: st.DrawFn, flag: RetryFlag | None = None, with_offset: bool | None = None
) -> ExtraInfo:
    """Any receipt; ``flag`` and ``with_offset`` pin the retry flag and the 8th field."""
    has_offset = draw(st.booleans()) if with_offset is None else with_offset
    return ExtraInfo(
        ck_queue_offset=draw(LONGS),
        pop_time_ms=draw(LONGS),
        invisible_time_ms=draw(LONGS),
        revive_qid=draw(INTS),
        retry_flag=draw(FLAGS) if flag is None else flag,
        broker_name=draw(BROKER_NAMES),
        queue_id=draw(INTS),
        queue_offset=draw(LONGS) if has_offset else None,
    )


# ------------------------------------------------------------------ ExtraInfo
@pytest.mark.parametrize("flag", list(RetryFlag))
@pytest.mark.parametrize("with_offset", [True, False])
@given(data=st.data())
def test_receipt_round_trip(flag: RetryFlag, with_offset: bool, data: st.DataObject) -> None:
    info = data.draw(receipts(flag, with_offset))
    text = info.encode()
    assert ExtraInfo.decode(text) == info
    assert len(text.split(" ")) == (8 if with_offset else 7)
    assert text.split(" ")[4] == str(int(flag))


def test_java_extra_info_getters_example() -> None:
    # ExtraInfoUtilTest.testExtraInfoGetters:
    # buildExtraInfo(100L, 1690000000000L, 60000L, 3, "TOPIC", "broker-a", 2, 101L)
    info = ExtraInfo.decode("100 1690000000000 60000 3 0 broker-a 2 101")
    assert info == ExtraInfo(100, 1690000000000, 60000, 3, NORMAL, "broker-a", 2, 101)
    assert info.deadline_ms == 1690000060000
    assert not info.is_order
    assert not info.is_retry


def test_seven_field_form_and_order_flag() -> None:
    info = ExtraInfo.decode(f"5 1000 30000 {POP_ORDER_REVIVE_QUEUE} 1 broker-b 7")
    assert info.queue_offset is None
    assert info.is_order
    assert info.retry_flag is V1
    assert info.encode() == f"5 1000 30000 {POP_ORDER_REVIVE_QUEUE} 1 broker-b 7"


@pytest.mark.parametrize(
    ("flag", "v2", "expected"),
    [
        (NORMAL, None, "Order_Topic"),
        (V1, None, "%RETRY%MyGroup_Order_Topic"),
        (V2, None, "%RETRY%MyGroup+Order_Topic"),
        (V1, True, "%RETRY%MyGroup+Order_Topic"),
        (V2, False, "%RETRY%MyGroup_Order_Topic"),
        (NORMAL, True, "Order_Topic"),
    ],
)
def test_real_topic(flag: RetryFlag, v2: bool | None, expected: str) -> None:
    info = ExtraInfo(0, 0, 0, 0, flag, "b", 0, 0)
    assert info.real_topic("Order_Topic", "MyGroup", v2=v2) == expected


@pytest.mark.parametrize(
    ("topic", "flag"),
    [("T", NORMAL), ("%RETRY%g", V1), ("%RETRY%g_t", V1), ("%RETRY%g+t", V2), ("%DLQ%g", NORMAL)],
)
def test_retry_flag_of_topic(topic: str, flag: RetryFlag) -> None:
    assert RetryFlag.of_topic(topic) is flag


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "empty"),
        ("1 2 3 4 0 broker", "6 space-separated fields"),
        ("1 2 3 4 0 broker 5 6 7", "9 space-separated fields"),
        ("1 2 3 4 0  5", "brokerName is empty"),
        (" 1 2 3 4 0 b 5", "ckQueueOffset is empty"),
        ("1 2 3 4 0 b 5 ", "msgQueueOffset is empty"),
        ("1 2  3 4 0 b 5", "invisibleTime is empty"),
        ("x 2 3 4 0 b 5", "ckQueueOffset is not a canonical decimal"),
        ("1 2.5 3 4 0 b 5", "popTime is not a canonical decimal"),
        ("1 2 +3 4 0 b 5", "invisibleTime is not a canonical decimal"),
        ("1 2 3 04 0 b 5", "reviveQid is not a canonical decimal"),
        ("1 2 3 4 0 b -0", "queueId is not a canonical decimal"),
        ("1 2 3 4 0 b \u0665", "queueId is not a canonical decimal"),  # Arabic-Indic 5
        ("1 2 3 4 3 b 5", "retryFlag must be 0, 1 or 2"),
        ("1 2 3 4 true b 5", "retryFlag must be 0, 1 or 2"),
        ("1 2 3 2147483648 0 b 5", "reviveQid 2147483648 is out of the Java int range"),
        ("1 2 3 4 0 b -2147483649", "queueId -2147483649 is out of the Java int range"),
        ("9223372036854775808 2 3 4 0 b 5", "out of the Java long range"),
        ("1 2 3 4 0 b 5 -9223372036854775809", "msgQueueOffset -9223372036854775809 is out"),
        ("1 2 3 4 0 b 5 123456789012345678901234", "msgQueueOffset is not a canonical"),
        ("1\t2 3 4 0 b 5", "6 space-separated fields"),
    ],
)
def test_malformed_receipts(text: str, fragment: str) -> None:
    with pytest.raises(ReceiptError, match=fragment.replace("+", r"\+")):
        ExtraInfo.decode(text)


def test_java_range_boundaries_decode() -> None:
    text = "-9223372036854775808 9223372036854775807 0 -2147483648 2 b 2147483647"
    info = ExtraInfo.decode(text)
    assert (info.ck_queue_offset, info.revive_qid, info.queue_id) == (-(2**63), -(2**31), 2**31 - 1)
    assert info.encode() == text


@given(st.text(max_size=80) | st.text(alphabet="0123456789- b\t+", max_size=60))
def test_fuzz_decode_raises_only_receipt_error(text: str) -> None:
    try:
        info = ExtraInfo.decode(text)
    except ReceiptError:
        return
    assert info.encode() == text  # anything accepted is canonical


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"broker_name": "broker a"}, "without spaces"),
        ({"broker_name": ""}, "non-empty"),
        ({"pop_time_ms": 2**63}, "popTime .* out of the Java long"),
        ({"queue_id": -(2**31) - 1}, "queueId .* out of the Java int"),
        ({"revive_qid": True}, "reviveQid must be an int"),
        ({"queue_offset": 2**63}, "msgQueueOffset"),
        ({"retry_flag": 3}, "retryFlag must be a RetryFlag"),
    ],
)
def test_encode_rejects_bad_values(changes: dict[str, object], fragment: str) -> None:
    fields: dict[str, object] = {
        "ck_queue_offset": 1,
        "pop_time_ms": 2,
        "invisible_time_ms": 3,
        "revive_qid": 4,
        "retry_flag": NORMAL,
        "broker_name": "b",
        "queue_id": 5,
        "queue_offset": 6,
    }
    fields.update(changes)
    info = ExtraInfo(**fields)  # type: ignore[arg-type]
    with pytest.raises(EncodeError, match=fragment):
        info.encode()


# ------------------------------------------------------------------ offset-info strings
START_OFFSETS = st.lists(
    st.builds(StartOffset, FLAGS, INTS, LONGS), max_size=8, unique_by=lambda e: (e[0], e[1])
)
MSG_OFFSETS = st.lists(
    st.builds(MsgOffsets, FLAGS, INTS, st.lists(LONGS, min_size=1, max_size=5).map(tuple)),
    max_size=8,
    unique_by=lambda e: (e[0], e[1]),
)
ORDER_COUNTS = st.lists(
    st.builds(OrderCount, FLAGS, INTS, st.none() | LONGS, INTS),
    max_size=8,
    unique_by=lambda e: (e[0], e[1], e[2]),
)


@given(START_OFFSETS)
def test_start_offset_info_round_trip(entries: list[StartOffset]) -> None:
    text = build_start_offset_info(entries)
    parsed = parse_start_offset_info(text)
    assert parsed == {QueueKey(e.retry_flag, e.queue_id): e.start_offset for e in entries}
    rebuilt = build_start_offset_info(StartOffset(k[0], k[1], v) for k, v in parsed.items())
    assert rebuilt == text


@given(MSG_OFFSETS)
def test_msg_offset_info_round_trip(entries: list[MsgOffsets]) -> None:
    text = build_msg_offset_info(entries)
    parsed = parse_msg_offset_info(text)
    assert parsed == {QueueKey(e.retry_flag, e.queue_id): tuple(e.offsets) for e in entries}
    assert build_msg_offset_info(MsgOffsets(k[0], k[1], v) for k, v in parsed.items()) == text


@given(ORDER_COUNTS)
def test_order_count_info_round_trip(entries: list[OrderCount]) -> None:
    text = build_order_count_info(entries)
    parsed = parse_order_count_info(text)
    assert parsed == {QueueKey(e[0], e[1], e[2]): e.order_count for e in entries}
    rebuilt = build_order_count_info(OrderCount(k[0], k[1], k[2], v) for k, v in parsed.items())
    assert rebuilt == text


def test_java_order_count_info_example() -> None:
    # ExtraInfoUtilTest.testOrderCountInfo: queue-level count 1, then offset 1234 count 2.
    text = build_order_count_info([OrderCount(NORMAL, 0, None, 1), OrderCount(NORMAL, 0, 1234, 2)])
    assert text == "0 0 1;0 qo0%1234 2"
    parsed = parse_order_count_info(text)
    assert {k.java_key: v for k, v in parsed.items()} == {"0@0": 1, "0@qo0%1234": 2}
    assert order_count_for(parsed, NORMAL, 0, 1234) == 2
    assert order_count_for(parsed, NORMAL, 0, 99) == 1  # falls back to the queue's count
    assert order_count_for(parsed, V1, 0, 1234) is None


def test_java_start_and_msg_offset_examples() -> None:
    # testStartOffsetInfoRoundTrip: "TOPIC" queue 0 at 100, V2 retry topic queue 1 at 200.
    text = build_start_offset_info([StartOffset(NORMAL, 0, 100), StartOffset(V2, 1, 200)])
    assert text == "0 0 100;2 1 200"
    assert {k.java_key: v for k, v in parse_start_offset_info(text).items()} == {
        "0@0": 100,
        "2@1": 200,
    }
    # testMsgOffsetInfoRoundTrip
    text = build_msg_offset_info([MsgOffsets(NORMAL, 0, [1, 2, 3]), MsgOffsets(NORMAL, 1, [9])])
    assert text == "0 0 1,2,3;0 1 9"
    assert parse_msg_offset_info(text) == {
        QueueKey(NORMAL, 0): (1, 2, 3),
        QueueKey(NORMAL, 1): (9,),
    }


PARSERS = [parse_start_offset_info, parse_msg_offset_info, parse_order_count_info]


@pytest.mark.parametrize("parse", PARSERS)
@pytest.mark.parametrize(
    "bad",
    # ExtraInfoUtilTest.testParseMalformedEntriesThrow, then our stricter cases.
    [
        "0 1",
        "0 1 2 3",
        " 0 1",
        "0  1",
        "0 1 ",
        "0 1 2;",
        ";0 1 2",
        "0 1 2;;0 2 3",
        "5 1 2",
        "0 x 2",
    ],
)
def test_malformed_offset_info(parse: Callable[[str], object], bad: str) -> None:
    with pytest.raises(ReceiptError):
        parse(bad)


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (parse_start_offset_info, "0 1 5;0 1 6"),
        (parse_msg_offset_info, "1 3 5,6;1 3 7"),
        (parse_order_count_info, "0 qo1%5 1;0 qo1%5 2"),
        (parse_order_count_info, "0 1 1;0 1 2"),
    ],
)
def test_duplicate_keys_rejected(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(ReceiptError, match="duplicate"):
        parse(text)


def test_distinct_flags_are_distinct_keys() -> None:
    assert len(parse_start_offset_info("0 1 5;1 1 6;2 1 7")) == 3
    assert len(parse_order_count_info("0 1 1;0 qo1%1 1")) == 2


@pytest.mark.parametrize(
    ("parse", "bad", "fragment"),
    [
        (parse_msg_offset_info, "0 1 1,,2", "offset is not a canonical"),
        (parse_msg_offset_info, "0 1 ,1", "offset is not a canonical"),
        (parse_msg_offset_info, "0 1 1,", "offset is not a canonical"),
        (parse_start_offset_info, "0 1 01", "startOffset is not a canonical"),
        (parse_start_offset_info, "0 2147483648 1", "queueId 2147483648 is out"),
        (parse_order_count_info, "0 qo1%-0 1", "queueId is not a canonical"),
        (parse_order_count_info, "0 qo%1 1", "queueId is not a canonical"),
        (parse_order_count_info, "0 1 2147483648", "count 2147483648 is out"),
        (parse_order_count_info, "3 1 1", "retryFlag must be 0, 1 or 2"),
    ],
)
def test_malformed_values(parse: Callable[[str], object], bad: str, fragment: str) -> None:
    with pytest.raises(ReceiptError, match=fragment):
        parse(bad)


def test_empty_strings() -> None:
    assert parse_start_offset_info("") == {}
    assert parse_msg_offset_info("") == {}
    assert parse_order_count_info("") == {}
    assert build_start_offset_info([]) == ""


def test_build_rejects_what_parse_would() -> None:
    with pytest.raises(EncodeError, match="duplicate"):
        build_start_offset_info([StartOffset(NORMAL, 1, 5), StartOffset(NORMAL, 1, 6)])
    with pytest.raises(EncodeError, match="no offsets"):
        build_msg_offset_info([MsgOffsets(NORMAL, 1, [])])
    with pytest.raises(EncodeError, match="count"):
        build_order_count_info([OrderCount(NORMAL, 1, None, 2**31)])
    with pytest.raises(EncodeError, match="retryFlag"):
        build_start_offset_info([StartOffset(7, 1, 5)])  # type: ignore[arg-type]


def _rebuild(parse: Callable[[str], object], text: str) -> str:
    """Parse ``text`` and build it again from the parsed dict."""
    if parse is parse_start_offset_info:
        starts = parse_start_offset_info(text)
        return build_start_offset_info(StartOffset(k[0], k[1], v) for k, v in starts.items())
    if parse is parse_msg_offset_info:
        msgs = parse_msg_offset_info(text)
        return build_msg_offset_info(MsgOffsets(k[0], k[1], v) for k, v in msgs.items())
    counts = parse_order_count_info(text)
    return build_order_count_info(OrderCount(k[0], k[1], k[2], v) for k, v in counts.items())


@given(st.text(max_size=60) | st.text(alphabet="0123 ;,%qo-", max_size=40))
def test_fuzz_offset_info_raises_only_receipt_error(text: str) -> None:
    for parse in PARSERS:
        try:
            rebuilt = _rebuild(parse, text)
        except ReceiptError:
            continue
        assert rebuilt == text  # anything accepted is canonical


# ------------------------------------------------------------------ the plain-receipt fast path
_RECEIPT_PARTS = st.one_of(
    st.integers(-5, 10**19).map(str),
    st.sampled_from(["0", "00", "01", "-0", "+1", "1_0", " 1", "١", "", "2", "3", "999999999",
                     "1000000000", "999999999999999999", "1000000000000000000"]),
    st.text(max_size=8),
)  # fmt: skip


@given(st.lists(_RECEIPT_PARTS, min_size=6, max_size=9))
def test_plain_receipt_equals_the_checked_decode(parts: list[str]) -> None:
    """The fast path either declines or gives exactly what the field by field decode gives
    (and then the receipt re-encodes to the same text)."""
    text = " ".join(parts)
    plain = plain_receipt(text)
    if plain is None:
        return
    checked = ExtraInfo._decode_checked(text)
    assert ExtraInfo(*plain) == checked
    assert checked.encode() == text


@given(receipts())
def test_plain_receipt_takes_what_the_broker_writes(info: ExtraInfo) -> None:
    text = info.encode()
    plain = plain_receipt(text)
    fields = (info.ck_queue_offset, info.pop_time_ms, info.invisible_time_ms, info.revive_qid,
              info.queue_id, info.queue_offset or 0)  # fmt: skip
    if all(0 <= v < 10**9 for v in fields):
        assert plain is not None
    if plain is not None:
        assert ExtraInfo(*plain) == info == ExtraInfo._decode_checked(text)
        assert type(plain[4]) is RetryFlag
