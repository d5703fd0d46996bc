"""Which role a broker takes at start-up: its flags, or the role its data says it holds
(``<data-dir>/config/haRole``; docs/design.md §13, "Role at restart").

``--broker-id`` says what a broker *starts* as; a promotion (``trimq-admin promoteReplica``,
or an election) is a later decision that the data directory must remember, or a restart
with the original flags undoes it. ``config/haRole`` records the epoch this broker last
served as master under and whether a promotion made it so; it is written before the epoch
history (:class:`~broker.ha.epoch.EpochHistory`) and counts only when the history agrees
(its fence is that epoch, or newer), so a crash between the two writes leaves the broker as
it was. The rules (:func:`resolve_role`):

* **A promotion wins over ``--broker-id`` ≥ 1** while no newer epoch was accepted since: a
  promoted broker restarted with its replica flags comes back as master, id 0, same epoch.
  Its replica flags point at the deposed master, whose stream it would refuse (older
  epoch): as a replica it would leave the group without a master. To demote it on purpose,
  stop it and delete ``config/haRole``.
* **A broker that knows a newer master may not start as master**: ``--broker-id 0`` on a
  data directory whose fence is newer than the epoch it last served as master under (a
  deposed master that followed the new one since), or that never served as master (a
  replica's data: promote it with ``promoteReplica``, which takes a new epoch), is refused
  with :class:`RoleConflict` — never a second master silently. A deposed master that never
  heard of its successor cannot know it; fencing it is the election's job (Phase B).

With ``--etcd-endpoints`` none of this applies: the election decides who is master.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from broker.config import BrokerConfig
from broker.ha.epoch import FIRST_EPOCH, EpochHistory
from broker.logs import get_logger
from broker.store.files import atomic_write, read_optional

_log = get_logger("roles")

ROLE_FILE = "haRole"
EPOCH_FILE = "haEpoch"


class RoleConflict(Exception):
    """The flags ask for a role the data directory forbids; the message says why and what
    to do."""


@dataclass(frozen=True, slots=True)
class RoleRecord:
    """The epoch this broker last served as master under, and whether a promotion (rather
    than ``--broker-id 0``) made it master."""

    master_epoch: int
    promoted: bool


def role_path(data_dir: Path) -> Path:
    return data_dir / "config" / ROLE_FILE


def load_role(path: Path) -> RoleRecord | None:
    """The record at ``path`` (None without one).

    Raises:
        RoleConflict: the file is unreadable — the operator must look, not the broker guess.
    """
    data = read_optional(path)
    if data is None:
        return None
    try:
        obj = json.loads(data)
        epoch, promoted = obj["master_epoch"], obj["promoted"]
    except (ValueError, KeyError, TypeError) as exc:
        raise RoleConflict(f"{path} is not a role record ({exc})") from None
    if type(epoch) is not int or type(promoted) is not bool:
        raise RoleConflict(f"{path} is not a role record")
    return RoleRecord(epoch, promoted)


def save_role(path: Path, record: RoleRecord) -> None:
    """Write ``record`` atomically and durably (before the epoch history that it needs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"master_epoch": record.master_epoch, "promoted": record.promoted}
    atomic_write(path, (json.dumps(payload) + "\n").encode())


def resolve_role(config: BrokerConfig) -> BrokerConfig:
    """``config`` with the role the data directory says (see the module docstring): the
    same object when the flags rule. A broker that starts as master records it (a master
    epoch not from a promotion) before its epoch history is written.

    Raises:
        RoleConflict: ``--broker-id 0`` on the data of a broker that knows a newer master
            or never was one; an unreadable role record or history.
    """
    if config.etcd_endpoints:
        return config  # the election decides the role, and fences with its own epochs
    path = role_path(config.data_dir)
    history = _history(config.data_dir)
    record = None if history is None else valid_record(load_role(path), history)
    if config.is_replica:
        if history is None or not _promoted_last(record, history):
            return config
        _log.warning("promoted earlier: starting as master, not as a replica",
                     epoch=history.current, broker_id_flag=config.broker_id,
                     role_file=str(path))  # fmt: skip
        return dataclasses.replace(config, broker_id=0)
    if history is not None and history.current > 0:
        _check_master(config, record, history)
    epoch = history.current if history is not None and history.current > 0 else FIRST_EPOCH
    if record is None or record.master_epoch != epoch:
        save_role(path, RoleRecord(epoch, promoted=False))
    return config


def _promoted_last(record: RoleRecord | None, history: EpochHistory) -> bool:
    """Whether a promotion made this broker master under the newest epoch it knows."""
    return record is not None and record.promoted and record.master_epoch == history.current


def _history(data_dir: Path) -> EpochHistory | None:
    path = data_dir / "config" / EPOCH_FILE
    if read_optional(path) is None:
        return None  # a new data directory (or a first master's of an earlier build)
    try:
        return EpochHistory(path, master=False)
    except ValueError as exc:
        raise RoleConflict(str(exc)) from None


def valid_record(record: RoleRecord | None, history: EpochHistory) -> RoleRecord | None:
    """``record`` if the epoch history took its epoch too (a crash between the two writes
    leaves a record ahead of the history: it does not count)."""
    if record is None or history.current < record.master_epoch:
        return None
    if all(entry.epoch != record.master_epoch for entry in history.entries):
        return None
    return record


def _check_master(config: BrokerConfig, record: RoleRecord | None, history: EpochHistory) -> None:
    if record is None:
        raise RoleConflict(
            f"{config.data_dir} holds a replica's data (epoch {history.current} accepted, "
            "never master): starting it with --broker-id 0 could make a second master. "
            "Promote it with trimq-admin promoteReplica (a new epoch), or start it as a "
            "replica (--broker-id N with --ha-master-addr or --namesrv-addr)"
        )
    if record.master_epoch < history.current:
        raise RoleConflict(
            f"{config.data_dir}: this broker was master under epoch {record.master_epoch} "
            f"and has since followed a master of epoch {history.current}: starting it with "
            "--broker-id 0 could make a second master. Start it as a replica (--broker-id N "
            "with --ha-master-addr or --namesrv-addr), or promote it once it follows"
        )
