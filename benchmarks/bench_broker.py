"""Broker throughput and latency over TCP, side by side with Redis Streams in the same run.

Our broker runs as a subprocess (``python -m broker`` on 127.0.0.1, any free port, a temporary
data dir under ``.bench-peers/``); a trio client in this process measures:

* ``produce_sync``: SEND_MESSAGE_V2 awaited one at a time (msgs/s, p50/p99 latency);
* ``produce_window``: windows of ``--batch`` SEND_MESSAGE_V2 in flight on one connection
  (written together, replies matched by opaque);
* ``produce_batch``: SEND_BATCH_MESSAGE with ``--batch`` messages per request;
* ``consume_pull``: drain a ``--backlog`` of messages pre-produced into one topic / 4 queues
  with PULL_MESSAGE maxMsgNums=``--count`` (queues in turn, commit offset in each pull),
  decoding the records;
* ``e2e_latency``: a producer task at ``--rate`` msg/s with a monotonic timestamp in the body,
  a consumer task long-polling (SUSPEND) on its own connection; the first ``--warmup``
  messages are dropped.

The peers are ``../shared/peer-bench/redis_streams_bench.py`` (Redis Streams on 127.0.0.1:6390)
and ``rabbitmq_bench.py`` (RabbitMQ classic queue, transient messages, on 127.0.0.1:5672), each
run with ``--runs 1`` after every round of ours, so all three see the same noise. A peer server
that is not running is started here (installed with apt if missing) and stopped at the end; see
``benchmarks/peers.py``. Their clients run in a throwaway venv (``--peer-python``, by default
``.bench-peers/venv/bin/python``, created and given redis-py, hiredis and aio-pika if missing).

Usage: python -m benchmarks.bench_broker [--runs 3] [--sizes 128,1024]
    [--peers redis,rabbitmq | --no-peer] [--broker-root OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from benchmarks.peers import (
    PEER_BENCH,
    PEER_PYTHON,
    PEERS,
    WORK_DIR,
    ensure_peer_venv,
    run_peer,
)
from protocol.batch import BatchEntry, encode_batch
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.connection import NEED_DATA, Closed, Malformed, RemotingConnection, Response, Role
from protocol.headers.pull import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    build_pull_sys_flag,
)
from protocol.headers.send import SendMessageRequestHeader
from protocol.message import decode_records
from protocol.properties import encode_properties

ROOT = Path(__file__).resolve().parent.parent
REPLY_TIMEOUT = 30.0
GROUP = "bench_consumer_group"
QUEUES = 4
TS_BYTES = 8


# ---------------------------------------------------------------- statistics
def percentile(sorted_vals: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted values (as peer-bench's ``common.percentile``)."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, math.ceil(p / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def lat_summary_ms(lat_ns: Sequence[int]) -> dict[str, float]:
    v = sorted(x / 1e6 for x in lat_ns)
    return {
        "p50_ms": percentile(v, 50),
        "p90_ms": percentile(v, 90),
        "p99_ms": percentile(v, 99),
        "max_ms": v[-1] if v else float("nan"),
        "n": float(len(v)),
    }


def proc_cpu_seconds(pid: int) -> float:
    """user+system CPU seconds used so far by process ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_payload(size: int, ts_ns: int = 0) -> bytes:
    """``size`` bytes; the first 8 carry a big-endian monotonic timestamp (peer-bench layout)."""
    return ts_ns.to_bytes(TS_BYTES, "big") + b"x" * (size - TS_BYTES)


