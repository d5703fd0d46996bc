"""The read half of POP_MESSAGE: pick queues, read from the group's pop cursors, record leases.

Everything here is synchronous (no await): the processor reads and, when nothing was found,
parks in the :class:`~broker.pop.hub.PopHub` in the same step, so a message that arrives in
between always either was read or wakes the parked pop.

- Non-orderly pops read the retry topic and the normal queues in alternating order per
  (group, topic), so neither retries nor new messages starve (RocketMQ draws a 20 % chance
  per request). Cursors advance at pop time, like RocketMQ's consumer offset in pop mode;
  unacknowledged messages live on as leases.
- A retried message is sent with its original topic and its receipt (``POP_CK``) in the
  record, as RocketMQ does; a normal message is sent as stored and the client rebuilds its
  receipt from ``startOffsetInfo``/``msgOffsetInfo``.
- Orderly pops take a queue whose lock is free or expired, and re-deliver an expired lock's
  offsets in order, from the same queue, with their consume counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from broker.pop.inflight import InflightTable, Lease
from broker.store.api import GetResult, GetStatus, RecordFilter
from broker.store.store import MessageStore
from broker.topics import TopicManager
from protocol.headers.pop import INIT_MODE_MIN
from protocol.message import decode_record, encode_record
from protocol.naming import V1RetryNames, pop_retry_topic_v2
from protocol.properties import ORIGIN_TOPIC, POP_CK, REVIVE_DEADLINE_MS
from protocol.receipt import (
    POP_ORDER_REVIVE_QUEUE,
    ExtraInfo,
    MsgOffsets,
    OrderCount,
    RetryFlag,
    StartOffset,
)

#: :meth:`PopReader.rotation`: (retry topic first?, next first queue), None when unset.
Rotation = tuple[bool | None, int | None]
#: Revive queue id put into non-orderly receipts (one logical revive queue here).
REVIVE_QID = 0
#: A queue whose first message is within this many bytes of the commit log's end counts as
#: "in memory" for a new MAX group (RocketMQ checks the page cache, which holds up to 40 % of
#: the machine's memory; a fixed size keeps the rule independent of the machine).
HOT_LOG_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class PopRequest:
    """What one pop asks for (validated by the processor)."""

    group: str
    topic: str
    queue_id: int  # -1: any queue
    max_nums: int
    invisible_ms: int
    tags: frozenset[int] | None = None
    #: A property (SQL92) filter the store applies to each candidate record, and the same
    #: check over an arriving message's properties (long-poll wake-ups).
    record_filter: RecordFilter | None = None
    property_match: Callable[[Mapping[str, str]], bool] | None = None
    order: bool = False
    attempt_id: str | None = None
    init_mode: int = INIT_MODE_MIN


@dataclass(slots=True)
class PopResult:
    """What one pop found: record bytes to send (chunks of whole records, to be joined)
    and the header strings describing them."""

    pop_time: int
    records: list[bytes] = field(default_factory=list)
    leases: list[Lease] = field(default_factory=list)
    start_offsets: list[StartOffset] = field(default_factory=list)
    msg_offsets: list[MsgOffsets] = field(default_factory=list)
    order_counts: list[OrderCount] = field(default_factory=list)
    rest: int = 0
    #: Retried messages handed out: (reconsume times, revive deadline epoch ms or None).
    redelivered: list[tuple[int, int | None]] = field(default_factory=list)

    @property
    def found(self) -> bool:
        """Whether the pop returns messages."""
        return bool(self.leases)


class PopReader:
    """Serves the read side of pops over a store and an in-flight table."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicManager,
        table: InflightTable,
        *,
        broker_name: str,
        retry_v2: bool,
        v1_names: V1RetryNames,
    ) -> None:
        self.store = store
        self.topics = topics
        self.table = table
        self.broker_name = broker_name
        self.retry_v2 = retry_v2
        self.v1_names = v1_names
        self._retry_first: dict[tuple[str, str], bool] = {}
        self._next_queue: dict[tuple[str, str], int] = {}

    def retry_topic(self, group: str, topic: str) -> str:
        """The pop retry topic of ``(group, topic)``; V1 names are claimed (a collision raises
        :class:`~protocol.errors.RetryNameCollisionError`)."""
        if self.retry_v2:
            return pop_retry_topic_v2(group, topic)
        return self.v1_names.register(group, topic)

    # ------------------------------------------------------------------ pop
    def rotation(self, req: PopRequest) -> Rotation:
        """Where the next pop of ``req``'s (group, topic) starts (retry topic first or last,
        first normal queue): what a read that is then undone must put back (:meth:`rotate_back`)."""
        pair = (req.group, req.topic)
        return self._retry_first.get(pair), self._next_queue.get(pair)

    def rotate_back(self, req: PopRequest, rotation: Rotation) -> None:
        """Put back a :meth:`rotation` (a read that found nothing and is done again later)."""
        pair = (req.group, req.topic)
        retry_first, next_queue = rotation
        if retry_first is None:
            self._retry_first.pop(pair, None)
        else:
            self._retry_first[pair] = retry_first
        if next_queue is None:
            self._next_queue.pop(pair, None)
        else:
            self._next_queue[pair] = next_queue

    def pop_nowait(self, req: PopRequest, now_ms: int) -> PopResult:
        """Pop up to ``req.max_nums`` messages at ``now_ms``, recording their leases."""
        result = PopResult(pop_time=now_ms)
        if req.order:
            for queue_id in self._queues(req):
                self._pop_orderly(req, queue_id, result)
            return result
        retry = self.retry_topic(req.group, req.topic)
        pair = (req.group, req.topic)
        retry_first = self._retry_first.get(pair, False)
        self._retry_first[pair] = not retry_first
        sources = [(req.topic, q) for q in self._queues(req)]
        # Created at the group's first pop, not at its first revive: creating a topic
        # persists the topic table (two fsyncs), which made each run's first revive 5-8 ms
        # late in the seed experiment.
        self.topics.ensure(retry, 1)
        sources.insert(0 if retry_first else len(sources), (retry, 0))
        for topic, queue_id in sources:
            self._pop_queue(req, topic, queue_id, result)
        return result

    def _queues(self, req: PopRequest) -> list[int]:
        """The normal queues to try, rotating the starting queue between pops."""
        if req.queue_id >= 0:
            return [req.queue_id]
        config = self.topics.get(req.topic)
        n = config.read_queue_nums if config is not None else 0
        if n <= 0:
            return []
        key = (req.group, req.topic)
        start = self._next_queue.get(key, 0) % n
        self._next_queue[key] = start + 1
        return [(start + i) % n for i in range(n)]

    def _start(self, req: PopRequest, topic: str, queue_id: int) -> int:
        """The group's pop cursor on a queue, initialised on first use: a committed consumer
        offset if the group has one, else the queue's start (``initMode`` MIN, and always
        for retry topics) or, for MAX, RocketMQ's ``getInitOffset``: the whole queue while it
        is young (it never lost a message and its first one is still "in memory", here: in
        the last :data:`HOT_LOG_BYTES` of the commit log), else its last message (max − 1)."""
        cursor = self.table.cursor(req.group, topic, queue_id)
        low = self.store.min_offset(topic, queue_id)
        if cursor is None:
            committed = self.store.offsets.query(req.group, topic, queue_id)
            if committed is not None:
                cursor = committed
            elif req.init_mode == INIT_MODE_MIN or topic != req.topic:
                cursor = low
            elif low == 0 and self._first_is_hot(topic, queue_id):
                cursor = 0
            else:
                cursor = max(low, self.store.max_offset(topic, queue_id) - 1)
            self.table.set_cursor(req.group, topic, queue_id, cursor)
        return max(cursor, low)  # retention may have removed the cursor's messages

    def _first_is_hot(self, topic: str, queue_id: int) -> bool:
        first = self.store.get(topic, queue_id, 0, 1)
        if not first.commit_log_offsets:
            return True  # empty: starting at 0 is starting at the end
        return self.store.log.end - first.commit_log_offsets[0] <= HOT_LOG_BYTES

    def _read(
        self, topic: str, queue_id: int, offset: int, count: int, req: PopRequest
    ) -> GetResult:
        return self.store.get(
            topic, queue_id, offset, count, tags_codes=req.tags, record_filter=req.record_filter
        )

    def _read_at_cursor(
        self, req: PopRequest, topic: str, queue_id: int, start: int, count: int
    ) -> tuple[int, GetResult, int]:
        """Read from the cursor (from the queue's start if retention removed it); returns
        where the read began, what it found and where the cursor goes next (past filtered
        messages too)."""
        got = self._read(topic, queue_id, start, count, req)
        if got.status is GetStatus.OFFSET_TOO_SMALL:
            start = got.min_offset
            got = self._read(topic, queue_id, start, count, req)
        return start, got, got.next_offset if got.status in _ADVANCING else start

    def _pop_queue(self, req: PopRequest, topic: str, queue_id: int, result: PopResult) -> None:
        remaining = req.max_nums - len(result.leases)
        start = self._start(req, topic, queue_id)
        if remaining <= 0:
            result.rest += max(0, self.store.max_offset(topic, queue_id) - start)
            return
        start, got, next_offset = self._read_at_cursor(req, topic, queue_id, start, remaining)
        result.rest += max(0, got.max_offset - next_offset)
        if next_offset == start and not got.offsets:
            return
        flag = RetryFlag.of_topic(topic)
        leases = self._take(req, topic, queue_id, flag, got, start, result)
        if flag is RetryFlag.NORMAL and leases:  # one origin topic: the request's
            self.table.popped_read(leases, next_offset)
        else:
            self.table.popped(leases, cursor=(req.group, topic, queue_id, next_offset))
        self.store.offsets.commit(req.group, topic, queue_id, next_offset)

    def _take(
        self,
        req: PopRequest,
        topic: str,
        queue_id: int,
        flag: RetryFlag,
        got: GetResult,
        start: int,
        result: PopResult,
    ) -> list[Lease]:
        """Leases and records for what a read found (retried messages re-encoded)."""
        group, pop_time, invisible_ms, origin = (
            req.group,
            result.pop_time,
            req.invisible_ms,
            req.topic,
        )
        leases = [  # positional: a third cheaper than origin_topic= (0.3 vs 0.45 us a lease)
            Lease(group, topic, queue_id, offset, pop_time, invisible_ms, origin)
            for offset in got.offsets
        ]
        if flag is RetryFlag.NORMAL:
            if got.body:
                result.records.append(got.body)  # sent exactly as stored
        else:
            pos = 0
            for lease in leases:
                msg, pos = decode_record(got.body, pos)
                receipt = self._receipt(result.pop_time, req, flag, queue_id, start, lease.offset)
                props = dict(msg.properties)
                props[POP_CK] = receipt.encode()
                lease.origin_topic = props.get(ORIGIN_TOPIC, req.topic)
                deadline = props.get(REVIVE_DEADLINE_MS, "")
                result.redelivered.append(
                    (
                        msg.reconsume_times,
                        int(deadline) if deadline.isdigit() and deadline.isascii() else None,
                    )
                )
                msg = dataclasses.replace(msg, topic=lease.origin_topic, properties=props)
                result.records.append(encode_record(msg))
        if leases:
            result.leases.extend(leases)
            result.start_offsets.append(StartOffset(flag, queue_id, start))
            result.msg_offsets.append(MsgOffsets(flag, queue_id, list(got.offsets)))
        return leases

    def _receipt(
        self, pop_time: int, req: PopRequest, flag: RetryFlag, queue_id: int, ck: int, offset: int
    ) -> ExtraInfo:
        qid = POP_ORDER_REVIVE_QUEUE if req.order else REVIVE_QID
        return ExtraInfo(
            ck, pop_time, req.invisible_ms, qid, flag, self.broker_name, queue_id, offset
        )

    # ------------------------------------------------------------------ orderly
    def _pop_orderly(self, req: PopRequest, queue_id: int, result: PopResult) -> None:
        remaining = req.max_nums - len(result.leases)
        if remaining <= 0:
            return
        lock = self.table.order_lock(req.group, req.topic, queue_id)
        if lock is not None:
            same_attempt = req.attempt_id is not None and lock.attempt_id == req.attempt_id
            if not same_attempt and self.table.blocked(
                req.group, req.topic, queue_id, result.pop_time
            ):
                return
            if len(lock.offsets) <= remaining:
                # An expired lock comes back whole, in order; a repeated attempt gets the
                # same messages again without counting another consumption.
                counts = {
                    o: lock.counts.get(o, 1) - (1 if same_attempt else 0) for o in lock.offsets
                }
                self._repop(req, queue_id, list(lock.offsets), counts, result)
            return
        start = self._start(req, req.topic, queue_id)
        start, got, next_offset = self._read_at_cursor(req, req.topic, queue_id, start, remaining)
        result.rest += max(0, got.max_offset - next_offset)
        leases = self._take(req, req.topic, queue_id, RetryFlag.NORMAL, got, start, result)
        for lease in leases:
            lease.order = True
            result.order_counts.append(OrderCount(RetryFlag.NORMAL, queue_id, lease.offset, 0))
        if leases:
            result.order_counts.append(OrderCount(RetryFlag.NORMAL, queue_id, None, 0))
        if leases or next_offset != start:
            cursor = (req.group, req.topic, queue_id, next_offset)
            self.table.popped(leases, cursor=cursor, attempt_id=req.attempt_id)
            self.store.offsets.commit(req.group, req.topic, queue_id, next_offset)

    def _repop(
        self,
        req: PopRequest,
        queue_id: int,
        offsets: list[int],
        counts: dict[int, int],
        result: PopResult,
    ) -> None:
        leases: list[Lease] = []
        found: list[int] = []
        for offset in offsets:
            got = self.store.get(req.topic, queue_id, offset, 1)
            if got.status is not GetStatus.FOUND or got.offsets[0] != offset:
                continue  # removed by retention: nothing left to deliver
            msg, _ = decode_record(got.body)
            consumed = counts[offset]
            record = got.body
            if consumed != msg.reconsume_times:
                record = encode_record(dataclasses.replace(msg, reconsume_times=consumed))
            leases.append(
                Lease(
                    req.group,
                    req.topic,
                    queue_id,
                    offset,
                    result.pop_time,
                    req.invisible_ms,
                    origin_topic=req.topic,
                    order=True,
                    consumed=consumed,
                )
            )
            found.append(offset)
            result.records.append(record)
            result.order_counts.append(OrderCount(RetryFlag.NORMAL, queue_id, offset, consumed))
        if not leases:
            return
        result.leases.extend(leases)
        result.start_offsets.append(StartOffset(RetryFlag.NORMAL, queue_id, found[0]))
        result.msg_offsets.append(MsgOffsets(RetryFlag.NORMAL, queue_id, found))
        result.order_counts.append(
            OrderCount(RetryFlag.NORMAL, queue_id, None, min(counts.values()))
        )
        self.table.popped(leases, attempt_id=req.attempt_id)


#: Read outcomes after which the cursor moves to ``next_offset`` (past filtered messages).
_ADVANCING = frozenset({GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE})
