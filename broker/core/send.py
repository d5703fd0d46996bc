"""Sending: one message, a batch, a consumer's send-back, a dead letter.

Checks follow RocketMQ's ``msgCheck``: a legal topic that producers may write, the topic
auto-created from ``TBW102`` when unknown (``autoCreateTopicEnable``), the queue id within the
topic's write queues (negative = any, round robin). A send to a classic ``%RETRY%group`` topic
whose reconsume count is past the group's maximum goes to ``%DLQ%group`` instead
(``handleRetryAndDLQ``). A delayed or timer message (``DELAY``, ``TIMER_*``) is stored in
``SCHEDULE_TOPIC_XXXX`` and handed to the timer service, which copies it to its real topic at
its delivery time.

A send-back (RocketMQ ``consumerSendMsgBack``): the message is found by its commit-log offset,
copied to the group's ``%RETRY%group`` topic with ``RETRY_TOPIC`` (its original topic, which
ali-ons needs), ``ORIGIN_MESSAGE_ID`` and its reconsume count + 1, and delayed by level
``3 + reconsume times`` unless the client asks for a level (so retries come back after 10 s,
30 s, 1 min … 2 h). Past the group's maximum, or with a negative level, it goes to
``%DLQ%group`` at once — which is also what a dead-letter request asks for.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from broker.clock import Clock
from broker.ha.acks import ReplicaSet, SyncOutcome
from broker.schedule import DELAY_PROPERTIES, SCHEDULE_TOPIC, delivery_time
from broker.storage import Storage
from broker.store.api import Host, MessageToStore, PutResult, PutStatus
from broker.timers import TimerService
from broker.topics import DEFAULT_TOPIC, TopicConfig, TopicManager
from protocol.batch import BatchEntry
from protocol.codes import ResponseCode
from protocol.errors import BrokerError, IllegalNameError, RecordError
from protocol.message import SYSFLAG_TRANSACTION_MASK, decode_record
from protocol.naming import (
    dlq_topic,
    group_of_classic_retry,
    is_retry_topic,
    producer_may_send,
    retry_topic,
    validate_group,
    validate_topic,
)
from protocol.properties import (
    CRC32,
    DELAY,
    ORIGIN_MESSAGE_ID,
    REAL_QID,
    REAL_TOPIC,
    RETRY_TOPIC,
    TIMER_OUT_MS,
    TRAN_MSG,
    UNIQ_KEY,
    encode_properties,
)

#: What a producer's send answers when its replicas did not acknowledge it in time (the
#: message is stored on the master).
_NOT_ACKNOWLEDGED = "stored on the master, but too few replicas acknowledged it in time"

#: Topic names whose checks a send service remembers at most.
_SENDABLE_NAMES = 4096

#: Where a message came from when the front end cannot tell (not an IPv4 peer).
UNKNOWN_HOST: Host = ("127.0.0.1", 0)


def born_host_of(peer: str) -> Host:
    """A producer's ``host:port`` as records store it (IPv4 only; else unknown)."""
    host, _, port = peer.rpartition(":")
    return (host, int(port)) if port.isdigit() and host.count(".") == 3 else UNKNOWN_HOST


@dataclass(frozen=True, slots=True)
class SendPolicy:
    """The broker settings sends obey."""

    auto_create_topic: bool
    #: The broker's retry limit (``max_reconsume_times``).
    max_reconsume_times: int
    max_message_size: int
    #: A group's retry limit when the sender names none: its subscription group's
    #: ``retryMaxTimes``, else the broker's.
    group_max_reconsume_times: Callable[[str], int]


class SendRequest(NamedTuple):
    """One message as a producer sends it (whatever the front end). A named tuple, not a
    frozen dataclass: one is built per message on the hot path, and a frozen dataclass's
    ``__init__`` costs microseconds (measured in ``benchmarks/bench_broker.py``)."""

    topic: str
    body: bytes
    properties: Mapping[str, str]
    #: Negative: any write queue (round robin).
    queue_id: int = -1
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = UNKNOWN_HOST
    reconsume_times: int = 0
    #: The sender's maximum for a classic retry topic (None or negative: the group's).
    max_reconsume_times: int | None = None
    #: The topic an unknown topic is created from, and how many queues the producer wants.
    default_topic: str | None = None
    default_topic_queue_nums: int = 4
    #: The properties exactly as received, stored verbatim when the message is not redirected
    #: (saves a re-encode; must describe ``properties``).
    properties_text: str | None = None


