"""The classic-consumer requests a pull-mode push consumer sends: PULL_MESSAGE, consumer
offsets, queue offsets, GET_CONSUMER_LIST_BY_GROUP, CONSUMER_SEND_MSG_BACK and the orderly
queue locks. Each function builds one request, sends it through the client instance and reads
the reply; policy (when to call, what to do on failure) lives in the callers.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from client.errors import NoRouteError
from client.filters import FilterExpression, as_filter, raise_if_refused
from client.instance import ClientInstance, check
from client.message import ReceivedMessage
from protocol.bodies.consumer import (
    GetConsumerListByGroupResponseBody,
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    UnlockBatchRequestBody,
)
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.client import GetConsumerListByGroupRequestHeader
from protocol.headers.offsets import (
    GetMaxOffsetRequestHeader,
    GetMaxOffsetResponseHeader,
    GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader,
    QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
)
from protocol.headers.pull import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    build_pull_sys_flag,
)
from protocol.headers.send import ConsumerSendMsgBackRequestHeader
from protocol.message import decode_records

#: Pull answers that carry no messages but a valid next offset.
NOT_FOUND_CODES = frozenset({ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY})


@dataclass(frozen=True, slots=True)
class PullResult:
    """One pull's answer: ``code`` is SUCCESS (found), PULL_NOT_FOUND,
    PULL_RETRY_IMMEDIATELY (nothing matched the filter) or PULL_OFFSET_MOVED."""

    code: int
    messages: list[ReceivedMessage]
    next_offset: int
    min_offset: int
    max_offset: int


def _address(instance: ClientInstance, broker_name: str) -> str:
    address = instance.broker_address(broker_name)
    if address is None:
        raise NoRouteError(f"no address known for broker {broker_name!r}")
    return address


async def pull(
    instance: ClientInstance,
    group: str,
    mq: MessageQueue,
    offset: int,
    *,
    max_messages: int,
    max_bytes: int | None,
    commit_offset: int | None,
    expression: str | FilterExpression,
    suspend_ms: int,
) -> PullResult:
    """PULL_MESSAGE with long polling (``suspend_ms``; 0 = answer at once) and a piggy-backed
    offset commit (``None``: commit nothing); ``max_bytes`` caps the reply body if given.
    ``expression`` travels as the pull's own subscription (a ``str`` is a TAG expression),
    with its type as ``expressionType``.

    Raises:
        SubscriptionRefusedError: the broker refused the filter.
        BrokerError: any answer but found / not found / retry / offset moved.
        ClientError: the broker could not be reached in time.
    """
    wanted = as_filter(expression)
    header = PullMessageRequestHeader(
        consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset,
        max_msg_nums=max_messages,
        sys_flag=build_pull_sys_flag(
            commit_offset=commit_offset is not None, suspend=suspend_ms > 0, subscription=True
        ),
        commit_offset=commit_offset if commit_offset is not None else 0,
        suspend_timeout_millis=suspend_ms, subscription=wanted.wire_expression,
        sub_version=int(time.time() * 1000), expression_type=wanted.type.value,
        max_msg_bytes=max_bytes,
    )  # fmt: skip
    cmd = instance.request(RequestCode.PULL_MESSAGE, header.to_ext())
    # Java: CONSUMER_TIMEOUT_MILLIS_WHEN_SUSPEND = 30 s for a 15 s hold; we give the hold
    # plus one request timeout.
    timeout = suspend_ms / 1000 + instance.config.request_timeout
    reply = await instance.remoting.invoke(_address(instance, mq.broker_name), cmd, timeout)
    raise_if_refused(reply, mq.topic, mq.broker_name, wanted)
    moved = reply.code == ResponseCode.PULL_OFFSET_MOVED
    if reply.code not in NOT_FOUND_CODES and not moved:
        check(reply)
    head = PullMessageResponseHeader.from_ext(reply.ext_fields)
    messages = []
    if reply.code == ResponseCode.SUCCESS:
        messages = [ReceivedMessage.of(r, mq.broker_name) for r in decode_records(reply.body)]
    return PullResult(reply.code, messages, head.next_begin_offset, head.min_offset,
                      head.max_offset)  # fmt: skip


async def query_offset(instance: ClientInstance, group: str, mq: MessageQueue) -> int | None:
    """The group's committed offset on ``mq``, ``None`` if it never committed one."""
    header = QueryConsumerOffsetRequestHeader(
        consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, set_zero_if_not_found=False
    )
    cmd = instance.request(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())
    reply = await instance.remoting.invoke(_address(instance, mq.broker_name), cmd)
    if reply.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    return QueryConsumerOffsetResponseHeader.from_ext(check(reply).ext_fields).offset


