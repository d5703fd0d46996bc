"""trimq's gRPC front end against what trio itself can do (issue 16: "server CPU ≤ 250 µs per
unary gRPC call and ≤ 25 µs per streamed message"), measured with one cheap raw HTTP/2
client for every server.

``bench_grpc`` measures with the official RocketMQ Python client (grpcio), which costs about
twice what the server does: the client is what it measures. Here the client is this
process: a blocking stdlib socket (TCP_NODELAY) speaking HTTP/2 by hand. Its requests are
encoded before the clock starts (a HEADERS frame whose HPACK block holds only static-table
references and literals without indexing, so the same block is valid on every stream, and a
DATA frame with the gRPC-framed protobuf; only the stream ids are patched in), and replies
are read by walking frame headers: a call is done at the HEADERS frame with END_STREAM (its
trailers). Every connection starts with checked calls outside the clock (every header block
HPACK-decoded, ``grpc-status`` 0, the protobuf status OK); in the timed loop each trailer
block must be one seen there and every 100th reply message is parsed and checked.

Three servers, in the same run, rounds interleaved (the order rotating) so they see the same
noise:

* **trimq**: ``python -m broker --grpc-port 0`` (of this checkout or ``--broker-root``), a
  fresh data dir, topics auto-created;
* **the floor**: a trio server in its own process that walks frame headers only (no HPACK)
  and answers each request stream, as soon as its END_STREAM arrives, with pre-encoded
  frames (response headers, a reply message the size of trimq's, ``grpc-status 0``
  trailers), stream id patched in, everything a read brought in one ``send_all``; it acks
  SETTINGS and PINGs and replenishes the connection window: the most any gRPC server on
  trio can do (:func:`serve_floor`);
* **null**: ``benchmarks/grpc_null_server.py``, a do-nothing ``grpc.aio`` server (grpcio's
  C core) in the official client's venv (:mod:`scripts.interop_setup`).

Workloads, at each ``--sizes`` body size:

* ``unary_one``: ``--count`` SendMessage calls, one in flight;
* ``unary_window``: 4 × ``--count`` SendMessage calls, ``--window`` (100) written at once
  (capped to the server's SETTINGS_MAX_CONCURRENT_STREAMS, reported as ``window_cap``),
  then read until all their trailers arrived;
* ``streamed``: 4 × ``--count`` messages by ReceiveMessage calls of 32, one call in flight,
  from a backlog put into a topic of its own by raw SendMessage windows before the clock
  (trimq; one consumer group per round and size, messages invisible for an hour). The floor
  answers on a port of its own per body size with a pre-encoded stream (a status response,
  32 message responses the size of trimq's, a delivery timestamp, trailers); null (one per
  body size) answers with its canned messages. The figure is per streamed message.

Each figure is the median of ``--runs`` rounds. Server CPU per call (per message for
``streamed``) is the delta across the timed loop of the process's threads' run time from
``/proc/<pid>/task/*/schedstat`` (ns; ``server_us``), with the utime+stime of
``/proc/<pid>/stat`` beside it (``server_us_stat``: 10 ms ticks, a few for the floor's
loops); the client's is this process's ``time.process_time``; ``reply_bytes`` the DATA
bytes per call (or message), to compare the floor's replies with trimq's. The servers run
for the whole run (trimq with one data dir); every loop is bounded by a count and by
``--max-seconds``; every server binds to loopback and is stopped by pid.

Usage: python -m benchmarks.bench_grpc_floor [--runs 3] [--sizes 128,1024] [--count 3000]
    [--window 100] [--workloads unary_one,unary_window,streamed] [--broker-root CHECKOUT]
    [--out rows.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_broker import proc_cpu_seconds, write_row
from benchmarks.bench_floor import RawClient, median_of, spawned_server
from benchmarks.bench_grpc import null_server, official_client_python, trimq_server
from broker.sockio import SocketReader, send_now
from protocol.grpc import http2, schema
from protocol.grpc.codes import Code
from protocol.grpc.framing import encode_message
from protocol.grpc.hpack import HpackDecoder
from protocol.grpc.http2 import Flag, FrameType, Setting

SERVICE = "/apache.rocketmq.v2.MessagingService/"
TOPIC = "bench_grpc_floor"
BATCH = 32
MESSAGE_ID = "01" + "0A0B0C0D0E0F" + "00001234" + "0000ABCD" + "000001"  # 34 hex, v1 layout
WORKLOADS = ("unary_one", "unary_window", "streamed")
#: Aims of the issue, µs of server CPU.
AIM_UNARY_US = 250.0
AIM_STREAMED_US = 25.0
#: The client's receive window (stream and connection): the largest there is.
CLIENT_WINDOW = http2.MAX_WINDOW
#: The floor's windows, as trimq's (protocol/grpc/connection.py).
FLOOR_STREAM_WINDOW = 1024 * 1024
FLOOR_CONNECTION_WINDOW = 16 * 1024 * 1024
FLOOR_MAX_STREAMS = 1000
#: Every how many reply messages one is parsed in the timed loop.
CHECK_EVERY = 100
#: Calls checked in full at the start of every connection (a server's HPACK encoder may
#: index its trailers: the block settles after the first call).
CHECKED = 3
_HEAD = struct.Struct(">IBI")
#: The official Python client's metadata (reference/grpc-frontend.md); one request id for
#: every call (the block must not change).
METADATA = (
    (b"x-mq-language", b"PYTHON"),
    (b"x-mq-protocol", b"GRPC_V2"),
    (b"x-mq-client-version", b"5.1.2"),
    (b"x-mq-date-time", b"20261125T011500Z"),
    (b"x-mq-request-id", b"7d3f4a52-5c1e-4d6b-9a0e-2f1c8b7e6a90"),
    (b"x-mq-client-id", b"bench-host@4242@0@bench0"),
    (b"x-mq-namespace", b""),
)


# ---------------------------------------------------------------- messages (our schema)
def send_request(topic: str, size: int) -> bytes:
    """A serialised SendMessageRequest with one message, as the official Python client
    builds it (reference/grpc-frontend.md: tag, message id, type, born time in seconds,
    born host, IDENTITY encoding)."""
    req = schema.SendMessageRequest()
    message = req.messages.add()
    message.topic.name = topic
    message.body = b"x" * size
    system = message.system_properties
    system.tag = "bench"
    system.message_id = MESSAGE_ID
    system.message_type = schema.MessageType.NORMAL
    system.born_timestamp.seconds = int(time.time())
    system.born_host = "bench-host"
    system.body_encoding = schema.Encoding.IDENTITY
    return bytes(req.SerializeToString())


def send_response() -> bytes:
    """A serialised SendMessageResponse as trimq answers one message (status OK and one
    entry with the message id and an offset)."""
    out = schema.SendMessageResponse()
    out.status.code = Code.OK
    out.status.message = "OK"
    entry = out.entries.add()
    entry.status.code = Code.OK
    entry.status.message = "OK"
    entry.message_id = MESSAGE_ID
    entry.offset = 123456
    return bytes(out.SerializeToString())


def receive_request(topic: str, group: str) -> bytes:
    """A SimpleConsumer's ReceiveMessageRequest: any queue, tag ``*``, 32 messages,
    invisible for an hour (nothing comes back during the run), long poll 5 s."""
    req = schema.ReceiveMessageRequest()
    req.group.name = group
    req.message_queue.topic.name = topic
    req.message_queue.id = -1
    req.filter_expression.type = schema.FilterType.TAG
    req.filter_expression.expression = "*"
    req.batch_size = BATCH
    req.invisible_duration.seconds = 3600
    req.long_polling_timeout.seconds = 5
    return bytes(req.SerializeToString())


def receive_responses(topic: str, size: int) -> list[bytes]:
    """What a ReceiveMessage of :data:`BATCH` messages answers, serialised: a status, the
    messages (the system properties trimq fills), a delivery timestamp."""
    head = schema.ReceiveMessageResponse()
    head.status.code = Code.OK
    head.status.message = "OK"
    out = [bytes(head.SerializeToString())]
    now = int(time.time())
    for i in range(BATCH):
        resp = schema.ReceiveMessageResponse()
        m = resp.message
        m.topic.name = topic
        m.body = b"x" * size
        s = m.system_properties
        s.tag = "bench"
        s.message_id = MESSAGE_ID
        s.body_digest.type = schema.DigestType.CRC32
        s.body_digest.checksum = "1A2B3C4D"
        s.body_encoding = schema.Encoding.IDENTITY
        s.message_type = schema.MessageType.NORMAL
        s.born_timestamp.seconds = now
        s.born_timestamp.nanos = 123_000_000
        s.born_host = "127.0.0.1:54321"
        s.store_timestamp.seconds = now
        s.store_timestamp.nanos = 124_000_000
        s.store_host = "127.0.0.1:10911"
        s.delivery_timestamp.seconds = now
        s.receipt_handle = "x" * 64
        s.queue_id = 3
        s.queue_offset = 100_000 + i
        s.invisible_duration.seconds = 3600
        s.delivery_attempt = 1
        out.append(bytes(resp.SerializeToString()))
    tail = schema.ReceiveMessageResponse()
    tail.delivery_timestamp.seconds = now
    tail.delivery_timestamp.nanos = 125_000_000
    out.append(bytes(tail.SerializeToString()))
    return out


def _status_ok(name: str, message: bytes) -> None:
    """Fail loudly unless the serialised response ``message`` of method ``name`` carries a
    v2 status OK (for SendMessage also every entry's)."""
    cls = schema.SendMessageResponse if name == "SendMessage" else schema.ReceiveMessageResponse
    resp = cls.FromString(message)
    if name == "SendMessage":
        codes = [resp.status.code, *(e.status.code for e in resp.entries)]
    elif resp.HasField("status"):
        codes = [resp.status.code]
    else:
        return  # a message or the delivery timestamp
    if any(code != Code.OK for code in codes):
        raise RuntimeError(f"{name}: status not OK: {resp}")


# ---------------------------------------------------------------- HTTP/2 pieces
def request_block(method: str) -> bytes:
    """The request header block: static-table references and literals without indexing
    only, so it leaves the server's HPACK table alone and is valid on every stream."""
    path = (SERVICE + method).encode()
    authority = b"127.0.0.1"
    block = b"\x83\x86"  # :method POST (static 3), :scheme http (static 6)
    block += http2.hpack_int(4, 4) + http2.hpack_int(len(path), 7) + path  # :path (name 4)
    block += http2.hpack_int(1, 4) + http2.hpack_int(len(authority), 7) + authority
    block += http2.hpack_int(31, 4) + http2.hpack_int(16, 7) + b"application/grpc"
    block += http2.literal(b"te", b"trailers")
    for name, value in METADATA:  # what the official Python client sends (no credentials)
        block += http2.literal(name, value)
    return block


@dataclass(frozen=True)
class Pieces:
    """A stream's frames cut around their stream ids: ``pieces[0] + sid + pieces[1] + sid
    + …``; ``data`` is the DATA payload bytes (flow control)."""

    pieces: tuple[bytes, ...]
    data: int = 0

    def join(self, sid: bytes) -> list[bytes]:
        out = [self.pieces[0]]
        for piece in self.pieces[1:]:
            out += (sid, piece)
        return out


def cut(frames: list[tuple[int, int, bytes]]) -> Pieces:
    """(type, flags, payload) frames of one stream as :class:`Pieces`."""
    pieces: list[bytes] = []
    tail = b""
    data = 0
    for ftype, flags, payload in frames:
        head = _HEAD.pack(len(payload) << 8 | ftype, flags, 0)
        pieces.append(tail + head[:5])
        tail = payload
        if ftype == FrameType.DATA:
            data += len(payload)
    pieces.append(tail)
    return Pieces(tuple(pieces), data)


def request_pieces(method: str, message: bytes) -> Pieces:
    return cut(
        [
            (FrameType.HEADERS, Flag.END_HEADERS, request_block(method)),
            (FrameType.DATA, Flag.END_STREAM, encode_message(message)),
        ]
    )


def response_pieces(messages: list[bytes]) -> Pieces:
    """Response headers, a DATA frame per message, OK trailers (as trimq writes them)."""
    frames = [(int(FrameType.HEADERS), Flag.END_HEADERS, http2.RESPONSE_HEADERS_BLOCK)]
    frames += [(int(FrameType.DATA), 0, encode_message(m)) for m in messages]
    frames.append((FrameType.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, http2.OK_TRAILERS_BLOCK))
    return cut(frames)


# ---------------------------------------------------------------- the floor server
async def _floor_connection(reply: Pieces, stream: trio.SocketStream, sockio: bool) -> None:
    buf = bytearray()
    # With ``sockio``: trimq's own socket path (single non-blocking syscalls, no scheduler
    # round after a read or write that did not wait), else trio's stream calls.
    sock = stream.socket
    reader = SocketReader(sock, 262144) if sockio else None
    out: list[bytes] = [
        http2.settings_frame(
            {
                Setting.MAX_CONCURRENT_STREAMS: FLOOR_MAX_STREAMS,
                Setting.INITIAL_WINDOW_SIZE: FLOOR_STREAM_WINDOW,
            }
        ),
        http2.window_update(0, FLOOR_CONNECTION_WINDOW - http2.DEFAULT_WINDOW),
    ]
    preface = False
    unacked = 0
    try:
        while True:  # ends with the connection
            data = await (stream.receive_some(262144) if reader is None else reader.receive_some())
            if not data:
                return
            buf += data
            if not preface:
                if len(buf) < len(http2.CONNECTION_PREFACE):
                    continue
                if not buf.startswith(http2.CONNECTION_PREFACE):
                    return
                del buf[: len(http2.CONNECTION_PREFACE)]
                preface = True
            pos, end = 0, len(buf)
            while end - pos >= 9:
                nxt = pos + 9 + (buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2])
                if nxt > end:
                    break
                ftype, flags = buf[pos + 3], buf[pos + 4]
                if ftype == FrameType.DATA:
                    unacked += nxt - pos - 9
                if ftype <= FrameType.HEADERS:
                    if flags & Flag.END_STREAM:
                        out += reply.join(bytes(buf[pos + 5 : pos + 9]))
                elif ftype == FrameType.SETTINGS:
                    if not flags & Flag.ACK:
                        out.append(http2.SETTINGS_ACK)
                elif ftype == FrameType.PING:
                    if not flags & Flag.ACK:
                        out.append(http2.ping_ack(bytes(buf[pos + 9 : nxt])))
                elif ftype == FrameType.GOAWAY:
                    return
                pos = nxt
            del buf[:pos]
            if unacked >= FLOOR_CONNECTION_WINDOW // 2:
                out.append(http2.window_update(0, unacked))
                unacked = 0
            if out:
                data = b"".join(out)
                sent = 0 if reader is None else send_now(sock, data)
                if sent < len(data):
                    await stream.send_all(data[sent:])
                out = []
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


