"""POP_MESSAGE / ACK_MESSAGE / BATCH_ACK_MESSAGE / CHANGE_MESSAGE_INVISIBLETIME.

The broker runs over memory streams on trio's mock clock (``autojump_clock``): its wall clock
follows trio's, so invisible times, revive deadlines and long-poll holds are exact virtual
times, whatever the machine's load. (Pop over TCP is covered by the interop and client tests.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from protocol.codes import RequestCode, ResponseCode
from protocol.properties import FIRST_POP_TIME, ORIGIN_MESSAGE_ID, ORIGIN_TOPIC, REVIVE_DEADLINE_MS
from protocol.receipt import RetryFlag
from tests.broker.client import BrokerClient
from tests.broker.memory import open_memory_broker
from tests.broker.pop_client import ack, batch_ack, change_invisible, pop
from tests.broker.test_timers import send


async def create_topic(client: BrokerClient, topic: str, queues: int = 4) -> None:
    ext = {"topic": topic, "defaultTopic": "TBW102", "readQueueNums": str(queues),
           "writeQueueNums": str(queues), "perm": "6", "topicFilterType": "SINGLE_TAG",
           "order": "false"}  # fmt: skip
    reply = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def test_pop_ack_and_ack_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            for i in range(5):
                await send(client, "T", f"m{i}".encode())
            reply, got = await pop(client, "g", "T")
            assert reply.code == ResponseCode.SUCCESS
            assert sorted(p.msg.body for p in got) == [b"m0", b"m1", b"m2", b"m3", b"m4"]
            assert all(p.receipt.retry_flag is RetryFlag.NORMAL for p in got)
            for p in got:
                assert (await ack(client, "g", p)).code == ResponseCode.SUCCESS
            again = await ack(client, "g", got[0])
            assert again.code == ResponseCode.NO_MESSAGE
            assert "already acked" in (again.remark or "")
            reply, rest = await pop(client, "g", "T")  # nothing left, no hold
            assert reply.code == ResponseCode.POLLING_TIMEOUT and rest == []
            assert broker.statistics().core.pop.in_flight == 0


async def test_parked_pop_is_woken_by_a_new_message(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            async with broker.connect() as producer, trio.open_nursery() as nursery:

                async def later() -> None:
                    await trio.sleep(0.3)
                    await send(producer, "T", b"late")

                nursery.start_soon(later)
                start = trio.current_time()
                reply, got = await pop(client, "g", "T", poll_ms=5_000)
                waited = trio.current_time() - start
            assert reply.code == ResponseCode.SUCCESS and [p.msg.body for p in got] == [b"late"]
            assert waited == pytest.approx(0.3)  # woken by the arrival itself, not a scan


async def test_parked_pop_times_out_with_polling_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            start = trio.current_time()
            reply, got = await pop(client, "g", "T", poll_ms=400)
            assert reply.code == ResponseCode.POLLING_TIMEOUT and got == []
            assert trio.current_time() - start == pytest.approx(0.4)  # exactly its poll time


async def test_unacked_message_is_revived_at_its_deadline_into_the_v2_retry_topic(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(15):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            await send(client, "T", b"once")
            _, (first,) = await pop(client, "g", "T", invisible_ms=500)
            deadline = first.receipt.deadline_ms
            popped_at = trio.current_time()
            reply, got = await pop(client, "g", "T", poll_ms=5_000, invisible_ms=10_000)
            assert reply.code == ResponseCode.SUCCESS
            # Revived at its deadline and handed to the parked pop at once (ms resolution).
            assert trio.current_time() - popped_at == pytest.approx(0.5, abs=0.002)
            (retry,) = got
            assert retry.msg.topic == "T"  # consumers see the original topic
            assert retry.msg.body == b"once"
            assert retry.msg.reconsume_times == 1
            assert retry.receipt.retry_flag is RetryFlag.RETRY_V2
            assert retry.real_topic == "%RETRY%g+T"
            props = retry.msg.properties
            assert props[ORIGIN_TOPIC] == "T"
            assert props[ORIGIN_MESSAGE_ID] == "once"
            assert props[FIRST_POP_TIME] == str(first.receipt.pop_time_ms)
            assert int(props[REVIVE_DEADLINE_MS]) == deadline
            # The retry is acked on the retry topic and gone for good.
            assert (await ack(client, "g", retry)).code == ResponseCode.SUCCESS
            # The original receipt expired: acking it now is refused.
            late = await ack(client, "g", first)
            assert late.code == ResponseCode.NO_MESSAGE
            # The original lease is forgotten once its retry copy is on disk (next flush).
            for _ in range(300):  # bounded: one flush interval at most
                if broker.statistics().core.pop.in_flight == 0:
                    break
                await trio.sleep(0.01)
            pop_stats = broker.statistics().core.pop
            assert pop_stats.revived == 1 and pop_stats.in_flight == 0


async def test_change_invisible_time_moves_the_deadline_and_staleness(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(15):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            await send(client, "T", b"slow")
            _, (p,) = await pop(client, "g", "T", invisible_ms=300)
            reply, newer = await change_invisible(client, "g", p, 1_500)
            assert reply.code == ResponseCode.SUCCESS and newer is not None
            assert newer.receipt.pop_time_ms >= p.receipt.pop_time_ms
            await trio.sleep(0.6)  # past the old deadline: not revived
            assert broker.statistics().core.pop.revived == 0
            stale = await ack(client, "g", p)
            assert stale.code == ResponseCode.NO_MESSAGE and "stale" in (stale.remark or "")
            assert (await ack(client, "g", newer)).code == ResponseCode.SUCCESS


async def test_bad_receipts_and_bad_pops_get_clear_codes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            await send(client, "T", b"x")
            _, (p,) = await pop(client, "g", "T")
            # another group's receipt
            other = await ack(client, "other", p)
            assert other.code == ResponseCode.NO_MESSAGE
            # malformed receipt
            ext = {"consumerGroup": "g", "topic": "T", "queueId": str(p.msg.queue_id),
                   "extraInfo": "not a receipt", "offset": str(p.msg.queue_offset)}  # fmt: skip
            bad = await client.call(RequestCode.ACK_MESSAGE, ext)
            assert bad.code == ResponseCode.INVALID_PARAMETER
            # wrong offset with a real receipt
            ext = {**ext, "extraInfo": p.receipt.encode(), "offset": "999"}
            assert (await client.call(RequestCode.ACK_MESSAGE, ext)).code == ResponseCode.NO_MESSAGE
            # invisibleTime <= 0, too many messages, unknown topic, bad queue, bad group
            reply, _ = await pop(client, "g", "T", invisible_ms=0)
            assert reply.code == ResponseCode.INVALID_PARAMETER
            reply, _ = await pop(client, "g", "T", max_nums=33)
            assert reply.code == ResponseCode.INVALID_PARAMETER
            reply, _ = await pop(client, "g", "Nope")
            assert reply.code == ResponseCode.TOPIC_NOT_EXIST
            reply, _ = await pop(client, "g", "T", queue_id=9)
            assert reply.code == ResponseCode.INVALID_PARAMETER
            reply, _ = await pop(client, "bad group!", "T")
            assert reply.code != ResponseCode.SUCCESS
            reply, _ = await change_invisible(client, "g", p, -1)  # 0 is a nack: allowed
            assert reply.code == ResponseCode.INVALID_PARAMETER
            # nothing changed: the real receipt still acks
            assert (await ack(client, "g", p)).code == ResponseCode.SUCCESS


async def test_batch_ack(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            for i in range(4):
                await send(client, "T", f"b{i}".encode())
            _, got = await pop(client, "g", "T")
            reply = await batch_ack(client, "g", got[:3])
            assert reply.code == ResponseCode.SUCCESS and reply.remark is None
            assert broker.statistics().core.pop.in_flight == 1
            reply = await batch_ack(client, "g", got)  # three of four no longer in flight
            assert reply.code == ResponseCode.SUCCESS and reply.remark == "3 not in flight"
            assert broker.statistics().core.pop.in_flight == 0


async def test_tag_filter(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            await send(client, "T", b"a", TAGS="TagA")
            await send(client, "T", b"b", TAGS="TagB")
            await send(client, "T", b"a2", TAGS="TagA")
            _, got = await pop(client, "g", "T", exp="TagA")
            assert [p.msg.body for p in got] == [b"a", b"a2"]
            reply, _ = await pop(client, "g", "T", exp="TagA")  # cursor moved past TagB too
            assert reply.code == ResponseCode.POLLING_TIMEOUT


async def test_sql92_filter_and_its_wake_ups(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """An SQL92 pop takes only the messages whose properties match (the cursor moves past the
    rest), a parked one is woken by a matching arrival only, and a bad expression is
    SUBSCRIPTION_PARSE_FAILED."""
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            for body, price in ((b"cheap", "3"), (b"dear", "30"), (b"dearer", "300")):
                await send(client, "T", body, price=price)
            sql = "price >= 10"
            _, got = await pop(client, "g", "T", exp=sql, exp_type="SQL92")
            assert [p.msg.body for p in got] == [b"dear", b"dearer"]
            async with broker.connect() as producer, trio.open_nursery() as nursery:

                async def later() -> None:
                    await trio.sleep(0.3)
                    await send(producer, "T", b"cheap again", price="1")
                    await trio.sleep(0.3)
                    await send(producer, "T", b"dear again", price="99")

                nursery.start_soon(later)
                start = trio.current_time()
                reply, got = await pop(client, "g", "T", poll_ms=5_000, exp=sql, exp_type="SQL92")
                waited = trio.current_time() - start
            assert [p.msg.body for p in got] == [b"dear again"]
            assert waited == pytest.approx(0.6)  # the cheap one woke nobody
            assert broker.broker.pop.hub.statistics().wasted_wakeups == 0
            reply, _ = await pop(client, "g", "T", exp="price >", exp_type="SQL92")
            assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED, reply.remark


async def test_dlq_after_max_reconsume_times(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(15):
        async with (
            open_memory_broker(tmp_path, max_reconsume_times=1) as broker,
            broker.connect() as client,
        ):
            await create_topic(client, "T", queues=1)
            await send(client, "T", b"poison")
            _, (_p,) = await pop(client, "g", "T", invisible_ms=200)
            _, (r,) = await pop(client, "g", "T", invisible_ms=200, poll_ms=3_000)
            assert r.msg.reconsume_times == 1
            for _ in range(300):  # bounded: the second expiry dead-letters it
                if broker.statistics().core.pop.dead_lettered:
                    break
                await trio.sleep(0.01)
            got = broker.broker.store.get("%DLQ%g", 0, 0, 8)
            assert got.count == 1
            reply, rest = await pop(client, "g", "T", poll_ms=300)
            assert reply.code == ResponseCode.POLLING_TIMEOUT and rest == []


async def test_v1_retry_names_and_collisions_are_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(15):
        async with (
            open_memory_broker(tmp_path, retry_naming="v1") as broker,
            broker.connect() as client,
        ):
            await create_topic(client, "Order_Topic", queues=1)
            await create_topic(client, "Topic", queues=1)
            await send(client, "Order_Topic", b"o1")
            _, (_p,) = await pop(client, "MyConsumerGroup", "Order_Topic", invisible_ms=300)
            reply, got = await pop(client, "MyConsumerGroup", "Order_Topic", poll_ms=5_000)
            assert reply.code == ResponseCode.SUCCESS
            (retry,) = got
            assert retry.receipt.retry_flag is RetryFlag.RETRY_V1
            assert retry.real_topic == "%RETRY%MyConsumerGroup_Order_Topic"
            assert retry.msg.topic == "Order_Topic"
            assert (await ack(client, "MyConsumerGroup", retry)).code == ResponseCode.SUCCESS
            # (MyConsumerGroup_Order, Topic) maps to the same V1 name: refused, not mixed.
            reply, _ = await pop(client, "MyConsumerGroup_Order", "Topic")
            assert reply.code == ResponseCode.ILLEGAL_OPERATION
            assert "already used" in (reply.remark or "")


async def test_two_groups_only_the_failing_one_gets_retries_and_wakeups(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(20):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            await send(client, "T", b"shared")
            _, (_a,) = await pop(client, "A", "T", invisible_ms=300)  # A never acks
            _, (b,) = await pop(client, "B", "T", invisible_ms=300)
            assert (await ack(client, "B", b)).code == ResponseCode.SUCCESS
            async with broker.connect() as other:
                results: dict[str, list[bytes]] = {}

                async def consume(c: BrokerClient, group: str, poll_ms: int) -> None:
                    _reply, got = await pop(c, group, "T", poll_ms=poll_ms)
                    results[group] = [p.msg.body for p in got]

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume, client, "A", 5_000)
                    nursery.start_soon(consume, other, "B", 1_500)
            assert results == {"A": [b"shared"], "B": []}
            hub = broker.statistics().core.pop.hub
            assert "B" not in hub.groups or hub.groups["B"].wakeups == 0
            assert hub.wasted_wakeups == 0


async def test_orderly_pop_blocks_then_redelivers_in_order(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(15):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            for i in range(3):
                await send(client, "T", f"o{i}".encode())
            _, first = await pop(client, "g", "T", order=True, invisible_ms=400, attempt_id="a1")
            assert [p.msg.body for p in first] == [b"o0", b"o1", b"o2"]
            assert all(p.receipt.is_order for p in first)
            await send(client, "T", b"o3")
            reply, _got = await pop(client, "g", "T", order=True, attempt_id="a2")
            assert reply.code == ResponseCode.POLLING_TIMEOUT  # queue locked
            # the same attempt id (a lost response) gets the same messages at once
            _, again = await pop(client, "g", "T", order=True, invisible_ms=400, attempt_id="a1")
            assert [p.msg.body for p in again] == [b"o0", b"o1", b"o2"]
            assert all(p.msg.reconsume_times == 0 for p in again)
            assert (await ack(client, "g", again[0])).code == ResponseCode.SUCCESS
            # after the deadline the unacked ones come back, in order, from the same queue,
            # woken by the lock's expiry
            reply, back = await pop(client, "g", "T", order=True, attempt_id="a3", poll_ms=3_000)
            assert [p.msg.body for p in back] == [b"o1", b"o2"]
            assert [p.msg.reconsume_times for p in back] == [1, 1]
            for p in back:
                assert (await ack(client, "g", p)).code == ResponseCode.SUCCESS
            _, nxt = await pop(client, "g", "T", order=True, attempt_id="a4")
            assert [p.msg.body for p in nxt] == [b"o3"]


async def test_unacked_messages_survive_a_graceful_restart(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(20):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            for i in range(3):
                await send(client, "T", f"r{i}".encode())
            _, got = await pop(client, "g", "T", invisible_ms=1_500)
            assert (await ack(client, "g", got[0])).code == ResponseCode.SUCCESS
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            assert broker.statistics().core.pop.in_flight == 2
            # the receipt from before the restart still acks
            assert (await ack(client, "g", got[1])).code == ResponseCode.SUCCESS
            _, back = await pop(client, "g", "T", poll_ms=5_000)
            assert [p.msg.body for p in back] == [b"r2"]
            assert back[0].msg.reconsume_times == 1
            _reply, none = await pop(client, "g", "T", poll_ms=200)
            assert none == []
