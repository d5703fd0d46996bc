"""Transactional messages over real TCP: half messages, END_TRANSACTION (37) and the broker's
check-backs (CHECK_TRANSACTION_STATE, 39), with the frames Remoting producers send.

Every test runs a broker in-process on 127.0.0.1 (short check immunity and interval so check
-backs come within a second) and talks to it with the small test client; the restart tests run
the broker as a process and kill it with SIGKILL.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.halves import DISCARD_TOPIC, HALF_TOPIC
from protocol.bodies.heartbeat import HeartbeatData, ProducerData
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.headers.send import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.headers.transaction import CheckTransactionStateRequestHeader
from protocol.message import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    MessageExt,
    decode_record,
)
from protocol.msgid import decode_offset_msg_id
from protocol.properties import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    KEYS,
    PGROUP,
    REAL_TOPIC,
    TAGS,
    TRAN_MSG,
    UNIQ_KEY,
    encode_properties,
)
from tests.broker.client import BrokerClient, open_broker, open_client
from tests.broker.test_restart import broker_process, kill9, pull_queue, pull_topic, sigterm

pytestmark = pytest.mark.integration

TOPIC = "TxnTopic"
GROUP = "txn_producer"
TIMEOUT = 20
#: Check-backs in these tests: first 0.3 s after the half, then every 0.3 s.
FAST_CHECKS = {"transaction_immunity_s": 0.3, "transaction_check_interval_s": 0.3}
#: Check-backs of the broker processes: slower (a process starts in about a second).
SLOW_CHECKS = {"transaction_immunity_s": 1, "transaction_check_interval_s": 1}
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0


@dataclass(frozen=True)
class HalfSent:
    """What a half send answered: the ids END_TRANSACTION names the half by."""

    key: str
    msg_id: str
    commit_offset: int
    queue_offset: int
    queue_id: int


def half_request(key: str, *, group: str = GROUP, **props: str) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group=group, topic=TOPIC, default_topic="TBW102", default_topic_queue_nums=4,
        queue_id=0, sys_flag=0x4, born_timestamp=1_700_000_000_000, flag=0,
        properties=encode_properties(
            {UNIQ_KEY: key, TAGS: "TagT", KEYS: f"{key} k2", TRAN_MSG: "true", PGROUP: group,
             **props}
        ),
    )  # fmt: skip
    return request(RequestCode.SEND_MESSAGE_V2, 0, header.to_v2_ext(), b"txn body")


async def send_half(client: BrokerClient, key: str, **props: str) -> HalfSent:
    reply = await client.request(half_request(key, **props))
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    header = SendMessageResponseHeader.from_ext(reply.ext_fields)
    _, _, commit_offset = decode_offset_msg_id(header.msg_id)
    return HalfSent(key, header.msg_id, commit_offset, header.queue_offset, header.queue_id)


def end_request(
    half: HalfSent,
    resolution: int,
    *,
    from_check: bool = False,
    group: str = GROUP,
    queue_offset: int | None = None,
    commit_offset: int | None = None,
) -> RemotingCommand:
    """END_TRANSACTION as client-cpp sends it: string fields, "0"/"1" for the check flag, an
    empty transaction id on the first call, and no oneway flag."""
    ext = {
        "producerGroup": group,
        "tranStateTableOffset": str(half.queue_offset if queue_offset is None else queue_offset),
        "commitLogOffset": str(half.commit_offset if commit_offset is None else commit_offset),
        "commitOrRollback": str(resolution),
        "fromTransactionCheck": "1" if from_check else "0",
        "msgId": half.msg_id,
        "transactionId": "",
    }  # fmt: skip
    return request(RequestCode.END_TRANSACTION, 0, ext)


async def end(
    client: BrokerClient, half: HalfSent, resolution: int, **kw: object
) -> RemotingCommand:
    return await client.request(end_request(half, resolution, **kw))  # type: ignore[arg-type]


async def published(client: BrokerClient) -> list[MessageExt]:
    return await pull_queue(client, TOPIC, 0)


async def register_producer(client: BrokerClient, client_id: str, group: str = GROUP) -> None:
    """A producer-only heartbeat: the connection now stands for ``group``."""
    data = HeartbeatData(client_id=client_id, producer_data_set=(ProducerData(group),))
    reply = await client.call(RequestCode.HEART_BEAT, body=data.to_json())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


def checks_of(client: BrokerClient) -> list[tuple[CheckTransactionStateRequestHeader, MessageExt]]:
    out = []
    for note in client.notifications:
        if note.code == RequestCode.CHECK_TRANSACTION_STATE:
            out.append((CheckTransactionStateRequestHeader.from_ext(note.ext_fields),
                        decode_record(note.body)[0]))  # fmt: skip
    return out


async def wait_checks(client: BrokerClient, count: int) -> None:
    with trio.fail_after(TIMEOUT):
        while len(checks_of(client)) < count:
            await client.wait_notifications(len(client.notifications) + 1)


# ---------------------------------------------------------------- decisions
async def test_a_half_is_invisible_until_committed_then_published_once(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            half = await send_half(client, "k-commit", user="v")
            assert half.queue_id == 0
            assert await published(client) == []
            halves = await pull_queue(client, HALF_TOPIC, 0)
            assert [m.properties[REAL_TOPIC] for m in halves] == [TOPIC]

            reply = await end(client, half, COMMIT)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            [msg] = await published(client)
            assert msg.body == b"txn body"
            assert msg.properties[UNIQ_KEY] == "k-commit"
            assert msg.properties[TAGS] == "TagT" and msg.properties[KEYS] == "k-commit k2"
            assert msg.properties["user"] == "v" and msg.properties[PGROUP] == GROUP
            assert TRAN_MSG not in msg.properties and REAL_TOPIC not in msg.properties
            assert msg.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_COMMIT
            assert msg.prepared_transaction_offset == half.commit_offset

            # Decided once: a repeated commit or a late rollback changes nothing.
            for resolution in (COMMIT, ROLLBACK):
                again = await end(client, half, resolution)
                assert again.code == ResponseCode.SUCCESS
                assert "decided already" in (again.remark or "")
            assert len(await published(client)) == 1
            stats = broker.broker.transactions.statistics()
            assert (stats.prepared, stats.committed, stats.pending) == (1, 1, 0)


async def test_rollback_publishes_nothing_and_unknown_gets_no_answer(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            half = await send_half(client, "k-rollback")
            unknown = end_request(half, UNKNOWN)
            opaque, data = client.protocol.send_request(unknown)
            await client.send_raw(data)
            # Requests of a connection are answered in order: once a later one is answered,
            # the UNKNOWN one would have been.
            assert (await end(client, half, ROLLBACK)).code == ResponseCode.SUCCESS
            assert not client.has_reply(opaque)
            assert (await end(client, half, COMMIT)).code == ResponseCode.SUCCESS  # ignored
            assert await published(client) == []
            stats = broker.broker.transactions.statistics()
            assert (stats.rolled_back, stats.committed, stats.pending) == (1, 0, 0)


async def test_ends_that_do_not_match_a_half_are_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            half = await send_half(client, "k-bad")
            cases: list[tuple[dict[str, Any], int]] = [
                ({"commit_offset": half.commit_offset + 1}, ResponseCode.SYSTEM_ERROR),
                ({"group": "other_group"}, ResponseCode.TRANSACTION_FAILED),
                ({"queue_offset": half.queue_offset + 5}, ResponseCode.TRANSACTION_FAILED),
            ]
            for fields, code in cases:
                reply = await end(client, half, COMMIT, **fields)
                assert reply.code == code, (fields, reply.remark)
            bad = end_request(half, 4)  # neither 0, 8 nor 12
            assert (await client.request(bad)).code == ResponseCode.INVALID_PARAMETER
            # A normal message with the commit bits set is stored as a plain message.
            header = SendMessageRequestHeader(
                producer_group=GROUP, topic=TOPIC, default_topic="TBW102",
                default_topic_queue_nums=4, queue_id=0, sys_flag=SYSFLAG_TRANSACTION_COMMIT,
                born_timestamp=0, flag=0, properties=encode_properties({UNIQ_KEY: "plain"}),
            )  # fmt: skip
            plain = request(RequestCode.SEND_MESSAGE_V2, 0, header.to_v2_ext(), b"x")
            assert (await client.request(plain)).code == ResponseCode.SUCCESS
            [msg] = await published(client)
            assert msg.sys_flag & SYSFLAG_TRANSACTION_MASK == 0
            assert broker.broker.transactions.statistics().pending == 1
            assert (await end(client, half, COMMIT)).code == ResponseCode.SUCCESS


async def test_a_transactional_batch_is_refused(tmp_path: Path) -> None:
    from protocol.batch import BatchEntry, encode_batch

    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            entries = [BatchEntry(b"a", {UNIQ_KEY: "b1", TRAN_MSG: "true"})]
            header = SendMessageRequestHeader(
                producer_group=GROUP, topic=TOPIC, default_topic="TBW102",
                default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=0, flag=0,
                properties="", batch=True,
            )  # fmt: skip
            cmd = request(
                RequestCode.SEND_BATCH_MESSAGE, 0, header.to_v2_ext(), encode_batch(entries)
            )
            reply = await client.request(cmd)
            assert reply.code == ResponseCode.MESSAGE_ILLEGAL
            assert "transactional" in (reply.remark or "")


# ---------------------------------------------------------------- check-backs
async def test_check_back_asks_a_producer_of_the_group_and_its_answer_decides(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path, **FAST_CHECKS) as broker,
            open_client(broker.port) as sender,
            open_client(broker.port) as checker,
        ):
            stranger = await send_half(sender, "k-stranger", group="other_producer")
            first = await send_half(sender, "k-check-1")
            second = await send_half(sender, "k-check-2")
            # The sender never sent a heartbeat: the check goes to the group's producer.
            await register_producer(checker, "checker@1")
            await wait_checks(checker, 2)
            asked = {h.commit_log_offset: m for h, m in checks_of(checker)}
            assert set(asked) <= {first.commit_offset, second.commit_offset}
            assert stranger.commit_offset not in asked
            for header, msg in checks_of(checker)[:2]:
                assert msg.topic == TOPIC and msg.queue_id == 0
                assert msg.properties[PGROUP] == GROUP and msg.properties[TRAN_MSG] == "true"
                assert header.msg_id == msg.properties[UNIQ_KEY] == header.transaction_id
                half = first if header.commit_log_offset == first.commit_offset else second
                assert header.tran_state_table_offset == half.queue_offset
            assert not sender.notifications

            # An UNKNOWN answer: asked again; then commit and rollback by check.
            await checker.send(end_request(first, UNKNOWN, from_check=True))
            seen = len(checks_of(checker))
            await wait_checks(checker, seen + 2)
            reply = await end(checker, first, COMMIT, from_check=True)
            assert reply.code == ResponseCode.SUCCESS
            reply = await end(checker, second, ROLLBACK, from_check=True)
            assert reply.code == ResponseCode.SUCCESS
            assert [m.properties[UNIQ_KEY] for m in await published(sender)] == ["k-check-1"]
            # Decided halves are never asked about again.
            seen = len(checks_of(checker))
            await trio.sleep(1.0)  # three check intervals
            assert len(checks_of(checker)) == seen
            assert broker.broker.transactions.statistics().pending == 1  # the stranger's


async def test_a_half_asked_the_maximum_times_is_discarded_for_admins(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path, transaction_check_max=2, **FAST_CHECKS) as broker,
            open_client(broker.port) as client,
        ):
            half = await send_half(client, "k-dead")
            await register_producer(client, "silent@1")
            await wait_checks(client, 2)
            stats = broker.broker.transactions.statistics
            while not stats().discarded:  # noqa: ASYNC110 (bounded by the test's fail_after)
                await trio.sleep(0.05)
            [copy] = await pull_queue(client, DISCARD_TOPIC, 0)
            assert copy.properties[UNIQ_KEY] == "k-dead" and copy.body == b"txn body"
            assert copy.properties[REAL_TOPIC] == TOPIC
            assert len(checks_of(client)) == 2
            assert await published(client) == []
            assert (await end(client, half, COMMIT)).code == ResponseCode.SUCCESS  # too late
            assert await published(client) == []
            assert stats().discarded == 1 and stats().pending == 0


async def test_checks_wait_for_a_producer_and_count_only_when_one_is_asked(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path, transaction_check_max=1, **FAST_CHECKS) as broker,
            open_client(broker.port) as client,
        ):
            half = await send_half(client, "k-late", **{CHECK_IMMUNITY_TIME_IN_SECONDS: "0"})
            await trio.sleep(1.0)  # several intervals with nobody to ask
            assert broker.broker.transactions.statistics().checks == 0
            await register_producer(client, "late@1")
            await wait_checks(client, 1)
            assert (await end(client, half, COMMIT, from_check=True)).code == 0
            assert [m.properties[UNIQ_KEY] for m in await published(client)] == ["k-late"]


# ---------------------------------------------------------------- restarts
@pytest.mark.e2e
async def test_decisions_and_undecided_halves_survive_kill9_and_a_clean_stop(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with trio.fail_after(120):
        async with broker_process(data, flush="sync", **SLOW_CHECKS) as broker:
            async with open_client(broker.port) as client:
                committed = await send_half(client, "k-c")
                rolled = await send_half(client, "k-r")
                open_ = await send_half(client, "k-open")
                assert (await end(client, committed, COMMIT)).code == 0
                assert (await end(client, rolled, ROLLBACK)).code == 0
            # Killed within the checkpoint interval: the decisions are only in the log (and
            # SYNC flush made every answered request durable).
            await kill9(broker)
        async with broker_process(data, flush="sync", **SLOW_CHECKS) as broker:
            async with open_client(broker.port) as client:
                assert [m.properties[UNIQ_KEY] for m in await pull_topic(client, TOPIC)] == ["k-c"]
                await register_producer(client, "restarted@1")
                await wait_checks(client, 2)
                offsets = {h.commit_log_offset for h, _ in checks_of(client)}
                assert offsets == {open_.commit_offset}
                assert (await end(client, open_, COMMIT, from_check=True)).code == 0
            await sigterm(broker)
        async with broker_process(data, flush="sync", **SLOW_CHECKS) as broker:
            async with open_client(broker.port) as client:
                await register_producer(client, "restarted@2")
                keys = sorted(m.properties[UNIQ_KEY] for m in await pull_topic(client, TOPIC))
                assert keys == ["k-c", "k-open"]
                await trio.sleep(2.5)  # two check intervals: nothing is undecided
                assert not checks_of(client)
            await sigterm(broker)
