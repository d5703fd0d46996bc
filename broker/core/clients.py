"""Connected clients and their groups (RocketMQ's ``ConsumerManager`` and
``ProducerManager``), over whatever channel a front end gives each client.

Heartbeats register a client id on its channel for every group it names. A consumer group's
membership change (a client joins, leaves, unregisters or its channel closes) tells every
remaining member at once, so clients rebalance without waiting for their 20 s poll (RocketMQ
``realTimeNotifyConsumerChange``). Clients that never unregister (client-cpp 2.1) leave when
their channel closes. A clustering consumer group's heartbeat creates its classic retry topic
``%RETRY%group`` (one queue), as RocketMQ does, so that ali-ons finds the retry route when
its consumer starts.

The registry never builds a wire message: a front end implements :class:`ClientChannel`
(Remoting: one per connection, sending oneway requests).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from broker.core.offsets import OffsetReset
from broker.topics import TopicManager
from protocol.naming import V1RetryNames, retry_topic, validate_group


class ClientChannel(Protocol):
    """How the broker reaches one connected client (a front end implements it). Both
    notifications are fire-and-forget: they return False when the message could not even
    be queued (the client is gone, or too slow to read)."""

    @property
    def channel_id(self) -> Hashable:
        """Equal for the same connection, different for any other."""
        ...

    def notify_consumer_ids_changed(self, group: str) -> bool:
        """Tell the client that ``group``'s members changed (it rebalances now)."""
        ...

    def notify_reset_offset(self, reset: OffsetReset, offsets: Mapping[int, int]) -> bool:
        """Tell the client that ``reset`` moved its group's offsets to ``offsets`` (queue id →
        offset), so that it does not overwrite them with its own position."""
        ...

    def check_transaction_state(self, check: TransactionCheck) -> bool:
        """Ask the producer whether the transaction of a half message committed; it answers
        with an end of the transaction (or not at all)."""
        ...


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    """A check-back: what the broker asks a producer about one undecided half message."""

    #: The producer group asked.
    group: str
    #: The half's real topic.
    topic: str
    #: The half's queue offset in the half topic (``tranStateTableOffset``).
    queue_offset: int
    #: The half's commit-log offset (how the producer's answer names it).
    commit_offset: int
    #: ``UNIQ_KEY`` (else the offset id): the message id the producer gave it.
    msg_id: str
    transaction_id: str
    offset_msg_id: str
    #: The half as a stored record with its real topic and queue (the check's body).
    record: bytes


class MessageModel(Enum):
    """How a consumer group shares messages (RocketMQ's ``MessageModel`` names)."""

    BROADCASTING = "BROADCASTING"
    CLUSTERING = "CLUSTERING"
    LITE_SELECTIVE = "LITE_SELECTIVE"


class ConsumeType(Enum):
    """How a consumer gets messages (RocketMQ's ``ConsumeType`` names)."""

    #: Pull.
    CONSUME_ACTIVELY = "CONSUME_ACTIVELY"
    #: Push (a pull loop inside the client).
    CONSUME_PASSIVELY = "CONSUME_PASSIVELY"
    CONSUME_POP = "CONSUME_POP"


@dataclass(frozen=True, slots=True)
class Subscription:
    """One topic a consumer group subscribes to, with its filter expression."""

    topic: str
    #: ``"*"`` (everything) or ``"tagA || tagB"`` for ``TAG``; the text for other types.
    expression: str
    #: ``TAG`` or ``SQL92``.
    expression_type: str


@dataclass(frozen=True, slots=True)
class ConsumerRegistration:
    """A consumer group as one client runs it (what a heartbeat says about it)."""

    group: str
    subscriptions: tuple[Subscription, ...] = ()
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_type: ConsumeType = ConsumeType.CONSUME_PASSIVELY


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """Numbers for the admin and the metrics."""

    #: Consumer groups with at least one member.
    groups: int
    #: (consumer group, client) memberships.
    members: int
    #: (producer group, client) registrations.
    producers: int
    #: Notifications queued to clients so far (membership changes and offset resets).
    notifications: int


@dataclass(slots=True)
class _Member:
    """One client of a consumer group."""

    client_id: str
    channel: ClientChannel
    registration: ConsumerRegistration


@dataclass(slots=True)
class _Group:
    """The members of one consumer group, in the order they first joined."""

    members: dict[str, _Member] = field(default_factory=dict)

    def channels(self) -> list[ClientChannel]:
        """Each member's channel once (a client may run several members on one)."""
        seen: dict[Hashable, ClientChannel] = {}
        for member in self.members.values():
            seen.setdefault(member.channel.channel_id, member.channel)
        return list(seen.values())


