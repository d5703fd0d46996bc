"""``consumeMessage``: pull messages of a topic and print them (mqadmin's
``ConsumeMessageCommand``).

Where reading starts, per queue: ``-o`` if given; else, with ``-g``, the group's committed
offset; else the queue's first stored message. Offsets are committed only when a group is
given with ``-g`` (the offset after the last message printed), so looking at a topic never
moves anyone's position; without ``-g`` the pulls use RocketMQ's ``TOOLS_CONSUMER`` group,
which commits nothing. Pulls never long-poll: an empty queue ends that queue's reading.
"""

from __future__ import annotations

import argparse

from client.admin.messages import message_doc
from client.admin.output import Result, table
from client.admin.session import Admin, AdminError
from client.instance import TopicRoute
from client.message import ReceivedMessage
from protocol.bodies.consumer import MessageQueue
from protocol.codes import RequestCode, ResponseCode
from protocol.errors import RecordError, for_code
from protocol.headers.offsets import (
    GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
)
from protocol.headers.pull import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    build_pull_sys_flag,
)
from protocol.message import decode_records

#: ``MixAll.TOOLS_CONSUMER_GROUP``.
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
#: Messages printed at most without ``-c`` (mqadmin ``consumeMessage``: 128).
DEFAULT_COUNT = 128
#: Messages asked for per pull (what Java clients ask).
PULL_BATCH = 32
_NOT_FOUND = (
    ResponseCode.PULL_NOT_FOUND,
    ResponseCode.PULL_OFFSET_MOVED,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``consumeMessage`` to the CLI."""
    p = sub.add_parser("consumeMessage", help="pull messages and print them")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-g", "--consumerGroup", help="start at and commit this group's offsets")
    p.add_argument("-c", "--count", type=int, default=DEFAULT_COUNT, help="at most this many")
    p.add_argument("-b", "--brokerName", help="one broker (name or address)")
    p.add_argument("-i", "--queueId", type=int, help="one queue")
    p.add_argument("-o", "--offset", type=int, help="start offset in each queue read")
    p.set_defaults(run=consume_message)


class _Reader:
    """Pulls one queue after another for one command."""

    def __init__(self, admin: Admin, group: str, addresses: dict[str, str]) -> None:
        self.admin = admin
        self.group = group
        self.addresses = addresses

    async def start_offset(self, mq: MessageQueue, committed: bool) -> int:
        address = self.addresses[mq.broker_name]
        if committed:
            ext = QueryConsumerOffsetRequestHeader(
                consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id
            ).to_ext()
            reply = await self.admin.invoke(
                address, self.admin.request(RequestCode.QUERY_CONSUMER_OFFSET, ext)
            )
            if reply.code == ResponseCode.SUCCESS:
                return QueryConsumerOffsetResponseHeader.from_ext(reply.ext_fields).offset
        ext = GetMinOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id).to_ext()
        cmd = self.admin.request(RequestCode.GET_MIN_OFFSET, ext)
        reply = await self.admin.broker(address, cmd)
        return GetMinOffsetResponseHeader.from_ext(reply.ext_fields).offset

    async def pull(
        self, mq: MessageQueue, offset: int, limit: int
    ) -> tuple[list[ReceivedMessage], int]:
        """Up to ``limit`` messages from ``offset`` (none once caught up), and the next offset."""
        header = PullMessageRequestHeader(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id,
            queue_offset=offset, max_msg_nums=min(limit, PULL_BATCH),
            sys_flag=build_pull_sys_flag(commit_offset=False, suspend=False, subscription=True),
            commit_offset=0, suspend_timeout_millis=0, subscription="*", sub_version=0,
        )  # fmt: skip
        cmd = self.admin.request(RequestCode.PULL_MESSAGE, header.to_ext())
        reply = await self.admin.invoke(self.addresses[mq.broker_name], cmd)
        if reply.code in _NOT_FOUND:
            return [], offset
        if reply.code != ResponseCode.SUCCESS:
            raise for_code(reply.code, reply.remark)
        try:
            records = decode_records(reply.body)
        except RecordError as exc:
            raise AdminError(f"malformed message in pull reply: {exc}") from None
        nxt = PullMessageResponseHeader.from_ext(reply.ext_fields).next_begin_offset
        return [ReceivedMessage.of(r, mq.broker_name) for r in records[:limit]], nxt

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        ext = UpdateConsumerOffsetRequestHeader(
            consumer_group=self.group, topic=mq.topic, queue_id=mq.queue_id, commit_offset=offset
        ).to_ext()
        cmd = self.admin.request(RequestCode.UPDATE_CONSUMER_OFFSET, ext)
        await self.admin.broker(self.addresses[mq.broker_name], cmd)


async def read_queue(
    reader: _Reader, mq: MessageQueue, offset: int, limit: int
) -> tuple[list[ReceivedMessage], int]:
    """Up to ``limit`` messages of one queue from ``offset``, and the offset after them."""
    got: list[ReceivedMessage] = []
    for _ in range(limit):  # bounded: every round that goes on gains at least one message
        messages, _ = await reader.pull(mq, offset, limit - len(got))
        if not messages:
            break
        got += messages
        offset = messages[-1].queue_offset + 1
        if len(got) >= limit:
            break
    return got, offset


def _queues(
    route: TopicRoute, addresses: dict[str, str], args: argparse.Namespace
) -> list[MessageQueue]:
    queues = list(route.read_queues)
    if args.brokerName:
        names = {n for n, a in addresses.items() if args.brokerName in (n, a)}
        if not names:
            raise AdminError(f"broker {args.brokerName!r} does not hold topic {args.topic!r}")
        queues = [q for q in queues if q.broker_name in names]
    if args.queueId is not None:
        queues = [q for q in queues if q.queue_id == args.queueId]
        if not queues:
            raise AdminError(f"topic {args.topic!r} has no readable queue {args.queueId}")
    return queues


async def consume_message(admin: Admin, args: argparse.Namespace) -> Result:
    """Pull up to ``-c`` messages from the chosen queues and print them (see module doc)."""
    if args.count <= 0:
        raise AdminError("count must be positive")
    data = await admin.route(args.topic)
    route = TopicRoute.build(args.topic, data)
    addresses = {b.broker_name: b.master_addr for b in data.broker_datas if b.master_addr}
    reader = _Reader(admin, args.consumerGroup or TOOLS_CONSUMER_GROUP, addresses)
    printed: list[ReceivedMessage] = []
    for mq in _queues(route, addresses, args):
        if len(printed) >= args.count:
            break
        start = args.offset
        if start is None:
            start = await reader.start_offset(mq, committed=bool(args.consumerGroup))
        got, after = await read_queue(reader, mq, start, args.count - len(printed))
        printed += got
        if args.consumerGroup and got:
            await reader.commit(mq, after)
    rows = [
        (m.broker_name, m.record.queue_id, m.queue_offset, m.message_id, m.tag or "",
         " ".join(m.keys), m.body.decode("utf-8", errors="replace"))
        for m in printed
    ]  # fmt: skip
    doc = [{**message_doc(m.record, m.body), "brokerName": m.broker_name} for m in printed]
    headers = ("Broker Name", "QID", "Offset", "MsgId", "Tags", "Keys", "Body")
    return Result(doc, table(headers, rows))
