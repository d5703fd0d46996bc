"""Automatic failover through etcd (docs/ha.md), with a real 3-member etcd cluster on
loopback and real brokers: a master killed with ``kill -9`` is replaced by an in-sync
replica (every SEND_OK message on the new master, the takeover time measured and
printed); a master that cannot renew its lease is fenced (writes refused); a master frozen
past its lease refuses writes the moment it runs again, while the new master takes them;
an out-of-sync replica never campaigns.

Times are measured and bounded generously (a busy 2-core machine): the aim, a takeover
within the lease TTL + about 1 s, is recorded (``-s`` prints it), not asserted tightly.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from broker.app import BrokerHandle
from broker.ha.election import FENCED_REFUSAL, Election, Keys, read_insync
from broker.ha.etcd import EtcdClient, parse_endpoints
from protocol.codes import ResponseCode
from protocol.headers.send import SendMessageResponseHeader
from tests.broker.client import open_broker, open_client
from tests.broker.ha.etcd_cluster import EtcdCluster, etcd_cluster, requires_etcd
from tests.broker.ha.support import NAME, send
from tests.broker.test_process import BrokerProcess
from tests.broker.test_process import run_broker as run_process_broker
from tests.broker.test_restart import body_for, kill9, pull_queue
from tests.namesrv.support import open_namesrv, route_of, wait_until

__all__ = ["etcd_cluster"]

pytestmark = requires_etcd

TOPIC = "Failover"
QUEUES = 4
TTL_S = 3
CLUSTER = "DefaultCluster"
#: Upper bound of every wait here (loopback, but a loaded 2-core machine).
BOUND_S = 60.0
#: Where measured takeover times are appended (read by docs/ha.md's figures), if set.
TIMES_FILE = os.environ.get("TRIMQ_FAILOVER_TIMES")


def election(handle: BrokerHandle) -> Election:
    assert handle.election is not None
    return handle.election


def record_time(what: str, seconds: float) -> None:
    print(f"\n{what}: {seconds:.2f} s")
    if TIMES_FILE:
        with open(TIMES_FILE, "a") as f:
            f.write(json.dumps({"what": what, "s": round(seconds, 3)}) + "\n")


@asynccontextmanager
async def open_member(
    data_dir: Path, cluster: EtcdCluster, broker_id: int, **settings: Any
) -> AsyncIterator[BrokerHandle]:
    """An in-process broker of group :data:`NAME` taking part in the etcd election."""
    async with open_broker(
        data_dir,
        broker_name=NAME,
        broker_id=broker_id,
        etcd_endpoints=cluster.endpoints,
        etcd_lease_ttl_s=TTL_S,
        **settings,
    ) as handle:
        yield handle


async def insync_members(client: EtcdClient) -> frozenset[int]:
    found = await read_insync(client, Keys(CLUSTER, NAME))
    return frozenset() if found is None else found.members


async def wait_insync(client: EtcdClient, members: set[int]) -> None:
    # etcd is another process: its keys can only be read again (bounded by fail_after).
    with trio.fail_after(BOUND_S):
        for _ in itertools.count():
            if members <= await insync_members(client):
                return
            await trio.sleep(0.1)


async def send_until_ok(port: int, key: str) -> None:
    """Send ``key`` until SEND_OK (bounded by the caller): a new master answers once its
    replicas are in sync again."""
    async with open_client(port) as client:
        for _ in itertools.count():
            reply = await send(client, TOPIC, key, body_for(key))
            if reply.code == ResponseCode.SUCCESS:
                return
            await trio.sleep(0.05)


async def produce(port: int, label: str, acked: dict[str, tuple[int, int]], count: int) -> None:
    async with open_client(port) as client:
        for i in range(count):
            key = f"{label}-{i}"
            reply = await send(client, TOPIC, key, body_for(key), i % QUEUES)
            assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
            answer = SendMessageResponseHeader.from_ext(reply.ext_fields)
            acked[key] = (answer.queue_id, answer.queue_offset)


async def stored_keys(port: int) -> dict[str, tuple[int, int]]:
    async with open_client(port) as client:
        messages = [m for q in range(QUEUES) for m in await pull_queue(client, TOPIC, q)]
    return {m.properties["UNIQ_KEY"]: (m.queue_id, m.queue_offset) for m in messages}


@asynccontextmanager
async def process_master(
    data_dir: Path, cluster: EtcdCluster, *args: str
) -> AsyncIterator[BrokerProcess]:
    async with run_process_broker(
        data_dir, "--host", "127.0.0.1", "--broker-name", NAME, "--ha-port", "0",
        "--etcd-endpoints", cluster.endpoints, "--etcd-lease-ttl-s", str(TTL_S), *args,
        register_interval_s=0.5,
    ) as master:  # fmt: skip
        yield master


async def wait_elected(handles: list[BrokerHandle]) -> BrokerHandle:
    """The one of ``handles`` that became master (bounded by the caller)."""
    while True:  # bounded by the caller's deadline
        won = [h for h in handles if election(h).stats.master_epoch > 0]
        if won:
            assert len(won) == 1, "two masters elected"
            return won[0]
        await trio.sleep(0.02)


# ---------------------------------------------------------------- kill -9 of the master
async def test_master_killed_an_in_sync_replica_takes_over(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    """A sync master (min-insync 2) with two replicas; 200 SEND_OKs; kill -9. One
    replica is elected with a newer epoch, the other follows it; every SEND_OK message is
    on the new master at its queue and offset; the new master takes writes."""
    client = EtcdClient(parse_endpoints(etcd_cluster.endpoints))
    sync = ("--replication", "sync", "--min-insync-replicas", "2")
    with trio.fail_after(BOUND_S * 3):
        async with process_master(tmp_path / "m", etcd_cluster, *sync) as master:
            r_settings: dict[str, Any] = {"replication": "sync", "min_insync_replicas": 2}
            async with (
                open_member(tmp_path / "r1", etcd_cluster, 1, **r_settings) as r1,
                open_member(tmp_path / "r2", etcd_cluster, 2, **r_settings) as r2,
            ):
                await wait_insync(client, {0, 1, 2})
                first = await client.get(Keys(CLUSTER, NAME).master)
                assert first is not None
                acked: dict[str, tuple[int, int]] = {}
                async with trio.open_nursery() as nursery:
                    for n in range(4):
                        nursery.start_soon(produce, master.port, f"p{n}", acked, 50)
                await wait_insync(client, {0, 1, 2})
                killed = trio.current_time()
                await kill9(master)
                new = await wait_elected([r1, r2])
                took = trio.current_time() - killed
                record_time("takeover after kill -9 (lease TTL 3 s)", took)
                other = r2 if new is r1 else r1
                assert new.broker.roles.epochs.current == election(new).stats.master_epoch
                assert election(new).stats.master_epoch > first.create_revision
                await send_until_ok(new.port, "after-failover")
                unavailable = trio.current_time() - killed
                record_time("kill -9 to first SEND_OK on the new master", unavailable)
                stored = await stored_keys(new.port)
                missing = sorted(set(acked) - set(stored))
                assert not missing, f"{len(missing)} of {len(acked)} SEND_OK lost: {missing[:5]}"
                for key, where in acked.items():
                    assert stored[key] == where, key
                # The other replica follows the new master under its epoch.
                leader = election(other).leader
                assert leader is not None
                assert leader.epoch == election(new).stats.master_epoch
                assert other.broker.roles.epochs.current >= election(new).stats.master_epoch
                # Generous: the aim is TTL + ~1 s; a loaded machine may take longer.
                assert took < TTL_S + 20


# ---------------------------------------------------------------- fencing
async def test_a_master_that_cannot_renew_is_fenced(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    """A master takes writes while it holds its lease; once etcd loses its quorum (2 of 3
    members killed) it cannot renew, and within TTL/2 of its last renewal it refuses every
    write with SERVICE_NOT_AVAILABLE, then steps down."""
    with trio.fail_after(BOUND_S * 2):
        async with open_member(tmp_path / "m", etcd_cluster, 0) as master:
            with trio.fail_after(BOUND_S):
                await election(master).wait_until(lambda s: s.master_epoch > 0)
            await send_until_ok(master.port, "before")
            etcd_cluster.kill_member(0)
            etcd_cluster.kill_member(1)
            lost = trio.current_time()
            with trio.fail_after(BOUND_S):
                await election(master).wait_until(lambda s: s.fenced)
            record_time("fenced after quorum loss (TTL/2 = 1.5 s aim)", trio.current_time() - lost)
            async with open_client(master.port) as client:
                reply = await send(client, TOPIC, "after", b"after")
            assert reply.code == ResponseCode.SERVICE_NOT_AVAILABLE, reply.code
            assert reply.remark == FENCED_REFUSAL
            with trio.fail_after(BOUND_S):
                await election(master).wait_until(lambda s: s.step_downs == 1)


async def test_a_frozen_master_refuses_writes_when_it_runs_again(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    """SIGSTOP of the master longer than its lease: a replica takes over. On SIGCONT the
    old master refuses writes at once (its fence is a deadline, not a timer), while the
    new master takes them: never two masters accepting writes."""
    with trio.fail_after(BOUND_S * 3):
        async with (
            process_master(tmp_path / "m", etcd_cluster) as master,
            open_member(tmp_path / "r1", etcd_cluster, 1) as r1,
        ):
            client = EtcdClient(parse_endpoints(etcd_cluster.endpoints))
            await wait_insync(client, {0, 1})
            await send_until_ok(master.port, "before")
            master.process.send_signal(signal.SIGSTOP)
            try:
                stopped = trio.current_time()
                with trio.fail_after(BOUND_S):
                    await election(r1).wait_until(lambda s: s.master_epoch > 0)
                record_time("takeover from a frozen master", trio.current_time() - stopped)
                await send_until_ok(r1.port, "new-master")
            finally:
                master.process.send_signal(signal.SIGCONT)
            async with open_client(master.port) as old:
                reply = await send(old, TOPIC, "old-master", b"old")
            assert reply.code == ResponseCode.SERVICE_NOT_AVAILABLE, reply.code
            assert "fenced" in (reply.remark or "")
            # The old master stays out: the key is the new master's.
            kv = await client.get(Keys(CLUSTER, NAME).master)
            assert kv is not None and kv.create_revision == election(r1).stats.master_epoch


# ---------------------------------------------------------------- no unclean election
async def test_an_out_of_sync_replica_does_not_campaign(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    """The in-sync set shrinks to the master alone while its replica is away; the master
    stops; the replica comes back, finds no master, and is not in the set: it never
    campaigns, and the group stays without a master (no unclean election)."""
    client = EtcdClient(parse_endpoints(etcd_cluster.endpoints))
    with trio.fail_after(BOUND_S * 3):
        async with open_member(tmp_path / "m", etcd_cluster, 0) as master:
            async with open_member(tmp_path / "r1", etcd_cluster, 1):
                await wait_insync(client, {0, 1})
                await send_until_ok(master.port, "while-in-sync")
            with trio.fail_after(BOUND_S):
                for _ in itertools.count():
                    if await insync_members(client) == {0}:
                        break
                    await trio.sleep(0.1)
            await send_until_ok(master.port, "only-on-the-master")
        assert await client.get(Keys(CLUSTER, NAME).master) is None  # revoked on stop
        async with open_member(tmp_path / "r1", etcd_cluster, 1) as replica:
            # Long enough for a lease to lapse and several polls; the claim is "never".
            await trio.sleep(TTL_S + 2)
            assert election(replica).stats.campaigns == 0
            assert election(replica).stats.master_epoch == 0
            assert await client.get(Keys(CLUSTER, NAME).master) is None


# ---------------------------------------------------------------- the name server
async def test_the_name_server_follows_the_elected_master(
    etcd_cluster: EtcdCluster, tmp_path: Path
) -> None:
    """Brokers register with their epoch: after a takeover the route's brokerId 0 is the
    new master, and the old master (frozen, then running again) is refused when it
    registers again with its older epoch — the route keeps the new one."""
    fast = {"register_interval_s": 0.5}
    async with open_namesrv() as ns:
        namesrv = f"127.0.0.1:{ns.port}"
        with trio.fail_after(BOUND_S * 3):
            async with (
                process_master(tmp_path / "m", etcd_cluster, "--namesrv-addr", namesrv) as master,
                open_member(tmp_path / "r1", etcd_cluster, 1, namesrv_addr=namesrv, **fast) as r1,
            ):
                client = EtcdClient(parse_endpoints(etcd_cluster.endpoints))
                await wait_insync(client, {0, 1})
                await send_until_ok(master.port, "before")

                async def master_is(address: str) -> bool:
                    route = await route_of(ns.port, TOPIC)
                    return (
                        route is not None and route.broker_datas[0].broker_addrs.get(0) == address
                    )

                # The topic reaches the name server with the master's next registration.
                await wait_until(lambda: master_is(f"127.0.0.1:{master.port}"), BOUND_S)

                async def epoch_known() -> bool:  # the elected master registers it
                    return (ns.ctx.routes.master_epoch(NAME) or 0) > 0

                await wait_until(epoch_known, BOUND_S)
                old_epoch = ns.ctx.routes.master_epoch(NAME) or 0
                master.process.send_signal(signal.SIGSTOP)
                try:
                    with trio.fail_after(BOUND_S):
                        await election(r1).wait_until(lambda s: s.master_epoch > 0)
                    await wait_until(lambda: master_is(r1.address), BOUND_S)
                finally:
                    master.process.send_signal(signal.SIGCONT)
                new_epoch = election(r1).stats.master_epoch
                assert ns.ctx.routes.master_epoch(NAME) == new_epoch > old_epoch
                # The old master registers every 0.5 s: refused each time (its epoch is older).
                refused = 0
                with trio.fail_after(BOUND_S):
                    while refused == 0:  # bounded by fail_after
                        await trio.sleep(0.5)
                        refused = sum(
                            1
                            for line in master.lines
                            if line.get("event") == "register with namesrv failed"
                        )
                assert await master_is(r1.address)
