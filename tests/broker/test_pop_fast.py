"""The pop and ack processors' fast paths give exactly what the general ones give (issue 15):
headers read straight from ``extFields``, the pop reply's header written out, a receipt read
without its field by field checks, pops answered in the reader."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.core.pop import PopBatch, lease_key
from broker.pop.inflight import Lease
from broker.pop.reader import PopRequest, PopResult
from broker.remoting.connection import Connection
from broker.remoting.dispatch import Registry
from broker.remoting.processors.ack import AckFields, _batch_receipts, _plain_ack
from broker.remoting.processors.pop import PopFields, _plain_pop, _response_ext
from broker.remoting.server import BoundRegistry
from protocol.bodies.ack import BatchAck, BatchAckMessageRequestBody
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import FieldError
from protocol.headers.pop import (
    AckMessageRequestHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
)
from protocol.receipt import (
    POP_ORDER_REVIVE_QUEUE,
    ExtraInfo,
    MsgOffsets,
    OrderCount,
    RetryFlag,
    StartOffset,
    build_msg_offset_info,
    build_order_count_info,
    build_start_offset_info,
)
from tests.broker.client import BrokerClient
from tests.broker.memory import open_memory_broker
from tests.broker.pop_client import Popped, ack, pop
from tests.broker.test_pop import create_topic
from tests.broker.test_timers import send

Reply = RemotingCommand | None
VALUES = [None, "", "0", "1", "2", "32", "-1", "-0", "-", "+3", "123456789", "1234567890",
          "-123456789", "-1234567890", "999999999999999999", "9223372036854775808", "x", "٣",
          "true", "false", "TRUE", "TAG", "*"]  # fmt: skip

#: What RocketMQ's Java client writes for an ack.
JAVA_ACK = {
    "consumerGroup": "cg",
    "topic": "orders",
    "queueId": "3",
    "offset": "1200",
    "extraInfo": "1199 1764000000123 60000 0 0 broker-a 3 1200",
    "bname": "broker-a",
}
#: ... and for a pop.
JAVA_POP = {
    "consumerGroup": "cg",
    "topic": "orders",
    "queueId": "-1",
    "maxMsgNums": "32",
    "invisibleTime": "60000",
    "pollTime": "15000",
    "bornTime": "1764000000123",
    "initMode": "0",
    "expType": "TAG",
    "exp": "*",
    "order": "false",
    "bname": "broker-a",
}
POP_FIELDS = sorted([*JAVA_POP, "attemptId"])


def _changed(base: dict[str, str], changes: dict[str, str | None]) -> dict[str, str]:
    ext = dict(base)
    for key, value in changes.items():
        if value is None:
            ext.pop(key, None)
        else:
            ext[key] = value
    return ext


def _typed_ack(ext: dict[str, str]) -> AckFields | FieldError:
    try:
        h = AckMessageRequestHeader.from_ext(ext)
    except FieldError as exc:
        return exc
    return h.consumer_group, h.topic, h.queue_id, h.offset, h.extra_info


def _typed_pop(ext: dict[str, str]) -> PopFields | FieldError:
    try:
        h = PopMessageRequestHeader.from_ext(ext)
    except FieldError as exc:
        return exc
    return PopFields(
        h.consumer_group, h.topic, h.queue_id, h.max_msg_nums, h.invisible_time, h.poll_time,
        h.init_mode, h.exp_type, h.exp, h.order, h.attempt_id,
    )  # fmt: skip


def test_java_headers_take_the_fast_paths() -> None:
    fast_ack = _plain_ack(JAVA_ACK)
    assert fast_ack is not None and fast_ack == _typed_ack(JAVA_ACK)
    fast_pop = _plain_pop(JAVA_POP)
    assert fast_pop is not None and fast_pop == _typed_pop(JAVA_POP)
    assert fast_pop.queue_id == -1 and fast_pop.order is False


@settings(max_examples=400)
@given(st.dictionaries(st.sampled_from(sorted(JAVA_ACK)), st.sampled_from(VALUES), max_size=6))
def test_ack_fast_path_is_none_or_the_typed_header(changes: dict[str, str | None]) -> None:
    ext = _changed(JAVA_ACK, changes)
    fast = _plain_ack(ext)
    if fast is not None:
        assert fast == _typed_ack(ext)


@settings(max_examples=600)
@given(st.dictionaries(st.sampled_from(POP_FIELDS), st.sampled_from(VALUES), max_size=8))
def test_pop_fast_path_is_none_or_the_typed_header(changes: dict[str, str | None]) -> None:
    ext = _changed(JAVA_POP, changes)
    fast = _plain_pop(ext)
    if fast is not None:
        assert fast == _typed_pop(ext)


LONGS = st.integers(0, 2**63 - 1)
QUEUES = st.integers(0, 2**31 - 1)
FLAGS = st.sampled_from(RetryFlag)


@st.composite
def batches(draw: st.DrawFn) -> PopBatch:
    order = draw(st.booleans())
    req = PopRequest("g", "T", -1, 32, draw(st.integers(1, 2**63 - 1)), order=order)
    queues = draw(st.lists(st.tuples(FLAGS, QUEUES), unique=True, max_size=3))
    found = draw(st.booleans()) and bool(queues)
    result = PopResult(pop_time=draw(LONGS), rest=draw(LONGS))
    for flag, queue_id in queues:
        offsets = draw(st.lists(LONGS, min_size=1, max_size=3))
        result.start_offsets.append(StartOffset(flag, queue_id, offsets[0]))
        result.msg_offsets.append(MsgOffsets(flag, queue_id, offsets))
        if order:
            result.order_counts.append(OrderCount(flag, queue_id, None, draw(st.integers(0, 9))))
    if found:
        result.leases.append(Lease("g", "T", 0, 0, result.pop_time, req.invisible_ms, "T"))
    return PopBatch(req, result, "broker-a")


@given(batches())
def test_pop_response_ext_is_the_typed_header(batch: PopBatch) -> None:
    req, result = batch.request, batch.result
    typed = PopMessageResponseHeader(
        pop_time=result.pop_time,
        invisible_time=req.invisible_ms,
        revive_qid=POP_ORDER_REVIVE_QUEUE if req.order else 0,
        rest_num=result.rest,
        start_offset_info=build_start_offset_info(result.start_offsets) or None,
        msg_offset_info=build_msg_offset_info(result.msg_offsets) or None,
        order_count_info=build_order_count_info(result.order_counts) or None,
    ).to_ext()
    ours = _response_ext(batch)
    assert ours == typed
    assert list(ours) == list(typed)


async def test_a_pop_that_parks_after_the_quick_try_rotates_as_one_read(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A pop with a hold that finds nothing is tried in the reader, taken back and parked in
    a task: its read leaves the queue rotation as one read does (the retry topic and the
    first queue move once per pop, not twice), and the parked pop is woken as before."""
    with trio.fail_after(30):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=4)
            reader = broker.broker.pops.engine.reader
            req = broker.broker.pops.request("g", "T", -1, 32, 60_000)
            assert reader.rotation(req) == (None, None)
            async with trio.open_nursery() as nursery:

                async def parked() -> None:
                    reply, got = await pop(client, "g", "T", poll_ms=10_000)
                    assert reply.code == ResponseCode.SUCCESS
                    assert [p.msg.body for p in got] == [b"late"]

                nursery.start_soon(parked)
                await trio.sleep(1)
                assert reader.rotation(req) == (True, 1)  # one read so far: flipped once
                await send(client, "T", b"late")
            # The woken pop read once more (a wake-up re-reads, as before).
            assert reader.rotation(req) == (False, 2)
            reply, got = await pop(client, "g", "T", poll_ms=0)  # nothing left, no hold
            assert reply.code == ResponseCode.POLLING_TIMEOUT and got == []
            assert reader.rotation(req) == (True, 3)


