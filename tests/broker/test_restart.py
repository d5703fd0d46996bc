"""Durability across restarts of ``python -m broker``, over TCP (the issue's must-shows).

1. A graceful restart (SIGTERM, exit 0) keeps every acknowledged message, the committed
   consumer offsets and the pending delayed messages, which then fire once, on time.
2. ``kill -9`` under ``--flush sync`` loses no acknowledged message: concurrent producers are
   killed mid-flight at random moments, several times over the same data directory.
3. ``kill -9`` under the default async mode: the store reopens by scanning from its last
   checkpoint, serves only intact records with dense offsets, and keeps what a checkpoint
   covered before the crash.
4. Timers across ``kill -9``: a delivered timer message is not delivered again (its copy is
   recognised by ``TIMER_SRC``), a pending one fires after the restart.

Every broker is a child process started here on 127.0.0.1, port 0; it is killed by its own pid
(never by name) if it is still alive when a test ends, and every wait is bounded. Message
bodies are derived from their ``UNIQ_KEY`` (:func:`body_for`), so each stored message can be
checked byte for byte; records are also decoded with their CRCs verified.

No test sleeps for "long enough" before a kill: it waits (bounded) for what the kill must not
lose to be in the broker's files — the checkpoint covering a batch (:func:`checkpoint_of`), a
record written out to its commit-log segment (:func:`on_disk`), timer progress in
``config/schedule.json`` (:func:`progress_of`). A timer that must still be pending when its
broker stops is given a delay far longer than the stop takes, and its copy must then come from
the restarted broker: no assertion depends on how fast this machine is.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from broker.config import BrokerConfig
from broker.schedule import SCHEDULE_TOPIC, TIMER_QUEUE, TIMER_SRC, Schedule, parse_src
from broker.store.checkpoint import Checkpoint
from broker.store.commitlog import segment_name
from broker.store.files import read_optional
from broker.store.record import check_record
from broker.store.store import MessageStore
from broker.timers import RECALL_TOPIC
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.grpc.convert import encode_recall_handle
from protocol.headers.offsets import (
    QueryConsumerOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from protocol.headers.pull import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    build_pull_sys_flag,
)
from protocol.headers.send import (
    SendMessageRequestHeader,
    SendMessageResponseHeader,
    send_header_to_v2_ext,
)
from protocol.message import MessageExt, decode_record, decode_records
from protocol.properties import UNIQ_KEY, encode_properties
from tests.broker.client import TEST_SETTINGS, BrokerClient, ConnectionClosedError, open_client
from tests.broker.grpc.client import open_grpc_client
from tests.broker.test_process import STOP_TIMEOUT, BrokerProcess
from tests.broker.test_process import run_broker as run_process_broker

pytestmark = pytest.mark.e2e

TOPIC = "Durable"
TIMERS = "DurableTimers"
GROUP = "restart_group"
QUEUES = 4
#: Where an acknowledged message was stored: (queue id, queue offset).
Position = tuple[int, int]
#: Commit-log segment size of every broker here (see TEST_SETTINGS).
SEGMENT_SIZE = int(TEST_SETTINGS["segment_size"])
#: Delay of a timer that must still be pending when its broker stops or is killed: the
#: stop (bounded by STOP_TIMEOUT) or kill follows its send within tenths of a second.
PENDING_MS = 4_000
#: Bound on a whole test: generous (several broker processes start on a busy machine).
TEST_BUDGET_S = 90


def now_ms() -> int:
    return time.time_ns() // 1_000_000


#: Keys ending with this get a :data:`BIG` body.
BIG_SUFFIX = ".big"
BIG = 96 * 1024


def body_for(key: str) -> bytes:
    """The body of the message whose UNIQ_KEY is ``key``: the key, then bytes derived from
    it (16 to 526 of them, or :data:`BIG` for a key ending with :data:`BIG_SUFFIX`), so that
    a stored body can be checked on its own."""
    digest = hashlib.sha256(key.encode()).digest()
    length = BIG if key.endswith(BIG_SUFFIX) else 16 + digest[0] * 2
    filler = (digest * (length // len(digest) + 1))[:length]
    return key.encode() + b"|" + filler


# ---------------------------------------------------------------- processes
@asynccontextmanager
async def broker_process(
    data_dir: Path, *, flush: str = "async", **settings: object
) -> AsyncIterator[BrokerProcess]:
    """Start ``python -m broker --host 127.0.0.1 --port 0 --flush FLUSH`` on ``data_dir``
    (see :func:`tests.broker.test_process.run_broker`)."""
    async with run_process_broker(
        data_dir, "--host", "127.0.0.1", "--flush", flush, **settings
    ) as broker:
        yield broker


async def kill9(broker: BrokerProcess) -> None:
    """SIGKILL the broker (its pid only) and wait, bounded, until it is gone."""
    broker.process.kill()
    with trio.fail_after(STOP_TIMEOUT):
        assert await broker.process.wait() == -signal.SIGKILL


async def sigterm(broker: BrokerProcess) -> None:
    """Stop the broker gracefully: exit status 0 and its "broker stopped" line."""
    assert await broker.stop(signal.SIGTERM) == 0
    with trio.fail_after(STOP_TIMEOUT):
        await broker.wait_for("broker stopped")
    assert_clean_log(broker)


def assert_clean_log(broker: BrokerProcess) -> None:
    """Nothing but info lines: no warning, error, exception or stray traceback text."""
    bad = [
        line
        for line in broker.lines
        if "raw" in line or "exception" in line or line.get("level") != "info"
    ]
    assert not bad, bad


# ---------------------------------------------------------------- requests
def send_request(
    topic: str, key: str, body: bytes, *, queue_id: int = 0, **props: str
) -> RemotingCommand:
    """SEND_MESSAGE_V2 of one message with UNIQ_KEY ``key`` (and ``props``)."""
    header = SendMessageRequestHeader(
        producer_group="restart_producer", topic=topic, default_topic="TBW102",
        default_topic_queue_nums=QUEUES, queue_id=queue_id, sys_flag=0,
        born_timestamp=now_ms(), flag=0, properties=encode_properties({UNIQ_KEY: key, **props}),
    )  # fmt: skip
    return request(RequestCode.SEND_MESSAGE_V2, 0, send_header_to_v2_ext(header), body)


async def send_ok(
    client: BrokerClient, topic: str, key: str, *, queue_id: int = 0, **props: str
) -> Position:
    """Send ``body_for(key)`` and return where it was stored (SUCCESS required)."""
    reply = await client.request(
        send_request(topic, key, body_for(key), queue_id=queue_id, **props)
    )
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    answer = SendMessageResponseHeader.from_ext(reply.ext_fields)
    return answer.queue_id, answer.queue_offset


def pull_request(
    topic: str, queue_id: int, offset: int, *, commit_offset: int | None = None
) -> RemotingCommand:
    """PULL_MESSAGE without suspend; with ``commit_offset`` the COMMIT_OFFSET sysflag is set."""
    header = PullMessageRequestHeader(
        consumer_group=GROUP, topic=topic, queue_id=queue_id, queue_offset=offset,
        max_msg_nums=32, sys_flag=build_pull_sys_flag(
            commit_offset=commit_offset is not None, suspend=False, subscription=True
        ),
        commit_offset=commit_offset or 0, suspend_timeout_millis=0, subscription="*",
        sub_version=0,
    )  # fmt: skip
    return request(RequestCode.PULL_MESSAGE, 0, header.to_ext())


async def pull_queue(client: BrokerClient, topic: str, queue_id: int) -> list[MessageExt]:
    """Every message of the queue, from offset 0 (CRCs verified); the offsets must be dense
    and the queue must end where the broker says it does."""
    got: list[MessageExt] = []
    for _ in range(100_000):  # bounded: 32 messages per pull
        reply = await client.request(pull_request(topic, queue_id, len(got)))
        if reply.code == ResponseCode.PULL_NOT_FOUND:  # caught up (or an empty queue)
            break
        assert reply.code == ResponseCode.SUCCESS, (topic, queue_id, reply.code, reply.remark)
        got += decode_records(reply.body, verify_crc=True)
        header = PullMessageResponseHeader.from_ext(reply.ext_fields)
        assert header.next_begin_offset == len(got)
    assert [m.queue_offset for m in got] == list(range(len(got)))  # dense, from 0
    assert {(m.topic, m.queue_id) for m in got} <= {(topic, queue_id)}
    return got


async def pull_topic(client: BrokerClient, topic: str) -> list[MessageExt]:
    """Every message of the topic's queues."""
    return [m for q in range(QUEUES) for m in await pull_queue(client, topic, q)]


