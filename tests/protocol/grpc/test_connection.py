"""GrpcConnection, sans-IO, driven by a real h2 client-side connection.

Each test pumps bytes between an ``h2`` client (``client_side=True``) and the server's
:class:`GrpcConnection` by hand — no sockets, no clock — and checks both ends: the call events
the server's I/O layer would act on, and the frames the client sees (response headers,
messages, trailers, resets), in order. Frames h2 would refuse to send (a GOAWAY that leaves
the client's own state machine open, garbage) are written as raw bytes with hyperframe.
"""

from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import hpack
import pytest
from hyperframe.frame import GoAwayFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.grpc.codes import GrpcStatus
from protocol.grpc.connection import (
    CallHalfClosed,
    CallMessage,
    CallReset,
    CallStarted,
    Event,
    GrpcConnection,
    GrpcConnectionError,
    PeerGoingAway,
)
from protocol.grpc.framing import percent_decode

PATH = "/apache.rocketmq.v2.MessagingService/QueryRoute"
_PREFIX = struct.Struct(">BI")


def frame(payload: bytes, flag: int = 0) -> bytes:
    """A gRPC length-prefixed message, built independently of the code under test."""
    return _PREFIX.pack(flag, len(payload)) + payload


def request_headers(**overrides: str | None) -> list[tuple[str, str]]:
    """A gRPC request's headers; a keyword (``_`` for ``-``, ``p_`` for ``:``) replaces one,
    None drops it."""
    headers: dict[str, str | None] = {
        ":method": "POST",
        ":scheme": "http",
        ":path": PATH,
        ":authority": "127.0.0.1:8081",
        "content-type": "application/grpc",
        "te": "trailers",
        "grpc-timeout": "3S",
        "x-mq-client-id": "host@1@0@abc",
    }
    for key, value in overrides.items():
        name = (":" + key[2:] if key.startswith("p_") else key).replace("_", "-")
        headers[name] = value
    return [(k, v) for k, v in headers.items() if v is not None]


@dataclass
class Seen:
    """What the client saw on one stream, in order."""

    items: list[tuple[str, Any]] = field(default_factory=list)
    buf: bytearray = field(default_factory=bytearray)

    @property
    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.items]

    @property
    def messages(self) -> list[bytes]:
        return [value for kind, value in self.items if kind == "message"]

    def first(self, kind: str) -> Any:
        return next(value for k, value in self.items if k == kind)

    @property
    def status(self) -> tuple[int, str]:
        """grpc-status and the decoded grpc-message of the trailers (or Trailers-Only)."""
        trailers = next(v for k, v in self.items if k in ("trailers", "trailers-only"))
        return int(trailers["grpc-status"]), percent_decode(trailers.get("grpc-message", ""))


class Pair:
    """An h2 client and a GrpcConnection, connected by hand."""

    def __init__(self, *, client_window: int | None = None, **server_kwargs: Any) -> None:
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.client = h2.connection.H2Connection(config)
        if client_window is not None:
            self.client.local_settings = h2.settings.Settings(
                client=True,
                initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: client_window},
            )
        self.server = GrpcConnection(**server_kwargs)
        self.seen: dict[int, Seen] = {}
        self.client_events: list[h2.events.Event] = []
        self.server.initiate()
        self.client.initiate_connection()
        assert self.to_server() == []
        self.to_client()
        assert self.to_server() == []  # the client's SETTINGS ack
        self.to_client()

    def to_server(self, extra: bytes = b"") -> list[Event]:
        """Deliver what the client queued (and ``extra`` raw bytes) to the server."""
        data = self.client.data_to_send() + extra
        return self.server.receive_data(data) if data else []

    def to_client(self, *, ack: bool = True) -> list[h2.events.Event]:
        """Deliver what the server queued to the client; file it per stream."""
        data = self.server.data_to_send()
        events = self.client.receive_data(data) if data else []
        self.client_events.extend(events)
        for ev in events:
            sid = getattr(ev, "stream_id", None)
            if not sid:
                continue
            seen = self.seen.setdefault(sid, Seen())
            if isinstance(ev, h2.events.ResponseReceived):
                headers = dict(ev.headers or ())
                seen.items.append(("trailers-only" if ev.stream_ended else "headers", headers))
            elif isinstance(ev, h2.events.DataReceived):
                if ack and ev.flow_controlled_length:
                    self.client.acknowledge_received_data(ev.flow_controlled_length, sid)
                seen.buf += ev.data or b""
                while len(seen.buf) >= 5:
                    flag, length = _PREFIX.unpack_from(seen.buf)
                    assert flag == 0
                    if len(seen.buf) < 5 + length:
                        break
                    seen.items.append(("message", bytes(seen.buf[5 : 5 + length])))
                    del seen.buf[: 5 + length]
            elif isinstance(ev, h2.events.TrailersReceived):
                seen.items.append(("trailers", dict(ev.headers or ())))
            elif isinstance(ev, h2.events.StreamEnded):
                seen.items.append(("end", None))
            elif isinstance(ev, h2.events.StreamReset):
                seen.items.append(("reset", ev.error_code))
        return events

    def request(
        self,
        *messages: bytes,
        end: bool = True,
        headers: dict[str, str | None] | None = None,
        **more: str | None,
    ) -> int:
        """Queue a request on a new stream (headers as :func:`request_headers`); its id."""
        sid = self.client.get_next_available_stream_id()
        body = b"".join(frame(m) for m in messages)
        fields = request_headers(**(headers or {}), **more)
        self.client.send_headers(sid, fields, end_stream=end and not body)
        if body:
            self.client.send_data(sid, body, end_stream=end)
        return sid


