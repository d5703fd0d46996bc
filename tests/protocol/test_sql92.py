"""RocketMQ's SQL92 selectors (protocol.sql92): grammar, evaluation rules, errors, limits.

The tables pin RocketMQ's behaviour case by case, starting with the examples of its own docs
and tests (``docs/en/Example_Filter.md``, ``filter/src/test/.../ExpressionTest.java`` and
``ParserTest.java``). The Hypothesis tests check that rendering and parsing are inverse, that
the compiled closures agree with a naive interpreter of the documented rules, and that no
input makes ``parse`` raise anything but ``SelectorError``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.sql92 import (
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    And,
    Between,
    BooleanLiteral,
    Comparison,
    ComparisonOp,
    FloatLiteral,
    In,
    IntegerLiteral,
    IsNull,
    MatchOp,
    Negate,
    Node,
    Not,
    NullLiteral,
    Or,
    Property,
    SelectorError,
    StringLiteral,
    StringMatch,
    compile_selector,
    parse,
    render,
)


def matches(expression: str, properties: Mapping[str, str]) -> bool:
    return compile_selector(expression).matches(properties)


a, b, c = Property("a"), Property("b"), Property("c")

# ------------------------------------------------------------------ evaluation tables

DOCUMENTED = [
    # docs/en/Example_Filter.md
    ("a > 5 AND b = 'abc'", {"a": "10", "b": "abc", "c": "true"}, True),
    ("a > 5 AND b = 'abc'", {"a": "1", "b": "abc", "c": "true"}, False),
    ("a between 0 and 3", {"a": "0"}, True),
    ("a between 0 and 3", {"a": "3"}, True),
    ("a between 0 and 3", {"a": "4"}, False),
    ("a between 0 and 3", {}, False),
    # the tag test every RocketMQ SQL example uses
    ("TAGS IS NOT NULL AND TAGS IN ('TagA','TagB')", {"TAGS": "TagB"}, True),
    ("TAGS IS NOT NULL AND TAGS IN ('TagA','TagB')", {"TAGS": "TagC"}, False),
    ("TAGS IS NOT NULL AND TAGS IN ('TagA','TagB')", {}, False),
    # ExpressionTest.java
    ("a=3 and b<>4 And c>5 AND d<=4", {"a": "3", "b": "5", "c": "6", "d": "1"}, True),
    ("a=3 and b<>4 And c>5 AND d<=4", {"a": "4", "b": "5", "c": "6", "d": "1"}, False),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3", "d": "2"}, True),
    ("a=3 or b<>4 Or c>5 OR d<=4", {"a": "4", "b": "4", "c": "3", "d": "10"}, False),
    ("a in ('3', '4', '5')", {"a": "4"}, True),
    ("a in ('3', '4', '5')", {"a": "8"}, False),
    ("a not in ('3', '4', '5')", {"a": "8"}, True),
    ("a not in ('3', '4', '5')", {"a": "3"}, False),
    ("a not between 2 and 10", {"a": "11"}, True),
    ("a not between 2 and 10", {"a": "10"}, False),
    ("a is null", {"abc": "2"}, True),
    ("a is not null", {"abc": "2"}, False),
    ("a is not null and a='hello'", {"a": "hello"}, True),
    ("a is not null and a='hello'", {}, False),
    ("a is null OR a='hello'", {}, True),
    ("a is null OR a='hello'", {"a": "abc"}, False),
    ("a=TRUE OR b=FALSE", {"a": "true", "b": "false"}, True),
    ("a=TRUE OR b=FALSE", {"a": "false", "b": "true"}, False),
    ("TAGS is not null and TAGS='''''tag'''''", {"TAGS": "''tag''"}, True),
    ("a > 3.1E10", {"a": "3.1415E10"}, True),
    ("a > 3.14", {"a": "3.1415"}, True),
    ("a > b", {"a": "10", "b": "20"}, False),
    ("a > b", {"a": "20", "b": "10"}, True),
    ("a=b", {"a": "3.14", "b": "3.14"}, True),
    ("a<>b", {"a": "3.14", "b": "3.141"}, True),
    ("a between up and low", {"a": "3.14", "up": "up", "low": "low"}, False),
    (
        "a not in ('4', '4', '5') and b between 3 and 10 and c not contains 'axbc'",
        {"a": "3", "b": "3", "c": "axbdc"},
        True,
    ),
    ("value contains 'x'", {"value": "axb"}, True),
    ("value startswith 'ax'", {"value": "axb"}, True),
    ("value endswith 'xb'", {"value": "axb"}, True),
    ("value not contains 'x'", {"value": "axb"}, False),
    ("value not startswith 'x'", {"value": "abb"}, True),
    ("value contains ''", {"value": "axb"}, False),
    ("value not contains ''", {"value": "axb"}, False),
    ("value contains 'x'", {}, False),
    ("value not contains 'x'", {}, False),
    ("'axb' contains 'x'", {}, True),
    ("' ' endswith ' '", {}, True),
    ("'s' contains '\\'", {}, False),
]

OPERATORS = [
    # = and <> between strings: exact, case-sensitive, no numeric conversion
    ("b = 'abc'", {"b": "abc"}, True),
    ("b = 'abc'", {"b": "ABC"}, False),
    ("b <> 'abc'", {"b": "ABC"}, True),
    ("a = b", {"a": "1", "b": "1.0"}, False),
    ("'abc' = b", {"b": "abc"}, True),
    # ordering: numbers only
    ("a > 5", {"a": "6"}, True),
    ("a > 5", {"a": "5"}, False),
    ("a >= 5", {"a": "5"}, True),
    ("a < 5", {"a": "4"}, True),
    ("a < 5", {"a": "5"}, False),
    ("a <= 5", {"a": "5"}, True),
    ("5 < a", {"a": "6"}, True),
    ("5 >= a", {"a": "6"}, False),
    ("a > -5", {"a": "-3"}, True),
    ("a = -5", {"a": "-5"}, True),
    ("-a < 5", {"a": "3"}, False),  # negating a property's string gives NULL
    ("a > b", {"a": "2.5", "b": "10"}, False),  # numerically, not as strings
    ("a >= b AND a <= b", {"a": "1", "b": "1.0"}, True),
    # BETWEEN includes its bounds; NOT BETWEEN is the outside
    ("a BETWEEN 1 AND 1", {"a": "1"}, True),
    ("a BETWEEN -1.5 AND 1.5", {"a": "1.5"}, True),
    ("a BETWEEN -1 AND 1.5", {"a": "1.5"}, False),  # '1.5' >= -1 is Integer.valueOf: error
    ("a BETWEEN -1 AND 1.5", {"a": "1"}, True),
    ("a NOT BETWEEN 1 AND 2", {"a": "0"}, True),
    ("a NOT BETWEEN 1 AND 2", {"a": "1"}, False),
    ("a NOT BETWEEN 2 AND 1", {"a": "1"}, True),  # no bounds check for NOT BETWEEN
    ("a BETWEEN -1 AND -5", {"a": "-3"}, False),  # negations are not literals: no check
    # IN and NOT IN take strings and compare them exactly
    ("a IN ('1')", {"a": "1.0"}, False),
    ("a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("a NOT IN ('x', 'y')", {}, False),
    ("a IN ('x', 'x', 'y')", {"a": "x"}, True),
    # CONTAINS / STARTSWITH / ENDSWITH
    ("a CONTAINS 'b'", {"a": "abc"}, True),
    ("a STARTSWITH 'ab'", {"a": "abc"}, True),
    ("a STARTSWITH 'bc'", {"a": "abc"}, False),
    ("a ENDSWITH 'bc'", {"a": "abc"}, True),
    ("a NOT ENDSWITH 'bc'", {"a": "abc"}, False),
    ("a NOT STARTSWITH 'x'", {}, False),
    ("NOT (a NOT STARTSWITH 'x')", {}, True),  # the NOT form is FALSE, not NULL, when absent
    ("5 CONTAINS '5'", {}, False),  # only strings match
    ("a CONTAINS '%'", {"a": "100%"}, True),  # no wildcards
    # IS NULL / IS NOT NULL
    ("a IS NULL", {}, True),
    ("a IS NULL", {"a": ""}, False),  # an empty value is a value
    ("a IS NOT NULL", {"a": ""}, True),
    ("(a > 1) IS NULL", {}, True),
    ("a IS NULL IS NULL", {}, False),
    # TRUE, FALSE, NULL and bare properties as conditions
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NULL", {}, False),
    ("NOT NULL", {}, False),
    ("a", {"a": "true"}, False),  # a string is not a boolean
    ("NOT a", {"a": "false"}, True),
    ("NOT a", {}, False),
    # booleans meet strings through Boolean.valueOf
    ("a = TRUE", {"a": "TrUe"}, True),
    ("a = FALSE", {"a": "yes"}, True),
    ("a <> TRUE", {"a": "true"}, False),
    ("'true' = TRUE", {}, True),
    ("TRUE = a", {"a": "true"}, False),  # Java's ClassCastException: an error, no match
    ("NOT (TRUE = a)", {"a": "x"}, False),
    ("TRUE = a", {}, False),
    ("TRUE = TRUE", {}, True),
    ("1 = TRUE", {}, False),  # numbers and booleans are never equal
    ("(a = 'x') = TRUE", {"a": "x"}, True),
    ("(a = 'x') = b", {"a": "x", "b": "TRUE"}, False),  # boolean left of a string: error
    ("b = (a = 'x')", {"a": "x", "b": "TRUE"}, True),
]

NULLS_AND_LOGIC = [
    # three-valued AND / OR / NOT over an absent property
    ("a = 'x'", {}, False),
    ("a <> 'x'", {}, False),
    ("NOT (a = 'x')", {}, False),
    ("a = 'x' OR TRUE", {}, True),
    ("a = 'x' AND TRUE", {}, False),
    ("NOT (a = 'x' AND FALSE)", {}, True),
    ("NOT (a = 'x' OR TRUE)", {}, False),
    ("NOT (a = 'x' OR FALSE)", {}, False),
    # = is asymmetric in NULLs (ComparisonExpression.doCreateEqual)
    ("a = b", {}, True),
    ("a = b", {"b": "1"}, False),  # NULL
    ("NOT (a = b)", {"b": "1"}, False),  # still NULL
    ("NOT (a = b)", {"a": "1"}, True),  # FALSE
    ("a <> b", {"a": "1"}, True),
    ("a = -'x'", {}, True),
    # precedence: NOT > comparisons > = and IS > AND > OR
    ("a = 'x' OR b = 'y' AND c = 'z'", {"a": "x"}, True),
    ("(a = 'x' OR b = 'y') AND c = 'z'", {"a": "x"}, False),
    ("NOT a = 'x'", {"a": "y"}, False),  # (NOT a) = 'x'
    ("NOT (a = 'x')", {"a": "y"}, True),
    ("NOT NOT (a = 'x')", {"a": "x"}, True),
    ("a = 1 = TRUE", {"a": "1"}, True),  # (a = 1) = TRUE
    ("a > 1 = FALSE", {"a": "0"}, True),  # (a > 1) = FALSE
    ("((a = 'x'))", {"a": "x"}, True),
    # an evaluation error ends the evaluation: no match, whatever comes after
    ("a > 5 OR b = 'x'", {"a": "x", "b": "x"}, False),
    ("b = 'x' OR a > 5", {"a": "x", "b": "x"}, True),  # short-circuited before the error
    ("a > 5 AND b = 'x'", {"a": "1", "b": "x"}, False),
    ("NOT (a > 5)", {"a": "x"}, False),
    ("a = 5 OR TRUE", {"a": "five"}, False),
    ("FALSE AND a = 5", {"a": "five"}, False),
]

CONVERSIONS = [
    # a string meeting an int literal is parsed with Integer.valueOf
    ("a = 5", {"a": "05"}, True),
    ("a = 5", {"a": "+5"}, True),
    ("a = 5", {"a": " 5"}, False),
    ("a > 5", {"a": "5.5"}, False),  # not an int: an error
    ("a > 5.0", {"a": "5.5"}, True),
    ("a > 1", {"a": "2147483648"}, False),  # above int range: an error
    ("a > 1", {"a": "\u0663"}, True),  # Java's Character.digit reads Unicode digits
    ("a > 1", {"a": "1_000"}, False),
    # a literal above 2**31 - 1 is a long: the property is parsed with Long.valueOf
    ("a = 3000000000", {"a": "3000000000"}, True),
    ("a < 3000000000", {"a": "5"}, True),
    ("a < 9223372036854775807", {"a": "9223372036854775808"}, False),
    ("a = -2147483648", {"a": "-2147483648"}, True),
    # a decimal literal or two strings: Double.valueOf
    ("a = 8.0", {"a": "0x1p3"}, True),
    ("a = 1.5", {"a": "1.5f"}, True),
    ("a = 1.5", {"a": " 1.5\t"}, True),
    ("a = 1.5", {"a": "1.5ff"}, False),
    ("a > 1.0", {"a": "Infinity"}, True),
    ("a > 1.0", {"a": "inf"}, False),
    ("a > 1.0", {"a": "NaN"}, True),  # Double.compareTo puts NaN above everything
    ("a = b", {"a": "NaN", "b": "NaN"}, True),  # = between two strings compares the strings
    ("a = 1.0", {"a": "NaN"}, False),
    ("a >= b AND a <= b", {"a": "NaN", "b": "NaN"}, True),
    ("a < b", {"a": "-0.0", "b": "0"}, True),  # and -0.0 below 0.0
    ("a > 1.5", {"a": "1e1"}, True),
    ("a > 1.5", {"a": ".5e1"}, True),
    ("a > 1.5", {"a": "1."}, False),
    ("a > 1.5", {"a": "."}, False),
    ("a > b", {"a": "x", "b": "1"}, False),
    # ints widen to doubles exactly as Java does, rounding past 2**53
    ("a = 9007199254740993", {"a": "9007199254740993"}, True),
    ("9007199254740993 = 9007199254740992.0", {}, True),
]

SYNTAX = [
    # keywords in any case, property names case-sensitive
    ("a BeTwEeN 1 aNd 3 or B is NoT nUlL", {"a": "2"}, True),
    ("tags = 'x'", {"TAGS": "x"}, False),
    ("a not contains 'x' AND a Not In ('y')", {"a": "z"}, True),
    ("true and not false", {}, True),
    # literal forms
    ("a = 5L", {"a": "5"}, True),
    ("a = 5l", {"a": "5"}, True),
    ("a = 1.5E2", {"a": "150"}, True),  # Double.valueOf("150") = 150.0
    ("a = 1.5E2", {"a": "150.0"}, True),
    ("a = 15e-1", {"a": "1.5"}, True),
    ("a = .5", {"a": "0.5"}, True),
    ("a = 5.", {"a": "5"}, True),
    ("a = 'it''s'", {"a": "it's"}, True),
    ("a = ''", {"a": ""}, True),
    ("a = 'two\nlines'", {"a": "two\nlines"}, True),
    ("$p_1 = 'x' AND _q$ = 'y'", {"$p_1": "x", "_q$": "y"}, True),
    ("a = +5", {"a": "5"}, True),
    ("a = - -5", {"a": "5"}, True),
    # whitespace and comments
    ("\ta\r\n=\f'x'", {"a": "x"}, True),
    ("a = 'x' -- the rest of the line\n AND b = 'y'", {"a": "x", "b": "y"}, True),
    ("a = 'x' -- a comment that ends the text", {"a": "x"}, True),
    ("/* leading */ a /* inner ** stars */ = 'x'", {"a": "x"}, True),
]
MATCH_TABLE = DOCUMENTED + OPERATORS + NULLS_AND_LOGIC + CONVERSIONS + SYNTAX


@pytest.mark.parametrize(
    ("expression", "properties", "expected"), MATCH_TABLE, ids=[row[0] for row in MATCH_TABLE]
)
def test_matches(expression: str, properties: dict[str, str], expected: bool) -> None:
    assert matches(expression, properties) is expected
    # the naive interpreter below reads the same rules from the same AST
    assert reference_matches(parse(expression), properties) is expected


def test_matches_never_raises_on_values_that_are_not_strings() -> None:
    selector = compile_selector("a > 5 AND b CONTAINS 'x'")
    assert selector.matches({"a": 7, "b": None}) is False  # type: ignore[dict-item]


def test_selector_reports_the_properties_it_reads() -> None:
    selector = compile_selector("TAGS IN ('A') AND (x > 1 OR -y < z) AND w BETWEEN v AND 9")
    assert selector.properties == frozenset({"TAGS", "x", "y", "z", "w", "v"})
    assert compile_selector("TRUE").properties == frozenset()
    assert selector.expression == "TAGS IN ('A') AND (x > 1 OR -y < z) AND w BETWEEN v AND 9"


# ------------------------------------------------------------------ parse trees

TREES: list[tuple[str, Node]] = [
    (
        "a > 5 AND b = 'abc'",
        And((Comparison(">", a, IntegerLiteral(5)), Comparison("=", b, StringLiteral("abc")))),
    ),
    ("a OR b AND c", Or((a, And((b, c))))),
    ("a AND b AND c OR a", Or((And((a, b, c)), a))),
    ("a AND (b AND c)", And((a, And((b, c))))),
    ("NOT a = 1", Comparison("=", Not(a), IntegerLiteral(1))),
    ("NOT NOT a", Not(Not(a))),
    ("a = 1 = TRUE", Comparison("=", Comparison("=", a, IntegerLiteral(1)), BooleanLiteral(True))),
    ("a = b > 1", Comparison("=", a, Comparison(">", b, IntegerLiteral(1)))),
    ("a > -5", Comparison(">", a, Negate(IntegerLiteral(5)))),
    ("+a > +1", Comparison(">", a, IntegerLiteral(1))),
    ("(a)", a),
    ("a IS NOT NULL", IsNull(a, negated=True)),
    ("a NOT BETWEEN 1 AND 2.5", Between(a, IntegerLiteral(1), FloatLiteral(2.5), negated=True)),
    ("a not in ('x','y','x')", In(a, ("x", "y", "x"), negated=True)),
    ("(a) IN ('x')", In(a, ("x",))),
    ("a NOT STARTSWITH 'p'", StringMatch("STARTSWITH", a, "p", negated=True)),
    ("a > 2147483648L", Comparison(">", a, IntegerLiteral(2**31))),
    ("a > 9223372036854775807", Comparison(">", a, IntegerLiteral(2**63 - 1))),
    ("a > 4.9E-324", Comparison(">", a, FloatLiteral(5e-324))),
    ("a = 007.50", Comparison("=", a, FloatLiteral(7.5))),
    ("a = 'x' OR NULL", Or((Comparison("=", a, StringLiteral("x")), NullLiteral()))),
]


@pytest.mark.parametrize(("expression", "tree"), TREES, ids=[row[0] for row in TREES])
def test_parse_tree(expression: str, tree: Node) -> None:
    assert parse(expression) == tree
    assert parse(render(tree)) == tree


def test_keywords_are_case_insensitive_and_names_are_not() -> None:
    assert parse("a bEtWeEn 1 AnD 2 oR a iS nOt NuLl") == parse(
        "a BETWEEN 1 AND 2 OR a IS NOT NULL"
    )
    assert parse("TAGS = 'x'") != parse("tags = 'x'")


RENDERED = [
    ("a>5 and b='it''s'", "a > 5 AND b = 'it''s'"),
    ("a or (b or c)", "a OR (b OR c)"),
    ("(a and b) or c", "a AND b OR c"),
    ("not (a = 1)", "NOT (a = 1)"),
    ("(not a) = 1", "NOT a = 1"),
    ("a = (b = c)", "a = (b = c)"),
    ("a > -(-5)", "a > - -5"),
    ("a between -1 and 1e3", "a BETWEEN -1 AND 1000.0"),
    ("a in ('x','y') and b not contains ''", "a IN ('x', 'y') AND b NOT CONTAINS ''"),
    ("(a is null) = true", "a IS NULL = TRUE"),
    ("a = 1 /* comment */ -- more", "a = 1"),
]


@pytest.mark.parametrize(("expression", "canonical"), RENDERED, ids=[row[0] for row in RENDERED])
def test_render_is_canonical(expression: str, canonical: str) -> None:
    assert render(parse(expression)) == canonical


# ------------------------------------------------------------------ errors

ERRORS = [
    # lexical
    ("a = 'abc", 4, "unterminated string literal"),
    ("a = 'it''s", 8, "unterminated string literal"),  # 'it' is a string, then 's
    ("a = 1 /* open", 6, "unterminated comment"),
    ('a = "x"', 4, "single quotes"),
    ("a # 1", 2, "unexpected character '#'"),
    ("a != 1", 2, "unexpected character '!'"),
    ("a.b = 1", 1, "unexpected character '.'"),
    ("a = 1;", 5, "unexpected character ';'"),
    # structure
    ("", 0, "the expression is empty"),
    ("  -- only a comment", 19, "the expression is empty"),
    ("a > ", 4, "expected a value after '>', found the end of the expression"),
    ("a = 1 AND", 9, "expected a value after 'AND'"),
    ("a = 1 AND OR b", 10, "expected a value after 'AND', found 'OR'"),
    (") = 1", 0, "expected a value, found ')'"),
    ("(a = 1", 6, "expected ')' to close the '(' opened at position 0"),
    ("a = 1)", 5, "unexpected ')' after a complete expression"),
    ("a = 1 b = 2", 6, "unexpected 'b' after a complete expression"),
    ("a = 1 --x\n b", 11, "unexpected 'b'"),
    ("a > --5", 7, "expected a value after '>'"),  # "--" is always a comment
    ("a NOT = 1", 2, "unexpected 'NOT'"),
    ("a IS 5", 5, "expected NULL or NOT NULL after IS, found '5'"),
    ("a IS NOT 5", 9, "expected NULL or NOT NULL after IS"),
    ("a BETWEEN 1 OR 2", 12, "expected AND between the bounds of BETWEEN"),
    ("a IN 'x'", 5, "expected '(' after IN"),
    ("a IN ()", 6, "expected a string literal in the IN list"),
    ("a IN (1, 2)", 6, "expected a string literal in the IN list"),
    ("a IN ('x' 'y')", 10, "expected ',' or ')' in the IN list"),
    ("a CONTAINS b", 11, "expected a string literal after CONTAINS"),
    ("a NOT ENDSWITH 5", 15, "expected a string literal after ENDSWITH"),
    # literals
    ("a > 9223372036854775808", 4, "integer literal 9223372036854775808 is above"),
    ("a > 100000000000000000000000", 4, "is above 9223372036854775807"),
    ("a > 1e999", 4, "decimal literal 1e999 is out of range"),
    ("a > 0.0", 4, "zero or below Double.MIN_VALUE"),
    ("a > 1e-400", 4, "zero or below Double.MIN_VALUE"),
    ("a = 0L", 5, "unexpected 'L'"),  # "0" takes no suffix in RocketMQ's grammar
    ("a = 0x1F", 5, "unexpected 'x1F'"),  # no hex literals
    # RocketMQ's type checks
    ("5", 0, "5 is not a condition"),
    ("'x'", 0, "'x' is not a condition"),
    ("-a", 0, "-a is not a condition"),
    ("a = 1 AND 5", 10, "5 is not a condition"),
    ("NOT 'x'", 4, "'x' is not a condition"),
    ("a = NULL", 4, "NULL cannot be compared with = or <> (use IS NULL)"),
    ("NULL <> a", 0, "NULL cannot be compared"),
    ("TRUE = 'x'", 0, "TRUE cannot be compared with 'x'"),
    ("FALSE = 1", 0, "FALSE cannot be compared with 1"),
    ("a > 'x'", 4, "'x' cannot be compared with >, >=, < or <="),
    ("a < TRUE", 4, "TRUE cannot be compared"),
    ("a >= NULL", 5, "NULL cannot be compared"),
    ("(a = 1) > 2", 0, "(a = 1) cannot be compared"),
    ("NOT a > 5", 0, "NOT a cannot be compared"),
    ("a > 1 > 2", 0, "a > 1 cannot be compared"),
    ("a BETWEEN 'x' AND 'y'", 10, "'x' cannot be compared"),
    ("a BETWEEN 10 AND 0", 10, "BETWEEN bounds are reversed: 10 is above 0"),
    ("a BETWEEN 2.5 AND 2", 10, "BETWEEN bounds are reversed"),
    ("a BETWEEN 1 AND NULL", 16, "NULL cannot be compared"),
    ("5 IN ('x')", 0, "IN needs a property on its left, not 5"),
    ("a = 'x' IN ('x')", 4, "IN needs a property on its left, not 'x'"),
    ("a and between 2 and 10", 6, "expected a value after 'and', found 'between'"),
]


@pytest.mark.parametrize(("expression", "position", "reason"), ERRORS, ids=[e[0] for e in ERRORS])
def test_parse_errors(expression: str, position: int, reason: str) -> None:
    with pytest.raises(SelectorError) as caught:
        parse(expression)
    assert caught.value.position == position
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f"{caught.value.reason} at position {position}: ")
    with pytest.raises(SelectorError):
        compile_selector(expression)


def test_error_message_shows_where() -> None:
    with pytest.raises(SelectorError) as caught:
        parse("a > ")
    assert str(caught.value) == (
        "expected a value after '>', found the end of the expression at position 4: a > [here]"
    )
    with pytest.raises(SelectorError) as caught:
        parse("x = 1 AND (y = 2 OR z =\n)")
    assert caught.value.position == 24
    assert str(caught.value).endswith("x = 1 AND (y = 2 OR z = [here])")


def test_length_limit() -> None:
    longest = "a = '" + "x" * (MAX_EXPRESSION_LENGTH - 6) + "'"
    assert len(longest) == MAX_EXPRESSION_LENGTH
    assert parse(longest) == Comparison("=", a, StringLiteral("x" * (MAX_EXPRESSION_LENGTH - 6)))
    with pytest.raises(SelectorError, match="longer than 4096 characters") as caught:
        parse(longest + " ")
    assert caught.value.position == MAX_EXPRESSION_LENGTH


def test_a_long_chain_of_or_is_not_deep() -> None:
    # hundreds of alternatives fit in the length limit and make one flat node
    expression = " OR ".join(f"a = '{i}'" for i in range(300))
    selector = compile_selector(expression)
    assert selector.matches({"a": "299"})
    assert not selector.matches({"a": "300"})


@pytest.mark.parametrize(
    ("nest", "deepest", "position"),
    [
        # 64 parentheses are 64 levels of parsing; the 65th is refused where it opens
        (lambda depth: "(" * depth + "a = 1" + ")" * depth, MAX_DEPTH, MAX_DEPTH),
        # a chain of NOTs is refused at its outermost NOT, whose subtree is too deep
        (lambda depth: "NOT " * depth + "a", MAX_DEPTH - 1, 0),
        # the comparison over the negations is one level more
        (lambda depth: "a > " + "- " * depth + "1", MAX_DEPTH - 2, 2),
        # chained equalities nest to the left; refused at the '=' that goes too deep
        (lambda depth: "TRUE" + " = TRUE" * depth, MAX_DEPTH - 1, 5 + 7 * (MAX_DEPTH - 1)),
    ],
    ids=["parentheses", "not", "negation", "equality chain"],
)
def test_depth_limit(nest: Callable[[int], str], deepest: int, position: int) -> None:
    assert parse(nest(deepest)).depth <= MAX_DEPTH
    with pytest.raises(SelectorError, match=f"nests deeper than {MAX_DEPTH} levels") as caught:
        parse(nest(deepest + 1))
    assert caught.value.position == position
    with pytest.raises(SelectorError, match="nests deeper"):
        parse(nest(500))  # a clear error, never a RecursionError


# ------------------------------------------------------------------ the reference interpreter
#
# A deliberately naive reading of the module docstring's rules: Java values are tagged tuples,
# every rule is spelt out where it applies, nothing is precompiled or specialised.

JValue = tuple[str, object] | None


class Abort(Exception):
    """Java would throw: the message does not match."""


def reference_matches(node: Node, properties: Mapping[str, str]) -> bool:
    try:
        return truth(node, properties) is True
    except Abort:
        return False


def truth(node: Node, properties: Mapping[str, str]) -> bool | None:
    """A node where a condition is wanted."""
    if isinstance(node, Property):
        return None if node.name not in properties else False
    value = evaluate(node, properties)
    if value is None:
        return None
    assert value[0] == "Boolean"
    assert isinstance(value[1], bool)
    return value[1]


def boolean(value: bool | None) -> JValue:
    return None if value is None else ("Boolean", value)


def evaluate(node: Node, properties: Mapping[str, str]) -> JValue:
    if isinstance(node, Property):
        return None if node.name not in properties else ("String", properties[node.name])
    if isinstance(node, StringLiteral):
        return ("String", node.value)
    if isinstance(node, IntegerLiteral):
        return ("Integer" if node.value < 2**31 else "Long", node.value)
    if isinstance(node, FloatLiteral):
        return ("Double", node.value)
    if isinstance(node, BooleanLiteral):
        return ("Boolean", node.value)
    if isinstance(node, NullLiteral):
        return None
    if isinstance(node, Negate):
        value = evaluate(node.operand, properties)
        if value is None or value[0] not in ("Integer", "Long", "Double"):
            return None
        assert isinstance(value[1], int | float)
        return (value[0], -value[1])
    if isinstance(node, Not):
        inner = truth(node.operand, properties)
        return boolean(None if inner is None else not inner)
    if isinstance(node, And):
        return boolean(logic_and([partial(truth, n, properties) for n in node.operands]))
    if isinstance(node, Or):
        return boolean(logic_or([partial(truth, n, properties) for n in node.operands]))
    if isinstance(node, Comparison):
        return boolean(comparison(node.op, node.left, node.right, properties))
    if isinstance(node, IsNull):
        return boolean((evaluate(node.operand, properties) is None) != node.negated)
    if isinstance(node, Between):
        x, low, high = node.operand, node.low, node.high
        outside: list[Callable[[], bool | None]] = [
            lambda: comparison("<", x, low, properties),
            lambda: comparison(">", x, high, properties),
        ]
        inside: list[Callable[[], bool | None]] = [
            lambda: comparison(">=", x, low, properties),
            lambda: comparison("<=", x, high, properties),
        ]
        return boolean(logic_or(outside) if node.negated else logic_and(inside))
    if isinstance(node, In):
        if node.operand.name not in properties:
            return None
        return boolean((properties[node.operand.name] in node.values) != node.negated)
    assert isinstance(node, StringMatch)
    if node.pattern == "":
        return boolean(False)
    value = evaluate(node.operand, properties)
    if value is None or value[0] != "String":
        return boolean(False)
    assert isinstance(value[1], str)
    found = {
        "CONTAINS": node.pattern in value[1],
        "STARTSWITH": value[1].startswith(node.pattern),
        "ENDSWITH": value[1].endswith(node.pattern),
    }[node.op]
    return boolean(found != node.negated)


def logic_and(operands: list[Callable[[], bool | None]]) -> bool | None:
    result: bool | None = True
    for operand in operands:
        value = operand()
        if value is False:
            return False
        if value is None:
            result = None
    return result


def logic_or(operands: list[Callable[[], bool | None]]) -> bool | None:
    result: bool | None = False
    for operand in operands:
        value = operand()
        if value is True:
            return True
        if value is None:
            result = None
    return result


def comparison(op: str, left: Node, right: Node, properties: Mapping[str, str]) -> bool | None:
    if op in ("=", "<>"):
        lhs, rhs = evaluate(left, properties), evaluate(right, properties)
        if lhs is None and rhs is None:
            equal: bool | None = True
        elif lhs is None:
            equal = None
        elif rhs is None:
            equal = False
        else:
            equal = java_compare(lhs, rhs) == 0
        return equal if op == "=" or equal is None else not equal
    lhs = evaluate(left, properties)
    if lhs is None:
        return None
    rhs = evaluate(right, properties)
    if rhs is None:
        return None
    if lhs[0] == "String" and rhs[0] == "String":
        lhs, rhs = convert(lhs, "Double"), convert(rhs, "Double")
    sign = java_compare(lhs, rhs)
    return {">": sign > 0, ">=": sign >= 0, "<": sign < 0, "<=": sign <= 0}[op]


def java_compare(lhs: tuple[str, object], rhs: tuple[str, object]) -> int:
    if lhs[0] != rhs[0]:
        if lhs[0] == "Boolean":
            if rhs[0] == "String":
                raise Abort("ClassCastException")
            return -1
        if lhs[0] == "String":
            lhs = convert(lhs, rhs[0])
        elif rhs[0] == "String":
            rhs = convert(rhs, lhs[0])
        elif rhs[0] == "Boolean":
            return -1
        elif "Double" in (lhs[0], rhs[0]):
            lhs, rhs = ("Double", float(lhs[1])), ("Double", float(rhs[1]))  # type: ignore[arg-type]
    if lhs[0] == "Double":
        left_key, right_key = double_key(lhs[1]), double_key(rhs[1])
        return (left_key > right_key) - (left_key < right_key)
    return int((lhs[1] > rhs[1]) - (lhs[1] < rhs[1]))  # type: ignore[operator]


def double_key(value: object) -> tuple[int, float, float]:
    """Double.compareTo's order: -0.0 below 0.0, NaN above everything."""
    assert isinstance(value, float)
    if math.isnan(value):
        return (1, 0.0, 0.0)
    return (0, value, math.copysign(1.0, value))


