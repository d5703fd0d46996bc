"""``serve_broker``: one broker process — listener, store, flusher, checkpoints, processors.

Start order: bind the listener first (its port goes into every stored record's store host
and into routes), open and recover the store, then accept connections. Stop order
(:meth:`BrokerHandle.stop`, also on SIGTERM/SIGINT): refuse new work, answer every parked
pull, wait briefly for requests in flight, close connections, then flush, checkpoint and close
the store cleanly.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from functools import partial

import trio

from broker.acl import AclGuard

# Registering the processors is a side effect of importing them.
from broker.clock import SYSTEM_CLOCK, Clock, DiskProbe, disk_used_ratio
from broker.config import BrokerConfig
from broker.core.broker import Broker, BrokerStatistics, open_broker
from broker.grpc.server import GrpcLimits, GrpcServerState, GrpcStatistics, serve_grpc
from broker.grpc.service import GrpcEndpoint, build_service
from broker.ha.election import FENCED_REFUSAL, Election, ElectionSettings, MasterRecord
from broker.ha.etcd import EtcdClient, parse_endpoints
from broker.ha.master import HaSettings, LogGrowth, MasterLink, serve_ha_master
from broker.ha.metadata import MasterMetadata, ReplicaMetadata
from broker.ha.replica import Follower, MasterAddress
from broker.ha.role import resolve_role
from broker.logs import get_logger
from broker.prometheus import RefusalSource, open_prometheus
from broker.registration import NamesrvRoutes, Registrar
from broker.remoting.context import BrokerContext
from broker.remoting.processors import broker_dispatcher
from broker.remoting.server import (
    ServerLimits,
    ServerStatistics,
    serve_remoting,
)
from broker.tls import TlsMode, TlsPolicy, client_context, server_context

_log = get_logger("broker")
#: How long a stop waits for requests in flight before cutting connections.
DRAIN_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class BrokerHandleStatistics:
    """What :meth:`BrokerHandle.statistics` reports."""

    core: BrokerStatistics
    remoting: ServerStatistics
    #: None without a gRPC front end.
    grpc: GrpcStatistics | None = None


@dataclass
class BrokerHandle:
    """A running broker (what ``nursery.start(serve_broker, config)`` returns)."""

    port: int
    address: str
    ctx: BrokerContext
    _stop: trio.Event
    _stopped: trio.Event
    #: Keeps the broker registered with its name servers (None without ``namesrv_addr``).
    registrar: Registrar | None = None
    #: Where Prometheus ``/metrics`` is served (None when ``prometheus_port`` is not set).
    prometheus_port: int | None = None
    #: The gRPC front end's port and counters (None when ``grpc_port`` is None).
    grpc_port: int | None = None
    grpc: GrpcServerState | None = None
    #: A master's HA port (None on a replica, which serves none).
    ha_port: int | None = None
    #: A replica's link to its master (None on a master).
    follower: Follower | None = None
    #: Automatic failover through etcd (None without ``etcd_endpoints``).
    election: Election | None = None

    @property
    def broker(self) -> Broker:
        """The broker's services."""
        return self.ctx.broker

    def statistics(self) -> BrokerHandleStatistics:
        """The services' counters and the Remoting server's."""
        grpc = None if self.grpc is None else self.grpc.statistics()
        return BrokerHandleStatistics(self.broker.statistics(), self.ctx.server.statistics(), grpc)

    async def stop(self) -> None:
        """Graceful stop (see the module docstring); returns once the store is closed."""
        self._stop.set()
        await self._stopped.wait()


