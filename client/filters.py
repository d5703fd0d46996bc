"""Subscription filters: which messages of a topic a consumer wants (RocketMQ's Java
``MessageSelector.byTag`` / ``bySql``, the 5.x clients' ``FilterExpression``).

A subscription maps a topic to a :class:`FilterExpression` of one of two types:

* ``TAG`` — ``*`` for every message or tags joined by ``||`` (``"paid || refunded"``). A
  plain ``str`` in a subscription is a TAG expression, so existing code keeps working.
* ``SQL92`` — a boolean expression over the message's properties
  (``"color = 'red' AND n > 5"``; the tag is the property ``TAGS``), evaluated by the broker
  as :mod:`protocol.sql92` describes. A message matches only when the expression is TRUE;
  a property it does not have is NULL, so ``n > 5`` skips messages without ``n``.

SQL92 expressions are parsed when the :class:`FilterExpression` is made, with the broker's
own parser, so a typo raises ``ValueError`` (with the position) in the constructor or
``subscribe`` call instead of turning into a consumer that never receives anything.

Whether a broker *serves* SQL92 is its choice (``--enable-property-filter``): the consumers
ask each broker of an SQL92 topic before they use it (:func:`verify_filter`) and raise
:class:`~client.errors.SubscriptionRefusedError` when one refuses.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from client.errors import ClientError, SubscriptionRefusedError
from client.instance import ClientInstance
from protocol.bodies.heartbeat import SubscriptionData
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.filters import EXPRESSION_TAG, SUB_ALL, split_tags
from protocol.headers.pull import PullMessageRequestHeader, build_pull_sys_flag
from protocol.sql92 import SelectorError, parse

__all__ = [
    "FilterExpression",
    "FilterType",
    "as_filter",
    "as_filters",
    "raise_if_refused",
    "verify_filter",
]

#: Java's ``Long.MAX_VALUE``: the probe pull's offset, past the end of any queue, so the
#: broker answers at once without reading (or holding) anything.
_PROBE_OFFSET: Final = 2**63 - 1


class FilterType(enum.Enum):
    """RocketMQ's ``ExpressionType``; the value is what travels on the wire."""

    TAG = EXPRESSION_TAG
    SQL92 = "SQL92"


@dataclass(frozen=True, slots=True)
class FilterExpression:
    """A subscription's filter: ``FilterExpression.tag("a || b")`` or
    ``FilterExpression.sql("color = 'red' AND n > 5")``.

    Attributes:
        expression: the expression text (``*`` for every message).
        type: :attr:`FilterType.TAG` (default) or :attr:`FilterType.SQL92`.

    Raises:
        ValueError: an SQL92 expression that does not parse (the message says where; the
            :class:`~protocol.sql92.SelectorError` is chained as the cause).
        TypeError: ``expression`` is not a string or ``type`` not a :class:`FilterType`.
    """

    expression: str = SUB_ALL
    type: FilterType = FilterType.TAG

    def __post_init__(self) -> None:
        # Types checked at run time too: a subscription mapping is often built from config.
        if not isinstance(self.expression, str):
            raise TypeError(f"a filter expression is a str, not {type(self.expression).__name__}")
        if not isinstance(self.type, FilterType):
            raise TypeError(f"a filter type is a FilterType, not {self.type!r}")
        if self.type is FilterType.SQL92:
            try:
                parse(self.expression)
            except SelectorError as exc:
                raise ValueError(f"invalid SQL92 filter expression: {exc}") from exc

    @classmethod
    def tag(cls, expression: str = SUB_ALL) -> FilterExpression:
        """A TAG filter: ``*`` or tags joined by ``||``."""
        return cls(expression, FilterType.TAG)

    @classmethod
    def sql(cls, expression: str) -> FilterExpression:
        """An SQL92 filter over message properties, checked now.

        Raises:
            ValueError: the expression does not parse.
        """
        return cls(expression, FilterType.SQL92)

    @property
    def is_sql(self) -> bool:
        """Whether this is an SQL92 filter."""
        return self.type is FilterType.SQL92

    @property
    def wire_expression(self) -> str:
        """The text requests carry: an empty TAG expression means every message (``*``)."""
        if self.type is FilterType.TAG:
            return self.expression or SUB_ALL
        return self.expression

    def matches_tag(self, tag: str | None) -> bool:
        """The client-side re-check of a pulled message (the broker filters tags by hash,
        which can collide). SQL92 was evaluated exactly by the broker: always True, as the
        Java client only re-checks tag sets."""
        if self.type is FilterType.SQL92:
            return True
        tags = split_tags(self.expression)
        return tags is None or (tag is not None and tag in tags)

    def subscription_data(self, topic: str) -> SubscriptionData:
        """The subscription as heartbeats announce it (Java's ``FilterAPI.build``: tags are
        listed for TAG only; SQL92 sends the expression and its type)."""
        if self.type is FilterType.SQL92:
            return SubscriptionData(
                topic=topic, sub_string=self.expression, expression_type=self.type.value
            )
        tags = split_tags(self.expression) or ()
        return SubscriptionData(topic=topic, sub_string=self.wire_expression, tags_set=tags)


