"""Transactional messages (RocketMQ's ``TransactionalMessageService``), whatever the front end.

A producer sends a *half* message (``TRAN_MSG=true``): it is stored durably in queue 0 of
``RMQ_SYS_TRANS_HALF_TOPIC`` with ``REAL_TOPIC``/``REAL_QID``, where no consumer reads it. The
producer then ends the transaction (END_TRANSACTION / gRPC ``EndTransaction``):

- **commit** copies the half to its real topic and queue (a new offset; body, flag, keys,
  tags and the compression bit kept; delayed if it asks to be) with the sys flag
  TRANSACTION_COMMIT and the half's commit-log offset in the record's
  ``preparedTransactionOffset`` field;
- **rollback** writes a marker record in ``RMQ_SYS_TRANS_OP_HALF_TOPIC``;
- **unknown** changes nothing: the half is checked back later.

An undecided half is *checked back*: from its store time + the check immunity (the
message's ``CHECK_IMMUNITY_TIME_IN_SECONDS``, else ``transaction_immunity_s``), then once per
``transaction_check_interval_s``, the broker asks one live producer of its group
(``PGROUP``) through its :class:`~broker.core.clients.ClientChannel` — exact deadlines on the
broker's deadline loop, no scanning (RocketMQ rescans the half topic every interval and
re-appends every half it checks). A check counts only when a producer was there to ask: a
group that is offline for a while loses nothing (RocketMQ counts checks sent to nobody).
Past ``transaction_check_max`` checks the half is copied to ``TRANS_CHECK_MAX_TIME_TOPIC``
(readable by admins, as in RocketMQ) and counts as decided.

Each decision applies once: a half being decided is neither checked nor decided again, and
a later END_TRANSACTION for a decided half is answered without effect. Decisions survive
restarts: ``config/transactions.json`` (written just before every store checkpoint) holds
them with the check counts, and after a crash the decision records written since the
checkpoint — commit copies, rollback markers, discard copies — are found in the recovered
log, as timer deliveries are.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import trio

from broker.clock import Clock
from broker.core.clients import ClientRegistry, TransactionCheck
from broker.core.send import store_or_schedule
from broker.halves import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC, TRAN_OP, Half, HalfTable
from broker.logs import get_logger
from broker.storage import PendingDurable, Storage
from broker.store.api import GetStatus, MessageToStore, PutResult
from broker.store.files import StateFile, read_optional
from broker.timers import TimerService
from broker.topics import TopicManager
from protocol.codes import ResponseCode
from protocol.errors import BrokerError, RecordError
from protocol.message import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_MASK,
    MessageExt,
    decode_record,
    decode_records,
    encode_record,
)
from protocol.properties import (
    CHECK_IMMUNITY_TIME_IN_SECONDS,
    CRC32,
    PGROUP,
    REAL_QID,
    REAL_TOPIC,
    TRAN_MSG,
    UNIQ_KEY,
)

_log = get_logger("transactions")
#: Halves read per step when the table is rebuilt at start-up.
_LOAD_BATCH = 32


class Resolution(enum.Enum):
    """How a producer ends a transaction (the values are Remoting's ``commitOrRollback``)."""

    UNKNOWN = 0x0
    COMMIT = 0x8
    ROLLBACK = 0xC


@dataclass(frozen=True, slots=True)
class TransactionPolicy:
    """The broker settings transactions obey."""

    check_interval_ms: int
    immunity_ms: int
    check_max: int


@dataclass(frozen=True, slots=True)
class EndRequest:
    """A producer's decision about one half message."""

    #: The producer group; must be the half's ``PGROUP`` when the half names one.
    group: str
    #: The half's commit-log offset (how the half is found).
    commit_offset: int
    #: The half's queue offset in the half topic (``tranStateTableOffset``); must match.
    queue_offset: int
    resolution: Resolution
    #: The answer to a check-back (for the log only).
    from_check: bool = False
    #: The message id the producer names, for remarks.
    msg_id: str = ""


class EndOutcome(NamedTuple):
    """What an END_TRANSACTION did."""

    #: False: nothing happened (UNKNOWN, or the half was decided before).
    applied: bool
    remark: str = ""


@dataclass(frozen=True, slots=True)
class TransactionStatistics:
    """Counters since the start, and the halves waiting now."""

    pending: int
    prepared: int = 0
    committed: int = 0
    rolled_back: int = 0
    checks: int = 0
    discarded: int = 0


@dataclass(slots=True)
class _Counters:
    prepared: int = 0
    committed: int = 0
    rolled_back: int = 0
    checks: int = 0
    discarded: int = 0


class TransactionService:
    """Half messages, decisions and check-backs (see the module docstring)."""

    def __init__(
        self,
        policy: TransactionPolicy,
        storage: Storage,
        topics: TopicManager,
        timers: TimerService,
        clients: ClientRegistry,
        clock: Clock,
        path: Path,
        *,
        poke: Callable[[], None] = lambda: None,
    ) -> None:
        self.policy = policy
        self.storage = storage
        self.store = storage.store
        self.topics = topics
        self.timers = timers
        self.clients = clients
        self.clock = clock
        self.path = path
        #: Its checkpoint writes, skipped when the file holds the bytes already.
        self._file = StateFile(path)
        #: Tells the deadline loop about a new deadline.
        self.poke = poke
        self.table = HalfTable()
        #: Decision records written, their durability awaited, by half queue offset.
        self._in_flight: PendingDurable[int] = PendingDurable(storage)
        self._counters = _Counters()

    # ------------------------------------------------------------------ start-up
    def load(self) -> None:
        """Restore decisions and check counts, recognise decisions written since the last
        checkpoint (after a crash), and schedule a check for every undecided half (cost: the
        halves above the decided watermark, not the log).

        Raises:
            ValueError: ``config/transactions.json`` is unreadable.
        """
        data = read_optional(self.path)
        if data is not None:
            try:
                self.table.load(data)
            except ValueError as exc:
                raise ValueError(f"{self.path}: {exc}") from None
        self.topics.ensure_queues(HALF_TOPIC, 1)
        self._track_halves()
        start = self.store.statistics().recovery_scanned_from
        if start >= 0:  # a crash: decisions since the checkpoint are only in the log
            self._decisions_since(start)

    def _track_halves(self) -> None:
        offset = self.table.watermark
        for _ in range(100_000_000 // _LOAD_BATCH):  # bounded by the half queue's length
            got = self.store.get(HALF_TOPIC, 0, offset, _LOAD_BATCH)
            if got.status is GetStatus.OFFSET_TOO_SMALL:
                offset = got.next_offset  # retention removed the oldest halves
                continue
            if got.status is not GetStatus.FOUND:
                return
            for queue_offset, msg in zip(got.offsets, decode_records(got.body), strict=True):
                self._track(msg, queue_offset, msg.store_timestamp)
            offset = got.next_offset

    def _decisions_since(self, start: int) -> None:
        for msg in self.store.messages_since(start):
            if msg.topic in (OP_TOPIC, DISCARD_TOPIC):
                marker = msg.properties.get(TRAN_OP, "")
                if marker.isdigit() and marker.isascii():
                    self.table.decide(int(marker))
            elif msg.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_COMMIT:
                half = self.table.by_commit_offset(msg.prepared_transaction_offset)
                if half is not None:
                    self.table.decide(half.queue_offset)

    def _track(self, half: MessageExt, queue_offset: int, stored_ms: int) -> None:
        immunity_ms = self.policy.immunity_ms
        raw = half.properties.get(CHECK_IMMUNITY_TIME_IN_SECONDS, "")
        if (
            raw.isdigit() and raw.isascii()
        ):  # the message's own immunity, as RocketMQ's getImmunityTime
            immunity_ms = int(raw) * 1000
        entry = Half(queue_offset, half.commit_log_offset, half.properties.get(PGROUP, ""))
        if self.table.add(entry, stored_ms + immunity_ms):
            self.poke()

    # ------------------------------------------------------------------ half messages
    async def prepare(self, msg: MessageToStore) -> PutResult:
        """Store ``msg`` (already checked and given its real topic and queue) as a half
        message; in SYNC mode return once it is durable."""
        properties = {**msg.properties, REAL_TOPIC: msg.topic, REAL_QID: str(msg.queue_id)}
        half = MessageToStore(
            HALF_TOPIC, 0, msg.body, properties, msg.flag,
            msg.sys_flag & ~SYSFLAG_TRANSACTION_MASK,  # stored as a plain record, as RocketMQ
            msg.born_timestamp, msg.born_host, msg.reconsume_times,
        )  # fmt: skip
        self.topics.ensure_queues(HALF_TOPIC, 1)
        result = await self.storage.put(half)
        if result.ok:
            self._counters.prepared += 1
            stored = MessageExt(
                HALF_TOPIC, properties=properties, commit_log_offset=result.commit_log_offset
            )
            self._track(stored, result.queue_offset, self.clock.now_ms())
        return result

    # ------------------------------------------------------------------ decisions
    async def end(self, req: EndRequest) -> EndOutcome:
        """Apply a producer's decision once (see the module docstring).

        Raises:
            BrokerError: ``SYSTEM_ERROR`` when no half message is at the offset (RocketMQ's
                "Find prepared transaction message failed"), ``TRANSACTION_FAILED`` when the
                group or queue offset do not match it, ``SERVICE_NOT_AVAILABLE`` when the
                decision could not be stored (the half stays undecided).
        """
        if req.resolution is Resolution.UNKNOWN:
            return EndOutcome(False, "unknown: the half message will be checked back")
        half = self.table.by_commit_offset(req.commit_offset)
        if half is None:
            return self._not_pending(req)
        self._check_matches(req, half)
        if self.table.begin(half.queue_offset) is None:
            return EndOutcome(False, f"the transaction of {req.msg_id} is being decided")
        try:
            stored = self._read_half(half)
            if req.resolution is Resolution.COMMIT:
                await self._commit(half, stored)
            else:
                await self._mark(OP_TOPIC, half, stored)
                self._counters.rolled_back += 1
        except BaseException:
            self.table.abort(half.queue_offset)
            raise
        self.table.decide(half.queue_offset)
        if req.from_check:
            _log.info("transaction decided by check-back", msg_id=req.msg_id,
                      resolution=req.resolution.name)  # fmt: skip
        return EndOutcome(True)

    def _not_pending(self, req: EndRequest) -> EndOutcome:
        data = self.store.message_at(req.commit_offset)
        try:
            msg = decode_record(data)[0] if data is not None else None
        except RecordError:
            msg = None
        if msg is None or msg.topic != HALF_TOPIC:
            raise BrokerError(
                f"Find prepared transaction message failed: no half message at commit-log "
                f"offset {req.commit_offset} ({req.msg_id})",
                code=ResponseCode.SYSTEM_ERROR,
            )
        _log.warning("end of a decided transaction ignored", msg_id=req.msg_id,
                     resolution=req.resolution.name)  # fmt: skip
        return EndOutcome(False, f"the transaction of {req.msg_id} was decided already")

    @staticmethod
    def _check_matches(req: EndRequest, half: Half) -> None:
        """RocketMQ's ``checkPrepareMessage``: the producer group and the queue offset."""
        if half.group and req.group != half.group:
            raise BrokerError(
                f"The producer group wrong: {req.group!r} ends a half message of {half.group!r}",
                code=ResponseCode.TRANSACTION_FAILED,
            )
        if req.queue_offset != half.queue_offset:
            raise BrokerError(
                f"The transaction state table offset wrong: {req.queue_offset}, the half "
                f"message at {req.commit_offset} has {half.queue_offset}",
                code=ResponseCode.TRANSACTION_FAILED,
            )

    def _read_half(self, half: Half) -> MessageExt:
        data = self.store.message_at(half.commit_offset)
        if data is None:
            raise BrokerError(
                f"half message at {half.commit_offset} is gone (retention)",
                code=ResponseCode.SYSTEM_ERROR,
            )
        try:
            return decode_record(data)[0]
        except RecordError as exc:
            raise BrokerError(str(exc), code=ResponseCode.SYSTEM_ERROR) from None

    async def _commit(self, half: Half, stored: MessageExt) -> None:
        properties = {
            k: v for k, v in stored.properties.items()
            if k not in (REAL_TOPIC, REAL_QID, TRAN_MSG, CRC32)
        }  # fmt: skip
        topic = stored.properties.get(REAL_TOPIC, "")
        queue_id = int(stored.properties.get(REAL_QID, "0") or 0)
        self.topics.ensure(topic, queue_id + 1)
        real = MessageToStore(
            topic, queue_id, stored.body, properties, stored.flag,
            (stored.sys_flag & ~SYSFLAG_TRANSACTION_MASK) | SYSFLAG_TRANSACTION_COMMIT,
            stored.born_timestamp, stored.born_host, stored.reconsume_times,
            half.commit_offset,
        )  # fmt: skip
        result = (await store_or_schedule(self.storage, self.timers, self.clock, real)).result
        if not result.ok:
            raise BrokerError(
                f"commit not stored: {result.remark or result.status.value}",
                code=ResponseCode.SERVICE_NOT_AVAILABLE,
            )
        self._counters.committed += 1

    async def _mark(self, topic: str, half: Half, stored: MessageExt) -> None:
        """Write a decision record naming the half (rollback: an empty marker; discard: a
        copy of the half that admins can read) and wait until it is durable."""
        properties = {TRAN_OP: str(half.queue_offset)}
        body = b""
        if topic == DISCARD_TOPIC:
            properties = {**stored.properties, **properties}
            properties.pop(CRC32, None)
            body = stored.body
        self.topics.ensure_queues(topic, 1)
        record = MessageToStore(
            topic, 0, body, properties, stored.flag, stored.sys_flag & ~SYSFLAG_TRANSACTION_MASK,
            stored.born_timestamp, stored.born_host, 0,
        )  # fmt: skip
        result = self.store.put_nowait(record)
        if result.ok and await self._in_flight.wait(half.queue_offset, result.end_offset):
            return
        raise BrokerError(
            f"transaction decision not stored: {result.remark or result.status.value}",
            code=ResponseCode.SERVICE_NOT_AVAILABLE,
        )

    # ------------------------------------------------------------------ check-backs
    def next_deadline_ms(self) -> int | None:
        """When the next check-back is due (a :class:`~broker.deadlines.DeadlineSource`)."""
        return self.table.next_deadline()

    def fire_due(self, now_ms: int, nursery: trio.Nursery) -> None:
        """Ask a producer about every half whose check is due; discard the ones past the
        check limit (in a task: the copy waits for its fsync)."""
        interval = self.policy.check_interval_ms
        for half in self.table.pop_due(now_ms):
            if self.table.is_deciding(half.queue_offset):
                self.table.reschedule(half, now_ms + interval)
            elif half.checks >= self.policy.check_max:
                nursery.start_soon(self._discard, half)
            else:
                self._check(half, now_ms)
                self.table.reschedule(half, now_ms + interval)

    def _check(self, half: Half, now_ms: int) -> None:
        channel = self.clients.producer_channel(half.group) if half.group else None
        if channel is None:
            return  # nobody to ask now: not counted (see the module docstring)
        data = self.store.message_at(half.commit_offset)
        try:
            stored = decode_record(data)[0] if data is not None else None
        except RecordError:
            stored = None
        if stored is None:
            _log.warning("half message unreadable; dropped", commit_offset=half.commit_offset)
            self.table.decide(half.queue_offset)
            return
        if channel.check_transaction_state(_check_of(half, stored)):
            half.checks += 1
            self._counters.checks += 1

    async def _discard(self, half: Half) -> None:
        # Shielded: a discard copy written but not marked decided would be written again.
        with trio.CancelScope(shield=True):
            if self.table.begin(half.queue_offset) is None:
                return
            try:
                await self._mark(DISCARD_TOPIC, half, self._read_half(half))
            except BrokerError as exc:
                self.table.abort(half.queue_offset)
                self.table.reschedule(half, self.clock.now_ms() + self.policy.check_interval_ms)
                self.poke()
                _log.warning("discarding a half message failed; retrying", error=str(exc))
                return
            self.table.decide(half.queue_offset)
            self._counters.discarded += 1
            _log.warning("half message discarded after the check limit",
                         commit_offset=half.commit_offset, checks=half.checks)  # fmt: skip

    # ------------------------------------------------------------------ persistence, stats
    def before_checkpoint(self) -> Callable[[], None]:
        """Main thread: snapshot decisions; the returned writer runs in the checkpoint's
        worker thread before the checkpoint file is written."""
        # A decision record durable below the checkpoint's offset would not be rescanned
        # after a crash: count it as decided here.
        data = self.table.snapshot(self._in_flight.durable_keys())
        return self._file.writer(data)

    def statistics(self) -> TransactionStatistics:
        """A snapshot of the counters."""
        c = self._counters
        return TransactionStatistics(
            self.table.pending, c.prepared, c.committed, c.rolled_back, c.checks, c.discarded
        )


def _check_of(half: Half, stored: MessageExt) -> TransactionCheck:
    """What a producer is asked: the half as it sent it (real topic and queue)."""
    topic = stored.properties.get(REAL_TOPIC, stored.topic)
    queue_id = int(stored.properties.get(REAL_QID, "0") or 0)
    real = dataclasses.replace(stored, topic=topic, queue_id=queue_id)
    msg_id = stored.properties.get(UNIQ_KEY) or stored.offset_msg_id
    return TransactionCheck(
        group=half.group,
        topic=topic,
        queue_offset=half.queue_offset,
        commit_offset=half.commit_offset,
        msg_id=msg_id,
        transaction_id=msg_id,
        offset_msg_id=stored.offset_msg_id,
        record=encode_record(real),
    )
