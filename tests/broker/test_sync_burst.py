"""SYNC flush mode, a burst of sends in one read: stored in the reader in the order they
came, answered together after one fsync (broker/remoting/server.py ``_store_group``,
``SendService.send_nowait`` / ``settle``), with every reply what a send alone would get.

The broker runs over memory streams on trio's mock clock; its fsyncs go through an
``Offload`` the test holds shut or makes fail.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trio.testing

from broker.remoting.dispatch import Registry
from protocol.codes import RequestCode, ResponseCode
from protocol.command import FLAG_ONEWAY, RemotingCommand, request
from protocol.frame import encode_command
from protocol.headers.send import SendMessageResponseHeader
from protocol.message import decode_record
from protocol.properties import DELAY, TAGS
from tests.broker.client import BrokerClient
from tests.broker.memory import open_memory_broker
from tests.broker.test_server import send_header, send_v2

T = TypeVar("T")
TOPIC = "SyncBurst"


class Fsyncs:
    """An ``Offload`` whose file work (the flusher's and the checkpointer's fsyncs, which
    both make the log durable) waits for :meth:`open`; with ``failing``, it then fails."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.waiting = 0
        self.failing = False

    def open(self) -> None:
        self.gate.set()

    async def __call__(self, fn: Callable[[], T], /, *, abandon_on_cancel: bool = False) -> T:
        await trio.lowlevel.checkpoint()
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        if self.failing:
            raise OSError(5, "injected fsync failure")
        return fn()


def _burst(client: BrokerClient, cmds: list[RemotingCommand]) -> tuple[list[int], bytes]:
    """The opaques and the bytes of ``cmds`` written back to back (one write)."""
    opaques = [client.next_opaque() for _ in cmds]
    data = b"".join(
        encode_command(c._replace(opaque=o)) for c, o in zip(cmds, opaques, strict=True)
    )
    return opaques, data


async def _replies(client: BrokerClient, opaques: list[int]) -> list[RemotingCommand]:
    return [await client.reply(o) for o in opaques]


def _queue_offsets(replies: list[RemotingCommand]) -> list[int]:
    out = []
    for reply in replies:
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        out.append(SendMessageResponseHeader.from_ext(reply.ext_fields).queue_offset)
    return out


