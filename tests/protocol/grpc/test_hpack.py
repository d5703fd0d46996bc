"""HpackDecoder: RFC 7541's Appendix C examples, malformed blocks, and a differential test
against the ``hpack`` library's Decoder (blocks from its Encoder, structured random blocks and
arbitrary bytes): the same header lists and dynamic tables, and the same blocks refused."""

from __future__ import annotations

from dataclasses import dataclass

import hpack
import pytest
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.grpc.hpack import HpackDecoder, HpackError

HUFFMAN = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)
Fields = list[tuple[str, str]]


def text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


# ----------------------------------------------------------------- RFC 7541 Appendix C

C2 = [  # (block, header list, dynamic table, table size), each on a fresh decoder
    (
        "400a637573746f6d2d6b65790d637573746f6d2d686561646572",
        [("custom-key", "custom-header")],
        [("custom-key", "custom-header")],
        55,
    ),
    ("040c2f73616d706c652f70617468", [(":path", "/sample/path")], [], 0),
    ("100870617373776f726406736563726574", [("password", "secret")], [], 0),
    ("82", [(":method", "GET")], [], 0),
]

REQUEST_1 = [(":method", "GET"), (":scheme", "http"), (":path", "/")]
REQUESTS = [  # C.3 / C.4: (header list, dynamic table, table size) after each block
    (
        [*REQUEST_1, (":authority", "www.example.com")],
        [(":authority", "www.example.com")],
        57,
    ),
    (
        [*REQUEST_1, (":authority", "www.example.com"), ("cache-control", "no-cache")],
        [("cache-control", "no-cache"), (":authority", "www.example.com")],
        110,
    ),
    (
        [
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ],
        [
            ("custom-key", "custom-value"),
            ("cache-control", "no-cache"),
            (":authority", "www.example.com"),
        ],
        164,
    ),
]
C3 = [
    "828684410f7777772e6578616d706c652e636f6d",
    "828684be58086e6f2d6361636865",
    "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
]
C4 = [
    "828684418cf1e3c2e5f23a6ba0ab90f4ff",
    "828684be5886a8eb10649cbf",
    "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
]

DATE_1 = ("date", "Mon, 21 Oct 2013 20:13:21 GMT")
DATE_2 = ("date", "Mon, 21 Oct 2013 20:13:22 GMT")
LOCATION = ("location", "https://www.example.com")
COOKIE = ("set-cookie", "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1")
RESPONSES = [  # C.5 / C.6, table size 256: evictions from the second block on
    (
        [(":status", "302"), ("cache-control", "private"), DATE_1, LOCATION],
        [LOCATION, DATE_1, ("cache-control", "private"), (":status", "302")],
        222,
    ),
    (
        [(":status", "307"), ("cache-control", "private"), DATE_1, LOCATION],
        [(":status", "307"), LOCATION, DATE_1, ("cache-control", "private")],
        222,
    ),
    (
        [
            (":status", "200"),
            ("cache-control", "private"),
            DATE_2,
            LOCATION,
            ("content-encoding", "gzip"),
            COOKIE,
        ],
        [COOKIE, ("content-encoding", "gzip"), DATE_2],
        215,
    ),
]
C5 = [
    "4803333032580770726976617465611d4d6f6e2c203231204f637420323031332032303a31333a323120474d54"
    "6e1768747470733a2f2f7777772e6578616d706c652e636f6d",
    "4803333037c1c0bf",
    "88c1611d4d6f6e2c203231204f637420323031332032303a31333a323220474d54c05a04677a69707738666f6f"
    "3d4153444a4b48514b425a584f5157454f50495541585157454f49553b206d61782d6167653d333630303b2076"
    "657273696f6e3d31",
]
C6 = [
    "488264025885aec3771a4b6196d07abe941054d444a8200595040b8166e082a62d1bff6e919d29ad171863c78f"
    "0b97c8e9ae82ae43d3",
    "4883640effc1c0bf",
    "88c16196d07abe941054d444a8200595040b8166e084a62d1bffc05a839bd9ab77ad94e7821dd7f2e6c7b335df"
    "dfcd5b3960d5af27087f3672c1ab270fb5291f9587316065c003ed4ee5b1063d5007",
]


