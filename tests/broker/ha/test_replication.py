"""Replication over real TCP on loopback (docs/design.md §13): a replica's log is the
master's at the same offsets, it catches up from empty and from where it was, it serves
pulls and refuses writes; sync replication answers SEND_OK only with the replicas' copies,
FLUSH_SLAVE_TIMEOUT when they do not acknowledge in time (stored), SLAVE_NOT_AVAILABLE before
the append when too few are in sync (nothing stored). Every wait is on a condition, bounded."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import trio

from broker.app import BrokerHandle
from protocol.codes import RequestCode, ResponseCode
from protocol.ha import encode_batch, encode_confirm, encode_report
from protocol.headers.admin import CreateTopicRequestHeader
from protocol.headers.send import SendMessageResponseHeader
from protocol.message import MessageExt
from protocol.properties import UNIQ_KEY
from tests.broker.client import open_broker, open_client
from tests.broker.ha.support import (
    NAME,
    batch_command,
    follower,
    ha_addr,
    handshake_as_master,
    handshake_as_replica,
    log_image,
    open_master,
    open_replica,
    send,
    send_command,
    wait_caught_up,
    wait_replicas,
)
from tests.broker.test_restart import BIG_SUFFIX, body_for, pull_queue

TOPIC = "Replicated"
QUEUES = 4
#: Bound on a whole test.
TEST_S = 60


async def drain(stream: trio.abc.Stream) -> None:
    """Read and drop everything until the stream ends."""
    while await stream.receive_some(1 << 16):
        pass


async def send_many(master: BrokerHandle, keys: list[str]) -> dict[str, str]:
    """Send ``body_for(key)`` for every key (queue = index % 4); return key -> msgId."""
    ids: dict[str, str] = {}
    async with open_client(master.port) as client:
        for i, key in enumerate(keys):
            reply = await send(client, TOPIC, key, body_for(key), i % QUEUES)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            ids[key] = SendMessageResponseHeader.from_ext(reply.ext_fields).msg_id
    return ids


async def pulled(broker: BrokerHandle) -> list[MessageExt]:
    async with open_client(broker.port) as client:
        return [m for q in range(QUEUES) for m in await pull_queue(client, TOPIC, q)]


def keys(prefix: str, count: int, big_every: int = 0) -> list[str]:
    """``count`` keys; every ``big_every``-th one names a 96 KiB body (segments roll)."""
    return [
        f"{prefix}-{i}{BIG_SUFFIX if big_every and i % big_every == 0 else ''}"
        for i in range(count)
    ]


def _where(m: MessageExt) -> tuple[object, ...]:
    return (m.offset_msg_id, m.queue_id, m.queue_offset, m.commit_log_offset, m.body)


async def assert_same(master: BrokerHandle, replica: BrokerHandle, ids: dict[str, str]) -> None:
    """Same log bytes; the replica serves every message with the msgId the master gave."""
    assert log_image(replica.broker.store) == log_image(master.broker.store)
    from_replica = await pulled(replica)
    assert list(map(_where, from_replica)) == list(map(_where, await pulled(master)))
    by_key = {m.properties[UNIQ_KEY]: m for m in from_replica}
    assert set(by_key) == set(ids)
    for key, msg_id in ids.items():
        assert by_key[key].offset_msg_id == msg_id, key
        assert by_key[key].body == body_for(key)


async def test_sends_to_the_master_appear_on_the_replica_at_the_same_offsets(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TEST_S):
        async with (
            open_master(tmp_path / "m") as master,
            open_replica(tmp_path / "r", ha_addr(master)) as replica,
        ):
            await wait_replicas(master, 1)
            # 40 messages, 14 of 96 KiB: the 1 MiB segments roll (a blank crosses too).
            ids = await send_many(master, keys("live", 40, big_every=3))
            assert master.broker.store.log.end > master.broker.store.log.segment_size
            await wait_caught_up(master, replica)
            await assert_same(master, replica, ids)
            stats = master.broker.replicas.statistics()
            end = master.broker.store.log.end
            assert [(r.broker_id, r.acked) for r in stats.replicas] == [(1, end)]
            assert follower(replica).statistics().master_end == end


async def test_a_replica_started_late_catches_up_from_empty(tmp_path: Path) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master:
            ids = await send_many(master, keys("early", 30, big_every=4))
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                await wait_caught_up(master, replica)
                await assert_same(master, replica, ids)


async def test_a_restarted_replica_continues_from_its_own_log_end(tmp_path: Path) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master:
            first = await send_many(master, keys("one", 20))
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                await wait_caught_up(master, replica)
                was = replica.broker.store.log.end
            await wait_replicas(master, 0)
            second = await send_many(master, keys("two", 20, big_every=5))
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                # It reopened its own log and reported its end: the master streams from there
                # (the replica appends only at its end, so a restart from 0 would fail).
                assert replica.broker.store.log.end == was
                await wait_caught_up(master, replica)
                await assert_same(master, replica, {**first, **second})
                assert follower(replica).statistics().disconnects == 0


@pytest.mark.parametrize("flush", ["async", "sync"])
async def test_sync_replication_answers_send_ok_only_once_the_replica_holds_the_message(
    tmp_path: Path, flush: str
) -> None:
    """With ``flush`` on both: in SYNC flush mode the master streams only fsynced bytes
    and the replica reports only after its own fsync."""
    with trio.fail_after(TEST_S):
        async with (
            open_master(
                tmp_path / "m", replication="sync", min_insync_replicas=2, flush=flush
            ) as master,
            open_replica(tmp_path / "r", ha_addr(master), flush=flush) as replica,
            open_client(master.port) as client,
        ):
            await wait_replicas(master, 1)
            for i in range(30):
                key = f"sync-{i}"
                reply = await send(client, TOPIC, key, body_for(key), i % QUEUES)
                assert reply.code == ResponseCode.SUCCESS, reply.remark
                # Nothing else is sent meanwhile: the master's end is this record's end.
                assert replica.broker.store.log.end >= master.broker.store.log.end, i
                assert replica.broker.store.durable_offset >= master.broker.store.log.end or (
                    flush == "async"
                )
            stats = master.broker.replicas.statistics()
            assert (stats.sync_ok, stats.sync_timeouts, stats.sync_not_available) == (30, 0, 0)


async def test_sync_send_times_out_with_flush_slave_timeout_when_the_replica_is_silent(
    tmp_path: Path,
) -> None:
    """A replica that connects and then never acknowledges (stalled): the send is stored
    and answered FLUSH_SLAVE_TIMEOUT (12) after --replica-timeout-ms, with its msgId. It
    stays stored, as in RocketMQ, but consumers do not see it while no replica holds it
    (RocketMQ 5's confirm offset; docs/design.md §13, "Reads on a sync master")."""
    timeout_ms = 400
    with trio.fail_after(TEST_S):
        async with open_master(
            tmp_path / "m", replication="sync", min_insync_replicas=2,
            replica_timeout_ms=timeout_ms,
        ) as master:  # fmt: skip
            stalled = await trio.open_tcp_stream("127.0.0.1", master.ha_port or 0)
            async with stalled, trio.open_nursery() as nursery:
                await handshake_as_replica(stalled)
                nursery.start_soon(drain, stalled)  # takes the log, never acknowledges it
                await wait_replicas(master, 1)
                async with open_client(master.port) as client:
                    started = trio.current_time()
                    reply = await send(client, TOPIC, "late", body_for("late"))
                    took = trio.current_time() - started
                assert reply.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, reply.remark
                assert timeout_ms / 1000 <= took < timeout_ms / 1000 + 5
                header = SendMessageResponseHeader.from_ext(reply.ext_fields)
                assert header.msg_id and header.queue_offset == 0
                nursery.cancel_scope.cancel()
            store = master.broker.store
            assert store.max_offset(TOPIC, 0) == 1  # stays stored, as in RocketMQ
            assert store.read_limit is not None and store.read_limit < store.log.end
            assert await pulled(master) == []  # but unread while no replica holds it
            assert master.broker.replicas.statistics().sync_timeouts == 1


async def test_sync_send_is_refused_before_its_append_without_enough_replicas_in_sync(
    tmp_path: Path,
) -> None:
    """Too few replicas in sync: SLAVE_NOT_AVAILABLE with the count, nothing stored (so a
    producer's retry duplicates nothing); with the replica there, SEND_OK."""
    with trio.fail_after(TEST_S):
        async with open_master(
            tmp_path / "m", replication="sync", min_insync_replicas=2, replica_timeout_ms=30_000
        ) as master:
            store = master.broker.store
            async with open_client(master.port) as client:
                before = store.log.end
                reply = await send(client, TOPIC, "alone", body_for("alone"))
                assert reply.code == ResponseCode.SLAVE_NOT_AVAILABLE, reply.remark
                assert "0 in sync, 1 needed" in (reply.remark or ""), reply.remark
                assert "msgId" not in reply.ext_fields
                assert store.log.end == before
                # A replica comes, then goes: SEND_OK while it is there, refused once it left.
                async with open_replica(tmp_path / "r", ha_addr(master)):
                    await wait_replicas(master, 1)
                    ok = await send(client, TOPIC, "paired", body_for("paired"))
                    assert ok.code == ResponseCode.SUCCESS, ok.remark
                await wait_replicas(master, 0)
                end = store.log.end
                again = await send(client, TOPIC, "left", body_for("left"))
                assert again.code == ResponseCode.SLAVE_NOT_AVAILABLE, again.remark
                batch = await client.request(batch_command(TOPIC, ["b1", "b2"]))
                assert batch.code == ResponseCode.SLAVE_NOT_AVAILABLE, batch.remark
                assert store.log.end == end
            stored = await pulled(master)
            assert [m.properties[UNIQ_KEY] for m in stored] == ["paired"]
            assert master.broker.replicas.statistics().sync_not_available == 3


async def test_a_replica_refuses_sends_and_admin_writes_with_a_clear_code(tmp_path: Path) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master:
            ids = await send_many(master, keys("before", 3))
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                await wait_caught_up(master, replica)
                async with open_client(replica.port) as client:
                    reply = await send(client, TOPIC, "nope", b"x")
                    assert reply.code == ResponseCode.SERVICE_NOT_AVAILABLE
                    assert "replica" in (reply.remark or "")
                    create = CreateTopicRequestHeader(
                        topic="Other", default_topic="TBW102", read_queue_nums=1,
                        write_queue_nums=1, perm=6, topic_filter_type="SINGLE_TAG", order=False,
                    )  # fmt: skip
                    refused = await client.call(
                        RequestCode.UPDATE_AND_CREATE_TOPIC, create.to_ext()
                    )
                    assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE
                    assert "replica" in (refused.remark or "")
                assert replica.broker.store.log.end == master.broker.store.log.end
                await assert_same(master, replica, ids)


async def test_the_master_refuses_a_replica_of_another_group_or_one_from_a_newer_epoch(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master:
            async with open_broker(
                tmp_path / "x", broker_name="other", broker_id=1, ha_master_addr=ha_addr(master)
            ) as other:
                assert other.follower is not None
                await other.follower.wait_until(lambda s: f"serves {NAME}" in s.last_error)
            epoch_file = tmp_path / "r" / "config" / "haEpoch"
            epoch_file.parent.mkdir(parents=True)
            epoch_file.write_text("5\n")
            async with open_replica(tmp_path / "r", ha_addr(master)) as replica:
                await follower(replica).wait_until(lambda s: "epoch 5" in s.last_error)
                assert replica.broker.store.log.end == 0
            assert master.broker.replicas.statistics().replicas == ()


async def test_a_replica_drops_a_stream_from_an_epoch_older_than_it_accepted(
    tmp_path: Path,
) -> None:
    async def deposed_master(stream: trio.SocketStream) -> None:
        """Takes the replica's hello and streams under epoch 3."""
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.receive_some(1024)
            await stream.send_all(encode_batch(3, 0, 0, b""))
            await drain(stream)

    epoch_file = tmp_path / "r" / "config" / "haEpoch"
    epoch_file.parent.mkdir(parents=True)
    epoch_file.write_text("5\n")
    with trio.fail_after(TEST_S):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                trio.serve_listeners,
                deposed_master,
                await trio.open_tcp_listeners(0, host="127.0.0.1"),
            )
            port = listeners[0].socket.getsockname()[1]
            async with open_replica(tmp_path / "r", f"127.0.0.1:{port}") as replica:
                await follower(replica).wait_until(lambda s: "older than 5" in s.last_error)
                assert follower(replica).statistics().epoch == 5
            nursery.cancel_scope.cancel()


async def test_sync_sends_on_one_connection_wait_for_their_copies_together(
    tmp_path: Path,
) -> None:
    """Sync replication makes a send wait: each gets a task of its own (as in SYNC flush
    mode), so two pipelined sends wait at once and one acknowledgement releases both."""
    with trio.fail_after(TEST_S):
        async with open_master(
            tmp_path / "m", replication="sync", min_insync_replicas=2, replica_timeout_ms=60_000
        ) as master:
            replica = await trio.open_tcp_stream("127.0.0.1", master.ha_port or 0)
            async with replica, trio.open_nursery() as nursery, open_client(master.port) as client:
                await handshake_as_replica(replica)
                nursery.start_soon(drain, replica)
                await wait_replicas(master, 1)
                opaques = []
                for key in ("a", "b"):
                    opaque, frame = client.protocol.send_request(send_command(TOPIC, key, b"x"))
                    await client.send_raw(frame)
                    opaques.append(opaque)
                replicas = master.broker.replicas
                await replicas.wait_until(lambda s: s.waiting == 2)
                await replica.send_all(encode_report(master.broker.store.log.end))
                for opaque in opaques:
                    assert (await client.reply(opaque)).code == ResponseCode.SUCCESS
                assert replicas.statistics().sync_ok == 2
                nursery.cancel_scope.cancel()


async def test_a_link_cut_inside_a_record_resumes_after_the_last_whole_record(
    tmp_path: Path,
) -> None:
    """A master that streams half of a record and drops the link: the replica kept only
    whole records, reports their end on the next link, and gets the rest from there."""
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "m") as master:
            ids = await send_many(master, keys("cut", 12))
            log = log_image(master.broker.store)
        cut = len(log) - 100  # inside the last record
        reports: list[int] = []

        async def flaky_master(stream: trio.SocketStream) -> None:
            with contextlib.suppress(trio.BrokenResourceError):
                report = await handshake_as_master(stream, 1, len(log))
                reports.append(report.offset)
                if len(reports) == 1:
                    await stream.send_all(encode_batch(1, 0, len(log), log[:cut]))
                    return  # the link breaks mid-record
                start = report.offset
                batch = encode_batch(1, start, len(log), log[start:])
                await stream.send_all(batch + encode_confirm(1, len(log)))  # async: all of it
                await drain(stream)

        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                trio.serve_listeners,
                flaky_master,
                await trio.open_tcp_listeners(0, host="127.0.0.1"),
            )
            port = listeners[0].socket.getsockname()[1]
            async with open_replica(tmp_path / "r", f"127.0.0.1:{port}") as replica:
                link = follower(replica)
                await link.wait_until(lambda s: s.offset == len(log))
                assert reports[0] == 0 and 0 < reports[1] <= cut < len(log)
                assert log_image(replica.broker.store) == log
                stored = {m.properties[UNIQ_KEY]: m.offset_msg_id for m in await pulled(replica)}
                assert stored == ids
            nursery.cancel_scope.cancel()
