"""etcd v3's JSON gateway, sans-IO: the requests trimq's failover makes (docs/ha.md) as
HTTP/1.1 bytes, and their replies parsed back into typed values.

etcd (3.4 and later) serves its gRPC API as JSON over HTTP at ``/v3/...`` on its client
port (grpc-gateway). Keys and values are base64 strings; 64-bit integers are JSON strings
(``"revision": "12"``) and fields at their default (0, false, empty) are left out, so every
reader here takes a missing field as its default. A gRPC error is an HTTP error status with
a JSON body ``{"error": ..., "code": N, "message": ...}``.

Only unary calls are used: ``lease/grant``, ``lease/keepalive`` (a bidirectional stream in
gRPC; the gateway sends the one request body, and answers with one ``{"result": ...}``
object, then ends the stream), ``lease/revoke``, ``kv/range`` and ``kv/txn``. Each call is
one HTTP/1.1 request with ``Connection: close``; :class:`ResponseParser` reads a reply
framed by Content-Length, chunked, or by the end of the connection.
"""

from __future__ import annotations

import base64
import enum
import json
from dataclasses import dataclass, field
from typing import Any, cast

#: The JSON gateway's prefix (etcd 3.4+; 3.3 used ``/v3beta``).
PREFIX = "/v3"
#: A reply larger than this is refused (ours are a few hundred bytes).
MAX_REPLY_BYTES = 4 * 1024 * 1024


class EtcdError(Exception):
    """etcd answered with an error, or its reply cannot be read."""

    def __init__(self, message: str, *, status: int = 0, grpc_code: int = 0) -> None:
        super().__init__(message)
        #: The HTTP status (0 when the reply was not even an HTTP reply).
        self.status = status
        #: gRPC's status code from the error body (0 when absent).
        self.grpc_code = grpc_code

    @property
    def retriable_elsewhere(self) -> bool:
        """Whether another member may answer (etcd unavailable, no leader, timeouts), as
        opposed to a definite answer (lease not found, invalid argument)."""
        # gRPC UNAVAILABLE 14, DEADLINE_EXCEEDED 4, UNKNOWN 2 ("leader changed"); HTTP 5xx
        # other than a definite gRPC code; or no HTTP reply at all.
        return (
            self.status == 0
            or self.grpc_code in (2, 4, 14)
            or (self.status >= 500 and self.grpc_code == 0)
        )


