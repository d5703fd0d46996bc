"""ClientRegistry over fake channels: membership, notifications, subscriptions, retry topics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.core.clients import (
    ClientRegistry,
    ClientStatistics,
    ConsumerRegistration,
    MessageModel,
    Subscription,
    TransactionCheck,
)
from broker.core.offsets import OffsetReset
from broker.topics import TopicManager
from protocol.errors import IllegalNameError, RetryNameCollisionError
from protocol.naming import V1RetryNames


@dataclass(eq=False)
class FakeChannel:
    """Records what the registry tells the client; ``accepts`` False plays a full queue."""

    channel_id: int
    accepts: bool = True
    changed: list[str] = field(default_factory=list)
    resets: list[tuple[OffsetReset, dict[int, int]]] = field(default_factory=list)
    checks: list[TransactionCheck] = field(default_factory=list)

    def check_transaction_state(self, check: TransactionCheck) -> bool:
        self.checks.append(check)
        return self.accepts

    def notify_consumer_ids_changed(self, group: str) -> bool:
        self.changed.append(group)
        return self.accepts

    def notify_reset_offset(self, reset: OffsetReset, offsets: Mapping[int, int]) -> bool:
        self.resets.append((reset, dict(offsets)))
        return self.accepts


def consumer(
    group: str, *subs: Subscription, model: MessageModel = MessageModel.CLUSTERING
) -> ConsumerRegistration:
    return ConsumerRegistration(group, tuple(subs), message_model=model)


@pytest.fixture
def topics(tmp_path: Path) -> TopicManager:
    return TopicManager(tmp_path / "topics.json", default_queue_nums=4)


@pytest.fixture
def v1_names() -> V1RetryNames:
    return V1RetryNames()


@pytest.fixture
def registry(topics: TopicManager, v1_names: V1RetryNames) -> ClientRegistry:
    return ClientRegistry(topics, v1_names)


def test_joining_tells_every_member_once_per_channel(registry: ClientRegistry) -> None:
    a, b = FakeChannel(1), FakeChannel(2)
    assert registry.heartbeat(a, "c1", [], [consumer("g")]) == ["g"]
    assert a.changed == ["g"]
    assert registry.heartbeat(a, "c1", [], [consumer("g")]) == []  # a repeat joins nothing
    assert a.changed == ["g"]
    # Two clients on one channel are told once; the other channel is told too.
    assert registry.heartbeat(b, "c2", [], [consumer("g")]) == ["g"]
    assert registry.heartbeat(b, "c3", [], [consumer("g")]) == ["g"]
    assert (a.changed, b.changed) == (["g"] * 3, ["g"] * 2)
    assert registry.client_ids("g") == ["c1", "c2", "c3"]
    # A client that moves to another channel joins again.
    assert registry.heartbeat(b, "c1", [], [consumer("g")]) == ["g"]


def test_leaving_tells_the_rest_and_an_empty_group_goes(registry: ClientRegistry) -> None:
    a, b = FakeChannel(1), FakeChannel(2)
    registry.heartbeat(a, "c1", ["p"], [consumer("g")])
    registry.heartbeat(b, "c2", [], [consumer("g")])
    a.changed.clear()
    registry.unregister("c2", None, "g")
    assert a.changed == ["g"] and registry.client_ids("g") == ["c1"]
    registry.unregister("c9", None, "g")  # not a member: nobody is told
    assert a.changed == ["g"]
    registry.channel_closed(a)
    assert registry.client_ids("g") == [] and registry.producer_ids("p") == []
    assert registry.statistics() == ClientStatistics(
        groups=0, members=0, producers=0, notifications=4
    )


def test_closing_a_channel_removes_only_its_clients(registry: ClientRegistry) -> None:
    a, b = FakeChannel(1), FakeChannel(2)
    registry.heartbeat(a, "c1", ["p"], [consumer("g"), consumer("h")])
    registry.heartbeat(b, "c2", ["p"], [consumer("g")])
    b.changed.clear()
    registry.channel_closed(FakeChannel(1))  # the same connection, another object
    assert registry.client_ids("g") == ["c2"] and registry.client_ids("h") == []
    assert registry.producer_ids("p") == ["c2"]
    assert b.changed == ["g"]
    assert registry.statistics().groups == 1


def test_subscription_of_the_member_that_joined_last(registry: ClientRegistry) -> None:
    old = Subscription("T", "a || b", "TAG")
    new = Subscription("T", "c", "TAG")
    registry.heartbeat(FakeChannel(1), "c1", [], [consumer("g", old)])
    registry.heartbeat(
        FakeChannel(2), "c2", [], [consumer("g", new, Subscription("U", "*", "TAG"))]
    )
    assert registry.subscription("g", "T") == new
    assert registry.subscription("g", "U") == Subscription("U", "*", "TAG")
    assert registry.subscription("g", "V") is None
    assert registry.subscription("nobody", "T") is None


def test_clustering_groups_get_their_retry_topic(
    registry: ClientRegistry, topics: TopicManager
) -> None:
    registry.heartbeat(FakeChannel(1), "c1", [], [consumer("cg")])
    registry.heartbeat(FakeChannel(1), "c1", [], [consumer("bg", model=MessageModel.BROADCASTING)])
    retry = topics.get("%RETRY%cg")
    assert retry is not None and retry.write_queue_nums == 1
    assert topics.get("%RETRY%bg") is None


def test_an_illegal_group_registers_nothing(registry: ClientRegistry) -> None:
    with pytest.raises(IllegalNameError):
        registry.heartbeat(FakeChannel(1), "c1", ["p"], [consumer("ok"), consumer("bad group")])
    assert registry.client_ids("ok") == [] and registry.producer_ids("p") == []


def test_a_classic_retry_topic_that_is_a_v1_pop_retry_topic_is_refused(
    registry: ClientRegistry, v1_names: V1RetryNames, topics: TopicManager
) -> None:
    # Group "G" pops topic "T_X" with V1 names: its retry topic is %RETRY%G_T_X, which is
    # also the classic retry topic of a group named "G_T_X". Sharing it would mix them.
    v1_names.register("G", "T_X")
    with pytest.raises(RetryNameCollisionError, match="V1 retry topic"):
        registry.heartbeat(FakeChannel(1), "c1", ["p"], [consumer("G_T_X")])
    assert registry.client_ids("G_T_X") == [] and registry.producer_ids("p") == []
    # The reverse: once the classic group holds the name, the V1 pair is refused.
    registry.heartbeat(FakeChannel(1), "c1", [], [consumer("H_U")])
    with pytest.raises(RetryNameCollisionError, match="classic retry topic"):
        v1_names.register("H", "U")
    # A broadcasting group has no retry topic: nothing to claim.
    registry.heartbeat(
        FakeChannel(1), "c1", [], [consumer("G_T_X", model=MessageModel.BROADCASTING)]
    )


def test_reset_notice_goes_to_each_channel_and_counts_the_queued(
    registry: ClientRegistry,
) -> None:
    a, full = FakeChannel(1), FakeChannel(2, accepts=False)
    registry.heartbeat(a, "c1", [], [consumer("g")])
    registry.heartbeat(a, "c2", [], [consumer("g")])
    registry.heartbeat(full, "c3", [], [consumer("g")])
    reset = OffsetReset("g", "T", timestamp=-1, force=True)
    assert registry.notify_reset(reset, {0: 5, 1: 7}) == 1
    assert a.resets == [(reset, {0: 5, 1: 7})] and len(full.resets) == 1
    assert registry.notify_reset(OffsetReset("other", "T", 0, True), {0: 0}) == 0


def test_producer_channels_take_turns_and_leave_with_their_connection(
    topics: TopicManager, v1_names: V1RetryNames
) -> None:
    registry = ClientRegistry(topics, v1_names)
    a, b = FakeChannel(1), FakeChannel(2)
    assert registry.producer_channel("pg") is None
    registry.heartbeat(a, "client-a", ["pg"], [])
    registry.heartbeat(b, "client-b", ["pg", "other"], [])
    picked = [registry.producer_channel("pg") for _ in range(4)]
    assert {c.channel_id for c in picked if c is not None} == {1, 2}
    registry.channel_closed(b)
    assert registry.producer_channel("pg") is a
    assert registry.producer_channel("other") is None
