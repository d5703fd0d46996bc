"""The pop receipt (RocketMQ's ``ExtraInfo``, the ``POP_CK`` property) and the offset-info strings.

A receipt is seven or eight fields joined by single spaces (``ExtraInfoUtil.buildExtraInfo``)::

    ckQueueOffset popTime invisibleTime reviveQid retryFlag brokerName queueId [msgQueueOffset]

The pop response header carries three companion strings from which a client rebuilds each
message's receipt; entries are joined by ``;``, fields by a space:

- ``startOffsetInfo``: ``retryFlag queueId startOffset``
- ``msgOffsetInfo``: ``retryFlag queueId off1,off2,...``
- ``orderCountInfo``: ``retryFlag qo<queueId>%<queueOffset> count`` per message, plus the
  queue-level ``retryFlag queueId count`` form.

Parsed strings are dicts keyed by :class:`QueueKey`, a typed version of Java's map keys
(``QueueKey.java_key`` gives the Java string, e.g. ``"0@3"`` or ``"0@qo3%120"``).

Decoding is strict where Java is lenient: numbers must be canonical ASCII decimals (what
``Long.toString`` writes: no ``+``, no leading zeros, no ``-0``, no non-ASCII digits) within Java's
``long``/``int`` ranges; no empty fields, no stray separators; the retry flag is ``0``, ``1`` or
``2``. Hence every accepted string re-encodes to itself. Everything malformed raises
:class:`ReceiptError`; building from bad values raises :class:`EncodeError`.

The broker name is the only free text. It must be non-empty and contain no space: Java would
carry an empty name (``a  b`` splits into an empty field), but a receipt without a broker name
cannot route an ACK, and an empty field is far more often a corrupted receipt.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, NamedTuple, TypeVar

from protocol.errors import EncodeError, ReceiptError
from protocol.naming import RETRY_PREFIX, is_pop_retry_topic_v2, pop_retry_topic

#: ``KeyBuilder.POP_ORDER_REVIVE_QUEUE``: the revive queue id that marks an orderly pop.
POP_ORDER_REVIVE_QUEUE = 999
#: RocketMQ refuses pops of more than this many messages (broker and clients both check).
MAX_POP_MESSAGES = 32

_SEP = " "  # MessageConst.KEY_SEPARATOR
_QUEUE_OFFSET_KEY = re.compile(r"qo(0|-?[1-9][0-9]*)%(0|-?[1-9][0-9]*)")
_FIELDS = (
    "ckQueueOffset",
    "popTime",
    "invisibleTime",
    "reviveQid",
    "retryFlag",
    "brokerName",
    "queueId",
    "msgQueueOffset",
)
_V = TypeVar("_V")
_JAVA_TYPE = {64: "long", 32: "int"}


class RetryFlag(IntEnum):
    """Field 5 of a receipt: which kind of topic the message was popped from.

    ``ExtraInfoUtil.NORMAL_TOPIC`` ``"0"``, ``RETRY_TOPIC`` ``"1"`` (V1 ``%RETRY%group_topic``),
    ``RETRY_TOPIC_V2`` ``"2"`` (``%RETRY%group+topic``). Older ``ExtraInfoUtil`` versions wrote
    ``"1"`` for every ``%RETRY%`` topic.
    """

    NORMAL = 0
    RETRY_V1 = 1
    RETRY_V2 = 2

    @classmethod
    def of_topic(cls, topic: str) -> RetryFlag:
        """The flag for a message popped from ``topic`` (``ExtraInfoUtil.getRetry(topic)``)."""
        if is_pop_retry_topic_v2(topic):
            return cls.RETRY_V2
        return cls.RETRY_V1 if topic.startswith(RETRY_PREFIX) else cls.NORMAL


def _show(text: object) -> str:
    """``repr`` of ``text``, shortened so that error messages stay readable."""
    shown = repr(text)
    return shown if len(shown) <= 100 else shown[:97] + "..."


# ------------------------------------------------------------------ number helpers
def _parse_num(text: str, what: str, *, bits: int = 64) -> int:
    # Java's Long.parseLong/Integer.parseInt also take "+1", "007" and non-ASCII digits;
    # Long.toString never writes them, so accepting only its output keeps decode∘encode exact.
    # ``str(int(text)) == text`` is exactly "canonical" ("+1", "007", "-0", "1_0", " 1" and
    # non-ASCII digits all print differently) and several times cheaper than a regex.
    try:
        value = int(text) if len(text) <= 20 else None
    except ValueError:
        value = None
    if value is None or str(value) != text:
        raise ReceiptError(f"{what} is not a canonical decimal integer: {_show(text)}")
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise ReceiptError(f"{what} {value} is out of the Java {_JAVA_TYPE[bits]} range")
    return value


def _parse_flag(text: str, what: str) -> RetryFlag:
    if text not in ("0", "1", "2"):
        raise ReceiptError(f"{what} must be 0, 1 or 2, got {_show(text)}")
    return RetryFlag(int(text))


def _parse_queue_key(flag: str, queue_id: str, what: str) -> QueueKey:
    return QueueKey(
        _parse_flag(flag, f"{what} retryFlag"), _parse_num(queue_id, f"{what} queueId", bits=32)
    )


#: Java int and long ranges, by bit count: ``(low, high)``, high exclusive.
_RANGES: Final = {32: (-(2**31), 2**31), 64: (-(2**63), 2**63)}


def _check_num(value: int, what: str, *, bits: int = 64) -> int:
    low, high = _RANGES[bits]
    # The common case first: a plain int in range (every receipt a pop encodes).
    if type(value) is int and low <= value < high:
        return value
    # bool is an int subclass, but True in a receipt is a caller bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise EncodeError(f"{what} must be an int, got {_show(value)}")
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise EncodeError(f"{what} {value} is out of the Java {_JAVA_TYPE[bits]} range")
    return int(value)


def _check_flag(value: int, what: str) -> RetryFlag:
    if isinstance(value, bool) or value not in (0, 1, 2):
        raise EncodeError(f"{what} must be a RetryFlag (0, 1 or 2), got {_show(value)}")
    return RetryFlag(value)


# ------------------------------------------------------------------ the receipt
@dataclass(frozen=True, slots=True)
class ExtraInfo:
    """One message's pop receipt. Times are epoch / duration milliseconds."""

    ck_queue_offset: int
    pop_time_ms: int
    invisible_time_ms: int
    revive_qid: int
    retry_flag: RetryFlag
    broker_name: str
    queue_id: int
    #: the message's consume-queue offset; absent in the 7-field form of ``buildExtraInfo``.
    queue_offset: int | None = None

    @property
    def deadline_ms(self) -> int:
        """When the message becomes visible again: pop time + invisible time."""
        return self.pop_time_ms + self.invisible_time_ms

    @property
    def is_order(self) -> bool:
        """Orderly pop (``ExtraInfoUtil.isOrder``: revive qid 999)."""
        return self.revive_qid == POP_ORDER_REVIVE_QUEUE

    @property
    def is_retry(self) -> bool:
        """Whether the message was popped from a retry topic."""
        return self.retry_flag != RetryFlag.NORMAL

    def real_topic(self, topic: str, group: str, *, v2: bool | None = None) -> str:
        """The topic to ack on (``ExtraInfoUtil.getRealTopic``): ``topic`` itself for a normal
        message, else ``group``'s pop retry topic for it.

        ``v2=None`` follows the flag (1 → V1, 2 → V2). A bool forces the naming of a retry
        message, for peers that wrote flag 1 for V2 retry topics too.
        """
        if self.retry_flag == RetryFlag.NORMAL:
            return topic
        use_v2 = self.retry_flag == RetryFlag.RETRY_V2 if v2 is None else v2
        return pop_retry_topic(group, topic, v2=use_v2)

    def encode(self) -> str:
        """The wire string; raises :class:`EncodeError` for out-of-range values or a broker
        name that is empty or contains a space."""
        name = self.broker_name
        if not isinstance(name, str) or not name or _SEP in name:
            raise EncodeError(
                f"receipt broker name must be a non-empty str without spaces: {_show(name)}"
            )
        fields = [
            _check_num(self.ck_queue_offset, "ckQueueOffset"),
            _check_num(self.pop_time_ms, "popTime"),
            _check_num(self.invisible_time_ms, "invisibleTime"),
            _check_num(self.revive_qid, "reviveQid", bits=32),
            int(_check_flag(self.retry_flag, "retryFlag")),
            self.broker_name,
            _check_num(self.queue_id, "queueId", bits=32),
        ]
        if self.queue_offset is not None:
            fields.append(_check_num(self.queue_offset, "msgQueueOffset"))
        return _SEP.join(map(str, fields))

    @classmethod
    def decode(cls, text: str) -> ExtraInfo:
        """Parse a receipt string; raises :class:`ReceiptError` naming the bad part."""
        plain = plain_receipt(text)
        if plain is not None:
            return cls(*plain)
        return cls._decode_checked(text)

    @classmethod
    def _decode_checked(cls, text: str) -> ExtraInfo:
        """:meth:`decode` field by field, every refusal naming the bad part."""
        if not text:
            raise ReceiptError("pop receipt is empty")
        parts = text.split(_SEP)
        if len(parts) not in (7, 8):
            raise ReceiptError(
                f"pop receipt has {len(parts)} space-separated fields, expected 7 or 8"
                f" ({' '.join(_FIELDS)}): {_show(text)}"
            )
        if "" in parts:
            raise ReceiptError(
                f"pop receipt field {_FIELDS[parts.index('')]} is empty (stray space):"
                f" {_show(text)}"
            )
        return cls._from_parts(parts)

    @classmethod
    def _from_parts(cls, parts: list[str]) -> ExtraInfo:
        def num(index: int, bits: int = 64) -> int:
            return _parse_num(parts[index], f"pop receipt field {_FIELDS[index]}", bits=bits)

        return cls(
            ck_queue_offset=num(0),
            pop_time_ms=num(1),
            invisible_time_ms=num(2),
            revive_qid=num(3, bits=32),
            retry_flag=_parse_flag(parts[4], f"pop receipt field {_FIELDS[4]}"),
            broker_name=parts[5],
            queue_id=num(6, bits=32),
            queue_offset=num(7) if len(parts) == 8 else None,
        )


