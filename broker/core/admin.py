"""Administration and introspection for ``trimq-admin`` / mqadmin, transport-neutral
(RocketMQ's ``AdminBrokerProcessor``, ``QueryMessageProcessor`` and the rebalance locks).

Topic deletion is the one owner of "everything about a topic": its configuration, consume
queues, committed offsets, and the pop state (cursors, leases, orderly locks) of it and of
its pop retry topics. A pop cursor that outlived its topic would sit above a re-created
queue's max offset, and its group would receive nothing until the new queue passed it.

A broker started alone also answers the name server's cluster and topic-list questions,
about itself (:meth:`AdminService.cluster_info`, :meth:`AdminService.topic_list`).

Subscription groups (``mqadmin updateSubGroup`` / ``deleteSubGroup``): a group's
configuration decides whether it consumes in order and how often a message is redelivered
before the DLQ (:mod:`broker.groups`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata

import trio

from broker.clock import Clock
from broker.core.routes import BrokerIdentity
from broker.groups import (
    SubscriptionGroupConfig,
    SubscriptionGroupManager,
    SubscriptionGroupWrapper,
)
from broker.locks import QueueName, RebalanceLocks
from broker.offload import Offload
from broker.pop.service import PopEngine
from broker.store.store import REPLICA_REFUSAL, MessageStore
from broker.topics import TopicConfig, TopicManager
from protocol.codes import ResponseCode
from protocol.errors import BrokerError, RecordError
from protocol.message import peek_record
from protocol.naming import is_retry_topic, is_system_topic, validate_group, validate_topic

#: RocketMQ caps queue counts per topic per broker (``TopicValidator`` / console: 1024).
MAX_QUEUE_NUMS = 1024
#: Results of a unique-key query (RocketMQ ``defaultQueryMaxNum``): the client's maxNum is
#: replaced, since one unique key may match a few redelivered copies.
DEFAULT_QUERY_MAX_NUM = 32
#: Results of any query at most (RocketMQ ``maxMsgsNumBatch``).
MAX_QUERY_NUM = 64


@dataclass(frozen=True, slots=True)
class QueueOffsets:
    """The offset range of one queue."""

    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """A consumer group's progress on one queue."""

    topic: str
    queue_id: int
    #: One past the queue's last message.
    broker_offset: int
    #: The group's committed offset (0 when it never committed).
    consumer_offset: int


@dataclass(frozen=True, slots=True)
class MessageQuery:
    """Stored messages of a topic by key (``KEYS`` or ``UNIQ_KEY``) within a store-time
    window (epoch ms)."""

    topic: str
    key: str
    max_num: int
    begin_timestamp: int
    end_timestamp: int
    #: The key is a unique key (``UNIQ_KEY``): the result count is fixed, not ``max_num``.
    unique: bool = False


@dataclass(frozen=True, slots=True)
class MessageQueryResult:
    """Stored records found (newest first) and how current the index was."""

    records: list[bytes]
    #: Epoch ms of the answer: the index gets its rows at dispatch, so it is current now.
    index_last_update_timestamp: int
    #: The dispatched commit-log position the index covers.
    index_last_update_phyoffset: int


