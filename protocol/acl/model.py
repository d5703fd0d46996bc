"""RocketMQ 5.3's ACL 2.0 model as one YAML document: users, and per user the policies that
allow or deny actions on resources. Sans-IO: :func:`model_from_obj` validates the document as
a YAML loader returns it, :func:`model_to_obj` writes one back; reading the file is the
broker's (``broker.acl``)::

    users:
      - {username: orders-app, password: "8f1e2d3c", userType: Normal, userStatus: enable}
    acls:
      - subject: User:orders-app
        policies:
          - policyType: Custom          # Custom (absent: Custom) or Default
            entries:
              - resource: [Topic:orders, Topic:order-*, Group:*, "*"]
                actions: [Pub, Sub]     # All Pub Sub Create Update Delete Get List
                sourceIps: [10.0.0.0/8, 127.0.0.1]    # absent or empty: any address
                decision: Allow         # Allow or Deny

A resource is ``Type:name`` (LITERAL), ``Type:prefix*`` (PREFIXED), ``Type:*`` (every name of
the type) or ``*`` (everything); the types are Topic, Group and Cluster (only ``Cluster:*``: a
trimq server checks its own cluster, whatever its name). Words are case-insensitive, as in
RocketMQ.

The decision for one resource and the actions a request needs (RocketMQ's
``AclAuthorizationHandler``, :meth:`UserAcl.deciding`): the Custom entries that match (their
resource covers it, they hold one of the needed actions or All, the peer is in their source
IPs), else the Default ones; none is a deny. Of the matches, a specific type beats ``*``; then
LITERAL beats PREFIXED (the longer prefix first) beats ``Type:*``; at equal rank Deny beats
Allow; the first decides. Super users and disabled users are the caller's
(:mod:`protocol.acl.v2`).

Stricter than RocketMQ, so that a typo cannot change access silently: unknown keys and words,
a ``*`` anywhere but at the end of a name, Namespace resources, a CIDR with host bits set, a
repeated user or subject, and an ACL for a user that does not exist make the whole document
invalid.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import TypeVar

from protocol.acl.rules import AclConfigError, IPAddress, parse_ip

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_TOP_KEYS = frozenset({"users", "acls"})
_USER_KEYS = frozenset({"username", "password", "userType", "userStatus"})
_ACL_KEYS = frozenset({"subject", "policies"})
_POLICY_KEYS = frozenset({"policyType", "entries"})
_ENTRY_KEYS = frozenset({"resource", "actions", "sourceIps", "decision"})
_SUBJECT_PREFIX = "user:"


class UserType(Enum):
    """A Super user may do everything; a Normal one what its policies allow."""

    SUPER = "Super"
    NORMAL = "Normal"


class UserStatus(Enum):
    """A disabled user is refused whatever it signs."""

    ENABLE = "enable"
    DISABLE = "disable"


class Action(Enum):
    """RocketMQ's ``Action`` (``Any`` is not written in files: requests use it)."""

    ALL = "All"
    PUB = "Pub"
    SUB = "Sub"
    CREATE = "Create"
    UPDATE = "Update"
    DELETE = "Delete"
    GET = "Get"
    LIST = "List"


class Decision(Enum):
    """What a matching entry decides."""

    ALLOW = "Allow"
    DENY = "Deny"


class PolicyType(Enum):
    """Default entries count only when no Custom entry matches."""

    CUSTOM = "Custom"
    DEFAULT = "Default"


class ResourceType(Enum):
    """What a resource is; ANY is the ``*`` resource."""

    ANY = "Any"
    CLUSTER = "Cluster"
    TOPIC = "Topic"
    GROUP = "Group"


class Pattern(Enum):
    """How a resource's name matches: exactly, as a prefix, or every name. The value is the
    rank (lower wins)."""

    LITERAL = 0
    PREFIXED = 1
    ANY = 2


_E = TypeVar("_E", bound=Enum)


def _word(enum: type[_E], raw: object, where: str) -> _E:
    """The member of ``enum`` whose value is ``raw`` ignoring case."""
    if isinstance(raw, str):
        for member in enum:
            if str(member.value).lower() == raw.strip().lower():
                return member
    words = ", ".join(str(m.value) for m in enum)
    raise AclConfigError(f"{where}: {raw!r} is not one of {words}")


