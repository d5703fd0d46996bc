"""Broker settings: defaults < TOML file < environment (``TRIMQ_<SETTING>``) < flags.

The command line is docs/design.md §10's contract; every flag is also a TOML key and an
environment variable (``--data-dir`` = ``data_dir`` = ``TRIMQ_DATA_DIR``). Names and defaults
follow RocketMQ where it has one.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from broker.acl import AclFileError, load_rules
from broker.clock import SYSTEM_CLOCK, Clock, DiskProbe, disk_used_ratio
from broker.store.api import FlushMode
from broker.store.config import StoreConfig
from protocol.etcd import parse_endpoints

WAKE_MODES = ("targeted", "topic", "none")
RETRY_NAMINGS = ("v2", "v1")
#: ``--tls-mode`` values (``broker.tls.TlsMode``).
TLS_MODES = ("permissive", "enforcing", "disabled")


class ConfigError(ValueError):
    """A setting has an unusable value; the message names it."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Everything a broker process needs (see the module docstring for the sources)."""

    host: str = "127.0.0.1"
    port: int = 10911
    data_dir: Path = Path("./data")
    broker_name: str = "broker-a"
    cluster: str = "DefaultCluster"
    advertise: str | None = None
    namesrv_addr: str | None = None
    wake_mode: str = "targeted"
    retry_naming: str = "v2"
    flush: str = "async"
    metrics_dir: Path | None = None
    #: Serve Prometheus ``/metrics`` on this port of ``host`` (0 = any free port, logged);
    #: None = off. (RocketMQ's exporter is off by default too; its port is 5557.)
    prometheus_port: int | None = None
    #: Queues of a topic created on first send or by default (RocketMQ: defaultTopicQueueNums).
    default_queue_nums: int = 4
    auto_create_topic: bool = True
    max_connections: int = 4096
    max_frame_size: int = 16 * 1024 * 1024
    max_message_size: int = 4 * 1024 * 1024
    #: Longest a pull may be held (RocketMQ brokerSuspendMaxTimeMillis).
    suspend_max_ms: int = 15_000
    max_reconsume_times: int = 16
    segment_size: int = 1024 * 1024 * 1024
    flush_interval_s: float = 0.5
    checkpoint_interval_s: float = 1.0
    #: Replies queued per connection before handlers wait for the socket (back-pressure).
    write_queue: int = 256
    #: Long polls (and SYNC-mode stores) of one Remoting connection waiting at once; beyond
    #: it a request is answered SYSTEM_BUSY at once (clients retry later).
    max_waiting_per_connection: int = 64
    #: Reply bytes a Remoting connection may leave unread before its long polls are answered
    #: SYSTEM_BUSY (a consumer that stops reading pins at most about this much).
    max_unsent_bytes_per_connection: int = 16 * 1024 * 1024
    #: A connection silent this long, with nothing waiting or unsent, is closed (0: never);
    #: on the gRPC port: with no call open.
    idle_timeout_s: float = 120.0
    #: The daemon freezes its start-up objects, keeps CPython's automatic collections to the
    #: young and middle generations, and runs a full one every this many seconds
    #: (broker/gc_tuning.py; 0: the interpreter's own settings).
    gc_full_collect_s: float = 600.0
    #: The GIL switch interval in milliseconds: how long a worker thread may keep the
    #: event loop waiting for the GIL (broker/gil_tuning.py; 0: the interpreter's 5 ms).
    gil_switch_ms: float = 0.5
    #: Connections from one source address, per port, beyond which new ones are closed at
    #: once (0: no cap).
    max_connections_per_ip: int = 1024
    #: A send read but not started after this long (the event loop is overloaded) is
    #: answered SYSTEM_BUSY instead of stored (RocketMQ's ``waitTimeMillsInSendQueue``).
    send_queue_wait_ms: int = 200
    #: The same for every other Remoting request (RocketMQ's pull queue: 5 s).
    queue_wait_ms: int = 5000
    #: At this disk usage or more, writes are refused (SERVICE_NOT_AVAILABLE) until space is
    #: freed; reads go on (RocketMQ's ``diskSpaceWarningLevelRatio``). 0: never.
    disk_full_ratio: float = 0.90
    #: Registration with the name servers (RocketMQ registerNameServerPeriod: 30 s).
    register_interval_s: float = 30.0
    #: Bound on one registration with one name server (RocketMQ registerBrokerTimeoutMills).
    register_timeout_s: float = 6.0
    #: The gRPC front end's port on ``host`` (the proxy's 8081; 0 = any free port, logged as
    #: ``grpc_port``; None, ``off`` on the command line = no gRPC front end).
    grpc_port: int | None = 8081
    #: PEM certificate and unencrypted key for TLS on both ports; without them a self-signed
    #: certificate is made at start-up, as the proxy's TLS test mode does.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: TLS on the Remoting and gRPC ports: ``permissive`` (TLS and plaintext on each port, by
    #: the first byte; RocketMQ's default), ``enforcing`` (TLS only) or ``disabled``.
    tls_mode: str = "permissive"
    #: Seconds between check-backs of an undecided transactional half message (RocketMQ's
    #: ``transactionCheckInterval``: 60).
    transaction_check_interval_s: float = 60.0
    #: Seconds a half message is left alone before its first check-back (RocketMQ's
    #: ``transactionTimeOut``: 6; a message's ``CHECK_IMMUNITY_TIME_IN_SECONDS`` overrides it).
    transaction_immunity_s: float = 6.0
    #: Check-backs before an undecided half is discarded to ``TRANS_CHECK_MAX_TIME_TOPIC``
    #: (RocketMQ's ``transactionCheckMax``: 15).
    transaction_check_max: int = 15
    #: Serve SQL92 subscriptions (RocketMQ's ``enablePropertyFilter``, off there by default;
    #: on here: the official 5.x clients offer SQL92 filters). Off: they are refused with
    #: SUBSCRIPTION_PARSE_FAILED, as RocketMQ does.
    enable_property_filter: bool = True
    #: The pop journal's bytes before a checkpoint snapshots the in-flight table again (also
    #: at least 64 per lease in flight); 0: a snapshot at every checkpoint.
    pop_snapshot_min_bytes: int = 256 * 1024
    #: Talk TLS to the name servers (registrations, route lookups); with ``namesrv_tls_ca``
    #: their certificate is verified against that PEM bundle, else not checked (RocketMQ's
    #: client test mode: encrypted, but not proof against a man in the middle).
    namesrv_tls: bool = False
    namesrv_tls_ca: Path | None = None
    #: ACL (docs/security.md): every request is authenticated and authorised against this
    #: file — a ``plain_acl.yml`` (RocketMQ ACL 1.0) or an ACL 2.0 rule file (users and
    #: policies, §7), told apart by their keys — reloaded when it changes. None = ACL off
    #: (RocketMQ's ``aclEnable=false``).
    acl_file: Path | None = None
    #: The account the broker signs its name-server registrations with (the name servers'
    #: ``--acl-file`` must know it). Both or neither.
    acl_access_key: str | None = None
    acl_secret_key: str | None = None
    #: 0: the master of its broker group (``broker_name``); 1 and up: a replica, which
    #: follows the master's commit log and refuses writes (docs/design.md §13).
    broker_id: int = 0
    #: The HA port a master serves its replicas on (None: the Remoting port + 1, as
    #: RocketMQ's ``haListenPort``; 0: any free port, logged as ``ha_port``).
    ha_port: int | None = None
    #: A replica's master, ``HOST:PORT`` of its HA port; without it, a replica learns it
    #: from the name servers' reply to its registration (the master's ``haServerAddr``).
    ha_master_addr: str | None = None
    #: ``sync``: a send is answered SEND_OK only once ``min_insync_replicas`` copies hold it
    #: (RocketMQ's SYNC_MASTER); ``async``: at once (ASYNC_MASTER).
    replication: str = "async"
    #: Copies a sync send needs, the master included (RocketMQ ``inSyncReplicas``).
    min_insync_replicas: int = 1
    #: How long a sync send waits for its replicas before FLUSH_SLAVE_TIMEOUT (RocketMQ
    #: ``slaveTimeout``).
    replica_timeout_ms: int = 3000
    #: Automatic failover (docs/ha.md): etcd members ``http://h1:2379,http://h2:2379``;
    #: the group's master holds a lease-held key there, and an in-sync replica takes it
    #: over when it lapses. None: no automatic failover (manual promotion only).
    etcd_endpoints: str | None = None
    #: The master lease's TTL: a dead master is replaced about this long after its last
    #: renewal; a master that cannot renew within half of it refuses writes (fencing).
    etcd_lease_ttl_s: int = 3

    def __post_init__(self) -> None:
        if self.wake_mode not in WAKE_MODES:
            raise ConfigError(f"wake_mode must be one of {WAKE_MODES}, not {self.wake_mode!r}")
        if self.retry_naming not in RETRY_NAMINGS:
            raise ConfigError(f"retry_naming must be v2 or v1, not {self.retry_naming!r}")
        if self.tls_mode not in TLS_MODES:
            raise ConfigError(f"tls_mode must be one of {TLS_MODES}, not {self.tls_mode!r}")
        if self.flush not in ("async", "sync"):
            raise ConfigError(f"flush must be async or sync, not {self.flush!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is outside 0..65535")
        for name in (
            "register_interval_s",
            "register_timeout_s",
            "transaction_check_interval_s",
            "transaction_immunity_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("prometheus_port", "grpc_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 65535:
                raise ConfigError(f"{name} {value} is outside 0..65535")
        for name in ("max_connections_per_ip", "send_queue_wait_ms", "queue_wait_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, not {getattr(self, name)}")
        if self.max_waiting_per_connection < 1:
            raise ConfigError("max_waiting_per_connection must be at least 1")
        if self.gc_full_collect_s < 0:
            raise ConfigError("gc_full_collect_s must be 0 (off) or positive")
        if not 0 <= self.gil_switch_ms <= 1000:
            raise ConfigError("gil_switch_ms must be 0 (the interpreter's own) to 1000")
        if self.max_unsent_bytes_per_connection < 1:
            raise ConfigError("max_unsent_bytes_per_connection must be at least 1")
        if not 0 <= self.disk_full_ratio <= 1:
            raise ConfigError(f"disk_full_ratio {self.disk_full_ratio} is outside 0..1")
        if self.transaction_check_max < 1:
            raise ConfigError(
                f"transaction_check_max must be at least 1, not {self.transaction_check_max}"
            )
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key go together")
        if self.namesrv_tls_ca is not None and not self.namesrv_tls:
            raise ConfigError("namesrv_tls_ca needs namesrv_tls")
        if (self.acl_access_key is None) != (self.acl_secret_key is None):
            raise ConfigError("acl_access_key and acl_secret_key go together")
        self.namesrv_addrs()
        self._check_replication()

    def _check_replication(self) -> None:
        if self.broker_id < 0:
            raise ConfigError(f"broker_id must not be negative, not {self.broker_id}")
        if self.replication not in ("async", "sync"):
            raise ConfigError(f"replication must be async or sync, not {self.replication!r}")
        if self.min_insync_replicas < 1:
            raise ConfigError("min_insync_replicas must be at least 1 (the master counts)")
        if self.replica_timeout_ms <= 0:
            raise ConfigError(f"replica_timeout_ms must be positive, not {self.replica_timeout_ms}")
        if self.ha_port is not None and not 0 <= self.ha_port <= 65535:
            raise ConfigError(f"ha_port {self.ha_port} is outside 0..65535")
        if self.ha_master_addr is not None and not _is_host_port(self.ha_master_addr):
            raise ConfigError(f"ha_master_addr: {self.ha_master_addr!r} is not HOST:PORT")
        if self.is_replica and not (
            self.ha_master_addr or self.namesrv_addr or self.etcd_endpoints
        ):
            raise ConfigError(
                "a replica (broker_id >= 1) needs ha_master_addr or namesrv_addr "
                "(or etcd_endpoints)"
            )
        if self.etcd_endpoints is not None:
            try:
                parse_endpoints(self.etcd_endpoints)
            except ValueError as exc:
                raise ConfigError(f"etcd_endpoints: {exc}") from None
        if self.etcd_lease_ttl_s < 2:
            # etcd's own floor is 1.5 x its election timeout (2 s by default).
            raise ConfigError(f"etcd_lease_ttl_s must be at least 2, not {self.etcd_lease_ttl_s}")

    @property
    def stores_wait(self) -> bool:
        """Whether a request that stores a record may wait long for its answer — its fsync
        (``flush`` sync) or its replicas' acknowledgements (``replication`` sync) — and so
        needs a task of its own on both front ends (concurrent sends then share one wait)."""
        sync_replication = self.replication == "sync" and self.min_insync_replicas > 1
        return self.flush == "sync" or (sync_replication and not self.is_replica)

    @property
    def is_replica(self) -> bool:
        """Whether this broker follows a master (``broker_id`` >= 1)."""
        return self.broker_id > 0

    def namesrv_addrs(self) -> list[str]:
        """The name servers of ``namesrv_addr`` (``"h1:9876;h2:9876"``), in order.

        Raises:
            ConfigError: an entry is not ``HOST:PORT``.
        """
        addrs = [a.strip() for a in (self.namesrv_addr or "").split(";") if a.strip()]
        for addr in addrs:
            if not _is_host_port(addr):
                raise ConfigError(f"namesrv_addr: {addr!r} is not HOST:PORT")
        return addrs

    def store_config(
        self,
        bound_port: int,
        *,
        clock: Clock = SYSTEM_CLOCK,
        disk_probe: DiskProbe = disk_used_ratio,
    ) -> StoreConfig:
        """The storage engine's settings (the store host is the advertised address)."""
        host, port = self.advertised(bound_port).rsplit(":", 1)
        return StoreConfig(
            clock=clock,
            disk_probe=disk_probe,
            data_dir=self.data_dir,
            segment_size=self.segment_size,
            flush_mode=FlushMode(self.flush),
            flush_interval_s=self.flush_interval_s,
            checkpoint_interval_s=self.checkpoint_interval_s,
            max_message_size=self.max_message_size,
            disk_full_ratio=self.disk_full_ratio,
            store_host=(host if _is_ip(host) else "127.0.0.1", int(port)),
            replica=self.is_replica,
        )

    def advertised(self, bound_port: int) -> str:
        """``HOST:PORT`` put into routes."""
        if self.advertise:
            return self.advertise
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{host}:{bound_port}"


def _is_host_port(addr: str) -> bool:
    host, sep, port = addr.rpartition(":")
    return bool(sep and host and port.isdigit() and port.isascii() and 0 < int(port) < 65536)


def _is_ip(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() and p.isascii() and int(p) < 256 for p in parts)


def _convert(name: str, kind: Any, raw: object) -> object:
    if raw is None:
        return None
    text = str(raw)
    if kind == "int | None" and text.lower() == "off":
        return None
    try:
        if kind in (int, "int", "int | None"):
            return int(text)
        if kind in (float, "float"):
            return float(text)
        if kind in (bool, "bool"):
            if isinstance(raw, bool):
                return raw
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind in (Path, "Path", "Path | None"):
            return Path(text)
    except ValueError:
        raise ConfigError(f"setting {name!r}: {text!r} is not a valid {kind}") from None
    return text


Settings = TypeVar("Settings")


def from_sources(
    *,
    toml_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
) -> BrokerConfig:
    """Merge defaults < TOML < environment < flags (flags set to None are absent)."""
    return merge_sources(BrokerConfig, toml_path=toml_path, env=env, flags=flags)


def merge_sources(
    cls: type[Settings],
    *,
    toml_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, object] | None = None,
    env_prefix: str = "TRIMQ_",
) -> Settings:
    """Merge defaults < TOML < environment (``<env_prefix><SETTING>``) < flags into the
    frozen settings dataclass ``cls``.

    Raises:
        ConfigError: an unknown key in the file, or a value of the wrong kind.
    """
    kinds: dict[str, Any] = {f.name: f.type for f in fields(cls)}  # type: ignore[arg-type]
    values: dict[str, object] = {}
    if toml_path is not None:
        try:
            table = tomllib.loads(toml_path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {toml_path}: {exc}") from None
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in kinds:
                raise ConfigError(f"config file {toml_path}: unknown setting {key!r}")
            values[name] = raw
    for name in kinds:
        raw = (env or {}).get(f"{env_prefix}{name.upper()}")
        if raw is not None:
            values[name] = raw
    for name, raw in (flags or {}).items():
        if raw is not None and name in kinds:
            values[name] = raw
    converted = {n: _convert(n, str(kinds[n]).replace("'", ""), v) for n, v in values.items()}
    try:
        return cls(**converted)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The broker's flags, exactly as docs/design.md §10 lists them (all default to None so that
    lower-priority sources show through)."""
    p = argparse.ArgumentParser(prog="trimq-broker", description="trimq broker daemon")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port, 0 = any free port (default 10911)")
    p.add_argument("--data-dir", help="commit log, queues, offsets (default ./data)")
    p.add_argument("--broker-name")
    p.add_argument("--cluster")
    p.add_argument("--advertise", help="HOST:PORT put into routes")
    p.add_argument("--namesrv-addr", help='"h1:9876;h2:9876"')
    p.add_argument("--wake-mode", choices=WAKE_MODES)
    p.add_argument("--retry-naming", choices=RETRY_NAMINGS)
    p.add_argument("--flush", choices=("async", "sync"))
    p.add_argument("--metrics-dir")
    p.add_argument(
        "--register-interval-s",
        type=float,
        help="seconds between registrations with the name servers (default 30)",
    )
    p.add_argument(
        "--register-timeout-s",
        type=float,
        help="bound on one registration with one name server (default 6)",
    )
    p.add_argument("--prometheus-port", type=int, help="serve /metrics here (0 = any free port)")
    p.add_argument(
        "--grpc-port",
        help="RocketMQ 5 gRPC API port on --host (default 8081, 0 = any free port, off = none)",
    )
    p.add_argument("--tls-cert", help="PEM certificate for TLS on both ports")
    p.add_argument("--tls-key", help="PEM key (unencrypted) of --tls-cert")
    p.add_argument(
        "--tls-mode",
        choices=TLS_MODES,
        help="TLS on both ports: permissive (default: TLS and plaintext), enforcing, disabled",
    )
    p.add_argument(
        "--transaction-check-interval-s",
        type=float,
        help="seconds between check-backs of an undecided half message (default 60)",
    )
    p.add_argument(
        "--transaction-immunity-s",
        type=float,
        help="seconds before a half message's first check-back (default 6)",
    )
    p.add_argument(
        "--transaction-check-max",
        type=int,
        help="check-backs before an undecided half message is discarded (default 15)",
    )
    p.add_argument(
        "--enable-property-filter",
        help="serve SQL92 subscriptions: true (default) or false",
    )
    p.add_argument(
        "--acl-file",
        help="ACL on: a plain_acl.yml (ACL 1.0) or an ACL 2.0 rule file, reloaded when it changes",
    )
    p.add_argument(
        "--acl-access-key", help="AccessKey the broker signs its name-server registrations with"
    )
    p.add_argument(
        "--acl-secret-key",
        help="its secret (better in TRIMQ_ACL_SECRET_KEY: flags show in the process list)",
    )
    p.add_argument(
        "--gc-full-collect-s",
        type=float,
        help="full garbage collection every this many seconds, none automatic "
        "(default 600; 0: CPython's own settings)",
    )
    p.add_argument(
        "--gil-switch-ms",
        type=float,
        help="GIL switch interval: how long a worker thread may keep the event loop "
        "waiting (default 0.5; 0: CPython's own, 5)",
    )
    p.add_argument(
        "--idle-timeout-s",
        type=float,
        help="close a connection silent this long with nothing waiting (default 120, 0: never)",
    )
    p.add_argument(
        "--max-waiting-per-connection",
        type=int,
        help="long polls one connection may have waiting (default 64; beyond: SYSTEM_BUSY)",
    )
    p.add_argument(
        "--max-unsent-bytes-per-connection",
        type=int,
        help="reply bytes one connection may leave unread before its long polls are refused "
        "SYSTEM_BUSY (default 16777216)",
    )
    p.add_argument(
        "--namesrv-tls",
        help="true: talk TLS to the name servers (default false)",
    )
    p.add_argument(
        "--namesrv-tls-ca",
        help="PEM bundle the name servers' certificates are verified against",
    )
    p.add_argument(
        "--max-connections-per-ip",
        type=int,
        help="connections one source address may hold per port (default 1024, 0: no cap)",
    )
    p.add_argument(
        "--send-queue-wait-ms",
        type=int,
        help="a send waiting in line this long is answered SYSTEM_BUSY (default 200, 0: no bound)",
    )
    p.add_argument(
        "--queue-wait-ms",
        type=int,
        help="the same for other requests (default 5000, 0: no bound)",
    )
    p.add_argument(
        "--disk-full-ratio",
        type=float,
        help="refuse writes at this disk usage or more (default 0.90, 0: never)",
    )
    p.add_argument(
        "--broker-id",
        type=int,
        help="0: master (default); 1 and up: a replica of the master of --broker-name",
    )
    p.add_argument(
        "--ha-port",
        type=int,
        help="HA port replicas connect to (default: --port + 1; 0 = any free port)",
    )
    p.add_argument(
        "--ha-master-addr",
        help="a replica's master HA address HOST:PORT (default: learnt from the name servers)",
    )
    p.add_argument(
        "--replication",
        choices=("async", "sync"),
        help="sync: SEND_OK once --min-insync-replicas copies hold a message (default async)",
    )
    p.add_argument(
        "--min-insync-replicas",
        type=int,
        help="copies a sync send needs, the master included (default 1)",
    )
    p.add_argument(
        "--replica-timeout-ms",
        type=int,
        help="a sync send waits this long for its replicas: FLUSH_SLAVE_TIMEOUT (default 3000)",
    )
    p.add_argument(
        "--etcd-endpoints",
        help="automatic failover through these etcd members: http://h1:2379,http://h2:2379 "
        "(default: none, manual promotion only)",
    )
    p.add_argument(
        "--etcd-lease-ttl-s",
        type=int,
        help="the master lease's TTL in seconds: takeover after about this; fenced at half "
        "(default 3)",
    )
    p.add_argument("--config", help="broker.toml with the same settings")
    return p


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> BrokerConfig:
    """Parse the command line and merge every source.

    Raises:
        ConfigError: a setting has an unusable value (an invalid ACL file included).
    """
    args = vars(build_parser().parse_args(argv))
    toml = args.pop("config")
    config = from_sources(
        toml_path=Path(toml) if toml else None,
        env=os.environ if env is None else env,
        flags=args,
    )
    check_acl_file(config.acl_file)
    return config


def check_acl_file(path: Path | None) -> None:
    """Read the ACL file once, so that a command line naming a bad one fails at once.

    Raises:
        ConfigError: the file is not a valid ``plain_acl.yml``.
    """
    if path is not None:
        try:
            load_rules(path)
        except AclFileError as exc:
            raise ConfigError(f"acl_file: {exc}") from None
