"""What a lone broker answers for ``trimq-admin`` / mqadmin besides routes.

A broker started without name servers answers route queries itself (``route.py``); so that the
admin tools work against it the same way, it also answers the name server's
GET_BROKER_CLUSTER_INFO (106, a cluster of one: itself) and
GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206, its own topics), with the bodies a name server uses.
A broker registered with name servers answers them too, about itself only; tools ask the name
servers for the whole cluster.

Broker-side admin codes: GET_BROKER_RUNTIME_INFO (28), INVOKE_BROKER_TO_RESET_OFFSET (222)
and GET_ALL_CONSUMER_OFFSET (43, which mqadmin-like tools use to list the groups a broker
knows).
"""

from __future__ import annotations

import time
from importlib import metadata

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from broker.remoting.processors.offsets import commit_offset
from protocol.bodies.admin import ConsumerOffsetSerializeWrapper, KVTable, ResetOffsetBody
from protocol.bodies.consumer import MessageQueue
from protocol.bodies.route import BrokerData, ClusterInfo, TopicList
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import BrokerError, RecordError
from protocol.headers.admin import ResetOffsetRequestHeader
from protocol.message import peek_record
from protocol.naming import validate_group

#: Java's ``timestamp == -1`` in a reset: "to the end of every queue".
RESET_TO_END = -1


def _version() -> str:
    try:
        return metadata.version("trimq")
    except metadata.PackageNotFoundError:
        return "unknown"


