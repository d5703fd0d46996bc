"""HPACK header-block decoding (RFC 7541) for the gRPC front end's HTTP/2 server, sans-IO.

What it implements: :class:`HpackDecoder`, the decoding side of RFC 7541 — the static table
(Appendix A), the dynamic table with its eviction (§4), integers with N-bit prefixes (§5.1),
string literals plain or Huffman-coded (§5.2, Appendix B), and every field representation
(§6: indexed; literal with incremental indexing, without indexing, never indexed; dynamic
table size updates). A block decodes to a list of ``(name, value)`` strings, the octets read as
UTF-8 with ``errors="replace"`` (what the connection did with the ``hpack`` library's raw
bytes). Anything malformed raises :class:`HpackError`; after one the decoder's table no longer
follows the peer's, so the connection must end (COMPRESSION_ERROR, RFC 9113 §4.3).

What it does not: no encoder — our response blocks are constant literals "without indexing"
(:mod:`protocol.grpc.http2`), so they need no HPACK state. The never-indexed flag is not
reported (nothing downstream re-encodes a request's headers).

Why it exists: the ``hpack`` library's ``Decoder`` cost ~18 % of a unary call's CPU under the
official Python client (~80-100 µs for a typical 16-field request block): a ``logging.debug``
call per field, ``HeaderTuple`` objects, memoryview slicing per field and a Huffman state
machine stepping a nibble at a time. This decoder reads the block in one loop with its state in
locals, keeps static and dynamic tables in one list positioned so that an indexed field's
octet is its position, hands out the table's own ``(name, value)`` tuples for indexed fields,
and decodes Huffman an octet per step through a state machine built at import (~25 ms,
~5 MB), with a memo for the first 32 octets of long values. ``python -m
benchmarks.bench_hpack`` (figures in its docstring): ~11 µs instead of ~85 µs per block of
the official client's requests (~7.6x); ~4.5 µs vs ~44 µs without Huffman coding (~10x).

Behaviour matches ``hpack.Decoder(...).decode(block, raw=True)`` on everything it accepts and
refuses (the differential tests in ``tests/protocol/grpc/test_hpack.py``), including its
leniency: a table size update is accepted at the start of any block, not only the first after
a SETTINGS change (but, as there, never after a field). Integers may take at most five
continuation octets (as there) and must not exceed 2**32 (there ~2**35; such values fail
later in both). An over-long header list and an indexed field with index 0 are reported once
the block is decoded, not at the field (the table may then hold that block's entries; the
connection ends anyway).
"""

from __future__ import annotations

from typing import Any, Final

from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH
from hpack.table import HeaderTable

__all__ = ["HpackDecoder", "HpackError"]


class HpackError(ValueError):
    """A header block that does not decode (RFC 7541): the connection's HPACK state is lost."""


#: Entry overhead in the dynamic table and in a header list's size (RFC 7541 §4.1).
_ENTRY_OVERHEAD: Final = 32
#: Largest integer we decode (lengths, indices, table sizes).
_MAX_INT: Final = 2**32
#: Continuation octets an integer may use after its prefix (as the ``hpack`` library).
_MAX_INT_OCTETS: Final = 5

#: The static table (RFC 7541 Appendix A): names and values are ASCII.
_STATIC: Final[tuple[tuple[str, str], ...]] = tuple(
    (name.decode("ascii"), value.decode("ascii")) for name, value in HeaderTable.STATIC_TABLE
)
#: The decoder keeps the static and dynamic tables as one list, HPACK index i at i + _BASE:
#: an indexed field's first octet (0x80 | i) is then its position when i < 127.
_BASE: Final = 0x80
#: Position of the newest dynamic entry (index 62).
_FIRST_DYNAMIC: Final = _BASE + len(_STATIC) + 1
#: The "size" of index 0, so that an indexed field with index 0 (an error) costs the common
#: path nothing: the header list's size then exceeds any limit, and decode() says why.
_INDEX_0: Final = 2**62


