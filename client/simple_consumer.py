"""``SimpleConsumer``: receive, ack and change invisibility yourself (RocketMQ 5's model).

``receive`` pops from the subscribed topics over pop long polling. With several brokers it
first sweeps every (topic, broker) pair without waiting, and long-polls one pair (round-robin)
only if the sweep found nothing — so messages on one broker never wait for another broker's
empty long poll, and no popped message is ever dropped client-side (dropping one would hide
it until its invisible time ran out). The long-poll part waits at most ``await_duration``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType

import anyio
import structlog

from client.config import ClientConfig
from client.errors import ClientClosedError, ClientError, NoRouteError, single_error
from client.filters import FilterExpression, as_filter, as_filters, verify_filter
from client.instance import ClientInstance, open_instance
from client.message import ReceivedMessage
from client.pop import PopSession, brokers_of
from protocol.bodies.heartbeat import (
    ConsumeFromWhere,
    ConsumerData,
    ConsumeType,
    MessageModel,
    SubscriptionData,
)
from protocol.errors import BrokerError
from protocol.naming import validate_group, validate_topic
from protocol.receipt import MAX_POP_MESSAGES

_EMPTY_SWEEP_PAUSE = 0.05
_log = structlog.get_logger("trimq.client")


def consume_from_first(consume_from: str) -> bool:
    """``"first"`` → True, ``"last"`` → False."""
    return consume_from == "first"


def subscription_data(topic: str, expression: str | FilterExpression) -> SubscriptionData:
    """A subscription as heartbeats announce it (a ``str`` is a TAG expression:
    ``tagA || tagB`` or ``*``)."""
    return as_filter(expression).subscription_data(topic)


async def verify_filters(
    instance: ClientInstance, group: str, subscription: Mapping[str, FilterExpression]
) -> None:
    """Ask the brokers of every SQL92 topic whether they accept its filter; a topic with no
    route yet is skipped (its first pop or pull reports a refusal).

    Raises:
        SubscriptionRefusedError: a broker refused a filter.
    """
    for topic, expression in sorted(subscription.items()):
        try:
            await verify_filter(instance, group, topic, expression)
        except NoRouteError:
            continue


class SimpleConsumer:
    """Receive and acknowledge messages explicitly (``async with SimpleConsumer(...)``).

    Args:
        config: connection settings.
        group: the consumer group.
        subscription: topic → filter: a tag expression (``"*"`` for all, ``"a || b"``) or a
            :class:`~client.filters.FilterExpression` (``FilterExpression.sql("n > 5")``).
        await_duration: seconds ``receive`` long-polls when nothing is ready.
        consume_from: where a group new to a queue starts: ``"last"`` (only messages sent
            from now on, RocketMQ's default) or ``"first"`` (everything still stored).

    Raises:
        ValueError: a bad argument, or an SQL92 expression that does not parse (checked
            here, before anything is sent).
        SubscriptionRefusedError: from ``async with``, ``subscribe`` or ``receive``: a broker
            refused a filter (SQL92 on a broker with property filtering off).
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        group: str,
        subscription: Mapping[str, str | FilterExpression] | None = None,
        await_duration: float = 20.0,
        consume_from: str = "last",
    ) -> None:
        validate_group(group)
        if consume_from not in ("last", "first"):
            raise ValueError(f"consume_from must be 'last' or 'first', not {consume_from!r}")
        self.consume_from = consume_from
        for topic in subscription or {}:
            validate_topic(topic)
        self.config = config or ClientConfig()
        self.group = group
        self.subscription: dict[str, FilterExpression] = as_filters(subscription)
        self.await_duration = await_duration
        self._instance: ClientInstance | None = None
        self._stack: AsyncExitStack | None = None
        self._session: PopSession | None = None
        self._turn = 0

    async def __aenter__(self) -> SimpleConsumer:
        # What starting raised, not the instance task group's wrapping of it.
        with single_error():
            async with AsyncExitStack() as stack:  # unwinds if starting fails
                instance, _ = await stack.enter_async_context(open_instance(self.config))
                instance.consumer_data = self._consumer_data
                await instance.prefetch_routes(self.subscription)  # receive retries missing ones
                # Before registering: a refused filter must fail here, not as empty receives.
                await verify_filters(instance, self.group, self.subscription)
                await instance.heartbeat()
                self._instance, self._stack = instance, stack.pop_all()
        self._session = PopSession(
            instance, self.group, from_first=consume_from_first(self.consume_from)
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        instance, stack = self._instance, self._stack
        self._instance = self._stack = self._session = None
        if instance is None or stack is None:
            return
        await instance.unregister(consumer_group=self.group)
        await stack.__aexit__(exc_type, exc, tb)

    def _consumer_data(self) -> list[ConsumerData]:
        return [
            ConsumerData(
                group_name=self.group,
                consume_type=ConsumeType.CONSUME_POP,
                message_model=MessageModel.CLUSTERING,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                subscription_data_set=tuple(
                    subscription_data(t, e) for t, e in sorted(self.subscription.items())
                ),
            )
        ]

    @property
    def session(self) -> PopSession:
        """The pop session.

        Raises:
            ClientClosedError: outside ``async with``.
        """
        if self._session is None:
            raise ClientClosedError("the consumer is not running: use 'async with'")
        return self._session

    async def subscribe(self, topic: str, expression: str | FilterExpression = "*") -> None:
        """Add (or change) a subscription (a ``str`` is a TAG expression); the topic's route
        is fetched and an SQL92 filter is checked with its brokers now.

        Raises:
            ValueError: an SQL92 expression that does not parse (before any request).
            NoRouteError: the topic does not exist.
            SubscriptionRefusedError: a broker refused the filter (SQL92 with property
                filtering off, say).
        """
        validate_topic(topic)
        wanted = as_filter(expression)
        instance = self.session.instance
        await instance.route(topic)
        await verify_filter(instance, self.group, topic, wanted)
        self.subscription[topic] = wanted

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving from ``topic``."""
        self.subscription.pop(topic, None)

    async def receive(
        self,
        max_messages: int = 16,
        invisible_duration: float = 60.0,
        await_duration: float | None = None,
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages, invisible to others for ``invisible_duration``
        seconds unless acked; waits up to ``await_duration`` (default: the consumer's) when
        none is ready, then returns an empty list.

        Raises:
            ValueError: no subscription, or an argument out of range (1..32 messages).
            SubscriptionRefusedError: a broker refused a subscription's filter.
        """
        if not self.subscription:
            raise ValueError("subscribe to a topic before receiving")
        if not 1 <= max_messages <= MAX_POP_MESSAGES:
            raise ValueError(f"max_messages must be 1..{MAX_POP_MESSAGES}")
        wait = self.await_duration if await_duration is None else await_duration
        invisible_ms = max(1, int(invisible_duration * 1000))
        pairs = await self._pairs()
        if not pairs:
            raise NoRouteError(f"no readable queue for {sorted(self.subscription)}")
        self._turn += 1
        start = self._turn % len(pairs)
        ordered = pairs[start:] + pairs[:start]
        for topic, broker in ordered:  # the sweep: no waiting
            got = await self._pop(topic, broker, max_messages, invisible_ms, 0)
            if got:
                return got
        if wait <= 0:
            return []
        topic, broker = ordered[0]
        return await self._pop(topic, broker, max_messages, invisible_ms, int(wait * 1000))

    async def _pairs(self) -> list[tuple[str, str]]:
        pairs = []
        for topic in sorted(self.subscription):
            try:
                route = await self.session.instance.route(topic)
            except NoRouteError:
                continue
            pairs += [(topic, broker) for broker in brokers_of(route.read_queues)]
        return pairs

    async def _pop(
        self, topic: str, broker: str, max_messages: int, invisible_ms: int, poll_ms: int
    ) -> list[ReceivedMessage]:
        try:
            return await self.session.pop(
                broker, topic, max_messages=max_messages, invisible_ms=invisible_ms,
                poll_ms=poll_ms, expression=self.subscription.get(topic, FilterExpression()),
            )  # fmt: skip
        except (ClientError, BrokerError) as exc:
            if not getattr(exc, "retriable", False):
                raise
            await anyio.sleep(_EMPTY_SWEEP_PAUSE)  # a broker down: let the others answer
            return []

    async def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge a received message: it will not be delivered again.

        Raises:
            BrokerError: the receipt is stale (redelivered already, or acked) or invalid.
        """
        await self.session.ack(message)

    async def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """Acknowledge many messages in one request per broker (BATCH_ACK_MESSAGE): the fast
        way to ack what one ``receive`` returned. A stale receipt among them is skipped by
        the broker instead of failing the others."""
        if messages:
            await self.session.ack_many(messages)

    async def change_invisible_duration(
        self, message: ReceivedMessage, invisible_duration: float
    ) -> ReceivedMessage:
        """Keep ``message`` invisible for ``invisible_duration`` more seconds; returns it with
        its new receipt (ack with that one)."""
        return await self.session.change_invisible(message, max(1, int(invisible_duration * 1000)))
