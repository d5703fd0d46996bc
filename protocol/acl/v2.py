"""Whether a request may run under an ACL 2.0 file (:mod:`protocol.acl.model`): who signed it,
which resources it names with which actions, and the decision, for a broker's Remoting port,
a name server and the gRPC port.

Authentication is ACL 1.0's signatures with the user's name as the AccessKey and its password
as the secret (:mod:`.signature` on Remoting, ``MQv2-HMAC-SHA1`` on gRPC); an unknown or
disabled user is refused. There are no whitelists.

Authorisation (RocketMQ 5.3's ``DefaultAuthorizationContextBuilder`` and ``@RocketMQAction``
header annotations):

- a Super user passes everything; every other user needs, for each resource the request names,
  an entry that decides Allow (:meth:`.model.UserAcl.deciding`);
- the resources are ACL 1.0's (:func:`.decide.needs_of`: PUB is Pub, SUB is Sub; a retry topic
  is its group with Sub), with RocketMQ's alternatives: querying a consumer offset, querying
  messages and listing a group's consumers also pass with Get, committing an offset also with
  Update;
- admin requests (:data:`ADMIN_TARGETS`): creating a topic needs Create on it, deleting it
  Delete; creating or updating a subscription group Create on the group, deleting it Delete;
  resetting offsets Update on the group and the topic; the rest (broker configuration, write
  permission, file deletion, promotion of a replica, the name servers' topic registry, and
  the list forms whose resources are in a body) need an action on ``Cluster:*``;
- a send whose only resource is ``RMQ_SYS_TRACE_TOPIC`` passes once signed (ACL 1.0's rule);
- a request naming no resource (route queries, offsets lookups, statistics) needs only a valid
  signature.

A name server serves route queries to anyone; registrations and KV changes need a known,
enabled user with a valid signature, and its admin requests the Cluster action above.

On gRPC the resources are :func:`.grpc.needs_of`'s; a route query passes with Pub, Sub or Get.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from protocol.acl import grpc as acl_grpc
from protocol.acl.decide import ADMIN_CODES, NAMESRV_PROTECTED, TRACE_TOPIC, Refusal, needs_of
from protocol.acl.model import (
    AclModel,
    Action,
    Decision,
    Entry,
    ResourceType,
    Target,
    User,
    UserStatus,
    UserType,
)
from protocol.acl.rules import IPAddress, Kind, Perm, group_of_retry_topic
from protocol.acl.signature import ACCESS_KEY, signature_matches
from protocol.bodies.subscription import SubscriptionGroupConfig
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.errors import ProtocolError

_SHOWN = 64
_TOPIC, _GROUP, _CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER


@dataclass(frozen=True, slots=True)
class Need:
    """A resource a request names and the actions of which it needs one."""

    target: Target
    actions: frozenset[Action]


@dataclass(frozen=True, slots=True)
class AdminTarget:
    """A resource an admin request names in an ext field ("" field: the cluster)."""

    type: ResourceType
    field: str
    action: Action


def _show(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


#: Admin request code → what it names (RocketMQ's ``@RocketMQAction`` where RocketMQ has one;
#: where it checks nothing, a Cluster action). UPDATE_AND_CREATE_SUBSCRIPTIONGROUP names its
#: group in the body (see :func:`remoting_needs`).
ADMIN_TARGETS: Mapping[int, tuple[AdminTarget, ...]] = MappingProxyType(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC: (AdminTarget(_TOPIC, "topic", Action.CREATE),),
        RequestCode.DELETE_TOPIC_IN_BROKER: (AdminTarget(_TOPIC, "topic", Action.DELETE),),
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: (),
        RequestCode.DELETE_SUBSCRIPTIONGROUP: (AdminTarget(_GROUP, "groupName", Action.DELETE),),
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: (
            AdminTarget(_GROUP, "group", Action.UPDATE),
            AdminTarget(_TOPIC, "topic", Action.UPDATE),
        ),
        RequestCode.RESET_CONSUMER_OFFSET_IN_BROKER: (
            AdminTarget(_GROUP, "group", Action.UPDATE),
            AdminTarget(_TOPIC, "topic", Action.UPDATE),
        ),
        RequestCode.UPDATE_AND_CREATE_TOPIC_LIST: (AdminTarget(_CLUSTER, "", Action.CREATE),),
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST: (
            AdminTarget(_CLUSTER, "", Action.CREATE),
        ),
        RequestCode.UPDATE_BROKER_CONFIG: (AdminTarget(_CLUSTER, "", Action.UPDATE),),
        RequestCode.WIPE_WRITE_PERM_OF_BROKER: (AdminTarget(_CLUSTER, "", Action.UPDATE),),
        RequestCode.ADD_WRITE_PERM_OF_BROKER: (AdminTarget(_CLUSTER, "", Action.UPDATE),),
        RequestCode.TRIGGER_DELETE_FILES: (AdminTarget(_CLUSTER, "", Action.UPDATE),),
        RequestCode.DELETE_TOPIC_IN_NAMESRV: (AdminTarget(_CLUSTER, "", Action.UPDATE),),
        RequestCode.REGISTER_TOPIC_IN_NAMESRV: (AdminTarget(_CLUSTER, "", Action.UPDATE),),
        RequestCode.PROMOTE_REPLICA: (AdminTarget(_CLUSTER, "", Action.UPDATE),),
    }
)

#: Requests that RocketMQ also lets through with a second action.
_ALSO: Mapping[int, Action] = MappingProxyType(
    {
        RequestCode.QUERY_CONSUMER_OFFSET: Action.GET,
        RequestCode.UPDATE_CONSUMER_OFFSET: Action.UPDATE,
        RequestCode.QUERY_MESSAGE: Action.GET,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: Action.GET,
    }
)
_TYPES: Mapping[Kind, ResourceType] = MappingProxyType({Kind.TOPIC: _TOPIC, Kind.GROUP: _GROUP})
_ACTIONS: Mapping[Perm, frozenset[Action]] = MappingProxyType(
    {
        Perm.PUB: frozenset({Action.PUB}),
        Perm.SUB: frozenset({Action.SUB}),
        Perm.ANY: frozenset({Action.PUB, Action.SUB, Action.GET}),
    }
)


# ------------------------------------------------------------------ resources of a request
def need_of(kind: Kind, name: str, perm: Perm, also: Action | None = None) -> Need:
    """An ACL 1.0 need as a 2.0 one. A retry topic is its group, with the same actions (as
    ACL 1.0 checks a gRPC call's; a Remoting request's are already resolved by
    :func:`~protocol.acl.decide.needs_of`)."""
    actions = _ACTIONS[perm] | {also} if also else _ACTIONS[perm]
    retry_of = group_of_retry_topic(name) if kind is Kind.TOPIC else None
    if retry_of is not None:
        return Need(Target(_GROUP, retry_of), actions)
    return Need(Target(_TYPES[kind], name), actions)


def remoting_needs(cmd: RemotingCommand) -> list[Need]:
    """What ``cmd`` names, with the actions of which it needs one each (module docstring).

    Raises:
        ProtocolError: the body that names them is unreadable.
    """
    if cmd.code in ADMIN_TARGETS:
        return list(_admin_needs(cmd))
    also = _ALSO.get(cmd.code)
    return [need_of(kind, name, perm, also) for kind, name, perm in needs_of(cmd)]


def _admin_needs(cmd: RemotingCommand) -> Iterator[Need]:
    if cmd.code == RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:
        yield Need(Target(_GROUP, _configured_group(cmd.body)), frozenset({Action.CREATE}))
    for admin in ADMIN_TARGETS[cmd.code]:
        if admin.type is _CLUSTER:
            yield Need(Target(_CLUSTER), frozenset({admin.action}))
            continue
        # An absent name is "" (only wildcards cover it): an admin request is never unchecked.
        name = cmd.ext_fields.get(admin.field) or ""
        retry_of = group_of_retry_topic(name) if admin.type is _TOPIC else None
        target = Target(admin.type, name) if retry_of is None else Target(_GROUP, retry_of)
        yield Need(target, frozenset({admin.action}))


def _configured_group(body: bytes) -> str:
    """The group a subscription-group configuration names; "" when the body is unreadable
    (only wildcards cover it, and the processor refuses the body anyway), so that such a
    request is decided as ACL 1.0 decides it, by who sends it."""
    try:
        return SubscriptionGroupConfig.from_json(body).group_name
    except ProtocolError:
        return ""


def grpc_needs(method: str, req: object) -> list[Need]:
    """What a v2 call of ``method`` (its short name) names."""
    return [need_of(kind, name, perm) for kind, name, perm in acl_grpc.needs_of(method, req)]


# ------------------------------------------------------------------ decisions
def user_named(model: AclModel, name: str) -> User | Refusal:
    """The user called ``name`` if it exists and is enabled, else why not."""
    user = model.users.get(name)
    if user is None:
        return Refusal(f"user {_show(name)} is not in the ACL file", name)
    if user.status is UserStatus.DISABLE:
        return Refusal(f"user {_show(name)} is disabled", name)
    return user


def authenticate(model: AclModel, cmd: RemotingCommand) -> User | Refusal:
    """The enabled user whose password signed ``cmd``."""
    name = cmd.ext_fields.get(ACCESS_KEY) or ""
    if not name:
        return Refusal(f"no AccessKey: request code {cmd.code} needs credentials (ACL is on)")
    user = user_named(model, name)
    if isinstance(user, Refusal):
        return user
    if not signature_matches(cmd, user.password):
        return Refusal(f"signature check failed for user {_show(name)}", name)
    return user


def authorize_needs(
    model: AclModel, user: User, needs: list[Need], peer: IPAddress | None
) -> Refusal | None:
    """None if ``user`` may use every resource of ``needs`` from ``peer``, else why not."""
    if user.user_type is UserType.SUPER:
        return None
    acl = model.acls.get(user.username)
    for need in needs:
        entry = None if acl is None else acl.deciding(need.target, need.actions, peer)
        if entry is None or entry.decision is Decision.DENY:
            return _refusal(user, need, entry, peer)
    return None


def _refusal(user: User, need: Need, entry: Entry | None, peer: IPAddress | None) -> Refusal:
    """A refused need, saying what RocketMQ's audit line says: the user, the actions, the
    resource, the address, and what decided."""
    why = "no matched policies" if entry is None else f"denied by {entry.resource.key()}"
    words = " or ".join(a.value for a in Action if a in need.actions)
    where = "an unknown address" if peer is None else str(peer)
    return Refusal(
        f"user {_show(user.username)} has no {words} permission on "
        f"{need.target.type.value} {_show(need.target.name)} from {where}: {why}",
        user.username,
    )


def _needs(user: User, cmd: RemotingCommand) -> list[Need] | Refusal:
    """:func:`remoting_needs`, or the refusal of a request whose body cannot be read."""
    try:
        return remoting_needs(cmd)
    except ProtocolError as exc:
        return Refusal(
            f"user {_show(user.username)}: request body unreadable: {exc}", user.username
        )


def _is_trace(needs: list[Need]) -> bool:
    return needs == [need_of(Kind.TOPIC, TRACE_TOPIC, Perm.PUB)]


def authorize_request(
    model: AclModel, cmd: RemotingCommand, peer: IPAddress | None
) -> Refusal | None:
    """None if a broker may run ``cmd`` from ``peer``, else why not (module docstring)."""
    user = authenticate(model, cmd)
    if isinstance(user, Refusal):
        return user
    needs = _needs(user, cmd)
    if isinstance(needs, Refusal):
        return needs
    if _is_trace(needs):
        return None
    return authorize_needs(model, user, needs, peer)


def authorize_namesrv(
    model: AclModel, cmd: RemotingCommand, peer: IPAddress | None
) -> Refusal | None:
    """None if a name server may run ``cmd``: open requests always, registrations and KV
    changes with a valid signature, admin requests with their Cluster action."""
    if cmd.code not in NAMESRV_PROTECTED and cmd.code not in ADMIN_CODES:
        return None
    user = authenticate(model, cmd)
    if isinstance(user, Refusal):
        return user
    if cmd.code not in ADMIN_CODES:
        return None  # a registration or a KV change: a valid signature is enough
    needs = _needs(user, cmd)
    if isinstance(needs, Refusal):
        return needs
    return authorize_needs(model, user, needs, peer)


def authorize_call(
    model: AclModel, metadata: Mapping[str, str], peer: IPAddress | None, needs: list[Need]
) -> tuple[Refusal, bool] | None:
    """None if a gRPC call may run, else why not and whether it is an authentication failure
    (UNAUTHORIZED) rather than a missing permission (FORBIDDEN)."""
    name, signature = acl_grpc.credential_of(metadata)
    if not name:
        return Refusal(f"no {acl_grpc.SCHEME} credential: the call needs one (ACL is on)"), True
    user = user_named(model, name)
    if isinstance(user, Refusal):
        return user, True
    if not acl_grpc.signature_ok(metadata, signature, user.password):
        return Refusal(f"signature check failed for user {_show(name)}", name), True
    refusal = authorize_needs(model, user, needs, peer)
    return None if refusal is None else (refusal, False)
