"""A small Remoting client for broker tests, and a helper to run a broker.

:func:`open_client` connects to a broker on loopback (:func:`attach_client` serves any trio
stream, such as one end of ``trio.testing.memory_stream_pair()``) and reads in a background
task through a :class:`~protocol.connection.RemotingConnection`: every response is kept by
its ``opaque`` (whether this client allocated it or a test wrote it into raw bytes),
broker-initiated requests (such as ``NOTIFY_CONSUMER_IDS_CHANGED``) are collected in
:attr:`BrokerClient.notifications`, and :attr:`BrokerClient.closed` is set when the broker
closes the connection. Raw bytes can be sent too, for malformed-input tests. Every wait is
bounded (``reply_timeout``, or a ``timeout`` for one call), so a missing reply fails the test
instead of hanging it.

:func:`open_broker` runs ``serve_broker`` in-process with small commit-log segments (the
default 1 GiB segment is preallocated per broker, which fills disks quickly in a test run)
and stops it gracefully on exit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from broker.app import BrokerHandle, serve_broker
from broker.config import BrokerConfig
from protocol.command import RemotingCommand, request
from protocol.connection import (
    NEED_DATA,
    Closed,
    LocalProtocolError,
    Malformed,
    RemotingConnection,
    Request,
    Response,
    Role,
    UnsolicitedResponse,
)
from protocol.errors import ProtocolError
from protocol.frame import encode_command

#: How long a reply is awaited by default (see ``BrokerClient.reply_timeout``).
REPLY_TIMEOUT = 5.0


class ConnectionClosedError(Exception):
    """The broker closed the connection before the awaited reply arrived."""


class BrokerClient:
    """One connection to a broker (see the module docstring)."""

    def __init__(self, stream: trio.abc.Stream, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self.stream = stream
        #: Requests keep their own serialize type (tests send all three).
        self.protocol = RemotingConnection(Role.CLIENT, max_frame_size=max_frame_size)
        #: Requests the broker sent to us (oneway notifications), in arrival order.
        self.notifications: list[RemotingCommand] = []
        #: Set when the broker closed the connection (EOF or reset).
        self.closed = trio.Event()
        #: A decoding error on the broker's bytes (a broker bug), if any.
        self.error: ProtocolError | None = None
        self._replies: dict[int, RemotingCommand] = {}
        self._changed = trio.Event()
        self._send_lock = trio.Lock()
        #: How long a reply, notification or close is awaited before the test fails.
        self.reply_timeout = REPLY_TIMEOUT

    # ------------------------------------------------------------------ sending
    def next_opaque(self) -> int:
        """A fresh opaque for a request on this connection (built and sent by the test)."""
        return self.protocol.next_opaque()

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (for malformed-input tests)."""
        async with self._send_lock:
            await self.stream.send_all(data)

    async def send(self, cmd: RemotingCommand) -> None:
        """Encode and write ``cmd`` as it is (its own opaque) without waiting for a reply."""
        await self.send_raw(encode_command(cmd))

    async def request(
        self,
        cmd: RemotingCommand,
        *,
        opaque: int | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (a per-call bound, see module doc)
    ) -> RemotingCommand:
        """Send ``cmd`` and wait for its reply. The opaque is a fresh one unless ``opaque``
        is given (``cmd.opaque`` is ignored)."""
        if opaque is None:
            try:
                opaque, data = self.protocol.send_request(cmd)
            except LocalProtocolError as exc:  # the broker already closed the connection
                raise ConnectionClosedError(f"connection closed: {exc}") from exc
            await self.send_raw(data)
        else:
            await self.send(cmd._replace(opaque=opaque))
        return await self.reply(opaque, timeout=timeout)

    async def call(
        self,
        code: int,
        ext_fields: Mapping[str, str] | None = None,
        body: bytes = b"",
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        **kwargs: Any,
    ) -> RemotingCommand:
        """Build a JSON request (see :func:`protocol.command.request`) and send it."""
        cmd = request(code, 0, ext_fields, body, **kwargs)
        return await self.request(cmd, timeout=timeout)

    # ------------------------------------------------------------------ receiving
    async def reply(
        self,
        opaque: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> RemotingCommand:
        """Wait for the response with ``opaque`` (and take it)."""
        with trio.fail_after(self.reply_timeout if timeout is None else timeout):
            while opaque not in self._replies:
                if self.closed.is_set():
                    raise ConnectionClosedError(f"connection closed before reply {opaque}")
                await self._changed.wait()
        return self._replies.pop(opaque)

    def has_reply(self, opaque: int) -> bool:
        """Whether a response with ``opaque`` arrived and was not taken yet."""
        return opaque in self._replies

    async def wait_notifications(self, count: int) -> None:
        """Wait until at least ``count`` broker requests have arrived."""
        with trio.fail_after(self.reply_timeout):
            while len(self.notifications) < count:
                if self.closed.is_set():
                    raise ConnectionClosedError("connection closed while waiting")
                await self._changed.wait()

    async def wait_closed(self) -> None:
        """Wait until the broker closes the connection."""
        with trio.fail_after(self.reply_timeout):
            await self.closed.wait()

    async def _read(self) -> None:
        try:
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                self.protocol.receive_data(data)
                ended = self._take_events()
                self._wake()
                if ended:
                    return
        except ProtocolError as exc:
            self.error = exc
        finally:
            self.protocol.close()
            self.closed.set()
            self._wake()

    def _take_events(self) -> bool:
        """File every complete event; True once the broker closed the connection."""
        for _ in range(1_000_000):  # bounded by the bytes received
            event = self.protocol.next_event()
            if event is NEED_DATA:
                return False
            if isinstance(event, (Response, UnsolicitedResponse)):
                self._replies[event.command.opaque] = event.command
            elif isinstance(event, Request):
                self.notifications.append(event.command)
            elif isinstance(event, Malformed):
                raise event.error  # the broker sent a frame it cannot have meant
            elif isinstance(event, Closed):
                return True
        raise AssertionError("more events than bytes")

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


C = TypeVar("C", bound=BrokerClient)


@asynccontextmanager
async def attach_client_of(cls: type[C], stream: trio.abc.Stream) -> AsyncIterator[C]:
    """A ``cls`` client on an open ``stream``, reading in the background; the stream is
    closed on exit."""
    client = cls(stream)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._read)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        await trio.aclose_forcefully(stream)


