"""Message ids: broker "offset" ids and client unique keys (``UNIQ_KEY``), plus IP packing.

Offset id (``MessageDecoder.createMessageId``): uppercase hex of the store host's IP bytes,
its port as a 4-byte int and the record's commit-log offset as an 8-byte long: 32 hex
characters for IPv4, 56 for IPv6. Anyone holding one can find the record without an index.

Unique key (``MessageClientIDSetter.createUniqID``): uppercase hex of IP (4 or 16 bytes),
pid (2), a per-process salt (4; Java uses its class loader's hash), milliseconds since the
start of the current month (4) and a wrapping counter (2): 32 hex characters for IPv4.
Java takes "the start of the month" in the JVM's local time zone; trimq uses UTC, which only
matters to :func:`uniq_key_timestamp`'s estimate.

The IP helpers live here because both ids and message records need them; ``protocol`` may not
import ``socket``, so addresses go through ``ipaddress`` behind small caches (a broker sees
few distinct hosts, and formatting one is far slower than a dict lookup).
"""

from __future__ import annotations

import calendar
import ipaddress
import random
import struct
import time
from collections.abc import Callable

from protocol.errors import EncodeError, RecordError

_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_PORT_OFFSET = struct.Struct(">iq")
_PID_SALT = struct.Struct(">HI")
_SPAN = struct.Struct(">I")
_CACHE_LIMIT = 4096  # entries per cache; cleared when full, so memory stays bounded
_TEXT_BY_IP: dict[bytes, str] = {}
_IP_BY_TEXT: dict[str, bytes] = {}


# ------------------------------------------------------------------ IP addresses
def ip_to_bytes(host: str) -> bytes:
    """Pack an IPv4 or IPv6 address string into its 4 or 16 network-order bytes.

    Raises:
        EncodeError: ``host`` is not an IP address (host names are not resolved here), or
            carries an IPv6 scope id, which the wire format cannot hold.
    """
    packed = _IP_BY_TEXT.get(host)
    if packed is None:
        packed = _pack_ip(host)
        if len(_IP_BY_TEXT) >= _CACHE_LIMIT:
            _IP_BY_TEXT.clear()
        _IP_BY_TEXT[host] = packed
    return packed


def _pack_ip(host: str) -> bytes:
    if type(host) is not str or "%" in host:
        raise EncodeError(f"{host!r} is not an IPv4 or IPv6 address without scope id")
    try:
        return ipaddress.ip_address(host).packed
    except ValueError:
        raise EncodeError(f"{host!r} is not an IPv4 or IPv6 address") from None


def ip_from_bytes(packed: bytes) -> str:
    """Format 4 or 16 address bytes as text (IPv6 in its compressed, canonical form).

    Raises:
        RecordError: ``packed`` is neither 4 nor 16 bytes long.
    """
    text = _TEXT_BY_IP.get(packed)
    if text is None:
        size = len(packed)
        if size == 4:
            text = ".".join(map(str, packed))
        elif size == 16:
            text = str(ipaddress.IPv6Address(bytes(packed)))
        else:
            raise RecordError(f"an IP address has 4 or 16 bytes, not {size}")
        if len(_TEXT_BY_IP) >= _CACHE_LIMIT:
            _TEXT_BY_IP.clear()
        _TEXT_BY_IP[bytes(packed)] = text
    return text


