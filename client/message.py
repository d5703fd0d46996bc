"""What applications send and receive.

:class:`Message` is what a producer sends; :class:`ReceivedMessage` is what a consumer gets
(a read-only view over the stored record, with the original topic for retried messages);
:class:`SendReceipt` is the broker's answer to a send.
"""

from __future__ import annotations

import enum
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protocol.bodies.consumer import MessageQueue
from protocol.message import (
    SYSFLAG_COMPRESSED,
    SYSFLAG_COMPRESSION_MASK,
    SYSFLAG_COMPRESSION_ZLIB,
    MessageExt,
)
from protocol.naming import is_retry_topic, validate_topic
from protocol.properties import (
    DELAY,
    KEYS,
    ORIGIN_TOPIC,
    RETRY_TOPIC,
    TAGS,
    TIMER_DELIVER_MS,
    UNIQ_KEY,
    join_keys,
)

#: RocketMQ's ``maxMessageSize`` for a body (``DefaultMQProducer``).
MAX_BODY_SIZE = 4 * 1024 * 1024
#: Delay levels 1..18 are ``1s 5s 10s 30s 1m 2m 3m … 2h``.
MAX_DELAY_LEVEL = 18
_RESERVED = frozenset({UNIQ_KEY, TAGS, KEYS, DELAY, TIMER_DELIVER_MS})


