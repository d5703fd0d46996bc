"""Issue 19's must-show: ali-ons, client-cpp 1.x (PyPI ``rocketmq`` 0.4.4) and trimq's own
client keep producing and consuming across an automatic failover (docs/ha.md).

One scenario per client, all on loopback: an in-process name server, a 3-member etcd, and
three broker *processes* of one group (``--replication sync --min-insync-replicas 2``,
``--etcd-endpoints``, registered with the name server every 0.5 s); the topic is created on
the master. The client's consumer subscribes, then its producer sends keys one after the
other at a modest pace, each retried until SEND_OK (every SEND_OK key recorded). After some
SEND_OKs the master is killed with ``kill -9``. The test proves:

* a replica is elected with a newer epoch, and the name server's route names it as brokerId 0;
* the client gets SEND_OK again, from the new master (a copy of that key written by it);
* the consumer receives every SEND_OK key (duplicates allowed, counted, printed);
* the new master stores every SEND_OK key.

It measures, per client, how long the producer was without SEND_OK: from the kill to the
first SEND_OK of a message the new master stored itself (``-s`` prints it; with
``TRIMQ_FAILOVER_TIMES`` set it is appended there too). The election takes about the lease
TTL (3 s); then the client must learn the new master from the name server, which the real
clients do only on their periodic route poll: ali-ons every ``pollNameServerInteval`` (sic;
30 s by default, set to 1 s here), trimq's client every ``route_refresh_interval`` (1 s
here), client-cpp 1.x every 30 s, fixed (``MQClientFactory::updateTopicRouteInfo``), so its
gap is the election plus up to 30 s. None of them asks again because a send failed (ali-ons
and client-cpp 1.x do only when the route they hold has no master at all). A fourth case
shows the application's way around client-cpp 1.x's fixed poll: its producer replaced by a
new client instance after 5 failed sends in a row (the driver's ``--renew-after``), which
asks the name server at once.

Installs, skips and driver handling are those of ``test_interop``; without etcd every test
here is skipped. Every wait is bounded and every process is stopped by its pid.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.ha.election import Keys, MasterRecord, read_insync, read_master
from broker.ha.etcd import EtcdClient, EtcdError, parse_endpoints
from client import ClientConfig, ConsumeResult, Message, Producer, PushConsumer, SendStatus
from client.message import ReceivedMessage
from protocol.errors import TrimqError
from scripts.interop_setup import ClientEnv
from tests.broker.client import open_client
from tests.broker.ha.etcd_cluster import EtcdCluster, etcd_cluster, requires_etcd
from tests.broker.ha.test_etcd_failover import record_time
from tests.broker.test_process import BrokerProcess
from tests.broker.test_process import run_broker as run_process_broker
from tests.broker.test_restart import kill9, pull_queue
from tests.interop.test_interop import (
    ALI_ONS,
    CPP_1X,
    Client,
    DriverRun,
    LiveDriver,
    client_env,
)
from tests.namesrv.support import create_topic, open_namesrv, route_of, wait_until

pytestmark = [pytest.mark.interop, requires_etcd]

__all__ = ["client_env", "etcd_cluster"]  # the fixtures

NAME = "broker-fo"
CLUSTER = "DefaultCluster"
#: The group's etcd keys.
KEYS = Keys(CLUSTER, NAME)
TOPIC = "FailoverInterop"
QUEUES = 4
TTL_S = 3
PRODUCER_GROUP = "failover_producer"
#: Keys sent at most per scenario (at PACE_MS, far more than a run needs: the test stops the
#: producer once it has seen enough SEND_OKs after the failover).
COUNT = 3000
PACE_MS = 100
RETRY_PAUSE_MS = 200
#: How long one key is retried: past client-cpp 1.x's 30 s route poll plus the election.
RETRY_FOR_MS = 120_000
#: The route poll of the clients that let us set it (ali-ons, trimq's client), seconds.
ROUTE_POLL_S = 1.0
#: SEND_OKs before the kill, and after it (at most one of these can be the old master's
#: answer to the send in flight at the kill: the producer sends one message at a time).
BEFORE_KILL = 20
AFTER_KILL = 10
#: Bounds (seconds; a loaded 2-core machine). The cpp client needs up to 30 s more than the
#: others to learn the new master, and its consumer may need three of its fixed cycles in a
#: row before it pulls there: the route poll (30 s), the heartbeat that makes the new master
#: list it as a member of its group (30 s) and the rebalance (20 s), 80 s before any pull. A
#: 90 s drain bound failed once on a loaded machine with nothing received after the kill.
SETUP_BOUND_S = 90.0
FAILOVER_BOUND_S = 60.0
RECOVER_BOUND_S = 120.0
DRAIN_BOUND_S = 180.0
SCENARIO_BOUND_S = 420.0


# ---------------------------------------------------------------- event streams
class TimedRun(DriverRun):
    """A driver's events, each stamped ``_at`` (trio's clock) when the test read it; our own
    client's producer and consumer record the same events through :meth:`add`."""

    def feed(self, line: bytes) -> None:
        before = len(self.events)
        super().feed(line)
        for event in self.events[before:]:
            event["_at"] = trio.current_time()

    def add(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields, "_at": trio.current_time()})

    def ok_keys(self) -> set[str]:
        return {e["key"] for e in self.of("sent")}


