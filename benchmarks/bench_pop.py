"""Pop + ack throughput over TCP, side by side with Redis Streams XREADGROUP + XACK.

Our broker runs as a subprocess (``bench_broker.broker_process``: ``python -m broker`` on
127.0.0.1, a free port, a temporary data dir under ``.bench-peers/``, stopped by pid at the
end). Each measurement gets a fresh topic (4 queues) and group; a backlog of ``--backlog``
messages is preloaded untimed with SEND_BATCH_MESSAGE (100 per request, 8 requests in flight),
then drained by trio clients in this process:

* ``pop_ack``: one consumer: POP_MESSAGE of ``--count`` (queueId -1, invisibleTime
  ``--invisible-ms``, pollTime 0), then one ACK_MESSAGE per message, the acks of a pop written
  back to back in one send and all awaited before the next pop;
* ``pop_batch_ack``: the same with one BATCH_ACK_MESSAGE per pop (one ``BatchAck`` per queue
  checkpoint of the pop);
* ``pop_ack_4conn``: ``pop_ack`` by ``--consumers`` consumers of one group, each on its own
  connection, in parallel.

The client does what a RocketMQ 5 client does with a pop reply: parse the header, decode the
records, build each receipt (``pop_receipt``) and encode it. A pop that finds nothing ends a
consumer (nothing is revived within the invisible time); every loop is bounded in count and by
``--max-seconds``. Every ack must succeed and exactly the backlog must be acked.

Figures per measurement: messages/s consumed+acked; CPU seconds of the broker process per 1000
messages over the drain only (``/proc/<pid>/stat``); the same for this client process; the
broker's write(2) calls on files per message (``syscw`` of ``/proc/<pid>/io``: journal and
metrics appends); and the CPU (in cores) used by everything else on the machine meanwhile, to
show how noisy it was.

The peer is ``../shared/peer-bench/redis_streams_bench.py --workloads consume_ack`` (XREADGROUP
COUNT ``--count`` + one XACK per batch over the same backlog), run with ``--runs 1`` after every
round of ours so both see the same noise. It talks to a private ``redis-server`` on a free
loopback port started here and stopped by pid at the end (not the shared 6390, whose stream key
another benchmark may be using), or to ``--redis-port`` if given. Its client runs in the
``--peer-python`` venv (created with redis-py and hiredis if missing). ``--profile FILE`` adds
one extra, unreported run of ``--profile-workload`` (``pop_ack``) at the first size, its drain
under ``py-spy record --format raw``, and prints the broker's top functions by self and
inclusive share of the busy samples.

``--broker-root`` runs the broker of another checkout (a before/after comparison with the same
client); ``--py-spy`` names the py-spy executable.

Usage: python -m benchmarks.bench_pop [--runs 3] [--sizes 128,1024] [--no-peer] [--quick]
    [--profile /tmp/pop.txt] [--py-spy PATH] [--broker-root OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from benchmarks.bench_broker import (
    QUEUES,
    Conn,
    ConnPool,
    batch_body,
    broker_process,
    check,
    proc_cpu_seconds,
    send_ext,
    with_conns,
    write_row,
)
from benchmarks.peers import (
    PEER_BENCH,
    PEER_PYTHON,
    WORK_DIR,
    ensure_peer_venv,
    redis_cli,
    redis_daemon,
)
from protocol.bodies.ack import BatchAck, BatchAckMessageRequestBody
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.frame import encode_command
from protocol.headers.pop import (
    AckMessageRequestHeader,
    PopMessageRequestHeader,
    PopMessageResponseHeader,
)
from protocol.message import decode_records
from protocol.receipt import ExtraInfo, parse_start_offset_info, pop_receipt

BROKER_NAME = "broker-a"  #: the broker's default name, put into receipts and batch acks
PRELOAD_BATCH = 100  #: messages per SEND_BATCH_MESSAGE of the preload
PRELOAD_WINDOW = 8  #: preload requests in flight
AIM = 0.5  #: trimq / Redis msgs/s aimed at (the pop issue)
PY_SPY = WORK_DIR / "venv" / "bin" / "py-spy"
REDIS_SCRIPT = "redis_streams_bench.py"


# ---------------------------------------------------------------- machine load
def proc_write_calls(pid: int) -> int:
    """``syscw`` of ``/proc/<pid>/io``: write(2)-family calls on files and pipes so far (socket
    sends are not counted); -1 when unreadable."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("syscw:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return -1


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])  # guest time is already counted in user
    return total - idle, total