async def test_a_burst_is_stored_in_arrival_order_and_answered_only_after_its_fsync(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fsyncs = Fsyncs()
    async with (
        open_memory_broker(tmp_path, flush="sync", offload=fsyncs) as broker,
        broker.connect() as client,
    ):
        header = send_header(TOPIC)
        cmds = [send_v2(header, b"m%d" % i) for i in range(12)]
        opaques, data = _burst(client, cmds)
        await client.send_raw(data)
        await trio.sleep(5)  # fsync held: stored, not answered
        assert fsyncs.waiting
        early = [await client.reply(o) for o in opaques if client.has_reply(o)]
        assert not early, [(r.code, r.remark) for r in early]
        assert broker.broker.store.max_offset(TOPIC, 0) == 0  # SYNC: dispatched once durable
        fsyncs.open()
        replies = await _replies(client, opaques)
        assert _queue_offsets(replies) == list(range(12))  # the order they came in
        for reply, i in zip(replies, range(12), strict=True):
            header_out = SendMessageResponseHeader.from_ext(reply.ext_fields)
            found = broker.broker.store.get(TOPIC, 0, header_out.queue_offset, 1)
            assert decode_record(found.body)[0].body == b"m%d" % i
        stats = broker.statistics().remoting
        assert (stats.in_flight, stats.unsent) == (0, 0)


async def test_a_failed_fsync_answers_the_whole_burst_service_not_available(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fsyncs = Fsyncs()
    fsyncs.failing = True
    async with (
        open_memory_broker(tmp_path, flush="sync", offload=fsyncs) as broker,
        broker.connect() as client,
    ):
        opaques, data = _burst(client, [send_v2(send_header(TOPIC)) for _ in range(5)])
        await client.send_raw(data)
        await trio.sleep(1)
        fsyncs.open()
        for reply in await _replies(client, opaques):
            assert reply.code == ResponseCode.SERVICE_NOT_AVAILABLE
            assert "injected fsync failure" in (reply.remark or "")
        # A send alone, with the disk still failing: the same answer.
        alone = await client.request(send_v2(send_header(TOPIC)))
        assert alone.code == ResponseCode.SERVICE_NOT_AVAILABLE


async def test_delayed_bad_and_oneway_sends_in_a_burst_get_what_they_get_alone(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_memory_broker(tmp_path, flush="sync") as broker,
        broker.connect() as client,
    ):
        plain = send_v2(send_header(TOPIC, properties={TAGS: "a"}))
        delayed = send_v2(send_header(TOPIC, properties={DELAY: "2"}))
        bad_queue = send_v2(send_header(TOPIC, queue_id=99))
        system = send_v2(send_header("TBW102"))
        oneway = plain._replace(flag=plain.flag | FLAG_ONEWAY)
        cmds = [plain, bad_queue, plain, system, delayed, plain, oneway, plain]
        opaques, data = _burst(client, cmds)
        await client.send_raw(data)
        answered = [o for c, o in zip(cmds, opaques, strict=True) if not c.is_oneway]
        replies = dict(zip(answered, await _replies(client, answered), strict=True))
        codes = [replies[o].code if o in replies else None for o in opaques]
        # What each gets alone: a queue id past the topic's write queues is refused, a
        # system topic may not be written.
        assert codes == [
            ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR, ResponseCode.SUCCESS,
            ResponseCode.NO_PERMISSION, ResponseCode.SUCCESS, ResponseCode.SUCCESS, None,
            ResponseCode.SUCCESS,
        ]  # fmt: skip
        assert "queueId 99 is illegal" in (replies[opaques[1]].remark or "")
        assert _queue_offsets([replies[opaques[i]] for i in (0, 2)]) == [0, 1]
        await trio.sleep(1)
        assert not client.has_reply(opaques[6])
        # Everything stored: 5 plain (the oneway one included), the delayed one once due
        # (level 2: 5 s).
        await trio.sleep(5)
        total = sum(broker.broker.store.max_offset(TOPIC, q) for q in range(4))
        assert total == 6


async def test_a_burst_past_the_connections_waiting_cap_is_refused_busy_beyond_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    fsyncs = Fsyncs()
    async with (
        open_memory_broker(
            tmp_path, flush="sync", offload=fsyncs, max_waiting_per_connection=4
        ) as broker,
        broker.connect() as client,
    ):
        opaques, data = _burst(client, [send_v2(send_header(TOPIC)) for _ in range(7)])
        await client.send_raw(data)
        await trio.sleep(1)
        # The three past the cap are answered at once; the four wait for the fsync.
        for o in opaques[4:]:
            busy = await client.reply(o)
            assert busy.code == ResponseCode.SYSTEM_BUSY
            assert "limit 4" in (busy.remark or "")
        assert not any(client.has_reply(o) for o in opaques[:4])
        fsyncs.open()
        assert _queue_offsets(await _replies(client, opaques[:4])) == [0, 1, 2, 3]


# ---------------------------------------------------------------- the registry's part
def _registry(stored: list[RemotingCommand]) -> Registry[None]:
    async def handler(ctx: None, conn: Any, cmd: RemotingCommand) -> RemotingCommand:
        raise AssertionError("not dispatched")

    def store(ctx: None, conn: Any, cmd: RemotingCommand) -> object | None:
        if cmd.body == b"raise":
            raise ValueError("store bug")
        if cmd.body == b"later":
            return None
        stored.append(cmd)
        return cmd.body

    async def settle(
        ctx: None, conn: Any, pairs: Sequence[tuple[RemotingCommand, object]]
    ) -> list[RemotingCommand]:
        await trio.lowlevel.checkpoint()
        return [cmd.response(ResponseCode.SUCCESS, str(token)) for cmd, token in pairs]

    registry: Registry[None] = Registry("test")
    registry.register([RequestCode.SEND_MESSAGE], handler, stores=True, durable=(store, settle))
    return registry


async def test_store_group_answers_in_order_and_hands_back_from_the_first_that_needs_a_task() -> (
    None
):
    stored: list[RemotingCommand] = []
    registry = _registry(stored)
    bodies = [b"a", b"raise", b"refused", b"b", b"later", b"c"]
    cmds = [request(RequestCode.SEND_MESSAGE, i, {}, body) for i, body in enumerate(bodies)]
    cmds[3] = cmds[3]._replace(flag=cmds[3].flag | FLAG_ONEWAY)

    def refuse(cmd: RemotingCommand) -> RemotingCommand | None:
        return cmd.response(ResponseCode.NO_PERMISSION, "no") if cmd.body == b"refused" else None

    taken, replies = registry.store_group(None, None, cmds, refuse)  # type: ignore[arg-type]
    assert taken == 4  # up to the one that needs its handler; "c" is not stored
    assert [c.body for c in stored] == [b"a", b"b"]
    answers = await replies
    assert [(a.code, a.remark) if a else None for a in answers] == [
        (ResponseCode.SUCCESS, "b'a'"),
        (ResponseCode.SYSTEM_ERROR, "ValueError: store bug"),
        (ResponseCode.NO_PERMISSION, "no"),
        None,  # oneway: stored, not answered
    ]


@pytest.mark.parametrize("first", [b"later"])
async def test_store_group_takes_none_when_the_first_needs_its_handler(first: bytes) -> None:
    registry = _registry([])
    cmds = [request(RequestCode.SEND_MESSAGE, 0, {}, first)]
    taken, replies = registry.store_group(None, None, cmds)  # type: ignore[arg-type]
    assert taken == 0
    assert await replies == []
