"""RemotingConnection: a client and a server instance talking over a fake wire (h11's
ConnectionPair), split frames, out-of-order and unsolicited replies, oneway requests,
malformed frames, EOF, and fuzzing that only ever gets events or a ProtocolError."""

from __future__ import annotations

import itertools
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.codes import RequestCode, ResponseCode, SerializeType
from protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand, request
from protocol.connection import (
    MAX_OPAQUE,
    NEED_DATA,
    Closed,
    Event,
    LocalProtocolError,
    Malformed,
    RemotingConnection,
    Request,
    Response,
    Role,
    State,
    UnsolicitedResponse,
)
from protocol.errors import (
    EncodeError,
    FrameError,
    FrameTooLargeError,
    HeaderError,
    ProtocolError,
)
from protocol.frame import encode_command
from tests.protocol.strategies import commands


def drain(conn: RemotingConnection, budget: int = 1000) -> list[Event]:
    """Every event until NEED_DATA (or Closed, which repeats forever)."""
    events: list[Event] = []
    for _ in range(budget):
        event = conn.next_event()
        if event is NEED_DATA:
            return events
        events.append(event)
        if isinstance(event, Closed):
            return events
    raise AssertionError("more events than the input allows")


def raw_frame(stype: int, header: bytes, body: bytes = b"") -> bytes:
    length = 4 + len(header) + len(body)
    return struct.pack(">II", length, (stype << 24) | len(header)) + header + body


def json_frame(header: dict[str, object]) -> bytes:
    return raw_frame(SerializeType.JSON, json.dumps(header).encode())


class ConnectionPair:
    """A client and a server joined by a fake wire; each exchange checks that the peer
    decoded exactly what was sent."""

    def __init__(self, *, serialize_type: SerializeType | None = None) -> None:
        self.client = RemotingConnection(Role.CLIENT, serialize_type=serialize_type)
        self.server = RemotingConnection(Role.SERVER)

    @staticmethod
    def deliver(to: RemotingConnection, data: bytes) -> list[Event]:
        to.receive_data(data)
        return drain(to)

    def request(self, cmd: RemotingCommand, *, oneway: bool = False) -> RemotingCommand:
        """The client sends ``cmd``; returns it as the server received it."""
        opaque, data = self.client.send_request(cmd, oneway=oneway)
        (event,) = self.deliver(self.server, data)
        assert isinstance(event, Request)
        got = event.command
        assert got.opaque == opaque
        assert (got.code, dict(got.ext_fields), got.body) == (cmd.code, cmd.ext_fields, cmd.body)
        assert got.is_oneway == (oneway or cmd.is_oneway)
        return got

    def respond(self, req: RemotingCommand, reply: RemotingCommand) -> Event:
        """The server answers ``req``; returns the client's one event."""
        (event,) = self.deliver(self.client, self.server.send_response(req, reply))
        return event


def route(
    opaque: int = 0,
    *,
    body: bytes = b"",
    oneway: bool = False,
    serialize_type: SerializeType = SerializeType.JSON,
) -> RemotingCommand:
    return request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque, {"topic": "T"}, body,
        oneway=oneway, serialize_type=serialize_type,
    )  # fmt: skip


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("stype", list(SerializeType))
def test_request_and_response_round_trip(stype: SerializeType) -> None:
    pair = ConnectionPair()
    got = pair.request(route(serialize_type=stype))
    assert pair.client.pending == {got.opaque}
    assert got.serialize_type is stype
    event = pair.respond(got, got.response(body=b"route"))
    assert event == Response(got.response(body=b"route"))
    assert pair.client.pending == frozenset()


def test_the_client_serialize_type_applies_to_its_requests_and_their_replies() -> None:
    pair = ConnectionPair(serialize_type=SerializeType.MSGPACK)
    got = pair.request(route(serialize_type=SerializeType.JSON))
    assert got.serialize_type is SerializeType.MSGPACK
    event = pair.respond(got, got.response())
    assert isinstance(event, Response)
    assert event.command.serialize_type is SerializeType.MSGPACK