# ------------------------------------------------------------------ offset message ids
def encode_offset_msg_id(host: str, port: int, commit_log_offset: int) -> str:
    """The offset message id of the record at ``commit_log_offset`` stored by ``host:port``.

    Raises:
        EncodeError: bad address, port outside 0..65535 or offset outside a Java long.
    """
    if type(port) is not int or not 0 <= port <= 0xFFFF:
        raise EncodeError(f"port {port!r} is outside 0..65535")
    try:
        tail = _PORT_OFFSET.pack(port, commit_log_offset)
    except struct.error:
        raise EncodeError(f"commit-log offset {commit_log_offset!r} is not a Java long") from None
    return (ip_to_bytes(host) + tail).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple[str, int, int]:
    """Split an offset message id into ``(store IP, store port, commit-log offset)``.

    Hex digits of either case are accepted, as Java's ``string2bytes`` upper-cases first.
    The offset is signed: Java also builds such ids from (possibly negative) hash codes.

    Raises:
        RecordError: not 32 or 56 hex digits, or a port outside 0..65535.
    """
    size = len(msg_id)
    if size not in (32, 56) or not _HEX_DIGITS.issuperset(msg_id):
        raise RecordError(f"an offset message id is 32 or 56 hex digits, got {msg_id!r:.80}")
    raw = bytes.fromhex(msg_id)
    ip_len = 4 if size == 32 else 16
    port, offset = _PORT_OFFSET.unpack_from(raw, ip_len)
    if not 0 <= port <= 0xFFFF:
        raise RecordError(f"message id {msg_id!r} has port {port} outside 0..65535")
    return ip_from_bytes(raw[:ip_len]), port, offset


# ------------------------------------------------------------------ unique keys
class UniqKeyGenerator:
    """Generates ``UNIQ_KEY`` values laid out as Java's ``MessageClientIDSetter`` does.

    Args:
        ip: this client's address, 4 or 16 bytes.
        pid: process id; only its low 16 bits are used, as in Java.
        now_ms: clock returning milliseconds since the epoch (injected: no I/O here).
        salt: the 4-byte slot Java fills with its class loader's hash; random when ``None``,
            so two processes with equal ip and pid (containers) still differ.
    """

    def __init__(
        self, ip: bytes, pid: int, now_ms: Callable[[], int], *, salt: int | None = None
    ) -> None:
        if len(ip) not in (4, 16):
            raise ValueError(f"ip must have 4 or 16 bytes, not {len(ip)}")
        if salt is None:
            salt = random.getrandbits(32)
        fixed = bytes(ip) + _PID_SALT.pack(pid & 0xFFFF, salt & 0xFFFFFFFF)
        self._prefix = fixed.hex().upper()
        self._now_ms = now_ms
        self._counter = 0
        self._start, self._next_start = _month_bounds(now_ms())

    def new_uniq_key(self) -> str:
        """Return the next unique key (32 hex digits for IPv4, 56 for IPv6)."""
        now = self._now_ms()
        if now >= self._next_start:
            self._start, self._next_start = _month_bounds(now)
        diff = (now - self._start) & 0xFFFFFFFF  # Java's (int) cast keeps the low 32 bits
        as_int = diff - 0x100000000 if diff & 0x80000000 else diff
        if -1_000_000 < as_int < 0:  # the clock stepped back a little (NTP): Java writes 0
            diff = 0
        counter = self._counter
        self._counter = (counter + 1) & 0xFFFF
        return f"{self._prefix}{diff:08X}{counter:04X}"


def uniq_key_timestamp(uniq_key: str, now_ms: int) -> int:
    """Estimate when ``uniq_key`` was created, as Java's ``getNearlyTimeFromID``.

    The key holds only milliseconds since a month start, so the newest such instant not
    after ``now_ms`` is chosen (this month's, or last month's if that would be in the future).

    Raises:
        RecordError: not 32 or 56 hex digits.
    """
    size = len(uniq_key)
    if size not in (32, 56) or not _HEX_DIGITS.issuperset(uniq_key):
        raise RecordError(f"a unique key is 32 or 56 hex digits, got {uniq_key!r:.80}")
    raw = bytes.fromhex(uniq_key)
    span: int = _SPAN.unpack_from(raw, len(raw) - 6)[0]
    start, _ = _month_bounds(now_ms)
    if start + span >= now_ms:
        start = _previous_month_start(start)
    return start + span


def _month_bounds(ms: int) -> tuple[int, int]:
    """Start of the UTC month containing ``ms`` and start of the next one, in ms."""
    year, month = time.gmtime(ms // 1000)[:2]
    start = calendar.timegm((year, month, 1, 0, 0, 0)) * 1000
    year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return start, calendar.timegm((year, month, 1, 0, 0, 0)) * 1000


def _previous_month_start(start: int) -> int:
    return _month_bounds(start - 1)[0]