#: The retry flag of each wire value.
_FLAGS: Final = {"0": RetryFlag.NORMAL, "1": RetryFlag.RETRY_V1, "2": RetryFlag.RETRY_V2}

#: A receipt's fields as :func:`plain_receipt` returns them, in :class:`ExtraInfo`'s order.
ReceiptFields = tuple[int, int, int, int, RetryFlag, str, int, int | None]


def _plain_num(text: str, digits: int) -> int | None:
    """``text`` as an int when it is a canonical non-negative decimal of at most ``digits``
    ASCII digits (so within range: 18 for a Java long, 9 for an int), else None."""
    if (
        len(text) <= digits
        and text.isdigit()
        and text.isascii()
        and (text[0] != "0" or text == "0")
    ):
        return int(text)
    return None


def plain_receipt(text: str) -> ReceiptFields | None:
    """The fields of a receipt as the broker writes them (every number a canonical
    non-negative decimal of at most 18 digits, 9 for the int fields; a known retry flag; a
    non-empty broker name), without :meth:`ExtraInfo.decode`'s field by field checks; None for
    anything else, which that decode then reads or refuses. Gives exactly what the checked
    decode gives for such a string (tests/protocol/test_receipt.py)."""
    parts = text.split(_SEP)
    n = len(parts)
    if n != 7 and n != 8:
        return None
    ck, pop_time = _plain_num(parts[0], 18), _plain_num(parts[1], 18)
    invisible, revive_qid = _plain_num(parts[2], 18), _plain_num(parts[3], 9)
    flag, name, queue_id = _FLAGS.get(parts[4]), parts[5], _plain_num(parts[6], 9)
    offset = _plain_num(parts[7], 18) if n == 8 else None
    if (
        ck is None
        or pop_time is None
        or invisible is None
        or revive_qid is None
        or flag is None
        or not name
        or queue_id is None
        or (n == 8 and offset is None)
    ):
        return None
    return ck, pop_time, invisible, revive_qid, flag, name, queue_id, offset


