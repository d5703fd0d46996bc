"""Name-server bodies: the KV table and both forms of a broker registration body."""

from __future__ import annotations

import contextlib
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.bodies import (
    DataVersion,
    KVTable,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicFilterType,
    body_crc32,
    decode_register_body,
    encode_register_body,
)
from protocol.bodies.namesrv import topic_config_from_text, topic_config_to_text
from protocol.errors import FieldError, ProtocolError

QUICK = settings(max_examples=60, deadline=None)
NAMES = st.text(alphabet="abcXYZ019%-_|", min_size=1, max_size=12)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
ATTRIBUTES = st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3)
# The text form carries only name, queue counts, perm, filter type and attributes.
TEXT_CONFIGS = st.builds(
    TopicConfig, NAMES, INT32, INT32, INT32, st.sampled_from(TopicFilterType),
    attributes=ATTRIBUTES,
)  # fmt: skip
BODIES = st.builds(
    RegisterBrokerBody,
    st.builds(
        TopicConfigSerializeWrapper,
        st.lists(TEXT_CONFIGS, max_size=4).map(lambda cs: {c.topic_name: c for c in cs}),
        st.builds(DataVersion, INT64, INT64, INT64),
    ),
    st.lists(st.text(max_size=8), max_size=2).map(tuple),
)


@QUICK
@given(table=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4))
def test_kv_table_round_trips(table: dict[str, str]) -> None:
    body = KVTable(table)
    assert KVTable.from_json(body.to_json()) == body
    assert body.to_json().startswith(b'{"table":{')


@QUICK
@given(body=BODIES, compressed=st.booleans())
def test_register_body_round_trips_in_both_forms(
    body: RegisterBrokerBody, compressed: bool
) -> None:
    data = encode_register_body(body, compressed=compressed)
    assert decode_register_body(data, compressed=compressed) == body


def test_topic_config_text_form_matches_java() -> None:
    config = TopicConfig("T1", read_queue_nums=8, write_queue_nums=4, perm=6)
    assert topic_config_to_text(config) == "T1 8 4 6 SINGLE_TAG"
    assert topic_config_from_text("T1 8 4 6 SINGLE_TAG", "t") == config
    with_attrs = topic_config_from_text('T2 1 1 6 MULTI_TAG {"+message.type":"NORMAL"}', "t")
    assert with_attrs.attributes == {"+message.type": "NORMAL"}
    assert with_attrs.topic_filter_type is TopicFilterType.MULTI_TAG


def _java_like(*chunks: bytes, count: int) -> bytes:
    """What ``RegisterBrokerBody.encode(true)`` writes (data version, count, topics, list)."""
    version, *topics, servers = chunks
    out = struct.pack(">i", len(version)) + version + struct.pack(">i", count)
    for t in topics:
        out += struct.pack(">i", len(t)) + t
    return zlib.compress(out + struct.pack(">i", len(servers)) + servers)


def test_java_compressed_body_with_trailing_queue_mappings_decodes() -> None:
    data = _java_like(
        b'{"counter":3,"stateVersion":0,"timestamp":1700000000000}',
        b"TopicA 4 4 6 SINGLE_TAG",
        b"TBW102 8 8 7 SINGLE_TAG",
        b"[]",
        count=2,
    )
    # A 5.x broker appends its queue mappings (count 0 here): ignored.
    data = zlib.compress(zlib.decompress(data) + struct.pack(">i", 0))
    body = decode_register_body(data, compressed=True)
    wrapper = body.topic_config_serialize_wrapper
    assert wrapper.data_version == DataVersion(1_700_000_000_000, 3, 0)
    assert sorted(wrapper.topic_config_table) == ["TBW102", "TopicA"]
    assert wrapper.topic_config_table["TBW102"].perm == 7


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (b"not zlib", "$"),
        (zlib.compress(b"\x00\x00"), "dataVersion"),
        (zlib.compress(struct.pack(">i", 99) + b"{}"), "dataVersion"),
        (zlib.compress(struct.pack(">i", 2) + b"{}" + struct.pack(">i", -1)), "topicConfigTable"),
        (
            zlib.compress(
                struct.pack(">i", 2) + b"{}" + struct.pack(">i", 1) + struct.pack(">i", 3) + b"a b"
            ),
            "topicConfigTable[0]",
        ),
        (
            zlib.compress(
                struct.pack(">i", 2)
                + b"{}"
                + struct.pack(">i", 1)
                + struct.pack(">i", 13)
                + b"a x 1 6 SINGL"
            ),
            "topicConfigTable[0]",
        ),
        (zlib.compress(b"x" * 64)[:-6], "$"),
    ],
)
def test_bad_compressed_bodies_name_the_field(data: bytes, field: str) -> None:
    with pytest.raises(FieldError) as info:
        decode_register_body(data, compressed=True)
    assert info.value.field == field


def test_inflating_beyond_the_bound_is_refused() -> None:
    bomb = zlib.compress(b"\x00" * 100_000)
    with pytest.raises(FieldError, match="beyond 1000 bytes"):
        decode_register_body(bomb, compressed=True, max_size=1000)


def test_bad_json_body_is_a_field_error() -> None:
    with pytest.raises(FieldError):
        decode_register_body(b'{"topicConfigSerializeWrapper":[1]}', compressed=False)
    assert decode_register_body(b"", compressed=False) == RegisterBrokerBody()


def test_body_crc32_is_javas_masked_crc() -> None:
    assert body_crc32(b"") == 0
    assert body_crc32(b"123456789") == 0xCBF43926 & 0x7FFFFFFF


@QUICK
@given(data=st.binary(max_size=200), compressed=st.booleans())
def test_arbitrary_bytes_only_raise_protocol_errors(data: bytes, compressed: bool) -> None:
    with contextlib.suppress(ProtocolError):
        decode_register_body(data, compressed=compressed)
    with contextlib.suppress(ProtocolError):
        decode_register_body(zlib.compress(data), compressed=True)
