"""The gRPC server (``broker.grpc.server``): transport behaviour, with a fake service and with
a real broker.

The first half drives ``handle_grpc_stream`` / ``serve_grpc`` with a small fake
:class:`~broker.grpc.server.Service` (echo, streams, a handler that never returns, one that
crashes …) over memory streams or loopback TCP, to pin the server's own contract: deadlines,
resets, handler failures, flow control, the writer that a cancelled call cannot tear, the
peer's GOAWAY, and the graceful stop. The second half runs a real broker
(``tests.broker.client.open_broker``) and talks to its gRPC port over TCP: unknown methods,
TLS and plaintext on one port, silent and broken clients, many calls on one connection, and
the broker's stop with a Telemetry stream and a parked receive open.

Every test is bounded by ``trio.fail_after``; waits are on conditions, never on sleeps.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import h2.errors
import pytest
import trio
import trio.testing
import trustme
from hyperframe.frame import GoAwayFrame

import broker.grpc.server as server_module
import broker.tls as tls_module
from broker.grpc.server import (
    Call,
    GrpcError,
    GrpcLimits,
    GrpcServerState,
    Handler,
    handle_grpc_stream,
    serve_grpc,
)
from broker.tls import TlsMode, TlsPolicy
from protocol.grpc import schema
from protocol.grpc.codes import Code, GrpcStatus
from protocol.grpc.framing import percent_decode
from tests.broker.client import open_broker
from tests.broker.grpc.client import (
    GrpcClient,
    attach_grpc_client,
    client_ssl_context,
    connect_tls,
    open_grpc_client,
    receive_request,
    route_request,
    send_request,
    settings_command,
    wait_parked,
)

TIMEOUT = 15
UNAVAILABLE = int(GrpcStatus.UNAVAILABLE)


# ---------------------------------------------------------------- a fake service
class FakeService:
    """Handlers under ``/t.Test/<name>`` that exercise the server, not the broker."""

    def __init__(self) -> None:
        self.closed_peers: list[str] = []
        #: Paths whose handler saw a cancellation.
        self.cancelled: list[str] = []
        #: Set by the test to let ``Slow`` answer.
        self.release = trio.Event()
        #: Set when a handler started (path -> event).
        self.started: dict[str, trio.Event] = {}
        self._handlers: dict[str, Handler] = {
            "/t.Test/Echo": self.echo,
            "/t.Test/Stream": self.stream,
            "/t.Test/Bidi": self.bidi,
            "/t.Test/Forever": self.forever,
            "/t.Test/Boom": self.boom,
            "/t.Test/Fail": self.fail,
            "/t.Test/Big": self.big,
            "/t.Test/Slow": self.slow,
        }

    def handler(self, path: str) -> Handler | None:
        return self._handlers.get(path)

    def may_wait(self, path: str) -> bool:
        """Every fake method gets a task (several wait or stream); the broker's quick
        methods run in the reader (the real-broker tests below)."""
        return True

    def connection_closed(self, peer: str) -> None:
        self.closed_peers.append(peer)

    def _started(self, call: Call) -> None:
        self.started.setdefault(call.path, trio.Event()).set()

    async def wait_started(self, name: str) -> None:
        await self.started.setdefault(f"/t.Test/{name}", trio.Event()).wait()

    async def echo(self, call: Call) -> None:
        await call.send(await call.request())

    async def stream(self, call: Call) -> None:
        count = int(await call.request())
        for i in range(count):
            await call.send(b"%d" % i)

    async def bidi(self, call: Call) -> None:
        self._started(call)
        try:
            async for payload in call.messages():
                await call.send(b"echo:" + payload)
        except trio.Cancelled:
            self.cancelled.append(call.path)
            raise

    async def forever(self, call: Call) -> None:
        await call.request()
        self._started(call)
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            self.cancelled.append(call.path)
            raise

    async def boom(self, call: Call) -> None:
        raise RuntimeError("a handler bug")

    async def fail(self, call: Call) -> None:
        raise GrpcError(GrpcStatus.INVALID_ARGUMENT, "bad thing: 100% «wrong»")

    async def big(self, call: Call) -> None:
        size = int(await call.request())
        self._started(call)
        try:
            await call.send(b"b" * size)
            await call.drain()
        except trio.Cancelled:
            self.cancelled.append(call.path)
            raise

    async def slow(self, call: Call) -> None:
        await call.request()
        self._started(call)
        await self.release.wait()
        await call.send(b"done")


@dataclass
class Served:
    port: int
    state: GrpcServerState
    scope: trio.CancelScope


@asynccontextmanager
async def serve_fake(
    service: FakeService,
    *,
    ssl_context: ssl.SSLContext | None = None,
    limits: GrpcLimits | None = None,
) -> AsyncIterator[Served]:
    """``serve_grpc`` with ``service`` on 127.0.0.1 (any port), cancelled on exit."""
    state = GrpcServerState()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(
                serve_grpc,
                tls=None if ssl_context is None else TlsPolicy(TlsMode.PERMISSIVE, ssl_context),
            ),
            service,
            listeners,
            limits or GrpcLimits(),
            state,
        )
        yield Served(port, state, nursery.cancel_scope)
        nursery.cancel_scope.cancel()


@dataclass
class MemoryConnection:
    client: GrpcClient
    state: GrpcServerState
    #: Cancelling it stops the server side (as a broker stop does).
    scope: trio.CancelScope
    #: Set when ``handle_grpc_stream`` returned.
    finished: trio.Event


@asynccontextmanager
async def memory_connection(
    service: FakeService,
    *,
    pair: Callable[[], tuple[Any, Any]] = trio.testing.memory_stream_pair,
    limits: GrpcLimits | None = None,
    **client_kwargs: Any,
) -> AsyncIterator[MemoryConnection]:
    """One connection served by ``handle_grpc_stream`` over an in-memory stream pair."""
    client_end, server_end = pair()
    state = GrpcServerState()
    scope, finished = trio.CancelScope(), trio.Event()

    async def serve() -> None:
        try:
            with scope:
                await handle_grpc_stream(service, limits or GrpcLimits(), state, None, server_end)
        finally:
            finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        async with attach_grpc_client(client_end, **client_kwargs) as client:
            yield MemoryConnection(client, state, scope, finished)


# ---------------------------------------------------------------- fake service: calls
async def test_unary_and_server_streaming_over_tcp() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with serve_fake(service) as served, open_grpc_client(served.port) as client:
            reply = await client.unary("/t.Test/Echo", b"hello")
            assert (reply.status, reply.messages) == (0, [b"hello"])
            assert reply.headers[":status"] == "200"
            assert reply.headers["content-type"] == "application/grpc"
            assert not reply.trailers_only
            reply = await client.server_streaming("/t.Test/Stream", b"50")
            assert reply.status == 0
            assert reply.messages == [b"%d" % i for i in range(50)]
            assert reply.data_after_trailers == 0
            assert reply.partial == 0
            assert served.state.calls == 2
            assert served.state.connections == 1
        assert served.state.in_flight == 0


async def test_bidi_echoes_until_the_client_half_closes() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client = conn.client
            async with client.open_call("/t.Test/Bidi", grpc_timeout="10S") as call:
                for i in range(5):
                    await call.send(b"%d" % i)
                    assert await call.receive() == b"echo:%d" % i
                await call.close_send()
                reply = await call.result()
            assert reply.status == 0
            assert len(reply.messages) == 5


async def test_unknown_method_is_unimplemented_trailers_only() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client = conn.client
            reply = await client.unary("/t.Test/Nope", b"x")
            assert reply.status == GrpcStatus.UNIMPLEMENTED
            assert reply.trailers_only
            assert "/t.Test/Nope" in percent_decode(reply.message)


async def test_deadline_exceeded_cancels_the_handler() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client, state = conn.client, conn.state
            start = trio.current_time()
            reply = await client.unary("/t.Test/Forever", b"x", grpc_timeout="200m")
            elapsed = trio.current_time() - start
            assert reply.status == GrpcStatus.DEADLINE_EXCEEDED
            assert 0.15 < elapsed < 5
            assert service.cancelled == ["/t.Test/Forever"]
            # The connection goes on.
            assert (await client.unary("/t.Test/Echo", b"after")).messages == [b"after"]
            assert state.in_flight == 0


async def test_handler_bug_is_internal_and_the_connection_survives() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client = conn.client
            reply = await client.unary("/t.Test/Boom", b"x")
            assert reply.status == GrpcStatus.INTERNAL
            assert "RuntimeError" in percent_decode(reply.message)
            assert (await client.unary("/t.Test/Echo", b"still")).messages == [b"still"]


async def test_grpc_error_status_and_encoded_message() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client = conn.client
            reply = await client.unary("/t.Test/Fail", b"x")
            assert reply.status == GrpcStatus.INVALID_ARGUMENT
            assert reply.message.isascii()
            assert percent_decode(reply.message) == "bad thing: 100% «wrong»"


async def test_client_reset_cancels_the_handler_and_nothing_more_is_written() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client, state = conn.client, conn.state
            call = await client.start_call("/t.Test/Forever")
            await call.send(b"x", end=True)
            await service.wait_started("Forever")
            await call.reset()
            # The echo after the reset is answered: the reset was handled before it.
            assert (await client.unary("/t.Test/Echo", b"next")).messages == [b"next"]
            assert service.cancelled == ["/t.Test/Forever"]
            assert call.headers is None
            assert call.messages == []
            assert call.trailers is None
            assert state.in_flight == 0


async def test_stalled_call_does_not_hold_the_others() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service, initial_window=1000, auto_ack=False) as conn:
            client = conn.client
            big = await client.start_call("/t.Test/Big")
            await big.send(b"500000", end=True)
            await service.wait_started("Big")
            await big.wait_headers()
            # The big response waits for a window the client does not open; others go on.
            for i in range(20):
                reply = await client.unary("/t.Test/Echo", b"%d" % i)
                assert reply.messages == [b"%d" % i]
                await client.open_window(reply_stream := client.h2.highest_outbound_stream_id)
                assert reply_stream
            assert not big.done
            await big.reset()
            await client.unary("/t.Test/Echo", b"after")
            assert service.cancelled == ["/t.Test/Big"]


async def test_cancelled_call_cannot_tear_the_byte_stream() -> None:
    # Regression: a call wrote to the socket itself; when its deadline fired while the write
    # was blocked (the peer not reading), the cancelled send_all left half a frame behind and
    # every later frame of every call was garbage to the client.
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(
            service,
            pair=trio.testing.lockstep_stream_pair,
            initial_window=1 << 20,
            connection_window=1 << 20,
        ) as conn:
            client = conn.client
            await client.unary("/t.Test/Echo", b"warm up")
            # The reader's receive already pending takes at most 64 KiB; the rest of the
            # response then blocks in the server's write.
            client.pause_reading()
            call = await client.start_call("/t.Test/Big", grpc_timeout="300m")
            await call.send(b"500000", end=True)
            await service.wait_started("Big")
            # The deadline passes while the response is stuck in the (lockstep) write.
            with trio.move_on_after(0.6):
                await trio.sleep_forever()
            assert service.cancelled == ["/t.Test/Big"]
            client.resume_reading()
            reply = await call.result()
            assert client.error is None
            assert reply.status == GrpcStatus.DEADLINE_EXCEEDED
            assert (await client.unary("/t.Test/Echo", b"intact")).messages == [b"intact"]


async def test_tcp_writes_beyond_full_socket_buffers_keep_their_order() -> None:
    # Over plain TCP a reply is written at once while the writer is idle; what the socket
    # does not take goes to the writer, and replies queued after it wait behind it.
    service = FakeService()
    size = 16 << 20  # more than loopback's socket buffers take
    window = 2**31 - 1
    with trio.fail_after(TIMEOUT):
        async with (
            serve_fake(service) as served,
            open_grpc_client(served.port, initial_window=window, connection_window=window)
            as client,
        ):  # fmt: skip
            await client.unary("/t.Test/Echo", b"warm up")
            client.pause_reading()
            big = await client.start_call("/t.Test/Big")
            await big.send(b"%d" % size, end=True)
            await service.wait_started("Big")
            behind = await client.start_call("/t.Test/Echo")
            await behind.send(b"behind", end=True)
            client.resume_reading()
            assert (await big.result()).messages == [b"b" * size]
            assert (await behind.result()).messages == [b"behind"]
            assert client.error is None
            assert (await client.unary("/t.Test/Echo", b"intact")).messages == [b"intact"]


async def test_many_concurrent_calls_on_one_connection() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with serve_fake(service) as served, open_grpc_client(served.port) as client:
            replies: dict[int, Any] = {}

            async def one(i: int) -> None:
                replies[i] = await client.unary("/t.Test/Echo", b"call %d" % i)

            async with trio.open_nursery() as nursery:
                for i in range(300):
                    nursery.start_soon(one, i)
            assert all(replies[i].messages == [b"call %d" % i] for i in range(300))
            assert served.state.calls == 300
            # A call's task counts itself done only once its flush returns, which may be
            # after the client has read the reply: wait for the last ones (bounded above).
            while served.state.in_flight:  # noqa: ASYNC110
                await trio.sleep(0.01)


async def test_connections_over_the_limit_are_refused() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with (
            serve_fake(service, limits=GrpcLimits(max_connections=1)) as served,
            open_grpc_client(served.port) as first,
        ):
            assert (await first.unary("/t.Test/Echo", b"1")).status == 0
            second = await trio.open_tcp_stream("127.0.0.1", served.port)
            assert await second.receive_some(100) == b""  # closed at once
            await second.aclose()
            assert (served.state.accepted, served.state.refused) == (1, 1)
            assert (await first.unary("/t.Test/Echo", b"2")).status == 0


# ---------------------------------------------------------------- the client's GOAWAY
async def test_client_goaway_lets_the_open_call_finish_then_closes() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client = conn.client
            async with client.open_call("/t.Test/Bidi") as call:
                await call.send(b"1")
                assert await call.receive() == b"echo:1"
                # grpc-js's shutdown: GOAWAY while its Telemetry stream is open.
                await client.send_raw(GoAwayFrame(stream_id=0, last_stream_id=0).serialize())
                await call.send(b"2")
                assert await call.receive() == b"echo:2"
                late = await client.start_call("/t.Test/Echo")
                await late.send(b"refused", end=True)
                assert (await late.result()).reset_code == h2.errors.ErrorCodes.REFUSED_STREAM
                await call.close_send()
                assert (await call.result()).status == 0
            # The last call done, the server says GOAWAY and closes.
            await client.wait_closed()
            assert client.goaway is not None
            assert client.goaway.error_code == 0


# ---------------------------------------------------------------- graceful stop (fake)
async def test_stop_ends_waiting_calls_lets_the_others_finish_then_goaway() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client, server_scope = conn.client, conn.scope
            async with client.open_call("/t.Test/Bidi") as bidi:
                await bidi.send(b"hi")
                assert await bidi.receive() == b"echo:hi"
                slow = await client.start_call("/t.Test/Slow")
                await slow.send(b"x", end=True)
                await service.wait_started("Slow")
                server_scope.cancel()  # the server stops
                # The call waiting for the client ends now, with trailers.
                bidi_reply = await bidi.result()
                assert bidi_reply.status == UNAVAILABLE
                assert percent_decode(bidi_reply.message) == "broker stopping"
                assert not slow.done
                service.release.set()  # the half-closed call finishes by itself
                slow_reply = await slow.result()
                assert (slow_reply.status, slow_reply.messages) == (0, [b"done"])
                await client.wait_closed()
            assert client.goaway is not None
            assert client.error is None
            assert service.cancelled == ["/t.Test/Bidi"]


async def test_stop_ends_a_call_that_does_not_finish_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "STOP_GRACE_S", 0.2)
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(service) as conn:
            client, server_scope = conn.client, conn.scope
            call = await client.start_call("/t.Test/Forever")
            await call.send(b"x", end=True)
            await service.wait_started("Forever")
            start = trio.current_time()
            server_scope.cancel()
            reply = await call.result()
            assert 0.15 < trio.current_time() - start < 2
            assert reply.status == UNAVAILABLE
            await client.wait_closed()
            assert client.goaway is not None


async def test_stop_with_a_client_that_does_not_read_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "STOP_GRACE_S", 0.1)
    monkeypatch.setattr(server_module, "STOP_TIMEOUT_S", 0.4)
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with memory_connection(
            service,
            pair=trio.testing.lockstep_stream_pair,
            initial_window=1 << 20,
            connection_window=1 << 20,
        ) as conn:
            client = conn.client
            await client.unary("/t.Test/Echo", b"x")
            client.pause_reading()
            call = await client.start_call("/t.Test/Big")
            await call.send(b"500000", end=True)
            await service.wait_started("Big")
            start = trio.current_time()
            conn.scope.cancel()
            with trio.fail_after(3):
                await conn.finished.wait()
            assert conn.state.connections == 0
            # The stop gave up on the unread response after its bound.
            assert 0.3 < trio.current_time() - start < 3


async def test_stop_just_after_the_client_left_is_quick() -> None:
    # Regression: the reader saw the EOF and stopped the writer while the stop waited for the
    # writer to write the GOAWAY: every such stop took the whole STOP_TIMEOUT_S.
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        start = trio.current_time()
        async with serve_fake(service) as served, open_grpc_client(served.port) as client:
            await client.unary("/t.Test/Echo", b"x")
        assert trio.current_time() - start < server_module.STOP_TIMEOUT_S / 2
        assert len(service.closed_peers) == 1


# ---------------------------------------------------------------- a real broker over TCP
@pytest.mark.integration
async def test_broker_unknown_method_is_unimplemented(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            assert handle.grpc_port is not None
            for path in (
                "/apache.rocketmq.v2.MessagingService/PullMessage",
                "/apache.rocketmq.v2.MessagingService/NoSuchMethod",
                "/grpc.health.v1.Health/Check",
            ):
                reply = await client.unary(path, b"")
                assert reply.status == GrpcStatus.UNIMPLEMENTED, path
                assert reply.trailers_only
            reply = await client.unary("QueryRoute", route_request("TopicA"))
            assert reply.status == 0


@pytest.mark.integration
async def test_broker_tls_and_plaintext_on_one_port(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data", tls_cert=cert_file, tls_key=key_file) as handle:
            assert handle.grpc_port is not None
            context = client_ssl_context(ca.cert_pem.bytes())
            async with open_grpc_client(handle.grpc_port, ssl_context=context) as tls_client:
                assert isinstance(tls_client.stream, trio.SSLStream)
                assert tls_client.stream.selected_alpn_protocol() == "h2"
                reply = await tls_client.unary("QueryRoute", route_request("TopicA"))
                assert reply.status == 0
                async with open_grpc_client(handle.grpc_port) as plain_client:
                    reply = await plain_client.unary("QueryRoute", route_request("TopicA"))
                    assert reply.status == 0
            stats = handle.statistics().grpc
            assert stats is not None
            assert (stats.accepted, stats.tls) == (2, 1)


@pytest.mark.integration
async def test_broker_serves_a_self_signed_certificate_without_settings(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle:
            assert handle.grpc_port is not None
            # A verifying client (the system's roots) refuses it ...
            verifying = ssl.create_default_context()
            verifying.set_alpn_protocols(["h2"])
            with pytest.raises(trio.BrokenResourceError) as refused:
                await connect_tls(handle.grpc_port, verifying)
            assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
            # ... one that does not verify (the Java/Go/C++ clients' way) gets in.
            context = client_ssl_context()
            async with open_grpc_client(handle.grpc_port, ssl_context=context) as client:
                assert isinstance(client.stream, trio.SSLStream)
                der = client.stream.getpeercert(binary_form=True)
                assert der is not None
                assert b"trimq self-signed" in der
                reply = await client.unary("QueryRoute", route_request("TopicA"))
                assert reply.status == 0


@pytest.mark.integration
async def test_broker_drops_a_silent_client_after_the_first_byte_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tls_module, "FIRST_BYTE_TIMEOUT_S", 0.3)
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle:
            assert handle.grpc_port is not None
            silent = await trio.open_tcp_stream("127.0.0.1", handle.grpc_port)
            start = trio.current_time()
            assert await silent.receive_some(100) == b""  # closed by the server
            assert 0.2 < trio.current_time() - start < 5
            await silent.aclose()
            # A TLS client that stops in the middle of its handshake gets the same bound.
            half = await trio.open_tcp_stream("127.0.0.1", handle.grpc_port)
            await half.send_all(b"\x16\x03\x01\x00\xff\x01")
            start = trio.current_time()
            assert await half.receive_some(100) == b""
            assert 0.2 < trio.current_time() - start < 5
            await half.aclose()
            async with open_grpc_client(handle.grpc_port) as client:
                assert (await client.unary("QueryRoute", route_request("T"))).status == 0
            stats = handle.statistics().grpc
            assert stats is not None
            assert stats.connections == 1  # the client above is still being closed at most


@pytest.mark.integration
async def test_broker_survives_a_client_that_resets_before_its_first_byte(
    tmp_path: Path,
) -> None:
    # Regression: the first-byte peek raised ConnectionResetError (an OSError, not a trio
    # error), which escaped the handler and took down the listener and the broker.
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle:
            assert handle.grpc_port is not None
            stats_before = handle.statistics().grpc
            assert stats_before is not None
            for _ in range(5):
                stream = await trio.open_tcp_stream("127.0.0.1", handle.grpc_port)
                linger = struct.pack("ii", 1, 0)  # close() sends RST
                stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                stream.socket.close()
            async with open_grpc_client(handle.grpc_port) as client:
                assert (await client.unary("QueryRoute", route_request("T"))).status == 0
                stats = handle.statistics().grpc
                assert stats is not None
                assert stats.accepted == stats_before.accepted + 6


@pytest.mark.integration
async def test_broker_broken_http2_closes_that_connection_only(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle:
            assert handle.grpc_port is not None
            async with open_grpc_client(handle.grpc_port) as good:
                telemetry = await good.start_call("Telemetry")
                async with open_grpc_client(handle.grpc_port) as bad:
                    await bad.unary("QueryRoute", route_request("T"))
                    await bad.send_raw(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x" + b"garbage" * 10)
                    await bad.wait_closed()
                    assert bad.goaway is not None
                    assert bad.goaway.error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
                assert (await good.unary("QueryRoute", route_request("T"))).status == 0
                assert not telemetry.done
                stats = handle.statistics().grpc
                assert stats is not None
                assert stats.broken == 1


@pytest.mark.integration
async def test_broker_answers_a_header_that_is_not_utf8(tmp_path: Path) -> None:
    # Regression: h2's UTF-8 decoding raised UnicodeDecodeError, past the server's
    # GrpcConnectionError handler, and took the listener (and the broker) down.
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            headers = [
                (k.encode(), v.encode())
                for k, v in client.headers_for("QueryRoute", client_id=None)
            ]
            call = await client.start_call_raw([*headers, (b"x-mq-client-id", b"host\xff@1")])
            await call.send(route_request("T"), end=True)
            answer = (await call.result()).one(schema.QueryRouteResponse)
            assert answer.status.code == Code.OK
            assert (await client.unary("QueryRoute", route_request("T"))).status == 0


@pytest.mark.integration
async def test_broker_many_concurrent_calls_on_one_connection(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            results: dict[str, Any] = {}

            async def send(i: int) -> None:
                req = send_request("ManyTopic", b"body %d" % i)
                reply = await client.unary("SendMessage", req)
                answer = reply.one(schema.SendMessageResponse)
                assert answer.status.code == Code.OK, answer
                sent_id = req.messages[0].system_properties.message_id
                assert answer.entries[0].message_id == sent_id
                results[sent_id] = answer.entries[0].offset

            async def route(i: int) -> None:
                reply = await client.unary("QueryRoute", route_request("ManyTopic"))
                assert reply.status == 0

            async with trio.open_nursery() as nursery:
                for i in range(200):
                    nursery.start_soon(send, i)
                    nursery.start_soon(route, i)
            assert len(results) == 200
            stats = handle.statistics().grpc
            assert stats is not None
            assert stats.calls == 400
            assert stats.connections == 1


# ---------------------------------------------------------------- broker stop
@pytest.mark.integration
async def test_broker_stop_answers_parked_receive_and_ends_telemetry(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle:
            assert handle.grpc_port is not None
            async with open_grpc_client(handle.grpc_port) as client:
                await client.unary("SendMessage", send_request("StopTopic"))
                telemetry = await client.start_call("Telemetry", grpc_timeout="8760H")
                await telemetry.send(settings_command("StopGroup", "StopTopic"))
                settings = schema.TelemetryCommand.FromString(await telemetry.receive())
                assert settings.status.code == Code.OK
                # Drain the topic so the next receive parks.
                first = await client.server_streaming(
                    "ReceiveMessage", receive_request("StopTopic", "StopGroup"), grpc_timeout="30S"
                )
                assert first.status == 0
                parked = await client.start_call("ReceiveMessage", grpc_timeout="30S")
                await parked.send(receive_request("StopTopic", "StopGroup"), end=True)
                await wait_parked(handle)
                start = trio.current_time()
                with trio.fail_after(5):
                    await handle.stop()
                stop_took = trio.current_time() - start
                receive_reply = await parked.result()
                telemetry_reply = await telemetry.result()
                await client.wait_closed()
            # The parked receive got its answer: a status, then OK trailers.
            assert receive_reply.status == 0
            (status,) = receive_reply.decode(schema.ReceiveMessageResponse)
            assert status.status.code == Code.MESSAGE_NOT_FOUND
            # Telemetry ended with trailers (not a dropped connection), then GOAWAY.
            assert telemetry_reply.status == UNAVAILABLE
            assert percent_decode(telemetry_reply.message) == "broker stopping"
            assert telemetry_reply.reset_code is None
            assert client.goaway is not None
            assert client.goaway.error_code == 0
            assert client.error is None
            # Answered by the broker's stop itself, not after the server's grace.
            assert stop_took < server_module.STOP_GRACE_S


@pytest.mark.integration
async def test_broker_stop_refuses_calls_during_the_grace(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle:
            assert handle.grpc_port is not None
            async with open_grpc_client(handle.grpc_port) as client:
                assert (await client.unary("QueryRoute", route_request("T"))).status == 0
                await handle.stop()
                await client.wait_closed()
                assert client.goaway is not None
            # The listener is gone.
            with pytest.raises(OSError, match="connect"):
                await trio.open_tcp_stream("127.0.0.1", handle.grpc_port)


@pytest.mark.integration
async def test_broker_stop_with_a_silent_connection(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle:
            assert handle.grpc_port is not None
            silent = await trio.open_tcp_stream("127.0.0.1", handle.grpc_port)
            with trio.fail_after(5):
                await handle.stop()
            assert await silent.receive_some(10) == b""
            await silent.aclose()


@pytest.mark.integration
async def test_broker_stop_over_tls(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle:
            assert handle.grpc_port is not None
            context = client_ssl_context()
            async with open_grpc_client(handle.grpc_port, ssl_context=context) as client:
                telemetry = await client.start_call("Telemetry")
                await telemetry.send(settings_command("TlsGroup", "TlsTopic"))
                await telemetry.receive()
                with trio.fail_after(5):
                    await handle.stop()
                reply = await telemetry.result()
                assert reply.status == UNAVAILABLE
                await client.wait_closed()
                assert client.goaway is not None


# ---------------------------------------------------------------- limits
async def test_a_connection_without_calls_is_closed_after_the_idle_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    service = FakeService()
    limits = GrpcLimits(idle_timeout_s=120)
    async with memory_connection(service, limits=limits) as conn:
        client = conn.client
        # An open call (a parked receive, a Telemetry stream) keeps the connection.
        async with client.open_call("/t.Test/Forever") as call:
            await call.send(b"x", end=True)
            await service.wait_started("Forever")
            await trio.sleep(300)
            assert not client.closed.is_set()
        # (Leaving the block reset the call.) A call now and then keeps it too; silence
        # past the timeout ends it with GOAWAY.
        await trio.sleep(100)
        assert (await client.unary("/t.Test/Echo", b"hi")).status == 0
        quiet_from = trio.current_time()
        with trio.fail_after(200):
            await conn.finished.wait()
        assert 120 <= trio.current_time() - quiet_from <= 121
        assert client.goaway is not None and client.goaway.error_code == 0
    assert conn.state.statistics().idle_closed == 1


async def test_connections_per_source_address_are_capped() -> None:
    service = FakeService()
    with trio.fail_after(TIMEOUT):
        async with serve_fake(service, limits=GrpcLimits(max_connections_per_ip=2)) as served:
            async with open_grpc_client(served.port) as a, open_grpc_client(served.port) as b:
                async with open_grpc_client(served.port) as third:
                    await third.wait_closed()
                for client in (a, b):
                    assert (await client.unary("/t.Test/Echo", b"ok")).status == 0
                assert (served.state.refused_per_ip, served.state.connections) == (1, 2)
            while served.state.connections:  # noqa: ASYNC110 (bounded by fail_after)
                await trio.sleep(0.01)
            async with open_grpc_client(served.port) as a, open_grpc_client(served.port) as b:
                for client in (a, b):
                    assert (await client.unary("/t.Test/Echo", b"ok")).status == 0
