"""The timer service: delivers delayed and timer messages at their exact time.

A source of the broker's one deadline loop (:mod:`broker.deadlines`; no scanning, no
per-level polling: RocketMQ's ``ScheduleMessageService`` re-checks every level every 100 ms):
at the earliest delivery time in :class:`broker.schedule.Schedule` it copies each due record from
``SCHEDULE_TOPIC_XXXX`` to its real topic and queue. Progress is written to
``config/schedule.json`` just before every store checkpoint (so the checkpoint is never newer
than it); after a crash, delivered copies written since the checkpoint are found in the
recovered log by their ``TIMER_SRC`` property. A restart therefore neither loses nor
double-fires a scheduled message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from broker.clock import SYSTEM_CLOCK
from broker.logs import get_logger
from broker.schedule import (
    SCHEDULE_TOPIC,
    TIMER_PROPERTIES,
    TIMER_QUEUE,
    TIMER_SRC,
    Due,
    Schedule,
    parse_src,
)
from broker.storage import PendingDurable, Storage
from broker.store.api import GetStatus, MessageToStore, PutResult
from broker.store.files import StateFile, read_optional
from broker.topics import TopicManager
from protocol.codes import ResponseCode
from protocol.errors import BrokerError
from protocol.message import decode_record, decode_records
from protocol.properties import CRC32, REAL_QID, REAL_TOPIC, TIMER_OUT_MS, UNIQ_KEY

_log = get_logger("timers")
RETRY_DELAY_MS = 1_000
SCHEDULE_QUEUES = TIMER_QUEUE + 1
#: Where recall markers go (a system topic: no producer writes it, no consumer reads it).
RECALL_TOPIC = "rmq_sys_TIMER_RECALL"
#: A recall marker's property: ``"<queue>:<queue offset>"`` of the cancelled record.
TIMER_RECALL = "TIMER_RECALL"


def _not_found(what: str) -> BrokerError:
    return BrokerError(what, code=ResponseCode.QUERY_NOT_FOUND)


@dataclass(frozen=True, slots=True)
class TimerStatistics:
    """A snapshot of a :class:`TimerService`'s counters (:meth:`TimerService.statistics`)."""

    #: Scheduled records copied to their real topic since the start.
    delivered: int
    #: Deliveries whose copy could not be stored or made durable (each retried later).
    retried: int
    #: Records waiting for their time now.
    pending: int
    #: Copies written and waiting for their fsync now.
    in_flight: int
    #: Scheduled records cancelled before their delivery (RecallMessage) since the start.
    recalled: int = 0


