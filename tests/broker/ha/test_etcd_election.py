"""The election's rules (broker/ha/election.py) against an in-memory etcd, on trio's mock
clock: deterministic to the millisecond, no processes. The same rules run against a real
etcd in test_etcd_failover.py; here the timings can be asserted exactly.

- the longest in-sync log wins, whichever replica looks first;
- a replica outside the in-sync set never campaigns (no unclean election);
- a fresh group is started by broker id 0 only;
- the fence closes exactly TTL/2 after the sending of the last renewal etcd confirmed, and
  the master steps down once nothing renewed its lease for a whole TTL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from broker.ha.acks import ReplicaSet, ReplicationPolicy
from broker.ha.election import (
    FENCED_REFUSAL,
    Election,
    ElectionSettings,
    InSyncSet,
    Keys,
    MasterRecord,
)
from broker.ha.etcd import EtcdClient, EtcdUnavailable
from protocol.etcd import (
    Compare,
    Delete,
    EtcdError,
    Get,
    KeyValue,
    LeaseGranted,
    Operation,
    Put,
    RangeResult,
    Target,
    TxnResult,
    prefix_end,
)

CLUSTER, NAME = "c", "g"
KEYS = Keys(CLUSTER, NAME)


@dataclass
class FakeEtcd(EtcdClient):
    """etcd's data model in memory: revisions, leases that expire on trio's clock, txns.
    ``down`` makes every call fail as a cluster without quorum does."""

    kvs: dict[bytes, KeyValue] = field(default_factory=dict)
    leases: dict[int, tuple[int, float]] = field(default_factory=dict)
    revision: int = 1
    down: bool = False
    #: When each keepalive that etcd confirmed was called.
    renewals: list[float] = field(default_factory=list)
    _next_lease: int = 100

    def __post_init__(self) -> None:
        super().__init__(["fake:2379"])

    def _tick(self) -> None:
        if self.down:
            raise EtcdUnavailable("no quorum")
        now = trio.current_time()
        for lease, (_, expires) in list(self.leases.items()):
            if expires <= now:
                del self.leases[lease]
                gone = [k for k, kv in self.kvs.items() if kv.lease == lease]
                if gone:
                    self.revision += 1
                    for key in gone:
                        del self.kvs[key]

    async def lease_grant(self, ttl_s: int, *, timeout_s: float | None = None) -> LeaseGranted:
        await trio.sleep(0.001)
        self._tick()
        self._next_lease += 1
        self.leases[self._next_lease] = (ttl_s, trio.current_time() + ttl_s)
        return LeaseGranted(self._next_lease, ttl_s)

    async def lease_keepalive(self, lease_id: int, *, timeout_s: float | None = None) -> int:
        called = trio.current_time()
        await trio.sleep(0.001)
        self._tick()
        if lease_id not in self.leases:
            return 0
        ttl, _ = self.leases[lease_id]
        self.leases[lease_id] = (ttl, trio.current_time() + ttl)
        self.renewals.append(called)
        return ttl

    async def lease_revoke(self, lease_id: int, *, timeout_s: float | None = None) -> None:
        self._tick()
        if self.leases.pop(lease_id, None) is not None:
            self.leases[lease_id] = (0, trio.current_time())
            self._tick()

    async def range(
        self, key: bytes, *, prefix: bool = False, timeout_s: float | None = None
    ) -> RangeResult:
        await trio.sleep(0.001)
        self._tick()
        return self._range(key, prefix)

    def _range(self, key: bytes, prefix: bool) -> RangeResult:
        if prefix:
            end = prefix_end(key)
            found = tuple(kv for k, kv in sorted(self.kvs.items()) if key <= k < end)
        else:
            found = (self.kvs[key],) if key in self.kvs else ()
        return RangeResult(self.revision, found)

    async def txn(
        self,
        compare: list[Compare],
        success: list[Operation],
        failure: list[Operation] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> TxnResult:
        await trio.sleep(0.001)
        self._tick()
        ok = all(self._holds(c) for c in compare)
        ops = success if ok else failure or []
        writes = [op for op in ops if not isinstance(op, Get)]
        for write in writes:
            if isinstance(write, Put) and write.lease and write.lease not in self.leases:
                raise EtcdError("lease not found", status=404, grpc_code=5)
        if writes:
            self.revision += 1
        ranges = []
        for op in ops:
            if isinstance(op, Put):
                old = self.kvs.get(op.key)
                self.kvs[op.key] = KeyValue(
                    op.key, op.value, old.create_revision if old else self.revision,
                    self.revision, (old.version if old else 0) + 1, op.lease,
                )  # fmt: skip
            elif isinstance(op, Delete):
                self.kvs.pop(op.key, None)
            else:
                ranges.append(self._range(op.key, False))
        return TxnResult(ok, self.revision, tuple(ranges))

    def _holds(self, c: Compare) -> bool:
        kv = self.kvs.get(c.key)
        actual: int | bytes
        if c.target is Target.CREATE:
            actual = kv.create_revision if kv else 0
        elif c.target is Target.MOD:
            actual = kv.mod_revision if kv else 0
        elif c.target is Target.VERSION:
            actual = kv.version if kv else 0
        else:
            actual = kv.value if kv else b""
        return actual == c.value

    def put_insync(self, members: set[int], master: int) -> None:
        self.revision += 1
        value = InSyncSet(1, frozenset(members), master).encode()
        self.kvs[KEYS.insync] = KeyValue(KEYS.insync, value, self.revision, self.revision, 1, 0)


@dataclass
class Member:
    """One broker's side: its election and what the callbacks saw."""

    election: Election
    replica: bool
    promoted_epoch: int = 0
    followed: list[MasterRecord] = field(default_factory=list)
    #: Set whenever a follow starts (the election starts it in a task of its own).
    following: trio.Event = field(default_factory=trio.Event)