def started(events: list[Event]) -> CallStarted:
    (ev,) = [e for e in events if isinstance(e, CallStarted)]
    return ev


def reset_of(events: list[Event]) -> CallReset:
    """The one event, a CallReset."""
    (ev,) = events
    assert isinstance(ev, CallReset)
    return ev


# ---------------------------------------------------------------- calls
def test_unary_round_trip() -> None:
    pair = Pair()
    sid = pair.request(b"route please")
    events = pair.to_server()
    assert events == [
        CallStarted(
            sid,
            PATH,
            {
                "content-type": "application/grpc",
                "te": "trailers",
                "grpc-timeout": "3S",
                "x-mq-client-id": "host@1@0@abc",
            },
            3.0,
        ),
        CallMessage(sid, b"route please"),
        CallHalfClosed(sid),
    ]
    assert pair.server.open_calls == 1
    pair.server.send_message(sid, b"the route")
    pair.server.end_call(sid, GrpcStatus.OK)
    pair.to_client()
    seen = pair.seen[sid]
    assert seen.kinds == ["headers", "message", "trailers", "end"]
    assert seen.first("headers") == {":status": "200", "content-type": "application/grpc"}
    assert seen.messages == [b"the route"]
    assert seen.status == (0, "")
    assert pair.server.open_calls == 0


def test_request_split_across_many_reads() -> None:
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers(grpc_timeout=None))
    pair.client.send_data(sid, frame(b"a" * 100) + frame(b"") + frame(b"b" * 10), end_stream=True)
    data = pair.client.data_to_send()
    events: list[Event] = []
    for i in range(len(data)):
        events += pair.server.receive_data(data[i : i + 1])
    assert started(events).timeout_s is None
    assert [e for e in events if not isinstance(e, CallStarted)] == [
        CallMessage(sid, b"a" * 100),
        CallMessage(sid, b""),
        CallMessage(sid, b"b" * 10),
        CallHalfClosed(sid),
    ]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 200), max_size=30))
def test_reads_of_any_size_give_the_events_of_one_read(cuts: list[int]) -> None:
    # Whole frames are read from the read's bytes, the rest through the buffer: where
    # the reads end must not matter.
    def wire() -> tuple[Pair, bytes]:
        pair = Pair()
        for body in (b"a" * 100, b"", b"b" * 3000):
            pair.request(body, b"second")
        pair.client.ping(b"12345678")
        return pair, pair.client.data_to_send()

    whole, data = wire()
    expected = whole.server.receive_data(data)
    pair, data = wire()
    events: list[Event] = []
    pos = 0
    for cut in cuts:
        events += pair.server.receive_data(data[pos : pos + cut])
        pos += cut
    events += pair.server.receive_data(data[pos:])
    assert events == expected
    assert pair.server.data_to_send() == whole.server.data_to_send()


def test_messages_a_frame_each_or_together_are_the_same_events() -> None:
    # One whole message per DATA frame is taken without the message decoder; a frame with
    # two messages, or one message across frames, goes through it: the same events.
    messages = [b"first", b"", b"x" * 300, b"last"]
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers())
    for m in messages:
        pair.client.send_data(sid, frame(m))
    pair.client.end_stream(sid)
    one_each = pair.to_server()
    sid2 = pair.request(*messages)  # all in one frame
    together = pair.to_server()
    expected = [CallMessage(sid, m) for m in messages] + [CallHalfClosed(sid)]
    assert one_each[1:] == expected
    assert together[1:] == [CallMessage(sid2, m) for m in messages] + [CallHalfClosed(sid2)]
    sid3 = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid3, request_headers())
    wire = frame(b"split me")
    pair.client.send_data(sid3, wire[:7])
    pair.client.send_data(sid3, wire[7:], end_stream=True)
    assert pair.to_server()[1:] == [CallMessage(sid3, b"split me"), CallHalfClosed(sid3)]


def test_server_streaming_messages_then_trailers() -> None:
    pair = Pair()
    sid = pair.request(b"receive")
    pair.to_server()
    bodies = [b"status", b"m1" * 1000, b"m2", b"", b"delivery time"]
    for body in bodies[:2]:
        pair.server.send_message(sid, body)
    pair.to_client()  # part of the stream goes out before the rest is queued
    for body in bodies[2:]:
        pair.server.send_message(sid, body)
    pair.server.end_call(sid, GrpcStatus.OK)
    pair.to_client()
    seen = pair.seen[sid]
    assert seen.kinds == ["headers", *["message"] * len(bodies), "trailers", "end"]
    assert seen.messages == bodies
    assert seen.status == (0, "")


