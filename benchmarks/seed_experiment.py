"""Seed 000's experiment on a real broker: how late does a retried pop message come back?

RocketMQ pop mode moves an unacknowledged message to a retry topic at its deadline. With V1
retry names (``%RETRY%group_topic``) the broker wakes no parked pop, so the retry waits for
the consumer's long-poll timeout (the seed measured 14955 ms); with V2 names it wakes every
group of the original topic, all but one for nothing; the fix wakes only the owning group.
trimq keeps all three behaviours selectable (``--wake-mode targeted|topic|none``), so this
script runs one broker subprocess per (retry naming, variant, wake mode) and measures:

* per round (``--rounds``), ``--messages`` N messages are sent in a burst; once the other
  groups have acked them, one *failing* consumer group pops them in ``--waves`` pops
  ``--wave-gap-ms`` apart (``--invisible-ms`` each; a wave shares one deadline), acks none of
  them, then long-polls with ``--poll-ms`` (15 s); every retried message it receives is acked.
  Each message's *delay past the deadline* is its receive time minus its
  ``REVIVE_DEADLINE_MS`` property (the expired lease's deadline, epoch ms), measured
  client-side; *pop to redelivery* is the receive time minus the pop time in the receipt (the
  seed's "time since first failure");
* ``--others`` K other groups subscribed to the same topic consume and ack everything and sit
  long-polling with the same poll time: in ``topic`` mode each retry wakes them for nothing;
* variant ``idle``: no other traffic; variant ``producer``: a producer sends ``--rate`` msg/s
  to the same topic for the whole run (the seed's experiment 2: new messages happen to wake
  the consumer).

After the broker is stopped (SIGTERM by pid) its latency events (``--metrics-dir``, schema in
``broker/metrics.py``) are read back and give the cross-check: ``revive`` (deadline -> copy
written), ``redeliver`` (deadline -> handed to the consumer), ``wakeup`` events with ``found``
(``found=false`` is a wasted wake-up). *Retry wake-ups* are the wake-ups within
:data:`WAKE_WINDOW_MS` after a revive (any group), leaving out those near a send. A second
table splits each revive instant's delay into deadline -> first copy written -> re-read by the
woken pop -> reply bytes at the client -> decoded (broker event timestamps and two client
ones), and lists how late each run's first revive instant was (it also creates the retry
topic).

Everything binds to 127.0.0.1; every wait is bounded. Usage::

    python -m benchmarks.seed_experiment [--messages 20] [--rounds 3] [--waves 4]
        [--invisible-ms 2000] [--poll-ms 15000] [--others 3] [--modes targeted,topic,none]
        [--variant idle,producer] [--retry-naming v2,v1] [--repeat 1] [--json out.json]
        [--quick]

Each run's latency events are copied to ``--events-dir``/<run tag>/ (default
:data:`DEFAULT_EVENTS_DIR`, ``--events-dir ''`` keeps none), where ``make analyze`` (the
PySpark job, ``analytics/``) reads them. The events carry the wake mode but not the retry
naming or the variant, so pick one naming and one variant for a run meant for the job.

With ``--repeat`` the whole matrix runs that often; the table pools the samples of a
configuration (p50 / p99 / max over all of them) and lists each run's p50 beside.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import trio

from benchmarks.bench_broker import broker_subprocess
from broker.metrics import read_events
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.send import SendMessageRequestHeader, send_header_to_v2_ext
from protocol.properties import REVIVE_DEADLINE_MS, encode_properties
from tests.broker.client import BrokerClient, open_client, open_client_of
from tests.broker.pop_client import Popped, ack, pop

ROOT = Path(__file__).resolve().parent.parent
#: Where each run's metrics dir is copied (``make analyze`` reads it, ``EVENTS=`` overrides).
DEFAULT_EVENTS_DIR = ROOT / "data" / "seed-events"
#: A file in an events dir that says it is ours to clear at the next run.
EVENTS_MARKER = ".seed-events"
TOPIC = "SeedTopic"
QUEUES = 4
FAILING_GROUP = "seed_failing_group"
OTHER_GROUP = "seed_other_group_{}"
SEED_PREFIX = b"seed-"
LIVE_PREFIX = b"live-"
#: A wake-up at most this long after a revive counts as caused by it.
WAKE_WINDOW_MS = 50.0
#: Upper bounds on loops (they end much earlier; these only keep a bug from spinning).
MAX_POPS_PER_WAVE = 100
MAX_POLLS = 10_000
MODES = ("targeted", "topic", "none")
VARIANTS = ("idle", "producer")
NAMINGS = ("v2", "v1")


def wall_ms() -> float:
    """Wall clock, epoch milliseconds (the clock of ``REVIVE_DEADLINE_MS`` and receipts)."""
    return time.time_ns() / 1e6


def percentile(sorted_vals: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted values (NaN when empty)."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def summary(values: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max / n of ``values``."""
    v = sorted(values)
    return {
        "p50": percentile(v, 50),
        "p99": percentile(v, 99),
        "max": v[-1] if v else float("nan"),
        "n": float(len(v)),
    }


