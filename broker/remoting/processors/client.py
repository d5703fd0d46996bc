"""Client bookkeeping: HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38).

A consumer group's heartbeat creates its classic retry topic ``%RETRY%group`` (one queue), as
RocketMQ does, so that ali-ons finds the retry route when its consumer starts.
"""

from __future__ import annotations

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from protocol.bodies.consumer import GetConsumerListByGroupResponseBody
from protocol.bodies.heartbeat import HeartbeatData, MessageModel
from protocol.command import RemotingCommand
from protocol.headers.client import (
    GetConsumerListByGroupRequestHeader,
    UnregisterClientRequestHeader,
)
from protocol.naming import retry_topic, validate_group


async def heartbeat(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Register the client's producer and consumer groups on this connection."""
    data = HeartbeatData.from_json(cmd.body)
    for consumer in data.consumer_data_set:
        validate_group(consumer.group_name)
    ctx.consumers.heartbeat(conn, data)
    for consumer in data.consumer_data_set:
        if consumer.message_model is MessageModel.CLUSTERING:
            ctx.topics.ensure(retry_topic(consumer.group_name), 1)
    return cmd.response()


async def unregister(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """The client leaves the groups it names (an empty group name means none)."""
    header = UnregisterClientRequestHeader.from_ext(cmd.ext_fields)
    ctx.consumers.unregister(
        header.client_id, header.producer_group or None, header.consumer_group or None
    )
    return cmd.response()


async def consumer_list(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The client ids of a consumer group, for client-side rebalance."""
    header = GetConsumerListByGroupRequestHeader.from_ext(cmd.ext_fields)
    ids = ctx.consumers.client_ids(header.consumer_group)
    return cmd.response(body=GetConsumerListByGroupResponseBody(tuple(ids)).to_json())
