"""RocketMQ 5 pop, ack and change of invisible time, transport-neutral.

Validation follows ``PopMessageProcessor`` (more than 32 messages, a missing topic or queue, a
bad group name are refused with its codes); on top, an invisible time ≤ 0 is
``INVALID_PARAMETER`` (RocketMQ would revive such a message at once, as a poison loop).

A pop that finds nothing parks in the :class:`~broker.pop.hub.PopHub` for its hold time
(capped by the broker, counted from the broker's own receive time rather than the client's
``bornTime``: weak spot 7) and at its deadline is answered "nothing" directly, without
re-reading (weak spot 5). A woken pop reads again; if another consumer was faster it parks
again for the rest of its time (the wake-up is counted as wasted).

A receipt names one lease: ``(group, real topic, queue, offset)`` and the pop time from the
receipt. The real topic is the request's topic, or the group's retry topic when the receipt's
retry flag says so and the client sent the original topic. An ack or change of a receipt that
is not in flight (never popped by this group, already acked, revived, or superseded by a change
of invisible time) is ``NO_MESSAGE`` with a remark saying which, and changes nothing. RocketMQ
answers ``SUCCESS`` even when it failed to record an ack (weak spot 18); here a journal failure
is a ``SYSTEM_ERROR`` and the message stays in flight.

Pops belong to the master: on a replica every pop, ack and change is refused with
``SERVICE_NOT_AVAILABLE`` (:data:`POP_ON_REPLICA`) before it touches any state.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import trio

from broker.clock import Clock
from broker.core.filters import check_readable, message_filter
from broker.metrics import EventKind
from broker.pop.inflight import Lease, LeaseKey, Outcome
from broker.pop.reader import REVIVE_QID, PopRequest, PopResult
from broker.pop.service import PopEngine
from broker.topics import TopicManager
from protocol.codes import ResponseCode
from protocol.errors import BrokerError, ReceiptError, TrimqError
from protocol.message import peek_record
from protocol.naming import is_retry_topic, pop_retry_topic, validate_group
from protocol.receipt import (
    MAX_POP_MESSAGES,
    POP_ORDER_REVIVE_QUEUE,
    ExtraInfo,
    RetryFlag,
    plain_receipt,
)

#: A woken pop that found nothing parks again at most this many times (bounded loop).
MAX_REPARKS = 10_000
#: One single ack as :meth:`PopService.ack_texts` takes it: group, topic, queue id, queue
#: offset, receipt text.
AckText = tuple[str, str, int, int, str]
#: Group names an ack remembers as valid, at most (see ``PopService._validate_group``).
_MAX_VALID_GROUPS = 4096
#: Why a replica refuses pops, acks and changes (docs/design.md §13).
POP_ON_REPLICA = "the broker is a replica: pop from the master (broker id 0)"

_REMARKS = {
    Outcome.UNKNOWN: "no message in flight for this receipt (never popped by this group, "
    "already acked, or revived)",
    Outcome.EXPIRED: "receipt expired: the message's invisible time is over and it is being "
    "redelivered",
    Outcome.STALE: "stale receipt: the message's invisible time was changed since; use the "
    "newer receipt",
}


@dataclass(frozen=True, slots=True)
class Popped:
    """One popped message, as any front end needs it."""

    lease: Lease
    #: The record to deliver (stored bytes, or a retried message re-encoded).
    record: bytes
    #: Its receipt (gRPC's receipt handle is ``receipt.encode()``).
    receipt: ExtraInfo


@dataclass(frozen=True, slots=True)
class PopBatch:
    """What one pop found: the reader's result, and per-message views of it."""

    request: PopRequest
    result: PopResult
    broker_name: str

    @property
    def found(self) -> bool:
        """Whether the pop returns messages."""
        return self.result.found

    def messages(self) -> list[Popped]:
        """One record and receipt per message, in delivery order.

        The reader hands normal messages of one queue read as one chunk of records (sent as
        stored); this splits the chunks at record boundaries and pairs each record with its
        lease and the receipt a Remoting client would rebuild from the response header.
        """
        records = [r for chunk in self.result.records for r in _split(chunk)]
        starts = {(s.retry_flag, s.queue_id): s.start_offset for s in self.result.start_offsets}
        revive_qid = POP_ORDER_REVIVE_QUEUE if self.request.order else REVIVE_QID
        broker_name = self.broker_name
        flags: dict[str, RetryFlag] = {}  # by lease topic: one or two topics per pop
        out = []
        for lease, record in zip(self.result.leases, records, strict=True):
            topic, queue_id, offset = lease.topic, lease.queue_id, lease.offset
            flag = flags.get(topic)
            if flag is None:
                flag = flags[topic] = RetryFlag.of_topic(topic)
            receipt = ExtraInfo(
                starts.get((flag, queue_id), offset),
                lease.pop_time,
                lease.invisible_ms,
                revive_qid,
                flag,
                broker_name,
                queue_id,
                offset,
            )
            out.append(Popped(lease, record, receipt))
        return out