def test_out_of_order_replies_each_find_their_request() -> None:
    pair = ConnectionPair()
    sent = [pair.request(route()) for _ in range(3)]
    assert [c.opaque for c in sent] == [1, 2, 3]
    for req in reversed(sent):
        event = pair.respond(req, req.response(remark=f"for {req.opaque}"))
        assert isinstance(event, Response)
        assert event.command.opaque == req.opaque
        assert event.command.remark == f"for {req.opaque}"
    assert pair.client.pending == frozenset()


def test_both_sides_send_requests() -> None:
    """The broker notifies clients and clients answer: roles do not restrict directions."""
    pair = ConnectionPair()
    opaque, data = pair.server.send_request(route(), oneway=True)
    (event,) = pair.deliver(pair.client, data)
    assert isinstance(event, Request) and event.command.opaque == opaque
    opaque, data = pair.server.send_request(route())
    (event,) = pair.deliver(pair.client, data)
    assert isinstance(event, Request)
    reply = pair.client.send_response(event.command, event.command.response())
    assert pair.deliver(pair.server, reply) == [Response(event.command.response())]


@given(
    st.lists(commands(), min_size=1, max_size=5),
    st.lists(st.integers(0, 8000), max_size=20),
)
def test_any_split_of_the_stream_gives_the_same_requests(
    cmds: list[RemotingCommand], cuts: list[int]
) -> None:
    client = RemotingConnection(Role.CLIENT)
    server = RemotingConnection(Role.SERVER)
    expected: list[Event] = []
    frames: list[bytes] = []
    for cmd in cmds:
        cmd = cmd._replace(flag=cmd.flag & ~FLAG_RESPONSE)
        opaque, frame = client.send_request(cmd)
        expected.append(Request(cmd._replace(opaque=opaque)))
        frames.append(frame)
    stream = b"".join(frames)
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(stream)}), len(stream)]
    events: list[Event] = []
    for start, end in itertools.pairwise(bounds):
        server.receive_data(stream[start:end])
        events += drain(server)
    assert events == expected
    assert server.buffered == 0


def test_byte_at_a_time() -> None:
    pair = ConnectionPair()
    opaque, data = pair.client.send_request(route())
    for i in range(len(data) - 1):
        pair.server.receive_data(data[i : i + 1])
        assert pair.server.next_event() is NEED_DATA
    (event,) = pair.deliver(pair.server, data[-1:])
    assert isinstance(event, Request) and event.command.opaque == opaque


# ------------------------------------------------------------------ opaques and pending
def test_opaques_count_per_connection() -> None:
    first, second = RemotingConnection(Role.CLIENT), RemotingConnection(Role.CLIENT)
    assert [first.send_request(route())[0] for _ in range(3)] == [1, 2, 3]
    assert second.send_request(route())[0] == 1


def test_the_counter_skips_pending_opaques_and_wraps_inside_java_int() -> None:
    conn = RemotingConnection(Role.CLIENT)
    conn.expect_response(1)
    conn.expect_response(2)
    assert conn.next_opaque() == 3
    conn._next_opaque = MAX_OPAQUE - 1  # a long-lived connection, 2**31 requests later
    assert [conn.next_opaque() for _ in range(4)] == [MAX_OPAQUE - 1, MAX_OPAQUE, 3, 4]


def test_oneway_requests_are_not_pending_and_take_no_response() -> None:
    pair = ConnectionPair()
    got = pair.request(route(), oneway=True)
    assert got.flag & FLAG_ONEWAY
    assert pair.client.pending == frozenset()
    with pytest.raises(LocalProtocolError, match="takes no response"):
        pair.server.send_response(got, got.response())
    # A command already flagged oneway is sent as one.
    flagged = pair.request(route(oneway=True))
    assert flagged.is_oneway and pair.client.pending == frozenset()