@dataclass(frozen=True, slots=True)
class BatchSendRequest:
    """Messages a producer sends as one batch to one queue of one topic."""

    topic: str
    entries: Sequence[BatchEntry]
    queue_id: int = -1
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = UNKNOWN_HOST
    default_topic: str | None = None
    default_topic_queue_nums: int = 4


class Scheduled(NamedTuple):
    """Where a delayed message waits for its delivery (what a recall names)."""

    #: Its queue and offset in SCHEDULE_TOPIC_XXXX.
    queue_id: int
    queue_offset: int
    deliver_ms: int


class SendOutcome(NamedTuple):
    """Where a message went: the put's result, and the queue it was stored in (for a
    delayed message, the queue it will be delivered to, and where it waits meanwhile). A
    named tuple: one per message."""

    result: PutResult
    topic: str
    queue_id: int
    scheduled: Scheduled | None = None


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """One result per stored message, plus a final failed one unless every message was
    stored durably (see :meth:`Storage.put_many`)."""

    results: list[PutResult]
    queue_id: int

    @property
    def ok(self) -> bool:
        """Whether every message was stored."""
        return bool(self.results) and self.results[-1].ok


@dataclass(frozen=True, slots=True)
class SendBackRequest:
    """A consumer hands back the message at ``commit_offset`` (classic retry)."""

    group: str
    commit_offset: int
    #: 0: the broker's schedule (3 + reconsume times); negative: dead-letter at once.
    delay_level: int = 0
    max_reconsume_times: int | None = None
    origin_msg_id: str | None = None


class HalfWriter(Protocol):
    """Stores a transaction's half message (the transaction service)."""

    async def prepare(self, msg: MessageToStore) -> PutResult:
        """Store ``msg`` (checked, with its real topic and queue) as a half message."""
        ...


def is_half(properties: Mapping[str, str]) -> bool:
    """Whether a send is a transaction's half message (Java's ``Boolean.parseBoolean`` of
    ``TRAN_MSG``)."""
    return properties.get(TRAN_MSG, "").lower() == "true"


