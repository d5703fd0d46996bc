"""The metadata a promoted replica needs reaches it over the HA link (RocketMQ's
SlaveSynchronize, docs/design.md §13): topic configs, subscription groups and consumer
offsets made or changed on the master appear on the replica — those from before it
connected at once, later ones within the master's check interval — persisted there, kept
across the replica's restart, and offsets never move back on it. Over real TCP on
loopback; every wait is on a condition, bounded."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import trio

from broker.app import BrokerHandle
from protocol.bodies.subscription import SubscriptionGroupConfig
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.admin import CreateTopicRequestHeader
from protocol.headers.offsets import (
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from tests.broker.client import BrokerClient, open_client
from tests.broker.ha.support import (
    CATCH_UP_S,
    follower,
    ha_addr,
    open_master,
    open_replica,
    send,
)
from tests.broker.pop_client import ack, pop

TOPIC = "MetaTopic"
LATER_TOPIC = "MetaLater"
GROUP = "meta_group"
TEST_S = 90


async def create_topic(client: BrokerClient, topic: str, queues: int) -> None:
    header = CreateTopicRequestHeader(
        topic=topic, default_topic="TBW102", read_queue_nums=queues, write_queue_nums=queues,
        perm=6, topic_filter_type="SINGLE_TAG", order=False,
    )  # fmt: skip
    reply = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def create_group(client: BrokerClient, retry_max_times: int) -> None:
    body = json.dumps(
        {"groupName": GROUP, "consumeMessageOrderly": True, "retryMaxTimes": retry_max_times}
    ).encode()
    reply = await client.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def commit(client: BrokerClient, topic: str, offset: int) -> None:
    header = UpdateConsumerOffsetRequestHeader(
        consumer_group=GROUP, topic=topic, queue_id=0, commit_offset=offset
    )
    reply = await client.call(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def committed(broker: BrokerHandle, topic: str) -> int:
    """The group's offset on queue 0, asked over Remoting."""
    header = QueryConsumerOffsetRequestHeader(consumer_group=GROUP, topic=topic, queue_id=0)
    async with open_client(broker.port) as client:
        reply = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return int(reply.ext_fields["offset"])


async def wait_for(replica: BrokerHandle, check: Callable[[], bool]) -> None:
    """Until ``check`` holds on the replica (re-checked whenever its link applies
    something)."""
    with trio.fail_after(CATCH_UP_S):
        await follower(replica).wait_until(lambda _: check())


def same_metadata(master: BrokerHandle, replica: BrokerHandle) -> bool:
    m, r = master.broker, replica.broker
    return (
        r.topics.all() == m.topics.all()
        and r.groups.snapshot().subscription_group_table
        == m.groups.snapshot().subscription_group_table
        and r.store.offsets.snapshot() == m.store.offsets.snapshot()
    )


def group_of(broker: BrokerHandle) -> SubscriptionGroupConfig | None:
    return broker.broker.groups.get(GROUP)


async def test_topics_groups_and_offsets_reach_the_replica_and_survive_its_restart(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master, open_client(master.port) as client:
            await create_topic(client, TOPIC, 2)
            for i in range(6):
                assert (await send(client, TOPIC, f"k{i}", b"x")).code == ResponseCode.SUCCESS
            await create_group(client, retry_max_times=3)
            await commit(client, TOPIC, 3)
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                # What the master had before the replica came: at connection.
                await wait_for(replica, lambda: same_metadata(master, replica))
                config = replica.broker.topics.get(TOPIC)
                assert config is not None and config.read_queue_nums == 2
                assert await committed(replica, TOPIC) == 3
                # Changes while it follows: within the master's check interval.
                await create_topic(client, LATER_TOPIC, 1)
                await create_group(client, retry_max_times=5)
                await commit(client, TOPIC, 5)
                await wait_for(replica, lambda: same_metadata(master, replica))
                group = group_of(replica)
                assert group is not None and group.retry_max_times == 5
                assert group.consume_message_orderly
                # A commit that moves back on the master never moves the replica back.
                applied = follower(replica).statistics().meta_applied
                await commit(client, TOPIC, 1)
                await wait_for(
                    replica, lambda: follower(replica).statistics().meta_applied > applied
                )
                assert await committed(master, TOPIC) == 1
                assert await committed(replica, TOPIC) == 5
                assert follower(replica).statistics().meta_skipped == 0
                expected = (replica.broker.topics.all(), group_of(replica))
        # The replica restarted without its master: what it was sent is still there.
        async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
            assert (replica.broker.topics.all(), group_of(replica)) == expected
            assert await committed(replica, TOPIC) == 5


async def test_offsets_sent_to_a_replica_stop_at_what_pops_have_in_flight(tmp_path: Path) -> None:
    """A pop moves its group's offset past what it took at once; a replica's copy stays at
    the oldest message not acked yet, so a promoted replica delivers it again."""
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master, open_client(master.port) as client:
            for i in range(4):
                assert (await send(client, TOPIC, f"k{i}", b"x")).code == ResponseCode.SUCCESS
            _, popped = await pop(client, GROUP, TOPIC, queue_id=0, max_nums=4)
            assert len(popped) == 4
            assert (await ack(client, GROUP, popped[0])).code == ResponseCode.SUCCESS
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                await wait_for(replica, lambda: replica.broker.topics.get(TOPIC) is not None)
                await wait_for(replica, lambda: offset_on(replica) is not None)
                assert await committed(master, TOPIC) == 4
                assert offset_on(replica) == 1  # popped[1] is the oldest in flight
                for p in popped[1:]:
                    assert (await ack(client, GROUP, p)).code == ResponseCode.SUCCESS
                await wait_for(replica, lambda: offset_on(replica) == 4)


def offset_on(replica: BrokerHandle) -> int | None:
    return replica.broker.store.offsets.query(GROUP, TOPIC, 0)
