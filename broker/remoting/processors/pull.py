"""PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361): classic pull with long polling (RocketMQ
``PullMessageProcessor`` and ``PullRequestHoldService``).

A pull reads up to ``maxMsgNums`` stored records from the client's offset and sends them back
as they are stored. Read outcomes map to response codes exactly as RocketMQ's
``PullMessageProcessor`` does (reference §1.7); only ``PULL_NOT_FOUND`` ("caught up") is held.

Differences from RocketMQ, all deliberate:

* A held pull is woken the moment a matching message is dispatched to its queue
  (:class:`~broker.longpoll.PullHub`), not by a 5 s scan; at its deadline it is answered
  ``PULL_NOT_FOUND`` directly instead of re-running the whole pull (weak spots 4 and 5).
* A queue id outside the topic's read queues is ``INVALID_PARAMETER`` (RocketMQ answers
  ``SYSTEM_ERROR``, which our clients would retry): repeating the request cannot succeed.
* A ``SQL92`` (or any non-``TAG``) subscription is refused with ``SUBSCRIPTION_PARSE_FAILED``:
  this broker has no property filter, and delivering everything would hand an SQL92 consumer
  messages it never asked for (Java clients filter only tags on their side). RocketMQ with
  ``enablePropertyFilter = false`` refuses it too (with ``SYSTEM_ERROR``).
"""

from __future__ import annotations

from collections.abc import Mapping

import trio

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from broker.remoting.processors.offsets import commit_offset
from broker.store.api import GetResult, GetStatus
from protocol.bodies.heartbeat import EXPRESSION_TAG, SUB_ALL
from protocol.bodies.route import is_readable
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError
from protocol.headers.pull import PullMessageRequestHeader, PullMessageResponseHeader
from protocol.properties import java_string_hash

#: Messages one pull returns at most (RocketMQ ``maxTransferCountOnMessageInMemory``).
MAX_PULL_MESSAGES = 32
#: Bytes one pull returns at most unless the client asks for less (at least one message).
MAX_PULL_BYTES = 4 * 1024 * 1024
#: RocketMQ's tag separator in a subscription expression (``SubscriptionData``/``FilterAPI``).
TAG_SEPARATOR = "||"

#: ``GetMessageStatus`` → response code for the statuses whose code never depends on the
#: requested offset (``PullMessageProcessor``).
_FIXED_CODES: Mapping[GetStatus, int] = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


def response_code(status: GetStatus, requested_offset: int) -> int:
    """RocketMQ's pull status mapping: an unknown or empty queue is ``PULL_NOT_FOUND`` for a
    pull from 0 (a consumer waiting for a new queue's first message) and
    ``PULL_OFFSET_MOVED`` otherwise (the client's offset points at nothing that can exist)."""
    code = _FIXED_CODES.get(status)
    if code is not None:
        return code
    # NO_MATCHED_LOGIC_QUEUE, NO_MESSAGE_IN_QUEUE
    return ResponseCode.PULL_OFFSET_MOVED if requested_offset != 0 else ResponseCode.PULL_NOT_FOUND


def parse_tags(expression: str | None) -> frozenset[int] | None:
    """The tag-hash filter of a ``TAG`` expression, ``None`` for "every message".

    As Java's ``FilterAPI.buildSubscriptionData``: tags split on ``||`` and stripped; ``*``
    or an empty expression matches everything. An expression with no tag at all (``"||"``)
    also matches everything here, where Java would match nothing: no client means that.
    """
    if expression is None or expression.strip() in ("", SUB_ALL):
        return None
    tags = [tag.strip() for tag in expression.split(TAG_SEPARATOR)]
    codes = frozenset(java_string_hash(tag) for tag in tags if tag)
    return codes or None


def tag_filter(ctx: BrokerContext, header: PullMessageRequestHeader) -> frozenset[int] | None:
    """The filter of this pull: the request's own expression when it carries one
    (``SUBSCRIPTION`` flag, as every C++ and JavaScript pull does), else the one the group
    registered by heartbeat, else none (clients filter tags themselves too).

    Raises:
        BrokerError: ``SUBSCRIPTION_PARSE_FAILED`` for a non-``TAG`` expression type.
    """
    expression: str | None
    expression_type: str | None
    if header.has_subscription:
        expression, expression_type = header.subscription, header.expression_type
    else:
        group = ctx.consumers.groups.get(header.consumer_group)
        sub = group.subscriptions().get(header.topic) if group is not None else None
        if sub is None:
            return None
        expression, expression_type = sub.sub_string, sub.expression_type
    check_expression_type(expression_type)
    return parse_tags(expression)


def check_expression_type(expression_type: str | None) -> None:
    """Raise unless the subscription is a TAG expression (or has no type: TAG).

    Raises:
        BrokerError: ``SUBSCRIPTION_PARSE_FAILED``.
    """
    if (expression_type or EXPRESSION_TAG).upper() != EXPRESSION_TAG:
        raise BrokerError(
            f"The broker does not support consumer to filter message by {expression_type}",
            code=ResponseCode.SUBSCRIPTION_PARSE_FAILED,
        )