class SendService:
    """Sends of every kind (see the module docstring)."""

    def __init__(
        self,
        policy: SendPolicy,
        topics: TopicManager,
        storage: Storage,
        timers: TimerService,
        clock: Clock,
        halves: HalfWriter,
        replicas: ReplicaSet,
    ) -> None:
        self.policy = policy
        #: Sync replication: a producer's send waits for its copies here (docs/design.md §13).
        self.replicas = replicas
        #: Where a transaction's half message goes.
        self.halves = halves
        self.topics = topics
        self.storage = storage
        self.timers = timers
        self.clock = clock
        self._round_robin = itertools.count()
        #: Topic names that passed :meth:`_check_sendable`.
        self._sendable: set[str] = set()

    # ------------------------------------------------------------------ single messages
    async def send(self, req: SendRequest) -> SendOutcome:
        """Store one message (or schedule it); in SYNC mode return once durable.

        Raises:
            BrokerError: the topic may not be written, does not exist, the queue id is
                illegal, or the delivery time is malformed; ``SLAVE_NOT_AVAILABLE`` (nothing
                stored) in sync replication with too few replicas in sync.
            IllegalNameError: the topic name is illegal.
        """
        msg = self._message(req)
        self._check_in_sync()
        if is_half(req.properties) and msg.topic == req.topic:
            result = await self.halves.prepare(msg)
            return SendOutcome(await self._replicated(result), msg.topic, msg.queue_id)
        outcome = await self._store(msg)
        result = await self._replicated(outcome.result)
        # Unchanged unless sync replication timed out: no copy of the outcome per send.
        return outcome if result is outcome.result else outcome._replace(result=result)

    def send_nowait(self, req: SendRequest) -> SendOutcome | None:
        """:meth:`send` without its waits, for a burst of sends that waits once
        (:meth:`settle`): a plain message is appended now and its outcome returned *before*
        it is durable or replicated — the caller must not answer it before :meth:`settle`.
        None, with nothing done, for a send that needs :meth:`send` (a half message, a
        delayed one). Raises as :meth:`send` (nothing stored)."""
        msg = self._message(req)
        if is_half(req.properties) and msg.topic == req.topic:
            return None
        try:
            if delivery_time(req.properties, self.clock.now_ms()) is not None:
                return None
        except ValueError:
            return None  # send() refuses it with its words
        self._check_in_sync()
        return SendOutcome(self.storage.store.put_nowait(msg), msg.topic, msg.queue_id)

    async def settle(self, outcomes: Sequence[SendOutcome]) -> list[SendOutcome]:
        """Wait, once for all of them, until the messages :meth:`send_nowait` stored are
        durable (SYNC flush) and replicated (sync replication); each outcome as :meth:`send`
        would have answered it: ``DISK_ERROR`` for a message the fsync did not cover,
        ``FLUSH_SLAVE_TIMEOUT`` for one too few replicas hold in time."""
        stored = [o.result.end_offset for o in outcomes if o.result.ok]
        if not stored:
            return list(outcomes)
        end = max(stored)
        # Offsets only grow: what covers a message covers every one before it.
        durable = await self.storage.wait_durable(end)
        durable_to = end if durable else self.storage.store.durable_offset
        if await self.replicas.wait_replicated(durable_to) is SyncOutcome.OK:
            replicated_to = durable_to
        else:
            replicated_to = self.replicas.confirmed()
        if replicated_to >= end:
            return list(outcomes)
        settled = []
        for o in outcomes:
            result = o.result
            if not result.ok:
                pass  # refused: answered as it is
            elif result.end_offset > durable_to:
                result = self.storage.not_durable()
            elif result.end_offset > replicated_to:
                result = result._replace(
                    status=PutStatus.FLUSH_SLAVE_TIMEOUT, remark=_NOT_ACKNOWLEDGED
                )
            settled.append(o if result is o.result else o._replace(result=result))
        return settled

    def _message(self, req: SendRequest) -> MessageToStore:
        """The message a send stores: its topic's checks (auto-created when allowed), its
        queue, a classic retry past its maximum redirected to the DLQ."""
        config = self.topic_for_send(req.topic, req.default_topic, req.default_topic_queue_nums)
        queue_id = self._queue_id(config, req.queue_id)
        topic, queue_id = self._dlq_redirect(req, queue_id)
        # Transaction bits are the broker's to set (a commit's copy): never a producer's.
        return MessageToStore(
            topic, queue_id, req.body, req.properties, req.flag,
            req.sys_flag & ~SYSFLAG_TRANSACTION_MASK, req.born_timestamp, req.born_host,
            req.reconsume_times, 0, req.properties_text if topic == req.topic else None,
        )  # fmt: skip

    def _check_in_sync(self) -> None:
        """Sync replication refuses a send before its append when too few replicas are in
        sync (Kafka's NotEnoughReplicas), so that a producer's retry cannot duplicate it.

        Raises:
            BrokerError: ``SLAVE_NOT_AVAILABLE``, the remark counting replicas in sync and
                needed; nothing was stored.
        """
        remark = self.replicas.shortfall()
        if remark is not None:
            raise BrokerError(remark, code=ResponseCode.SLAVE_NOT_AVAILABLE)

    async def _replicated(self, result: PutResult) -> PutResult:
        """Sync replication (RocketMQ's SYNC_MASTER): a stored message is answered SEND_OK
        only once enough replicas hold it; otherwise it stays stored and the answer says
        FLUSH_SLAVE_TIMEOUT. Async replication: at once."""
        if not result.ok:
            return result
        if await self.replicas.wait_replicated(result.end_offset) is SyncOutcome.OK:
            return result
        return result._replace(status=PutStatus.FLUSH_SLAVE_TIMEOUT, remark=_NOT_ACKNOWLEDGED)

    def topic_for_send(
        self, topic: str, default_topic: str | None = None, default_queue_nums: int = 4
    ) -> TopicConfig:
        """The topic's configuration, auto-created from the default topic when allowed.

        Raises:
            BrokerError: the topic may not be written or does not exist.
            IllegalNameError: the topic name is illegal.
        """
        if topic not in self._sendable:
            self._check_sendable(topic)
        config = self.topics.get(topic)
        if config is not None:
            return config
        if is_retry_topic(topic):
            return self.topics.ensure(topic, 1)
        default = self.topics.get(default_topic or DEFAULT_TOPIC)
        if self.policy.auto_create_topic and default is not None:
            nums = max(1, min(default_queue_nums, default.write_queue_nums))
            return self.topics.ensure(topic, nums)
        raise BrokerError(f"topic {topic} does not exist", code=ResponseCode.TOPIC_NOT_EXIST)

    def _check_sendable(self, topic: str) -> None:
        """Check a topic name a producer sends to, and remember it once it passes: both
        checks depend on the name alone, and checking its characters on every send cost
        more than the rest of the topic lookup (bounded: names are usually few).

        Raises:
            BrokerError: ``NO_PERMISSION``: producers may not send to this topic.
            IllegalNameError: the name is illegal.
        """
        validate_topic(topic)
        if not producer_may_send(topic):
            raise BrokerError(
                f"sending to topic {topic} is forbidden (a system, dead-letter or malformed "
                f"retry topic)",
                code=ResponseCode.NO_PERMISSION,
            )
        if len(self._sendable) >= _SENDABLE_NAMES:
            self._sendable.clear()
        self._sendable.add(topic)

    def _queue_id(self, config: TopicConfig, requested: int) -> int:
        if requested < 0:
            return next(self._round_robin) % max(1, config.write_queue_nums)
        if requested >= config.write_queue_nums:
            raise BrokerError(
                f"queueId {requested} is illegal: topic {config.topic_name} has "
                f"{config.write_queue_nums} write queues",
                code=ResponseCode.SYSTEM_ERROR,
            )
        return requested

    def _dlq_redirect(self, req: SendRequest, queue_id: int) -> tuple[str, int]:
        """Retry sends past the group's maximum go to the group's DLQ."""
        if not is_retry_topic(req.topic):
            return req.topic, queue_id
        try:
            group: str | None = group_of_classic_retry(req.topic)
        except IllegalNameError:  # a pop retry V2 name: no classic group
            group = None
        if req.reconsume_times > self._limit(group, req.max_reconsume_times):
            dlq = dlq_topic(group_of_classic_retry(req.topic))
            self.topics.ensure(dlq, 1)
            return dlq, 0
        return req.topic, queue_id

    def _limit(self, group: str | None, requested: int | None) -> int:
        if requested is not None and requested >= 0:
            return requested
        if group is None:
            return self.policy.max_reconsume_times
        return self.policy.group_max_reconsume_times(group)

    async def _store(self, msg: MessageToStore) -> SendOutcome:
        return await store_or_schedule(self.storage, self.timers, self.clock, msg)

    async def recall(self, topic: str, where: Scheduled, uniq_key: str) -> None:
        """Cancel a delayed message of ``topic`` before its delivery (RocketMQ 5.3's
        RecallMessage): it is never delivered, across restarts and crashes too.

        Raises:
            BrokerError: ``QUERY_NOT_FOUND`` when no such delayed message waits there (wrong
                topic or id, or already delivered or recalled).
        """
        await self.timers.recall(topic, where.queue_id, where.queue_offset, uniq_key)

    # ------------------------------------------------------------------ batches
    async def send_batch(self, req: BatchSendRequest) -> BatchOutcome:
        """Store every message of a batch in one queue, as one unit: every check runs before
        the first append, so a refused batch stores nothing, and its messages get
        consecutive queue offsets.

        Raises:
            BrokerError: as :meth:`send`; ``MESSAGE_ILLEGAL`` for an empty batch, a delayed
                message in it, or a body over the size limit; ``SLAVE_NOT_AVAILABLE`` as
                :meth:`send` (nothing stored).
        """
        config = self.topic_for_send(req.topic, req.default_topic, req.default_topic_queue_nums)
        queue_id = self._queue_id(config, req.queue_id)
        if not req.entries:
            raise BrokerError("empty batch", code=ResponseCode.MESSAGE_ILLEGAL)
        messages = [self._batch_message(req, queue_id, i, e) for i, e in enumerate(req.entries)]
        self._check_in_sync()
        results = await self.storage.put_many(messages)
        if results and results[-1].ok:
            last = await self._replicated(results[-1])
            if not last.ok:  # every message of the batch is stored: each says so
                results = [r._replace(status=last.status, remark=last.remark) for r in results]
        return BatchOutcome(results, queue_id)

    def _batch_message(
        self, req: BatchSendRequest, queue_id: int, index: int, entry: BatchEntry
    ) -> MessageToStore:
        _check_not_delayed(entry.properties)
        if is_half(entry.properties):
            raise BrokerError(
                f"batch message {index}: a batch cannot be transactional",
                code=ResponseCode.MESSAGE_ILLEGAL,
            )
        limit = self.policy.max_message_size
        if len(entry.body) > limit:
            raise BrokerError(
                f"batch message {index}: body of {len(entry.body)} bytes exceeds {limit}",
                code=ResponseCode.MESSAGE_ILLEGAL,
            )
        return MessageToStore(
            req.topic, queue_id, entry.body, entry.properties, entry.flag,
            req.sys_flag & ~SYSFLAG_TRANSACTION_MASK,
            req.born_timestamp, req.born_host, 0, 0, encode_properties(entry.properties),
        )  # fmt: skip

    # ------------------------------------------------------------------ send-back, DLQ
    async def send_back(self, req: SendBackRequest) -> SendOutcome:
        """Re-queue a failed message on the group's retry topic, or dead-letter it.

        Raises:
            BrokerError: ``SYSTEM_ERROR`` when no readable message is at the offset,
                ``SERVICE_NOT_AVAILABLE`` when it could not be stored.
            IllegalNameError: the group name is illegal.
        """
        validate_group(req.group)
        data = self.storage.store.message_at(req.commit_offset)
        if data is None:
            raise BrokerError(f"look message by offset failed, {req.commit_offset}",
                              code=ResponseCode.SYSTEM_ERROR)  # fmt: skip
        try:
            msg, _ = decode_record(data)
        except RecordError as exc:
            raise BrokerError(str(exc), code=ResponseCode.SYSTEM_ERROR) from None
        props = {k: v for k, v in msg.properties.items() if k not in (CRC32, DELAY)}
        props.setdefault(RETRY_TOPIC, msg.topic)
        props.setdefault(
            ORIGIN_MESSAGE_ID, req.origin_msg_id or props.get(UNIQ_KEY) or msg.offset_msg_id
        )
        limit = self._limit(req.group, req.max_reconsume_times)
        if msg.reconsume_times >= limit or req.delay_level < 0:
            topic = dlq_topic(req.group)
        else:
            topic = retry_topic(req.group)
            props[DELAY] = str(req.delay_level or 3 + msg.reconsume_times)
        self.topics.ensure(topic, 1)
        outcome = await self._store(MessageToStore(
            topic, 0, msg.body, props, msg.flag, msg.sys_flag & ~SYSFLAG_TRANSACTION_MASK,
            msg.born_timestamp,
            msg.born_host, msg.reconsume_times + 1,
        ))  # fmt: skip
        if not outcome.result.ok:
            raise BrokerError(outcome.result.remark or outcome.result.status.value,
                              code=ResponseCode.SERVICE_NOT_AVAILABLE)  # fmt: skip
        return outcome

    async def dead_letter(
        self, group: str, commit_offset: int, origin_msg_id: str | None = None
    ) -> SendOutcome:
        """Move the message at ``commit_offset`` to the group's DLQ now (gRPC's
        ``ForwardMessageToDeadLetterQueue``; a send-back with a negative level)."""
        return await self.send_back(
            SendBackRequest(group, commit_offset, delay_level=-1, origin_msg_id=origin_msg_id)
        )


