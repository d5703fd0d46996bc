"""Storage engine throughput and restart cost: async puts, sync group commit, recovery time.

Workloads:

* ``async``: ``MessageStore.put_nowait`` in a loop plus the final ``flush`` (one fsync), ASYNC
  mode, for each ``--sizes`` body (128 B and 1 KiB by default) with the properties a real
  producer sends (TAGS, KEYS, UNIQ_KEY), round-robin over ``--queues`` queues of one topic.
  MB/s counts stored record bytes (``PutResult.size``). The peer figure is
  ``../shared/peer-bench/physical_limits.py --workloads append`` (``append_1k_nofsync``: 1 KiB
  ``os.write`` calls, no fsync), run in the same session, interleaved run by run; the aim is
  >= 40 % of its MB/s for 1 KiB bodies. A put defers some work to the next checkpoint
  (consume-queue write-out, key-index rows into SQLite): one checkpoint taken after the timed
  part is shown beside the figure (``ckpt s``, ``MB/s+ckpt``), not counted in it.
  ``--profile`` adds one cProfile'd 1 KiB run (not counted in the medians) and prints its top
  15 functions by own time.
* ``sync``: ``serve_storage`` in SYNC mode on trio, 1, 16 and 64 writer tasks each looping
  ``await storage.put(...)`` (1 KiB bodies) until a fixed total is stored: puts/s, group
  commits (``Storage.statistics().fsyncs``), messages per fsync, put latency; aim: 64
  writers >= 10x 1.
* ``stall``: the longest single put. ``--stall-mb`` MiB (400) of 1 KiB puts, the log written
  out (no fsync) every 256 puts as the broker's flush task does, each put timed alone: the
  maximum, the 99.99th percentile and how many puts took over 5 ms. Automatic GC is off
  during the loop (a broker schedules its own collections, ``broker/gc_tuning.py``), so the
  figure is the store's. Before the chunked in-memory tail, one put every ~32 MiB copied
  the whole 64 MiB tail (40-70 ms).
* ``restart``: a ~10 MB and a ~1 GB store (``--small-mb``, ``--big-mb``). Crash recovery
  (kill -9 simulated: the log is written out, then the store is abandoned without close):
  (a) with a checkpoint taken before the last ~1 % of the writes, (b) with no checkpoint file
  (a full scan). Then a clean restart: ``MessageStore.open`` + ``close`` with no work, which
  should cost the same whatever the log size. Each is timed ``--restart-repeats`` times
  (median) with a cold page cache (``echo 3 > /proc/sys/vm/drop_caches``, tried only when
  possible, i.e. as root with a writable /proc; the report says whether it was done) and warm.

Disk space: the stores live in a temporary directory under ``--dir`` (default: ``.bench-store``
beside the repository root, on the working disk), removed at the end. Segments are
preallocated, so the peak is about ``--big-mb`` MiB + two segments (``--segment-mb``, 256 by
default) + the peer's ~256 MB file: about 1.8 GiB with the defaults, about 0.9 GiB with
``--quick`` (which also shrinks every count, for a smoke test). The run refuses to start
with less free space than that.

Nothing is bound to the network; every loop is bounded by a count and a time limit.

Usage: python -m benchmarks.bench_store [--runs 5] [--sizes 128,1024] [--n 300000,200000]
       [--big-mb 1024] [--quick] [--profile] [--no-peer] [--no-drop-caches] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import math
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from benchmarks.peer import physical_limits
from broker.storage import Storage, serve_storage
from broker.store.api import FlushMode, MessageToStore
from broker.store.config import StoreConfig
from broker.store.store import MessageStore, remove_store
from protocol.properties import KEYS, TAGS, UNIQ_KEY, encode_properties

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
TOPIC = "BenchTopic"
POOL = 4096  # distinct messages cycled through (a power of two: index with a mask)
BATCH = 4096  # puts between two looks at the clock
PEER_REFERENCE = "append_1k_nofsync"
ASYNC_AIM = 0.40
CHECKPOINT_EVERY = 64 * MIB  # while building the restart stores
SYNC_AIM = 10.0
Row = dict[str, Any]


# ------------------------------------------------------------------ helpers
def messages(body_size: int, queues: int, count: int = POOL) -> list[MessageToStore]:
    """``count`` distinct messages as a producer sends them (random bodies, unique keys)."""
    pid = os.getpid() & 0xFFFF
    born = time.time_ns() // 1_000_000
    out = []
    for i in range(count):
        uniq = f"0A000007{pid:04X}1B2C3D4E{(born // 1000) & 0xFFFFFFFF:08X}{i & 0xFFFF:04X}"
        props = {TAGS: f"Tag{'ABCD'[i % 4]}", KEYS: f"order-{100000 + i}", UNIQ_KEY: uniq}
        out.append(
            MessageToStore(
                topic=TOPIC,
                queue_id=i % queues,
                body=os.urandom(body_size),
                properties=props,
                # The broker passes the properties string as the producer sent it.
                properties_text=encode_properties(props),
                born_timestamp=born + i,
                born_host=("10.0.0.7", 52000 + i % 8),
            )
        )
    return out


@contextlib.contextmanager
def scratch(base: Path) -> Iterator[Path]:
    """A fresh directory under ``base``, removed afterwards whatever happens."""
    path = Path(tempfile.mkdtemp(prefix="store-", dir=base))
    try:
        yield path
    finally:
        remove_store(path)


def config(data_dir: Path, segment_mb: int, mode: FlushMode = FlushMode.ASYNC) -> StoreConfig:
    return StoreConfig(data_dir, segment_size=segment_mb * MIB, flush_mode=mode)


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def fmt_s(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def per_item(counts: list[int], items: list[int], what: str) -> list[int]:
    """``counts`` matched to ``items`` (a single count applies to all)."""
    if len(counts) == 1:
        return counts * len(items)
    if len(counts) != len(items):
        raise SystemExit(f"{what}: give one count or one per item ({len(items)})")
    return counts


def drop_page_cache() -> bool:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``; False when not permitted here."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def crash(store: MessageStore) -> None:
    """Abandon an open store as ``kill -9`` would: bytes handed to the OS survive, the
    in-memory ones (consume-queue tails) are lost, no clean checkpoint, the abort file stays."""
    store.log.write_out()
    for cq in store._queues.values():
        cq._close_fds()  # no write-out: the process died
    store._release()


# ------------------------------------------------------------------ async puts
@dataclass(frozen=True, slots=True)
class AsyncRun:
    body: int
    puts: int
    bytes: int
    loop_s: float
    flush_s: float
    checkpoint_s: float

    @property
    def seconds(self) -> float:
        return self.loop_s + self.flush_s

    @property
    def puts_per_s(self) -> float:
        return self.puts / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    @property
    def loop_mb_per_s(self) -> float:
        return self.bytes / self.loop_s / 1e6

    @property
    def with_checkpoint_mb_per_s(self) -> float:
        return self.bytes / (self.seconds + self.checkpoint_s) / 1e6


def async_run(
    base: Path,
    segment_mb: int,
    msgs: list[MessageToStore],
    n: int,
    seconds: float,
    profiler: cProfile.Profile | None = None,
) -> AsyncRun:
    """``n`` puts (or as many as fit in ``seconds``) and the final flush, timed."""
    mask = len(msgs) - 1
    with scratch(base) as data_dir:
        store = MessageStore.open(config(data_dir, segment_mb))
        try:
            put = store.put_nowait
            done = total = 0
            if profiler is not None:
                profiler.enable()
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while done < n and time.perf_counter() < deadline:
                stop = min(n, done + BATCH)
                for i in range(done, stop):
                    total += put(msgs[i & mask]).size
                done = stop
            t1 = time.perf_counter()
            store.flush()
            t2 = time.perf_counter()
            if profiler is not None:
                profiler.disable()
            # Not in the figure, shown beside it: the work a put defers to the next checkpoint
            # (consume-queue write-out, key-index rows into SQLite), which a broker does once
            # a second with the fsyncs and SQLite's C code in a worker thread.
            store.checkpoint()
            t3 = time.perf_counter()
            stats = store.statistics()
            if stats.puts != done or stats.put_errors:
                raise RuntimeError(f"{done} puts tried, {stats.puts} stored")
        finally:
            store.close()
    return AsyncRun(len(msgs[0].body), done, total, t1 - t0, t2 - t1, t3 - t2)


def print_profile(profiler: cProfile.Profile, run: AsyncRun, top: int = 15) -> None:
    profile = pstats.Stats(profiler).get_stats_profile()
    funcs = sorted(profile.func_profiles.items(), key=lambda kv: kv[1].tottime, reverse=True)
    print(
        f"\nprofile: one async run, {run.body} B bodies, {run.puts:,} puts + flush under "
        f"cProfile ({profile.total_tt:.2f} s profiled, {run.puts_per_s:,.0f} puts/s with the "
        "profiler's overhead); top functions by own time:"
    )
    print(f"{'tottime s':>10} {'%':>6} {'cumtime s':>10} {'calls':>12}  function")
    for name, fp in funcs[:top]:
        where = fp.file_name
        with contextlib.suppress(ValueError):
            where = str(Path(where).relative_to(ROOT))
        label = f"{name} ({where}:{fp.line_number})" if fp.line_number else name
        share = 100 * fp.tottime / profile.total_tt if profile.total_tt else 0.0
        print(f"{fp.tottime:10.3f} {share:6.1f} {fp.cumtime:10.3f} {fp.ncalls:>12}  {label}")


# ------------------------------------------------------------------ peer
def peer_append(append_mb: int) -> dict[str, Row]:
    """Run the peer-bench ``append`` workload once now; its rows by workload name."""
    rows = physical_limits("append", "--append-mb", str(append_mb))
    return {str(r["workload"]): r for r in rows}


# ------------------------------------------------------------------ sync group commit
@dataclass(frozen=True, slots=True)
class SyncRun:
    writers: int
    puts: int
    errors: int
    seconds: float
    fsyncs: int
    checkpoints: int
    p50_ms: float
    p99_ms: float

    @property
    def puts_per_s(self) -> float:
        return self.puts / self.seconds

    @property
    def per_fsync(self) -> float:
        return self.puts / self.fsyncs if self.fsyncs else math.nan


async def _sync_run(
    store: MessageStore, writers: int, n: int, seconds: float, msgs: list[MessageToStore]
) -> SyncRun:
    mask = len(msgs) - 1
    claimed = errors = 0
    latencies: list[int] = []
    async with trio.open_nursery() as service:
        storage: Storage = await service.start(serve_storage, store)
        deadline = time.perf_counter() + seconds

        async def writer() -> None:
            nonlocal claimed, errors
            while claimed < n and time.perf_counter() < deadline:
                i = claimed
                claimed += 1
                t = time.perf_counter_ns()
                result = await storage.put(msgs[i & mask])
                latencies.append(time.perf_counter_ns() - t)
                errors += not result.ok

        t0 = time.perf_counter()
        with trio.fail_after(seconds + 60):  # a put never answered must not hang the run
            async with trio.open_nursery() as nursery:
                for _ in range(writers):
                    nursery.start_soon(writer)
        elapsed = time.perf_counter() - t0
        fsyncs = storage.statistics().fsyncs
        checkpoints = store.statistics().checkpoints
        service.cancel_scope.cancel()  # serve_storage flushes and closes the store
    lat_ms = sorted(x / 1e6 for x in latencies)
    return SyncRun(
        writers,
        len(latencies) - errors,
        errors,
        elapsed,
        fsyncs,
        checkpoints,
        percentile(lat_ms, 50),
        percentile(lat_ms, 99),
    )


def sync_run(
    base: Path, segment_mb: int, writers: int, n: int, seconds: float, msgs: list[MessageToStore]
) -> SyncRun:
    with scratch(base) as data_dir:
        store = MessageStore.open(config(data_dir, segment_mb, FlushMode.SYNC))
        try:
            return trio.run(_sync_run, store, writers, n, seconds, msgs)
        finally:
            store.close()  # already closed by serve_storage unless it failed to start


# ------------------------------------------------------------------ restart and recovery
@dataclass(frozen=True, slots=True)
class Timing:
    store: str
    log_mb: float
    records: int
    variant: str
    cache: str
    seconds: list[float]
    recovered: int
    stop_reason: str


def fill(store: MessageStore, msgs: list[MessageToStore], until: int, deadline: float) -> None:
    """Put messages until the log reaches ``until`` bytes (bounded by ``deadline``),
    checkpointing every ``CHECKPOINT_EVERY`` bytes as a running broker would."""
    mask = len(msgs) - 1
    i = store.statistics().puts
    next_checkpoint = store.log.end + CHECKPOINT_EVERY
    while store.log.end < until and time.perf_counter() < deadline:
        if store.log.end >= next_checkpoint:
            store.checkpoint()
            next_checkpoint = store.log.end + CHECKPOINT_EVERY
        approx = max(1, store.log.end // max(1, store.statistics().puts)) if i else 1024
        for _ in range(min(1024, (until - store.log.end) // approx + 1)):
            store.put_nowait(msgs[i & mask])
            i += 1


def build_crashed(
    cfg: StoreConfig, msgs: list[MessageToStore], size: int, limit_s: float
) -> tuple[int, int]:
    """A store of ``size`` log bytes left as after ``kill -9``, its last checkpoint taken
    before the last ~1 % of the writes. Returns the record count and the log's bytes."""
    deadline = time.perf_counter() + limit_s
    store = MessageStore.open(cfg)
    try:
        fill(store, msgs, int(size * 0.99), deadline)
        store.checkpoint()
        fill(store, msgs, size, deadline)
        if store.log.end < size:
            raise RuntimeError(f"building the store took more than {limit_s:.0f} s")
    except BaseException:
        store.close()
        raise
    records, log_bytes = store.statistics().puts, store.log.end - store.log.min_offset
    crash(store)
    return records, log_bytes


