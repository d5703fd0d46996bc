"""Pop mode: the broker balances, the client only receives, consumes and settles.

One receive loop per subscribed (topic, broker) long-polls POP_MESSAGE and hands each message
to a consume task; a loop first reserves room in the cache budget and pops at most that many,
so the cache never holds more than ``max_cache_messages`` (and a loop waits while the cached
bytes are over ``max_cache_bytes``). New (topic, broker) pairs are picked up every
``rebalance_interval`` as routes are refreshed.

Settling, per message:

* success → ACK_MESSAGE;
* failure (result, exception or consume timeout) → CHANGE_MESSAGE_INVISIBLETIME to a back-off
  (1 s, 2 s, 4 s … up to ``retry_backoff_max``, by delivery attempt) instead of waiting out
  the whole invisible time, as RocketMQ 5's push consumer does with its retry policy. At the
  new deadline the broker revives it into the group's retry topic with its attempt count
  raised; the consumer sees the original topic. Past the broker's max reconsume times the
  broker dead-letters it (``%DLQ%group``); the client does not count concurrent retries;
* a message whose invisible time ran out while it waited in the cache is skipped: the broker
  has already made it visible again, consuming it now would only duplicate it;
* on shutdown, cached messages that never reached the listener are given back (their invisible
  time is set to the minimum) so another consumer gets them at once.

Orderly (``order=True`` pops): the broker serves one queue's messages in order and keeps the
queue locked while any of them is unacked. The batch is consumed one message at a time; on
SUSPEND (or any failure) the rest of the batch is made visible again after
``suspend_interval``, so the same messages come back in the same order. A message that failed
more than ``max_reconsume_times`` times (counted by this client: the broker's attempt count
also rises for messages re-popped unconsumed behind a failed one) is sent to ``%DLQ%group``
by the client (CONSUMER_SEND_MSG_BACK, delay level -1) and acked, so the queue moves on
(seed 004).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping

import anyio
import anyio.abc
import structlog

from client.errors import ClientError, SubscriptionRefusedError
from client.filters import FilterExpression
from client.instance import ClientInstance
from client.message import ReceivedMessage
from client.pop import PopSession, brokers_of
from client.push import pull_api
from client.push.runtime import REFUSED_PAUSE, Runtime
from client.push.types import Outcome
from protocol.errors import TrimqError
from protocol.receipt import MAX_POP_MESSAGES

_log = structlog.get_logger("trimq.client.push")
#: Pause after a failed pop before the loop tries again (RocketMQ 5: 1 s on receive failure).
_POP_FAILURE_PAUSE = 1.0
#: Invisible time of a message given back on shutdown: as soon as the broker allows.
_GIVE_BACK_MS = 1
#: Orderly failure counts kept at most (oldest forgotten first; the broker's own limit
#: still dead-letters a message whose count was forgotten).
_MAX_TRACKED_FAILURES = 10_000


class PopEngine:
    """Receive loops and settling for a pop-mode push consumer (see module doc)."""

    def __init__(
        self,
        instance: ClientInstance,
        group: str,
        subscription: Mapping[str, FilterExpression],
        runtime: Runtime,
        consume_tg: anyio.abc.TaskGroup,
    ) -> None:
        self.instance = instance
        self.group = group
        self.subscription = dict(subscription)
        self.runtime = runtime
        self.options = runtime.options
        self.session = PopSession(instance, group, from_first=self.options.consume_from == "first")
        self._consume_tg = consume_tg
        self._loops: set[tuple[str, str]] = set()
        #: Orderly: failed consumptions per message (topic, queue, offset), counted here
        #: because the broker's attempt count also rises for messages re-popped unconsumed
        #: behind a failed one.
        self._failures: dict[tuple[str, int, int], int] = {}

    async def run(self) -> None:
        """Start receive loops for every (topic, broker) and keep discovering new ones."""
        async with anyio.create_task_group() as tg:
            while True:  # runs until the consumer cancels its fetchers
                pairs = await self._pairs()
                for pair in pairs:
                    if pair not in self._loops:
                        self._loops.add(pair)
                        tg.start_soon(self._receive_loop, *pair)
                # A topic without a route yet (created after we started) is looked for
                # every second, not every rebalance interval.
                covered = {topic for topic, _ in pairs}
                interval = self.options.rebalance_interval
                await anyio.sleep(
                    interval if covered >= set(self.subscription) else min(1.0, interval)
                )

    async def _pairs(self) -> list[tuple[str, str]]:
        pairs = []
        for topic in sorted(self.subscription):
            try:
                route = await self.instance.route(topic)
            except ClientError as exc:
                _log.warning("no route", topic=topic, error=str(exc))
                continue
            pairs += [(topic, b) for b in brokers_of(route.read_queues)]
        return pairs

    async def _receive_loop(self, topic: str, broker: str) -> None:
        options = self.options
        caught_up = False
        while not self.runtime.closing:
            # After an empty pop the next one is a long poll: it reserves room for one
            # message only, so an idle (topic, broker) does not hold the budget others need.
            wanted = 1 if caught_up else min(MAX_POP_MESSAGES, options.pull_batch_size)
            reserved = await self.runtime.reserve(wanted)
            try:
                got = await self.session.pop(
                    broker, topic, max_messages=reserved, invisible_ms=options.invisible_ms,
                    poll_ms=int(options.long_poll_s * 1000),
                    expression=self.subscription.get(topic, FilterExpression()),
                    order=options.orderly,
                )  # fmt: skip
            except SubscriptionRefusedError as exc:
                self.runtime.fill(reserved, [])
                _log.error("subscription refused", topic=topic, broker=broker, error=str(exc))
                await anyio.sleep(REFUSED_PAUSE)
                continue
            except TrimqError as exc:
                self.runtime.fill(reserved, [])
                _log.warning("pop failed", topic=topic, broker=broker, error=str(exc))
                await anyio.sleep(_POP_FAILURE_PAUSE)
                continue
            self.runtime.fill(reserved, got)
            caught_up = not got
            if not got:
                continue
            if options.orderly:
                self._consume_tg.start_soon(self._consume_in_order, got)
            else:
                for message in got:
                    self._consume_tg.start_soon(self._consume_one, message)

    # ------------------------------------------------------------------ settling
    def _expired(self, message: ReceivedMessage) -> bool:
        # received_at is time.monotonic() at decode; leave a little room for the ack trip.
        deadline = message.received_at + self.options.invisible_ms / 1000 - 0.5
        return time.monotonic() > deadline

    async def _consume_one(self, message: ReceivedMessage) -> None:
        with self.runtime.tracked():
            await self._consume_one_tracked(message)

    async def _consume_one_tracked(self, message: ReceivedMessage) -> None:
        try:
            if self._expired(message):
                _log.info("invisible time ran out in the cache", message_id=message.message_id)
                return
            outcome = await self.runtime.consume(message)
            if outcome is Outcome.SUCCESS:
                await self._settle(self.session.ack(message), message, "ack")
            elif outcome is Outcome.SKIPPED:
                await self._give_back([message])
            else:
                delay = self.options.retry_backoff(message.delivery_attempt)
                change = self.session.change_invisible(message, max(1, int(delay * 1000)))
                await self._settle(change, message, "change invisible time")
        finally:
            self.runtime.release(1, len(message.body))

    async def _consume_in_order(self, batch: list[ReceivedMessage]) -> None:
        with self.runtime.tracked():
            await self._consume_batch_in_order(batch)

    async def _consume_batch_in_order(self, batch: list[ReceivedMessage]) -> None:
        done = 0
        try:
            for message in batch:
                outcome = await self.runtime.consume(message)
                if outcome is Outcome.SKIPPED:
                    break
                if outcome is not Outcome.SUCCESS and not await self._dead_letter_if_spent(message):
                    await self._later(batch[done:], self.options.suspend_interval)
                    done = len(batch)
                    break
                self._failures.pop(
                    (message.record.topic, message.record.queue_id, message.queue_offset), None
                )
                await self._settle(self.session.ack(message), message, "ack")
                done += 1
            await self._give_back(batch[done:])
        finally:
            self.runtime.release(len(batch), sum(len(m.body) for m in batch))

    async def _dead_letter_if_spent(self, message: ReceivedMessage) -> bool:
        """Orderly: a failure past the retry limit sends the message to the DLQ (True) — if
        that fails it is retried like any failure, so it is never lost."""
        key = (message.record.topic, message.record.queue_id, message.queue_offset)
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        if len(self._failures) > _MAX_TRACKED_FAILURES:  # messages another consumer took
            del self._failures[next(iter(self._failures))]
        if failures <= self.options.max_reconsume_times:
            return False
        try:
            await pull_api.send_back(
                self.instance, self.group, message, delay_level=-1,
                max_reconsume_times=self.options.max_reconsume_times,
            )  # fmt: skip
        except TrimqError as exc:
            _log.warning("dead-lettering failed", message_id=message.message_id, error=str(exc))
            return False
        self._failures.pop(key, None)
        self.runtime.dead_lettered += 1
        _log.warning("sent to DLQ after retries", message_id=message.message_id,
                     attempts=message.delivery_attempt)  # fmt: skip
        return True

    async def _later(self, messages: list[ReceivedMessage], seconds: float) -> None:
        for message in messages:
            change = self.session.change_invisible(message, max(1, int(seconds * 1000)))
            await self._settle(change, message, "change invisible time")

    async def _give_back(self, messages: list[ReceivedMessage]) -> None:
        for message in messages:
            change = self.session.change_invisible(message, _GIVE_BACK_MS)
            await self._settle(change, message, "give back")

    @staticmethod
    async def _settle(call: Awaitable[object], message: ReceivedMessage, what: str) -> None:
        # A failed ack or change is logged, not retried: the message comes back when its
        # invisible time runs out (at-least-once).
        try:
            await call
        except TrimqError as exc:
            _log.warning(f"{what} failed", message_id=message.message_id, error=str(exc))
