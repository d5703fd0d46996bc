"""RocketMQ's SQL92 message selectors: parse once per subscription, evaluate per message.

A consumer that subscribes with expression type ``SQL92`` sends a boolean expression over the
message's properties (all strings; the tag is the property ``TAGS``); the broker delivers a
message only when the expression is TRUE for it: FALSE and NULL both filter it out.
:func:`compile_selector` parses the text into an immutable AST (:func:`parse`) and compiles
that into closures, so :meth:`Selector.matches` does no parsing or dispatch on node types.

The rules below are RocketMQ 5's, read from ``filter/src/main/java/org/apache/rocketmq/filter/``
(``parser/SelectorParser.jj`` and the generated ``parser/SelectorParser.java``;
``expression/ComparisonExpression.java``, ``LogicExpression.java``, ``UnaryExpression.java``,
``ConstantExpression.java``, ``BooleanConstantExpression.java``, ``PropertyExpression.java``)
and from the broker's ``broker/src/main/java/org/apache/rocketmq/broker/filter/``
(``ExpressionMessageFilter.java``, ``MessageEvaluationContext.java``).

Lexical rules
  * Keywords (``AND OR NOT BETWEEN IN IS NULL TRUE FALSE CONTAINS STARTSWITH ENDSWITH``) are
    case-insensitive. Property names are ASCII ``[A-Za-z_$][A-Za-z0-9_$]*``, case-sensitive,
    and never a keyword.
  * Strings are single-quoted; ``''`` stands for one quote, every other character (line
    breaks included) for itself.
  * Integers are ``0`` or ``[1-9][0-9]*``, optionally suffixed ``L``, at most Java's
    ``Long.MAX_VALUE``; a value above ``2**31 - 1`` is a Java long, the rest are ints (which
    decides how a property string is parsed to meet it, below). Decimals are ``1.5``, ``1.``,
    ``.5``, ``1e3``, ``1.5E-2``. No hex, octal or signed literals: ``-5`` is a negation. A
    decimal that overflows or is below ``Double.MIN_VALUE``, so ``0.0`` too, is rejected.
  * Whitespace is space, tab, CR, LF and FF; ``-- ...`` and ``/* ... */`` are comments.

Grammar, loosest first; binary levels are left-associative
  1. ``OR``; 2. ``AND``; 3. ``=``, ``<>``, ``IS [NOT] NULL``;
  4. ``>``, ``>=``, ``<``, ``<=``, ``[NOT] BETWEEN lo AND hi``, ``[NOT] IN ('s', ...)``,
     ``[NOT] CONTAINS|STARTSWITH|ENDSWITH 's'``; 5. prefix ``NOT``, ``-``, ``+``;
  6. a literal, a property or ``( ... )``.
  Prefix ``NOT`` binds tighter than comparisons: ``NOT a = 1`` is ``(NOT a) = 1`` (never
  TRUE), and ``NOT a > 1`` is an error; write ``NOT (a = 1)``.

Checks made while parsing (RocketMQ rejects these too)
  * The whole expression and each operand of ``AND``, ``OR`` and ``NOT`` is a condition: a
    comparison or logical operation, ``TRUE``, ``FALSE``, ``NULL`` or a bare property.
  * ``=`` and ``<>``: no ``NULL`` literal on either side (use ``IS NULL``), and ``TRUE`` or
    ``FALSE`` on the left cannot face a string or number literal.
  * ``>`` and friends, BETWEEN included: no string, boolean or ``NULL`` literal and no
    condition on either side; ``BETWEEN`` with two number literals needs ``lo <= hi``.
  * ``IN`` needs a property on its left and string literals in its list; ``CONTAINS`` and
    friends need a string literal on their right.

Evaluation: values are NULL, strings, Java ints, longs and doubles, and booleans
  * ``AND`` and ``OR`` use three-valued logic left to right and stop at the first FALSE
    (``AND``) or TRUE (``OR``); ``NOT NULL`` is NULL.
  * A bare property used as a condition is NULL when absent and FALSE otherwise (its value is
    a string, not a boolean), so ``NOT a`` is TRUE for any message that has ``a``.
  * ``x = y`` is TRUE when both sides are NULL, NULL when only ``x`` is, FALSE when only ``y``
    is, and otherwise compares them as below; ``x <> y`` is ``NOT (x = y)``.
  * ``>``, ``>=``, ``<``, ``<=`` are NULL when a side is NULL; two strings are both parsed as
    Java doubles (so ``a > b`` compares numerically).
  * Different types: a string meeting a number is parsed as that number's Java type
    (``Integer.valueOf``, ``Long.valueOf``, ``Double.valueOf``: ``a > 5`` fails on ``'5.5'``
    where ``a > 5.0`` works); a string meeting a boolean is ``true`` when it equals "true" in
    any case; an int meeting a long widens, either meeting a double becomes one. Doubles order
    as ``Double.compareTo`` does (NaN above everything, -0.0 below 0.0). Booleans and numbers
    are never equal. A boolean on the left of a string is an error (Java's
    ``ClassCastException``), so ``TRUE = a`` never matches a message that has ``a``.
  * ``x BETWEEN lo AND hi`` is ``x >= lo AND x <= hi``; ``NOT BETWEEN`` is ``x < lo OR x > hi``.
  * ``IN`` is NULL for an absent property, else (non-)membership.
  * ``CONTAINS``, ``STARTSWITH``, ``ENDSWITH`` and their ``NOT`` forms are FALSE when the
    pattern is empty or the value is not a string (an absent property included).
  * ``IS NULL`` and ``IS NOT NULL`` are never NULL.
  * ``-x`` negates a number and is NULL for anything else (a property, say).
  * An error (a string that does not parse as the number it meets; a boolean left of a
    string) ends the evaluation and the message does not match, as ``ExpressionMessageFilter``
    catches the exception; short-circuiting ``AND``/``OR`` may skip the failing operand.

Deliberate differences
  * RocketMQ's parser stops after the first complete expression and ignores the rest
    (``a = 1 b = 2`` filters on ``a = 1``); here any trailing text is an error. For the same
    reason a ``--`` comment may run to the end of the text (RocketMQ needs a line break but
    then ignores the trailing ``--...`` tokens anyway), so ``--`` always starts a comment:
    write ``- -5`` for a double negation.
  * Bad input has bounded cost: at most :data:`MAX_EXPRESSION_LENGTH` characters and
    :data:`MAX_DEPTH` levels of nesting (RocketMQ has neither limit).
"""

