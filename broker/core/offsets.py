"""Consumer offsets and queue offsets, transport-neutral (RocketMQ's
``ConsumerManageProcessor`` offset half and the offset queries of ``AdminBrokerProcessor``).

The never-committed rule (RocketMQ ``ConsumerManageProcessor.queryConsumerOffset``): a group
that never committed on a queue is answered ``offset 0`` while the queue still starts at 0, and
``QUERY_NOT_FOUND`` only once retention has removed message 0. The C++ consumer takes
``QUERY_NOT_FOUND`` as "start at the end" (it then asks for the max offset), so answering it
for a queue that starts at 0 would make "produce first, then start the consumer" lose every
message produced before the consumer started.

Queue-offset queries on a queue that never held a message answer 0, like RocketMQ's
``getMaxOffsetInQueue`` / ``getMinOffsetInQueue`` for a missing consume queue.

A reset (mqadmin ``resetOffsetByTime``) moves the committed offsets *and* the pop cursors:
a pop group reads from its cursor, not from the committed offset, once it has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from broker.store.store import MessageStore
from broker.topics import TopicConfig, TopicManager
from protocol.codes import ResponseCode
from protocol.errors import BrokerError, RecordError
from protocol.message import peek_record
from protocol.naming import validate_group

#: ``OffsetReset.timestamp`` meaning "to the end of every queue" (Java's ``timestamp == -1``).
RESET_TO_END = -1
#: ``OffsetReset.queue_id`` meaning "every queue of the topic" (Java's default, always sent).
ALL_QUEUES = -1


class Boundary(Enum):
    """Which message a search by time picks when several share the millisecond."""

    #: The first message stored at or after the time.
    LOWER = "lower"
    #: The last message stored exactly at the time, if any (else as ``LOWER``).
    UPPER = "upper"


@dataclass(frozen=True, slots=True)
class OffsetReset:
    """Move a group's offsets on a topic (mqadmin ``resetOffsetByTime``; RocketMQ 5 also
    resets one queue to an explicit offset). Front ends that tell online consumers about
    the reset send these facts along with the new offsets."""

    group: str
    topic: str
    #: Epoch ms: reset to the first message stored at or after it; :data:`RESET_TO_END`
    #: for the end of every queue.
    timestamp: int
    #: Also move offsets forward (without it an offset only moves back, as in RocketMQ).
    force: bool
    #: One queue, or :data:`ALL_QUEUES` (any negative id).
    queue_id: int = ALL_QUEUES
    #: An explicit target for ``queue_id`` instead of ``timestamp`` (one queue only).
    offset: int | None = None


class PopCursors(Protocol):
    """What a reset needs of the pop engine (:class:`broker.pop.service.PopEngine`)."""

    def reset_cursor(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Move the group's pop cursor on a queue, if it has one."""
        ...


