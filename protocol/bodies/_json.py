"""JSON as Java's fastjson writes it (lenient in) and as Java clients read it (strict out).

fastjson (RocketMQ's ``RemotingSerializable``) writes maps whose keys are not strings with
the key unquoted: ``{"brokerAddrs":{0:"127.0.0.1:10911"}}`` in route data,
``{"offsetTable":{"t@g":{0:12}}}`` in ``consumerOffset.json`` (apache/rocketmq#1506), and a
bean key as a whole JSON object, ``{"offsetTable":{{"brokerName":"b","queueId":0,
"topic":"t"}:{...}}}`` in ``TopicStatsTable`` and ``ConsumeStats`` (apache/rocketmq#3389).

:func:`loads_lenient` turns every such key into a JSON string before handing the text to the
standard library's (C) parser: a bare key keeps its text (``0`` becomes ``"0"``) and an
object or array key becomes its compact JSON text as a string, which callers parse again
(see ``protocol.bodies.broker``). Standard JSON takes the fast path and is never rewritten.
A container key inside another key is refused: fastjson never writes one, and escaping it
once per level would double the text at every level.
The rewrite is done by a small token scanner that skips string literals whole, so a string
*value* such as ``"{0:"`` or ``",1:"`` is never touched.

:func:`dumps` writes compact standard JSON with quoted keys, which Java clients accept.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from protocol.errors import EncodeError, FieldError

#: The ``field`` of a :class:`FieldError` about the body as a whole.
ROOT: Final = "$"


def _reject_constant(name: str) -> Any:
    # json accepts NaN and Infinity by default; neither is JSON and no Java client sends them.
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)

_WHITESPACE = " \t\r\n"  # JSON's whitespace (not Unicode's)
# One token per match: a whole string literal (unrolled loop: no backtracking blow-up),
# whitespace, a structural character, a bare word (number, true/false/null) or any other
# single character, which the real parser will reject afterwards.
_TOKEN = re.compile(
    r'"[^"\\]*(?:\\.[^"\\]*)*"|[ \t\r\n]+|[{}\[\],:]|[^ \t\r\n{}\[\],:"]+|.',
    re.DOTALL,
)


class _Frame:
    """One open ``{`` or ``[`` while scanning."""

    __slots__ = ("expect_key", "is_object", "key_start")

    def __init__(self, is_object: bool, key_start: int) -> None:
        self.is_object = is_object
        self.expect_key = is_object
        # Index in the output where this container starts when it is itself a map key.
        self.key_start = key_start


def _quote_keys(text: str) -> str | None:
    """Rewrite non-string object keys as strings; ``None`` when there was nothing to do."""
    out: list[str] = []
    stack: list[_Frame] = []
    changed = False
    open_keys = 0  # containers on the stack that are themselves map keys
    for match in _TOKEN.finditer(text):
        tok = match.group()
        first = tok[0]
        if first in _WHITESPACE:
            continue  # insignificant outside strings; dropping it keeps object keys compact
        if tok == '"':
            # An unterminated string: no rewrite can parse. Stopping here also keeps the scan
            # linear: each quote of "\"\"\"… would otherwise rescan to the end of the text.
            return None
        top = stack[-1] if stack else None
        at_key = top is not None and top.expect_key
        if top is not None and at_key:
            top.expect_key = False
        if first in "{[":
            if at_key and open_keys:
                # A key inside a key: each level would escape the inner key's text again,
                # doubling its backslashes (exponential output); fastjson never writes it.
                return None
            changed |= at_key
            open_keys += at_key
            stack.append(_Frame(first == "{", len(out) if at_key else -1))
            out.append(tok)
        elif first in "}]":
            out.append(tok)
            if stack:  # an unbalanced close is left for the parser to reject
                frame = stack.pop()
                if frame.key_start >= 0:
                    open_keys -= 1
                    key = "".join(out[frame.key_start :])
                    del out[frame.key_start :]
                    out.append(json.dumps(key, ensure_ascii=False))
        elif first == ",":
            if top is not None and top.is_object:
                top.expect_key = True
            out.append(tok)
        elif at_key and first != '"':
            out.append(json.dumps(tok))
            changed = True
        else:
            out.append(tok)
    return "".join(out) if changed else None


def _parse(text: str) -> object:
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise FieldError("body is nested too deeply", field=ROOT) from None


def loads_lenient(data: bytes | bytearray | memoryview | str) -> object:
    """Parse a JSON body as fastjson writes it; see the module docstring.

    Raises:
        FieldError: (``field`` is ``"$"``) the body is not UTF-8, not JSON even after quoting
            bare keys, nested too deeply for the parser, or uses NaN/Infinity.
    """
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FieldError(
                f"body is not UTF-8: {exc.reason} at byte {exc.start}", field=ROOT
            ) from None
    try:
        return _parse(text)
    except ValueError as exc:
        first_error = exc
    rewritten = _quote_keys(text)
    if rewritten is not None:
        try:
            return _parse(rewritten)
        except ValueError:
            pass  # report the error at its place in the original text
    raise FieldError(f"body is not JSON: {first_error}", field=ROOT) from None


def dumps(obj: object) -> bytes:
    """Encode ``obj`` as compact UTF-8 JSON (``,``/``:`` separators, keys quoted).

    Raises:
        EncodeError: ``obj`` holds something JSON cannot carry (NaN, a lone surrogate, a
            non-JSON type).
    """
    try:
        return _ENCODER.encode(obj).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise EncodeError(f"value cannot be encoded as JSON: {exc}") from None


def dumps_text(obj: object) -> str:
    """Like :func:`dumps` but returns the text, for bodies assembled from pieces."""
    return dumps(obj).decode("utf-8")