async def store_or_schedule(
    storage: Storage, timers: TimerService, clock: Clock, msg: MessageToStore
) -> SendOutcome:
    """Store a message, or — when it is delayed or timed — park it in SCHEDULE_TOPIC_XXXX for
    the timer service, which copies it to its topic and queue at its delivery time.

    Raises:
        BrokerError: ``MESSAGE_ILLEGAL`` for a malformed delivery time.
    """
    try:
        scheduled = delivery_time(msg.properties, clock.now_ms())
    except ValueError as exc:
        raise BrokerError(f"bad delivery time: {exc}", code=ResponseCode.MESSAGE_ILLEGAL) from None
    if scheduled is None:
        return SendOutcome(await storage.put(msg), msg.topic, msg.queue_id)
    schedule_queue, deliver_ms = scheduled
    properties = {**msg.properties, REAL_TOPIC: msg.topic, REAL_QID: str(msg.queue_id),
                  TIMER_OUT_MS: str(deliver_ms)}  # fmt: skip
    parked = MessageToStore(
        SCHEDULE_TOPIC, schedule_queue, msg.body, properties, msg.flag, msg.sys_flag,
        msg.born_timestamp, msg.born_host, msg.reconsume_times, msg.prepared_transaction_offset,
    )  # fmt: skip
    result = await storage.put(parked)
    if not result.ok:
        return SendOutcome(result, msg.topic, msg.queue_id)
    timers.scheduled(result, schedule_queue, deliver_ms)
    where = Scheduled(schedule_queue, result.queue_offset, deliver_ms)
    return SendOutcome(result, msg.topic, msg.queue_id, where)


def _check_not_delayed(properties: Mapping[str, str]) -> None:
    """Batches cannot be delayed (RocketMQ refuses them too)."""
    for name in DELAY_PROPERTIES:
        value = properties.get(name)
        if value and value not in ("0", "-1"):
            raise BrokerError(
                f"a batch message cannot be delayed ({name}={value})",
                code=ResponseCode.MESSAGE_ILLEGAL,
            )