from __future__ import annotations

import math
import operator
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final, Literal, NamedTuple, TypeAlias

__all__ = [
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "And",
    "Between",
    "BooleanLiteral",
    "Comparison",
    "ComparisonOp",
    "FloatLiteral",
    "In",
    "IntegerLiteral",
    "IsNull",
    "MatchOp",
    "Negate",
    "Node",
    "Not",
    "NullLiteral",
    "Or",
    "Property",
    "Selector",
    "SelectorError",
    "StringLiteral",
    "StringMatch",
    "compile_selector",
    "parse",
    "render",
]

#: Longest expression accepted, in characters. RocketMQ has no limit; 4 KiB is far more than
#: any hand-written selector and keeps parsing a hostile one cheap.
MAX_EXPRESSION_LENGTH: Final = 4096
#: Deepest nesting accepted: parentheses, prefix operators and chained comparisons each add a
#: level. Keeps the recursive parser, compiler and evaluator far from Python's stack limit.
MAX_DEPTH: Final = 64

_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1
_LONG_MIN: Final = -(2**63)
_LONG_MAX: Final = 2**63 - 1
#: ``Double.MIN_VALUE``: RocketMQ rejects decimal literals below it.
_DOUBLE_MIN: Final = 5e-324


class SelectorError(ValueError):
    """An expression that is not a valid selector.

    Attributes:
        reason: What is wrong, without the position.
        position: Character offset of the problem in ``expression``.
        expression: The text that was parsed.
    """

    def __init__(self, reason: str, position: int, expression: str) -> None:
        super().__init__(f"{reason} at position {position}: {_excerpt(expression, position)}")
        self.reason = reason
        self.position = position
        self.expression = expression


def _excerpt(text: str, position: int) -> str:
    """The text around ``position`` on one line, with ``[here]`` marking the spot."""
    start, end = max(0, position - 40), position + 20
    before = ("..." if start else "") + text[start:position]
    after = text[position:end] + ("..." if end < len(text) else "")
    return _ONE_LINE.sub(" ", f"{before}[here]{after}")


_ONE_LINE = re.compile(r"[\x00-\x1f]")

# ------------------------------------------------------------------ the AST

ComparisonOp: TypeAlias = Literal["=", "<>", ">", ">=", "<", "<="]
MatchOp: TypeAlias = Literal["CONTAINS", "STARTSWITH", "ENDSWITH"]


@dataclass(frozen=True, slots=True)
class Property:
    """A message property, NULL when the message does not have it."""

    name: str
    depth: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class StringLiteral:
    """A quoted string (``value`` is unescaped)."""

    value: str
    depth: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class IntegerLiteral:
    """An integer literal, ``0 <= value <= 2**63 - 1``; ints above ``2**31 - 1`` are longs."""

    value: int
    depth: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class FloatLiteral:
    """A decimal literal: finite and at least ``Double.MIN_VALUE``."""

    value: float
    depth: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class BooleanLiteral:
    """``TRUE`` or ``FALSE``."""

    value: bool
    depth: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class NullLiteral:
    """``NULL``."""

    depth: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Negate:
    """Prefix ``-``."""

    operand: Node
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", self.operand.depth + 1)


@dataclass(frozen=True, slots=True)
class Not:
    """Prefix ``NOT``."""

    operand: Node
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", self.operand.depth + 1)


@dataclass(frozen=True, slots=True)
class And:
    """``a AND b AND ...``: an unparenthesised chain is one node (two operands or more)."""

    operands: tuple[Node, ...]
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", max(node.depth for node in self.operands) + 1)


@dataclass(frozen=True, slots=True)
class Or:
    """``a OR b OR ...``: an unparenthesised chain is one node (two operands or more)."""

    operands: tuple[Node, ...]
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", max(node.depth for node in self.operands) + 1)


@dataclass(frozen=True, slots=True)
class Comparison:
    """``left op right`` for ``=``, ``<>``, ``>``, ``>=``, ``<`` and ``<=``."""

    op: ComparisonOp
    left: Node
    right: Node
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", max(self.left.depth, self.right.depth) + 1)


@dataclass(frozen=True, slots=True)
class IsNull:
    """``operand IS NULL``, or ``IS NOT NULL`` when negated."""

    operand: Node
    negated: bool = False
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", self.operand.depth + 1)


@dataclass(frozen=True, slots=True)
class Between:
    """``operand [NOT] BETWEEN low AND high``, bounds included."""

    operand: Node
    low: Node
    high: Node
    negated: bool = False
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        depth = max(self.operand.depth, self.low.depth, self.high.depth) + 1
        object.__setattr__(self, "depth", depth)


@dataclass(frozen=True, slots=True)
class In:
    """``property [NOT] IN ('a', 'b', ...)``; the list keeps its order and duplicates."""

    operand: Property
    values: tuple[str, ...]
    negated: bool = False
    depth: ClassVar[int] = 2


@dataclass(frozen=True, slots=True)
class StringMatch:
    """``operand [NOT] CONTAINS|STARTSWITH|ENDSWITH 'pattern'``."""

    op: MatchOp
    operand: Node
    pattern: str
    negated: bool = False
    depth: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "depth", self.operand.depth + 1)


