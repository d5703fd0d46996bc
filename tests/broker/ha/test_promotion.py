"""Manual promotion (docs/design.md §13): a sync master and its replica behind a name
server; messages acknowledged SEND_OK, offsets committed; the master stopped; the replica
promoted with ``trimq-admin promoteReplica``. The new master registers as brokerId 0 under
epoch 2 (persisted), serves every acknowledged message and the committed offsets, takes
sends from a producer that found it through the name server, and refuses a second
promotion; the admin-only code needs an admin under ACL. Real TCP on loopback; every wait
is on a condition, bounded."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import trio

from broker.app import BrokerHandle
from broker.ha.epoch import EpochHistory
from client.admin import main as admin_main
from client.config import ClientConfig
from client.message import Message, SendStatus
from client.producer import Producer
from protocol.acl.decide import ADMIN_CODES
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.headers.offsets import QueryConsumerOffsetRequestHeader
from protocol.properties import TIMER_DELAY_MS, UNIQ_KEY
from tests.broker.client import open_client
from tests.broker.ha.support import (
    CATCH_UP_S,
    NAME,
    follower,
    ha_addr,
    open_master,
    open_replica,
    send,
    wait_caught_up,
    wait_replicas,
)
from tests.broker.ha.test_metadata import GROUP, commit, wait_for
from tests.broker.test_acl import ACL, expect_refused, signed, write_acl
from tests.broker.test_restart import body_for, pull_queue
from tests.namesrv.support import open_namesrv, route_of, wait_until

TOPIC = "Promoted"
DELAYED = "PromotedLater"
QUEUES = 4
TEST_S = 120


async def promote_with_the_cli(ns: str, address: str, *extra: str) -> tuple[int, str]:
    """``trimq-admin -n NS --json promoteReplica -b ADDRESS``: its exit code and stdout (in a
    thread: the CLI runs its own event loop)."""
    out = io.StringIO()

    def run() -> int:
        with contextlib.redirect_stdout(out):
            return admin_main(["-n", ns, "--json", *extra, "promoteReplica", "-b", address])

    code = await trio.to_thread.run_sync(run)
    return code, out.getvalue()


async def offset_of(broker: BrokerHandle, queue_id: int) -> int:
    header = QueryConsumerOffsetRequestHeader(consumer_group=GROUP, topic=TOPIC, queue_id=queue_id)
    async with open_client(broker.port) as client:
        reply = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return int(reply.ext_fields["offset"])


async def run_master(
    data_dir: Path,
    ns: str,
    stop: trio.Event,
    *,
    task_status: trio.TaskStatus[BrokerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A sync master (min-insync 2) in a task of its own, so that it can stop while the
    replica started after it goes on."""
    settings = {"namesrv_addr": ns, "replication": "sync", "min_insync_replicas": 2}
    async with open_master(data_dir, **settings) as master:
        task_status.started(master)
        await stop.wait()


async def test_a_promoted_replica_serves_everything_acknowledged_and_takes_sends(
    tmp_path: Path,
) -> None:
    acked: dict[str, tuple[int, int]] = {}
    with trio.fail_after(TEST_S):
        async with open_namesrv() as namesrv, trio.open_nursery() as nursery:
            ns = f"127.0.0.1:{namesrv.port}"
            stop_master = trio.Event()
            master: BrokerHandle = await nursery.start(run_master, tmp_path / "m", ns, stop_master)
            async with open_replica(tmp_path / "r", None, namesrv_addr=ns) as replica:
                await wait_replicas(master, 1)
                async with open_client(master.port) as client:
                    for i in range(40):
                        key = f"k{i}"
                        reply = await send(client, TOPIC, key, body_for(key), i % QUEUES)
                        assert reply.code == ResponseCode.SUCCESS, reply.remark
                        acked[key] = (i % QUEUES, int(reply.ext_fields["queueOffset"]))
                    await commit(client, TOPIC, 3)
                await wait_for(
                    replica, lambda: replica.broker.store.offsets.query(GROUP, TOPIC, 0) == 3
                )
                async with open_client(master.port) as client:
                    # Due soon: delivered by the master before it stops, or by the promoted
                    # replica after — exactly once either way.
                    delayed = await send(
                        client, DELAYED, "late", b"late", 0, {TIMER_DELAY_MS: "2500"}
                    )
                    assert delayed.code == ResponseCode.SUCCESS, delayed.remark
                stop_master.set()  # a clean stop: it unregisters from the name server
                await wait_for(replica, lambda: not follower(replica).statistics().connected)
                # The master is gone (stopped: it unregistered). Promote the replica.
                code, out = await promote_with_the_cli(ns, replica.address)
                assert code == 0, out
                assert json.loads(out) == {"brokerAddr": replica.address, "epoch": 2}
                durable = EpochHistory(tmp_path / "r" / "config" / "haEpoch", master=False)
                assert durable.current == 2
                # Epoch 2 starts where the replicated log ended (a timer may have written since).
                assert durable.entries[-1].epoch == 2
                assert durable.entries[-1].start <= replica.broker.store.log.end
                assert not replica.broker.roles.is_replica

                async def master_is_the_replica() -> bool:
                    route = await route_of(namesrv.port, TOPIC)
                    if route is None:
                        return False
                    addrs = {b.broker_name: b.broker_addrs for b in route.broker_datas}
                    return addrs.get(NAME) == {0: replica.address}

                await wait_until(master_is_the_replica, CATCH_UP_S)
                await check_everything_acknowledged_is_served(replica, acked)
                assert await offset_of(replica, 0) == 3
                await wait_for_delivery(replica)
                # A producer finds the new master through the name server and sends to it.
                config = ClientConfig(namesrv_addr=ns, request_timeout=5.0, backoff_initial=0.01)
                async with Producer(config) as producer:
                    receipt = await producer.send(Message(TOPIC, b"after promotion"))
                assert receipt.status is SendStatus.SEND_OK
                assert receipt.queue.broker_name == NAME
                # Once is enough: a master is refused.
                again, _ = await promote_with_the_cli(ns, replica.address)
                assert again == 1
                assert replica.broker.roles.epochs.current == 2
                assert replica.ha_port is not None


