"""Epoch histories (broker/ha/epoch.py): the common point of two logs, and the durable file;
the confirmed offset's file (broker/ha/confirm.py). docs/design.md §13."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.ha.confirm import ConfirmedOffset
from broker.ha.epoch import EpochEntry, EpochHistory, common_point

E = EpochEntry


@pytest.mark.parametrize(
    ("local", "local_end", "master", "master_end", "point"),
    [
        # Behind on the same epoch: nothing to cut.
        ([E(1, 0)], 50, [E(1, 0)], 100, 50),
        # An old master's tail in epoch 1 past where epoch 2 began on the new master.
        ([E(1, 0)], 150, [E(1, 0), E(2, 100)], 180, 100),
        # The replica followed epoch 2 too, then the old master of epoch 2 wrote on alone;
        # epoch 3 began at 130 elsewhere.
        ([E(1, 0), E(2, 100)], 160, [E(1, 0), E(2, 100), E(3, 130)], 200, 130),
        # Epoch 2 at another start on each side: back to the end of epoch 1.
        ([E(1, 0), E(2, 120)], 160, [E(1, 0), E(2, 100)], 200, 100),
        # A local epoch the master never had (promoted, then deposed).
        ([E(1, 0), E(4, 90)], 95, [E(1, 0), E(3, 80)], 120, 80),
        # Nothing shared, or an empty replica: from 0.
        ([E(7, 0)], 40, [E(1, 0)], 100, 0),
        ([], 0, [E(1, 0), E(2, 30)], 100, 0),
        # A replica ahead inside the master's only epoch (the master lost its tail).
        ([E(1, 0)], 120, [E(1, 0)], 100, 100),
    ],
)
def test_common_point(
    local: list[EpochEntry], local_end: int, master: list[EpochEntry], master_end: int, point: int
) -> None:
    assert common_point(local, local_end, master, master_end) == point


def test_a_master_writes_its_first_epoch_at_once_and_a_replica_knows_none(tmp_path: Path) -> None:
    path = tmp_path / "config" / "haEpoch"
    replica = EpochHistory(path, master=False)
    assert (replica.current, replica.entries) == (0, ())
    assert not path.exists()
    master = EpochHistory(path, master=True)
    assert (master.current, master.entries) == (1, (E(1, 0),))
    again = EpochHistory(path, master=False)  # what a restart as a replica finds
    assert (again.current, again.entries) == (1, (E(1, 0),))


def test_begin_raise_and_adopt_are_durable(tmp_path: Path) -> None:
    path = tmp_path / "haEpoch"
    history = EpochHistory(path, master=True)
    history.begin(2, 500)
    with pytest.raises(ValueError, match="not newer"):
        history.begin(2, 600)
    history.raise_to(1)
    assert EpochHistory(path, master=False).entries == (E(1, 0), E(2, 500))
    replica = EpochHistory(tmp_path / "r", master=False)
    master = (E(1, 0), E(2, 500), E(3, 900))
    replica.adopt(master, 700)  # epoch 3's bytes are not here yet
    replica.raise_to(3)
    reloaded = EpochHistory(tmp_path / "r", master=False)
    assert (reloaded.current, reloaded.entries) == (3, (E(1, 0), E(2, 500)))
    reloaded.adopt(master, 901)
    assert EpochHistory(tmp_path / "r", master=False).entries == master


def test_a_one_integer_file_of_earlier_builds_reads_as_the_first_epoch(tmp_path: Path) -> None:
    path = tmp_path / "haEpoch"
    path.write_text("2\n")
    history = EpochHistory(path, master=False)
    assert (history.current, history.entries) == (2, (E(1, 0),))
    path.write_text('{"fence": 2, "history": [[2, 0], [1, 5]]}')
    with pytest.raises(ValueError, match="rise"):
        EpochHistory(path, master=False)
    path.write_text("{")
    with pytest.raises(ValueError, match="not an epoch history"):
        EpochHistory(path, master=False)


def test_the_confirmed_offset_never_goes_back_but_is_cut_with_the_log(tmp_path: Path) -> None:
    path = tmp_path / "haConfirmed"
    confirmed = ConfirmedOffset(path)
    assert confirmed.value == 0
    assert confirmed.advance(500) and not confirmed.advance(400)
    confirmed.before_checkpoint()()
    assert ConfirmedOffset(path).value == 500
    confirmed.cut_to(300)  # a diverged tail cut: the old master's confirmations go with it
    assert confirmed.value == 300
    confirmed.before_checkpoint()()
    assert ConfirmedOffset(path).value == 300
