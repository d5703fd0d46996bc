"""Typed headers: round trips, the wire names Java uses, real captured frames, and errors that
name the bad field."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import protocol.headers as headers_pkg
from protocol.codes import RequestCode, ResponseCode, SerializeType
from protocol.command import RemotingCommand, request
from protocol.errors import EncodeError, FieldError, ProtocolError
from protocol.frame import FrameDecoder, encode_command
from protocol.headers import (
    REQUEST_HEADERS,
    RESPONSE_HEADERS,
    V2_SEND_CODES,
    V2_WIRE_NAMES,
    AckMessageRequestHeader,
    Codec,
    ConsumerSendMsgBackRequestHeader,
    CreateTopicRequestHeader,
    FieldInfo,
    FieldKind,
    GetMaxOffsetRequestHeader,
    GetRouteInfoRequestHeader,
    Header,
    Long,
    PopMessageRequestHeader,
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    PullSysFlag,
    QueryConsumerOffsetRequestHeader,
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
    build_pull_sys_flag,
    clear_commit_offset_flag,
    decode_request_header,
    fields_of,
    from_ext,
    meta,
    send_header_from_v2_ext,
    send_header_to_v2_ext,
    to_ext,
)
from tests.protocol.captures import Capture, all_captures, capture


def _exported_headers() -> list[type[Header]]:
    exported = [getattr(headers_pkg, name) for name in headers_pkg.__all__]
    found = [
        o for o in exported if isinstance(o, type) and issubclass(o, Header) and o is not Header
    ]
    return sorted(found, key=lambda c: c.__name__)


ALL_HEADERS = _exported_headers()

# ------------------------------------------------------------------ strategies
_KINDS: dict[FieldKind, st.SearchStrategy[Any]] = {
    FieldKind.STR: st.text(max_size=30),
    FieldKind.INT: st.integers(-(2**31), 2**31 - 1),
    FieldKind.LONG: st.integers(-(2**63), 2**63 - 1),
    FieldKind.BOOL: st.booleans(),
}


def _values(info: FieldInfo) -> st.SearchStrategy[Any]:
    if info.choices is not None:
        base: st.SearchStrategy[Any] = st.sampled_from(sorted(info.choices, key=repr))
    else:
        base = _KINDS[info.kind]
    return st.none() | base if info.nullable else base


def instances(cls: type[Header]) -> st.SearchStrategy[Header]:
    """Any instance of a header class, every field within its Java type's range."""
    return st.builds(cls, **{info.name: _values(info) for info in fields_of(cls)})


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("cls", ALL_HEADERS, ids=lambda c: c.__name__)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_header_round_trips(cls: type[Header], data: st.DataObject) -> None:
    header = data.draw(instances(cls))
    ext = header.to_ext()
    assert all(type(v) is str for v in ext.values())
    assert cls.from_ext(ext) == header
    assert from_ext(cls, to_ext(header)) == header


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.ROCKETMQ])
@pytest.mark.parametrize("cls", ALL_HEADERS, ids=lambda c: c.__name__)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_header_round_trips_through_a_frame(
    cls: type[Header], stype: SerializeType, data: st.DataObject
) -> None:
    header = data.draw(instances(cls))
    decoder = FrameDecoder()
    decoder.feed(encode_command(request(10, 1, header.to_ext(), serialize_type=stype)))
    cmd = decoder.next_command()
    assert cmd is not None and cls.from_ext(cmd.ext_fields) == header


@settings(max_examples=100, deadline=None)
@given(header=instances(SendMessageRequestHeader))
def test_send_header_v2_round_trip(header: Header) -> None:
    assert isinstance(header, SendMessageRequestHeader)
    v2 = send_header_to_v2_ext(header)
    assert set(v2) <= set("abcdefghijklmn")
    assert send_header_from_v2_ext(v2) == header
    assert SendMessageRequestHeader.from_v2_ext(header.to_v2_ext()) == header
    # The same fields as V1, renamed (brokerName is "bname" in V1, "n" in V2).
    v1_wire = {i.name: i.wire for i in fields_of(SendMessageRequestHeader)}
    letter_to_long = {V2_WIRE_NAMES[name]: wire for name, wire in v1_wire.items()}
    assert {letter_to_long[k]: v for k, v in v2.items()} == header.to_ext()


