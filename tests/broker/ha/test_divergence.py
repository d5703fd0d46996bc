"""Divergence after a failover (docs/design.md §13, epoch histories): an old master wrote a
tail its replica never got; the replica was promoted (epoch 2) and wrote messages of its own
at the same offsets; the old master comes back as the new master's replica. It cuts its
unreplicated tail at the common point of the two epoch histories — log, consume queues, key
index — and then holds the new master's log byte for byte, across its own restart too.
Real brokers on loopback; every wait is on a condition, bounded."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from broker.app import BrokerHandle
from broker.ha.epoch import EpochEntry
from protocol.codes import ResponseCode
from protocol.properties import UNIQ_KEY
from tests.broker.client import open_client
from tests.broker.ha.support import (
    CATCH_UP_S,
    follower,
    ha_addr,
    log_image,
    open_master,
    open_replica,
    send,
    wait_caught_up,
)
from tests.broker.test_restart import body_for, pull_queue

TOPIC = "Diverged"
QUEUES = 2
TEST_S = 90


async def send_all(broker: BrokerHandle, keys: list[str]) -> None:
    async with open_client(broker.port) as client:
        for i, key in enumerate(keys):
            reply = await send(client, TOPIC, key, body_for(key), i % QUEUES)
            assert reply.code == ResponseCode.SUCCESS, reply.remark


async def served(broker: BrokerHandle) -> list[tuple[int, int, str]]:
    """(queue id, queue offset, key) of every message the broker serves."""
    async with open_client(broker.port) as client:
        return [
            (m.queue_id, m.queue_offset, m.properties[UNIQ_KEY])
            for q in range(QUEUES)
            for m in await pull_queue(client, TOPIC, q)
        ]


async def wait_ha_port(broker: BrokerHandle) -> str:
    """A promoted broker opens its HA port in a task of its own, at once: wait until every
    task is blocked (that one has run)."""
    with trio.fail_after(CATCH_UP_S):
        for _ in range(100):
            if broker.ha_port is not None:
                break
            await trio.testing.wait_all_tasks_blocked()
    return ha_addr(broker)


async def test_an_old_master_cuts_its_unreplicated_tail_and_follows_the_new_one(
    tmp_path: Path,
) -> None:
    old, new = tmp_path / "a", tmp_path / "b"
    shared = [f"shared-{i}" for i in range(10)]
    lost = [f"lost-{i}-{'x' * (i * 37)}" for i in range(5)]  # other sizes than the new ones
    fresh = [f"fresh-{i}" for i in range(7)]
    with trio.fail_after(TEST_S):
        async with open_master(old) as a:
            old_ha = ha_addr(a)
            async with open_replica(new, old_ha) as b:
                await send_all(a, shared)
                await wait_caught_up(a, b)
                common = b.broker.store.log.end
            await send_all(a, lost)  # the replica is gone: this tail reaches nobody
            old_end = a.broker.store.log.end
        assert old_end > common
        # B comes back (its old master is down), is promoted and writes at the same offsets.
        async with open_replica(new, old_ha) as b:
            assert b.broker.roles.promote() == 2
            assert b.broker.roles.epochs.entries == (EpochEntry(1, 0), EpochEntry(2, common))
            await send_all(b, fresh)
            b_ha = await wait_ha_port(b)
            # A comes back as B's replica: it must cut [common, old_end) before appending.
            async with open_replica(old, b_ha) as a:
                await wait_caught_up(b, a)
                stats = follower(a).statistics()
                assert stats.truncated == old_end - common
                assert stats.epoch == 2
                assert log_image(a.broker.store) == log_image(b.broker.store)
                assert a.broker.roles.epochs.entries == b.broker.roles.epochs.entries
                expected = await served(b)
                assert await served(a) == expected
                assert not {key for _, _, key in expected} & set(lost)
                assert len(expected) == len(shared) + len(fresh)
            # Across A's restart (a clean close; the cut stays cut), and B never truncated.
            async with open_replica(old, b_ha) as a:
                await wait_caught_up(b, a)
                assert follower(a).statistics().truncated == 0
                assert log_image(a.broker.store) == log_image(b.broker.store)
                assert await served(a) == expected
            assert b.broker.store.log.end > common