def _split(chunk: bytes) -> list[bytes]:
    out, pos = [], 0
    for _ in range(len(chunk)):  # bounded: every record is at least one byte
        if pos >= len(chunk):
            break
        size = peek_record(chunk, pos).total_size
        out.append(chunk[pos : pos + size])
        pos += size
    return out


def parse_receipt(text: str) -> ExtraInfo:
    """Decode a receipt; a malformed one is ``INVALID_PARAMETER``."""
    try:
        return ExtraInfo.decode(text)
    except ReceiptError as exc:
        raise BrokerError(str(exc), code=ResponseCode.INVALID_PARAMETER) from None


def lease_key(group: str, topic: str, queue_id: int, offset: int, receipt: ExtraInfo) -> LeaseKey:
    """The in-flight table key a receipt names."""
    return _key(group, topic, queue_id, offset, receipt.retry_flag)


def _key(group: str, topic: str, queue_id: int, offset: int, flag: RetryFlag) -> LeaseKey:
    """:func:`lease_key` of a receipt with retry flag ``flag``."""
    return (group, lease_topic(group, topic, flag), queue_id, offset)


def lease_topic(group: str, topic: str, flag: RetryFlag) -> str:
    """The topic of the lease keys a receipt with retry flag ``flag`` names: ``topic``, or
    ``group``'s pop retry topic of it when the flag says so and the client sent the
    original topic."""
    if flag is not RetryFlag.NORMAL and not is_retry_topic(topic):
        return pop_retry_topic(group, topic, v2=flag is RetryFlag.RETRY_V2)
    return topic


def _refuse(outcome: Outcome, key: LeaseKey) -> BrokerError:
    group, topic, queue_id, offset = key
    return BrokerError(
        f"{_REMARKS[outcome]}: group {group}, topic {topic}, queue {queue_id}, offset {offset}",
        code=ResponseCode.NO_MESSAGE,
    )


def _not_journaled(what: str) -> BrokerError:
    return BrokerError(
        f"{what} not recorded (pop journal write failed); retry", code=ResponseCode.SYSTEM_ERROR
    )


def _check_invisible(invisible_ms: int, *, least: int = 1) -> None:
    if invisible_ms < least:
        raise BrokerError(
            f"invisibleTime must be >= {least} ms, not {invisible_ms}",
            code=ResponseCode.INVALID_PARAMETER,
        )