def as_filter(value: str | FilterExpression) -> FilterExpression:
    """A subscription value as a filter: a ``str`` is a TAG expression.

    Raises:
        TypeError: neither a ``str`` nor a :class:`FilterExpression`.
    """
    if isinstance(value, FilterExpression):
        return value
    if isinstance(value, str):
        return FilterExpression.tag(value)
    raise TypeError(f"a subscription is a str or FilterExpression, not {type(value).__name__}")


def as_filters(
    subscription: Mapping[str, str | FilterExpression] | None,
) -> dict[str, FilterExpression]:
    """A subscription mapping with every value as a :class:`FilterExpression`."""
    return {topic: as_filter(value) for topic, value in (subscription or {}).items()}


def raise_if_refused(
    reply: RemotingCommand, topic: str, broker: str, expression: FilterExpression
) -> None:
    """Turn a ``SUBSCRIPTION_PARSE_FAILED`` answer into a
    :class:`~client.errors.SubscriptionRefusedError` naming the subscription.

    Raises:
        SubscriptionRefusedError: the broker refused the filter.
    """
    if reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED:
        raise SubscriptionRefusedError(
            topic=topic, broker=broker, expression=expression.expression,
            expression_type=expression.type.value, remark=reply.remark or "no reason given",
        )  # fmt: skip


async def verify_filter(
    instance: ClientInstance, group: str, topic: str, expression: FilterExpression
) -> None:
    """Ask every broker serving ``topic`` whether it accepts ``expression`` (SQL92 only:
    every broker serves TAG).

    Java's consumers ask at start with CHECK_CLIENT_CONFIG (``checkClientInBroker``); trimq
    brokers do not serve that request, so the question is a PULL_MESSAGE carrying the
    subscription at an offset past the end of the queue: the broker parses the filter before
    it reads, and for an offset that far reads nothing, holds nothing and (no commit flag)
    commits nothing. Any other answer, or a broker that cannot be reached now, is not a
    refusal: the consumer's own requests will report those.

    Raises:
        SubscriptionRefusedError: a broker refused the filter.
        NoRouteError: no route for ``topic``.
    """
    if not expression.is_sql:
        return
    route = await instance.route(topic)
    first_queue: dict[str, int] = {}
    for mq in route.read_queues:
        first_queue.setdefault(mq.broker_name, mq.queue_id)
    for broker, queue_id in first_queue.items():
        address = instance.broker_address(broker)
        if address is None:
            continue
        header = PullMessageRequestHeader(
            consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=_PROBE_OFFSET,
            max_msg_nums=1,
            sys_flag=build_pull_sys_flag(commit_offset=False, suspend=False, subscription=True),
            commit_offset=0, suspend_timeout_millis=0, subscription=expression.wire_expression,
            sub_version=int(time.time() * 1000), expression_type=expression.type.value,
        )  # fmt: skip
        cmd = instance.request(RequestCode.PULL_MESSAGE, header.to_ext())
        try:
            reply = await instance.remoting.invoke(address, cmd)
        except ClientError:
            continue
        raise_if_refused(reply, topic, broker, expression)
