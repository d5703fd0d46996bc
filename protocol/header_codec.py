"""The three header serializations: RocketMQ JSON, RocketMQ binary, and trimq's msgpack.

Each decoder turns header bytes into a :class:`Header` tuple or raises :class:`HeaderError`
(carrying the opaque when it could be recovered, so the caller can still answer the request).
Decoders are lenient where real clients are sloppy (JSON ext values that are numbers,
booleans or null; a trailing newline) and strict everywhere else.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import msgpack

from protocol.codes import LanguageCode, SerializeType
from protocol.command import RemotingCommand
from protocol.errors import EncodeError, HeaderError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1


class Header(NamedTuple):
    """The decoded header fields of one command (everything but the body)."""

    # Same order as RemotingCommand's first fields: the decoder splats a Header into it.
    code: int
    opaque: int
    flag: int
    language: str
    version: int
    remark: str | None
    ext_fields: dict[str, str]


# ------------------------------------------------------------------ shared validation
def _int32(name: str, value: object, opaque: int | None, stype: SerializeType) -> int:
    # bool is an int subclass: a JSON `true` for `code` is malformed, not 1.
    if type(value) is int:
        if INT32_MIN <= value <= INT32_MAX:
            return value
    elif type(value) is str:
        # fastjson accepts numeric strings for int fields; so do we (ASCII digits, one sign,
        # at most 10 digits so int() can neither fail nor be made to work hard).
        digits = value[1:] if value[:1] == "-" else value
        if 0 < len(digits) <= 10 and digits.isascii() and digits.isdigit():
            return _int32(name, int(value), opaque, stype)
    raise HeaderError(
        f"header field {name!r} must be a 32-bit integer, got {value!r:.40}",
        opaque=opaque,
        serialize_type=stype,
    )


def _language(value: object, opaque: int | None, stype: SerializeType) -> str:
    if type(value) is str:
        return value
    if type(value) is int:  # some clients send the ordinal
        try:
            return LanguageCode(value).name
        except ValueError:
            return LanguageCode.OTHER.name
    raise HeaderError(
        f"header field 'language' must be a string, got {value!r:.40}",
        opaque=opaque,
        serialize_type=stype,
    )


def _ext_value(key: str, value: object, opaque: int | None) -> str | None:
    if type(value) is str:
        return value
    if type(value) is bool:
        return "true" if value else "false"  # Java's String.valueOf(boolean)
    if type(value) is int or type(value) is float:
        return str(value)
    if value is None:
        return None  # Java decodes a null ext field as absent
    raise HeaderError(
        f"extFields[{key!r}] must be a string, number, boolean or null, got {type(value).__name__}",
        opaque=opaque,
        serialize_type=SerializeType.JSON,
    )


def _lenient_ext(raw: object, opaque: int | None) -> dict[str, str]:
    if raw is None:
        return {}
    if type(raw) is not dict:
        raise HeaderError(
            "header field 'extFields' must be an object",
            opaque=opaque,
            serialize_type=SerializeType.JSON,
        )
    if set(map(type, raw.values())) <= _STR_ONLY:
        return raw
    out: dict[str, str] = {}
    for key, value in raw.items():
        coerced = _ext_value(key, value, opaque)
        if coerced is not None:
            out[key] = coerced
    return out


# ------------------------------------------------------------------ JSON (type 0)
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def decode_json(data: bytes | bytearray) -> Header:
    """Decode a RocketMQ JSON header (fastjson's ``RemotingCommand`` fields)."""
    stype = SerializeType.JSON
    try:
        obj = _JSON_DECODER.decode(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HeaderError(f"JSON header does not parse: {exc}", serialize_type=stype) from None
    if type(obj) is not dict:
        raise HeaderError("JSON header must be an object", serialize_type=stype)
    return _plain_header(obj) or _checked_header(obj)


def _checked_header(obj: dict[str, Any]) -> Header:
    """The header of a JSON object, field by field: lenient where clients are sloppy,
    every refusal naming what is wrong."""
    stype = SerializeType.JSON
    raw_opaque = obj.get("opaque", 0)
    opaque = (
        raw_opaque if type(raw_opaque) is int and INT32_MIN <= raw_opaque <= INT32_MAX else None
    )
    if "code" not in obj:
        raise HeaderError("JSON header has no 'code'", opaque=opaque, serialize_type=stype)
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:
        raise HeaderError(
            "header field 'remark' must be a string", opaque=opaque, serialize_type=stype
        )
    return Header(
        code=_int32("code", obj["code"], opaque, stype),
        opaque=_int32("opaque", raw_opaque, opaque, stype),
        flag=_int32("flag", obj.get("flag", 0), opaque, stype),
        language=_language(obj.get("language", "JAVA"), opaque, stype),
        version=_int32("version", obj.get("version", 0), opaque, stype),
        remark=remark,
        ext_fields=_lenient_ext(obj.get("extFields"), opaque),
    )


def _plain_header(obj: dict[str, Any]) -> Header | None:
    """The header of a JSON object as clients write it (numbers as 32-bit integers, text as
    strings, extFields a map of strings) in one combined check; None for anything else,
    which :func:`decode_json`'s field by field checks then read or refuse. Gives exactly
    what those checks give for such an object, in about half the time."""
    code, opaque = obj.get("code"), obj.get("opaque", 0)
    flag, version = obj.get("flag", 0), obj.get("version", 0)
    language, remark, ext = obj.get("language", "JAVA"), obj.get("remark"), obj.get("extFields")
    if (
        type(code) is int
        and type(opaque) is int
        and type(flag) is int
        and type(version) is int
        and INT32_MIN <= code <= INT32_MAX
        and INT32_MIN <= opaque <= INT32_MAX
        and INT32_MIN <= flag <= INT32_MAX
        and INT32_MIN <= version <= INT32_MAX
        and type(language) is str
        and (remark is None or type(remark) is str)
        and type(ext) is dict
        and set(map(type, ext.values())) <= _STR_ONLY
    ):
        return Header(code, opaque, flag, language, version, remark, ext)
    return None


def _plain_json(cmd: RemotingCommand) -> bytes | None:
    """The JSON header written by formatting, when no text in it needs escaping (the
    common case: ids, numbers, names); None otherwise. ``json`` costs ~7 µs a header, this
    ~1.5 µs, and every reply pays it. The output is byte for byte what :func:`encode_json`'s
    general path writes (tests/protocol/test_header_codec.py checks it)."""
    ext, remark, language = cmd.ext_fields, cmd.remark, cmd.language
    try:
        text = language + "".join(ext) + "".join(ext.values()) + (remark or "")
    except TypeError:  # a key or value that is no str: the general path says what
        return None
    # JSON escapes '"', '\' and control characters; isprintable() is False for those (and
    # for a few more, which then take the general path) and for lone surrogates.
    if not text.isprintable() or '"' in text or "\\" in text:
        return None
    if type(cmd.code) is not int or type(cmd.opaque) is not int:
        return None
    if type(cmd.flag) is not int or type(cmd.version) is not int:
        return None
    fields = ",".join([f'"{k}":"{v}"' for k, v in ext.items()])
    shown = "null" if remark is None else f'"{remark}"'
    return (
        f'{{"code":{cmd.code},"language":"{language}","version":{cmd.version},'
        f'"opaque":{cmd.opaque},"flag":{cmd.flag},"remark":{shown},"extFields":{{{fields}}},'
        f'"serializeTypeCurrentRPC":"JSON"}}'
    ).encode()


def encode_json(cmd: RemotingCommand) -> bytes:
    """Encode the header as RocketMQ JSON, in the field order Java brokers use.

    Raises:
        EncodeError: a value JSON cannot carry, or text that is not UTF-8 (a lone surrogate).
    """
    ext = cmd.ext_fields
    if type(cmd.language) is str and type(ext) is dict and (plain := _plain_json(cmd)):
        return plain
    return _general_json(cmd)


def _general_json(cmd: RemotingCommand) -> bytes:
    ext = cmd.ext_fields
    try:
        return _JSON_ENCODER.encode(
            {
                "code": cmd.code,
                "language": cmd.language,
                "version": cmd.version,
                "opaque": cmd.opaque,
                "flag": cmd.flag,
                "remark": cmd.remark,
                "extFields": ext if type(ext) is dict else dict(ext),
                "serializeTypeCurrentRPC": "JSON",
            }
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise EncodeError(f"header cannot be encoded as JSON: {exc}") from None


# ------------------------------------------------------------------ ROCKETMQ binary (type 1)
_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


class _Reader:
    """Bounds-checked cursor over header bytes; every short read is a HeaderError."""

    __slots__ = ("data", "opaque", "pos")

    def __init__(self, data: bytes | bytearray) -> None:
        self.data = data
        self.pos = 0
        self.opaque: int | None = None

    def take(self, n: int, what: str) -> bytes | bytearray:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise HeaderError(
                f"binary header truncated in {what} (need {n} bytes at {self.pos}, "
                f"have {len(self.data) - self.pos})",
                opaque=self.opaque,
                serialize_type=SerializeType.ROCKETMQ,
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def text(self, n: int, what: str) -> str:
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderError(
                f"binary header {what} is not UTF-8",
                opaque=self.opaque,
                serialize_type=SerializeType.ROCKETMQ,
            ) from None


def decode_binary(data: bytes | bytearray) -> Header:
    """Decode a RocketMQ binary header (``RocketMQSerializable.rocketMQProtocolDecode``).

    A zero-length remark decodes as ``None``, as in Java.
    """
    r = _Reader(data)
    code, lang, version, opaque, flag = _BIN_FIXED.unpack(r.take(_BIN_FIXED.size, "fixed part"))
    r.opaque = opaque
    (remark_len,) = _I32.unpack(r.take(4, "remark length"))
    remark = r.text(remark_len, "remark") if remark_len > 0 else None
    (ext_len,) = _I32.unpack(r.take(4, "extFields length"))
    ext: dict[str, str] = {}
    if ext_len > 0:
        end = r.pos + ext_len
        r.take(ext_len, "extFields")  # bounds check once, then walk it
        r.pos = end - ext_len
        while r.pos < end:
            (key_len,) = _I16.unpack(r.take(2, "ext key length"))
            key = r.text(key_len, "ext key")
            (val_len,) = _I32.unpack(r.take(4, "ext value length"))
            ext[key] = r.text(val_len, "ext value")
        if r.pos != end:
            raise HeaderError("binary extFields overrun", opaque=opaque)
    if r.pos != len(data):
        raise HeaderError(
            f"binary header has {len(data) - r.pos} trailing bytes",
            opaque=opaque,
            serialize_type=SerializeType.ROCKETMQ,
        )
    try:
        language = LanguageCode(lang).name
    except ValueError:
        language = LanguageCode.OTHER.name
    return Header(code, opaque, flag, language, version, remark, ext)


def encode_binary(cmd: RemotingCommand) -> bytes:
    """Encode the header in RocketMQ's binary form.

    Raises:
        EncodeError: ``code`` or ``version`` does not fit a signed short (RocketMQ writes them
            with ``writeShort``, so codes above 32767, such as the pop codes, cannot travel
            in this form), ``opaque`` or ``flag`` does not fit a signed int, text is not
            UTF-8 (a lone surrogate), or an ext key is longer than 32767 bytes.
    """
    if not INT16_MIN <= cmd.code <= INT16_MAX:
        raise EncodeError(f"code {cmd.code} does not fit the binary header's 16-bit code field")
    if not INT16_MIN <= cmd.version <= INT16_MAX:
        raise EncodeError(f"version {cmd.version} does not fit the binary header's 16 bits")
    lang = LanguageCode.__members__.get(cmd.language, LanguageCode.OTHER)
    try:
        parts = [_BIN_FIXED.pack(cmd.code, lang, cmd.version, cmd.opaque, cmd.flag)]
        remark = (cmd.remark or "").encode("utf-8")
        parts += [_I32.pack(len(remark)), remark]
        ext_parts: list[bytes] = []
        for key, value in cmd.ext_fields.items():
            k, v = key.encode("utf-8"), value.encode("utf-8")
            if len(k) > INT16_MAX:
                raise EncodeError(f"ext key of {len(k)} bytes is too long for the binary header")
            ext_parts += [_I16.pack(len(k)), k, _I32.pack(len(v)), v]
    except (struct.error, UnicodeEncodeError, AttributeError) as exc:
        # AttributeError: a key or value that is not a str (no .encode).
        raise EncodeError(f"header cannot be encoded in binary: {exc}") from None
    ext_bytes = b"".join(ext_parts)
    parts += [_I32.pack(len(ext_bytes)), ext_bytes]
    return b"".join(parts)


# ------------------------------------------------------------------ msgpack (trimq, type 0x4D)
# An array, not a map: [code, language, version, opaque, flag, remark, ext_fields].
_MSGPACK_FIELDS = 7


_STR_ONLY = frozenset({str})


def _all_str(mapping: dict[Any, Any]) -> bool:
    # set(map(type, …)) runs in C: several times faster than a generator over the items.
    types = set(map(type, mapping.values()))
    types.update(map(type, mapping))
    return types <= _STR_ONLY


def decode_msgpack(data: bytes | bytearray) -> Header:
    """Decode trimq's msgpack header. Strict: ext keys and values must be strings."""
    try:
        obj = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types (ValueError, ExtraData, StackError…)
        raise HeaderError(
            f"msgpack header does not parse: {exc!r:.80}", serialize_type=SerializeType.MSGPACK
        ) from None
    if type(obj) is list and len(obj) == _MSGPACK_FIELDS:
        code, language, version, opaque, flag, remark, ext = obj
        # One combined check on the hot path; _msgpack_error explains what failed.
        if (
            type(code) is int
            and type(version) is int
            and type(opaque) is int
            and type(flag) is int
            and INT32_MIN <= code <= INT32_MAX
            and INT32_MIN <= version <= INT32_MAX
            and INT32_MIN <= opaque <= INT32_MAX
            and INT32_MIN <= flag <= INT32_MAX
            and type(language) is str
            and (remark is None or type(remark) is str)
            and type(ext) is dict
            and _all_str(ext)
        ):
            return Header(code, opaque, flag, language, version, remark, ext)
    raise _msgpack_error(obj)


def _msgpack_error(obj: object) -> HeaderError:
    stype = SerializeType.MSGPACK
    if type(obj) is not list or len(obj) != _MSGPACK_FIELDS:
        return HeaderError(
            f"msgpack header must be an array of {_MSGPACK_FIELDS}", serialize_type=stype
        )
    code, language, version, opaque, flag, remark, _ext = obj
    known = opaque if type(opaque) is int and INT32_MIN <= opaque <= INT32_MAX else None
    for name, value in (("code", code), ("version", version), ("opaque", opaque), ("flag", flag)):
        if type(value) is not int or not INT32_MIN <= value <= INT32_MAX:
            return HeaderError(
                f"msgpack header field {name!r} must be a 32-bit integer, got {value!r:.40}",
                opaque=known,
                serialize_type=stype,
            )
    if type(language) is not str or (remark is not None and type(remark) is not str):
        return HeaderError(
            "msgpack header: bad language or remark", opaque=known, serialize_type=stype
        )
    return HeaderError(
        "msgpack header: ext_fields must map strings to strings", opaque=known, serialize_type=stype
    )


def encode_msgpack(cmd: RemotingCommand) -> bytes:
    """Encode the header as trimq's msgpack array."""
    ext = cmd.ext_fields
    try:
        packed: bytes = msgpack.packb(
            [
                cmd.code,
                cmd.language,
                cmd.version,
                cmd.opaque,
                cmd.flag,
                cmd.remark,
                ext if type(ext) is dict else dict(ext),
            ],
            use_bin_type=True,
        )
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"header cannot be packed: {exc}") from None
    return packed


DECODERS: Mapping[int, Callable[[bytes | bytearray], Header]] = {
    SerializeType.JSON: decode_json,
    SerializeType.ROCKETMQ: decode_binary,
    SerializeType.MSGPACK: decode_msgpack,
}

ENCODERS: Mapping[int, Callable[[RemotingCommand], bytes]] = {
    SerializeType.JSON: encode_json,
    SerializeType.ROCKETMQ: encode_binary,
    SerializeType.MSGPACK: encode_msgpack,
}
