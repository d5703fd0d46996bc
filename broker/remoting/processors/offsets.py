"""Consumer offsets (QUERY_CONSUMER_OFFSET 14, UPDATE_CONSUMER_OFFSET 15) and queue offsets
(SEARCH_OFFSET_BY_TIMESTAMP 29, GET_MAX_OFFSET 30, GET_MIN_OFFSET 31,
GET_EARLIEST_MSG_STORETIME 32): the Remoting adapter over
:class:`broker.core.offsets.OffsetService` (the never-committed rule lives there).
"""

from __future__ import annotations

from broker.core.offsets import Boundary
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.command import RemotingCommand
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


async def query_consumer_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The group's committed offset (``QUERY_NOT_FOUND`` per the never-committed rule)."""
    header = QueryConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
    offset = ctx.broker.offsets.committed(
        header.consumer_group,
        header.topic,
        header.queue_id,
        # 5.x clients ask for False explicitly ("maybe this group boot first").
        zero_if_never=header.set_zero_if_not_found is not False,
    )
    return cmd.response(ext_fields=QueryConsumerOffsetResponseHeader(offset=offset).to_ext())


async def update_consumer_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Commit the group's offset (RocketMQ clients send this with flag 0: it is answered)."""
    header = UpdateConsumerOffsetRequestHeader.from_ext(cmd.ext_fields)
    ctx.broker.offsets.commit(
        header.consumer_group, header.topic, header.queue_id, header.commit_offset
    )
    return cmd.response()


async def get_max_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """One past the last message of the queue (``committed`` is accepted and ignored: only
    dispatched messages have queue offsets here, so both readings agree)."""
    header = GetMaxOffsetRequestHeader.from_ext(cmd.ext_fields)
    offset = ctx.broker.offsets.max_offset(header.topic, header.queue_id)
    return cmd.response(ext_fields=GetMaxOffsetResponseHeader(offset=offset).to_ext())


async def get_min_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The first queue offset whose message is still stored."""
    header = GetMinOffsetRequestHeader.from_ext(cmd.ext_fields)
    offset = ctx.broker.offsets.min_offset(header.topic, header.queue_id)
    return cmd.response(ext_fields=GetMinOffsetResponseHeader(offset=offset).to_ext())


async def search_offset_by_timestamp(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The queue offset of the message stored at a time (mqadmin ``resetOffsetByTime``,
    consumers starting ``CONSUME_FROM_TIMESTAMP``)."""
    header = SearchOffsetRequestHeader.from_ext(cmd.ext_fields)
    boundary = Boundary.UPPER if header.boundary == BOUNDARY_UPPER else Boundary.LOWER
    offset = ctx.broker.offsets.search(header.topic, header.queue_id, header.timestamp, boundary)
    return cmd.response(ext_fields=SearchOffsetResponseHeader(offset=offset).to_ext())


async def get_earliest_msg_storetime(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Store time of the first message still held in the queue (-1 when empty)."""
    header = GetEarliestMsgStoretimeRequestHeader.from_ext(cmd.ext_fields)
    timestamp = ctx.broker.offsets.earliest_store_time(header.topic, header.queue_id)
    reply = GetEarliestMsgStoretimeResponseHeader(timestamp=timestamp)
    return cmd.response(ext_fields=reply.to_ext())
