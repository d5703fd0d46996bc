"""The pop state's cheaper per-message paths against the ones they replace: a queue read
journaled as one ``pops`` op (``InflightTable.popped_read``) replays to the table the
per-lease ``pop`` op gives (and journals written before it still load), batch-ack ops whose
keys are tuples pack to the bytes lists gave, and ``MetricsWriter.emit_each`` buffers what
one ``emit`` per event buffers."""

from __future__ import annotations

import heapq
import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.clock import ManualClock
from broker.core.pop import POP_ON_REPLICA, PopService
from broker.metrics import EventKind, MetricsWriter
from broker.pop.inflight import Expired, InflightTable, Lease, LeaseKey, LeaseState, Op, Outcome
from broker.pop.journal import Journal
from protocol.codes import ResponseCode
from protocol.receipt import ExtraInfo, RetryFlag

names = st.sampled_from(["g", "T", "%RETRY%g_T", "ü", ""])


@st.composite
def reads(draw: st.DrawFn) -> tuple[list[Lease], int]:
    group, topic, origin = draw(names), draw(names), draw(names)
    queue_id = draw(st.integers(0, 7))
    pop_time, invisible = draw(st.integers(0, 2**41)), draw(st.integers(1, 2**31))
    offsets = draw(st.lists(st.integers(0, 2**40), min_size=1, max_size=32, unique=True))
    leases = [
        Lease(group, topic, queue_id, offset, pop_time, invisible, origin_topic=origin)
        for offset in offsets
    ]
    return leases, max(offsets) + draw(st.integers(1, 3))


def copy(lease: Lease) -> Lease:
    return Lease.from_list(lease.to_list())


def state(table: InflightTable) -> Any:
    return (table.snapshot(), table.next_deadline(), len(table))


@settings(max_examples=150, deadline=None)
@given(st.lists(reads(), min_size=1, max_size=6), st.data())
def test_pops_op_replays_as_the_pop_ops(
    reads_: list[tuple[list[Lease], int]], data: st.DataObject
) -> None:
    compact_ops: list[Op] = []
    plain_ops: list[Op] = []
    compact = InflightTable(on_op=compact_ops.append)
    plain = InflightTable(on_op=plain_ops.append)
    for leases, next_offset in reads_:
        first = leases[0]
        compact.popped_read([copy(x) for x in leases], next_offset)
        cursor = (first.group, first.topic, first.queue_id, next_offset)
        plain.popped([copy(x) for x in leases], cursor=cursor)
    assert state(compact) == state(plain)
    assert [op[0] for op in compact_ops] == ["pops"] * len(reads_)
    # Both journals, through msgpack as the journal stores them, replay to the same table.
    again = [InflightTable(), InflightTable()]
    for table, ops in zip(again, (compact_ops, plain_ops), strict=True):
        for op in ops:
            table.apply(msgpack.unpackb(msgpack.packb(op), raw=False, strict_map_key=False))
        assert state(table) == state(plain)
    # Acked and expired alike afterwards.
    now = data.draw(st.integers(0, 2**42))
    keys = [(lease.key, lease.pop_time) for leases, _ in reads_ for lease in leases]
    chosen = data.draw(st.lists(st.sampled_from(keys), max_size=8))
    for table in (compact, plain, *again):
        table.ack_many(chosen, now)
    assert state(compact) == state(plain) == state(again[0]) == state(again[1])
    assert [e.lease.key for e in compact.expire_due(now)] == [
        e.lease.key for e in plain.expire_due(now)
    ]


def test_journal_of_both_ops_recovers(tmp_path: Path) -> None:
    """A journal written before ``pops`` existed (``pop`` ops), continued with ``pops``."""
    journal, _ = Journal.open(tmp_path)
    table = InflightTable(on_op=journal.append)
    old = [Lease("g", "T", 0, o, 1_000, 5_000, origin_topic="T") for o in (0, 1)]
    table.popped(old, cursor=("g", "T", 0, 2))
    table.popped_read([Lease("g", "T", 0, o, 1_001, 5_000, origin_topic="T") for o in (2, 3)], 4)
    table.ack_many([(("g", "T", 0, 1), 1_000), (("g", "T", 0, 2), 1_001)], 2_000)
    journal.close()
    _, recovered = Journal.open(tmp_path)
    replayed = InflightTable()
    for op in recovered.ops:
        replayed.apply(op)
    assert [op[0] for op in recovered.ops] == ["pop", "pops", "acks"]
    assert replayed.snapshot() == table.snapshot()
    assert sorted(replayed.leases) == [("g", "T", 0, 0), ("g", "T", 0, 3)]
    assert replayed.cursor("g", "T", 0) == 4