async def wait_for_delivery(broker: BrokerHandle) -> None:
    """Until the delayed message is in its topic (re-checked as the store grows); then it
    must be there once."""
    store = broker.broker.store
    with trio.fail_after(CATCH_UP_S):
        while store.max_offset(DELAYED, 0) < 1:  # no await between the check and the park
            await broker.broker.pull_hub.wait(DELAYED, 0, None, trio.current_time() + CATCH_UP_S)
    async with open_client(broker.port) as client:
        assert [m.body for m in await pull_queue(client, DELAYED, 0)] == [b"late"]


async def check_everything_acknowledged_is_served(
    broker: BrokerHandle, acked: dict[str, tuple[int, int]]
) -> None:
    async with open_client(broker.port) as client:
        served = {
            m.properties[UNIQ_KEY]: m
            for q in range(QUEUES)
            for m in await pull_queue(client, TOPIC, q)
        }
    missing = sorted(set(acked) - set(served))
    assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:5]}"
    for key, (queue_id, queue_offset) in acked.items():
        assert (served[key].queue_id, served[key].queue_offset) == (queue_id, queue_offset)
        assert served[key].body == body_for(key)


async def test_promotion_is_admin_only_and_a_master_refuses_it(tmp_path: Path) -> None:
    assert RequestCode.PROMOTE_REPLICA in ADMIN_CODES
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master, open_client(master.port) as client:
            reply = await client.call(RequestCode.PROMOTE_REPLICA, {})
            assert reply.code == ResponseCode.ILLEGAL_OPERATION, reply.remark
            assert "master already" in (reply.remark or "")
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                await wait_caught_up(master, replica)
                assert replica.broker.roles.is_replica


async def test_another_replica_follows_the_promoted_one_under_the_new_epoch(
    tmp_path: Path,
) -> None:
    """Two replicas behind a name server; the master stops; one replica is promoted. The
    other learns the new master's HA address from its next registration's reply, follows
    it under epoch 2 from where its own log ends, and copies what the new master stores."""
    fast = {"register_interval_s": 0.2}
    with trio.fail_after(TEST_S):
        async with open_namesrv() as namesrv, trio.open_nursery() as nursery:
            ns = f"127.0.0.1:{namesrv.port}"
            stop_master = trio.Event()
            master: BrokerHandle = await nursery.start(run_master, tmp_path / "m", ns, stop_master)
            async with (
                open_replica(tmp_path / "r1", None, 1, namesrv_addr=ns, **fast) as first,
                open_replica(tmp_path / "r2", None, 2, namesrv_addr=ns, **fast) as second,
            ):
                await wait_replicas(master, 2)
                async with open_client(master.port) as client:
                    for i in range(10):
                        reply = await send(client, TOPIC, f"k{i}", body_for(f"k{i}"), i % QUEUES)
                        assert reply.code == ResponseCode.SUCCESS, reply.remark
                await wait_caught_up(master, second)
                stop_master.set()
                await wait_for(first, lambda: not follower(first).statistics().connected)
                assert first.broker.roles.promote() == 2
                async with open_client(first.port) as client:
                    for i in range(10, 20):
                        reply = await send(client, TOPIC, f"k{i}", body_for(f"k{i}"), i % QUEUES)
                        assert reply.code == ResponseCode.SUCCESS, reply.remark
                await wait_caught_up(first, second)
                assert follower(second).statistics().epoch == 2
                assert second.registrar is not None
                assert second.registrar.master_ha_address == f"127.0.0.1:{first.ha_port}"
                async with open_client(second.port) as client:
                    keys = {
                        m.properties[UNIQ_KEY]
                        for q in range(QUEUES)
                        for m in await pull_queue(client, TOPIC, q)
                    }
                assert keys == {f"k{i}" for i in range(20)}


async def test_under_acl_only_an_admin_may_promote(tmp_path: Path) -> None:
    acl = write_acl(tmp_path / "plain_acl.yml", ACL)
    promote = request(RequestCode.PROMOTE_REPLICA, 0, {})
    with trio.fail_after(TEST_S):
        async with (
            open_master(tmp_path / "m") as master,
            open_replica(tmp_path / "r", ha_addr(master), acl_file=acl) as replica,
            open_client(replica.port) as client,
        ):
            await expect_refused(client, signed(promote, "producer1"), "'producer1' is not admin")
            assert replica.broker.roles.is_replica
            reply = await client.request(signed(promote, "admin001"))
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            assert reply.ext_fields["epoch"] == "2"
            assert not replica.broker.roles.is_replica
