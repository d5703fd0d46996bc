"""Protocol throughput: frames/s encoded and decoded, records/s, vs this machine's msgpack rate.

Workloads (each repeated ``--runs`` times; medians are reported):

* ``encode_json`` / ``encode_msgpack``: ``encode_command`` of a SEND_MESSAGE_V2 request with a
  128-byte body and the ext fields a real producer sends (one-letter names, properties with
  TAGS, KEYS, UNIQ_KEY, WAIT).
* ``decode_json`` / ``decode_msgpack``: a ``FrameDecoder`` fed 64 KiB chunks of a stream of
  such frames, as the server's read loop does; one command out per frame.
* ``decode_json+header``: the same plus the typed V2 send header (what a broker does per send).
* ``record_roundtrip``: ``encode_record`` + ``decode_record`` of a 128-byte-body message.

The peer figure is ``../shared/peer-bench/physical_limits.py --workloads msgpack`` run in the
same session (a msgpack pack+unpack of a small message-like dict): the ratio says how close
the protocol layer comes to the cheapest possible Python serialization on this machine.

Usage: python -m benchmarks.bench_protocol [--runs 5] [--n 100000] [--no-peer] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

from benchmarks.peer import physical_limits
from protocol.codes import RequestCode, SerializeType
from protocol.command import RemotingCommand, request
from protocol.frame import FrameDecoder, encode_command
from protocol.headers import SendMessageRequestHeader, send_header_from_v2_ext
from protocol.message import MessageExt, decode_record, encode_record
from protocol.properties import decode_properties

CHUNK = 65536
BODY = b"x" * 128
EXT_V2 = {
    "a": "bench_producer_group",
    "b": "BenchTopic",
    "c": "TBW102",
    "d": "4",
    "e": "3",
    "f": "0",
    "g": "1795306556772",
    "h": "0",
    "i": "TAGS\x01TagA\x02KEYS\x01key-0\x02UNIQ_KEY\x017F0000012CBC5FB551D26C34FDDF0000\x02"
    "WAIT\x01true\x02",
    "j": "0",
    "k": "false",
    "l": "16",
    "m": "false",
}


def send_request(stype: SerializeType) -> RemotingCommand:
    return request(
        RequestCode.SEND_MESSAGE_V2, 1, EXT_V2, BODY, serialize_type=stype, language="JAVA"
    )


def rate(fn: Callable[[int], int], n: int) -> float:
    """Operations per second of ``fn(n)``, which returns how many operations it did."""
    t0 = time.perf_counter()
    done = fn(n)
    return done / (time.perf_counter() - t0)


def encoder(stype: SerializeType) -> Callable[[int], int]:
    cmd = send_request(stype)

    def run(n: int) -> int:
        for _ in range(n):
            encode_command(cmd)
        return n

    return run


def decoder(stype: SerializeType, typed_header: bool = False) -> Callable[[int], int]:
    frame = encode_command(send_request(stype))
    per_stream = 1000
    stream = frame * per_stream

    def run(n: int) -> int:
        done = 0
        for _ in range(max(1, n // per_stream)):
            dec = FrameDecoder()
            for start in range(0, len(stream), CHUNK):
                dec.feed(stream[start : start + CHUNK])
                while (cmd := dec.next_command()) is not None:
                    if typed_header:
                        header: SendMessageRequestHeader = send_header_from_v2_ext(cmd.ext_fields)
                        assert header.topic == "BenchTopic"
                    done += 1
        return done

    return run


def record_roundtrip() -> Callable[[int], int]:
    cmd = send_request(SerializeType.JSON)
    header = send_header_from_v2_ext(cmd.ext_fields)
    msg = MessageExt(
        topic=header.topic,
        queue_id=header.queue_id,
        flag=header.flag,
        queue_offset=123456,
        commit_log_offset=987654321,
        sys_flag=0,
        born_timestamp=header.born_timestamp,
        born_host=("127.0.0.1", 50123),
        store_timestamp=header.born_timestamp + 1,
        store_host=("127.0.0.1", 10911),
        reconsume_times=0,
        prepared_transaction_offset=0,
        body=BODY,
        properties=decode_properties(header.properties or ""),
    )

    def run(n: int) -> int:
        for _ in range(n):
            decode_record(encode_record(msg))
        return n

    return run


WORKLOADS: dict[str, Callable[[], Callable[[int], int]]] = {
    "encode_json": lambda: encoder(SerializeType.JSON),
    "encode_msgpack": lambda: encoder(SerializeType.MSGPACK),
    "decode_json": lambda: decoder(SerializeType.JSON),
    "decode_msgpack": lambda: decoder(SerializeType.MSGPACK),
    "decode_json+header": lambda: decoder(SerializeType.JSON, typed_header=True),
    "decode_msgpack+header": lambda: decoder(SerializeType.MSGPACK, typed_header=True),
    "record_roundtrip": record_roundtrip,
}


def peer_msgpack(runs: int) -> list[float]:
    """Run the peer-bench msgpack workload now and return its ops/s per run."""
    rows = physical_limits("msgpack", runs=runs, timeout=600)
    return [r["ops_per_s"] for r in rows if r["workload"] == "msgpack_roundtrip"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=100_000, help="operations per run")
    ap.add_argument("--no-peer", action="store_true", help="skip the peer-bench msgpack run")
    ap.add_argument("--out", default=None, help="append JSON lines here")
    args = ap.parse_args()

    results: dict[str, list[float]] = {name: [] for name in WORKLOADS}
    peer: list[float] = []
    for run in range(args.runs):
        for name, make in WORKLOADS.items():
            results[name].append(rate(make(), args.n))
        if not args.no_peer:
            peer += peer_msgpack(1)  # interleaved with ours, so both see the same noise
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)

    peer_median = statistics.median(peer) if peer else None
    print(
        f"\nprotocol benchmark: {args.runs} runs x {args.n} ops, python {sys.version.split()[0]},"
        f" loadavg {os.getloadavg()[0]:.2f}"
    )
    print(f"{'workload':24} {'median/s':>12} {'min/s':>12} {'max/s':>12} {'vs msgpack rt':>14}")
    for name, values in results.items():
        med = statistics.median(values)
        ratio = f"{med / peer_median:.2f}x" if peer_median else "-"
        print(f"{name:24} {med:12,.0f} {min(values):12,.0f} {max(values):12,.0f} {ratio:>14}")
    if peer_median:
        print(
            f"{'peer msgpack_roundtrip':24} {peer_median:12,.0f} {min(peer):12,.0f} "
            f"{max(peer):12,.0f} {'1.00x':>14}"
        )
    if args.out:
        with open(args.out, "a") as f:
            row = {
                "ts": time.time(),
                "runs": args.runs,
                "n": args.n,
                "peer_msgpack": peer,
                **results,
            }
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