def test_a_batch_of_messages_goes_as_one_at_a_time_would() -> None:
    pair = Pair()
    sid = pair.request(b"receive")
    pair.to_server()
    bodies = [b"status", b"m1" * 1000, b"", b"m3"]

    def failing() -> Any:
        yield b"m4"
        raise ValueError("a record that does not decode")

    pair.server.send_messages(sid, iter(bodies))
    with pytest.raises(ValueError, match="does not decode"):  # what came before is still sent
        pair.server.send_messages(sid, failing())
    assert pair.server.unsent(sid) == sum(len(frame(b)) for b in [*bodies, b"m4"])
    pair.server.end_call(sid, GrpcStatus.OK)
    pair.to_client()
    seen = pair.seen[sid]
    assert seen.kinds == ["headers", *["message"] * 5, "trailers", "end"]
    assert seen.messages == [*bodies, b"m4"]


def test_error_after_messages_uses_trailers_and_encodes_the_message() -> None:
    pair = Pair()
    sid = pair.request(b"x")
    pair.to_server()
    pair.server.send_message(sid, b"one")
    pair.server.end_call(sid, GrpcStatus.INTERNAL, "broke: 100% «bad»\n")
    pair.server.end_call(sid, GrpcStatus.OK)  # a second end does nothing
    pair.server.send_message(sid, b"late")  # nor does a message after the end
    pair.to_client()
    seen = pair.seen[sid]
    assert seen.kinds == ["headers", "message", "trailers", "end"]
    trailers = seen.first("trailers")
    assert trailers["grpc-message"].isascii()
    assert seen.status == (GrpcStatus.INTERNAL, "broke: 100% «bad»\n")


def test_end_without_messages_is_trailers_only() -> None:
    pair = Pair()
    sid = pair.request(b"x")
    pair.to_server()
    pair.server.end_call(sid, GrpcStatus.UNIMPLEMENTED, "unknown method")
    pair.to_client()
    seen = pair.seen[sid]
    assert seen.kinds == ["trailers-only", "end"]
    headers = seen.first("trailers-only")
    assert headers[":status"] == "200"
    assert headers["content-type"] == "application/grpc"
    assert seen.status == (GrpcStatus.UNIMPLEMENTED, "unknown method")


# ---------------------------------------------------------------- refused requests
@pytest.mark.parametrize(
    ("headers", "status", "text"),
    [
        ({"p_method": "GET"}, GrpcStatus.UNIMPLEMENTED, "not POST"),
        ({"p_method": "PUT"}, GrpcStatus.UNIMPLEMENTED, "not POST"),
        ({"content_type": "application/json"}, GrpcStatus.UNIMPLEMENTED, "content-type"),
        ({"content_type": None}, GrpcStatus.UNIMPLEMENTED, "content-type"),
        ({"grpc_timeout": "soon"}, GrpcStatus.INTERNAL, "grpc-timeout"),
        ({"grpc_timeout": "123456789S"}, GrpcStatus.INTERNAL, "grpc-timeout"),
        ({"grpc_timeout": "-1S"}, GrpcStatus.INTERNAL, "grpc-timeout"),
        ({"grpc_encoding": "gzip"}, GrpcStatus.UNIMPLEMENTED, "gzip"),
    ],
)
def test_non_grpc_requests_get_trailers_only(
    headers: dict[str, str | None], status: int, text: str
) -> None:
    pair = Pair()
    sid = pair.request(b"body", headers=headers)
    reset = reset_of(pair.to_server())
    assert reset.stream_id == sid
    assert text in reset.reason
    pair.to_client()
    seen = pair.seen[sid]
    assert seen.kinds == ["trailers-only", "end"]
    assert seen.status[0] == status
    assert text in seen.status[1]
    assert pair.server.open_calls == 0


def test_header_that_is_not_utf8_is_decoded_leniently() -> None:
    # Regression: h2's own UTF-8 decoding raised UnicodeDecodeError out of receive_data,
    # which the server did not expect (it took the whole listener down).
    pair = Pair()
    headers = [(k.encode(), v.encode()) for k, v in request_headers()]
    block = hpack.Encoder().encode([*headers, (b"x-mq-client-id", b"host\xff\xfe@1")])
    sid = 1
    data = struct.pack(">I", len(block))[1:] + bytes([1, 0x5]) + struct.pack(">I", sid) + block
    events = pair.server.receive_data(data)
    call = started(events)
    assert call.metadata["x-mq-client-id"] == "host\ufffd\ufffd@1"
    assert events[-1] == CallHalfClosed(sid)


def test_content_type_with_a_suffix_is_grpc() -> None:
    pair = Pair()
    sid = pair.request(b"x", content_type="application/grpc+proto", grpc_encoding="identity")
    assert started(pair.to_server()).stream_id == sid


