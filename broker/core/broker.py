"""``open_broker``: build one complete broker in dependency order, run its background tasks,
and close it along one ordered path.

Build order (each part gets everything it needs in its constructor; nothing is patched on
afterwards): the deadline loop (its ``poke`` goes to the timer and revive services), the
hubs, the store (recovered; its arrivals wake the hubs), topics, subscription groups, the
storage facade, the metrics writer, the timer service, the pop service (journal replayed),
then the core services over them. The :class:`Broker` is frozen: a front end holding one can
reach every service, and none of them is ever missing.

Background tasks live in two nurseries owned here: the outer one runs storage (flusher,
checkpoints with the timer and pop hooks, retention), the inner one the deadline loop and the
metrics writer. Leaving the ``async with`` is the one stop path: answer every parked pull and
pop (front ends see ``shutting_down`` and stop parking), cancel the inner tasks and wait for
them, then cancel storage, whose shielded ``finally`` flushes, runs the checkpoint hooks a
last time (timer progress, pop snapshot) and closes the store; then the pop journal is
closed. Front ends drain their own requests *before* leaving (see
:func:`broker.app.serve_broker`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import trio

from broker.clock import SYSTEM_CLOCK, Clock, DiskProbe, disk_used_ratio
from broker.config import BrokerConfig
from broker.core.admin import AdminService
from broker.core.clients import ClientRegistry, ClientStatistics
from broker.core.offsets import OffsetService
from broker.core.pop import PopService as CorePopService
from broker.core.pull import PullService
from broker.core.roles import RoleService
from broker.core.routes import BrokerIdentity, RouteService
from broker.core.send import SendPolicy, SendService
from broker.core.transactions import (
    TransactionPolicy,
    TransactionService,
    TransactionStatistics,
)
from broker.deadlines import DeadlineLoop
from broker.groups import SubscriptionGroupManager
from broker.ha.acks import ReplicaSet, ReplicationPolicy, ReplicationStatistics
from broker.ha.confirm import ConfirmedOffset
from broker.ha.epoch import EpochHistory
from broker.ha.role import role_path
from broker.locks import RebalanceLocks
from broker.logs import get_logger
from broker.longpoll import Arrivals, PullHub, PullHubStatistics
from broker.metrics import MetricsStatistics, MetricsWriter
from broker.offload import Offload, run_in_thread
from broker.pop.hub import PopHub, WakeMode
from broker.pop.service import PopEngine, PopStatistics
from broker.schedule import SCHEDULE_TOPIC
from broker.storage import Storage, StorageStatistics
from broker.store.store import MessageStore
from broker.store.tickets import StoreStatistics
from broker.timers import SCHEDULE_QUEUES, TimerService, TimerStatistics
from broker.topics import TopicManager
from protocol.naming import V1RetryNames

_log = get_logger("broker")


@dataclass(frozen=True, slots=True)
class BrokerStatistics:
    """What :meth:`Broker.statistics` reports: one snapshot per service."""

    store: StoreStatistics
    storage: StorageStatistics
    pop: PopStatistics
    pull_hub: PullHubStatistics
    timers: TimerStatistics
    transactions: TransactionStatistics
    metrics: MetricsStatistics
    clients: ClientStatistics
    replication: ReplicationStatistics


@dataclass(frozen=True, slots=True)
class Broker:
    """Every service of one running broker, fully built (see the module docstring)."""

    config: BrokerConfig
    clock: Clock
    #: ``host:port`` this broker puts into routes and records.
    address: str
    store: MessageStore
    storage: Storage
    topics: TopicManager
    #: Subscription-group configurations (orderly groups, retry limits).
    groups: SubscriptionGroupManager
    clients: ClientRegistry
    pull_hub: PullHub
    pop: PopEngine
    timers: TimerService
    metrics: MetricsWriter
    sends: SendService
    #: Half messages, their decisions and check-backs.
    transactions: TransactionService
    pulls: PullService
    pops: CorePopService
    offsets: OffsetService
    admin: AdminService
    routes: RouteService
    #: A master's replicas and their acknowledgements (none connect to a replica).
    replicas: ReplicaSet
    #: Master or replica, the epoch, and manual promotion.
    roles: RoleService
    #: Set when the broker stops: front ends answer parked requests and park no more.
    shutting_down: trio.Event
    #: Wall-clock time the broker started, epoch seconds (runtime info).
    started_at: float

    def statistics(self) -> BrokerStatistics:
        """A snapshot of every service's counters."""
        return BrokerStatistics(
            store=self.store.statistics(),
            storage=self.storage.statistics(),
            pop=self.pop.statistics(),
            pull_hub=self.pull_hub.statistics(),
            timers=self.timers.statistics(),
            transactions=self.transactions.statistics(),
            metrics=self.metrics.statistics(),
            clients=self.clients.statistics(),
            replication=self.replicas.statistics(),
        )

    def stop_parking(self) -> None:
        """The stop begins: set ``shutting_down`` and answer every parked pull and pop now
        (they see it and return; no request parks any more)."""
        self.shutting_down.set()
        self.pull_hub.wake_all()
        self.pop.hub.wake_all()


