"""What both push modes share: the options, the listener runner with its concurrency bound
and per-message consume timeout, the cache budget with waiting, and the counters.

Listener calls: sync listeners run in worker threads (``anyio.to_thread.run_sync`` with
its own limiter of ``consume_concurrency``), async ones in the caller's task; one
:class:`anyio.CapacityLimiter` bounds both. Each call gets its own deadline (a cancel scope
of ``consume_timeout``), so a stuck call is given up exactly when its time is up — not at the
next round of a periodic scan, which in RocketMQ (``cleanExpiredMsg``, scheduled every
``consumeTimeout``) fires up to twice the timeout late (seed 003). An async listener is
cancelled at its deadline; a sync one cannot be, so its thread is abandoned (it frees its slot
and its late result is ignored).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import anyio
import structlog

from client.message import ReceivedMessage
from client.push.process_queue import CacheBudget
from client.push.types import ConsumeResult, Listener, Outcome, PushStatistics

_log = structlog.get_logger("trimq.client.push")
#: Pause of a fetch loop after a broker refused its filter. Filters are checked on entering
#: the consumer, so this is a broker reconfigured since: it stays refused until the broker
#: is changed again, and asking every second would only flood the log.
REFUSED_PAUSE = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PushOptions:
    """Validated push-consumer settings (see :class:`~client.push.PushConsumer`)."""

    mode: str = "pop"
    orderly: bool = False
    consume_concurrency: int = 20
    max_cache_messages: int = 1024
    max_cache_bytes: int = 64 * 1024 * 1024
    consume_timeout: float = 900.0
    max_reconsume_times: int = 16
    consume_from: str = "last"
    invisible_duration: float | None = None
    pull_batch_size: int = 32
    long_poll: float | None = None
    suspend_interval: float = 1.0
    shutdown_timeout: float = 10.0
    rebalance_interval: float = 20.0
    persist_interval: float = 5.0
    send_back_delay_level: int = 0
    retry_backoff_initial: float = 1.0
    retry_backoff_max: float = 60.0
    max_span: int = 2000

    def __post_init__(self) -> None:
        if self.mode not in ("pop", "pull"):
            raise ValueError(f"mode must be 'pop' or 'pull', not {self.mode!r}")
        if self.consume_from not in ("last", "first"):
            raise ValueError(f"consume_from must be 'last' or 'first', not {self.consume_from!r}")
        if not 1 <= self.pull_batch_size <= 32:
            raise ValueError("pull_batch_size must be 1..32")
        for name in ("consume_concurrency", "max_cache_messages", "max_cache_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        for name in ("consume_timeout", "suspend_interval", "rebalance_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def long_poll_s(self) -> float:
        """Long-poll hold: RocketMQ's 15 s broker suspend for pulls, 20 s for pops."""
        if self.long_poll is not None:
            return self.long_poll
        return 15.0 if self.mode == "pull" else 20.0

    @property
    def invisible_ms(self) -> int:
        """Pop invisible time: by default the consume timeout plus a margin, so a message
        is not redelivered to someone else while its listener may legally still run."""
        seconds = self.invisible_duration
        if seconds is None:
            seconds = self.consume_timeout + 10.0
        return max(1000, int(seconds * 1000))

    def retry_backoff(self, attempt: int) -> float:
        """Pop mode: seconds until a failed message comes back after its ``attempt``-th
        delivery (exponential from ``retry_backoff_initial``, as RocketMQ 5's
        ``ExponentialBackoffRetryPolicy``)."""
        return min(self.retry_backoff_max, self.retry_backoff_initial * 2.0 ** max(0, attempt - 1))


def is_async_listener(listener: object) -> bool:
    """Whether calling ``listener`` returns a coroutine (functions, partials, objects with an
    ``async def __call__``)."""
    while isinstance(listener, functools.partial):
        listener = listener.func
    return inspect.iscoroutinefunction(listener) or inspect.iscoroutinefunction(
        getattr(listener, "__call__", None)  # noqa: B004
    )


