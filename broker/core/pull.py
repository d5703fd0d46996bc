"""Classic pull with long polling (RocketMQ ``PullMessageProcessor`` and
``PullRequestHoldService``), transport-neutral.

A pull reads up to ``max_nums`` stored records from the client's offset. Only a caught-up
read ("nothing past your offset yet") is held: the pull parks in the
:class:`~broker.longpoll.PullHub`, is woken the moment a matching message is dispatched to its
queue (not by a 5 s scan), reads once more and answers whatever it finds; at its deadline it is
answered "caught up" at once, without re-reading (weak spots 4 and 5 in
docs/rocketmq-differences.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from broker.core.clients import ClientRegistry
from broker.core.filters import EVERYTHING, MessageFilter, check_readable, message_filter
from broker.core.offsets import OffsetService
from broker.longpoll import PullHub
from broker.store.api import GetResult, GetStatus
from broker.store.store import MessageStore
from broker.topics import TopicManager

#: Messages one pull returns at most (RocketMQ ``maxTransferCountOnMessageInMemory``).
MAX_PULL_MESSAGES = 32
#: Bytes one pull returns at most unless the client asks for less (at least one message).
MAX_PULL_BYTES = 4 * 1024 * 1024
#: Read outcomes of an unknown or empty queue: "caught up" for a pull from 0 (a consumer
#: waiting for a new queue's first message), "offset moved" otherwise.
_EMPTY_QUEUE = frozenset({GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE})


@dataclass(frozen=True, slots=True)
class PullRequest:
    """One pull of one queue from an offset (validated by :meth:`PullService.check`)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    max_nums: int
    #: The client's byte limit (None or ≤ 0: the broker's).
    max_bytes: int | None = None
    #: The pull's own subscription, (expression, expression type) — every C++ and JavaScript
    #: pull carries one; None: the one the group registered by heartbeat, else every message.
    subscription: tuple[str | None, str | None] | None = None
    #: An offset to commit first (C++ clients commit on every pull); None: no commit.
    commit_offset: int | None = None


def caught_up(status: GetStatus, requested_offset: int) -> bool:
    """Whether a read found nothing *yet* (RocketMQ's ``PULL_NOT_FOUND``): only such a pull
    may be held."""
    return status is GetStatus.OFFSET_OVERFLOW_ONE or (
        status in _EMPTY_QUEUE and requested_offset == 0
    )


class PullService:
    """Pulls over a store, with long polling in a :class:`PullHub`."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicManager,
        hub: PullHub,
        clients: ClientRegistry,
        offsets: OffsetService,
        stopping: trio.Event,
        *,
        max_hold_ms: int,
        property_filter: bool = True,
    ) -> None:
        self.store = store
        #: Whether SQL92 subscriptions are served (``enable_property_filter``).
        self.property_filter = property_filter
        self.topics = topics
        self.hub = hub
        self.clients = clients
        self.offsets = offsets
        self.stopping = stopping
        #: The longest a pull is held, whatever it asks (``brokerSuspendMaxTimeMillis``).
        self.max_hold_ms = max_hold_ms

    def filter_of(self, req: PullRequest) -> MessageFilter:
        """The pull's filter: its own expression when it carries one, else the one its group
        registered by heartbeat, else none (clients filter tags themselves too).

        Raises:
            BrokerError: ``SUBSCRIPTION_PARSE_FAILED`` for an expression type the broker
                does not serve or an SQL92 expression that does not parse.
        """
        if req.subscription is not None:
            expression, expression_type = req.subscription
        else:
            sub = self.clients.subscription(req.group, req.topic)
            if sub is None:
                return EVERYTHING
            expression, expression_type = sub.expression, sub.expression_type
        return message_filter(expression, expression_type, property_filter=self.property_filter)

    async def pull(self, req: PullRequest, *, hold_ms: int) -> GetResult:
        """Check, commit the piggy-backed offset, read, and hold a caught-up pull for up to
        ``hold_ms`` (capped by ``max_hold_ms``; none once the broker is stopping) until a
        matching message arrives.

        Raises:
            BrokerError: ``TOPIC_NOT_EXIST``, ``NO_PERMISSION``, ``INVALID_PARAMETER`` or
                ``SUBSCRIPTION_PARSE_FAILED``.
            IllegalNameError: the group name is illegal (checked when committing).
        """
        wanted, result = self._start(req)
        hold_s = self._hold_s(req, result, hold_ms)
        if hold_s <= 0:
            return result
        # No lost wake-up: the read above and the registration inside PullHub.wait (it
        # registers before its first checkpoint) run in one synchronous step of this task,
        # and the store calls PullHub.arriving only on the trio thread. So a message
        # dispatched "between the read and the park" cannot exist: it was either seen by the
        # read or it will wake this waiter. Keep every await out of that span.
        woken = await self.hub.wait(
            req.topic, req.queue_id, wanted.tags, trio.current_time() + hold_s,
            wanted.property_match,
        )  # fmt: skip
        if not woken or self.stopping.is_set():
            return self._timed_out(req, result)
        # Woken by a matching message: read once more and answer whatever it finds
        # (RocketMQ's executeRequestWhenWakeup with brokerAllowSuspend = false).
        return self._read(req, wanted)

    def pull_nowait(self, req: PullRequest, *, hold_ms: int) -> GetResult | None:
        """:meth:`pull` when it would not hold the request, without a checkpoint: its
        answer; None when it would (then :meth:`pull` it, which commits the piggy-backed
        offset again: the same offset, a no-op).

        Raises:
            BrokerError, IllegalNameError: as :meth:`pull`.
        """
        _, result = self._start(req)
        return None if self._hold_s(req, result, hold_ms) > 0 else result

    def _start(self, req: PullRequest) -> tuple[MessageFilter, GetResult]:
        """Check, commit the piggy-backed offset, read: the filter and the first read."""
        check_readable(self.topics, req.topic, req.queue_id, req.group)
        wanted = self.filter_of(req)
        if req.commit_offset is not None:
            self.offsets.commit_checked(req.group, req.topic, req.queue_id, req.commit_offset)
        return wanted, self._read(req, wanted)

    def _hold_s(self, req: PullRequest, result: GetResult, hold_ms: int) -> float:
        """How long to hold a pull that read ``result`` first: 0 unless it is caught up,
        asks for a hold (capped by ``max_hold_ms``) and the broker is not stopping."""
        hold_s = max(0, min(hold_ms, self.max_hold_ms)) / 1000
        if hold_s <= 0 or self.stopping.is_set() or not caught_up(result.status, req.offset):
            return 0
        return hold_s

    def _read(self, req: PullRequest, wanted: MessageFilter) -> GetResult:
        count = min(max(req.max_nums, 1), MAX_PULL_MESSAGES)
        limit = req.max_bytes
        max_bytes = (
            min(limit, MAX_PULL_BYTES) if limit is not None and limit > 0 else MAX_PULL_BYTES
        )
        return self.store.get(
            req.topic, req.queue_id, req.offset, count, max_bytes=max_bytes,
            tags_codes=wanted.tags, record_filter=wanted.record_filter,
        )  # fmt: skip

    def _timed_out(self, req: PullRequest, result: GetResult) -> GetResult:
        """ "Caught up" for a pull whose hold ended without a matching message (or a stop),
        without re-reading; min and max offsets are refreshed, which costs no read."""
        store, topic, qid = self.store, req.topic, req.queue_id
        return GetResult(
            GetStatus.OFFSET_OVERFLOW_ONE,
            result.next_offset,
            store.min_offset(topic, qid),
            max(store.max_offset(topic, qid), result.max_offset),
        )
