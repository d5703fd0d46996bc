"""The JSON header's one-check fast path gives exactly what the field-by-field checks give
(issue 15), or steps aside for them."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import HeaderError
from protocol.header_codec import _checked_header, _plain_header, decode_json

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**33), 2**33),
    st.sampled_from([0, 1, 310, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1]),
    st.floats(allow_nan=False),
    st.text(max_size=5),
)
EXT = st.one_of(
    st.none(), st.dictionaries(st.text(max_size=3), SCALARS, max_size=4), st.lists(SCALARS)
)
FIELDS = {
    "code": SCALARS,
    "opaque": SCALARS,
    "flag": SCALARS,
    "version": SCALARS,
    "language": SCALARS,
    "remark": SCALARS,
    "extFields": EXT,
}


def _checked(obj: dict[str, Any]) -> object:
    try:
        return _checked_header(obj)
    except HeaderError as exc:
        return exc


@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_fast_path_is_none_or_the_checked_header(obj: dict[str, Any]) -> None:
    plain = _plain_header(obj)
    if plain is not None:
        assert plain == _checked(obj)
        assert plain.ext_fields is obj["extFields"]  # no copy, as the checked path


def test_a_client_header_takes_the_fast_path() -> None:
    data = (
        b'{"code":310,"language":"JAVA","version":401,"opaque":7,"flag":0,"remark":null,'
        b'"extFields":{"a":"pg","b":"t"},"serializeTypeCurrentRPC":"JSON"}'
    )
    obj = {"code": 310, "language": "JAVA", "version": 401, "opaque": 7, "flag": 0,
           "remark": None, "extFields": {"a": "pg", "b": "t"}}  # fmt: skip
    assert _plain_header(obj) is not None
    assert decode_json(data) == _checked_header(obj)


NEAR = st.sampled_from([0, 7, -1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, True, "7", None])


@given(
    st.fixed_dictionaries(
        {"code": NEAR, "extFields": st.dictionaries(st.text(max_size=2), st.text(max_size=2))},
        optional={
            "opaque": NEAR,
            "flag": NEAR,
            "version": NEAR,
            "language": st.sampled_from(["JAVA", 3, None]),
            "remark": st.sampled_from([None, "r", 5]),
        },
    )
)
def test_near_plain_headers(obj: dict[str, Any]) -> None:
    plain = _plain_header(obj)
    if plain is not None:
        assert plain == _checked(obj)