#: Any node of a parsed selector.
Node: TypeAlias = (
    Property
    | StringLiteral
    | IntegerLiteral
    | FloatLiteral
    | BooleanLiteral
    | NullLiteral
    | Negate
    | Not
    | And
    | Or
    | Comparison
    | IsNull
    | Between
    | In
    | StringMatch
)

#: The literal nodes (RocketMQ's ``ConstantExpression``).
_LITERALS = (StringLiteral, IntegerLiteral, FloatLiteral, BooleanLiteral, NullLiteral)
#: Nodes that RocketMQ types as boolean (``BooleanExpression``): they cannot be ordered, and
#: together with a bare property they are what AND, OR and NOT accept.
_CONDITIONS = (Comparison, IsNull, Between, In, StringMatch, And, Or, Not, BooleanLiteral)
_CONDITIONS_AND_NULL = (*_CONDITIONS, NullLiteral)

# ------------------------------------------------------------------ tokens

_KEYWORDS: Final = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"}
    | {"CONTAINS", "STARTSWITH", "ENDSWITH"}
)
# Alternatives are ordered so that the first match is also JavaCC's longest one: a decimal
# before an integer ("1.5", "1e3"), and "--" is a comment before it could be two minus signs.
_TOKEN: Final = re.compile(
    r"(?P<SKIP>[ \t\n\r\f]+|--[^\n\r]*(?:\r\n|\n|\r|\Z)|/\*[^*]*\*+(?:[^/*][^*]*\*+)*/)"
    r"|(?P<FLOAT>[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
    r"|[0-9]+[eE][+-]?[0-9]+)"
    r"|(?P<INT>0|[1-9][0-9]*[lL]?)"
    r"|(?P<STRING>'(?:[^']|'')*')"
    r"|(?P<ID>[A-Za-z_$][A-Za-z0-9_$]*)"
    r"|(?P<PUNCT><>|<=|>=|[=<>(),+-])"
)


class _Token(NamedTuple):
    kind: str  # a keyword in upper case, ID, INT, FLOAT, STRING, the punctuation, or EOF
    text: str
    pos: int


def _tokenize(text: str) -> list[_Token]:
    """Split ``text`` into tokens, comments and whitespace dropped, ending with EOF."""
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise SelectorError(_lexical_problem(text, pos), pos, text)
        kind = match.lastgroup
        assert kind is not None  # every alternative is a named group
        if kind != "SKIP":
            word = match.group()
            if kind == "ID" and word.upper() in _KEYWORDS:
                kind = word.upper()
            elif kind == "PUNCT":
                kind = word
            tokens.append(_Token(kind, word, pos))
        pos = match.end()
    tokens.append(_Token("EOF", "", len(text)))
    return tokens


def _lexical_problem(text: str, pos: int) -> str:
    """Why no token starts at ``pos``."""
    if text.startswith("'", pos):
        return "unterminated string literal"
    if text.startswith("/*", pos):
        return "unterminated comment"
    if text.startswith('"', pos):
        return "unexpected '\"' (string literals take single quotes)"
    return f"unexpected character {text[pos]!r}"


# ------------------------------------------------------------------ parser

_ORDERING_OPS: Final[dict[str, ComparisonOp]] = {">": ">", ">=": ">=", "<": "<", "<=": "<="}
_EQUALITY_OPS: Final[dict[str, ComparisonOp]] = {"=": "=", "<>": "<>"}
_MATCH_OPS: Final[dict[str, MatchOp]] = {
    "CONTAINS": "CONTAINS",
    "STARTSWITH": "STARTSWITH",
    "ENDSWITH": "ENDSWITH",
}
#: Keywords that may follow an infix NOT.
_NEGATABLE: Final = frozenset({"BETWEEN", "IN", *_MATCH_OPS})


def parse(expression: str) -> Node:
    """Parse a selector into its AST.

    Args:
        expression: The SQL92 selector text.

    Returns:
        The root node, always a condition.

    Raises:
        SelectorError: The text is not a valid selector (and nothing else, for any string).
    """
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise SelectorError(
            f"the expression is longer than {MAX_EXPRESSION_LENGTH} characters",
            MAX_EXPRESSION_LENGTH,
            expression,
        )
    return _Parser(expression, _tokenize(expression)).selector()


