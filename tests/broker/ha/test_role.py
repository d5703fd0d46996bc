"""The role a broker takes at restart (docs/design.md §13, broker/ha/role.py): a promotion
recorded in the data directory wins over the replica's ``--broker-id``; a broker that
followed a newer master, or never was one, may not start as master (never a second master
silently). Real brokers on loopback; every wait is on a condition, bounded."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.app import BrokerHandle
from broker.config import BrokerConfig
from broker.ha.role import RoleConflict, resolve_role, role_path
from protocol.codes import ResponseCode
from tests.broker.client import open_broker, open_client
from tests.broker.ha.support import (
    NAME,
    follower,
    ha_addr,
    open_master,
    open_replica,
    send,
    wait_caught_up,
)
from tests.broker.ha.test_divergence import wait_ha_port

TEST_S = 90
TOPIC = "Roles"


def flags(data_dir: Path, broker_id: int) -> BrokerConfig:
    """What a restart with ``--broker-id broker_id`` asks for."""
    master = None if broker_id == 0 else "127.0.0.1:1"
    return BrokerConfig(
        host="127.0.0.1", port=0, data_dir=data_dir, broker_name=NAME, broker_id=broker_id,
        ha_master_addr=master,
    )  # fmt: skip


async def sent(port: int, key: str) -> int:
    async with open_client(port) as client:
        return (await send(client, TOPIC, key, key.encode())).code


async def test_a_promoted_replica_restarted_with_its_replica_flags_comes_back_as_master(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "a") as a:
            old_ha = ha_addr(a)
            async with open_replica(tmp_path / "b", old_ha) as b:
                assert await sent(a.port, "before") == ResponseCode.SUCCESS
                await wait_caught_up(a, b)
        async with open_replica(tmp_path / "b", old_ha) as b:
            assert b.broker.roles.promote() == 2
            assert await sent(b.port, "promoted") == ResponseCode.SUCCESS
        # The same flags again (--broker-id 1, the deposed master's HA address).
        async with open_broker_as(tmp_path / "b", broker_id=1, ha_master_addr=old_ha) as b:
            assert b.follower is None and not b.broker.roles.is_replica
            assert b.broker.roles.broker_id == 0
            assert b.broker.roles.epochs.current == 2  # the same reign: no new epoch
            await wait_ha_port(b)
            assert await sent(b.port, "after restart") == ResponseCode.SUCCESS
            # Its replicas follow it as before.
            async with open_replica(tmp_path / "c", ha_addr(b)) as c:
                await wait_caught_up(b, c)
                assert follower(c).statistics().epoch == 2


def open_broker_as(data_dir: Path, **settings: Any) -> AbstractAsyncContextManager[BrokerHandle]:
    """A broker with exactly these role flags (open_replica insists on a follower)."""
    return open_broker(data_dir, broker_name=NAME, ha_port=0, **settings)


async def test_a_deposed_master_that_followed_the_new_one_may_not_start_as_master(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "a") as a:
            old_ha = ha_addr(a)
            assert await sent(a.port, "first") == ResponseCode.SUCCESS
            async with open_replica(tmp_path / "b", old_ha) as b:
                await wait_caught_up(a, b)
        async with open_replica(tmp_path / "b", old_ha) as b:
            b.broker.roles.promote()
            assert await sent(b.port, "second") == ResponseCode.SUCCESS
            async with open_replica(tmp_path / "a", await wait_ha_port(b)) as a:
                await wait_caught_up(b, a)
                assert follower(a).statistics().epoch == 2
    assert resolve_role(flags(tmp_path / "a", 1)).broker_id == 1  # a replica: fine
    with pytest.raises(RoleConflict, match="followed a master of epoch 2"):
        resolve_role(flags(tmp_path / "a", 0))
    # The promoted one may start as master with either flag.
    assert resolve_role(flags(tmp_path / "b", 0)).broker_id == 0
    assert resolve_role(flags(tmp_path / "b", 1)).broker_id == 0


async def test_a_replicas_data_is_refused_as_a_master_and_a_half_written_promotion_ignored(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TEST_S):
        async with open_master(tmp_path / "a") as a:
            assert await sent(a.port, "x") == ResponseCode.SUCCESS
            async with open_replica(tmp_path / "b", ha_addr(a)) as b:
                await wait_caught_up(a, b)
    with pytest.raises(RoleConflict, match="replica's data"):
        resolve_role(flags(tmp_path / "b", 0))
    # A crash between the promotion's two writes: the record names epoch 2, the history
    # never took it — the promotion did not happen.
    role_path(tmp_path / "b").write_text(json.dumps({"master_epoch": 2, "promoted": True}))
    assert resolve_role(flags(tmp_path / "b", 1)).broker_id == 1
    # A master of a new data directory records itself; so does a master of older data.
    assert resolve_role(flags(tmp_path / "new", 0)).broker_id == 0
    assert json.loads(role_path(tmp_path / "new").read_text()) == {
        "master_epoch": 1,
        "promoted": False,
    }
    assert resolve_role(flags(tmp_path / "a", 0)).broker_id == 0
