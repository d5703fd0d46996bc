"""Cluster and broker commands: ``clusterList`` and ``brokerStatus`` (mqadmin's
``tools/command/cluster`` and ``broker``), both built on GET_BROKER_RUNTIME_INFO; and
trimq's own ``promoteReplica`` (PROMOTE_REPLICA, admin-only: docs/design.md §13)."""

from __future__ import annotations

import argparse
import time

from client.admin.output import Result, table
from client.admin.session import Admin, AdminError, BrokerRef
from protocol.bodies.admin import KVTable
from protocol.codes import RequestCode
from protocol.errors import BrokerError, ProtocolError

_HOUR_MS = 3_600_000


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the cluster and broker commands to the CLI."""
    p = sub.add_parser("clusterList", help="every broker of every cluster")
    p.add_argument("-c", "--clusterName", help="one cluster only")
    p.set_defaults(run=cluster_list)

    p = sub.add_parser("brokerStatus", help="a broker's runtime information")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("-b", "--brokerAddr")
    group.add_argument("-c", "--clusterName")
    p.set_defaults(run=broker_status)

    p = sub.add_parser(
        "promoteReplica",
        help="make a replica its group's master (trimq; stop or fence the old master first)",
    )
    p.add_argument("-b", "--brokerAddr", required=True, help="the replica's HOST:PORT")
    p.set_defaults(run=promote_replica)


async def runtime_info(admin: Admin, address: str) -> dict[str, str]:
    """A broker's runtime KV table."""
    reply = await admin.broker(address, admin.request(RequestCode.GET_BROKER_RUNTIME_INFO))
    return dict(KVTable.from_json(reply.body).table)


def _first(value: str | None) -> str:
    # putTps and friends are "10s 60s 600s" averages; mqadmin shows the first.
    return value.split()[0] if value else "-"


def _hours(info: dict[str, str], now_ms: int) -> str:
    earliest = info.get("earliestMessageTimeStamp")
    if not earliest or not earliest.lstrip("-").isdigit() or int(earliest) <= 0:
        return "-"
    return f"{(now_ms - int(earliest)) / _HOUR_MS:.2f}"


def _space(info: dict[str, str]) -> str:
    ratio = info.get("commitLogDiskRatio")
    try:
        return f"{float(ratio):.4f}" if ratio else "-"
    except ValueError:
        return "-"


async def cluster_list(admin: Admin, args: argparse.Namespace) -> Result:
    """One row per broker with its version, throughput (when known), age and disk use.

    A broker that cannot be reached still gets its row, with its error in ``--json``.
    """
    now_ms = int(time.time() * 1000)
    rows: list[tuple[object, ...]] = []
    doc: list[dict[str, object]] = []
    for ref in await admin.brokers(args.clusterName):
        info, error = await _info_or_error(admin, ref)
        rows.append((ref.cluster, ref.name, 0, ref.address,
                     info.get("brokerVersionDesc", "-"), _first(info.get("putTps")),
                     _first(info.get("getTransferedTps")),
                     info.get("pageCacheLockTimeMills", "-"), _hours(info, now_ms),
                     _space(info)))  # fmt: skip
        doc.append({"clusterName": ref.cluster, "brokerName": ref.name, "brokerId": 0,
                    "address": ref.address, "runtimeInfo": info, "error": error})  # fmt: skip
    headers = ("Cluster Name", "Broker Name", "BID", "Addr", "Version", "InTPS(LOAD)",
               "OutTPS(LOAD)", "PCWait(ms)", "Hour", "SPACE")  # fmt: skip
    return Result(doc, table(headers, rows))


async def _info_or_error(admin: Admin, ref: BrokerRef) -> tuple[dict[str, str], str | None]:
    try:
        return await runtime_info(admin, ref.address), None
    except (AdminError, BrokerError, ProtocolError) as exc:
        return {}, str(exc)


async def broker_status(admin: Admin, args: argparse.Namespace) -> Result:
    """Every runtime key of one broker (``-b``) or of each broker of a cluster (``-c``)."""
    if args.brokerAddr:
        info = await runtime_info(admin, args.brokerAddr)
        text = "\n".join(f"{k:<32}: {v}" for k, v in sorted(info.items()))
        return Result({args.brokerAddr: info}, text)
    doc: dict[str, dict[str, str]] = {}
    lines: list[str] = []
    for ref in await admin.brokers(args.clusterName):
        info = await runtime_info(admin, ref.address)
        doc[ref.address] = info
        lines += (f"{ref.address:<24} {k:<32}: {v}" for k, v in sorted(info.items()))
    return Result(doc, "\n".join(lines))


async def promote_replica(admin: Admin, args: argparse.Namespace) -> Result:
    """Promote the replica at ``-b``; prints its new epoch."""
    reply = await admin.broker(args.brokerAddr, admin.request(RequestCode.PROMOTE_REPLICA))
    epoch = int(reply.ext_fields.get("epoch", "0"))
    doc = {"brokerAddr": args.brokerAddr, "epoch": epoch}
    return Result(doc, f"{args.brokerAddr} is now the master of its group, epoch {epoch}")
