"""Pull mode: the client balances queues among the group's consumers and pulls them.

Theory of operation (RocketMQ's ``RebalancePushImpl`` + ``DefaultMQPushConsumerImpl``):

* **Rebalance** at start, every ``rebalance_interval`` (20 s) and at once when a broker sends
  NOTIFY_CONSUMER_IDS_CHANGED: for each subscribed topic and the group's ``%RETRY%group``
  topic, the readable queues and the group's client ids (GET_CONSUMER_LIST_BY_GROUP) are
  split with :func:`~client.push.allocate.allocate_averagely`. A queue gained gets a
  :class:`QueueState` (process queue, pull task); a queue lost has its pull cancelled, its
  offset persisted, its lock released (orderly), and its late results ignored.
* **Pull** per queue with long polling (the broker holds the request up to ``long_poll``
  seconds), carrying the local offset as a commit. Before each pull the loop reserves room
  in the consumer-wide cache budget and asks for at most that many messages and at most the
  bytes left, and it waits while the queue's offset span exceeds ``max_span`` (2000).
* **Concurrent consumption**: a task per message; the listener runs within the concurrency
  bound and its own consume timeout. Success finishes the message; failure or timeout sends
  it back (CONSUMER_SEND_MSG_BACK; the broker re-queues it on ``%RETRY%group`` after delay
  level ``send_back_delay_level``, 0 = ``3 + reconsume times``) and finishes it; if the
  send-back fails it is consumed again locally after 5 s. Finishing removes it from the
  process queue and moves the local offset to the smallest unfinished offset.
* **Orderly consumption** (:mod:`client.push.orderly`): a queue is consumed only while this
  client holds its broker lock, one message at a time.
* **Offsets** (:class:`~client.push.offsets.OffsetStore`) are persisted every
  ``persist_interval`` (5 s), on queue loss and on close.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import anyio
import anyio.abc
import structlog

from client.errors import NoRouteError, SubscriptionRefusedError
from client.filters import FilterExpression
from client.instance import ClientInstance
from client.message import ReceivedMessage
from client.pop import brokers_of
from client.push import pull_api
from client.push.allocate import allocate_averagely
from client.push.offsets import OffsetStore
from client.push.process_queue import ProcessQueue
from client.push.runtime import REFUSED_PAUSE, Runtime
from client.push.types import Outcome
from protocol.bodies.consumer import MessageQueue
from protocol.codes import ResponseCode
from protocol.errors import TrimqError
from protocol.naming import retry_topic

_log = structlog.get_logger("trimq.client.push")
#: Java ``pullTimeDelayMillsWhenException`` is 3 s; 1 s keeps a restarted broker's queues
#: from idling long.
_PULL_FAILURE_PAUSE = 1.0
#: Java ``PULL_TIME_DELAY_MILLS_WHEN_CACHE_FLOW_CONTROL``.
_FLOW_CONTROL_PAUSE = 0.05
#: Java ``submitConsumeRequestLater``: re-consume locally when the send-back failed.
_RECONSUME_LATER_DELAY = 5.0
#: Java ``removeUnnecessaryMessageQueue``: an orderly queue's consume lock is waited for 1 s.
_ORDERLY_DROP_WAIT = 1.0


def tag_matches(expression: str, tag: str | None) -> bool:
    """Client-side tag filter (the broker filters by tag hash, which can collide)."""
    return FilterExpression.tag(expression).matches_tag(tag)


@dataclass(eq=False)
class QueueState:
    """One owned queue: its process queue, its pull task's scope and (orderly) its lock."""

    mq: MessageQueue
    pq: ProcessQueue
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    #: ``anyio.current_time()`` until which the broker lock is ours (orderly).
    locked_until: float = 0.0
    #: Set when a pull brought messages (wakes the orderly consumer of the queue).
    wake: anyio.Event = field(default_factory=anyio.Event)
    #: The last pull found nothing new: the next one is a long poll that may be held.
    caught_up: bool = False
    #: Orderly: a listener call on this queue is running; ``idle`` is set when it ends.
    consuming: bool = False
    idle: anyio.Event = field(default_factory=anyio.Event)