# ------------------------------------------------------------------ wire names as in Java
# "name" is a String, ":i" an int, ":l" a long, ":b" a boolean; "!" marks @CFNotNull
# (required). Checked against apache/rocketmq remoting/.../protocol/header/*.java.
JAVA_FIELDS: dict[str, str] = {
    "SendMessageRequestHeader": "producerGroup! topic! defaultTopic! defaultTopicQueueNums!:i "
    "queueId!:i sysFlag!:i bornTimestamp!:l flag!:i properties reconsumeTimes:i unitMode:b "
    "batch:b maxReconsumeTimes:i bname",
    "SendMessageResponseHeader": "msgId! queueId!:i queueOffset!:l transactionId batchUniqId "
    "recallHandle delayTime:l",
    "ConsumerSendMsgBackRequestHeader": "offset!:l group! delayLevel!:i originMsgId originTopic "
    "unitMode:b maxReconsumeTimes:i",
    "PullMessageRequestHeader": "consumerGroup! topic! queueId!:i queueOffset!:l maxMsgNums!:i "
    "sysFlag!:i commitOffset!:l suspendTimeoutMillis!:l subscription subVersion!:l "
    "expressionType maxMsgBytes:i requestSource:i proxyFrowardClientId liteTopic",
    "PullMessageResponseHeader": "suggestWhichBrokerId!:l nextBeginOffset!:l minOffset!:l "
    "maxOffset!:l offsetDelta:l topicSysFlag:i groupSysFlag:i forbiddenType:i",
    "QueryConsumerOffsetRequestHeader": "consumerGroup! topic! queueId!:i setZeroIfNotFound:b",
    "QueryConsumerOffsetResponseHeader": "offset!:l",
    "UpdateConsumerOffsetRequestHeader": "consumerGroup! topic! queueId!:i commitOffset!:l",
    "GetMaxOffsetRequestHeader": "topic! queueId!:i committed:b",
    "GetMaxOffsetResponseHeader": "offset!:l",
    "GetMinOffsetRequestHeader": "topic! queueId!:i",
    "GetMinOffsetResponseHeader": "offset!:l",
    "SearchOffsetRequestHeader": "topic! queueId!:i timestamp!:l boundaryType",
    "SearchOffsetResponseHeader": "offset!:l",
    "GetEarliestMsgStoretimeRequestHeader": "topic! queueId!:i",
    "GetEarliestMsgStoretimeResponseHeader": "timestamp!:l",
    "UnregisterClientRequestHeader": "clientID! producerGroup consumerGroup",
    "GetConsumerListByGroupRequestHeader": "consumerGroup!",
    "NotifyConsumerIdsChangedRequestHeader": "consumerGroup!",
    "GetRouteInfoRequestHeader": "topic! acceptStandardJsonOnly:b",
    "GetTopicsByClusterRequestHeader": "cluster!",
    "RegisterBrokerRequestHeader": "brokerName! brokerAddr! clusterName! haServerAddr! "
    "brokerId!:l heartbeatTimeoutMillis:l enableActingMaster:b compressed:b bodyCrc32:i",
    "RegisterBrokerResponseHeader": "haServerAddr masterAddr",
    "UnRegisterBrokerRequestHeader": "brokerName! brokerAddr! clusterName! brokerId!:l",
    "GetKVConfigRequestHeader": "namespace! key!",
    "GetKVConfigResponseHeader": "value",
    "PutKVConfigRequestHeader": "namespace! key! value!",
    "DeleteKVConfigRequestHeader": "namespace! key!",
    "GetKVListByNamespaceRequestHeader": "namespace!",
    "PopMessageRequestHeader": "consumerGroup! topic! queueId!:i maxMsgNums!:i invisibleTime!:l "
    "pollTime!:l bornTime!:l initMode!:i expType exp order:b attemptId",
    "PopMessageResponseHeader": "popTime!:l invisibleTime!:l reviveQid!:i restNum!:l "
    "startOffsetInfo msgOffsetInfo orderCountInfo",
    "AckMessageRequestHeader": "consumerGroup! topic! queueId!:i extraInfo! offset!:l",
    "ChangeInvisibleTimeRequestHeader": "consumerGroup! topic! queueId!:i extraInfo! offset!:l "
    "invisibleTime!:l liteTopic",
    "ChangeInvisibleTimeResponseHeader": "popTime!:l invisibleTime!:l reviveQid!:i",
    "CreateTopicRequestHeader": "topic! defaultTopic! readQueueNums!:i writeQueueNums!:i "
    "perm!:i topicFilterType! topicSysFlag:i order!:b attributes force:b",
    "DeleteTopicRequestHeader": "topic!",
    "DeleteSubscriptionGroupRequestHeader": "groupName! cleanOffset:b",
    "GetSubscriptionGroupConfigRequestHeader": "group!",
    "GetTopicStatsInfoRequestHeader": "topic!",
    "GetConsumeStatsRequestHeader": "consumerGroup! topic",
    "GetConsumerConnectionListRequestHeader": "consumerGroup!",
    "ResetOffsetRequestHeader": "topic! group! queueId:i offset:l timestamp!:l isForce!:b",
    "QueryMessageRequestHeader": "topic! key! maxNum!:i beginTimestamp!:l endTimestamp!:l",
    "QueryMessageResponseHeader": "indexLastUpdateTimestamp!:l indexLastUpdatePhyoffset!:l",
    "ViewMessageRequestHeader": "offset!:l",
    "EndTransactionRequestHeader": "topic producerGroup! tranStateTableOffset!:l "
    "commitLogOffset!:l commitOrRollback!:i fromTransactionCheck:b msgId! transactionId",
    "CheckTransactionStateRequestHeader": "tranStateTableOffset!:l commitLogOffset!:l msgId "
    "transactionId offsetMsgId",
}
_SUFFIX = {FieldKind.STR: "", FieldKind.INT: ":i", FieldKind.LONG: ":l", FieldKind.BOOL: ":b"}