# ---------------------------------------------------------------- parameters and results
@dataclass(frozen=True)
class Params:
    """One experiment's settings (see the module docstring)."""

    messages: int
    rounds: int
    waves: int
    wave_gap_ms: int
    invisible_ms: int
    poll_ms: int
    others: int
    rate: float
    verbose: bool = False

    def wave_sizes(self) -> list[int]:
        """How many messages each wave pops (N split as evenly as possible, none empty)."""
        waves = max(1, min(self.waves, self.messages))
        base, extra = divmod(self.messages, waves)
        return [base + (1 if i < extra else 0) for i in range(waves)]


@dataclass
class ClientSide:
    """What the consumers and the producer saw."""

    #: Receive time - REVIVE_DEADLINE_MS of every retried message (ms).
    past_deadline_ms: list[float] = field(default_factory=list)
    #: Receive time - pop time of the first delivery (the seed's "since first failure").
    since_pop_ms: list[float] = field(default_factory=list)
    #: (REVIVE_DEADLINE_MS, reply bytes decoded by the client's reader, pop returned) of
    #: every retried message, epoch ms.
    deliveries: list[tuple[int, float, float]] = field(default_factory=list)
    #: Past the deadline at the run's first revive instant (one value per run): the first
    #: revive into a retry topic also creates that topic.
    first_instant_ms: list[float] = field(default_factory=list)
    #: Our own deadline (pop time + invisible time) - REVIVE_DEADLINE_MS: must be 0.
    deadline_mismatch: int = 0
    #: Seed messages popped and never seen again within the bound.
    missing: int = 0
    #: Seed messages delivered a first time again (should never happen).
    unexpected: int = 0
    live_sent: int = 0
    #: (before send, after reply) of each live message and each round's burst, epoch ms.
    send_windows: list[tuple[float, float]] = field(default_factory=list)
    #: Start and end of the measured phase (first wave pop -> last retry), epoch ms.
    started_ms: float = 0.0
    ended_ms: float = 0.0


@dataclass
class BrokerSide:
    """What the broker's latency events say about the measured phase."""

    revive_ms: list[float] = field(default_factory=list)
    redeliver_ms: list[float] = field(default_factory=list)
    wakeups: int = 0
    wasted: int = 0
    retry_wakeups_owner: int = 0
    retry_wakeups_others: int = 0
    wasted_by_group: dict[str, int] = field(default_factory=dict)
    events: int = 0
    #: Per retried batch (one deadline), ms: deadline -> first copy written (deadline loop),
    #: -> re-read by the woken pop (copies put, dispatch, hub, task switch, read), -> reply
    #: bytes at the client (response, loopback, client wake-up), -> ``pop`` returned (client
    #: decode).
    to_written_ms: list[float] = field(default_factory=list)
    to_reread_ms: list[float] = field(default_factory=list)
    to_arrived_ms: list[float] = field(default_factory=list)
    to_decoded_ms: list[float] = field(default_factory=list)