class TimerService:
    """Scheduled delivery over a store (see the module docstring)."""

    def __init__(
        self,
        storage: Storage,
        topics: TopicManager,
        path: Path,
        *,
        clock_ms: Callable[[], int] = SYSTEM_CLOCK.now_ms,
        poke: Callable[[], None] = lambda: None,
    ) -> None:
        self.storage = storage
        self.store = storage.store
        self.topics = topics
        self.path = path
        #: Its checkpoint writes, skipped when the file holds the bytes already.
        self._file = StateFile(path)
        self.clock_ms = clock_ms
        self.schedule = Schedule()
        #: Tells the deadline loop about a new deadline.
        self.poke = poke
        #: Copies written, their durability awaited: (queue, offset) of the scheduled record.
        self._in_flight: PendingDurable[tuple[int, int]] = PendingDurable(storage)
        self._delivered = 0
        self._retried = 0
        self._recalled = 0

    # ------------------------------------------------------------------ start-up
    def load(self) -> None:
        """Restore progress, recognise copies written since the checkpoint, and schedule
        every pending record (cost: the pending records, not the log)."""
        data = read_optional(self.path)
        if data is not None:
            try:
                self.schedule.load(data)
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{self.path}: unreadable schedule progress: {exc}") from None
        start = self.store.statistics().recovery_scanned_from
        if start >= 0:  # a crash: the log after the checkpoint was re-dispatched
            self._mark_copies_since(start)
        for queue_id in range(SCHEDULE_QUEUES):
            self._schedule_queue(queue_id)

    def adopt_log(self) -> None:
        """A promoted replica takes over the delayed messages its old master streamed
        (timer progress is not replicated): start afresh, mark every copy the log shows
        delivered (their ``TIMER_SRC`` markers), schedule the rest. Scans the whole log on
        the calling thread — promotion is rare and manual."""
        self.schedule = Schedule()
        self._mark_copies_since(self.store.log.min_offset)
        for queue_id in range(SCHEDULE_QUEUES):
            self._schedule_queue(queue_id)
        self.poke()

    def _mark_copies_since(self, start: int) -> None:
        for msg in self.store.messages_since(start):
            props = msg.properties
            src = parse_src(props.get(TIMER_SRC, "") or props.get(TIMER_RECALL, ""))
            if src is not None:  # a delivered copy, or a recall
                self.schedule.mark_delivered(*src)

    def _schedule_queue(self, queue_id: int) -> None:
        offset = self.schedule.watermark(queue_id)
        for _ in range(1_000_000):  # bounded: the queue's pending records, 32 at a time
            got = self.store.get(SCHEDULE_TOPIC, queue_id, offset, 32)
            if got.status is not GetStatus.FOUND:
                return
            for queue_offset, msg in zip(got.offsets, decode_records(got.body), strict=True):
                deliver_ms = int(msg.properties.get(TIMER_OUT_MS, "0") or 0)
                self.schedule.add(Due(deliver_ms, queue_id, queue_offset))
            offset = got.next_offset

    # ------------------------------------------------------------------ scheduling
    def scheduled(self, result: PutResult, queue_id: int, deliver_ms: int) -> None:
        """A message was stored in SCHEDULE_TOPIC_XXXX: deliver it at ``deliver_ms``."""
        self.schedule.add(Due(deliver_ms, queue_id, result.queue_offset))
        self.poke()

    def next_deadline_ms(self) -> int | None:
        """The earliest delivery time (a :class:`~broker.deadlines.DeadlineSource`)."""
        return self.schedule.next_deadline()

    def fire_due(self, now_ms: int, nursery: trio.Nursery) -> None:
        """Deliver every due record, in a task (each delivery may wait for an fsync)."""
        dues = self.schedule.pop_due(now_ms)
        if dues:
            nursery.start_soon(self._deliver_all, dues)

    async def _deliver_all(self, dues: list[Due]) -> None:
        for due in dues:
            # Shielded: a copy written but not marked delivered would fire again after
            # a clean restart. A delivery waits at most for one fsync.
            with trio.CancelScope(shield=True):
                await self._deliver(due)

    async def _deliver(self, due: Due) -> None:
        if self.schedule.delivered(due.queue_id, due.queue_offset):
            return  # recalled
        got = self.store.get(SCHEDULE_TOPIC, due.queue_id, due.queue_offset, 1)
        if got.status is not GetStatus.FOUND or got.offsets[0] != due.queue_offset:
            self.schedule.mark_delivered(due.queue_id, due.queue_offset)  # gone: retention
            return
        msg, _ = decode_record(got.body)
        props = {
            k: v for k, v in msg.properties.items() if k not in TIMER_PROPERTIES and k != CRC32
        }
        props[TIMER_SRC] = f"{due.queue_id}:{due.queue_offset}"
        # The delivery time stays on the copy (RocketMQ's TIMER_OUT_MS): the gRPC front end
        # delivers it as the message's delivery timestamp, with message type DELAY.
        if TIMER_OUT_MS in msg.properties:
            props[TIMER_OUT_MS] = msg.properties[TIMER_OUT_MS]
        topic = msg.properties.get(REAL_TOPIC, "")
        queue_id = int(msg.properties.get(REAL_QID, "0") or 0)
        self.topics.ensure(topic, queue_id + 1)
        copy = MessageToStore(
            topic, queue_id, msg.body, props, msg.flag, msg.sys_flag, msg.born_timestamp,
            msg.born_host, msg.reconsume_times, msg.prepared_transaction_offset,
        )  # fmt: skip
        key = (due.queue_id, due.queue_offset)
        result = self.store.put_nowait(copy)
        ok = result.ok
        if ok:
            # Until marked, a checkpoint must still count this copy once it is durable:
            # see before_checkpoint.
            ok = await self._in_flight.wait(key, result.end_offset)
        if ok:
            self.schedule.mark_delivered(*key)
            self._delivered += 1
        else:
            self._retried += 1
            _log.warning("scheduled delivery failed; retrying", topic=topic, remark=result.remark)
            self.schedule.retry(due, self.clock_ms() + RETRY_DELAY_MS)
            self.poke()

    # ------------------------------------------------------------------ recall
    async def recall(self, topic: str, queue_id: int, queue_offset: int, uniq_key: str) -> None:
        """Cancel the scheduled record at (``queue_id``, ``queue_offset``) if it is ``topic``'s
        message ``uniq_key`` and not delivered yet. A marker record in the log
        (:data:`RECALL_TOPIC`, property :data:`TIMER_RECALL`) makes it survive a crash, as a
        delivered copy's ``TIMER_SRC`` does; the checkpoint's progress covers the rest.

        Raises:
            BrokerError: ``QUERY_NOT_FOUND`` (no such waiting message) or
                ``SERVICE_NOT_AVAILABLE`` (the marker could not be written).
        """
        key = (queue_id, queue_offset)
        if self.schedule.delivered(*key) or key in self._in_flight:
            raise _not_found(f"message {uniq_key} was delivered or recalled already")
        got = self.store.get(SCHEDULE_TOPIC, queue_id, queue_offset, 1)
        if got.status is not GetStatus.FOUND or got.offsets[0] != queue_offset:
            raise _not_found(f"no delayed message {uniq_key} waits there")
        msg, _ = decode_record(got.body)
        if msg.properties.get(REAL_TOPIC) != topic or msg.properties.get(UNIQ_KEY) != uniq_key:
            raise _not_found(f"no delayed message {uniq_key} of topic {topic} waits there")
        self.topics.ensure(RECALL_TOPIC, 1)
        marker = MessageToStore(
            RECALL_TOPIC, 0, b"", {TIMER_RECALL: f"{queue_id}:{queue_offset}", UNIQ_KEY: uniq_key},
            0, 0, self.clock_ms(), ("127.0.0.1", 0), 0,
        )  # fmt: skip
        result = await self.storage.put(marker)
        if not result.ok:
            raise BrokerError(
                f"recall not recorded: {result.remark or result.status.value}",
                code=ResponseCode.SERVICE_NOT_AVAILABLE,
            )
        if self.schedule.delivered(*key) or key in self._in_flight:  # delivered meanwhile
            raise _not_found(f"message {uniq_key} was delivered meanwhile")
        self.schedule.mark_delivered(*key)
        self._recalled += 1

    def statistics(self) -> TimerStatistics:
        """A snapshot of the counters."""
        return TimerStatistics(
            delivered=self._delivered,
            retried=self._retried,
            pending=self.schedule.pending,
            in_flight=len(self._in_flight),
            recalled=self._recalled,
        )

    # ------------------------------------------------------------------ persistence
    def before_checkpoint(self) -> Callable[[], None]:
        """Main thread: snapshot progress; the returned writer runs in the checkpoint's
        worker thread before the checkpoint file is written."""
        # A copy that became durable while its delivery was still waiting on the fsync may be
        # below the checkpoint's safe offset: recovery would not rescan it, so count it here.
        data = self.schedule.snapshot(self._in_flight.durable_keys())
        return self._file.writer(data)
