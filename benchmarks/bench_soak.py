"""The soak of issue 17: ~1,000 connections for 10 minutes, slow readers and parked polls;
the broker's RSS must stay bounded and cheap control requests be answered ≤ 50 ms at p99.

Two processes besides the broker (``python -m broker`` of this checkout or of
``--broker-root``, on 127.0.0.1, a free port, a fresh data dir under ``.bench-peers/``,
``--idle-timeout-s`` and ``--max-waiting-per-connection`` as given; stopped by pid with
SIGTERM, then SIGKILL after a bound):

* this process: creates the topics, preloads ``SoakData``, starts the load driver, runs the
  **control** client and samples the broker. The control client, on its own connection,
  sends one request every ``--control-interval-s`` (0.1 s), one in flight, alternating
  GET_BROKER_RUNTIME_INFO (28) and a 128 B SEND_MESSAGE_V2 to ``SoakControl``, and records
  each latency (blocking socket, ``perf_counter_ns``); a reply later than 5 s counts as a
  timeout and the connection is opened again. Every ``--sample-s`` it reads ``VmRSS``,
  ``RssAnon`` and ``RssFile`` of ``/proc/<pid>/status``, the broker's CPU time
  (``/proc/<pid>/stat`` utime + stime), its open descriptors and threads, the connection
  count and commit-log end offset the broker reports in its runtime info, and the CPU the
  rest of the machine used (``/proc/stat`` less the broker, the driver and this process:
  the machine is shared).
* the **load driver** (``--role driver``, one trio process, raw trio sockets, no task per
  request) keeps ``--connections`` connections open for ``--duration-s``:

  - ``pull`` (30 %): PULL_MESSAGE long polls (suspend 10–15 s, capped by the broker at 15 s)
    on empty queues of ``SoakPull*`` topics nobody writes to; ``pop`` (20 %): POP_MESSAGE with
    a 10–15 s poll time on empty ``SoakPop*`` topics. Each connection keeps 4 polls parked and
    parks a new one as each is answered; every ``GREEDY_EVERY``-th keeps
    ``max_waiting + 16`` in flight (16 are refused SYSTEM_BUSY each round), and enough pop
    connections share one key (``SoakPopHot``) that its 1,024-waiter cap answers
    POLLING_FULL. A refused poll is sent again after 5 s (± 50 %).
  - ``slow`` (10 %): SO_RCVBUF of 4 KiB; PULL_MESSAGE of 32 messages at random offsets of
    ``SoakData`` (~13 KB replies) and GET_ROUTEINFO_BY_TOPIC. Half are *stalled*: 1,000
    requests at once (what the socket does not take is pushed again every 10 s), nothing
    ever read; half *trickle*: read 2 KiB every 0.5 s and keep up to 200 requests
    unanswered.
  - ``idle`` (the rest): one HEART_BEAT (a consumer of one of many groups) on connecting,
    then *silent* (half: closed by the broker after ``--idle-timeout-s``; the driver notes
    the silence it took and connects again 0–2 s later) or *quiet* (a HEART_BEAT every
    idle-timeout / 3 s: must never be closed).
  - ``producer`` (2 connections): ``--rate`` SEND_MESSAGE_V2 of ``--size`` B per second
    to ``SoakData`` in 50 ms windows, each window awaited. 300 × 1 KiB grows the commit log
    by ~21 MB a minute, so the newest 64–96 MB that the store keeps in memory (its tail
    cache) reach their bound within the first half of a 10-minute run.

  It counts replies by kind and code (refusals: SYSTEM_BUSY 2, POLLING_FULL 209 …), the
  connections the broker closed, per minute and in total, and prints them as one JSON line.

Output: one JSON line with every figure (``--out`` appends it to a file too), then a human
summary; ``--trace FILE`` writes every sample and control request (with wall-clock times, to
line them up with a broker-side log). RSS "bounded" means the least-squares growth over the
second half of the run is at most max(4 MB, 2 % of the peak); the aims are printed with their
verdicts. For diagnosis: ``--without stalled,trickle`` replaces those kinds by quiet
connections (what do they cost?), ``--attach PID:PORT`` soaks a broker started otherwise
(under a profiler, or a launcher that logs its garbage collections).

Usage: python -m benchmarks.bench_soak [--duration-s 600] [--connections 1000]
    [--idle-timeout-s 30] [--max-waiting 64] [--rate 300] [--size 1024] [--broker-root DIR]
    [--out FILE] [--trace FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_broker import (
    ROOT,
    batch_body,
    broker_subprocess,
    make_payload,
    percentile,
    proc_cpu_seconds,
    send_ext,
)
from benchmarks.bench_pop import cpu_jiffies
from benchmarks.peers import WORK_DIR
from protocol.bodies.heartbeat import (
    ConsumerData,
    ConsumeType,
    HeartbeatData,
    MessageModel,
    SubscriptionData,
)
from protocol.codes import RequestCode, ResponseCode
from protocol.command import FLAG_RESPONSE, RemotingCommand, request
from protocol.frame import FrameDecoder, encode_command
from protocol.headers.admin import CreateTopicRequestHeader
from protocol.headers.pop import PopMessageRequestHeader
from protocol.headers.pull import PullMessageRequestHeader, build_pull_sys_flag
from protocol.headers.route import GetRouteInfoRequestHeader

QUEUES = 4
DATA_TOPIC = "SoakData"
CONTROL_TOPIC = "SoakControl"
HOT_TOPIC = "SoakPopHot"
PARK_TOPICS = 8  #: SoakPull0..7 and SoakPop0..7
PRELOAD_PER_QUEUE = 2000  #: messages of SoakData per queue before the load starts
DATA_SIZE = 256  #: the preloaded messages (what the slow readers pull: ~13 KB replies)
CONTROL_SIZE = 128
PARK_DEPTH = 4  #: polls an ordinary parking connection keeps parked
GREEDY_EVERY = 10  #: every n-th parking connection goes past max_waiting
GREEDY_EXTRA = 16  #: polls beyond max_waiting a greedy connection sends
HOT_DEPTH = 48  #: pops per connection on the hot key
HOT_CAP = 1024  #: parked pops per key (broker.pop.hub.DEFAULT_MAX_PER_KEY)
REFUSED_RETRY_S = 5.0
SLOW_RCVBUF = 4096
STALL_BURST = 1000
POOL = 32  #: pre-encoded frames per kind of request
TRICKLE_READ = 2048
TRICKLE_TICK_S = 0.5
TRICKLE_WINDOW = 200
CONTROL_TIMEOUT_S = 5.0
#: Most of the commit log a broker keeps in memory (broker/store/config.py tail_cache_bytes,
#: 64 MiB, plus the 4 MiB chunk being filled and two spare chunks: broker/store/tail.py).
LOG_TAIL_MAX_MB = 76.0
STOP_TIMEOUT_S = 30.0  #: SIGTERM to SIGKILL, broker and driver alike
REFUSALS: dict[int, str] = {
    ResponseCode.SYSTEM_BUSY: "SYSTEM_BUSY",
    ResponseCode.POLLING_FULL: "POLLING_FULL",
    ResponseCode.SYSTEM_ERROR: "SYSTEM_ERROR",
    ResponseCode.SERVICE_NOT_AVAILABLE: "SERVICE_NOT_AVAILABLE",
}
#: What a parked poll is answered with when nothing arrived: it is parked again at once.
PARK_ANSWERS = frozenset({ResponseCode.PULL_NOT_FOUND, ResponseCode.POLLING_TIMEOUT})


def raise_nofile(want: int) -> int:
    """Raise the soft RLIMIT_NOFILE to ``want`` (at most the hard limit); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return int(soft)