@dataclass
class Meter:
    """Broker CPU, client CPU and machine CPU between :meth:`start` and :meth:`stop`."""

    pid: int
    wall: float = 0.0
    broker_s: float = 0.0
    client_s: float = 0.0
    machine_s: float = 0.0
    writes: int = -1
    _t: float = 0.0
    _b: float = 0.0
    _c: float = 0.0
    _m: int = 0
    _w: int = -1

    def start(self) -> None:
        self._w = proc_write_calls(self.pid)
        self._t = time.perf_counter()
        self._b = proc_cpu_seconds(self.pid)
        self._c = time.process_time()
        self._m = cpu_jiffies()[0]

    def stop(self) -> None:
        self.wall = time.perf_counter() - self._t
        self.broker_s = proc_cpu_seconds(self.pid) - self._b
        self.client_s = time.process_time() - self._c
        self.machine_s = (cpu_jiffies()[0] - self._m) / os.sysconf("SC_CLK_TCK")
        w = proc_write_calls(self.pid)
        self.writes = w - self._w if w >= 0 and self._w >= 0 else -1

    def figures(self, msgs: int) -> dict[str, float]:
        k = max(msgs, 1) / 1000
        other = max(0.0, self.machine_s - self.broker_s - self.client_s)
        return {
            "msgs": float(msgs),
            "seconds": self.wall,
            "msgs_per_s": msgs / self.wall if self.wall > 0 else float("nan"),
            "broker_cpu_s_per_1k": self.broker_s / k,
            "client_cpu_s_per_1k": self.client_s / k,
            "other_cores": other / self.wall if self.wall > 0 else float("nan"),
            "broker_writes_per_msg": self.writes / msgs if self.writes >= 0 else float("nan"),
        }


# ---------------------------------------------------------------- protocol
@dataclass(frozen=True)
class Params:
    port: int
    pid: int
    size: int
    backlog: int
    count: int
    invisible_ms: int
    consumers: int
    max_seconds: float
    tag: str
    profile: Path | None = None  #: py-spy raw output of the drain (not the preload)
    py_spy: Path = PY_SPY  #: the py-spy executable
    #: Sample only the thread holding the GIL (``py-spy --gil``): Python CPU, not GIL waits.
    py_spy_gil: bool = False


@dataclass
class Tally:
    """Shared by the consumers of one measurement."""

    target: int
    acked: int = 0
    pops: int = 0
    empty_pops: int = 0


def pop_cmd(p: Params, topic: str, group: str, opaque: int) -> RemotingCommand:
    header = PopMessageRequestHeader(
        consumer_group=group, topic=topic, queue_id=-1, max_msg_nums=p.count,
        invisible_time=p.invisible_ms, poll_time=0, born_time=int(time.time() * 1000),
        init_mode=0, exp_type="TAG", exp="*",
    )  # fmt: skip
    return request(RequestCode.POP_MESSAGE, opaque, header.to_ext())


def receipts(reply: RemotingCommand) -> list[tuple[str, int, int, ExtraInfo]]:
    """(topic, queue id, queue offset, receipt) of each message of a SUCCESS pop reply, as the
    Java client rebuilds them (``MQClientAPIImpl.processPopResponse``)."""
    head = PopMessageResponseHeader.from_ext(reply.ext_fields)
    starts = parse_start_offset_info(head.start_offset_info or "")
    out = []
    for msg in decode_records(reply.body):
        receipt = pop_receipt(
            msg.topic, msg.queue_id, msg.queue_offset, msg.properties, pop_time=head.pop_time,
            invisible_time=head.invisible_time, revive_qid=head.revive_qid,
            start_offsets=starts, broker_name=BROKER_NAME,
        )  # fmt: skip
        out.append((msg.topic, msg.queue_id, msg.queue_offset, receipt))
    return out


