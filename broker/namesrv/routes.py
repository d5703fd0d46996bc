"""The name server's route table (RocketMQ's ``RouteInfoManager``), sans-IO.

Theory of operation. Four tables, as in RocketMQ:

* ``topic → broker name → QueueData``: how many queues each broker group has for the topic;
* ``broker name → BrokerData``: the group's cluster and its addresses by broker id (0 is the
  master);
* ``cluster → broker names``;
* ``broker address → BrokerLive``: when the address last registered, with which topic data
  version, and how long it may stay silent.

A broker registers every 30 s (and at once when its topics change). The topics of a
registration are applied only when they come from a master (broker id 0) and the broker is
new or its data version changed; otherwise the registration only renews the address. Unlike
RocketMQ 4.x, a registration *replaces* the broker's topic set, so a topic deleted on the
broker leaves the route at its next registration (RocketMQ needs DELETE_TOPIC_IN_NAMESRV).

A broker that has not registered for its timeout (``expire_s``, or the ``heartbeatTimeoutMillis``
it sent) is expired by :meth:`RouteTable.expire`: at an age of exactly the timeout it is gone.
When the last address of a broker group goes, the group, its place in its cluster and its
queues go too, and a topic left without queues is removed.

Time is an argument (seconds on any monotonic clock): the server passes ``trio.current_time()``
and tests pass numbers. Nothing here blocks or does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.bodies.broker import DataVersion, TopicConfig
from protocol.bodies.route import MASTER_ID, BrokerData, ClusterInfo, QueueData, TopicRouteData
from protocol.errors import InvalidParameterError
from protocol.naming import validate_topic

#: RocketMQ's ``BROKER_CHANNEL_EXPIRED_TIME``: 120 s without a registration.
DEFAULT_EXPIRE_S = 120.0


@dataclass(frozen=True, slots=True)
class Registration:
    """What one REGISTER_BROKER request says (header fields plus the decoded body)."""

    cluster: str
    broker_addr: str
    broker_name: str
    broker_id: int
    ha_server_addr: str = ""
    topics: Mapping[str, TopicConfig] | None = None
    data_version: DataVersion = field(default_factory=DataVersion)
    #: The broker's own ``heartbeatTimeoutMillis`` in seconds; None: the table's default.
    timeout_s: float | None = None
    #: A master elected through etcd: its epoch (``trimqMasterEpoch``, docs/ha.md).
    master_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class RegisterResult:
    """The answer to a registration: the master's addresses (for a slave) and what changed."""

    master_addr: str | None
    ha_server_addr: str | None
    first: bool
    topics_applied: bool


@dataclass(slots=True)
class BrokerLive:
    """One registered broker address."""

    cluster: str
    broker_name: str
    broker_id: int
    last_update: float
    timeout_s: float
    data_version: DataVersion
    ha_server_addr: str

    def expired(self, now: float) -> bool:
        """Silent for its whole timeout (an age of exactly the timeout counts)."""
        return now - self.last_update >= self.timeout_s


class StaleMasterError(InvalidParameterError):
    """A deposed master's registration (an older epoch than the group's newest)."""


def check_registration(reg: Registration) -> None:
    """Refuse a registration that would corrupt the table.

    Raises:
        InvalidParameterError: naming the bad field.
    """
    for name, value in (("clusterName", reg.cluster), ("brokerName", reg.broker_name)):
        if not value or value != value.strip():
            raise InvalidParameterError(f"{name} {value!r} is empty or padded")
    check_address(reg.broker_addr)
    if reg.broker_id < 0:
        raise InvalidParameterError(f"brokerId {reg.broker_id} is negative")
    if reg.timeout_s is not None and reg.timeout_s <= 0:
        raise InvalidParameterError(f"heartbeatTimeoutMillis must be positive: {reg.timeout_s}")
    for name, config in (reg.topics or {}).items():
        validate_topic(name)
        if config.topic_name != name:
            raise InvalidParameterError(f"topic {name!r} is configured as {config.topic_name!r}")
        if config.read_queue_nums < 0 or config.write_queue_nums < 0:
            raise InvalidParameterError(f"topic {name}: negative queue count")