def check_readable(
    ctx: BrokerContext,
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

    Raises:
        BrokerError: ``TOPIC_NOT_EXIST``, ``NO_PERMISSION`` or ``INVALID_PARAMETER``.
    """
    config = ctx.topics.get(topic)
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


def read(
    ctx: BrokerContext, header: PullMessageRequestHeader, tags: frozenset[int] | None
) -> GetResult:
    """One read of the requested queue from the requested offset."""
    count = min(max(header.max_msg_nums, 1), MAX_PULL_MESSAGES)
    limit = header.max_msg_bytes
    max_bytes = min(limit, MAX_PULL_BYTES) if limit is not None and limit > 0 else MAX_PULL_BYTES
    return ctx.store.get(
        header.topic, header.queue_id, header.queue_offset, count,
        max_bytes=max_bytes, tags_codes=tags,
    )  # fmt: skip


def answer(cmd: RemotingCommand, result: GetResult, requested_offset: int) -> RemotingCommand:
    """The response to a pull for one read result (records sent exactly as stored)."""
    code = response_code(result.status, requested_offset)
    header = PullMessageResponseHeader(
        suggest_which_broker_id=0,
        next_begin_offset=result.next_offset,
        min_offset=result.min_offset,
        max_offset=result.max_offset,
    )
    body = result.body if code == ResponseCode.SUCCESS else b""
    remark = None if code == ResponseCode.SUCCESS else result.status.value
    return cmd.response(code, remark, header.to_ext(), body)


def timed_out(
    ctx: BrokerContext, cmd: RemotingCommand, header: PullMessageRequestHeader, result: GetResult
) -> RemotingCommand:
    """``PULL_NOT_FOUND`` for a pull whose hold ended without a matching message, without
    re-reading (weak spot 5); min and max offsets are refreshed, which costs no read."""
    store, topic, qid = ctx.store, header.topic, header.queue_id
    fresh = GetResult(
        GetStatus.OFFSET_OVERFLOW_ONE,
        result.next_offset,
        store.min_offset(topic, qid),
        max(store.max_offset(topic, qid), result.max_offset),
    )
    return answer(cmd, fresh, header.queue_offset)


def hold_seconds(ctx: BrokerContext, header: PullMessageRequestHeader) -> float:
    """How long this pull may be held: its own ``suspendTimeoutMillis``, capped by the
    broker's ``suspend_max_ms`` (RocketMQ ``brokerSuspendMaxTimeMillis``); 0 = do not hold."""
    if not header.has_suspend or ctx.shutting_down.is_set():
        return 0.0
    return max(0, min(header.suspend_timeout_millis, ctx.config.suspend_max_ms)) / 1000


# LITE_PULL_MESSAGE (361) carries the same header and is served by the same processor class in
# RocketMQ (its own thread pool there, which trio does not need).
async def pull_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Serve one pull: commit the piggy-backed offset, read, and hold a caught-up pull until a
    matching message arrives or its suspend timeout passes."""
    header = PullMessageRequestHeader.from_ext(cmd.ext_fields)
    check_readable(ctx, header.topic, header.queue_id, header.consumer_group)
    tags = tag_filter(ctx, header)
    if header.has_commit_offset:
        # C++ clients commit on every pull (sysFlag 7); negative commits are ignored.
        commit_offset(
            ctx, header.consumer_group, header.topic, header.queue_id, header.commit_offset
        )
    result = read(ctx, header, tags)
    code = response_code(result.status, header.queue_offset)
    hold = hold_seconds(ctx, header)
    if code != ResponseCode.PULL_NOT_FOUND or hold <= 0:
        return answer(cmd, result, header.queue_offset)
    # No lost wake-up: the read above and the registration inside PullHub.wait (it registers
    # before its first checkpoint) run in one synchronous step of this task, and the store
    # calls PullHub.arriving only on the trio thread (inside a put in ASYNC mode, in
    # flush_end in SYNC mode). So a message dispatched "between the read and the park"
    # cannot exist: it was either seen by the read or it will wake this waiter. Keep every
    # await out of the span from ``read`` to ``wait``.
    deadline = trio.current_time() + hold
    woken = await ctx.pull_hub.wait(header.topic, header.queue_id, tags, deadline)
    if not woken or ctx.shutting_down.is_set():
        # Deadline (or a graceful stop): answer at once, as RocketMQ's re-run would.
        return timed_out(ctx, cmd, header, result)
    # Woken by a matching message: read once more and answer whatever it finds (RocketMQ's
    # executeRequestWhenWakeup with brokerAllowSuspend = false: never held twice).
    return answer(cmd, read(ctx, header, tags), header.queue_offset)