class ClientRegistry:
    """Who consumes and produces on this broker (see the module docstring)."""

    def __init__(self, topics: TopicManager, v1_names: V1RetryNames) -> None:
        self._topics = topics
        #: The broker's one V1 retry-name table: a clustering group's ``%RETRY%group`` is
        #: claimed there, so it can never also be a V1 pop retry topic (or the reverse).
        self._v1_names = v1_names
        self._groups: dict[str, _Group] = {}
        #: Producer group → client id → channel.
        self._producers: dict[str, dict[str, ClientChannel]] = {}
        self._notifications = 0
        self._turns = itertools.count()

    # ------------------------------------------------------------------ membership
    def heartbeat(
        self,
        channel: ClientChannel,
        client_id: str,
        producer_groups: Iterable[str],
        consumers: Sequence[ConsumerRegistration],
    ) -> list[str]:
        """Register a client's heartbeat on ``channel`` (the last heartbeat's subscriptions
        win); returns the consumer groups it joined (first time, or on another channel),
        whose other members were told.

        Raises:
            IllegalNameError: a consumer group name breaks RocketMQ's rules (nothing was
                registered).
            RetryNameCollisionError: a clustering group's retry topic is already the V1 pop
                retry topic of a (group, topic) pair (nothing was registered).
        """
        for consumer in consumers:
            validate_group(consumer.group)
        for consumer in consumers:
            if consumer.message_model is MessageModel.CLUSTERING:
                self._v1_names.reserve_classic(consumer.group)
        for producer_group in producer_groups:
            self._producers.setdefault(producer_group, {})[client_id] = channel
        joined: list[str] = []
        for consumer in consumers:
            group = self._groups.setdefault(consumer.group, _Group())
            old = group.members.get(client_id)
            group.members[client_id] = _Member(client_id, channel, consumer)
            if old is None or old.channel.channel_id != channel.channel_id:
                joined.append(consumer.group)
                self._members_changed(consumer.group, group)
            if consumer.message_model is MessageModel.CLUSTERING:
                self._topics.ensure(retry_topic(consumer.group), 1)
        return joined

    def unregister(
        self, client_id: str, producer_group: str | None, consumer_group: str | None
    ) -> None:
        """The client leaves the named groups (None: no group of that kind)."""
        if producer_group:
            self._remove_producer(producer_group, lambda cid, _: cid == client_id)
        if consumer_group:
            self._remove_members(consumer_group, lambda member: member.client_id == client_id)

    def channel_closed(self, channel: ClientChannel) -> None:
        """Every client on ``channel`` leaves every group."""
        gone = channel.channel_id
        for group in list(self._producers):
            self._remove_producer(group, lambda _, ch: ch.channel_id == gone)
        for group in list(self._groups):
            self._remove_members(group, lambda member: member.channel.channel_id == gone)

    def _remove_producer(self, group: str, leaves: Callable[[str, ClientChannel], bool]) -> None:
        members = self._producers.get(group)
        if members is None:
            return
        for client_id in [c for c, ch in members.items() if leaves(c, ch)]:
            del members[client_id]
        if not members:
            del self._producers[group]

    def _remove_members(self, name: str, leaves: Callable[[_Member], bool]) -> None:
        """Remove the members ``leaves`` picks; tell the rest if any left."""
        group = self._groups.get(name)
        if group is None:
            return
        gone = [c for c, member in group.members.items() if leaves(member)]
        for client_id in gone:
            del group.members[client_id]
        if not group.members:
            del self._groups[name]
        elif gone:
            self._members_changed(name, group)

    # ------------------------------------------------------------------ queries
    def client_ids(self, group: str) -> list[str]:
        """The consumer group's client ids, sorted like RocketMQ does (clients rebalance
        over this list, so every member must see the same order)."""
        found = self._groups.get(group)
        return sorted(found.members) if found is not None else []

    def producer_channel(self, group: str) -> ClientChannel | None:
        """A channel of one online producer of ``group`` (each in turn, so check-backs are
        spread over the group), None when none is online."""
        members = self._producers.get(group)
        if not members:
            return None
        channels = list(members.values())
        return channels[next(self._turns) % len(channels)]

    def producer_ids(self, group: str) -> list[str]:
        """The producer group's client ids, sorted."""
        return sorted(self._producers.get(group, ()))

    def subscription(self, group: str, topic: str) -> Subscription | None:
        """The group's subscription to ``topic`` as its members registered it (the member
        that joined last wins where they differ), None when no member subscribes."""
        found = self._groups.get(group)
        if found is None:
            return None
        latest: Subscription | None = None
        for member in found.members.values():
            for sub in member.registration.subscriptions:
                if sub.topic == topic:
                    latest = sub
        return latest

    def statistics(self) -> ClientStatistics:
        """Counts of groups, memberships, producers and notifications sent."""
        return ClientStatistics(
            groups=len(self._groups),
            members=sum(len(g.members) for g in self._groups.values()),
            producers=sum(len(p) for p in self._producers.values()),
            notifications=self._notifications,
        )

    # ------------------------------------------------------------------ notifications
    def notify_reset(self, reset: OffsetReset, offsets: Mapping[int, int]) -> int:
        """Tell every channel of the group's online consumers about an offset reset (as
        RocketMQ's ``Broker2Client.resetOffset``); returns how many were queued.

        A pull-mode client keeps its position in memory and commits it every few seconds:
        without this it would overwrite the reset with its next commit. A client that
        ignores the notice overwrites the reset (reset a stopped group then).
        """
        group = self._groups.get(reset.group)
        if group is None:
            return 0
        return self._count(ch.notify_reset_offset(reset, offsets) for ch in group.channels())

    def _members_changed(self, name: str, group: _Group) -> None:
        self._count(ch.notify_consumer_ids_changed(name) for ch in group.channels())

    def _count(self, queued: Iterable[bool]) -> int:
        sent = sum(1 for ok in queued if ok)
        self._notifications += sent
        return sent