def test_every_header_is_exported_and_described() -> None:
    defined = {
        c
        for c in Header.__subclasses__()
        if c.__module__.startswith("protocol.headers.")
        and getattr(sys.modules[c.__module__], c.__name__, None) is c  # not a pre-slots copy
    }
    assert defined == set(ALL_HEADERS)
    assert sorted(JAVA_FIELDS) == [c.__name__ for c in ALL_HEADERS]


#: Our own optional fields after Java's (a Java name server ignores unknown ext fields):
#: the master epoch of automatic failover (docs/ha.md).
TRIMQ_EXTENSIONS: dict[str, str] = {"RegisterBrokerRequestHeader": "trimqMasterEpoch:l"}


@pytest.mark.parametrize("cls", ALL_HEADERS, ids=lambda c: c.__name__)
def test_wire_names_kinds_and_required_match_java(cls: type[Header]) -> None:
    described = " ".join(
        f"{i.wire}{'!' if i.required else ''}{_SUFFIX[i.kind]}" for i in fields_of(cls)
    )
    expected = " ".join(
        filter(None, (JAVA_FIELDS[cls.__name__], TRIMQ_EXTENSIONS.get(cls.__name__)))
    )
    assert described == expected


def test_v2_letters_cover_every_send_field() -> None:
    names = [i.name for i in fields_of(SendMessageRequestHeader)]
    assert sorted(V2_WIRE_NAMES) == sorted(names)
    assert sorted(V2_WIRE_NAMES.values()) == list("abcdefghijklmn")


# ------------------------------------------------------------------ real captured frames
def test_ali_ons_send_v2() -> None:
    cmd = capture("ali-ons-02-10911-code310.hex").decode()
    h = decode_request_header(cmd)
    assert isinstance(h, SendMessageRequestHeader)
    assert (h.producer_group, h.topic, h.default_topic) == (
        "interop_producer_group",
        "InteropTopic",
        "TBW102",
    )
    assert (h.default_topic_queue_nums, h.queue_id, h.sys_flag, h.flag) == (4, 3, 0, 0)
    assert h.born_timestamp == 1795306556772
    assert h.properties == "TAGS\x01TagA\x02KEYS\x01key-0\x02"
    assert h.reconsume_times == 0
    assert h.unit_mode is False and h.batch is None and not h.is_batch
    assert h.max_reconsume_times is None and h.broker_name is None