def test_ack_ops_pack_as_before() -> None:
    ops: list[Op] = []
    table = InflightTable(on_op=ops.append)
    table.popped_read([Lease("g", "T", 1, o, 1_000, 5_000, origin_topic="T") for o in range(4)], 4)
    table.ack_many([(("g", "T", 1, 0), 1_000), (("g", "T", 1, 1), 1_000)], 1_500)
    table.ack_each([(("g", "T", 1, 2), 1_000), (("g", "T", 1, 3), 1_000)], 1_500)
    lists = [["g", "T", 1, 0], ["g", "T", 1, 1]]
    assert msgpack.packb(ops[1]) == msgpack.packb(["acks", lists])
    assert msgpack.packb(ops[2]) == msgpack.packb(["acks", [["g", "T", 1, 2], ["g", "T", 1, 3]]])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(names, st.none() | names, st.none() | st.integers(0, 9), st.integers(0, 10**6)),
        max_size=12,
    ),
    st.integers(0, 14),
    st.integers(0, 3),
)
def test_emit_each_is_emit_per_event(
    events: list[tuple[str, str | None, int | None, int]], max_buffer: int, before: int
) -> None:
    def writer() -> MetricsWriter:
        ticks = iter(range(10**6))
        w = MetricsWriter(
            Path("/nonexistent"),
            broker="b",
            wake_mode=lambda: "targeted",
            clock_ms=lambda: float(next(ticks)),
            max_buffer=max_buffer,
        )
        for _ in range(before):
            w.emit(EventKind.STORE, topic="x", latency_ms=1)
        return w

    one, each = writer(), writer()
    for topic, group, queue, latency in events:
        one.emit(EventKind.ACK, topic=topic, group=group, queue=queue, latency_ms=float(latency))
    each.emit_each(EventKind.ACK, events)
    assert one._buffer == each._buffer
    assert [type(v) for r in one._buffer for v in r] == [type(v) for r in each._buffer for v in r]
    assert one.statistics() == each.statistics()


class PerLeaseHeap(InflightTable):
    """The deadline heap as it was before pops shared entries: one ``(due, seq, key)`` per
    lease (copied from ``broker/pop/inflight.py`` as of 4b05cd2)."""

    def _push(self, lease: Lease) -> None:
        lease.heap_seq = next(self._seq)
        heapq.heappush(self._old, (lease.due_at, lease.heap_seq, lease.key))

    def _apply_pop(self, leases: Any, cursor: Any, attempt_id: Any) -> None:
        leases = list(leases)
        super()._apply_pop(leases, cursor, attempt_id)  # its heap entries go unused
        for lease in leases:
            self._push(lease)

    def next_deadline(self) -> int | None:
        while self._old:
            due, seq, key = self._old[0]
            lease = self.leases.get(key)
            if lease is not None and lease.heap_seq == seq and lease.due_at == due:
                return due
            heapq.heappop(self._old)
        return None

    def expire_due(self, now_ms: int, limit: int = 1024) -> list[Expired]:
        out: list[Expired] = []
        while self._old and len(out) < limit and self._old[0][0] <= now_ms:
            due, seq, key = heapq.heappop(self._old)
            lease = self.leases.get(key)
            if lease is None or lease.heap_seq != seq or lease.due_at != due:
                continue
            if not lease.order and lease.state is LeaseState.INVISIBLE:
                lease.state = LeaseState.REVIVING
            out.append(Expired(lease))
        return out

    def __init__(self) -> None:
        super().__init__()
        self._old: list[tuple[int, int, LeaseKey]] = []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("pop"),
                st.lists(st.integers(0, 30), min_size=1, max_size=8),
                st.integers(0, 3),  # pop time step
                st.sampled_from([5, 10, 20]),  # invisible time
            ),
            st.tuples(
                st.just("opop"),
                st.lists(st.integers(0, 30), min_size=1, max_size=4),
                st.integers(0, 3),
            ),
            st.tuples(st.just("ack"), st.lists(st.integers(0, 30), max_size=6)),
            st.tuples(st.just("chg"), st.integers(0, 30), st.sampled_from([0, 5, 15])),
            st.tuples(st.just("expire"), st.integers(0, 20), st.integers(1, 4)),
            st.tuples(st.just("revived"), st.integers(0, 30)),
            st.tuples(st.just("retry"), st.integers(0, 30), st.integers(0, 40)),
        ),
        max_size=40,
    )
)
def test_shared_heap_entries_expire_as_per_lease_ones(steps: list[tuple[Any, ...]]) -> None:
    new, old = InflightTable(), PerLeaseHeap()
    now = 0
    for step in steps:
        kind = step[0]
        for table in (new, old):
            if kind == "pop":
                offsets, dt, invisible = step[1], step[2], step[3]
                pop_now = now + dt
                leases = [
                    Lease("g", "T", 0, o, pop_now, invisible, origin_topic="T")
                    for o in dict.fromkeys(offsets)
                    if ("g", "T", 0, o) not in table.leases
                ]
                if leases:
                    table.popped_read(leases, max(offsets) + 1)
            elif kind == "opop":  # orderly: due leases stay (the next pop takes them)
                table.popped(
                    [
                        Lease("g", "T", 1, o, now + step[2], 10, origin_topic="T", order=True)
                        for o in dict.fromkeys(step[1])
                    ]
                )
            elif kind == "ack":
                pairs = [
                    (("g", "T", 0, o), table.leases[("g", "T", 0, o)].pop_time)
                    for o in step[1]
                    if ("g", "T", 0, o) in table.leases
                ]
                table.ack_each(pairs, now)
            elif kind == "chg":
                lease = table.leases.get(("g", "T", 0, step[1]))
                if lease is not None:
                    table.change(lease.key, lease.pop_time, now, step[2])
            elif kind == "revived":
                lease = table.leases.get(("g", "T", 0, step[1]))
                if lease is not None and lease.state is LeaseState.REVIVING:
                    table.revived(lease.key)
            elif kind == "retry":
                lease = table.leases.get(("g", "T", 0, step[1]))
                if lease is not None and lease.state is LeaseState.REVIVING:
                    table.retry_later(lease.key, now + step[2])
        if kind == "expire":
            now += step[1]
            got = [[e.lease.key for e in t.expire_due(now, step[2])] for t in (new, old)]
            assert got[0] == got[1]
        assert new.next_deadline() == old.next_deadline()
        assert new.snapshot() == old.snapshot()
        assert {k: v.state for k, v in new.leases.items()} == {
            k: v.state for k, v in old.leases.items()
        }