class Runtime:
    """Listener runner, cache budget and counters of one push consumer."""

    def __init__(self, listener: Listener, options: PushOptions) -> None:
        self.listener = listener
        self.options = options
        self.is_async = is_async_listener(listener)
        self.limiter = anyio.CapacityLimiter(options.consume_concurrency)
        self._thread_limiter = anyio.CapacityLimiter(options.consume_concurrency)
        self.budget = CacheBudget(options.max_cache_messages, options.max_cache_bytes)
        self._space = anyio.Event()
        # Fetchers queue for room in order (the lock is FIFO): a fetcher whose long poll
        # just ended empty must not take the room back before one that has been waiting.
        self._reserve_lock = anyio.Lock()
        #: Set when shutting down: queued calls are skipped, fetchers stop.
        self.closing = False
        self.active = self.peak_active = 0
        self.consumed = self.failed = self.timed_out = self.dead_lettered = 0
        self.assigned_queues = 0
        #: Consume tasks alive (waiting for a slot, calling, or settling the result).
        self.tasks = 0
        self._settled = anyio.Event()
        self._settled.set()

    # ------------------------------------------------------------------ cache budget
    async def reserve(self, wanted: int) -> int:
        """Wait (in line with other fetchers) until the cache has room, then reserve up to
        ``wanted`` messages."""
        async with self._reserve_lock:
            while True:  # bounded by the consumer's lifetime: released messages wake it
                granted = self.budget.try_reserve(wanted)
                if granted:
                    return granted
                space = self._space
                await space.wait()

    def release(self, messages: int, size: int) -> None:
        """Messages left the cache: wake fetchers waiting for room."""
        self.budget.release(messages, size)
        self._space.set()
        self._space = anyio.Event()

    def fill(self, reserved: int, messages: list[ReceivedMessage]) -> None:
        """A fetch that reserved ``reserved`` brought ``messages``."""
        self.budget.fill(reserved, len(messages), sum(len(m.body) for m in messages))
        if len(messages) < reserved:
            self._space.set()
            self._space = anyio.Event()

    # ------------------------------------------------------------------ listener calls
    async def consume(self, message: ReceivedMessage) -> Outcome:
        """Run the listener on ``message`` within the concurrency bound and its deadline."""
        async with self.limiter:
            if self.closing:
                return Outcome.SKIPPED
            self.active += 1
            self.peak_active = max(self.peak_active, self.active)
            try:
                outcome = await self._call(message)
            finally:
                self.active -= 1
        if outcome is Outcome.SUCCESS:
            self.consumed += 1
        else:
            self.failed += 1
            self.timed_out += outcome is Outcome.TIMEOUT
        return outcome

    async def _call(self, message: ReceivedMessage) -> Outcome:
        result: object = None
        try:
            with anyio.move_on_after(self.options.consume_timeout) as scope:
                if self.is_async:
                    result = await cast(Awaitable[object], self.listener(message))
                else:
                    result = await anyio.to_thread.run_sync(
                        self.listener, message, abandon_on_cancel=True,
                        limiter=self._thread_limiter,
                    )  # fmt: skip
        except Exception:
            _log.exception("listener raised", message_id=message.message_id, topic=message.topic)
            return Outcome.FAILURE
        if scope.cancelled_caught:
            _log.warning(
                "consume timeout", message_id=message.message_id,
                timeout_s=self.options.consume_timeout,
            )  # fmt: skip
            return Outcome.TIMEOUT
        if result is ConsumeResult.SUCCESS:
            return Outcome.SUCCESS
        if not isinstance(result, ConsumeResult):
            _log.warning("listener returned no ConsumeResult", result=repr(result)[:80])
        return Outcome.FAILURE

    @contextmanager
    def tracked(self) -> Iterator[None]:
        """Count a consume task for :meth:`wait_settled` while the block runs."""
        if not self.tasks:
            self._settled = anyio.Event()
        self.tasks += 1
        try:
            yield
        finally:
            self.tasks -= 1
            if not self.tasks:
                self._settled.set()

    async def wait_settled(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait up to ``timeout`` until no consume task is left; True if none is."""
        with anyio.move_on_after(timeout):
            await self._settled.wait()
            return True
        return False

    def statistics(self) -> PushStatistics:
        """A snapshot of the counters."""
        b = self.budget
        return PushStatistics(
            cached_messages=b.cached, cached_bytes=b.cached_bytes,
            peak_cached_messages=b.peak_cached, active_calls=self.active,
            peak_active_calls=self.peak_active, consumed=self.consumed,
            failed=self.failed, timed_out=self.timed_out, dead_lettered=self.dead_lettered,
            assigned_queues=self.assigned_queues,
        )  # fmt: skip
