"""Name-server bodies: the KV config table and both forms of a broker registration.

* ``GET_KVLIST_BY_NAMESPACE`` (219) answers, and ``REGISTER_BROKER`` (103) may answer,
  :class:`KVTable` (``{"table":{"key":"value"}}``, ``remoting/.../body/KVTable.java``).
* ``REGISTER_BROKER`` carries a :class:`~protocol.bodies.broker.RegisterBrokerBody` either
  as JSON (RocketMQ's default, ``compressedRegister=false``) or, when its header says
  ``compressed=true``, in the binary form of ``RegisterBrokerBody.encode(true)``, deflated
  with zlib (``DeflaterOutputStream``)::

      int32 len + DataVersion JSON
      int32 topic count, then per topic: int32 len + TopicConfig.encode() text
      int32 len + filter server list JSON
      (5.x brokers append their static-topic queue mappings: ignored here)

  ``TopicConfig.encode()`` is ``name readQueueNums writeQueueNums perm topicFilterType``
  separated by single spaces, and 5.x appends the attributes as a JSON object.
* ``bodyCrc32`` in the registration header is ``UtilAll.crc32(body)``: the CRC32 of the
  body as sent, masked to 31 bits (:func:`body_crc32`); 0 means "not computed".

Decoding a compressed body inflates at most ``max_size`` bytes, so a small deflate bomb
cannot exhaust memory; every malformed input raises :class:`~protocol.errors.FieldError`.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from protocol.bodies._fields import as_text
from protocol.bodies._json import ROOT, dumps, loads_lenient
from protocol.bodies.admin import KVTable as KVTable  # one definition, shared with admin
from protocol.bodies.broker import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicFilterType,
)
from protocol.errors import FieldError

#: KV namespace of order-topic configuration (``NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG``).
NAMESPACE_ORDER_TOPIC_CONFIG: Final = "ORDER_TOPIC_CONFIG"
#: Default bound on an inflated registration body (16 MiB, the frame limit).
MAX_INFLATED: Final = 16 * 1024 * 1024
_INT = struct.Struct(">i")


def body_crc32(data: bytes) -> int:
    """``UtilAll.crc32``: CRC32 masked to a non-negative Java ``int``."""
    return zlib.crc32(data) & 0x7FFFFFFF


# ------------------------------------------------------------------ TopicConfig text form
def topic_config_to_text(config: TopicConfig) -> str:
    """``TopicConfig.encode()`` (5.x form: attributes appended as JSON when present)."""
    text = (
        f"{config.topic_name} {config.read_queue_nums} {config.write_queue_nums} "
        f"{config.perm} {config.topic_filter_type.name}"
    )
    if config.attributes:
        text += " " + dumps(dict(config.attributes)).decode()
    return text


def topic_config_from_text(text: str, path: str) -> TopicConfig:
    """``TopicConfig.decode()``: five space-separated fields, then optional attributes."""
    parts = text.split(" ", 5)
    if len(parts) < 5:
        raise FieldError(f"{path}: topic config {text[:60]!r} has fewer than 5 fields", field=path)
    name, read, write, perm, filter_type = parts[:5]
    try:
        numbers = [int(read), int(write), int(perm)]
        kind = TopicFilterType[filter_type]
    except (ValueError, KeyError):
        raise FieldError(f"{path}: malformed topic config {text[:60]!r}", field=path) from None
    attributes: dict[str, str] = {}
    if len(parts) == 6 and parts[5]:
        attributes = _attributes(loads_lenient(parts[5]), path)
    return TopicConfig(
        name,
        read_queue_nums=numbers[0],
        write_queue_nums=numbers[1],
        perm=numbers[2],
        topic_filter_type=kind,
        attributes=attributes,
    )


def _attributes(obj: object, path: str) -> dict[str, str]:
    if type(obj) is not dict:
        raise FieldError(f"{path}: topic attributes are not a JSON object", field=path)
    return {str(key): as_text(value, f"{path}[{key}]") for key, value in obj.items()}


# ------------------------------------------------------------------ registration bodies
def encode_register_body(body: RegisterBrokerBody, *, compressed: bool) -> bytes:
    """``RegisterBrokerBody.encode(compressed)``."""
    if not compressed:
        return body.to_json()
    wrapper = body.topic_config_serialize_wrapper
    parts = [_chunk(wrapper.data_version.to_json()), _INT.pack(len(wrapper.topic_config_table))]
    parts += [_chunk(topic_config_to_text(c).encode()) for c in wrapper.topic_config_table.values()]
    parts.append(_chunk(dumps(list(body.filter_server_list))))
    return zlib.compress(b"".join(parts), 9)


def _chunk(data: bytes) -> bytes:
    return _INT.pack(len(data)) + data


def decode_register_body(
    data: bytes, *, compressed: bool, max_size: int = MAX_INFLATED
) -> RegisterBrokerBody:
    """Decode a registration body in either form (see the module docstring).

    Raises:
        FieldError: the body is malformed, truncated, or inflates beyond ``max_size``.
    """
    if not compressed:
        return RegisterBrokerBody.from_json(data) if data else RegisterBrokerBody()
    raw = _inflate(data, max_size)
    reader = _Reader(raw)
    version = DataVersion.from_obj(loads_lenient(reader.chunk("dataVersion")), "dataVersion")
    count = reader.count("topicConfigTable")
    table: dict[str, TopicConfig] = {}
    for index in range(count):
        at = f"topicConfigTable[{index}]"
        try:
            text = reader.chunk(at).decode("utf-8")
        except UnicodeDecodeError:
            raise FieldError(f"{at}: topic config is not UTF-8", field=at) from None
        config = topic_config_from_text(text, at)
        table[config.topic_name] = config
    servers = loads_lenient(reader.chunk("filterServerList"))
    if type(servers) is not list:
        raise FieldError("filterServerList: not a JSON array", field="filterServerList")
    return RegisterBrokerBody(
        TopicConfigSerializeWrapper(table, version),
        tuple(as_text(s, f"filterServerList[{i}]") for i, s in enumerate(servers)),
    )


def _inflate(data: bytes, max_size: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, max_size)
    except zlib.error as exc:
        raise FieldError(f"compressed body does not inflate: {exc}", field=ROOT) from None
    if inflater.unconsumed_tail:
        raise FieldError(f"compressed body inflates beyond {max_size} bytes", field=ROOT)
    if not inflater.eof:
        raise FieldError("compressed body is truncated", field=ROOT)
    return raw


class _Reader:
    """Length-prefixed chunks of an inflated registration body."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def count(self, path: str) -> int:
        if self.pos + 4 > len(self.data):
            raise FieldError(f"{path}: body ends before its length", field=path)
        (value,) = _INT.unpack_from(self.data, self.pos)
        self.pos += 4
        if value < 0:
            raise FieldError(f"{path}: negative length {value}", field=path)
        return int(value)

    def chunk(self, path: str) -> bytes:
        size = self.count(path)
        if self.pos + size > len(self.data):
            raise FieldError(f"{path}: length {size} runs past the end of the body", field=path)
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out


__all__ = [
    "MAX_INFLATED",
    "NAMESPACE_ORDER_TOPIC_CONFIG",
    "KVTable",
    "body_crc32",
    "decode_register_body",
    "encode_register_body",
    "topic_config_from_text",
    "topic_config_to_text",
]