def test_ack_burst_on_a_replica_refuses_each_after_its_receipt_check() -> None:
    """The replica question is asked once per burst; each ack still gets the error it
    would get alone (a malformed receipt first, then the replica's refusal)."""
    asked: list[int] = []

    def is_replica() -> bool:
        asked.append(1)
        return True

    service = PopService(
        None,  # type: ignore[arg-type]  # never reached on a replica
        None,  # type: ignore[arg-type]
        ManualClock(0),
        trio.Event(),
        max_hold_ms=0,
        is_replica=is_replica,
    )
    good = ExtraInfo(0, 1_000, 5_000, 0, RetryFlag.NORMAL, "b", 0, 3).encode()
    errors = service.ack_texts(
        [("g", "T", 0, 3, "x y"), ("g", "T", 0, 3, good), ("g", "T", 0, 3, good)]
    )
    assert [e.code if e else None for e in errors] == [
        ResponseCode.INVALID_PARAMETER,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.SERVICE_NOT_AVAILABLE,
    ]
    assert str(errors[1]) == POP_ON_REPLICA and len(asked) == 1


def test_journal_sync_with_nothing_new_does_not_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    journal, _ = Journal.open(tmp_path)
    journal.sync()  # the first one always syncs
    first = len(synced)
    assert first >= 1
    journal.sync()
    assert len(synced) == first  # nothing appended since
    journal.append(["cur", "g", "T", 0, 1])
    journal.sync()
    assert len(synced) == first + 1
    journal.sync()
    assert len(synced) == first + 1
    journal.rotate({})  # a new generation: its file and the old one
    journal.sync()
    assert len(synced) > first + 1
    n = len(synced)
    journal.sync()
    assert len(synced) == n
    journal.close()
    _, recovered = Journal.open(tmp_path)
    assert recovered.ops == [["cur", "g", "T", 0, 1]]  # no snapshot written: replayed


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 9), max_size=12),
    st.lists(st.integers(0, 9), max_size=12),
    st.integers(900, 2_100),
)
def test_acks_return_the_leases_they_acknowledged(
    popped: list[int], acked: list[int], now: int
) -> None:
    """What ``PopEngine`` emits ACK events for: the leases a lookup before the ack found,
    of the receipts acknowledged, in receipt order."""
    for method in ("ack_many", "ack_each"):
        table = InflightTable()
        leases = [Lease("g", "T", 0, o, 1_000, 1_000, "T") for o in dict.fromkeys(popped)]
        if leases:
            table.popped_read(leases, max(popped) + 1)
        receipts = [(("g", "T", 0, o), 1_000 if o % 3 else 999) for o in acked]
        before = [table.leases.get(key) for key, _ in receipts]
        outcomes, got = getattr(table, f"{method}_leases")(receipts, now)
        expected = [
            lease
            for lease, outcome in zip(before, outcomes, strict=True)
            if lease is not None and outcome is Outcome.OK
        ]
        assert [id(x) for x in got] == [id(x) for x in expected]
