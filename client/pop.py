"""Pop, ack and change-invisible-time requests and replies (RocketMQ 5's pop consumption).

Shared by :class:`~client.simple_consumer.SimpleConsumer` and the push consumer's pop mode.
The functions here build commands and read replies without I/O; :class:`PopSession` sends
them through a :class:`~client.instance.ClientInstance`. Receipts are rebuilt exactly as the
Java client does (``protocol.receipt.pop_receipt``) and travel inside
:class:`~client.message.ReceivedMessage` as the encoded ``ExtraInfo`` text.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import anyio

from client.filters import FilterExpression, as_filter, raise_if_refused
from client.instance import ClientInstance, check
from client.message import ReceivedMessage
from protocol.bodies.ack import BatchAck, BatchAckMessageRequestBody
from protocol.bodies.consumer import MessageQueue
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import ReceiptError, TrimqError
from protocol.headers.pop import (
    INIT_MODE_MAX,
    INIT_MODE_MIN,
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
)
from protocol.message import decode_records
from protocol.receipt import (
    MAX_POP_MESSAGES,
    ExtraInfo,
    RetryFlag,
    order_count_for,
    parse_order_count_info,
    parse_start_offset_info,
    pop_receipt,
)

#: The broker's most messages per pop.
#: Answers of a pop that mean "nothing for you now", not a failure.
EMPTY_CODES = frozenset(
    {ResponseCode.NO_MESSAGE, ResponseCode.POLLING_TIMEOUT, ResponseCode.PULL_NOT_FOUND}
)


def pop_request(
    instance: ClientInstance,
    group: str,
    topic: str,
    *,
    queue_id: int = -1,
    max_messages: int,
    invisible_ms: int,
    poll_ms: int,
    expression: str | FilterExpression = "*",
    order: bool = False,
    attempt_id: str | None = None,
    from_first: bool = False,
) -> RemotingCommand:
    """POP_MESSAGE for ``group`` on ``topic`` (all queues of one broker when ``queue_id`` is -1).

    A new group starts at the end of the queues (``INIT_MODE_MAX``), as a RocketMQ 5 consumer,
    unless ``from_first`` (``INIT_MODE_MIN``). ``expression`` is the filter (a ``str`` is a TAG
    expression); its type travels as ``expType`` (``TAG`` or ``SQL92``).
    """
    if not 1 <= max_messages <= MAX_POP_MESSAGES:
        raise ValueError(f"max_messages must be 1..{MAX_POP_MESSAGES}, not {max_messages}")
    if invisible_ms <= 0:
        raise ValueError("invisible duration must be positive")
    wanted = as_filter(expression)
    header = PopMessageRequestHeader(
        consumer_group=group,
        topic=topic,
        queue_id=queue_id,
        max_msg_nums=max_messages,
        invisible_time=invisible_ms,
        poll_time=poll_ms,
        born_time=int(time.time() * 1000),
        init_mode=INIT_MODE_MIN if from_first else INIT_MODE_MAX,
        exp_type=wanted.type.value,
        exp=wanted.wire_expression,
        order=order,
        attempt_id=attempt_id,
    )
    return instance.request(RequestCode.POP_MESSAGE, header.to_ext())


def read_pop_reply(reply: RemotingCommand, group: str, broker_name: str) -> list[ReceivedMessage]:
    """The messages of a pop reply with their receipts; empty for "no message" answers.

    Raises:
        BrokerError: any other non-SUCCESS answer.
    """
    if reply.code in EMPTY_CODES:
        return []
    check(reply)
    head = PopMessageResponseHeader.from_ext(reply.ext_fields)
    starts = parse_start_offset_info(head.start_offset_info or "")
    counts = parse_order_count_info(head.order_count_info or "")
    out = []
    for record in decode_records(reply.body):
        receipt = pop_receipt(
            record.topic, record.queue_id, record.queue_offset, record.properties,
            pop_time=head.pop_time, invisible_time=head.invisible_time,
            revive_qid=head.revive_qid, start_offsets=starts, broker_name=broker_name,
        )  # fmt: skip
        if counts:
            count = order_count_for(
                counts, RetryFlag.of_topic(record.topic), record.queue_id, record.queue_offset
            )
            if count is not None and count > record.reconsume_times:
                record = dataclasses.replace(record, reconsume_times=count)
        out.append(ReceivedMessage.of(record, broker_name, receipt.encode()))
    return out


def receipt_of(message: ReceivedMessage) -> ExtraInfo:
    """The pop receipt a message was received with.

    Raises:
        ReceiptError: the message was not popped (pulled messages have no receipt) or its
            receipt is malformed.
    """
    if message.receipt is None:
        raise ReceiptError("this message has no pop receipt (it was not received by pop)")
    return ExtraInfo.decode(message.receipt)


def ack_request(
    instance: ClientInstance, group: str, message: ReceivedMessage, receipt: ExtraInfo
) -> RemotingCommand:
    """ACK_MESSAGE for a popped message (on its real topic: the retry topic for a retry);
    ``receipt`` is the message's decoded receipt (:func:`receipt_of`)."""
    header = AckMessageRequestHeader(
        consumer_group=group,
        topic=receipt.real_topic(message.record.topic, group),
        queue_id=message.record.queue_id,
        extra_info=message.receipt or "",
        offset=message.record.queue_offset,
    )
    return instance.request(RequestCode.ACK_MESSAGE, header.to_ext())