async def query_offset(client: BrokerClient, topic: str, queue_id: int) -> int:
    header = QueryConsumerOffsetRequestHeader(consumer_group=GROUP, topic=topic, queue_id=queue_id)
    reply = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return int(reply.ext_fields["offset"])


def check_intact(messages: list[MessageExt]) -> dict[str, MessageExt]:
    """Each stored message is one we sent, byte for byte, and no key is stored twice."""
    by_key: dict[str, MessageExt] = {}
    for m in messages:
        key = m.properties[UNIQ_KEY]
        assert m.body == body_for(key), key
        assert key not in by_key, f"{key} stored twice"
        by_key[key] = m
    return by_key


def check_acked(stored: Mapping[str, MessageExt], acked: Mapping[str, Position]) -> None:
    """Every acknowledged message is stored where its SEND reply said."""
    missing = sorted(set(acked) - set(stored))
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:5]}"
    for key, (queue_id, offset) in acked.items():
        m = stored[key]
        assert (m.queue_id, m.queue_offset) == (queue_id, offset), key


async def wait_for_count(client: BrokerClient, topic: str, count: int) -> list[MessageExt]:
    """Poll queue 0 of ``topic`` until it holds ``count`` messages (callers bound it)."""
    while len(got := await pull_queue(client, topic, 0)) < count:  # noqa: ASYNC110 (a remote state)
        await trio.sleep(0.02)
    return got


