"""Subscription-group configuration of this broker (RocketMQ's ``SubscriptionGroupManager``).

Persisted as ``config/subscriptionGroup.json`` in RocketMQ's shape
(``subscriptionGroupTable`` + ``forbiddenTable`` + ``dataVersion``), written atomically on
every change, like ``topics.json``. A group without a configuration behaves as one with
RocketMQ's defaults, except that its retry limit is the broker's ``max_reconsume_times``.
Groups are not created on first use (RocketMQ's ``autoCreateSubscriptionGroup``): only those
an administrator configured are listed.

What the broker takes from a configuration today: ``consumeMessageOrderly`` (the gRPC front
end's ``fifo``: orderly pops, one assignment per queue) and ``retryMaxTimes`` (when a
message goes to ``%DLQ%group``). The other fields are kept and answered, not enforced.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from broker.clock import SYSTEM_CLOCK, Clock
from broker.store.files import atomic_write, read_optional
from protocol.bodies.broker import DataVersion
from protocol.bodies.subscription import SubscriptionGroupConfig, SubscriptionGroupWrapper
from protocol.errors import ProtocolError
from protocol.naming import validate_group

# The group table is kept in RocketMQ's own shapes; core code takes them from here, the one
# owner of subscription-group state.
__all__ = ["SubscriptionGroupConfig", "SubscriptionGroupManager", "SubscriptionGroupWrapper"]


class SubscriptionGroupManager:
    """Group name → :class:`SubscriptionGroupConfig`, persisted."""

    def __init__(
        self, path: Path, *, default_retry_max_times: int, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        """``default_retry_max_times``: the retry limit of a group with no configuration."""
        self.path = path
        self.default_retry_max_times = default_retry_max_times
        self.clock = clock
        self._groups: dict[str, SubscriptionGroupConfig] = {}
        self._forbidden: dict[str, Mapping[str, int]] = {}
        self._version = DataVersion(timestamp=clock.now_ms(), counter=0)
        self._load()

    def _load(self) -> None:
        data = read_optional(self.path)
        if data is None:
            return
        try:
            wrapper = SubscriptionGroupWrapper.from_json(data)
        except ProtocolError as exc:
            raise ValueError(f"{self.path}: unreadable subscription groups: {exc}") from None
        self._groups = dict(wrapper.subscription_group_table)
        self._forbidden = dict(wrapper.forbidden_table)
        self._version = wrapper.data_version

    def _persist(self) -> None:
        self._version = self._version.next(self.clock.now_ms())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, self.snapshot().to_json())

    @property
    def data_version(self) -> DataVersion:
        """Changes with every update."""
        return self._version

    def snapshot(self) -> SubscriptionGroupWrapper:
        """Every configuration, the forbidden table and the data version (what
        ``GET_ALL_SUBSCRIPTIONGROUP_CONFIG`` answers, and what is persisted)."""
        return SubscriptionGroupWrapper(dict(self._groups), dict(self._forbidden), self._version)

    def mirror(self, master: SubscriptionGroupWrapper) -> bool:
        """Make the groups and the forbidden table the master's (a replica, docs/design.md
        §13); persisted only when something changed. Returns whether it changed.

        Raises:
            IllegalNameError: a group name in ``master`` is illegal (nothing changed).
        """
        for group in master.subscription_group_table:
            validate_group(group)
        groups = dict(master.subscription_group_table)
        forbidden = dict(master.forbidden_table)
        if groups == self._groups and forbidden == self._forbidden:
            return False
        self._groups, self._forbidden = groups, forbidden
        self._persist()
        return True

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's configuration, or None."""
        return self._groups.get(group)

    def names(self) -> list[str]:
        """Every configured group, sorted."""
        return sorted(self._groups)

    def update(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create or replace a group's configuration (its name validated) and persist.

        Raises:
            IllegalNameError: the name breaks RocketMQ's rules.
        """
        validate_group(config.group_name)
        self._groups[config.group_name] = config
        self._persist()
        return config

    def delete(self, group: str) -> bool:
        """Remove a group's configuration (and its forbidden entries); True if it existed."""
        existed = self._groups.pop(group, None) is not None
        existed = self._forbidden.pop(group, None) is not None or existed
        if existed:
            self._persist()
        return existed

    # ------------------------------------------------------------------ queries
    def orderly(self, group: str) -> bool:
        """Whether ``group`` consumes in order (``consumeMessageOrderly``; False when it has
        no configuration)."""
        config = self._groups.get(group)
        return config is not None and config.consume_message_orderly

    def retry_max_times(self, group: str) -> int:
        """Redeliveries of a message of ``group`` before it goes to the group's DLQ: the
        configuration's ``retryMaxTimes``, else the broker's default."""
        config = self._groups.get(group)
        return self.default_retry_max_times if config is None else config.retry_max_times
