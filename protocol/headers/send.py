"""Send family: SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320), the reply
variants (324/325), their response, and CONSUMER_SEND_MSG_BACK (36).

SEND_MESSAGE carries ``SendMessageRequestHeader`` with long field names; the V2 codes carry
``SendMessageRequestHeaderV2``, the same fields under one-letter names (Java: "to speed up
FastJson deserialization"). Both decode to the one typed :class:`SendMessageRequestHeader`:
use :func:`send_header_from_v2_ext` / :func:`send_header_to_v2_ext` (or the methods of the
same meaning) for the V2 codes, as Java's ``SendMessageRequestHeader.parseRequestHeader``
does. ``protocol.headers.decode_request_header`` picks the right one by request code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from protocol.codes import RequestCode
from protocol.headers._base import Codec, Header, Long, meta


@dataclass(frozen=True, slots=True, kw_only=True)
class SendMessageRequestHeader(Header):
    """``SendMessageRequestHeader`` (V1 names; V2 one-letter names via the V2 functions).

    Attributes:
        producer_group: the sending producer's group.
        topic: the target topic.
        default_topic: the topic whose config is copied when ``topic`` is auto-created
            (``TBW102``).
        default_topic_queue_nums: queue count for an auto-created topic.
        queue_id: target queue.
        sys_flag: ``MessageSysFlag`` bits (compression, transaction type, …).
        born_timestamp: producer clock at send, in ms.
        flag: the application's message flag, stored as is.
        properties: ``key\\x01value\\x02…`` message properties.
        reconsume_times: for sends of retried messages (Java reads ``None`` as 0).
        unit_mode: Java reads ``None`` as false.
        batch: Java reads ``None`` as false; SEND_BATCH_MESSAGE sets it.
        max_reconsume_times: the consumer's retry limit, for retry sends.
        broker_name: the logical broker name (``bname`` in V1, inherited from
            ``RpcRequestHeader``; ``n`` in V2).
    """

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: Long
    flag: int
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool | None = None
    batch: bool | None = None
    max_reconsume_times: int | None = None
    broker_name: str | None = field(default=None, metadata=meta(wire="bname"))

    @property
    def is_unit_mode(self) -> bool:
        """Java's ``isUnitMode()``: absent means false."""
        return self.unit_mode is True

    @property
    def is_batch(self) -> bool:
        """Java's ``isBatch()``: absent means false."""
        return self.batch is True

    @classmethod
    def from_v2_ext(cls, ext: Mapping[str, str]) -> SendMessageRequestHeader:
        """Decode ``SendMessageRequestHeaderV2`` one-letter ``extFields``.

        Raises:
            FieldError: names the one-letter field and its long name.
        """
        return _V2.decode(ext)

    def to_v2_ext(self) -> dict[str, str]:
        """Encode with ``SendMessageRequestHeaderV2``'s one-letter names."""
        return _V2.encode(self)


#: ``SendMessageRequestHeaderV2`` wire name of each field (``createSendMessageRequestHeaderV1``).
V2_WIRE_NAMES: Mapping[str, str] = MappingProxyType(
    {
        "producer_group": "a",
        "topic": "b",
        "default_topic": "c",
        "default_topic_queue_nums": "d",
        "queue_id": "e",
        "sys_flag": "f",
        "born_timestamp": "g",
        "flag": "h",
        "properties": "i",
        "reconsume_times": "j",
        "unit_mode": "k",
        "max_reconsume_times": "l",
        "batch": "m",
        "broker_name": "n",
    }
)

_V2: Codec[SendMessageRequestHeader] = Codec(
    SendMessageRequestHeader, wire_names=V2_WIRE_NAMES, label="SendMessageRequestHeaderV2"
)

#: Request codes whose header uses the V2 one-letter names.
V2_SEND_CODES: frozenset[int] = frozenset(
    {RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2}
)


def send_header_from_v2_ext(ext: Mapping[str, str]) -> SendMessageRequestHeader:
    """Decode the one-letter ``extFields`` of SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE.

    Raises:
        FieldError: ``field`` is the one-letter name; the message also gives the long name.
    """
    return _V2.decode(ext)


def send_header_to_v2_ext(header: SendMessageRequestHeader) -> dict[str, str]:
    """Encode a send header with the V2 one-letter names."""
    return _V2.encode(header)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendMessageResponseHeader(Header):
    """``SendMessageResponseHeader``: where the message was stored.

    Attributes:
        msg_id: the offset message id (32 hex characters: store host + commit-log offset;
            comma-separated ids for a batch).
        queue_id: the queue it was appended to.
        queue_offset: its consume-queue offset (of the first message of a batch).
        transaction_id: for half (prepared) messages.
        batch_uniq_id: the ``UNIQ_KEY`` ids of a batch, comma-separated.
        recall_handle: handle for recalling a delayed message (5.3+).
        delay_time: (5.3+) when a delayed message is due.
    """

    msg_id: str
    queue_id: int
    queue_offset: Long
    transaction_id: str | None = None
    batch_uniq_id: str | None = None
    recall_handle: str | None = None
    delay_time: Long | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerSendMsgBackRequestHeader(Header):
    """``ConsumerSendMsgBackRequestHeader``: a consumer returns a message it failed to consume.

    Attributes:
        offset: the message's commit-log (physical) offset; the broker finds it by this.
        group: the consumer group (whose ``%RETRY%`` topic receives the copy).
        delay_level: 0 = let the broker pick (3 + reconsume times); < 0 = straight to DLQ.
        origin_msg_id: the message id as the client knows it (client-cpp 2.1 sends
            ``UNIQ_KEY``, ali-ons the offset id).
        origin_topic: the topic it was consumed from (client-cpp 1.x omits it).
        unit_mode: Java's primitive ``boolean``: always sent, absent reads as false.
        max_reconsume_times: the consumer's retry limit (broker default 16 when absent).
    """

    offset: Long
    group: str
    delay_level: int
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None