# ---------------------------------------------------------------- client
class Conn:
    """One connection to the broker. Its :class:`~protocol.connection.RemotingConnection`
    allocates opaques, keeps the pending replies and decodes; this keeps one wake-up event per
    awaited opaque. Frames can be encoded ahead of a pipelined window (:meth:`prepare`, or
    :meth:`opaque` + :meth:`expect` for commands built elsewhere) and written together."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.protocol = RemotingConnection(Role.CLIENT, max_frame_size=64 * 1024 * 1024)
        self._waiters: dict[int, trio.Event] = {}
        self._replies: dict[int, RemotingCommand] = {}
        self.closed = False

    def opaque(self) -> int:
        """A fresh opaque for a command the caller encodes itself (then :meth:`expect` it)."""
        return self.protocol.next_opaque()

    def expect(self, opaque: int) -> None:
        """Wait for the reply to a request written with ``opaque``."""
        self.protocol.expect_response(opaque)
        self._waiters[opaque] = trio.Event()

    def prepare(self, cmd: RemotingCommand) -> tuple[int, bytes]:
        """``cmd``'s frame with a fresh opaque (``cmd.opaque`` is ignored), its reply awaited."""
        opaque, frame = self.protocol.send_request(cmd)
        self._waiters[opaque] = trio.Event()
        return opaque, frame

    async def reply(self, opaque: int, timeout: float = REPLY_TIMEOUT) -> RemotingCommand:  # noqa: ASYNC109
        event = self._waiters[opaque]
        with trio.fail_after(timeout):
            await event.wait()
        del self._waiters[opaque]
        if opaque not in self._replies:
            raise RuntimeError(f"connection closed before reply {opaque}")
        return self._replies.pop(opaque)

    async def request(
        self,
        cmd: RemotingCommand,
        timeout: float = REPLY_TIMEOUT,  # noqa: ASYNC109
    ) -> RemotingCommand:
        """Send ``cmd`` with a fresh opaque and wait for its reply."""
        opaque, frame = self.prepare(cmd)
        await self.stream.send_all(frame)
        return await self.reply(opaque, timeout)

    async def read_loop(self) -> None:
        try:
            while True:
                try:
                    data = await self.stream.receive_some(262144)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                self.protocol.receive_data(data)
                if self._take_replies():
                    return
        finally:
            self.closed = True
            self.protocol.close()
            for event in self._waiters.values():
                event.set()

    def _take_replies(self) -> bool:
        """File every reply that arrived; True once the broker closed the connection."""
        while (event := self.protocol.next_event()) is not NEED_DATA:  # bounded by the bytes
            if type(event) is Response:
                cmd = event.command
                self._replies[cmd.opaque] = cmd
                self._waiters[cmd.opaque].set()
            elif type(event) is Closed:
                return True
            elif type(event) is Malformed:
                raise event.error
        return False


@dataclass
class ConnPool:
    """Connections opened for one measurement, all closed when it ends."""

    port: int
    nursery: trio.Nursery
    conns: list[Conn] = field(default_factory=list)

    async def open(self) -> Conn:
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        conn = Conn(stream)
        self.conns.append(conn)
        self.nursery.start_soon(conn.read_loop)
        return conn


async def with_conns(port: int, fn: Callable[[ConnPool], Any]) -> dict[str, float]:
    async with trio.open_nursery() as nursery:
        pool = ConnPool(port, nursery)
        try:
            result: dict[str, float] = await fn(pool)
        finally:
            for conn in pool.conns:
                await trio.aclose_forcefully(conn.stream)
            nursery.cancel_scope.cancel()
    return result


def check(reply: RemotingCommand, what: str) -> None:
    if reply.code != ResponseCode.SUCCESS:
        raise RuntimeError(f"{what}: code {reply.code} {reply.remark}")


def send_ext(topic: str, queue_id: int, *, batch: bool = False) -> dict[str, str]:
    header = SendMessageRequestHeader(
        producer_group="bench_producer_group",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=QUEUES,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties({"WAIT": "true"}),
        batch=True if batch else None,
    )
    return header.to_v2_ext()


def pull_cmd(
    topic: str, queue_id: int, offset: int, *, count: int, suspend_ms: int = 0
) -> RemotingCommand:
    header = PullMessageRequestHeader(
        consumer_group=GROUP,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=count,
        sys_flag=build_pull_sys_flag(
            commit_offset=offset > 0, suspend=suspend_ms > 0, subscription=True
        ),
        commit_offset=offset,
        suspend_timeout_millis=suspend_ms,
        subscription="*",
        sub_version=0,
    )
    return request(RequestCode.PULL_MESSAGE, 0, header.to_ext())


# ---------------------------------------------------------------- our workloads
@dataclass
class Params:
    port: int
    size: int
    n_sync: int
    n_pipe: int
    batch: int
    backlog: int
    count: int
    rate: float
    e2e_seconds: float
    warmup: int
    max_seconds: float
    tag: str


