"""The declarative machinery behind the typed headers: dataclass fields ⇄ ``extFields``.

A header is a frozen, slotted, keyword-only dataclass that inherits :class:`Header`::

    @dataclass(frozen=True, slots=True, kw_only=True)
    class ExampleHeader(Header):
        topic: str                  # Java String, @CFNotNull: no default = required
        queue_id: int               # Java int/Integer: 32-bit signed
        offset: Long                # Java long/Long: 64-bit signed
        committed: bool = True      # a default: optional on the wire, but always sent
        origin_topic: str | None = None   # optional, omitted from the wire when None
        client_id: str = field(metadata=meta(wire="clientID"))   # explicit wire name

A field's wire name is its Python name in RocketMQ's camelCase (``queue_id`` → ``queueId``)
unless ``meta(wire=...)`` gives one. ``meta(choices=...)`` restricts the accepted values.

Encoding follows Java's ``makeCustomHeaderToNet``: ``None`` fields are omitted, booleans are
``"true"``/``"false"``, integers decimal. Decoding is stricter than Java, which logs and skips
a field it cannot parse: here any malformed value, or a missing required field, raises a
:class:`~protocol.errors.FieldError` whose ``field`` is the wire name and whose message names
the header, the field (wire and Python names) and the offending value. Keys the header does
not know (``AccessKey``, ``Signature``, ``OnsChannel``, RPC extras such as ``bname`` or
``lo``) are ignored.

Each class's converters are built once, on first use, and cached (:func:`codec_of`).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Annotated, Any, Generic, Self, TypeVar

from protocol.errors import EncodeError, FieldError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_MAX_SHOWN = 48  # characters of a bad value quoted in an error message


class _LongMarker:
    """Annotation marker: the ``int`` is a Java ``long`` (64-bit), not an ``int``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "LONG"


LONG = _LongMarker()
#: A Java ``long``/``Long`` field: a Python ``int`` validated to the signed 64-bit range.
Long = Annotated[int, LONG]

_WIRE = "trimq.wire"
_CHOICES = "trimq.choices"


def meta(*, wire: str | None = None, choices: Collection[object] | None = None) -> dict[str, Any]:
    """Field metadata: an explicit wire name and/or the set of accepted values.

    Use as ``dataclasses.field(metadata=meta(wire="clientID"))``.
    """
    out: dict[str, Any] = {}
    if wire is not None:
        out[_WIRE] = wire
    if choices is not None:
        out[_CHOICES] = frozenset(choices)
    return out


