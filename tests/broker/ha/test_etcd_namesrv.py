"""The name server and elected masters (docs/ha.md): a master registering with a newer
epoch replaces the group's stale master, whose later registrations are refused; a
registration without an epoch (RocketMQ's brokers, trimq without etcd) works as before."""

from __future__ import annotations

import dataclasses

import pytest

from broker.namesrv.routes import Registration, RouteTable, StaleMasterError
from protocol.bodies.broker import DataVersion, TopicConfig
from protocol.headers.route import RegisterBrokerRequestHeader

OLD, NEW, REPLICA = "127.0.0.1:10911", "127.0.0.1:10921", "127.0.0.1:10931"


def reg(addr: str, broker_id: int = 0, epoch: int | None = None, version: int = 1) -> Registration:
    topics = {"T": TopicConfig("T", read_queue_nums=4, write_queue_nums=4)}
    return Registration(
        "DefaultCluster", addr, "broker-a", broker_id, f"{addr}-ha", topics,
        DataVersion(1000, version), None, epoch,
    )  # fmt: skip


def addrs(table: RouteTable) -> dict[int, str]:
    route = table.route("T")
    assert route is not None
    return dict(route.broker_datas[0].broker_addrs)


def test_a_newer_epoch_replaces_the_stale_master() -> None:
    table = RouteTable()
    table.register(reg(OLD, epoch=5), now=0.0)
    table.register(reg(NEW, broker_id=1), now=0.0)
    assert addrs(table) == {0: OLD, 1: NEW}
    # The replica was elected: it registers as id 0 with its newer epoch.
    table.register(reg(NEW, epoch=9, version=2), now=1.0)
    assert addrs(table) == {0: NEW}
    assert OLD not in table.live()
    assert table.master_epoch("broker-a") == 9
    # The deposed master keeps registering: refused, nothing changes.
    with pytest.raises(StaleMasterError, match="older than 9"):
        table.register(reg(OLD, epoch=5, version=3), now=2.0)
    with pytest.raises(StaleMasterError):
        table.register(reg(OLD, epoch=0), now=2.0)  # elected never: no epoch to show
    assert addrs(table) == {0: NEW}
    # The same master renewing, and a replica, are unaffected.
    table.register(reg(NEW, epoch=9, version=2), now=3.0)
    table.register(reg(REPLICA, broker_id=2), now=3.0)
    assert addrs(table) == {0: NEW, 2: REPLICA}


def test_registrations_without_an_epoch_work_as_before() -> None:
    table = RouteTable()
    table.register(reg(OLD), now=0.0)
    table.register(reg(NEW), now=1.0)  # RocketMQ's rule: the last master registered wins
    assert addrs(table) == {0: NEW}
    assert table.master_epoch("broker-a") is None


def test_the_epoch_travels_in_an_ext_field_of_our_own() -> None:
    header = RegisterBrokerRequestHeader(
        broker_name="broker-a", broker_addr=NEW, cluster_name="DefaultCluster",
        ha_server_addr=NEW, broker_id=0, trimq_master_epoch=9,
    )  # fmt: skip
    ext = header.to_ext()
    assert ext["trimqMasterEpoch"] == "9"
    assert RegisterBrokerRequestHeader.from_ext(ext).trimq_master_epoch == 9
    legacy = {k: v for k, v in ext.items() if k != "trimqMasterEpoch"}
    assert RegisterBrokerRequestHeader.from_ext(legacy).trimq_master_epoch is None
    assert dataclasses.replace(reg(OLD), master_epoch=None).master_epoch is None
