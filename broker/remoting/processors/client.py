"""Client bookkeeping: HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38),
the Remoting adapter over :class:`broker.core.clients.ClientRegistry` (the connection's
:class:`~broker.remoting.channel.RemotingChannel` is how the registry reaches the client).
"""

from __future__ import annotations

from broker.core.clients import ConsumerRegistration, ConsumeType, MessageModel, Subscription
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.bodies.consumer import GetConsumerListByGroupResponseBody
from protocol.bodies.heartbeat import ConsumerData, HeartbeatData
from protocol.command import RemotingCommand
from protocol.headers.client import (
    GetConsumerListByGroupRequestHeader,
    UnregisterClientRequestHeader,
)


def registration(data: ConsumerData) -> ConsumerRegistration:
    """The core's view of one consumer group in a heartbeat."""
    return ConsumerRegistration(
        group=data.group_name,
        subscriptions=tuple(
            Subscription(sub.topic, sub.sub_string, sub.expression_type)
            for sub in data.subscription_data_set
        ),
        message_model=MessageModel[data.message_model.name],
        consume_type=ConsumeType[data.consume_type.name],
    )


async def heartbeat(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Register the client's producer and consumer groups on this connection."""
    data = HeartbeatData.from_json(cmd.body)
    ctx.broker.clients.heartbeat(
        ctx.channel(conn),
        data.client_id,
        [producer.group_name for producer in data.producer_data_set],
        [registration(consumer) for consumer in data.consumer_data_set],
    )
    return cmd.response()


async def unregister(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """The client leaves the groups it names (an empty group name means none)."""
    header = UnregisterClientRequestHeader.from_ext(cmd.ext_fields)
    ctx.broker.clients.unregister(
        header.client_id, header.producer_group or None, header.consumer_group or None
    )
    return cmd.response()


async def consumer_list(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The client ids of a consumer group, for client-side rebalance."""
    header = GetConsumerListByGroupRequestHeader.from_ext(cmd.ext_fields)
    ids = ctx.broker.clients.client_ids(header.consumer_group)
    return cmd.response(body=GetConsumerListByGroupResponseBody(tuple(ids)).to_json())
