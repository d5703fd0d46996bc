"""Typed, path-aware field access for decoded JSON bodies, and the body base class.

Java reads bodies with fastjson, which is forgiving: a missing or ``null`` field keeps the
Java default, numbers may arrive as numeric strings (the C++ client sends ``subVersion`` as
``"1795306582035"``), enums as names or ordinals. The readers here accept the same inputs and
reject everything else with a :class:`FieldError` whose ``field`` is the JSON path of the bad
value (``consumerDataSet[0].subscriptionDataSet[1].topic``), never a ``KeyError`` or
``TypeError``.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Final, Self, TypeVar

from protocol.bodies._json import ROOT, dumps, loads_lenient
from protocol.errors import FieldError

E = TypeVar("E", bound=IntEnum)

INT32: Final = (-(2**31), 2**31 - 1)
INT64: Final = (-(2**63), 2**63 - 1)
_MAX_DIGITS = 20  # a Java long has at most 19 digits plus a sign


def kind(value: object) -> str:
    """The JSON type name of a decoded value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _bad(path: str, expected: str, value: object) -> FieldError:
    return FieldError(
        f"{path or 'body'}: expected {expected}, got {kind(value)}", field=path or ROOT
    )


def as_text(value: object, path: str) -> str:
    """A JSON string."""
    if type(value) is str:
        return value
    raise _bad(path, "a string", value)


def as_int(value: object, path: str, bounds: tuple[int, int] = INT64) -> int:
    """A JSON integer or a numeric string (fastjson accepts both), within ``bounds``."""
    if type(value) is str:
        digits = value
        body = digits[1:] if digits[:1] in "+-" else digits
        if body.isascii() and body.isdigit() and len(digits) <= _MAX_DIGITS:
            value = int(digits)
    if type(value) is not int:  # bool is an int subclass, but `true` is not a number
        raise _bad(path, "an integer", value)
    low, high = bounds
    if not low <= value <= high:
        raise FieldError(f"{path}: {value} is outside {low}..{high}", field=path or ROOT)
    return value


def as_bool(value: object, path: str) -> bool:
    """A JSON boolean; also ``0``/``1`` and ``"true"``/``"false"``/``"0"``/``"1"``."""
    if type(value) is bool:
        return value
    if type(value) is int and value in (0, 1):
        return bool(value)
    if type(value) is str and value.lower() in ("true", "false", "0", "1"):
        return value.lower() in ("true", "1")
    raise _bad(path, "a boolean", value)


def as_float(value: object, path: str) -> float:
    """A finite JSON number (a Java ``double``); ``1e999`` and ``10**400`` are out of range."""
    if type(value) is int or type(value) is float:
        try:
            number = float(value)
        except OverflowError:  # an integer beyond a double
            number = math.inf
        if math.isfinite(number):
            return number
        raise FieldError(f"{path}: {value!r:.40} is outside a Java double", field=path or ROOT)
    raise _bad(path, "a number", value)


def as_enum(value: object, path: str, cls: type[E]) -> E:
    """An enum by name (fastjson's default) or by ordinal (what the C++ client sends)."""
    if type(value) is str and value in cls.__members__:
        return cls[value]
    if type(value) is str or type(value) is int:
        try:
            return cls(as_int(value, path, INT32))
        except (FieldError, ValueError):
            pass
    names = ", ".join(cls.__members__)
    raise FieldError(
        f"{path}: expected one of {names} or its ordinal, got {value!r:.40}", field=path
    )


def as_list(value: object, path: str) -> list[tuple[object, str]]:
    """A JSON array (a Java ``List`` or ``Set``): its elements with their paths."""
    if type(value) is not list:
        raise _bad(path, "an array", value)
    return [(item, f"{path}[{i}]") for i, item in enumerate(value)]


def as_texts(value: object, path: str) -> tuple[str, ...]:
    """A JSON array of strings."""
    return tuple(as_text(item, at) for item, at in as_list(value, path))


