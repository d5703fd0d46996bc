"""Orderly consumption in pull mode (RocketMQ's ``ConsumeMessageOrderlyService``).

A queue is pulled and consumed only while this client holds its lock on the broker
(LOCK_BATCH_MQ): taken when the queue is assigned, renewed for every owned queue every
``_LOCK_INTERVAL`` (Java ``REBALANCE_LOCK_INTERVAL``, 20 s), trusted for ``_LOCK_LIVE``
(Java ``REBALANCE_LOCK_MAX_LIVE_TIME``, 30 s, shorter than the broker's expiry) after it was
granted, and released (UNLOCK_BATCH_MQ) when the queue is lost or the consumer stops.

One task per queue consumes its process queue's head message, one at a time, so messages of
a queue are handled in offset order. On failure (SUSPEND, RETRY_LATER, exception, timeout) the
same message is tried again after ``suspend_interval``; its delivery attempt counts up locally
(as Java bumps ``reconsumeTimes``). Once it has failed with ``max_reconsume_times`` reconsumes
behind it, it is sent to ``%DLQ%group`` (CONSUMER_SEND_MSG_BACK with delay level -1) and the
queue moves on — the retry limit seed 004 describes; without it a poison message would
block its queue forever.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
import structlog

from client.message import ReceivedMessage
from client.push import pull_api
from client.push.types import Outcome
from protocol.bodies.consumer import MessageQueue
from protocol.errors import TrimqError

if TYPE_CHECKING:
    from client.push.pull_mode import PullEngine, QueueState

_log = structlog.get_logger("trimq.client.push")
_LOCK_INTERVAL = 20.0
_LOCK_LIVE = 30.0


class OrderlyConsumer:
    """Queue locks and the per-queue consume loop of an orderly pull-mode consumer."""

    def __init__(self, engine: PullEngine) -> None:
        self.engine = engine
        self.runtime = engine.runtime
        self.options = engine.options

    # ------------------------------------------------------------------ locks
    def holds(self, state: QueueState) -> bool:
        """Whether this client may consume the queue now."""
        return anyio.current_time() < state.locked_until

    async def lock(self, state: QueueState) -> bool:
        """Lock one queue; True if this client holds it now."""
        await self._lock_many([state])
        return self.holds(state)

    async def lock_loop(self) -> None:
        """Renew the locks of every owned queue until cancelled."""
        while True:  # until cancelled
            await anyio.sleep(_LOCK_INTERVAL)
            await self._lock_many(list(self.engine.queues.values()))

    async def _lock_many(self, states: Iterable[QueueState]) -> None:
        by_broker: dict[str, list[QueueState]] = defaultdict(list)
        for state in states:
            by_broker[state.mq.broker_name].append(state)
        for broker, group in by_broker.items():
            now = anyio.current_time()
            try:
                granted = await pull_api.lock_batch(
                    self.engine.instance, self.engine.group, broker, [s.mq for s in group]
                )
            except TrimqError as exc:
                _log.warning("lock failed", broker=broker, error=str(exc))
                continue
            for state in group:
                state.locked_until = now + _LOCK_LIVE if state.mq in granted else 0.0

    async def unlock(self, states: Iterable[QueueState]) -> None:
        """Release the locks of ``states`` (best effort)."""
        by_broker: dict[str, list[MessageQueue]] = defaultdict(list)
        for state in states:
            state.locked_until = 0.0
            by_broker[state.mq.broker_name].append(state.mq)
        for broker, mqs in by_broker.items():
            try:
                await pull_api.unlock_batch(self.engine.instance, self.engine.group, broker, mqs)
            except TrimqError as exc:
                _log.info("unlock failed", broker=broker, error=str(exc))

    # ------------------------------------------------------------------ consuming
    async def consume_loop(self, state: QueueState) -> None:
        """Consume the queue's messages one at a time, in order, until it is dropped or
        the consumer stops."""
        failures: dict[int, int] = {}
        while not self.runtime.closing and not state.pq.dropped:  # until dropped or closing
            message = state.pq.head()
            if message is None:
                await state.wake.wait()
                state.wake = anyio.Event()
                continue
            if not self.holds(state):
                await anyio.sleep(self.options.suspend_interval)
                continue
            offset = message.queue_offset
            count = message.reconsume_times + failures.get(offset, 0)
            view = replace(message, record=replace(message.record, reconsume_times=count))
            with self.runtime.tracked():
                state.consuming, state.idle = True, anyio.Event()
                try:
                    outcome = await self.runtime.consume(view)
                finally:
                    state.consuming = False
                    state.idle.set()
                if outcome is Outcome.SKIPPED or state.pq.dropped:
                    return
                if outcome is Outcome.SUCCESS or await self._dead_letter_if_spent(view):
                    failures.pop(offset, None)
                    self.engine.finish(state, offset)
                    continue
            failures[offset] = failures.get(offset, 0) + 1
            await anyio.sleep(self.options.suspend_interval)

    async def _dead_letter_if_spent(self, message: ReceivedMessage) -> bool:
        if message.reconsume_times < self.options.max_reconsume_times:
            return False
        if not await self.engine.send_back(message, -1):
            return False  # try again after the suspend interval: never lose it
        self.runtime.dead_lettered += 1
        _log.warning("sent to DLQ after retries", message_id=message.message_id,
                     attempts=message.delivery_attempt)  # fmt: skip
        return True
