"""AdminService and RouteService on a complete broker without a front end: topic creation and
deletion (with the pop state of the topic and of its pop retry topics), statistics, message
lookups, queue locks, routes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from broker.core.admin import (
    DEFAULT_QUERY_MAX_NUM,
    MAX_QUERY_NUM,
    MessageQuery,
    QueueOffsets,
    QueueProgress,
)
from broker.core.broker import Broker
from broker.core.routes import BrokerIdentity, RouteView
from broker.locks import QueueName
from broker.pop.inflight import InflightTable
from broker.pop.journal import Journal
from broker.store.api import MessageToStore
from broker.topics import PERM_READ_WRITE, TopicConfig
from protocol.codes import ResponseCode
from protocol.errors import BrokerError, IllegalNameError
from protocol.message import decode_records
from protocol.naming import pop_retry_topic_v2
from protocol.properties import KEYS
from tests.broker.core.support import PORT, core_broker, create, pop, put

G = "admin_group"


def recovered_table(pop_dir: Path) -> InflightTable:
    """The pop table a restart would rebuild from ``pop_dir`` (snapshot + journal)."""
    journal, recovered = Journal.open(pop_dir)
    journal.close()
    table = InflightTable()
    if recovered.state is not None:
        table.restore(recovered.state)
    for op in recovered.ops:
        table.apply(op)
    return table


def code_of(info: pytest.ExceptionInfo[BrokerError]) -> int | None:
    return info.value.code


# ---------------------------------------------------------------------- delete topic
async def test_a_recreated_topic_is_popped_from_its_start(tmp_path: Path) -> None:
    """The stale pop cursor (3, above the new queue's max offset 1) goes with the topic."""
    async with core_broker(tmp_path) as broker:
        create(broker, "T")
        for i in range(3):
            put(broker, "T", b"old%d" % i)
        assert len(pop(broker, G, "T").leases) == 3
        await broker.admin.delete_topic("T")
        assert broker.pop.table.cursor(G, "T", 0) is None
        assert not broker.pop.table.leases  # unacked leases of the deleted topic are gone
        assert broker.offsets.committed(G, "T", 0) == 0
        create(broker, "T")
        put(broker, "T", b"new")
        found = pop(broker, G, "T")
        assert [lease.offset for lease in found.leases] == [0]


async def test_deleting_drops_the_pop_retry_topics_of_the_topic(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        create(broker, "T")
        create(broker, "Other")
        put(broker, "T", b"m")
        put(broker, "Other", b"o")
        pop(broker, G, "T")
        pop(broker, G, "Other")
        retry = pop_retry_topic_v2(G, "T")
        assert broker.topics.get(retry) is not None  # a pop reads (and so makes) it
        assert broker.pop.retry_topics_of("T") == [retry]
        await broker.admin.delete_topic("T")
        assert broker.topics.get(retry) is None
        assert {t for _, t, _ in broker.pop.table.cursors} == {
            "Other",
            pop_retry_topic_v2(G, "Other"),
        }
        assert [lease.topic for lease in broker.pop.table.leases.values()] == ["Other"]


async def test_the_drop_is_durable_when_delete_returns(tmp_path: Path) -> None:
    """What a ``kill -9`` right after the delete would leave recovers without the cursor."""
    async with core_broker(tmp_path) as broker:
        create(broker, "T")
        create(broker, "Kept")
        put(broker, "T", b"m")
        put(broker, "Kept", b"k")
        pop(broker, G, "T")
        pop(broker, G, "Kept")
        await broker.admin.delete_topic("T")
        shutil.copytree(tmp_path / "pop", tmp_path / "after-kill")
    table = recovered_table(tmp_path / "after-kill")
    assert table.cursor(G, "T", 0) is None
    assert table.cursor(G, "Kept", 0) == 1
    assert [lease.topic for lease in table.leases.values()] == ["Kept"]


async def test_system_topics_cannot_be_deleted(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        with pytest.raises(BrokerError) as info:
            await broker.admin.delete_topic("SCHEDULE_TOPIC_XXXX")
        assert code_of(info) == ResponseCode.NO_PERMISSION


# ---------------------------------------------------------------------- create topic
@pytest.mark.parametrize(("read", "write"), [(0, 1), (1, 1025), (1025, 4)])
async def test_queue_counts_are_bounded(tmp_path: Path, read: int, write: int) -> None:
    async with core_broker(tmp_path) as broker:
        config = TopicConfig("T", read_queue_nums=read, write_queue_nums=write)
        with pytest.raises(BrokerError) as info:
            broker.admin.create_topic(config)
        assert code_of(info) == ResponseCode.INVALID_PARAMETER
        assert broker.topics.get("T") is None
        with pytest.raises(IllegalNameError):
            broker.admin.create_topic(TopicConfig("a b", read_queue_nums=1, write_queue_nums=1))


# ---------------------------------------------------------------------- statistics
async def test_topic_and_consume_stats(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        create(broker, "T", 2)
        put(broker, "T", b"a")
        put(broker, "T", b"b")
        admin = broker.admin
        assert admin.topic_stats("T") == {0: QueueOffsets(0, 2), 1: QueueOffsets(0, 0)}
        with pytest.raises(BrokerError) as info:
            admin.topic_stats("Nope")
        assert code_of(info) == ResponseCode.TOPIC_NOT_EXIST
        with pytest.raises(BrokerError) as info:
            admin.consume_stats(G)  # no offsets anywhere yet
        assert code_of(info) == ResponseCode.CONSUMER_NOT_ONLINE
        broker.offsets.commit(G, "T", 0, 1)
        assert admin.consume_stats(G) == [QueueProgress("T", 0, 2, 1), QueueProgress("T", 1, 0, 0)]
        assert admin.all_consumer_offsets() == {("T", G): {0: 1}}


async def test_runtime_and_cluster_info(tmp_path: Path) -> None:
    async with core_broker(tmp_path, broker_name="b1", cluster="C1") as broker:
        info = broker.admin.runtime_info(connections=3)
        assert info["connectionCount"] == "3" and info["brokerName"] == "b1"
        assert info["earliestMessageTimeStamp"] == "-1"  # nothing stored yet
        assert info["runtime"].startswith("[ 0 days, 0 hours, 0 minutes")
        assert broker.admin.cluster_info() == BrokerIdentity("C1", "b1", f"127.0.0.1:{PORT}")
        assert "TBW102" in broker.admin.topic_list()


# ---------------------------------------------------------------------- lookups
def put_keyed(broker: Broker, body: bytes, keys: str) -> int:
    result = broker.store.put_nowait(MessageToStore("T", 0, body, {KEYS: keys}))
    return result.commit_log_offset


async def test_message_lookups(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        create(broker, "T")
        offsets = [put_keyed(broker, b"m%d" % i, "k") for i in range(MAX_QUERY_NUM + 2)]
        admin = broker.admin
        (viewed,) = decode_records(admin.view_message(offsets[1]))
        assert (viewed.body, viewed.commit_log_offset) == (b"m1", offsets[1])
        for bad in (-1, 10**12):
            with pytest.raises(BrokerError) as info:
                admin.view_message(bad)
            assert code_of(info) == ResponseCode.QUERY_NOT_FOUND

        def query(max_num: int, *, unique: bool = False) -> int:
            found = admin.query_messages(MessageQuery("T", "k", max_num, 0, 2**62, unique))
            assert found.index_last_update_phyoffset == broker.store.dispatched_offset
            return len(found.records)

        assert query(0) == 1  # at least one
        assert query(1000) == MAX_QUERY_NUM
        assert query(1, unique=True) == DEFAULT_QUERY_MAX_NUM
        assert admin.query_messages(MessageQuery("T", "none", 5, 0, 2**62)).records == []


# ---------------------------------------------------------------------- locks and routes
async def test_queue_locks_go_to_the_first_client(tmp_path: Path) -> None:
    async with core_broker(tmp_path) as broker:
        q0, q1 = QueueName("T", "b", 0), QueueName("T", "b", 1)
        assert broker.admin.lock_queues(G, "c1", [q0, q1]) == [q0, q1]
        assert broker.admin.lock_queues(G, "c2", [q0, q1]) == []
        broker.admin.unlock_queues(G, "c1", [q1])
        assert broker.admin.lock_queues(G, "c2", [q0, q1]) == [q1]


async def test_route_of_a_held_topic(tmp_path: Path) -> None:
    async with core_broker(tmp_path, broker_name="b1", cluster="C1") as broker:
        create(broker, "T", 3)
        assert broker.routes.route("T") == RouteView(
            broker_name="b1",
            cluster="C1",
            address=f"127.0.0.1:{PORT}",
            read_queue_nums=3,
            write_queue_nums=3,
            perm=PERM_READ_WRITE,
            topic_sys_flag=0,
        )
        # Not created yet: the route a first send will create (auto-create is on) ...
        planned = broker.routes.route("NotYet")
        assert planned is not None and planned.write_queue_nums == 4
        assert broker.topics.get("NotYet") is None  # ... and asking created nothing
        # No route for names no producer may write or that are illegal.
        for name in ("%DLQ%g", "%RETRY%g", "bad topic"):
            assert broker.routes.route(name) is None, name


async def test_no_route_for_an_unknown_topic_with_auto_create_off(tmp_path: Path) -> None:
    async with core_broker(tmp_path, auto_create_topic=False) as broker:
        assert broker.routes.route("Nope") is None