def restart_bench(
    base: Path,
    segment_mb: int,
    label: str,
    size: int,
    repeats: int,
    cold: bool,
    msgs: list[MessageToStore],
) -> list[Timing]:
    """Crash recovery with and without a checkpoint, then clean restarts, of one store."""
    caches = (["cold"] if cold else []) + ["warm"]
    out: list[Timing] = []
    with scratch(base) as data_dir:
        cfg = config(data_dir, segment_mb)
        t = time.perf_counter()
        records, log_bytes = build_crashed(cfg, msgs, size, limit_s=1800)
        print(
            f"  built {label}: {records:,} records in {time.perf_counter() - t:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        log_mb = log_bytes / 1e6

        def timed_open(variant: str, cache: str, last: bool) -> Timing:
            seconds: list[float] = []
            recovered, reason = 0, ""
            for k in range(repeats):
                if cache == "cold":
                    drop_page_cache()
                t0 = time.perf_counter()
                store = MessageStore.open(cfg)
                if variant == "clean restart":
                    store.close()
                seconds.append(time.perf_counter() - t0)
                stats = store.statistics()
                recovered, reason = stats.recovered_records, stats.recovery_stop_reason
                if store.log.end - store.log.min_offset != log_bytes:
                    raise RuntimeError(f"{label}: recovery ended the log at {store.log.end}")
                if variant != "clean restart":
                    if last and k == repeats - 1:
                        store.close()
                    else:
                        crash(store)
            return Timing(label, log_mb, records, variant, cache, seconds, recovered, reason)

        for cache in caches:
            out.append(timed_open("crash, checkpoint at 99 %", cache, last=False))
        (data_dir / "checkpoint").unlink()
        for cache in caches:
            out.append(timed_open("crash, no checkpoint", cache, last=cache == "warm"))
        for cache in caches:
            out.append(timed_open("clean restart", cache, last=False))
    return out


# ------------------------------------------------------------------ report
def print_async(
    results: dict[int, list[AsyncRun]], peer: dict[str, list[Row]], append_mb: list[int]
) -> None:
    ref = [float(r["MB_per_s"]) for r in peer.get(PEER_REFERENCE, [])]
    ref_med = med(ref)
    print("\nasync puts (put_nowait loop + final flush; MB/s of stored record bytes)")
    print(
        f"{'body B':>7} {'record B':>9} {'puts':>8} {'puts/s med':>11} {'MB/s med':>9} "
        f"{'MB/s min':>9} {'MB/s max':>9} {'loop MB/s':>10} {'flush s':>8} {'vs peer':>8} "
        f"{'ckpt s':>7} {'MB/s+ckpt':>10}"
    )
    for body, runs in results.items():
        mbs = [r.mb_per_s for r in runs]
        ratio = med(mbs) / ref_med if ref else math.nan
        print(
            f"{body:7} {runs[0].bytes / runs[0].puts:9.0f} {runs[0].puts:8,} "
            f"{med([r.puts_per_s for r in runs]):11,.0f} {med(mbs):9.1f} {min(mbs):9.1f} "
            f"{max(mbs):9.1f} {med([r.loop_mb_per_s for r in runs]):10.1f} "
            f"{med([r.flush_s for r in runs]):8.3f} "
            f"{'-' if math.isnan(ratio) else f'{ratio:.2f}x':>8} "
            f"{med([r.checkpoint_s for r in runs]):7.3f} "
            f"{med([r.with_checkpoint_mb_per_s for r in runs]):10.1f}"
        )
    print(
        "(loop MB/s: without the final flush; ckpt s: the checkpoint taken after the timed part,"
        " not counted; MB/s+ckpt: counting it)"
    )
    if not ref:
        print("(no peer figures: --no-peer or physical_limits.py missing)")
        return
    print(
        f"\npeer physical_limits.py --workloads append (same session, interleaved, "
        f"--append-mb {','.join(map(str, append_mb))})"
    )
    print(f"{'workload':26} {'MB/s med':>9} {'MB/s min':>9} {'MB/s max':>9} {'writes/s med':>13}")
    for name, rows in peer.items():
        mbs = [float(r["MB_per_s"]) for r in rows]
        wps = med([float(r["writes_per_s"]) for r in rows])
        print(f"{name:26} {med(mbs):9.1f} {min(mbs):9.1f} {max(mbs):9.1f} {wps:13,.0f}")
    for body, runs in results.items():
        if body == 1024:
            ratio = med([r.mb_per_s for r in runs]) / ref_med
            verdict = "met" if ratio >= ASYNC_AIM else "NOT met"
            print(
                f"1 KiB async vs {PEER_REFERENCE}: {ratio:.0%} of raw MB/s "
                f"(aim >= {ASYNC_AIM:.0%}: {verdict})"
            )


def print_sync(results: dict[int, list[SyncRun]]) -> None:
    print("\nsync mode (serve_storage, FlushMode.SYNC, 1 KiB bodies, each put awaits its fsync)")
    print(
        f"{'writers':>7} {'puts':>7} {'puts/s med':>11} {'min':>9} {'max':>9} {'fsyncs':>7} "
        f"{'msgs/fsync':>10} {'p50 ms':>7} {'p99 ms':>7} {'ckpts':>6} {'errors':>6}"
    )
    for writers, runs in results.items():
        rates = [r.puts_per_s for r in runs]
        mid = sorted(runs, key=lambda r: r.puts_per_s)[len(runs) // 2]
        print(
            f"{writers:7} {mid.puts:7,} {med(rates):11,.0f} {min(rates):9,.0f} "
            f"{max(rates):9,.0f} {mid.fsyncs:7,} {mid.per_fsync:10.1f} {mid.p50_ms:7.2f} "
            f"{mid.p99_ms:7.2f} {mid.checkpoints:6} {sum(r.errors for r in runs):6}"
        )
    print("(fsyncs, msgs/fsync, latency, checkpoints: of the median run)")
    counts = sorted(results)
    if len(counts) > 1 and counts[0] == 1:
        one = med([r.puts_per_s for r in results[1]])
        top = counts[-1]
        ratio = med([r.puts_per_s for r in results[top]]) / one
        verdict = "met" if ratio >= SYNC_AIM else "NOT met"
        print(f"{top} writers / 1 writer: {ratio:.1f}x (aim >= {SYNC_AIM:.0f}x: {verdict})")


def print_restart(timings: list[Timing], cold_note: str) -> None:
    print(f"\nrestart and recovery (median of repeats; page cache: {cold_note})")
    print(
        f"{'store':6} {'log MB':>8} {'records':>10} {'variant':26} {'cache':5} "
        f"{'recovered':>10} {'median s':>9} {'min s':>8} {'max s':>8}  stop reason"
    )
    for t in timings:
        reason = t.stop_reason if t.variant != "clean restart" else "-"
        print(
            f"{t.store:6} {t.log_mb:8.1f} {t.records:10,} {t.variant:26} {t.cache:5} "
            f"{t.recovered:10,} {fmt_s(med(t.seconds)):>9} {fmt_s(min(t.seconds)):>8} "
            f"{fmt_s(max(t.seconds)):>8}  {reason}"
        )
    clean = {(t.store, t.cache): med(t.seconds) for t in timings if t.variant == "clean restart"}
    for cache in ("cold", "warm"):
        small, big = clean.get(("small", cache)), clean.get(("big", cache))
        if small and big:
            print(f"clean restart {cache}: big / small = {big / small:.2f}x")


# ------------------------------------------------------------------ main
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=None, help="repetitions (default 5; quick 1)")
    ap.add_argument("--sizes", default="128,1024", help="async body sizes in bytes")
    ap.add_argument(
        "--n", default=None, help="async puts per run, one per size (default 300000,200000)"
    )
    ap.add_argument("--seconds", type=float, default=60.0, help="time limit of one run")
    ap.add_argument("--queues", type=int, default=8, help="queues of the topic written")
    ap.add_argument("--segment-mb", type=int, default=256, help="commit-log segment size")
    ap.add_argument("--sync-writers", default="1,16,64", help="concurrent sync writers")
    ap.add_argument(
        "--sync-n", default=None, help="sync puts per run, one per writer count (3000,16000,32000)"
    )
    ap.add_argument("--small-mb", type=int, default=10, help="log size of the small store")
    ap.add_argument("--big-mb", type=int, default=None, help="big store MiB (1024; quick 100)")
    ap.add_argument("--restart-repeats", type=int, default=None, help="timed opens (3)")
    ap.add_argument("--stall-mb", type=int, default=400, help="MiB put by the stall workload")
    ap.add_argument("--workloads", default="async,sync,restart", help="subset to run (or stall)")
    ap.add_argument("--profile", action="store_true", help="profile one async 1 KiB run")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer append runs")
    ap.add_argument("--no-drop-caches", action="store_true", help="warm page cache only")
    ap.add_argument("--dir", default=str(ROOT / ".bench-store"), help="scratch directory")
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    ap.add_argument("--out", default=None, help="append JSON lines here")
    args = ap.parse_args()
    quick = args.quick
    args.runs = args.runs or (1 if quick else 5)
    args.n = args.n or ("20000,10000" if quick else "300000,200000")
    args.sync_n = args.sync_n or ("300,1600,3200" if quick else "3000,16000,32000")
    args.big_mb = args.big_mb or (100 if quick else 1024)
    args.restart_repeats = args.restart_repeats or (1 if quick else 3)
    return args


def main() -> None:
    args = parse_args()
    workloads = set(args.workloads.split(","))
    sizes = int_list(args.sizes)
    counts = per_item(int_list(args.n), sizes, "--n")
    writer_counts = int_list(args.sync_writers)
    sync_counts = per_item(int_list(args.sync_n), writer_counts, "--sync-n")
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    need = (
        (args.big_mb if "restart" in workloads else 0) * MIB
        + (args.stall_mb if "stall" in workloads else 0) * MIB
        + 2 * args.segment_mb * MIB
        + (0 if args.no_peer else 300 * MIB)
    )
    free = shutil.disk_usage(base).free
    if free < need:
        raise SystemExit(f"{base}: {free / MIB:,.0f} MiB free, this run needs {need / MIB:,.0f}")
    session = time.time()
    rows: list[Row] = []
    common: Row = {"bench": "store", "session": session, "python": sys.version.split()[0]}
    print(
        f"store benchmark: python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"loadavg {os.getloadavg()[0]:.2f}, scratch {base} ({free / 2**30:.0f} GiB free), "
        f"segments {args.segment_mb} MiB",
        file=sys.stderr,
    )
    try:
        if "async" in workloads:
            run_async(args, base, sizes, counts, rows)
        if "sync" in workloads:
            run_sync(args, base, writer_counts, sync_counts, rows)
        if "restart" in workloads:
            run_restart(args, base, rows)
        if "stall" in workloads:
            run_stall(args, base, rows)
    finally:
        with contextlib.suppress(OSError):
            base.rmdir()  # only when empty: never remove what someone else put there
    print(f"\nloadavg at the end: {os.getloadavg()[0]:.2f}")
    if args.out:
        with open(args.out, "a") as f:
            for row in rows:
                f.write(json.dumps({**common, **row}) + "\n")


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_async(
    args: argparse.Namespace, base: Path, sizes: list[int], counts: list[int], rows: list[Row]
) -> None:
    pools = {size: messages(size, args.queues) for size in sizes}
    results: dict[int, list[AsyncRun]] = {size: [] for size in sizes}
    peer: dict[str, list[Row]] = {}
    append_mb: list[int] = []
    for run in range(args.runs):
        for size, n in zip(sizes, counts, strict=True):
            results[size].append(async_run(base, args.segment_mb, pools[size], n, args.seconds))
        if not args.no_peer:
            ref = results.get(1024) or results[sizes[-1]]
            mb = max(1, round(ref[-1].bytes / MIB))
            append_mb.append(mb)
            for name, row in peer_append(mb).items():
                peer.setdefault(name, []).append(row)
        progress(f"async run {run + 1}/{args.runs} done")
    print_async(results, peer, append_mb)
    for size, runs in results.items():
        rows.append(
            {
                "workload": "async_put",
                "body": size,
                "runs": [
                    {
                        **asdict(r),
                        "MB_per_s": r.mb_per_s,
                        "MB_per_s_with_checkpoint": r.with_checkpoint_mb_per_s,
                    }
                    for r in runs
                ],
                "puts_per_s_median": med([r.puts_per_s for r in runs]),
                "MB_per_s_median": med([r.mb_per_s for r in runs]),
            }
        )
    if peer:
        rows.append({"workload": "peer_append", "append_mb": append_mb, "runs": peer})
    if args.profile:
        size = 1024 if 1024 in pools else sizes[-1]
        profiler = cProfile.Profile()
        n = counts[sizes.index(size)]
        profiled = async_run(base, args.segment_mb, pools[size], n, args.seconds, profiler)
        print_profile(profiler, profiled)


def run_sync(
    args: argparse.Namespace,
    base: Path,
    writer_counts: list[int],
    sync_counts: list[int],
    rows: list[Row],
) -> None:
    msgs = messages(1024, args.queues)
    results: dict[int, list[SyncRun]] = {w: [] for w in writer_counts}
    for run in range(args.runs):
        for writers, n in zip(writer_counts, sync_counts, strict=True):
            results[writers].append(sync_run(base, args.segment_mb, writers, n, args.seconds, msgs))
        progress(f"sync run {run + 1}/{args.runs} done")
    print_sync(results)
    for writers, runs in results.items():
        rows.append(
            {
                "workload": "sync_put",
                "body": 1024,
                "writers": writers,
                "runs": [
                    {**asdict(r), "puts_per_s": r.puts_per_s, "per_fsync": r.per_fsync}
                    for r in runs
                ],
                "puts_per_s_median": med([r.puts_per_s for r in runs]),
            }
        )


WRITE_OUT_EVERY = 256
STALL_MS = 5.0


def stall_run(base: Path, segment_mb: int, msgs: list[MessageToStore], total: int) -> list[float]:
    """Every put's own time in ms while ``total`` bytes are put, written out every 256 puts."""
    mask = len(msgs) - 1
    times: list[float] = []
    clock = time.perf_counter_ns
    with scratch(base) as data_dir:
        store = MessageStore.open(config(data_dir, segment_mb))
        gc.disable()
        try:
            put, stored, i = store.put_nowait, 0, 0
            while stored < total:  # bounded: every put adds at least one record
                t0 = clock()
                stored += put(msgs[i & mask]).size
                times.append((clock() - t0) / 1e6)
                i += 1
                if i % WRITE_OUT_EVERY == 0:
                    store.log.write_out()
        finally:
            gc.enable()
            store.close()
    return times


def run_stall(args: argparse.Namespace, base: Path, rows: list[Row]) -> None:
    msgs = messages(1024, args.queues)
    print(f"\nstall: {args.stall_mb} MiB of 1 KiB puts, written out every {WRITE_OUT_EVERY}")
    print(f"{'run':>4} {'puts':>9} {'max ms':>8} {'p99.99 ms':>10} {'> 5 ms':>7}")
    for run in range(args.runs):
        times = stall_run(base, args.segment_mb, msgs, args.stall_mb * MIB)
        ordered = sorted(times)
        slow = sum(1 for t in times if t > STALL_MS)
        p9999 = percentile(ordered, 99.99)
        print(f"{run:>4} {len(times):>9} {ordered[-1]:>8.2f} {p9999:>10.3f} {slow:>7}")
        rows.append(
            {"workload": "stall", "body": 1024, "mb": args.stall_mb, "puts": len(times),
             "max_ms": ordered[-1], "p9999_ms": p9999, "over_5ms": slow}
        )  # fmt: skip


def run_restart(args: argparse.Namespace, base: Path, rows: list[Row]) -> None:
    cold = not args.no_drop_caches and drop_page_cache()
    if cold:
        note = "dropped (sync; echo 3 > drop_caches) before every cold open"
    elif args.no_drop_caches:
        note = "not dropped (--no-drop-caches): warm figures only"
    else:
        note = "could not drop it (no permission): warm figures only"
    msgs = messages(1024, args.queues)
    timings: list[Timing] = []
    for label, mb in (("small", args.small_mb), ("big", args.big_mb)):
        progress(f"restart: building the {label} store ({mb} MiB)")
        timings += restart_bench(
            base, args.segment_mb, label, mb * MIB, args.restart_repeats, cold, msgs
        )
    print_restart(timings, note)
    for t in timings:
        rows.append({"workload": "restart", "page_cache_dropped": cold, **asdict(t)})


if __name__ == "__main__":
    main()