def ack_frames(
    conn: Conn, group: str, popped: Sequence[tuple[str, int, int, ExtraInfo]]
) -> tuple[bytes, list[int]]:
    """One ACK_MESSAGE per message, registered with ``conn``: the frames joined, the opaques."""
    frames = []
    opaques = []
    for topic, queue_id, offset, receipt in popped:
        header = AckMessageRequestHeader(
            consumer_group=group, topic=receipt.real_topic(topic, group), queue_id=queue_id,
            extra_info=receipt.encode(), offset=offset,
        )  # fmt: skip
        cmd = request(RequestCode.ACK_MESSAGE, conn.opaque(), header.to_ext())
        conn.expect(cmd.opaque)
        opaques.append(cmd.opaque)
        frames.append(encode_command(cmd))
    return b"".join(frames), opaques


def batch_ack_body(group: str, popped: Sequence[tuple[str, int, int, ExtraInfo]]) -> bytes:
    """BATCH_ACK_MESSAGE body: one ``BatchAck`` per (topic, queue, checkpoint) of the pop."""
    by_ck: dict[tuple[str, int, int], list[int]] = {}
    first: dict[tuple[str, int, int], ExtraInfo] = {}
    for topic, queue_id, offset, receipt in popped:
        key = (topic, queue_id, receipt.ck_queue_offset)
        by_ck.setdefault(key, []).append(offset)
        first.setdefault(key, receipt)
    acks = []
    for (topic, queue_id, start), offsets in by_ck.items():
        r = first[(topic, queue_id, start)]
        acks.append(BatchAck(
            consumer_group=group, topic=topic, start_offset=start, queue_id=queue_id,
            revive_queue_id=r.revive_qid, pop_time=r.pop_time_ms,
            invisible_time=r.invisible_time_ms, retry=str(int(r.retry_flag)),
            offsets=tuple(offsets),
        ))  # fmt: skip
    return BatchAckMessageRequestBody(broker_name=BROKER_NAME, acks=tuple(acks)).to_json()


async def preload(conn: Conn, topic: str, size: int, backlog: int) -> int:
    """``backlog`` messages (rounded down to whole batches) over the queues in turn."""
    body = batch_body(size, PRELOAD_BATCH)
    n = backlog // PRELOAD_BATCH
    exts = [send_ext(topic, q, batch=True) for q in range(QUEUES)]
    for first in range(0, n, PRELOAD_WINDOW):  # bounded: n / window rounds
        cmds = [
            request(RequestCode.SEND_BATCH_MESSAGE, conn.opaque(), exts[i % QUEUES], body)
            for i in range(first, min(n, first + PRELOAD_WINDOW))
        ]
        for cmd in cmds:
            conn.expect(cmd.opaque)
        await conn.stream.send_all(b"".join(encode_command(cmd) for cmd in cmds))
        for cmd in cmds:
            check(await conn.reply(cmd.opaque), "preload")
    return n * PRELOAD_BATCH


async def consumer(
    conn: Conn, p: Params, topic: str, group: str, tally: Tally, batch: bool, deadline: float
) -> None:
    """Pop and ack until a pop finds nothing, the backlog is acked, or the deadline."""
    for _ in range(tally.target + 10):  # bounded: every pop but the last returns >= 1 message
        if tally.acked >= tally.target or time.perf_counter() > deadline:
            return
        reply = await conn.request(pop_cmd(p, topic, group, conn.opaque()))
        tally.pops += 1
        if reply.code == ResponseCode.POLLING_TIMEOUT:
            tally.empty_pops += 1
            return
        check(reply, "pop")
        popped = receipts(reply)
        if batch:
            cmd = request(
                RequestCode.BATCH_ACK_MESSAGE, conn.opaque(), body=batch_ack_body(group, popped)
            )
            reply = await conn.request(cmd)
            check(reply, "batch ack")
            if reply.remark:
                raise RuntimeError(f"batch ack: {reply.remark}")
        else:
            frames, opaques = ack_frames(conn, group, popped)
            await conn.stream.send_all(frames)
            for opaque in opaques:
                check(await conn.reply(opaque), "ack")
        tally.acked += len(popped)


