"""Consumer offsets (QUERY_CONSUMER_OFFSET 14, UPDATE_CONSUMER_OFFSET 15) and queue offsets
(SEARCH_OFFSET_BY_TIMESTAMP 29, GET_MAX_OFFSET 30, GET_MIN_OFFSET 31,
GET_EARLIEST_MSG_STORETIME 32).

The never-committed rule (RocketMQ ``ConsumerManageProcessor.queryConsumerOffset``): a group
that never committed on a queue is answered ``offset 0`` while the queue still starts at 0, and
``QUERY_NOT_FOUND`` only once retention has removed message 0. The C++ consumer takes
``QUERY_NOT_FOUND`` as "start at the end" (it then asks GET_MAX_OFFSET), so answering it for a
queue that starts at 0 would make "produce first, then start the consumer" lose every message
produced before the consumer started.

Queue-offset queries on a queue that never held a message answer 0, like RocketMQ's
``getMaxOffsetInQueue`` / ``getMinOffsetInQueue`` for a missing consume queue.
"""

from __future__ import annotations

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError, RecordError
from protocol.headers.offsets import (
    BOUNDARY_UPPER,
    GetEarliestMsgStoretimeRequestHeader,
    GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader,
    GetMaxOffsetResponseHeader,
    GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    SearchOffsetRequestHeader,
    SearchOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
)
from protocol.message import peek_record
from protocol.naming import validate_group


def commit_offset(ctx: BrokerContext, group: str, topic: str, queue_id: int, offset: int) -> None:
    """Commit ``offset`` for the group's queue; a negative offset is ignored.

    The JavaScript client commits -1 for a queue it has no position in yet; that must not
    erase a real position (``ConsumerOffsets.commit`` ignores it as well).

    Raises:
        IllegalNameError: ``group`` is not a legal group name (it could not be persisted).
    """
    validate_group(group)
    if offset >= 0:
        ctx.store.offsets.commit(group, topic, queue_id, offset)


def check_queue(ctx: BrokerContext, topic: str, queue_id: int) -> None:
    """Raise unless ``topic`` exists here and ``queue_id`` is one of its queues.

    Raises:
        BrokerError: ``TOPIC_NOT_EXIST`` or ``INVALID_PARAMETER``.
    """
    config = ctx.topics.get(topic)
    if config is None:
        raise BrokerError(
            f"topic[{topic}] not exist, apply first please!", code=ResponseCode.TOPIC_NOT_EXIST
        )
    queues = max(config.read_queue_nums, config.write_queue_nums)
    if not 0 <= queue_id < queues:
        raise BrokerError(
            f"queueId[{queue_id}] is illegal, topic:[{topic}] has {queues} queues",
            code=ResponseCode.INVALID_PARAMETER,
        )


async def query_consumer_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The group's committed offset; for a group that never committed, 0 while the queue
    still starts at 0, else ``QUERY_NOT_FOUND`` (see the module docstring)."""
    header = QueryConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
    offset = ctx.store.offsets.query(header.consumer_group, header.topic, header.queue_id)
    if offset is None:
        if header.set_zero_if_not_found is False:
            # 5.x clients ask for this explicitly ("maybe this group boot first").
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND, "Not found, do not set to zero, maybe this group "
                "boot first",
            )  # fmt: skip
        if ctx.store.min_offset(header.topic, header.queue_id) > 0:
            return cmd.response(
                ResponseCode.QUERY_NOT_FOUND,
                "Not found, the group never committed and message 0 of the queue is gone",
            )
        offset = 0
    reply = QueryConsumerOffsetResponseHeader(offset=offset)
    return cmd.response(ext_fields=reply.to_ext())


async def update_consumer_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Commit the group's offset (RocketMQ clients send this with flag 0: it is answered)."""
    header = UpdateConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
    check_queue(ctx, header.topic, header.queue_id)
    commit_offset(ctx, header.consumer_group, header.topic, header.queue_id, header.commit_offset)
    return cmd.response()


async def get_max_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """One past the last message of the queue.

    ``committed`` is accepted and ignored: only dispatched messages have queue offsets here
    (in SYNC flush mode a message is dispatched once durable), so both readings agree.
    """
    header = GetMaxOffsetRequestHeader.from_ext(cmd.ext_fields)
    offset = ctx.store.max_offset(header.topic, header.queue_id)
    return cmd.response(ext_fields=GetMaxOffsetResponseHeader(offset=offset).to_ext())


async def get_min_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The first queue offset whose message is still stored."""
    header = GetMinOffsetRequestHeader.from_ext(cmd.ext_fields)
    offset = ctx.store.min_offset(header.topic, header.queue_id)
    return cmd.response(ext_fields=GetMinOffsetResponseHeader(offset=offset).to_ext())


def search_offset(ctx: BrokerContext, header: SearchOffsetRequestHeader) -> int:
    """The queue offset of the message stored at ``header.timestamp``.

    ``LOWER``: the first message stored at or after it (the max offset when none was).
    ``UPPER``: the last message stored exactly at it when there are such messages (several
    can share a millisecond), otherwise the same as ``LOWER``.
    """
    store, topic, qid, ts = ctx.store, header.topic, header.queue_id, header.timestamp
    lower = store.offset_by_time(topic, qid, ts)
    if header.boundary != BOUNDARY_UPPER:
        return lower
    after = store.offset_by_time(topic, qid, ts + 1)
    return after - 1 if after > lower else lower


async def search_offset_by_timestamp(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The queue offset of the first message stored at or after a time (mqadmin
    ``resetOffsetByTime``, consumers starting ``CONSUME_FROM_TIMESTAMP``)."""
    header = SearchOffsetRequestHeader.from_ext(cmd.ext_fields)
    offset = search_offset(ctx, header)
    return cmd.response(ext_fields=SearchOffsetResponseHeader(offset=offset).to_ext())


def earliest_store_time(ctx: BrokerContext, topic: str, queue_id: int) -> int:
    """Store time of the queue's first live message, -1 when there is none (as RocketMQ's
    ``getEarliestMessageTime``)."""
    first = ctx.store.min_offset(topic, queue_id)
    result = ctx.store.get(topic, queue_id, first, 1)
    if not result.body:
        return -1
    try:
        return peek_record(result.body).store_timestamp
    except RecordError:
        return -1


async def get_earliest_msg_storetime(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Store time of the first message still held in the queue (-1 when empty)."""
    header = GetEarliestMsgStoretimeRequestHeader.from_ext(cmd.ext_fields)
    timestamp = earliest_store_time(ctx, header.topic, header.queue_id)
    reply = GetEarliestMsgStoretimeResponseHeader(timestamp=timestamp)
    return cmd.response(ext_fields=reply.to_ext())