def test_cpp_1x_send_v1_long_names_and_numeric_booleans() -> None:
    cmd = capture("cpp-client-02-10911-code10.hex").decode()
    assert cmd.ext_fields["batch"] == "0" and cmd.ext_fields["unitMode"] == "0"
    h = decode_request_header(cmd)  # AccessKey / Signature / OnsChannel are ignored
    assert isinstance(h, SendMessageRequestHeader)
    assert h.producer_group == "interop_cpp_producer_group"
    assert (h.topic, h.queue_id, h.born_timestamp) == ("InteropTopic", 0, 1795306581979)
    assert h.batch is False and h.unit_mode is False
    assert "UNIQ_KEY\x010100007F00005D8F00005BD291710100\x02" in (h.properties or "")


def test_cpp_21_send_v2_with_numeric_booleans() -> None:
    cmd = capture("cpp21-client-02-10911-code310.hex").decode()
    assert cmd.ext_fields["k"] == "0" and cmd.ext_fields["m"] == "0"
    h = decode_request_header(cmd)
    assert isinstance(h, SendMessageRequestHeader)
    assert h.unit_mode is False and h.batch is False
    assert h.max_reconsume_times == 16 and h.born_timestamp == 1795306612191


@pytest.mark.parametrize(
    ("name", "topic", "suspend"),
    [
        ("ali-ons-18-10911-code11.hex", "InteropTopic", 2000),
        ("cpp-client-16-10911-code11.hex", "%RETRY%interop_cpp_consumer_group", 15000),
        ("cpp21-client-14-10911-code11.hex", "%RETRY%interop_cpp_consumer_group", 15000),
    ],
)
def test_pull_requests(name: str, topic: str, suspend: int) -> None:
    h = decode_request_header(capture(name).decode())
    assert isinstance(h, PullMessageRequestHeader)
    assert h.topic == topic and h.queue_id == 0 and h.queue_offset == 0
    assert (h.max_msg_nums, h.sys_flag, h.commit_offset) == (32, 6, 0)
    assert h.suspend_timeout_millis == suspend
    assert h.subscription == "*" and h.expression_type is None
    assert h.has_suspend and h.has_subscription
    assert not (h.has_commit_offset or h.has_class_filter or h.is_lite_pull)


def test_offset_client_and_route_requests() -> None:
    q = decode_request_header(capture("ali-ons-15-10911-code14.hex").decode())
    assert q == QueryConsumerOffsetRequestHeader(
        consumer_group="interop_consumer_group", topic="InteropTopic", queue_id=0
    )
    u = decode_request_header(capture("ali-ons-44-10911-code15.hex").decode())
    assert u == UpdateConsumerOffsetRequestHeader(
        consumer_group="interop_consumer_group", topic="InteropTopic", queue_id=0, commit_offset=1
    )
    un = decode_request_header(capture("ali-ons-52-10911-code35.hex").decode())
    assert un == UnregisterClientRequestHeader(
        client_id="127.0.0.1@10743", consumer_group="interop_consumer_group"
    )
    cpp = decode_request_header(capture("cpp-client-06-10911-code35.hex").decode())
    assert isinstance(cpp, UnregisterClientRequestHeader)
    assert cpp.producer_group == "interop_cpp_producer_group" and cpp.consumer_group == ""
    g = decode_request_header(capture("cpp21-client-09-10911-code38.hex").decode())
    assert g == headers_pkg.GetConsumerListByGroupRequestHeader(
        consumer_group="interop_cpp_consumer_group"
    )
    r = decode_request_header(capture("cpp-client-1.x-first-request.hex").decode())
    assert r == GetRouteInfoRequestHeader(topic="InteropTopic")


def test_responses_the_clients_accepted() -> None:
    send = SendMessageResponseHeader.from_ext(
        capture("ali-ons-02-10911-resp310-0.hex").decode().ext_fields
    )
    assert send == SendMessageResponseHeader(
        msg_id="7F00000100002A9F0000000000000000", queue_id=3, queue_offset=0
    )
    pull = PullMessageResponseHeader.from_ext(
        capture("cpp21-client-23-10911-resp11-0.hex").decode().ext_fields
    )
    assert pull == PullMessageResponseHeader(
        suggest_which_broker_id=0, next_begin_offset=1, min_offset=0, max_offset=1
    )


REQUESTS = [c for c in all_captures() if not c.is_response]
RESPONSES = [c for c in all_captures() if c.is_response]


