"""``BATCH_ACK_MESSAGE`` (200151) body: several pop acks per request, as bit sets.

``remoting/.../protocol/body/BatchAck.java`` names its fields with ``@JSONField(name=…,
alternateNames=…)``: fastjson writes the short names ``c t r so q rq pt it b`` and reads the
long ones (``consumerGroup``, ``topic``, ``retry``, ``startOffset``, ``queueId``,
``reviveQueueId``, ``popTime``, ``invisibleTime``, ``bitSet``) too; so do we.

``b`` is a ``java.util.BitSet`` written by RocketMQ's ``BitSetSerializerDeserializer`` (both
its fastjson 1 and fastjson 2 versions) as ``Base64(bitSet.toByteArray())``: bit ``i`` is bit
``i % 8`` (least significant first) of byte ``i // 8``, trailing zero bytes trimmed, and bit
``i`` set means offset ``startOffset + i`` is acked. fastjson 2's plain ``writeBinary`` writes
the same bytes as a JSON array of signed numbers instead; that form is accepted too.

``r`` is the retry flag of the receipt (``ExtraInfoUtil``): ``"0"`` normal topic, ``"1"``
V1 retry topic, ``"2"`` V2 retry topic.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Self

from protocol.bodies._fields import Fields, JsonBody, as_int, as_list, kind
from protocol.errors import EncodeError, FieldError

#: Largest bit set accepted, in bytes (65536 offsets past the checkpoint's start). A real
#: batch covers one pop (at most a few dozen offsets); the cap keeps a hostile body from
#: expanding into millions of offsets.
MAX_BITSET_BYTES: Final = 8192
_MAX_BITS = MAX_BITSET_BYTES * 8

RETRY_NORMAL: Final = "0"
RETRY_V1: Final = "1"
RETRY_V2: Final = "2"


def _bits(start_offset: int, raw: bytes) -> list[int]:
    return [
        start_offset + index * 8 + bit
        for index, byte in enumerate(raw)
        if byte
        for bit in range(8)
        if byte >> bit & 1
    ]


def _b64_bytes(b64: str, path: str) -> bytes:
    if len(b64) > (MAX_BITSET_BYTES + 2) // 3 * 4:
        raise FieldError(f"{path}: bit set longer than {MAX_BITSET_BYTES} bytes", field=path)
    try:
        # Java's decoder accepts missing padding; Python's wants it.
        return base64.b64decode(b64 + "=" * (-len(b64) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FieldError(f"{path}: not base64: {exc}", field=path) from None


def bitset_to_offsets(start_offset: int, b64: str) -> list[int]:
    """The acked offsets of a base64 ``BitSet.toByteArray()``, ascending.

    Raises:
        FieldError: ``b64`` is not base64 or longer than :data:`MAX_BITSET_BYTES`.
    """
    return _bits(start_offset, _b64_bytes(b64, "b"))


def offsets_to_bitset(start_offset: int, offsets: Iterable[int]) -> str:
    """The base64 ``BitSet.toByteArray()`` that acks ``offsets`` from ``start_offset``.

    Raises:
        EncodeError: an offset is below ``start_offset`` or too far above it.
    """
    indexes = [offset - start_offset for offset in offsets]
    if not indexes:
        return ""
    if min(indexes) < 0 or max(indexes) >= _MAX_BITS:
        raise EncodeError(f"offsets must lie in [{start_offset}, {start_offset + _MAX_BITS})")
    raw = bytearray(max(indexes) // 8 + 1)  # ends on a non-zero byte, like toByteArray()
    for index in indexes:
        raw[index // 8] |= 1 << (index % 8)
    return base64.b64encode(raw).decode("ascii")


def _read_bitset(value: object, path: str) -> bytes:
    """``b`` as base64 text (RocketMQ's serializer) or a number array (fastjson 2 default)."""
    if value is None:
        return b""
    if type(value) is str:
        return _b64_bytes(value, path)
    items = as_list(value, path)
    if len(items) > MAX_BITSET_BYTES:
        raise FieldError(f"{path}: bit set longer than {MAX_BITSET_BYTES} bytes", field=path)
    return bytes(as_int(item, at, (-128, 255)) & 0xFF for item, at in items)


def _read_retry(f: Fields) -> str:
    value, path = f.get("r", "retry")
    if value is None:
        return RETRY_NORMAL  # Java's getRealTopic treats a null flag as a normal topic
    if type(value) is int:
        return str(value)  # fastjson turns a number into a String field's text
    if type(value) is str:
        return value
    raise FieldError(f"{path}: expected a string, got {kind(value)}", field=path)


@dataclass(frozen=True, slots=True)
class BatchAck(JsonBody):
    """The acks of one pop checkpoint: which offsets from ``start_offset`` are done.

    ``offsets`` are absolute queue offsets; they are kept sorted and unique.
    """

    consumer_group: str
    topic: str
    start_offset: int
    queue_id: int
    revive_queue_id: int
    pop_time: int
    invisible_time: int
    retry: str = RETRY_NORMAL
    offsets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        # Canonical order, so that equal acks compare equal however they were built.
        object.__setattr__(self, "offsets", tuple(sorted(set(self.offsets))))

    @property
    def bit_set(self) -> str:
        """``b`` as it travels: base64 of the Java ``BitSet`` bytes."""
        return offsets_to_bitset(self.start_offset, self.offsets)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object (short or long field names)."""
        f = Fields(obj, path)
        start = f.int64("so", None, "startOffset")
        raw, at = f.get("b", "bitSet")
        return cls(
            consumer_group=f.text("c", "consumerGroup"),
            topic=f.text("t", "topic"),
            start_offset=start,
            queue_id=f.int32("q", None, "queueId"),
            revive_queue_id=f.int32("rq", None, "reviveQueueId"),
            pop_time=f.int64("pt", None, "popTime"),
            invisible_time=f.int64("it", None, "invisibleTime"),
            retry=_read_retry(f),
            offsets=tuple(_bits(start, _read_bitset(raw, at))),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object with the short names, in fastjson's (alphabetical) order."""
        return {
            "b": self.bit_set,
            "c": self.consumer_group,
            "it": self.invisible_time,
            "pt": self.pop_time,
            "q": self.queue_id,
            "r": self.retry,
            "rq": self.revive_queue_id,
            "so": self.start_offset,
            "t": self.topic,
        }


@dataclass(frozen=True, slots=True)
class BatchAckMessageRequestBody(JsonBody):
    """The body of ``BATCH_ACK_MESSAGE``: the acking broker's name and its acks."""

    broker_name: str
    acks: tuple[BatchAck, ...] = ()

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            broker_name=f.text("brokerName"),
            acks=tuple(BatchAck.from_obj(item, at) for item, at in f.items("acks")),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {"brokerName": self.broker_name, "acks": [ack.to_obj() for ack in self.acks]}
