"""Broker settings: defaults < TOML < environment < flags, and clear errors
(docs/design.md §9-10)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.__main__ import main
from broker.config import BrokerConfig, ConfigError, from_sources, load

#: Every flag of docs/design.md §10's ``python -m broker`` command line.
DESIGN_FLAGS = (
    "--host",
    "--gc-full-collect-s",
    "--gil-switch-ms",
    "--max-unsent-bytes-per-connection",
    "--port",
    "--data-dir",
    "--broker-name",
    "--cluster",
    "--advertise",
    "--namesrv-addr",
    "--wake-mode",
    "--retry-naming",
    "--flush",
    "--metrics-dir",
    "--config",
    "--grpc-port",
    "--tls-cert",
    "--tls-key",
    "--broker-id",
    "--ha-port",
    "--ha-master-addr",
    "--replication",
    "--min-insync-replicas",
    "--replica-timeout-ms",
)


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    return path


def test_defaults_follow_design_and_rocketmq() -> None:
    config = from_sources(env={})
    assert config == BrokerConfig()
    assert (config.host, config.port) == ("127.0.0.1", 10911)
    assert config.data_dir == Path("./data")
    assert (config.broker_name, config.cluster) == ("broker-a", "DefaultCluster")
    assert (config.wake_mode, config.retry_naming, config.flush) == ("targeted", "v2", "async")
    assert config.advertise is None and config.namesrv_addr is None
    assert config.max_frame_size == 16 * 1024 * 1024
    # The gRPC front end on the proxy's port, a self-signed certificate for TLS clients.
    assert config.grpc_port == 8081 and config.tls_cert is None and config.tls_key is None
    assert load([], env={}) == config


def test_grpc_port_any_free_or_off_and_tls_files_go_together(tmp_path: Path) -> None:
    assert load(["--grpc-port", "0"], env={}).grpc_port == 0
    assert load(["--grpc-port", "off"], env={}).grpc_port is None
    assert load([], env={"TRIMQ_GRPC_PORT": "OFF"}).grpc_port is None
    assert load([], env={"TRIMQ_GRPC_PORT": "9081"}).grpc_port == 9081
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    config = load(["--tls-cert", str(cert), "--tls-key", str(key)], env={})
    assert (config.tls_cert, config.tls_key) == (cert, key)
    with pytest.raises(ConfigError, match="tls_cert and tls_key go together"):
        load(["--tls-cert", str(cert)], env={})
    with pytest.raises(ConfigError, match="grpc_port"):
        load(["--grpc-port", "70000"], env={})


def test_toml_overrides_defaults_env_overrides_toml_flags_override_env(tmp_path: Path) -> None:
    toml = write_toml(
        tmp_path,
        """
        port = 1111
        broker-name = "from-toml"
        cluster = "TomlCluster"
        wake_mode = "topic"
        flush = "sync"
        data_dir = "/var/lib/trimq"
        auto_create_topic = false
        flush_interval_s = 0.25
        """,
    )
    env = {
        "TRIMQ_PORT": "2222",
        "TRIMQ_BROKER_NAME": "from-env",
        "TRIMQ_WAKE_MODE": "none",
        "TRIMQ_MAX_FRAME_SIZE": "65536",
        "UNRELATED": "ignored",
    }
    flags: dict[str, object] = {"port": 3333, "wake_mode": None, "retry_naming": "v1"}

    only_toml = from_sources(toml_path=toml, env={})
    assert only_toml.port == 1111 and only_toml.broker_name == "from-toml"
    assert only_toml.cluster == "TomlCluster" and only_toml.wake_mode == "topic"
    assert only_toml.flush == "sync" and only_toml.data_dir == Path("/var/lib/trimq")
    assert only_toml.auto_create_topic is False and only_toml.flush_interval_s == 0.25

    with_env = from_sources(toml_path=toml, env=env)
    assert (with_env.port, with_env.broker_name, with_env.wake_mode) == (2222, "from-env", "none")
    assert with_env.max_frame_size == 65536
    assert with_env.cluster == "TomlCluster"  # not in the environment: TOML shows through

    merged = from_sources(toml_path=toml, env=env, flags=flags)
    assert merged.port == 3333  # flag beats env and TOML
    assert merged.wake_mode == "none"  # a flag set to None is absent
    assert merged.retry_naming == "v1"
    assert merged.broker_name == "from-env" and merged.cluster == "TomlCluster"
    assert merged.host == "127.0.0.1"  # nowhere: the default


def test_load_parses_the_command_line_over_env_and_toml(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, 'port = 1111\nhost = "0.0.0.0"\nmetrics_dir = "/m"\n')
    env = {"TRIMQ_PORT": "2222", "TRIMQ_CLUSTER": "EnvCluster"}
    argv = [
        "--config",
        str(toml),
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "data"),
        "--broker-name",
        "broker-b",
        "--advertise",
        "10.0.0.1:10911",
        "--namesrv-addr",
        "h1:9876;h2:9876",
        "--wake-mode",
        "topic",
        "--retry-naming",
        "v1",
        "--flush",
        "sync",
    ]
    config = load(argv, env=env)
    assert config.port == 0
    assert config.host == "0.0.0.0"
    assert config.metrics_dir == Path("/m")
    assert config.data_dir == tmp_path / "data"
    assert config.cluster == "EnvCluster"
    assert config.broker_name == "broker-b"
    assert config.namesrv_addr == "h1:9876;h2:9876"
    assert (config.wake_mode, config.retry_naming, config.flush) == ("topic", "v1", "sync")
    assert config.advertised(4321) == "10.0.0.1:10911"
    assert BrokerConfig(host="0.0.0.0").advertised(4321) == "127.0.0.1:4321"


def test_unknown_toml_key_is_named(tmp_path: Path) -> None:
    toml = write_toml(tmp_path, 'port = 1\nwake_moed = "topic"\n')
    with pytest.raises(ConfigError, match="wake_moed") as info:
        from_sources(toml_path=toml, env={})
    assert str(toml) in str(info.value)


def test_unreadable_toml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"broker\.toml"):
        from_sources(toml_path=write_toml(tmp_path, "port = = 1\n"), env={})
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        from_sources(toml_path=tmp_path / "missing.toml", env={})


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TRIMQ_PORT": "x"}, "port"),
        ({"TRIMQ_PORT": "70000"}, "70000"),
        ({"TRIMQ_PORT": "-1"}, "-1"),
        ({"TRIMQ_WAKE_MODE": "bad"}, "wake_mode"),
        ({"TRIMQ_RETRY_NAMING": "v3"}, "retry_naming"),
        ({"TRIMQ_FLUSH": "sometimes"}, "flush"),
        ({"TRIMQ_AUTO_CREATE_TOPIC": "maybe"}, "auto_create_topic"),
        ({"TRIMQ_FLUSH_INTERVAL_S": "soon"}, "flush_interval_s"),
    ],
)
def test_bad_values_are_config_errors_naming_the_setting(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        from_sources(env=env)


def test_bad_values_from_toml_and_flags(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="wake_mode"):
        from_sources(toml_path=write_toml(tmp_path, 'wake_mode = "bad"\n'), env={})
    with pytest.raises(ConfigError, match="port"):
        from_sources(env={}, flags={"port": "x"})
    with pytest.raises(ConfigError, match="wake_mode"):
        from_sources(env={}, flags={"wake_mode": "bad"})
    # argparse itself refuses what it can check (exit status 2, like any usage error).
    for argv in (["--port", "x"], ["--wake-mode", "bad"], ["--flush", "never"]):
        with pytest.raises(SystemExit) as info:
            load(argv, env={})
        assert info.value.code == 2


def test_booleans_accept_the_usual_spellings() -> None:
    for text, value in [("true", True), ("1", True), ("on", True), ("no", False), ("0", False)]:
        assert from_sources(env={"TRIMQ_AUTO_CREATE_TOPIC": text}).auto_create_topic is value


def test_main_reports_a_config_error_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIMQ_WAKE_MODE", "bad")
    assert main(["--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trimq-broker:") and "wake_mode" in err


def test_help_lists_every_design_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "broker", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for flag in DESIGN_FLAGS:
        assert flag in result.stdout, flag
    for choices in ("targeted,topic,none", "v2,v1", "async,sync"):
        assert choices in result.stdout


def test_replication_settings_default_to_a_lone_async_master() -> None:
    config = load([], env={})
    assert (config.broker_id, config.ha_port, config.ha_master_addr) == (0, None, None)
    assert (config.replication, config.min_insync_replicas, config.replica_timeout_ms) == (
        "async", 1, 3000,
    )  # fmt: skip
    assert not config.is_replica and not config.store_config(10911).replica
    replica = load(
        ["--broker-id", "2", "--ha-master-addr", "10.0.0.1:10912", "--ha-port", "0"], env={}
    )
    assert replica.is_replica and replica.store_config(10911).replica
    assert (replica.broker_id, replica.ha_port) == (2, 0)
    sync = load(["--replication", "sync", "--min-insync-replicas", "2",
                 "--replica-timeout-ms", "500"], env={})  # fmt: skip
    assert (sync.replication, sync.min_insync_replicas, sync.replica_timeout_ms) == (
        "sync", 2, 500,
    )  # fmt: skip
    # A sync send waits for its replicas: it gets a task of its own, as in SYNC flush mode.
    assert sync.stores_wait and not config.stores_wait
    assert load(["--flush", "sync"], env={}).stores_wait


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"TRIMQ_BROKER_ID": "-1"}, "broker_id"),
        ({"TRIMQ_BROKER_ID": "1"}, "ha_master_addr or namesrv_addr"),
        ({"TRIMQ_REPLICATION": "semi"}, "replication"),
        ({"TRIMQ_MIN_INSYNC_REPLICAS": "0"}, "min_insync_replicas"),
        ({"TRIMQ_REPLICA_TIMEOUT_MS": "0"}, "replica_timeout_ms"),
        ({"TRIMQ_HA_PORT": "70000"}, "ha_port"),
        ({"TRIMQ_HA_MASTER_ADDR": "nohost"}, "ha_master_addr"),
    ],
)
def test_bad_replication_settings_are_named(settings: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load([], env=settings)
