"""The ``plain_acl.yml`` model of RocketMQ's ACL 1.0: accounts, permissions, address patterns.

:func:`rules_from_obj` validates the document as a YAML loader returns it (plain dicts, lists,
strings, numbers) and builds :class:`AclRules`; the loading itself is the broker's
(``broker.acl``), so this module stays free of any YAML library::

    globalWhiteRemoteAddresses: [10.10.103.*, 192.168.0.*]
    accounts:
      - accessKey: RocketMQ
        secretKey: 12345678            # a YAML integer is its decimal text
        whiteRemoteAddress:            # empty: no address skips the signature
        admin: false
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]

Permissions (RocketMQ's ``Permission``): ``DENY`` refuses whatever else is owned; a needed
``ANY`` is met by ``PUB`` or ``SUB``; otherwise the needed bit must be owned. A topic or group
without an entry of its own gets the account's default (absent = ``DENY``). A retry topic
``%RETRY%<group>`` (and a pop retry topic ``%RETRY%<group>+<topic>``) is checked as its group.
An admin account without any ``topicPerms`` or ``groupPerms`` may use every resource.

Stricter than RocketMQ, so that a typo cannot widen access silently: an unknown key, an
unknown permission word (RocketMQ reads it as ``DENY`` in a default), a duplicate AccessKey, or
an address pattern RocketMQ would read in a surprising way (``10.*.1.1`` meaning ``10.*.*.*``)
is an error, and the whole file is refused.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum, IntFlag
from types import MappingProxyType

RETRY_PREFIX = "%RETRY%"
#: RocketMQ refuses shorter keys (``AclConstants.ACCESS_KEY_MIN_LENGTH``: more than 6).
MIN_KEY_LENGTH = 7
_TOP_KEYS = frozenset({"globalWhiteRemoteAddresses", "accounts", "dataVersion"})
_ACCOUNT_KEYS = frozenset(
    {
        "accessKey",
        "secretKey",
        "whiteRemoteAddress",
        "admin",
        "defaultTopicPerm",
        "defaultGroupPerm",
        "topicPerms",
        "groupPerms",
    }
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AclConfigError(ValueError):
    """The ACL document is not a valid ``plain_acl.yml``; the message says where."""


class Perm(IntFlag):
    """RocketMQ's permission bits (``Permission.DENY/ANY/PUB/SUB``)."""

    NONE = 0
    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_PERM_WORDS: Mapping[str, Perm] = MappingProxyType(
    {
        "DENY": Perm.DENY,
        "PUB": Perm.PUB,
        "SUB": Perm.SUB,
        "PUB|SUB": Perm.PUB | Perm.SUB,
        "SUB|PUB": Perm.PUB | Perm.SUB,
    }
)


def parse_perm(text: str, where: str) -> Perm:
    """``PUB``, ``SUB``, ``PUB|SUB`` (or ``SUB|PUB``) or ``DENY``.

    Raises:
        AclConfigError: any other word.
    """
    perm = _PERM_WORDS.get(text.strip())
    if perm is None:
        raise AclConfigError(f"{where}: {text!r} is not PUB, SUB, PUB|SUB or DENY")
    return perm


def perm_allows(needed: Perm, owned: Perm) -> bool:
    """RocketMQ's ``Permission.checkPermission``."""
    if owned & Perm.DENY:
        return False
    if needed & Perm.ANY:
        return bool(owned & (Perm.PUB | Perm.SUB))
    return bool(needed & owned)


class Kind(Enum):
    """What a permission is about."""

    TOPIC = "topic"
    GROUP = "group"


def group_of_retry_topic(name: str) -> str | None:
    """The group a retry topic belongs to (``%RETRY%g`` and ``%RETRY%g+t``: ``g``), None for
    any other topic."""
    if not name.startswith(RETRY_PREFIX):
        return None
    return name[len(RETRY_PREFIX) :].partition("+")[0]


# ------------------------------------------------------------------ addresses
def parse_ip(text: str) -> IPAddress | None:
    """An IP address (an IPv4-mapped IPv6 address as its IPv4 one), None if ``text`` is none."""
    try:
        addr = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


@dataclass(frozen=True, slots=True)
class _Range:
    """Addresses whose first ``len(head)`` segments are ``head`` and whose next segment lies
    in ``low..high`` (the segments after it are free)."""

    version: int
    head: tuple[int, ...]
    low: int
    high: int

    def matches(self, addr: IPAddress) -> bool:
        if addr.version != self.version:
            return False
        segments = _segments(addr)
        n = len(self.head)
        return segments[:n] == self.head and self.low <= segments[n] <= self.high


def _segments(addr: IPAddress) -> tuple[int, ...]:
    if isinstance(addr, ipaddress.IPv4Address):
        return tuple(addr.packed)
    packed = addr.packed
    return tuple(int.from_bytes(packed[i : i + 2], "big") for i in range(0, 16, 2))