# ------------------------------------------------------------------ offset-info strings
class QueueKey(NamedTuple):
    """Key of a parsed offset-info entry; ``queue_offset`` only for per-message order counts."""

    retry_flag: RetryFlag
    queue_id: int
    queue_offset: int | None = None

    @property
    def java_key(self) -> str:
        """Java's map key: ``"flag@queueId"`` or ``"flag@qo<queueId>%<offset>"``."""
        if self.queue_offset is None:
            return f"{int(self.retry_flag)}@{self.queue_id}"
        return f"{int(self.retry_flag)}@qo{self.queue_id}%{self.queue_offset}"


class StartOffset(NamedTuple):
    """One ``startOffsetInfo`` entry: the CK start offset of a queue."""

    retry_flag: RetryFlag
    queue_id: int
    start_offset: int


class MsgOffsets(NamedTuple):
    """One ``msgOffsetInfo`` entry: the offsets of the messages popped from a queue."""

    retry_flag: RetryFlag
    queue_id: int
    offsets: Sequence[int]


class OrderCount(NamedTuple):
    """One ``orderCountInfo`` entry: how often a message was consumed, or (when
    ``queue_offset`` is None, the queue-level form) the queue's minimum."""

    retry_flag: RetryFlag
    queue_id: int
    queue_offset: int | None
    order_count: int


