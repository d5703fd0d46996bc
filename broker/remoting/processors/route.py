"""GET_ROUTEINFO_BY_TOPIC (105): a broker started alone answers route queries itself.

Unknown topics answer ``TOPIC_NOT_EXIST`` like a name server does; producers then ask for
``TBW102`` and send with it as their default topic, and the send auto-creates the topic.
"""

from __future__ import annotations

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from protocol.bodies.route import BrokerData, QueueData, TopicRouteData
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.route import GetRouteInfoRequestHeader


def route_of(ctx: BrokerContext, topic: str) -> TopicRouteData | None:
    """This broker's route for ``topic``, or None if it does not hold it."""
    config = ctx.topics.get(topic)
    if config is None:
        return None
    name = ctx.config.broker_name
    return TopicRouteData(
        queue_datas=(
            QueueData(
                name,
                config.read_queue_nums,
                config.write_queue_nums,
                config.perm,
                config.topic_sys_flag,
            ),
        ),
        broker_datas=(BrokerData(ctx.config.cluster, name, {0: ctx.address}),),
    )


async def get_route(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Answer a route query for a topic this broker holds."""
    header = GetRouteInfoRequestHeader.from_ext(cmd.ext_fields)
    route = route_of(ctx, header.topic)
    if route is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST,
            f"No topic route info in name server for the topic: {header.topic}",
        )
    return cmd.response(body=route.to_json())