@dataclass
class RunResult:
    """One (naming, variant, mode) run."""

    naming: str
    variant: str
    mode: str
    seconds: float
    #: 1-minute load average when the run ended (the machine has 2 shared cores).
    load: float
    client: ClientSide
    broker: BrokerSide


# ---------------------------------------------------------------- broker process
@dataclass(frozen=True)
class BrokerProc:
    pid: int
    port: int
    data_dir: Path
    metrics_dir: Path
    log_path: Path


@contextmanager
def broker_process(work: Path, mode: str, naming: str, tag: str) -> Iterator[BrokerProc]:
    """``python -m broker`` on 127.0.0.1, any free port, with this wake mode and retry naming;
    stopped with SIGTERM (by pid) on exit. The data dir is left for the caller."""
    data_dir = work / f"broker-{tag}"
    metrics_dir = data_dir / "metrics"
    log_path = work / f"broker-{tag}.log"
    data_dir.mkdir(parents=True)
    args = ("--metrics-dir", str(metrics_dir), "--wake-mode", mode, "--retry-naming", naming)
    with broker_subprocess(data_dir, log_path, *args, segment_size=64 * 1024 * 1024) as (
        pid,
        port,
    ):
        yield BrokerProc(pid, port, data_dir, metrics_dir, log_path)


# ---------------------------------------------------------------- client helpers
class StampedClient(BrokerClient):
    """The test client, noting when its reader last decoded bytes from the broker: for the
    failing consumer, whose pops are one at a time, that is when a pop's reply arrived (before
    ``pop`` decodes the records and builds receipts)."""

    arrived_ms: float = 0.0

    def _wake(self) -> None:
        self.arrived_ms = wall_ms()
        super()._wake()


def open_stamped_client(port: int) -> AbstractAsyncContextManager[StampedClient]:
    """:func:`tests.broker.client.open_client` for a :class:`StampedClient`."""
    return open_client_of(StampedClient, port)


def check(reply_code: int, remark: str | None, what: str) -> None:
    if reply_code != ResponseCode.SUCCESS:
        raise RuntimeError(f"{what}: code {reply_code} {remark}")


async def create_topic(client: BrokerClient) -> None:
    ext = {"topic": TOPIC, "defaultTopic": "TBW102", "readQueueNums": str(QUEUES),
           "writeQueueNums": str(QUEUES), "perm": "6", "topicFilterType": "SINGLE_TAG",
           "order": "false"}  # fmt: skip
    reply = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, ext)
    check(reply.code, reply.remark, "create topic")


async def send(client: BrokerClient, body: bytes, queue_id: int) -> None:
    header = SendMessageRequestHeader(
        producer_group="seed_producer_group", topic=TOPIC, default_topic="TBW102",
        default_topic_queue_nums=QUEUES, queue_id=queue_id, sys_flag=0,
        born_timestamp=int(wall_ms()), flag=0,
        properties=encode_properties({"UNIQ_KEY": body.decode(), "WAIT": "true"}),
    )  # fmt: skip
    reply = await client.call(RequestCode.SEND_MESSAGE_V2, send_header_to_v2_ext(header), body)
    check(reply.code, reply.remark, "send")


async def pop_some(
    client: BrokerClient, group: str, p: Params, *, max_nums: int, poll_ms: int
) -> tuple[int, list[Popped]]:
    """One pop; the response code and the messages."""
    reply, got = await pop(
        client, group, TOPIC, max_nums=max_nums, invisible_ms=p.invisible_ms,
        poll_ms=poll_ms, timeout=poll_ms / 1000 + 10,
    )  # fmt: skip
    if reply.code not in (ResponseCode.SUCCESS, ResponseCode.POLLING_TIMEOUT):
        raise RuntimeError(f"pop by {group}: code {reply.code} {reply.remark}")
    return reply.code, got


