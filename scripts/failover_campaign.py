"""The failover campaign (issue 19, docs/ha.md): ``kill -9`` of the current master, N
times at random moments, under producers, with automatic failover through etcd.

One broker group of three broker processes (``--replication sync --min-insync-replicas
2``, ``--etcd-endpoints`` of a 3-member etcd on loopback, ``--etcd-lease-ttl-s``), and
``--producers`` tasks sending unique keys through trimq's own client to whichever broker
the election names, ``--consumers`` pop consumers (one group, broker-side balancing)
receiving and acking from it, and ``--pull-consumers`` pull consumers (a second group:
trimq's ``PushConsumer`` in pull mode, client-side rebalance, offsets committed to the
broker) resuming from the group's committed offsets on each new master. Each round:
traffic for a random 0.5-2.5 s, ``kill -9`` of the master, then wait until a new master
answers SEND_OK; the killed broker is restarted as a replica (its ``config/haRole``
removed: the operator's demotion, docs/design.md §13) and the round ends once the in-sync
set has all three again (so that the next kill has an in-sync candidate: there is no
unclean election).

At the end every broker is stopped and the final master's store is read directly:

- **lost**: a key answered SEND_OK that is not stored (must be 0);
- **duplicates**: stored copies beyond one per key (a retry after an ambiguous answer);
- **consumed**, per consumer group (pop, pull): acknowledged keys the group never
  received once drained (the consumers' side of no loss; exit status 1 if any), keys
  received more than once (redeliveries: offsets and pop leases reach replicas as
  snapshots every ~3 s), and per failover the time from the kill to the group's first
  message from the new master;
- **unavailability** per failover: from the kill to the first SEND_OK of any producer on
  the new master, and the election's part (kill to the new master key);
- **masters**: the master epochs seen, strictly rising (no two masters under one epoch),
  and the epoch history of the final master.

Bounded: every wait has a deadline; every process started here is stopped by its pid.
The clients' own log (info and up: queues assigned with their start offsets, failed pulls,
pops and sends around a kill) goes to ``clients.log`` in the work directory (``--keep``
keeps it), not to stdout.
Usage: ``python -m scripts.failover_campaign --kills 20 --pull-consumers 2 --out c.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import structlog
import trio

from broker.ha.election import Keys, MasterRecord, read_insync, read_master
from broker.ha.etcd import EtcdClient, EtcdError, parse_endpoints
from broker.store.config import StoreConfig
from broker.store.store import MessageStore
from client import (
    ClientConfig,
    ConsumeResult,
    Message,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SendStatus,
    SimpleConsumer,
)
from protocol.message import decode_records
from scripts.etcd_local import EtcdCluster

NAME = "broker-fo"
CLUSTER = "DefaultCluster"
#: The group's etcd keys.
KEYS = Keys(CLUSTER, NAME)
TOPIC = "Campaign"
#: Upper bound of any single wait (a start, an election, a catch-up) on a loaded machine.
WAIT_S = 90.0
REPO = Path(__file__).resolve().parent.parent
#: Into clients.log with the clients' own lines: each pull consumer's sessions.
_log = structlog.get_logger("trimq.campaign")


@dataclass
class BrokerProc:
    """One broker process of the group; ``slot`` is its replica id (>= 1) once restarted."""

    slot: int
    data_dir: Path
    log_path: Path
    process: trio.Process | None = None
    port: int = 0
    broker_id: int = 0

    async def start(self, broker_id: int, endpoints: str, ttl_s: int) -> None:
        self.broker_id = broker_id
        argv = [
            sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", "0",
            "--ha-port", "0", "--grpc-port", "0", "--data-dir", str(self.data_dir),
            "--broker-name", NAME, "--broker-id", str(broker_id),
            "--replication", "sync", "--min-insync-replicas", "2",
            "--etcd-endpoints", endpoints, "--etcd-lease-ttl-s", str(ttl_s),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
        env["TRIMQ_SEGMENT_SIZE"] = str(8 << 20)
        env["TRIMQ_DISK_FULL_RATIO"] = "0"
        log = _append(self.log_path)
        since = log.tell()  # this life's lines only (the file keeps earlier lives')
        try:
            self.process = await trio.lowlevel.open_process(
                argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip
        finally:
            log.close()  # the child holds its own descriptor
        with trio.fail_after(WAIT_S):
            while not self.port:  # bounded by fail_after
                self.port = self._started_port(since)
                if self.process.poll() is not None:
                    raise RuntimeError(f"broker {self.slot} exited: see {self.log_path}")
                await trio.sleep(0.05)

    def _started_port(self, since: int) -> int:
        with open(self.log_path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == "broker started":
                return int(entry["port"])
        return 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def kill9(self) -> None:
        assert self.process is not None
        self.process.kill()  # this process only, by its pid
        with trio.fail_after(WAIT_S):
            await self.process.wait()
        self.port = 0

    async def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(30):
            await self.process.wait()
        if self.process.poll() is None:
            self.process.kill()
            await self.process.wait()


@dataclass
class Failover:
    """One kill and what followed."""

    killed_slot: int
    old_epoch: int
    new_epoch: int = 0
    #: Kill -> the new master key in etcd.
    election_s: float = 0.0
    #: Kill -> the first SEND_OK of any producer on the new master.
    unavailable_s: float = 0.0
    #: Monotonic time of the kill (not reported: only differences mean something).
    killed_at: float = 0.0

    def report(self, groups: dict[str, Group]) -> dict[str, Any]:
        """The JSON of this failover: with, per consumer group, kill -> its first message
        received from the new master (None: none came from that master)."""
        resumed = {}
        for kind, group in groups.items():
            if not group.consumers:
                continue
            first = group.first_by_epoch.get(self.new_epoch)
            resumed[kind] = None if first is None else round(first - self.killed_at, 3)
        return {
            "killed_slot": self.killed_slot,
            "old_epoch": self.old_epoch,
            "new_epoch": self.new_epoch,
            "election_s": self.election_s,
            "unavailable_s": self.unavailable_s,
            "consumer_resumed_s": resumed,
        }


@dataclass
class Group:
    """One consumer group of the campaign (``kind``: "pop" or "pull") and what it got."""

    kind: str
    consumers: int
    #: key -> how many times the group received it (across every master).
    received: Counter[str] = field(default_factory=Counter)
    #: Consumer sessions that failed (a dead master, a refused request): retried.
    errors: int = 0
    #: master epoch -> monotonic time of the group's first message from that master.
    first_by_epoch: dict[int, float] = field(default_factory=dict)

    def got(self, key: str, epoch: int) -> None:
        self.received[key] += 1
        self.first_by_epoch.setdefault(epoch, time.monotonic())

    def missing(self, acked: dict[str, tuple[float, int]]) -> list[str]:
        """Acknowledged keys this group has not received (none if it has no consumer)."""
        return sorted(set(acked) - set(self.received)) if self.consumers else []

    def report(self, acked: dict[str, tuple[float, int]]) -> dict[str, Any]:
        missing = self.missing(acked)
        again = sum(1 for n in self.received.values() if n > 1)
        return {
            "consumers": self.consumers,
            "received_keys": len(self.received),
            "acknowledged_not_received": len(missing) if self.consumers else None,
            "missing_sample": missing[:10],
            "received_more_than_once": again,
            "received_more_than_once_pct": round(100 * again / len(acked), 1) if acked else 0.0,
            "deliveries": sum(self.received.values()),
            "errors": self.errors,
        }


@dataclass
class Traffic:
    """What the producers saw."""

    #: key -> monotonic time of its SEND_OK and the epoch of the master that gave it.
    acked: dict[str, tuple[float, int]] = field(default_factory=dict)
    #: Sends that raised or came back non-OK (each is retried with the same key).
    failed: int = 0
    ambiguous: int = 0
    last_error: str = ""
    leader: MasterRecord | None = None
    leader_changed: trio.Event = field(default_factory=trio.Event)
    #: The consumer groups by kind ("pop", "pull").
    groups: dict[str, Group] = field(default_factory=dict)
    #: Set on every SEND_OK (the campaign waits on it for the first one after a kill).
    acked_event: trio.Event = field(default_factory=trio.Event)
    stop: bool = False
    #: Sends awaiting their answer: once ``stop`` is set the drain waits for none to be
    #: left, since a SEND_OK arriving after the drain's check would count as missing.
    sending: int = 0

    def ack(self, key: str, epoch: int) -> None:
        self.acked[key] = (time.monotonic(), epoch)
        self.acked_event.set()
        self.acked_event = trio.Event()


async def watch_leader(client: EtcdClient, traffic: Traffic) -> None:
    """Keep ``traffic.leader`` on the elected master (etcd is another process: polled).

    A change is a new epoch or address: the master publishing its HA address into its key
    later is the same master (clients restarted for it would fail over twice per kill)."""
    while not traffic.stop:  # ends with the campaign
        try:
            record = await read_master(client, KEYS)
        except EtcdError:
            record = None
        if _who(record) != _who(traffic.leader) and (record is None or record.address):
            traffic.leader = record
            traffic.leader_changed.set()
            traffic.leader_changed = trio.Event()
        await trio.sleep(0.05)


def _who(record: MasterRecord | None) -> tuple[int, str] | None:
    return None if record is None else (record.epoch, record.address)


async def produce(label: str, traffic: Traffic) -> None:
    """Send unique keys to the current master; a key is retried (same key) until SEND_OK.

    One producer per master, kept for every key sent to it: its round robin then spreads
    the keys over the topic's queues (a producer per key would start its round robin anew
    each time and put every key on one queue, leaving all but one pull consumer idle)."""
    keys = (f"{label}-{i}" for i in itertools.count())
    key = next(keys)
    while not traffic.stop:  # until the end of the campaign
        leader = traffic.leader
        if leader is None:
            await traffic.leader_changed.wait()
            continue
        config = ClientConfig(namesrv_addr=leader.address, request_timeout=2.0)
        try:
            async with Producer(config, group="campaign", retry_times=0) as producer:
                while traffic.leader == leader and not traffic.stop:
                    traffic.sending += 1
                    try:
                        receipt = await producer.send(Message(TOPIC, key.encode(), keys=[key]))
                    finally:
                        traffic.sending -= 1
                    if receipt.status is SendStatus.SEND_OK:
                        traffic.ack(key, leader.epoch)
                        key = next(keys)
                    else:
                        traffic.ambiguous += 1  # stored, not acknowledged: retried
        except* trio.Cancelled:  # the campaign's end: errors beside it are moot
            raise
        except* Exception as exc:  # every failure is retried; the kind is reported
            traffic.failed += 1
            cause: BaseException = exc
            while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
                cause = cause.exceptions[0]  # the cause, not trio's wrapper
            traffic.last_error = f"{type(cause).__name__}: {cause}"[:200]
            await trio.sleep(0.05)


async def consume(label: str, traffic: Traffic, until: trio.Event) -> None:
    """Pop from the current master (broker-side balancing), ack what arrives; a new
    consumer for every new master. Runs until ``until`` is set."""
    group = traffic.groups["pop"]
    while not until.is_set():
        leader = traffic.leader
        if leader is None:
            await traffic.leader_changed.wait()
            continue
        config = ClientConfig(namesrv_addr=leader.address, request_timeout=3.0)
        try:
            async with SimpleConsumer(
                config, group="campaign-pop", subscription={TOPIC: "*"}, await_duration=1.0,
                consume_from="first",
            ) as consumer:  # fmt: skip
                while traffic.leader == leader and not until.is_set():
                    messages = await consumer.receive(32, invisible_duration=20.0)
                    for m in messages:
                        group.got(m.body.decode(), leader.epoch)
                    await consumer.ack_many(messages)
        except* trio.Cancelled:  # the campaign's end: errors beside it are moot
            raise
        except* Exception:  # a dead master, a refused pop: counted, tried again
            group.errors += 1
            await trio.sleep(0.1)


async def pull_consume(label: str, traffic: Traffic, until: trio.Event) -> None:
    """A pull-mode ``PushConsumer`` (client-side rebalance among the group's members,
    offsets committed to the broker) on the current master; a new one for every new master,
    which starts each queue from the group's committed offset there (what the last offset
    snapshot brought it: up to ~3 s behind, hence redeliveries). Runs until ``until``."""
    group = traffic.groups["pull"]
    while not until.is_set():
        leader = traffic.leader
        if leader is None:
            await traffic.leader_changed.wait()
            continue
        listener = _counting_listener(group, leader.epoch)
        config = ClientConfig(namesrv_addr=leader.address, request_timeout=3.0)
        try:
            async with PushConsumer(
                config, group="campaign-pull", subscription={TOPIC: "*"}, listener=listener,
                mode="pull", consume_from="first", shutdown_timeout=5.0,
            ) as consumer:  # fmt: skip
                _log.info("pull session", consumer=label, epoch=leader.epoch)
                while traffic.leader == leader and not until.is_set():
                    await traffic.leader_changed.wait()  # set on a change and at the end
                _log.info(
                    "pull session ends", consumer=label, epoch=leader.epoch,
                    queues=[f"{q.topic}:{q.queue_id}" for q in consumer.assigned_queues],
                    consumed=consumer.statistics().consumed,
                )  # fmt: skip
        except* trio.Cancelled:  # the campaign's end: errors beside it are moot
            raise
        except* Exception:  # a dead master on entering: counted, tried again
            group.errors += 1
            await trio.sleep(0.1)


def _counting_listener(
    group: Group, epoch: int
) -> Callable[[ReceivedMessage], Awaitable[ConsumeResult]]:
    """A listener counting each message for ``group`` as received from ``epoch``'s master."""

    async def listener(message: ReceivedMessage) -> ConsumeResult:
        group.got(message.body.decode(), epoch)
        return ConsumeResult.SUCCESS

    return listener


