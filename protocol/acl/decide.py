"""Whether a Remoting request may run: authentication, then authorisation, in RocketMQ 4.x's
order (``PlainPermissionManager.validate``), as one pure function per kind of server.

A broker (:func:`authorize_request`):

1. a peer on ``globalWhiteRemoteAddresses`` passes, with or without credentials;
2. otherwise the request needs an ``AccessKey`` that the file knows;
3. and the signature of that account's secret, unless the peer is on the account's
   ``whiteRemoteAddress`` (RocketMQ then also skips the permission checks; here the account's
   permissions still apply);
4. a send whose only resource is ``RMQ_SYS_TRACE_TOPIC`` passes (message traces);
5. an admin request code needs ``admin: true`` (:data:`ADMIN_CODES`);
6. every resource the request names (:data:`RESOURCES`) needs its permission; a retry topic
   is checked as its group, and a send to a retry topic needs SUB on that group (a consumer
   sending a message back). Producer groups are not checked, as in RocketMQ.

A name server (:func:`authorize_namesrv`) serves route queries to anyone; the requests that
change what it tells clients (:data:`NAMESRV_PROTECTED`: broker registration, the KV config)
need a known AccessKey with a valid signature, whatever the addresses, and deleting a topic
needs an admin.

A refusal is a :class:`Refusal` whose remark names the account and the resource, never the
secret; the server answers it with ``NO_PERMISSION``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from protocol.acl.rules import Account, AclRules, IPAddress, Kind, Perm, group_of_retry_topic
from protocol.acl.signature import ACCESS_KEY, signature_matches
from protocol.bodies.ack import BatchAckMessageRequestBody
from protocol.bodies.heartbeat import HeartbeatData
from protocol.codes import RequestCode
from protocol.command import RemotingCommand
from protocol.errors import ProtocolError

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
_SHOWN = 64  # characters of a client-chosen name quoted in a remark


@dataclass(frozen=True, slots=True)
class Need:
    """A resource a request names in an ext field, and the permission it needs there."""

    kind: Kind
    field: str
    perm: Perm


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request may not run; ``remark`` is what the client is told."""

    remark: str
    #: The AccessKey the request claimed ("" for none).
    access_key: str = ""


_T, _G = Kind.TOPIC, Kind.GROUP
_PUB, _SUB = Perm.PUB, Perm.SUB
_CONSUMING = (Need(_T, "topic", _SUB), Need(_G, "consumerGroup", _SUB))

#: Request code → the resources it needs (RocketMQ's ``PlainAccessValidator.parse``; the pop,
#: lite-pull, offset-query and end-transaction rows are trimq's). ``HEART_BEAT`` and
#: ``BATCH_ACK_MESSAGE`` name theirs in the body (see :func:`needs_of`).
RESOURCES: Mapping[int, tuple[Need, ...]] = MappingProxyType(
    {
        RequestCode.SEND_MESSAGE: (Need(_T, "topic", _PUB),),
        RequestCode.SEND_MESSAGE_V2: (Need(_T, "b", _PUB),),
        RequestCode.SEND_BATCH_MESSAGE: (Need(_T, "b", _PUB),),
        RequestCode.CONSUMER_SEND_MSG_BACK: (Need(_G, "group", _SUB),),
        RequestCode.PULL_MESSAGE: _CONSUMING,
        RequestCode.LITE_PULL_MESSAGE: _CONSUMING,
        RequestCode.QUERY_MESSAGE: (Need(_T, "topic", _SUB),),
        RequestCode.UNREGISTER_CLIENT: (Need(_G, "consumerGroup", _SUB),),
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: (Need(_G, "consumerGroup", _SUB),),
        RequestCode.UPDATE_CONSUMER_OFFSET: _CONSUMING,
        RequestCode.QUERY_CONSUMER_OFFSET: _CONSUMING,
        RequestCode.POP_MESSAGE: _CONSUMING,
        RequestCode.ACK_MESSAGE: _CONSUMING,
        RequestCode.CHANGE_MESSAGE_INVISIBLETIME: _CONSUMING,
        RequestCode.END_TRANSACTION: (Need(_T, "topic", _PUB),),
    }
)

#: Request codes only an admin account may send: RocketMQ's five (create/update and delete
#: of topics and subscription groups, broker config) and every other request that changes
#: the broker's or name server's configuration or a group's offsets.
ADMIN_CODES = frozenset(
    {
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        RequestCode.UPDATE_AND_CREATE_TOPIC_LIST,
        RequestCode.UPDATE_BROKER_CONFIG,
        RequestCode.DELETE_TOPIC_IN_BROKER,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP_LIST,
        RequestCode.DELETE_SUBSCRIPTIONGROUP,
        RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
        RequestCode.RESET_CONSUMER_OFFSET_IN_BROKER,
        RequestCode.WIPE_WRITE_PERM_OF_BROKER,
        RequestCode.ADD_WRITE_PERM_OF_BROKER,
        RequestCode.TRIGGER_DELETE_FILES,
        RequestCode.DELETE_TOPIC_IN_NAMESRV,
        RequestCode.REGISTER_TOPIC_IN_NAMESRV,
        RequestCode.PROMOTE_REPLICA,
    }
)

