"""``--etcd-endpoints`` and ``--etcd-lease-ttl-s`` (docs/design.md §10, docs/ha.md)."""

from __future__ import annotations

import pytest

from broker.config import ConfigError, load


def test_flags() -> None:
    config = load(
        [
            "--broker-id", "1",
            "--etcd-endpoints", "http://127.0.0.1:2379,http://127.0.0.1:22379",
            "--etcd-lease-ttl-s", "5",
        ],
        env={},
    )  # fmt: skip
    assert config.etcd_endpoints == "http://127.0.0.1:2379,http://127.0.0.1:22379"
    assert config.etcd_lease_ttl_s == 5
    assert config.is_replica  # etcd names its master: no --ha-master-addr needed
    defaults = load([], env={})
    assert defaults.etcd_endpoints is None and defaults.etcd_lease_ttl_s == 3


def test_environment() -> None:
    config = load([], env={"TRIMQ_ETCD_ENDPOINTS": "10.0.0.1:2379", "TRIMQ_ETCD_LEASE_TTL_S": "4"})
    assert config.etcd_endpoints == "10.0.0.1:2379" and config.etcd_lease_ttl_s == 4


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--etcd-endpoints", "https://h:2379"], "TLS"),
        (["--etcd-endpoints", "http://h"], "HOST:PORT"),
        (["--etcd-lease-ttl-s", "1"], "at least 2"),
        (["--broker-id", "1"], "ha_master_addr or namesrv_addr (or etcd_endpoints)"),
    ],
)
def test_bad_settings_are_named(args: list[str], words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load(args, env={})