@pytest.mark.parametrize(("block", "fields", "entries", "size"), C2)
def test_rfc7541_c2_single_fields(block: str, fields: Fields, entries: Fields, size: int) -> None:
    decoder = HpackDecoder()
    assert decoder.decode(bytes.fromhex(block)) == fields
    assert decoder.table_entries() == entries
    assert decoder.table_size == size


@pytest.mark.parametrize(
    ("blocks", "expected", "table_size"),
    [(C3, REQUESTS, 4096), (C4, REQUESTS, 4096), (C5, RESPONSES, 256), (C6, RESPONSES, 256)],
    ids=["C.3", "C.4", "C.5", "C.6"],
)
def test_rfc7541_c3_to_c6_sequences(
    blocks: list[str], expected: list[tuple[Fields, Fields, int]], table_size: int
) -> None:
    decoder = HpackDecoder(max_table_size=table_size)
    reference = hpack.Decoder()
    reference.header_table_size = table_size
    for block, (fields, entries, size) in zip(blocks, expected, strict=True):
        data = bytes.fromhex(block)
        assert decoder.decode(data) == fields
        assert decoder.table_entries() == entries
        assert decoder.table_size == size
        assert [(text(k), text(v)) for k, v in reference.decode(data, raw=True)] == fields


# ------------------------------------------------------------------------------ Huffman


def literal(value: bytes, *, huffman: bool, name: bytes = b"n") -> bytes:
    """A literal field without indexing, new name (RFC 7541 §6.2.2), value as given."""
    flag = 0x80 if huffman else 0
    assert len(name) < 127 and len(value) < 127
    return bytes([0, len(name)]) + name + bytes([flag | len(value)]) + value


def test_huffman_every_octet_and_utf8() -> None:
    everything = bytes(range(256))
    for chunk in (everything[i : i + 40] for i in range(0, 256, 40)):
        (field,) = HpackDecoder().decode(literal(HUFFMAN.encode(chunk), huffman=True))
        assert field == ("n", text(chunk))
        (field,) = HpackDecoder().decode(literal(chunk[:5], huffman=False))
        assert field == ("n", text(chunk[:5]))
    latin = HUFFMAN.encode(everything[:20])  # control characters: 13-30 bit codes
    assert HpackDecoder().decode(literal(latin, huffman=True)) == [("n", text(everything[:20]))]
    assert HpackDecoder().decode(literal(HUFFMAN.encode("é€".encode()), huffman=True)) == [
        ("n", "é€")
    ]


def test_huffman_long_values_and_the_prefix_memo() -> None:
    """Values longer than the 32-octet memo prefix, alike and not, in names and values."""
    decoder = HpackDecoder()
    head = b"MQv2-HMAC-SHA1 Credential=AK0123456789, SignedHeaders=x-mq-date-time, Signature="
    encoder = hpack.Encoder()
    for i in range(3):
        value = head + f"{i:040X}".encode()
        block = encoder.encode([("authorization", value), (value[:50], "x")], huffman=True)
        assert decoder.decode(block) == [("authorization", text(value)), (text(value[:50]), "x")]
    broken = head + b"\xff\xfe"  # invalid UTF-8 after the memoised prefix
    assert decoder.decode(literal(HUFFMAN.encode(broken), huffman=True)) == [("n", text(broken))]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"\xff\xff\xff\xff", "EOS"),  # EOS (30 ones) and 2 bits of padding
        (b"\xff\xff\xff\xfc", "EOS"),  # EOS then 0s
        (HUFFMAN.encode(b"a") + b"\xff", "padding"),  # 8 + 3 bits of padding
        (b"\x18", "padding"),  # 'a' = 00011, then padding 000
        (b"\x00", "padding"),  # '0' = 00000, then 000
        (b"\xfe", "padding"),  # a 7-bit prefix of a longer code, not all ones
    ],
)
def test_bad_huffman(value: bytes, message: str) -> None:
    as_name = b"\x00" + bytes([0x80 | len(value)]) + value + b"\x00"
    long = HUFFMAN.encode(b"x" * 64) + value  # past the memo prefix (7 bits x 64: no padding)
    past_memo = b"\x00\x01n" + bytes([0x80 | len(long)]) + long
    for block in (literal(value, huffman=True), as_name, past_memo):
        with pytest.raises(HpackError, match=message):
            HpackDecoder().decode(block)
        with pytest.raises(hpack.HPACKDecodingError):
            hpack.Decoder().decode(block, raw=True)