@dataclass(frozen=True, slots=True)
class AddressPattern:
    """One of RocketMQ's remote-address patterns (``RemoteAddressStrategyFactory``):

    - empty: matches nothing;
    - ``*`` (or ``*.*.*.*``, ``*:*:*:*:*:*:*:*``): every address;
    - an address: that one (IPv6 in any notation);
    - ``192.168.1.{1,2,3}`` or ``1.2.3.4,1.2.3.5``: those addresses;
    - ``192.168.*.*``, ``192.168.1.1-200``, ``192.168.1-5.*`` (IPv6 alike, hexadecimal): the
      first wildcard or range segment decides, every segment after it must be ``*``.
    """

    text: str
    any: bool = False
    exact: frozenset[IPAddress] = frozenset()
    ranges: tuple[_Range, ...] = ()

    def matches(self, addr: IPAddress | None) -> bool:
        """Whether ``addr`` (None: unknown) is one of the pattern's addresses."""
        if addr is None:
            return False
        return self.any or addr in self.exact or any(r.matches(addr) for r in self.ranges)

    @classmethod
    def parse(cls, text: str, where: str = "address") -> AddressPattern:
        """Read one pattern.

        Raises:
            AclConfigError: not a pattern of the forms above.
        """
        raw = text.strip()
        if not raw:
            return cls(raw)
        if raw in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            return cls(raw, any=True)
        if raw.endswith("}"):
            head, brace, tail = raw.partition("{")
            if not brace or not head:
                raise AclConfigError(f"{where}: {raw!r} is not HEAD{{a,b,...}}")
            items = [head + item.strip() for item in tail[:-1].split(",") if item.strip()]
            if not items:
                raise AclConfigError(f"{where}: {raw!r} lists no address")
            return cls(raw, exact=_addresses(items, raw, where))
        if "," in raw:
            return cls(raw, exact=_addresses(raw.split(","), raw, where))
        if "*" in raw or "-" in raw:
            return cls(raw, ranges=(_parse_range(raw, where),))
        return cls(raw, exact=_addresses([raw], raw, where))


def _addresses(items: Iterable[str], raw: str, where: str) -> frozenset[IPAddress]:
    out: set[IPAddress] = set()
    for item in items:
        addr = parse_ip(item)
        if addr is None:
            raise AclConfigError(f"{where}: {item.strip()!r} in {raw!r} is not an IP address")
        out.add(addr)
    return frozenset(out)


def _ipv6_groups(raw: str, where: str) -> list[str]:
    if raw.count("::") > 1:
        raise AclConfigError(f"{where}: {raw!r} has more than one '::'")
    if "::" in raw:
        left, _, right = raw.partition("::")
        head = left.split(":") if left else []
        tail = right.split(":") if right else []
        return head + ["0"] * (8 - len(head) - len(tail)) + tail
    return raw.split(":")


def _parse_range(raw: str, where: str) -> _Range:
    version, base, width = (6, 16, 8) if ":" in raw else (4, 10, 4)
    top = 0xFFFF if version == 6 else 255
    parts = [p.strip() for p in (_ipv6_groups(raw, where) if version == 6 else raw.split("."))]
    bad = AclConfigError(
        f"{where}: {raw!r} is not an address with one '*' or 'a-b' segment followed only by '*'"
    )
    if len(parts) != width:
        raise bad
    wild = next((i for i, p in enumerate(parts) if p == "*" or "-" in p), None)
    if wild is None or wild == 0 or any(p != "*" for p in parts[wild + 1 :]):
        raise bad
    try:
        head = tuple(int(p, base) for p in parts[:wild])
        if parts[wild] == "*":
            low, high = 0, top
        else:
            first, _, last = parts[wild].partition("-")
            low, high = int(first, base), int(last, base)
    except ValueError:
        raise bad from None
    if not all(0 <= s <= top for s in (*head, low, high)) or low > high:
        raise bad
    return _Range(version, head, low, high)


