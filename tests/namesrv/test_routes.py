"""The route table and KV config, sans-IO: time is a number passed in."""

from __future__ import annotations

import pytest

from broker.namesrv.kv import KVConfig
from broker.namesrv.routes import Registration, RouteTable
from protocol.bodies.broker import DataVersion, TopicConfig
from protocol.bodies.route import BrokerData, QueueData
from protocol.errors import FieldError, IllegalNameError, InvalidParameterError

A, B = "127.0.0.1:10911", "127.0.0.1:10921"


def topics(*names: str, queues: int = 4) -> dict[str, TopicConfig]:
    return {n: TopicConfig(n, read_queue_nums=queues, write_queue_nums=queues) for n in names}


def reg(
    addr: str = A,
    name: str = "broker-a",
    *names: str,
    version: int = 1,
    broker_id: int = 0,
    cluster: str = "DefaultCluster",
    queues: int = 4,
    timeout_s: float | None = None,
) -> Registration:
    return Registration(
        cluster, addr, name, broker_id, f"{addr}-ha",
        topics(*names, queues=queues), DataVersion(1000, version), timeout_s,
    )  # fmt: skip


def test_register_then_route() -> None:
    table = RouteTable()
    result = table.register(reg(A, "broker-a", "T1", "TBW102"), now=0.0)
    assert result.first and result.topics_applied and result.master_addr is None
    route = table.route("T1")
    assert route is not None
    assert route.queue_datas == (QueueData("broker-a", 4, 4, 6, 0),)
    assert route.broker_datas == (BrokerData("DefaultCluster", "broker-a", {0: A}),)
    assert table.route("Unknown") is None
    assert table.topics() == ["T1", "TBW102"]


def test_renewal_with_the_same_version_only_renews() -> None:
    table = RouteTable(expire_s=120)
    table.register(reg(A, "broker-a", "T1"), now=0.0)
    again = table.register(reg(A, "broker-a", "T1", "T2"), now=30.0)  # same version: ignored
    assert not again.first and not again.topics_applied
    assert table.route("T2") is None
    assert table.live()[A].last_update == 30.0
    changed = table.register(reg(A, "broker-a", "T1", "T2", version=2), now=31.0)
    assert changed.topics_applied and table.route("T2") is not None


def test_expiry_at_exactly_the_configured_age() -> None:
    table = RouteTable(expire_s=120)
    table.register(reg(A, "broker-a", "T1"), now=10.0)
    table.register(reg(A, "broker-a", "T1"), now=40.0)  # renewed
    assert table.expire(now=159.999) == []
    assert table.route("T1") is not None
    (gone,) = table.expire(now=160.0)
    assert (gone.broker_name, gone.last_update) == ("broker-a", 40.0)
    assert table.route("T1") is None
    assert table.topics() == [] and table.live() == {}
    assert table.cluster_info().broker_addr_table == {}
    assert table.cluster_info().cluster_addr_table == {}


def test_a_broker_timeout_from_its_header_wins() -> None:
    table = RouteTable(expire_s=120)
    table.register(reg(A, "broker-a", "T1", timeout_s=10.0), now=0.0)
    table.register(reg(B, "broker-b", "T1"), now=0.0)
    assert [g.broker_name for g in table.expire(now=10.0)] == ["broker-a"]
    route = table.route("T1")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["broker-b"]


def test_unregister_removes_at_once() -> None:
    table = RouteTable()
    table.register(reg(A, "broker-a", "T1"), now=0.0)
    assert table.unregister("DefaultCluster", A, "broker-a", 0)
    assert table.route("T1") is None and table.live() == {}
    assert not table.unregister("DefaultCluster", A, "broker-a", 0)


def test_a_topic_on_two_brokers_and_removal_with_the_last_one() -> None:
    table = RouteTable()
    table.register(reg(A, "broker-a", "Shared", "OnlyA", queues=4), now=0.0)
    table.register(reg(B, "broker-b", "Shared", queues=8), now=0.0)
    route = table.route("Shared")
    assert route is not None
    assert [(q.broker_name, q.read_queue_nums) for q in route.queue_datas] == [
        ("broker-a", 4),
        ("broker-b", 8),
    ]
    assert [b.master_addr for b in route.broker_datas] == [A, B]
    table.unregister("DefaultCluster", A, "broker-a", 0)
    route = table.route("Shared")
    assert route is not None and [q.broker_name for q in route.queue_datas] == ["broker-b"]
    assert table.route("OnlyA") is None
    table.unregister("DefaultCluster", B, "broker-b", 0)
    assert table.route("Shared") is None and table.topics() == []


def test_a_topic_deleted_on_the_broker_leaves_at_the_next_registration() -> None:
    table = RouteTable()
    table.register(reg(A, "broker-a", "T1", "T2"), now=0.0)
    table.register(reg(A, "broker-a", "T1", version=2), now=1.0)
    assert table.route("T2") is None and table.topics() == ["T1"]