def test_huffman_padding_up_to_seven_ones() -> None:
    # '0' = 00000 | 111 (3 bits of padding); "00" = 00000 00000 | 111111 (6 bits)
    assert HpackDecoder().decode(literal(b"\x07", huffman=True)) == [("n", "0")]
    assert HpackDecoder().decode(literal(b"\x00\x3f", huffman=True)) == [("n", "00")]
    assert HpackDecoder().decode(literal(b"", huffman=True)) == [("n", "")]


# ------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (b"\x80", "index 0"),
        (b"\x82\x80\x82", "index 0"),
        (b"\xbe", "index 62 beyond the table \\(61 entries\\)"),
        (b"\xff\x80\x01", "index 255 beyond"),
        (b"\x7e\x01x", "index 62 beyond"),  # literal, incremental indexing, name index 62
        (b"\x0f\x2f\x01x", "index 62 beyond"),  # literal without indexing, name index 62
        (b"\x1f\x30\x01x", "index 63 beyond"),  # never indexed, name index 63
        (b"\xff", "truncated"),
        (b"\xff\x80", "truncated"),
        (b"\x41", "truncated"),  # name index 1, no value
        (b"\x41\x03ab", "truncated"),
        (b"\x40\x05ab", "truncated"),
        (b"\x00\x03abc\x05ab", "truncated"),
        (b"\x00\x03abc\x7f", "truncated"),
        (b"\x00\x7f\x80\x80", "truncated"),
        (b"\x00\x83\x00\x00", "truncated"),
        (b"\xff" + b"\x80" * 5 + b"\x00", "longer than 5 continuation octets"),
        (b"\x3f" + b"\xff" * 4 + b"\x7f", "too large"),
        (b"\x3f\xe2\x1f", "table size update to 4097 above our limit 4096"),
        (b"\x82\x20", "size update after a header field"),
        (b"\x20\x82\x3f\xe1\x1f", "size update after a header field"),
    ],
)
def test_malformed(block: bytes, message: str) -> None:
    with pytest.raises(HpackError, match=message):
        HpackDecoder().decode(block)
    with pytest.raises(hpack.HPACKDecodingError):  # the library refuses them too
        hpack.Decoder().decode(block, raw=True)


def test_header_list_size_limit() -> None:
    field = literal(b"v" * 30, huffman=False)  # 1 + 30 + 32 = 63 octets
    decoder = HpackDecoder(max_header_list_size=126)
    assert len(decoder.decode(field * 2)) == 2
    with pytest.raises(HpackError, match="header list larger than 126 octets"):
        decoder.decode(field * 3)
    # indexed fields count too: 42 + 43 + 38 + 57 octets, ":authority: www.example.com" 57
    decoder = HpackDecoder(max_header_list_size=180)
    assert len(decoder.decode(bytes.fromhex(C3[0]))) == 4
    assert len(decoder.decode(b"\xbe\xbe\xbe")) == 3
    with pytest.raises(HpackError, match="larger than 180"):
        decoder.decode(b"\xbe\xbe\xbe\xbe")


def test_entry_sizes_count_octets_not_characters() -> None:
    decoder = HpackDecoder()
    value = "é€".encode() + b"\xff\xfe"  # 2 + 3 + 2 invalid octets
    decoder.decode(b"\x40\x01n" + bytes([len(value)]) + value)
    assert decoder.table_entries() == [("n", "é€\ufffd\ufffd")]
    assert decoder.table_size == 32 + 1 + 7
    # an indexed name keeps its size in octets: b"\xe9" is one octet, "\ufffd" as UTF-8 three
    decoder.decode(b"\x40\x01\xe9\x00")
    decoder.decode(b"\x7e\x01x")  # name of index 62 (b"\xe9")
    assert decoder.table_entries()[0] == ("\ufffd", "x")
    assert decoder.table_size == 40 + 33 + 34