# ------------------------------------------------------------------ accounts
@dataclass(frozen=True, slots=True)
class Account:
    """One entry of ``accounts``."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: AddressPattern = AddressPattern("")
    admin: bool = False
    default_topic_perm: Perm = Perm.DENY
    default_group_perm: Perm = Perm.DENY
    topic_perms: Mapping[str, Perm] = field(default_factory=dict)
    group_perms: Mapping[str, Perm] = field(default_factory=dict)

    def allows(self, kind: Kind, name: str, needed: Perm) -> bool:
        """Whether this account may use resource ``name`` of ``kind`` with ``needed``
        (a retry topic is checked as its group)."""
        if kind is Kind.TOPIC:
            group = group_of_retry_topic(name)
            if group is not None:
                kind, name = Kind.GROUP, group
        if self.admin and not self.topic_perms and not self.group_perms:
            return True
        if kind is Kind.GROUP:
            owned = self.group_perms.get(name, self.default_group_perm)
        else:
            owned = self.topic_perms.get(name, self.default_topic_perm)
        return perm_allows(needed, owned)


@dataclass(frozen=True, slots=True)
class AclRules:
    """A whole ACL file: the global whitelist and the accounts by AccessKey."""

    global_white: tuple[AddressPattern, ...] = ()
    accounts: Mapping[str, Account] = field(default_factory=dict)

    def globally_white(self, addr: IPAddress | None) -> bool:
        """Whether ``addr`` is on ``globalWhiteRemoteAddresses``."""
        return any(p.matches(addr) for p in self.global_white)


def rules_from_obj(doc: object) -> AclRules:
    """Validate a loaded ``plain_acl.yml`` document (see the module docstring).

    Raises:
        AclConfigError: the first problem found, naming where it is.
    """
    if doc is None:
        return AclRules()
    if not isinstance(doc, dict):
        raise AclConfigError("the ACL file must be a mapping with 'accounts'")
    _no_unknown_keys(doc, _TOP_KEYS, "the ACL file")
    white = tuple(
        AddressPattern.parse(text, f"globalWhiteRemoteAddresses[{i}]")
        for i, text in enumerate(_strings(doc.get("globalWhiteRemoteAddresses"),
                                          "globalWhiteRemoteAddresses"))
    )  # fmt: skip
    raw_accounts = doc.get("accounts")
    if raw_accounts is None:
        raw_accounts = []
    if not isinstance(raw_accounts, list):
        raise AclConfigError("accounts must be a list")
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(raw_accounts):
        account = _account(raw, f"accounts[{i}]")
        if account.access_key in accounts:
            raise AclConfigError(f"accounts[{i}]: accessKey {account.access_key!r} is repeated")
        accounts[account.access_key] = account
    return AclRules(white, MappingProxyType(accounts))


def _no_unknown_keys(obj: dict[object, object], known: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in obj if k not in known)
    if unknown:
        raise AclConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _strings(raw: object, where: str) -> list[str]:
    """A list of strings (None = empty; a single string = one item)."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw] if raw.strip() else []
    if not isinstance(raw, list):
        raise AclConfigError(f"{where} must be a list")
    out: list[str] = []
    for i, item in enumerate(raw):
        if item is None:
            continue
        if isinstance(item, bool) or not isinstance(item, str | int):
            raise AclConfigError(f"{where}[{i}] must be text")
        out.append(str(item))
    return out


def _key_text(raw: object, name: str, where: str) -> str:
    # A YAML integer (secretKey: 12345678 in RocketMQ's sample) is its decimal text.
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise AclConfigError(f"{where}: {name} must be text")
    text = str(raw)
    if len(text) < MIN_KEY_LENGTH:
        raise AclConfigError(f"{where}: {name} must be at least {MIN_KEY_LENGTH} characters")
    return text


def _boolean(raw: object, where: str) -> bool:
    if raw is None:
        return False
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise AclConfigError(f"{where} must be true or false")


def _resource_perms(raw: object, where: str, *, groups: bool) -> dict[str, Perm]:
    out: dict[str, Perm] = {}
    for i, entry in enumerate(_strings(raw, where)):
        name, eq, perm = entry.partition("=")
        name = name.strip()
        if not eq or not name or "=" in perm:
            raise AclConfigError(f"{where}[{i}]: {entry!r} is not NAME=PERM")
        if not groups and (group := group_of_retry_topic(name)) is not None:
            raise AclConfigError(
                f"{where}[{i}]: {name!r} is a retry topic: give group {group!r} in groupPerms"
            )
        out[name] = parse_perm(perm, f"{where}[{i}]")
    return out


def _account(raw: object, where: str) -> Account:
    if not isinstance(raw, dict):
        raise AclConfigError(f"{where} must be a mapping")
    _no_unknown_keys(raw, _ACCOUNT_KEYS, where)
    access_key = _key_text(raw.get("accessKey"), "accessKey", where)
    where = f"{where} ({access_key})"
    white = raw.get("whiteRemoteAddress")
    if white is not None and not isinstance(white, str):
        raise AclConfigError(f"{where}: whiteRemoteAddress must be text")

    def default(name: str) -> Perm:
        value = raw.get(name)
        if value is None:
            return Perm.DENY
        if not isinstance(value, str):
            raise AclConfigError(f"{where}: {name} must be text")
        return parse_perm(value, f"{where}: {name}")

    return Account(
        access_key=access_key,
        secret_key=_key_text(raw.get("secretKey"), "secretKey", where),
        white_remote_address=AddressPattern.parse(white or "", f"{where}: whiteRemoteAddress"),
        admin=_boolean(raw.get("admin"), f"{where}: admin"),
        default_topic_perm=default("defaultTopicPerm"),
        default_group_perm=default("defaultGroupPerm"),
        topic_perms=MappingProxyType(
            _resource_perms(raw.get("topicPerms"), f"{where}: topicPerms", groups=False)
        ),
        group_perms=MappingProxyType(
            _resource_perms(raw.get("groupPerms"), f"{where}: groupPerms", groups=True)
        ),
    )
