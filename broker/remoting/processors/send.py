"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320).

Checks follow RocketMQ's ``msgCheck``: a legal topic that producers may write, the topic
auto-created from ``TBW102`` when unknown (``autoCreateTopicEnable``), the queue id within the
topic's write queues (negative = any). A send to a classic ``%RETRY%group`` topic whose
reconsume count is past the group's maximum goes to ``%DLQ%group`` instead
(``handleRetryAndDLQ``). A delayed or timer message (``DELAY``, ``TIMER_*``) is stored in
``SCHEDULE_TOPIC_XXXX`` and handed to the timer service (``broker.timers``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from broker.schedule import DELAY_PROPERTIES, SCHEDULE_TOPIC, delivery_time
from broker.store.api import MessageToStore, PutResult, PutStatus
from broker.topics import DEFAULT_TOPIC
from protocol.batch import decode_batch
from protocol.bodies.broker import TopicConfig
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError
from protocol.headers.registry import decode_request_header
from protocol.headers.send import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.naming import (
    dlq_topic,
    group_of_classic_retry,
    is_retry_topic,
    is_send_allowed,
    validate_topic,
)
from protocol.properties import (
    REAL_QID,
    REAL_TOPIC,
    TIMER_OUT_MS,
    UNIQ_KEY,
    decode_properties,
    encode_properties,
)

_round_robin = itertools.count()

_STATUS_CODES: Mapping[PutStatus, int] = {
    PutStatus.PUT_OK: ResponseCode.SUCCESS,
    PutStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutStatus.DISK_ERROR: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
}


def _fail(code: int, remark: str) -> BrokerError:
    return BrokerError(remark, code=code)


def topic_for_send(ctx: BrokerContext, header: SendMessageRequestHeader) -> TopicConfig:
    """The topic's configuration, auto-created from the default topic when allowed.

    Raises:
        BrokerError: the topic may not be written or does not exist.
        IllegalNameError: the topic name is illegal.
    """
    validate_topic(header.topic)
    if not is_send_allowed(header.topic):
        raise _fail(ResponseCode.NO_PERMISSION, f"sending to topic {header.topic} is forbidden")
    config = ctx.topics.get(header.topic)
    if config is not None:
        return config
    if is_retry_topic(header.topic):
        return ctx.topics.ensure(header.topic, 1)
    default = ctx.topics.get(header.default_topic or DEFAULT_TOPIC)
    if ctx.config.auto_create_topic and default is not None:
        nums = max(1, min(header.default_topic_queue_nums, default.write_queue_nums))
        return ctx.topics.ensure(header.topic, nums)
    raise _fail(ResponseCode.TOPIC_NOT_EXIST, f"topic {header.topic} does not exist")


def _queue_id(config: TopicConfig, requested: int) -> int:
    if requested < 0:
        return next(_round_robin) % max(1, config.write_queue_nums)
    if requested >= config.write_queue_nums:
        raise _fail(
            ResponseCode.SYSTEM_ERROR,
            f"queueId {requested} is illegal: topic {config.topic_name} has "
            f"{config.write_queue_nums} write queues",
        )
    return requested


def _target(
    ctx: BrokerContext, header: SendMessageRequestHeader, config: TopicConfig, queue_id: int
) -> tuple[str, int]:
    """Retry sends past the group's maximum go to the group's DLQ."""
    if not is_retry_topic(header.topic):
        return header.topic, queue_id
    limit = header.max_reconsume_times
    if limit is None or limit < 0:
        limit = ctx.config.max_reconsume_times
    if (header.reconsume_times or 0) > limit:
        dlq = dlq_topic(group_of_classic_retry(header.topic))
        ctx.topics.ensure(dlq, 1)
        return dlq, 0
    return header.topic, queue_id


def _born_host(conn: Connection) -> tuple[str, int]:
    host, _, port = conn.peer.rpartition(":")
    return (host, int(port)) if port.isdigit() and host.count(".") == 3 else ("127.0.0.1", 0)


def _check_delay(properties: Mapping[str, str]) -> None:
    """Batches cannot be delayed (RocketMQ refuses them too)."""
    for name in DELAY_PROPERTIES:
        value = properties.get(name)
        if value and value not in ("0", "-1"):
            raise _fail(
                ResponseCode.MESSAGE_ILLEGAL, f"a batch message cannot be delayed ({name}={value})"
            )


def _schedule(properties: Mapping[str, str]) -> tuple[int, int] | None:
    """(schedule queue, delivery ms) of a delayed or timer message, else None."""
    try:
        return delivery_time(properties, time.time_ns() // 1_000_000)
    except ValueError as exc:
        raise _fail(ResponseCode.MESSAGE_ILLEGAL, f"bad delivery time: {exc}") from None


def _reply(cmd: RemotingCommand, result: PutResult, queue_id: int, **extra: str) -> RemotingCommand:
    code = _STATUS_CODES[result.status]
    if code != ResponseCode.SUCCESS:
        return cmd.response(code, result.remark or result.status.value)
    header = SendMessageResponseHeader(
        msg_id=extra.get("msg_id", result.msg_id),
        queue_id=queue_id,
        queue_offset=result.queue_offset,
        batch_uniq_id=extra.get("batch_uniq_id"),
    )
    return cmd.response(ext_fields=header.to_ext())


async def store_message(
    ctx: BrokerContext,
    topic: str,
    queue_id: int,
    body: bytes,
    properties: Mapping[str, str],
    flag: int,
    sys_flag: int,
    born_timestamp: int,
    born_host: tuple[str, int],
    reconsume_times: int,
    properties_text: str | None = None,
) -> tuple[PutResult, int]:
    """Store a message, or — when it is delayed or timed — park it in SCHEDULE_TOPIC_XXXX for
    the timer service, which copies it to ``topic``/``queue_id`` at its delivery time.
    Returns the put's result and the schedule queue (-1 when not scheduled)."""
    scheduled = _schedule(properties) if ctx.timers is not None else None
    if scheduled is not None:
        properties = {**properties, REAL_TOPIC: topic, REAL_QID: str(queue_id),
                      TIMER_OUT_MS: str(scheduled[1])}  # fmt: skip
        topic, queue_id, properties_text = SCHEDULE_TOPIC, scheduled[0], None
    msg = MessageToStore(
        topic, queue_id, body, properties, flag, sys_flag, born_timestamp, born_host,
        reconsume_times, 0, properties_text,
    )  # fmt: skip
    result = await ctx.storage.put(msg)
    if scheduled is None:
        return result, -1
    if result.ok and ctx.timers is not None:
        ctx.timers.scheduled(result, scheduled[0], scheduled[1])
    return result, scheduled[0]


async def send_message(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Store one message and answer with its msgId, queue and queue offset."""
    header = decode_request_header(cmd)
    assert isinstance(header, SendMessageRequestHeader)
    config = topic_for_send(ctx, header)
    topic, queue_id = _target(ctx, header, config, _queue_id(config, header.queue_id))
    properties = decode_properties(header.properties or "")
    text = header.properties if topic == header.topic else None
    result, _ = await store_message(
        ctx, topic, queue_id, cmd.body, properties, header.flag, header.sys_flag,
        header.born_timestamp, _born_host(conn), header.reconsume_times or 0, text,
    )  # fmt: skip
    return _reply(cmd, result, queue_id)


async def send_batch(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Store every message of a batch in one queue; msgIds and UNIQ_KEYs comma-joined."""
    header = decode_request_header(cmd)
    assert isinstance(header, SendMessageRequestHeader)
    config = topic_for_send(ctx, header)
    queue_id = _queue_id(config, header.queue_id)
    entries = decode_batch(cmd.body)
    if not entries:
        raise _fail(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
    # Every check before the first append, and the batch appended as one unit: a refused
    # batch stores nothing, and its messages get consecutive queue offsets.
    limit = ctx.config.max_message_size
    born = _born_host(conn)
    messages: list[MessageToStore] = []
    for entry in entries:
        _check_delay(entry.properties)
        if len(entry.body) > limit:
            raise _fail(
                ResponseCode.MESSAGE_ILLEGAL,
                f"batch message {len(messages)}: body of {len(entry.body)} bytes exceeds {limit}",
            )
        messages.append(MessageToStore(
            header.topic, queue_id, entry.body, entry.properties, entry.flag, header.sys_flag,
            header.born_timestamp, born, 0, 0, encode_properties(entry.properties),
        ))  # fmt: skip
    results = await ctx.storage.put_many(messages)
    if not results[-1].ok:
        return _reply(cmd, results[-1], queue_id)
    uniq = [entry.properties.get(UNIQ_KEY, "") for entry in entries]
    first = results[0]
    return _reply(
        cmd,
        first,
        queue_id,
        msg_id=",".join(r.msg_id for r in results),
        batch_uniq_id=",".join(uniq),
    )
