"""Read checks and message filters shared by pull and pop (RocketMQ's checks and codes).

A consumer names a topic, a queue (or any queue, for pops) and a subscription expression;
these rules decide whether it may read and which messages it wants (tag hashes, or an SQL92
selector over the properties), whatever the front end.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from broker.store.api import RecordFilter
from broker.topics import TopicManager, is_readable
from protocol.codes import ResponseCode
from protocol.errors import BrokerError, RecordError
from protocol.filters import EXPRESSION_TAG, tag_codes
from protocol.message import decode_record
from protocol.sql92 import Selector, SelectorError, compile_selector

#: ``ExpressionType.SQL92``.
EXPRESSION_SQL92 = "SQL92"
#: Compiled selectors kept (one per distinct expression: subscriptions repeat theirs).
_SELECTOR_CACHE = 1024


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """A subscription's filter as reads apply it: tag hashes (consume-queue entries carry
    them, so no record is read) or an SQL92 selector over the properties (each candidate
    record is read and its properties decoded)."""

    #: Tag hashes wanted; None: every tag.
    tags: frozenset[int] | None = None
    selector: Selector | None = None

    @property
    def property_match(self) -> Callable[[Mapping[str, str]], bool] | None:
        """The check of an arriving message's properties (long-poll wake-ups), if any."""
        return None if self.selector is None else self.selector.matches

    @property
    def record_filter(self) -> RecordFilter | None:
        """The store's per-record check, None when the tags say everything."""
        selector = self.selector
        if selector is None:
            return None

        def passes(data: bytes) -> bool:
            try:
                properties = decode_record(data)[0].properties
            except RecordError:
                return False
            return selector.matches(properties)

        return passes


#: Every message.
EVERYTHING = MessageFilter()


def message_filter(
    expression: str | None, expression_type: str | None, *, property_filter: bool = True
) -> MessageFilter:
    """The filter of a subscription: a ``TAG`` expression (the default type) or, when the
    broker has property filtering on, an ``SQL92`` one.

    Raises:
        BrokerError: ``SUBSCRIPTION_PARSE_FAILED`` for another type, SQL92 with property
            filtering off (RocketMQ's ``enablePropertyFilter = false``: delivering everything
            would hand the consumer messages it never asked for), or an SQL92 expression
            that does not parse (the remark says where).
    """
    kind = (expression_type or EXPRESSION_TAG).upper()
    if kind == EXPRESSION_TAG:
        return MessageFilter(tags=tag_codes(expression))
    if kind != EXPRESSION_SQL92 or not property_filter:
        raise BrokerError(
            f"The broker does not support consumer to filter message by {expression_type}",
            code=ResponseCode.SUBSCRIPTION_PARSE_FAILED,
        )
    try:
        return MessageFilter(selector=_compiled(expression or ""))
    except SelectorError as exc:
        raise BrokerError(
            f"bad SQL92 expression: {exc}", code=ResponseCode.SUBSCRIPTION_PARSE_FAILED
        ) from None


@functools.lru_cache(maxsize=_SELECTOR_CACHE)
def _compiled(expression: str) -> Selector:
    return compile_selector(expression)


def check_readable(
    topics: TopicManager,
    topic: str,
    queue_id: int,
    group: str,
    *,
    verb: str = "pulling",
    any_queue: bool = False,
) -> None:
    """Raise unless the topic exists, may be read and has the requested queue (with
    ``any_queue``, a negative queue id means "any" and passes). ``verb`` is RocketMQ's word
    in the permission remark ("pulling", "peeking" for pops).

    A queue id outside the read queues is ``INVALID_PARAMETER`` (RocketMQ answers
    ``SYSTEM_ERROR``, which clients would retry): repeating the request cannot succeed.

    Raises:
        BrokerError: ``TOPIC_NOT_EXIST``, ``NO_PERMISSION`` or ``INVALID_PARAMETER``.
    """
    config = topics.get(topic)
    if config is None:
        raise BrokerError(
            f"topic[{topic}] not exist, apply first please!",
            code=ResponseCode.TOPIC_NOT_EXIST,
        )
    if not is_readable(config.perm):
        raise BrokerError(
            f"the topic[{topic}] {verb} message is forbidden",
            code=ResponseCode.NO_PERMISSION,
        )
    if queue_id >= config.read_queue_nums or (queue_id < 0 and not any_queue):
        raise BrokerError(
            f"queueId[{queue_id}] is illegal, topic:[{topic}] "
            f"topicConfig.readQueueNums:[{config.read_queue_nums}] "
            f"consumer:[{group}]",
            code=ResponseCode.INVALID_PARAMETER,
        )