def _open_topics(config: BrokerConfig, store: MessageStore, clock: Clock) -> TopicManager:
    """The topic table, with every queue the store holds (a topic created before a crash
    that lost ``topics.json`` keeps its queues) and the schedule topic."""
    topics = TopicManager(
        config.data_dir / "config" / "topics.json",
        default_queue_nums=config.default_queue_nums,
        clock=clock,
    )
    for topic, queue_ids in store.topics().items():
        topics.ensure_queues(topic, max(queue_ids) + 1)
    topics.ensure_queues(SCHEDULE_TOPIC, SCHEDULE_QUEUES)
    return topics


def _open_groups(config: BrokerConfig, clock: Clock) -> SubscriptionGroupManager:
    """The subscription-group table (``config/subscriptionGroup.json``)."""
    return SubscriptionGroupManager(
        config.data_dir / "config" / "subscriptionGroup.json",
        default_retry_max_times=config.max_reconsume_times,
        clock=clock,
    )


def _open_pop(
    config: BrokerConfig,
    storage: Storage,
    topics: TopicManager,
    parts: tuple[PopHub, V1RetryNames, MetricsWriter, DeadlineLoop, SubscriptionGroupManager],
) -> PopEngine:
    """Recover the pop in-flight state (``<data-dir>/pop``) and build the pop service."""
    hub, v1_names, metrics, deadlines, groups = parts
    return PopEngine.open(
        config.data_dir / "pop",
        storage,
        topics,
        hub,
        broker_name=config.broker_name,
        retry_v2=config.retry_naming == "v2",
        max_reconsume=groups.retry_max_times,
        v1_names=v1_names,
        metrics=metrics,
        poke=deadlines.poke,
        clock_ms=deadlines.clock.now_ms,
        fsync=config.flush == "sync",
        snapshot_min_bytes=config.pop_snapshot_min_bytes,
    )


def _transaction_policy(config: BrokerConfig) -> TransactionPolicy:
    return TransactionPolicy(
        check_interval_ms=round(config.transaction_check_interval_s * 1000),
        immunity_ms=round(config.transaction_immunity_s * 1000),
        check_max=config.transaction_check_max,
    )


def _replication_policy(config: BrokerConfig, *, as_master: bool) -> ReplicationPolicy:
    return ReplicationPolicy(
        sync=config.replication == "sync" and as_master,
        min_insync_replicas=config.min_insync_replicas,
        timeout_s=config.replica_timeout_ms / 1000,
    )


def _roles(config: BrokerConfig, store: MessageStore, replicas: ReplicaSet,
           timers: TimerService, pop: PopEngine) -> RoleService:  # fmt: skip
    """The broker's role; its epochs in ``config/haEpoch`` (a master that never saw one
    serves epoch 1 from offset 0; a replica knows none until its master answers). On
    promotion the timer service and the pop engine take over what the old master left: the
    delayed messages in the log, the mirrored pop in-flight table."""

    def adopt() -> None:
        timers.adopt_log()
        pop.adopt_replicated()

    return RoleService(
        store,
        replicas,
        EpochHistory(config.data_dir / "config" / "haEpoch", master=not config.is_replica),
        broker_id=config.broker_id,
        master_policy=_replication_policy(config, as_master=True),
        adopt_log=adopt,
        role_file=role_path(config.data_dir),
        confirmed=ConfirmedOffset(config.data_dir / "config" / "haConfirmed"),
    )


def _confirm_reads(store: MessageStore, offset: int) -> None:
    """A sync master's replicas now all hold the log up to ``offset``: its consumers may
    read that far (docs/design.md §13, "Reads on a sync master"). Only forward: what was
    readable stays readable when a replica that is behind connects. (A replica's
    ``ReplicaSet`` needs no acknowledgements, so it never calls this.)"""
    limit = store.read_limit
    if limit is not None and offset > limit:
        store.confirm(offset)


async def _when_master(roles: RoleService, run: Callable[[], Awaitable[None]]) -> None:
    """Run the broker's own log writers on a master — on a replica once it is promoted
    (its log is the master's until then)."""
    if roles.is_replica:
        await roles.promoted.wait()
    await run()


def _send_policy(config: BrokerConfig, groups: SubscriptionGroupManager) -> SendPolicy:
    return SendPolicy(
        auto_create_topic=config.auto_create_topic,
        max_reconsume_times=config.max_reconsume_times,
        max_message_size=config.max_message_size,
        group_max_reconsume_times=groups.retry_max_times,
    )