def test_refused_request_still_sending_is_ignored_afterwards() -> None:
    pair = Pair()
    sid = pair.request(b"first", end=False, p_method="GET")
    assert [type(e) for e in pair.to_server()] == [CallReset]
    pair.to_client()
    pair.client.send_data(sid, frame(b"more" * 4000), end_stream=True)
    assert pair.to_server() == []  # late data of an ended call: no events, still acked
    pair.to_client()
    assert pair.seen[sid].kinds == ["trailers-only", "end"]
    # The connection goes on.
    sid2 = pair.request(b"next")
    assert started(pair.to_server()).stream_id == sid2


# ---------------------------------------------------------------- broken request streams
def test_compressed_message_is_unimplemented_and_resets_the_call() -> None:
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers())
    pair.client.send_data(sid, frame(b"gzipped", flag=1), end_stream=True)
    events = pair.to_server()
    assert isinstance(events[0], CallStarted)
    assert events[1:] == [CallReset(sid, "compressed messages are not supported")]
    pair.to_client()
    assert pair.seen[sid].kinds == ["trailers-only", "end"]
    assert pair.seen[sid].status[0] == GrpcStatus.UNIMPLEMENTED
    # The I/O layer's late writes on the reset call do nothing.
    pair.server.send_message(sid, b"reply")
    pair.server.end_call(sid, GrpcStatus.OK)
    assert pair.server.data_to_send() == b""


def test_unknown_flag_byte_is_internal() -> None:
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers())
    pair.client.send_data(sid, frame(b"?", flag=7), end_stream=True)
    assert isinstance(pair.to_server()[-1], CallReset)
    pair.to_client()
    assert pair.seen[sid].status[0] == GrpcStatus.INTERNAL


def test_oversize_message_is_resource_exhausted_before_its_body_arrives() -> None:
    pair = Pair(max_message_size=1000)
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers())
    pair.client.send_data(sid, _PREFIX.pack(0, 1001) + b"x" * 100)
    events = pair.to_server()
    assert isinstance(events[0], CallStarted)
    assert isinstance(events[1], CallReset)
    assert "1001" in events[1].reason
    pair.to_client()
    assert pair.seen[sid].status[0] == GrpcStatus.RESOURCE_EXHAUSTED
    # The rest of the body is read (and its window given back) without events.
    pair.client.send_data(sid, b"x" * 901, end_stream=True)
    assert pair.to_server() == []
    # A message of exactly the limit is fine.
    sid2 = pair.request(b"y" * 1000)
    assert [type(e) for e in pair.to_server()] == [CallStarted, CallMessage, CallHalfClosed]
    assert sid2 != sid


def test_request_ending_mid_message_is_internal() -> None:
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers())
    pair.client.send_data(sid, frame(b"whole") + frame(b"cut short")[:-3], end_stream=True)
    events = pair.to_server()
    assert [type(e) for e in events] == [CallStarted, CallMessage, CallReset]
    assert "middle of a message" in reset_of(events[2:]).reason
    pair.to_client()
    assert pair.seen[sid].status == (
        GrpcStatus.INTERNAL,
        "request ended in the middle of a message",
    )


def test_error_after_response_headers_sends_trailers() -> None:
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers())
    pair.client.send_data(sid, frame(b"one"))
    pair.to_server()
    pair.server.send_message(sid, b"echo")
    pair.to_client()
    pair.client.send_data(sid, frame(b"two", flag=1))
    assert [type(e) for e in pair.to_server()] == [CallReset]
    pair.to_client()
    seen = pair.seen[sid]
    assert seen.kinds == ["headers", "message", "trailers", "end"]
    assert seen.status[0] == GrpcStatus.UNIMPLEMENTED


# ---------------------------------------------------------------- client resets
def test_client_reset_is_call_reset_and_later_sends_are_no_ops() -> None:
    pair = Pair()
    sid = pair.request(b"receive", end=False)
    other = pair.request(b"another")
    pair.to_server()
    pair.server.send_message(sid, b"status")
    pair.to_client()
    pair.client.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
    reset = reset_of(pair.to_server())
    assert reset.stream_id == sid
    assert "CANCEL" in reset.reason
    assert pair.server.open_calls == 1
    pair.server.send_message(sid, b"message nobody reads")
    pair.server.end_call(sid, GrpcStatus.OK)
    assert pair.server.unsent(sid) == 0
    assert pair.server.data_to_send() == b""
    # The other call is unaffected.
    pair.server.send_message(other, b"fine")
    pair.server.end_call(other, GrpcStatus.OK)
    pair.to_client()
    assert pair.seen[other].messages == [b"fine"]
    assert pair.seen[sid].kinds == ["headers", "message"]


def test_client_reset_while_response_is_stalled_drops_it() -> None:
    pair = Pair(client_window=100)
    sid = pair.request(b"x")
    pair.to_server()
    pair.server.send_message(sid, b"z" * 10_000)
    pair.server.end_call(sid, GrpcStatus.OK)
    pair.to_client(ack=False)
    assert pair.server.unsent(sid) > 0
    pair.client.reset_stream(sid)
    assert [type(e) for e in pair.to_server()] == [CallReset]
    assert pair.server.unsent(sid) == 0
    assert pair.server.open_calls == 0
    assert pair.server.data_to_send() == b""