async def cluster_info(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """A cluster of one broker: this one, as the master (id 0) of its broker name."""
    name, cluster = ctx.config.broker_name, ctx.config.cluster
    info = ClusterInfo(
        broker_addr_table={name: BrokerData(cluster, name, {0: ctx.address})},
        cluster_addr_table={cluster: (name,)},
    )
    return cmd.response(body=info.to_json())


async def topic_list(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Every topic of this broker, system topics included (as a name server lists them)."""
    return cmd.response(body=TopicList(tuple(sorted(ctx.topics.names()))).to_json())


def _runtime(elapsed_s: float) -> str:
    """RocketMQ's ``StoreStatsService.getRuntimeInfo`` text: ``[ 0 days, 1 hours, … ]``."""
    total = int(elapsed_s)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"


def _earliest_store_time(ctx: BrokerContext) -> int:
    """Store time of the first record still in the commit log, -1 when there is none."""
    record = ctx.store.message_at(ctx.store.log.min_offset)
    if record is None:
        return -1
    try:
        return peek_record(record).store_timestamp
    except RecordError:
        return -1


def runtime_info(ctx: BrokerContext, now_s: float) -> dict[str, str]:
    """The runtime keys this broker can fill truthfully, named as RocketMQ names them
    (``BrokerController``/``AdminBrokerProcessor.prepareRuntimeInfo``). Throughput keys
    (``putTps``, ``msgPutTotalTodayNow`` …) are left out: the broker keeps no such counters,
    and a made-up zero would read as "idle"."""
    store = ctx.store
    return {
        "brokerVersionDesc": f"trimq-{_version()}",
        "brokerName": ctx.config.broker_name,
        "brokerAddr": ctx.address,
        "bootTimestamp": str(int(ctx.started_at * 1000)),
        "runtime": _runtime(now_s - ctx.started_at),
        "commitLogDiskRatio": f"{store.disk_used_ratio():.4f}",
        "commitLogMinOffset": str(store.log.min_offset),
        "commitLogMaxOffset": str(store.dispatched_offset),
        "earliestMessageTimeStamp": str(_earliest_store_time(ctx)),
        "topicCount": str(len(ctx.topics.names())),
        "connectionCount": str(len(ctx.open_connections)),
        "flushDiskType": "SYNC_FLUSH" if ctx.config.flush == "sync" else "ASYNC_FLUSH",
    }


async def broker_runtime_info(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """``KVTable`` of runtime facts (see :func:`runtime_info`)."""
    return cmd.response(body=KVTable(runtime_info(ctx, time.time())).to_json())


def reset_offsets(ctx: BrokerContext, header: ResetOffsetRequestHeader) -> dict[MessageQueue, int]:
    """Move the group's committed offsets (and its pop cursors) on every queue of the topic
    (or ``header.queue_id`` alone) to the first message stored at or after
    ``header.timestamp``; without ``is_force`` only backwards. Returns the new offsets.

    Raises:
        BrokerError: ``TOPIC_NOT_EXIST``, or ``INVALID_PARAMETER`` for a bad queue id.
    """
    validate_group(header.group)
    config = ctx.topics.get(header.topic)
    if config is None:
        raise BrokerError(f"topic {header.topic} does not exist",
                          code=ResponseCode.TOPIC_NOT_EXIST)  # fmt: skip
    queues = range(config.read_queue_nums)
    if header.queue_id >= 0:
        if header.queue_id not in queues:
            raise BrokerError(f"queueId {header.queue_id} is illegal",
                              code=ResponseCode.INVALID_PARAMETER)  # fmt: skip
        queues = range(header.queue_id, header.queue_id + 1)
    store, offsets = ctx.store, ctx.store.offsets
    table: dict[MessageQueue, int] = {}
    for qid in queues:
        if header.queue_id >= 0 and header.offset is not None:
            target = header.offset  # 5.x: an explicit offset for one queue
        elif header.timestamp == RESET_TO_END:
            target = store.max_offset(header.topic, qid)
        else:
            target = store.offset_by_time(header.topic, qid, header.timestamp)
        committed = offsets.query(header.group, header.topic, qid)
        if not header.is_force and committed is not None and committed < target:
            target = committed  # RocketMQ: without force an offset only moves back
        commit_offset(ctx, header.group, header.topic, qid, target)
        _reset_pop_cursor(ctx, header.group, header.topic, qid, target)
        table[MessageQueue(header.topic, ctx.config.broker_name, qid)] = target
    return table


def _reset_pop_cursor(ctx: BrokerContext, group: str, topic: str, qid: int, offset: int) -> None:
    # A pop group reads from its cursor, not from the committed offset, once it has one;
    # moving only the committed offset would not change what it receives next. A group that
    # never popped this queue has no cursor and starts from the committed offset anyway.
    pop = ctx.pop
    if pop is not None and pop.table.cursor(group, topic, qid) is not None:
        pop.table.set_cursor(group, topic, qid, offset)


def tell_clients(ctx: BrokerContext, header: ResetOffsetRequestHeader, body: bytes) -> int:
    """Send RESET_CONSUMER_CLIENT_OFFSET (oneway, as ``Broker2Client.resetOffset``) to each
    connection of the group's online consumers; returns how many were sent.

    A pull-mode client keeps its position in memory and commits it every few seconds: without
    this it would overwrite the reset with its next commit. Java clients move their offset
    store on it; a client that ignores it overwrites the reset (reset a stopped group then).
    """
    group = ctx.consumers.groups.get(header.group)
    if group is None:
        return 0
    sent: set[int] = set()
    for member in group.members.values():
        conn = member.connection
        if conn.id in sent:
            continue
        note = request(
            RequestCode.RESET_CONSUMER_CLIENT_OFFSET, conn.next_opaque(), header.to_ext(), body,
            oneway=True, language="JAVA",
        )  # fmt: skip
        if conn.notify_nowait(note):
            sent.add(conn.id)
    return len(sent)


async def reset_offset(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Reset a group's offsets on a topic to a point in time (mqadmin ``resetOffsetByTime``):
    in the offset table and the pop cursors here, and in the online consumers' own stores
    (:func:`tell_clients`)."""
    header = ResetOffsetRequestHeader.from_ext(cmd.ext_fields)
    body = ResetOffsetBody(reset_offsets(ctx, header)).to_json()
    tell_clients(ctx, header, body)
    return cmd.response(body=body)


async def all_consumer_offsets(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Every group's committed offsets on every topic of this broker."""
    offsets = ctx.store.offsets
    table = {
        (topic, group): offsets.table(group, topic)
        for topic in ctx.topics.names()
        for group in sorted(offsets.groups_of(topic))
    }
    return cmd.response(body=ConsumerOffsetSerializeWrapper(table).to_json())