def camel(name: str) -> str:
    """RocketMQ's wire name for a snake_case Python name: ``ha_server_addr`` → ``haServerAddr``."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class FieldKind(enum.Enum):
    """The Java type of a header field, which decides how its string is parsed."""

    STR = "String"
    INT = "int"
    LONG = "long"
    BOOL = "boolean"


@dataclasses.dataclass(frozen=True, slots=True)
class FieldInfo:
    """What the codec knows about one field (exposed for tests and tooling).

    Attributes:
        name: the Python attribute name.
        wire: the ``extFields`` key.
        kind: the Java type.
        required: no default: absent from ``extFields`` is an error (Java's ``@CFNotNull``).
        nullable: annotated ``X | None``; ``None`` is omitted from the wire.
        choices: the accepted values, or ``None`` for any value of the kind.
        default: the default value (``dataclasses.MISSING`` when required).
    """

    name: str
    wire: str
    kind: FieldKind
    required: bool
    nullable: bool
    choices: frozenset[object] | None
    default: object


# ------------------------------------------------------------------ value parsers
# Parsers raise ValueError(reason); the codec turns that into a FieldError with context.


def _parse_int(raw: str, low: int, high: int, bits: int) -> int:
    # int() alone would accept '1_000', ' 5 ' and non-ASCII digits; Java's parseInt does not
    # accept the first two, and nothing legitimate sends the third.
    body = raw[1:] if raw[:1] in ("+", "-") else raw
    if not (body.isascii() and body.isdigit()):
        raise ValueError(f"must be a decimal {bits}-bit integer")
    try:
        value = int(raw)
    except ValueError:  # more digits than int() will convert: certainly out of range
        value = high + 1
    if not low <= value <= high:
        raise ValueError(f"is outside the signed {bits}-bit range [{low}, {high}]")
    return value


def plain_int(raw: str | None, digits: int, *, signed: bool = False) -> int | None:
    """``raw`` as an int when it is at most ``digits`` plain ASCII digits (with ``signed``,
    after an optional ``-``), else None: the fast rule of :func:`_parse_int32` (9 digits
    always fit a Java int) and :func:`_parse_int64` (18, a long), for header fast paths
    that read ``extFields`` directly and leave anything else to the typed header."""
    if raw is None:
        return None
    body = raw[1:] if signed and raw[:1] == "-" else raw
    if len(body) <= digits and body.isdigit() and body.isascii():
        return int(raw)
    return None


def _parse_int32(raw: str) -> int:
    # Fast path for what clients send almost always: up to 9 plain digits always fit.
    if len(raw) <= 9 and raw.isdigit() and raw.isascii():
        return int(raw)
    return _parse_int(raw, INT32_MIN, INT32_MAX, 32)


def _parse_int64(raw: str) -> int:
    if len(raw) <= 18 and raw.isdigit() and raw.isascii():
        return int(raw)
    return _parse_int(raw, INT64_MIN, INT64_MAX, 64)


# Java writes "true"/"false"; client-cpp writes C++ bools as "1"/"0" (unitMode, batch).
# Java's Boolean.parseBoolean would read "1" as false; we take it as the sender meant it.
_BOOLS = {"true": True, "false": False, "1": True, "0": False}


def _parse_bool(raw: str) -> bool:
    value = _BOOLS.get(raw)
    if value is not None:
        return value
    value = _BOOLS.get(raw.lower()) if raw.isascii() else None
    if value is None:
        raise ValueError("must be true or false (or 1 or 0)")
    return value


_PARSERS: Mapping[FieldKind, Callable[[str], object] | None] = {
    FieldKind.STR: None,  # taken as is
    FieldKind.INT: _parse_int32,
    FieldKind.LONG: _parse_int64,
    FieldKind.BOOL: _parse_bool,
}

_RANGES: Mapping[FieldKind, tuple[int, int]] = {
    FieldKind.INT: (INT32_MIN, INT32_MAX),
    FieldKind.LONG: (INT64_MIN, INT64_MAX),
}


def _with_choices(
    parse: Callable[[str], object] | None, choices: frozenset[object]
) -> Callable[[str], object]:
    shown = ", ".join(sorted(repr(c) for c in choices))

    def parse_choice(raw: str) -> object:
        value = raw if parse is None else parse(raw)
        if value not in choices:
            raise ValueError(f"must be one of {shown}")
        return value

    return parse_choice


def _clip(raw: str) -> str:
    if len(raw) <= _MAX_SHOWN:
        return repr(raw)
    return f"{raw[:_MAX_SHOWN]!r}… ({len(raw)} characters)"


# ------------------------------------------------------------------ annotations → kinds
def _kind_of(annotation: object) -> tuple[FieldKind, bool]:
    """Return (kind, nullable) for a resolved annotation, or raise TypeError."""
    nullable = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1 or len(typing.get_args(annotation)) != 2:
            raise TypeError(f"unsupported header annotation {annotation!r}")
        nullable, annotation = True, args[0]
    if typing.get_origin(annotation) is Annotated:
        base, *extras = typing.get_args(annotation)
        if base is int and LONG in extras:
            return FieldKind.LONG, nullable
    elif annotation is str:
        return FieldKind.STR, nullable
    elif annotation is bool:
        return FieldKind.BOOL, nullable
    elif annotation is int:
        return FieldKind.INT, nullable
    raise TypeError(f"unsupported header annotation {annotation!r}")


def _field_infos(cls: type[Any]) -> tuple[FieldInfo, ...]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass to be a header")
    hints = typing.get_type_hints(cls, include_extras=True)
    infos = []
    for f in dataclasses.fields(cls):
        kind, nullable = _kind_of(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if nullable and f.default is not None:
            raise TypeError(f"{cls.__name__}.{f.name}: an optional field must default to None")
        wire = f.metadata.get(_WIRE, camel(f.name))
        infos.append(
            FieldInfo(f.name, wire, kind, required, nullable, f.metadata.get(_CHOICES), f.default)
        )
    wires = [i.wire for i in infos]
    if len(set(wires)) != len(wires):
        raise TypeError(f"{cls.__name__}: two fields share a wire name ({wires})")
    return tuple(infos)


# ------------------------------------------------------------------ the codec
H = TypeVar("H", bound="Header")


@dataclasses.dataclass(frozen=True, slots=True)
class _Slot:
    """One field, precomputed for the hot path."""

    name: str
    wire: str
    required: bool
    parse: Callable[[str], object] | None
    kind: FieldKind
    choices: frozenset[object] | None
    desc: str  # how error messages name the field


class Codec(Generic[H]):
    """Converts one header class to and from ``extFields``.

    Args:
        cls: the header dataclass.
        wire_names: Python name → wire name overrides (e.g. the one-letter names of
            ``SendMessageRequestHeaderV2``); fields not listed keep their usual name.
        label: the header name used in error messages (default: the class name).
    """

    __slots__ = ("_make", "_rows", "_slots", "cls", "fields", "label")

    def __init__(
        self, cls: type[H], *, wire_names: Mapping[str, str] | None = None, label: str | None = None
    ) -> None:
        self.cls = cls
        self._make: Callable[..., H] = cls
        self.label = label or cls.__name__
        renames = dict(wire_names or {})
        infos = _field_infos(cls)
        unknown = set(renames) - {i.name for i in infos}
        if unknown:
            raise TypeError(f"{self.label}: wire_names for unknown fields {sorted(unknown)}")
        self.fields = tuple(dataclasses.replace(i, wire=renames.get(i.name, i.wire)) for i in infos)
        self._slots = tuple(
            _Slot(new.name, new.wire, new.required, _parser(new), new.kind, new.choices, desc)
            for new, desc in zip(self.fields, map(_describe, self.fields, infos), strict=True)
        )
        # Plain tuples for decode's loop: unpacking beats attribute access on the hot path.
        self._rows = tuple((s.name, s.wire, s.required, s.parse, s.desc) for s in self._slots)

    def decode(self, ext: Mapping[str, str]) -> H:
        """Build the header from ``extFields``.

        Raises:
            FieldError: a required field is missing or a value does not parse.
        """
        values: dict[str, object] = {}
        get = ext.get
        for name, wire, required, parse, desc in self._rows:
            raw = get(wire)
            if raw is None:
                if required:
                    raise FieldError(f"{self.label}: required field {desc} is missing", field=wire)
                continue  # the dataclass default applies
            if parse is None:
                values[name] = raw
                continue
            try:
                values[name] = parse(raw)
            except ValueError as exc:
                raise FieldError(
                    f"{self.label}: field {desc} {exc}, got {_clip(raw)}", field=wire
                ) from None
        return self._make(**values)

    def encode(self, header: H) -> dict[str, str]:
        """The header's ``extFields``: ``None`` omitted, booleans ``true``/``false``.

        Raises:
            EncodeError: an integer does not fit its Java type, or a value is not one of
                the field's choices.
        """
        out: dict[str, str] = {}
        for s in self._slots:
            value = getattr(header, s.name)
            if value is None:
                continue
            if s.choices is not None and value not in s.choices:
                raise EncodeError(f"{self.label}: field {s.desc} = {value!r} is not allowed")
            if s.kind is FieldKind.STR:
                out[s.wire] = value
            elif s.kind is FieldKind.BOOL:
                out[s.wire] = "true" if value else "false"
            else:
                out[s.wire] = self._format_int(s, value)
        return out

    def _format_int(self, s: _Slot, value: int) -> str:
        low, high = _RANGES[s.kind]
        if not low <= value <= high:
            raise EncodeError(
                f"{self.label}: field {s.desc} = {value} does not fit a Java {s.kind.value}"
            )
        return str(int(value))  # int() so an IntEnum member is written as its number


def _parser(info: FieldInfo) -> Callable[[str], object] | None:
    parse = _PARSERS[info.kind]
    return parse if info.choices is None else _with_choices(parse, info.choices)


def _describe(info: FieldInfo, original: FieldInfo) -> str:
    aliases = [n for n in (original.wire, info.name) if n != info.wire]
    aliases = list(dict.fromkeys(aliases))  # V1 wire name may equal the Python name
    return f"{info.wire!r} ({', '.join(aliases)})" if aliases else repr(info.wire)


_CODECS: dict[type[Any], Codec[Any]] = {}


def codec_of(cls: type[H]) -> Codec[H]:
    """The cached default :class:`Codec` of a header class."""
    codec = _CODECS.get(cls)
    if codec is None:
        codec = _CODECS[cls] = Codec(cls)
    return codec


def fields_of(cls: type[Header]) -> tuple[FieldInfo, ...]:
    """The fields of a header class as the codec sees them (wire names, kinds, defaults)."""
    return codec_of(cls).fields


# ------------------------------------------------------------------ the mixin
class Header:
    """Base of every typed header; subclasses are frozen keyword-only dataclasses."""

    __slots__ = ()

    @classmethod
    def from_ext(cls, ext: Mapping[str, str]) -> Self:
        """Decode ``extFields`` into this header.

        Raises:
            FieldError: a required field is missing or a value is malformed.
        """
        return codec_of(cls).decode(ext)

    def to_ext(self) -> dict[str, str]:
        """Encode this header as ``extFields`` (Java's ``makeCustomHeaderToNet``)."""
        return codec_of(type(self)).encode(self)


def from_ext(cls: type[H], ext: Mapping[str, str]) -> H:
    """Decode ``ext`` as header ``cls`` (same as ``cls.from_ext(ext)``)."""
    return codec_of(cls).decode(ext)


def to_ext(header: Header) -> dict[str, str]:
    """Encode a header as ``extFields`` (same as ``header.to_ext()``)."""
    return codec_of(type(header)).encode(header)