# ---------------------------------------------------------------- the client's GOAWAY
def test_client_goaway_lets_open_calls_finish_and_refuses_new_ones() -> None:
    pair = Pair()
    telemetry = pair.request(b"settings", end=False)
    pair.to_server()
    pair.server.send_message(telemetry, b"settings reply")
    pair.to_client()
    # grpc-js's shutdown: GOAWAY while its Telemetry stream is still half-open. Written raw,
    # so the client's own h2 stays open (as grpc-js's does) and can go on using the stream.
    goaway = GoAwayFrame(stream_id=0, last_stream_id=0, error_code=0).serialize()
    events = pair.to_server(goaway)
    assert events == [PeerGoingAway(0, 0)]
    assert pair.server.going_away
    # The open stream finishes: more data, the half-close, then our answer and trailers.
    pair.client.send_data(telemetry, frame(b"last words"), end_stream=True)
    assert pair.to_server() == [
        CallMessage(telemetry, b"last words"),
        CallHalfClosed(telemetry),
    ]
    pair.server.end_call(telemetry, GrpcStatus.OK)
    pair.to_client()
    assert pair.seen[telemetry].kinds == ["headers", "message", "trailers", "end"]
    assert pair.seen[telemetry].status == (0, "")
    # A new stream after the GOAWAY is refused.
    late = pair.request(b"too late")
    assert pair.to_server() == []
    pair.to_client()
    assert pair.seen[late].kinds == ["reset"]
    assert pair.seen[late].first("reset") == h2.errors.ErrorCodes.REFUSED_STREAM
    assert pair.server.open_calls == 0
    # Our own close still works after it.
    pair.server.close()
    pair.to_client()
    assert any(isinstance(e, h2.events.ConnectionTerminated) for e in pair.client_events)


def test_goaway_split_across_reads_is_still_withheld() -> None:
    pair = Pair()
    sid = pair.request(b"x", end=False)
    pair.to_server()
    goaway = GoAwayFrame(stream_id=0, last_stream_id=0, error_code=0, additional_data=b"bye")
    data = goaway.serialize()
    events: list[Event] = []
    for i in range(len(data)):
        events += pair.server.receive_data(data[i : i + 1])
    assert events == [PeerGoingAway(0, 0)]
    pair.client.send_data(sid, b"", end_stream=True)
    assert pair.to_server() == [CallHalfClosed(sid)]


# ---------------------------------------------------------------- flow control
def test_tiny_client_window_gets_large_response_only_through_window_updates() -> None:
    window = 1000
    pair = Pair(client_window=window)
    sid = pair.request(b"receive")
    pair.to_server()
    body = bytes(range(256)) * 400  # 102_400 bytes
    pair.server.send_message(sid, body)
    pair.server.send_message(sid, b"tail")
    pair.server.end_call(sid, GrpcStatus.OK)
    expected = len(frame(body)) + len(frame(b"tail"))
    assert pair.server.unsent(sid) == expected - window
    received = 0
    rounds = 0
    for rounds in range(1, 1000):  # noqa: B007 (bounded: each round moves ≤ the window)
        events = pair.to_client(ack=False)
        data = [e for e in events if isinstance(e, h2.events.DataReceived)]
        got = sum(len(e.data or b"") for e in data)
        assert got <= window
        received += got
        seen = pair.seen[sid]
        if "trailers" in seen.kinds:
            break
        # No window update sent: nothing more comes.
        assert pair.server.data_to_send() == b""
        assert pair.server.unsent(sid) == expected - received
        for ev in data:
            pair.client.acknowledge_received_data(ev.flow_controlled_length, sid)
        assert pair.to_server() == []  # WINDOW_UPDATEs are no call events
    assert received == expected
    assert rounds > expected // window
    assert pair.server.unsent(sid) == 0
    seen = pair.seen[sid]
    assert seen.kinds == ["headers", "message", "message", "trailers", "end"]
    assert seen.messages == [body, b"tail"]


def test_stalled_call_does_not_hold_the_others() -> None:
    pair = Pair(client_window=500)
    slow = pair.request(b"big")
    quick = pair.request(b"small")
    pair.to_server()
    pair.server.send_message(slow, b"s" * 5000)
    pair.server.end_call(slow, GrpcStatus.OK)
    pair.server.send_message(quick, b"q" * 100)
    pair.server.end_call(quick, GrpcStatus.OK)
    pair.to_client(ack=False)
    assert pair.seen[quick].kinds == ["headers", "message", "trailers", "end"]
    assert "trailers" not in pair.seen[slow].kinds
    assert pair.server.unsent(slow) > 0
    assert pair.server.unsent(quick) == 0