async def drain(p: Params, consumers: int, batch: bool) -> dict[str, float]:
    topic = f"BenchPop{p.tag}"
    group = f"bench_pop_group_{p.tag}"

    async def run(pool: ConnPool) -> dict[str, float]:
        conns = [await pool.open() for _ in range(consumers)]
        total = await preload(conns[0], topic, p.size, p.backlog)
        tally = Tally(total)
        meter = Meter(p.pid)
        with ExitStack() as stack:
            if p.profile is not None:
                stack.enter_context(
                    py_spy(p.pid, p.profile, p.max_seconds + 60, p.py_spy, gil=p.py_spy_gil)
                )
            meter.start()
            deadline = time.perf_counter() + p.max_seconds
            async with trio.open_nursery() as nursery:
                for conn in conns:
                    nursery.start_soon(consumer, conn, p, topic, group, tally, batch, deadline)
            meter.stop()
        if tally.acked != total:
            raise RuntimeError(f"acked {tally.acked} of {total} in {meter.wall:.1f} s")
        res = meter.figures(tally.acked)
        res["pops"] = float(tally.pops)
        return res

    return await with_conns(p.port, run)


async def pop_ack(p: Params) -> dict[str, float]:
    return await drain(p, 1, batch=False)


async def pop_batch_ack(p: Params) -> dict[str, float]:
    return await drain(p, 1, batch=True)


async def pop_ack_nconn(p: Params) -> dict[str, float]:
    return await drain(p, p.consumers, batch=False)


OURS: dict[str, Callable[[Params], Awaitable[dict[str, float]]]] = {
    "pop_ack": pop_ack,
    "pop_batch_ack": pop_batch_ack,
    "pop_ack_4conn": pop_ack_nconn,
}


# ---------------------------------------------------------------- Redis
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def redis_pid(port: int) -> int:
    """The pid of the Redis answering on ``port`` (0 if none answers)."""
    for line in redis_cli(port, "info", "server").splitlines():
        if line.startswith("process_id:"):
            return int(line.split(":", 1)[1])
    return 0


@contextmanager
def private_redis() -> Iterator[tuple[int, int]]:
    """A ``redis-server`` on a free loopback port, no persistence; yields (pid, port)."""
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    with redis_daemon(port, "redis-pop-") as pid:
        print(f"redis pid {pid} port {port} (private)", flush=True)
        yield pid, port


def redis_round(
    python: Path, port: int, pid: int, size: int, backlog: int, count: int, max_seconds: float
) -> dict[str, float]:
    """One ``consume_ack`` of the peer script; its figures in our units."""
    with tempfile.TemporaryDirectory(dir=WORK_DIR) as tmp:
        out = Path(tmp) / "redis.jsonl"
        argv = [str(python), str(PEER_BENCH / REDIS_SCRIPT), "--port", str(port)]
        argv += ["--runs", "1", "--workloads", "consume_ack", "--sizes", str(size)]
        argv += [
            "--backlog",
            str(backlog),
            "--count",
            str(count),
            "--max-seconds",
            str(max_seconds),
        ]
        argv += ["--quiet-wait", "0", "--broker-pid", str(pid), "--out", str(out)]
        done = subprocess.run(argv, cwd=PEER_BENCH, capture_output=True, timeout=900)
        if done.returncode:
            raise RuntimeError(f"{REDIS_SCRIPT} exited {done.returncode}: {done.stderr[-1500:]!r}")
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    row = next(r for r in rows if r.get("workload") == "consume_ack")
    msgs = int(row["msgs"])
    if msgs != backlog:
        raise RuntimeError(f"redis consume_ack drained {msgs} of {backlog}")
    k = msgs / 1000
    return {
        "msgs_per_s": float(row["msgs_per_s"]),
        "broker_cpu_s_per_1k": float(row.get("drain_broker_cpu_s", math.nan)) / k,
        "client_cpu_s_per_1k": float(row.get("drain_client_cpu_s", math.nan)) / k,
    }


# ---------------------------------------------------------------- profile
@contextmanager
def py_spy(
    pid: int, out: Path, limit_s: float, exe: Path = PY_SPY, *, gil: bool = False
) -> Iterator[None]:
    """``py-spy record --format raw`` of ``pid`` while entered (at most ``limit_s``; with
    ``gil``, only the thread holding the GIL: a thread waiting for it is not sampled)."""
    argv = [str(exe), "record", "--pid", str(pid), "--format", "raw", "-o", str(out)]
    argv += ["--rate", "200", "--duration", str(math.ceil(limit_s))]
    argv += ["--gil"] if gil else []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(1.0)  # attached
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        try:
            log, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate(timeout=10)
        tail = log.decode(errors="replace").strip().splitlines()[-2:]
        print("\n".join(f"  {line}" for line in tail), flush=True)