def _join(what: str, entries: Iterable[tuple[QueueKey, str]]) -> str:
    seen: set[QueueKey] = set()
    out: list[str] = []
    for key, text in entries:
        if key in seen:  # never build what the parser (ours and Java's) rejects
            raise EncodeError(f"{what}: duplicate entry for {key.java_key}")
        seen.add(key)
        out.append(text)
    return ";".join(out)


def _queue_key(flag: int, queue_id: int, what: str) -> QueueKey:
    return QueueKey(
        _check_flag(flag, f"{what} retryFlag"), _check_num(queue_id, f"{what} queueId", bits=32)
    )


def build_start_offset_info(entries: Iterable[StartOffset]) -> str:
    """``ExtraInfoUtil.buildStartOffsetInfo`` for each entry, joined by ``;``."""
    what = "startOffsetInfo"

    def one(e: StartOffset) -> tuple[QueueKey, str]:
        key = _queue_key(e.retry_flag, e.queue_id, what)
        offset = _check_num(e.start_offset, f"{what} startOffset")
        return key, f"{int(key.retry_flag)} {key.queue_id} {offset}"

    return _join(what, map(one, entries))


def build_msg_offset_info(entries: Iterable[MsgOffsets]) -> str:
    """``ExtraInfoUtil.buildMsgOffsetInfo`` for each entry; every entry needs an offset
    (Java would write ``"0 1 "``, which no parser accepts)."""
    what = "msgOffsetInfo"

    def one(e: MsgOffsets) -> tuple[QueueKey, str]:
        key = _queue_key(e.retry_flag, e.queue_id, what)
        if not e.offsets:
            raise EncodeError(f"{what}: no offsets for {key.java_key}")
        offsets = ",".join(str(_check_num(o, f"{what} offset")) for o in e.offsets)
        return key, f"{int(key.retry_flag)} {key.queue_id} {offsets}"

    return _join(what, map(one, entries))


def build_order_count_info(entries: Iterable[OrderCount]) -> str:
    """``buildQueueOffsetOrderCountInfo`` / ``buildQueueIdOrderCountInfo`` for each entry."""
    what = "orderCountInfo"

    def one(e: OrderCount) -> tuple[QueueKey, str]:
        key = _queue_key(e.retry_flag, e.queue_id, what)
        count = _check_num(e.order_count, f"{what} count", bits=32)
        if e.queue_offset is None:
            return key, f"{int(key.retry_flag)} {key.queue_id} {count}"
        key = key._replace(queue_offset=_check_num(e.queue_offset, f"{what} queueOffset"))
        return key, f"{int(key.retry_flag)} qo{key.queue_id}%{key.queue_offset} {count}"

    return _join(what, map(one, entries))