def test_raised_initial_window_releases_a_stalled_response() -> None:
    pair = Pair(client_window=100)
    sid = pair.request(b"x")
    pair.to_server()
    pair.server.send_message(sid, b"w" * 20_000)
    pair.server.end_call(sid, GrpcStatus.OK)
    pair.to_client(ack=False)
    assert pair.server.unsent(sid) > 0
    # SETTINGS_INITIAL_WINDOW_SIZE grows every stream's window (RFC 9113 §6.9.2).
    pair.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    pair.to_server()
    pair.to_client(ack=False)
    assert pair.server.unsent(sid) == 0
    assert pair.seen[sid].messages == [b"w" * 20_000]
    assert pair.seen[sid].kinds[-2:] == ["trailers", "end"]


def test_connection_window_is_shared_and_reopened() -> None:
    # The client's connection window stays at 65 535; three 40 KB responses need updates.
    pair = Pair()
    sids = [pair.request(b"x") for _ in range(3)]
    pair.to_server()
    for sid in sids:
        pair.server.send_message(sid, bytes([sid]) * 40_000)
        pair.server.end_call(sid, GrpcStatus.OK)
    assert sum(pair.server.unsent(s) for s in sids) > 0
    for _ in range(100):
        pair.to_client(ack=True)
        pair.to_server()
        if all("end" in pair.seen.get(s, Seen()).kinds for s in sids):
            break
    for sid in sids:
        assert pair.seen[sid].messages == [bytes([sid]) * 40_000]
        assert pair.server.unsent(sid) == 0


def test_large_request_is_acknowledged_as_it_is_read() -> None:
    # The server's stream window is 1 MiB; a 3 MiB request needs its window updates.
    pair = Pair()
    sid = pair.client.get_next_available_stream_id()
    pair.client.send_headers(sid, request_headers())
    body = frame(b"r" * (3 << 20))
    sent = 0
    messages: list[bytes] = []
    for _ in range(1000):
        room = min(pair.client.local_flow_control_window(sid), len(body) - sent)
        while room > 0:
            chunk = min(room, pair.client.max_outbound_frame_size)
            pair.client.send_data(sid, body[sent : sent + chunk])
            sent += chunk
            room -= chunk
        if sent == len(body):
            pair.client.end_stream(sid)
        events = pair.to_server()
        messages += [e.payload for e in events if isinstance(e, CallMessage)]
        pair.to_client()
        if any(isinstance(e, CallHalfClosed) for e in events):
            break
    assert messages == [b"r" * (3 << 20)]


# ---------------------------------------------------------------- connection errors
def test_garbage_preface_is_a_connection_error() -> None:
    server = GrpcConnection()
    server.initiate()
    with pytest.raises(GrpcConnectionError):
        server.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert server.closed
    assert server.data_to_send()  # h2's GOAWAY (after our preface)


def test_broken_frame_after_preface_is_a_connection_error_with_goaway() -> None:
    pair = Pair()
    with pytest.raises(GrpcConnectionError):
        # A DATA frame on stream 0 is a connection error (RFC 9113 §6.1).
        pair.server.receive_data(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")
    pair.to_client()
    assert any(isinstance(e, h2.events.ConnectionTerminated) for e in pair.client_events)


def test_close_sends_goaway_once() -> None:
    pair = Pair()
    pair.server.close()
    pair.server.close()
    pair.to_client()
    assert sum(isinstance(e, h2.events.ConnectionTerminated) for e in pair.client_events) == 1


def test_sends_after_close_do_nothing() -> None:
    # A call task still running when the server closed the connection (a stop that ran out
    # of time) must not make h2 raise on its closed state machine.
    pair = Pair()
    sid = pair.request(b"x")
    pair.to_server()
    pair.server.close()
    pair.server.send_message(sid, b"late")
    pair.server.end_call(sid, GrpcStatus.OK)
    pair.to_client()
    assert sid not in pair.seen
    assert any(isinstance(e, h2.events.ConnectionTerminated) for e in pair.client_events)


def test_sends_after_a_connection_error_do_nothing() -> None:
    pair = Pair()
    sid = pair.request(b"x")
    pair.to_server()
    with pytest.raises(GrpcConnectionError):
        pair.server.receive_data(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")
    pair.server.send_message(sid, b"late")
    pair.server.end_call(sid, GrpcStatus.INTERNAL, "late")
    pair.to_client()
    assert sid not in pair.seen


def test_ping_is_answered() -> None:
    pair = Pair()
    pair.client.ping(b"12345678")
    assert pair.to_server() == []
    pair.to_client()
    assert any(isinstance(e, h2.events.PingAckReceived) for e in pair.client_events)


# ---------------------------------------------------------------- fuzz
_FRAME_TYPES = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0x42])
_STREAM_IDS = st.sampled_from([0, 1, 2, 3, 5, 7, 0x7FFFFFFF, 0x80000001])


