"""The metadata a promoted replica needs, kept in step over the HA link (RocketMQ's
``SlaveSynchronize``, docs/design.md §13).

The master sends a whole snapshot of a table — topic configs, subscription groups, consumer
offsets, each in the form its owner persists — when a replica connects and then whenever the
table changed, checked every ``meta_interval_s`` (3 s; RocketMQ checks every 3 s and syncs at
most every 60 s). The replica applies them through the owners: topics and groups are made
the master's (and persisted at once, as the master's are); offsets only ever move forward,
and the store's checkpoint persists them as it does the master's.

A pop commits its group's offset past what it popped at once (as RocketMQ's does), and pop
in-flight state is not replicated: so the offsets a master sends are capped at the smallest
offset each (group, topic, queue) still has in flight. A promoted replica's pops then start
at the oldest unacknowledged message — what was popped and not acked is delivered again
(duplicates, never a loss). A snapshot the replica
cannot read or persist is skipped with a warning — the messages keep flowing, and the next
change brings a new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from broker.groups import SubscriptionGroupManager
from broker.logs import get_logger
from broker.store.offsets import ConsumerOffsets
from broker.topics import TopicManager
from protocol.bodies.broker import TopicConfigSerializeWrapper
from protocol.bodies.subscription import SubscriptionGroupWrapper
from protocol.errors import TrimqError
from protocol.ha import META_GROUPS, META_OFFSETS, META_TOPICS

_log = get_logger("ha.metadata")

#: Every table, in the order a master sends them (topics before the offsets on them).
TABLES = (META_TOPICS, META_GROUPS, META_OFFSETS)


class InFlight(Protocol):
    """What is popped and not acked yet (the pop engine's in-flight table)."""

    @property
    def changes(self) -> int:
        """Grows with every change."""
        ...

    def lowest_in_flight(self) -> Mapping[tuple[str, str, int], int]:
        """The smallest offset in flight per (group, topic, queue id)."""
        ...


class MasterMetadata:
    """The master's side: each table's version (what changed) and its snapshot."""

    def __init__(
        self,
        topics: TopicManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsets,
        in_flight: InFlight,
    ) -> None:
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.in_flight = in_flight

    def version(self, table: int) -> object:
        """Changes whenever ``table`` does (compared with ``==``)."""
        if table == META_TOPICS:
            return self.topics.data_version
        if table == META_GROUPS:
            return self.groups.data_version
        return self.offsets.changes, self.in_flight.changes

    def snapshot(self, table: int) -> bytes:
        """``table`` as its owner persists it."""
        if table == META_TOPICS:
            wrapper = TopicConfigSerializeWrapper(self.topics.all(), self.topics.data_version)
            return wrapper.to_json()
        if table == META_GROUPS:
            return self.groups.snapshot().to_json()
        return self.offsets.snapshot(self.in_flight.lowest_in_flight())


class ReplicaMetadata:
    """The replica's side: apply a snapshot through the table's owner."""

    def __init__(
        self, topics: TopicManager, groups: SubscriptionGroupManager, offsets: ConsumerOffsets
    ) -> None:
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        #: Snapshots applied, and those skipped (unreadable, or a table this broker lacks).
        self.applied = 0
        self.skipped = 0

    def apply(self, table: int, data: bytes) -> bool:
        """Apply the master's snapshot of ``table``; returns whether anything changed."""
        try:
            changed = self._apply(table, data)
        except (TrimqError, ValueError, OSError) as exc:
            self.skipped += 1
            _log.warning("metadata snapshot skipped", table=table, error=str(exc))
            return False
        self.applied += 1
        return changed

    def _apply(self, table: int, data: bytes) -> bool:
        if table == META_TOPICS:
            wrapper = TopicConfigSerializeWrapper.from_json(data)
            return self.topics.mirror(wrapper.topic_config_table)
        if table == META_GROUPS:
            return self.groups.mirror(SubscriptionGroupWrapper.from_json(data))
        if table == META_OFFSETS:
            return self.offsets.advance_from(data) > 0
        raise ValueError(f"unknown metadata table {table} (a newer master?)")
