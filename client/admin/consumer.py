"""Consumer-group commands: ``consumerProgress`` and ``resetOffsetByTime`` (mqadmin's
``tools/command/consumer`` and ``offset``)."""

from __future__ import annotations

import argparse
import time
from datetime import datetime

from client.admin.output import Result, format_ms, table
from client.admin.session import Admin, AdminError, BrokerRef
from protocol.bodies.admin import ConsumerOffsetSerializeWrapper, ResetOffsetBody
from protocol.bodies.broker import ConsumeStats, OffsetWrapper
from protocol.bodies.consumer import GetConsumerListByGroupResponseBody, MessageQueue
from protocol.codes import RequestCode, ResponseCode
from protocol.errors import for_code
from protocol.headers.admin import GetConsumeStatsRequestHeader, ResetOffsetRequestHeader
from protocol.headers.client import GetConsumerListByGroupRequestHeader

#: mqadmin's ``resetOffsetByTime -s`` text form (``UtilAll.YYYY_MM_DD_HH_MM_SS_SSS``-like).
TIME_FORMAT = "%Y-%m-%d#%H:%M:%S:%f"
#: Codes with which a broker says "this group has nothing here" (not an error for a scan).
_NOTHING_HERE = (ResponseCode.CONSUMER_NOT_ONLINE, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)


def parse_timestamp(text: str) -> int:
    """``now``, epoch milliseconds, or ``yyyy-MM-dd#HH:mm:ss:SSS`` in local time.

    Raises:
        argparse.ArgumentTypeError: none of these.
    """
    if text == "now":
        return int(time.time() * 1000)
    if text.isdigit():
        return int(text)
    try:
        # %f reads microseconds: SSS (milliseconds) is padded to six digits first.
        head, _, millis = text.rpartition(":")
        moment = datetime.strptime(f"{head}:{millis.ljust(6, '0')}", TIME_FORMAT)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"timestamp must be ms, 'now' or yyyy-MM-dd#HH:mm:ss:SSS, not {text!r}"
        ) from None
    return int(moment.timestamp() * 1000)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the consumer commands to the CLI."""
    p = sub.add_parser("consumerProgress", help="a group's lag per queue (all groups without -g)")
    p.add_argument("-g", "--groupName")
    p.add_argument("-t", "--topicName", help="one topic only")
    p.set_defaults(run=consumer_progress)

    p = sub.add_parser("resetOffsetByTime", help="move a group's offsets to a point in time")
    p.add_argument("-g", "--group", required=True)
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-s", "--timestamp", type=parse_timestamp, required=True,
                   help="ms, 'now' or yyyy-MM-dd#HH:mm:ss:SSS")  # fmt: skip
    p.add_argument("-f", "--force", type=lambda s: s.lower() != "false", default=True,
                   metavar="true|false", help="also move forward (default true)")  # fmt: skip
    p.set_defaults(run=reset_offset_by_time)


async def _consume_stats(
    admin: Admin, ref: BrokerRef, group: str, topic: str | None
) -> ConsumeStats | None:
    ext = GetConsumeStatsRequestHeader(consumer_group=group, topic=topic).to_ext()
    reply = await admin.invoke(ref.address, admin.request(RequestCode.GET_CONSUME_STATS, ext))
    if reply.code in _NOTHING_HERE:
        return None
    if reply.code != ResponseCode.SUCCESS:
        raise for_code(reply.code, reply.remark)
    return ConsumeStats.from_json(reply.body)


async def group_stats(
    admin: Admin, group: str, topic: str | None = None
) -> dict[MessageQueue, OffsetWrapper]:
    """The group's progress on every queue of every broker that has any."""
    table_: dict[MessageQueue, OffsetWrapper] = {}
    for ref in await admin.brokers():
        stats = await _consume_stats(admin, ref, group, topic)
        if stats is not None:
            table_.update(stats.offset_table)
    return table_


