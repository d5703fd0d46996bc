"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320): the Remoting
adapter over :class:`broker.core.send.SendService` (the rules live there).

Header → :class:`~broker.core.send.SendRequest`; the put's status → response code; the
stored message → ``SendMessageResponseHeader`` (a batch's msgIds and UNIQ_KEYs comma-joined).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

from broker.core.send import BatchSendRequest, SendOutcome, SendRequest, born_host_of
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from broker.store.api import Host, PutResult, PutStatus
from protocol.batch import decode_batch
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.registry import decode_request_header
from protocol.headers.send import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.properties import UNIQ_KEY, decode_properties

_STATUS_CODES: Mapping[PutStatus, int] = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.DISK_ERROR: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
}


#: Boolean spellings the typed header accepts as they are (``unitMode``, ``batch``).
_PLAIN_BOOLS = frozenset({"true", "false", "1", "0"})
#: A producer's ``host:port`` as records store it, per peer (connections come and go, the
#: addresses repeat; bounded).
_born_host = lru_cache(maxsize=4096)(born_host_of)


def _reply(cmd: RemotingCommand, result: PutResult, queue_id: int, **extra: str) -> RemotingCommand:
    if result.status is PutStatus.PUT_OK and not extra:
        # The common answer first: hashing an Enum member (the table, ``stored``) is a
        # Python call, twice per send.
        return cmd.response(
            ResponseCode.SUCCESS, result.remark or None, _stored_ext(result, queue_id)
        )
    code = _STATUS_CODES[result.status]
    if not result.stored:
        return cmd.response(code, result.remark or result.status.value)
    # A stored message's answer carries its msgId and offset even when sync replication
    # timed out (code 12): RocketMQ's clients read them into the SendResult.
    if not extra:
        return cmd.response(code, result.remark or None, _stored_ext(result, queue_id))
    header = SendMessageResponseHeader(
        msg_id=extra.get("msg_id", result.msg_id),
        queue_id=queue_id,
        queue_offset=result.queue_offset,
        batch_uniq_id=extra.get("batch_uniq_id"),
    )
    return cmd.response(code, result.remark or None, ext_fields=header.to_ext())


def _stored_ext(result: PutResult, queue_id: int) -> dict[str, str]:
    """``SendMessageResponseHeader(msg_id, queue_id, queue_offset).to_ext()`` written out:
    the same keys in the same order (its other fields are None, so absent), without
    building the header per message. Queue ids and offsets always fit their Java types."""
    return {
        "msgId": result.msg_id,
        "queueId": str(queue_id),
        "queueOffset": str(result.queue_offset),
    }