def b64(data: bytes) -> str:
    """etcd's form of a key or value."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: object) -> bytes:
    """The bytes of a base64 field (a missing field is empty)."""
    if text is None:
        return b""
    if not isinstance(text, str):
        raise EtcdError(f"expected a base64 string, got {text!r}")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise EtcdError(f"not base64: {text[:40]!r}") from None


def _int(obj: dict[str, Any], name: str) -> int:
    """A 64-bit integer field: a JSON string (or number); missing = 0."""
    raw = obj.get(name, 0)
    if isinstance(raw, bool):
        raise EtcdError(f"{name}: expected an integer, got {raw!r}")
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise EtcdError(f"{name}: expected an integer, got {raw!r}") from None


def _obj(value: object, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise EtcdError(f"{what}: expected an object, got {type(value).__name__}")
    return cast(dict[str, Any], value)


def _list(value: object, what: str) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise EtcdError(f"{what}: expected a list, got {type(value).__name__}")
    return cast(list[object], value)


def parse_endpoints(text: str) -> list[str]:
    """``http://h1:2379,http://h2:2379`` (or bare ``h1:2379``) as ``HOST:PORT`` strings.

    Raises:
        ValueError: an endpoint is not ``[http://]HOST:PORT`` (https is not supported).
    """
    out: list[str] = []
    for raw in text.split(","):
        item = raw.strip().rstrip("/")
        if not item:
            continue
        if item.startswith("https://"):
            raise ValueError(f"{item}: TLS to etcd is not supported (use http:// on a private net)")
        item = item.removeprefix("http://")
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{raw.strip()!r} is not http://HOST:PORT")
        out.append(f"{host}:{port}")
    if not out:
        raise ValueError("no etcd endpoint given")
    return out


# ---------------------------------------------------------------------- requests
@dataclass(frozen=True, slots=True)
class Request:
    """One gateway call: its path under :data:`PREFIX` and its JSON body."""

    path: str
    body: dict[str, Any]


def encode_http(request: Request, host: str) -> bytes:
    """The HTTP/1.1 bytes of ``request`` for the member at ``host`` (``HOST:PORT``)."""
    payload = json.dumps(request.body, separators=(",", ":")).encode()
    head = (
        f"POST {PREFIX}{request.path} HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + payload


def lease_grant(ttl_s: int) -> Request:
    """Grant a lease of ``ttl_s`` seconds (etcd picks the id)."""
    return Request("/lease/grant", {"TTL": ttl_s, "ID": 0})


def lease_keepalive(lease_id: int) -> Request:
    """Renew a lease to its full TTL."""
    return Request("/lease/keepalive", {"ID": str(lease_id)})


def lease_revoke(lease_id: int) -> Request:
    """End a lease now: the keys it holds are deleted."""
    return Request("/lease/revoke", {"ID": str(lease_id)})


def range_request(key: bytes, *, prefix: bool = False) -> Request:
    """Read one key, or (``prefix``) every key starting with it."""
    body: dict[str, Any] = {"key": b64(key)}
    if prefix:
        body["range_end"] = b64(prefix_end(key))
    return Request("/kv/range", body)


def prefix_end(key: bytes) -> bytes:
    """The range end covering every key with prefix ``key`` (etcd's ``GetPrefixRangeEnd``)."""
    end = bytearray(key)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\x00"  # every key


class Target(enum.Enum):
    """What a txn compare looks at."""

    CREATE = "CREATE"
    MOD = "MOD"
    VERSION = "VERSION"
    VALUE = "VALUE"


@dataclass(frozen=True, slots=True)
class Compare:
    """``key``'s target EQUAL (or ``result``) to ``value`` — a revision, or bytes for VALUE."""

    key: bytes
    target: Target
    value: int | bytes
    result: str = "EQUAL"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "key": b64(self.key),
            "target": self.target.value,
            "result": self.result,
        }
        if self.target is Target.VALUE:
            assert isinstance(self.value, bytes)
            out["value"] = b64(self.value)
        else:
            name = {
                Target.CREATE: "create_revision",
                Target.MOD: "mod_revision",
                Target.VERSION: "version",
            }[self.target]
            out[name] = str(self.value)
        return out


@dataclass(frozen=True, slots=True)
class Put:
    """Write ``key`` = ``value``, held by ``lease`` (0: by none)."""

    key: bytes
    value: bytes
    lease: int = 0

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": b64(self.key), "value": b64(self.value)}
        if self.lease:
            body["lease"] = str(self.lease)
        return {"request_put": body}


@dataclass(frozen=True, slots=True)
class Get:
    """Read ``key`` inside a txn."""

    key: bytes

    def to_json(self) -> dict[str, Any]:
        return {"request_range": {"key": b64(self.key)}}


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete ``key`` inside a txn."""

    key: bytes

    def to_json(self) -> dict[str, Any]:
        return {"request_delete_range": {"key": b64(self.key)}}


Operation = Put | Get | Delete


def txn(
    compare: list[Compare], success: list[Operation], failure: list[Operation] | None = None
) -> Request:
    """If every compare holds, ``success``; else ``failure`` — atomically."""
    return Request(
        "/kv/txn",
        {
            "compare": [c.to_json() for c in compare],
            "success": [op.to_json() for op in success],
            "failure": [op.to_json() for op in failure or []],
        },
    )


# ---------------------------------------------------------------------- replies
@dataclass(frozen=True, slots=True)
class KeyValue:
    """One stored key (``mvccpb.KeyValue``)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    #: The lease holding it (0: none).
    lease: int

    @classmethod
    def from_json(cls, obj: object) -> KeyValue:
        o = _obj(obj, "kv")
        return cls(
            key=unb64(o.get("key")),
            value=unb64(o.get("value")),
            create_revision=_int(o, "create_revision"),
            mod_revision=_int(o, "mod_revision"),
            version=_int(o, "version"),
            lease=_int(o, "lease"),
        )


def _revision(reply: dict[str, Any]) -> int:
    return _int(_obj(reply.get("header"), "header"), "revision")


@dataclass(frozen=True, slots=True)
class LeaseGranted:
    """``lease/grant``'s reply."""

    lease_id: int
    ttl_s: int


def decode_lease_grant(reply: dict[str, Any]) -> LeaseGranted:
    if reply.get("error"):
        raise EtcdError(f"lease grant: {reply['error']}")
    granted = LeaseGranted(_int(reply, "ID"), _int(reply, "TTL"))
    if granted.lease_id == 0 or granted.ttl_s <= 0:
        raise EtcdError(f"lease grant: no lease in {reply!r}")
    return granted


def decode_lease_keepalive(reply: dict[str, Any]) -> int:
    """The lease's remaining TTL after the renewal: 0 when the lease no longer exists
    (it expired or was revoked; etcd answers TTL 0, left out of the JSON)."""
    if "error" in reply:
        raise EtcdError(f"lease keepalive: {_obj(reply['error'], 'error').get('message')}")
    return _int(_obj(reply.get("result"), "result"), "TTL")


@dataclass(frozen=True, slots=True)
class RangeResult:
    """``kv/range``'s reply."""

    revision: int
    kvs: tuple[KeyValue, ...]


def decode_range(reply: dict[str, Any]) -> RangeResult:
    kvs = tuple(KeyValue.from_json(kv) for kv in _list(reply.get("kvs"), "kvs"))
    return RangeResult(_revision(reply), kvs)


@dataclass(frozen=True, slots=True)
class TxnResult:
    """``kv/txn``'s reply: whether the compares held, the revision after it (a put's
    create revision when it created the key), and the ranges' results in order."""

    succeeded: bool
    revision: int
    ranges: tuple[RangeResult, ...] = field(default=())


def decode_txn(reply: dict[str, Any]) -> TxnResult:
    ranges: list[RangeResult] = []
    for response in _list(reply.get("responses"), "responses"):
        r = _obj(response, "response")
        if "response_range" in r:
            ranges.append(decode_range(_obj(r["response_range"], "response_range")))
    return TxnResult(bool(reply.get("succeeded", False)), _revision(reply), tuple(ranges))


def decode_error(status: int, body: bytes) -> EtcdError:
    """An HTTP error reply as an :class:`EtcdError` (gRPC code and message when given)."""
    message, code = body[:200].decode("utf-8", "replace").strip(), 0
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        message = str(parsed.get("message") or parsed.get("error") or message)
        raw = parsed.get("code", 0)
        code = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
    return EtcdError(f"HTTP {status}: {message}", status=status, grpc_code=code)


# ---------------------------------------------------------------------- HTTP/1.1 replies
class ResponseParser:
    """Reads one HTTP/1.1 reply fed in pieces; :attr:`done` once it is complete.

    Framing: Content-Length, chunked transfer coding, or (neither) the end of the
    connection (:meth:`eof`). Raises :class:`EtcdError` on anything malformed or larger
    than :data:`MAX_REPLY_BYTES`.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""
        self.done = False
        self._length: int | None = None
        self._chunked = False
        self._head_done = False

    def feed(self, data: bytes) -> None:
        if self.done:
            return
        self._buf += data
        if len(self._buf) > MAX_REPLY_BYTES:
            raise EtcdError(f"reply larger than {MAX_REPLY_BYTES} bytes")
        if not self._head_done:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            self._head(bytes(self._buf[:end]))
            del self._buf[: end + 4]
        self._try_body()

    def eof(self) -> None:
        """The connection ended: a reply framed by it is complete; any other is cut."""
        if self.done:
            return
        if self._head_done and self._length is None and not self._chunked:
            self.body, self.done = bytes(self._buf), True
            return
        raise EtcdError("connection closed before the whole reply")

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise EtcdError(f"not an HTTP reply: {lines[0][:80]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise EtcdError(f"malformed header line {line[:80]!r}")
            self.headers[name.strip().lower()] = value.strip()
        self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if not self._chunked and "content-length" in self.headers:
            raw = self.headers["content-length"]
            if not raw.isdigit():
                raise EtcdError(f"bad Content-Length {raw!r}")
            self._length = int(raw)
        self._head_done = True

    def _try_body(self) -> None:
        if self._chunked:
            self._try_chunks()
        elif self._length is not None and len(self._buf) >= self._length:
            self.body, self.done = bytes(self._buf[: self._length]), True

    def _try_chunks(self) -> None:
        body = bytearray()
        pos = 0
        buf = self._buf
        while True:  # bounded: each pass consumes a chunk of the (bounded) buffer
            line_end = buf.find(b"\r\n", pos)
            if line_end < 0:
                return
            size_text = bytes(buf[pos:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise EtcdError(f"bad chunk size {size_text[:20]!r}") from None
            start = line_end + 2
            if size == 0:
                # The last chunk; trailers (none expected) end with an empty line.
                if buf.find(b"\r\n", start) < 0:
                    return
                self.body, self.done = bytes(body), True
                return
            if len(buf) < start + size + 2:
                return
            body += buf[start : start + size]
            pos = start + size + 2


def decode_json_body(status: int, body: bytes) -> dict[str, Any]:
    """A reply's JSON object, or the :class:`EtcdError` its status or body says.

    A streamed reply (keepalive) may hold several JSON objects one after the other; the
    first is the answer to our one request.
    """
    if status != 200:
        raise decode_error(status, body)
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        raise EtcdError(f"not JSON: {text[:80]!r}", status=status) from None
    if not isinstance(parsed, dict):
        raise EtcdError(f"expected a JSON object, got {text[:80]!r}", status=status)
    return cast(dict[str, Any], parsed)
