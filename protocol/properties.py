"""Message property names and the properties string codec (RocketMQ ``MessageConst``).

A message's properties travel as one string, ``name \\x01 value \\x02`` for every pair
(``MessageDecoder.messageProperties2String``, trailing ``\\x02`` included), UTF-8 encoded. The
reader (``string2messageProperties``) splits on ``\\x02`` and keeps a segment only when its
first ``\\x01`` has at least one character on each side; the value is everything after that
first ``\\x01``. So empty names and empty values never survive a round trip, and a separator
inside a name or value silently corrupts the map: :func:`encode_properties` refuses all of
those instead of writing something that decodes differently.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import NoReturn

from protocol.errors import EncodeError

# ------------------------------------------------------------------ wire names
#: Client-generated message id (``PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX``).
UNIQ_KEY = "UNIQ_KEY"
#: User keys, joined by :data:`KEY_SEPARATOR`; indexed by the broker.
KEYS = "KEYS"
#: The tag; consume queues store its :func:`java_string_hash`.
TAGS = "TAGS"
#: ``"true"``: the producer waits for the flush in SYNC_FLUSH mode.
WAIT = "WAIT"
#: Delay level 1..18.
DELAY = "DELAY"
#: Original topic of a message sent back to a ``%RETRY%`` topic.
RETRY_TOPIC = "RETRY_TOPIC"
#: Saved destination of delayed, timer and half messages.
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
#: ``"true"``: a transactional half message.
TRAN_MSG = "TRAN_MSG"
#: Producer group, for transaction check-back.
PGROUP = "PGROUP"
#: First message id across retries.
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
#: Retry count carried when a message is re-sent as a normal message.
RECONSUME_TIME = "RECONSUME_TIME"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
#: Pop receipt (``ExtraInfo``) and its queue offset.
POP_CK = "POP_CK"
POP_CK_OFFSET = "POP_CK_OFFSET"
#: Time of the first pop.
FIRST_POP_TIME = "1ST_POP_TIME"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
#: Rounded delivery time set by the broker's timer wheel.
TIMER_OUT_MS = "TIMER_OUT_MS"
CONSUME_START_TIME = "CONSUME_START_TIME"
MSG_REGION = "MSG_REGION"
#: ``PROPERTY_TRACE_SWITCH``.
TRACE_ON = "TRACE_ON"
TRANSACTION_ID = "__transactionId__"
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
#: Optional whole-record CRC property (10 digits) of ``enabledAppendPropCRC``.
CRC32 = "__CRC32#"
#: trimq's own: the original topic of a pop-retry message. RocketMQ's ``develop`` has no such
#: constant (it exists only in the unmerged PR #9637), so trimq names it itself.
ORIGIN_TOPIC = "ORIGIN_TOPIC"
#: trimq: when a pop retry message's original lease expired (epoch ms), so the delay from the
#: deadline to redelivery can be measured by broker and clients alike.
REVIVE_DEADLINE_MS = "REVIVE_DEADLINE_MS"

#: Separator of several keys in :data:`KEYS` (``MessageConst.KEY_SEPARATOR``).
KEY_SEPARATOR = " "

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

#: Largest properties string in bytes: the record stores its length as a signed short.
MAX_PROPERTIES_SIZE = 2**15 - 1


# ------------------------------------------------------------------ properties string
def encode_properties(properties: Mapping[str, str]) -> str:
    """Encode ``properties`` as Java's ``messageProperties2String`` does, in mapping order.

    Raises:
        EncodeError: a name or value contains ``\\x01`` or ``\\x02``, or is empty; the reader
            would decode a different map, so the offending name is reported instead.
    """
    if not properties:
        return ""
    text = "".join([f"{k}\x01{v}\x02" for k, v in properties.items()])
    n = len(properties)
    # One C-level scan instead of four `in` tests per pair: with exactly n separators of each
    # kind, the string alternates name/value cleanly, so empties show up as adjacent ones.
    if (
        text.count("\x01") != n
        or text.count("\x02") != n
        or text[0] == "\x01"
        or "\x01\x02" in text
        or "\x02\x01" in text
    ):
        _raise_bad_property(properties)
    return text


def _raise_bad_property(properties: Mapping[str, str]) -> NoReturn:
    for key, value in properties.items():
        if not key or not value:
            raise EncodeError(f"message property {key!r} has an empty name or value")
        if _has_separator(key) or _has_separator(value):
            raise EncodeError(f"message property {key!r} contains a \\x01 or \\x02 separator")
    raise EncodeError("message properties cannot be encoded")  # pragma: no cover


def _has_separator(text: str) -> bool:
    return "\x01" in text or "\x02" in text


def decode_properties(text: str) -> dict[str, str]:
    """Decode a properties string exactly as Java's ``string2messageProperties``.

    Malformed segments (no ``\\x01``, an empty name or an empty value) are skipped, as Java
    skips them; a repeated name keeps its last value.
    """
    out: dict[str, str] = {}
    if not text:
        return out
    for segment in text.split("\x02"):
        key, _, value = segment.partition("\x01")
        # Java's test is "length >= 3 and the first \x01 strictly inside": the same as a
        # non-empty name and a non-empty value (a segment without \x01 has an empty value).
        if key and value:
            out[key] = value
    return out


# ------------------------------------------------------------------ keys and tags
def split_keys(value: str | None) -> list[str]:
    """Split a :data:`KEYS` value into its keys; empty parts are dropped."""
    if not value:
        return []
    return [k for k in value.split(KEY_SEPARATOR) if k]


def join_keys(keys: Iterable[str]) -> str:
    """Join keys into one :data:`KEYS` value (the inverse of :func:`split_keys`)."""
    return KEY_SEPARATOR.join(k for k in keys if k)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: signed 32-bit, over UTF-16 code units.

    A character outside the BMP counts as its two surrogates, as in Java; consume queues
    store this value for the ``TAGS`` property, so it must match the Java broker's bit for bit.
    """
    if text.isascii():
        units: Iterable[int] = text.encode("ascii")
    else:
        # surrogatepass: a lone surrogate is a valid Java char, so hash it rather than fail.
        data = text.encode("utf-16-be", "surrogatepass")
        units = struct.unpack(f">{len(data) // 2}H", data)
    h = 0
    for unit in units:
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h