def batch_ack_requests(
    instance: ClientInstance, group: str, messages: Sequence[ReceivedMessage]
) -> dict[str, RemotingCommand]:
    """BATCH_ACK_MESSAGE per broker: messages popped together from one queue share one
    entry (their offsets listed), as the Java client groups them."""
    entries: dict[str, dict[tuple[object, ...], list[int]]] = {}
    for message in messages:
        r = receipt_of(message)
        key = (message.record.topic, r.ck_queue_offset, r.queue_id, r.revive_qid,
               r.pop_time_ms, r.invisible_time_ms, int(r.retry_flag))  # fmt: skip
        entries.setdefault(r.broker_name, {}).setdefault(key, []).append(
            message.record.queue_offset
        )
    out = {}
    for broker, groups in entries.items():
        acks = tuple(
            BatchAck(
                consumer_group=group, topic=str(topic), start_offset=int(str(start)),
                queue_id=int(str(qid)), revive_queue_id=int(str(rqid)),
                pop_time=int(str(pop)), invisible_time=int(str(inv)), retry=str(flag),
                offsets=tuple(offsets),
            )
            for (topic, start, qid, rqid, pop, inv, flag), offsets in groups.items()
        )  # fmt: skip
        body = BatchAckMessageRequestBody(broker_name=broker, acks=acks)
        out[broker] = instance.request(RequestCode.BATCH_ACK_MESSAGE, body=body.to_json())
    return out


def change_request(
    instance: ClientInstance,
    group: str,
    message: ReceivedMessage,
    receipt: ExtraInfo,
    invisible_ms: int,
) -> RemotingCommand:
    """CHANGE_MESSAGE_INVISIBLETIME: make a popped message invisible for ``invisible_ms`` more
    (``receipt``: its decoded receipt)."""
    if invisible_ms <= 0:
        raise ValueError("invisible duration must be positive")
    header = ChangeInvisibleTimeRequestHeader(
        consumer_group=group,
        topic=receipt.real_topic(message.record.topic, group),
        queue_id=message.record.queue_id,
        extra_info=message.receipt or "",
        offset=message.record.queue_offset,
        invisible_time=invisible_ms,
    )
    return instance.request(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header.to_ext())


