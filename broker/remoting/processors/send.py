"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320): the Remoting
adapter over :class:`broker.core.send.SendService` (the rules live there).

Header → :class:`~broker.core.send.SendRequest`; the put's status → response code; the
stored message → ``SendMessageResponseHeader`` (a batch's msgIds and UNIQ_KEYs comma-joined).
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.core.send import BatchSendRequest, SendRequest, born_host_of
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from broker.store.api import PutResult, PutStatus
from protocol.batch import decode_batch
from protocol.codes import ResponseCode
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


def _reply(cmd: RemotingCommand, result: PutResult, queue_id: int, **extra: str) -> RemotingCommand:
    code = _STATUS_CODES[result.status]
    if not result.stored:
        return cmd.response(code, result.remark or result.status.value)
    # A stored message's answer carries its msgId and offset even when sync replication
    # timed out (code 12): RocketMQ's clients read them into the SendResult.
    header = SendMessageResponseHeader(
        msg_id=extra.get("msg_id", result.msg_id),
        queue_id=queue_id,
        queue_offset=result.queue_offset,
        batch_uniq_id=extra.get("batch_uniq_id"),
    )
    return cmd.response(code, result.remark or None, ext_fields=header.to_ext())


async def send_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Store one message and answer with its msgId, queue and queue offset."""
    header = decode_request_header(cmd)
    assert isinstance(header, SendMessageRequestHeader)
    request = SendRequest(
        topic=header.topic,
        body=cmd.body,
        properties=decode_properties(header.properties or ""),
        queue_id=header.queue_id,
        flag=header.flag,
        sys_flag=header.sys_flag,
        born_timestamp=header.born_timestamp,
        born_host=born_host_of(conn.peer),
        reconsume_times=header.reconsume_times or 0,
        max_reconsume_times=header.max_reconsume_times,
        default_topic=header.default_topic,
        default_topic_queue_nums=header.default_topic_queue_nums,
        properties_text=header.properties,
    )
    outcome = await ctx.broker.sends.send(request)
    return _reply(cmd, outcome.result, outcome.queue_id)


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
        born_host=born_host_of(conn.peer),
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
