"""``trimq-admin updateSubGroup`` / ``deleteSubGroup`` / ``subGroupList`` against a real broker
thread: what the broker ends up with, ``--json``, and the usage errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from client.admin import main
from tests.client.harness import BrokerThread, broker_thread
from tests.client.test_admin import Cli

pytestmark = pytest.mark.integration

GROUP = "AdminFifoG"


@pytest.fixture(scope="module")
def group_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    with broker_thread(tmp_path_factory.mktemp("admin-groups") / "broker") as running:
        yield running


@pytest.fixture
def cli(group_broker: BrokerThread, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(group_broker.address, capsys)


def test_sub_group_lifecycle(cli: Cli, group_broker: BrokerThread) -> None:
    """Create an orderly group, change only its retry limit (the rest stays), list it,
    delete it."""
    assert group_broker.handle is not None
    groups = group_broker.handle.broker.groups
    out = cli.ok("updateSubGroup", "-g", GROUP, "-o", "true", "-r", "3", "-b", group_broker.address)
    assert f"create subscription group to {group_broker.address} success." in out
    assert f"SubscriptionGroupConfig [groupName={GROUP}, consumeEnable=true" in out
    assert "consumeMessageOrderly=true, retryQueueNums=1, retryMaxTimes=3" in out
    assert groups.orderly(GROUP) and groups.retry_max_times(GROUP) == 3

    doc = cli.json("updateSubGroup", "-g", GROUP, "-r", "5")  # every broker: just this one
    (done,) = doc["brokers"]
    assert done["brokerAddr"] == group_broker.address and done["brokerName"] == "broker-a"
    config = done["subscriptionGroupConfig"]
    assert config["consumeMessageOrderly"] is True and config["retryMaxTimes"] == 5
    assert groups.orderly(GROUP) and groups.retry_max_times(GROUP) == 5

    cli.ok("updateSubGroup", "-g", "AdminPlainG", "-s", "false")
    listed = cli.json("subGroupList")
    assert [(g["groupName"], g["consumeMessageOrderly"]) for g in listed] == [
        ("AdminFifoG", True),
        ("AdminPlainG", False),
    ]
    assert listed[1]["consumeEnable"] is False and listed[1]["brokerName"] == "broker-a"
    table = cli.ok("subGroupList", "-c", "DefaultCluster").splitlines()
    assert table[0].split() == ["#Broker", "Name", "#Group", "#Orderly", "#Retry", "Max",
                                "Times", "#Consume", "Enable", "#Retry", "Queues"]  # fmt: skip
    assert table[1].split() == ["broker-a", GROUP, "true", "5", "true", "1"]

    out = cli.ok("deleteSubGroup", "-g", GROUP, "-r", "true")
    assert f"delete subscription group [{GROUP}] from broker [{group_broker.address}]" in out
    assert not groups.orderly(GROUP) and groups.names() == ["AdminPlainG"]
    doc = cli.json("deleteSubGroup", "-g", "AdminPlainG", "-b", "broker-a")
    assert doc == {"groupName": "AdminPlainG", "brokers": [group_broker.address],
                   "removeOffset": False}  # fmt: skip
    assert cli.json("subGroupList") == []


def test_refused_names_and_unknown_brokers(cli: Cli) -> None:
    assert "INVALID_PARAMETER" in cli.fails("updateSubGroup", "-g", "bad group")
    assert "broker 'nope' does not exist" in cli.fails("updateSubGroup", "-g", "g", "-b", "nope")
    assert "cluster 'Nope' does not exist" in cli.fails("subGroupList", "-c", "Nope")


@pytest.mark.parametrize(
    "argv",
    [
        ["updateSubGroup"],  # -g missing
        ["updateSubGroup", "-g", "g", "-o", "maybe"],
        ["updateSubGroup", "-g", "g", "-r", "-1"],
        ["updateSubGroup", "-g", "g", "-r", "many"],
        ["deleteSubGroup"],
        ["deleteSubGroup", "-g", "g", "-r", "perhaps"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["-n", "127.0.0.1:1", *argv])
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err