@dataclass
class Clients:
    """One client's producer and consumer, running; ``stop_*`` end them (bounded)."""

    producer: TimedRun
    consumer: TimedRun
    stop_producer: Callable[[], Awaitable[None]]
    stop_consumer: Callable[[], Awaitable[None]]


# ---------------------------------------------------------------- the broker group
@dataclass
class Group:
    """The running broker processes by address, the name server and etcd."""

    namesrv_port: int
    brokers: dict[str, BrokerProcess]
    data_dirs: dict[str, Path]
    etcd: EtcdClient

    @property
    def namesrv(self) -> str:
        return f"127.0.0.1:{self.namesrv_port}"


async def master_now(client: EtcdClient) -> MasterRecord | None:
    """The master key, or None while etcd names none or does not answer (a slow etcd on a
    loaded machine: the caller reads again)."""
    try:
        return await read_master(client, KEYS)
    except EtcdError:
        return None


async def wait_master(client: EtcdClient, *, not_epoch: int = 0) -> MasterRecord:
    """The master key once it names a master (with an HA address) of another epoch than
    ``not_epoch`` (bounded by the caller; etcd is another process: it is read again)."""
    for _ in itertools.count():
        master = await master_now(client)
        if master is not None and master.address and master.epoch != not_epoch:
            return master
        await trio.sleep(0.05)
    raise AssertionError("unreachable")


async def wait_insync(client: EtcdClient, members: set[int]) -> None:
    """Until the in-sync set holds ``members`` (bounded by the caller)."""
    for _ in itertools.count():
        try:
            found = await read_insync(client, KEYS)
        except EtcdError:
            found = None
        if found is not None and members <= found.members:
            return
        await trio.sleep(0.1)


async def route_master(namesrv_port: int) -> str | None:
    """brokerId 0 of the topic's route on the name server."""
    route = await route_of(namesrv_port, TOPIC)
    return None if route is None else route.broker_datas[0].broker_addrs.get(0)


