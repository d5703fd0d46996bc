"""CONSUMER_SEND_MSG_BACK (36): a classic consumer hands back a message it failed to consume.

As RocketMQ's ``consumerSendMsgBack``: the message is found by its commit-log offset (client-cpp
1.x sends nothing else), copied to the group's ``%RETRY%group`` topic with ``RETRY_TOPIC`` (the
original topic, which ali-ons needs to hand the retry to its handler), ``ORIGIN_MESSAGE_ID``
and its reconsume count + 1, and delayed by level ``3 + reconsume times`` unless the client
asks for a level (so the retries come back after 10 s, 30 s, 1 min … 2 h). Past the group's
maximum (the client's ``maxReconsumeTimes`` or 16), or with a negative level, it goes to
``%DLQ%group`` at once.
"""

from __future__ import annotations

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from broker.remoting.processors.send import store_message
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError, RecordError
from protocol.headers.send import ConsumerSendMsgBackRequestHeader
from protocol.message import decode_record
from protocol.naming import dlq_topic, retry_topic, validate_group
from protocol.properties import (
    CRC32,
    DELAY,
    ORIGIN_MESSAGE_ID,
    RETRY_TOPIC,
    UNIQ_KEY,
)


async def send_back(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Re-queue a failed message on the group's retry topic, or dead-letter it."""
    header = ConsumerSendMsgBackRequestHeader.from_ext(cmd.ext_fields)
    validate_group(header.group)
    data = ctx.store.message_at(header.offset)
    if data is None:
        raise BrokerError(f"look message by offset failed, {header.offset}",
                          code=ResponseCode.SYSTEM_ERROR)  # fmt: skip
    try:
        msg, _ = decode_record(data)
    except RecordError as exc:
        raise BrokerError(str(exc), code=ResponseCode.SYSTEM_ERROR) from None
    limit = header.max_reconsume_times
    if limit is None or limit < 0:
        limit = ctx.config.max_reconsume_times
    props = {k: v for k, v in msg.properties.items() if k not in (CRC32, DELAY)}
    props.setdefault(RETRY_TOPIC, msg.topic)
    props.setdefault(
        ORIGIN_MESSAGE_ID, header.origin_msg_id or props.get(UNIQ_KEY) or msg.offset_msg_id
    )
    if msg.reconsume_times >= limit or header.delay_level < 0:
        topic = dlq_topic(header.group)
    else:
        topic = retry_topic(header.group)
        props[DELAY] = str(header.delay_level or 3 + msg.reconsume_times)
    ctx.topics.ensure(topic, 1)
    result, _ = await store_message(
        ctx, topic, 0, msg.body, props, msg.flag, msg.sys_flag, msg.born_timestamp,
        msg.born_host, msg.reconsume_times + 1,
    )  # fmt: skip
    if not result.ok:
        raise BrokerError(result.remark or result.status.value,
                          code=ResponseCode.SERVICE_NOT_AVAILABLE)  # fmt: skip
    return cmd.response()
