"""The lone broker's admin answers over real TCP: cluster info (106), topic list (206),
runtime info (28), offset reset (222, committed offsets and pop cursors) and the all-offsets
dump (43)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio

from protocol.bodies.admin import ConsumerOffsetSerializeWrapper, KVTable, ResetOffsetBody
from protocol.bodies.route import ClusterInfo, TopicList
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.admin import ResetOffsetRequestHeader
from protocol.headers.offsets import (
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
)
from tests.broker.client import BrokerClient, open_broker, open_client
from tests.broker.pop_client import ack, pop
from tests.broker.test_pull_offsets import send
from tests.broker.test_server import heartbeat_body

pytestmark = pytest.mark.integration

TIMEOUT = 10
TOPIC = "PullTopic"  # the topic ``send`` writes to
GROUP = "admin_group"


async def _reset(
    client: BrokerClient, timestamp: int, *, group: str = GROUP, force: bool = True
) -> dict[int, int]:
    header = ResetOffsetRequestHeader(topic=TOPIC, group=group, timestamp=timestamp, is_force=force)
    reply = await client.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return {mq.queue_id: o for mq, o in ResetOffsetBody.from_json(reply.body).offset_table.items()}


async def _commit(client: BrokerClient, queue_id: int, offset: int) -> None:
    header = UpdateConsumerOffsetRequestHeader(
        consumer_group=GROUP, topic=TOPIC, queue_id=queue_id, commit_offset=offset
    )
    reply = await client.call(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def _committed(client: BrokerClient, queue_id: int) -> int:
    header = QueryConsumerOffsetRequestHeader(consumer_group=GROUP, topic=TOPIC, queue_id=queue_id)
    reply = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())
    return QueryConsumerOffsetResponseHeader.from_ext(reply.ext_fields).offset


async def test_cluster_topics_and_runtime_info(tmp_path: Path) -> None:
    """106 lists this broker as a cluster of one, 206 its topics, 28 its runtime facts."""
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path, broker_name="b1", cluster="C1") as handle,
            open_client(handle.port) as client,
        ):
            await send(client, b"x")
            reply = await client.call(RequestCode.GET_BROKER_CLUSTER_INFO)
            info = ClusterInfo.from_json(reply.body)
            assert dict(info.cluster_addr_table) == {"C1": ("b1",)}
            assert info.broker_addr_table["b1"].master_addr == handle.address
            reply = await client.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            assert TOPIC in TopicList.from_json(reply.body).topic_list
            reply = await client.call(RequestCode.GET_BROKER_RUNTIME_INFO)
            table = KVTable.from_json(reply.body).table
    assert table["brokerName"] == "b1" and table["brokerAddr"] == handle.address
    assert table["runtime"].startswith("[ 0 days, 0 hours, ")
    assert 0 < int(table["earliestMessageTimeStamp"]) <= int(time.time() * 1000)
    assert 0.0 <= float(table["commitLogDiskRatio"]) <= 1.0
    assert int(table["commitLogMaxOffset"]) > 0
    assert "putTps" not in table  # no counters: left out rather than made up


async def test_reset_committed_offsets(tmp_path: Path) -> None:
    """Reset to a time before the messages, to the end (-1), and not forward without force."""
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            before = int(time.time() * 1000) - 1
            for i in range(3):
                await send(client, f"m{i}".encode())
            await _commit(client, 0, 3)
            assert (await _reset(client, before))[0] == 0
            assert await _committed(client, 0) == 0
            assert await _reset(client, -1) == {0: 3, 1: 0, 2: 0, 3: 0}
            await _commit(client, 0, 1)
            assert (await _reset(client, -1, force=False))[0] == 1  # forward needs force
            reply = await client.call(RequestCode.GET_ALL_CONSUMER_OFFSET)
            dump = ConsumerOffsetSerializeWrapper.from_json(reply.body)
            assert dump.offset_table[(TOPIC, GROUP)][0] == 1
            header = ResetOffsetRequestHeader(topic="Nope", group=GROUP, timestamp=0, is_force=True)
            reply = await client.call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, header.to_ext())
            assert reply.code == ResponseCode.TOPIC_NOT_EXIST


async def test_reset_tells_online_consumers(tmp_path: Path) -> None:
    """A connected consumer of the group gets RESET_CONSUMER_CLIENT_OFFSET with the offsets."""
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            await send(client, b"m")
            async with open_client(handle.port) as member:
                body = heartbeat_body("member@1", GROUP, TOPIC)
                assert (await member.call(RequestCode.HEART_BEAT, body=body)).code == 0
                await _reset(client, -1)
                resets: list[RemotingCommand] = []
                for count in range(1, 4):  # a membership notification may come first
                    await member.wait_notifications(count)
                    resets = [
                        n
                        for n in member.notifications
                        if n.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET
                    ]
                    if resets:
                        break
    (note,) = resets
    header = ResetOffsetRequestHeader.from_ext(note.ext_fields)
    assert (header.group, header.topic, header.timestamp) == (GROUP, TOPIC, -1)
    offsets = ResetOffsetBody.from_json(note.body).offset_table
    assert {mq.queue_id: o for mq, o in offsets.items()}[0] == 1


async def test_reset_moves_pop_cursor(tmp_path: Path) -> None:
    """A pop group that consumed everything receives the messages again after a reset."""
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            before = int(time.time() * 1000) - 1
            for i in range(3):
                await send(client, f"p{i}".encode())
            _, popped = await pop(client, GROUP, TOPIC, queue_id=0)
            assert len(popped) == 3
            for p in popped:
                await ack(client, GROUP, p)
            assert (await pop(client, GROUP, TOPIC, queue_id=0))[1] == []
            await _reset(client, before)
            _, again = await pop(client, GROUP, TOPIC, queue_id=0)
            assert sorted(p.msg.body for p in again) == [b"p0", b"p1", b"p2"]