def test_responses_nobody_waits_for_are_unsolicited() -> None:
    pair = ConnectionPair()
    late = pair.request(route())
    assert pair.client.abandon(late.opaque)
    assert not pair.client.abandon(late.opaque)
    assert pair.respond(late, late.response()) == UnsolicitedResponse(late.response())
    answered = pair.request(route())
    assert isinstance(pair.respond(answered, answered.response()), Response)
    # A duplicate of an answered reply, and a reply to something never sent.
    assert isinstance(pair.respond(answered, answered.response()), UnsolicitedResponse)
    stray = RemotingCommand(code=0, opaque=999, flag=FLAG_RESPONSE)
    assert pair.deliver(pair.client, encode_command(stray)) == [UnsolicitedResponse(stray)]


def test_expect_response_matches_frames_the_caller_encoded() -> None:
    pair = ConnectionPair()
    opaques = [pair.client.next_opaque() for _ in range(3)]
    for opaque in opaques:
        pair.client.expect_response(opaque)
    with pytest.raises(LocalProtocolError, match="already awaits"):
        pair.client.expect_response(opaques[0])
    frames = b"".join(encode_command(route(o)) for o in opaques)
    requests = pair.deliver(pair.server, frames)
    assert [e.command.opaque for e in requests if isinstance(e, Request)] == opaques
    assert pair.client.send_request(route())[0] == opaques[-1] + 1
    replies = b"".join(pair.server.send_response(route(o), route(o).response()) for o in opaques)
    events = pair.deliver(pair.client, replies)
    assert [type(e) for e in events] == [Response] * 3


def test_close_hands_back_what_is_pending_and_refuses_new_requests() -> None:
    pair = ConnectionPair()
    for _ in range(3):
        pair.request(route())
    pair.client.abandon(2)
    assert pair.client.close() == (1, 3)
    assert pair.client.close() == ()
    assert pair.client.our_state is State.CLOSED
    with pytest.raises(LocalProtocolError, match="cannot send"):
        pair.client.send_request(route())


# ------------------------------------------------------------------ responses we send
def test_send_response_stamps_the_request_opaque_flag_and_serialize_type() -> None:
    pair = ConnectionPair()
    got = pair.request(route(serialize_type=SerializeType.ROCKETMQ))
    careless = RemotingCommand(code=ResponseCode.SUCCESS, opaque=12345, remark="r")
    event = pair.respond(got, careless)
    assert isinstance(event, Response)
    assert event.command.opaque == got.opaque and event.command.is_response
    assert event.command.serialize_type is SerializeType.ROCKETMQ
    assert event.command.remark == "r"


def test_a_reply_over_the_frame_limit_is_an_encode_error() -> None:
    server = RemotingConnection(Role.SERVER, max_frame_size=1024)
    req = route(7)
    with pytest.raises(EncodeError, match="exceeds"):
        server.send_response(req, req.response(body=b"x" * 2000))


def test_misuse_is_a_local_protocol_error() -> None:
    conn = RemotingConnection(Role.CLIENT)
    with pytest.raises(LocalProtocolError, match="given a response"):
        conn.send_request(route().response())
    with pytest.raises(LocalProtocolError, match="takes no response"):
        conn.send_response(route().response(), route().response())
    assert conn.pending == frozenset()


def test_a_request_that_cannot_be_encoded_leaves_nothing_pending() -> None:
    conn = RemotingConnection(Role.CLIENT, serialize_type=SerializeType.ROCKETMQ)
    with pytest.raises(EncodeError):
        conn.send_request(request(70_000, 0))  # the binary header's code is a short
    assert conn.pending == frozenset()


# ------------------------------------------------------------------ malformed frames
def old_server_answer(code: int, opaque: int, remark: str, stype: SerializeType) -> bytes:
    """What broker/remoting/server.py answered a malformed request with before
    RemotingConnection took it over (pinned here byte for byte)."""
    return encode_command(
        RemotingCommand(
            code=code, opaque=opaque, flag=FLAG_RESPONSE, remark=remark[:512], serialize_type=stype
        )
    )