JAVA_INTEGER = re.compile(r"[+-]?\d+")
# Double.valueOf's grammar, from its Javadoc, with String.trim's whitespace.
JAVA_DOUBLE = re.compile(
    r"[\x00-\x20]*[+-]?(NaN|Infinity|((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[fFdD]?)"
    r"|(0[xX]([0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?\d+[fFdD]?))[\x00-\x20]*",
    re.ASCII,
)


def convert(value: tuple[str, object], java_type: str) -> tuple[str, object]:
    text = value[1]
    assert isinstance(text, str)
    if java_type == "Boolean":
        return ("Boolean", text.lower() == "true")
    if java_type == "Double":
        if not JAVA_DOUBLE.fullmatch(text):
            raise Abort("NumberFormatException")
        text = text.strip("".join(map(chr, range(33)))).rstrip("fFdD")
        if "x" in text or "X" in text:
            try:
                return ("Double", float.fromhex(text))
            except OverflowError:
                return ("Double", -math.inf if text.startswith("-") else math.inf)
        return ("Double", float(text))
    bits = 32 if java_type == "Integer" else 64
    if not JAVA_INTEGER.fullmatch(text) or any(ord(char) > 0xFFFF for char in text):
        raise Abort("NumberFormatException")
    number = int(text)
    if not -(2 ** (bits - 1)) <= number < 2 ** (bits - 1):
        raise Abort("NumberFormatException")
    return (java_type, number)


