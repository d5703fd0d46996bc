"""Topic commands: ``updateTopic``, ``deleteTopic``, ``topicList``, ``topicRoute``,
``topicStatus`` (mqadmin's ``tools/command/topic``)."""

from __future__ import annotations

import argparse
import json

from client.admin.output import Result, format_ms, table
from client.admin.session import Admin, AdminError, BrokerRef
from protocol.bodies.broker import TopicConfig, TopicStatsTable
from protocol.bodies.route import perm_to_string
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.admin import (
    CreateTopicRequestHeader,
    DeleteTopicRequestHeader,
    GetTopicStatsInfoRequestHeader,
)
from protocol.naming import DEFAULT_TOPIC

#: mqadmin ``updateTopic`` defaults (``UpdateTopicSubCommand``).
DEFAULT_QUEUE_NUMS = 8
DEFAULT_PERM = 6


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the topic commands to the CLI."""
    p = sub.add_parser("updateTopic", help="create or update a topic")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-b", "--brokerAddr", help="one broker (wins over -c)")
    p.add_argument("-c", "--clusterName", help="every broker of a cluster (default: all)")
    p.add_argument("-r", "--readQueueNums", type=int, default=DEFAULT_QUEUE_NUMS)
    p.add_argument("-w", "--writeQueueNums", type=int, default=DEFAULT_QUEUE_NUMS)
    p.add_argument("-p", "--perm", type=int, choices=(2, 4, 6), default=DEFAULT_PERM)
    p.add_argument("-o", "--order", type=_bool, default=False, metavar="true|false")
    p.set_defaults(run=update_topic)

    p = sub.add_parser("deleteTopic", help="delete a topic from brokers and name servers")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-c", "--clusterName", help="delete on this cluster's brokers")
    p.set_defaults(run=delete_topic)

    p = sub.add_parser("topicList", help="list topics")
    p.add_argument("-c", "--clusterModel", action="store_true", help="with their clusters")
    p.set_defaults(run=topic_list)

    p = sub.add_parser("topicRoute", help="where a topic's queues are")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-l", "--list", action="store_true", help="as a table")
    p.set_defaults(run=topic_route)

    p = sub.add_parser("topicStatus", help="offsets of every queue of a topic")
    p.add_argument("-t", "--topic", required=True)
    p.set_defaults(run=topic_status)


async def _targets(admin: Admin, broker: str | None, cluster: str | None) -> list[BrokerRef]:
    """``-b`` wins over ``-c``; neither means every broker the name servers know."""
    if broker:
        return [await admin.resolve(broker)]
    refs = await admin.brokers(cluster)
    if not refs:
        raise AdminError("no broker is registered with the name server")
    return refs


def topic_config_text(c: TopicConfig) -> str:
    """``TopicConfig.toString()``."""
    return (
        f"TopicConfig [topicName={c.topic_name}, readQueueNums={c.read_queue_nums}, "
        f"writeQueueNums={c.write_queue_nums}, perm={perm_to_string(c.perm)}, "
        f"topicFilterType={c.topic_filter_type.name}, topicSysFlag={c.topic_sys_flag}, "
        f"order={str(c.order).lower()}, attributes={dict(c.attributes)}]"
    )


async def update_topic(admin: Admin, args: argparse.Namespace) -> Result:
    """Create or update the topic on the chosen brokers."""
    config = TopicConfig(
        args.topic,
        read_queue_nums=args.readQueueNums,
        write_queue_nums=args.writeQueueNums,
        perm=args.perm,
        order=args.order,
    )
    header = CreateTopicRequestHeader(
        topic=args.topic,
        default_topic=DEFAULT_TOPIC,
        read_queue_nums=config.read_queue_nums,
        write_queue_nums=config.write_queue_nums,
        perm=config.perm,
        topic_filter_type=config.topic_filter_type.name,
        topic_sys_flag=0,
        order=config.order,
    )
    lines, done = [], []
    for ref in await _targets(admin, args.brokerAddr, args.clusterName):
        cmd = admin.request(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
        await admin.broker(ref.address, cmd)
        lines.append(f"create topic to {ref.address} success.")
        done.append(ref.address)
    lines.append(topic_config_text(config))
    return Result({"brokers": done, "topicConfig": config.to_obj()}, "\n".join(lines))


async def delete_topic(admin: Admin, args: argparse.Namespace) -> Result:
    """Delete the topic on its brokers (or the cluster's), then on the name servers."""
    if args.clusterName:
        refs = await admin.brokers(args.clusterName)
    else:
        refs = await admin.topic_brokers(args.topic)
    ext = DeleteTopicRequestHeader(topic=args.topic).to_ext()
    lines = []
    for ref in refs:
        await admin.broker(ref.address, admin.request(RequestCode.DELETE_TOPIC_IN_BROKER, ext))
        lines.append(f"delete topic [{args.topic}] from broker [{ref.name}] success.")
    # A name server keeps the route until told; a lone broker has no such table and does
    # not serve the code, which is fine.
    reply = await admin.namesrv(admin.request(RequestCode.DELETE_TOPIC_IN_NAMESRV, ext))
    namesrv = reply.code == ResponseCode.SUCCESS
    if namesrv:
        lines.append(f"delete topic [{args.topic}] from NameServer success.")
    doc = {"topic": args.topic, "brokers": [r.name for r in refs], "nameServer": namesrv}
    return Result(doc, "\n".join(lines))


async def topic_list(admin: Admin, args: argparse.Namespace) -> Result:
    """Every topic; with ``-c`` also the clusters holding it."""
    names = await admin.topic_names()
    if not args.clusterModel:
        return Result({"topicList": names}, "\n".join(names))
    rows: list[tuple[str, str]] = []
    for name in names:  # one route query per topic, as mqadmin does
        try:
            route = await admin.route(name)
        except AdminError:
            continue  # deleted since it was listed
        rows += sorted({(b.cluster, name) for b in route.broker_datas})
    doc = [{"clusterName": c, "topic": t} for c, t in rows]
    return Result(doc, table(("Cluster Name", "Topic"), rows))


async def topic_route(admin: Admin, args: argparse.Namespace) -> Result:
    """The route as JSON (mqadmin's default) or, with ``-l``, as a table."""
    route = await admin.route(args.topic)
    doc = route.to_obj()
    if not args.list:
        return Result(doc, json.dumps(doc, indent=2))
    clusters = {b.broker_name: b for b in route.broker_datas}
    rows: list[tuple[object, ...]] = []
    for q in sorted(route.queue_datas, key=lambda q: q.broker_name):
        b = clusters.get(q.broker_name)
        addrs = ",".join(f"{k}:{v}" for k, v in sorted(b.broker_addrs.items())) if b else ""
        cluster = b.cluster if b else ""
        rows.append((cluster, q.broker_name, addrs, q.read_queue_nums, q.write_queue_nums,
                     perm_to_string(q.perm)))  # fmt: skip
    reads = sum(q.read_queue_nums for q in route.queue_datas)
    writes = sum(q.write_queue_nums for q in route.queue_datas)
    rows.append(("Total:", len(rows), "", reads, writes, ""))
    headers = ("ClusterName", "BrokerName", "BrokerAddrs", "ReadQueue", "WriteQueue", "Perm")
    return Result(doc, table(headers, rows))


async def topic_status(admin: Admin, args: argparse.Namespace) -> Result:
    """Min and max offset of every queue of the topic on every broker holding it."""
    ext = GetTopicStatsInfoRequestHeader(topic=args.topic).to_ext()
    rows: list[tuple[object, ...]] = []
    doc: list[dict[str, object]] = []
    for ref in await admin.topic_brokers(args.topic):
        reply = await admin.broker(
            ref.address, admin.request(RequestCode.GET_TOPIC_STATS_INFO, ext)
        )
        stats = TopicStatsTable.from_json(reply.body)
        for mq, off in sorted(stats.offset_table.items(), key=lambda i: i[0].queue_id):
            rows.append((mq.broker_name, mq.queue_id, off.min_offset, off.max_offset,
                         format_ms(off.last_update_timestamp)))  # fmt: skip
            doc.append({"brokerName": mq.broker_name, "queueId": mq.queue_id,
                        "minOffset": off.min_offset, "maxOffset": off.max_offset,
                        "lastUpdateTimestamp": off.last_update_timestamp})  # fmt: skip
    headers = ("Broker Name", "QID", "Min Offset", "Max Offset", "Last Updated")
    return Result(doc, table(headers, rows))