def member(etcd: FakeEtcd, broker_id: int, log_end: int, *, replica: bool = True) -> Member:
    holder: list[Member] = []

    def promote(epoch: int) -> int:
        holder[0].promoted_epoch, holder[0].replica = epoch, False
        return epoch

    def become_master(epoch: int) -> None:
        holder[0].promoted_epoch = epoch

    async def follow(record: MasterRecord) -> None:
        holder[0].followed.append(record)
        holder[0].following.set()
        await trio.sleep_forever()

    election = Election(
        etcd,
        ElectionSettings(ttl_s=3),
        cluster=CLUSTER,
        broker_name=NAME,
        broker_id=broker_id,
        address=f"127.0.0.1:{10911 + broker_id}",
        replicas=ReplicaSet(ReplicationPolicy()),
        is_replica=lambda: holder[0].replica,
        log_end=lambda: log_end,
        promote=promote,
        become_master=become_master,
        follow=follow,
        ha_address=lambda: f"127.0.0.1:{20911 + broker_id}",
    )
    holder.append(Member(election, replica))
    return holder[0]


@pytest.mark.parametrize("first", [1, 2])
async def test_the_longest_in_sync_log_wins(
    first: int, autojump_clock: trio.testing.MockClock
) -> None:
    etcd = FakeEtcd()
    etcd.put_insync({0, 1, 2}, master=0)
    shorter, longer = member(etcd, 1, 1000), member(etcd, 2, 2000)
    async with trio.open_nursery() as nursery:
        for m in sorted([shorter, longer], key=lambda m: m.election.broker_id != first):
            nursery.start_soon(m.election.run)
            await trio.sleep(0.05)
        with trio.fail_after(30):
            await longer.election.wait_until(lambda s: s.master_epoch > 0)
            await shorter.following.wait()
        assert longer.promoted_epoch == etcd.kvs[KEYS.master].create_revision
        assert shorter.promoted_epoch == 0 and shorter.election.stats.wins == 0
        assert shorter.followed[-1].broker_id == 2
        assert shorter.followed[-1].epoch == longer.promoted_epoch
        # The winner is the only member of the new in-sync set.
        insync = InSyncSet.from_kv(etcd.kvs.get(KEYS.insync))
        assert insync is not None and insync.members == {2} and insync.master == 2
        nursery.cancel_scope.cancel()
    assert KEYS.master not in etcd.kvs  # the winner's stop revoked its lease