async def consumer_progress(admin: Admin, args: argparse.Namespace) -> Result:
    """Per-queue lag of one group, or one summary row per group known to the brokers."""
    if not args.groupName:
        return await _all_groups(admin)
    offsets = await group_stats(admin, args.groupName, args.topicName)
    if not offsets:
        raise AdminError(f"consumer group {args.groupName!r} has no offsets on any broker")
    rows: list[tuple[object, ...]] = []
    doc_rows: list[dict[str, object]] = []
    for mq, o in sorted(offsets.items(), key=lambda i: (i[0].topic, i[0].broker_name,
                                                         i[0].queue_id)):  # fmt: skip
        diff = o.broker_offset - o.consumer_offset
        rows.append((mq.topic, mq.broker_name, mq.queue_id, o.broker_offset, o.consumer_offset,
                     diff, format_ms(o.last_timestamp)))  # fmt: skip
        doc_rows.append({"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id,
                         "brokerOffset": o.broker_offset, "consumerOffset": o.consumer_offset,
                         "diff": diff, "lastTimestamp": o.last_timestamp})  # fmt: skip
    total = sum(o.broker_offset - o.consumer_offset for o in offsets.values())
    headers = ("Topic", "Broker Name", "QID", "Broker Offset", "Consumer Offset", "Diff",
               "LastTime")  # fmt: skip
    text = f"{table(headers, rows)}\n\nConsume TPS: 0.00\nDiff Total: {total}"
    doc = {"group": args.groupName, "queues": doc_rows, "diffTotal": total}
    return Result(doc, text)


async def _groups(admin: Admin) -> set[str]:
    groups: set[str] = set()
    for ref in await admin.brokers():
        reply = await admin.invoke(ref.address, admin.request(RequestCode.GET_ALL_CONSUMER_OFFSET))
        if reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            raise AdminError(f"broker {ref.address} cannot list its groups: give -g GROUP")
        if reply.code != ResponseCode.SUCCESS:
            raise for_code(reply.code, reply.remark)
        groups |= ConsumerOffsetSerializeWrapper.from_json(reply.body).groups
    return groups


async def _online(admin: Admin, group: str) -> int:
    ids: set[str] = set()
    ext = GetConsumerListByGroupRequestHeader(consumer_group=group).to_ext()
    for ref in await admin.brokers():
        reply = await admin.invoke(
            ref.address, admin.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext)
        )
        if reply.code == ResponseCode.SUCCESS:
            ids |= set(GetConsumerListByGroupResponseBody.from_json(reply.body).consumer_id_list)
    return len(ids)


async def _all_groups(admin: Admin) -> Result:
    """mqadmin's group summary; version, type and model need the consumer connection list,
    which brokers here do not serve, so they print as ``-``."""
    rows: list[tuple[object, ...]] = []
    doc: list[dict[str, object]] = []
    for group in sorted(await _groups(admin)):
        offsets = await group_stats(admin, group)
        total = sum(o.broker_offset - o.consumer_offset for o in offsets.values())
        count = await _online(admin, group)
        rows.append((group, count, "-", "-", "-", "0.00", total))
        doc.append({"group": group, "count": count, "diffTotal": total})
    headers = ("Group", "Count", "Version", "Type", "Model", "TPS", "Diff Total")
    return Result(doc, table(headers, rows))


async def reset_offset_by_time(admin: Admin, args: argparse.Namespace) -> Result:
    """Ask every broker holding the topic to reset the group's offsets (and pop cursors)."""
    header = ResetOffsetRequestHeader(
        topic=args.topic, group=args.group, timestamp=args.timestamp, is_force=args.force
    )
    offsets: dict[MessageQueue, int] = {}
    for ref in await admin.topic_brokers(args.topic):
        cmd = admin.request(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header.to_ext())
        reply = await admin.broker(ref.address, cmd)
        offsets.update(ResetOffsetBody.from_json(reply.body).offset_table)
    ordered = sorted(offsets.items(), key=lambda i: (i[0].broker_name, i[0].queue_id))
    head = (
        f"rollback consumer offset by specified group[{args.group}], topic[{args.topic}], "
        f"force[{str(args.force).lower()}], timestamp(string)[{format_ms(args.timestamp)}], "
        f"timestamp(long)[{args.timestamp}]"
    )
    rows = [(mq.broker_name, mq.queue_id, offset) for mq, offset in ordered]
    doc = {
        "group": args.group,
        "topic": args.topic,
        "timestamp": args.timestamp,
        "offsets": [{"brokerName": b, "queueId": q, "offset": o} for b, q, o in rows],
    }
    return Result(doc, f"{head}\n{table(('brokerName', 'queueId', 'offset'), rows)}")