def test_reference_reads_java_numbers_like_java() -> None:
    # The reference interpreter's own conversions, against values Java documents.
    assert convert(("String", "+0x1.8p1"), "Double") == ("Double", 3.0)
    assert convert(("String", "1e400"), "Double") == ("Double", math.inf)
    assert convert(("String", "-Infinity"), "Double") == ("Double", -math.inf)
    assert convert(("String", "-7"), "Integer") == ("Integer", -7)
    assert convert(("String", "2147483648"), "Long") == ("Long", 2**31)
    for text, java_type in [("1.5", "Integer"), ("2147483648", "Integer"), ("", "Long")]:
        with pytest.raises(Abort):
            convert(("String", text), java_type)
    for text in ["nan", "infinity", "1_0", "0x1", "1e", "\u0663.0"]:
        with pytest.raises(Abort):
            convert(("String", text), "Double")


# ------------------------------------------------------------------ Hypothesis

NAMES = ["a", "b", "c", "TAGS", "x_1", "$v"]
TEXTS = st.sampled_from(["", "x", "abc", "5", "true", "it's", "TagA", "a'b''"]) | st.text(
    max_size=4
)
NUMBER_TEXTS = ["0", "1", "3", "5", "-3", "+7", "05", "5.5", "1e3", "-0.0", "0.0", "NaN", "-5.0"]
ODD_NUMBER_TEXTS = ["Infinity", "-Infinity", " 2 ", "1.5f", "0x1p3", "\u0663", "1_000", "inf"]
RANGE_TEXTS = ["2147483648", "-2147483649", "9223372036854775807", "9223372036854775808"]
OTHER_TEXTS = ["", "true", "TRUE", "false", "abc", "x", "TagA", "it's"]
VALUES = st.sampled_from([*NUMBER_TEXTS, *ODD_NUMBER_TEXTS, *RANGE_TEXTS, *OTHER_TEXTS]) | TEXTS
PROPERTY_MAPS = st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=len(NAMES))

