"""Pop, ack and change-invisible-time over the test client, as a RocketMQ 5 client sends them."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.bodies.ack import BatchAck, BatchAckMessageRequestBody
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.pop import (
    AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader,
    ChangeInvisibleTimeResponseHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
)
from protocol.message import MessageExt, decode_records
from protocol.receipt import ExtraInfo, parse_start_offset_info, pop_receipt
from tests.broker.client import BrokerClient

BROKER = "broker-a"


@dataclass
class Popped:
    """One popped message and its receipt."""

    msg: MessageExt
    receipt: ExtraInfo
    #: The topic to ack on (the retry topic for a retried message).
    real_topic: str


async def pop(
    client: BrokerClient,
    group: str,
    topic: str,
    *,
    queue_id: int = -1,
    max_nums: int = 32,
    invisible_ms: int = 60_000,
    poll_ms: int = 0,
    order: bool = False,
    attempt_id: str | None = None,
    exp: str | None = None,
    exp_type: str | None = None,
    timeout: float = 30,  # noqa: ASYNC109
) -> tuple[RemotingCommand, list[Popped]]:
    """One POP_MESSAGE; the reply and its messages with receipts (empty unless SUCCESS)."""
    header = PopMessageRequestHeader(
        consumer_group=group, topic=topic, queue_id=queue_id, max_msg_nums=max_nums,
        invisible_time=invisible_ms, poll_time=poll_ms, born_time=0, init_mode=0,
        exp_type=exp_type or ("TAG" if exp else None), exp=exp, order=order,
        attempt_id=attempt_id,
    )  # fmt: skip
    reply = await client.call(RequestCode.POP_MESSAGE, header.to_ext(), timeout=timeout)
    return reply, popped_of(reply, group)


def popped_of(reply: RemotingCommand, group: str) -> list[Popped]:
    """The messages of a POP_MESSAGE reply with the receipts a Java client rebuilds from its
    header (empty unless SUCCESS)."""
    if reply.code != ResponseCode.SUCCESS:
        return []
    head = PopMessageResponseHeader.from_ext(reply.ext_fields)
    starts = parse_start_offset_info(head.start_offset_info or "")
    out = []
    for msg in decode_records(reply.body):
        receipt = pop_receipt(
            msg.topic, msg.queue_id, msg.queue_offset, msg.properties, pop_time=head.pop_time,
            invisible_time=head.invisible_time, revive_qid=head.revive_qid,
            start_offsets=starts, broker_name=BROKER,
        )  # fmt: skip
        out.append(Popped(msg, receipt, receipt.real_topic(msg.topic, group)))
    return out


async def ack(client: BrokerClient, group: str, popped: Popped) -> RemotingCommand:
    """ACK_MESSAGE with the popped message's receipt, as the Java client sends it."""
    header = AckMessageRequestHeader(
        consumer_group=group, topic=popped.real_topic, queue_id=popped.msg.queue_id,
        extra_info=popped.receipt.encode(), offset=popped.msg.queue_offset,
    )  # fmt: skip
    return await client.call(RequestCode.ACK_MESSAGE, header.to_ext())


async def batch_ack(client: BrokerClient, group: str, popped: list[Popped]) -> RemotingCommand:
    """BATCH_ACK_MESSAGE of messages popped together from one queue."""
    acks = []
    for p in popped:
        r = p.receipt
        acks.append(BatchAck(
            consumer_group=group, topic=p.msg.topic, start_offset=r.ck_queue_offset,
            queue_id=r.queue_id, revive_queue_id=r.revive_qid, pop_time=r.pop_time_ms,
            invisible_time=r.invisible_time_ms, retry=str(int(r.retry_flag)),
            offsets=(p.msg.queue_offset,),
        ))  # fmt: skip
    body = BatchAckMessageRequestBody(broker_name=BROKER, acks=tuple(acks))
    return await client.call(RequestCode.BATCH_ACK_MESSAGE, body=body.to_json())


async def change_invisible(
    client: BrokerClient, group: str, popped: Popped, invisible_ms: int
) -> tuple[RemotingCommand, Popped | None]:
    """CHANGE_MESSAGE_INVISIBLETIME; on success the message with its new receipt."""
    header = ChangeInvisibleTimeRequestHeader(
        consumer_group=group, topic=popped.real_topic, queue_id=popped.msg.queue_id,
        extra_info=popped.receipt.encode(), offset=popped.msg.queue_offset,
        invisible_time=invisible_ms,
    )  # fmt: skip
    reply = await client.call(RequestCode.CHANGE_MESSAGE_INVISIBLETIME, header.to_ext())
    if reply.code != ResponseCode.SUCCESS:
        return reply, None
    head = ChangeInvisibleTimeResponseHeader.from_ext(reply.ext_fields)
    r = popped.receipt
    new = ExtraInfo(r.ck_queue_offset, head.pop_time, head.invisible_time, head.revive_qid,
                    r.retry_flag, r.broker_name, r.queue_id, r.queue_offset)  # fmt: skip
    return reply, Popped(popped.msg, new, popped.real_topic)