async def produce_sync(p: Params) -> dict[str, float]:
    async def run(pool: ConnPool) -> dict[str, float]:
        conn = await pool.open()
        cmd = request(RequestCode.SEND_MESSAGE_V2, 0, send_ext(f"BenchSync{p.tag}", 0),
                      make_payload(p.size))  # fmt: skip
        lats: list[int] = []
        t0 = time.perf_counter()
        deadline = t0 + p.max_seconds
        while len(lats) < p.n_sync and time.perf_counter() < deadline:
            s = time.perf_counter_ns()
            reply = await conn.request(cmd)
            lats.append(time.perf_counter_ns() - s)
            check(reply, "send")
        dt = time.perf_counter() - t0
        lat = lat_summary_ms(lats)
        return {"msgs_per_s": len(lats) / dt, "p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"]}

    return await with_conns(p.port, run)


async def produce_window(p: Params) -> dict[str, float]:
    async def run(pool: ConnPool) -> dict[str, float]:
        conn = await pool.open()
        cmd = request(RequestCode.SEND_MESSAGE_V2, 0, send_ext(f"BenchWin{p.tag}", 0),
                      make_payload(p.size))  # fmt: skip
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + p.max_seconds
        while n < p.n_pipe and time.perf_counter() < deadline:
            window = [conn.prepare(cmd) for _ in range(p.batch)]
            await conn.stream.send_all(b"".join(frame for _, frame in window))
            for opaque, _ in window:
                check(await conn.reply(opaque), "send")
            n += p.batch
        dt = time.perf_counter() - t0
        return {"msgs_per_s": n / dt}

    return await with_conns(p.port, run)


def batch_body(size: int, batch: int) -> bytes:
    return encode_batch([BatchEntry(make_payload(size), {"WAIT": "true"})] * batch)


async def produce_batch(p: Params) -> dict[str, float]:
    async def run(pool: ConnPool) -> dict[str, float]:
        conn = await pool.open()
        ext = send_ext(f"BenchBatch{p.tag}", 0, batch=True)
        cmd = request(RequestCode.SEND_BATCH_MESSAGE, 0, ext, batch_body(p.size, p.batch))
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + p.max_seconds
        while n < p.n_pipe and time.perf_counter() < deadline:
            check(await conn.request(cmd), "batch send")
            n += p.batch
        dt = time.perf_counter() - t0
        return {"msgs_per_s": n / dt}

    return await with_conns(p.port, run)


