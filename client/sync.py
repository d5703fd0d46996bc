"""Thread-backed synchronous facades with the same names as the async clients.

For applications that are not async (Django views, scripts, Celery tasks): each facade runs
its async client on an event loop in a background thread (an anyio blocking portal) and
forwards calls to it, so ``producer.send(msg)`` blocks the calling thread until the broker
answered. Use them as context managers, or call ``start()`` / ``close()``::

    from client.sync import Producer
    with Producer(ClientConfig(namesrv_addr="127.0.0.1:9876")) as producer:
        receipt = producer.send(Message("orders", b"..."))

The calls are thread-safe: several threads may share one facade (the portal serializes the
hand-over; the requests themselves run concurrently on the loop).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Generic, ParamSpec, Self, TypeVar

import anyio.to_thread
from anyio.from_thread import BlockingPortal, start_blocking_portal

from client import producer as _producer
from client import push as _push
from client import simple_consumer as _simple
from client.config import ClientConfig
from client.errors import ClientClosedError
from client.filters import FilterExpression
from client.message import Message, ReceivedMessage, SendReceipt
from client.transaction import LocalTransaction, TransactionReceipt, resolve

A = TypeVar("A")
P = ParamSpec("P")
T = TypeVar("T")


class _Facade(Generic[A]):
    """Owns a portal thread and the async client entered on it."""

    def __init__(self, client: A, backend: str) -> None:
        self._client = client
        self._backend = backend
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._entered: AbstractContextManager[Any] | None = None

    def start(self) -> Self:
        """Start the event-loop thread and the client (connects, fetches routes)."""
        if self._portal is not None:
            return self
        portal_cm = start_blocking_portal(backend=self._backend)
        portal = portal_cm.__enter__()
        try:
            # Every async client is an async context manager returning itself.
            entered: AbstractContextManager[Any] = portal.wrap_async_context_manager(
                self._client  # type: ignore[arg-type]
            )
            entered.__enter__()
        except BaseException as exc:
            portal_cm.__exit__(type(exc), exc, exc.__traceback__)
            raise
        self._portal_cm, self._portal, self._entered = portal_cm, portal, entered
        return self

    def close(self) -> None:
        """Stop the client (unregisters, closes connections) and its thread. Idempotent."""
        portal_cm, entered = self._portal_cm, self._entered
        self._portal_cm = self._portal = self._entered = None
        try:
            if entered is not None:
                entered.__exit__(None, None, None)
        finally:
            if portal_cm is not None:
                portal_cm.__exit__(None, None, None)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._portal is None:
            raise ClientClosedError("not started: use 'with' or call start()")
        return self._portal.call(functools.partial(fn, *args, **kwargs))

    @property
    def async_client(self) -> A:
        """The async client this facade drives."""
        return self._client


class Producer(_Facade[_producer.Producer]):
    """Blocking :class:`client.producer.Producer` (same arguments, same methods). A plain
    ``checker`` function runs in a worker thread, so it may block (a database query)."""

    def __init__(
        self, config: ClientConfig | None = None, *, backend: str = "asyncio", **kwargs: Any
    ) -> None:
        checker = kwargs.pop("checker", None)
        if checker is not None:
            kwargs["checker"] = _in_thread(checker)
        super().__init__(_producer.Producer(config, **kwargs), backend)

    def send_in_transaction(
        self, message: Message, execute: LocalTransaction
    ) -> TransactionReceipt:
        """Send a half message, run ``execute`` (in a worker thread when it is a plain
        function), then commit or roll back as it answers (see the async method)."""
        return self._call(self._client.send_in_transaction, message, _in_thread(execute))

    def send(self, message: Message, *, sharding_key: str | None = None) -> SendReceipt:
        """Send and wait for the broker (see the async method)."""
        return self._call(self._client.send, message, sharding_key=sharding_key)

    def send_oneway(self, message: Message, *, sharding_key: str | None = None) -> None:
        """Send without waiting for the broker."""
        self._call(self._client.send_oneway, message, sharding_key=sharding_key)

    def send_batch(
        self, messages: Sequence[Message], *, sharding_key: str | None = None
    ) -> list[SendReceipt]:
        """Send messages of one topic in one request."""
        return self._call(self._client.send_batch, messages, sharding_key=sharding_key)


def _in_thread(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``fn`` as a coroutine function: a coroutine function as it is, a plain function run
    in a worker thread (it must not block the facade's event loop)."""
    if inspect.iscoroutinefunction(fn):
        return fn

    async def run(*args: Any) -> Any:
        return await resolve(await anyio.to_thread.run_sync(fn, *args))

    return run


class SimpleConsumer(_Facade[_simple.SimpleConsumer]):
    """Blocking :class:`client.simple_consumer.SimpleConsumer`."""

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        group: str,
        subscription: Mapping[str, str | FilterExpression] | None = None,
        backend: str = "asyncio",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            _simple.SimpleConsumer(config, group=group, subscription=subscription, **kwargs),
            backend,
        )

    def subscribe(self, topic: str, expression: str | FilterExpression = "*") -> None:
        """Add or change a subscription (a ``str`` is a TAG expression; see the async
        method for what it raises)."""
        self._call(self._client.subscribe, topic, expression)

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving from ``topic``."""
        self._client.unsubscribe(topic)

    def receive(
        self,
        max_messages: int = 16,
        invisible_duration: float = 60.0,
        await_duration: float | None = None,
    ) -> list[ReceivedMessage]:
        """Receive up to ``max_messages`` (blocks up to ``await_duration``)."""
        return self._call(self._client.receive, max_messages, invisible_duration, await_duration)

    def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge a received message."""
        self._call(self._client.ack, message)

    def change_invisible_duration(
        self, message: ReceivedMessage, invisible_duration: float
    ) -> ReceivedMessage:
        """Keep a message invisible longer; returns it with its new receipt."""
        return self._call(self._client.change_invisible_duration, message, invisible_duration)


class PushConsumer(_Facade[_push.PushConsumer]):
    """Blocking :class:`client.push.PushConsumer`: the listener runs on the facade's event-loop
    thread (async listeners) or in worker threads (sync listeners) while the block is open."""

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        group: str,
        subscription: Mapping[str, str | FilterExpression],
        listener: _push.Listener,
        backend: str = "asyncio",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            _push.PushConsumer(
                config, group=group, subscription=subscription, listener=listener, **kwargs
            ),
            backend,
        )

    def statistics(self) -> _push.PushStatistics:
        """Counters and cache levels (see the async method)."""
        return self._client.statistics()