async def test_acks_through_the_fast_paths_and_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Pop answered in the reader, acks read straight from their fields: every ack succeeds
    once, a second ack of the same receipt is NO_MESSAGE, a malformed receipt is
    INVALID_PARAMETER."""
    with trio.fail_after(30):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T")
            for i in range(6):
                await send(client, "T", f"m{i}".encode())
            reply, got = await pop(client, "g", "T")
            assert reply.code == ResponseCode.SUCCESS and len(got) == 6
            for p in got:
                assert (await ack(client, "g", p)).code == ResponseCode.SUCCESS
            again = await ack(client, "g", got[0])
            assert again.code == ResponseCode.NO_MESSAGE
            bad = await client.call(
                RequestCode.ACK_MESSAGE,
                {**_ack_ext(got[0].real_topic, got[0]), "extraInfo": "1 2 3"},
            )
            assert bad.code == ResponseCode.INVALID_PARAMETER
            assert broker.statistics().core.pop.in_flight == 0


def _ack_ext(topic: str, p: Popped) -> dict[str, str]:
    return AckMessageRequestHeader(
        consumer_group="g", topic=topic, queue_id=p.msg.queue_id,
        extra_info=p.receipt.encode(), offset=p.msg.queue_offset,
    ).to_ext()  # fmt: skip


# ------------------------------------------------------------------ a burst of acks together
def _ack_cmd(group: str, topic: str, queue_id: int, offset: int, receipt: str) -> RemotingCommand:
    ext = {"consumerGroup": group, "topic": topic, "queueId": str(queue_id),
           "offset": str(offset), "extraInfo": receipt}  # fmt: skip
    return request(RequestCode.ACK_MESSAGE, 0, ext)


async def _burst(client: BrokerClient, cmds: list[RemotingCommand]) -> list[RemotingCommand]:
    """``cmds`` written in one write (one read of the broker's), their replies in order."""
    sent = [client.protocol.send_request(cmd) for cmd in cmds]
    await client.send_raw(b"".join(data for _, data in sent))
    return [await client.reply(opaque) for opaque, _ in sent]


def _script(got: list[Popped]) -> list[RemotingCommand]:
    """Acks of every kind one read may bring: fine ones, a second ack of the same message, a
    stale pop time, an unknown offset, a malformed receipt, a header missing a field, an
    illegal group name."""
    p0, p1, p2, p3 = got[:4]
    stale = dataclasses.replace(p2.receipt, pop_time_ms=p2.receipt.pop_time_ms - 1)
    return [
        _ack_cmd("g", "T", p0.msg.queue_id, p0.msg.queue_offset, p0.receipt.encode()),
        _ack_cmd("g", "T", p1.msg.queue_id, p1.msg.queue_offset, p1.receipt.encode()),
        _ack_cmd("g", "T", p0.msg.queue_id, p0.msg.queue_offset, p0.receipt.encode()),
        _ack_cmd("g", "T", p2.msg.queue_id, p2.msg.queue_offset, stale.encode()),
        _ack_cmd("g", "T", p2.msg.queue_id, 999, p2.receipt.encode()),
        _ack_cmd("g", "T", p2.msg.queue_id, p2.msg.queue_offset, "0 1 2"),
        request(RequestCode.ACK_MESSAGE, 0, {"consumerGroup": "g", "topic": "T"}),
        _ack_cmd("bad group!", "T", p3.msg.queue_id, p3.msg.queue_offset, p3.receipt.encode()),
        _ack_cmd("g", "T", p3.msg.queue_id, p3.msg.queue_offset, p3.receipt.encode()),
        _ack_cmd("g", "T", p2.msg.queue_id, p2.msg.queue_offset, p2.receipt.encode()),
    ]


async def test_a_burst_of_acks_is_answered_as_one_ack_after_another_in_one_journal_write(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The same acks, on two brokers in the same state: in one write (one read, one group:
    one journal write) and one at a time. Every reply (code and remark) and what is left in
    flight are the same."""
    answers: list[list[tuple[int, str | None]]] = []
    for mode in ("burst", "one by one"):
        with trio.fail_after(30):
            async with open_memory_broker(tmp_path / mode) as broker, broker.connect() as c:
                await create_topic(c, "T", queues=1)
                for i in range(5):
                    await send(c, "T", f"m{i}".encode())
                reply, got = await pop(c, "g", "T")
                assert reply.code == ResponseCode.SUCCESS and len(got) == 5
                journal = broker.broker.pops.engine.journal
                appended = journal.appended
                cmds = _script(got)
                if mode == "burst":
                    replies = await _burst(c, cmds)
                    assert journal.appended == appended + 1
                else:
                    replies = [await c.request(cmd) for cmd in cmds]
                answers.append([(r.code, r.remark) for r in replies])
                assert broker.statistics().core.pop.in_flight == 1
    assert answers[0] == answers[1]
    codes = [code for code, _ in answers[0]]
    ok, gone, bad = ResponseCode.SUCCESS, ResponseCode.NO_MESSAGE, ResponseCode.INVALID_PARAMETER
    assert codes == [ok, ok, gone, gone, gone, bad, bad, bad, ok, ok]


async def test_a_burst_of_acks_the_journal_cannot_record_fails_whole(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A journal write that fails fails every ack of the burst that reached it (SYSTEM_ERROR,
    nothing acked, as a single ack); the same acks succeed once the journal writes again."""
    with trio.fail_after(30):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            for i in range(3):
                await send(client, "T", f"m{i}".encode())
            _, got = await pop(client, "g", "T")
            table = broker.broker.pops.engine.table
            write = table.on_op

            def full(op: object) -> None:
                raise OSError(28, "No space left on device")

            cmds = [
                _ack_cmd("g", "T", p.msg.queue_id, p.msg.queue_offset, p.receipt.encode())
                for p in got
            ]
            table.on_op = full
            replies = await _burst(client, cmds)
            assert [r.code for r in replies] == [ResponseCode.SYSTEM_ERROR] * 3
            assert all("not recorded" in (r.remark or "") for r in replies)
            assert broker.statistics().core.pop.in_flight == 3
            table.on_op = write
            replies = await _burst(client, cmds)
            assert [r.code for r in replies] == [ResponseCode.SUCCESS] * 3
            assert broker.statistics().core.pop.in_flight == 0


async def test_a_guarded_group_runs_what_the_guard_lets_through_in_order() -> None:
    """With ACL on, the guard refuses requests of a group one by one (in their places, a
    oneway one unanswered); the group handler sees only the others, in order."""
    seen: list[int] = []

    def group(ctx: None, conn: Connection, cmds: Sequence[RemotingCommand]) -> list[Reply]:
        seen.extend(cmd.opaque for cmd in cmds)
        return [cmd.response(remark="ran") for cmd in cmds]

    async def handler(ctx: None, conn: Connection, cmd: RemotingCommand) -> Reply:
        raise AssertionError("the group handler answers")

    def guard(peer: str, cmd: RemotingCommand) -> RemotingCommand | None:
        return cmd.response(ResponseCode.NO_PERMISSION, "no") if cmd.opaque % 3 == 0 else None

    registry: Registry[None] = Registry("test")
    registry.register([RequestCode.ACK_MESSAGE], handler, group=group)
    bound = BoundRegistry(registry, None, guard=guard)
    assert bound.grouped == {RequestCode.ACK_MESSAGE}
    send, _ = trio.open_memory_channel[bytes](1)
    conn = Connection("peer", send)
    cmds = [request(RequestCode.ACK_MESSAGE, n, {}) for n in range(1, 8)]
    cmds[5] = request(RequestCode.ACK_MESSAGE, 6, {}, oneway=True)
    replies = bound.answer_group(conn, cmds)
    assert seen == [1, 2, 4, 5, 7]
    assert [r.remark if r else None for r in replies] == [
        "ran", "ran", "no", "ran", "ran", None, "ran"
    ]  # fmt: skip


async def test_a_pop_into_an_emptied_table_pokes_the_revive_loop_only_when_earlier(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The revive loop sleeps until at most the deadline it last read. A pop whose leases end
    later (the table emptied by acks meanwhile) does not wake it, one ending earlier does,
    and either message is revived exactly at its deadline."""
    with trio.fail_after(60):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            revive = broker.broker.pops.engine.revive
            pokes: list[float] = []
            poke = revive.poke

            def counted() -> None:
                pokes.append(trio.current_time())
                poke()

            revive.poke = counted
            await send(client, "T", b"m0")
            _, (m0,) = await pop(client, "g", "T", invisible_ms=10_000)
            assert len(pokes) == 1  # the loop slept with nothing to revive
            await trio.sleep(0.1)  # the loop reads the new deadline
            assert (await ack(client, "g", m0)).code == ResponseCode.SUCCESS
            await send(client, "T", b"later")
            t0 = trio.current_time()
            _ = await pop(client, "g", "T", invisible_ms=20_000)
            assert len(pokes) == 1  # ends after the deadline the loop wakes at anyway
            got = await _pop_parked(client)
            assert [p.msg.body for p in got] == [b"later"]  # revived, no poke needed
            assert trio.current_time() - t0 == pytest.approx(20.0, abs=0.002)
            await send(client, "T", b"sooner")  # the loop sleeps until the retry's deadline
            t1, before = trio.current_time(), len(pokes)  # the revive poked on its own
            _ = await pop(client, "g", "T", invisible_ms=5_000)
            assert len(pokes) == before + 1  # ends before it: the loop is woken
            got = await _pop_parked(client)
            assert [p.msg.body for p in got] == [b"sooner"]
            assert trio.current_time() - t1 == pytest.approx(5.0, abs=0.002)


async def _pop_parked(client: BrokerClient) -> list[Popped]:
    """Pop with the longest hold until something comes (the broker caps a hold at 15 s)."""
    for _ in range(10):  # bounded
        _, got = await pop(client, "g", "T", poll_ms=15_000)
        if got:
            return got
    return []


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["g", "g2"]),
            st.sampled_from(["T", "%RETRY%g+T", "%RETRY%g_T"]),
            st.sampled_from(["0", "1", "2", "x", ""]),
            st.integers(0, 3),
            st.lists(st.integers(0, 2**40), max_size=4),
        ),
        max_size=4,
    )
)
def test_batch_receipts_key_each_offset_as_its_receipt_would(
    entries: list[tuple[str, str, str, int, list[int]]],
) -> None:
    """The lease keys of a batch ack, its topic found once per entry, are those
    ``lease_key`` gives each offset's receipt."""
    acks = tuple(
        BatchAck(consumer_group=g, topic=t, start_offset=0, queue_id=q, revive_queue_id=0,
                 pop_time=1_000 + q, invisible_time=60_000, retry=r, offsets=tuple(offsets))
        for g, t, r, q, offsets in entries
    )  # fmt: skip
    body = BatchAckMessageRequestBody(broker_name="broker-a", acks=acks)
    expected = []
    for e in body.acks:
        flag = RetryFlag(int(e.retry)) if e.retry in ("0", "1", "2") else RetryFlag.NORMAL
        receipt = ExtraInfo(0, e.pop_time, 60_000, 0, flag, "broker-a", e.queue_id)
        for offset in e.offsets:
            key = lease_key(e.consumer_group, e.topic, e.queue_id, offset, receipt)
            expected.append((key, e.pop_time))
    assert _batch_receipts(body) == expected