def _function(frame: str) -> str:
    """``name (path:line)`` -> ``name (path)``: one entry per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/lib/python3", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})" if path else name


#: Leaf frames of a thread that waits (py-spy's idle detection misses these): the event loop
#: in ``epoll_wait`` and trio's cached worker threads waiting for a job.
IDLE_LEAVES = frozenset(
    {
        "EpollIOManager.get_events (trio/_core/_io_epoll.py)",
        "WorkerThread._work (trio/_core/_thread_cache.py)",
    }
)


def profile_summary(path: Path, top: int) -> None:
    """Top functions of a raw py-spy output, as shares of the busy samples (idle waits
    dropped): by self time, and by inclusive time among the project's own functions."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    busy = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [_function(f) for f in stack.split(";") if f]
        if not frames or not count.isdigit():
            continue
        n = int(count)
        if frames[-1] in IDLE_LEAVES:
            idle += n
            continue
        busy += n
        own[frames[-1]] += n
        for fn in set(frames):
            if fn.partition(" (")[2].startswith(("broker/", "protocol/")):
                inclusive[fn] += n
    print(f"\n## py-spy profile of the broker ({path})")
    print(f"{busy} busy samples ({idle} idle ones dropped: epoll wait, idle worker threads)")
    for title, counter in (("self", own), ("inclusive, broker/ and protocol/", inclusive)):
        print(f"\n| {title} % | function |\n|---:|---|")
        for fn, n in counter.most_common(top):
            print(f"| {100 * n / max(busy, 1):5.1f} | `{fn}` |")


# ---------------------------------------------------------------- report
def median_of(rows: Sequence[dict[str, float]], key: str) -> float:
    vals = [r[key] for r in rows if key in r and not math.isnan(r[key])]
    return statistics.median(vals) if vals else float("nan")


