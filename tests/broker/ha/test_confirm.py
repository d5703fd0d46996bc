"""Reads on a replica never pass the master's confirmed offset (docs/design.md §13): with
sync replication, the end of what ``--min-insync-replicas`` copies hold. A sync master
needs two replica copies; one replica is stalled (a hand-made one that never acknowledges):
the real replica holds the message but does not serve it — not even to a pull parked on
it — until the stalled one acknowledges; then the parked pull is woken and served. The
confirmed offset survives the replica's restart while its master is down. Real brokers on
loopback; every wait is on a condition, bounded."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from broker.app import BrokerHandle
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.ha import encode_report
from protocol.headers.pull import PullMessageRequestHeader, build_pull_sys_flag
from protocol.message import decode_records
from protocol.properties import UNIQ_KEY
from tests.broker.client import open_client
from tests.broker.ha.support import (
    CATCH_UP_S,
    follower,
    ha_addr,
    handshake_as_replica,
    open_master,
    open_replica,
    send,
    wait_caught_up,
    wait_replicas,
)
from tests.broker.test_restart import GROUP, pull_queue

TOPIC = "Confirmed"
TEST_S = 90


def parked_pull(offset: int, hold_ms: int) -> RemotingCommand:
    """PULL_MESSAGE of queue 0 that the broker may hold ``hold_ms`` (long polling)."""
    header = PullMessageRequestHeader(
        consumer_group=GROUP, topic=TOPIC, queue_id=0, queue_offset=offset, max_msg_nums=32,
        sys_flag=build_pull_sys_flag(commit_offset=False, suspend=True, subscription=True),
        commit_offset=0, suspend_timeout_millis=hold_ms, subscription="*", sub_version=0,
    )  # fmt: skip
    return request(RequestCode.PULL_MESSAGE, 0, header.to_ext())


async def drain(stream: trio.abc.Stream) -> None:
    while await stream.receive_some(1 << 16):
        pass


async def test_a_replica_serves_only_what_enough_copies_hold(tmp_path: Path) -> None:
    sync = {"replication": "sync", "min_insync_replicas": 3, "replica_timeout_ms": 300}
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m", **sync) as master:
            stalled = await trio.open_tcp_stream("127.0.0.1", master.ha_port or 0)
            async with (
                stalled,
                open_replica(tmp_path / "r", ha_addr(master)) as replica,
                trio.open_nursery() as nursery,
            ):
                await handshake_as_replica(stalled)  # acknowledges offset 0, then nothing
                nursery.start_soon(drain, stalled)
                await wait_replicas(master, 2)
                async with open_client(master.port) as client:
                    reply = await send(client, TOPIC, "k0", b"k0")
                # One replica copy of the two needed: stored, not confirmed.
                assert reply.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, reply.remark
                await wait_caught_up(master, replica)
                assert replica.broker.store.max_offset(TOPIC, 0) == 1
                assert follower(replica).statistics().confirmed == 0
                async with open_client(replica.port) as client:
                    assert await pull_queue(client, TOPIC, 0) == []
                    # A pull parked on the replica: woken once the offset is confirmed.
                    async with trio.open_nursery() as pulls:
                        answers: list[RemotingCommand] = []

                        async def pull() -> None:
                            answers.append(await client.request(parked_pull(0, 30_000)))

                        pulls.start_soon(pull)
                        await trio.testing.wait_all_tasks_blocked()
                        assert answers == []
                        end = master.broker.store.log.end
                        await stalled.send_all(encode_report(end))
                        await wait_confirmed(replica, end)
                    assert answers[0].code == ResponseCode.SUCCESS, answers[0].remark
                    keys = [m.properties[UNIQ_KEY] for m in decode_records(answers[0].body)]
                    assert keys == ["k0"]
                nursery.cancel_scope.cancel()
        # The master is gone; the replica restarts and still serves what was confirmed.
        async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
            assert follower(replica).statistics().confirmed == end
            async with open_client(replica.port) as client:
                assert [m.body for m in await pull_queue(client, TOPIC, 0)] == [b"k0"]


async def wait_confirmed(replica: BrokerHandle, offset: int) -> None:
    with trio.fail_after(CATCH_UP_S):
        await follower(replica).wait_until(lambda s: s.confirmed >= offset)


async def test_with_async_replication_a_replica_serves_everything_it_holds(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TEST_S):
        async with (
            open_master(tmp_path / "m") as master,
            open_replica(tmp_path / "r", ha_addr(master)) as replica,
        ):
            async with open_client(master.port) as client:
                for i in range(5):
                    assert (await send(client, TOPIC, f"a{i}", b"x")).code == ResponseCode.SUCCESS
            await wait_caught_up(master, replica)
            await wait_confirmed(replica, replica.broker.store.log.end)
            async with open_client(replica.port) as client:
                assert len(await pull_queue(client, TOPIC, 0)) == 5