# ------------------------------------------------------------------------------ Huffman
# The code (RFC 7541 Appendix B) as a binary tree: internal nodes 0..255 (0 is the root), a
# child is an internal node's number or ~symbol for a leaf (symbol 256 is EOS). Decoding runs
# a state machine over whole octets. A state is a row: row[octet] is (next row, the symbols
# completed on the way as a str of code points 0..255, i.e. latin-1), and row[256] says
# whether a string may end there: on the all-ones path less than 8 bits deep (§5.2: padding
# is at most 7 bits, the EOS code's prefix). EOS itself leads to a dead row, which leads only
# to itself and accepts nothing. (Rows of tuples measured ~25 % faster than flat tables
# indexed by ``state << 8 | octet``; they take ~5 MB.)

_Row = list[Any]  # 256 x tuple[_Row, str], then a bool


def _huffman_rows() -> tuple[_Row, _Row]:
    """The state machine's (root row, dead row)."""
    children: list[list[int]] = [[0, 0]]
    for symbol, (code, length) in enumerate(zip(REQUEST_CODES, REQUEST_CODES_LENGTH, strict=True)):
        node = 0
        for shift in range(length - 1, 0, -1):
            bit = (code >> shift) & 1
            child = children[node][bit]
            if child == 0:  # the root is nobody's child: 0 means no child yet
                child = len(children)
                children.append([0, 0])
                children[node][bit] = child
            node = child
        children[node][code & 1] = ~symbol
    dead = len(children)
    if dead != 256:  # a complete prefix code over 257 symbols has 256 internal nodes
        raise AssertionError("bad Huffman code table")
    eos = ~256

    # Transitions on a nibble first, then an octet is two nibbles.
    nibbles: list[list[tuple[int, str]]] = []
    for state in range(dead + 1):
        row: list[tuple[int, str]] = []
        for nibble in range(16):
            node, out = state, ""
            for shift in (3, 2, 1, 0):
                if node == dead:
                    break
                child = children[node][(nibble >> shift) & 1]
                if child == eos:
                    node = dead
                elif child < 0:
                    out += chr(~child)
                    node = 0
                else:
                    node = child
            row.append((node, out))
        nibbles.append(row)

    rows: list[_Row] = [[] for _ in range(dead + 1)]
    # An octet whose first nibble completes no symbol shares its transition with the
    # nibble-state's; the others' outputs are interned (memory: ~5 MB in all).
    shared = [[(rows[node], out) for node, out in nibbles[state]] for state in range(dead + 1)]
    strings: dict[str, str] = {}
    for state, transitions in enumerate(rows):
        for middle, first in nibbles[state]:
            if first:
                transitions.extend(
                    (rows[node], strings.setdefault(first + out, first + out) if out else first)
                    for node, out in nibbles[middle]
                )
            else:
                transitions.extend(shared[middle])
        transitions.append(False)
    node = 0
    for _ in range(8):
        rows[node][256] = True
        node = children[node][1]
    return rows[0], rows[dead]


_ROOT, _DEAD = _huffman_rows()


def _huffman(data: bytes) -> str:
    """The Huffman-coded ``data`` decoded, as latin-1 code points (one per octet)."""
    state, text = _huffman_from(_ROOT, "", data)
    if not state[256]:
        raise _huffman_error(state)
    return text


def _huffman_from(state: _Row, text: str, data: bytes) -> tuple[_Row, str]:
    """The state machine run from ``state`` over ``data``: (end state, ``text`` + output)."""
    for octet in data:
        state, out = state[octet]
        text += out
    return state, text


def _huffman_error(state: _Row) -> HpackError:
    if state is _DEAD:
        return HpackError("Huffman string contains the EOS symbol")
    return HpackError("Huffman string ends in bad padding (not a 0-7 bit prefix of EOS)")


#: Memo of the decoding of long Huffman values' first _PREFIX octets: octets -> (state, text).
_PREFIXES: dict[bytes, tuple[_Row, str]] = {}
_PREFIX: Final = 32
_PREFIXES_MAX: Final = 256


