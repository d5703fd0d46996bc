"""Read checks and message filters shared by pull and pop (RocketMQ's checks and codes).

A consumer names a topic, a queue (or any queue, for pops) and a subscription expression;
these rules decide whether it may read and which tag hashes it wants, whatever the front end.
"""

from __future__ import annotations

from broker.topics import TopicManager, is_readable
from protocol.codes import ResponseCode
from protocol.errors import BrokerError
from protocol.filters import EXPRESSION_TAG, tag_codes


def check_expression_type(expression_type: str | None) -> None:
    """Raise unless the subscription is a TAG expression (or has no type: TAG).

    This broker has no property (SQL92) filter, and delivering everything would hand an SQL92
    consumer messages it never asked for; RocketMQ with ``enablePropertyFilter = false``
    refuses it too.

    Raises:
        BrokerError: ``SUBSCRIPTION_PARSE_FAILED``.
    """
    if (expression_type or EXPRESSION_TAG).upper() != EXPRESSION_TAG:
        raise BrokerError(
            f"The broker does not support consumer to filter message by {expression_type}",
            code=ResponseCode.SUBSCRIPTION_PARSE_FAILED,
        )


def tag_filter(expression: str | None, expression_type: str | None) -> frozenset[int] | None:
    """The tag-hash filter of a subscription, ``None`` for "every message".

    Raises:
        BrokerError: ``SUBSCRIPTION_PARSE_FAILED`` for a non-``TAG`` expression type.
    """
    check_expression_type(expression_type)
    return tag_codes(expression)


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