async def test_a_replica_outside_the_in_sync_set_never_campaigns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd = FakeEtcd()
    etcd.put_insync({0, 1}, master=0)
    outside = member(etcd, 2, 10**9)  # the longest log, but not in sync
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outside.election.run)
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert outside.election.stats.campaigns == 0
    assert KEYS.master not in etcd.kvs
    assert outside.election.write_refusal() == FENCED_REFUSAL


async def test_a_fresh_group_is_started_by_broker_id_0_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd = FakeEtcd()
    replica = member(etcd, 1, 0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(replica.election.run)
        await trio.sleep(10)
        assert replica.election.stats.campaigns == 0
        first = member(etcd, 0, 0, replica=False)
        nursery.start_soon(first.election.run)
        with trio.fail_after(30):
            await first.election.wait_until(lambda s: s.master_epoch > 0)
            await replica.following.wait()
        nursery.cancel_scope.cancel()
    assert first.promoted_epoch > 0 and replica.followed[-1].ha_address == "127.0.0.1:20911"
    record = MasterRecord.from_kv(etcd.kvs[KEYS.master]) if KEYS.master in etcd.kvs else None
    assert record is None  # the stop revoked its lease: the key went at once


async def test_the_fence_closes_ttl_2_after_the_last_confirmed_renewal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    etcd = FakeEtcd()
    master = member(etcd, 0, 0, replica=False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(master.election.run)
        with trio.fail_after(30):
            await master.election.wait_until(lambda s: s.master_epoch > 0)
        assert master.election.write_refusal() is None
        await trio.sleep(5.5)  # a few renewals
        etcd.down = True
        lost = trio.current_time()
        with trio.fail_after(30):
            await master.election.wait_until(lambda s: s.fenced)
        fenced = trio.current_time()
        assert fenced == pytest.approx(etcd.renewals[-1] + 1.5, abs=1e-6)
        assert fenced - lost <= 1.5
        assert master.election.write_refusal() == FENCED_REFUSAL
        with trio.fail_after(30):
            await master.election.wait_until(lambda s: s.step_downs == 1)
        # Nothing renewed the lease for a whole TTL: it has lapsed at etcd by then.
        assert trio.current_time() >= etcd.renewals[-1] + 3
        etcd.down = False
        await trio.sleep(10)
        # Stepped down for good: fenced, no new campaign even though the key lapsed.
        assert master.election.write_refusal() == FENCED_REFUSAL
        assert master.election.stats.wins == 1
        nursery.cancel_scope.cancel()


def test_values() -> None:
    kv = KeyValue(
        KEYS.master,
        json.dumps({"brokerId": 3, "address": "a", "haAddress": "h"}).encode(),
        7,
        9,
        2,
        55,
    )
    assert MasterRecord.from_kv(kv) == MasterRecord(3, "a", "h", 7, 55)
    garbage = KeyValue(KEYS.insync, b"{not json", 1, 1, 1, 0)
    assert InSyncSet.from_kv(garbage) == InSyncSet(0, frozenset(), -1, 1)
    again = InSyncSet.from_kv(
        KeyValue(KEYS.insync, InSyncSet(5, frozenset({2, 1}), 1).encode(), 1, 4, 1, 0)
    )
    assert again == InSyncSet(5, frozenset({1, 2}), 1, 4)
    assert KEYS.master == b"/trimq/c/g/master" and KEYS.candidate(2) == b"/trimq/c/g/candidates/2"