@pytest.mark.parametrize("cap", REQUESTS, ids=lambda c: c.path.name)
def test_every_captured_request_decodes_through_the_registry(cap: Capture) -> None:
    cmd = cap.decode()
    header = decode_request_header(cmd)
    if cmd.code == RequestCode.HEART_BEAT:  # all in the JSON body
        assert header is None
        return
    assert type(header) is REQUEST_HEADERS[cmd.code]
    assert header is not None
    if cmd.code in V2_SEND_CODES:
        assert isinstance(header, SendMessageRequestHeader)
        again = send_header_to_v2_ext(header)
    else:
        again = header.to_ext()
    # Re-encoding gives back every field the client sent, minus the ACL extras; only
    # client-cpp's "0"/"1" booleans come back in Java's spelling.
    sent = {k: v for k, v in cmd.ext_fields.items() if k not in _ACL_EXTRAS}
    assert set(again) == set(sent)
    changed = {(sent[k], again[k]) for k in sent if sent[k] != again[k]}
    assert changed <= {("0", "false"), ("1", "true")}


_ACL_EXTRAS = ("AccessKey", "Signature", "OnsChannel")


@pytest.mark.parametrize(
    "cap", [c for c in RESPONSES if c.request_code in RESPONSE_HEADERS], ids=lambda c: c.path.name
)
def test_every_captured_response_with_fields_decodes(cap: Capture) -> None:
    cmd = cap.decode()
    if not cmd.ext_fields:  # e.g. QUERY_NOT_FOUND carries no offset
        assert cmd.code != ResponseCode.SUCCESS
        return
    header = RESPONSE_HEADERS[cap.request_code].from_ext(cmd.ext_fields)
    assert header.to_ext() == cmd.ext_fields


def test_registry_codes_and_v2_dispatch() -> None:
    assert all(isinstance(code, RequestCode) for code in REQUEST_HEADERS)
    assert all(
        cls in ALL_HEADERS for cls in [*REQUEST_HEADERS.values(), *RESPONSE_HEADERS.values()]
    )
    v1 = capture("cpp-client-02-10911-code10.hex").decode()
    v2 = capture("cpp21-client-02-10911-code310.hex").decode()
    batch = RemotingCommand(code=RequestCode.SEND_BATCH_MESSAGE, ext_fields=v2.ext_fields)
    assert decode_request_header(batch) == decode_request_header(v2)
    with pytest.raises(FieldError) as info:  # V1 code with V2 names: nothing matches
        decode_request_header(RemotingCommand(code=v1.code, ext_fields=v2.ext_fields))
    assert info.value.field == "producerGroup"
    assert decode_request_header(RemotingCommand(code=999_999)) is None
    assert decode_request_header(RemotingCommand(code=RequestCode.LOCK_BATCH_MQ)) is None


# ------------------------------------------------------------------ errors name the field
_GOOD_MAX_OFFSET = {"topic": "T", "queueId": "1"}


def test_missing_required_field() -> None:
    with pytest.raises(FieldError) as info:
        GetMaxOffsetRequestHeader.from_ext({"topic": "T"})
    err = info.value
    assert err.field == "queueId"
    assert "GetMaxOffsetRequestHeader" in str(err) and "'queueId' (queue_id)" in str(err)
    assert "missing" in str(err)
    assert isinstance(err, ProtocolError) and err.code == ResponseCode.INVALID_PARAMETER


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("12x", "must be a decimal 32-bit integer"),
        ("2147483648", "outside the signed 32-bit range"),
        ("-2147483649", "outside the signed 32-bit range"),
        ("1_000", "must be a decimal"),
        (" 5", "must be a decimal"),
        ("5 ", "must be a decimal"),
        ("", "must be a decimal"),
        ("+", "must be a decimal"),
        ("0x10", "must be a decimal"),
        ("1e3", "must be a decimal"),
        ("٣", "must be a decimal"),  # an Arabic-Indic digit: int() would accept it
        ("9" * 5000, "outside the signed 32-bit range"),
    ],
)
def test_malformed_int(bad: str, reason: str) -> None:
    with pytest.raises(FieldError) as info:
        GetMaxOffsetRequestHeader.from_ext({**_GOOD_MAX_OFFSET, "queueId": bad})
    assert info.value.field == "queueId"
    message = str(info.value)
    assert reason in message and "GetMaxOffsetRequestHeader" in message
    assert repr(bad[:48]) in message
    assert len(message) < 300  # a huge value is clipped


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("0", 0),
        ("-0", 0),
        ("+5", 5),
        ("007", 7),
        ("-2147483648", -(2**31)),
        ("2147483647", 2**31 - 1),
    ],
)
def test_ints_java_accepts(raw: str, value: int) -> None:
    assert (
        GetMaxOffsetRequestHeader.from_ext({**_GOOD_MAX_OFFSET, "queueId": raw}).queue_id == value
    )