def attach_client(stream: trio.abc.Stream) -> AbstractAsyncContextManager[BrokerClient]:
    """A client on an open ``stream`` (a memory stream, say); closed on exit."""
    return attach_client_of(BrokerClient, stream)


@asynccontextmanager
async def open_client_of(cls: type[C], port: int, host: str = "127.0.0.1") -> AsyncIterator[C]:
    """Connect a ``cls`` client to a broker; the connection is closed on exit."""
    stream = await trio.open_tcp_stream(host, port)
    async with attach_client_of(cls, stream) as client:
        yield client


def open_client(port: int, host: str = "127.0.0.1") -> AbstractAsyncContextManager[BrokerClient]:
    """Connect to a broker; the connection is closed on exit."""
    return open_client_of(BrokerClient, port, host)


#: Commit-log segments are preallocated: tests use small ones (the default is 1 GiB). The
#: gRPC front end takes any free port (its default, 8081, would clash between test brokers).
TEST_SETTINGS: Mapping[str, Any] = {
    "segment_size": 1 << 20,
    "max_message_size": 256 * 1024,
    "grpc_port": 0,
    # And the HA port: its default, the Remoting port + 1, may be taken when a test restarts
    # a broker on the port it had (any free port was chosen the first time).
    "ha_port": 0,
    # Writes must not stop because the machine's disk is full (tests inject a probe to
    # check the refusal).
    "disk_full_ratio": 0,
}


@asynccontextmanager
async def open_broker(data_dir: Path, **settings: Any) -> AsyncIterator[BrokerHandle]:
    """Run a broker on 127.0.0.1, any free port, with ``settings`` over the defaults and
    :data:`TEST_SETTINGS`; it is stopped gracefully on exit."""
    merged = {**TEST_SETTINGS, **settings}
    config = BrokerConfig(host="127.0.0.1", port=0, data_dir=data_dir, **merged)
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(serve_broker, config)
        try:
            yield handle
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await handle.stop()