# ---------------------------------------------------------------- the broker's files
async def poll(check: Callable[[], bool]) -> None:
    """Poll a condition on a running broker's files every 20 ms (callers bound the wait)."""
    while not check():  # noqa: ASYNC110 (files another process writes)
        await trio.sleep(0.02)


def checkpoint_of(data_dir: Path) -> Checkpoint | None:
    """The store's recovery checkpoint as it is on disk now (written atomically)."""
    return Checkpoint.load(data_dir / "checkpoint")


def on_disk(data_dir: Path, m: MessageExt) -> bool:
    """Whether ``m``'s record is in its commit-log segment file: handed to the OS, it
    survives a ``kill -9`` (flushed or not). Segments are preallocated with zeros, so an
    unwritten record reads as no record."""
    offset = m.commit_log_offset
    start = offset - offset % SEGMENT_SIZE
    path = data_dir / "commitlog" / segment_name(start)
    try:
        with path.open("rb") as f:
            f.seek(offset - start)
            data = f.read(SEGMENT_SIZE - (offset - start))
    except FileNotFoundError:
        return False
    if check_record(data, 0, offset).reason != "ok":  # zeros, or not all of it yet
        return False
    stored, _ = decode_record(data)
    here = (stored.commit_log_offset, stored.topic, stored.queue_id, stored.queue_offset)
    return here == (offset, m.topic, m.queue_id, m.queue_offset)


def progress_of(data_dir: Path) -> Schedule:
    """The timer progress saved in ``config/schedule.json`` (written before each checkpoint)."""
    schedule = Schedule()
    data = read_optional(data_dir / "config" / "schedule.json")
    if data is not None:
        schedule.load(data)
    return schedule