async def ack_all(client: BrokerClient, group: str, popped: Sequence[Popped]) -> None:
    """Ack all of them at once (pipelined on the connection, as a real client's acks are
    concurrent): the next pop is not held back by one round trip per message."""

    async def one(msg: Popped) -> None:
        reply = await ack(client, group, msg)
        check(reply.code, reply.remark, f"ack by {group}")

    async with trio.open_nursery() as nursery:
        for msg in popped:
            nursery.start_soon(one, msg)


# ---------------------------------------------------------------- the actors
class Acked:
    """Seed messages acked by each healthy group, with an event for "a count changed"."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._changed = trio.Event()

    def add(self, group: str, n: int) -> None:
        self.counts[group] = self.counts.get(group, 0) + n
        self._changed.set()
        self._changed = trio.Event()

    async def wait_all(self, n: int) -> None:
        """Until every group acked at least ``n`` (bound it from outside)."""
        while any(c < n for c in self.counts.values()):
            await self._changed.wait()


async def other_consumer(
    port: int,
    group: str,
    p: Params,
    acked: Acked,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """A healthy group: long-poll and ack everything until cancelled, counting in ``acked``
    the seed messages it acked."""
    async with open_client(port) as client:
        acked.add(group, 0)
        task_status.started()
        for _ in range(MAX_POLLS):
            _, got = await pop_some(client, group, p, max_nums=32, poll_ms=p.poll_ms)
            await ack_all(client, group, got)
            acked.add(group, sum(1 for g in got if g.msg.body.startswith(SEED_PREFIX)))


async def producer(port: int, p: Params, out: ClientSide) -> None:
    """``p.rate`` messages a second to the topic until cancelled."""
    async with open_client(port) as client:
        start = trio.current_time()
        for i in range(MAX_POLLS):
            await trio.sleep_until(start + i / p.rate)
            before = wall_ms()
            await send(client, LIVE_PREFIX + str(i).encode(), i % QUEUES)
            out.send_windows.append((before, wall_ms()))
            out.live_sent += 1


async def failing_round(client: StampedClient, p: Params, out: ClientSide) -> None:
    """Pop N messages in waves without acking them, then long-poll until every one came back
    as a retry (acking those and any new message)."""
    pending: dict[bytes, int] = {}  # body -> pop time (epoch ms) of its first delivery
    sizes = p.wave_sizes()
    for w, size in enumerate(sizes):
        taken, code = 0, -1
        for _ in range(MAX_POPS_PER_WAVE):
            if taken >= size:
                break
            code, got = await pop_some(client, FAILING_GROUP, p, max_nums=size - taken, poll_ms=0)
            live = []
            for one in got:
                if one.msg.body.startswith(SEED_PREFIX) and one.msg.reconsume_times == 0:
                    pending[one.msg.body] = one.receipt.pop_time_ms
                    taken += 1
                else:
                    live.append(one)
            await ack_all(client, FAILING_GROUP, live)
            if not got:
                await trio.sleep(0.01)
        if taken < size:
            raise RuntimeError(f"wave {w}: popped {taken} of {size} messages (last code {code})")
        if w + 1 < len(sizes):
            await trio.sleep(p.wave_gap_ms / 1000)
    last_deadline = max(pending.values()) + p.invisible_ms
    bound_s = (last_deadline - wall_ms()) / 1000 + p.poll_ms / 1000 + 10
    with trio.move_on_after(bound_s):
        for _ in range(MAX_POLLS):
            if not pending:
                break
            _, got = await pop_some(client, FAILING_GROUP, p, max_nums=32, poll_ms=p.poll_ms)
            received = wall_ms()
            for one in got:
                body = one.msg.body
                if body in pending and one.msg.reconsume_times >= 1:
                    deadline = int(one.msg.properties.get(REVIVE_DEADLINE_MS, "0"))
                    popped_at = pending.pop(body)
                    if popped_at + p.invisible_ms != deadline:
                        out.deadline_mismatch += 1
                    out.past_deadline_ms.append(received - deadline)
                    out.since_pop_ms.append(received - popped_at)
                    out.deliveries.append((deadline, client.arrived_ms, received))
                    out.ended_ms = received
                elif body.startswith(SEED_PREFIX):
                    out.unexpected += 1
            await ack_all(client, FAILING_GROUP, got)
    out.missing += len(pending)


async def experiment(port: int, p: Params, variant: str) -> ClientSide:
    """The whole client side of one run: per round, N messages are sent in a burst, the
    other groups consume them, then the failing group pops them and lets them expire."""
    out = ClientSide()
    acked = Acked()
    async with open_client(port) as admin, trio.open_nursery() as nursery:
        await create_topic(admin)
        for k in range(p.others):
            await nursery.start(other_consumer, port, OTHER_GROUP.format(k), p, acked)
        if variant == "producer":
            nursery.start_soon(producer, port, p, out)
        await trio.sleep(0.5)  # let the other groups park
        async with open_stamped_client(port) as client:
            out.started_ms = wall_ms()
            for r in range(p.rounds):
                await trio.sleep(0.2)  # keep the burst apart from the last round's retries
                before = wall_ms()
                for i in range(p.messages):
                    await send(admin, SEED_PREFIX + f"{r}-{i}".encode(), i % QUEUES)
                out.send_windows.append((before, wall_ms()))
                with trio.fail_after(10):  # the other groups have them all: no traffic left
                    await acked.wait_all((r + 1) * p.messages)
                try:
                    await failing_round(client, p, out)
                except RuntimeError as exc:
                    raise RuntimeError(f"round {r + 1}: {exc}") from exc
                if p.verbose:
                    print(f"    round {r + 1}/{p.rounds} done", flush=True)
        await trio.sleep(0.3)  # let late wake-ups (if any) show up in the events
        nursery.cancel_scope.cancel()
    if out.deliveries:
        first = min(d for d, _, _ in out.deliveries)
        out.first_instant_ms.append(min(r for d, _, r in out.deliveries if d == first) - first)
    return out


# ---------------------------------------------------------------- broker events
def broker_side(metrics_dir: Path, client: ClientSide) -> BrokerSide:
    """Sum up the broker's events of the measured phase."""
    out = BrokerSide()
    events = [e for e in read_events(metrics_dir) if e["ts_ms"] >= client.started_ms - 1]
    out.events = len(events)
    revives = sorted(e["ts_ms"] for e in events if e["kind"] == "revive")
    out.revive_ms = [e["latency_ms"] for e in events if e["kind"] == "revive"]
    out.redeliver_ms = [
        e["latency_ms"] for e in events if e["kind"] == "redeliver" and e["group"] == FAILING_GROUP
    ]
    for e in events:
        if e["kind"] != "wakeup":
            continue
        out.wakeups += 1
        if e["found"] is False:
            out.wasted += 1
            out.wasted_by_group[e["group"]] = out.wasted_by_group.get(e["group"], 0) + 1
        ts = e["ts_ms"]
        near_revive = any(r <= ts <= r + WAKE_WINDOW_MS for r in revives)
        near_send = any(a - 1 <= ts <= b + WAKE_WINDOW_MS for a, b in client.send_windows)
        if near_revive and not near_send:
            if e["group"] == FAILING_GROUP:
                out.retry_wakeups_owner += 1
            else:
                out.retry_wakeups_others += 1
    breakdown(events, client, out)
    return out


