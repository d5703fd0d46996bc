"""A real broker on its own thread, so client code can run under trio *and* asyncio.

The broker is trio; an asyncio test cannot share its event loop, so :class:`BrokerThread`
runs ``serve_broker`` with ``trio.run`` on a thread and stops it gracefully through its trio
token. Client scenarios are plain ``async def`` functions run with :func:`run` on the backend
a test is parametrized with.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

import anyio
import trio

from broker.app import BrokerHandle, serve_broker
from broker.config import BrokerConfig
from broker.namesrv.app import NamesrvHandle, serve_namesrv
from broker.namesrv.config import NamesrvConfig
from tests.broker.client import TEST_SETTINGS

T = TypeVar("T")
BACKENDS = ("trio", "asyncio")
_START_TIMEOUT = 20.0


H = TypeVar("H", BrokerHandle, NamesrvHandle)


class _ServerThread(Generic[H]):
    """A trio server (``serve_*(config, task_status=)``) run by ``trio.run`` on a daemon
    thread; stopped through its trio token."""

    def __init__(self, serve: Callable[..., Awaitable[None]], config: Any, label: str) -> None:
        self.config = config
        self.handle: H | None = None
        self._serve_fn = serve
        self._label = label
        self._token: trio.lowlevel.TrioToken | None = None
        self._cancel = trio.CancelScope()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"trimq-test-{label}", daemon=True)

    @property
    def address(self) -> str:
        """``127.0.0.1:port`` of the running server."""
        assert self.handle is not None
        return self.handle.address

    @property
    def port(self) -> int:
        """The bound port."""
        assert self.handle is not None
        return self.handle.port

    def call(self, fn: Callable[[H], T]) -> T:
        """``fn(handle)`` run on the server's own trio thread, where its state may be read
        safely (``handle.statistics()``, say). Blocks: call it from a thread that runs no
        trio, e.g. through ``anyio.to_thread.run_sync`` in a scenario."""
        assert self.handle is not None and self._token is not None
        return trio.from_thread.run_sync(fn, self.handle, trio_token=self._token)

    def start(self) -> Self:
        """Start and wait until the server accepts connections."""
        self._thread.start()
        if not self._started.wait(_START_TIMEOUT) or self.handle is None:
            raise RuntimeError(f"{self._label} did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        """Stop gracefully and join the thread."""
        if self._token is not None and self._thread.is_alive():
            with suppress(trio.RunFinishedError):
                trio.from_thread.run(self._graceful, trio_token=self._token)
        self._thread.join(_START_TIMEOUT)

    def kill(self) -> None:
        """Stop abruptly: cancel the server without draining (a crash as clients see it:
        connections reset, nothing answered)."""
        if self._token is not None and self._thread.is_alive():
            with suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._cancel.cancel, trio_token=self._token)
        self._thread.join(_START_TIMEOUT)

    async def _graceful(self) -> None:
        self._cancel.cancel()

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:
            self._error = exc
            self._started.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with self._cancel:
            async with trio.open_nursery() as nursery:
                self.handle = await nursery.start(self._serve_fn, self.config)
                self._started.set()


class BrokerThread(_ServerThread[BrokerHandle]):
    """A broker on a thread (see module docstring); ``stop`` drains, flushes, checkpoints."""

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        config = BrokerConfig(
            host="127.0.0.1", port=settings.pop("port", 0), data_dir=data_dir,
            **{**TEST_SETTINGS, **settings},
        )  # fmt: skip
        super().__init__(serve_broker, config, "broker")

    async def _graceful(self) -> None:
        assert self.handle is not None
        with trio.move_on_after(10):
            await self.handle.stop()


@contextmanager
def broker_thread(data_dir: Path, **settings: Any) -> Iterator[BrokerThread]:
    """Run a :class:`BrokerThread` for the block."""
    broker = BrokerThread(data_dir, **settings).start()
    try:
        yield broker
    finally:
        broker.stop()


def run(backend: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``fn(*args)`` on a fresh event loop of ``backend`` (``trio`` or ``asyncio``)."""
    return anyio.run(fn, *args, backend=backend)


class NamesrvThread(_ServerThread[NamesrvHandle]):
    """A name server on a thread (its routes are memory only: stopping is cancelling)."""

    def __init__(self, **settings: Any) -> None:
        config = NamesrvConfig(host="127.0.0.1", port=settings.pop("port", 0), **settings)
        super().__init__(serve_namesrv, config, "namesrv")


@contextmanager
def cluster(
    data_dir: Path, brokers: int = 2, **settings: Any
) -> Iterator[tuple[NamesrvThread, list[BrokerThread]]]:
    """A name server and ``brokers`` brokers registered with it (broker-a, broker-b, …);
    yields once every broker is in the name server's cluster info."""
    namesrv = NamesrvThread().start()
    started: list[BrokerThread] = []
    try:
        for i in range(brokers):
            name = f"broker-{chr(ord('a') + i)}"
            started.append(
                BrokerThread(
                    data_dir / name, broker_name=name, namesrv_addr=namesrv.address,
                    register_interval_s=1.0, **settings,
                ).start()
            )  # fmt: skip
        assert namesrv.handle is not None
        table = namesrv.handle.ctx.routes
        for _ in range(200):  # bounded: 10 s
            try:  # read from another thread: a concurrent change may interrupt the copy
                if len(table.cluster_info().broker_addr_table) >= brokers:
                    break
            except RuntimeError:
                pass
            time.sleep(0.05)
        yield namesrv, started
    finally:
        for broker in started:
            broker.stop()
        namesrv.stop()
