"""The sans-IO half-message table: check deadlines, decisions, snapshots."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.halves import Half, HalfTable


def half(queue_offset: int, group: str = "g") -> Half:
    return Half(queue_offset, commit_offset=1000 + queue_offset * 100, group=group)


def test_checks_come_due_in_time_order_and_again_after_a_reschedule() -> None:
    table = HalfTable()
    assert table.add(half(0), 500)
    assert table.add(half(1), 300)
    assert not table.add(half(1), 100)  # known already
    assert table.next_deadline() == 300
    assert table.pop_due(299) == []
    [first] = table.pop_due(300)
    assert first.queue_offset == 1
    assert table.next_deadline() == 500  # the popped one is off the heap
    table.reschedule(first, 800)
    assert [h.queue_offset for h in table.pop_due(1000)] == [0, 1]
    assert table.next_deadline() is None


def test_decisions_drop_the_half_and_its_deadline() -> None:
    table = HalfTable()
    for q in range(3):
        table.add(half(q), 100 + q)
    assert table.by_commit_offset(1100) is table.get(1)
    table.decide(1)
    assert table.get(1) is None and table.by_commit_offset(1100) is None
    assert table.decided(1) and not table.decided(0)
    assert [h.queue_offset for h in table.pop_due(10_000)] == [0, 2]
    assert not table.add(half(1), 0)  # a decided half is never tracked again
    table.decide(0)
    assert table.watermark == 2  # 0 and 1 decided: the watermark passed them
    assert table.pending == 1


def test_a_half_being_decided_is_not_decided_twice_and_an_abort_releases_it() -> None:
    table = HalfTable()
    table.add(half(0), 0)
    assert table.begin(0) is not None
    assert table.is_deciding(0)
    assert table.begin(0) is None  # a second END_TRANSACTION meanwhile
    table.abort(0)
    assert not table.is_deciding(0)
    assert table.begin(0) is not None
    table.decide(0)
    assert table.begin(0) is None


def test_snapshot_restores_decisions_and_check_counts() -> None:
    table = HalfTable()
    for q in range(5):
        table.add(half(q), 0)
    table.get(3).checks = 4  # type: ignore[union-attr]
    table.decide(0)
    table.decide(2)
    data = table.snapshot(also_decided=[4])
    restored = HalfTable()
    restored.load(data)
    assert restored.watermark == 1
    added = [q for q in range(5) if restored.add(half(q), 0)]
    assert added == [1, 3]
    assert restored.get(3).checks == 4  # type: ignore[union-attr]
    assert restored.get(1).checks == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("data", [b"{}", b"[]", b'{"version": 2}', b"not json", b'{"version":1}'])
def test_a_foreign_snapshot_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="snapshot"):
        HalfTable().load(data)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(st.sampled_from(["decide", "due", "resched"]), st.integers(0, 15)),
        max_size=40,
    )
)
def test_every_undecided_half_stays_checkable(ops: list[tuple[str, int]]) -> None:
    """Whatever the order of decisions and check rounds, each undecided half has exactly one
    pending deadline once rescheduled, and decided halves never come due."""
    table = HalfTable()
    for q in range(16):
        table.add(half(q), q)
    now = 0
    for op, q in ops:
        if op == "decide":
            table.decide(q)
        elif op == "due":
            now += q
            for h in table.pop_due(now):
                assert not table.decided(h.queue_offset)
                table.reschedule(h, now + 5)
        else:
            found = table.get(q)
            if found is not None and found.due_ms >= 0:
                table.reschedule(found, now + q)
    due = table.pop_due(1 << 40)
    offsets = [h.queue_offset for h in due]
    assert len(offsets) == len(set(offsets))
    assert sorted(offsets) == sorted(q for q in range(16) if not table.decided(q))
