"""Name-server settings: defaults < TOML file < environment (``TRIMQ_NAMESRV_<SETTING>``) <
flags, merged like the broker's (``broker.config.merge_sources``).

The environment prefix differs from the broker's ``TRIMQ_`` so that a shell or a compose
file can configure both processes without one's ``TRIMQ_PORT`` moving the other.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.config import TLS_MODES, ConfigError, check_acl_file, merge_sources

ENV_PREFIX = "TRIMQ_NAMESRV_"


@dataclass(frozen=True, slots=True)
class NamesrvConfig:
    """Everything a name-server process needs."""

    host: str = "127.0.0.1"
    port: int = 9876
    #: A broker silent this long is dropped (RocketMQ BROKER_CHANNEL_EXPIRED_TIME, 120 s).
    broker_expire_s: float = 120.0
    #: How often silent brokers are looked for (RocketMQ scanNotActiveBrokerInterval, 5 s).
    scan_interval_s: float = 5.0
    #: Where the KV config is kept (RocketMQ's kvConfig.json); None: in memory only.
    kv_config_path: Path | None = None
    max_connections: int = 4096
    #: Connections from one source address beyond which new ones are closed (0: no cap).
    max_connections_per_ip: int = 1024
    max_frame_size: int = 16 * 1024 * 1024
    #: Replies queued per connection before handlers wait for the socket (back-pressure).
    write_queue: int = 256
    #: ACL on (docs/security.md): broker registrations and KV-config changes need
    #: credentials from this ``plain_acl.yml`` file (reloaded when it changes); route
    #: queries stay open. None = off.
    acl_file: Path | None = None
    #: TLS as on a broker's ports (``broker.tls``): permissive (TLS and plaintext by the
    #: first byte), enforcing or disabled; the certificate is self-signed without these.
    tls_mode: str = "permissive"
    tls_cert: Path | None = None
    tls_key: Path | None = None

    def __post_init__(self) -> None:
        if self.tls_mode not in TLS_MODES:
            raise ConfigError(f"tls_mode must be one of {TLS_MODES}, not {self.tls_mode!r}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("tls_cert and tls_key go together")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port {self.port} is outside 0..65535")
        for name in ("broker_expire_s", "scan_interval_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, not {getattr(self, name)}")


def build_parser() -> argparse.ArgumentParser:
    """The name server's flags (all default to None so that lower sources show through)."""
    p = argparse.ArgumentParser(prog="trimq-namesrv", description="trimq name server")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port, 0 = any free port (default 9876)")
    p.add_argument("--broker-expire-s", type=float,
                   help="drop a broker silent this long (default 120)")  # fmt: skip
    p.add_argument("--scan-interval-s", type=float,
                   help="how often silent brokers are looked for (default 5)")  # fmt: skip
    p.add_argument(
        "--max-connections-per-ip",
        type=int,
        help="connections one source address may hold (default 1024, 0: no cap)",
    )
    p.add_argument("--kv-config-path", help="file for the KV config (default: memory only)")
    p.add_argument(
        "--acl-file",
        help="ACL on: broker registrations need credentials from this ACL file (1.0 or 2.0)",
    )
    p.add_argument(
        "--tls-mode",
        choices=TLS_MODES,
        help="TLS: permissive (default: TLS and plaintext), enforcing, disabled",
    )
    p.add_argument("--tls-cert", help="PEM certificate for TLS")
    p.add_argument("--tls-key", help="PEM key (unencrypted) of --tls-cert")
    p.add_argument("--config", help="namesrv.toml with the same settings")
    return p


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> NamesrvConfig:
    """Parse the command line and merge every source.

    Raises:
        ConfigError: a setting has an unusable value.
    """
    args = vars(build_parser().parse_args(argv))
    toml = args.pop("config")
    config = merge_sources(
        NamesrvConfig,
        toml_path=Path(toml) if toml else None,
        env=os.environ if env is None else env,
        flags=args,
        env_prefix=ENV_PREFIX,
    )
    check_acl_file(config.acl_file)
    return config