# ---------------------------------------------------------------- requests
def pull_frame(
    opaque: int, topic: str, group: str, queue_id: int, offset: int, suspend_ms: int
) -> bytes:
    header = PullMessageRequestHeader(
        consumer_group=group, topic=topic, queue_id=queue_id, queue_offset=offset,
        max_msg_nums=32, sys_flag=build_pull_sys_flag(
            commit_offset=False, suspend=suspend_ms > 0, subscription=True),
        commit_offset=0, suspend_timeout_millis=suspend_ms, subscription="*", sub_version=0,
    )  # fmt: skip
    return encode_command(request(RequestCode.PULL_MESSAGE, opaque, header.to_ext()))


def pop_frame(opaque: int, topic: str, group: str, poll_ms: int) -> bytes:
    header = PopMessageRequestHeader(
        consumer_group=group, topic=topic, queue_id=-1, max_msg_nums=32, invisible_time=60_000,
        poll_time=poll_ms, born_time=int(time.time() * 1000), init_mode=0, exp_type="TAG",
        exp="*",
    )  # fmt: skip
    return encode_command(request(RequestCode.POP_MESSAGE, opaque, header.to_ext()))


def route_frame(opaque: int, topic: str) -> bytes:
    ext = GetRouteInfoRequestHeader(topic=topic).to_ext()
    return encode_command(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque, ext))


def heartbeat_frame(opaque: int, client_id: str, group: str) -> bytes:
    consumer = ConsumerData(
        group_name=group, consume_type=ConsumeType.CONSUME_PASSIVELY,
        message_model=MessageModel.CLUSTERING,
        subscription_data_set=(SubscriptionData(topic=DATA_TOPIC, sub_string="*"),),
    )  # fmt: skip
    body = HeartbeatData(client_id=client_id, consumer_data_set=(consumer,)).to_json()
    return encode_command(request(RequestCode.HEART_BEAT, opaque, None, body))


def send_frame(opaque: int, topic: str, queue_id: int, size: int) -> bytes:
    cmd = request(RequestCode.SEND_MESSAGE_V2, opaque, send_ext(topic, queue_id),
                  make_payload(size, time.monotonic_ns()))  # fmt: skip
    return encode_command(cmd)