def _int(block: bytes, pos: int, value: int) -> tuple[int, int]:
    """An integer whose prefix was all ones (``value``), continued at ``block[pos]``
    (RFC 7541 §5.1): (integer, position after it). IndexError when the block ends."""
    shift = 0
    for _ in range(_MAX_INT_OCTETS):
        octet = block[pos]
        pos += 1
        value += (octet & 0x7F) << shift
        if octet < 0x80:
            if value > _MAX_INT:
                raise HpackError(f"integer {value} too large")
            return value, pos
        shift += 7
    raise HpackError(f"integer longer than {_MAX_INT_OCTETS} continuation octets")


def _string(block: bytes, pos: int) -> tuple[str, int, int]:
    """The string literal at ``block[pos]`` (§5.2): (text, its size in octets, position after
    it). IndexError when the block ends in its length."""
    octet = block[pos]
    pos += 1
    length = octet & 0x7F
    if length == 0x7F:
        length, pos = _int(block, pos, length)
    stop = pos + length
    if stop > len(block):
        raise HpackError("header block truncated in a string")
    if not octet & 0x80:
        return block[pos:stop].decode("utf-8", "replace"), length, stop
    text = _huffman(block[pos:stop])
    if text.isascii():
        return text, len(text), stop
    return text.encode("latin-1").decode("utf-8", "replace"), len(text), stop