@pytest.mark.parametrize(
    "header",
    [
        {"code": 105, "opaque": 71, "flag": "not a number"},
        {"opaque": 72, "flag": 0},
        {"code": 105, "opaque": 73, "remark": 5},
        {"code": 105, "opaque": 74, "extFields": ["not", "a", "map"]},
    ],
)
def test_a_bad_header_is_answered_on_its_opaque_and_the_stream_stays_in_sync(
    header: dict[str, object],
) -> None:
    server = RemotingConnection(Role.SERVER)
    events = ConnectionPair.deliver(server, json_frame(header) + encode_command(route(9)))
    assert [type(e) for e in events] == [Malformed, Request]
    bad = events[0]
    assert isinstance(bad, Malformed) and isinstance(bad.error, HeaderError)
    opaque = header["opaque"]
    assert isinstance(opaque, int) and bad.opaque == opaque
    answer = server.answer_malformed(bad)
    assert answer == old_server_answer(
        ResponseCode.INVALID_PARAMETER, opaque, str(bad.error), SerializeType.JSON
    )
    assert json.loads(answer[8:]) == {
        "code": ResponseCode.INVALID_PARAMETER,
        "language": "JAVA",
        "version": 0,
        "opaque": opaque,
        "flag": FLAG_RESPONSE,
        "remark": str(bad.error)[:512],
        "extFields": {},
        "serializeTypeCurrentRPC": "JSON",
    }


@pytest.mark.parametrize("header", [b'{"code":105,"opaque":75,', b"\xff\xfe not utf-8"])
def test_a_header_without_a_readable_opaque_gets_no_answer(header: bytes) -> None:
    server = RemotingConnection(Role.SERVER)
    events = ConnectionPair.deliver(server, raw_frame(SerializeType.JSON, header))
    (bad,) = events
    assert isinstance(bad, Malformed) and bad.opaque is None
    assert server.answer_malformed(bad) is None
    assert server.their_state is State.OPEN


def test_a_client_does_not_answer_malformed_frames() -> None:
    client = RemotingConnection(Role.CLIENT)
    (bad,) = ConnectionPair.deliver(client, json_frame({"opaque": 72}))
    assert isinstance(bad, Malformed) and bad.opaque == 72
    assert client.answer_malformed(bad) is None


@pytest.mark.parametrize("stype", list(SerializeType))
def test_an_oversize_frame_is_answered_and_skipped(stype: SerializeType) -> None:
    limit = 4096
    server = RemotingConnection(Role.SERVER, max_frame_size=limit)
    big = route(81, serialize_type=stype, body=b"x" * 3 * limit)
    stream = encode_command(big) + encode_command(route(82, serialize_type=stype))
    events: list[Event] = []
    for start in range(0, len(stream), 1000):  # the big body never sits in the buffer whole
        server.receive_data(stream[start : start + 1000])
        events += drain(server)
        assert server.buffered <= limit + 1000
    bad, after = events
    assert isinstance(bad, Malformed) and isinstance(bad.error, FrameTooLargeError)
    assert isinstance(after, Request) and after.command.opaque == 82
    answer = server.answer_malformed(bad)
    assert answer == old_server_answer(ResponseCode.MESSAGE_ILLEGAL, 81, str(bad.error), stype)
    (reply,) = ConnectionPair.deliver(RemotingConnection(Role.CLIENT), answer)
    assert isinstance(reply, UnsolicitedResponse)
    assert str(limit) in (reply.command.remark or "")