def test_table_size_updates_and_eviction() -> None:
    decoder = HpackDecoder()
    decoder.decode(bytes.fromhex(C3[0]) + b"\x40\x01a\x01b")  # 57 + 34 octets
    assert decoder.table_size == 91
    # at the start of any block (lenient, as the hpack library), several in a row; shrinking
    # to 57 evicts the oldest entry
    assert decoder.decode(b"\x3f\x1d\x3f\x1a\xbe") == [("a", "b")]
    assert decoder.table_max_size == 57
    assert (decoder.table_entries(), decoder.table_size) == ([("a", "b")], 34)
    # adding evicts as much as needed: 34 + 34 > 57
    decoder.decode(b"\x40\x01c\x01d")
    assert (decoder.table_entries(), decoder.table_size) == ([("c", "d")], 34)
    # an entry larger than the table empties it and is not added
    assert decoder.decode(b"\x40\x02aa\x1a" + b"x" * 26) == [("aa", "x" * 26)]
    assert (decoder.table_entries(), decoder.table_size) == ([], 0)
    decoder.decode(b"\x3f\xe1\x1f\x40\x01a\x01b")  # back to 4096
    assert (decoder.table_entries(), decoder.table_size) == ([("a", "b")], 34)
    assert decoder.decode(b"\x20") == []
    assert (decoder.table_entries(), decoder.table_size) == ([], 0)
    with pytest.raises(HpackError, match="index 62 beyond"):
        decoder.decode(b"\xbe")


def test_many_entries_and_long_integers() -> None:
    """Indices past 127 and lengths past 127 take continuation octets."""
    encoder = hpack.Encoder()
    decoder = HpackDecoder()
    names = [f"h{i}" for i in range(100)]  # 100 x 35 octets + 336: all fit
    first = encoder.encode([(n, "v") for n in names] + [("long", "x" * 300)], huffman=False)
    assert decoder.decode(first)[-1] == ("long", "x" * 300)
    again = encoder.encode([(n, "v") for n in names], huffman=True)
    assert again[:1] == b"\xff"  # h0 is now far down the table
    assert decoder.decode(again) == [(n, "v") for n in names]


# ----------------------------------------------------------------- differential tests


def reference_fields(decoder: hpack.Decoder, block: bytes) -> Fields:
    return [(text(bytes(k)), text(bytes(v))) for k, v in decoder.decode(block, raw=True)]


def reference_table(decoder: hpack.Decoder) -> tuple[Fields, int]:
    table = decoder.header_table
    return [(text(k), text(v)) for k, v in table.dynamic_entries], table._current_size


def same_outcome(theirs: hpack.Decoder, ours: HpackDecoder, block: bytes) -> bool:
    """Both decoders decode ``block`` alike, or both refuse it (False: the states are lost)."""
    try:
        expected = reference_fields(theirs, block)
    except hpack.HPACKDecodingError:
        with pytest.raises(HpackError):
            ours.decode(block)
        return False
    assert ours.decode(block) == expected
    assert (ours.table_entries(), ours.table_size) == reference_table(theirs)
    return True


NAMES = st.one_of(
    st.sampled_from(["content-type", ":path", "x-mq-request-id", "authorization", "te"]),
    st.text(max_size=12),
    st.binary(max_size=12),
)
VALUES = st.one_of(
    st.sampled_from(["", "application/grpc", "trailers", "v2", "PYTHON"]),
    st.text(max_size=60),
    st.binary(max_size=200),
)


@dataclass
class Piece:
    """Part of a block: fields encoded in one Encoder.encode call."""

    fields: list[tuple[str | bytes, str | bytes, bool]]
    huffman: bool


PIECES = st.builds(
    Piece,
    st.lists(st.tuples(NAMES, VALUES, st.booleans()), max_size=6),
    st.booleans(),
)


