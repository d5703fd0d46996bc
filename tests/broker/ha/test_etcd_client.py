"""The trio client of etcd's JSON gateway (broker/ha/etcd.py) against a real 3-member
cluster on loopback: leases, txn compare-and-set, range, failover between members, and no
lease without a quorum."""

from __future__ import annotations

import trio

from broker.ha.etcd import EtcdClient, EtcdTimeouts, EtcdUnavailable, parse_endpoints
from protocol.etcd import Compare, Get, Put, Target
from tests.broker.ha.etcd_cluster import EtcdCluster, etcd_cluster, requires_etcd

__all__ = ["etcd_cluster"]

pytestmark = requires_etcd


async def test_lease_txn_range(etcd_cluster: EtcdCluster) -> None:
    client = EtcdClient(parse_endpoints(etcd_cluster.endpoints))
    granted = await client.lease_grant(3)
    assert granted.lease_id != 0 and granted.ttl_s >= 3
    key = b"/trimq/test/b/master"
    created = await client.txn(
        [Compare(key, Target.CREATE, 0)], [Put(key, b"me", granted.lease_id)], [Get(key)]
    )
    assert created.succeeded
    # The create revision is the txn's revision: what the election uses as the epoch.
    kv = await client.get(key)
    assert kv is not None and kv.value == b"me" and kv.lease == granted.lease_id
    assert kv.create_revision == created.revision
    again = await client.txn([Compare(key, Target.CREATE, 0)], [Put(key, b"other")], [Get(key)])
    assert not again.succeeded and again.ranges[0].kvs[0].value == b"me"
    assert await client.lease_keepalive(granted.lease_id) >= 1
    under = await client.range(b"/trimq/test/", prefix=True)
    assert [k.key for k in under.kvs] == [key]
    await client.lease_revoke(granted.lease_id)
    assert await client.get(key) is None  # the key went with its lease
    assert await client.lease_keepalive(granted.lease_id) == 0
    await client.lease_revoke(granted.lease_id)  # already gone: no error


async def test_fails_over_to_another_member(etcd_cluster: EtcdCluster) -> None:
    client = EtcdClient(parse_endpoints(etcd_cluster.endpoints))
    await client.txn([], [Put(b"/k", b"1")])
    etcd_cluster.kill_member(0)
    with trio.fail_after(30):  # generous: a new etcd leader may have to be elected first
        while True:  # bounded by fail_after
            try:
                kv = await client.get(b"/k")
                break
            except EtcdUnavailable:
                await trio.sleep(0.2)
    assert kv is not None and kv.value == b"1"
    assert client.failovers >= 1


async def test_no_lease_without_a_quorum(etcd_cluster: EtcdCluster) -> None:
    client = EtcdClient(
        parse_endpoints(etcd_cluster.endpoints), EtcdTimeouts(attempt_s=0.5, call_s=2.0)
    )
    etcd_cluster.kill_member(0)
    etcd_cluster.kill_member(1)
    started = trio.current_time()
    try:
        await client.lease_grant(3)
    except EtcdUnavailable:
        pass
    else:
        raise AssertionError("a lease was granted by one member of three")
    assert trio.current_time() - started < 30  # bounded by the call's timeout
