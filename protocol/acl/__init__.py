"""RocketMQ ACL 1.0 on Remoting, sans-IO: request signatures (:mod:`.signature`), the
``plain_acl.yml`` model (:mod:`.rules`) and the decision whether a request may run
(:mod:`.decide`). Reading the file is the broker's (``broker.acl``); ``docs/security.md``
is the user's guide."""

from __future__ import annotations

from protocol.acl.decide import ADMIN_CODES as ADMIN_CODES
from protocol.acl.decide import NAMESRV_PROTECTED as NAMESRV_PROTECTED
from protocol.acl.decide import RESOURCES as RESOURCES
from protocol.acl.decide import Refusal as Refusal
from protocol.acl.decide import authorize_namesrv as authorize_namesrv
from protocol.acl.decide import authorize_request as authorize_request
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