def changed_message(
    reply: RemotingCommand, message: ReceivedMessage, r: ExtraInfo
) -> ReceivedMessage:
    """The message with the new receipt a successful change-invisible-time reply gives
    (``r``: its old, decoded receipt)."""
    head = ChangeInvisibleTimeResponseHeader.from_ext(check(reply).ext_fields)
    new = ExtraInfo(r.ck_queue_offset, head.pop_time, head.invisible_time, head.revive_qid,
                    r.retry_flag, r.broker_name, r.queue_id, r.queue_offset)  # fmt: skip
    return dataclasses.replace(message, receipt=new.encode())


class PopSession:
    """Pop, ack and change for one consumer group through a client instance."""

    def __init__(self, instance: ClientInstance, group: str, *, from_first: bool = False) -> None:
        self.instance = instance
        self.group = group
        self.from_first = from_first

    def _address(self, broker_name: str) -> str:
        address = self.instance.broker_address(broker_name)
        if address is None:
            raise ReceiptError(f"unknown broker {broker_name!r} in receipt")
        return address

    async def pop(
        self,
        broker_name: str,
        topic: str,
        *,
        max_messages: int,
        invisible_ms: int,
        poll_ms: int,
        expression: str | FilterExpression = "*",
        queue_id: int = -1,
        order: bool = False,
    ) -> list[ReceivedMessage]:
        """One pop on one broker; returns at most ``max_messages`` (maybe none).

        Raises:
            SubscriptionRefusedError: the broker refused the filter (never retriable).
            BrokerError: another refusal.
        """
        wanted = as_filter(expression)
        cmd = pop_request(
            self.instance, self.group, topic, queue_id=queue_id, max_messages=max_messages,
            invisible_ms=invisible_ms, poll_ms=poll_ms, expression=wanted, order=order,
            from_first=self.from_first,
        )  # fmt: skip
        timeout = poll_ms / 1000 + self.instance.config.request_timeout
        reply = await self.instance.remoting.invoke(self._address(broker_name), cmd, timeout)
        raise_if_refused(reply, topic, broker_name, wanted)
        return read_pop_reply(reply, self.group, broker_name)

    async def ack(self, message: ReceivedMessage) -> None:
        """Acknowledge: the message will not come back.

        Raises:
            BrokerError: NO_MESSAGE when the receipt is stale (the message was revived or
                acked already), INVALID_PARAMETER for a malformed one.
        """
        receipt = receipt_of(message)
        cmd = ack_request(self.instance, self.group, message, receipt)
        await self.instance.call(self._address(receipt.broker_name), cmd)

    async def ack_many(self, messages: Sequence[ReceivedMessage]) -> None:
        """Acknowledge many messages with one BATCH_ACK_MESSAGE per broker (concurrently).
        Messages whose receipt went stale are skipped by the broker, not reported.

        Raises:
            ClientError, BrokerError: as :meth:`ack`, the first broker's failure (the other
                brokers' acknowledgements are still sent; further failures are added to its
                notes), never an exception group.
        """
        requests = batch_ack_requests(self.instance, self.group, messages)
        failures: list[TrimqError] = []

        async def ack_at(broker: str, cmd: RemotingCommand) -> None:
            try:
                await self.instance.call(self._address(broker), cmd)
            except TrimqError as exc:  # one broker's failure must not cancel the others'
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            for broker, cmd in requests.items():
                tg.start_soon(ack_at, broker, cmd)
        if failures:
            first = failures[0]
            for other in failures[1:]:
                first.add_note(f"and: {other}")
            raise first

    async def change_invisible(
        self, message: ReceivedMessage, invisible_ms: int
    ) -> ReceivedMessage:
        """Push the message's redelivery back; returns it with its new receipt (the old one
        no longer acks)."""
        receipt = receipt_of(message)
        cmd = change_request(self.instance, self.group, message, receipt, invisible_ms)
        address = self._address(receipt.broker_name)
        return changed_message(await self.instance.remoting.invoke(address, cmd), message, receipt)


def brokers_of(queues: Sequence[MessageQueue]) -> list[str]:
    """Distinct broker names of a queue list, in order."""
    return list(dict.fromkeys(q.broker_name for q in queues))