class OffsetService:
    """Committed offsets of consumer groups and the offsets of queues."""

    def __init__(self, store: MessageStore, topics: TopicManager, pop: PopCursors) -> None:
        self._store = store
        self._topics = topics
        self._pop = pop

    # ------------------------------------------------------------------ committed offsets
    def committed(
        self, group: str, topic: str, queue_id: int, *, zero_if_never: bool = True
    ) -> int:
        """The group's committed offset on a queue; for a group that never committed there,
        0 while the queue still starts at 0 (see the module docstring).

        ``zero_if_never=False`` is RocketMQ 5's ``setZeroIfNotFound = false``: a client that
        wants to pick its own start for a group that never committed.

        Raises:
            BrokerError: ``QUERY_NOT_FOUND`` when the group never committed on the queue and
                0 is not the answer.
        """
        offset = self._store.offsets.query(group, topic, queue_id)
        if offset is not None:
            return offset
        if not zero_if_never:
            raise BrokerError(
                "Not found, do not set to zero, maybe this group boot first",
                code=ResponseCode.QUERY_NOT_FOUND,
            )
        if self._store.min_offset(topic, queue_id) > 0:
            raise BrokerError(
                "Not found, the group never committed and message 0 of the queue is gone",
                code=ResponseCode.QUERY_NOT_FOUND,
            )
        return 0

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Commit ``offset`` for the group's queue of an existing topic; a negative offset is
        ignored: the JavaScript client commits -1 for a queue it has no position in yet, and
        that must not erase a real position.

        Raises:
            BrokerError: ``TOPIC_NOT_EXIST`` or ``INVALID_PARAMETER`` (no such queue).
            IllegalNameError: ``group`` is not a legal group name (it could not be persisted).
        """
        self.check_queue(topic, queue_id)
        self.commit_checked(group, topic, queue_id, offset)

    def check_queue(self, topic: str, queue_id: int) -> None:
        """Raise unless ``topic`` exists here and ``queue_id`` is one of its queues (read or
        write: a queue being scaled down still has readers committing).

        Raises:
            BrokerError: ``TOPIC_NOT_EXIST`` or ``INVALID_PARAMETER``.
        """
        config = self._topics.get(topic)
        if config is None:
            raise BrokerError(
                f"topic[{topic}] not exist, apply first please!", code=ResponseCode.TOPIC_NOT_EXIST
            )
        queues = max(config.read_queue_nums, config.write_queue_nums)
        if not 0 <= queue_id < queues:
            raise BrokerError(
                f"queueId[{queue_id}] is illegal, topic:[{topic}] has {queues} queues",
                code=ResponseCode.INVALID_PARAMETER,
            )

    def commit_checked(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """:meth:`commit` for a queue the caller has already checked (a pull piggy-backing
        its commit; a reset of the topic's own queues): negative offsets ignored.

        Raises:
            IllegalNameError: ``group`` is not a legal group name.
        """
        validate_group(group)
        if offset >= 0:
            self._store.offsets.commit(group, topic, queue_id, offset)

    # ------------------------------------------------------------------ queue offsets
    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last message of the queue (only dispatched messages count: in SYNC
        flush mode a message is dispatched once durable, so "committed" reads agree)."""
        return self._store.max_offset(topic, queue_id)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset whose message is still stored."""
        return self._store.min_offset(topic, queue_id)

    def search(self, topic: str, queue_id: int, timestamp: int, boundary: Boundary) -> int:
        """The queue offset of the message stored at ``timestamp`` (epoch ms).

        ``LOWER``: the first message stored at or after it (the max offset when none was).
        ``UPPER``: the last message stored exactly at it when there are such messages
        (several can share a millisecond), otherwise the same as ``LOWER``.
        """
        lower = self._store.offset_by_time(topic, queue_id, timestamp)
        if boundary is Boundary.LOWER:
            return lower
        after = self._store.offset_by_time(topic, queue_id, timestamp + 1)
        return after - 1 if after > lower else lower

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        """Store time of the queue's first live message, -1 when there is none (as RocketMQ's
        ``getEarliestMessageTime``)."""
        first = self._store.min_offset(topic, queue_id)
        result = self._store.get(topic, queue_id, first, 1)
        if not result.body:
            return -1
        try:
            return peek_record(result.body).store_timestamp
        except RecordError:
            return -1

    # ------------------------------------------------------------------ reset
    def reset(self, request: OffsetReset) -> dict[int, int]:
        """Move the group's committed offsets and its pop cursors on every queue of the topic
        (or ``request.queue_id`` alone) to the first message stored at or after
        ``request.timestamp`` (or to ``request.offset``); without ``force`` only backwards.
        Returns queue id → new offset.

        Online consumers keep their own positions: telling them is the caller's part
        (:meth:`broker.core.clients.ClientRegistry.notify_reset`).

        Raises:
            BrokerError: ``TOPIC_NOT_EXIST``, or ``INVALID_PARAMETER`` for a bad queue id.
            IllegalNameError: ``request.group`` is not a legal group name.
        """
        validate_group(request.group)
        config = self._topics.get(request.topic)
        if config is None:
            raise BrokerError(
                f"topic {request.topic} does not exist", code=ResponseCode.TOPIC_NOT_EXIST
            )
        table: dict[int, int] = {}
        for queue_id in _reset_queues(request, config):
            target = self._reset_target(request, queue_id)
            self.commit_checked(request.group, request.topic, queue_id, target)
            self._pop.reset_cursor(request.group, request.topic, queue_id, target)
            table[queue_id] = target
        return table

    def _reset_target(self, request: OffsetReset, queue_id: int) -> int:
        """Where one queue's offset goes."""
        if request.queue_id >= 0 and request.offset is not None:
            target = request.offset
        elif request.timestamp == RESET_TO_END:
            target = self._store.max_offset(request.topic, queue_id)
        else:
            target = self._store.offset_by_time(request.topic, queue_id, request.timestamp)
        committed = self._store.offsets.query(request.group, request.topic, queue_id)
        if not request.force and committed is not None and committed < target:
            return committed
        return target


def _reset_queues(request: OffsetReset, config: TopicConfig) -> range:
    """The queues a reset covers.

    Raises:
        BrokerError: ``INVALID_PARAMETER`` for a queue the topic does not have.
    """
    queues = range(config.read_queue_nums)
    if request.queue_id < 0:  # ALL_QUEUES (any negative id, as RocketMQ reads it)
        return queues
    if request.queue_id not in queues:
        raise BrokerError(
            f"queueId {request.queue_id} is illegal", code=ResponseCode.INVALID_PARAMETER
        )
    return range(request.queue_id, request.queue_id + 1)
