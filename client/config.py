"""Client settings: one frozen dataclass shared by producers and consumers.

Defaults follow RocketMQ's Java client (``ClientConfig``): name servers from the argument,
else ``NAMESRV_ADDR`` (a ``;``-separated list), 3 s requests, route refresh and heartbeats
every 30 s. trimq's own broker understands the msgpack header, which is the default; set
``serialize="json"`` to speak plain RocketMQ JSON headers.
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass, field

from protocol.codes import SerializeType

DEFAULT_NAMESRV = "127.0.0.1:9876"


def namesrv_from_env(explicit: str | None = None) -> tuple[str, ...]:
    """The name server addresses: ``explicit``, else ``NAMESRV_ADDR``, else localhost:9876.

    Raises:
        ValueError: an address is not ``host:port``.
    """
    raw = explicit if explicit else os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV
    addresses = tuple(part.strip() for part in raw.split(";") if part.strip())
    for address in addresses:
        split_address(address)
    if not addresses:
        raise ValueError(f"no name server address in {raw!r}")
    return addresses


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` → ``(host, port)``.

    Raises:
        ValueError: not ``host:port`` with a port in 1..65535.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"address must be host:port, not {address!r}")
    return host.strip("[]"), int(port_text)


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


def _local_ip() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Settings every client shares.

    Attributes:
        namesrv_addr: name servers (``"h1:9876;h2:9876"``); ``None`` reads ``NAMESRV_ADDR``.
            A lone trimq broker answers route queries itself, so its address works too.
        request_timeout: seconds for one request without long polling.
        serialize: ``"msgpack"`` (trimq brokers) or ``"json"`` (any RocketMQ server).
        instance_name: part of the client id, as ``rocketmq.client.name``.
        route_refresh_interval: seconds between route refreshes of the topics in use.
        heartbeat_interval: seconds between heartbeats to every broker in use.
        connect_timeout: seconds for one TCP connect.
        backoff_initial, backoff_max: after a failed connect, an address is not tried again
            for this long (doubling per failure up to the max); requests to it fail fast
            with :class:`~client.errors.ConnectError`, which lets a producer move on.
        access_key, secret_key: credentials of a RocketMQ ACL 1.0 account: every request
            is signed with them (``AccessKey``/``Signature``). Default: ``TRIMQ_ACCESS_KEY``
            and ``TRIMQ_SECRET_KEY``; both or neither.
        tls: connect with TLS (to brokers and name servers alike): ``True`` verifies the
            server against the system's trusted certificates and its host name; an
            ``ssl.SSLContext`` is used as it is (a private CA, or a self-signed broker's
            certificate); ``False`` is plaintext.
    """

    namesrv_addr: str | None = None
    request_timeout: float = 3.0
    serialize: str = "msgpack"
    instance_name: str = "DEFAULT"
    client_ip: str = field(default_factory=_local_ip)
    route_refresh_interval: float = 30.0
    heartbeat_interval: float = 30.0
    connect_timeout: float = 3.0
    backoff_initial: float = 0.2
    backoff_max: float = 5.0
    access_key: str | None = field(default_factory=lambda: _env("TRIMQ_ACCESS_KEY"))
    secret_key: str | None = field(default_factory=lambda: _env("TRIMQ_SECRET_KEY"), repr=False)
    tls: bool | ssl.SSLContext = False

    def __post_init__(self) -> None:
        if (self.access_key is None) != (self.secret_key is None):
            raise ValueError("access_key and secret_key go together")
        if self.serialize not in ("msgpack", "json"):
            raise ValueError(f"serialize must be 'msgpack' or 'json', not {self.serialize!r}")
        for name in ("request_timeout", "connect_timeout", "heartbeat_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.namesrv_addr:
            namesrv_from_env(self.namesrv_addr)  # a bad address fails here, not at first use

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The context of TLS connections, None for plaintext."""
        if isinstance(self.tls, ssl.SSLContext):
            return self.tls
        return ssl.create_default_context() if self.tls else None

    @property
    def serialize_type(self) -> SerializeType:
        """The header encoding of our requests."""
        return SerializeType.MSGPACK if self.serialize == "msgpack" else SerializeType.JSON

    @property
    def namesrv_addresses(self) -> tuple[str, ...]:
        """The name servers to ask, in order."""
        return namesrv_from_env(self.namesrv_addr)

    @property
    def client_id(self) -> str:
        """``ip@instance@pid``: unique per process, as Java builds it (plus the pid)."""
        return f"{self.client_ip}@{self.instance_name}@{os.getpid()}"