def test_long_range() -> None:
    ext = {"consumerGroup": "g", "topic": "t", "queueId": "0"}
    ok = UpdateConsumerOffsetRequestHeader.from_ext({**ext, "commitOffset": str(-(2**63))})
    assert ok.commit_offset == -(2**63)
    with pytest.raises(FieldError, match="outside the signed 64-bit range") as info:
        UpdateConsumerOffsetRequestHeader.from_ext({**ext, "commitOffset": str(2**63)})
    assert info.value.field == "commitOffset"


@pytest.mark.parametrize(
    ("raw", "value"),
    [("true", True), ("false", False), ("TRUE", True), ("False", False), ("1", True), ("0", False)],
)
def test_booleans_accepted(raw: str, value: bool) -> None:
    assert (
        GetMaxOffsetRequestHeader.from_ext({**_GOOD_MAX_OFFSET, "committed": raw}).committed
        is value
    )


@pytest.mark.parametrize("bad", ["maybe", "yes", "", "2", "t", " true", "ｔｒｕｅ"])
def test_malformed_bool(bad: str) -> None:
    with pytest.raises(FieldError) as info:
        GetMaxOffsetRequestHeader.from_ext({**_GOOD_MAX_OFFSET, "committed": bad})
    assert info.value.field == "committed"
    assert "'committed'" in str(info.value) and "true or false" in str(info.value)
    assert repr(bad) in str(info.value)


def test_v2_error_names_the_letter_and_the_long_name() -> None:
    ext = dict(capture("cpp21-client-02-10911-code310.hex").decode().ext_fields)
    with pytest.raises(FieldError) as info:
        send_header_from_v2_ext({**ext, "e": "12x"})
    assert info.value.field == "e"
    assert "SendMessageRequestHeaderV2" in str(info.value)
    assert "'e' (queueId, queue_id)" in str(info.value) and "'12x'" in str(info.value)
    del ext["b"]
    with pytest.raises(FieldError, match=r"'b' \(topic\) is missing") as missing:
        send_header_from_v2_ext(ext)
    assert missing.value.field == "b"
    with pytest.raises(FieldError) as flag:
        send_header_from_v2_ext({**ext, "b": "T", "k": "maybe"})
    assert flag.value.field == "k" and "unitMode" in str(flag.value)


def test_choices_are_enforced() -> None:
    ext = {
        "topic": "T",
        "defaultTopic": "TBW102",
        "readQueueNums": "8",
        "writeQueueNums": "8",
        "perm": "6",
        "topicFilterType": "SINGLE_TAG",
        "order": "false",
    }
    assert CreateTopicRequestHeader.from_ext(ext).topic_filter_type == "SINGLE_TAG"
    with pytest.raises(FieldError, match="must be one of 'MULTI_TAG', 'SINGLE_TAG'") as info:
        CreateTopicRequestHeader.from_ext({**ext, "topicFilterType": "ANY"})
    assert info.value.field == "topicFilterType"
    end = {
        "producerGroup": "p",
        "tranStateTableOffset": "1",
        "commitLogOffset": "2",
        "msgId": "m",
    }
    for value in ("0", "8", "12"):
        header = headers_pkg.EndTransactionRequestHeader.from_ext(
            {**end, "commitOrRollback": value}
        )
        assert header.commit_or_rollback == int(value)
    with pytest.raises(FieldError) as bad:
        headers_pkg.EndTransactionRequestHeader.from_ext({**end, "commitOrRollback": "4"})
    assert bad.value.field == "commitOrRollback"


# ------------------------------------------------------------------ encoding details
def any_queue_pop(*, order: bool = False) -> PopMessageRequestHeader:
    """A pop of any queue: 32 messages, 60 s invisible, 20 s poll, born at t=1000 ms."""
    return PopMessageRequestHeader(
        consumer_group="g",
        topic="t",
        queue_id=-1,
        max_msg_nums=32,
        invisible_time=60_000,
        poll_time=20_000,
        born_time=1_000,
        init_mode=0,
        order=order,
    )


