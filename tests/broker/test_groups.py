"""The subscription-group table: persisted in RocketMQ's shape, atomically, across restarts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.clock import Clock, ManualClock
from broker.groups import SubscriptionGroupConfig, SubscriptionGroupManager
from protocol.errors import IllegalNameError


def manager(path: Path, clock: Clock | None = None) -> SubscriptionGroupManager:
    return SubscriptionGroupManager(path, default_retry_max_times=7, clock=clock or ManualClock(1))


def test_a_group_without_configuration_has_the_defaults(tmp_path: Path) -> None:
    groups = manager(tmp_path / "subscriptionGroup.json")
    assert groups.names() == [] and groups.get("g") is None
    assert groups.orderly("g") is False
    assert groups.retry_max_times("g") == 7  # the broker's, not RocketMQ's 16
    assert not (tmp_path / "subscriptionGroup.json").exists()  # nothing written yet


def test_configurations_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "config" / "subscriptionGroup.json"
    clock = ManualClock(1_000)
    groups = manager(path, clock)
    fifo = SubscriptionGroupConfig(
        "fifo", consume_message_orderly=True, retry_max_times=2, extra={"groupRetryPolicy": {}}
    )
    groups.update(fifo)
    clock.set_ms(2_000)
    groups.update(SubscriptionGroupConfig("plain", retry_max_times=0))
    assert groups.data_version.counter == 2 and groups.data_version.timestamp == 2_000

    doc = json.loads(path.read_bytes())  # RocketMQ's file shape and names
    assert set(doc) == {"subscriptionGroupTable", "forbiddenTable", "dataVersion"}
    assert doc["subscriptionGroupTable"]["fifo"]["consumeMessageOrderly"] is True
    assert doc["subscriptionGroupTable"]["fifo"]["groupRetryPolicy"] == {}
    assert not list(path.parent.glob("*.tmp*"))  # written atomically, nothing left over

    again = manager(path)
    assert again.names() == ["fifo", "plain"]
    assert again.get("fifo") == fifo
    assert again.orderly("fifo") and not again.orderly("plain")
    assert again.retry_max_times("fifo") == 2 and again.retry_max_times("plain") == 0
    assert again.data_version == groups.data_version

    assert again.delete("fifo") is True
    assert again.delete("fifo") is False  # gone already: nothing written
    assert manager(path).names() == ["plain"]
    assert manager(path).data_version.counter == 3


def test_illegal_names_are_refused(tmp_path: Path) -> None:
    groups = manager(tmp_path / "subscriptionGroup.json")
    with pytest.raises(IllegalNameError):
        groups.update(SubscriptionGroupConfig("bad group"))
    assert groups.names() == []


def test_an_unreadable_file_stops_the_broker(tmp_path: Path) -> None:
    path = tmp_path / "subscriptionGroup.json"
    path.write_text('{"subscriptionGroupTable":{"g":{"retryMaxTimes":1}}}')
    with pytest.raises(ValueError, match="unreadable subscription groups"):
        manager(path)