@st.composite
def _raw_frames(draw: st.DrawFn) -> bytes:
    payload = draw(st.binary(max_size=48))
    length = draw(st.one_of(st.just(len(payload)), st.integers(0, 70_000)))
    ftype, flags, sid = draw(_FRAME_TYPES), draw(st.integers(0, 255)), draw(_STREAM_IDS)
    return struct.pack(">I", length)[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


@st.composite
def _header_frames(draw: st.DrawFn) -> bytes:
    """A HEADERS frame with a valid HPACK block of (mostly) request-like headers."""
    names = st.sampled_from(
        [":method", ":path", ":scheme", ":authority", "content-type", "te", "grpc-timeout",
         "grpc-encoding", "x-mq-client-id", ":status", "connection", "Upper"]
    )  # fmt: skip
    values = st.one_of(
        st.sampled_from(["POST", "GET", PATH, "http", "application/grpc", "trailers", "1S"]),
        st.text(max_size=12),
    )
    raw_values = st.one_of(
        values.map(lambda v: v.encode("utf-8", "replace")), st.binary(max_size=6)
    )
    headers = draw(st.lists(st.tuples(names.map(str.encode), raw_values), max_size=8))
    if draw(st.booleans()):
        headers = [(k.encode(), v.encode()) for k, v in request_headers()] + headers
    block = hpack.Encoder().encode(headers)
    flags = draw(st.sampled_from([0x4, 0x5, 0x0, 0x1]))  # END_HEADERS / END_STREAM
    sid = draw(_STREAM_IDS)
    return struct.pack(">I", len(block))[1:] + bytes([1, flags]) + struct.pack(">I", sid) + block


@st.composite
def _data_frames(draw: st.DrawFn) -> bytes:
    """DATA on an odd stream with gRPC-ish content."""
    payload = draw(
        st.one_of(
            st.builds(frame, st.binary(max_size=20)),
            st.builds(frame, st.binary(max_size=4), st.integers(0, 3)),
            st.binary(max_size=20),
        )
    )
    flags = draw(st.sampled_from([0, 1]))
    sid = draw(st.sampled_from([1, 3, 5]))
    return (
        struct.pack(">I", len(payload))[1:] + bytes([0, flags]) + struct.pack(">I", sid) + payload
    )


_CHUNKS = st.lists(
    st.one_of(st.binary(max_size=40), _raw_frames(), _header_frames(), _data_frames()),
    max_size=12,
)


@settings(max_examples=int(os.environ.get("TRIMQ_FUZZ_EXAMPLES", "300")))
@given(
    chunks=_CHUNKS,
    cuts=st.lists(st.integers(0, 400), max_size=6),
    answer=st.sampled_from([0, 10, 100_000]),
    open_call=st.booleans(),
)
def test_fuzz_after_preface_only_connection_errors(
    chunks: list[bytes], cuts: list[int], answer: int, open_call: bool
) -> None:
    """After a valid preface (and maybe an open call on stream 1 with a response stalled on
    the window), arbitrary bytes raise nothing but GrpcConnectionError, and what the I/O
    layer then does with the events never raises."""
    pair = Pair(client_window=1000)
    if open_call:
        sid = pair.request(b"open", end=False)
        pair.to_server()
        pair.server.send_message(sid, b"s" * 5000)
    data = b"".join(chunks)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in itertools.pairwise(points):
        try:
            events = pair.server.receive_data(data[a:b])
        except GrpcConnectionError:
            assert pair.server.closed
            pair.server.data_to_send()
            return
        for ev in events:
            # What the I/O layer does with them must not raise either.
            if isinstance(ev, CallStarted) and answer:
                pair.server.send_message(ev.stream_id, b"r" * answer)
                pair.server.end_call(ev.stream_id, GrpcStatus.OK)
            elif isinstance(ev, CallHalfClosed):
                pair.server.end_call(ev.stream_id, GrpcStatus.OK)
            elif isinstance(ev, CallReset):
                # Nothing more is queued (what was queued before may still drain, then the
                # trailers of the framing error).
                unsent = pair.server.unsent(ev.stream_id)
                pair.server.send_message(ev.stream_id, b"ignored")
                assert pair.server.unsent(ev.stream_id) == unsent
        pair.server.data_to_send()


# ---------------------------------------------------------------- the HTTP/2 wire, raw
class Raw:
    """A server fed hand-built frames (what an h2 client would never send, or sends only in
    some configurations), its output parsed back into (type, flags, stream, payload)."""

    def __init__(self, **server_kwargs: Any) -> None:
        self.server = GrpcConnection(**server_kwargs)
        self.server.initiate()
        self.encoder = hpack.Encoder()
        self.server.data_to_send()
        assert self.feed(PREFACE + raw_frame(0x4, b"")) == []
        self.frames()  # our SETTINGS ack

    def feed(self, data: bytes) -> list[Event]:
        return self.server.receive_data(data)

    def block(self, **overrides: str | None) -> bytes:
        return bytes(self.encoder.encode(request_headers(**overrides)))

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        data, out = self.server.data_to_send(), []
        while data:
            length = int.from_bytes(data[:3], "big")
            ftype, flags = data[3], data[4]
            sid = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
            out.append((ftype, flags, sid, data[9 : 9 + length]))
            data = data[9 + length :]
        return out

    def goaway_code(self) -> int:
        [code] = [struct.unpack(">II", p[:8])[1] for t, _, _, p in self.frames() if t == 0x7]
        return int(code)


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def raw_frame(ftype: int, payload: bytes, flags: int = 0, sid: int = 0) -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([ftype, flags])
        + struct.pack(">I", sid)
        + payload
    )