def _at(events: Sequence[dict[str, Any]], deadline: int) -> list[float]:
    """Timestamps of the events about a lease with this deadline: ``latency_ms`` is
    ``now_ms - deadline`` with ``now_ms`` an int taken before the event's float ``ts_ms``, so
    ``ts_ms - latency_ms`` is the deadline plus a little (deadlines are >= 100 ms apart)."""
    return sorted(
        e["ts_ms"]
        for e in events
        if deadline - 0.5 <= e["ts_ms"] - e["latency_ms"] <= deadline + 10
    )


def breakdown(events: Sequence[dict[str, Any]], client: ClientSide, out: BrokerSide) -> None:
    """Split deadline -> client receive into spans, per deadline (see BrokerSide)."""
    revives = [e for e in events if e["kind"] == "revive"]
    redelivers = [e for e in events if e["kind"] == "redeliver" and e["group"] == FAILING_GROUP]
    first: dict[int, tuple[float, float]] = {}
    for deadline, arrived, returned in client.deliveries:
        if deadline not in first or returned < first[deadline][1]:
            first[deadline] = (arrived, returned)
    for deadline, (arrived, returned) in sorted(first.items()):
        written = _at(revives, deadline)
        reread = _at(redelivers, deadline)
        if not written or not reread or not written[0] <= reread[0] <= arrived <= returned:
            continue
        out.to_written_ms.append(written[0] - deadline)
        out.to_reread_ms.append(reread[0] - written[0])
        out.to_arrived_ms.append(arrived - reread[0])
        out.to_decoded_ms.append(returned - arrived)


