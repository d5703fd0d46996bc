"""ACK_MESSAGE (200051), BATCH_ACK_MESSAGE (200151) and CHANGE_MESSAGE_INVISIBLETIME (200053).

A receipt names one lease: ``(group, real topic, queue, offset)`` from the header and the pop
time from the receipt. The real topic is the header's topic, or the group's retry topic when
the receipt's retry flag says so and the client sent the original topic. An ack or change of a
receipt that is not in flight (never popped by this group, already acked, revived, or
superseded by a change of invisible time) is answered ``NO_MESSAGE`` with a remark saying which,
and changes nothing; RocketMQ's Java client maps ``NO_MESSAGE`` to ``AckStatus.NO_EXIST``.
RocketMQ itself answers ``SUCCESS`` even when it failed to record the ack (weak spot 18); here a
journal failure is a ``SYSTEM_ERROR`` and the message stays in flight.
"""

from __future__ import annotations

from broker.context import BrokerContext
from broker.deadlines import now_ms
from broker.pop.inflight import LeaseKey, Outcome
from broker.remoting.connection import Connection
from broker.remoting.processors.pop import pop_service
from protocol.bodies.ack import BatchAckMessageRequestBody
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError, ReceiptError
from protocol.headers.pop import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
)
from protocol.naming import is_retry_topic, pop_retry_topic, validate_group
from protocol.receipt import ExtraInfo, RetryFlag

_REMARKS = {
    Outcome.UNKNOWN: "no message in flight for this receipt (never popped by this group, "
    "already acked, or revived)",
    Outcome.EXPIRED: "receipt expired: the message's invisible time is over and it is being "
    "redelivered",
    Outcome.STALE: "stale receipt: the message's invisible time was changed since; use the "
    "newer receipt",
}


def lease_key(group: str, topic: str, queue_id: int, offset: int, receipt: ExtraInfo) -> LeaseKey:
    """The in-flight table key a receipt names."""
    if receipt.retry_flag is not RetryFlag.NORMAL and not is_retry_topic(topic):
        topic = pop_retry_topic(group, topic, v2=receipt.retry_flag is RetryFlag.RETRY_V2)
    return (group, topic, queue_id, offset)


def named_lease(
    header: AckMessageRequestHeader | ChangeInvisibleTimeRequestHeader,
) -> tuple[LeaseKey, ExtraInfo]:
    """The lease key and receipt an ack or change header names.

    Raises:
        BrokerError: a malformed receipt (``INVALID_PARAMETER``).
        IllegalNameError: a malformed group name.
    """
    validate_group(header.consumer_group)
    receipt = parse_receipt(header.extra_info)
    key = lease_key(header.consumer_group, header.topic, header.queue_id, header.offset, receipt)
    return key, receipt


def parse_receipt(text: str) -> ExtraInfo:
    """Decode a receipt; a malformed one is ``INVALID_PARAMETER``."""
    try:
        return ExtraInfo.decode(text)
    except ReceiptError as exc:
        raise BrokerError(str(exc), code=ResponseCode.INVALID_PARAMETER) from None


def refuse(outcome: Outcome, key: LeaseKey) -> BrokerError:
    """The error for an ack or change that found no valid lease."""
    group, topic, queue_id, offset = key
    return BrokerError(
        f"{_REMARKS[outcome]}: group {group}, topic {topic}, queue {queue_id}, offset {offset}",
        code=ResponseCode.NO_MESSAGE,
    )


def journaled(what: str) -> BrokerError:
    """A journal write failed: nothing changed."""
    return BrokerError(
        f"{what} not recorded (pop journal write failed); retry", code=ResponseCode.SYSTEM_ERROR
    )


async def ack_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Acknowledge one popped message."""
    header = AckMessageRequestHeader.from_ext(cmd.ext_fields)
    key, receipt = named_lease(header)
    pop = pop_service(ctx)
    try:
        outcome = pop.ack(key, receipt, now_ms())
    except OSError:
        raise journaled("ack") from None
    if outcome is not Outcome.OK:
        raise refuse(outcome, key)
    return cmd.response()


async def batch_ack_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Acknowledge several messages (RocketMQ's ``BatchAckMessageRequestBody``). Offsets that
    are not in flight are skipped, as RocketMQ does; the remark counts them."""
    body = BatchAckMessageRequestBody.from_json(cmd.body)
    pop = pop_service(ctx)
    receipts: list[tuple[LeaseKey, int]] = []
    for ack in body.acks:
        validate_group(ack.consumer_group)
        flag = RetryFlag(int(ack.retry)) if ack.retry in ("0", "1", "2") else RetryFlag.NORMAL
        receipt = ExtraInfo(
            ack.start_offset,
            ack.pop_time,
            ack.invisible_time,
            ack.revive_queue_id,
            flag,
            body.broker_name or "-",
            ack.queue_id,
        )
        for offset in ack.offsets:
            key = lease_key(ack.consumer_group, ack.topic, ack.queue_id, offset, receipt)
            receipts.append((key, ack.pop_time))
    try:
        outcomes = pop.ack_many(receipts, now_ms())
    except OSError:
        raise journaled("batch ack") from None
    skipped = sum(outcome is not Outcome.OK for outcome in outcomes)
    return cmd.response(remark=f"{skipped} not in flight" if skipped else None)


async def change_invisible_time(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Give a popped message a new deadline ``now + invisibleTime`` and a new receipt."""
    header = ChangeInvisibleTimeRequestHeader.from_ext(cmd.ext_fields)
    if header.invisible_time <= 0:
        raise BrokerError(
            f"invisibleTime must be > 0 ms, not {header.invisible_time}",
            code=ResponseCode.INVALID_PARAMETER,
        )
    key, receipt = named_lease(header)
    pop = pop_service(ctx)
    try:
        outcome, lease = pop.change(key, receipt, now_ms(), header.invisible_time)
    except OSError:
        raise journaled("change of invisible time") from None
    if lease is None:
        raise refuse(outcome, key)
    reply = ChangeInvisibleTimeResponseHeader(
        pop_time=lease.pop_time, invisible_time=lease.invisible_ms, revive_qid=receipt.revive_qid
    )
    return cmd.response(ext_fields=reply.to_ext())
