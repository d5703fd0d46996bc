"""RocketMQ ACLs, sans-IO: request signatures (:mod:`.signature`), the ``plain_acl.yml`` model
of ACL 1.0 (:mod:`.rules`) and its decisions (:mod:`.decide`, :mod:`.grpc`), the ACL 2.0
model (:mod:`.model`) and its decisions (:mod:`.v2`), the import of the first into the second
(:mod:`.migrate`), and the decision functions that take either (:mod:`.check`: what the
servers call). Reading the file is the broker's (``broker.acl``); ``docs/security.md`` is the
user's guide."""

from __future__ import annotations

from protocol.acl.check import AnyRules as AnyRules
from protocol.acl.check import authorize_namesrv as authorize_namesrv
from protocol.acl.check import authorize_request as authorize_request
from protocol.acl.check import rules_from_doc as rules_from_doc
from protocol.acl.decide import ADMIN_CODES as ADMIN_CODES
from protocol.acl.decide import NAMESRV_PROTECTED as NAMESRV_PROTECTED
from protocol.acl.decide import RESOURCES as RESOURCES
from protocol.acl.decide import Refusal as Refusal
from protocol.acl.model import AclModel as AclModel
from protocol.acl.model import model_from_obj as model_from_obj
from protocol.acl.model import model_to_obj as model_to_obj
from protocol.acl.rules import Account as Account
from protocol.acl.rules import AclConfigError as AclConfigError
from protocol.acl.rules import AclRules as AclRules
from protocol.acl.rules import AddressPattern as AddressPattern
from protocol.acl.rules import Kind as Kind
from protocol.acl.rules import Perm as Perm
from protocol.acl.rules import parse_ip as parse_ip
from protocol.acl.rules import rules_from_obj as rules_from_obj
from protocol.acl.signature import sign as sign
from protocol.acl.signature import signature_matches as signature_matches
