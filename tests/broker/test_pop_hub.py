"""The pop long-polling hub: who a message wakes, in each wake mode, and that nothing leaks.

Waiters are parked one at a time (``wait_all_tasks_blocked`` between them) so that their
parking order, which decides FIFO, is the order of the test. With ``autojump_clock`` the clock
only moves when every task is blocked, so deadlines pass exactly and instantly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from broker.pop.hub import GroupStatistics, PopHub, PopHubStatistics, WakeMode, WakeReason, Wakeup
from protocol.errors import PollingFullError
from protocol.naming import V1RetryNames, pop_retry_topic_v1, pop_retry_topic_v2
from protocol.properties import ORIGIN_TOPIC

T = "Orders"
TIMEOUT = 15.0


@dataclass
class Parked:
    """One pop parked by :func:`park`: its result once ``done``, and when it returned."""

    done: bool = False
    result: Wakeup | None = None
    at: float = 0.0
    cancel_scope: trio.CancelScope | None = None

    def woken(self) -> bool:
        return self.done and self.result is not None

    def finished(self) -> bool:
        # A method, not the attribute: mypy would narrow ``done`` across awaits.
        return self.done


async def park(
    nursery: trio.Nursery,
    hub: PopHub,
    group: str,
    queue_id: int = -1,
    tags: frozenset[int] | None = None,
    *,
    topic: str = T,
    hold: float = TIMEOUT,
) -> Parked:
    """Start a pop waiting on ``hub`` and return once it is parked."""
    parked = Parked()
    deadline = trio.current_time() + hold

    async def run() -> None:
        with trio.CancelScope() as scope:
            parked.cancel_scope = scope
            parked.result = await hub.wait(topic, group, queue_id, tags, deadline)
            parked.at = trio.current_time()
            parked.done = True

    nursery.start_soon(run)
    await trio.testing.wait_all_tasks_blocked()
    return parked


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


def message(
    hub: PopHub,
    topic: str = T,
    queue_id: int = 0,
    tags_code: int = 0,
    properties: Mapping[str, str] | None = None,
    offset: int = 7,
) -> None:
    hub.arriving(topic, queue_id, offset, tags_code, 1_700_000_000_000, properties or {})


def retry(
    hub: PopHub, name: str, origin: str | None = None, tags_code: int = 0, queue_id: int = 0
) -> None:
    properties = {} if origin is None else {ORIGIN_TOPIC: origin}
    message(hub, name, queue_id, tags_code, properties)


def assert_empty(hub: PopHub) -> None:
    """No waiter, key or index entry is left behind."""
    stats = hub.statistics()
    assert stats.parked == 0
    assert stats.keys == 0
    assert hub._lines == {}
    assert hub._index == {}
    assert all(group.parked == 0 for group in stats.groups.values())


# ------------------------------------------------------------------ new messages
async def test_new_message_wakes_one_waiter_per_group_fifo(autojump_clock: Any) -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        a1 = await park(nursery, hub, "A")
        b1 = await park(nursery, hub, "B")
        a2 = await park(nursery, hub, "A")
        b2 = await park(nursery, hub, "B")
        message(hub, queue_id=3)
        await settle()
        assert [a1.woken(), a2.woken(), b1.woken(), b2.woken()] == [True, False, True, False]
        assert a1.result is not None
        assert a1.result.reason == WakeReason.NEW
        assert str(a1.result.reason) == "new"
        assert (a1.result.group, a1.result.topic, a1.result.queue_id) == ("A", T, 3)
        assert a1.result.queue_offset == 7
        assert a1.result.time == trio.current_time()
        message(hub, queue_id=3)
        await settle()
        assert a2.woken() and b2.woken()
    assert hub.statistics().wakeups == 4
    assert hub.statistics().groups["A"].wakeups == 2
    assert_empty(hub)


async def test_fifo_across_the_any_key_and_the_queue_key() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        on_q1 = await park(nursery, hub, "g", 1)
        on_any = await park(nursery, hub, "g", -1)
        on_q1_later = await park(nursery, hub, "g", 1)
        message(hub, queue_id=1)
        await settle()
        assert (on_q1.woken(), on_any.woken(), on_q1_later.woken()) == (True, False, False)
        message(hub, queue_id=1)
        await settle()
        assert on_any.woken() and not on_q1_later.woken()
        message(hub, queue_id=1)
        await settle()
        assert on_q1_later.woken()
    assert_empty(hub)


async def test_other_queue_ids_are_not_woken() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        on_q2 = await park(nursery, hub, "g", 2)
        on_any = await park(nursery, hub, "g", -1)
        message(hub, queue_id=1)
        await settle()
        assert on_any.woken() and not on_q2.woken()
        message(hub, queue_id=1)  # only the queue-2 waiter is left: nobody wakes
        await settle()
        assert not on_q2.finished()
        nursery.cancel_scope.cancel()
    assert hub.statistics().wakeups == 1
    assert_empty(hub)


async def test_other_topics_are_not_woken() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        other = await park(nursery, hub, "g", topic="Other")
        message(hub, topic=T)
        await settle()
        assert not other.finished()
        nursery.cancel_scope.cancel()
    assert hub.statistics().wakeups == 0
    assert_empty(hub)


async def test_filter_mismatch_skips_to_the_next_waiter() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        wants_a = await park(nursery, hub, "g", tags=frozenset({11}))
        wants_b = await park(nursery, hub, "g", 0, tags=frozenset({22, 33}))
        wants_all = await park(nursery, hub, "g")
        message(hub, queue_id=0, tags_code=33)
        await settle()
        # RocketMQ would look at wants_a only, put it back and stop (weak spot 3).
        assert (wants_a.woken(), wants_b.woken(), wants_all.woken()) == (False, True, False)
        message(hub, queue_id=0, tags_code=99)
        await settle()
        assert wants_all.woken() and not wants_a.finished()
        message(hub, queue_id=0, tags_code=99)  # matches nobody left
        await settle()
        assert not wants_a.finished()
        message(hub, queue_id=5, tags_code=11)
        await settle()
        assert wants_a.woken()
    assert_empty(hub)


@pytest.mark.parametrize("mode", list(WakeMode))
async def test_new_messages_wake_in_every_mode(mode: WakeMode) -> None:
    hub = PopHub(mode)
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A")
        b = await park(nursery, hub, "B", 0)
        message(hub)
        await settle()
        assert a.woken() and b.woken()


# ------------------------------------------------------------------ retry messages, by mode
async def test_targeted_retry_wakes_only_the_owning_group(autojump_clock: Any) -> None:
    hub = PopHub(WakeMode.TARGETED)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        a = await park(nursery, hub, "A")
        b = await park(nursery, hub, "B")
        retry(hub, pop_retry_topic_v2("A", T), origin=T)
        await settle()
        assert a.woken() and not b.finished()
        assert a.result is not None
        assert a.result.reason == WakeReason.RETRY
        assert a.result.topic == "%RETRY%A+Orders"
    assert b.finished() and b.result is None
    assert b.at == start + TIMEOUT
    assert hub.statistics().groups["B"].wakeups == 0
    assert_empty(hub)


async def test_targeted_retry_without_origin_parses_the_v2_name() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A", 2)  # any key of the group: retry queue 0 is not T's
        b = await park(nursery, hub, "B")
        retry(hub, pop_retry_topic_v2("A", T))
        await settle()
        assert a.woken() and not b.finished()
        nursery.cancel_scope.cancel()


async def test_targeted_retry_wakes_one_waiter_fifo_over_all_keys_with_filter() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        first = await park(nursery, hub, "A", 4, tags=frozenset({1}))
        second = await park(nursery, hub, "A", 2)
        third = await park(nursery, hub, "A", -1)
        retry(hub, pop_retry_topic_v2("A", T), origin=T, tags_code=5)
        await settle()
        assert (first.woken(), second.woken(), third.woken()) == (False, True, False)
        retry(hub, pop_retry_topic_v2("A", T), origin=T, tags_code=1)
        await settle()
        assert first.woken() and not third.finished()
        nursery.cancel_scope.cancel()
    assert_empty(hub)


async def test_topic_mode_wakes_every_group_and_counts_the_wasted_one() -> None:
    hub = PopHub(WakeMode.TOPIC)
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A")
        b = await park(nursery, hub, "B")
        other = await park(nursery, hub, "C", topic="Other")
        retry(hub, pop_retry_topic_v2("A", T), origin=T)
        await settle()
        assert a.woken() and b.woken() and not other.finished()
        assert a.result is not None and b.result is not None
        hub.record_result(a.result, found=True)
        hub.record_result(b.result, found=False)  # B's pop cannot read A's retry topic
        nursery.cancel_scope.cancel()
    stats = hub.statistics()
    assert (stats.wakeups, stats.wasted_wakeups) == (2, 1)
    assert stats.groups["A"] == GroupStatistics(parked=0, wakeups=1, wasted_wakeups=0)
    assert stats.groups["B"] == GroupStatistics(parked=0, wakeups=1, wasted_wakeups=1)
    assert stats.wakeups_by_reason[WakeReason.RETRY] == 2


async def test_topic_mode_v1_name_wakes_nobody() -> None:
    hub = PopHub(WakeMode.TOPIC, v1_owner=lambda name: ("A", T))
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A")
        retry(hub, pop_retry_topic_v1("A", T), origin=T)
        await settle()
        assert not a.finished()
        nursery.cancel_scope.cancel()
    assert hub.statistics().wakeups == 0
    assert hub.statistics().unrouted_retry == 1


async def test_none_mode_wakes_nobody_and_the_pop_returns_none_at_its_deadline(
    autojump_clock: Any,
) -> None:
    hub = PopHub(WakeMode.NONE)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        a = await park(nursery, hub, "A")
        b = await park(nursery, hub, "B", hold=3.5)
        retry(hub, pop_retry_topic_v2("A", T), origin=T)
        await settle()
        assert not a.finished() and not b.finished()
    assert a.result is None and b.result is None
    assert (a.at, b.at) == (start + TIMEOUT, start + 3.5)
    assert hub.statistics().wakeups == 0
    assert hub.statistics().unrouted_retry == 1
    assert_empty(hub)


async def test_wake_mode_can_be_changed_at_run_time() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A")
        hub.wake_mode = WakeMode.NONE
        retry(hub, pop_retry_topic_v2("A", T), origin=T)
        await settle()
        assert not a.finished()
        hub.wake_mode = WakeMode.TARGETED
        retry(hub, pop_retry_topic_v2("A", T), origin=T)
        await settle()
        assert a.woken()
    assert hub.statistics().wake_mode == WakeMode.TARGETED
    assert hub.statistics().as_json()["wake_mode"] == "targeted"


# ------------------------------------------------------------------ V1 names
async def test_targeted_v1_name_resolved_by_the_registry() -> None:
    names = V1RetryNames()
    names.register("A", T)
    hub = PopHub(v1_owner=names.owner)
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A")
        b = await park(nursery, hub, "B")
        retry(hub, pop_retry_topic_v1("A", T))  # no ORIGIN_TOPIC: ask the registry
        await settle()
        assert a.woken() and not b.finished()
        nursery.cancel_scope.cancel()


async def test_colliding_v1_names_resolved_by_origin_topic() -> None:
    # Both pairs map to %RETRY%MyConsumerGroup_Order_Topic (issue #9633).
    name = "%RETRY%MyConsumerGroup_Order_Topic"
    assert pop_retry_topic_v1("MyConsumerGroup", "Order_Topic") == name
    assert pop_retry_topic_v1("MyConsumerGroup_Order", "Topic") == name
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        short = await park(nursery, hub, "MyConsumerGroup", topic="Order_Topic")
        long = await park(nursery, hub, "MyConsumerGroup_Order", topic="Topic")
        retry(hub, name, origin="Topic")
        await settle()
        assert long.woken() and not short.finished()
        retry(hub, name, origin="Order_Topic")
        await settle()
        assert short.woken()
    assert hub.statistics().unowned_retry == 0
    assert_empty(hub)


async def test_unknown_v1_owner_wakes_nobody_and_is_counted() -> None:
    hub = PopHub()  # no registry
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A")
        retry(hub, pop_retry_topic_v1("A", T))
        retry(hub, "%RETRY%A+Orders+x")  # not a well-formed V2 name either
        await settle()
        assert not a.finished()
        nursery.cancel_scope.cancel()
    assert hub.statistics().unowned_retry == 2


async def test_classic_retry_and_dlq_wake_nobody() -> None:
    hub = PopHub(v1_owner=lambda name: None)
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A")
        for mode in WakeMode:
            hub.wake_mode = mode
            retry(hub, "%RETRY%A")
            message(hub, "%DLQ%A")
            message(hub, "%DLQ%A+Orders")
        await settle()
        assert not a.finished()
        nursery.cancel_scope.cancel()
    assert hub.statistics().wakeups == 0
    assert hub.statistics().unowned_retry == 0


# ------------------------------------------------------------------ notify
async def test_notify_prefers_the_queue_key_then_any_and_ignores_filters() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        on_any = await park(nursery, hub, "g", -1, tags=frozenset({1}))
        on_q3 = await park(nursery, hub, "g", 3, tags=frozenset({2}))
        other_group = await park(nursery, hub, "h", 3)
        assert hub.notify(T, "g", 3)
        await settle()
        assert on_q3.woken() and not on_any.finished() and not other_group.finished()
        assert on_q3.result is not None
        assert on_q3.result.reason == WakeReason.NOTIFY
        assert (on_q3.result.topic, on_q3.result.queue_id) == (T, 3)
        assert hub.notify(T, "g", 3)
        await settle()
        assert on_any.woken()
        assert not hub.notify(T, "g", 3)
        assert not hub.notify(T, "nobody", 0)
        assert hub.notify(T, "h", -1) is False  # h waits on key 3 only
        nursery.cancel_scope.cancel()
    assert_empty(hub)


# ------------------------------------------------------------------ capacity, leaks, shutdown
async def test_capacity_per_key_and_in_total() -> None:
    hub = PopHub(max_per_key=2, max_total=3)
    async with trio.open_nursery() as nursery:
        first = await park(nursery, hub, "g", 0)
        await park(nursery, hub, "g", 0)
        with pytest.raises(PollingFullError) as full:
            await hub.wait(T, "g", 0, None, trio.current_time() + 1)
        assert full.value.retriable
        await park(nursery, hub, "g", 1)  # another key has room
        with pytest.raises(PollingFullError):
            await hub.wait(T, "h", 5, None, trio.current_time() + 1)  # the hub is full
        assert hub.statistics().parked == 3
        message(hub, queue_id=0)
        await settle()
        assert first.woken()
        await park(nursery, hub, "g", 0)  # a woken waiter frees its slot at once
        assert hub.statistics().parked == 3
        nursery.cancel_scope.cancel()
    assert_empty(hub)


async def test_no_leaks_after_timeouts_cancellation_and_wakeups(autojump_clock: Any) -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        for group in ("A", "B", "C"):
            for queue_id in (-1, 0, 1, 2):
                await park(nursery, hub, group, queue_id, hold=2 + queue_id)
        cancelled = await park(nursery, hub, "D", 0, hold=100)
        woken = await park(nursery, hub, "E", 1, hold=100)
        assert hub.statistics().parked == 14
        assert hub.statistics().keys == 14
        message(hub, queue_id=1)
        await settle()
        assert woken.woken()
        assert cancelled.cancel_scope is not None
        cancelled.cancel_scope.cancel()
        await settle()
        assert hub.statistics().groups["D"].parked == 0
    assert_empty(hub)


async def test_a_past_deadline_returns_none_at_once(autojump_clock: Any) -> None:
    hub = PopHub()
    start = trio.current_time()
    assert await hub.wait(T, "g", 0, None, start - 1) is None
    assert trio.current_time() == start
    assert_empty(hub)


async def test_wake_all_answers_every_parked_pop() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        parked = [
            await park(nursery, hub, group, queue_id, topic=topic)
            for group in ("A", "B")
            for queue_id in (-1, 0)
            for topic in (T, "Other")
        ]
        hub.wake_all()
        await settle()
    assert all(p.woken() for p in parked)
    assert {p.result.reason for p in parked if p.result} == {WakeReason.SHUTDOWN}
    assert parked[1].result is not None
    assert (parked[1].result.topic, parked[1].result.queue_id) == ("Other", -1)
    assert hub.statistics().wakeups_by_reason[WakeReason.SHUTDOWN] == 8
    assert_empty(hub)


async def test_a_wakeup_for_a_cancelled_waiter_is_passed_on() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        first = await park(nursery, hub, "g")
        second = await park(nursery, hub, "g")
        assert first.cancel_scope is not None
        # The cancel is delivered, but the task has not run yet when the message arrives
        # and picks it: the wake-up must reach the next waiter, not vanish.
        first.cancel_scope.cancel()
        message(hub)
        await settle()
        assert not first.finished()
        assert second.woken()
    stats = hub.statistics()
    assert stats.passed_on == 1
    assert stats.groups["g"] == GroupStatistics(parked=0, wakeups=2, wasted_wakeups=1)
    assert_empty(hub)


# ------------------------------------------------------------------ robustness, stats
async def test_junk_properties_never_raise_out_of_arriving() -> None:
    def exploding_registry(name: str) -> tuple[str, str] | None:
        raise RuntimeError("registry is broken")

    hub = PopHub(v1_owner=exploding_registry)
    v1, v2 = pop_retry_topic_v1("A", T), pop_retry_topic_v2("A", T)
    junk: list[Any] = [None, 42, "ORIGIN_TOPIC", {ORIGIN_TOPIC: 5}, {ORIGIN_TOPIC: ""}]
    async with trio.open_nursery() as nursery:
        for properties in [*junk, {ORIGIN_TOPIC: "NotTheOrigin"}]:
            a = await park(nursery, hub, "A")
            hub.arriving(v1, 0, 0, 0, 0, properties)  # no usable origin: the registry raises
            hub.arriving(v2, 0, 0, 0, 0, properties)  # the name still names the owner
            await settle()
            assert a.woken(), properties
        a = await park(nursery, hub, "A")
        hub.arriving("%RETRY%", 0, 0, 0, 0, {})
        hub.arriving("%RETRY%+", 0, 0, 0, 0, {ORIGIN_TOPIC: "+"})
        hub.arriving(None, 0, 0, 0, 0, {})  # type: ignore[arg-type]
        hub.arriving(T, 0, 0, 0, 0, None)  # type: ignore[arg-type]  # normal topic: fine
        await settle()
        assert a.woken()
    stats = hub.statistics()
    assert stats.wakeups == 7
    # 5 junk and 1 wrong origin, each on a V1 and a V2 name, and the origin "+" of "%RETRY%+".
    assert stats.bad_properties == 13
    assert stats.arrival_errors == 8  # the registry 7 times, the None topic once
    assert stats.last_error is not None
    assert "registry is broken" in stats.last_error or "NoneType" in stats.last_error
    assert_empty(hub)
    json.dumps(stats.as_json())


async def test_statistics_are_a_frozen_snapshot() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        before = hub.statistics()
        await park(nursery, hub, "A")
        after = hub.statistics()
        assert isinstance(after, PopHubStatistics)
        assert (before.parked, before.groups) == (0, {})  # not changed by the later park
        assert after.parked == 1 and after.groups["A"].parked == 1
        with pytest.raises(AttributeError):
            after.parked = 5  # type: ignore[misc]
        with pytest.raises(TypeError):
            after.groups["B"] = GroupStatistics(0, 0, 0)  # type: ignore[index]
        with pytest.raises(TypeError):
            after.wakeups_by_reason[WakeReason.NEW] = 3  # type: ignore[index]
        nursery.cancel_scope.cancel()


async def test_stats_are_json_and_cover_every_group() -> None:
    hub = PopHub()
    async with trio.open_nursery() as nursery:
        a = await park(nursery, hub, "A")
        await park(nursery, hub, "B", 1)
        message(hub, queue_id=0)
        await settle()
        assert a.result is not None
        hub.record_result(a.result, found=False)
        snapshot = hub.statistics()
        stats = json.loads(json.dumps(snapshot.as_json()))
        assert stats["parked"] == snapshot.parked == 1
        assert stats["wakeups"] == snapshot.wakeups == 1
        assert stats["wasted_wakeups"] == snapshot.wasted_wakeups == 1
        assert stats["wakeups_by_reason"] == {"new": 1, "retry": 0, "notify": 0, "shutdown": 0}
        assert stats["groups"] == {
            "A": {"parked": 0, "wakeups": 1, "wasted_wakeups": 1},
            "B": {"parked": 1, "wakeups": 0, "wasted_wakeups": 0},
        }
        nursery.cancel_scope.cancel()