def _split_entries(text: str, what: str) -> Iterator[tuple[str, str, str]]:
    """The ``(flag, middle, value)`` fields of each entry; empty text has no entries.

    As strict as the newest ``ExtraInfoUtil.locateEntrySeparators`` (exactly three non-empty
    fields), and also refuses the empty entries that Java's ``split(";")`` lets through.
    """
    if not text:
        return
    for index, entry in enumerate(text.split(";")):
        parts = entry.split(_SEP)
        if len(parts) != 3 or "" in parts:
            raise ReceiptError(
                f"{what} entry {index} must be three space-separated fields: {_show(entry)}"
            )
        yield parts[0], parts[1], parts[2]


def _put(out: dict[QueueKey, _V], key: QueueKey, value: _V, what: str) -> None:
    if key in out:  # ExtraInfoUtil.parse*: "duplicate"
        raise ReceiptError(f"{what}: duplicate entry for {key.java_key}")
    out[key] = value


def parse_start_offset_info(text: str) -> dict[QueueKey, int]:
    """``ExtraInfoUtil.parseStartOffsetInfo``: queue → CK start offset (``{}`` for "")."""
    what = "startOffsetInfo"
    out: dict[QueueKey, int] = {}
    for flag, queue_id, value in _split_entries(text, what):
        key = _parse_queue_key(flag, queue_id, what)
        _put(out, key, _parse_num(value, f"{what} startOffset"), what)
    return out


def parse_msg_offset_info(text: str) -> dict[QueueKey, tuple[int, ...]]:
    """``ExtraInfoUtil.parseMsgOffsetInfo``: queue → popped message offsets, in order."""
    what = "msgOffsetInfo"
    out: dict[QueueKey, tuple[int, ...]] = {}
    for flag, queue_id, value in _split_entries(text, what):
        key = _parse_queue_key(flag, queue_id, what)
        offsets = tuple(_parse_num(o, f"{what} offset") for o in value.split(","))
        _put(out, key, offsets, what)
    return out


def parse_order_count_info(text: str) -> dict[QueueKey, int]:
    """``ExtraInfoUtil.parseOrderCountInfo``: per-message keys carry ``queue_offset``,
    queue-level keys do not. :func:`order_count_for` looks a message up."""
    what = "orderCountInfo"
    out: dict[QueueKey, int] = {}
    for flag, middle, value in _split_entries(text, what):
        match = _QUEUE_OFFSET_KEY.fullmatch(middle)
        key = _parse_queue_key(flag, match[1] if match else middle, what)
        if match:
            key = key._replace(queue_offset=_parse_num(match[2], f"{what} queueOffset"))
        _put(out, key, _parse_num(value, f"{what} count", bits=32), what)
    return out


def order_count_for(
    counts: Mapping[QueueKey, int], flag: RetryFlag, queue_id: int, queue_offset: int
) -> int | None:
    """A message's consumed count: its own entry, else its queue's — the lookup order of the
    Java client (``MQClientAPIImpl.processPopResponse``)."""
    found = counts.get(QueueKey(flag, queue_id, queue_offset))
    return counts.get(QueueKey(flag, queue_id)) if found is None else found


# ------------------------------------------------------------------ a pop response's receipts
def pop_receipt(
    topic: str,
    queue_id: int,
    queue_offset: int,
    properties: Mapping[str, str],
    *,
    pop_time: int,
    invisible_time: int,
    revive_qid: int,
    start_offsets: Mapping[QueueKey, int],
    broker_name: str,
) -> ExtraInfo:
    """The receipt of one message of a POP response, as the Java client builds it
    (``MQClientAPIImpl.processPopResponse``): the record's own ``POP_CK`` when it carries one
    (a retried message), else one built from the response header and ``startOffsetInfo``
    (keyed by the record's topic kind and queue; the message offset itself when absent).

    Raises:
        ReceiptError: the record's ``POP_CK`` is malformed.
    """
    own = properties.get("POP_CK")
    if own:
        return ExtraInfo.decode(own)
    flag = RetryFlag.of_topic(topic)
    ck = start_offsets.get(QueueKey(flag, queue_id), queue_offset)
    return ExtraInfo(ck, pop_time, invisible_time, revive_qid, flag, broker_name, queue_id,
                     queue_offset)  # fmt: skip
