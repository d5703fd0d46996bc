"""Message lookup: VIEW_MESSAGE_BY_ID (33) and QUERY_MESSAGE (12) (RocketMQ
``QueryMessageProcessor``; mqadmin ``queryMsgById`` / ``queryMsgByKey`` /
``queryMsgByUniqueKey``), the Remoting adapter over :class:`broker.core.admin.AdminService`.

Both answer with stored records as they are, back to back, like a pull. A lookup that finds
nothing is ``QUERY_NOT_FOUND``.
"""

from __future__ import annotations

from broker.core.admin import MessageQuery
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.admin import (
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
)

#: Set to "true" by a client whose key is a unique key (``MixAll.UNIQUE_MSG_QUERY_FLAG``).
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"


async def view_message_by_id(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The record at a commit-log offset (the offset part of an offset message id)."""
    header = ViewMessageRequestHeader.from_ext(cmd.ext_fields)
    return cmd.response(body=ctx.broker.admin.view_message(header.offset))


async def query_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Records of a topic whose ``KEYS`` or ``UNIQ_KEY`` hold the key, stored within the
    time window, newest first; the response header says how current the index was."""
    header = QueryMessageRequestHeader.from_ext(cmd.ext_fields)
    found = ctx.broker.admin.query_messages(
        MessageQuery(
            topic=header.topic,
            key=header.key,
            max_num=header.max_num,
            begin_timestamp=header.begin_timestamp,
            end_timestamp=header.end_timestamp,
            unique=cmd.ext_fields.get(UNIQUE_MSG_QUERY_FLAG) == "true",
        )
    )
    reply = QueryMessageResponseHeader(
        index_last_update_timestamp=found.index_last_update_timestamp,
        index_last_update_phyoffset=found.index_last_update_phyoffset,
    )
    if not found.records:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND,
            "can not find message, maybe time range not correct",
            reply.to_ext(),
        )
    return cmd.response(ext_fields=reply.to_ext(), body=b"".join(found.records))
