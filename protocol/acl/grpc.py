"""ACL 1.0 on the gRPC front end: the ``MQv2-HMAC-SHA1`` credential and what each v2 RPC needs.

The RocketMQ 5 clients sign every call with metadata
``authorization: MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time, Signature=<hex>``
where the signature is HMAC-SHA1 (key: the secret) over the ``x-mq-date-time`` value; the hex
is compared case-insensitively, in constant time, and no clock-skew check is made (the official
Python client sends local time labelled UTC). The proxy's recipe (``DefaultAuthentication
ContextBuilder``); ``../shared/reference/security-ha.md`` §1.8 has the measured details.

An account's rights come from the same ``plain_acl.yml`` as on Remoting, with the resources a
v2 request names (the proxy's ACL 1.0 mapping): a send, recall or end of a transaction needs
PUB on its topic; a receive, ack, change of invisible time, DLQ forward and assignment query
need SUB on the topic and on the group; a route query any right on the topic; a heartbeat or
termination SUB on its group; Telemetry settings PUB on each published topic, SUB on each
subscribed one and on the group. A whitelisted address (global, or the account's own) needs no
signature, as on Remoting.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Mapping
from typing import Any

from protocol.acl.decide import Refusal
from protocol.acl.rules import Account, AclRules, IPAddress, Kind, Perm

#: The scheme of the ``authorization`` metadata.
SCHEME = "MQv2-HMAC-SHA1"
DATE_TIME = "x-mq-date-time"
_SHOWN = 64

#: A resource a request names, and the permission it needs there.
Need = tuple[Kind, str, Perm]


def _show(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")


def credential_of(metadata: Mapping[str, str]) -> tuple[str, str]:
    """(AccessKey, hex signature) of a call's ``authorization``; empty strings when absent
    or not ``MQv2-HMAC-SHA1``."""
    scheme, _, rest = metadata.get("authorization", "").partition(" ")
    if scheme != SCHEME:
        return "", ""
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            fields[name] = value.strip()
    return fields.get("Credential", "").split("/")[0], fields.get("Signature", "")


def signature_ok(metadata: Mapping[str, str], signature_hex: str, secret_key: str) -> bool:
    """Whether ``signature_hex`` is the HMAC-SHA1 of ``x-mq-date-time`` under ``secret_key``."""
    date_time = metadata.get(DATE_TIME, "")
    if not date_time:
        return False
    try:
        got = bytes.fromhex(signature_hex)
    except ValueError:
        return False
    want = hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).digest()
    return hmac.compare_digest(want, got)


def authenticate(
    rules: AclRules, metadata: Mapping[str, str], peer: IPAddress | None
) -> Account | Refusal:
    """The account a call is signed by."""
    access_key, signature = credential_of(metadata)
    if not access_key:
        return Refusal(f"no {SCHEME} credential: the call needs one (ACL is on)")
    account = rules.accounts.get(access_key)
    if account is None:
        return Refusal(f"AccessKey {_show(access_key)} is not in the ACL file", access_key)
    if not account.white_remote_address.matches(peer) and not signature_ok(
        metadata, signature, account.secret_key
    ):
        return Refusal(f"signature check failed for AccessKey {_show(access_key)}", access_key)
    return account


def authorize_call(
    rules: AclRules,
    metadata: Mapping[str, str],
    peer: IPAddress | None,
    needs: list[Need],
) -> tuple[Refusal, bool] | None:
    """None if the call may run, else why not and whether it is an authentication failure
    (UNAUTHORIZED) rather than a missing permission (FORBIDDEN)."""
    if rules.globally_white(peer):
        return None
    account = authenticate(rules, metadata, peer)
    if isinstance(account, Refusal):
        return account, True
    for kind, name, perm in needs:
        if not account.allows(kind, name, perm):
            who = _show(account.access_key)
            word = "any" if perm is Perm.ANY else perm.name
            return Refusal(
                f"AccessKey {who} has no {word} permission on {kind.value} {_show(name)}",
                account.access_key,
            ), False
    return None


def needs_of(method: str, req: Any) -> list[Need]:
    """The resources a v2 request of ``method`` (its short name) names."""
    return list(_needs(method, req))


def _needs(method: str, req: Any) -> Iterator[Need]:
    if method in ("SendMessage",):
        for message in req.messages:
            yield Kind.TOPIC, message.topic.name, Perm.PUB
    elif method in ("RecallMessage", "EndTransaction"):
        yield Kind.TOPIC, req.topic.name, Perm.PUB
    elif method == "QueryRoute":
        yield Kind.TOPIC, req.topic.name, Perm.ANY
    elif method == "ReceiveMessage":
        yield Kind.TOPIC, req.message_queue.topic.name, Perm.SUB
        yield Kind.GROUP, req.group.name, Perm.SUB
    elif method in (
        "AckMessage",
        "ChangeInvisibleDuration",
        "ForwardMessageToDeadLetterQueue",
        "QueryAssignment",
    ):
        yield Kind.TOPIC, req.topic.name, Perm.SUB
        yield Kind.GROUP, req.group.name, Perm.SUB
    elif method in ("Heartbeat", "NotifyClientTermination"):
        if req.HasField("group") and req.group.name:
            yield Kind.GROUP, req.group.name, Perm.SUB
    elif method == "Telemetry" and req.WhichOneof("command") == "settings":
        settings = req.settings
        if settings.WhichOneof("pub_sub") == "publishing":
            for topic in settings.publishing.topics:
                yield Kind.TOPIC, topic.name, Perm.PUB
        elif settings.WhichOneof("pub_sub") == "subscription":
            yield Kind.GROUP, settings.subscription.group.name, Perm.SUB
            for entry in settings.subscription.subscriptions:
                yield Kind.TOPIC, entry.topic.name, Perm.SUB