# ---------------------------------------------------------------- report
def fmt(v: float) -> str:
    if math.isnan(v):
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


HEADER = (
    "| naming | variant | wake mode | retries (revive batches) "
    "| past deadline p50 / p99 / max (ms) | p50 of each run (ms) | pop → redelivery p50 (ms) "
    "| retry wake-ups owner + others | wasted wake-ups "
    "| broker: revive lag p50 / redeliver p50 (ms) |"
)
_D = TypeVar("_D", ClientSide, BrokerSide)


def merged(items: Sequence[_D]) -> _D:
    """The runs' samples pooled and their counts summed (one result per configuration)."""
    out = type(items[0])()
    for f in dataclasses.fields(out):
        values = [getattr(x, f.name) for x in items]
        value: Any
        if isinstance(values[0], list):
            value = [v for vs in values for v in vs]
        elif isinstance(values[0], dict):
            value = {}
            for d in values:
                for k, n in d.items():
                    value[k] = value.get(k, 0) + n
        elif f.name in ("started_ms", "ended_ms"):
            value = values[0]
        else:
            value = sum(values)
        setattr(out, f.name, value)
    return out


def pooled(results: Sequence[RunResult]) -> list[tuple[RunResult, list[float]]]:
    """Per (naming, variant, mode), in first-seen order: the pooled result and each run's
    p50 past the deadline."""
    groups: dict[tuple[str, str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.naming, r.variant, r.mode), []).append(r)
    out = []
    for (naming, variant, mode), runs in groups.items():
        pool = RunResult(
            naming, variant, mode, sum(r.seconds for r in runs), max(r.load for r in runs),
            merged([r.client for r in runs]), merged([r.broker for r in runs]),
        )  # fmt: skip
        out.append((pool, [summary(r.client.past_deadline_ms)["p50"] for r in runs]))
    return out


def batches(c: ClientSide) -> int:
    """Distinct deadlines among the retried messages (each is one revive instant)."""
    return len({deadline for deadline, _, _ in c.deliveries})


def table(results: Sequence[RunResult]) -> str:
    lines = [HEADER, "|" + "---|" * 10]
    for r, p50s in pooled(results):
        past = summary(r.client.past_deadline_ms)
        since = summary(r.client.since_pop_ms)
        revive = summary(r.broker.revive_ms)
        redeliver = summary(r.broker.redeliver_ms)
        retries = f"{len(r.client.past_deadline_ms)} ({batches(r.client)})"
        if r.client.missing:
            retries += f", {r.client.missing} missing"
        lines.append(
            f"| {r.naming} | {r.variant} | {r.mode} | {retries} "
            f"| {fmt(past['p50'])} / {fmt(past['p99'])} / {fmt(past['max'])} "
            f"| {', '.join(fmt(v) for v in p50s)} "
            f"| {fmt(since['p50'])} "
            f"| {r.broker.retry_wakeups_owner} + {r.broker.retry_wakeups_others} "
            f"| {r.broker.wasted} "
            f"| {fmt(revive['p50'])} / {fmt(redeliver['p50'])} |"
        )
    return "\n".join(lines)


