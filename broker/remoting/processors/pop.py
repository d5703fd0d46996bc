"""POP_MESSAGE (200050): RocketMQ 5 pop with long polling that wakes exactly the right group.

Validation follows ``PopMessageProcessor`` (more than 32 messages, a missing topic or queue,
a bad group name are refused with its codes); on top, an ``invisibleTime`` ≤ 0 is
``INVALID_PARAMETER`` (RocketMQ would revive such a message at once, as a poison loop).
A pop that finds nothing parks in the :class:`~broker.pop.hub.PopHub` for its ``pollTime``
(capped by ``suspend_max_ms``, counted from the broker's own receive time rather than the
client's ``bornTime``: weak spot 7) and at its deadline is answered ``POLLING_TIMEOUT``
directly, without re-reading (weak spot 5). A woken pop reads again; if another consumer
was faster it parks again for the rest of its time (the wake-up is counted as wasted).
"""

from __future__ import annotations

import trio

from broker.context import BrokerContext
from broker.deadlines import now_ms
from broker.metrics import EventKind
from broker.pop.reader import MAX_POP_MESSAGES, REVIVE_QID, PopRequest, PopResult
from broker.pop.service import PopService
from broker.remoting.connection import Connection
from broker.remoting.processors.pull import check_expression_type, check_readable, parse_tags
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError
from protocol.headers.pop import PopMessageRequestHeader, PopMessageResponseHeader
from protocol.naming import validate_group
from protocol.receipt import (
    POP_ORDER_REVIVE_QUEUE,
    build_msg_offset_info,
    build_order_count_info,
    build_start_offset_info,
)

#: A woken pop that found nothing parks again at most this many times (bounded loop).
MAX_REPARKS = 10_000


def pop_service(ctx: BrokerContext) -> PopService:
    """The broker's pop service (absent only in a broker still starting)."""
    if ctx.pop is None:
        raise BrokerError("pop service is not running", code=ResponseCode.SERVICE_NOT_AVAILABLE)
    return ctx.pop


def pop_request(ctx: BrokerContext, header: PopMessageRequestHeader) -> PopRequest:
    """Validate a pop header (RocketMQ's checks and codes) and build the request.

    Raises:
        BrokerError: ``INVALID_PARAMETER``, ``TOPIC_NOT_EXIST``, ``NO_PERMISSION`` or
            ``SUBSCRIPTION_PARSE_FAILED``.
    """
    validate_group(header.consumer_group)
    if not 0 < header.max_msg_nums <= MAX_POP_MESSAGES:
        raise BrokerError(
            f"the broker pops 1 to {MAX_POP_MESSAGES} messages at a time, "
            f"not {header.max_msg_nums}",
            code=ResponseCode.INVALID_PARAMETER,
        )
    if header.invisible_time <= 0:
        raise BrokerError(
            f"invisibleTime must be > 0 ms, not {header.invisible_time}",
            code=ResponseCode.INVALID_PARAMETER,
        )
    check_readable(ctx, header.topic, header.queue_id, header.consumer_group,
                   verb="peeking", any_queue=True)  # fmt: skip
    check_expression_type(header.exp_type)
    return PopRequest(
        group=header.consumer_group,
        topic=header.topic,
        queue_id=max(header.queue_id, -1),
        max_nums=header.max_msg_nums,
        invisible_ms=header.invisible_time,
        tags=parse_tags(header.exp),
        order=header.order,
        attempt_id=header.attempt_id,
        init_mode=header.init_mode,
    )


def answer(cmd: RemotingCommand, req: PopRequest, result: PopResult) -> RemotingCommand:
    """SUCCESS with the records, or POLLING_TIMEOUT when nothing was found."""
    header = PopMessageResponseHeader(
        pop_time=result.pop_time,
        invisible_time=req.invisible_ms,
        revive_qid=POP_ORDER_REVIVE_QUEUE if req.order else REVIVE_QID,
        rest_num=result.rest,
        start_offset_info=build_start_offset_info(result.start_offsets) or None,
        msg_offset_info=build_msg_offset_info(result.msg_offsets) or None,
        order_count_info=build_order_count_info(result.order_counts) or None,
    )
    if not result.found:
        return cmd.response(ResponseCode.POLLING_TIMEOUT, "NO_NEW_MSG", header.to_ext())
    return cmd.response(ResponseCode.SUCCESS, "FOUND", header.to_ext(), b"".join(result.records))


def hold_seconds(ctx: BrokerContext, header: PopMessageRequestHeader) -> float:
    """How long this pop may park: its ``pollTime`` capped by ``suspend_max_ms``."""
    if ctx.shutting_down.is_set():
        return 0.0
    return max(0, min(header.poll_time, ctx.config.suspend_max_ms)) / 1000


async def pop_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Pop messages, parking until a matching message (or a retry of this group) arrives."""
    header = PopMessageRequestHeader.from_ext(cmd.ext_fields)
    req = pop_request(ctx, header)
    pop = pop_service(ctx)
    result = pop.pop_nowait(req, now_ms())
    hold = hold_seconds(ctx, header)
    if result.found or hold <= 0:
        return answer(cmd, req, result)
    # As for pulls: the read above and the park below happen in one synchronous step, so no
    # arriving message can slip between them. Keep every await out of that span.
    parked_at = trio.current_time()
    deadline = parked_at + hold
    park_key = req.queue_id  # -1 parks "any queue"
    for _ in range(MAX_REPARKS):
        wakeup = await pop.hub.wait(req.topic, req.group, park_key, req.tags, deadline)
        if wakeup is None or ctx.shutting_down.is_set():
            break
        result = pop.pop_nowait(req, now_ms())
        pop.hub.record_result(wakeup, result.found)
        pop.event(
            EventKind.WAKEUP, req, latency_ms=(wakeup.time - parked_at) * 1000, found=result.found
        )
        if result.found:
            break
    pop.event(
        EventKind.POP_WAIT,
        req,
        latency_ms=(trio.current_time() - parked_at) * 1000,
        found=result.found,
    )
    return answer(cmd, req, result)
