"""Offset message ids, client unique keys and the IP helpers behind them."""

from __future__ import annotations

import calendar
import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import EncodeError, ProtocolError, RecordError
from protocol.msgid import (
    UniqKeyGenerator,
    decode_offset_msg_id,
    encode_offset_msg_id,
    ip_from_bytes,
    ip_to_bytes,
    uniq_key_timestamp,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
IPS = st.ip_addresses(v=4).map(str) | st.ip_addresses(v=6).map(str)
# 2025-03-15 12:00:00 UTC, and the start of that month.
NOW = calendar.timegm((2025, 3, 15, 12, 0, 0)) * 1000
MARCH = calendar.timegm((2025, 3, 1, 0, 0, 0)) * 1000


class Clock:
    """A settable millisecond clock."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


# ------------------------------------------------------------------ offset ids
def test_offset_msg_id_matches_the_captured_send_responses() -> None:
    # Every captured SEND response carries this id for offset 0 on 127.0.0.1:10911.
    assert encode_offset_msg_id("127.0.0.1", 10911, 0) == "7F00000100002A9F0000000000000000"
    assert decode_offset_msg_id("7F00000100002A9F0000000000000091") == ("127.0.0.1", 10911, 145)


def test_offset_msg_id_ipv6_is_56_hex_digits() -> None:
    msg_id = encode_offset_msg_id("2001:db8::1", 8080, 2**40)
    assert len(msg_id) == 56
    assert msg_id == "20010DB8000000000000000000000001" + "00001F90" + "0000010000000000"
    assert decode_offset_msg_id(msg_id.lower()) == ("2001:db8::1", 8080, 2**40)


@given(IPS, st.integers(0, 0xFFFF), INT64)
def test_offset_msg_id_round_trip(host: str, port: int, offset: int) -> None:
    msg_id = encode_offset_msg_id(host, port, offset)
    assert len(msg_id) == (32 if "." in host and ":" not in host else 56)
    assert msg_id == msg_id.upper()
    assert decode_offset_msg_id(msg_id) == (host, port, offset)


@pytest.mark.parametrize(
    "msg_id",
    [
        "",
        "7F00000100002A9F000000000000009",  # 31 digits
        "7F00000100002A9F00000000000000911",  # 33 digits
        "7F00000100002A9F00000000000000G1",  # not hex
        "7F000001 0002A9F0000000000000091",  # bytes.fromhex would skip the space
        "7F000001FFFFFFFF0000000000000091",  # port outside 0..65535
    ],
)
def test_bad_offset_msg_ids(msg_id: str) -> None:
    with pytest.raises(RecordError):
        decode_offset_msg_id(msg_id)


@pytest.mark.parametrize(
    ("host", "port", "offset", "match"),
    [
        ("127.0.0.1", -1, 0, "port"),
        ("127.0.0.1", 65536, 0, "port"),
        ("127.0.0.1", 1, 2**63, "long"),
        ("localhost", 1, 0, "address"),
        ("01.2.3.4", 1, 0, "address"),
        ("fe80::1%eth0", 1, 0, "scope"),
    ],
)
def test_encode_offset_msg_id_refuses(host: str, port: int, offset: int, match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        encode_offset_msg_id(host, port, offset)


@given(st.text(max_size=64) | st.text("0123456789abcdefABCDEF", min_size=32, max_size=56))
def test_fuzz_decode_offset_msg_id(text: str) -> None:
    try:
        host, port, _ = decode_offset_msg_id(text)
    except ProtocolError as exc:
        assert isinstance(exc, RecordError)
    else:
        assert 0 <= port <= 0xFFFF and ipaddress.ip_address(host)


# ------------------------------------------------------------------ IP helpers
@given(IPS)
def test_ip_round_trip(host: str) -> None:
    packed = ip_to_bytes(host)
    assert packed == ipaddress.ip_address(host).packed
    assert ip_from_bytes(packed) == host


def test_ip_from_bytes_rejects_odd_lengths() -> None:
    with pytest.raises(RecordError):
        ip_from_bytes(b"\x01\x02\x03")


# ------------------------------------------------------------------ unique keys
def test_uniq_key_layout() -> None:
    gen = UniqKeyGenerator(bytes([10, 0, 0, 1]), 0x12345, Clock(NOW), salt=0xDEADBEEF)
    span = f"{NOW - MARCH:08X}"
    assert gen.new_uniq_key() == f"0A0000012345DEADBEEF{span}0000"
    assert gen.new_uniq_key() == f"0A0000012345DEADBEEF{span}0001"


def test_uniq_key_counter_wraps_at_16_bits() -> None:
    gen = UniqKeyGenerator(bytes(4), 1, Clock(NOW), salt=0)
    keys = [gen.new_uniq_key() for _ in range(0x10001)]
    assert keys[0xFFFF].endswith("FFFF") and keys[0x10000].endswith("0000")


def test_uniq_key_ipv6_and_bad_ip() -> None:
    gen = UniqKeyGenerator(bytes(range(16)), 7, Clock(NOW))
    key = gen.new_uniq_key()
    assert len(key) == 56 and key.startswith("000102030405060708090A0B0C0D0E0F0007")
    with pytest.raises(ValueError, match="4 or 16"):
        UniqKeyGenerator(bytes(5), 1, Clock(NOW))


def test_uniq_key_restarts_the_span_each_month() -> None:
    clock = Clock(NOW)
    gen = UniqKeyGenerator(bytes(4), 1, clock, salt=0)
    clock.ms = calendar.timegm((2025, 4, 1, 0, 0, 5)) * 1000
    assert gen.new_uniq_key()[20:28] == f"{5000:08X}"


def test_uniq_key_small_clock_step_back_writes_zero() -> None:
    clock = Clock(MARCH + 10)
    gen = UniqKeyGenerator(bytes(4), 1, clock, salt=0)
    clock.ms = MARCH - 500  # before the month start, within Java's one-million-ms tolerance
    assert gen.new_uniq_key()[20:28] == "00000000"
    clock.ms = MARCH - 2_000_000  # beyond it: Java writes the wrapped int
    assert gen.new_uniq_key()[20:28] == f"{(-2_000_000) & 0xFFFFFFFF:08X}"


def test_uniq_key_timestamp_of_a_real_client_key() -> None:
    # client-cpp 2.1 sent this UNIQ_KEY with bornTimestamp 1795306612191 (see the captures).
    key = "7F0000012CBC5FB551D26C34FDDF0000"
    assert uniq_key_timestamp(key, 1795306612191 + 3) == 1795306612191


@given(
    st.integers(calendar.timegm((2001, 1, 1, 0, 0, 0)) * 1000, 4_000_000_000_000),
    st.integers(1, 27 * 86_400_000),
    st.booleans(),
)
def test_uniq_key_timestamp_recovers_creation_time(created: int, delay: int, v6: bool) -> None:
    gen = UniqKeyGenerator(bytes(16 if v6 else 4), 1, Clock(created), salt=3)
    assert uniq_key_timestamp(gen.new_uniq_key(), created + delay) == created


def test_uniq_key_timestamp_rejects_bad_keys() -> None:
    with pytest.raises(RecordError):
        uniq_key_timestamp("XYZ", NOW)