def print_table(
    size: int,
    count: int,
    ours: dict[str, list[dict[str, float]]],
    redis: list[dict[str, float]],
) -> None:
    runs = max((len(v) for v in ours.values()), default=0)
    print(f"\n## size {size} B, 32-message pops, median of {runs} runs (Redis: {len(redis)})")
    print(
        "| workload | trimq msgs/s | Redis consume_ack msgs/s | x Redis | aim | verdict "
        "| broker CPU s/1k msgs | Redis CPU s/1k msgs | client CPU s/1k msgs "
        "| broker write calls/msg | other load (cores) |"
    )
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|")
    r_rate = median_of(redis, "msgs_per_s")
    r_cpu = median_of(redis, "broker_cpu_s_per_1k")
    for wl, rows in ours.items():
        rate = median_of(rows, "msgs_per_s")
        ratio = rate / r_rate if r_rate > 0 else float("nan")
        verdict = "n/a" if math.isnan(ratio) else ("met" if ratio >= AIM else "MISSED")
        cells = [
            wl,
            f"{rate:.0f}",
            "n/a" if math.isnan(r_rate) else f"{r_rate:.0f}",
            "n/a" if math.isnan(ratio) else f"{ratio:.2f}",
            f">={AIM}x",
            verdict,
            f"{median_of(rows, 'broker_cpu_s_per_1k'):.3f}",
            "n/a" if math.isnan(r_cpu) else f"{r_cpu:.3f}",
            f"{median_of(rows, 'client_cpu_s_per_1k'):.3f}",
            f"{median_of(rows, 'broker_writes_per_msg'):.2f}",
            f"{median_of(rows, 'other_cores'):.2f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print(
        f"(Redis: XREADGROUP COUNT {count} + one XACK per batch; x Redis = trimq/Redis msgs/s; "
        "write calls: write(2) on files (journal, metrics; socket sends not counted); "
        f"other load = CPU used by other processes during our drain, of {os.cpu_count()} cores)",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="128,1024")
    ap.add_argument("--workloads", default=",".join(OURS))
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--count", type=int, default=32, help="messages per pop / XREADGROUP")
    ap.add_argument("--invisible-ms", type=int, default=60_000)
    ap.add_argument("--consumers", type=int, default=4, help="consumers of pop_ack_4conn")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="limit of one drain")
    ap.add_argument("--no-peer", action="store_true", help="skip Redis")
    ap.add_argument("--redis-port", type=int, default=0, help="use this Redis, not a private one")
    ap.add_argument("--peer-python", type=Path, default=PEER_PYTHON)
    ap.add_argument("--quick", action="store_true", help="backlog 5000, 1 run: a smoke test")
    ap.add_argument("--profile", type=Path, default=None, help="py-spy raw output file")
    ap.add_argument("--profile-workload", default="pop_ack", choices=list(OURS))
    ap.add_argument("--profile-top", type=int, default=25)
    ap.add_argument("--py-spy", type=Path, default=PY_SPY, help="the py-spy executable")
    ap.add_argument(
        "--py-spy-gil",
        action="store_true",
        help="sample only the thread holding the GIL (py-spy --gil): where the Python CPU "
        "goes, without the samples of threads waiting for the GIL",
    )
    ap.add_argument(
        "--broker-root",
        type=Path,
        default=None,
        help="run the broker of another checkout (a before/after comparison, same client)",
    )
    ap.add_argument("--out", default=None, help="JSON-lines file for every row")
    args = ap.parse_args()
    if args.quick:
        args.backlog, args.runs = 5000, 1
    if args.backlog < PRELOAD_BATCH:
        ap.error(f"--backlog must be at least {PRELOAD_BATCH}")
    args.backlog -= args.backlog % PRELOAD_BATCH
    workloads = [w for w in args.workloads.split(",") if w]
    if unknown := set(workloads) - set(OURS):
        ap.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(OURS)}")
    with_redis = not args.no_peer and (PEER_BENCH / REDIS_SCRIPT).exists()
    if not args.no_peer and not with_redis:
        print(f"no {PEER_BENCH / REDIS_SCRIPT}: Redis skipped", flush=True)
    if with_redis:
        ensure_peer_venv(args.peer_python, ["redis", "hiredis"])
    print(f"load average {os.getloadavg()}, {os.cpu_count()} cores", flush=True)

    with ExitStack() as stack:
        pid, port = stack.enter_context(broker_process(verbose=True, root=args.broker_root))
        r_pid, r_port = 0, 0
        if with_redis and args.redis_port:
            r_pid, r_port = redis_pid(args.redis_port), args.redis_port
            if not r_pid:
                raise SystemExit(f"no Redis answers on 127.0.0.1:{args.redis_port}")
        elif with_redis:
            r_pid, r_port = stack.enter_context(private_redis())

        def params(size: int, tag: str) -> Params:
            return Params(
                port, pid, size, args.backlog, args.count, args.invisible_ms, args.consumers,
                args.max_seconds, tag,
            )  # fmt: skip

        sizes = [int(s) for s in args.sizes.split(",") if s]
        for size in sizes:
            ours: dict[str, list[dict[str, float]]] = {w: [] for w in workloads}
            redis: list[dict[str, float]] = []
            for run in range(args.runs):
                for wl in workloads:
                    res = trio.run(OURS[wl], params(size, f"{wl}{size}r{run}"))
                    ours[wl].append(res)
                    short = {k: round(v, 3) for k, v in res.items()}
                    print(f"[trimq] {wl} size={size} run={run}: {short}", flush=True)
                    write_row(args.out, {"peer": "trimq", "workload": wl, "size": size, **res})
                if with_redis:
                    try:
                        row = redis_round(
                            args.peer_python, r_port, r_pid, size, args.backlog, args.count,
                            args.max_seconds,
                        )  # fmt: skip
                    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                        print(f"[redis] size={size} run={run} FAILED: {exc}", flush=True)
                        continue
                    redis.append(row)
                    short = {k: round(v, 3) for k, v in row.items()}
                    print(f"[redis] consume_ack size={size} run={run}: {short}", flush=True)
                    write_row(
                        args.out, {"peer": "redis", "workload": "consume_ack", "size": size, **row}
                    )
            print_table(size, args.count, ours, redis)
        if args.profile is not None:
            size = sizes[0]
            wl = args.profile_workload
            print(f"\nprofiling one {wl} run (size {size}) with py-spy", flush=True)
            p = dataclasses.replace(
                params(size, f"profile{size}"),
                profile=args.profile,
                py_spy=args.py_spy,
                py_spy_gil=args.py_spy_gil,
            )
            res = trio.run(OURS[wl], p)
            print(f"[trimq] {wl} under py-spy: {res['msgs_per_s']:.0f} msgs/s", flush=True)
            profile_summary(args.profile, args.profile_top)


if __name__ == "__main__":
    main()
