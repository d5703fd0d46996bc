"""ACL 1.0 request signatures on Remoting, as RocketMQ's clients make them.

The signed content is the values (not the keys) of every ext field except ``Signature``,
concatenated in the order of their keys, as UTF-8, followed by the body exactly as it travels
(compressed when the client compressed it). The signature is the standard Base64 of
HMAC-SHA1 over that content, keyed with the UTF-8 bytes of the secret key.

- Values are the text the client signed: JSON booleans are ``true``/``false`` and numbers
  their decimal text, which is what :mod:`protocol.header_codec` makes of them.
- Keys sort as Java's ``TreeMap<String, …>`` sorts them (UTF-16 code units); every client's
  keys are ASCII, where that is plain byte order (client-cpp's ``std::map``, ali-ons's
  ``Array.sort``).
- ``_UNIQUE_KEY_QUERY`` is left out for requests of version V4_9_3 (384) or lower, as
  RocketMQ's brokers do (every non-Java client sends a lower version).
- Verified against frames from ali-ons 3.12.0 and client-cpp 1.x / 2.1
  (``../shared/reference/security-ha.md`` §1.2-1.3); client-cpp signs even without
  credentials, with an empty AccessKey and an empty key.

The scheme has known weaknesses (no freshness, ambiguous concatenation, the request code is
not signed): ``docs/security.md`` lists them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from protocol.command import RemotingCommand

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: An Aliyun leftover that ali-ons and client-cpp send; signed like any other field.
ONS_CHANNEL = "OnsChannel"
#: ``MixAll.UNIQUE_MSG_QUERY_FLAG``: not signed up to request version V4_9_3.
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
#: ``MQVersion.Version.V4_9_3.ordinal()``.
V4_9_3 = 384


def _java_order(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def canonical_content(ext: Mapping[str, str], body: bytes, *, version: int = 0) -> bytes:
    """The bytes a client signs for a request with ``ext`` fields, ``body`` and ``version``."""
    skip_unique = version <= V4_9_3
    parts = [
        ext[key]
        for key in sorted(ext, key=_java_order)
        if key != SIGNATURE and not (skip_unique and key == UNIQUE_KEY_QUERY)
    ]
    return "".join(parts).encode("utf-8", "surrogatepass") + body


def signature_of(content: bytes, secret_key: str) -> str:
    """Base64 of HMAC-SHA1 over ``content`` (28 characters)."""
    digest = hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def signature_matches(cmd: RemotingCommand, secret_key: str) -> bool:
    """Whether ``cmd`` carries the signature ``secret_key`` makes of it (constant time)."""
    given = cmd.ext_fields.get(SIGNATURE)
    if not given:
        return False
    content = canonical_content(cmd.ext_fields, cmd.body, version=cmd.version)
    want = signature_of(content, secret_key)
    # Compare bytes: compare_digest refuses str with non-ASCII characters.
    return hmac.compare_digest(want.encode("ascii"), given.encode("utf-8", "surrogatepass"))


def sign(
    cmd: RemotingCommand, access_key: str, secret_key: str, *, channel: str | None = None
) -> RemotingCommand:
    """A copy of ``cmd`` with ``AccessKey`` (and ``OnsChannel`` when given) added and
    signed, the way RocketMQ's ``AclClientRPCHook`` does it. A previous signature is
    replaced."""
    ext = {k: v for k, v in cmd.ext_fields.items() if k != SIGNATURE}
    ext[ACCESS_KEY] = access_key
    if channel is not None:
        ext[ONS_CHANNEL] = channel
    ext[SIGNATURE] = signature_of(canonical_content(ext, cmd.body, version=cmd.version), secret_key)
    return cmd._replace(ext_fields=ext)