def breakdown_table(results: Sequence[RunResult]) -> str:
    lines = [
        "| naming | variant | wake mode | batches | deadline → copy written "
        "| → re-read | → reply at client | → decoded | sum of p50s "
        "| first revive instant of each run: past deadline |",
        "|" + "---|" * 10,
    ]
    for r, _ in pooled(results):
        b = r.broker
        spans = [b.to_written_ms, b.to_reread_ms, b.to_arrived_ms, b.to_decoded_ms]
        p50s = [summary(x)["p50"] for x in spans]
        lines.append(
            f"| {r.naming} | {r.variant} | {r.mode} | {len(b.to_written_ms)} | "
            + " | ".join(fmt(v) for v in p50s)
            + f" | {fmt(sum(p50s))} | {', '.join(fmt(v) for v in r.client.first_instant_ms)} |"
        )
    return "\n".join(lines)


def checks(r: RunResult, p: Params) -> list[str]:
    """Things that contradict the expected shape or the cross-check, in words."""
    notes: list[str] = []
    c, b = r.client, r.broker
    expected = p.rounds * p.messages
    if len(c.past_deadline_ms) != expected:
        notes.append(f"{len(c.past_deadline_ms)} of {expected} retries received")
    if c.unexpected or c.deadline_mismatch:
        notes.append(f"{c.unexpected} unexpected, {c.deadline_mismatch} deadline mismatches")
    if len(b.redeliver_ms) != len(c.past_deadline_ms):
        notes.append(f"broker logged {len(b.redeliver_ms)} redeliveries")
    past = summary(c.past_deadline_ms)
    fast = r.mode == "targeted" or (r.mode == "topic" and r.naming == "v2")
    if fast and past["p50"] > 5:
        notes.append(f"p50 {past['p50']:.1f} ms past the deadline is over 5 ms")
    if r.mode == "targeted" and b.wasted:
        notes.append(f"{b.wasted} wasted wake-ups in targeted mode")
    return notes


# ---------------------------------------------------------------- main
def parse_list(text: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise SystemExit(f"--{what}: expected a comma list of {','.join(allowed)}, got {text!r}")
    return items


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--messages", type=int, help="N messages popped and not acked per round")
    ap.add_argument("--rounds", type=int, help="rounds per run (each costs a poll in none)")
    ap.add_argument("--waves", type=int, help="pops per round, --wave-gap-ms apart")
    ap.add_argument("--wave-gap-ms", type=int)
    ap.add_argument("--invisible-ms", type=int)
    ap.add_argument("--poll-ms", type=int, help="long-poll time of every consumer")
    ap.add_argument("--others", type=int, help="other groups on the topic (ack everything)")
    ap.add_argument("--rate", type=float, default=1.0, help="producer variant: msgs/s")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--variant", default=",".join(VARIANTS))
    ap.add_argument("--retry-naming", help="v2, v1 or both (comma list)")
    ap.add_argument("--repeat", type=int, default=1, help="run the whole matrix this often")
    ap.add_argument("--json", type=Path, help="also write every sample and count here")
    ap.add_argument("--keep", action="store_true", help="keep the brokers' data dirs")
    ap.add_argument("--events-dir", default=str(DEFAULT_EVENTS_DIR),
                    help="copy each run's metrics dir here, replacing the last experiment's "
                         "('' = do not keep)")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="a smoke run (small, 3 s polls)")
    ap.add_argument("-v", "--verbose", action="store_true")
    return ap


#: Defaults of the full run and of ``--quick``.
FULL: dict[str, int] = {"messages": 20, "rounds": 3, "waves": 4, "wave_gap_ms": 250,
                        "invisible_ms": 2000, "poll_ms": 15000, "others": 3}  # fmt: skip
