"""Pop family (RocketMQ 5): POP_MESSAGE (200050), ACK_MESSAGE (200051) and
CHANGE_MESSAGE_INVISIBLETIME (200053), requests and responses.

``extraInfo`` (the receipt handle) and the ``*OffsetInfo`` strings are kept as strings here;
``protocol.receipt`` parses them. BATCH_ACK_MESSAGE has no header: its acks are a JSON body.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.headers._base import Header, Long

#: ``ConsumeInitMode``: where a group with no offset starts popping.
INIT_MODE_MIN = 0
INIT_MODE_MAX = 1
#: ``isTimeoutTooMuch``: a request that spent longer than this beyond its ``pollTime`` (by
#: the client's clock) is answered POLLING_TIMEOUT instead of being served.
POP_TIMEOUT_SLACK_MS = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class PopMessageRequestHeader(Header):
    """``PopMessageRequestHeader``.

    Attributes:
        consumer_group: the popping group.
        topic: the topic.
        queue_id: one queue, or -1 (any negative value) for all queues.
        max_msg_nums: at most this many messages (the broker refuses more than 32).
        invisible_time: ms the popped messages stay invisible before they are revived.
        poll_time: ms the broker may hold the request when nothing is available.
        born_time: client clock when the request was sent, in ms.
        init_mode: :data:`INIT_MODE_MIN` or :data:`INIT_MODE_MAX`, for a new group.
        exp_type: ``TAG`` or ``SQL92``.
        exp: the filter expression.
        order: orderly pop. Java initialises the field to false, so it is always sent.
        attempt_id: client retry token for orderly pop.
    """

    consumer_group: str
    topic: str
    queue_id: int
    max_msg_nums: int
    invisible_time: Long
    poll_time: Long
    born_time: Long
    init_mode: int
    exp_type: str | None = None
    exp: str | None = None
    order: bool = False
    attempt_id: str | None = None

    @property
    def any_queue(self) -> bool:
        """True when the client lets the broker choose among all queues (queue id < 0)."""
        return self.queue_id < 0

    def is_timeout_too_much(self, now_ms: int) -> bool:
        """Java's ``isTimeoutTooMuch``: ``now - bornTime - pollTime > 500``.

        The client's clock (``born_time``) is compared with the broker's, as in Java.
        """
        return now_ms - self.born_time - self.poll_time > POP_TIMEOUT_SLACK_MS


@dataclass(frozen=True, slots=True, kw_only=True)
class PopMessageResponseHeader(Header):
    """``PopMessageResponseHeader``.

    Attributes:
        pop_time: broker clock when the messages were popped, in ms.
        invisible_time: echo of the request's invisible time.
        revive_qid: revive queue holding the checkpoint (999 for orderly pop).
        rest_num: messages still available after this batch.
        start_offset_info: ``retry queueId startOffset`` entries joined by ``;``.
        msg_offset_info: ``retry queueId off1,off2,…`` entries joined by ``;``.
        order_count_info: per-message consume counts, orderly pop only.
    """

    pop_time: Long
    invisible_time: Long
    revive_qid: int
    rest_num: Long
    start_offset_info: str | None = None
    msg_offset_info: str | None = None
    order_count_info: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AckMessageRequestHeader(Header):
    """``AckMessageRequestHeader``: acknowledge one popped message.

    Attributes:
        consumer_group: the group.
        topic: the real topic of the message (the retry topic for a retried message).
        queue_id: its queue.
        extra_info: the receipt (``POP_CK``) of the pop that returned it.
        offset: its queue offset.
    """

    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: Long


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeInvisibleTimeRequestHeader(Header):
    """``ChangeInvisibleTimeRequestHeader``: push a popped message's revive time back.

    Attributes:
        consumer_group: the group.
        topic: the real topic of the message.
        queue_id: its queue.
        extra_info: its receipt.
        offset: its queue offset.
        invisible_time: new invisible time, in ms from now.
        lite_topic: RocketMQ 5.4 lite topics.
    """

    consumer_group: str
    topic: str
    queue_id: int
    extra_info: str
    offset: Long
    invisible_time: Long
    lite_topic: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeInvisibleTimeResponseHeader(Header):
    """``ChangeInvisibleTimeResponseHeader``: the client rebuilds the receipt from these."""

    pop_time: Long
    invisible_time: Long
    revive_qid: int