class AdminService:
    """Topics, statistics, message lookups and queue locks (see the module docstring)."""

    def __init__(
        self,
        identity: BrokerIdentity,
        store: MessageStore,
        topics: TopicManager,
        groups: SubscriptionGroupManager,
        pop: PopEngine,
        locks: RebalanceLocks,
        *,
        clock: Clock,
        started_at: float,
        sync_flush: bool,
        offload: Offload,
    ) -> None:
        self._identity = identity
        self._store = store
        self._topics = topics
        self._groups = groups
        self._pop = pop
        self._locks = locks
        self._clock = clock
        self._started_at = started_at
        self._sync_flush = sync_flush
        self._offload = offload

    def _refuse_on_replica(self) -> None:
        """A replica's topics and groups are its master's business: admin writes go there,
        and the master's tables reach the replica over the HA link (docs/design.md §13).

        Raises:
            BrokerError: ``SERVICE_NOT_AVAILABLE`` on a replica.
        """
        if self._store.config.replica:
            raise BrokerError(REPLICA_REFUSAL, code=ResponseCode.SERVICE_NOT_AVAILABLE)

    # ------------------------------------------------------------------ topics
    def create_topic(self, config: TopicConfig) -> TopicConfig:
        """Create a topic or update its queue counts, permission and attributes.

        Raises:
            IllegalNameError: the name breaks RocketMQ's rules.
            BrokerError: ``INVALID_PARAMETER`` for a queue count outside 1..1024;
                ``SERVICE_NOT_AVAILABLE`` on a replica.
        """
        self._refuse_on_replica()
        validate_topic(config.topic_name)
        for name, value in (("readQueueNums", config.read_queue_nums),
                            ("writeQueueNums", config.write_queue_nums)):  # fmt: skip
            if not 1 <= value <= MAX_QUEUE_NUMS:
                raise BrokerError(
                    f"{name} {value} is outside 1..{MAX_QUEUE_NUMS}",
                    code=ResponseCode.INVALID_PARAMETER,
                )
        return self._topics.update(config)

    async def delete_topic(self, topic: str) -> None:
        """Delete a topic: its configuration, consume queues, offsets, pop state and queue
        locks, and the same of its pop retry topics (as RocketMQ 5 does); records age out of
        the log.
        Returns once the pop state's removal is durable.

        Raises:
            BrokerError: ``NO_PERMISSION`` for a system topic.
            OSError: the pop journal could not record the removal (the rest is done).
        """
        self._refuse_on_replica()
        if is_system_topic(topic):
            raise BrokerError(
                f"system topic {topic} cannot be deleted", code=ResponseCode.NO_PERMISSION
            )
        doomed = [topic] if is_retry_topic(topic) else [topic, *self._pop.retry_topics_of(topic)]
        for name in doomed:
            self._topics.delete(name)
            self._store.delete_topic(name)
        self._locks.forget_topics(doomed)
        write = self._pop.forget_topics(doomed)
        await self._offload(write)

    def topic_list(self) -> list[str]:
        """Every topic of this broker, system topics included (as a name server lists
        them), sorted."""
        return self._topics.names()

    def cluster_info(self) -> BrokerIdentity:
        """This broker as a cluster of one (a lone broker answers the name server's cluster
        question about itself)."""
        return self._identity

    # ------------------------------------------------------------------ subscription groups
    def update_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create a group's configuration or replace it (``UPDATE_AND_CREATE_SUBSCRIPTIONGROUP``).

        Raises:
            IllegalNameError: the group name breaks RocketMQ's rules.
            BrokerError: ``INVALID_PARAMETER`` for a negative ``retryMaxTimes`` or
                ``retryQueueNums``; ``SERVICE_NOT_AVAILABLE`` on a replica.
        """
        self._refuse_on_replica()
        validate_group(config.group_name)
        for name, value in (("retryMaxTimes", config.retry_max_times),
                            ("retryQueueNums", config.retry_queue_nums)):  # fmt: skip
            if value < 0:
                raise BrokerError(
                    f"{name} {value} is negative", code=ResponseCode.INVALID_PARAMETER
                )
        return self._groups.update(config)

    def group_config(self, group: str) -> SubscriptionGroupConfig:
        """One group's configuration (``GET_SUBSCRIPTIONGROUP_CONFIG``).

        Raises:
            BrokerError: ``SUBSCRIPTION_GROUP_NOT_EXIST`` (RocketMQ answers ``SYSTEM_ERROR``,
                which clients would retry).
        """
        config = self._groups.get(group)
        if config is None:
            raise BrokerError(
                f"subscription group {group} does not exist on this broker",
                code=ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            )
        return config

    def group_table(self) -> SubscriptionGroupWrapper:
        """Every group's configuration with the table's data version
        (``GET_ALL_SUBSCRIPTIONGROUP_CONFIG``)."""
        return self._groups.snapshot()

    def delete_group(self, group: str, *, clean_offset: bool = False) -> bool:
        """Delete a group's configuration (``DELETE_SUBSCRIPTIONGROUP``); with
        ``clean_offset`` also its committed offsets. True if it had a configuration (a
        missing one is no error, as in RocketMQ).

        The group's pop state (cursors, messages in flight) is kept: its consumers may still
        be running, and a lease dropped here would never be redelivered.
        """
        self._refuse_on_replica()
        existed = self._groups.delete(group)
        if clean_offset:
            self._store.offsets.remove_group(group)
        return existed

    # ------------------------------------------------------------------ statistics
    def topic_stats(self, topic: str) -> dict[int, QueueOffsets]:
        """Queue id → offset range, for every read queue of a topic.

        Raises:
            BrokerError: ``TOPIC_NOT_EXIST``.
        """
        return {
            qid: QueueOffsets(
                self._store.min_offset(topic, qid), self._store.max_offset(topic, qid)
            )
            for qid in self._read_queues(topic)
        }

    def consume_stats(self, group: str, topic: str | None = None) -> list[QueueProgress]:
        """A group's progress on every queue of one topic, or of every existing topic the
        group has offsets for.

        Raises:
            BrokerError: ``CONSUMER_NOT_ONLINE`` when there is nothing to report (a named
                topic that does not exist included).
        """
        offsets = self._store.offsets
        topics = [topic] if topic else sorted(offsets.topics_of(group))
        progress = [
            QueueProgress(
                name,
                qid,
                broker_offset=self._store.max_offset(name, qid),
                consumer_offset=offsets.query(group, name, qid) or 0,
            )
            for name in topics
            if self._topics.get(name) is not None
            for qid in self._read_queues(name)
        ]
        if not progress:
            raise BrokerError(
                f"no consume stats for group {group}", code=ResponseCode.CONSUMER_NOT_ONLINE
            )
        return progress

    def all_consumer_offsets(self) -> dict[tuple[str, str], dict[int, int]]:
        """(topic, group) → queue id → committed offset, over every topic of this broker
        (mqadmin-like tools list the groups a broker knows from this)."""
        offsets = self._store.offsets
        return {
            (topic, group): offsets.table(group, topic)
            for topic in self._topics.names()
            for group in sorted(offsets.groups_of(topic))
        }

    def runtime_info(self, connections: int) -> dict[str, str]:
        """The runtime keys this broker can fill truthfully, named as RocketMQ names them
        (``AdminBrokerProcessor.prepareRuntimeInfo``); ``connections`` is the front ends'
        open connection count. Throughput keys (``putTps``, ``msgPutTotalTodayNow`` …) are
        left out: the broker keeps no such counters, and a made-up zero would read as
        "idle"."""
        store = self._store
        return {
            "brokerVersionDesc": f"trimq-{_version()}",
            "brokerName": self._identity.broker_name,
            "brokerAddr": self._identity.address,
            "bootTimestamp": str(int(self._started_at * 1000)),
            "runtime": _runtime(self._clock.now_s() - self._started_at),
            "commitLogDiskRatio": f"{store.disk_used_ratio():.4f}",
            "commitLogMinOffset": str(store.log.min_offset),
            "commitLogMaxOffset": str(store.dispatched_offset),
            "earliestMessageTimeStamp": str(self._earliest_store_time()),
            "topicCount": str(len(self._topics.names())),
            "connectionCount": str(connections),
            "flushDiskType": "SYNC_FLUSH" if self._sync_flush else "ASYNC_FLUSH",
        }

    def _earliest_store_time(self) -> int:
        """Store time of the first record still in the commit log, -1 when there is none."""
        record = self._store.message_at(self._store.log.min_offset)
        if record is None:
            return -1
        try:
            return peek_record(record).store_timestamp
        except RecordError:
            return -1

    def _read_queues(self, topic: str) -> range:
        config = self._topics.get(topic)
        if config is None:
            raise BrokerError(f"topic {topic} does not exist", code=ResponseCode.TOPIC_NOT_EXIST)
        return range(config.read_queue_nums)

    # ------------------------------------------------------------------ message lookups
    def view_message(self, commit_log_offset: int) -> bytes:
        """The stored record at a commit-log offset (the offset part of an offset message id).

        Raises:
            BrokerError: ``QUERY_NOT_FOUND`` (RocketMQ answers ``SYSTEM_ERROR``; Java clients
                treat both alike, and ``QUERY_NOT_FOUND`` tells our clients not to retry).
        """
        record = self._store.message_at(commit_log_offset) if commit_log_offset >= 0 else None
        if record is None:
            raise BrokerError(
                f"can not find message by the offset, {commit_log_offset}",
                code=ResponseCode.QUERY_NOT_FOUND,
            )
        return record

    def query_messages(self, query: MessageQuery) -> MessageQueryResult:
        """Records of a topic whose ``KEYS`` or ``UNIQ_KEY`` hold the key, stored within the
        window, newest first (none found is an empty list: the front end says so)."""
        limit = DEFAULT_QUERY_MAX_NUM if query.unique else min(max(query.max_num, 1), MAX_QUERY_NUM)
        records = self._store.messages_by_key(
            query.topic, query.key, limit, query.begin_timestamp, query.end_timestamp
        )
        return MessageQueryResult(
            records=records,
            index_last_update_timestamp=self._clock.now_ms(),
            index_last_update_phyoffset=self._store.dispatched_offset,
        )

    # ------------------------------------------------------------------ rebalance locks
    def lock_queues(
        self, group: str, client_id: str, queues: Iterable[QueueName]
    ) -> list[QueueName]:
        """Lock (or renew) for an orderly consumer every requested queue that is free,
        expired or already its own; returns the queues it now holds."""
        return self._locks.try_lock(group, client_id, queues, trio.current_time())

    def unlock_queues(self, group: str, client_id: str, queues: Iterable[QueueName]) -> None:
        """Release the requested queues the client holds."""
        self._locks.unlock(group, client_id, queues)


def _version() -> str:
    try:
        return metadata.version("trimq")
    except metadata.PackageNotFoundError:
        return "unknown"


def _runtime(elapsed_s: float) -> str:
    """RocketMQ's ``StoreStatsService.getRuntimeInfo`` text: ``[ 0 days, 1 hours, … ]``."""
    total = int(elapsed_s)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    return f"[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]"
