"""POP_MESSAGE (200050): the Remoting adapter over :class:`broker.core.pop.PopService`
(validation, the long-poll park loop and its wake-up accounting live there).

Header → :class:`~broker.pop.reader.PopRequest`; the pop's result → ``SUCCESS`` with the
records and the ``startOffsetInfo``/``msgOffsetInfo``/``orderCountInfo`` strings a Remoting
client rebuilds its receipts from, or ``POLLING_TIMEOUT`` when nothing was found.

A pop that need not park (it finds messages, or asks for no hold) is answered in the reader
(:func:`pop_message_now`, a quick handler), its reply in the burst's write; one that parks
gets a task of its own (:func:`pop_message`). The header as clients write it is read straight
from ``extFields`` (:func:`_plain_pop`), the reply's header written out as a dict
(:func:`_response_ext`); anything else goes through the typed headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from broker.core.pop import PopBatch, PopService
from broker.pop.reader import REVIVE_QID, PopRequest
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from broker.remoting.dispatch import LATER, Later
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.headers import plain_int
from protocol.headers.pop import PopMessageRequestHeader
from protocol.receipt import (
    POP_ORDER_REVIVE_QUEUE,
    build_msg_offset_info,
    build_order_count_info,
    build_start_offset_info,
)


class PopFields(NamedTuple):
    """What the broker uses of a POP_MESSAGE header."""

    consumer_group: str
    topic: str
    queue_id: int
    max_msg_nums: int
    invisible_time: int
    poll_time: int
    init_mode: int
    exp_type: str | None
    exp: str | None
    order: bool
    attempt_id: str | None


def answer(cmd: RemotingCommand, batch: PopBatch) -> RemotingCommand:
    """SUCCESS with the records, or POLLING_TIMEOUT when nothing was found."""
    ext = _response_ext(batch)
    if not batch.result.found:
        return cmd.response(ResponseCode.POLLING_TIMEOUT, "NO_NEW_MSG", ext)
    return cmd.response(ResponseCode.SUCCESS, "FOUND", ext, b"".join(batch.result.records))


def _response_ext(batch: PopBatch) -> dict[str, str]:
    """``PopMessageResponseHeader(...).to_ext()`` written out: the same keys in the same
    order, empty info strings left out (tests/broker/test_pop_fast.py). Pop and invisible
    times, the revive queue and the rest count always fit their Java types (the broker's
    clock, a validated request, a count)."""
    req, result = batch.request, batch.result
    ext = {
        "popTime": str(result.pop_time),
        "invisibleTime": str(req.invisible_ms),
        "reviveQid": str(POP_ORDER_REVIVE_QUEUE if req.order else REVIVE_QID),
        "restNum": str(result.rest),
    }
    if start := build_start_offset_info(result.start_offsets):
        ext["startOffsetInfo"] = start
    if offsets := build_msg_offset_info(result.msg_offsets):
        ext["msgOffsetInfo"] = offsets
    if counts := build_order_count_info(result.order_counts):
        ext["orderCountInfo"] = counts
    return ext


async def pop_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Pop messages, parking until a matching message (or a retry of this group) arrives."""
    pops = ctx.broker.pops
    fields = pop_fields(cmd.ext_fields)
    req = _request(pops, fields)
    return answer(cmd, await pops.pop(req, poll_ms=fields.poll_time))


def pop_message_now(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand | Later:
    """Serve a pop at once when it need not park (:meth:`PopService.pop_now`), else
    :data:`LATER` (then :func:`pop_message` runs it in a task, from the start)."""
    pops = ctx.broker.pops
    fields = pop_fields(cmd.ext_fields)
    batch = pops.pop_now(_request(pops, fields), poll_ms=fields.poll_time)
    return LATER if batch is None else answer(cmd, batch)


def _request(pops: PopService, f: PopFields) -> PopRequest:
    return pops.request(
        f.consumer_group,
        f.topic,
        f.queue_id,
        f.max_msg_nums,
        f.invisible_time,
        expression=f.exp,
        expression_type=f.exp_type,
        order=f.order,
        attempt_id=f.attempt_id,
        init_mode=f.init_mode,
    )


def pop_fields(ext: Mapping[str, str]) -> PopFields:
    """The fields of a POP_MESSAGE header: read straight from ``extFields`` when plain, else
    through the typed header (which refuses what it must).

    Raises:
        FieldError: a required field is missing or malformed.
    """
    plain = _plain_pop(ext)
    if plain is not None:
        return plain
    h = PopMessageRequestHeader.from_ext(ext)
    return PopFields(
        h.consumer_group, h.topic, h.queue_id, h.max_msg_nums, h.invisible_time, h.poll_time,
        h.init_mode, h.exp_type, h.exp, h.order, h.attempt_id,
    )  # fmt: skip


#: ``order`` as Java writes it (the typed header's other spellings take its path).
_BOOLS: Mapping[str | None, bool] = {None: False, "false": False, "true": True}


def _plain_pop(ext: Mapping[str, str]) -> PopFields | None:
    """:func:`pop_fields` of a header as clients write it (every required field present,
    numbers plain ASCII digits: at most 9 for an int, 18 for a long, the queue id also -1..
    -999999999; ``order`` absent, ``true`` or ``false``), without building the typed header
    per pop; None for anything else. Gives exactly what the typed header gives for such a
    header (tests/broker/test_pop_fast.py)."""
    get = ext.get
    group, topic = get("consumerGroup"), get("topic")
    queue_id, max_nums = plain_int(get("queueId"), 9, signed=True), plain_int(get("maxMsgNums"), 9)
    invisible, poll = plain_int(get("invisibleTime"), 18), plain_int(get("pollTime"), 18)
    init_mode, order = plain_int(get("initMode"), 9), _BOOLS.get(get("order"))
    if (
        group is None
        or topic is None
        or queue_id is None
        or max_nums is None
        or invisible is None
        or poll is None
        or init_mode is None
        or order is None
        or plain_int(get("bornTime"), 18) is None
    ):
        return None
    return PopFields(
        group, topic, queue_id, max_nums, invisible, poll, init_mode, get("expType"),
        get("exp"), order, get("attemptId"),
    )  # fmt: skip