async def wait_master(client: EtcdClient) -> MasterRecord:
    with trio.fail_after(WAIT_S):
        for _ in itertools.count():  # etcd is another process: read again
            try:
                master = await read_master(client, KEYS)
            except EtcdError:  # a slow etcd under load: read again
                master = None
            if master is not None:
                return master
            await trio.sleep(0.05)
    raise AssertionError("unreachable")


async def wait_insync(client: EtcdClient, count: int) -> None:
    with trio.fail_after(WAIT_S):
        for _ in itertools.count():  # etcd is another process: read again
            try:
                found = await read_insync(client, KEYS)
            except EtcdError:
                found = None
            if found is not None and len(found.members) >= count:
                return
            await trio.sleep(0.1)


def stored_keys(data_dir: Path) -> tuple[Counter[str], dict[str, Any]]:
    """Every copy of every key in the store at ``data_dir`` (opened read-only in effect:
    the broker is stopped), and its epoch history."""
    store = MessageStore.open(StoreConfig(data_dir=data_dir, segment_size=8 << 20, replica=True))
    copies: Counter[str] = Counter()
    try:
        for queue_id in store.topics().get(TOPIC, []):
            offset = 0
            for _ in range(10_000_000):  # bounded: 256 messages per read
                result = store.get(TOPIC, queue_id, offset, 256)
                if not result.count:
                    break
                for record in decode_records(result.body):
                    copies[record.body.decode()] += 1
                offset = result.next_offset
    finally:
        store.close()
    epochs_file = data_dir / "config" / "haEpoch"
    history = json.loads(epochs_file.read_text()) if epochs_file.exists() else {}
    return copies, history