class HpackDecoder:
    """The HPACK decoding state of one HTTP/2 connection (RFC 7541; see the module docstring).

    ``max_table_size`` is our SETTINGS_HEADER_TABLE_SIZE: the dynamic table starts at that
    size and the encoder may not raise it above. ``max_header_list_size`` bounds a block's
    decoded size (names + values + 32 octets per field, RFC 9113 §6.5.2).
    """

    __slots__ = ("_limit", "_max_list", "_max_size", "_name_sizes", "_size", "_sizes", "_table")

    def __init__(self, *, max_header_list_size: int = 65536, max_table_size: int = 4096) -> None:
        self._max_list = max_header_list_size
        self._limit = max_table_size
        self._max_size = max_table_size
        self._size = 0
        # Static and dynamic tables as one list, index i at i + _BASE: [unused x _BASE,
        # index 0, static..., dynamic newest first...]; with each entry's size and its name's
        # size in octets (the str lengths differ for non-ASCII, and replaced invalid UTF-8
        # does not encode back).
        pad = [("", "")] * (_BASE + 1)
        self._table: list[tuple[str, str]] = [*pad, *_STATIC]
        self._sizes = (
            [0] * _BASE + [_INDEX_0] + [len(n) + len(v) + _ENTRY_OVERHEAD for n, v in _STATIC]
        )
        self._name_sizes = [0] * (_BASE + 1) + [len(n) for n, _ in _STATIC]

    @property
    def table_size(self) -> int:
        """The dynamic table's size in octets (RFC 7541 §4.1)."""
        return self._size

    @property
    def table_max_size(self) -> int:
        """The dynamic table's current maximum size (the encoder's last size update)."""
        return self._max_size

    def table_entries(self) -> list[tuple[str, str]]:
        """The dynamic table, newest entry first (index 62 onwards)."""
        return self._table[_FIRST_DYNAMIC:]

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        """The header list of one complete header block; :class:`HpackError` if malformed."""
        table = self._table
        sizes = self._sizes
        name_sizes = self._name_sizes
        fields: list[tuple[str, str]] = []
        append = fields.append
        total = 0  # the header list's size
        pos = 0
        end = len(block)
        try:
            while pos < end:
                octet = block[pos]
                pos += 1
                if octet > 0x7F:  # indexed field (§6.1): at table[octet] (see _BASE)
                    if octet == 0xFF:
                        octet, pos = _int(block, pos, octet)
                    try:
                        append(table[octet])
                    except IndexError:
                        raise self._bad_index(octet - _BASE) from None
                    total += sizes[octet]  # _INDEX_0 for 0x80
                    continue

                if octet & 0x40:  # literal with incremental indexing (§6.2.1)
                    index = octet & 0x3F
                    if index == 0x3F:  # common: a name in the dynamic table
                        octet = block[pos]
                        if octet < 0x80:
                            index += octet
                            pos += 1
                        else:
                            index, pos = _int(block, pos, index)
                    indexing = True
                elif octet & 0x20:  # dynamic table size update (§6.3)
                    index = octet & 0x1F
                    if index == 0x1F:
                        index, pos = _int(block, pos, index)
                    if fields:
                        raise HpackError("dynamic table size update after a header field")
                    self._resize(index)
                    continue
                else:  # literal without indexing / never indexed (§6.2.2, §6.2.3)
                    index = octet & 0x0F
                    if index == 0x0F:
                        index, pos = _int(block, pos, index)
                    indexing = False

                if index:  # indexed name
                    try:
                        name = table[index + _BASE][0]
                    except IndexError:
                        raise self._bad_index(index) from None
                    name_size = name_sizes[index + _BASE]
                else:
                    name, name_size, pos = _string(block, pos)

                # The value: _string inlined, with a memo for long Huffman-coded values.
                octet = block[pos]
                pos += 1
                length = octet & 0x7F
                if length == 0x7F:
                    length, pos = _int(block, pos, length)
                stop = pos + length
                if stop > end:
                    raise HpackError("header block truncated in a string")
                if not octet & 0x80:
                    value = block[pos:stop].decode("utf-8", "replace")
                    value_size = length
                else:
                    if length > _PREFIX:
                        # The first _PREFIX octets' decoding comes from a memo: long values
                        # often start alike (authorization: "MQv2-HMAC-SHA1 Credential=...,
                        # SignedHeaders=x-mq-date-time, Signature=" and a hex signature).
                        key = block[pos : pos + _PREFIX]
                        memo = _PREFIXES.get(key)
                        if memo is None:
                            memo = _huffman_from(_ROOT, "", key)
                            if len(_PREFIXES) >= _PREFIXES_MAX:
                                _PREFIXES.clear()
                            _PREFIXES[key] = memo
                        state, value = memo
                        pos += _PREFIX
                    else:
                        state = _ROOT
                        value = ""
                    for octet in block[pos:stop]:
                        state, out = state[octet]
                        value += out
                    if not state[256]:
                        raise _huffman_error(state)
                    value_size = len(value)
                    if not value.isascii():
                        value = value.encode("latin-1").decode("utf-8", "replace")
                pos = stop

                field = (name, value)
                append(field)
                size = name_size + value_size + _ENTRY_OVERHEAD
                total += size
                if indexing:  # add to the dynamic table, evicting the oldest (§4.4)
                    if size > self._max_size:  # evicts everything, is not added
                        del table[_FIRST_DYNAMIC:], sizes[_FIRST_DYNAMIC:]
                        del name_sizes[_FIRST_DYNAMIC:]
                        self._size = 0
                    else:
                        table_size = self._size + size
                        while table_size > self._max_size:
                            table_size -= sizes.pop()
                            table.pop()
                            name_sizes.pop()
                        table.insert(_FIRST_DYNAMIC, field)
                        sizes.insert(_FIRST_DYNAMIC, size)
                        name_sizes.insert(_FIRST_DYNAMIC, name_size)
                        self._size = table_size
        except IndexError:  # block[pos] beyond the end
            raise HpackError("header block truncated") from None
        if total > self._max_list:
            if total >= _INDEX_0:
                raise HpackError("indexed field with index 0")
            raise HpackError(f"header list larger than {self._max_list} octets")
        return fields

    def _bad_index(self, index: int) -> HpackError:
        entries = len(self._table) - _BASE - 1
        return HpackError(f"index {index} beyond the table ({entries} entries)")

    def _resize(self, size: int) -> None:
        """A dynamic table size update (§4.3, §6.3)."""
        if size > self._limit:
            raise HpackError(f"table size update to {size} above our limit {self._limit}")
        self._max_size = size
        total = self._size
        while total > size:
            total -= self._sizes.pop()
            self._table.pop()
            self._name_sizes.pop()
        self._size = total
