"""GET_ROUTEINFO_BY_TOPIC (105): a broker started alone answers route queries itself, as the
Remoting adapter over :class:`broker.core.routes.RouteService`.

Unknown topics answer ``TOPIC_NOT_EXIST`` like a name server does; producers then ask for
``TBW102`` and send with it as their default topic, and the send auto-creates the topic.
"""

from __future__ import annotations

from broker.core.routes import RouteView
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.bodies.route import BrokerData, QueueData, TopicRouteData
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.route import GetRouteInfoRequestHeader


def route_data(view: RouteView) -> TopicRouteData:
    """The name server's route body for this broker's view of a topic."""
    return TopicRouteData(
        queue_datas=(
            QueueData(
                view.broker_name,
                view.read_queue_nums,
                view.write_queue_nums,
                view.perm,
                view.topic_sys_flag,
            ),
        ),
        broker_datas=(BrokerData(view.cluster, view.broker_name, {0: view.address}),),
    )


async def get_route(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Answer a route query for a topic this broker holds."""
    header = GetRouteInfoRequestHeader.from_ext(cmd.ext_fields)
    view = ctx.broker.routes.route(header.topic)
    if view is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST,
            f"No topic route info in name server for the topic: {header.topic}",
        )
    return cmd.response(body=route_data(view).to_json())
