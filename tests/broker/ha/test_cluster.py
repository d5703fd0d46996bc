"""Replication with its surroundings: the name server keeps a master and its replica side by
side and tells the replica where the master's HA port is; gRPC sends get the same sync
rule; and ``kill -9`` of a master process after sync SEND_OKs loses none of them on the
replica (docs/design.md §13)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import trio

from broker.app import BrokerHandle
from protocol.codes import ResponseCode
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.headers.send import SendMessageResponseHeader
from protocol.message import MessageExt
from protocol.properties import UNIQ_KEY
from tests.broker.client import ConnectionClosedError, open_client
from tests.broker.grpc.client import open_grpc_client, send_request
from tests.broker.ha.support import (
    CATCH_UP_S,
    NAME,
    ha_addr,
    open_master,
    open_replica,
    send,
    wait_caught_up,
    wait_replicas,
)
from tests.broker.test_process import run_broker as run_process_broker
from tests.broker.test_restart import body_for, kill9, pull_queue
from tests.namesrv.support import open_namesrv, route_of, wait_until

TOPIC = "Replicated"
QUEUES = 4
TEST_S = 90


async def test_a_replica_registers_as_broker_id_1_and_finds_its_master_through_the_name_server(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TEST_S):
        async with open_namesrv() as namesrv:
            ns = f"127.0.0.1:{namesrv.port}"
            async with open_master(tmp_path / "m", namesrv_addr=ns) as master:
                async with open_client(master.port) as client:
                    reply = await send(client, TOPIC, "k0", body_for("k0"))
                    assert reply.code == ResponseCode.SUCCESS
                # No --ha-master-addr: the registration's reply names the master's HA port.
                async with open_replica(tmp_path / "r", None, namesrv_addr=ns) as replica:
                    await wait_caught_up(master, replica)
                    assert replica.registrar is not None
                    assert replica.registrar.master_ha_address == ha_addr(master)

                    async def both_listed() -> bool:
                        route = await route_of(namesrv.port, TOPIC)
                        if route is None:
                            return False
                        addrs = {b.broker_name: b.broker_addrs for b in route.broker_datas}
                        return addrs.get(NAME) == {0: master.address, 1: replica.address}

                    await wait_until(both_listed, CATCH_UP_S)


async def test_grpc_sends_get_the_sync_replication_rule(tmp_path: Path) -> None:
    with trio.fail_after(TEST_S):
        async with (
            open_master(tmp_path / "m", replication="sync", min_insync_replicas=2) as master,
            open_grpc_client(master.grpc_port) as client,
        ):
            alone = await client.unary("SendMessage", send_request(TOPIC, b"alone"))
            assert alone.one(schema.SendMessageResponse).status.code == Code.HA_NOT_AVAILABLE
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                await wait_replicas(master, 1)
                paired = await client.unary("SendMessage", send_request(TOPIC, b"paired"))
                answer = paired.one(schema.SendMessageResponse)
                assert answer.status.code == Code.OK, answer
                assert replica.broker.store.log.end >= master.broker.store.log.end


# ---------------------------------------------------------------- kill -9 of the master
async def produce(
    port: int, label: str, acked: dict[str, tuple[int, int]], enough: trio.Event, want: int
) -> None:
    """Send unique keys one at a time until the connection dies; record every SEND_OK."""
    rng = random.Random(label)
    async with open_client(port) as client:
        for i in itertools.count():
            key = f"{label}-{i}"
            try:
                reply = await send(client, TOPIC, key, body_for(key), rng.randrange(QUEUES))
            except (ConnectionClosedError, trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the master was killed
            if reply.code == ResponseCode.SUCCESS:
                answer = SendMessageResponseHeader.from_ext(reply.ext_fields)
                acked[key] = (answer.queue_id, answer.queue_offset)
                if len(acked) >= want:
                    enough.set()


async def pulled_from(replica: BrokerHandle) -> dict[str, MessageExt]:
    async with open_client(replica.port) as client:
        messages = [m for q in range(QUEUES) for m in await pull_queue(client, TOPIC, q)]
    return {m.properties[UNIQ_KEY]: m for m in messages}


async def test_kill9_of_a_sync_master_loses_no_acknowledged_message_on_the_replica(
    tmp_path: Path,
) -> None:
    """A master process in sync mode (min-insync 2) takes 8 concurrent producers; it is
    SIGKILLed with sends in flight. Every message it answered SEND_OK is on the replica,
    at the queue and offset the answer gave, byte for byte."""
    acked: dict[str, tuple[int, int]] = {}
    with trio.fail_after(TEST_S):
        async with run_process_broker(
            tmp_path / "m", "--host", "127.0.0.1", "--broker-name", NAME, "--replication", "sync",
            "--min-insync-replicas", "2", "--ha-port", "0",
        ) as master:  # fmt: skip
            started = master.find("broker started")
            assert started is not None and started["ha_port"]
            async with open_replica(tmp_path / "r", f"127.0.0.1:{started['ha_port']}") as replica:
                await first_send_ok(master.port)
                enough = trio.Event()
                async with trio.open_nursery() as nursery:
                    for n in range(8):
                        nursery.start_soon(produce, master.port, f"p{n}", acked, enough, 400)
                    await enough.wait()
                    await kill9(master)
                # The last acknowledged messages are on the replica; its reads stop at the
                # confirmed offset it heard last (which may lag the kill by one round trip)
                # until it is promoted: then everything it holds is served.
                replica.broker.roles.promote()
                stored = await pulled_from(replica)
                missing = sorted(set(acked) - set(stored))
                assert not missing, (
                    f"{len(missing)} of {len(acked)} acknowledged lost: {missing[:5]}"
                )
                for key, where in acked.items():
                    m = stored[key]
                    assert (m.queue_id, m.queue_offset) == where, key
                    assert m.body == body_for(key)
                assert len(acked) >= 400


async def first_send_ok(port: int) -> None:
    """Wait until the master answers SEND_OK (its replica is connected and acknowledging;
    until then a sync send is SLAVE_NOT_AVAILABLE). The master is another process: its
    state can only be asked again (bounded by the caller's deadline)."""
    async with open_client(port) as client:
        for i in itertools.count():
            key = f"first-{i}"
            if (await send(client, TOPIC, key, body_for(key))).code == ResponseCode.SUCCESS:
                return
            await trio.sleep(0.05)