class _Parser:
    """Recursive descent, one method per precedence level (loosest first).

    Each method mirrors a production of RocketMQ's ``SelectorParser.jj`` and makes the checks
    RocketMQ makes when it builds the node, so a node that exists is one RocketMQ accepts.
    """

    def __init__(self, text: str, tokens: list[_Token]) -> None:
        self._text = text
        self._tokens = tokens
        self._index = 0
        self._nesting = 0

    # -------------------------------------------------------------- token access

    def _peek(self, ahead: int = 0) -> _Token:
        return self._tokens[min(self._index + ahead, len(self._tokens) - 1)]

    def _next(self) -> _Token:
        token = self._tokens[self._index]
        if token.kind != "EOF":
            self._index += 1
        return token

    def _end(self) -> int:
        """Where the last consumed token ends."""
        if self._index == 0:
            return 0
        last = self._tokens[self._index - 1]
        return last.pos + len(last.text)

    def _error(self, reason: str, pos: int) -> SelectorError:
        return SelectorError(reason, pos, self._text)

    def _expect(self, kind: str, reason: str) -> _Token:
        token = self._peek()
        if token.kind != kind:
            raise self._error(f"{reason}, found {_describe(token)}", token.pos)
        return self._next()

    def _source(self, start: int) -> str:
        """The text from ``start`` to the end of the last consumed token, for messages."""
        return _clip(self._text[start : self._end()])

    # -------------------------------------------------------------- limits

    def _checked(self, node: Node, pos: int) -> Node:
        if node.depth > MAX_DEPTH:
            raise self._error(f"the expression nests deeper than {MAX_DEPTH} levels", pos)
        return node

    def _enter(self, token: _Token) -> None:
        """Count one more level of parser recursion (a parenthesis or a prefix operator)."""
        self._nesting += 1
        if self._nesting > MAX_DEPTH:
            raise self._error(f"the expression nests deeper than {MAX_DEPTH} levels", token.pos)

    # -------------------------------------------------------------- grammar

    def selector(self) -> Node:
        first = self._peek()
        if first.kind == "EOF":
            raise self._error("the expression is empty", first.pos)
        node = self._or()
        self._require_condition(node, first.pos)
        trailing = self._peek()
        if trailing.kind != "EOF":
            raise self._error(
                f"unexpected {_describe(trailing)} after a complete expression", trailing.pos
            )
        return node

    def _or(self) -> Node:
        start = self._peek().pos
        node = self._and()
        if self._peek().kind != "OR":
            return node
        self._require_condition(node, start)
        operands, keyword_pos = [node], self._peek().pos
        while self._peek().kind == "OR":
            self._next()
            start = self._peek().pos
            operands.append(self._require_condition(self._and(), start))
        return self._checked(Or(tuple(operands)), keyword_pos)

    def _and(self) -> Node:
        start = self._peek().pos
        node = self._equality()
        if self._peek().kind != "AND":
            return node
        self._require_condition(node, start)
        operands, keyword_pos = [node], self._peek().pos
        while self._peek().kind == "AND":
            self._next()
            start = self._peek().pos
            operands.append(self._require_condition(self._equality(), start))
        return self._checked(And(tuple(operands)), keyword_pos)

    def _equality(self) -> Node:
        start = self._peek().pos
        left = self._comparison()
        left_source = self._source(start)
        while True:
            token = self._peek()
            if token.kind in _EQUALITY_OPS:
                self._next()
                right_start = self._peek().pos
                right = self._comparison()
                self._check_equality(left, start, left_source, right, right_start)
                left = Comparison(_EQUALITY_OPS[token.kind], left, right)
            elif token.kind == "IS":
                self._next()
                negated = self._peek().kind == "NOT"
                if negated:
                    self._next()
                self._expect("NULL", "expected NULL or NOT NULL after IS")
                left = IsNull(left, negated)
            else:
                return left
            left = self._checked(left, token.pos)
            left_source = self._source(start)

    def _comparison(self) -> Node:
        start = self._peek().pos
        left = self._unary()
        while True:
            token = self._peek()
            negated = token.kind == "NOT" and self._peek(1).kind in _NEGATABLE
            if negated:
                self._next()
            keyword = self._peek()
            if keyword.kind in _ORDERING_OPS and not negated:
                left = self._ordering(left, start)
            elif keyword.kind in _MATCH_OPS:
                self._next()
                pattern = self._string(f"expected a string literal after {keyword.kind}")
                left = StringMatch(_MATCH_OPS[keyword.kind], left, pattern, negated)
            elif keyword.kind == "BETWEEN":
                left = self._between(left, start, negated)
            elif keyword.kind == "IN":
                left = self._in(left, start, negated)
            else:
                return left
            left = self._checked(left, token.pos)

    def _ordering(self, left: Node, start: int) -> Node:
        left_source = self._source(start)
        op = self._next()
        right_start = self._peek().pos
        right = self._unary()
        self._require_orderable(left, start, left_source)
        self._require_orderable(right, right_start, self._source(right_start))
        return Comparison(_ORDERING_OPS[op.kind], left, right)

    def _between(self, operand: Node, start: int, negated: bool) -> Node:
        operand_source = self._source(start)
        self._next()
        low_start = self._peek().pos
        low = self._unary()
        low_source = self._source(low_start)
        self._expect("AND", "expected AND between the bounds of BETWEEN")
        high_start = self._peek().pos
        high = self._unary()
        # RocketMQ checks literal bounds for BETWEEN only, not for NOT BETWEEN.
        if not negated and _descending(low, high):
            raise self._error(
                f"BETWEEN bounds are reversed: {low_source} is above {self._source(high_start)}",
                low_start,
            )
        self._require_orderable(operand, start, operand_source)
        self._require_orderable(low, low_start, low_source)
        self._require_orderable(high, high_start, self._source(high_start))
        return Between(operand, low, high, negated)

    def _in(self, operand: Node, start: int, negated: bool) -> Node:
        if not isinstance(operand, Property):
            raise self._error(f"IN needs a property on its left, not {self._source(start)}", start)
        self._next()
        self._expect("(", "expected '(' after IN")
        values = [self._string("expected a string literal in the IN list")]
        while self._peek().kind == ",":
            self._next()
            values.append(self._string("expected a string literal in the IN list"))
        self._expect(")", "expected ',' or ')' in the IN list")
        return In(operand, tuple(values), negated)

    def _unary(self) -> Node:
        token = self._peek()
        if token.kind not in ("+", "-", "NOT"):
            return self._primary()
        self._next()
        self._enter(token)
        start = self._peek().pos
        operand = self._unary()
        self._nesting -= 1
        if token.kind == "+":
            return operand  # RocketMQ drops a unary plus
        if token.kind == "-":
            return self._checked(Negate(operand), token.pos)
        self._require_condition(operand, start)
        return self._checked(Not(operand), token.pos)

    def _primary(self) -> Node:
        token = self._next()
        kind = token.kind
        if kind == "ID":
            return Property(token.text)
        if kind == "STRING":
            return StringLiteral(_unquote(token.text))
        if kind == "INT":
            return IntegerLiteral(self._integer(token))
        if kind == "FLOAT":
            return FloatLiteral(self._float(token))
        if kind in ("TRUE", "FALSE"):
            return BooleanLiteral(kind == "TRUE")
        if kind == "NULL":
            return NullLiteral()
        if kind == "(":
            self._enter(token)
            node = self._or()
            self._expect(")", f"expected ')' to close the '(' opened at position {token.pos}")
            self._nesting -= 1
            return node
        raise self._error(self._missing_value(token), token.pos)

    # -------------------------------------------------------------- pieces

    def _missing_value(self, found: _Token) -> str:
        previous = self._tokens[self._index - 2] if self._index >= 2 else None
        if found.kind == "EOF":
            previous = self._tokens[self._index - 1] if self._index >= 1 else None
        where = f" after {previous.text!r}" if previous is not None else ""
        return f"expected a value{where}, found {_describe(found)}"

    def _string(self, reason: str) -> str:
        return _unquote(self._expect("STRING", reason).text)

    def _integer(self, token: _Token) -> int:
        digits = token.text.rstrip("lL")
        # The length test first: int() refuses strings of more than 4300 digits.
        if len(digits) > 19 or int(digits) > _LONG_MAX:
            raise self._error(f"integer literal {_clip(digits)} is above {_LONG_MAX}", token.pos)
        return int(digits)

    def _float(self, token: _Token) -> float:
        value = float(token.text)
        if math.isinf(value):
            raise self._error(f"decimal literal {_clip(token.text)} is out of range", token.pos)
        if value < _DOUBLE_MIN:
            # RocketMQ's range check (ConstantExpression.createFloat) compares with
            # Double.MIN_VALUE, the smallest positive double, so it refuses zero as well.
            raise self._error(
                f"decimal literal {_clip(token.text)} is zero or below Double.MIN_VALUE, which "
                "RocketMQ refuses (write 0 for zero)",
                token.pos,
            )
        return value

    # -------------------------------------------------------------- RocketMQ's type checks

    def _require_condition(self, node: Node, start: int) -> Node:
        if not isinstance(node, (*_CONDITIONS_AND_NULL, Property)):
            raise self._error(f"{self._source(start)} is not a condition", start)
        return node

    def _require_orderable(self, node: Node, start: int, source: str) -> None:
        if isinstance(node, (*_CONDITIONS_AND_NULL, StringLiteral)):
            raise self._error(f"{source} cannot be compared with >, >=, < or <=", start)

    def _check_equality(
        self, left: Node, left_start: int, left_source: str, right: Node, right_start: int
    ) -> None:
        if isinstance(left, NullLiteral):
            raise self._error("NULL cannot be compared with = or <> (use IS NULL)", left_start)
        if isinstance(right, NullLiteral):
            raise self._error("NULL cannot be compared with = or <> (use IS NULL)", right_start)
        if isinstance(left, BooleanLiteral) and isinstance(
            right, (StringLiteral, IntegerLiteral, FloatLiteral)
        ):
            raise self._error(
                f"{left_source} cannot be compared with {self._source(right_start)}", left_start
            )