PROPERTIES = st.builds(Property, st.sampled_from(NAMES))
STRINGS = st.builds(StringLiteral, TEXTS)
NUMBERS = st.builds(
    IntegerLiteral,
    st.sampled_from([0, 1, 3, 5, 10, 2**31 - 1, 2**31, 2**63 - 1]) | st.integers(0, 100),
) | st.builds(
    FloatLiteral,
    st.sampled_from([0.5, 1.5, 3.0, 5.0, 1e10, 5e-324]) | st.floats(5e-324, 1e300),
)
BOOLEANS = st.builds(BooleanLiteral, st.booleans())
LEAVES: st.SearchStrategy[Node] = st.one_of(
    PROPERTIES, STRINGS, NUMBERS, BOOLEANS, st.just(NullLiteral())
)
# Operands worth comparing: properties and numbers most of the time, anything now and then.
ORDERABLE_LEAVES = PROPERTIES | PROPERTIES | NUMBERS | st.builds(Negate, NUMBERS)
OPERAND_LEAVES = PROPERTIES | PROPERTIES | STRINGS | NUMBERS | BOOLEANS
CONDITION_TYPES = (Comparison, IsNull, Between, In, StringMatch, And, Or, Not)
LITERAL_TYPES = (StringLiteral, IntegerLiteral, FloatLiteral, BooleanLiteral, NullLiteral)