class SendStatus(enum.StrEnum):
    """``SendStatus`` of a successful send (anything else raises)."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


@dataclass(frozen=True, slots=True)
class Message:
    """A message to send.

    Attributes:
        topic: where it goes.
        body: the payload (non-empty, at most 4 MiB by default).
        tag: one tag consumers filter on (no ``||``).
        keys: business keys, searchable with ``queryMsgByKey``.
        properties: user properties (names reserved by RocketMQ are refused).
        delay_level: 1..18 delivers after RocketMQ's fixed delays (1 s … 2 h); 0 = now.
        delivery_timestamp: deliver at this wall-clock time (epoch seconds); excludes
            ``delay_level``.
        flag: an application integer stored as is.
    """

    topic: str
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_level: int = 0
    delivery_timestamp: float | None = None
    flag: int = 0

    def validate(self, max_body_size: int = MAX_BODY_SIZE) -> None:
        """Check what the broker would refuse, with a clear message.

        Raises:
            ValueError: empty or oversize body, bad tag, keys, delay or properties.
            IllegalNameError: an illegal topic name.
        """
        validate_topic(self.topic)
        if not self.body:
            raise ValueError("message body must not be empty")
        if len(self.body) > max_body_size:
            raise ValueError(f"message body of {len(self.body)} bytes exceeds {max_body_size}")
        if self.tag is not None and (not self.tag or "||" in self.tag):
            raise ValueError(f"illegal tag {self.tag!r}: non-empty, without '||'")
        if any(not k or " " in k for k in self.keys):
            raise ValueError(f"illegal keys {list(self.keys)!r}: non-empty, without spaces")
        if not 0 <= self.delay_level <= MAX_DELAY_LEVEL:
            raise ValueError(f"delay_level must be 0..{MAX_DELAY_LEVEL}, not {self.delay_level}")
        if self.delay_level and self.delivery_timestamp is not None:
            raise ValueError("a message takes delay_level or delivery_timestamp, not both")
        reserved = _RESERVED.intersection(self.properties)
        if reserved:
            raise ValueError(f"reserved property names: {sorted(reserved)}")

    def wire_properties(self, uniq_key: str) -> dict[str, str]:
        """The properties as sent: user ones plus tag, keys, delay, ``UNIQ_KEY``."""
        props = dict(self.properties)
        if self.tag:
            props[TAGS] = self.tag
        if self.keys:
            props[KEYS] = join_keys(self.keys)
        if self.delay_level:
            props[DELAY] = str(self.delay_level)
        if self.delivery_timestamp is not None:
            props[TIMER_DELIVER_MS] = str(int(self.delivery_timestamp * 1000))
        props[UNIQ_KEY] = uniq_key
        return props


def compress_body(body: bytes, sys_flag: int, threshold: int, level: int = 5) -> tuple[bytes, int]:
    """Zlib-compress ``body`` when it has at least ``threshold`` bytes (as the Java
    producer does at 4 KiB), returning the body and the sys flag with the bits set."""
    if threshold <= 0 or len(body) < threshold:
        return body, sys_flag
    return zlib.compress(body, level), sys_flag | SYSFLAG_COMPRESSED | SYSFLAG_COMPRESSION_ZLIB


def decompress_body(record: MessageExt) -> bytes:
    """The record's body, inflated if its sys flag says it is zlib-compressed.

    Raises:
        ValueError: compressed with a codec other than zlib (lz4/zstd are not bundled), or
            the data does not inflate.
    """
    if not record.sys_flag & SYSFLAG_COMPRESSED:
        return record.body
    codec = record.sys_flag & SYSFLAG_COMPRESSION_MASK
    if codec not in (0, SYSFLAG_COMPRESSION_ZLIB):
        raise ValueError(f"unsupported compression type {codec >> 8}")
    try:
        return zlib.decompress(record.body)
    except zlib.error as exc:
        raise ValueError(f"compressed body does not inflate: {exc}") from exc


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """Where a sent message was stored.

    ``message_id`` is the client-side unique id (``UNIQ_KEY``) consumers see;
    ``offset_message_id`` is the broker's id (store host + commit-log offset).
    """

    message_id: str
    queue: MessageQueue
    queue_offset: int
    offset_message_id: str
    status: SendStatus = SendStatus.SEND_OK
    transaction_id: str | None = None


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A message as a consumer receives it.

    ``topic`` is the topic the producer sent to, also for a retried message (whose record
    lives in a retry topic: see ``record.topic``). ``delivery_attempt`` counts from 1.
    ``receipt`` is the pop receipt (``None`` for pulled messages); ``corrupted`` is set when
    the body could not be inflated (``body`` is then the stored bytes).
    """

    record: MessageExt
    body: bytes
    broker_name: str
    receipt: str | None = None
    corrupted: bool = False
    received_at: float = field(default_factory=time.monotonic)

    @classmethod
    def of(
        cls, record: MessageExt, broker_name: str, receipt: str | None = None
    ) -> ReceivedMessage:
        """Wrap a decoded record, inflating its body."""
        try:
            return cls(record, decompress_body(record), broker_name, receipt)
        except ValueError:
            return cls(record, record.body, broker_name, receipt, corrupted=True)

    @property
    def topic(self) -> str:
        """The original topic (a retry copy names it in ``ORIGIN_TOPIC``/``RETRY_TOPIC``)."""
        props = self.record.properties
        if is_retry_topic(self.record.topic):
            return props.get(ORIGIN_TOPIC) or props.get(RETRY_TOPIC) or self.record.topic
        return self.record.topic

    @property
    def message_id(self) -> str:
        """The id the producer was given (``UNIQ_KEY``), else the broker's offset id."""
        return self.record.msg_id

    @property
    def tag(self) -> str | None:
        """The tag, if any."""
        return self.record.tags

    @property
    def keys(self) -> list[str]:
        """The business keys."""
        return self.record.keys

    @property
    def properties(self) -> Mapping[str, str]:
        """Every property, system ones included."""
        return self.record.properties

    @property
    def delivery_attempt(self) -> int:
        """1 for the first delivery, 2 for the first retry, …"""
        return self.record.reconsume_times + 1

    @property
    def reconsume_times(self) -> int:
        """How many times it was consumed before without success."""
        return self.record.reconsume_times

    @property
    def queue(self) -> MessageQueue:
        """The queue it was read from (the retry topic's queue for a retried message)."""
        return MessageQueue(self.record.topic, self.broker_name, self.record.queue_id)

    @property
    def queue_offset(self) -> int:
        """Its offset in that queue."""
        return self.record.queue_offset

    @property
    def born_timestamp(self) -> int:
        """Producer clock at send, epoch ms."""
        return self.record.born_timestamp

    @property
    def store_timestamp(self) -> int:
        """Broker clock at store, epoch ms."""
        return self.record.store_timestamp