#: Name-server requests that need credentials from the ACL file (the rest are open).
NAMESRV_PROTECTED = frozenset(
    {
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.PUT_KV_CONFIG,
        RequestCode.DELETE_KV_CONFIG,
    }
)


def _show(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


# ------------------------------------------------------------------ resources of a request
def needs_of(cmd: RemotingCommand) -> Iterator[tuple[Kind, str, Perm]]:
    """The resources ``cmd`` names and the permission each needs. A field that is absent
    or empty names nothing (the processor refuses such a request anyway).

    Raises:
        ProtocolError: the body that names them (a heartbeat, a batch ack) is unreadable.
    """
    ext = cmd.ext_fields
    for need in RESOURCES.get(cmd.code, ()):
        name = ext.get(need.field)
        if name:
            yield _resolved(need.kind, name, need.perm)
    if cmd.code == RequestCode.HEART_BEAT:
        for consumer in HeartbeatData.from_json(cmd.body).consumer_data_set:
            yield Kind.GROUP, consumer.group_name, Perm.SUB
            for sub in consumer.subscription_data_set:
                yield _resolved(Kind.TOPIC, sub.topic, Perm.SUB)
    elif cmd.code == RequestCode.BATCH_ACK_MESSAGE:
        for ack in BatchAckMessageRequestBody.from_json(cmd.body).acks:
            yield _resolved(Kind.TOPIC, ack.topic, Perm.SUB)
            yield Kind.GROUP, ack.consumer_group, Perm.SUB


def _resolved(kind: Kind, name: str, perm: Perm) -> tuple[Kind, str, Perm]:
    """A retry topic is its group; writing one (a send-back) needs SUB there."""
    if kind is Kind.TOPIC:
        group = group_of_retry_topic(name)
        if group is not None:
            return Kind.GROUP, group, Perm.SUB
    return kind, name, perm


# ------------------------------------------------------------------ decisions
def authenticate(
    rules: AclRules, cmd: RemotingCommand, peer: IPAddress | None
) -> Account | Refusal:
    """The account ``cmd`` is signed by (step 2-3 of the module docstring)."""
    access_key = cmd.ext_fields.get(ACCESS_KEY) or ""
    if not access_key:
        return Refusal(f"no AccessKey: request code {cmd.code} needs credentials (ACL is on)")
    account = rules.accounts.get(access_key)
    if account is None:
        return Refusal(f"AccessKey {_show(access_key)} is not in the ACL file", access_key)
    if not account.white_remote_address.matches(peer) and not signature_matches(
        cmd, account.secret_key
    ):
        return Refusal(f"signature check failed for AccessKey {_show(access_key)}", access_key)
    return account


def authorize_request(
    rules: AclRules, cmd: RemotingCommand, peer: IPAddress | None
) -> Refusal | None:
    """None if a broker may run ``cmd`` from ``peer``, else why not (module docstring)."""
    if rules.globally_white(peer):
        return None
    account = authenticate(rules, cmd, peer)
    if isinstance(account, Refusal):
        return account
    who = _show(account.access_key)
    try:
        needs = list(needs_of(cmd))
    except ProtocolError as exc:
        return Refusal(f"AccessKey {who}: request body unreadable: {exc}", account.access_key)
    if needs == [(Kind.TOPIC, TRACE_TOPIC, Perm.PUB)]:
        return None
    if cmd.code in ADMIN_CODES and not account.admin:
        return Refusal(
            f"AccessKey {who} is not admin: request code {cmd.code} needs admin",
            account.access_key,
        )
    for kind, name, perm in needs:
        if not account.allows(kind, name, perm):
            return Refusal(
                f"AccessKey {who} has no {perm.name} permission on {kind.value} {_show(name)}",
                account.access_key,
            )
    return None


def authorize_namesrv(
    rules: AclRules, cmd: RemotingCommand, peer: IPAddress | None
) -> Refusal | None:
    """None if a name server may run ``cmd``: open requests always, the
    :data:`NAMESRV_PROTECTED` ones and admin ones only with an account's valid signature
    (no whitelist lets a broker register without credentials)."""
    protected = cmd.code in NAMESRV_PROTECTED or cmd.code in ADMIN_CODES
    if not protected:
        return None
    account = authenticate(rules, cmd, None)
    if isinstance(account, Refusal):
        return account
    if cmd.code in ADMIN_CODES and not account.admin:
        return Refusal(
            f"AccessKey {_show(account.access_key)} is not admin: "
            f"request code {cmd.code} needs admin",
            account.access_key,
        )
    return None
