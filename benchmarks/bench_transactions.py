"""Transactional sends against plain sends, in the same run, and check-back punctuality.

The broker runs as a subprocess (``python -m broker`` on 127.0.0.1, any free port, its own
data dir under ``.bench-peers/``); a raw trio client in this process (frames built once, as
``benchmarks/bench_broker.py``) measures, interleaved round by round:

* ``plain``: SEND_MESSAGE_V2 awaited one at a time (the peer of the next one);
* ``transaction``: a half message (``TRAN_MSG=true``) then END_TRANSACTION commit, each
  awaited — what a transactional producer does per message, one transaction at a time;
* ``check_delay``: ``--checks`` half messages with a 1 s check immunity
  (``CHECK_IMMUNITY_TIME_IN_SECONDS``) sent at once, left undecided; one connection registered
  as a producer of the group receives the broker's CHECK_TRANSACTION_STATE requests. A
  check's delay is its arrival (wall clock) minus the half's store time (in the check's body)
  minus the immunity: how late the broker asks. Each half is then rolled back.

For each it prints msgs/s and the broker's CPU per message (``/proc/<pid>/stat``), and the
ratio transaction / plain of each round; medians over ``--runs`` rounds.

Usage: python -m benchmarks.bench_transactions [--runs 3] [--n 2000] [--checks 400]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import trio

from benchmarks.bench_broker import (
    Conn,
    ConnPool,
    broker_process,
    check,
    lat_summary_ms,
    make_payload,
    proc_cpu_seconds,
    send_ext,
    with_conns,
)
from protocol.bodies.heartbeat import HeartbeatData, ProducerData
from protocol.codes import RequestCode
from protocol.command import RemotingCommand, request
from protocol.connection import NEED_DATA, Closed, Malformed, Request, Response
from protocol.headers.send import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.headers.transaction import (
    CheckTransactionStateRequestHeader,
    EndTransactionRequestHeader,
)
from protocol.message import decode_record
from protocol.msgid import decode_offset_msg_id
from protocol.properties import CHECK_IMMUNITY_TIME_IN_SECONDS, PGROUP, TRAN_MSG, encode_properties

PRODUCER_GROUP = "bench_txn_group"
COMMIT, ROLLBACK = 8, 12
IMMUNITY_S = 1


class CheckedConn(Conn):
    """A connection that also keeps the requests the broker sends (check-backs), with the
    wall-clock time each arrived."""

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self.requests: list[tuple[float, RemotingCommand]] = []
        self.arrived = trio.Event()

    def _take_replies(self) -> bool:
        while (event := self.protocol.next_event()) is not NEED_DATA:  # bounded by the bytes
            if type(event) is Response:
                self._replies[event.command.opaque] = event.command
                self._waiters[event.command.opaque].set()
            elif type(event) is Request:
                self.requests.append((time.time() * 1000, event.command))
                self.arrived.set()
                self.arrived = trio.Event()
            elif type(event) is Closed:
                return True
            elif type(event) is Malformed:
                raise event.error
        return False


def half_cmd(topic: str, size: int, *, immunity_s: int | None = None) -> RemotingCommand:
    props = {"WAIT": "true", TRAN_MSG: "true", PGROUP: PRODUCER_GROUP}
    if immunity_s is not None:
        props[CHECK_IMMUNITY_TIME_IN_SECONDS] = str(immunity_s)
    header = SendMessageRequestHeader(
        producer_group=PRODUCER_GROUP, topic=topic, default_topic="TBW102",
        default_topic_queue_nums=4, queue_id=0, sys_flag=0x4,  # TRANSACTION_PREPARED
        born_timestamp=int(time.time() * 1000), flag=0, properties=encode_properties(props),
    )  # fmt: skip
    return request(RequestCode.SEND_MESSAGE_V2, 0, header.to_v2_ext(), make_payload(size))


def end_cmd(
    reply: RemotingCommand, resolution: int, *, from_check: bool = False
) -> RemotingCommand:
    header = SendMessageResponseHeader.from_ext(reply.ext_fields)
    _, _, commit_offset = decode_offset_msg_id(header.msg_id)
    return end_of(header.queue_offset, commit_offset, header.msg_id, resolution, from_check)


def end_of(
    queue_offset: int, commit_offset: int, msg_id: str, resolution: int, from_check: bool
) -> RemotingCommand:
    header = EndTransactionRequestHeader(
        producer_group=PRODUCER_GROUP,
        tran_state_table_offset=queue_offset,
        commit_log_offset=commit_offset,
        commit_or_rollback=resolution,
        from_transaction_check=from_check,
        msg_id=msg_id,
    )
    return request(RequestCode.END_TRANSACTION, 0, header.to_ext())


@dataclass
class Params:
    port: int
    size: int
    n: int
    checks: int
    tag: str


async def plain(p: Params) -> dict[str, float]:
    async def run(pool: ConnPool) -> dict[str, float]:
        conn = await pool.open()
        cmd = request(RequestCode.SEND_MESSAGE_V2, 0, send_ext(f"TxPlain{p.tag}", 0),
                      make_payload(p.size))  # fmt: skip
        t0 = time.perf_counter()
        for _ in range(p.n):
            check(await conn.request(cmd), "send")
        return {"msgs_per_s": p.n / (time.perf_counter() - t0)}

    return await with_conns(p.port, run)


async def transaction(p: Params) -> dict[str, float]:
    async def run(pool: ConnPool) -> dict[str, float]:
        conn = await pool.open()
        half = half_cmd(f"TxCommit{p.tag}", p.size)
        t0 = time.perf_counter()
        for _ in range(p.n):
            reply = await conn.request(half)
            check(reply, "half")
            check(await conn.request(end_cmd(reply, COMMIT)), "commit")
        return {"msgs_per_s": p.n / (time.perf_counter() - t0)}

    return await with_conns(p.port, run)


async def check_delay(p: Params) -> dict[str, float]:
    async with trio.open_nursery() as nursery:
        stream = await trio.open_tcp_stream("127.0.0.1", p.port)
        conn = CheckedConn(stream)
        nursery.start_soon(conn.read_loop)
        beat = HeartbeatData(
            client_id=f"bench@{p.tag}", producer_data_set=(ProducerData(PRODUCER_GROUP),)
        )
        check(await conn.request(request(RequestCode.HEART_BEAT, 0, None, beat.to_json())), "beat")
        half = half_cmd(f"TxCheck{p.tag}", p.size, immunity_s=IMMUNITY_S)
        for _ in range(p.checks):
            check(await conn.request(half), "half")
        delays: list[int] = []
        with trio.fail_after(30 + IMMUNITY_S):
            while len(delays) < p.checks:
                while conn.requests:
                    arrived_ms, cmd = conn.requests.pop(0)
                    if cmd.code != RequestCode.CHECK_TRANSACTION_STATE:
                        continue
                    header = CheckTransactionStateRequestHeader.from_ext(cmd.ext_fields)
                    record, _ = decode_record(cmd.body)
                    late_ms = arrived_ms - (record.store_timestamp + IMMUNITY_S * 1000)
                    delays.append(int(late_ms * 1_000_000))
                    done = end_of(header.tran_state_table_offset, header.commit_log_offset,
                                  header.msg_id or "", ROLLBACK, True)  # fmt: skip
                    check(await conn.request(done), "rollback")
                if len(delays) < p.checks:
                    await conn.arrived.wait()
        await trio.aclose_forcefully(stream)
        nursery.cancel_scope.cancel()
    lat = lat_summary_ms(delays)
    return {
        "late_p50_ms": lat["p50_ms"],
        "late_p99_ms": lat["p99_ms"],
        "late_max_ms": lat["max_ms"],
    }


WORKLOADS = {"plain": plain, "transaction": transaction}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--n", type=int, default=2000, help="messages per throughput workload")
    ap.add_argument("--checks", type=int, default=400, help="halves in check_delay")
    args = ap.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"plain": [], "transaction": [], "check": []}
    with broker_process(verbose=True) as (pid, port):
        for run in range(args.runs):
            order = list(WORKLOADS) if run % 2 == 0 else list(reversed(WORKLOADS))
            for name in order:
                p = Params(port, args.size, args.n, args.checks, f"r{run}")
                c0 = proc_cpu_seconds(pid)
                res = trio.run(WORKLOADS[name], p)
                res["cpu_us"] = (proc_cpu_seconds(pid) - c0) * 1e6 / args.n
                rows[name].append(res)
                print(f"[{name}] run={run}: {_short(res)}", flush=True)
            res = trio.run(check_delay, Params(port, args.size, args.n, args.checks, f"r{run}"))
            rows["check"].append(res)
            print(f"[check_delay] run={run}: {_short(res)}", flush=True)
    ratios = [
        t["msgs_per_s"] / p["msgs_per_s"]
        for t, p in zip(rows["transaction"], rows["plain"], strict=True)
    ]
    print(f"\n{args.size} B bodies, medians of {args.runs} rounds (one in flight):")
    for name in WORKLOADS:
        med = {k: statistics.median(r[k] for r in rows[name]) for k in rows[name][0]}
        print(
            f"  {name:12s} {med['msgs_per_s']:9.0f} msgs/s  broker CPU {med['cpu_us']:6.0f} µs/msg"
        )
    print(f"  transaction / plain: {statistics.median(ratios):.2f} (rounds: "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    for key in ("late_p50_ms", "late_p99_ms", "late_max_ms"):
        vals = [r[key] for r in rows["check"]]
        print(f"  check-back {key}: {statistics.median(vals):.1f} (rounds: "
              f"{', '.join(f'{v:.1f}' for v in vals)})")  # fmt: skip


def _short(res: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in res.items()}


if __name__ == "__main__":
    main()