async def consume_pull(p: Params) -> dict[str, float]:
    topic = f"BenchConsume{p.tag}"

    async def run(pool: ConnPool) -> dict[str, float]:
        conn = await pool.open()
        # preload: batches of 100, queues in turn (not timed)
        body = batch_body(p.size, 100)
        for i in range(p.backlog // 100):
            ext = send_ext(topic, i % QUEUES, batch=True)
            cmd = request(RequestCode.SEND_BATCH_MESSAGE, 0, ext, body)
            check(await conn.request(cmd), "preload")
        total = (p.backlog // 100) * 100
        offsets = [0] * QUEUES
        done = [False] * QUEUES
        got = 0
        t0 = time.perf_counter()
        deadline = t0 + p.max_seconds
        q = 0
        while got < total and not all(done) and time.perf_counter() < deadline:
            if not done[q]:
                cmd = pull_cmd(topic, q, offsets[q], count=p.count)
                reply = await conn.request(cmd)
                if reply.code == ResponseCode.SUCCESS:
                    got += len(decode_records(reply.body))
                    offsets[q] = PullMessageResponseHeader.from_ext(
                        reply.ext_fields
                    ).next_begin_offset
                elif reply.code in (
                    ResponseCode.PULL_NOT_FOUND,
                    ResponseCode.PULL_RETRY_IMMEDIATELY,
                ):
                    done[q] = True
                else:
                    raise RuntimeError(f"pull: code {reply.code} {reply.remark}")
            q = (q + 1) % QUEUES
        dt = time.perf_counter() - t0
        if got != total:
            raise RuntimeError(f"drained {got} of {total}")
        return {"msgs_per_s": got / dt}

    return await with_conns(p.port, run)


async def e2e_latency(p: Params) -> dict[str, float]:
    topic = f"BenchE2E{p.tag}"
    n = int(p.rate * p.e2e_seconds)

    async def run(pool: ConnPool) -> dict[str, float]:
        prod = await pool.open()
        cons = await pool.open()
        ext = send_ext(topic, 0)
        filler = b"x" * (p.size - TS_BYTES)
        # create the topic; the consumer starts after this message
        prime = request(RequestCode.SEND_MESSAGE_V2, 0, ext, make_payload(p.size))
        check(await prod.request(prime), "prime")
        lats: list[int] = []
        all_in = trio.Event()
        limit = time.monotonic() + p.e2e_seconds + 30

        async def consumer(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            offset = 1
            task_status.started()
            while len(lats) < n and time.monotonic() < limit:
                cmd = pull_cmd(topic, 0, offset, count=p.count, suspend_ms=1000)
                reply = await cons.request(cmd)
                t = time.monotonic_ns()
                if reply.code == ResponseCode.SUCCESS:
                    for m in decode_records(reply.body):
                        lats.append(t - int.from_bytes(m.body[:TS_BYTES], "big"))
                    offset = PullMessageResponseHeader.from_ext(reply.ext_fields).next_begin_offset
                    if len(lats) >= n:
                        all_in.set()
                elif reply.code not in (
                    ResponseCode.PULL_NOT_FOUND,
                    ResponseCode.PULL_RETRY_IMMEDIATELY,
                ):
                    raise RuntimeError(f"pull: code {reply.code} {reply.remark}")

        async with trio.open_nursery() as nursery:
            await nursery.start(consumer)
            await trio.sleep(0.5)  # the consumer is parked in its long poll
            interval = 1.0 / p.rate
            t_start = time.monotonic()
            for i in range(n):
                delay = t_start + i * interval - time.monotonic()
                if delay > 0:
                    await trio.sleep(delay)
                body = time.monotonic_ns().to_bytes(TS_BYTES, "big") + filler
                cmd = request(RequestCode.SEND_MESSAGE_V2, 0, ext, body)
                check(await prod.request(cmd), "send")
            send_dt = time.monotonic() - t_start
            with trio.move_on_after(10):
                await all_in.wait()
            nursery.cancel_scope.cancel()
        res = lat_summary_ms(lats[p.warmup :])
        res["rate_achieved"] = n / send_dt
        res["received"] = float(len(lats))
        return res

    return await with_conns(p.port, run)


OURS: dict[str, Callable[[Params], Any]] = {
    "produce_sync": produce_sync,
    "produce_window": produce_window,
    "produce_batch": produce_batch,
    "consume_pull": consume_pull,
    "e2e_latency": e2e_latency,
}


# ---------------------------------------------------------------- processes
@contextmanager
def broker_subprocess(
    data_dir: Path,
    log_path: Path,
    *args: str,
    segment_size: int = 256 * 1024 * 1024,
    root: Path | None = None,
) -> Iterator[tuple[int, int]]:
    """Run ``python -m broker --data-dir data_dir *args`` on 127.0.0.1 and a free port, its
    output in ``log_path``; yields (pid, port) once it logged "broker started"; stopped with
    SIGTERM (by pid) on exit. The data dir is left for the caller. ``root``: run the broker
    of another checkout (``--broker-root``: before/after comparisons with the same client)."""
    # Any free port for the gRPC front end too (an environment setting, so a broker of an
    # older checkout, which has none, ignores it).
    env = {**os.environ, "TRIMQ_SEGMENT_SIZE": str(segment_size), "TRIMQ_GRPC_PORT": "0"}
    argv = [sys.executable, "-m", "broker", "--host", "127.0.0.1", "--port", "0"]
    argv += ["--data-dir", str(data_dir), *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=root or ROOT, env=env, stdout=log, stderr=log)
    try:
        port = 0
        deadline = time.monotonic() + 30
        while not port and time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"broker exited: {log_path.read_text()[-2000:]}")
            for line in log_path.read_text().splitlines():
                if "broker started" in line:
                    try:
                        port = int(json.loads(line)["port"])
                    except (ValueError, KeyError):
                        continue
            time.sleep(0.05)
        if not port:
            raise RuntimeError("broker did not start within 30 s")
        yield proc.pid, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def broker_process(
    verbose: bool, root: Path | None = None, *args: str
) -> Iterator[tuple[int, int]]:
    """Run ``python -m broker *args`` (of checkout ``root``, default this one) on 127.0.0.1
    and a free port in a fresh data dir (removed at the end); yields (pid, port)."""
    WORK_DIR.mkdir(exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="broker-", dir=WORK_DIR))
    log_path = data_dir.parent / (data_dir.name + ".log")
    try:
        with broker_subprocess(data_dir, log_path, *args, root=root) as (pid, port):
            if verbose:
                print(f"broker pid {pid} port {port} data {data_dir}", flush=True)
            yield pid, port
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
        log_path.unlink(missing_ok=True)


# ---------------------------------------------------------------- report
#: (our workload, metric, the peers' workload (same name in both scripts), aim against Redis)
ROWS: list[tuple[str, str, str | None, str]] = [
    ("produce_sync", "msgs_per_s", "produce_sync", ">=0.8x"),
    ("produce_sync", "p50_ms", None, ""),
    ("produce_sync", "p99_ms", None, ""),
    ("produce_window", "msgs_per_s", "produce_pipelined", ">=1.0x"),
    ("produce_batch", "msgs_per_s", "produce_pipelined", ">=1.0x"),
    ("consume_pull", "msgs_per_s", "consume_ack", ">=1.0x"),
    ("e2e_latency", "p50_ms", "e2e_latency", ""),
    ("e2e_latency", "p90_ms", "e2e_latency", ""),
    ("e2e_latency", "p99_ms", "e2e_latency", "<=5ms"),
    ("e2e_latency", "max_ms", "e2e_latency", ""),
]


def median_of(rows: list[dict[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in rows if key in r]
    return statistics.median(vals) if vals else float("nan")


def verdict(aim: str, ours: float, ratio: float) -> str:
    if not aim:
        return ""
    if aim.endswith("ms"):
        return "met" if ours <= float(aim[2:-2]) else "MISSED"
    if math.isnan(ratio):
        return "n/a"
    return "met" if ratio >= float(aim[2:-1]) else "MISSED"


def ratio_of(metric: str, ours: float, theirs: float) -> float:
    """> 1 means trimq is better: ours/theirs for rates, theirs/ours for latencies."""
    if math.isnan(theirs) or not ours or not theirs:
        return float("nan")
    return theirs / ours if metric.endswith("_ms") else ours / theirs


def print_table(
    size: int,
    ours: dict[str, list[dict[str, float]]],
    peers: dict[str, dict[str, list[dict[str, Any]]]],
    cpu: dict[str, list[float]],
    rows: Sequence[tuple[str, str, str | None, str]] | None = None,
) -> None:
    """Medians; per peer its figure and the ratio; the aims (after Redis) are against Redis.
    ``rows`` are (our workload, metric, peer workload, aim); :data:`ROWS` by default."""
    names = sorted(peers, key=lambda name: name != "redis")  # Redis first, then the aims
    print(f"\n## size {size} B (median of {max(len(v) for v in ours.values())} runs)")
    head = [f"{'workload':<46}", f"{'trimq':>10}"]
    for name in names:
        head += [f"{name:>10}", f"{'x' + name[:6]:>7}"]
    head[2 + 2 * ("redis" in peers) : 2] = [f"{'aim':>6}", f"{'':>6}"]
    head.append(f"{'broker CPU us/msg':>17}")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("-" * (len(h) + 2) for h in head) + "|")
    for wl, metric, pwl, aim in ROWS if rows is None else rows:
        if wl not in ours:
            continue
        o = median_of(ours[wl], metric)
        fmt = "{:10.3f}" if metric.endswith("_ms") else "{:10.0f}"
        label = f"{wl} {metric}" + (f" vs {pwl}" if pwl and metric == "msgs_per_s" else "")
        cells = [f"{label:<46}", fmt.format(o)]
        vs_redis = float("nan")
        for name in names:
            r = median_of(peers[name].get(pwl, []), metric) if pwl else float("nan")
            ratio = ratio_of(metric, o, r)
            vs_redis = ratio if name == "redis" else vs_redis
            cells += [fmt.format(r) if not math.isnan(r) else f"{'n/a':>10}", f"{ratio:7.2f}"]
        cells[2 + 2 * ("redis" in peers) : 2] = [f"{aim:>6}", f"{verdict(aim, o, vs_redis):>6}"]
        us = f"{statistics.median(cpu[wl]):17.1f}" if metric == "msgs_per_s" and cpu.get(wl) else ""
        cells.append(f"{us:>17}")
        print("| " + " | ".join(cells) + " |")
    print("(x<peer>: trimq/peer for msgs/s, peer/trimq for latency; >1 = trimq better)")


def count_of(p: Params, wl: str) -> int:
    return {
        "produce_sync": p.n_sync,
        "produce_window": p.n_pipe,
        "produce_batch": p.n_pipe,
        "consume_pull": p.backlog,
        "e2e_latency": int(p.rate * p.e2e_seconds),
    }[wl]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="128")
    ap.add_argument("--workloads", default=",".join(OURS))
    ap.add_argument("--n-sync", type=int, default=20000)
    ap.add_argument("--n-pipe", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--backlog", type=int, default=100000)
    ap.add_argument("--count", type=int, default=32)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--e2e-seconds", type=float, default=10.0)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--peers", default=",".join(PEERS), help="peer brokers measured each run")
    ap.add_argument("--no-peer", action="store_true", help="same as --peers ''")
    ap.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    ap.add_argument("--out", default=None, help="JSON-lines file for every row")
    ap.add_argument(
        "--broker-root",
        type=Path,
        default=None,
        help="run the broker of another checkout (a before/after comparison, same client)",
    )
    args = ap.parse_args()
    workloads = [w for w in args.workloads.split(",") if w]
    peers = [] if args.no_peer else [n for n in args.peers.split(",") if n]
    if unknown := set(peers) - set(PEERS):
        ap.error(f"unknown peers {sorted(unknown)}; known: {', '.join(PEERS)}")
    peers = [n for n in peers if (PEER_BENCH / PEERS[n].script).exists()]
    common = peer_common_args(args)
    if peers:
        ensure_peer_venv(args.peer_python, [m for n in peers for m in PEERS[n].modules])

    with ExitStack() as stack:
        pid, port = stack.enter_context(broker_process(verbose=True, root=args.broker_root))
        for name in peers:
            stack.enter_context(PEERS[name].server())
        for size in [int(s) for s in args.sizes.split(",") if s]:
            ours: dict[str, list[dict[str, float]]] = {w: [] for w in workloads}
            cpu: dict[str, list[float]] = {w: [] for w in workloads}
            theirs: dict[str, dict[str, list[dict[str, Any]]]] = {n: {} for n in peers}
            for run in range(args.runs):
                for wl in workloads:
                    p = Params(
                        port, size, args.n_sync, args.n_pipe, args.batch, args.backlog,
                        args.count, args.rate, args.e2e_seconds, args.warmup, args.max_seconds,
                        f"{size}r{run}",
                    )  # fmt: skip
                    c0 = proc_cpu_seconds(pid)
                    res = trio.run(OURS[wl], p)
                    # consume_pull includes its (untimed) preload in the CPU figure
                    cpu[wl].append((proc_cpu_seconds(pid) - c0) * 1e6 / count_of(p, wl))
                    ours[wl].append(res)
                    short = {k: round(v, 3) for k, v in res.items()}
                    print(f"[trimq] {wl} size={size} run={run}: {short}", flush=True)
                    write_row(args.out, {"peer": "trimq", "workload": wl, "size": size, **res})
                peer_round(theirs, args.peer_python, size, run, common, args.count, args.out)
            print_table(size, ours, theirs, cpu)


#: Our options that the peer scripts take too: passed on, so all measure the same counts.
PEER_COMMON_ARGS: tuple[str, ...] = ("n_sync", "n_pipe", "batch", "backlog", "max_seconds")
PEER_COMMON_ARGS += ("rate", "e2e_seconds", "warmup")


def peer_round(
    theirs: dict[str, dict[str, list[dict[str, Any]]]],
    peer_python: Path,
    size: int,
    run: int,
    common: Sequence[str],
    count: int,
    out: str | None,
) -> None:
    """One round of every peer in ``theirs`` at ``size``: rows collected, printed, written.
    A peer that fails is reported and skipped for this round."""
    for name in theirs:
        try:
            rows = run_peer(name, peer_python, size, common, count)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"[{name}] size={size} run={run} FAILED: {exc}", flush=True)
            continue
        for wl, row in rows.items():
            theirs[name].setdefault(wl, []).append(row)
            keys = ("msgs_per_s", "p50_ms", "p90_ms", "p99_ms", "max_ms")
            short = {k: round(row[k], 3) for k in keys if k in row}
            print(f"[{name}] {wl} size={size} run={run}: {short}", flush=True)
            write_row(out, row)


def peer_common_args(args: argparse.Namespace) -> list[str]:
    """Our options that the peer scripts take too, as flags for them."""
    return [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in PEER_COMMON_ARGS]


def write_row(path: str | None, row: dict[str, Any]) -> None:
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