def _describe(token: _Token) -> str:
    return "the end of the expression" if token.kind == "EOF" else repr(_clip(token.text))


def _clip(text: str) -> str:
    """``text`` shortened to 40 characters for a message."""
    return text if len(text) <= 40 else text[:37] + "..."


def _unquote(literal: str) -> str:
    return literal[1:-1].replace("''", "'")


def _descending(low: Node, high: Node) -> bool:
    """Whether BETWEEN's bounds are number literals with ``high < low``."""
    numbers = (IntegerLiteral, FloatLiteral)
    if not (isinstance(low, numbers) and isinstance(high, numbers)):
        return False
    return _java_compare(_literal_value(high), _literal_value(low)) < 0


# ------------------------------------------------------------------ render

# Precedence levels, loosest first; a child below the level its position needs is
# parenthesised. Chains of AND/OR are one node, so an AND inside an AND needs parentheses.
_OR_LEVEL, _AND_LEVEL, _EQUALITY_LEVEL = 1, 2, 3
_COMPARISON_LEVEL, _UNARY_LEVEL, _PRIMARY_LEVEL = 4, 5, 6


def render(node: Node) -> str:
    """Canonical text for ``node``: keywords in upper case, minimal parentheses.

    For every AST :func:`parse` can return, ``parse(render(node)) == node``.
    """
    match node:
        case Property(name):
            return name
        case StringLiteral(value):
            return "'" + value.replace("'", "''") + "'"
        case IntegerLiteral(value):
            return str(value)
        case FloatLiteral(value):
            return repr(value)  # shortest round-tripping form, always a valid literal
        case BooleanLiteral(value):
            return "TRUE" if value else "FALSE"
        case NullLiteral():
            return "NULL"
        case Negate(operand):
            text = _render_at(operand, _UNARY_LEVEL)
            return "- " + text if text.startswith("-") else "-" + text  # "--" is a comment
        case Not(operand):
            return "NOT " + _render_at(operand, _UNARY_LEVEL)
        case And(operands):
            return " AND ".join(_render_at(child, _EQUALITY_LEVEL) for child in operands)
        case Or(operands):
            return " OR ".join(_render_at(child, _AND_LEVEL) for child in operands)
        case Comparison(op, left, right):
            # Equality sits a level below ordering, and the right side must bind tighter.
            level = _EQUALITY_LEVEL if op in _EQUALITY_OPS else _COMPARISON_LEVEL
            return f"{_render_at(left, level)} {op} {_render_at(right, level + 1)}"
        case IsNull(operand, negated):
            suffix = " IS NOT NULL" if negated else " IS NULL"
            return _render_at(operand, _EQUALITY_LEVEL) + suffix
        case Between(operand, low, high, negated):
            keyword = " NOT BETWEEN " if negated else " BETWEEN "
            bounds = f"{_render_at(low, _UNARY_LEVEL)} AND {_render_at(high, _UNARY_LEVEL)}"
            return _render_at(operand, _COMPARISON_LEVEL) + keyword + bounds
        case In(operand, values, negated):
            items = ", ".join(render(StringLiteral(value)) for value in values)
            return f"{operand.name}{' NOT' if negated else ''} IN ({items})"
        case StringMatch(op, operand, pattern, negated):
            keyword = f" NOT {op} " if negated else f" {op} "
            return _render_at(operand, _COMPARISON_LEVEL) + keyword + render(StringLiteral(pattern))