@asynccontextmanager
async def open_group(cluster: EtcdCluster, root: Path) -> AsyncIterator[Group]:
    """A name server and three broker processes of one group (ids 0, 1, 2), all in sync,
    the topic created on the master, registered, and copied to both replicas."""
    etcd = EtcdClient(parse_endpoints(cluster.endpoints))
    async with open_namesrv() as ns, AsyncExitStack() as stack:
        group = Group(ns.port, {}, {}, etcd)
        # Each start is bounded by run_broker itself (a cancel scope around entering the
        # stack would interleave with the brokers' nurseries).
        for broker_id in range(3):
            data_dir = root / f"b{broker_id}"
            broker = await stack.enter_async_context(
                run_process_broker(
                    data_dir, "--host", "127.0.0.1", "--broker-name", NAME,
                    "--broker-id", str(broker_id), "--ha-port", "0",
                    "--replication", "sync", "--min-insync-replicas", "2",
                    "--etcd-endpoints", cluster.endpoints,
                    "--etcd-lease-ttl-s", str(TTL_S), "--namesrv-addr", group.namesrv,
                    register_interval_s=0.5,
                )
            )  # fmt: skip
            address = f"127.0.0.1:{broker.port}"
            group.brokers[address], group.data_dirs[address] = broker, data_dir
        with trio.fail_after(SETUP_BOUND_S):
            await wait_insync(etcd, {0, 1, 2})
            master = await wait_master(etcd)
            async with open_client(group.brokers[master.address].port) as client:
                await create_topic(client, TOPIC, QUEUES)

            async def registered() -> bool:
                return await route_master(ns.port) == master.address

            await wait_until(registered, SETUP_BOUND_S, every=0.1)

            # A new master registers the topics it knows: each replica must hold the topic's
            # config (copied every 3 s, persisted at once) before a failover, or the route
            # would lose the topic.
            async def copied() -> bool:
                for address, data_dir in group.data_dirs.items():
                    path = trio.Path(data_dir / "config" / "topics.json")
                    if address != master.address and not (
                        await path.exists() and TOPIC in await path.read_text()
                    ):
                        return False
                return True

            await wait_until(copied, SETUP_BOUND_S, every=0.2)
        yield group


# ---------------------------------------------------------------- the clients
@asynccontextmanager
async def driver_clients(
    client: Client, env_: ClientEnv, group: Group, root: Path, *producer_flags: str
) -> AsyncIterator[Clients]:
    """A third-party client's consumer (started first) and its stream producer (given
    ``producer_flags`` too)."""
    home = root / "home"
    home.mkdir()
    env = client.environ(env_, home)
    # ali-ons lets us poll the name server more often; client-cpp 1.x does not.
    tuning = ["--poll-namesrv-ms", str(int(ROUTE_POLL_S * 1000))] if client is ALI_ONS else []

    def command(*args: str) -> list[str]:
        return client.command(env_, *args, "--namesrv", group.namesrv)

    consuming = TimedRun(f"{client.name} consumer", root / "consume.err")
    producing = TimedRun(f"{client.name} producer", root / "stream.err")
    async with trio.open_nursery() as nursery:
        consumer = LiveDriver(consuming)
        # A group name allows letters, digits, "_", "-", "%" and "|" (no "." of "cpp-1.x").
        group_name = "failover_" + client.name.replace(".", "")
        consume = ["consume", "--group", group_name, "--topic", TOPIC]
        await nursery.start(consumer.serve, command(*consume, *tuning), env)
        await consumer.wait_for("start", lambda: bool(consuming.of("started")), SETUP_BOUND_S)
        producer = LiveDriver(producing)
        stream = [
            "stream", "--group", PRODUCER_GROUP, "--topic", TOPIC, "--prefix", client.name,
            "--count", str(COUNT), "--pace-ms", str(PACE_MS),
            "--retry-pause-ms", str(RETRY_PAUSE_MS), "--retry-for-ms", str(RETRY_FOR_MS),
        ]  # fmt: skip
        await nursery.start(producer.serve, command(*stream, *tuning, *producer_flags), env)
        yield Clients(producing, consuming, producer.stop, consumer.stop)


