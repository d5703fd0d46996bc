"""Message lookup: VIEW_MESSAGE_BY_ID (33) and QUERY_MESSAGE (12) (RocketMQ
``QueryMessageProcessor``; mqadmin ``queryMsgById`` / ``queryMsgByKey`` /
``queryMsgByUniqueKey``).

Both answer with stored records as they are, back to back, like a pull. A lookup that finds
nothing is ``QUERY_NOT_FOUND``. (RocketMQ answers a view of a bad offset with
``SYSTEM_ERROR``; Java clients treat both codes alike — an exception carrying the remark —
and ``QUERY_NOT_FOUND`` tells our clients not to retry.)
"""

from __future__ import annotations

import time

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.admin import (
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
)

#: Set to "true" by a client whose key is a unique key (``MixAll.UNIQUE_MSG_QUERY_FLAG``).
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
#: Results of a unique-key query (RocketMQ ``defaultQueryMaxNum``): the client's maxNum is
#: replaced, since one unique key may match a few redelivered copies.
DEFAULT_QUERY_MAX_NUM = 32
#: Results of any query at most (RocketMQ ``maxMsgsNumBatch``).
MAX_QUERY_NUM = 64


async def view_message_by_id(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The record at a commit-log offset (the offset part of an offset message id)."""
    header = ViewMessageRequestHeader.from_ext(cmd.ext_fields)
    record = ctx.store.message_at(header.offset) if header.offset >= 0 else None
    if record is None:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND,
            f"can not find message by the offset, {header.offset}",
        )
    return cmd.response(body=record)


def query_limit(cmd: RemotingCommand, header: QueryMessageRequestHeader) -> int:
    """How many records a query may return."""
    if cmd.ext_fields.get(UNIQUE_MSG_QUERY_FLAG) == "true":
        return DEFAULT_QUERY_MAX_NUM
    return min(max(header.max_num, 1), MAX_QUERY_NUM)


async def query_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Records of a topic whose ``KEYS`` or ``UNIQ_KEY`` hold the key, stored within the
    time window, newest first.

    The index gets its rows at dispatch, so it is current as of now: the response header
    says so with the dispatched commit-log position and the current time.
    """
    header = QueryMessageRequestHeader.from_ext(cmd.ext_fields)
    records = ctx.store.messages_by_key(
        header.topic,
        header.key,
        query_limit(cmd, header),
        header.begin_timestamp,
        header.end_timestamp,
    )
    reply = QueryMessageResponseHeader(
        index_last_update_timestamp=time.time_ns() // 1_000_000,
        index_last_update_phyoffset=ctx.store.dispatched_offset,
    )
    if not records:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND,
            "can not find message, maybe time range not correct",
            reply.to_ext(),
        )
    return cmd.response(ext_fields=reply.to_ext(), body=b"".join(records))
