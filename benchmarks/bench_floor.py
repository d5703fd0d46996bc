"""The request path against what trio itself can do, and against Redis (issue "The request path:
close to what trio itself can do"), measured with one raw client for every server.

Three servers, in the same run, rounds interleaved so they see the same noise:

* **trimq** (``python -m broker`` on 127.0.0.1, a fresh data dir, ``--flush async``, or
  ``sync`` with ``--flush sync``: every SEND_OK after its fsync, group-committed);
* **the floor**: a trio server in its own process that reads length-prefixed frames and
  answers each with one fixed reply frame the size of trimq's SEND_MESSAGE_V2 answer,
  everything a burst brought in one ``send_all`` — the most any Remoting server on trio can
  do (:func:`serve_floor`);
* **redis-server** (no persistence; with ``--flush sync`` an append-only file with
  ``appendfsync always``, Redis's fsync-before-reply), what a Python team would pick instead
  (installed from Debian if missing, started and stopped here).

The client is this process: blocking stdlib sockets (TCP_NODELAY), every request frame
encoded before the clock starts, replies read by their length fields (a Remoting frame's
4-byte length; RESP's bulk and array headers), so it costs little next to the servers.
Workloads, at each ``--sizes`` body size:

* ``one``: SEND_MESSAGE_V2 / XADD, one in flight;
* ``window``: ``--window`` (100) requests written at once, then their replies read;
* ``pull``: a backlog of ``--backlog`` messages in one queue / one stream read back 32 at a
  time: PULL_MESSAGE (the client walks the records' sizes only) / XRANGE COUNT 32 (the client
  walks the RESP structure only). No floor for it (a floor would answer with nothing to read).

Each figure is the median of ``--runs`` rounds; the server's CPU per message comes from
``/proc/<pid>/stat``. Every loop is bounded by a count and by ``--max-seconds``; every server
binds to loopback and is stopped by pid.

Usage: python -m benchmarks.bench_floor [--runs 3] [--sizes 128,1024] [--count 5000]
    [--window 100] [--flush async|sync] [--broker-root OTHER_CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_broker import broker_process, proc_cpu_seconds, pull_cmd, send_ext
from benchmarks.peers import apt_install, redis_daemon
from protocol.codes import ResponseCode
from protocol.command import request
from protocol.frame import encode_command
from protocol.headers.send import SendMessageResponseHeader

_LEN = struct.Struct(">I")
TOPIC = "bench_floor"
STREAM = b"bench_floor"
BATCH = 32


# ---------------------------------------------------------------- the floor server
def floor_reply() -> bytes:
    """A reply frame the size of trimq's answer to a SEND_MESSAGE_V2 (JSON header with
    msgId, queueId, queueOffset, transactionId …)."""
    header = SendMessageResponseHeader(
        msg_id="7F00000100002A9F0000000000ABCDEF", queue_id=3, queue_offset=123456
    )
    sent = request(310, 1234567, {})
    return encode_command(sent.response(ResponseCode.SUCCESS, ext_fields=header.to_ext()))


async def _floor_connection(reply: bytes, stream: trio.SocketStream) -> None:
    buf = bytearray()
    try:
        while True:  # ends with the connection
            data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
            frames, pos = 0, 0
            while len(buf) - pos >= 4:
                (length,) = _LEN.unpack_from(buf, pos)
                if len(buf) - pos < 4 + length:
                    break
                pos += 4 + length
                frames += 1
            del buf[:pos]
            if frames:
                await stream.send_all(reply * frames)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


def serve_floor(port_out: Any) -> None:
    """The floor server's process: serve on a free loopback port (sent through
    ``port_out``) until SIGTERM."""

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port_out.send(listeners[0].socket.getsockname()[1])
        reply = floor_reply()

        async def handler(stream: trio.SocketStream) -> None:
            await _floor_connection(reply, stream)

        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, handler, listeners)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

    trio.run(main)


@contextmanager
def spawned_server(target: Callable[..., None], *args: Any) -> Iterator[tuple[int, Any]]:
    """Run ``target(pipe, *args)`` in a spawned process, which sends what it serves on (its
    port or ports) through ``pipe`` once listening; yields (pid, that); SIGTERM by pid at
    the end."""
    ctx = mp.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(send, *args), daemon=True)
    proc.start()
    try:
        if not receive.poll(30):
            raise RuntimeError(f"{target.__name__} did not start within 30 s")
        served = receive.recv()
        assert proc.pid is not None
        yield proc.pid, served
    finally:
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGTERM)
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


@contextmanager
def floor_process() -> Iterator[tuple[int, int]]:
    """Run the floor server; yields (pid, port); SIGTERM by pid at the end."""
    with spawned_server(serve_floor) as (pid, port):
        yield pid, int(port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def redis_process(*, fsync: bool = False) -> Iterator[tuple[int, int]]:
    """redis-server on a free loopback port (``fsync``: AOF fsynced per write); yields
    (pid, port)."""
    if shutil.which("redis-server") is None:
        apt_install("redis-server", "redis-tools")
    port = free_port()
    with redis_daemon(port, prefix="floor-redis-", fsync=fsync) as pid:
        yield pid, port


# ---------------------------------------------------------------- the raw client
class RawClient:
    """A blocking socket with a receive buffer; reads replies by their length fields."""

    def __init__(self, port: int, deadline: float) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.deadline = deadline

    def close(self) -> None:
        self.sock.close()

    def _more(self) -> None:
        if time.monotonic() > self.deadline:
            raise TimeoutError("benchmark ran past --max-seconds")
        data = self.sock.recv(262144)
        if not data:
            raise ConnectionError("server closed the connection")
        self.buf += data

    def remoting_frames(self, n: int) -> list[bytes]:
        """Read ``n`` Remoting frames (length-prefixed); returns them."""
        out: list[bytes] = []
        while len(out) < n:  # bounded by the deadline in _more
            pos = 0
            while len(out) < n and len(self.buf) - pos >= 4:
                (length,) = _LEN.unpack_from(self.buf, pos)
                if len(self.buf) - pos < 4 + length:
                    break
                out.append(bytes(self.buf[pos : pos + 4 + length]))
                pos += 4 + length
            del self.buf[:pos]
            if len(out) < n:
                self._more()
        return out

    def resp_replies(self, n: int) -> int:
        """Read ``n`` RESP replies, walking their structure only; returns how many leaf
        elements (bulk strings) they held."""
        leaves = 0
        for _ in range(n):
            while True:  # bounded by the deadline in _more
                end = _resp_end(self.buf, 0)
                if end is not None:
                    leaves += end[1]
                    del self.buf[: end[0]]
                    break
                self._more()
        return leaves


def _resp_end(buf: bytearray, pos: int) -> tuple[int, int] | None:
    """(end position, bulk strings inside) of the RESP value at ``pos``; None if incomplete."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return None
    kind, value = buf[pos], buf[pos + 1 : eol]
    if kind == ord("$"):
        size = int(value)
        end = eol + 2 + max(size, 0) + (2 if size >= 0 else 0)
        return (end, 1) if len(buf) >= end else None
    if kind == ord("*"):
        count, at, leaves = int(value), eol + 2, 0
        for _ in range(max(count, 0)):
            inner = _resp_end(buf, at)
            if inner is None:
                return None
            at, leaves = inner[0], leaves + inner[1]
        return at, leaves
    if kind == ord("-"):
        raise RuntimeError(f"redis error: {bytes(value)!r}")
    return eol + 2, 0  # +simple string, :integer