async def serve_broker(
    config: BrokerConfig,
    *,
    clock: Clock = SYSTEM_CLOCK,
    disk_probe: DiskProbe = disk_used_ratio,
    task_status: trio.TaskStatus[BrokerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a broker until cancelled or stopped; the store is always closed cleanly.

    Raises:
        ListenError: one of its ports cannot be bound (nothing else was started).
        RoleConflict: the flags ask for a role the data directory forbids (nothing started).
    """
    # Before any port: a promotion recorded in the data directory wins over --broker-id.
    config = resolve_role(config)
    opened: list[trio.SocketListener] = []
    try:
        listeners = await _listen(config.host, config.port, "Remoting (--port)", opened)
        port = listeners[0].socket.getsockname()[1]
        grpc_listeners = (
            []
            if config.grpc_port is None
            else await _listen(config.host, config.grpc_port, "gRPC (--grpc-port)", opened)
        )
        ha_listeners = (
            []
            if config.is_replica
            else await _listen(config.host, _ha_port(config, port), _HA_PORT, opened)
        )
    except BaseException:
        with trio.CancelScope(shield=True):
            for listener in opened:
                await listener.aclose()
        raise
    grpc_port = grpc_listeners[0].socket.getsockname()[1] if grpc_listeners else None
    ha_port = ha_listeners[0].socket.getsockname()[1] if ha_listeners else None
    stop, stopped = trio.Event(), trio.Event()
    try:
        async with open_broker(config, port=port, clock=clock, disk_probe=disk_probe) as broker:
            # Fenced before any front end accepts a request: with etcd, a broker writes only
            # while it holds its group's master lease.
            elected = _Elected(broker) if config.etcd_endpoints else None
            dispatcher = broker_dispatcher(broker)
            ctx, server = dispatcher.ctx, dispatcher.ctx.server
            grpc_state = None if grpc_port is None else GrpcServerState()
            sources: dict[str, RefusalSource] = {
                "remoting": (server.refusal_counts, lambda: len(server.open_connections))
            }
            if grpc_state is not None:
                sources["grpc"] = (grpc_state.refusal_counts, lambda: grpc_state.connections)
            prometheus = open_prometheus(
                config.host, config.prometheus_port, broker.metrics, sources
            )
            async with prometheus as prometheus_port, trio.open_nursery() as front:
                mode, now = TlsMode(config.tls_mode), _utc(clock)
                remoting_tls = TlsPolicy(
                    mode, server_context(config.tls_cert, config.tls_key, now=now)
                )
                await front.start(
                    partial(serve_remoting, tls=remoting_tls),
                    dispatcher,
                    listeners,
                    ServerLimits.of(config),
                    server,
                )
                if grpc_state is not None and grpc_port is not None:
                    host = broker.address.rpartition(":")[0]
                    cluster = (
                        NamesrvRoutes(
                            config.namesrv_addrs(),
                            timeout_s=config.register_timeout_s,
                            tls=client_context(config.namesrv_tls_ca)
                            if config.namesrv_tls
                            else None,
                        )
                        if config.namesrv_addr
                        else None
                    )
                    # One ACL file, one guard: both front ends see the same rules and reloads.
                    guard = dispatcher.guard
                    acl = guard if isinstance(guard, AclGuard) else None
                    service = build_service(broker, GrpcEndpoint(host, grpc_port), cluster, acl)
                    grpc_context = server_context(
                        config.tls_cert, config.tls_key, now=now, alpn=("h2",)
                    )
                    await front.start(
                        partial(serve_grpc, tls=TlsPolicy(mode, grpc_context)),
                        service,
                        grpc_listeners,
                        GrpcLimits(
                            max_message_size=config.max_message_size + 64 * 1024,
                            max_connections_per_ip=config.max_connections_per_ip or None,
                            idle_timeout_s=config.idle_timeout_s or None,
                        ),
                        grpc_state,
                    )
                ha_host = broker.address.rpartition(":")[0]
                ha_address = None if ha_port is None else f"{ha_host}:{ha_port}"
                if ha_port is not None and elected is None:
                    await front.start(serve_ha_master, _master_link(broker), ha_listeners)
                registrar = None
                if config.namesrv_addr:
                    grpc_endpoint = (
                        None
                        if grpc_port is None
                        else f"{broker.address.rpartition(':')[0]}:{grpc_port}"
                    )
                    registrar = Registrar(
                        config,
                        broker.topics,
                        broker.address,
                        grpc_endpoint=grpc_endpoint,
                        ha_address=ha_address,
                    )
                    broker.topics.subscribe(registrar.poke)
                    front.start_soon(registrar.run)
                follower = (
                    _follower(broker, registrar, None if elected is None else elected.master_ha)
                    if config.is_replica
                    else None
                )
                if follower is not None and elected is None:
                    await front.start(_follow_until_promoted, follower, broker)
                _log.info("broker started", address=broker.address, port=port,
                          grpc_port=grpc_port, data_dir=str(config.data_dir),
                          flush=config.flush, namesrv_addr=config.namesrv_addr,
                          broker_id=config.broker_id, ha_port=ha_port,
                          replication=config.replication)  # fmt: skip
                handle = BrokerHandle(
                    port, broker.address, ctx, stop, stopped, registrar, prometheus_port,
                    grpc_port, grpc_state, ha_port, follower,
                )  # fmt: skip
                if elected is not None:
                    handle.election = elected.start(handle, front, ha_listeners, registrar)
                    await front.start(handle.election.run)
                if follower is not None:
                    front.start_soon(_serve_once_promoted, handle, registrar)
                task_status.started(handle)
                await stop.wait()
                # The one stop path: leave the name servers' routes, answer parked polls,
                # let requests in flight finish (bounded), then close the connections.
                if registrar is not None:
                    await registrar.stop()
                broker.stop_parking()
                with trio.move_on_after(DRAIN_SECONDS):
                    await server.wait_drained()
                front.cancel_scope.cancel()
    finally:
        stopped.set()
    _log.info("broker stopped", address=f"{config.host}:{port}")


class ListenError(Exception):
    """A port the broker must listen on cannot be bound; the message says which and why."""


_HA_PORT = "replication (--ha-port; by default the Remoting port + 1)"


async def _listen(
    host: str, port: int, what: str, opened: list[trio.SocketListener]
) -> list[trio.SocketListener]:
    """Listen on ``host:port`` (added to ``opened``), or say plainly which port failed."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {host}:{port} for {what}: {exc.strerror or exc}"
        ) from None
    opened += listeners
    return listeners


def _ha_port(config: BrokerConfig, port: int) -> int:
    """``--ha-port``, else the Remoting port + 1 (RocketMQ's ``haListenPort``), else — when
    the Remoting port itself was "any free port" — any free port too."""
    if config.ha_port is not None:
        return config.ha_port
    return port + 1 if config.port else 0


def _master_link(broker: Broker) -> MasterLink:
    """What the HA port's connections share (docs/design.md §13)."""
    return MasterLink(
        broker.store,
        broker.replicas,
        LogGrowth(),
        broker.config.broker_name,
        broker.roles.epochs.current,
        broker.roles.epochs.entries,
        HaSettings(),
        MasterMetadata(broker.topics, broker.groups, broker.store.offsets, broker.pop.table),
    )


def _follower(
    broker: Broker, registrar: Registrar | None, elected: MasterAddress | None = None
) -> Follower:
    """A replica's link to its master: where the etcd election says (``elected``), else at
    ``--ha-master-addr``, else where the name servers say the group's master serves its
    HA port."""
    config = broker.config
    fixed = config.ha_master_addr

    async def master() -> str:
        if elected is not None:
            return await elected()
        if fixed is not None:
            return fixed
        assert registrar is not None  # config: a replica has one or the other
        return await registrar.master_ha_addr()

    return Follower(
        broker.storage,
        broker.topics,
        master,
        ReplicaMetadata(broker.topics, broker.groups, broker.store.offsets, broker.pop.mirror),
        broker_name=config.broker_name,
        broker_id=config.broker_id,
        epochs=broker.roles.epochs,
        confirmed=broker.roles.confirmed,
        settings=HaSettings(),
        min_queues=config.default_queue_nums,
    )


async def _follow_until_promoted(
    follower: Follower, broker: Broker, *, task_status: trio.TaskStatus[None]
) -> None:
    """Follow the master until this replica is promoted (docs/design.md §13)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(follower.run)
        task_status.started()
        await broker.roles.promoted.wait()
        nursery.cancel_scope.cancel()


async def _serve_once_promoted(handle: BrokerHandle, registrar: Registrar | None) -> None:
    """Once a replica is promoted: serve its group's HA port under the new epoch, and
    register as brokerId 0 with that HA address (replicas of the group find it there)."""
    broker = handle.broker
    await broker.roles.promoted.wait()
    config = broker.config
    try:
        listeners = await trio.open_tcp_listeners(_ha_port(config, handle.port), host=config.host)
    except OSError as exc:  # still a master: its producers and consumers are served
        _log.error("promoted, but no HA port: no replica can follow", error=str(exc))
        listeners = []
    ha_address = None
    if listeners:
        handle.ha_port = listeners[0].socket.getsockname()[1]
        ha_address = f"{broker.address.rpartition(':')[0]}:{handle.ha_port}"
    if registrar is not None:
        registrar.promoted(ha_address)
    _log.warning("serving as master", epoch=broker.roles.epochs.current, ha_port=handle.ha_port)
    if listeners:
        await serve_ha_master(_master_link(broker), listeners)


class _Elected:
    """Automatic failover (docs/ha.md): the broker's side of its group's etcd election.

    Made right after the store opens, so that its fence guards every put from the first
    request on (a broker writes only while it holds the master lease); :meth:`start`
    builds the :class:`Election` once the front end exists. A broker started as master
    serves its HA port only once elected, under the epoch the election gave it; a replica
    follows whichever master the election names (its epoch accepted first, so a deposed
    master's stream is refused), and one that wins is promoted with that epoch."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._fence: Election | None = None
        self._leader = ""
        broker.store.write_fence = self._refusal

    def _refusal(self) -> str | None:
        return FENCED_REFUSAL if self._fence is None else self._fence.write_refusal()

    async def master_ha(self) -> str:
        """The elected master's HA address (the follower runs only while one is known)."""
        return self._leader

    def start(
        self,
        handle: BrokerHandle,
        front: trio.Nursery,
        ha_listeners: list[trio.SocketListener],
        registrar: Registrar | None,
    ) -> Election:
        broker, config = self.broker, self.broker.config
        assert config.etcd_endpoints is not None
        host = broker.address.rpartition(":")[0]

        def become_master(epoch: int) -> None:
            # A broker started as master: its writes from now on are epoch ``epoch``'s.
            broker.roles.epochs.begin(epoch, broker.store.log.end)
            if ha_listeners:
                front.start_soon(serve_ha_master, _master_link(broker), ha_listeners)
            if registrar is not None:
                registrar.poke()  # the name servers learn the new epoch now

        async def follow(record: MasterRecord) -> None:
            assert handle.follower is not None
            broker.roles.epochs.raise_to(record.epoch)
            self._leader = record.ha_address
            await handle.follower.run()

        election = Election(
            EtcdClient(parse_endpoints(config.etcd_endpoints)),
            ElectionSettings(ttl_s=config.etcd_lease_ttl_s),
            cluster=config.cluster,
            broker_name=config.broker_name,
            broker_id=config.broker_id,
            address=broker.address,
            replicas=broker.replicas,
            is_replica=lambda: broker.roles.is_replica,
            log_end=lambda: broker.store.log.end,
            promote=broker.roles.promote,
            become_master=become_master,
            follow=follow,
            ha_address=lambda: "" if handle.ha_port is None else f"{host}:{handle.ha_port}",
        )
        self._fence = election
        if registrar is not None:
            registrar.master_epoch = election.registered_epoch
        return election


def _utc(clock: Clock) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(clock.now_ms() / 1000, tz=datetime.UTC)