def test_slaves_do_not_change_topics_and_learn_their_master() -> None:
    table = RouteTable()
    table.register(reg(A, "broker-a", "T1"), now=0.0)
    slave = table.register(reg(B, "broker-a", "T1", "T9", version=7, broker_id=1), now=0.0)
    assert (slave.master_addr, slave.ha_server_addr) == (A, f"{A}-ha")
    assert table.route("T9") is None
    route = table.route("T1")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: A, 1: B}
    # The master goes: the group stays (its slave is alive), with its queues.
    table.unregister("DefaultCluster", A, "broker-a", 0)
    route = table.route("T1")
    assert route is not None and route.broker_datas[0].broker_addrs == {1: B}


def test_a_broker_moving_to_a_new_address_replaces_the_old_one() -> None:
    table = RouteTable()
    table.register(reg(A, "broker-a", "T1"), now=0.0)
    moved = table.register(reg(B, "broker-a", "T1"), now=1.0)
    assert moved.first
    assert list(table.live()) == [B]
    route = table.route("T1")
    assert route is not None and route.broker_datas[0].broker_addrs == {0: B}


def test_cluster_info_and_topics_by_cluster() -> None:
    table = RouteTable()
    table.register(reg(A, "broker-a", "T1", cluster="c1"), now=0.0)
    table.register(reg(B, "broker-b", "T2", cluster="c2"), now=0.0)
    info = table.cluster_info()
    assert info.cluster_addr_table == {"c1": ("broker-a",), "c2": ("broker-b",)}
    assert info.broker_addr_table["broker-b"] == BrokerData("c2", "broker-b", {0: B})
    assert table.topics_of_cluster("c1") == ["T1"]
    assert table.topics_of_cluster("nope") == []
    # A broker group re-registering in another cluster moves there.
    table.register(reg(B, "broker-b", "T2", cluster="c1", version=2), now=1.0)
    assert table.cluster_info().cluster_addr_table == {"c1": ("broker-a", "broker-b")}


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (reg(addr="nohost"), InvalidParameterError, "brokerAddr"),
        (reg(addr="h:0"), InvalidParameterError, "brokerAddr"),
        (reg(addr="h:99999"), InvalidParameterError, "brokerAddr"),
        (reg(name=""), InvalidParameterError, "brokerName"),
        (reg(cluster=" c"), InvalidParameterError, "clusterName"),
        (reg(broker_id=-1), InvalidParameterError, "brokerId"),
        (reg(A, "broker-a", "bad topic"), IllegalNameError, "bad topic"),
        (reg(timeout_s=0.0), InvalidParameterError, "heartbeatTimeoutMillis"),
    ],
)
def test_bad_registrations_are_refused_and_change_nothing(
    bad: Registration, error: type[Exception], match: str
) -> None:
    table = RouteTable()
    with pytest.raises(error, match=match):
        table.register(bad, now=0.0)
    assert table.live() == {} and table.topics() == []
    assert table.cluster_info().cluster_addr_table == {}


def test_a_mismatched_topic_config_is_refused() -> None:
    bad = Registration("c", A, "b", 0, topics={"T1": TopicConfig("T2")})
    with pytest.raises(InvalidParameterError, match="configured as"):
        RouteTable().register(bad, now=0.0)


# ------------------------------------------------------------------ KV config
def test_kv_put_get_delete_and_list() -> None:
    kv = KVConfig()
    assert kv.get("ORDER_TOPIC_CONFIG", "T1") is None
    kv.put("ORDER_TOPIC_CONFIG", "T1", "broker-a:4")
    kv.put("ORDER_TOPIC_CONFIG", "T2", "broker-b:2")
    assert kv.get("ORDER_TOPIC_CONFIG", "T1") == "broker-a:4"
    assert kv.namespace("ORDER_TOPIC_CONFIG") == {"T1": "broker-a:4", "T2": "broker-b:2"}
    assert kv.delete("ORDER_TOPIC_CONFIG", "T1") and not kv.delete("ORDER_TOPIC_CONFIG", "T1")
    assert kv.delete("ORDER_TOPIC_CONFIG", "T2")
    assert kv.namespace("ORDER_TOPIC_CONFIG") is None


def test_kv_file_form_round_trips_and_bad_files_are_field_errors() -> None:
    kv = KVConfig()
    kv.put("ns", "k", "v")
    assert kv.to_json() == b'{"configTable":{"ns":{"k":"v"}}}'
    assert KVConfig.from_json(kv.to_json()).get("ns", "k") == "v"
    with pytest.raises(FieldError):
        KVConfig.from_json(b'{"configTable":{"ns":[1]}}')
    with pytest.raises(FieldError):
        KVConfig.from_json(b"nope")


@pytest.mark.parametrize(("namespace", "key"), [("", "k"), ("ns", ""), ("ns", "k" * 70_000)])
def test_kv_refuses_empty_or_huge_names(namespace: str, key: str) -> None:
    with pytest.raises(InvalidParameterError):
        KVConfig().put(namespace, key, "v")
