"""A pool of connections, one per address, with reconnection and back-off.

Connections are opened on first use and replaced when they die. A failed connect puts the
address on a back-off (doubling up to ``backoff_max``): until it ends, requests to it fail at
once with :class:`~client.errors.ConnectError`, which is what lets a producer skip a broker
that just failed instead of waiting a connect timeout per send. Every connection's reader runs
in the task group given at construction, so the pool lives exactly as long as its owner.
With credentials in the config, every request is signed here (RocketMQ ACL 1.0), the one
place all requests pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import anyio
import anyio.abc

from client.config import ClientConfig, split_address
from client.errors import ConnectError
from client.transport import Connection, RequestHandler
from protocol.acl import sign
from protocol.command import RemotingCommand


@dataclass(slots=True)
class _Backoff:
    failures: int = 0
    until: float = -math.inf


class RemotingClient:
    """Connections to many addresses, owned by ``task_group``.

    Args:
        task_group: where connection readers run; cancelling it closes every connection.
        config: timeouts, back-off and header encoding.
        on_request: handler for requests servers send us (notifications).
    """

    def __init__(
        self,
        task_group: anyio.abc.TaskGroup,
        config: ClientConfig,
        on_request: RequestHandler | None = None,
    ) -> None:
        self._tg = task_group
        self.config = config
        self._on_request = on_request
        self._connections: dict[str, Connection] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._backoff: dict[str, _Backoff] = {}
        #: Made once: building a context loads the trusted certificates.
        self._ssl_context = config.ssl_context

    async def invoke(
        self,
        address: str,
        cmd: RemotingCommand,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> RemotingCommand:
        """Send ``cmd`` to ``address`` and return the reply (any response code).

        Raises:
            ConnectError, ConnectionLostError, RequestTimeoutError.
        """
        timeout = self.config.request_timeout if timeout is None else timeout
        deadline = anyio.current_time() + timeout
        conn = await self.connection(address, timeout)
        return await conn.request(self.signed(cmd), max(0.0, deadline - anyio.current_time()))

    async def invoke_oneway(
        self,
        address: str,
        cmd: RemotingCommand,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> None:
        """Send ``cmd`` to ``address`` without waiting for a reply."""
        timeout = self.config.request_timeout if timeout is None else timeout
        conn = await self.connection(address, timeout)
        await conn.oneway(self.signed(cmd), timeout)

    def signed(self, cmd: RemotingCommand) -> RemotingCommand:
        """``cmd`` signed with the config's credentials (as it is without any)."""
        access_key, secret_key = self.config.access_key, self.config.secret_key
        if access_key is None or secret_key is None:
            return cmd
        return sign(cmd, access_key, secret_key)

    def is_backing_off(self, address: str) -> bool:
        """Whether ``address`` failed recently and is not retried yet."""
        state = self._backoff.get(address)
        return state is not None and anyio.current_time() < state.until

    async def connection(self, address: str, timeout: float | None = None) -> Connection:  # noqa: ASYNC109
        """The live connection to ``address``, connecting if needed.

        Raises:
            ConnectError: the connect failed now or recently (back-off).
        """
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        lock = self._locks.setdefault(address, anyio.Lock())
        async with lock:
            conn = self._connections.get(address)
            if conn is not None and not conn.closed:
                return conn
            conn = await self._connect(address, timeout)
            self._connections[address] = conn
            return conn

    async def _connect(self, address: str, timeout: float | None) -> Connection:  # noqa: ASYNC109
        state = self._backoff.setdefault(address, _Backoff())
        now = anyio.current_time()
        if now < state.until:
            raise ConnectError(
                f"{address} failed {state.failures} time(s); next try in {state.until - now:.2f} s",
                address=address,
            )
        host, port = split_address(address)
        limit = self.config.connect_timeout if timeout is None else timeout
        try:
            with anyio.fail_after(min(limit, self.config.connect_timeout)):
                stream: anyio.abc.ByteStream = await self._open(host, port)
        except (OSError, TimeoutError, anyio.BrokenResourceError) as exc:
            state.failures += 1
            delay = min(
                self.config.backoff_max, self.config.backoff_initial * 2 ** (state.failures - 1)
            )
            state.until = anyio.current_time() + delay
            raise ConnectError(f"cannot connect to {address}: {exc!r}", address=address) from exc
        state.failures, state.until = 0, -math.inf
        conn = Connection(
            stream,
            address,
            serialize_type=self.config.serialize_type,
            on_request=self._on_request,
        )
        self._tg.start_soon(conn.run, name=f"trimq-connection-{address}")
        return conn

    async def _open(self, host: str, port: int) -> anyio.abc.ByteStream:
        """A TCP connection, with TLS when the configuration asks for it (no close_notify
        is awaited: a broker may close without one)."""
        context = self._ssl_context
        if context is None:
            return await anyio.connect_tcp(host, port)
        return await anyio.connect_tcp(
            host, port, tls=True, ssl_context=context, tls_standard_compatible=False
        )

    async def aclose(self) -> None:
        """Close every connection."""
        for conn in list(self._connections.values()):
            with anyio.CancelScope(shield=True):
                await conn.aclose()
        self._connections.clear()

    @property
    def addresses(self) -> list[str]:
        """Addresses with a live connection."""
        return [a for a, c in self._connections.items() if not c.closed]