def _render_at(node: Node, level: int) -> str:
    text = render(node)
    return f"({text})" if _level(node) < level else text


def _level(node: Node) -> int:
    match node:
        case Or():
            return _OR_LEVEL
        case And():
            return _AND_LEVEL
        case Comparison(op) if op in _EQUALITY_OPS:
            return _EQUALITY_LEVEL
        case IsNull():
            return _EQUALITY_LEVEL
        case Comparison() | Between() | In() | StringMatch():
            return _COMPARISON_LEVEL
        case Negate() | Not():
            return _UNARY_LEVEL
        case _:
            return _PRIMARY_LEVEL


# ------------------------------------------------------------------ values and Java's rules


class _Long(int):
    """A Java long constant; a plain ``int`` is a Java int.

    The difference shows only when a property string meets the constant: it is then parsed
    with ``Long.valueOf`` rather than ``Integer.valueOf``, whose range is narrower.
    """


#: What an expression evaluates to: NULL, a Java String, int, long (:class:`_Long`), double or
#: Boolean.
_Value: TypeAlias = str | int | float | bool | None
_Evaluate: TypeAlias = Callable[[Mapping[str, str]], _Value]


class _EvaluationError(Exception):
    """A comparison Java would throw on; the message then does not match."""


def _literal_value(node: IntegerLiteral | FloatLiteral) -> int | float:
    if isinstance(node, FloatLiteral):
        return node.value
    # ConstantExpression.createFromDecimal narrows values in int range to Integer.
    return node.value if node.value <= _INT_MAX else _Long(node.value)


def _negate(value: _Value) -> _Value:
    """``UnaryExpression.createNegate``: numbers change sign, anything else is NULL."""
    kind = type(value)
    if kind is int or kind is float:
        # An int here is a literal or its negation, never -2**31, so it cannot overflow.
        return -value  # type: ignore[operator]
    if kind is _Long:
        return _Long(-value)  # type: ignore[operator]
    return None


def _parse_java_integer(text: str, low: int, high: int) -> int:
    """``Integer.valueOf``/``Long.valueOf``: optional sign, then decimal digits only."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    # isdecimal() is Unicode's Nd category, which is what Java's Character.digit accepts.
    if not digits.isdecimal():
        raise _EvaluationError(f"{text!r} is not an integer")
    if not digits.isascii():
        digits = _ascii_digits(digits, text)
    digits = digits.lstrip("0") or "0"
    if len(digits) > 19:  # also keeps int() under its 4300-digit limit
        raise _EvaluationError(f"{text!r} is out of range")
    value = -int(digits) if text[0] == "-" else int(digits)
    if not low <= value <= high:
        raise _EvaluationError(f"{text!r} is out of range")
    return value


def _ascii_digits(digits: str, text: str) -> str:
    # Java reads UTF-16 units one by one, so a digit outside the BMP (a surrogate pair) is
    # not a digit there.
    if any(ord(char) > 0xFFFF for char in digits):
        raise _EvaluationError(f"{text!r} is not an integer")
    return "".join(str(unicodedata.decimal(char)) for char in digits)


def _parse_java_int(text: str) -> int:
    if len(text) <= 9 and text.isdigit() and text.isascii():
        return int(text)  # the common case, and nine digits are always in range
    return _parse_java_integer(text, _INT_MIN, _INT_MAX)


def _parse_java_long(text: str) -> int:
    if len(text) <= 18 and text.isdigit() and text.isascii():
        return int(text)
    return _parse_java_integer(text, _LONG_MIN, _LONG_MAX)


# Double.valueOf's grammar: trimmed of characters up to U+0020, a sign, then NaN, Infinity, a
# decimal or a hexadecimal float, either of the latter with an optional type suffix.
_JAVA_DOUBLE: Final = re.compile(
    r"[\x00-\x20]*(?P<sign>[+-]?)"
    r"(?:(?P<special>NaN|Infinity)"
    r"|(?P<decimal>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[fFdD]?"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?)"
    r"[\x00-\x20]*"
)


_DECIMAL_CHARACTERS: Final = "0123456789.eE+-"


def _parse_java_double(text: str) -> float:
    """``Double.valueOf``, which accepts more than Python's ``float`` in places and less in
    others (no underscores, no Unicode digits or spaces, ``NaN`` and ``Infinity`` spelt so)."""
    if not text.strip(_DECIMAL_CHARACTERS):
        # Only digits, dots, exponents and signs: there the two grammars are the same, and
        # float() is several times faster than the full pattern.
        try:
            return float(text)
        except ValueError:
            raise _EvaluationError(f"{text!r} is not a number") from None
    match = _JAVA_DOUBLE.fullmatch(text)
    if match is None:
        raise _EvaluationError(f"{text!r} is not a number")
    sign, special, decimal, hexadecimal = match.group("sign", "special", "decimal", "hex")
    if decimal is not None:
        return float(sign + decimal)
    if special is not None:
        return math.nan if special == "NaN" else float(sign + "inf")
    try:
        return float.fromhex(sign + hexadecimal)
    except OverflowError:  # Java rounds a huge hex float to infinity
        return float(sign + "inf")


def _parse_java_boolean(text: str) -> bool:
    """``Boolean.valueOf``: "true" in any case, anything else is false."""
    return len(text) == 4 and text.lower() == "true"


#: How a string meeting a value of each type is converted (``__compare``'s String branches).
_FROM_STRING: Final[dict[type, Callable[[str], _Value]]] = {
    int: _parse_java_int,
    _Long: _parse_java_long,
    float: _parse_java_double,
    bool: _parse_java_boolean,
}


def _compare_doubles(left: float, right: float) -> int:
    """``Double.compare``: a total order, NaN above everything and -0.0 below 0.0."""
    if left < right:
        return -1
    if left > right:
        return 1
    if left == right:
        if left == 0.0:  # IEEE says 0.0 == -0.0; Java orders them by sign
            left_sign, right_sign = math.copysign(1.0, left), math.copysign(1.0, right)
            return (left_sign > right_sign) - (left_sign < right_sign)
        return 0
    return (left != left) - (right != right)  # x != x only for NaN


def _java_compare(left: _Value, right: _Value) -> int:
    """``ComparisonExpression.__compare`` for two non-null values.

    Raises:
        _EvaluationError: A string does not parse as the other side's type, or a boolean is
            on the left of a string.
    """
    left_type, right_type = type(left), type(right)
    if left_type is not right_type:
        if left_type is bool:
            if right_type is str:
                raise _EvaluationError("a boolean on the left of a string")
            return -1
        if left_type is str:
            left = _FROM_STRING[right_type](left)  # type: ignore[arg-type]
        elif right_type is str:
            right = _FROM_STRING[left_type](right)  # type: ignore[arg-type]
        elif right_type is bool:
            return -1
    if type(left) is float or type(right) is float:
        return _compare_doubles(float(left), float(right))  # type: ignore[arg-type]
    return (left > right) - (left < right)  # type: ignore[operator]


# ------------------------------------------------------------------ compiler


@dataclass(frozen=True)
class Selector:
    """A compiled selector.

    Attributes:
        expression: The text it was compiled from.
        properties: The names of the properties it reads.
    """

    expression: str
    properties: frozenset[str]
    _evaluate: _Evaluate = field(repr=False, compare=False)

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Whether a message with these properties passes: the expression is TRUE.

        Never raises: an evaluation error means no match, as in RocketMQ.
        """
        try:
            return self._evaluate(properties) is True
        except Exception:  # RocketMQ's ExpressionMessageFilter catches Throwable alike
            return False