@asynccontextmanager
async def trimq_clients(group: Group) -> AsyncIterator[Clients]:
    """trimq's Producer and PushConsumer (pull mode, as RocketMQ 4 clients consume) in this
    process, recording the drivers' events."""
    config = ClientConfig(namesrv_addr=group.namesrv, route_refresh_interval=ROUTE_POLL_S)
    producing = TimedRun("trimq producer", Path("/nonexistent"))
    consuming = TimedRun("trimq consumer", Path("/nonexistent"))
    stop_producing, stop_consuming = trio.Event(), trio.Event()
    produced, consumed = trio.Event(), trio.Event()

    async def listener(message: ReceivedMessage) -> ConsumeResult:
        consuming.add("received", key=message.keys[0] if message.keys else "")
        return ConsumeResult.SUCCESS

    async def consume(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with PushConsumer(
                config, group="failover_trimq", subscription={TOPIC: "*"}, listener=listener,
                mode="pull", consume_from="first", long_poll=2.0,
            ):  # fmt: skip
                consuming.add("started")
                task_status.started()
                await stop_consuming.wait()
            consuming.add("stopped")
            consuming.returncode = 0
        finally:
            consumed.set()

    async def send_until_ok(producer: Producer, key: str) -> None:
        first = trio.current_time()
        for attempt in itertools.count(1):
            try:
                receipt = await producer.send(
                    Message(TOPIC, f"{key}|failover".encode(), tag="failover", keys=[key])
                )
            except TrimqError as exc:  # a dead master, no route yet, a refusal: retried
                error = f"{type(exc).__name__}: {exc}"
            else:
                if receipt.status is SendStatus.SEND_OK:
                    producing.add("sent", key=key, attempts=attempt)
                    return
                error = f"status {receipt.status}"
            producing.add("send_failed", key=key, attempt=attempt, error=error[:300])
            if trio.current_time() - first > RETRY_FOR_MS / 1000:
                producing.add("gave_up", key=key)
                return
            await trio.sleep(RETRY_PAUSE_MS / 1000)

    async def produce() -> None:
        try:
            async with Producer(config, group=PRODUCER_GROUP) as producer:
                producing.add("started")
                for i in range(COUNT):
                    if stop_producing.is_set():
                        break
                    await send_until_ok(producer, f"trimq-{i}")
                    await trio.sleep(PACE_MS / 1000)
            producing.add("done")
            producing.returncode = 0
        finally:
            produced.set()

    async def stop(event: trio.Event, done: trio.Event) -> None:
        event.set()
        with trio.fail_after(DRAIN_BOUND_S):
            await done.wait()

    async with trio.open_nursery() as nursery:
        await nursery.start(consume)
        nursery.start_soon(produce)
        yield Clients(
            producing,
            consuming,
            lambda: stop(stop_producing, produced),
            lambda: stop(stop_consuming, consumed),
        )


# ---------------------------------------------------------------- the scenario
@dataclass
class Figures:
    """What one failover looked like to one client (seconds from the kill)."""

    election_s: float
    route_s: float
    #: Kill -> the first SEND_OK of a message the new master stored itself.
    no_send_ok_s: float
    failed_attempts: int
    acknowledged: int
    stored_duplicates: int
    received_duplicates: int


def count_after(run: TimedRun, event: str, since: float) -> int:
    return sum(1 for e in run.of(event) if e["_at"] > since)


async def wait_for(run: TimedRun, what: str, predicate: Callable[[], bool], within: float) -> None:
    """Poll ``predicate`` over ``run``'s events (every 50 ms, at most ``within`` s)."""
    with trio.move_on_after(within):
        while not predicate():  # noqa: ASYNC110 (events come from other tasks; bounded)
            await trio.sleep(0.05)
    assert predicate(), f"{run.label}: {what} not seen within {within} s\n{run.report()}"


async def stored_on(port: int) -> dict[str, list[int]]:
    """Every key stored on the broker at ``port``: the store-host port of each copy (the
    broker that wrote it; a replicated copy keeps its writer's)."""
    copies: dict[str, list[int]] = {}
    async with open_client(port) as client:
        for queue_id in range(QUEUES):
            for m in await pull_queue(client, TOPIC, queue_id):
                copies.setdefault(m.keys[0] if m.keys else "", []).append(m.store_host[1])
    return copies


async def across_a_failover(label: str, group: Group, clients: Clients) -> Figures:
    """Kill the master under ``clients``' traffic; check and measure (module docstring)."""
    producer, consumer = clients.producer, clients.consumer
    await wait_for(
        producer, f"{BEFORE_KILL} SEND_OKs", lambda: len(producer.of("sent")) >= BEFORE_KILL,
        SETUP_BOUND_S,
    )  # fmt: skip
    with trio.fail_after(FAILOVER_BOUND_S):
        old = await wait_master(group.etcd)
    killed = trio.current_time()
    await kill9(group.brokers[old.address])
    with trio.fail_after(FAILOVER_BOUND_S):
        new = await wait_master(group.etcd, not_epoch=old.epoch)
    election_s = trio.current_time() - killed
    assert new.epoch > old.epoch and new.address != old.address, (old, new)

    async def routed() -> bool:
        return await route_master(group.namesrv_port) == new.address

    await wait_until(routed, FAILOVER_BOUND_S, every=0.05)
    route_s = trio.current_time() - killed
    await wait_for(
        producer, f"{AFTER_KILL} SEND_OKs after the kill",
        lambda: count_after(producer, "sent", killed) >= AFTER_KILL, RECOVER_BOUND_S,
    )  # fmt: skip
    await clients.stop_producer()
    assert producer.returncode == 0 and producer.of("done"), producer.report()
    assert not producer.of("gave_up"), producer.report()
    acked = producer.ok_keys()

    # The consumer gets every acknowledged key (redeliveries allowed).
    def drained() -> bool:
        return acked <= {e["key"] for e in consumer.of("received")}

    await wait_for(consumer, "every SEND_OK key", drained, DRAIN_BOUND_S)
    await clients.stop_consumer()
    assert consumer.returncode == 0, consumer.report()

    # The new master stores every acknowledged key; the first SEND_OK after the kill of a
    # key it wrote itself is the end of the client's gap.
    copies = await stored_on(int(new.address.rpartition(":")[2]))
    missing = sorted(acked - set(copies))
    assert not missing, f"{len(missing)} of {len(acked)} SEND_OK keys not stored: {missing[:5]}"
    new_port = int(new.address.rpartition(":")[2])
    recovered = [
        e["_at"] - killed
        for e in producer.of("sent")
        if e["_at"] > killed and new_port in copies[e["key"]]
    ]
    assert recovered, f"no SEND_OK from the new master\n{producer.report()}"
    received = Counter(e["key"] for e in consumer.of("received"))
    figures = Figures(
        election_s=election_s,
        route_s=route_s,
        no_send_ok_s=min(recovered),
        failed_attempts=count_after(producer, "send_failed", killed),
        acknowledged=len(acked),
        stored_duplicates=sum(len(c) - 1 for c in copies.values()),
        received_duplicates=sum(n - 1 for n in received.values() if n > 1),
    )
    record_time(f"{label}: kill -9 to a new master in etcd", figures.election_s)
    record_time(f"{label}: kill -9 to the new master in the name server's route", route_s)
    record_time(f"{label}: kill -9 to first SEND_OK from the new master", figures.no_send_ok_s)
    print(f"{label}: {figures}")
    return figures


#: client-cpp 1.x learns of the new master only on its 30 s route poll; an application can
#: replace its producer after a few failed sends instead (a new client instance asks the name
#: server on its first send): the last case measures that workaround.
RENEW_AFTER = 5
THIRD_PARTY = [
    pytest.param(ALI_ONS, "ali-ons", (), id="ali-ons"),
    pytest.param(CPP_1X, "cpp-1.x", (), id="rocketmq-0.4.4-cpp-1.x"),
    pytest.param(
        CPP_1X,
        "cpp-1.x",
        ("--renew-after", str(RENEW_AFTER)),
        id="rocketmq-0.4.4-cpp-1.x-producer-renewed",
    ),
]


@pytest.mark.parametrize(
    ("client", "client_env", "producer_flags"), THIRD_PARTY, indirect=["client_env"]
)
async def test_a_third_party_client_across_a_failover(
    client: Client,
    client_env: ClientEnv,
    producer_flags: tuple[str, ...],
    etcd_cluster: EtcdCluster,
    tmp_path: Path,
) -> None:
    label = client.name + (" (producer renewed)" if producer_flags else "")
    with trio.fail_after(SCENARIO_BOUND_S):
        async with (
            open_group(etcd_cluster, tmp_path) as group,
            driver_clients(client, client_env, group, tmp_path, *producer_flags) as clients,
        ):
            figures = await across_a_failover(label, group, clients)
    # The election is the lease (3 s) plus a few etcd round trips; generous on a busy box.
    assert figures.election_s < TTL_S + 20


async def test_our_client_across_a_failover(etcd_cluster: EtcdCluster, tmp_path: Path) -> None:
    with trio.fail_after(SCENARIO_BOUND_S):
        async with (
            open_group(etcd_cluster, tmp_path) as group,
            trimq_clients(group) as clients,
        ):
            figures = await across_a_failover("trimq client", group, clients)
    assert figures.election_s < TTL_S + 20
