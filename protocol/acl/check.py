"""Either ACL file format, told apart by its top-level keys: ``accounts`` and
``globalWhiteRemoteAddresses`` are ``plain_acl.yml`` (ACL 1.0, :mod:`.rules` and
:mod:`.decide`), ``users`` and ``acls`` the ACL 2.0 model (:mod:`.model` and :mod:`.v2`). The
servers hold whichever the file is and ask these functions, which take either."""

from __future__ import annotations

from collections.abc import Mapping

from protocol.acl import decide, v2
from protocol.acl import grpc as acl_grpc
from protocol.acl.decide import Refusal
from protocol.acl.model import AclModel, model_from_obj
from protocol.acl.rules import AclConfigError, AclRules, IPAddress, rules_from_obj
from protocol.command import RemotingCommand

#: The rules of an ACL file of either format.
AnyRules = AclRules | AclModel
_V1_KEYS = frozenset({"accounts", "globalWhiteRemoteAddresses"})
_V2_KEYS = frozenset({"users", "acls"})


def is_v2(doc: object) -> bool:
    """Whether a loaded ACL document is an ACL 2.0 one.

    Raises:
        AclConfigError: it mixes the two formats' keys.
    """
    if not isinstance(doc, dict):
        return False
    v1, v2_ = _V1_KEYS & doc.keys(), _V2_KEYS & doc.keys()
    if v1 and v2_:
        raise AclConfigError(
            f"the ACL file mixes plain_acl.yml keys ({', '.join(sorted(v1))}) with ACL 2.0 "
            f"keys ({', '.join(sorted(v2_))}): use one format"
        )
    return bool(v2_)


def rules_from_doc(doc: object) -> AnyRules:
    """Validate a loaded ACL document of either format.

    Raises:
        AclConfigError: the first problem found, naming where it is.
    """
    return model_from_obj(doc) if is_v2(doc) else rules_from_obj(doc)


def authorize_request(
    rules: AnyRules, cmd: RemotingCommand, peer: IPAddress | None
) -> Refusal | None:
    """None if a broker may run ``cmd`` from ``peer``, else why not."""
    if isinstance(rules, AclModel):
        return v2.authorize_request(rules, cmd, peer)
    return decide.authorize_request(rules, cmd, peer)


def authorize_namesrv(
    rules: AnyRules, cmd: RemotingCommand, peer: IPAddress | None
) -> Refusal | None:
    """None if a name server may run ``cmd`` from ``peer``, else why not."""
    if isinstance(rules, AclModel):
        return v2.authorize_namesrv(rules, cmd, peer)
    return decide.authorize_namesrv(rules, cmd, peer)


def authorize_call(
    rules: AnyRules, metadata: Mapping[str, str], peer: IPAddress | None, method: str, req: object
) -> tuple[Refusal, bool] | None:
    """None if a gRPC call of ``method`` (its short name) may run, else why not and whether
    it is an authentication failure (UNAUTHORIZED) rather than a missing right (FORBIDDEN)."""
    if isinstance(rules, AclModel):
        return v2.authorize_call(rules, metadata, peer, v2.grpc_needs(method, req))
    return acl_grpc.authorize_call(rules, metadata, peer, acl_grpc.needs_of(method, req))