def test_to_ext_omits_none_and_writes_java_strings() -> None:
    h = ConsumerSendMsgBackRequestHeader(offset=2**40, group="g", delay_level=-1)
    assert h.to_ext() == {
        "offset": "1099511627776",
        "group": "g",
        "delayLevel": "-1",
        "unitMode": "false",  # Java's primitive boolean is always sent
    }
    pop = any_queue_pop(order=True)
    assert pop.to_ext()["order"] == "true" and "exp" not in pop.to_ext()


def test_unknown_ext_keys_are_ignored() -> None:
    ext = {**_GOOD_MAX_OFFSET, "AccessKey": "", "Signature": "x", "bname": "broker-a", "lo": "1"}
    assert GetMaxOffsetRequestHeader.from_ext(ext) == GetMaxOffsetRequestHeader(
        topic="T", queue_id=1
    )


def test_out_of_range_ints_are_refused_on_encode() -> None:
    with pytest.raises(EncodeError, match="'queueId'"):
        GetMaxOffsetRequestHeader(topic="T", queue_id=2**31).to_ext()
    with pytest.raises(EncodeError, match="'offset'"):
        AckMessageRequestHeader(
            consumer_group="g", topic="t", queue_id=0, extra_info="x", offset=2**63
        ).to_ext()


def test_values_outside_the_choices_are_refused_on_encode() -> None:
    header = headers_pkg.SearchOffsetRequestHeader(
        topic="t", queue_id=0, timestamp=0, boundary_type="MIDDLE"
    )
    with pytest.raises(EncodeError, match="'boundaryType'"):
        header.to_ext()
    assert dataclasses.replace(header, boundary_type=None).boundary == "LOWER"


def test_int_enum_values_are_written_as_numbers() -> None:
    h = PullMessageRequestHeader(
        consumer_group="g",
        topic="t",
        queue_id=0,
        queue_offset=0,
        max_msg_nums=32,
        sys_flag=PullSysFlag.SUSPEND | PullSysFlag.SUBSCRIPTION,
        commit_offset=0,
        suspend_timeout_millis=15_000,
        sub_version=0,
    )
    assert h.to_ext()["sysFlag"] == "6"


# ------------------------------------------------------------------ helpers
def test_pull_sys_flag_helpers() -> None:
    flag = build_pull_sys_flag(commit_offset=True, suspend=True, subscription=True)
    assert flag == 7  # what the C++ clients send
    assert clear_commit_offset_flag(flag) == 6
    assert build_pull_sys_flag(
        commit_offset=False, suspend=False, subscription=False, class_filter=True, lite_pull=True
    ) == (PullSysFlag.CLASS_FILTER | PullSysFlag.LITE_PULL_MESSAGE)


@pytest.mark.parametrize(("now", "expected"), [(21_499, False), (21_500, False), (21_501, True)])
def test_pop_timeout_too_much(now: int, expected: bool) -> None:
    pop = any_queue_pop()
    assert pop.is_timeout_too_much(now) is expected
    assert pop.any_queue and pop.order is False


# ------------------------------------------------------------------ the declarative machinery
def test_class_definition_errors_are_reported() -> None:
    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Floaty(Header):
        ratio: float

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class BadOptional(Header):
        name: str | None = "x"

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Clash(Header):
        queue_id: int
        other: int = dataclasses.field(metadata=meta(wire="queueId"))

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class Fine(Header):
        offset: Long
        name: str | None = None

    class NotADataclass(Header):
        pass

    with pytest.raises(TypeError, match="unsupported header annotation"):
        Floaty.from_ext({})
    with pytest.raises(TypeError, match="must default to None"):
        BadOptional.from_ext({})
    with pytest.raises(TypeError, match="share a wire name"):
        Clash.from_ext({})
    with pytest.raises(TypeError, match="must be a dataclass"):
        NotADataclass.from_ext({})
    with pytest.raises(TypeError, match="unknown fields"):
        Codec(Fine, wire_names={"nope": "z"})
    assert Fine.from_ext({"offset": "5"}) == Fine(offset=5)
    assert fields_of(Fine)[0].kind is FieldKind.LONG