def check_address(addr: str) -> None:
    """``HOST:PORT`` with a port in 1..65535.

    Raises:
        InvalidParameterError: the address is malformed.
    """
    host, sep, port = addr.rpartition(":")
    if not (sep and host and port.isdigit() and port.isascii() and 0 < int(port) < 65536):
        raise InvalidParameterError(f"brokerAddr {addr!r} is not HOST:PORT")


class RouteTable:
    """Routes of every topic, from broker registrations (see the module docstring)."""

    def __init__(self, *, expire_s: float = DEFAULT_EXPIRE_S) -> None:
        self.expire_s = expire_s
        self._topics: dict[str, dict[str, QueueData]] = {}
        self._brokers: dict[str, BrokerData] = {}
        self._clusters: dict[str, set[str]] = {}
        self._live: dict[str, BrokerLive] = {}
        #: Per broker name, the newest master epoch registered (kept after the master
        #: leaves: a deposed master must not come back as master).
        self._master_epochs: dict[str, int] = {}

    # ------------------------------------------------------------------ registration
    def register(self, reg: Registration, now: float) -> RegisterResult:
        """Add or renew a broker address; apply its topics if they changed.

        Raises:
            InvalidParameterError: the registration is malformed (nothing is changed).
            IllegalNameError: a topic name breaks RocketMQ's rules (nothing is changed).
            StaleMasterError: a master registers with an older epoch than one registered
                before (nothing is changed).
        """
        check_registration(reg)
        self._check_epoch(reg)
        self._move_cluster(reg.broker_name, reg.cluster)
        group = self._brokers.get(reg.broker_name)
        addrs = dict(group.broker_addrs) if group is not None else {}
        # One address has one id: an address re-registering under another id moves.
        addrs = {bid: a for bid, a in addrs.items() if a != reg.broker_addr or bid == reg.broker_id}
        old_addr = addrs.get(reg.broker_id)
        addrs[reg.broker_id] = reg.broker_addr
        self._brokers[reg.broker_name] = BrokerData(reg.cluster, reg.broker_name, addrs)
        if old_addr is not None and old_addr != reg.broker_addr:
            self._live.pop(old_addr, None)  # replaced by the new address
        previous = self._live.get(reg.broker_addr)
        first = previous is None or old_addr != reg.broker_addr
        changed = first or previous is None or previous.data_version != reg.data_version
        applied = reg.broker_id == MASTER_ID and reg.topics is not None and changed
        if applied and reg.topics is not None:
            self._apply_topics(reg.broker_name, reg.topics)
        self._live[reg.broker_addr] = BrokerLive(
            reg.cluster, reg.broker_name, reg.broker_id, now,
            self.expire_s if reg.timeout_s is None else reg.timeout_s,
            reg.data_version, reg.ha_server_addr,
        )  # fmt: skip
        master, ha = None, None
        if reg.broker_id != MASTER_ID:
            master = addrs.get(MASTER_ID)
            live = self._live.get(master) if master else None
            ha = live.ha_server_addr if live else None
        return RegisterResult(master, ha, first, applied)

    def _check_epoch(self, reg: Registration) -> None:
        """A master with an epoch: refuse an older one than registered before; a newer one
        replaces the group's master address below (the stale one is dropped). Without an
        epoch (RocketMQ's brokers, trimq without etcd) a registration is taken as before."""
        if reg.broker_id != MASTER_ID or reg.master_epoch is None:
            return
        newest = self._master_epochs.get(reg.broker_name, 0)
        if reg.master_epoch < newest:
            raise StaleMasterError(
                f"broker {reg.broker_name} at {reg.broker_addr}: master epoch "
                f"{reg.master_epoch} is older than {newest}, the group's newest master's"
            )
        self._master_epochs[reg.broker_name] = reg.master_epoch

    def master_epoch(self, broker_name: str) -> int | None:
        """The newest master epoch registered for ``broker_name`` (None: none carried one)."""
        return self._master_epochs.get(broker_name)

    def _move_cluster(self, broker_name: str, cluster: str) -> None:
        for name, members in list(self._clusters.items()):
            if name != cluster and broker_name in members:
                members.discard(broker_name)
                if not members:
                    del self._clusters[name]
        self._clusters.setdefault(cluster, set()).add(broker_name)

    def _apply_topics(self, broker_name: str, topics: Mapping[str, TopicConfig]) -> None:
        for name, config in topics.items():
            self._topics.setdefault(name, {})[broker_name] = QueueData(
                broker_name,
                config.read_queue_nums,
                config.write_queue_nums,
                config.perm,
                config.topic_sys_flag,
            )
        for name in [t for t, queues in self._topics.items() if broker_name in queues]:
            if name not in topics:
                self._drop_queues(name, broker_name)

    def _drop_queues(self, topic: str, broker_name: str) -> None:
        queues = self._topics.get(topic)
        if queues is None:
            return
        queues.pop(broker_name, None)
        if not queues:
            del self._topics[topic]

    def unregister(self, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> bool:
        """Remove one broker address (a graceful shutdown); True if it was registered."""
        live = self._live.get(broker_addr)
        group = self._brokers.get(broker_name)
        known = live is not None or (
            group is not None and broker_addr in group.broker_addrs.values()
        )
        self._remove(broker_addr, broker_name, broker_id)
        return known

    def _remove(self, broker_addr: str, broker_name: str, broker_id: int) -> None:
        self._live.pop(broker_addr, None)
        group = self._brokers.get(broker_name)
        if group is None:
            return
        addrs = {
            bid: addr
            for bid, addr in group.broker_addrs.items()
            if not (addr == broker_addr and bid == broker_id)
        }
        if addrs:
            self._brokers[broker_name] = BrokerData(group.cluster, broker_name, addrs)
            return
        del self._brokers[broker_name]
        members = self._clusters.get(group.cluster)
        if members is not None:
            members.discard(broker_name)
            if not members:
                del self._clusters[group.cluster]
        for topic in [t for t, queues in self._topics.items() if broker_name in queues]:
            self._drop_queues(topic, broker_name)

    def expire(self, now: float) -> list[BrokerLive]:
        """Remove every address silent for its whole timeout; return what was removed."""
        gone = [(addr, live) for addr, live in self._live.items() if live.expired(now)]
        for addr, live in gone:
            self._remove(addr, live.broker_name, live.broker_id)
        return [live for _, live in gone]

    # ------------------------------------------------------------------ queries
    def route(self, topic: str, *, order_topic_conf: str | None = None) -> TopicRouteData | None:
        """The topic's route: one QueueData and one BrokerData per broker group holding it;
        None when no registered broker holds it."""
        queues = self._topics.get(topic)
        if not queues:
            return None
        names = sorted(name for name in queues if name in self._brokers)
        if not names:
            return None
        return TopicRouteData(
            queue_datas=tuple(queues[name] for name in names),
            broker_datas=tuple(self._brokers[name] for name in names),
            order_topic_conf=order_topic_conf,
        )

    def cluster_info(self) -> ClusterInfo:
        """Every broker group and the groups of each cluster."""
        return ClusterInfo(
            broker_addr_table=dict(sorted(self._brokers.items())),
            cluster_addr_table={c: tuple(sorted(m)) for c, m in sorted(self._clusters.items())},
        )

    def topics(self) -> list[str]:
        """Every topic some registered broker holds, sorted."""
        return sorted(self._topics)

    def topics_of_cluster(self, cluster: str) -> list[str]:
        """The topics held by the broker groups of ``cluster``, sorted."""
        members = self._clusters.get(cluster, set())
        return sorted(t for t, queues in self._topics.items() if members & queues.keys())

    def live(self) -> dict[str, BrokerLive]:
        """Registered addresses (a copy)."""
        return dict(self._live)