def compile_selector(expression: str) -> Selector:
    """Parse and compile a selector.

    Raises:
        SelectorError: The text is not a valid selector.
    """
    node = parse(expression)
    return Selector(expression, _property_names(node), _compile_condition(node))


def _property_names(node: Node) -> frozenset[str]:
    match node:
        case Property(name):
            return frozenset((name,))
        case In(operand):
            return frozenset((operand.name,))
        case Negate(child) | Not(child) | IsNull(child) | StringMatch(_, child):
            return _property_names(child)
        case And(children) | Or(children):
            return frozenset().union(*map(_property_names, children))
        case Comparison(_, left, right):
            return _property_names(left) | _property_names(right)
        case Between(operand, low, high):
            return _property_names(operand) | _property_names(low) | _property_names(high)
        case _:
            return frozenset()


def _constant(node: Node) -> tuple[bool, _Value]:
    """``(True, value)`` when ``node`` has the same value for every message."""
    match node:
        case StringLiteral(value) | BooleanLiteral(value):
            return True, value
        case IntegerLiteral() | FloatLiteral():
            return True, _literal_value(node)
        case NullLiteral():
            return True, None
        case Negate(operand):
            known, inner = _constant(operand)
            return known, _negate(inner) if known else None
        case _:
            return False, None


def _compile_condition(node: Node) -> _Evaluate:
    """Compile a node in a place that wants a boolean (AND, OR, NOT, the whole expression)."""
    if isinstance(node, Property):
        # UnaryExpression.createBooleanCast: a property's value is a String, never a Boolean.
        name = node.name

        def property_as_condition(properties: Mapping[str, str]) -> _Value:
            return None if properties.get(name) is None else False

        return property_as_condition
    return _compile(node)


def _compile(node: Node) -> _Evaluate:
    known, value = _constant(node)
    if known:
        return lambda _properties: value
    match node:
        case Property(name):
            return lambda properties: properties.get(name)
        case Negate(operand):
            return _compile_negate(operand)
        case Not(operand):
            return _compile_not(operand)
        case And(operands):
            return _compile_and(operands)
        case Or(operands):
            return _compile_or(operands)
        case Comparison("=", left, right):
            return _compile_equal(left, right)
        case Comparison("<>", left, right):
            return _compile_not_equal(left, right)
        case Comparison(op, left, right):
            return _compile_ordering(op, left, right)
        case IsNull(operand, negated):
            return _compile_is_null(operand, negated)
        case Between(operand, low, high, False):
            return _compile_and((Comparison(">=", operand, low), Comparison("<=", operand, high)))
        case Between(operand, low, high, True):
            return _compile_or((Comparison("<", operand, low), Comparison(">", operand, high)))
        case In(operand, values, negated):
            return _compile_in(operand.name, frozenset(values), negated)
        case StringMatch(op, operand, pattern, negated):
            return _compile_match(op, operand, pattern, negated)
    raise AssertionError(f"not a node: {node!r}")  # pragma: no cover - the union is exhausted


def _compile_negate(operand: Node) -> _Evaluate:
    evaluate = _compile(operand)
    return lambda properties: _negate(evaluate(properties))


def _compile_not(operand: Node) -> _Evaluate:
    evaluate = _compile_condition(operand)

    def not_(properties: Mapping[str, str]) -> _Value:
        value = evaluate(properties)
        return None if value is None else not value

    return not_


def _compile_and(operands: tuple[Node, ...]) -> _Evaluate:
    parts = tuple(_compile_condition(node) for node in operands)
    if len(parts) == 2:
        first, second = parts

        def and2(properties: Mapping[str, str]) -> _Value:
            left = first(properties)
            if left is False:
                return False
            right = second(properties)
            if right is False:
                return False
            return None if left is None or right is None else True

        return and2

    def and_(properties: Mapping[str, str]) -> _Value:
        unknown = False
        for part in parts:
            value = part(properties)
            if value is False:
                return False
            unknown = unknown or value is None
        return None if unknown else True

    return and_


def _compile_or(operands: tuple[Node, ...]) -> _Evaluate:
    parts = tuple(_compile_condition(node) for node in operands)

    def or_(properties: Mapping[str, str]) -> _Value:
        unknown = False
        for part in parts:
            value = part(properties)
            if value is True:
                return True
            unknown = unknown or value is None
        return None if unknown else False

    return or_