async def campaign(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    etcd = EtcdCluster.start(root / "etcd")
    brokers = [BrokerProc(slot, root / f"b{slot}", root / f"b{slot}.log") for slot in (1, 2, 3)]
    failovers: list[Failover] = []
    traffic = Traffic()
    traffic.groups = {
        "pop": Group("pop", args.consumers),
        "pull": Group("pull", args.pull_consumers),
    }
    client = EtcdClient(parse_endpoints(etcd.endpoints))
    epochs_seen: list[int] = []
    try:
        # Slot 3 starts the group as broker id 0; slots 1 and 2 are replicas 1 and 2.
        for b in brokers:
            await b.start(0 if b.slot == 3 else b.slot, etcd.endpoints, args.ttl)
        await wait_insync(client, 3)
        drained = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_leader, client, traffic)
            for n in range(args.producers):
                nursery.start_soon(produce, f"p{n}", traffic)
            for n in range(args.consumers):
                nursery.start_soon(consume, f"c{n}", traffic, drained)
            for n in range(args.pull_consumers):
                nursery.start_soon(pull_consume, f"pc{n}", traffic, drained)
            for round_no in range(args.kills):
                await trio.sleep(rng.uniform(0.5, 2.5))
                # Under load a master may lose its lease on its own (a spontaneous
                # failover): wait for the group to have one again rather than fail.
                master = await wait_master(client)
                epochs_seen.append(master.epoch)
                victim = next(b for b in brokers if b.address == master.address)
                before = len(traffic.acked)
                killed = time.monotonic()
                await victim.kill9()
                failover = Failover(victim.slot, master.epoch, killed_at=killed)
                with trio.fail_after(WAIT_S):
                    while True:  # bounded by fail_after
                        new = await wait_master(client)
                        if new.epoch != master.epoch:
                            break
                        await trio.sleep(0.02)
                failover.new_epoch = new.epoch
                failover.election_s = time.monotonic() - killed
                # The first SEND_OK from the new master (replies of the old one may still
                # arrive after the kill).
                with trio.fail_after(WAIT_S):
                    while not any(e == new.epoch for _, e in traffic.acked.values()):  # bounded
                        await traffic.acked_event.wait()
                first = min(t for t, e in traffic.acked.values() if e == new.epoch)
                failover.unavailable_s = first - killed
                failovers.append(failover)
                # The killed broker comes back as a replica of the new master.
                (victim.data_dir / "config" / "haRole").unlink(missing_ok=True)
                await victim.start(victim.slot, etcd.endpoints, args.ttl)
                await wait_insync(client, 3)
                print(
                    f"round {round_no + 1}/{args.kills}: killed slot {victim.slot} "
                    f"(epoch {failover.old_epoch} -> {failover.new_epoch}), election "
                    f"{failover.election_s:.2f} s, unavailable {failover.unavailable_s:.2f} s, "
                    f"acked {len(traffic.acked)} (+{len(traffic.acked) - before})",
                    flush=True,
                )
            await trio.sleep(1.0)
            traffic.stop = True  # producers stop; consumers drain what was acknowledged
            with trio.move_on_after(WAIT_S):
                for _ in itertools.count():  # bounded: each send has its request timeout
                    if not traffic.sending:
                        break
                    await trio.sleep(0.05)
            drain_started = time.monotonic()
            with trio.move_on_after(args.drain_s):
                for _ in itertools.count():  # bounded by move_on_after
                    if not any(g.missing(traffic.acked) for g in traffic.groups.values()):
                        break
                    await trio.sleep(0.2)
            drain_s = time.monotonic() - drain_started
            drained.set()
            traffic.leader_changed.set()
            nursery.cancel_scope.cancel()
        final = await read_master(client, KEYS)
        assert final is not None
        final_broker = next(b for b in brokers if b.address == final.address)
    finally:
        for b in brokers:
            with trio.CancelScope(shield=True):
                await b.stop()
        etcd.stop()
    copies, history = stored_keys(final_broker.data_dir)
    lost = sorted(set(traffic.acked) - set(copies))
    duplicates = sum(n - 1 for n in copies.values() if n > 1)
    unavailable = [f.unavailable_s for f in failovers]
    elections = [f.election_s for f in failovers]
    rising = all(b > a for a, b in itertools.pairwise([f.old_epoch for f in failovers]))
    groups = {kind: g.report(traffic.acked) for kind, g in traffic.groups.items() if g.consumers}
    reports = [f.report(traffic.groups) for f in failovers]
    resumed = {
        kind: _summary([r[kind] for r in (f["consumer_resumed_s"] for f in reports) if r[kind]])
        for kind in groups
    }
    pop = groups.get("pop", {})
    return {
        "kills": len(failovers),
        "ttl_s": args.ttl,
        "producers": args.producers,
        "acknowledged": len(traffic.acked),
        "stored_keys": len(copies),
        "lost": len(lost),
        "lost_sample": lost[:10],
        "duplicates": duplicates,
        "failed_sends": traffic.failed,
        # The pop group's figures under their first names (earlier runs' JSON); every
        # group's, pull included, under "groups".
        "consumers": args.consumers,
        "received_keys": pop.get("received_keys", 0),
        "acknowledged_not_received": pop.get("acknowledged_not_received"),
        "received_more_than_once": pop.get("received_more_than_once", 0),
        "consume_errors": pop.get("errors", 0),
        "pull_consumers": args.pull_consumers,
        "groups": groups,
        "drain_s": round(drain_s, 1),
        "ambiguous_answers": traffic.ambiguous,
        "last_send_error": traffic.last_error,
        "epochs_rising": rising,
        "final_epoch_history": history,
        "election_s": _summary(elections),
        "unavailable_s": _summary(unavailable),
        "consumer_resumed_s": resumed,
        "failovers": reports,
    }