async def send_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Store one message and answer with its msgId, queue and queue offset."""
    outcome = await ctx.broker.sends.send(_request(conn, cmd))
    return _reply(cmd, outcome.result, outcome.queue_id)


def store_message(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> object | None:
    """SYNC mode, a burst of sends: :func:`send_message`'s message appended now (not yet
    durable: :func:`settle_messages` answers it); None for one that needs
    :func:`send_message` (delayed, half)."""
    return ctx.broker.sends.send_nowait(_request(conn, cmd))


async def settle_messages(
    ctx: BrokerContext, conn: Connection, stored: Sequence[tuple[RemotingCommand, object]]
) -> list[RemotingCommand]:
    """The replies of a burst of :func:`store_message` sends, once all are durable (and
    replicated): each as :func:`send_message` would answer it."""
    outcomes = []
    for _, outcome in stored:
        assert isinstance(outcome, SendOutcome)  # what store_message gave
        outcomes.append(outcome)
    settled = await ctx.broker.sends.settle(outcomes)
    return [
        _reply(cmd, outcome.result, outcome.queue_id)
        for (cmd, _), outcome in zip(stored, settled, strict=True)
    ]


def _request(conn: Connection, cmd: RemotingCommand) -> SendRequest:
    request = None
    if cmd.code == RequestCode.SEND_MESSAGE_V2:
        request = _plain_v2_request(cmd.ext_fields, cmd.body, _born_host(conn.peer))
    return _typed_request(cmd, conn.peer) if request is None else request


def _typed_request(cmd: RemotingCommand, peer: str) -> SendRequest:
    """The request through the typed header (any send code; every malformed field refused
    with the :class:`~protocol.errors.FieldError` naming it)."""
    header = decode_request_header(cmd)
    assert isinstance(header, SendMessageRequestHeader)
    return SendRequest(
        topic=header.topic,
        body=cmd.body,
        properties=decode_properties(header.properties or ""),
        queue_id=header.queue_id,
        flag=header.flag,
        sys_flag=header.sys_flag,
        born_timestamp=header.born_timestamp,
        born_host=_born_host(peer),
        reconsume_times=header.reconsume_times or 0,
        max_reconsume_times=header.max_reconsume_times,
        default_topic=header.default_topic,
        default_topic_queue_nums=header.default_topic_queue_nums,
        properties_text=header.properties,
    )


def _plain_v2_request(ext: Mapping[str, str], body: bytes, born_host: Host) -> SendRequest | None:
    """The request of a SEND_MESSAGE_V2 header as producers write it, read straight from
    its one-letter ``extFields``; None for anything else (a field missing, a number that is
    negative or long, an odd boolean), which :func:`_typed_request` then decodes or refuses.
    Gives exactly what :func:`_typed_request` gives for such a header, in ~1/4 of the time:
    no typed header is built per message (see docs/benchmarks.md, issue 15)."""
    get = ext.get
    group, topic, default_topic, stamp = get("a"), get("b"), get("c"), get("g")
    nums, queue_id, sys_flag, flag = get("d"), get("e"), get("f"), get("h")
    reconsume, max_reconsume = get("j", "0"), get("l")
    if (
        group is None
        or topic is None
        or default_topic is None
        or stamp is None
        or not (len(stamp) <= 18 and stamp.isdigit() and stamp.isascii())
        or get("k", "0") not in _PLAIN_BOOLS
        or get("m", "0") not in _PLAIN_BOOLS
    ):
        return None
    for raw in (
        nums,
        queue_id,
        sys_flag,
        flag,
        reconsume,
        "0" if max_reconsume is None else max_reconsume,
    ):
        # Up to 9 plain digits: a Java int whatever they are (the typed header's fast rule).
        if raw is None or not (len(raw) <= 9 and raw.isdigit() and raw.isascii()):
            return None
    assert nums is not None and queue_id is not None and sys_flag is not None and flag is not None
    properties = get("i")
    return SendRequest(
        topic, body, decode_properties(properties or ""), int(queue_id), int(flag),
        int(sys_flag), int(stamp), born_host, int(reconsume),
        None if max_reconsume is None else int(max_reconsume), default_topic, int(nums),
        properties,
    )  # fmt: skip


async def send_batch(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Store every message of a batch in one queue; msgIds and UNIQ_KEYs comma-joined."""
    header = decode_request_header(cmd)
    assert isinstance(header, SendMessageRequestHeader)
    entries = decode_batch(cmd.body)
    request = BatchSendRequest(
        topic=header.topic,
        entries=entries,
        queue_id=header.queue_id,
        sys_flag=header.sys_flag,
        born_timestamp=header.born_timestamp,
        born_host=_born_host(conn.peer),
        default_topic=header.default_topic,
        default_topic_queue_nums=header.default_topic_queue_nums,
    )
    outcome = await ctx.broker.sends.send_batch(request)
    if not outcome.results[-1].stored:
        return _reply(cmd, outcome.results[-1], outcome.queue_id)
    return _reply(
        cmd,
        outcome.results[0],
        outcome.queue_id,
        msg_id=",".join(r.msg_id for r in outcome.results),
        batch_uniq_id=",".join(entry.properties.get(UNIQ_KEY, "") for entry in entries),
    )
