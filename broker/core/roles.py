"""A broker's role in its group — master or replica — and manual promotion (docs/design.md
§13; RocketMQ 5's controller makes the same switch: ``ReplicasManager.changeToMaster``).

A replica becomes its group's master once, on an operator's request (``trimq-admin
promoteReplica``); never back (a deposed master is restarted as a replica). The switch is
one synchronous step on the trio thread, so no request sees half of it: the new epoch is
appended to the epoch history, starting at the log's end, and made durable first
(``config/haEpoch``: whatever streams under an older epoch is refused by the group's
replicas from then on, and a replica whose log runs past that start under an older epoch —
the old master's unreplicated tail — cuts it when it follows), then the store takes puts, sync
replication (if configured) counts this broker's own replicas, the timer service adopts the
delayed messages the old master streamed, and :attr:`RoleService.promoted` is set — the
front end then stops following, serves an HA port and registers as brokerId 0, and the
broker's own log writers (timers, revives, transaction check-backs) start. The promotion is
recorded in ``config/haRole`` (before the history): a restart with the replica's flags
comes back as master (:mod:`broker.ha.role`).

The pop engine adopts the in-flight table the old master mirrored to it (``META_POP``:
leases, cursors, orderly locks), fitted to the log it holds. What the promoted broker does
not have (not replicated yet): transaction bookkeeping. A master never truncates its own
log.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio

from broker.ha.acks import ReplicaSet, ReplicationPolicy
from broker.ha.confirm import ConfirmedOffset
from broker.ha.epoch import FIRST_EPOCH, EpochHistory
from broker.ha.role import RoleRecord, save_role
from broker.logs import get_logger
from broker.store.store import MessageStore
from protocol.codes import ResponseCode
from protocol.errors import BrokerError

_log = get_logger("roles")


class RoleService:
    """Master or replica, the epoch, and the one switch between them."""

    def __init__(
        self,
        store: MessageStore,
        replicas: ReplicaSet,
        epochs: EpochHistory,
        *,
        broker_id: int,
        master_policy: ReplicationPolicy,
        adopt_log: Callable[[], None],
        role_file: Path,
        confirmed: ConfirmedOffset,
    ) -> None:
        self.store = store
        self.replicas = replicas
        #: The newest epoch this broker accepted (a replica) or serves under (a master).
        self.epochs = epochs
        self._broker_id = broker_id
        #: Sync replication as this broker applies it once it is a master.
        self.master_policy = master_policy
        #: Takes over what the old master left for the broker's own writers (the timer
        #: service's delayed messages in the log, the pop engine's mirrored in-flight table).
        self.adopt_log = adopt_log
        #: Where a promotion is recorded, so that a restart keeps it (``config/haRole``).
        self.role_file = role_file
        #: A replica's confirmed offset: its store serves reads only up to it (§13).
        self.confirmed = confirmed
        if self.is_replica:
            store.confirm(confirmed.value)
        elif replicas.policy.needed:
            self._cap_reads_at_log_end()
        #: Set once a replica became the master (never on a broker started as master).
        self.promoted = trio.Event()

    def _cap_reads_at_log_end(self) -> None:
        """A sync master serves consumers only what ``--min-insync-replicas`` copies hold
        (docs/design.md §13): a record its replicas lack could be taken back by a failover,
        and a consumer that read it would then skip the new master's record at that
        offset. The log it holds now counts as held (what a promotion made the group's
        truth, or what a restart found); its replicas' acknowledgements move the cap on."""
        self.store.confirm(self.store.log.end)

    @property
    def is_replica(self) -> bool:
        """Whether this broker follows a master now."""
        return self.store.config.replica

    @property
    def broker_id(self) -> int:
        """The id it registers under: 0 once a master."""
        return self._broker_id

    def promote(self, epoch: int | None = None) -> int:
        """Make this replica the master of its group; returns its new epoch.

        Args:
            epoch: the new master epoch — an election passes its own (etcd: the revision
                of the master key); None: one past the newest this broker accepted (at
                least 2: past the first master's).

        Raises:
            BrokerError: ``ILLEGAL_OPERATION`` on a master, or for an ``epoch`` not newer
                than the newest accepted (nothing changes); ``SYSTEM_ERROR`` when the new
                epoch could not be made durable (still a replica).
        """
        if not self.is_replica:
            raise BrokerError(
                f"the broker is its group's master already (epoch {self.epochs.current})",
                code=ResponseCode.ILLEGAL_OPERATION,
            )
        # Past the first master's epoch even if no batch ever arrived (a replica that
        # accepted nothing yet holds 0): a deposed first master must be refused too.
        new = max(self.epochs.current, FIRST_EPOCH) + 1 if epoch is None else epoch
        if new <= max(self.epochs.current, FIRST_EPOCH):
            raise BrokerError(
                f"epoch {new} is not newer than {self.epochs.current}, the newest accepted",
                code=ResponseCode.ILLEGAL_OPERATION,
            )
        try:
            # The record first: it counts only once the history holds its epoch too.
            save_role(self.role_file, RoleRecord(new, promoted=True))
            self.epochs.begin(new, self.store.log.end)
        except OSError as exc:
            raise BrokerError(
                f"promotion refused: epoch {new} could not be stored: {exc}",
                code=ResponseCode.SYSTEM_ERROR,
            ) from None
        self.store.promote()
        self.replicas.policy = self.master_policy
        if self.master_policy.needed:
            self._cap_reads_at_log_end()
        self._broker_id = 0
        self.adopt_log()
        self.promoted.set()
        _log.warning("promoted to master", epoch=new, log_end=self.store.log.end)
        return new