# ---------------------------------------------------------------- driver: bookkeeping
@dataclass
class Tally:
    """What the driver saw, in total and per minute of the run."""

    t0: float
    total: Counter[str] = field(default_factory=Counter)
    minutes: list[Counter[str]] = field(default_factory=list)
    open: int = 0
    peak_open: int = 0
    #: Seconds a silent idle connection was silent before the broker closed it.
    silences: list[float] = field(default_factory=list)

    def add(self, key: str, n: int = 1) -> None:
        self.total[key] += n
        minute = int((trio.current_time() - self.t0) // 60)
        while len(self.minutes) <= minute:  # bounded: one entry per minute of the run
            self.minutes.append(Counter())
        self.minutes[minute][key] += n

    def reply(self, kind: str, code: int) -> None:
        self.add(f"reply:{kind}:{code}")
        name = REFUSALS.get(code)
        if name is not None:
            self.add(f"refused:{name}")

    def opened(self) -> None:
        self.open += 1
        self.peak_open = max(self.peak_open, self.open)


class Link:
    """One raw driver connection: a trio socket, a frame decoder, opaques."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.opaque = 0
        self.eof = False

    def gone(self) -> bool:
        """The broker closed the connection (or it failed)."""
        return self.eof

    def next_opaque(self) -> int:
        self.opaque += 1
        return self.opaque

    async def send(self, data: bytes | bytearray | memoryview, deadline: float) -> int:
        """Send as much of ``data`` as the socket takes before ``deadline``; bytes sent (a
        cancelled ``sock.send`` sent nothing, so frames are never cut but by the caller)."""
        view = memoryview(data)
        sent = 0
        while sent < len(view) and not self.eof:  # bounded by the deadline
            with trio.move_on_at(deadline):
                try:
                    sent += await self.sock.send(view[sent:])
                except OSError:
                    self.eof = True
                continue
            break
        return sent

    async def receive(self, deadline: float, size: int = 65536) -> list[RemotingCommand] | None:
        """Responses decoded from one read (broker notifications are dropped), [] with
        :attr:`eof` set when the broker closed, None when ``deadline`` came first."""
        with trio.move_on_at(deadline):
            try:
                data = await self.sock.recv(size)
            except OSError:
                data = b""
            if not data:
                self.eof = True
                return []
            self.decoder.feed(data)
            out = []
            while (cmd := self.decoder.next_command()) is not None:  # bounded by the bytes
                if cmd.flag & FLAG_RESPONSE:
                    out.append(cmd)
            return out
        return None


@dataclass(frozen=True)
class DriverConfig:
    port: int
    connections: int
    duration_s: float
    idle_timeout_s: float
    max_waiting: int
    rate: float
    seed: int
    size: int = 1024  #: produced message bodies, bytes
    #: Kinds of connection replaced by quiet idle ones (to see what each costs).
    without: frozenset[str] = frozenset()


class Driver:
    """The load: one task per connection, all ending at the deadline."""

    def __init__(self, cfg: DriverConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.t0 = trio.current_time()
        self.deadline = self.t0 + cfg.duration_s
        self.tally = Tally(self.t0)
        self.pools: dict[tuple[str, str, str], list[bytes]] = {}

    async def connect(self, rcvbuf: int | None = None) -> Link | None:
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        try:
            if rcvbuf is not None:
                sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, rcvbuf)
            sock.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
            with trio.fail_after(10):
                await sock.connect(("127.0.0.1", self.cfg.port))
        except (OSError, trio.TooSlowError):
            sock.close()
            self.tally.add("connect_error")
            return None
        self.tally.opened()
        self.tally.add("connected")
        return Link(sock)

    def close(self, link: Link, kind: str) -> None:
        if link.eof and trio.current_time() < self.deadline:
            self.tally.add(f"closed_by_broker:{kind}")
        link.sock.close()
        self.tally.open -= 1

    async def serve(self, kind: str, body: Callable[[], Any], start_at: float) -> None:
        """Run ``body`` (which opens its connection) again whenever it returns early: a
        connection closed by the broker is opened again, 0–2 s later."""
        await trio.sleep_until(start_at)
        while trio.current_time() < self.deadline:  # bounded by the deadline
            await body()
            await trio.sleep_until(min(self.deadline, trio.current_time() + self.rng.random() * 2))

    # ------------------------------------------------------------ parked polls
    async def parker(self, kind: str, depth: int, make: Callable[[Link], bytes]) -> None:
        link = await self.connect()
        if link is None:
            return
        tally, rng = self.tally, self.rng
        retries: list[float] = []  # when refused polls are sent again (a heap)
        try:
            await link.send(b"".join(make(link) for _ in range(depth)), self.deadline)
            tally.add(f"sent:{kind}", depth)
            while not link.gone():  # bounded: each turn waits, and ends at the deadline
                wake = min(self.deadline, retries[0] if retries else math.inf)
                cmds = await link.receive(wake)
                now = trio.current_time()
                if now >= self.deadline:
                    return
                again = 0
                if cmds is None:
                    while retries and retries[0] <= now:
                        heapq.heappop(retries)
                        again += 1
                else:
                    for cmd in cmds:
                        tally.reply(kind, cmd.code)
                        if cmd.code in PARK_ANSWERS:
                            again += 1
                        else:  # refused (or anything unexpected): later
                            wait = REFUSED_RETRY_S * (0.5 + rng.random())
                            heapq.heappush(retries, now + wait)
                if again:
                    await link.send(b"".join(make(link) for _ in range(again)), self.deadline)
                    tally.add(f"sent:{kind}", again)
        finally:
            self.close(link, kind)

    # Frames are encoded once into pools and sent again and again (opaques repeat, which the
    # broker does not mind): the driver's CPU goes to sockets, not to encoding.
    def pull_maker(self, idx: int) -> Callable[[Link], bytes]:
        topic, group = f"SoakPull{idx % PARK_TOPICS}", f"soak_pull_{idx % 16}"
        key = ("pull", topic, group)
        if key not in self.pools:
            self.pools[key] = [
                pull_frame(i + 1, topic, group, i % QUEUES, 0, self.rng.randrange(10_000, 15_001))
                for i in range(POOL)
            ]
        return self.picker(self.pools[key])

    def pop_maker(self, topic: str, group: str) -> Callable[[Link], bytes]:
        key = ("pop", topic, group)
        if key not in self.pools:
            self.pools[key] = [
                pop_frame(i + 1, topic, group, self.rng.randrange(10_000, 15_001))
                for i in range(POOL)
            ]
        return self.picker(self.pools[key])

    def picker(self, pool: list[bytes]) -> Callable[[Link], bytes]:
        rng = self.rng

        def make(link: Link) -> bytes:
            return pool[rng.randrange(len(pool))]

        return make

    # ------------------------------------------------------------ slow readers
    def slow_frames(self, idx: int, n: int) -> bytes:
        """``n`` requests of a slow reader: 3 in 4 are pulls of 32 messages at random offsets
        of SoakData, the rest GET_ROUTEINFO_BY_TOPIC."""
        key = ("slow", str(idx % 8), "")
        if key not in self.pools:
            group = f"soak_slow_{idx % 8}"
            self.pools[key] = [
                route_frame(i + 1, DATA_TOPIC) if i % 4 == 3 else pull_frame(
                    i + 1, DATA_TOPIC, group, i % QUEUES,
                    self.rng.randrange(PRELOAD_PER_QUEUE - 32), 0)
                for i in range(POOL)
            ]  # fmt: skip
        pool = self.pools[key]
        start = self.rng.randrange(len(pool))
        return b"".join(pool[(start + i) % len(pool)] for i in range(n))

    async def stalled(self, idx: int) -> None:
        """:data:`STALL_BURST` requests at once, never a byte read: the broker's writes to it
        block. What the socket does not take at once is pushed again every 10 s."""
        link = await self.connect(SLOW_RCVBUF)
        if link is None:
            return
        out = bytearray(self.slow_frames(idx, STALL_BURST))
        self.tally.add("sent:stalled", STALL_BURST)
        try:
            while not link.gone():  # bounded: every turn sleeps 10 s, ends at the deadline
                now = trio.current_time()
                if out:
                    sent = await link.send(out, min(self.deadline, now + 1))
                    del out[:sent]
                    self.tally.add("stalled_bytes_sent", sent)
                await trio.sleep_until(min(self.deadline, now + 10))
                if trio.current_time() >= self.deadline:
                    self.tally.add("stalled_bytes_unsent", len(out))
                    return
        finally:
            self.close(link, "stalled")

    async def trickle(self, idx: int) -> None:
        """Reads 2 KiB every 0.5 s and keeps up to 200 requests unanswered."""
        link = await self.connect(SLOW_RCVBUF)
        if link is None:
            return
        out = bytearray()
        unanswered = 0
        tick = trio.current_time()
        try:
            while not link.gone():  # bounded: one turn per tick, ends at the deadline
                tick += TRICKLE_TICK_S
                await trio.sleep_until(min(tick, self.deadline))
                if trio.current_time() >= self.deadline:
                    return
                cmds = await link.receive(tick + TRICKLE_TICK_S / 2, TRICKLE_READ)
                for cmd in cmds or ():
                    unanswered -= 1
                    self.tally.reply("trickle", cmd.code)
                if not out and unanswered < TRICKLE_WINDOW // 2:
                    n = TRICKLE_WINDOW - unanswered
                    out += self.slow_frames(idx, n)
                    unanswered += n
                    self.tally.add("sent:trickle", n)
                if out:
                    sent = await link.send(out, trio.current_time() + 0.05)
                    del out[:sent]
        finally:
            self.close(link, "trickle")

    # ------------------------------------------------------------ idle and producers
    async def idle(self, idx: int, silent: bool) -> None:
        kind = "silent" if silent else "quiet"
        link = await self.connect()
        if link is None:
            return
        client_id = f"soak-{kind}-{idx}@{self.tally.total['connected']}"
        group = f"soak_idle_{idx // 4}"
        every = self.cfg.idle_timeout_s / 3 if self.cfg.idle_timeout_s > 0 else 30.0
        try:
            while not link.gone():  # bounded: each turn waits, ends at the deadline
                await link.send(heartbeat_frame(link.next_opaque(), client_id, group),
                                self.deadline)  # fmt: skip
                self.tally.add(f"sent:{kind}")
                answered = False
                last = trio.current_time()
                until = self.deadline if silent else min(self.deadline, last + every)
                while not link.gone():  # bounded by ``until``
                    cmds = await link.receive(until)
                    if cmds is None:
                        break
                    for cmd in cmds:
                        self.tally.reply(kind, cmd.code)
                        answered = True
                        last = trio.current_time()
                if link.gone() and answered and silent:
                    self.tally.silences.append(trio.current_time() - last)
                if trio.current_time() >= self.deadline:
                    return
        finally:
            self.close(link, kind)

    async def producer(self, idx: int, rate: float) -> None:
        link = await self.connect()
        if link is None:
            return
        interval = 0.05
        owed = 0.0
        tick = trio.current_time()
        try:
            while not link.gone():  # bounded: one window per tick, ends at the deadline
                tick += interval
                await trio.sleep_until(min(tick, self.deadline))
                now = trio.current_time()
                if now >= self.deadline:
                    return
                tick = max(tick, now - interval)  # after a stall, do not burst to catch up
                owed += rate * interval
                n = int(owed)
                owed -= n
                if not n:
                    continue
                frames = [send_frame(link.next_opaque(), DATA_TOPIC, (idx + i) % QUEUES,
                                     self.cfg.size) for i in range(n)]  # fmt: skip
                await link.send(b"".join(frames), self.deadline)
                self.tally.add("sent:producer", n)
                got = 0
                while got < n and not link.gone():  # bounded by the window's deadline
                    cmds = await link.receive(min(self.deadline, now + 10))
                    if cmds is None:
                        self.tally.add("producer_window_timeout")
                        return
                    for cmd in cmds:
                        got += 1
                        self.tally.reply("producer", cmd.code)
                self.tally.add("produced", n)
        finally:
            self.close(link, "producer")

    # ------------------------------------------------------------ the mix
    def plan(self) -> list[tuple[str, Callable[[], Any]]]:
        """(kind, body) for every connection."""
        n = self.cfg.connections
        n_prod = 2 if n >= 10 else 1
        n_pull, n_pop, n_slow = n * 3 // 10, n // 5, n // 10
        n_idle = max(0, n - n_prod - n_pull - n_pop - n_slow)
        greedy_depth = self.cfg.max_waiting + GREEDY_EXTRA
        n_hot = min(n_pop, math.ceil(1.5 * HOT_CAP / HOT_DEPTH))
        plan: list[tuple[str, Callable[[], Any]]] = []

        def add(kind: str, fn: Callable[..., Any], *args: Any) -> None:
            if kind in self.cfg.without:  # a quiet idle connection instead
                kind, fn, args = "quiet", self.idle, (n + len(plan), False)
            plan.append((kind, lambda: fn(*args)))

        for i in range(n_prod):
            add("producer", self.producer, i, self.cfg.rate / n_prod)
        for i in range(n_pull):
            greedy = i % GREEDY_EVERY == GREEDY_EVERY - 1
            kind = "pull_greedy" if greedy else "pull"
            add(kind, self.parker, kind, greedy_depth if greedy else PARK_DEPTH,
                self.pull_maker(i))  # fmt: skip
        for i in range(n_pop):
            if i < n_hot:
                add("pop_hot", self.parker, "pop_hot", HOT_DEPTH,
                    self.pop_maker(HOT_TOPIC, "soak_pop_hot"))  # fmt: skip
                continue
            greedy = i % GREEDY_EVERY == GREEDY_EVERY - 1
            kind = "pop_greedy" if greedy else "pop"
            make = self.pop_maker(f"SoakPop{i % PARK_TOPICS}", f"soak_pop_{i % 16}")
            add(kind, self.parker, kind, greedy_depth if greedy else PARK_DEPTH, make)
        for i in range(n_slow):
            if i % 2:
                add("trickle", self.trickle, i)
            else:
                add("stalled", self.stalled, i)
        for i in range(n_idle):
            add("silent" if i % 2 else "quiet", self.idle, i, bool(i % 2))
        self.rng.shuffle(plan)
        return plan

    async def run(self) -> dict[str, Any]:
        plan = self.plan()
        ramp_s = min(10.0, self.cfg.duration_s / 10)
        kinds = Counter(kind for kind, _ in plan)
        async with trio.open_nursery() as nursery:
            for i, (kind, body) in enumerate(plan):
                start = self.t0 + ramp_s * i / max(1, len(plan))
                nursery.start_soon(self.serve, kind, body, start)
            nursery.start_soon(self.progress)
        t = self.tally
        sil = sorted(t.silences)
        return {
            "kinds": dict(kinds),
            "peak_open": t.peak_open,
            "total": dict(sorted(t.total.items())),
            "per_minute": [dict(sorted(m.items())) for m in t.minutes],
            "silence_before_close_s": {
                "n": len(sil),
                "min": sil[0] if sil else None,
                "p50": percentile(sil, 50) if sil else None,
                "max": sil[-1] if sil else None,
                #: how many in each 5 s bucket (its lower bound, seconds)
                "histogram": dict(sorted(Counter(int(x // 5 * 5) for x in sil).items())),
            },
        }

    async def progress(self) -> None:
        """A line on stderr every minute (the run's log)."""
        minute = 0
        while True:  # bounded by the deadline
            minute += 1
            at = self.t0 + 60 * minute
            if at > self.deadline:
                return
            await trio.sleep_until(at)
            m = self.tally.minutes[minute - 1] if len(self.tally.minutes) >= minute else Counter()
            refused = {k: v for k, v in m.items() if k.startswith(("refused", "closed"))}
            print(json.dumps({"minute": minute, "open": self.tally.open, **refused}),
                  file=sys.stderr, flush=True)  # fmt: skip


def driver_main(cfg: DriverConfig) -> None:
    raise_nofile(cfg.connections * 2 + 256)

    async def go() -> dict[str, Any]:
        return await Driver(cfg).run()

    result = trio.run(go)
    result["cpu_s"] = time.process_time()
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- blocking client
class BlockingLink:
    """A plain blocking connection, one request in flight (setup and control)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CONTROL_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.opaque = 0

    def call(self, cmd: RemotingCommand, timeout: float = CONTROL_TIMEOUT_S) -> RemotingCommand:
        """Send ``cmd`` (a fresh opaque) and wait for its reply.

        Raises:
            TimeoutError: no reply within ``timeout``.
            OSError: the connection failed.
        """
        self.opaque += 1
        opaque = self.opaque
        self.sock.sendall(encode_command(cmd._replace(opaque=opaque)))
        end = time.monotonic() + timeout
        while True:  # bounded by ``end``
            while (reply := self.decoder.next_command()) is not None:
                if reply.flag & FLAG_RESPONSE and reply.opaque == opaque:
                    return reply
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no reply to code {cmd.code} within {timeout} s")
            self.sock.settimeout(left)
            data = self.sock.recv(262144)
            if not data:
                raise ConnectionError("broker closed the control connection")
            self.decoder.feed(data)

    def close(self) -> None:
        self.sock.close()


def setup(port: int) -> None:
    """Create the topics and preload SoakData."""
    link = BlockingLink(port)
    try:
        names = [DATA_TOPIC, CONTROL_TOPIC, HOT_TOPIC]
        names += [f"SoakPull{i}" for i in range(PARK_TOPICS)]
        names += [f"SoakPop{i}" for i in range(PARK_TOPICS)]
        for name in names:
            header = CreateTopicRequestHeader(
                topic=name, default_topic="TBW102", read_queue_nums=QUEUES,
                write_queue_nums=QUEUES, perm=6, topic_filter_type="SINGLE_TAG", order=False,
            )  # fmt: skip
            check_code(link.call(request(RequestCode.UPDATE_AND_CREATE_TOPIC, 0,
                                         header.to_ext())), f"create {name}")  # fmt: skip
        body = batch_body(DATA_SIZE, 100)
        for q in range(QUEUES):
            ext = send_ext(DATA_TOPIC, q, batch=True)
            for _ in range(PRELOAD_PER_QUEUE // 100):
                cmd = request(RequestCode.SEND_BATCH_MESSAGE, 0, ext, body)
                check_code(link.call(cmd, 30), "preload")
    finally:
        link.close()


def check_code(reply: RemotingCommand, what: str) -> None:
    if reply.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"{what}: code {reply.code} {reply.remark}")


# ---------------------------------------------------------------- sampling
def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, VmHWM (kB) and Threads of ``/proc/<pid>/status``."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads"):
                out[key] = int(rest.split()[0])
    return out


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


@dataclass
class Sample:
    t: float
    rss_mb: float
    anon_mb: float
    file_mb: float
    hwm_mb: float
    threads: int
    fds: int
    broker_cpu_s: float
    connections: int  #: as the broker's runtime info last said (-1: not known)
    #: The commit log's end offset in MB (runtime info ``commitLogMaxOffset``): a fresh
    #: broker keeps the newest 64–76 MiB of it in memory (``StoreConfig.tail_cache_bytes``).
    log_mb: float
    #: CPU seconds so far of the whole machine (busy), of the driver and of this process: the
    #: rest is other people's work on the shared machine.
    machine_busy_s: float = 0.0
    driver_cpu_s: float = 0.0
    self_cpu_s: float = 0.0


def sample(pid: int, t: float, ctl: Control | None, driver: int | None = None) -> Sample:
    st = proc_status(pid)
    try:
        driver_cpu = proc_cpu_seconds(driver) if driver is not None else 0.0
    except (OSError, ValueError, IndexError):
        driver_cpu = float("nan")
    return Sample(
        t=t, rss_mb=st["VmRSS"] / 1024, anon_mb=st.get("RssAnon", 0) / 1024,
        file_mb=st.get("RssFile", 0) / 1024, hwm_mb=st["VmHWM"] / 1024,
        threads=st["Threads"], fds=open_fds(pid), broker_cpu_s=proc_cpu_seconds(pid),
        connections=-1 if ctl is None else ctl.connections,
        log_mb=-1.0 if ctl is None else ctl.log_mb,
        machine_busy_s=cpu_jiffies()[0] / os.sysconf("SC_CLK_TCK"), driver_cpu_s=driver_cpu,
        self_cpu_s=time.process_time(),
    )  # fmt: skip


def slope_per_min(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute (nan for < 3 points)."""
    if len(points) < 3:
        return float("nan")
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    if not den:
        return float("nan")
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


def lat_stats(lats: Sequence[float]) -> dict[str, float]:
    v = sorted(lats)
    return {
        "n": float(len(v)),
        "p50_ms": percentile(v, 50),
        "p99_ms": percentile(v, 99),
        "max_ms": v[-1] if v else float("nan"),
    }


# ---------------------------------------------------------------- control
@dataclass
class Control:
    """The control client's records: (seconds since start, kind, ms, code) per request."""

    port: int
    link: BlockingLink | None = None
    records: list[tuple[float, str, float, int]] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)
    reconnects: int = 0
    connections: int = -1  #: the broker's connectionCount, from the last runtime info
    log_mb: float = -1.0  #: its commitLogMaxOffset in MB, from the same
    _n: int = 0

    def once(self, t: float, kind: str | None = None) -> None:
        """One request: alternately runtime info and a send (``kind`` forces one)."""
        if self.link is None:
            try:
                self.link = BlockingLink(self.port)
            except OSError:
                self.timeouts.append(t)
                return
        self._n += 1
        if kind == "runtime_info" or (kind is None and self._n % 2):
            kind, cmd = "runtime_info", request(RequestCode.GET_BROKER_RUNTIME_INFO, 0)
        else:
            kind, cmd = "send", request(RequestCode.SEND_MESSAGE_V2, 0,
                                        send_ext(CONTROL_TOPIC, self._n // 2 % QUEUES),
                                        make_payload(CONTROL_SIZE))  # fmt: skip
        s = time.perf_counter_ns()
        try:
            reply = self.link.call(cmd)
        except (OSError, TimeoutError):
            self.timeouts.append(t)
            self.link.close()
            self.link = None
            self.reconnects += 1
            return
        ms = (time.perf_counter_ns() - s) / 1e6
        self.records.append((t, kind, ms, reply.code))
        if kind == "runtime_info" and reply.code == ResponseCode.SUCCESS:
            try:
                table = json.loads(reply.body)["table"]
                self.connections = int(table["connectionCount"])
                self.log_mb = int(table["commitLogMaxOffset"]) / 2**20
            except (ValueError, KeyError, TypeError):
                pass

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None


def control_figures(ctl: Control, duration_s: float) -> dict[str, Any]:
    ok = [r for r in ctl.records if r[3] == ResponseCode.SUCCESS]
    errors = Counter(str(r[3]) for r in ctl.records if r[3] != ResponseCode.SUCCESS)
    minutes = []
    for m in range(math.ceil(duration_s / 60)):
        lats = [r[2] for r in ok if m * 60 <= r[0] < (m + 1) * 60]
        minutes.append({"minute": m + 1, **lat_stats(lats)})
    return {
        **lat_stats([r[2] for r in ok]),
        "after_first_minute": lat_stats([r[2] for r in ok if r[0] >= 60]),
        "by_kind": {
            kind: lat_stats([r[2] for r in ok if r[1] == kind]) for kind in ("runtime_info", "send")
        },
        "over_50ms": sum(1 for r in ok if r[2] > 50),
        #: (seconds into the run, kind, ms) of the slowest 20, for a look at when they came.
        "slowest": [
            (round(r[0], 1), r[1], round(r[2], 1)) for r in sorted(ok, key=lambda r: -r[2])[:20]
        ],
        "errors_by_code": dict(errors),
        "timeouts": len(ctl.timeouts),
        "reconnects": ctl.reconnects,
        "per_minute": minutes,
    }


def rss_figures(samples: Sequence[Sample], duration_s: float) -> dict[str, Any]:
    load = [s for s in samples if 0 <= s.t <= duration_s]
    half = [s for s in load if s.t >= duration_s / 2]
    peak = max(s.rss_mb for s in load)
    out: dict[str, Any] = {
        "before_load_mb": samples[0].rss_mb,
        "start_mb": load[0].rss_mb,
        "max_mb": peak,
        "end_mb": load[-1].rss_mb,
        "hwm_mb": max(s.hwm_mb for s in samples),
        "after_close_mb": samples[-1].rss_mb,
        "anon_max_mb": max(s.anon_mb for s in load),
        "anon_end_mb": load[-1].anon_mb,
        "file_max_mb": max(s.file_mb for s in load),
    }
    for name, get in (("rss", "rss_mb"), ("anon", "anon_mb")):
        slope = slope_per_min([(s.t, getattr(s, get)) for s in half])
        out[f"{name}_second_half_slope_mb_per_min"] = slope
        out[f"{name}_second_half_growth_mb"] = slope * duration_s / 2 / 60
    if half:
        out["second_half_first_mb"] = half[0].rss_mb
        out["second_half_max_mb"] = max(s.rss_mb for s in half)
    growth = out["rss_second_half_growth_mb"]
    out["bounded"] = bool(not math.isnan(growth) and growth <= max(4.0, 0.02 * peak))
    # The store keeps the commit log's newest bytes in memory, up to 1.5 × 64 MB before it
    # trims back to 64 MB: growth that is only that cache filling is bounded by design.
    logged = [s for s in load if s.log_mb >= 0]
    if logged:
        out["log_start_mb"] = logged[0].log_mb
        out["log_end_mb"] = logged[-1].log_mb
        rest = [(s.t, s.anon_mb - min(s.log_mb, LOG_TAIL_MAX_MB)) for s in half if s.log_mb >= 0]
        slope = slope_per_min(rest)
        out["anon_less_log_tail_second_half_growth_mb"] = slope * duration_s / 2 / 60
    return out


# ---------------------------------------------------------------- the run
def stop_pid(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT_S` (our own child only)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def run(args: argparse.Namespace) -> dict[str, Any]:
    nofile = raise_nofile(args.connections * 2 + 256)
    WORK_DIR.mkdir(exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="soak-", dir=WORK_DIR))
    log_path = data_dir.parent / (data_dir.name + ".log")
    driver_err = data_dir.parent / (data_dir.name + ".driver.log")
    broker_args = ["--idle-timeout-s", str(args.idle_timeout_s),
                   "--max-waiting-per-connection", str(args.max_waiting)]  # fmt: skip
    root = Path(args.broker_root) if args.broker_root else None
    samples: list[Sample] = []
    load1 = os.getloadavg()
    try:
        with ExitStack() as stack:
            if args.attach:
                pid, port = (int(x) for x in args.attach.split(":"))
            else:
                pid, port = stack.enter_context(
                    broker_subprocess(data_dir, log_path, *broker_args, root=root)
                )
            print(f"broker pid {pid} port {port} data {data_dir} (log {log_path})", flush=True)
            samples.append(sample(pid, -1.0, None))
            setup(port)
            argv = [sys.executable, "-m", "benchmarks.bench_soak", "--role", "driver",
                    "--port", str(port), "--connections", str(args.connections),
                    "--duration-s", str(args.duration_s), "--idle-timeout-s",
                    str(args.idle_timeout_s), "--max-waiting", str(args.max_waiting),
                    "--rate", str(args.rate), "--seed", str(args.seed), "--size", str(args.size),
                    "--without", args.without]  # fmt: skip
            ctl = Control(port)
            with driver_err.open("wb") as err:
                driver = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=err)
            print(f"driver pid {driver.pid} ({args.connections} connections, "
                  f"{args.duration_s:.0f} s)", flush=True)  # fmt: skip
            try:
                t0, t0_wall = time.monotonic(), time.time()
                busy0, cpu_c0 = cpu_jiffies()[0], time.process_time()
                samples.append(sample(pid, 0.0, None, driver.pid))
                next_sample = args.sample_s
                tick = t0
                end = t0 + args.duration_s
                while (now := time.monotonic()) < end:  # bounded by the duration
                    t = now - t0
                    ctl.once(t)
                    if t >= next_sample:
                        samples.append(sample(pid, t, ctl, driver.pid))
                        next_sample += args.sample_s
                        if int(t) % 60 < args.sample_s:
                            last = samples[-1]
                            print(f"  t={t:5.0f}s rss {last.rss_mb:7.1f} MB anon "
                                  f"{last.anon_mb:7.1f} MB fds {last.fds} conns "
                                  f"{last.connections} cpu {last.broker_cpu_s:6.1f}s",
                                  flush=True)  # fmt: skip
                    tick = max(tick + args.control_interval_s, time.monotonic())
                    time.sleep(max(0.0, min(tick, end) - time.monotonic()))
                t_end = time.monotonic() - t0
                samples.append(sample(pid, t_end, ctl, driver.pid))
                busy = (cpu_jiffies()[0] - busy0) / os.sysconf("SC_CLK_TCK")
                client_cpu = time.process_time() - cpu_c0
                out, _ = driver.communicate(timeout=120)
                time.sleep(5)  # then a fresh connectionCount, the driver gone
                ctl.once(t_end + 6, "runtime_info")
                samples.append(sample(pid, t_end + 6, ctl))
            finally:
                ctl.close()
                stop_pid(driver)
            load2 = os.getloadavg()
            broker_cpu = samples[-2].broker_cpu_s - samples[1].broker_cpu_s
            driver_res: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
            other = busy - broker_cpu - float(driver_res.get("cpu_s", 0)) - client_cpu
            conns = [s.connections for s in samples[2:-1] if s.connections >= 0]
            if args.trace:
                write_trace(Path(args.trace), t0_wall, samples, ctl)
            return {
                "bench": "soak",
                "commit": git_head(root or ROOT),
                "connections": args.connections,
                "duration_s": args.duration_s,
                "idle_timeout_s": args.idle_timeout_s,
                "max_waiting": args.max_waiting,
                "rate": args.rate,
                "size": args.size,
                "without": args.without,
                "attached": bool(args.attach),
                "t0_wall": t0_wall,
                "nofile": nofile,
                "control": control_figures(ctl, args.duration_s),
                "rss": rss_figures(samples, t_end),
                "broker_cpu_s": broker_cpu,
                "broker_cores": broker_cpu / t_end,
                "driver_cpu_s": driver_res.get("cpu_s"),
                "other_cores": max(0.0, other) / t_end,
                "loadavg_start": load1[0],
                "loadavg_end": load2[0],
                "broker_fds_max": max(s.fds for s in samples),
                "broker_fds_after_close": samples[-1].fds,
                "broker_threads_max": max(s.threads for s in samples),
                "broker_connections": {
                    "min": min(conns, default=-1),
                    "max": max(conns, default=-1),
                    "after_close": samples[-1].connections,
                },
                "per_minute_rss_mb": per_minute_rss(samples, t_end),
                "per_minute_cores": per_minute_cores(samples, t_end),
                "driver": driver_res,
            }
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        log_keep = args.keep_logs
        if not log_keep:
            log_path.unlink(missing_ok=True)
            driver_err.unlink(missing_ok=True)


def write_trace(path: Path, t0_wall: float, samples: Sequence[Sample], ctl: Control) -> None:
    """Every sample and every control request, one JSON line each (``t``: seconds into the
    run, ``wall``: epoch seconds, to line them up with a broker-side log)."""
    with path.open("w") as f:
        for smp in samples:
            row = {"type": "sample", "wall": t0_wall + smp.t, **dataclasses.asdict(smp)}
            f.write(json.dumps(row) + "\n")
        for t, kind, ms, code in ctl.records:
            row = {"type": "control", "t": t, "wall": t0_wall + t, "kind": kind, "ms": ms,
                   "code": code}  # fmt: skip
            f.write(json.dumps(row) + "\n")


def per_minute_rss(samples: Sequence[Sample], t_end: float) -> list[float]:
    out = []
    for m in range(1, math.ceil(t_end / 60 - 0.01) + 1):
        inside = [s.rss_mb for s in samples if 0 <= s.t <= min(m * 60, t_end)]
        out.append(round(inside[-1], 1) if inside else float("nan"))
    return out


def per_minute_cores(samples: Sequence[Sample], t_end: float) -> dict[str, list[float]]:
    """Cores used per minute by the broker, and by everything that is neither the broker,
    the driver nor this process (other work on the shared machine)."""
    load = [s for s in samples if 0 <= s.t <= t_end]
    out: dict[str, list[float]] = {"broker": [], "others": []}
    for m in range(math.ceil(t_end / 60 - 0.01)):
        inside = [s for s in load if m * 60 <= s.t <= (m + 1) * 60]
        if len(inside) < 2 or inside[-1].t <= inside[0].t:
            out["broker"].append(float("nan"))
            out["others"].append(float("nan"))
            continue
        a, b = inside[0], inside[-1]
        dt = b.t - a.t
        broker = b.broker_cpu_s - a.broker_cpu_s
        ours = (b.driver_cpu_s - a.driver_cpu_s) + (b.self_cpu_s - a.self_cpu_s)
        out["broker"].append(round(broker / dt, 2))
        out["others"].append(round(max(0.0, b.machine_busy_s - a.machine_busy_s - broker - ours)
                                   / dt, 2))  # fmt: skip
    return out


def git_head(root: Path) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return root.name  # an exported tree (git archive): its directory names the build


def summary(res: dict[str, Any]) -> None:
    c, r, d = res["control"], res["rss"], res["driver"]
    tot: dict[str, int] = d["total"]
    refused = {k.split(":", 1)[1]: v for k, v in tot.items() if k.startswith("refused:")}
    closed = {k.split(":", 1)[1]: v for k, v in tot.items() if k.startswith("closed_by_broker:")}
    print(f"\nsoak: {res['connections']} connections, {res['duration_s']:.0f} s, idle timeout "
          f"{res['idle_timeout_s']:g} s, max waiting {res['max_waiting']}, {res['rate']:g} "
          f"msg/s of {res['size']} B produced (commit {res['commit']})")  # fmt: skip
    print(f"  control ({c['n']:.0f} requests): p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms,"
          f" max {c['max_ms']:.1f} ms; > 50 ms: {c['over_50ms']}; timeouts {c['timeouts']}; "
          f"errors {c['errors_by_code']}")  # fmt: skip
    for kind, s in c["by_kind"].items():
        print(
            f"    {kind:12s} p50 {s['p50_ms']:.2f} p99 {s['p99_ms']:.2f} max {s['max_ms']:.1f} ms"
        )
    print("    per minute p99 ms: " + ", ".join(f"{m['p99_ms']:.1f}" for m in c["per_minute"]))
    print("    per minute max ms: " + ", ".join(f"{m['max_ms']:.0f}" for m in c["per_minute"]))
    print(f"  RSS MB: before load {r['before_load_mb']:.1f}, start {r['start_mb']:.1f}, max "
          f"{r['max_mb']:.1f}, end {r['end_mb']:.1f}, after clients closed "
          f"{r['after_close_mb']:.1f} (anon max {r['anon_max_mb']:.1f})")  # fmt: skip
    print(f"    second half: slope {r['rss_second_half_slope_mb_per_min']:+.2f} MB/min "
          f"(growth {r['rss_second_half_growth_mb']:+.1f} MB; anon "
          f"{r['anon_second_half_growth_mb']:+.1f} MB)")  # fmt: skip
    print("    per minute: " + ", ".join(f"{v:.0f}" for v in res["per_minute_rss_mb"]))
    cores = res["per_minute_cores"]
    print("  cores per minute, broker: " + ", ".join(f"{v:.2f}" for v in cores["broker"]))
    print("    everything else on the machine: "
          + ", ".join(f"{v:.2f}" for v in cores["others"]))  # fmt: skip
    if "log_end_mb" in r:
        print(f"    commit log {r['log_start_mb']:.1f} -> {r['log_end_mb']:.1f} MB (its newest "
              f"64–96 MB stay in memory); anon RSS less that tail, second half: "
              f"{r['anon_less_log_tail_second_half_growth_mb']:+.1f} MB")  # fmt: skip
    print(f"  broker CPU {res['broker_cpu_s']:.1f} s ({res['broker_cores']:.2f} cores); driver "
          f"{res['driver_cpu_s']:.1f} s; everything else {res['other_cores']:.2f} cores; load "
          f"{res['loadavg_start']:.1f} -> {res['loadavg_end']:.1f}")  # fmt: skip
    bc = res["broker_connections"]
    print(f"  connections: driver peak open {d['peak_open']}, broker saw {bc['min']}–{bc['max']}"
          f" (after close {bc['after_close']}); fds max {res['broker_fds_max']}, after close "
          f"{res['broker_fds_after_close']}")  # fmt: skip
    print(f"  refusals: {refused}; closed by the broker: {closed}")
    sil = d["silence_before_close_s"]
    if sil["n"]:
        print(f"    silent connections closed after {sil['min']:.1f}–{sil['max']:.1f} s of "
              f"silence (median {sil['p50']:.1f}, n={sil['n']})")  # fmt: skip
    aim_lat = c["p99_ms"] <= 50
    print(f"  aims: control p99 <= 50 ms: {'met' if aim_lat else 'MISSED'}; RSS bounded: "
          f"{'met' if r['bounded'] else 'MISSED'}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--idle-timeout-s", type=float, default=30.0)
    ap.add_argument("--max-waiting", type=int, default=64,
                    help="the broker's --max-waiting-per-connection")  # fmt: skip
    ap.add_argument("--rate", type=float, default=300.0, help="produced msg/s")
    ap.add_argument("--size", type=int, default=1024, help="produced message body, bytes")
    ap.add_argument("--control-interval-s", type=float, default=0.1)
    ap.add_argument("--sample-s", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--broker-root", default=None, help="run the broker of another checkout")
    ap.add_argument("--out", default=None, help="append the JSON line to this file")
    ap.add_argument("--keep-logs", action="store_true", help="keep the broker and driver logs")
    ap.add_argument("--trace", default=None, help="write every sample and control request here")
    ap.add_argument(
        "--without",
        default="",
        help="kinds of connection replaced by quiet idle ones, e.g. stalled,trickle",
    )
    ap.add_argument("--attach", default=None, metavar="PID:PORT",
                    help="soak a broker that is already running (not stopped at the end; "
                    "its flags are then its own)")  # fmt: skip
    ap.add_argument("--role", choices=("run", "driver"), default="run", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "driver":
        driver_main(DriverConfig(args.port, args.connections, args.duration_s,
                                 args.idle_timeout_s, args.max_waiting, args.rate, args.seed,
                                 args.size,
                                 frozenset(filter(None, args.without.split(",")))))  # fmt: skip
        return
    res = run(args)
    line = json.dumps(res)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    summary(res)


if __name__ == "__main__":
    main()