@asynccontextmanager
async def open_broker(
    config: BrokerConfig,
    *,
    port: int,
    clock: Clock = SYSTEM_CLOCK,
    disk_probe: DiskProbe = disk_used_ratio,
    offload: Offload = run_in_thread,
) -> AsyncIterator[Broker]:
    """Open the store and every service of a broker whose front end listens on ``port``
    (it goes into records and routes), run the background tasks while the block runs, and
    close everything cleanly when it ends (see the module docstring). ``clock``,
    ``disk_probe`` and ``offload`` (where blocking file work runs) are injected so tests own
    time and the machine's state."""
    # The kernel's precise timer for the real clock; trio's timeouts for a test's clock.
    deadlines = DeadlineLoop(clock, precise=clock is SYSTEM_CLOCK)
    pull_hub = PullHub()
    v1_names = V1RetryNames()
    pop_hub = PopHub(WakeMode(config.wake_mode), v1_owner=v1_names.owner)
    store = MessageStore.open(
        config.store_config(port, clock=clock, disk_probe=disk_probe), Arrivals(pull_hub, pop_hub)
    )
    storage = Storage(store, offload)
    try:
        topics = _open_topics(config, store, clock)
        groups = _open_groups(config, clock)
        metrics = MetricsWriter(
            config.metrics_dir or config.data_dir / "metrics",
            broker=config.broker_name,
            wake_mode=lambda: pop_hub.wake_mode.value,
            clock_ms=clock.now_ms_f,
            offload=offload,
        )
        timers = TimerService(
            storage,
            topics,
            config.data_dir / "config" / "schedule.json",
            clock_ms=clock.now_ms,
            poke=deadlines.poke,
        )
        timers.load()
        pop = _open_pop(config, storage, topics, (pop_hub, v1_names, metrics, deadlines, groups))
    except BaseException:
        store.close()
        raise
    clients, shutting_down = ClientRegistry(topics, v1_names), trio.Event()
    transactions = TransactionService(
        _transaction_policy(config),
        storage,
        topics,
        timers,
        clients,
        clock,
        config.data_dir / "config" / "transactions.json",
        poke=deadlines.poke,
    )
    try:
        transactions.load()
    except BaseException:
        pop.close()
        store.close()
        raise
    offsets = OffsetService(store, topics, pop)
    address, started_at = config.advertised(port), clock.now_s()
    identity = BrokerIdentity(config.cluster, config.broker_name, address)
    replicas = ReplicaSet(
        _replication_policy(config, as_master=not config.is_replica),
        on_confirmed=partial(_confirm_reads, store),
    )
    roles = _roles(config, store, replicas, timers, pop)
    broker = Broker(
        config=config,
        clock=clock,
        address=address,
        store=store,
        storage=storage,
        topics=topics,
        groups=groups,
        clients=clients,
        pull_hub=pull_hub,
        pop=pop,
        timers=timers,
        metrics=metrics,
        sends=SendService(
            _send_policy(config, groups), topics, storage, timers, clock, transactions, replicas
        ),
        transactions=transactions,
        pulls=PullService(
            store,
            topics,
            pull_hub,
            clients,
            offsets,
            shutting_down,
            max_hold_ms=config.suspend_max_ms,
            property_filter=config.enable_property_filter,
        ),
        pops=CorePopService(
            pop,
            topics,
            clock,
            shutting_down,
            max_hold_ms=config.suspend_max_ms,
            property_filter=config.enable_property_filter,
            is_replica=lambda: roles.is_replica,
        ),
        offsets=offsets,
        admin=AdminService(
            identity,
            store,
            topics,
            groups,
            pop,
            RebalanceLocks(),
            clock=clock,
            started_at=started_at,
            sync_flush=config.flush == "sync",
            offload=offload,
        ),
        routes=RouteService(
            topics,
            identity,
            auto_create_queue_nums=config.default_queue_nums if config.auto_create_topic else None,
        ),
        replicas=replicas,
        roles=roles,
        shutting_down=shutting_down,
        started_at=started_at,
    )
    try:
        # Two nurseries, so that the order is fixed: the services stop (a timer delivery or a
        # revive copy under way finishes its shielded write) before the storage task's
        # shielded finally flushes, checkpoints and closes the store.
        async with trio.open_nursery() as storage_nursery:
            await storage_nursery.start(
                storage.serve,
                (
                    timers.before_checkpoint,
                    pop.before_checkpoint,
                    transactions.before_checkpoint,
                    roles.confirmed.before_checkpoint,
                ),
            )
            try:
                async with trio.open_nursery() as services:
                    writers = (timers, pop.revive, pop.renewals, transactions)
                    services.start_soon(_when_master, roles, partial(deadlines.run, writers))
                    services.start_soon(metrics.run)
                    try:
                        yield broker
                    finally:
                        broker.stop_parking()
                        services.cancel_scope.cancel()
            finally:
                storage_nursery.cancel_scope.cancel()
    finally:
        pop.close()
        _log.info("broker closed", address=broker.address)
