"""PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361): the Remoting adapter over
:class:`broker.core.pull.PullService` (checks, filter, long polling live there).

Read outcomes map to response codes exactly as RocketMQ's ``PullMessageProcessor`` does;
records are sent back as they are stored. A ``TAG`` or ``SQL92`` subscription filters them
(:func:`broker.core.filters.message_filter`); another type, or an SQL92 expression that does
not parse, is ``SUBSCRIPTION_PARSE_FAILED``.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.core.pull import PullRequest, caught_up
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from broker.remoting.dispatch import LATER, Later
from broker.store.api import GetResult, GetStatus
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.pull import PullMessageRequestHeader, PullMessageResponseHeader

#: ``GetMessageStatus`` → response code for the statuses whose code never depends on the
#: requested offset (``PullMessageProcessor``).
_FIXED_CODES: Mapping[GetStatus, int] = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


def response_code(status: GetStatus, requested_offset: int) -> int:
    """RocketMQ's pull status mapping: an unknown or empty queue is ``PULL_NOT_FOUND`` for a
    pull from 0 and ``PULL_OFFSET_MOVED`` otherwise."""
    code = _FIXED_CODES.get(status)
    if code is not None:
        return code
    if caught_up(status, requested_offset):
        return ResponseCode.PULL_NOT_FOUND
    return ResponseCode.PULL_OFFSET_MOVED


def answer(cmd: RemotingCommand, result: GetResult, requested_offset: int) -> RemotingCommand:
    """The response to a pull for one read result (records sent exactly as stored)."""
    code = response_code(result.status, requested_offset)
    header = PullMessageResponseHeader(
        suggest_which_broker_id=0,
        next_begin_offset=result.next_offset,
        min_offset=result.min_offset,
        max_offset=result.max_offset,
    )
    body = result.body if code == ResponseCode.SUCCESS else b""
    remark = None if code == ResponseCode.SUCCESS else result.status.value
    return cmd.response(code, remark, header.to_ext(), body)


def pull_request(header: PullMessageRequestHeader) -> PullRequest:
    """The core request a pull header describes."""
    return PullRequest(
        group=header.consumer_group,
        topic=header.topic,
        queue_id=header.queue_id,
        offset=header.queue_offset,
        max_nums=header.max_msg_nums,
        max_bytes=header.max_msg_bytes,
        subscription=(
            (header.subscription, header.expression_type) if header.has_subscription else None
        ),
        # Negative commits (the JavaScript client's "no position yet") are ignored below.
        commit_offset=header.commit_offset if header.has_commit_offset else None,
    )


def hold_ms(header: PullMessageRequestHeader) -> int:
    """How long this pull asks to be held: its ``suspendTimeoutMillis`` when it carries the
    suspend flag, else 0 (the core caps it)."""
    return header.suspend_timeout_millis if header.has_suspend else 0


# LITE_PULL_MESSAGE (361) carries the same header and is served by the same processor class in
# RocketMQ (its own thread pool there, which trio does not need).
async def pull_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Serve one pull (see :meth:`broker.core.pull.PullService.pull`)."""
    header = PullMessageRequestHeader.from_ext(cmd.ext_fields)
    result = await ctx.broker.pulls.pull(pull_request(header), hold_ms=hold_ms(header))
    return answer(cmd, result, header.queue_offset)


def pull_message_now(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand | Later:
    """Serve a pull at once when it need not be held (there is something to read, or it
    asks for no hold): no task of its own (:meth:`broker.core.pull.PullService.pull_nowait`).
    """
    header = PullMessageRequestHeader.from_ext(cmd.ext_fields)
    result = ctx.broker.pulls.pull_nowait(pull_request(header), hold_ms=hold_ms(header))
    return LATER if result is None else answer(cmd, result, header.queue_offset)