def resp(*args: bytes) -> bytes:
    """One RESP command."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


# ---------------------------------------------------------------- workloads
@dataclass(frozen=True)
class Target:
    name: str
    pid: int
    port: int


def body(size: int) -> bytes:
    return b"x" * size


def send_frames(size: int, n: int) -> list[bytes]:
    """``n`` SEND_MESSAGE_V2 frames with distinct opaques (a window's)."""
    ext = send_ext(TOPIC, 0)
    return [encode_command(request(310, i + 1, ext, body(size))) for i in range(n)]


def _check_remoting(frames: list[bytes]) -> None:
    # The code is the header's first field; a full decode here would cost the client more
    # than the check is worth on every reply: look at one in a hundred.
    for frame in frames[::100]:
        if b'"code":0' not in frame[:200]:
            raise RuntimeError(f"a request failed: {frame[:200]!r}")


def one_in_flight(t: Target, size: int, count: int, deadline: float) -> float:
    """Requests/s with one in flight."""
    client = RawClient(t.port, deadline)
    try:
        if t.name == "redis":
            frame = resp(b"XADD", STREAM, b"*", b"d", body(size))
            start = time.perf_counter()
            for _ in range(count):
                client.sock.sendall(frame)
                client.resp_replies(1)
        else:
            (frame,) = send_frames(size, 1)
            start = time.perf_counter()
            replies: list[bytes] = []
            for _ in range(count):
                client.sock.sendall(frame)
                replies += client.remoting_frames(1)
            _check_remoting(replies)
        return count / (time.perf_counter() - start)
    finally:
        client.close()


def windowed(t: Target, size: int, count: int, window: int, deadline: float) -> float:
    """Requests/s with ``window`` written at once, then their replies read."""
    client = RawClient(t.port, deadline)
    rounds = max(1, count // window)
    try:
        if t.name == "redis":
            data = resp(b"XADD", STREAM, b"*", b"d", body(size)) * window
            start = time.perf_counter()
            for _ in range(rounds):
                client.sock.sendall(data)
                client.resp_replies(window)
        else:
            data = b"".join(send_frames(size, window))
            start = time.perf_counter()
            for _ in range(rounds):
                client.sock.sendall(data)
                _check_remoting(client.remoting_frames(window))
        return rounds * window / (time.perf_counter() - start)
    finally:
        client.close()


def fill(t: Target, size: int, backlog: int, deadline: float) -> None:
    """Put ``backlog`` messages into queue 0 of :data:`TOPIC` / the stream with ids 1-1 …"""
    client = RawClient(t.port, deadline)
    try:
        if t.name == "redis":
            client.sock.sendall(resp(b"DEL", STREAM))
            client.resp_replies(1)
            for first in range(1, backlog + 1, 100):
                ids = range(first, min(first + 100, backlog + 1))
                client.sock.sendall(
                    b"".join(resp(b"XADD", STREAM, b"1-%d" % i, b"d", body(size)) for i in ids)
                )
                client.resp_replies(len(ids))
        else:
            # 64 at a time: a SYNC-mode broker refuses more waiting sends per connection
            frames = send_frames(size, 64)
            for first in range(0, backlog, 64):
                n = min(64, backlog - first)
                client.sock.sendall(b"".join(frames[:n]))
                _check_remoting(client.remoting_frames(n))
    finally:
        client.close()


def _records_in(frame: bytes) -> int:
    """Messages in a PULL reply: the body's records, walked by their 4-byte sizes."""
    header_len = _LEN.unpack_from(frame, 4)[0] & 0xFFFFFF
    pos, end, n = 8 + header_len, len(frame), 0
    while pos + 4 <= end:
        pos += _LEN.unpack_from(frame, pos)[0]
        n += 1
    return n


def pull(t: Target, backlog: int, deadline: float) -> float:
    """Messages/s reading the backlog back 32 at a time."""
    client = RawClient(t.port, deadline)
    got = 0
    try:
        if t.name == "redis":
            frames = [
                resp(b"XRANGE", STREAM, b"1-%d" % (k + 1), b"+", b"COUNT", b"%d" % BATCH)
                for k in range(0, backlog, BATCH)
            ]
            start = time.perf_counter()
            for frame in frames:
                client.sock.sendall(frame)
                got += client.resp_replies(1) // 3  # id, field, value per entry
        else:
            frames = [
                encode_command(pull_cmd(TOPIC, 0, k, count=BATCH)) for k in range(0, backlog, BATCH)
            ]
            start = time.perf_counter()
            for frame in frames:
                client.sock.sendall(frame)
                (reply,) = client.remoting_frames(1)
                got += _records_in(reply)
        elapsed = time.perf_counter() - start
    finally:
        client.close()
    if got != backlog:
        raise RuntimeError(f"{t.name}: pulled {got} of {backlog} messages")
    return got / elapsed


# ---------------------------------------------------------------- a run
def measure(t: Target, fn: Callable[[], float], count: int) -> dict[str, float]:
    cpu = proc_cpu_seconds(t.pid)
    rate = fn()
    used = proc_cpu_seconds(t.pid) - cpu
    return {"per_s": rate, "server_us": used / count * 1e6}


def run_round(targets: list[Target], size: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.max_seconds
    for t in targets:
        for workload in ("one", "window"):
            if workload == "one":
                count = args.count

                def fn(t: Target = t, count: int = count) -> float:
                    return one_in_flight(t, size, count, deadline)

            else:
                count = args.count * 4 // args.window * args.window

                def fn(t: Target = t, count: int = count) -> float:
                    return windowed(t, size, count, args.window, deadline)

            rows.append({"target": t.name, "size": size, "workload": workload,
                         **measure(t, fn, count)})  # fmt: skip
        if t.name != "floor":
            # Behind the sends above: the pulls read the backlog from offset 0 / id 1-1
            # (the sends went to trimq's queue 0 too, so the backlog is what they read first;
            # Redis's own ids start at 1-1, below the sends' time-based ones).
            fill(t, size, args.backlog, deadline)

            def fn_pull(t: Target = t) -> float:
                return pull(t, args.backlog, deadline)

            rows.append({"target": t.name, "size": size, "workload": "pull",
                         **measure(t, fn_pull, args.backlog)})  # fmt: skip
    return rows


def median_of(rows: list[dict[str, Any]], target: str, workload: str, size: int, key: str) -> float:
    """The median of ``key`` over the rows of one target, workload and size (nan: none)."""
    vals = [
        r[key]
        for r in rows
        if r["target"] == target and r["workload"] == workload and r["size"] == size
    ]
    return statistics.median(vals) if vals else float("nan")


def summarize(rows: list[dict[str, Any]]) -> str:
    """The table of medians: rates, ratios, server CPU per message."""
    lines = [
        "| workload | size | trimq /s | floor /s | redis /s | trimq / floor | trimq / redis "
        "| trimq µs/msg | floor µs/msg | redis µs/msg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    keys = sorted({(r["workload"], r["size"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for workload, size in keys:
        ours, floor, redis = (
            median_of(rows, n, workload, size, "per_s") for n in ("trimq", "floor", "redis")
        )
        cpu = [median_of(rows, n, workload, size, "server_us") for n in ("trimq", "floor", "redis")]
        lines.append(
            f"| {workload} | {size} | {ours:,.0f} | {floor:,.0f} | {redis:,.0f} "
            f"| {ours / floor:.2f} | {ours / redis:.2f} | {cpu[0]:.1f} | {cpu[1]:.1f} "
            f"| {cpu[2]:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="128,1024")
    parser.add_argument("--count", type=int, default=5000, help="requests one in flight")
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--backlog", type=int, default=32_000)
    parser.add_argument("--max-seconds", type=float, default=120.0, help="bound of one round")
    parser.add_argument("--out", help="JSON-lines file for every row")
    parser.add_argument(
        "--flush",
        choices=("async", "sync"),
        default="async",
        help="trimq's --flush; sync also gives Redis an AOF with appendfsync always",
    )
    parser.add_argument(
        "--broker-root", type=Path, help="run the broker of this checkout (a before/after)"
    )
    args = parser.parse_args()
    if args.backlog <= 0 or args.backlog % BATCH:
        parser.error(f"--backlog must be a positive multiple of {BATCH} (pulls read {BATCH})")
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict[str, Any]] = []
    for round_no in range(args.runs):
        for size in sizes:
            # Fresh servers per round and size: every pull reads from offset 0 / id 1-1.
            with ExitStack() as servers:
                trimq = broker_process(False, args.broker_root, "--flush", args.flush)
                b_pid, b_port = servers.enter_context(trimq)
                f_pid, f_port = servers.enter_context(floor_process())
                r_pid, r_port = servers.enter_context(redis_process(fsync=args.flush == "sync"))
                targets = [
                    Target("floor", f_pid, f_port),
                    Target("trimq", b_pid, b_port),
                    Target("redis", r_pid, r_port),
                ]
                got = run_round(targets, size, args)
            for row in got:
                row["round"] = round_no
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
            rows += got
    print()
    print(f"medians of {args.runs} rounds; loadavg at the end {os.getloadavg()}")
    print(summarize(rows))


if __name__ == "__main__":
    main()
