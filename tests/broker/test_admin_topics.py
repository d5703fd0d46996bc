"""Topic administration over real TCP: a topic deleted (DELETE_TOPIC_IN_BROKER, 215) and
created again (UPDATE_AND_CREATE_TOPIC, 17) serves a pop group from the new queue's start.

Before the delete also dropped the pop state (code review §1.2 item 8), the group's cursor
stayed at the old queue's end, above the new queue's max offset: every pop found nothing
(``OFFSET_OVERFLOW_BADLY`` does not move a cursor) until the new queue passed it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from protocol.codes import RequestCode, ResponseCode
from protocol.headers.admin import CreateTopicRequestHeader, DeleteTopicRequestHeader
from tests.broker.client import BrokerClient, open_broker, open_client
from tests.broker.pop_client import ack, pop
from tests.broker.test_pull_offsets import send

pytestmark = pytest.mark.integration

TIMEOUT = 10
TOPIC = "PullTopic"  # the topic ``send`` writes to (queue 0)
GROUP = "recreate_group"


async def _delete(client: BrokerClient, topic: str) -> None:
    header = DeleteTopicRequestHeader(topic=topic)
    reply = await client.call(RequestCode.DELETE_TOPIC_IN_BROKER, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def _create(client: BrokerClient, topic: str, queues: int) -> None:
    header = CreateTopicRequestHeader(
        topic=topic, default_topic="TBW102", read_queue_nums=queues, write_queue_nums=queues,
        perm=6, topic_filter_type="SINGLE_TAG", order=False,
    )  # fmt: skip
    reply = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def test_pop_group_receives_from_a_deleted_and_recreated_topic(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            for i in range(3):
                await send(client, f"old{i}".encode())
            _, popped = await pop(client, GROUP, TOPIC, queue_id=0)
            assert len(popped) == 3
            await ack(client, GROUP, popped[0])  # the other two stay in flight
            await _delete(client, TOPIC)
            await _create(client, TOPIC, 4)
            await send(client, b"new")
            reply, again = await pop(client, GROUP, TOPIC, queue_id=0)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            assert [(p.msg.body, p.msg.queue_offset) for p in again] == [(b"new", 0)]
            # The leases of the deleted topic went with it: nothing of it is redelivered.
            assert [lease.topic for lease in handle.broker.pop.table.leases.values()] == [TOPIC]


async def test_system_topics_are_not_deleted(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            header = DeleteTopicRequestHeader(topic="TBW102")
            reply = await client.call(RequestCode.DELETE_TOPIC_IN_BROKER, header.to_ext())
    assert reply.code == ResponseCode.NO_PERMISSION
    assert handle.broker.topics.get("TBW102") is not None
