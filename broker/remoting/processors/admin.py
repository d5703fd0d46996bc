"""Topic administration and statistics for ``trimq-admin`` / mqadmin.

UPDATE_AND_CREATE_TOPIC (17), DELETE_TOPIC_IN_BROKER (215), GET_TOPIC_STATS_INFO (202) and
GET_CONSUME_STATS (208, consumer progress: broker offset vs committed offset per queue).
"""

from __future__ import annotations

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from protocol.bodies.broker import (
    ConsumeStats,
    OffsetWrapper,
    TopicConfig,
    TopicFilterType,
    TopicOffset,
    TopicStatsTable,
)
from protocol.bodies.consumer import MessageQueue
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError
from protocol.headers.admin import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetConsumeStatsRequestHeader,
    GetTopicStatsInfoRequestHeader,
)
from protocol.naming import is_system_topic, validate_topic
from protocol.properties import decode_properties

#: RocketMQ caps queue counts per topic per broker (``TopicValidator`` / console: 1024).
MAX_QUEUE_NUMS = 1024


async def create_topic(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Create a topic or update its queue counts and permission."""
    header = CreateTopicRequestHeader.from_ext(cmd.ext_fields)
    validate_topic(header.topic)
    for name, value in (("readQueueNums", header.read_queue_nums),
                        ("writeQueueNums", header.write_queue_nums)):  # fmt: skip
        if not 1 <= value <= MAX_QUEUE_NUMS:
            raise BrokerError(f"{name} {value} is outside 1..{MAX_QUEUE_NUMS}",
                              code=ResponseCode.INVALID_PARAMETER)  # fmt: skip
    attributes = decode_properties(header.attributes) if header.attributes else {}
    ctx.topics.update(
        TopicConfig(
            header.topic,
            read_queue_nums=header.read_queue_nums,
            write_queue_nums=header.write_queue_nums,
            perm=header.perm,
            topic_filter_type=TopicFilterType[header.topic_filter_type],
            topic_sys_flag=header.topic_sys_flag or 0,
            order=header.order,
            attributes=attributes,
        )
    )
    return cmd.response()


async def delete_topic(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Delete a topic: its configuration, consume queues and offsets (records age out)."""
    header = DeleteTopicRequestHeader.from_ext(cmd.ext_fields)
    if is_system_topic(header.topic):
        raise BrokerError(f"system topic {header.topic} cannot be deleted",
                          code=ResponseCode.NO_PERMISSION)  # fmt: skip
    ctx.topics.delete(header.topic)
    ctx.store.delete_topic(header.topic)
    return cmd.response()


def _queues(ctx: BrokerContext, topic: str) -> list[MessageQueue]:
    config = ctx.topics.get(topic)
    if config is None:
        raise BrokerError(f"topic {topic} does not exist", code=ResponseCode.TOPIC_NOT_EXIST)
    name = ctx.config.broker_name
    return [MessageQueue(topic, name, q) for q in range(config.read_queue_nums)]


async def topic_stats(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Min and max offset of every queue of a topic."""
    header = GetTopicStatsInfoRequestHeader.from_ext(cmd.ext_fields)
    store = ctx.store
    table = {
        mq: TopicOffset(
            store.min_offset(mq.topic, mq.queue_id), store.max_offset(mq.topic, mq.queue_id)
        )
        for mq in _queues(ctx, header.topic)
    }
    return cmd.response(body=TopicStatsTable(table).to_json())


async def consume_stats(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """A group's progress: broker offset vs committed offset for every queue it consumes
    (one topic, or every topic the group has offsets for)."""
    header = GetConsumeStatsRequestHeader.from_ext(cmd.ext_fields)
    store = ctx.store
    topics = (
        [header.topic] if header.topic else sorted(store.offsets.topics_of(header.consumer_group))
    )
    table: dict[MessageQueue, OffsetWrapper] = {}
    for topic in topics:
        if ctx.topics.get(topic) is None:
            continue
        for mq in _queues(ctx, topic):
            committed = store.offsets.query(header.consumer_group, topic, mq.queue_id)
            table[mq] = OffsetWrapper(
                broker_offset=store.max_offset(topic, mq.queue_id),
                consumer_offset=committed if committed is not None else 0,
            )
    if not table:
        raise BrokerError(f"no consume stats for group {header.consumer_group}",
                          code=ResponseCode.CONSUMER_NOT_ONLINE)  # fmt: skip
    return cmd.response(body=ConsumeStats(table).to_json())
