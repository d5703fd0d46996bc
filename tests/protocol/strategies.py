"""Hypothesis strategies for protocol objects, shared by the protocol tests."""

from __future__ import annotations

from hypothesis import strategies as st

from protocol.codes import LanguageCode, SerializeType
from protocol.command import RemotingCommand

INT32 = st.integers(-(2**31), 2**31 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)
LANGUAGES = st.sampled_from([lang.name for lang in LanguageCode])
SHORT_TEXT = st.text(max_size=40)
EXT_FIELDS = st.dictionaries(SHORT_TEXT, st.text(max_size=80), max_size=12)
BODIES = st.binary(max_size=1024)


@st.composite
def commands(draw: st.DrawFn, serialize_type: SerializeType | None = None) -> RemotingCommand:
    """Any command that the given serialize type can carry (all types when None)."""
    stype = draw(st.sampled_from(SerializeType)) if serialize_type is None else serialize_type
    binary = stype is SerializeType.ROCKETMQ
    small = INT16 if binary else INT32
    # The binary header cannot tell an empty remark from a missing one (Java reads a
    # zero length as null), so only non-empty remarks round-trip there.
    remark = st.none() | (st.text(min_size=1, max_size=60) if binary else st.text(max_size=60))
    return RemotingCommand(
        code=draw(small),
        opaque=draw(INT32),
        flag=draw(INT32),
        language=draw(LANGUAGES),
        version=draw(small),
        remark=draw(remark),
        ext_fields=draw(EXT_FIELDS),
        body=draw(BODIES),
        serialize_type=stype,
    )
