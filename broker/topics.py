"""Topic configuration of this broker (RocketMQ's ``TopicConfigManager``).

Persisted as ``config/topics.json`` in RocketMQ's shape (``topicConfigTable`` +
``dataVersion``), written atomically on every change. ``TBW102`` is the default topic
producers fall back to for unknown topics; a send to an unknown topic creates it from there
when ``auto_create_topic`` is on, as a RocketMQ broker with ``autoCreateTopicEnable`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from broker.clock import SYSTEM_CLOCK, Clock
from broker.store.files import atomic_write, read_optional
from protocol.bodies.broker import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from protocol.bodies.route import PERM_INHERIT, PERM_READ, PERM_WRITE, is_readable, is_writeable
from protocol.errors import ProtocolError
from protocol.naming import DEFAULT_TOPIC, validate_topic

# The topic table is kept in RocketMQ's own shapes (TopicConfig, the perm bits); core code
# takes them from here, the one owner of topic state.
__all__ = [
    "DEFAULT_TOPIC",
    "PERM_READ_WRITE",
    "TopicConfig",
    "TopicManager",
    "is_readable",
    "is_writeable",
]

PERM_READ_WRITE = PERM_READ | PERM_WRITE


class TopicManager:
    """Topic name → :class:`TopicConfig`, persisted."""

    def __init__(self, path: Path, *, default_queue_nums: int, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self.default_queue_nums = default_queue_nums
        self.clock = clock
        self._topics: dict[str, TopicConfig] = {}
        self._version = DataVersion(timestamp=clock.now_ms(), counter=0)
        #: Called after every change (the name-server registrar re-registers at once).
        self._listeners: list[Callable[[], None]] = []
        self._load()
        if DEFAULT_TOPIC not in self._topics:
            self._topics[DEFAULT_TOPIC] = TopicConfig(
                DEFAULT_TOPIC,
                read_queue_nums=default_queue_nums,
                write_queue_nums=default_queue_nums,
                perm=PERM_READ_WRITE | PERM_INHERIT,
            )

    def _load(self) -> None:
        data = read_optional(self.path)
        if data is None:
            return
        try:
            wrapper = TopicConfigSerializeWrapper.from_json(data)
        except ProtocolError as exc:
            raise ValueError(f"{self.path}: unreadable topic configuration: {exc}") from None
        self._topics = dict(wrapper.topic_config_table)
        self._version = wrapper.data_version

    def _persist(self) -> None:
        self._version = self._version.next(self.clock.now_ms())
        wrapper = TopicConfigSerializeWrapper(dict(self._topics), self._version)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, wrapper.to_json())
        for listener in self._listeners:
            listener()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change from now on (the name-server registrar, which
        needs the topic table itself, so it cannot be built before it)."""
        self._listeners.append(listener)

    @property
    def data_version(self) -> DataVersion:
        """Changes with every update (the name server compares it)."""
        return self._version

    def get(self, name: str) -> TopicConfig | None:
        """The topic's configuration, or None."""
        return self._topics.get(name)

    def names(self) -> list[str]:
        """Every topic name, sorted."""
        return sorted(self._topics)

    def all(self) -> dict[str, TopicConfig]:
        """A copy of the table."""
        return dict(self._topics)

    def update(self, config: TopicConfig) -> TopicConfig:
        """Create or replace a topic (validated) and persist.

        Raises:
            IllegalNameError: the name breaks RocketMQ's rules.
        """
        validate_topic(config.topic_name)
        self._topics[config.topic_name] = config
        self._persist()
        return config

    def mirror(self, table: Mapping[str, TopicConfig]) -> bool:
        """Make the table the master's ``table`` (a replica, docs/design.md §13): topics it
        lacks are removed, the rest replaced; persisted only when something changed.
        Returns whether it changed.

        Raises:
            IllegalNameError: a name in ``table`` breaks RocketMQ's rules (nothing changed).
        """
        for name in table:
            validate_topic(name)
        if dict(table) == self._topics:
            return False
        self._topics = dict(table)
        self._persist()
        return True

    def delete(self, name: str) -> bool:
        """Remove a topic; True if it existed."""
        if self._topics.pop(name, None) is None:
            return False
        self._persist()
        return True

    def ensure(
        self, name: str, queue_nums: int | None = None, *, perm: int = PERM_READ_WRITE
    ) -> TopicConfig:
        """The topic, created with ``queue_nums`` queues if it does not exist yet."""
        found = self._topics.get(name)
        if found is not None:
            return found
        nums = queue_nums or self.default_queue_nums
        return self.update(
            TopicConfig(name, read_queue_nums=nums, write_queue_nums=nums, perm=perm)
        )

    def ensure_queues(self, name: str, queue_nums: int) -> None:
        """Make sure ``name`` has at least ``queue_nums`` queues (queues found in the store
        after a restart must stay readable)."""
        found = self.ensure(name, queue_nums)
        if found.read_queue_nums < queue_nums or found.write_queue_nums < queue_nums:
            self.update(
                dataclasses.replace(
                    found,
                    read_queue_nums=max(queue_nums, found.read_queue_nums),
                    write_queue_nums=max(queue_nums, found.write_queue_nums),
                )
            )