# ------------------------------------------------------------------ broken framing and EOF
@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        struct.pack(">II", 2, 0),  # length shorter than the type/header-length word
        struct.pack(">II", 10, 20) + b"x" * 10,  # header longer than the frame
    ],
)
def test_broken_framing_raises_and_stays_broken(garbage: bytes) -> None:
    pair = ConnectionPair()
    pair.request(route())
    pair.client.receive_data(garbage)
    with pytest.raises(FrameError) as first:
        pair.client.next_event()
    assert first.value.fatal
    with pytest.raises(FrameError) as again:
        pair.client.next_event()
    assert again.value is first.value
    assert pair.client.their_state is State.ERROR
    with pytest.raises(LocalProtocolError):
        pair.client.send_request(route())
    assert pair.client.close() == (1,)


def test_clean_eof_comes_after_the_buffered_frames_and_repeats() -> None:
    pair = ConnectionPair()
    got = pair.request(route())
    pair.client.receive_data(pair.server.send_response(got, got.response()))
    pair.client.receive_data(b"")
    pair.client.receive_data(b"")  # EOF twice is still EOF
    assert drain(pair.client) == [Response(got.response()), Closed()]
    assert pair.client.next_event() == Closed()
    assert pair.client.their_state is State.CLOSED
    with pytest.raises(LocalProtocolError, match="after EOF"):
        pair.client.receive_data(b"more")
    with pytest.raises(LocalProtocolError, match="cannot send"):
        pair.client.send_request(route())


def test_eof_mid_frame_is_a_protocol_error() -> None:
    server = RemotingConnection(Role.SERVER)
    frame = encode_command(route(1, body=b"x" * 100))
    server.receive_data(frame[:50])
    assert server.next_event() is NEED_DATA
    server.receive_data(b"")
    with pytest.raises(FrameError, match="mid-frame"):
        server.next_event()
    assert server.their_state is State.ERROR


# ------------------------------------------------------------------ fuzz
def pump(conn: RemotingConnection, seen: set[int]) -> bool:
    """Drain events; True once the connection is over (Closed or a ProtocolError).

    Checks the invariants: only events or a sticky ProtocolError, each pending opaque
    answered at most once, and a server's answer to malformed input is bytes or nothing.
    """
    for _ in range(10_000):
        try:
            event = conn.next_event()
        except ProtocolError as exc:
            with pytest.raises(ProtocolError) as again:
                conn.next_event()
            assert again.value is exc
            return True
        if event is NEED_DATA:
            return False
        if isinstance(event, Closed):
            return True
        if isinstance(event, Response):
            assert event.command.opaque not in seen
            seen.add(event.command.opaque)
        if isinstance(event, Malformed):
            assert not event.error.fatal
            answer = conn.answer_malformed(event)
            assert answer is None or isinstance(answer, bytes)
        assert isinstance(event, (Request, Response, UnsolicitedResponse, Malformed))
    raise AssertionError("more events than the input allows")


@given(
    st.sampled_from(Role),
    st.binary(max_size=4096),
    st.lists(st.integers(0, 4096), max_size=8),
    st.booleans(),
)
def test_fuzz_arbitrary_bytes(role: Role, data: bytes, cuts: list[int], eof: bool) -> None:
    conn = RemotingConnection(role, max_frame_size=1024)
    for opaque in range(1, 4):
        conn.expect_response(opaque)
    seen: set[int] = set()
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    for start, end in itertools.pairwise(bounds):
        conn.receive_data(data[start:end])
        if pump(conn, seen):
            return
    if eof:
        conn.receive_data(b"")
        assert pump(conn, seen)


@given(st.lists(commands(), min_size=1, max_size=4), st.data())
def test_fuzz_mutated_valid_streams(cmds: list[RemotingCommand], data: st.DataObject) -> None:
    server = RemotingConnection(Role.SERVER, max_frame_size=64 * 1024)
    for cmd in cmds:
        if cmd.flag & FLAG_RESPONSE and cmd.opaque not in server.pending:
            server.expect_response(cmd.opaque)
    stream = bytearray(b"".join(encode_command(c) for c in cmds))
    for _ in range(data.draw(st.integers(1, 4))):
        stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    server.receive_data(bytes(stream))
    server.receive_data(b"")
    assert pump(server, set())
