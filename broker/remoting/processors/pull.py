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
from protocol.headers import plain_int
from protocol.headers.pull import PullMessageRequestHeader, PullSysFlag

#: ``GetMessageStatus`` → response code for the statuses whose code never depends on the
#: requested offset (``PullMessageProcessor``).
_FIXED_CODES: Mapping[GetStatus, int] = {
    GetStatus.FOUND: ResponseCode.SUCCESS,
    GetStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
}


#: The pull sys-flag bits as plain ints (an IntFlag's ``&`` is a Python call).
_COMMIT_OFFSET = int(PullSysFlag.COMMIT_OFFSET)
_SUSPEND = int(PullSysFlag.SUSPEND)
_SUBSCRIPTION = int(PullSysFlag.SUBSCRIPTION)


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
    body = result.body if code == ResponseCode.SUCCESS else b""
    remark = None if code == ResponseCode.SUCCESS else result.status.value
    return cmd.response(code, remark, _response_ext(result), body)


def _response_ext(result: GetResult) -> dict[str, str]:
    """``PullMessageResponseHeader(0, next, min, max).to_ext()`` written out: the same keys
    in the same order (its other fields are None, so absent), without building the header
    per pull. Queue offsets always fit a Java long."""
    return {
        "suggestWhichBrokerId": "0",
        "nextBeginOffset": str(result.next_offset),
        "minOffset": str(result.min_offset),
        "maxOffset": str(result.max_offset),
    }


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
    request, hold = _request_of(cmd.ext_fields)
    result = await ctx.broker.pulls.pull(request, hold_ms=hold)
    return answer(cmd, result, request.offset)


def _request_of(ext: Mapping[str, str]) -> tuple[PullRequest, int]:
    """The core request and its hold (ms) from a pull's ``extFields``: read straight from
    them when plain, else through the typed header (which refuses what it must)."""
    plain = _plain_request(ext)
    if plain is not None:
        return plain
    header = PullMessageRequestHeader.from_ext(ext)
    return pull_request(header), hold_ms(header)


def _plain_request(ext: Mapping[str, str]) -> tuple[PullRequest, int] | None:
    """:func:`pull_request` and :func:`hold_ms` of a pull header as consumers write it,
    without building the typed header per pull: every required field present, numbers
    plain digits (a Java int up to 9, a long up to 18). None for anything else (a negative
    commit offset, say), which the typed header then reads or refuses. Gives exactly what
    the typed path gives for such a header (tests/broker/test_pull_fast.py)."""
    get = ext.get
    group, topic = get("consumerGroup"), get("topic")
    queue_id, max_nums = plain_int(get("queueId"), 9), plain_int(get("maxMsgNums"), 9)
    sys_flag, offset = plain_int(get("sysFlag"), 9), plain_int(get("queueOffset"), 18)
    commit, suspend = plain_int(get("commitOffset"), 18), plain_int(get("suspendTimeoutMillis"), 18)
    max_bytes = get("maxMsgBytes")
    if (
        group is None
        or topic is None
        or queue_id is None
        or max_nums is None
        or sys_flag is None
        or offset is None
        or commit is None
        or suspend is None
        or plain_int(get("subVersion"), 18) is None
        or plain_int(get("requestSource", "0"), 9) is None
        or (max_bytes is not None and plain_int(max_bytes, 9) is None)
    ):
        return None
    request = PullRequest(
        group, topic, queue_id, offset, max_nums,
        None if max_bytes is None else int(max_bytes),
        (get("subscription"), get("expressionType"))
        if sys_flag & _SUBSCRIPTION else None,
        commit if sys_flag & _COMMIT_OFFSET else None,
    )  # fmt: skip
    return request, suspend if sys_flag & _SUSPEND else 0


def pull_message_now(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand | Later:
    """Serve a pull at once when it need not be held (there is something to read, or it
    asks for no hold): no task of its own (:meth:`broker.core.pull.PullService.pull_nowait`).
    """
    request, hold = _request_of(cmd.ext_fields)
    result = ctx.broker.pulls.pull_nowait(request, hold_ms=hold)
    return LATER if result is None else answer(cmd, result, request.offset)
