"""``plain_acl.yml`` (ACL 1.0, :class:`~protocol.acl.rules.AclRules`) as an ACL 2.0 model
(:mod:`protocol.acl.model`) that decides every request as the 1.0 file does.

Each account becomes a user (the AccessKey its name, the secret its password):

- an admin without ``topicPerms`` or ``groupPerms`` may do everything: a Super user;
- any other account a Normal user whose **Custom** policy holds what it lists: ``name=PUB``,
  ``SUB`` or ``PUB|SUB`` an Allow entry with those actions on ``Topic:name`` (``Group:name``),
  ``name=DENY`` a Deny of Pub and Sub;
- and whose **Default** policy (consulted only when no Custom entry matches) holds the
  defaults, ``defaultTopicPerm`` an Allow on ``Topic:*`` (``DENY``: nothing, no match is a
  deny), and, for a listed name that lacks an action its default grants, a Deny of that action
  there (``orders=PUB`` with ``defaultTopicPerm: SUB`` must not read ``orders``). Kept in the
  Default policy so that a request that any listed right satisfies — a gRPC route query needs
  any of them — is still decided by the Custom Allow;
- an admin that lists rights also gets ``Cluster:*`` All, Create, Update and Delete on
  ``Topic:*`` and ``Group:*`` (the 2.0 form of the admin requests, which 1.0 lets an admin send
  whatever its rights say), and, where its default lacks Sub, a Deny of Sub on ``Topic:*`` /
  ``Group:*`` (committing an offset needs Sub or Update: Update alone must not do).

Not expressible, and refused with a message saying so: whitelists (``globalWhiteRemoteAddresses``,
``whiteRemoteAddress``: 2.0 always authenticates) and names containing ``*`` (a prefix in 2.0).
One difference remains and is reported as a note: an admin that lists rights, with
``defaultTopicPerm: PUB``, is refused a gRPC route query of an unlisted topic (1.0 allows it;
likewise ``defaultGroupPerm: PUB`` and the retry topic of an unlisted group).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from protocol.acl.model import (
    AclModel,
    Action,
    Decision,
    Entry,
    Pattern,
    Resource,
    ResourceType,
    User,
    UserAcl,
    UserType,
)
from protocol.acl.rules import Account, AclConfigError, AclRules, Perm

_PUB_SUB = frozenset({Action.PUB, Action.SUB})
_ADMIN = frozenset({Action.CREATE, Action.UPDATE, Action.DELETE})
_ALLOW, _DENY = Decision.ALLOW, Decision.DENY


@dataclass(frozen=True, slots=True)
class Imported:
    """The 2.0 model of a ``plain_acl.yml``, and what it decides differently (module
    docstring), one sentence per account concerned."""

    model: AclModel
    notes: tuple[str, ...] = ()


def import_plain_acl(rules: AclRules) -> Imported:
    """The ACL 2.0 model deciding as ``rules`` do (module docstring).

    Raises:
        AclConfigError: ``rules`` use what ACL 2.0 cannot express.
    """
    if any(pattern.text for pattern in rules.global_white):
        raise AclConfigError(
            "globalWhiteRemoteAddresses lets its addresses in without credentials; ACL 2.0 "
            "always authenticates: empty it (those clients then need an account) and import again"
        )
    users: dict[str, User] = {}
    acls: dict[str, UserAcl] = {}
    notes: list[str] = []
    for account in rules.accounts.values():
        _check(account)
        user, acl = _user(account), _acl(account)
        users[user.username] = user
        if acl is not None:
            acls[user.username] = acl
        notes.extend(_route_notes(account))
    return Imported(AclModel(MappingProxyType(users), MappingProxyType(acls)), tuple(notes))


def _check(account: Account) -> None:
    where = f"account {account.access_key!r}"
    if account.white_remote_address.text:
        raise AclConfigError(
            f"{where}: whiteRemoteAddress {account.white_remote_address.text!r} lets those "
            "addresses skip the signature; ACL 2.0 always authenticates: remove it and "
            "import again"
        )
    for name in (*account.topic_perms, *account.group_perms):
        if "*" in name:
            raise AclConfigError(
                f"{where}: {name!r}: a '*' in a name is a prefix pattern in ACL 2.0; "
                "no such topic or group can exist: remove it and import again"
            )


def _super(account: Account) -> bool:
    return account.admin and not account.topic_perms and not account.group_perms


def _route_notes(account: Account) -> list[str]:
    """The module docstring's one difference, for each default where it applies."""
    if not account.admin or _super(account):
        return []
    which = (
        ("defaultTopicPerm", account.default_topic_perm, "unlisted topics"),
        ("defaultGroupPerm", account.default_group_perm, "the retry topics of unlisted groups"),
    )
    return [
        f"{account.access_key}: an admin with listed rights and {key} PUB is refused gRPC "
        f"route queries of {what} under ACL 2.0 (1.0 allows them): list them, or make "
        f"{key} PUB|SUB"
        for key, perm, what in which
        if perm == Perm.PUB
    ]


def _user(account: Account) -> User:
    kind = UserType.SUPER if _super(account) else UserType.NORMAL
    return User(account.access_key, account.secret_key, kind)


def _granted(perm: Perm) -> frozenset[Action]:
    """The actions a 1.0 permission grants (none for DENY)."""
    if perm & Perm.DENY:
        return frozenset()
    return frozenset(
        action for bit, action in ((Perm.PUB, Action.PUB), (Perm.SUB, Action.SUB)) if perm & bit
    )


def _acl(account: Account) -> UserAcl | None:
    if _super(account):
        return None
    custom: list[Entry] = []
    default: list[Entry] = []
    kinds: tuple[tuple[ResourceType, Mapping[str, Perm], Perm], ...] = (
        (ResourceType.TOPIC, account.topic_perms, account.default_topic_perm),
        (ResourceType.GROUP, account.group_perms, account.default_group_perm),
    )
    for kind, perms, fallback in kinds:
        every = Resource(kind, "", Pattern.ANY)
        granted_by_default = _granted(fallback)
        for name, perm in perms.items():
            here = Resource(kind, name, Pattern.LITERAL)
            granted = _granted(perm)
            if not granted:
                custom.append(Entry(here, _PUB_SUB, _DENY))
                continue
            custom.append(Entry(here, granted, _ALLOW))
            missing = _PUB_SUB - granted
            if missing & granted_by_default:
                default.append(Entry(here, missing, _DENY))
        if granted_by_default:
            default.append(Entry(every, granted_by_default, _ALLOW))
        if account.admin:
            default.append(Entry(every, _ADMIN, _ALLOW))
            if Action.SUB not in granted_by_default:
                default.append(Entry(every, frozenset({Action.SUB}), _DENY))
    if account.admin:
        custom.append(
            Entry(Resource(ResourceType.CLUSTER, "", Pattern.ANY), frozenset({Action.ALL}), _ALLOW)
        )
    return UserAcl(tuple(custom), tuple(default))