QUICK: dict[str, int] = {"messages": 6, "rounds": 1, "waves": 2, "wave_gap_ms": 100,
                         "invisible_ms": 500, "poll_ms": 3000, "others": 2}  # fmt: skip


def params_from(args: argparse.Namespace) -> Params:
    defaults = QUICK if args.quick else FULL
    values = {k: getattr(args, k) if getattr(args, k) is not None else v
              for k, v in defaults.items()}  # fmt: skip
    p = Params(rate=args.rate, verbose=args.verbose, **values)
    if not (0 < p.messages <= 32 * p.waves and p.rounds > 0 and p.invisible_ms > 0):
        raise SystemExit("need 0 < --messages <= 32 x --waves, --rounds > 0, --invisible-ms > 0")
    if p.poll_ms <= 0 or p.others < 0 or p.rate <= 0:
        raise SystemExit("need --poll-ms > 0, --others >= 0, --rate > 0")
    return p


def prepare_events_dir(text: str) -> Path | None:
    """The events dir, emptied of the last experiment's runs (None when not wanted). A
    non-empty directory without our marker is refused rather than cleared."""
    if not text:
        return None
    events = Path(text)
    if events.exists() and any(events.iterdir()):
        if not (events / EVENTS_MARKER).exists():
            raise SystemExit(f"--events-dir {events}: not empty and not a seed events dir")
        shutil.rmtree(events)
    events.mkdir(parents=True)
    (events / EVENTS_MARKER).write_text("metrics dirs of benchmarks.seed_experiment runs\n")
    return events


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    events_dir = prepare_events_dir(args.events_dir)
    p = params_from(args)
    modes = parse_list(args.modes, MODES, "modes")
    variants = parse_list(args.variant, VARIANTS, "variant")
    naming_text = args.retry_naming or ("v2" if args.quick else "v2,v1")
    namings = parse_list(naming_text, NAMINGS, "retry-naming")
    work = Path(tempfile.mkdtemp(prefix="trimq-seed-"))
    print(f"seed experiment: {p}; modes {modes}, variants {variants}, namings {namings}")
    results: list[RunResult] = []
    matrix = [
        (naming, variant, mode) for naming in namings for variant in variants for mode in modes
    ]
    try:
        for rep in range(max(1, args.repeat)):
            for naming, variant, mode in matrix:
                tag = f"{naming}-{variant}-{mode}-{rep + 1}"
                print(f"  {tag} ...", flush=True)
                started = time.monotonic()
                with broker_process(work, mode, naming, tag) as proc:
                    if p.verbose:
                        print(f"    broker pid {proc.pid} port {proc.port}", flush=True)
                    client = trio.run(experiment, proc.port, p, variant)
                seconds = time.monotonic() - started
                result = RunResult(
                    naming, variant, mode, seconds, os.getloadavg()[0], client,
                    broker_side(proc.metrics_dir, client),
                )  # fmt: skip
                results.append(result)
                past = summary(client.past_deadline_ms)
                print(
                    f"    {seconds:.1f} s: past deadline p50 {fmt(past['p50'])} ms, "
                    f"wasted wake-ups {result.broker.wasted}, load {result.load:.2f}",
                    flush=True,
                )
                if events_dir is not None and proc.metrics_dir.is_dir():
                    shutil.copytree(proc.metrics_dir, events_dir / tag)
                if not args.keep:
                    shutil.rmtree(proc.data_dir, ignore_errors=True)
                    proc.log_path.unlink(missing_ok=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"broker data kept in {work}")
    if events_dir is not None:
        print(f"latency events in {events_dir} (make analyze EVENTS={events_dir})")
    print()
    print(table(results))
    print()
    print(breakdown_table(results))
    problems = [(r, n) for r in results for n in checks(r, p)]
    for r, note in problems:
        print(f"NOTE {r.naming}/{r.variant}/{r.mode}: {note}")
    if args.json:
        payload: dict[str, Any] = {"params": asdict(p), "runs": [asdict(r) for r in results]}
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