class PopService:
    """Pop, ack and change over the :class:`PopEngine` (see the module docstring)."""

    def __init__(
        self,
        engine: PopEngine,
        topics: TopicManager,
        clock: Clock,
        stopping: trio.Event,
        *,
        max_hold_ms: int,
        property_filter: bool = True,
        is_replica: Callable[[], bool] = lambda: False,
    ) -> None:
        self.engine = engine
        #: Whether the broker follows a master now (asked per request: a promotion ends it).
        self.is_replica = is_replica
        self.topics = topics
        self.clock = clock
        self.stopping = stopping
        #: The longest a pop parks, whatever its poll time asks.
        self.max_hold_ms = max_hold_ms
        #: Whether SQL92 subscriptions are served (``enable_property_filter``).
        self.property_filter = property_filter
        #: Group names :func:`validate_group` accepted (bounded: cleared when full).
        self._valid_groups: set[str] = set()

    def _refuse_on_replica(self) -> None:
        """Pops belong to the master: a lease taken on a replica would live in a state no
        one replicates, be revived by no one and be acked nowhere else.

        Raises:
            BrokerError: ``SERVICE_NOT_AVAILABLE`` on a replica.
        """
        if self.is_replica():
            raise BrokerError(POP_ON_REPLICA, code=ResponseCode.SERVICE_NOT_AVAILABLE)

    # ------------------------------------------------------------------ pop
    def request(
        self,
        group: str,
        topic: str,
        queue_id: int,
        max_nums: int,
        invisible_ms: int,
        *,
        expression: str | None = None,
        expression_type: str | None = None,
        order: bool = False,
        attempt_id: str | None = None,
        init_mode: int = 0,
    ) -> PopRequest:
        """Validate a pop (RocketMQ's checks and codes) and build the request.

        Raises:
            BrokerError: ``INVALID_PARAMETER``, ``TOPIC_NOT_EXIST``, ``NO_PERMISSION`` or
                ``SUBSCRIPTION_PARSE_FAILED``; ``SERVICE_NOT_AVAILABLE`` on a replica.
            IllegalNameError: the group name is illegal.
        """
        self._refuse_on_replica()
        validate_group(group)
        if not 0 < max_nums <= MAX_POP_MESSAGES:
            raise BrokerError(
                f"the broker pops 1 to {MAX_POP_MESSAGES} messages at a time, not {max_nums}",
                code=ResponseCode.INVALID_PARAMETER,
            )
        _check_invisible(invisible_ms)
        check_readable(self.topics, topic, queue_id, group, verb="peeking", any_queue=True)
        wanted = message_filter(expression, expression_type, property_filter=self.property_filter)
        return PopRequest(
            group=group,
            topic=topic,
            queue_id=max(queue_id, -1),
            max_nums=max_nums,
            invisible_ms=invisible_ms,
            tags=wanted.tags,
            record_filter=wanted.record_filter,
            property_match=wanted.property_match,
            order=order,
            attempt_id=attempt_id,
            init_mode=init_mode,
        )

    async def pop(self, req: PopRequest, *, poll_ms: int) -> PopBatch:
        """Pop up to ``req.max_nums`` messages, parking up to ``poll_ms`` (capped by
        ``max_hold_ms``; none once the broker is stopping) until a matching message or a
        retry of this group arrives."""
        engine = self.engine
        hold_s = self._hold_s(poll_ms)
        result = engine.pop_nowait(req, self.clock.now_ms())
        if result.found or hold_s <= 0 or self.stopping.is_set():
            return self._batch(req, result)
        # The read above and the park below happen in one synchronous step, so no arriving
        # message can slip between them. Keep every await out of that span.
        parked_at = trio.current_time()
        deadline = parked_at + hold_s
        for _ in range(MAX_REPARKS):
            wakeup = await engine.hub.wait(
                req.topic, req.group, req.queue_id, req.tags, deadline, req.property_match
            )
            if wakeup is None or self.stopping.is_set():
                break
            result = engine.pop_nowait(req, self.clock.now_ms())
            engine.hub.record_result(wakeup, result.found)
            waited = (wakeup.time - parked_at) * 1000
            engine.event(EventKind.WAKEUP, req, latency_ms=waited, found=result.found)
            if result.found:
                break
        waited = (trio.current_time() - parked_at) * 1000
        engine.event(EventKind.POP_WAIT, req, latency_ms=waited, found=result.found)
        return self._batch(req, result)

    def pop_now(self, req: PopRequest, *, poll_ms: int) -> PopBatch | None:
        """:meth:`pop` when it need not park (it found messages, or may not wait), else None
        with nothing changed that :meth:`pop` would not change the same way (a read that
        found nothing is taken back: the queue rotation is put back; cursors it set are where
        the same read in :meth:`pop` sets them). Lets a front end answer in its reader and
        give only the pops that park a task of their own."""
        engine = self.engine
        if self._hold_s(poll_ms) <= 0 or self.stopping.is_set():
            return self._batch(req, engine.pop_nowait(req, self.clock.now_ms()))
        rotation = engine.reader.rotation(req)
        result = engine.pop_nowait(req, self.clock.now_ms())
        if result.found:
            return self._batch(req, result)
        engine.reader.rotate_back(req, rotation)
        return None

    async def wait_for_topic(self, topic: str, group: str, poll_ms: int) -> bool:
        """Park like a pop on a topic that does not exist yet (a consumer that starts before
        the first send: the gRPC clients get the topic's planned route) until a message
        arrives on it or ``poll_ms`` pass; returns whether the topic exists now.

        Raises:
            BrokerError: ``SERVICE_NOT_AVAILABLE`` on a replica (at once).
        """
        self._refuse_on_replica()
        hold_s = self._hold_s(poll_ms)
        if self.topics.get(topic) is None and hold_s > 0 and not self.stopping.is_set():
            deadline = trio.current_time() + hold_s
            await self.engine.hub.wait(topic, group, -1, None, deadline)
        return self.topics.get(topic) is not None

    def _hold_s(self, poll_ms: int) -> float:
        """How long a request asking for ``poll_ms`` may park, in seconds."""
        return max(0, min(poll_ms, self.max_hold_ms)) / 1000

    def _batch(self, req: PopRequest, result: PopResult) -> PopBatch:
        return PopBatch(req, result, self.engine.reader.broker_name)

    # ------------------------------------------------------------------ ack / change
    def ack(self, group: str, topic: str, queue_id: int, offset: int, receipt: ExtraInfo) -> None:
        """Acknowledge one popped message.

        Raises:
            BrokerError: ``NO_MESSAGE`` (not in flight: the remark says why) or
                ``SYSTEM_ERROR`` (the journal could not record it; nothing changed);
                ``SERVICE_NOT_AVAILABLE`` on a replica.
            IllegalNameError: the group name is illegal.
        """
        self._ack(group, topic, queue_id, offset, receipt.retry_flag, receipt.pop_time_ms)

    def ack_text(self, group: str, topic: str, queue_id: int, offset: int, text: str) -> None:
        """:meth:`ack` of the receipt string ``text`` (a Remoting ``extraInfo``), read without
        building an :class:`ExtraInfo` when it is plain (:func:`plain_receipt`).

        Raises:
            BrokerError: ``INVALID_PARAMETER`` for a malformed receipt (before anything
                else), then as :meth:`ack`.
            IllegalNameError: the group name is illegal.
        """
        plain = plain_receipt(text)
        if plain is None:
            receipt = parse_receipt(text)
            self._ack(group, topic, queue_id, offset, receipt.retry_flag, receipt.pop_time_ms)
        else:
            self._ack(group, topic, queue_id, offset, plain[4], plain[1])

    def _ack(
        self, group: str, topic: str, queue_id: int, offset: int, flag: RetryFlag, pop_time: int
    ) -> None:
        self._refuse_on_replica()
        self._validate_group(group)
        key = _key(group, topic, queue_id, offset, flag)
        try:
            outcome = self.engine.ack(key, pop_time, self.clock.now_ms())
        except OSError:
            raise _not_journaled("ack") from None
        if outcome is not Outcome.OK:
            raise _refuse(outcome, key)

    def ack_texts(self, acks: Sequence[AckText]) -> list[TrimqError | None]:
        """:meth:`ack_text` of each of ``acks`` (consecutive single acks: a burst of
        ACK_MESSAGE requests), as one call after another would answer them (None: acked, else
        the error :meth:`ack_text` raises), with one journal write for all.

        A malformed receipt, a replica, an illegal group name and an ack that finds no
        message in flight fail only their own ack; a journal that cannot record the write
        fails every ack that reached it (nothing changed: ``SYSTEM_ERROR``, as :meth:`ack`).
        """
        errors: list[TrimqError | None] = [None] * len(acks)
        todo: list[tuple[int, LeaseKey, int]] = []
        replica = self.is_replica()  # asked once: nothing in this call changes the answer
        for i, (group, topic, queue_id, offset, text) in enumerate(acks):
            try:
                plain = plain_receipt(text)
                if plain is None:
                    receipt = parse_receipt(text)
                    flag, pop_time = receipt.retry_flag, receipt.pop_time_ms
                else:
                    flag, pop_time = plain[4], plain[1]
                if replica:
                    raise BrokerError(POP_ON_REPLICA, code=ResponseCode.SERVICE_NOT_AVAILABLE)
                self._validate_group(group)
                key = _key(group, topic, queue_id, offset, flag)
            except TrimqError as exc:
                errors[i] = exc
                continue
            todo.append((i, key, pop_time))
        if not todo:
            return errors
        try:
            outcomes = self.engine.ack_each([(k, t) for _, k, t in todo], self.clock.now_ms())
        except OSError:
            failed = _not_journaled("ack")
            for i, _, _ in todo:
                errors[i] = failed
            return errors
        for (i, key, _), outcome in zip(todo, outcomes, strict=True):
            if outcome is not Outcome.OK:
                errors[i] = _refuse(outcome, key)
        return errors

    def _validate_group(self, group: str) -> None:
        """:func:`validate_group`, remembering the names it accepted (a pure check: an ack
        per message need not re-read the same name)."""
        if group in self._valid_groups:
            return
        validate_group(group)
        if len(self._valid_groups) >= _MAX_VALID_GROUPS:
            self._valid_groups.clear()
        self._valid_groups.add(group)

    def ack_many(self, receipts: Sequence[tuple[LeaseKey, int]]) -> list[Outcome]:
        """Acknowledge ``(lease key, pop time)`` pairs in one journal write; those not in
        flight are skipped (RocketMQ's batch ack does the same) and reported per pair.

        Raises:
            BrokerError: ``SYSTEM_ERROR`` when the journal could not record it (nothing
                changed); ``SERVICE_NOT_AVAILABLE`` on a replica.
        """
        self._refuse_on_replica()
        try:
            return self.engine.ack_many(list(receipts), self.clock.now_ms())
        except OSError:
            raise _not_journaled("batch ack") from None

    # ------------------------------------------------------------------ auto-renewal
    def keep_invisible(self, owner: Hashable, batch: PopBatch) -> None:
        r"""Keep ``batch``'s messages invisible while ``owner`` works on them (renewed in
        place, receipts unchanged: :mod:`broker.pop.renew`) until acked, changed or
        :meth:`release`\ d."""
        self.engine.renewals.track(owner, [lease.key for lease in batch.result.leases])

    def release(self, owner: Hashable) -> int:
        """``owner`` went away: what it kept invisible is visible again within a second."""
        try:
            return self.engine.renewals.release(owner, self.clock.now_ms())
        except OSError:
            return 0  # not journaled: the leases revive at their current deadlines

    def change(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        receipt: ExtraInfo,
        invisible_ms: int,
    ) -> Lease:
        """Give a popped message a new deadline ``now + invisible_ms``; returns the new lease
        (its pop time is the new receipt's). 0 makes it visible again at once (a nack: the
        gRPC clients' push consumers send it; RocketMQ accepts it too).

        Raises:
            BrokerError: ``INVALID_PARAMETER`` (invisible time < 0), ``NO_MESSAGE``,
                ``SYSTEM_ERROR`` or ``SERVICE_NOT_AVAILABLE`` as for :meth:`ack`.
            IllegalNameError: the group name is illegal.
        """
        self._refuse_on_replica()
        _check_invisible(invisible_ms, least=0)
        validate_group(group)
        key = lease_key(group, topic, queue_id, offset, receipt)
        try:
            outcome, lease = self.engine.change(key, receipt, self.clock.now_ms(), invisible_ms)
        except OSError:
            raise _not_journaled("change of invisible time") from None
        if lease is None:
            raise _refuse(outcome, key)
        return lease
