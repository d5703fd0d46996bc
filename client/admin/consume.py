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
from collections.abc import Iterator
from contextlib import contextmanager

from client.admin.messages import message_doc
from client.admin.output import Result, table
from client.admin.session import Admin, AdminError, describe
from client.errors import ClientError
from client.instance import TopicRoute
from client.message import ReceivedMessage
from client.push import pull_api
from protocol.bodies.consumer import MessageQueue
from protocol.errors import RecordError

#: ``MixAll.TOOLS_CONSUMER_GROUP``.
TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
#: Messages printed at most without ``-c`` (mqadmin ``consumeMessage``: 128).
DEFAULT_COUNT = 128
#: Messages asked for per pull (what Java clients ask).
PULL_BATCH = 32


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
    """Pulls one queue after another for one command (through :mod:`client.push.pull_api`,
    with unreachable brokers and malformed replies turned into one-line errors)."""

    def __init__(self, admin: Admin, group: str) -> None:
        self.instance = admin.instance
        self.group = group

    @contextmanager
    def _guard(self, mq: MessageQueue) -> Iterator[None]:
        try:
            yield
        except ClientError as exc:
            raise describe(
                exc, self.instance.broker_address(mq.broker_name) or "?", "broker"
            ) from None
        except RecordError as exc:
            raise AdminError(f"malformed message in pull reply: {exc}") from None

    async def start_offset(self, mq: MessageQueue, committed: bool) -> int:
        with self._guard(mq):
            if committed:
                offset = await pull_api.query_offset(self.instance, self.group, mq)
                if offset is not None:
                    return offset
            return await pull_api.queue_offset(self.instance, mq, first=True)

    async def pull(
        self, mq: MessageQueue, offset: int, limit: int
    ) -> tuple[list[ReceivedMessage], int]:
        """Up to ``limit`` messages from ``offset`` (none once caught up), and the next offset."""
        with self._guard(mq):
            result = await pull_api.pull(
                self.instance, self.group, mq, offset, max_messages=min(limit, PULL_BATCH),
                max_bytes=None, commit_offset=None, expression="*", suspend_ms=0,
            )  # fmt: skip
        if not result.messages:
            return [], offset
        return result.messages[:limit], result.next_offset

    async def commit(self, mq: MessageQueue, offset: int) -> None:
        with self._guard(mq):
            await pull_api.update_offset(self.instance, self.group, mq, offset)


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
    route = admin.instance.adopt_route(args.topic, data)
    addresses = {b.broker_name: b.master_addr for b in data.broker_datas if b.master_addr}
    reader = _Reader(admin, args.consumerGroup or TOOLS_CONSUMER_GROUP)
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