class PullEngine:
    """Rebalance, pull loops, offsets and consumption for pull mode (see module doc)."""

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
        self.retry_topic = retry_topic(group)
        self.runtime = runtime
        self.options = runtime.options
        self.offsets = OffsetStore(instance, group, consume_from=self.options.consume_from)
        self.queues: dict[MessageQueue, QueueState] = {}
        self._consume_tg = consume_tg
        self._rebalance_now = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        # Imported here: orderly needs this module's QueueState.
        from client.push.orderly import OrderlyConsumer

        self.orderly = OrderlyConsumer(self) if self.options.orderly else None

    def expression(self, topic: str) -> FilterExpression:
        """The filter of a topic (every message, ``*``, for the retry topic)."""
        return self.subscription.get(topic, FilterExpression())

    def request_rebalance(self) -> None:
        """Rebalance as soon as possible (NOTIFY_CONSUMER_IDS_CHANGED, a new retry topic)."""
        self._rebalance_now.set()

    # ------------------------------------------------------------------ background
    async def run(self) -> None:
        """Rebalance now and then, pull owned queues, persist offsets; until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._persist_loop)
            if self.orderly is not None:
                tg.start_soon(self.orderly.lock_loop)
            while True:  # runs until the consumer cancels its fetchers
                await self.rebalance()
                with anyio.move_on_after(self.options.rebalance_interval):
                    await self._rebalance_now.wait()
                self._rebalance_now = anyio.Event()

    async def _persist_loop(self) -> None:
        while True:  # until cancelled
            await anyio.sleep(self.options.persist_interval)
            await self.offsets.persist_all()

    # ------------------------------------------------------------------ rebalance
    async def rebalance(self) -> None:
        """Recompute the owned queues of every topic and start or stop pulls to match."""
        for topic in [*sorted(self.subscription), self.retry_topic]:
            mine = await self._allocate(topic)
            if mine is None:
                continue  # no answer: keep what we have for this topic
            current = {mq for mq in self.queues if mq.topic == topic}
            for mq in sorted(current - mine):
                await self.drop(mq)
            for mq in sorted(mine - current):
                await self._add(mq)
        self.runtime.assigned_queues = len(self.queues)

    async def _allocate(self, topic: str) -> set[MessageQueue] | None:
        try:
            route = await self.instance.route(topic)
        except NoRouteError:
            if topic != self.retry_topic:  # the retry topic appears with the first send-back
                _log.warning("no route", topic=topic)
            return None
        for broker in brokers_of(route.read_queues):
            try:
                cids = await pull_api.consumer_ids(self.instance, self.group, broker)
            except TrimqError as exc:
                _log.info("consumer list failed", broker=broker, error=str(exc))
                continue
            if self.instance.client_id not in cids:
                return None  # our heartbeat has not arrived yet: Java skips this round
            return set(allocate_averagely(self.instance.client_id, route.read_queues, cids))
        return None

    async def _add(self, mq: MessageQueue) -> None:
        try:
            offset = await self.offsets.start_offset(mq)
        except TrimqError as exc:
            _log.warning("cannot read start offset", queue=str(mq), error=str(exc))
            return
        state = QueueState(mq, ProcessQueue(offset))
        if self.orderly is not None and not await self.orderly.lock(state):
            return  # held by another consumer still: try again next rebalance
        self.queues[mq] = state
        assert self._tg is not None
        self._tg.start_soon(self._pull_loop, state)
        if self.orderly is not None:
            self._consume_tg.start_soon(self.orderly.consume_loop, state)
        _log.info("queue assigned", queue=str(mq), offset=offset)

    async def drop(self, mq: MessageQueue) -> None:
        """Give up ``mq``: stop pulling, persist its offset, unlock it, forget its messages.

        Orderly: not while a listener call on it runs (waits up to 1 s, else keeps it until
        the next rebalance, as Java's ``removeUnnecessaryMessageQueue``), since unlocking
        would let the new owner consume the queue's next message alongside it.
        """
        state = self.queues.get(mq)
        if state is None:
            return
        if self.orderly is not None and state.consuming:
            with anyio.move_on_after(_ORDERLY_DROP_WAIT):
                await state.idle.wait()
            if state.consuming:
                _log.info("queue busy: released at the next rebalance", queue=str(mq))
                return
        del self.queues[mq]
        state.scope.cancel()
        state.pq.dropped = True
        state.wake.set()
        self.offsets.update(mq, state.pq.commit_offset)
        await self.offsets.persist(mq)
        self.offsets.remove(mq)
        if self.orderly is not None:
            await self.orderly.unlock([state])
        self.runtime.release(*state.pq.clear())
        _log.info("queue released", queue=str(mq))

    def reset_offsets(self, topic: str, table: Mapping[MessageQueue, int]) -> None:
        """The broker reset the group's offsets on ``topic`` (RESET_CONSUMER_CLIENT_OFFSET)."""
        if self._tg is not None:
            self._tg.start_soon(self._reset, topic, dict(table))

    async def _reset(self, topic: str, table: dict[MessageQueue, int]) -> None:
        """Forget the owned queues' positions and cached messages (never committing them:
        that would undo the reset), then take the queues again from the broker's offsets."""
        for mq, offset in sorted(table.items()):
            state = self.queues.pop(mq, None) if mq.topic == topic else None
            if state is None:
                continue
            state.scope.cancel()
            state.pq.dropped = True
            state.wake.set()
            self.offsets.remove(mq)
            if self.orderly is not None:
                await self.orderly.unlock([state])
            self.runtime.release(*state.pq.clear())
            _log.info("queue reset", queue=str(mq), offset=offset)
        self.request_rebalance()

    async def close(self) -> None:
        """On shutdown (consumption ended): persist every offset, release every lock."""
        states = list(self.queues.values())
        for state in states:
            state.pq.dropped = True
            self.offsets.update(state.mq, state.pq.commit_offset)
        await self.offsets.persist_all()
        if self.orderly is not None:
            await self.orderly.unlock(states)

    # ------------------------------------------------------------------ pulling
    async def _pull_loop(self, state: QueueState) -> None:
        with state.scope:
            while not self.runtime.closing and not state.pq.dropped:
                if not await self._may_pull(state):
                    continue
                # A long poll that may sit on the broker for seconds reserves room for one
                # message only, so idle queues do not hold the cache budget others need.
                wanted = 1 if state.caught_up else self.options.pull_batch_size
                reserved = await self.runtime.reserve(wanted)
                try:
                    result = await self._pull(state, reserved)
                except SubscriptionRefusedError as exc:
                    self.runtime.fill(reserved, [])
                    _log.error("subscription refused", queue=str(state.mq), error=str(exc))
                    await anyio.sleep(REFUSED_PAUSE)
                    continue
                except TrimqError as exc:
                    self.runtime.fill(reserved, [])
                    _log.warning("pull failed", queue=str(state.mq), error=str(exc))
                    await anyio.sleep(_PULL_FAILURE_PAUSE)
                    continue
                self._accept(state, reserved, result)

    async def _may_pull(self, state: QueueState) -> bool:
        if self.orderly is not None and not self.orderly.holds(state):
            await anyio.sleep(self.options.suspend_interval)
            return False
        if self.orderly is None and state.pq.span > self.options.max_span:
            await anyio.sleep(_FLOW_CONTROL_PAUSE)
            return False
        return True

    async def _pull(self, state: QueueState, reserved: int) -> pull_api.PullResult:
        budget = self.runtime.budget
        commit = self.offsets.get(state.mq)
        return await pull_api.pull(
            self.instance, self.group, state.mq, state.pq.next_offset, max_messages=reserved,
            max_bytes=max(1, budget.max_bytes - budget.cached_bytes), commit_offset=commit,
            expression=self.expression(state.mq.topic),
            suspend_ms=int(self.options.long_poll_s * 1000),
        )  # fmt: skip

    def _accept(self, state: QueueState, reserved: int, result: pull_api.PullResult) -> None:
        if state.pq.dropped:
            self.runtime.fill(reserved, [])
            return
        if result.code == ResponseCode.PULL_OFFSET_MOVED:
            # The offset points at nothing (retention removed it, or it is past the end):
            # jump to where the broker says, as Java's OFFSET_ILLEGAL handling does.
            self.runtime.fill(reserved, [])
            _log.warning("offset moved", queue=str(state.mq), next=result.next_offset)
            state.pq.next_offset = result.next_offset
            self.offsets.update(state.mq, result.next_offset, increase_only=False)
            return
        expression = self.expression(state.mq.topic)
        wanted = [m for m in result.messages if expression.matches_tag(m.tag)]
        added = state.pq.put(wanted, result.next_offset)
        self.runtime.fill(reserved, added)
        state.caught_up = not added
        if not state.pq.count:  # everything filtered or nothing new: the offset moves on
            self.offsets.update(state.mq, state.pq.commit_offset)
        if self.orderly is not None:
            state.wake.set()
            return
        for message in added:
            self._consume_tg.start_soon(self._consume_concurrently, state, message)

    # ------------------------------------------------------------------ consuming
    async def _consume_concurrently(self, state: QueueState, message: ReceivedMessage) -> None:
        with self.runtime.tracked():
            while True:  # bounded: ends on success, send-back, drop or shutdown
                outcome = await self.runtime.consume(message)
                if outcome is Outcome.SKIPPED:
                    return  # shutdown: left unfinished, so the committed offset keeps it
                if outcome is Outcome.SUCCESS or state.pq.dropped:
                    break
                if await self.send_back(message, self.options.send_back_delay_level):
                    break
                # Java bumps the count locally and re-submits the message 5 s later.
                record = replace(message.record, reconsume_times=message.reconsume_times + 1)
                message = replace(message, record=record)
                await anyio.sleep(_RECONSUME_LATER_DELAY)
                if self.runtime.closing:
                    return
            self.finish(state, message.queue_offset)

    def finish(self, state: QueueState, offset: int) -> None:
        """The message at ``offset`` is done: out of the cache, and the offset moves on."""
        size = state.pq.remove(offset)
        if size is not None:
            self.runtime.release(1, size)
        if not state.pq.dropped:
            self.offsets.update(state.mq, state.pq.commit_offset)

    async def send_back(self, message: ReceivedMessage, delay_level: int) -> bool:
        """CONSUMER_SEND_MSG_BACK; True if the broker took it."""
        try:
            await pull_api.send_back(
                self.instance, self.group, message, delay_level=delay_level,
                max_reconsume_times=self.options.max_reconsume_times,
            )  # fmt: skip
        except TrimqError as exc:
            _log.warning("send back failed", message_id=message.message_id, error=str(exc))
            return False
        if self.instance.cached_route(self.retry_topic) is None:
            self.request_rebalance()  # the retry topic may exist only now: start pulling it
        return True
