"""The metadata a promoted replica needs, kept in step over the HA link (RocketMQ's
``SlaveSynchronize``, docs/design.md §13).

The master sends a whole snapshot of a table — topic configs, subscription groups, consumer
offsets, each in the form its owner persists — when a replica connects and then whenever the
table changed, checked every ``meta_interval_s`` (3 s; RocketMQ checks every 3 s and syncs at
most every 60 s). The replica applies them through the owners: topics and groups are made
the master's (and persisted at once, as the master's are); offsets only ever move forward,
and the store's checkpoint persists them as it does the master's.

The pop in-flight table (leases with their deadlines, pop cursors, orderly locks) is a table
too: a promoted replica's pops continue at the master's cursors, a message popped and not
acked comes back at its deadline, an acked one never (at most the changes of the last
interval are lost: those leases' messages are redelivered or, for an ack not yet sent, once
more). A pop commits its group's offset past what it popped at once (as RocketMQ's does), so
the offsets a master sends are still capped at the smallest offset each (group, topic,
queue) has in flight: what a pull consumer of that group or a table snapshot the replica
missed falls back on. A snapshot the replica cannot read or persist is skipped with a
warning — the messages keep flowing, and the next change brings a new one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgpack

from broker.groups import SubscriptionGroupManager
from broker.logs import get_logger
from broker.store.offsets import ConsumerOffsets
from broker.topics import TopicManager
from protocol.bodies.broker import TopicConfigSerializeWrapper
from protocol.bodies.subscription import SubscriptionGroupWrapper
from protocol.errors import TrimqError
from protocol.ha import META_GROUPS, META_OFFSETS, META_POP, META_TOPICS

_log = get_logger("ha.metadata")

#: Every table, in the order a master sends them (topics before the offsets on them).
TABLES = (META_TOPICS, META_GROUPS, META_OFFSETS, META_POP)


class InFlight(Protocol):
    """What is popped and not acked yet (the pop engine's in-flight table)."""

    @property
    def changes(self) -> int:
        """Grows with every change."""
        ...

    def lowest_in_flight(self) -> Mapping[tuple[str, str, int], int]:
        """The smallest offset in flight per (group, topic, queue id)."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The whole table, msgpack-able (what the pop journal snapshots)."""
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
        if table == META_POP:
            return self.in_flight.changes
        return self.offsets.changes, self.in_flight.changes

    def snapshot(self, table: int) -> bytes:
        """``table`` as its owner persists it."""
        if table == META_TOPICS:
            wrapper = TopicConfigSerializeWrapper(self.topics.all(), self.topics.data_version)
            return wrapper.to_json()
        if table == META_GROUPS:
            return self.groups.snapshot().to_json()
        if table == META_POP:
            packed: bytes = msgpack.packb(self.in_flight.snapshot(), use_bin_type=True)
            return packed
        return self.offsets.snapshot(self.in_flight.lowest_in_flight())


class ReplicaMetadata:
    """The replica's side: apply a snapshot through the table's owner."""

    def __init__(
        self,
        topics: TopicManager,
        groups: SubscriptionGroupManager,
        offsets: ConsumerOffsets,
        pop_mirror: Callable[[dict[str, Any]], None],
    ) -> None:
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        #: Takes the master's pop in-flight table (``PopEngine.mirror``).
        self.pop_mirror = pop_mirror
        #: Snapshots applied, and those skipped (unreadable, or a table this broker lacks).
        self.applied = 0
        self.skipped = 0

    def apply(self, table: int, data: bytes) -> bool:
        """Apply the master's snapshot of ``table``; returns whether anything changed."""
        try:
            changed = self._apply(table, data)
        except (TrimqError, ValueError, OSError, msgpack.UnpackException) as exc:
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
        if table == META_POP:
            return self._mirror_pop(data)
        raise ValueError(f"unknown metadata table {table} (a newer master?)")

    def _mirror_pop(self, data: bytes) -> bool:
        state = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if not isinstance(state, dict):
            raise ValueError("the pop in-flight table is not a map")
        self.pop_mirror(state)
        return True
