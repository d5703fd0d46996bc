"""ACK_MESSAGE (200051), BATCH_ACK_MESSAGE (200151) and CHANGE_MESSAGE_INVISIBLETIME
(200053): the Remoting adapters over :class:`broker.core.pop.PopService` (receipt → lease,
refusals and journal failures live there). RocketMQ's Java client maps the ``NO_MESSAGE``
refusal to ``AckStatus.NO_EXIST``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from broker.core.pop import lease_topic, parse_receipt
from broker.pop.inflight import LeaseKey, Outcome
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.bodies.ack import BatchAckMessageRequestBody
from protocol.command import RemotingCommand
from protocol.errors import TrimqError
from protocol.headers import plain_int
from protocol.headers.pop import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
)
from protocol.naming import validate_group
from protocol.receipt import RetryFlag


async def ack_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Acknowledge one popped message."""
    group, topic, queue_id, offset, receipt = ack_fields(cmd.ext_fields)
    ctx.broker.pops.ack_text(group, topic, queue_id, offset, receipt)
    # An empty dict, not the default empty mapping: the header is then written by formatting
    # (protocol.header_codec's plain path), the same bytes as the json module's.
    return cmd.response(ext_fields={})


def ack_messages(
    ctx: BrokerContext, conn: Connection, cmds: Sequence[RemotingCommand]
) -> list[RemotingCommand | None]:
    """Acknowledge the messages of consecutive ACK_MESSAGE requests of one read, each
    answered as :func:`ack_message` answers it alone, with one journal write for all before
    any reply leaves (:meth:`broker.core.pop.PopService.ack_texts`)."""
    replies: list[RemotingCommand | None] = [None] * len(cmds)
    acks: list[AckFields] = []
    at: list[int] = []
    for i, cmd in enumerate(cmds):
        try:
            acks.append(ack_fields(cmd.ext_fields))
        except TrimqError as exc:
            replies[i] = _error(cmd, exc)
            continue
        at.append(i)
    for i, error in zip(at, ctx.broker.pops.ack_texts(acks), strict=True):
        cmd = cmds[i]
        replies[i] = cmd.response(ext_fields={}) if error is None else _error(cmd, error)
    return replies


def _error(cmd: RemotingCommand, exc: TrimqError) -> RemotingCommand:
    """The reply :meth:`broker.remoting.dispatch.Registry.dispatch` gives a handler that
    raised ``exc``."""
    return cmd.response(exc.code, str(exc))


AckFields = tuple[str, str, int, int, str]  #: group, topic, queue id, offset, receipt text


def ack_fields(ext: Mapping[str, str]) -> AckFields:
    """The fields of an ACK_MESSAGE header: read straight from ``extFields`` when plain,
    else through the typed header (which refuses what it must).

    Raises:
        FieldError: a required field is missing or malformed.
    """
    plain = _plain_ack(ext)
    if plain is not None:
        return plain
    h = AckMessageRequestHeader.from_ext(ext)
    return h.consumer_group, h.topic, h.queue_id, h.offset, h.extra_info


def _plain_ack(ext: Mapping[str, str]) -> AckFields | None:
    """The fields of an ack header as clients write it (every field present, the queue id
    at most 9 and the offset at most 18 plain ASCII digits), without building the typed
    header per ack; None for anything else. Gives exactly what the typed header gives for
    such a header (tests/broker/test_pop_fast.py)."""
    get = ext.get
    group, topic, receipt = get("consumerGroup"), get("topic"), get("extraInfo")
    queue_id, offset = plain_int(get("queueId"), 9), plain_int(get("offset"), 18)
    if group is None or topic is None or receipt is None or queue_id is None or offset is None:
        return None
    return group, topic, queue_id, offset, receipt


def _batch_receipts(body: BatchAckMessageRequestBody) -> list[tuple[LeaseKey, int]]:
    """(lease key, pop time) of every offset a batch-ack body names (the key's topic found
    once per entry: :func:`lease_key` of the entry's receipt, the same for all its offsets)."""
    receipts: list[tuple[LeaseKey, int]] = []
    for ack in body.acks:
        group, queue_id, pop_time = ack.consumer_group, ack.queue_id, ack.pop_time
        validate_group(group)
        flag = RetryFlag(int(ack.retry)) if ack.retry in ("0", "1", "2") else RetryFlag.NORMAL
        topic = lease_topic(group, ack.topic, flag)
        receipts += [((group, topic, queue_id, offset), pop_time) for offset in ack.offsets]
    return receipts


async def batch_ack_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Acknowledge several messages (RocketMQ's ``BatchAckMessageRequestBody``). Offsets that
    are not in flight are skipped, as RocketMQ does; the remark counts them."""
    body = BatchAckMessageRequestBody.from_json(cmd.body)
    outcomes = ctx.broker.pops.ack_many(_batch_receipts(body))
    skipped = sum(outcome is not Outcome.OK for outcome in outcomes)
    # An empty dict: the header written by formatting, as ack_message's (the same bytes).
    return cmd.response(remark=f"{skipped} not in flight" if skipped else None, ext_fields={})


async def change_invisible_time(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Give a popped message a new deadline ``now + invisibleTime`` and a new receipt."""
    header = ChangeInvisibleTimeRequestHeader.from_ext(cmd.ext_fields)
    receipt = parse_receipt(header.extra_info)
    lease = ctx.broker.pops.change(
        header.consumer_group, header.topic, header.queue_id, header.offset, receipt,
        header.invisible_time,
    )  # fmt: skip
    reply = ChangeInvisibleTimeResponseHeader(
        pop_time=lease.pop_time, invisible_time=lease.invisible_ms, revive_qid=receipt.revive_qid
    )
    return cmd.response(ext_fields=reply.to_ext())