def as_condition(node: Node) -> Node:
    """Any node, made acceptable where a condition is wanted."""
    conditions = (*CONDITION_TYPES, BooleanLiteral, NullLiteral, Property)
    return node if isinstance(node, conditions) else IsNull(node)


def as_orderable(node: Node) -> Node:
    """Any node, made acceptable on either side of ``>`` and friends."""
    orderable = (Property, IntegerLiteral, FloatLiteral, Negate)
    return node if isinstance(node, orderable) else Negate(node)


def equality(op: ComparisonOp, left: Node, right: Node) -> Node:
    left = BooleanLiteral(True) if isinstance(left, NullLiteral) else left
    right = BooleanLiteral(False) if isinstance(right, NullLiteral) else right
    if isinstance(left, BooleanLiteral) and isinstance(right, LITERAL_TYPES):
        left, right = right, left  # TRUE cannot face a string or number literal on its left
    return Comparison(op, left, right)


def between(operand: Node, low: Node, high: Node, negated: bool) -> Node:
    numbers = (IntegerLiteral, FloatLiteral)
    if isinstance(low, numbers) and isinstance(high, numbers):
        low_value, high_value = evaluate(low, {}), evaluate(high, {})
        assert low_value is not None and high_value is not None
        if java_compare(high_value, low_value) < 0:
            low, high = high, low  # BETWEEN wants ascending literal bounds
    return Between(operand, low, high, negated)