class Fields:
    """A decoded JSON object and its path; absent and ``null`` fields read as defaults."""

    __slots__ = ("_obj", "path")

    def __init__(self, obj: object, path: str = "") -> None:
        if type(obj) is not dict:
            raise _bad(path, "an object", obj)
        self._obj: dict[str, object] = obj
        self.path = path

    def at(self, name: str) -> str:
        """The path of field ``name``."""
        return f"{self.path}.{name}" if self.path else name

    def get(self, name: str, *alternates: str) -> tuple[object, str]:
        """The value of the first of ``name``/``alternates`` that is set, and its path."""
        for key in (name, *alternates):
            value = self._obj.get(key)
            if value is not None:
                return value, self.at(key)
        return None, self.at(name)

    def text(self, name: str, *alternates: str) -> str:
        """A required string."""
        value, path = self.get(name, *alternates)
        if value is None:
            raise FieldError(f"{path}: missing", field=path)
        return as_text(value, path)

    def opt_text(self, name: str) -> str | None:
        """An optional string."""
        value, path = self.get(name)
        return None if value is None else as_text(value, path)

    def text_or(self, name: str, default: str) -> str:
        """A string with a default."""
        value, path = self.get(name)
        return default if value is None else as_text(value, path)

    def int32(self, name: str, default: int | None = 0, *alternates: str) -> int:
        """A Java ``int``; required when ``default`` is ``None``."""
        return self._int(INT32, name, default, alternates)

    def int64(self, name: str, default: int | None = 0, *alternates: str) -> int:
        """A Java ``long``; required when ``default`` is ``None``."""
        return self._int(INT64, name, default, alternates)

    def _int(
        self, bounds: tuple[int, int], name: str, default: int | None, alternates: tuple[str, ...]
    ) -> int:
        value, path = self.get(name, *alternates)
        if value is not None:
            return as_int(value, path, bounds)
        if default is None:
            raise FieldError(f"{path}: missing", field=path)
        return default

    def boolean(self, name: str, default: bool = False) -> bool:
        """A Java ``boolean``."""
        value, path = self.get(name)
        return default if value is None else as_bool(value, path)

    def number(self, name: str, default: float = 0.0) -> float:
        """A Java ``double``."""
        value, path = self.get(name)
        return default if value is None else as_float(value, path)

    def enum(self, name: str, cls: type[E], default: E | None = None) -> E:
        """An enum; required when ``default`` is ``None``."""
        value, path = self.get(name)
        if value is not None:
            return as_enum(value, path, cls)
        if default is None:
            raise FieldError(f"{path}: missing", field=path)
        return default

    def items(self, name: str) -> list[tuple[object, str]]:
        """The elements of an array (a Java ``List`` or ``Set``) with their paths."""
        value, path = self.get(name)
        return [] if value is None else as_list(value, path)

    def texts(self, name: str) -> tuple[str, ...]:
        """An array of strings."""
        value, path = self.get(name)
        return () if value is None else as_texts(value, path)

    def entries(self, name: str) -> list[tuple[str, object, str]]:
        """The entries of a map as ``(key, value, path)``; keys come back as strings."""
        value, path = self.get(name)
        if value is None:
            return []
        if type(value) is not dict:
            raise _bad(path, "an object", value)
        out = [(key, item, f"{path}[{key}]") for key, item in value.items()]
        for key, _, at in out:
            if type(key) is not str:  # only reachable from Python callers of from_obj
                raise FieldError(f"{at}: map keys must be strings", field=at)
        return out


class JsonBody:
    """Base of the body dataclasses: JSON in and out through ``from_obj``/``to_obj``."""

    __slots__ = ()

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from an already parsed JSON value; ``path`` prefixes error fields."""
        raise NotImplementedError

    def to_obj(self) -> dict[str, object]:
        """The JSON object (field names as Java writes them)."""
        raise NotImplementedError

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview | str) -> Self:
        """Decode a body; every malformed input raises :class:`~protocol.errors.FieldError`."""
        return cls.from_obj(loads_lenient(data))

    def to_json(self) -> bytes:
        """Encode as compact UTF-8 JSON."""
        return dumps(self.to_obj())