async def update_offset(
    instance: ClientInstance, group: str, mq: MessageQueue, offset: int
) -> None:
    """Commit ``offset`` for the group on ``mq`` (UPDATE_CONSUMER_OFFSET)."""
    header = UpdateConsumerOffsetRequestHeader(
        consumer_group=group, topic=mq.topic, queue_id=mq.queue_id, commit_offset=offset
    )
    cmd = instance.request(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext())
    await instance.call(_address(instance, mq.broker_name), cmd)


async def queue_offset(instance: ClientInstance, mq: MessageQueue, *, first: bool) -> int:
    """The queue's first stored offset (``first``) or one past its last (GET_MIN/MAX_OFFSET)."""
    address = _address(instance, mq.broker_name)
    if first:
        cmd = instance.request(
            RequestCode.GET_MIN_OFFSET,
            GetMinOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id).to_ext(),
        )
        return GetMinOffsetResponseHeader.from_ext(
            (await instance.call(address, cmd)).ext_fields
        ).offset
    cmd = instance.request(
        RequestCode.GET_MAX_OFFSET,
        GetMaxOffsetRequestHeader(topic=mq.topic, queue_id=mq.queue_id).to_ext(),
    )
    return GetMaxOffsetResponseHeader.from_ext(
        (await instance.call(address, cmd)).ext_fields
    ).offset


async def consumer_ids(instance: ClientInstance, group: str, broker_name: str) -> list[str]:
    """The client ids of ``group`` as ``broker_name`` knows them from heartbeats."""
    header = GetConsumerListByGroupRequestHeader(consumer_group=group)
    cmd = instance.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, header.to_ext())
    reply = await instance.call(_address(instance, broker_name), cmd)
    return list(GetConsumerListByGroupResponseBody.from_json(reply.body).consumer_id_list)


async def send_back(
    instance: ClientInstance,
    group: str,
    message: ReceivedMessage,
    *,
    delay_level: int,
    max_reconsume_times: int,
) -> None:
    """CONSUMER_SEND_MSG_BACK: the broker re-queues the message on ``%RETRY%group`` (delay
    level 0: ``3 + reconsume times``), or on ``%DLQ%group`` when ``delay_level`` < 0 or the
    message was consumed ``max_reconsume_times`` times already.

    The broker finds the message by its commit-log offset on the broker it came from.
    """
    header = ConsumerSendMsgBackRequestHeader(
        offset=message.record.commit_log_offset, group=group, delay_level=delay_level,
        origin_msg_id=message.message_id, origin_topic=message.topic,
        max_reconsume_times=max_reconsume_times,
    )  # fmt: skip
    cmd = instance.request(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext())
    await instance.call(_address(instance, message.broker_name), cmd)


async def lock_batch(
    instance: ClientInstance, group: str, broker_name: str, mqs: Collection[MessageQueue]
) -> set[MessageQueue]:
    """LOCK_BATCH_MQ: lock (or renew) ``mqs`` for this client; returns the ones it holds."""
    body = LockBatchRequestBody(group, instance.client_id, tuple(mqs), only_this_broker=True)
    cmd = instance.request(RequestCode.LOCK_BATCH_MQ, body=body.to_json())
    reply = await instance.call(_address(instance, broker_name), cmd)
    return set(LockBatchResponseBody.from_json(reply.body).lock_ok_mq_set)


async def unlock_batch(
    instance: ClientInstance, group: str, broker_name: str, mqs: Collection[MessageQueue]
) -> None:
    """UNLOCK_BATCH_MQ: release this client's locks on ``mqs``."""
    body = UnlockBatchRequestBody(group, instance.client_id, tuple(mqs), only_this_broker=True)
    cmd = instance.request(RequestCode.UNLOCK_BATCH_MQ, body=body.to_json())
    await instance.call(_address(instance, broker_name), cmd)