# ------------------------------------------------------------------ resources
@dataclass(frozen=True, slots=True)
class Target:
    """One resource a request names (a Cluster target has no name)."""

    type: ResourceType
    name: str = ""


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource pattern of an entry: ``name`` is the literal name or the prefix ("" for
    ``Type:*`` and ``*``)."""

    type: ResourceType
    name: str = ""
    pattern: Pattern = Pattern.LITERAL

    @classmethod
    def parse(cls, text: object, where: str) -> Resource:
        """Read ``Type:name``, ``Type:prefix*``, ``Type:*`` or ``*``.

        Raises:
            AclConfigError: not one of those forms, or a type trimq does not check.
        """
        if not isinstance(text, str) or not text.strip():
            raise AclConfigError(f"{where}: a resource must be text such as Topic:orders")
        raw = text.strip()
        if raw == "*":
            return cls(ResourceType.ANY, "", Pattern.ANY)
        type_text, colon, name = raw.partition(":")
        if not colon:
            raise AclConfigError(f"{where}: {raw!r} is not Type:name or *")
        kind = _word(ResourceType, type_text, f"{where}: the type of {raw!r}")
        if kind is ResourceType.ANY:
            raise AclConfigError(f"{where}: {raw!r}: write * for every resource")
        star = name.find("*")
        if not name or star not in (-1, len(name) - 1):
            raise AclConfigError(f"{where}: {raw!r}: a name, or a prefix ending in one '*'")
        if name == "*":
            return cls(kind, "", Pattern.ANY)
        if kind is ResourceType.CLUSTER:
            raise AclConfigError(
                f"{where}: {raw!r}: write Cluster:* (a server checks its own cluster)"
            )
        if star == len(name) - 1:
            return cls(kind, name[:-1], Pattern.PREFIXED)
        return cls(kind, name, Pattern.LITERAL)

    def key(self) -> str:
        """The text form, as :meth:`parse` reads it."""
        if self.type is ResourceType.ANY:
            return "*"
        if self.pattern is Pattern.ANY:
            return f"{self.type.value}:*"
        star = "*" if self.pattern is Pattern.PREFIXED else ""
        return f"{self.type.value}:{self.name}{star}"

    def matches(self, target: Target) -> bool:
        """Whether this pattern covers ``target`` (RocketMQ's ``Resource.isMatch``)."""
        if self.type is ResourceType.ANY:
            return True
        if self.type is not target.type:
            return False
        if self.pattern is Pattern.ANY:
            return True
        if self.pattern is Pattern.PREFIXED:
            return target.name.startswith(self.name)
        return target.name == self.name

    def rank(self) -> tuple[int, int, int]:
        """Sort key, most specific first: a type before ``*``, then LITERAL, PREFIXED
        (longer first), ANY."""
        if self.type is ResourceType.ANY:
            return (1, Pattern.ANY.value, 0)
        longer = -len(self.name) if self.pattern is Pattern.PREFIXED else 0
        return (0, self.pattern.value, longer)


# ------------------------------------------------------------------ entries and users
@dataclass(frozen=True, slots=True)
class Entry:
    """One policy entry, for one resource (a file entry naming several is several)."""

    resource: Resource
    actions: frozenset[Action]
    decision: Decision
    #: Empty: any address.
    source_ips: tuple[IPNetwork, ...] = ()

    def matches(self, target: Target, actions: frozenset[Action], peer: IPAddress | None) -> bool:
        """Whether this entry speaks about a request for ``actions`` (any of them) on
        ``target`` from ``peer`` (None: unknown, matched only by an entry without IPs)."""
        if not self.resource.matches(target):
            return False
        if Action.ALL not in self.actions and not self.actions & actions:
            return False
        if not self.source_ips:
            return True
        return peer is not None and any(peer in net for net in self.source_ips)

    def rank(self) -> tuple[int, int, int, int]:
        """:meth:`Resource.rank`, then Deny before Allow."""
        return (*self.resource.rank(), 0 if self.decision is Decision.DENY else 1)


def _deciding(
    entries: tuple[Entry, ...], target: Target, actions: frozenset[Action], peer: IPAddress | None
) -> Entry | None:
    matched = [e for e in entries if e.matches(target, actions, peer)]
    # min() keeps the first of equal ranks, as RocketMQ's stable sort does.
    return min(matched, key=Entry.rank) if matched else None


@dataclass(frozen=True, slots=True)
class UserAcl:
    """A user's two policies."""

    custom: tuple[Entry, ...] = ()
    default: tuple[Entry, ...] = ()

    def deciding(
        self, target: Target, actions: frozenset[Action], peer: IPAddress | None
    ) -> Entry | None:
        """The entry that decides a request for ``actions`` on ``target`` from ``peer``; None
        when none matches (a deny)."""
        found = _deciding(self.custom, target, actions, peer)
        return found if found is not None else _deciding(self.default, target, actions, peer)


@dataclass(frozen=True, slots=True)
class User:
    """One entry of ``users``."""

    username: str
    password: str = field(repr=False)
    user_type: UserType = UserType.NORMAL
    status: UserStatus = UserStatus.ENABLE


@dataclass(frozen=True, slots=True)
class AclModel:
    """A whole ACL 2.0 document: users by name and their policies by user name."""

    users: Mapping[str, User] = field(default_factory=dict)
    acls: Mapping[str, UserAcl] = field(default_factory=dict)


# ------------------------------------------------------------------ reading
def model_from_obj(doc: object) -> AclModel:
    """Validate a loaded ACL 2.0 document (see the module docstring).

    Raises:
        AclConfigError: the first problem found, naming where it is.
    """
    if not isinstance(doc, dict):
        raise AclConfigError("the ACL file must be a mapping with users and acls")
    _no_unknown_keys(doc, _TOP_KEYS, "the ACL file")
    users: dict[str, User] = {}
    for i, raw in enumerate(_items(doc.get("users"), "users")):
        user = _user(raw, f"users[{i}]")
        if user.username in users:
            raise AclConfigError(f"users[{i}]: username {user.username!r} is repeated")
        users[user.username] = user
    acls: dict[str, UserAcl] = {}
    for i, raw in enumerate(_items(doc.get("acls"), "acls")):
        name, acl = _acl(raw, f"acls[{i}]", users)
        if name in acls:
            raise AclConfigError(f"acls[{i}]: subject User:{name} is repeated")
        acls[name] = acl
    return AclModel(MappingProxyType(users), MappingProxyType(acls))


def _no_unknown_keys(obj: dict[object, object], known: frozenset[str], where: str) -> None:
    unknown = sorted(str(k) for k in obj if k not in known)
    if unknown:
        raise AclConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")


def _items(raw: object, where: str) -> list[object]:
    """A list (None = empty)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise AclConfigError(f"{where} must be a list")
    return raw


def _mapping(raw: object, known: frozenset[str], where: str) -> dict[object, object]:
    if not isinstance(raw, dict):
        raise AclConfigError(f"{where} must be a mapping")
    _no_unknown_keys(raw, known, where)
    return raw


def _text(raw: object, name: str, where: str) -> str:
    # A YAML integer (password: 12345678) is its decimal text, as in plain_acl.yml.
    if isinstance(raw, bool) or not isinstance(raw, str | int) or not str(raw).strip():
        raise AclConfigError(f"{where}: {name} must be non-empty text")
    return str(raw)


def _user(raw: object, where: str) -> User:
    obj = _mapping(raw, _USER_KEYS, where)
    username = _text(obj.get("username"), "username", where).strip()
    where = f"{where} ({username})"
    user_type = obj.get("userType")
    status = obj.get("userStatus")
    return User(
        username=username,
        password=_text(obj.get("password"), "password", where),
        user_type=UserType.NORMAL
        if user_type is None
        else _word(UserType, user_type, f"{where}: userType"),
        status=UserStatus.ENABLE
        if status is None
        else _word(UserStatus, status, f"{where}: userStatus"),
    )


def _acl(raw: object, where: str, users: Mapping[str, User]) -> tuple[str, UserAcl]:
    obj = _mapping(raw, _ACL_KEYS, where)
    subject = obj.get("subject")
    if not isinstance(subject, str) or not subject.lower().startswith(_SUBJECT_PREFIX):
        raise AclConfigError(f"{where}: subject must be User:<username>, not {subject!r}")
    name = subject[len(_SUBJECT_PREFIX) :].strip()
    where = f"{where} (User:{name})"
    if name not in users:
        raise AclConfigError(f"{where}: no user {name!r} in users")
    policies: dict[PolicyType, tuple[Entry, ...]] = {}
    for i, policy in enumerate(_items(obj.get("policies"), f"{where}: policies")):
        kind, entries = _policy(policy, f"{where}: policies[{i}]")
        if kind in policies:
            raise AclConfigError(f"{where}: policies[{i}]: a second {kind.value} policy")
        policies[kind] = entries
    return name, UserAcl(policies.get(PolicyType.CUSTOM, ()), policies.get(PolicyType.DEFAULT, ()))


def _policy(raw: object, where: str) -> tuple[PolicyType, tuple[Entry, ...]]:
    obj = _mapping(raw, _POLICY_KEYS, where)
    kind_raw = obj.get("policyType")
    kind = PolicyType.CUSTOM if kind_raw is None else _word(PolicyType, kind_raw, where)
    entries: list[Entry] = []
    for i, entry in enumerate(_items(obj.get("entries"), f"{where}: entries")):
        entries.extend(_entries(entry, f"{where}: entries[{i}]"))
    return kind, tuple(entries)


def _words(raw: object, where: str) -> list[object]:
    """A list, or one text of comma-separated words (``Pub,Sub`` as mqadmin takes it)."""
    if isinstance(raw, str):
        return [w for w in raw.split(",") if w.strip()]
    return _items(raw, where)


def _entries(raw: object, where: str) -> list[Entry]:
    obj = _mapping(raw, _ENTRY_KEYS, where)
    for required in ("resource", "actions", "decision"):
        if obj.get(required) is None:
            raise AclConfigError(f"{where}: {required} is missing")
    raw_resources = obj["resource"]
    texts = (
        [raw_resources]
        if isinstance(raw_resources, str)
        else _items(raw_resources, f"{where}: resource")
    )
    resources = [Resource.parse(text, f"{where}: resource") for text in texts]
    if not resources:
        raise AclConfigError(f"{where}: resource must name at least one resource")
    actions = frozenset(
        _word(Action, a, f"{where}: actions") for a in _words(obj["actions"], where)
    )
    if not actions:
        raise AclConfigError(f"{where}: actions must name at least one action")
    ips = tuple(_network(ip, f"{where}: sourceIps") for ip in _items(obj.get("sourceIps"), where))
    decision = _word(Decision, obj["decision"], f"{where}: decision")
    return [Entry(resource, actions, decision, ips) for resource in resources]


def _network(raw: object, where: str) -> IPNetwork:
    """An address (``127.0.0.1``, ``::1``) or a CIDR block (``10.0.0.0/8``)."""
    if not isinstance(raw, str):
        raise AclConfigError(f"{where}: {raw!r} is not an address or a CIDR block")
    addr = parse_ip(raw)
    try:
        # A single IPv4-mapped IPv6 address is its IPv4 one, as peers are.
        return ipaddress.ip_network(addr if addr is not None else raw.strip())
    except ValueError as exc:
        raise AclConfigError(f"{where}: {raw!r} is not an address or a CIDR block: {exc}") from None


# ------------------------------------------------------------------ writing
def model_to_obj(model: AclModel) -> dict[str, object]:
    """The document :func:`model_from_obj` reads back as ``model`` (for a YAML dump)."""
    users = [_user_obj(user) for user in model.users.values()]
    acls = [
        {"subject": f"User:{name}", "policies": _policies_obj(acl)}
        for name, acl in model.acls.items()
        if acl.custom or acl.default
    ]
    return {"users": users, "acls": acls}


def _user_obj(user: User) -> dict[str, object]:
    return {
        "username": user.username,
        "password": user.password,
        "userType": user.user_type.value,
        "userStatus": user.status.value,
    }


def _policies_obj(acl: UserAcl) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for kind, entries in ((PolicyType.CUSTOM, acl.custom), (PolicyType.DEFAULT, acl.default)):
        if entries:
            out.append({"policyType": kind.value, "entries": [_entry_obj(e) for e in entries]})
    return out


def _entry_obj(entry: Entry) -> dict[str, object]:
    out: dict[str, object] = {
        "resource": [entry.resource.key()],
        # In Action's order, so that the output is stable.
        "actions": [a.value for a in Action if a in entry.actions],
    }
    if entry.source_ips:
        out["sourceIps"] = [str(net) for net in entry.source_ips]
    out["decision"] = entry.decision.value
    return out