def serve_floor(port_out: Any, replies: list[Pieces], sockio: bool = False) -> None:
    """The floor server's process: a port per reply (every call on it answered with that
    reply; the ports sent through ``port_out``), until SIGTERM. Decoding no HPACK, it knows
    the method (and the body size of a receive) by the port."""

    async def main() -> None:
        listeners = [await trio.open_tcp_listeners(0, host="127.0.0.1") for _ in replies]
        port_out.send([ls[0].socket.getsockname()[1] for ls in listeners])

        def handler(reply: Pieces) -> Callable[[trio.SocketStream], Awaitable[None]]:
            async def serve(stream: trio.SocketStream) -> None:
                await _floor_connection(reply, stream, sockio)

            return serve

        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                for reply, ls in zip(replies, listeners, strict=True):
                    nursery.start_soon(trio.serve_listeners, handler(reply), ls)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

    trio.run(main)


@contextmanager
def floor_process(replies: list[Pieces], sockio: bool = False) -> Iterator[tuple[int, list[int]]]:
    """Run the floor server; yields (pid, a port per reply); SIGTERM by pid."""
    with spawned_server(serve_floor, replies, sockio) as (pid, ports):
        yield pid, [int(p) for p in ports]


# ---------------------------------------------------------------- the raw client
class H2Client(RawClient):
    """One HTTP/2 connection over bench_floor's blocking socket client. Control frames it
    owes (SETTINGS and PING acks, WINDOW_UPDATEs) go out with its next write."""

    def __init__(self, port: int, deadline: float, method: str) -> None:
        super().__init__(port, deadline)
        self.method = method
        self.owed: list[bytes] = []
        self.next_sid = 1
        self.send_window = http2.DEFAULT_WINDOW  # the connection's, towards the server
        self.max_streams: int | None = None
        self.got_settings = False
        self.unacked = 0
        self.done = 0
        self.messages = 0
        self.received = 0  # DATA payload bytes
        #: Stream id -> the bytes of its gRPC message not yet complete.
        self.partial: dict[int, bytearray] = {}
        #: While set, every header block is HPACK-decoded and every message parsed.
        self.decoder: HpackDecoder | None = HpackDecoder()
        self.ok_trailers: set[bytes] = set()
        self.sock.sendall(
            http2.CONNECTION_PREFACE
            + http2.settings_frame(
                {Setting.ENABLE_PUSH: 0, Setting.INITIAL_WINDOW_SIZE: CLIENT_WINDOW}
            )
            + http2.window_update(0, CLIENT_WINDOW - http2.DEFAULT_WINDOW)
        )
        while not self.got_settings:
            self._more()
            self._walk()

    def _walk(self) -> None:
        """Take the complete frames in the buffer: count trailers and messages."""
        buf = self.buf
        pos, end = 0, len(buf)
        while end - pos >= 9:
            length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
            nxt = pos + 9 + length
            if nxt > end:
                break
            ftype, flags = buf[pos + 3], buf[pos + 4]
            if ftype == FrameType.DATA:
                self.unacked += length
                self.received += length
                if (
                    not self.partial
                    and length >= 5
                    and not buf[pos + 9]
                    and (buf[pos + 11] << 16 | buf[pos + 12] << 8 | buf[pos + 13]) + 5 == length
                    and not buf[pos + 10]
                ):  # one whole message (under 16 MiB), the common case
                    self.messages += 1
                    if self.decoder is not None or self.messages % CHECK_EVERY == 0:
                        _status_ok(self.method, bytes(buf[pos + 14 : nxt]))
                else:
                    self._data(int.from_bytes(buf[pos + 5 : pos + 9]), bytes(buf[pos + 9 : nxt]))
            elif ftype == FrameType.HEADERS:
                if self.decoder is not None:
                    self._check_headers(flags, bytes(buf[pos + 9 : nxt]))
                if flags & Flag.END_STREAM:
                    self.done += 1
                    if self.partial:
                        self._ended(int.from_bytes(buf[pos + 5 : pos + 9]))
                    if self.decoder is None and bytes(buf[pos + 9 : nxt]) not in self.ok_trailers:
                        raise RuntimeError(f"unknown trailers block {bytes(buf[pos + 9 : nxt])!r}")
            else:
                self._control(ftype, flags, bytes(buf[pos + 5 : nxt]))
            pos = nxt
        del buf[:pos]
        if self.unacked >= 1 << 20:
            self.owed.append(http2.window_update(0, self.unacked))
            self.unacked = 0

    def _data(self, sid: int, payload: bytes) -> None:
        """A DATA frame that is not one whole message: gRPC messages walked across the
        stream's frames (several in one frame, or one split over several)."""
        part = self.partial.setdefault(sid, bytearray())
        part += payload
        while len(part) >= 5:
            if part[0]:
                raise RuntimeError("a compressed gRPC message: not asked for")
            size = 5 + int.from_bytes(part[1:5])
            if len(part) < size:
                break
            self.messages += 1
            if self.decoder is not None or self.messages % CHECK_EVERY == 0:
                _status_ok(self.method, bytes(part[5:size]))
            del part[:size]
        if not part:
            del self.partial[sid]

    def _ended(self, sid: int) -> None:
        if self.partial.pop(sid, None):
            raise RuntimeError(f"stream {sid} ended inside a gRPC message")

    def _check_headers(self, flags: int, block: bytes) -> None:
        assert self.decoder is not None
        if not flags & Flag.END_HEADERS or flags & (Flag.PADDED | Flag.PRIORITY):
            raise RuntimeError(f"header frame flags {flags:#x} not handled")
        fields = dict(self.decoder.decode(block))
        if flags & Flag.END_STREAM:
            if fields.get("grpc-status") != "0":
                raise RuntimeError(f"{self.method}: call failed: {fields}")
            self.ok_trailers.add(block)
        elif fields.get(":status") != "200":
            raise RuntimeError(f"{self.method}: response headers {fields}")

    def _control(self, ftype: int, flags: int, body: bytes) -> None:
        sid, payload = struct.unpack_from(">I", body)[0], body[4:]
        if ftype == FrameType.SETTINGS and not flags & Flag.ACK:
            for key, value in http2.unpack_settings(payload):
                if key == Setting.MAX_CONCURRENT_STREAMS:
                    self.max_streams = value
            self.got_settings = True
            self.owed.append(http2.SETTINGS_ACK)
        elif ftype == FrameType.PING and not flags & Flag.ACK:
            self.owed.append(http2.ping_ack(payload))
        elif ftype == FrameType.WINDOW_UPDATE and sid == 0:
            self.send_window += http2.unpack_u32(payload) & 0x7FFFFFFF
        elif ftype == FrameType.RST_STREAM and http2.unpack_u32(payload):
            raise RuntimeError(f"RST_STREAM {http2.code_name(http2.unpack_u32(payload))} on {sid}")
        elif ftype == FrameType.GOAWAY:
            raise RuntimeError(f"GOAWAY {http2.unpack_goaway(payload)} {payload[8:]!r}")

    def calls(self, request: Pieces, n: int) -> None:
        """Write ``n`` calls (as the connection window allows), then read until all their
        trailers arrived."""
        target = self.done + n
        parts: list[bytes] = []
        sent = 0
        while sent < n:  # bounded by the deadline in _more
            while sent < n and request.data <= self.send_window:
                parts += request.join(self.next_sid.to_bytes(4, "big"))
                self.next_sid += 2
                self.send_window -= request.data
                sent += 1
            if parts or self.owed:
                self.sock.sendall(b"".join(self.owed + parts))
                self.owed, parts = [], []
            if sent < n:
                self._more()
                self._walk()
        while self.done < target:
            self._more()
            self._walk()
        if self.owed:
            self.sock.sendall(b"".join(self.owed))
            self.owed = []

    def repeat(self, request: Pieces, n: int, times: int) -> None:
        """:meth:`calls` of ``n`` calls, ``times`` times."""
        for _ in range(times):
            self.calls(request, n)

    def checked(self, request: Pieces, n: int) -> None:
        """``n`` calls one at a time with every header block decoded and every message
        checked; their trailer blocks are the ones the timed loop accepts."""
        for _ in range(n):
            self.calls(request, 1)
        self.decoder = None


