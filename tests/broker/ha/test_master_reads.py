"""Reads on a sync master (docs/design.md §13, "Reads on a sync master"): consumers are
served only what ``--min-insync-replicas`` copies hold, as a replica's are.

Without the cap, a consumer could read a record that no replica holds yet; a failover then
takes the record back, the new master stores another message at that offset, and the
consumer, whose position has moved past it, skips an acknowledged message. The replica here
is hand-made (it speaks the HA protocol and acknowledges only when told), so each step is
the test's own.
"""

from __future__ import annotations

from pathlib import Path

import trio

from protocol.codes import ResponseCode
from protocol.ha import encode_report
from protocol.message import decode_records
from tests.broker.client import open_client
from tests.broker.ha.support import (
    ha_addr,
    handshake_as_replica,
    open_master,
    open_replica,
    send,
    wait_caught_up,
    wait_replicas,
)
from tests.broker.test_restart import pull_request

TOPIC = "SyncReads"
BOUND_S = 30.0


async def pull_bodies(port: int, offset: int) -> list[bytes]:
    """The bodies a non-suspending pull of queue 0 from ``offset`` gets (none: empty)."""
    async with open_client(port) as client:
        reply = await client.request(pull_request(TOPIC, 0, offset))
    if reply.code != ResponseCode.SUCCESS:
        assert reply.code == ResponseCode.PULL_NOT_FOUND, (reply.code, reply.remark)  # caught up
        return []
    return [record.body for record in decode_records(reply.body)]


async def test_a_record_is_readable_once_min_insync_copies_hold_it(tmp_path: Path) -> None:
    """Sync master, min-insync 2, one replica that acknowledges on demand: the first
    message is readable once acknowledged; the second, stored and waiting for its
    acknowledgement, is not readable (a pull at its offset finds nothing) until the replica
    reports holding it, and then at once."""
    with trio.fail_after(BOUND_S):
        async with open_master(
            tmp_path / "m", replication="sync", min_insync_replicas=2, replica_timeout_ms=20_000
        ) as master:
            host, port = ha_addr(master).rsplit(":", 1)
            replica = await trio.open_tcp_stream(host, int(port))
            await handshake_as_replica(replica, 0)
            await wait_replicas(master, 1)
            store = master.broker.store
            async with open_client(master.port) as client, trio.open_nursery() as nursery:
                answers: list[int] = []

                async def send_one(key: str) -> None:
                    reply = await send(client, TOPIC, key, key.encode(), 0)
                    answers.append(reply.code)

                nursery.start_soon(send_one, "first")
                await master.broker.replicas.wait_until(lambda s: s.waiting == 1)
                assert await pull_bodies(master.port, 0) == []  # stored, held by no replica
                await replica.send_all(encode_report(store.log.end))
                await master.broker.replicas.wait_until(lambda s: s.waiting == 0)
                assert await pull_bodies(master.port, 0) == [b"first"]

                nursery.start_soon(send_one, "second")
                await master.broker.replicas.wait_until(lambda s: s.waiting == 1)
                assert await pull_bodies(master.port, 1) == []
                assert store.read_limit is not None and store.read_limit < store.log.end
                await replica.send_all(encode_report(store.log.end))
                await master.broker.replicas.wait_until(lambda s: s.waiting == 0)
                assert await pull_bodies(master.port, 0) == [b"first", b"second"]
            assert answers == [ResponseCode.SUCCESS, ResponseCode.SUCCESS]
            await replica.aclose()


async def test_a_read_never_passes_what_the_replicas_hold_across_a_failover(
    tmp_path: Path,
) -> None:
    """The skip the cap prevents, end to end: four messages on a sync master and its
    replica B; B goes, a replica that never acknowledges takes its place, and a fifth
    message is stored but held by no replica. A consumer at offset 4 gets nothing (without
    the cap it got the fifth and moved to 5). The master dies; B is promoted and stores two
    acknowledged messages at offsets 4 and 5: the consumer, still at 4, reads both."""
    with trio.fail_after(BOUND_S * 2):
        async with open_master(
            tmp_path / "a", replication="sync", min_insync_replicas=2, replica_timeout_ms=20_000
        ) as master:
            old_ha = ha_addr(master)
            async with open_replica(tmp_path / "b", old_ha) as b:
                async with open_client(master.port) as client:
                    for i in range(4):
                        reply = await send(client, TOPIC, f"k{i}", f"k{i}".encode(), 0)
                        assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
                await wait_caught_up(master, b)
            host, port = old_ha.rsplit(":", 1)
            silent = await trio.open_tcp_stream(host, int(port))
            await handshake_as_replica(silent, master.broker.store.log.end)
            await wait_replicas(master, 1)
            async with open_client(master.port) as client, trio.open_nursery() as nursery:

                async def send_unreplicated() -> None:
                    await send(client, TOPIC, "m", b"m-unreplicated", 0)

                nursery.start_soon(send_unreplicated)
                await master.broker.replicas.wait_until(lambda s: s.waiting == 1)
                assert await pull_bodies(master.port, 4) == []
                nursery.cancel_scope.cancel()  # the master dies with m held by no replica
            await silent.aclose()
        async with open_replica(tmp_path / "b", old_ha) as b:
            b.broker.roles.promote()
            async with open_client(b.port) as client:
                for key in ("n1", "n2"):
                    reply = await send(client, TOPIC, key, key.encode(), 0)
                    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
            # A promoted replica with no replica of its own: no acknowledgements needed.
            assert await pull_bodies(b.port, 4) == [b"n1", b"n2"]
