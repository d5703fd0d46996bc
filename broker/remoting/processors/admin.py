"""Topic administration and statistics for ``trimq-admin`` / mqadmin: the Remoting adapter over
:class:`broker.core.admin.AdminService`.

UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215), GET_TOPIC_STATS_INFO (202) and
GET_CONSUME_STATS (208, consumer progress: broker offset vs committed offset per queue).
"""

from __future__ import annotations

from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.bodies.broker import (
    ConsumeStats,
    OffsetWrapper,
    TopicConfig,
    TopicFilterType,
    TopicOffset,
    TopicStatsTable,
)
from protocol.bodies.consumer import MessageQueue
from protocol.command import RemotingCommand
from protocol.headers.admin import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    GetTopicStatsInfoRequestHeader,
)
from protocol.properties import decode_properties


def topic_config(header: CreateTopicRequestHeader) -> TopicConfig:
    """The topic configuration a create request describes."""
    return TopicConfig(
        header.topic,
        read_queue_nums=header.read_queue_nums,
        write_queue_nums=header.write_queue_nums,
        perm=header.perm,
        topic_filter_type=TopicFilterType[header.topic_filter_type],
        topic_sys_flag=header.topic_sys_flag or 0,
        order=header.order,
        attributes=decode_properties(header.attributes) if header.attributes else {},
    )


async def create_topic(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Create a topic or update its queue counts and permission."""
    header = CreateTopicRequestHeader.from_ext(cmd.ext_fields)
    ctx.broker.admin.create_topic(topic_config(header))
    return cmd.response()


async def delete_topic(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Delete a topic with its queues, offsets and pop state (records age out)."""
    header = DeleteTopicRequestHeader.from_ext(cmd.ext_fields)
    await ctx.broker.admin.delete_topic(header.topic)
    return cmd.response()


async def topic_stats(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Min and max offset of every queue of a topic."""
    header = GetTopicStatsInfoRequestHeader.from_ext(cmd.ext_fields)
    name = ctx.broker.config.broker_name
    table = {
        MessageQueue(header.topic, name, qid): TopicOffset(q.min_offset, q.max_offset)
        for qid, q in ctx.broker.admin.topic_stats(header.topic).items()
    }
    return cmd.response(body=TopicStatsTable(table).to_json())


async def consume_stats(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """A group's progress: broker offset vs committed offset for every queue it consumes
    (one topic, or every topic the group has offsets for)."""
    header = GetConsumeStatsRequestHeader.from_ext(cmd.ext_fields)
    name = ctx.broker.config.broker_name
    progress = ctx.broker.admin.consume_stats(header.consumer_group, header.topic or None)
    table = {
        MessageQueue(p.topic, name, p.queue_id): OffsetWrapper(
            broker_offset=p.broker_offset, consumer_offset=p.consumer_offset
        )
        for p in progress
    }
    return cmd.response(body=ConsumeStats(table).to_json())