def _append(path: Path) -> BinaryIO:
    """The broker's log file, opened for the child's stderr (a sync open: it is small)."""
    return open(path, "ab")  # closed by the caller once the child has it


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "max": round(ordered[-1], 3),
        "min": round(ordered[0], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=2, help="pop consumers (0: none)")
    parser.add_argument(
        "--pull-consumers", type=int, default=0,
        help="pull-mode push consumers, a second group (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--drain-s", type=float, default=60.0, help="at the end, how long consumers may drain"
    )
    parser.add_argument("--ttl", type=int, default=3, help="--etcd-lease-ttl-s")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--out", help="write the result as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="trimq-campaign-"))
    started = time.monotonic()
    try:
        with open(root / "clients.log", "a") as client_log:
            # The clients log through structlog, whose default prints to stdout: around a
            # kill every pull and pop fails for a while, which would bury the rounds' lines.
            # Info is kept: a pull queue's start offset on each new master is logged there.
            structlog.configure(
                wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
                logger_factory=structlog.PrintLoggerFactory(client_log),
            )
            result = trio.run(campaign, args, root)
    finally:
        if not args.keep:  # also after a failure: logs are kept only on request
            shutil.rmtree(root, ignore_errors=True)
    result["seconds"] = round(time.monotonic() - started, 1)
    result["work_dir"] = str(root) if args.keep else None
    for kind, group in result["groups"].items():
        print(
            f"{kind} consumers ({group['consumers']}): {group['acknowledged_not_received']} "
            f"acknowledged keys missing, {group['received_more_than_once']} "
            f"({group['received_more_than_once_pct']}%) received more than once, resumed "
            f"after a kill {result['consumer_resumed_s'][kind]}",
            flush=True,
        )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    # Failure: an acknowledged message not stored, or not received by a consumer group.
    missing = any(g["acknowledged_not_received"] for g in result["groups"].values())
    return 1 if result["lost"] or missing else 0


if __name__ == "__main__":
    sys.exit(main())