def _compile_not_equal(left: Node, right: Node) -> _Evaluate:
    equal = _compile_equal(left, right)

    def not_equal(properties: Mapping[str, str]) -> _Value:
        value = equal(properties)
        return None if value is None else not value

    return not_equal


def _compile_equal(left: Node, right: Node) -> _Evaluate:
    left_known, left_value = _constant(left)
    right_known, right_value = _constant(right)
    if isinstance(left, Property) and right_known and right_value is not None:
        return _property_equals_constant(left.name, right_value)
    if isinstance(right, Property) and left_known and left_value is not None:
        return _constant_equals_property(left_value, right.name)
    first, second = _compile(left), _compile(right)

    def equal(properties: Mapping[str, str]) -> _Value:
        # ComparisonExpression.doCreateEqual: both sides are evaluated, and NULL is handled
        # asymmetrically.
        lhs, rhs = first(properties), second(properties)
        if lhs is None:
            return True if rhs is None else None
        if rhs is None:
            return False
        return _java_compare(lhs, rhs) == 0

    return equal


def _property_equals_constant(name: str, constant: _Value) -> _Evaluate:
    """``property = constant`` for a non-NULL constant: the common case, made direct."""
    if type(constant) is str:

        def property_equals_string(properties: Mapping[str, str]) -> _Value:
            value = properties.get(name)
            return None if value is None else value == constant

        return property_equals_string
    convert = _FROM_STRING[type(constant)]
    if type(constant) is float:
        return lambda properties: (
            None
            if (value := properties.get(name)) is None
            else _compare_doubles(convert(value), constant) == 0  # type: ignore[arg-type]
        )

    def property_equals(properties: Mapping[str, str]) -> _Value:
        value = properties.get(name)
        return None if value is None else convert(value) == constant

    return property_equals


def _constant_equals_property(constant: _Value, name: str) -> _Evaluate:
    """``constant = property`` for a non-NULL constant (an absent property gives FALSE)."""
    if type(constant) is bool:
        # Java casts the String to Boolean here and fails, unless the property is absent.
        def boolean_equals_property(properties: Mapping[str, str]) -> _Value:
            if properties.get(name) is None:
                return False
            raise _EvaluationError("a boolean on the left of a string")

        return boolean_equals_property
    equal = _property_equals_constant(name, constant)
    return lambda properties: False if properties.get(name) is None else equal(properties)


_ORDER_TESTS: Final[dict[str, Callable[[int], bool]]] = {
    ">": lambda sign: sign > 0,
    ">=": lambda sign: sign >= 0,
    "<": lambda sign: sign < 0,
    "<=": lambda sign: sign <= 0,
}
_INT_ORDERS: Final[dict[str, Callable[[int, int], bool]]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_MIRRORED: Final[dict[ComparisonOp, ComparisonOp]] = {">": "<", ">=": "<=", "<": ">", "<=": ">="}


def _compile_ordering(op: ComparisonOp, left: Node, right: Node) -> _Evaluate:
    left_known, left_value = _constant(left)
    right_known, right_value = _constant(right)
    if isinstance(left, Property) and right_known:
        return _property_ordering(op, left.name, right_value)
    if isinstance(right, Property) and left_known:
        # Java evaluates the constant first, but it cannot fail, so mirroring is exact.
        return _property_ordering(_MIRRORED[op], right.name, left_value)
    test = _ORDER_TESTS[op]
    first, second = _compile(left), _compile(right)

    def ordering(properties: Mapping[str, str]) -> _Value:
        lhs = first(properties)
        if lhs is None:
            return None
        rhs = second(properties)
        if rhs is None:
            return None
        if type(lhs) is str and type(rhs) is str:
            # RocketMQ refuses to order strings and compares them as doubles instead.
            return test(_compare_doubles(_parse_java_double(lhs), _parse_java_double(rhs)))
        return test(_java_compare(lhs, rhs))

    return ordering


def _property_ordering(op: ComparisonOp, name: str, constant: _Value) -> _Evaluate:
    """``property op constant``; the parser allows only numbers (or NULL) as the constant."""
    if constant is None:
        return lambda _properties: None
    if type(constant) is float:
        test = _ORDER_TESTS[op]
        return lambda properties: (
            None
            if (value := properties.get(name)) is None
            else test(_compare_doubles(_parse_java_double(value), constant))
        )
    assert isinstance(constant, int) and not isinstance(constant, bool)
    order = _INT_ORDERS[op]
    convert = _parse_java_long if type(constant) is _Long else _parse_java_int
    return lambda properties: (
        None if (value := properties.get(name)) is None else order(convert(value), constant)
    )


def _compile_is_null(operand: Node, negated: bool) -> _Evaluate:
    if isinstance(operand, Property):
        name = operand.name
        return lambda properties: (properties.get(name) is None) is not negated
    evaluate = _compile(operand)
    return lambda properties: (evaluate(properties) is None) is not negated


def _compile_in(name: str, values: frozenset[str], negated: bool) -> _Evaluate:
    def in_(properties: Mapping[str, str]) -> _Value:
        value = properties.get(name)
        return None if value is None else (value in values) is not negated

    return in_


_MATCHERS: Final[dict[str, Callable[[str, str], bool]]] = {
    "CONTAINS": str.__contains__,
    "STARTSWITH": str.startswith,
    "ENDSWITH": str.endswith,
}


def _compile_match(op: MatchOp, operand: Node, pattern: str, negated: bool) -> _Evaluate:
    if not pattern:
        return lambda _properties: False  # RocketMQ does not even evaluate the operand
    evaluate = _compile(operand)
    matcher = _MATCHERS[op]

    def match(properties: Mapping[str, str]) -> _Value:
        value = evaluate(properties)
        if type(value) is not str:
            return False  # NULL, numbers and booleans never match, NOT forms included
        return matcher(value, pattern) is not negated

    return match
