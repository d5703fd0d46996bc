"""What a lone broker answers for ``trimq-admin`` / mqadmin besides routes, as the Remoting
adapter over :class:`broker.core.admin.AdminService`, :class:`~broker.core.offsets.OffsetService`
and :class:`~broker.core.clients.ClientRegistry`.

A broker started without name servers answers route queries itself (``route.py``); so that the
admin tools work against it the same way, it also answers the name server's
GET_BROKER_CLUSTER_INFO (106, a cluster of one: itself) and
GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206, its own topics), with the bodies a name server uses.
A broker registered with name servers answers them too, about itself only; tools ask the name
servers for the whole cluster.

Broker-side admin codes: GET_BROKER_RUNTIME_INFO (28), INVOKE_BROKER_TO_RESET_OFFSET (222)
and GET_ALL_CONSUMER_OFFSET (43, which mqadmin-like tools use to list the groups a broker
knows); and trimq's own PROMOTE_REPLICA (900001, admin-only: ``trimq-admin promoteReplica``).
"""

from __future__ import annotations

from broker.core.offsets import OffsetReset
from broker.remoting.channel import reset_offset_body
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.bodies.admin import ConsumerOffsetSerializeWrapper, KVTable
from protocol.bodies.route import BrokerData, ClusterInfo, TopicList
from protocol.command import RemotingCommand
from protocol.headers.admin import ResetOffsetRequestHeader


async def cluster_info(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """A cluster of one broker: this one, as the master (id 0) of its broker name."""
    me = ctx.broker.admin.cluster_info()
    info = ClusterInfo(
        broker_addr_table={me.broker_name: BrokerData(me.cluster, me.broker_name, {0: me.address})},
        cluster_addr_table={me.cluster: (me.broker_name,)},
    )
    return cmd.response(body=info.to_json())


async def topic_list(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Every topic of this broker, system topics included (as a name server lists them)."""
    return cmd.response(body=TopicList(tuple(ctx.broker.admin.topic_list())).to_json())


async def broker_runtime_info(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """``KVTable`` of runtime facts (:meth:`broker.core.admin.AdminService.runtime_info`)."""
    table = ctx.broker.admin.runtime_info(connections=ctx.server.connections)
    return cmd.response(body=KVTable(table).to_json())


def offset_reset(header: ResetOffsetRequestHeader) -> OffsetReset:
    """The core request a reset header describes."""
    return OffsetReset(
        group=header.group,
        topic=header.topic,
        timestamp=header.timestamp,
        force=header.is_force,
        queue_id=header.queue_id,
        offset=header.offset,
    )


async def reset_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Reset a group's offsets on a topic to a point in time (mqadmin ``resetOffsetByTime``):
    in the offset table and the pop cursors here, and in the online consumers' own stores
    (RESET_CONSUMER_CLIENT_OFFSET, sent oneway as ``Broker2Client.resetOffset`` does)."""
    reset = offset_reset(ResetOffsetRequestHeader.from_ext(cmd.ext_fields))
    offsets = ctx.broker.offsets.reset(reset)
    ctx.broker.clients.notify_reset(reset, offsets)
    return cmd.response(body=reset_offset_body(reset.topic, ctx.broker.config.broker_name, offsets))


async def all_consumer_offsets(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Every group's committed offsets on every topic of this broker."""
    table = ctx.broker.admin.all_consumer_offsets()
    return cmd.response(body=ConsumerOffsetSerializeWrapper(table).to_json())


async def promote_replica(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Make this replica its group's master (:meth:`broker.core.roles.RoleService.promote`);
    the answer carries the new epoch (ext field ``epoch``)."""
    epoch = ctx.broker.roles.promote()
    return cmd.response(
        remark=f"promoted to master, epoch {epoch}", ext_fields={"epoch": str(epoch)}
    )