def test_headers_continued_padded_and_prioritised_make_one_call() -> None:
    raw = Raw()
    block = raw.block()
    padded = bytes([3]) + bytes(5) + block[:10] + b"\0\0\0"  # PADDED | PRIORITY, 3 pad bytes
    events = raw.feed(
        raw_frame(0x1, padded, flags=0x8 | 0x20, sid=1)
        + raw_frame(0x9, block[10:20], sid=1)
        + raw_frame(0x9, block[20:], flags=0x4, sid=1)
        + raw_frame(0x0, bytes([2]) + frame(b"hi") + b"\0\0", flags=0x8 | 0x1, sid=1)
    )
    assert [type(e) for e in events] == [CallStarted, CallMessage, CallHalfClosed]
    assert started(events).path == PATH


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        # A header block interrupted by another frame.
        (raw_frame(0x1, b"\x82", sid=1) + raw_frame(0x6, bytes(8)), 0x1),
        # CONTINUATION without HEADERS.
        (raw_frame(0x9, b"\x82", flags=0x4, sid=1), 0x1),
        # HPACK that does not decode (an index far past both tables).
        (raw_frame(0x1, b"\xff\xff\xff\x0f", flags=0x4, sid=1), 0x9),
        # A client may not push.
        (raw_frame(0x5, bytes(8), flags=0x4, sid=1), 0x1),
        # Larger than our advertised SETTINGS_MAX_FRAME_SIZE (1 MiB).
        (struct.pack(">I", (1 << 20) + 1)[1:] + b"\x00\x00\x00\x00\x00\x01", 0x6),
        # An initial window past 2^31 - 1.
        (raw_frame(0x4, struct.pack(">HI", 0x4, 1 << 31)), 0x3),
        # A zero increment for the connection.
        (raw_frame(0x8, struct.pack(">I", 0)), 0x1),
        # PING of the wrong size.
        (raw_frame(0x6, bytes(7)), 0x6),
        # DATA on a stream the client never opened.
        (raw_frame(0x0, b"x", sid=5), 0x1),
        # Padding longer than the frame.
        (raw_frame(0x0, bytes([9]) + b"x", flags=0x8, sid=1), 0x1),
    ],
)
def test_connection_errors_carry_their_http2_code(wire: bytes, code: int) -> None:
    raw = Raw()
    with pytest.raises(GrpcConnectionError):
        raw.feed(wire)
    assert raw.goaway_code() == code
    assert raw.server.closed and raw.feed(b"anything") == []


def test_continuation_flood_is_enhance_your_calm() -> None:
    raw = Raw()
    raw.feed(raw_frame(0x1, b"\x82", sid=1))
    flood = raw_frame(0x9, b"\x40" * 16_384, sid=1) * 17  # 17 × 16 KiB: past the 256 KiB cap
    with pytest.raises(GrpcConnectionError):
        raw.feed(flood)
    assert raw.goaway_code() == 0xB


def test_stream_errors_reset_only_their_stream() -> None:
    raw = Raw()
    raw.feed(raw_frame(0x1, raw.block(), flags=0x4, sid=1))
    events = raw.feed(raw_frame(0x8, struct.pack(">I", 0), sid=1))  # zero increment
    assert [type(e) for e in events] == [CallReset]
    assert [(t, s, p) for t, _, s, p in raw.frames()] == [(0x3, 1, struct.pack(">I", 1))]
    # The connection goes on.
    events = raw.feed(raw_frame(0x1, raw.block(), flags=0x4 | 0x1, sid=3))
    assert [type(e) for e in events] == [CallStarted, CallHalfClosed]


def test_streams_over_the_limit_are_refused() -> None:
    raw = Raw(max_concurrent_streams=1)
    events = raw.feed(
        raw_frame(0x1, raw.block(), flags=0x4, sid=1)
        + raw_frame(0x1, raw.block(), flags=0x4, sid=3)
    )
    assert [type(e) for e in events] == [CallStarted]
    assert [(t, s, p) for t, _, s, p in raw.frames()] == [(0x3, 3, struct.pack(">I", 7))]


def test_long_status_message_is_cut_to_what_clients_accept() -> None:
    pair = Pair()
    sid = pair.request(b"x")
    pair.to_server()
    message = "é" * 20_000  # percent-encoded: 120 000 bytes, past any client's metadata limit
    pair.server.end_call(sid, GrpcStatus.INTERNAL, message)
    pair.to_client()
    status, text = pair.seen[sid].status
    assert status == GrpcStatus.INTERNAL
    assert text.startswith("é" * 500) and len(text) < 1000
