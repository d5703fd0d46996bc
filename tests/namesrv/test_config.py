"""Name-server settings and the broker's name-server settings; the expiry scan on trio's
(virtual) clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from broker.config import BrokerConfig, ConfigError
from broker.config import load as load_broker
from broker.namesrv.app import scan_expired
from broker.namesrv.config import NamesrvConfig, load
from broker.namesrv.context import NamesrvContext
from broker.namesrv.routes import Registration, RouteTable


def test_defaults_follow_rocketmq() -> None:
    config = NamesrvConfig()
    assert (config.port, config.broker_expire_s, config.scan_interval_s) == (9876, 120.0, 5.0)
    broker = BrokerConfig()
    assert (broker.register_interval_s, broker.register_timeout_s) == (30.0, 6.0)


def test_sources_merge_flags_over_env_over_file(tmp_path: Path) -> None:
    toml = tmp_path / "namesrv.toml"
    toml.write_text('port = 1111\nbroker_expire_s = 30\nkv_config_path = "kv.json"\n')
    env = {"TRIMQ_NAMESRV_PORT": "2222", "TRIMQ_PORT": "3333"}  # the broker's is ignored
    config = load(["--config", str(toml), "--scan-interval-s", "0.5"], env=env)
    assert (config.port, config.broker_expire_s, config.scan_interval_s) == (2222, 30.0, 0.5)
    assert config.kv_config_path == Path("kv.json")
    assert load(["--port", "0"], env=env).port == 0


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--broker-expire-s", "0"], "broker_expire_s must be positive"),
        (["--port", "70000"], "outside"),
    ],
)
def test_bad_namesrv_settings_name_the_setting(argv: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load(argv, env={})


def test_broker_namesrv_settings() -> None:
    config = load_broker(
        ["--namesrv-addr", " h1:9876; h2:9877 ;", "--register-interval-s", "0.5"],
        env={"TRIMQ_REGISTER_TIMEOUT_S": "2"},
    )
    assert config.namesrv_addrs() == ["h1:9876", "h2:9877"]
    assert (config.register_interval_s, config.register_timeout_s) == (0.5, 2.0)
    assert BrokerConfig().namesrv_addrs() == []
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        load_broker(["--namesrv-addr", "h1:9876;nope"], env={})
    with pytest.raises(ConfigError, match="register_interval_s must be positive"):
        load_broker(["--register-interval-s", "-1"], env={})


async def test_the_scan_drops_a_silent_broker_within_one_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = NamesrvConfig(broker_expire_s=120.0, scan_interval_s=5.0)
    ctx = NamesrvContext(config, RouteTable(expire_s=config.broker_expire_s))
    ctx.routes.register(Registration("c", "127.0.0.1:10911", "b", 0, topics={}), ctx.now())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(scan_expired, ctx)
        await trio.sleep(119.9)
        assert list(ctx.routes.live()) == ["127.0.0.1:10911"]
        await trio.sleep(5.5)  # expired at 120 s: seen by a scan at most 5 s later
        assert ctx.routes.live() == {}
        nursery.cancel_scope.cancel()