EQUALITY_OPS: list[ComparisonOp] = ["=", "<>"]
ORDERING_OPS: list[ComparisonOp] = [">", ">=", "<", "<="]
MATCH_OPS: list[MatchOp] = ["CONTAINS", "STARTSWITH", "ENDSWITH"]


def extend(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    conditions = children.map(as_condition)
    orderables = ORDERABLE_LEAVES | children.map(as_orderable)
    operands = OPERAND_LEAVES | children
    junctions = st.lists(conditions, min_size=2, max_size=3).map(tuple)
    return st.one_of(
        st.builds(Negate, children),
        st.builds(Not, conditions),
        st.builds(And, junctions),
        st.builds(Or, junctions),
        st.builds(equality, st.sampled_from(EQUALITY_OPS), operands, operands),
        st.builds(Comparison, st.sampled_from(ORDERING_OPS), orderables, orderables),
        st.builds(IsNull, operands, st.booleans()),
        st.builds(between, orderables, orderables, orderables, st.booleans()),
        st.builds(
            In, PROPERTIES, st.lists(TEXTS, min_size=1, max_size=3).map(tuple), st.booleans()
        ),
        st.builds(StringMatch, st.sampled_from(MATCH_OPS), operands, TEXTS, st.booleans()),
    )


SELECTORS = st.recursive(LEAVES, extend, max_leaves=8).map(as_condition)


@settings(max_examples=200, derandomize=True)
@given(SELECTORS)
def test_render_then_parse_gives_the_same_tree(node: Node) -> None:
    assert parse(render(node)) == node


@settings(max_examples=200, derandomize=True)
@given(SELECTORS, st.lists(PROPERTY_MAPS, min_size=1, max_size=4))
def test_compiled_selector_agrees_with_the_reference(
    node: Node, messages: list[dict[str, str]]
) -> None:
    assert_agrees(node, messages)


# One comparison at a time, with literals and property values drawn from small pools that
# meet often, so that every conversion rule gets exercised.
PAIR = st.builds(Property, st.sampled_from(["a", "b"]))
POOL_NUMBERS = st.builds(
    IntegerLiteral, st.sampled_from([0, 1, 3, 5, 2**31 - 1, 2**31, 2**63 - 1])
) | st.builds(FloatLiteral, st.sampled_from([0.5, 1.5, 3.0, 5.0, 1e3, 5e-324]))
POOL_ORDERABLES = PAIR | PAIR | POOL_NUMBERS | st.builds(Negate, POOL_NUMBERS)
POOL_OPERANDS = POOL_ORDERABLES | BOOLEANS | st.builds(StringLiteral, st.sampled_from(OTHER_TEXTS))
POOL_VALUES = [*NUMBER_TEXTS, *ODD_NUMBER_TEXTS, *RANGE_TEXTS, *OTHER_TEXTS]
COMPARISONS = st.one_of(
    st.builds(equality, st.sampled_from(EQUALITY_OPS), POOL_OPERANDS, POOL_OPERANDS),
    st.builds(Comparison, st.sampled_from(ORDERING_OPS), POOL_ORDERABLES, POOL_ORDERABLES),
    st.builds(between, POOL_ORDERABLES, POOL_ORDERABLES, POOL_ORDERABLES, st.booleans()),
)


@settings(max_examples=200, derandomize=True)
@given(COMPARISONS, st.none() | st.sampled_from(POOL_VALUES))
def test_comparisons_agree_with_the_reference(node: Node, other: str | None) -> None:
    # Every pool value for a (and no a at all), against one value (or none) for b.
    extra = {} if other is None else {"b": other}
    assert_agrees(node, [extra, *({"a": value} | extra for value in POOL_VALUES)])


def assert_agrees(node: Node, messages: list[dict[str, str]]) -> None:
    # x, NOT (x) and (x) IS NULL together tell TRUE, FALSE, NULL and an error apart, which
    # matches() alone does not.
    for tree in (node, Not(node), IsNull(node)):
        selector = compile_selector(render(tree))
        for properties in messages:
            assert selector.matches(properties) is reference_matches(tree, properties), (
                render(tree),
                properties,
            )


@settings(max_examples=200, derandomize=True)
@given(st.text(max_size=40))
def test_parse_raises_only_selector_errors_on_any_text(text: str) -> None:
    try:
        node = parse(text)
    except SelectorError as error:
        assert 0 <= error.position <= len(text)
    else:
        assert isinstance(node, (*CONDITION_TYPES, Property, BooleanLiteral, NullLiteral))


SOUP_WORDS = ["a", "b", "TAGS", "TRUE", "false", "NULL", "AND", "or", "NOT", "IS", "BETWEEN"]
SOUP_WORDS += ["IN", "CONTAINS", "startswith", "ENDSWITH"]
SOUP_LITERALS = ["'x'", "''", "'", "5", "2147483648", "1.5", ".5", "0.0", "1e999", "9" * 20]
SOUP_SYMBOLS = ["=", "<>", ">", ">=", "<", "<=", "(", ")", ",", "+", "-", "--", "/*", "*/", "\n"]
TOKENS = st.sampled_from([*SOUP_WORDS, *SOUP_LITERALS, *SOUP_SYMBOLS, "#"])


@settings(max_examples=300, derandomize=True)
@given(st.lists(TOKENS, max_size=12).map(" ".join), PROPERTY_MAPS)
def test_token_soup_parses_or_fails_cleanly(text: str, properties: dict[str, str]) -> None:
    try:
        selector = compile_selector(text)
    except SelectorError as error:
        assert 0 <= error.position <= len(text)
        return
    assert selector.matches(properties) is reference_matches(parse(text), properties)
    assert parse(render(parse(text))) == parse(text)
