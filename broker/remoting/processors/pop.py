"""POP_MESSAGE (200050): the Remoting adapter over :class:`broker.core.pop.PopService`
(validation, the long-poll park loop and its wake-up accounting live there).

Header → :class:`~broker.pop.reader.PopRequest`; the pop's result → ``SUCCESS`` with the
records and the ``startOffsetInfo``/``msgOffsetInfo``/``orderCountInfo`` strings a Remoting
client rebuilds its receipts from, or ``POLLING_TIMEOUT`` when nothing was found.
"""

from __future__ import annotations

from broker.core.pop import PopBatch
from broker.pop.reader import REVIVE_QID
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.pop import PopMessageRequestHeader, PopMessageResponseHeader
from protocol.receipt import (
    POP_ORDER_REVIVE_QUEUE,
    build_msg_offset_info,
    build_order_count_info,
    build_start_offset_info,
)


def answer(cmd: RemotingCommand, batch: PopBatch) -> RemotingCommand:
    """SUCCESS with the records, or POLLING_TIMEOUT when nothing was found."""
    req, result = batch.request, batch.result
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


async def pop_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Pop messages, parking until a matching message (or a retry of this group) arrives."""
    header = PopMessageRequestHeader.from_ext(cmd.ext_fields)
    pops = ctx.broker.pops
    req = pops.request(
        header.consumer_group,
        header.topic,
        header.queue_id,
        header.max_msg_nums,
        header.invisible_time,
        expression=header.exp,
        expression_type=header.exp_type,
        order=header.order,
        attempt_id=header.attempt_id,
        init_mode=header.init_mode,
    )
    return answer(cmd, await pops.pop(req, poll_ms=header.poll_time))