@settings(max_examples=100, derandomize=True)
@given(
    blocks=st.lists(
        st.tuples(st.none() | st.integers(0, 4096), st.lists(PIECES, min_size=1, max_size=3)),
        min_size=1,
        max_size=6,
    )
)
def test_differential_encoder_blocks(
    blocks: list[tuple[int | None, list[Piece]]],
) -> None:
    """Blocks from hpack's Encoder (table size changes, Huffman on and off, never-indexed
    fields) decode as the library decodes them, with the same dynamic table after each."""
    encoder = hpack.Encoder()
    theirs = hpack.Decoder()
    ours = HpackDecoder()
    for table_size, pieces in blocks:
        if table_size is not None:
            encoder.header_table_size = table_size
        block = b""
        for piece in pieces:  # concatenated encodings of one encoder make one block
            headers = [
                hpack.NeverIndexedHeaderTuple(n, v) if never else hpack.HeaderTuple(n, v)
                for n, v, never in piece.fields
            ]
            block += encoder.encode(headers, huffman=piece.huffman)
        assert same_outcome(theirs, ours, block)


def integer(value: int, prefix_bits: int, flags: int) -> bytes:
    """RFC 7541 §5.1, written independently of both decoders."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([flags | value])
    out = [flags | top]
    value -= top
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


@st.composite
def strings(draw: st.DrawFn) -> bytes:
    """A string literal (§5.2): plain, Huffman-coded, random octets flagged as Huffman, or
    claiming more octets than it has."""
    data = draw(st.binary(max_size=50))
    kind = draw(st.sampled_from(["plain", "huffman", "huffman-raw", "cut"]))
    if kind == "plain":
        return integer(len(data), 7, 0) + data
    if kind == "huffman":
        coded = HUFFMAN.encode(data) if data else b""
        return integer(len(coded), 7, 0x80) + coded
    if kind == "huffman-raw":  # random octets as Huffman: often invalid
        return integer(len(data), 7, 0x80) + data
    return integer(len(data) + draw(st.integers(1, 3)), 7, 0) + data


@st.composite
def representations(draw: st.DrawFn) -> bytes:
    """One field representation or table size update (RFC 7541 §6), or a few random octets."""
    kind = draw(st.sampled_from(["indexed", "literal", "size", "garbage"]))
    if kind == "indexed":
        return integer(draw(st.integers(0, 75) | st.integers(0, 300)), 7, 0x80)
    if kind == "size":
        return integer(draw(st.integers(0, 5000) | st.sampled_from([0, 64, 4096])), 5, 0x20)
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=4))
    prefix, flags = draw(st.sampled_from([(6, 0x40), (4, 0x00), (4, 0x10)]))
    index = draw(st.just(0) | st.integers(0, 75))
    name = b"" if index else draw(strings())
    return integer(index, prefix, flags) + name + draw(strings())


@settings(max_examples=200, derandomize=True)
@given(
    blocks=st.lists(st.lists(representations(), max_size=8), min_size=1, max_size=5),
    max_list=st.sampled_from([100, 400, 65536]),
)
def test_differential_structured_random_blocks(blocks: list[list[bytes]], max_list: int) -> None:
    """Blocks of random representations (valid or not, every kind, size updates anywhere,
    random Huffman octets): ours accepts exactly what the library accepts, with the same
    result and table, and refuses everything else with HpackError only."""
    theirs = hpack.Decoder(max_header_list_size=max_list)
    ours = HpackDecoder(max_header_list_size=max_list)
    for parts in blocks:
        if not same_outcome(theirs, ours, b"".join(parts)):
            break


@settings(max_examples=200, derandomize=True)
@given(blocks=st.lists(st.binary(max_size=40), min_size=1, max_size=4))
def test_differential_arbitrary_bytes(blocks: list[bytes]) -> None:
    """Arbitrary octets: HpackError or the library's result, as the library refuses or not."""
    theirs = hpack.Decoder()
    ours = HpackDecoder()
    for block in blocks:
        if not same_outcome(theirs, ours, block):
            break