def delivered_in(data_dir: Path, copy: MessageExt) -> bool:
    """Whether the saved progress counts the scheduled record ``copy`` was made from."""
    src = parse_src(copy.properties[TIMER_SRC])
    assert src is not None, copy.properties
    return progress_of(data_dir).delivered(*src)


# ---------------------------------------------------------------- 1. graceful restart
async def test_graceful_restart_keeps_messages_offsets_and_pending_timers(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    acked: dict[str, Position] = {}
    with trio.fail_after(TEST_BUDGET_S):
        async with broker_process(data_dir) as broker, open_client(broker.port) as client:
            for i in range(48):
                key = f"graceful-{i}"
                acked[key] = await send_ok(client, TOPIC, key, queue_id=i % QUEUES)
            # One timer fires before the stop; two are still pending when it stops.
            await send_ok(client, TIMERS, "early", TIMER_DELAY_MS="100")
            with trio.fail_after(10):
                await wait_for_count(client, TIMERS, 1)
            level_sent_ms = now_ms()
            await send_ok(client, TIMERS, "delay-level-1", DELAY="1")  # 1 s
            # Offsets: one by UPDATE_CONSUMER_OFFSET, one piggy-backed on a pull.
            update = UpdateConsumerOffsetRequestHeader(
                consumer_group=GROUP, topic=TOPIC, queue_id=0, commit_offset=7
            )
            reply = await client.call(RequestCode.UPDATE_CONSUMER_OFFSET, update.to_ext())
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            reply = await client.request(pull_request(TOPIC, 1, 0, commit_offset=5))
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            assert await query_offset(client, TOPIC, 1) == 5
            assert [m.body for m in await pull_queue(client, TIMERS, 0)] == [body_for("early")]
            # Sent last, just before the stop, with a delay far longer than a stop takes.
            pending_sent_ms = now_ms()
            await send_ok(client, TIMERS, "timer-pending", TIMER_DELAY_MS=str(PENDING_MS))
            await sigterm(broker)
        first_port = broker.port

        async with broker_process(data_dir) as broker, open_client(broker.port) as client:
            check_acked(check_intact(await pull_topic(client, TOPIC)), acked)
            assert await query_offset(client, TOPIC, 0) == 7
            assert await query_offset(client, TOPIC, 1) == 5
            with trio.fail_after(PENDING_MS / 1000 + 5):
                await wait_for_count(client, TIMERS, 3)
            await trio.sleep(0.3)  # a double fire would show up within this
            timers = await pull_queue(client, TIMERS, 0)
            keys = [m.properties[UNIQ_KEY] for m in timers]
            assert keys[0] == "early"
            assert sorted(keys[1:]) == ["delay-level-1", "timer-pending"]
            check_intact(timers)
            due = {"delay-level-1": level_sent_ms + 1_000,
                   "timer-pending": pending_sent_ms + PENDING_MS}  # fmt: skip
            for m in timers:
                assert m.properties[TIMER_SRC]
                assert "REAL_TOPIC" not in m.properties
                key = m.properties[UNIQ_KEY]
                assert m.store_timestamp >= due.get(key, 0), key  # never before its time
            # Stored by the process that delivered it: "early" by the first; the timer
            # pending at the stop by the restarted one (the delay level, due 1 s after its
            # send, by whichever ran at that moment).
            host = {m.properties[UNIQ_KEY]: m.store_host[1] for m in timers}
            assert host["early"] == first_port
            assert host["timer-pending"] == broker.port, "not pending at the stop?"
            assert host["delay-level-1"] in (first_port, broker.port)
            await sigterm(broker)


# ---------------------------------------------------------------- 2. kill -9, flush sync
@dataclass
class Produced:
    """What concurrent producers attempted and what the broker acknowledged."""

    attempted: set[str]
    acked: dict[str, Position]
    errors: int = 0


async def produce_then_kill(
    broker: BrokerProcess, produced: Produced, label: str, kill_after_s: float, senders: int = 8
) -> int:
    """Run ``senders`` producers (one connection each, one send in flight each) until the
    broker is SIGKILLed ``kill_after_s`` after they have 32 acknowledgements; return how many
    messages were acknowledged in this run."""
    before = len(produced.acked)

    async def send_until_killed(client: BrokerClient, sid: int) -> None:
        try:
            for n in itertools.count():
                key = f"{label}-s{sid}-n{n}"
                produced.attempted.add(key)
                reply = await client.request(
                    send_request(TOPIC, key, body_for(key), queue_id=sid % QUEUES)
                )
                if reply.code != ResponseCode.SUCCESS:
                    produced.errors += 1
                    continue
                answer = SendMessageResponseHeader.from_ext(reply.ext_fields)
                produced.acked[key] = (answer.queue_id, answer.queue_offset)
        except (ConnectionClosedError, trio.BrokenResourceError, trio.ClosedResourceError):
            return  # the broker was killed (maybe between a reply and the next send)

    async def sender(sid: int) -> None:
        try:
            async with open_client(broker.port) as client:
                await send_until_killed(client, sid)
        except OSError:
            return  # connection refused: the broker was killed before this one connected

    async with trio.open_nursery() as nursery:
        for sid in range(senders):
            nursery.start_soon(sender, sid)
        with trio.fail_after(20):
            while len(produced.acked) - before < 32:  # noqa: ASYNC110 (nothing to wait on)
                await trio.sleep(0.002)
        await trio.sleep(kill_after_s)
        await kill9(broker)
    return len(produced.acked) - before


async def test_kill9_under_flush_sync_loses_no_acknowledged_message(tmp_path: Path) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    print(f"kill moments drawn with random.Random({seed})")  # shown when the test fails
    data_dir = tmp_path / "data"
    produced = Produced(set(), {})
    with trio.fail_after(TEST_BUDGET_S):
        for run in range(3):  # three kills at different moments, one data directory
            async with broker_process(data_dir, flush="sync") as broker:
                if run:  # what the previous kill left behind
                    async with open_client(broker.port) as client:
                        stored = check_intact(await pull_topic(client, TOPIC))
                    check_acked(stored, produced.acked)
                    assert set(stored) <= produced.attempted
                kill_after_s = rng.uniform(0.0, 0.4)
                count = await produce_then_kill(broker, produced, f"run{run}", kill_after_s)
                assert count >= 32, (seed, run)
        async with broker_process(data_dir, flush="sync") as broker:
            async with open_client(broker.port) as client:
                stored = check_intact(await pull_topic(client, TOPIC))
            check_acked(stored, produced.acked)
            assert set(stored) <= produced.attempted
            assert produced.errors == 0
            await sigterm(broker)


# ---------------------------------------------------------------- 3. kill -9, flush async
async def test_kill9_under_flush_async_recovers_from_the_last_checkpoint(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    early: dict[str, Position] = {}
    late: dict[str, Position] = {}
    with trio.fail_after(TEST_BUDGET_S):
        async with broker_process(data_dir) as broker:
            async with open_client(broker.port) as client:
                for i in range(64):
                    key = f"early-{i}"
                    early[key] = await send_ok(client, TOPIC, key, queue_id=i % QUEUES)

                # A checkpoint covers the early batch (every queue's durable size does).
                def early_checkpointed() -> bool:
                    cp = checkpoint_of(data_dir)
                    return cp is not None and all(
                        cp.queue_sizes.get((TOPIC, q), 0) >= 64 // QUEUES for q in range(QUEUES)
                    )

                with trio.fail_after(10):
                    await poll(early_checkpointed)
                # Then ~4.5 MiB more, so that some of it is written out (a put writes out
                # past 4 MiB unwritten) after that checkpoint.
                for i in range(48):
                    for key in (f"late-{i}", f"late-{i}{BIG_SUFFIX}"):
                        late[key] = await send_ok(client, TOPIC, key, queue_id=i % QUEUES)
            await kill9(broker)
        cp = checkpoint_of(data_dir)
        assert cp is not None
        assert not cp.clean

        # The recovery itself, on a copy of the crashed directory (the original is left
        # for the broker process below): it scans from the checkpoint, nothing before.
        copy = tmp_path / "copy"
        shutil.copytree(data_dir, copy)
        config = BrokerConfig(data_dir=copy, **TEST_SETTINGS).store_config(0)
        with MessageStore.open(config) as store:
            stats = store.statistics()
            assert stats.recovery_scanned_from == cp.safe_offset > 0
            assert stats.recovery_stop_reason
            kept = sum(store.max_offset(TOPIC, q) for q in range(QUEUES))
            before = sum(cp.queue_sizes.get((TOPIC, q), 0) for q in range(QUEUES))
            assert kept == before + stats.recovered_records  # checkpointed + rescanned

        async with broker_process(data_dir) as broker, open_client(broker.port) as client:
            messages = await pull_topic(client, TOPIC)
            stored = check_intact(messages)
            assert len(stored) == kept
            check_acked({k: m for k, m in stored.items() if k in early}, early)
            for m in messages:
                if m.properties[UNIQ_KEY] in early:
                    assert m.commit_log_offset < cp.safe_offset
            # What survived of the late batch is where its SEND said, and a prefix of each
            # queue: a crash may cut the tail, never a hole.
            for key, m in stored.items():
                if key in late:
                    assert (m.queue_id, m.queue_offset) == late[key], key
            ends = {q: sum(1 for m in messages if m.queue_id == q) for q in range(QUEUES)}
            for key, (queue_id, offset) in late.items():
                assert (key in stored) == (offset < ends[queue_id]), key
            # The broker goes on from there: the next offset is the next dense one.
            assert await send_ok(client, TOPIC, "after", queue_id=0) == (0, ends[0])
            await sigterm(broker)


# ---------------------------------------------------------------- 4. timers and kill -9
@pytest.mark.parametrize(
    ("flush", "settings", "progress_saved"),
    [
        # No checkpoint before the kill: only TIMER_SRC in the log says what was delivered.
        ("sync", {"checkpoint_interval_s": 60}, False),
        # A checkpoint (with config/schedule.json) after the delivery, then the kill.
        ("async", {"checkpoint_interval_s": 0.25}, True),
    ],
)
async def test_timers_across_kill9_neither_refire_nor_get_lost(
    tmp_path: Path, flush: str, settings: dict[str, object], progress_saved: bool
) -> None:
    data_dir = tmp_path / "data"
    with trio.fail_after(TEST_BUDGET_S):
        async with broker_process(data_dir, flush=flush, **settings) as broker:
            async with open_client(broker.port) as client:
                await send_ok(client, TIMERS, "fired-before-kill", TIMER_DELAY_MS="100")
                sent_ms = now_ms()
                await send_ok(client, TIMERS, "pending-at-kill", TIMER_DELAY_MS=str(PENDING_MS))
                with trio.fail_after(10):
                    # sync: durable once visible, as the acknowledged scheduled records are
                    (copy,) = await wait_for_count(client, TIMERS, 1)
                if progress_saved:
                    # async: both scheduled records and the copy written out, and the
                    # delivery in config/schedule.json (so, by a checkpoint after it).
                    kept = [copy, *await pull_queue(client, SCHEDULE_TOPIC, TIMER_QUEUE)]

                    def saved() -> bool:
                        written = all(on_disk(data_dir, m) for m in kept)
                        return written and delivered_in(data_dir, copy)

                    with trio.fail_after(10):
                        await poll(saved)
            await kill9(broker)
        assert (data_dir / "config" / "schedule.json").exists() == progress_saved
        first_port = broker.port

        async with broker_process(data_dir, flush=flush, **settings) as broker:
            async with open_client(broker.port) as client:
                # Right after the restart: the delivered one is not delivered again; the
                # pending one is delivered at most once (not before its time: see below).
                got = await pull_queue(client, TIMERS, 0)
                keys = [m.properties[UNIQ_KEY] for m in got]
                assert keys in (["fired-before-kill"], ["fired-before-kill", "pending-at-kill"])
                assert got[0].store_host[1] == first_port
                with trio.fail_after(PENDING_MS / 1000 + 5):
                    await wait_for_count(client, TIMERS, 2)
                await trio.sleep(0.3)  # a double fire would show up within this
                got = await pull_queue(client, TIMERS, 0)
                assert [m.properties[UNIQ_KEY] for m in got] == [
                    "fired-before-kill",
                    "pending-at-kill",
                ]
                check_intact(got)
                fired = got[1]
                # It was pending at the kill: fired by the restarted broker, on time.
                assert fired.store_host[1] == broker.port, "not pending at the kill?"
                assert fired.store_timestamp >= sent_ms + PENDING_MS
                # Both scheduled records are still there; only their copies were added.
                assert len(await pull_queue(client, SCHEDULE_TOPIC, TIMER_QUEUE)) == 2
            # The copy written out (sync: it was durable before it was visible); after the
            # kill, its TIMER_SRC or the saved progress must say it was delivered.
            with trio.fail_after(10):
                await poll(lambda: on_disk(data_dir, fired))
            await kill9(broker)

        # A second crash, after the restart's delivery: nothing fires again.
        async with broker_process(data_dir, flush=flush, **settings) as broker:
            async with open_client(broker.port) as client:
                await trio.sleep(0.4)
                got = await pull_queue(client, TIMERS, 0)
                assert [m.properties[UNIQ_KEY] for m in got] == [
                    "fired-before-kill",
                    "pending-at-kill",
                ]
            await sigterm(broker)


async def test_a_recalled_timer_stays_recalled_across_kill9(tmp_path: Path) -> None:
    """RecallMessage (gRPC) cancels a pending timer; its marker in the log, written out
    before the kill, keeps it cancelled after ``kill -9`` and recovery, while its twin (due
    at the same time, not recalled) is delivered once."""
    data_dir = tmp_path / "data"
    with trio.fail_after(TEST_BUDGET_S):
        async with broker_process(data_dir) as broker:
            async with open_client(broker.port) as client:
                delay = str(PENDING_MS)
                await send_ok(client, TIMERS, "twin", TIMER_DELAY_MS=delay)
                await send_ok(client, TIMERS, "recalled", TIMER_DELAY_MS=delay)
                parked = await pull_queue(client, SCHEDULE_TOPIC, TIMER_QUEUE)
                (target,) = [m for m in parked if m.properties[UNIQ_KEY] == "recalled"]
                assert broker.grpc_port is not None
                async with open_grpc_client(broker.grpc_port) as grpc:
                    req = schema.RecallMessageRequest()
                    req.topic.name = TIMERS
                    req.recall_handle = encode_recall_handle(
                        TIMERS, TIMER_QUEUE, target.queue_offset, "recalled"
                    )
                    answer = (await grpc.unary("RecallMessage", req)).one(
                        schema.RecallMessageResponse
                    )
                    assert answer.status.code == Code.OK, answer
                (marker,) = await pull_queue(client, RECALL_TOPIC, 0)
                with trio.fail_after(10):
                    await poll(lambda: on_disk(data_dir, marker))
            await kill9(broker)

        async with broker_process(data_dir) as broker, open_client(broker.port) as client:
            with trio.fail_after(PENDING_MS / 1000 + 10):
                await wait_for_count(client, TIMERS, 1)
            got = await pull_queue(client, TIMERS, 0)
            assert [m.properties[UNIQ_KEY] for m in got] == ["twin"]