# ---------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Target:
    name: str
    pid: int
    port: int
    #: Where ReceiveMessage calls go (the floor's second port).
    streamed_port: int = 0
    notes: dict[str, Any] = field(default_factory=dict, compare=False)


def unary(t: Target, req: Pieces, count: int, window: int, deadline: float) -> dict[str, float]:
    """SendMessage calls, ``window`` at a time; the timed figures."""
    client = H2Client(t.port, deadline, "SendMessage")
    try:
        client.checked(req, CHECKED)
        if client.max_streams is not None and window > client.max_streams:
            t.notes["window_cap"] = client.max_streams
            window = client.max_streams
        rounds = max(1, count // window)
        return timed(t, client, rounds * window, lambda: client.repeat(req, window, rounds))
    finally:
        client.close()


def streamed(t: Target, req: Pieces, count: int, deadline: float) -> dict[str, float]:
    """ReceiveMessage calls of :data:`BATCH` messages one at a time; figures per message."""
    client = H2Client(t.streamed_port or t.port, deadline, "ReceiveMessage")
    try:
        client.checked(req, CHECKED)
        calls = max(1, count // BATCH)
        before = client.messages
        row = timed(t, client, calls * BATCH, lambda: client.repeat(req, 1, calls))
        # Each call: a status, the messages, a delivery timestamp.
        got = client.messages - before - 2 * calls
        if got != calls * BATCH:
            raise RuntimeError(f"{t.name}: received {got} of {calls * BATCH} messages")
        return row
    finally:
        client.close()


def proc_runtime_seconds(pid: int) -> float:
    """CPU seconds run so far by the threads of process ``pid`` (``/proc/<pid>/task/*/
    schedstat``, nanoseconds: the 10 ms ticks of ``/proc/<pid>/stat`` are too coarse for a
    floor that spends a few ms in a whole loop)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return total / 1e9


def timed(t: Target, client: H2Client, n: int, fn: Callable[[], object]) -> dict[str, float]:
    """Run ``fn`` (``n`` calls or messages); rates, CPU per call and reply bytes per call."""
    received0 = client.received
    stat0, run0 = proc_cpu_seconds(t.pid), proc_runtime_seconds(t.pid)
    client0, wall0 = time.process_time(), time.perf_counter()
    fn()
    wall = time.perf_counter() - wall0
    stat, run = proc_cpu_seconds(t.pid) - stat0, proc_runtime_seconds(t.pid) - run0
    used = time.process_time() - client0
    return {
        "n": n,
        "per_s": n / wall,
        "server_us": run / n * 1e6,
        "server_us_stat": stat / n * 1e6,
        "client_us": used / n * 1e6,
        "reply_bytes": (client.received - received0) / n,
    }


def fill(t: Target, topic: str, size: int, n: int, deadline: float) -> None:
    """``n`` messages into ``topic`` by raw SendMessage windows of 100 (not timed)."""
    client = H2Client(t.port, deadline, "SendMessage")
    try:
        req = request_pieces("SendMessage", send_request(topic, size))
        client.checked(req, 1)
        left = n - 1
        while left > 0:
            k = min(100, left)
            client.calls(req, k)
            left -= k
    finally:
        client.close()


def run_round(
    targets: list[Target], size: int, round_no: int, args: argparse.Namespace
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.max_seconds
    send = request_pieces("SendMessage", send_request(TOPIC, size))
    for t in targets:
        for workload in args.workloads:
            if workload == "unary_one":
                row = unary(t, send, args.count, 1, deadline)
            elif workload == "unary_window":
                row = unary(t, send, args.count * 4, args.window, deadline)
            else:
                topic, group = (
                    f"{TOPIC}_recv_{size}_r{round_no}",
                    f"bench_floor_g{size}_r{round_no}",
                )
                n = args.count * 4 // BATCH * BATCH
                if t.name == "trimq":
                    fill(t, topic, size, n + CHECKED * BATCH, deadline)
                req = request_pieces("ReceiveMessage", receive_request(topic, group))
                row = streamed(t, req, n, deadline)
            rows.append({"target": t.name, "size": size, "workload": workload, **row, **t.notes})
    return rows


# ---------------------------------------------------------------- report
NAMES = ("trimq", "floor", "null")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def summarize(rows: list[dict[str, Any]]) -> str:
    """The table of medians, the ratios and the aims."""
    lines = [
        "| workload | size | trimq /s | floor /s | null /s | trimq / floor /s "
        "| trimq µs | floor µs | null µs | trimq / floor µs | client µs trimq / floor / null |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    keys = sorted(
        {(r["workload"], r["size"]) for r in rows}, key=lambda k: (k[1], WORKLOADS.index(k[0]))
    )
    aims: list[str] = []
    for workload, size in keys:
        rate = [median_of(rows, n, workload, size, "per_s") for n in NAMES]
        cpu = [median_of(rows, n, workload, size, "server_us") for n in NAMES]
        client = [median_of(rows, n, workload, size, "client_us") for n in NAMES]
        lines.append(
            f"| {workload} | {size} | {rate[0]:,.0f} | {rate[1]:,.0f} | {rate[2]:,.0f} "
            f"| {ratio(rate[0], rate[1]):.2f} | {cpu[0]:.1f} | {cpu[1]:.1f} | {cpu[2]:.1f} "
            f"| {ratio(cpu[0], cpu[1]):.2f} | {client[0]:.1f} / {client[1]:.1f} / {client[2]:.1f} |"
        )
        aim = AIM_STREAMED_US if workload == "streamed" else AIM_UNARY_US
        what = "streamed message" if workload == "streamed" else "unary call"
        verdict = "n/a" if cpu[0] != cpu[0] else "met" if cpu[0] <= aim else "MISSED"
        aims.append(
            f"trimq server CPU per {what} ≤ {aim:.0f} µs ({workload}, {size} B): "
            f"{cpu[0]:.1f} µs, {verdict} (floor {cpu[1]:.1f} µs)"
        )
    return "\n".join([*lines, "", *aims])


def _bad(line: str) -> bool:
    low = line.lower()
    return (
        "traceback" in low
        or '"level": "error"' in low
        or '"level": "warning"' in low
        or "exception" in low
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="128,1024")
    parser.add_argument("--count", type=int, default=3000, help="calls one in flight")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--workloads", default="unary_one,unary_window,streamed")
    parser.add_argument("--targets", default=",".join(NAMES))
    parser.add_argument("--max-seconds", type=float, default=120.0, help="bound of one round")
    parser.add_argument("--out", help="JSON-lines file for every row")
    parser.add_argument(
        "--floor-io",
        choices=("stream", "sockio"),
        default="stream",
        help="the floor's socket calls: trio's stream (as bench_floor's floor) or trimq's "
        "broker/sockio.py (what trimq's connections use)",
    )
    parser.add_argument("--client-python", type=Path, default=None,
                        help="python of the official client's venv (null server; default: "
                        "scripts.interop_setup ensure('py-grpc'))")  # fmt: skip
    parser.add_argument(
        "--broker-root", type=Path, help="run the broker of this checkout (a before/after)"
    )
    args = parser.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    if unknown := set(args.workloads) - set(WORKLOADS):
        raise SystemExit(f"unknown workloads {sorted(unknown)}")
    names = [n for n in args.targets.split(",") if n]
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict[str, Any]] = []
    with ExitStack() as servers:
        work = Path(servers.enter_context(tempfile.TemporaryDirectory(prefix="bench-grpc-floor-")))
        #: size -> name -> target (the floor and null answer receives sized per body)
        targets: dict[int, dict[str, Target]] = {size: {} for size in sizes}
        if "trimq" in names:
            pid, _, grpc_port = servers.enter_context(trimq_server(work, args.broker_root))
            for size in sizes:
                targets[size]["trimq"] = Target("trimq", pid, grpc_port)
        if "floor" in names:
            # The floor answers as trimq does (its messages the size trimq's are).
            replies = [response_pieces([send_response()])]
            replies += [response_pieces(receive_responses(TOPIC, size)) for size in sizes]
            f_pid, ports = servers.enter_context(floor_process(replies, args.floor_io == "sockio"))
            for size, port in zip(sizes, ports[1:], strict=True):
                targets[size]["floor"] = Target("floor", f_pid, ports[0], port)
        if "null" in names:
            python = official_client_python(args.client_python)
            home = work / "home"
            home.mkdir()
            env = {**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
            env.pop("PYTHONPATH", None)
            for size in sizes:
                own = work / f"null-{size}"
                own.mkdir()
                n_pid, n_port = servers.enter_context(null_server(python, env, own, size))
                targets[size]["null"] = Target("null", n_pid, n_port)
        for size in sizes:
            listed = ", ".join(
                f"{t.name} pid {t.pid} port {t.port}" for t in targets[size].values()
            )
            print(f"{size} B: {listed}", flush=True)
        print(f"loadavg {os.getloadavg()}", flush=True)
        order = [n for n in NAMES if n in names]
        for round_no in range(args.runs):
            for size in sizes:
                shift = (round_no * len(sizes) + sizes.index(size)) % len(order)
                turn = [targets[size][n] for n in order[shift:] + order[:shift]]
                got = run_round(turn, size, round_no, args)
                for row in got:
                    row["round"] = round_no
                    print(json.dumps(row), flush=True)
                    write_row(args.out, row)
                rows += got
        log = work / "broker.log"
        if log.exists():  # trimq's complaints during the run, if any
            bad = [ln for ln in log.read_text(errors="replace").splitlines() if _bad(ln)]
            print(f"trimq log: {len(bad)} error or warning lines", *bad[:5], sep="\n  ")
    print()
    print(f"medians of {args.runs} rounds; loadavg at the end {os.getloadavg()}; "
          f"python {sys.version.split()[0]}")  # fmt: skip
    print(summarize(rows))


if __name__ == "__main__":
    main()
