"""Helpers for replication tests: a master and its replicas in one trio run, waits on the
replica's progress (never on time), the log as bytes, sends with their answers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from broker.app import BrokerHandle
from broker.ha.acks import ReplicationStatistics
from broker.ha.replica import Follower
from broker.store.store import MessageStore
from protocol.batch import BatchEntry, encode_batch
from protocol.codes import RequestCode
from protocol.command import RemotingCommand, request
from protocol.ha import (
    Epochs,
    Hello,
    MasterSide,
    ReplicaSide,
    Report,
    encode_epochs,
    encode_hello,
    encode_report,
)
from protocol.headers.send import SendMessageRequestHeader, send_header_to_v2_ext
from protocol.properties import UNIQ_KEY, encode_properties
from tests.broker.client import BrokerClient, open_broker

NAME = "broker-ha"
#: Bound on any wait for replication to catch up (loopback; generous for a busy machine).
CATCH_UP_S = 20.0


@asynccontextmanager
async def open_master(data_dir: Path, **settings: Any) -> AsyncIterator[BrokerHandle]:
    """A master whose HA port is any free port."""
    async with open_broker(data_dir, broker_name=NAME, ha_port=0, **settings) as master:
        assert master.ha_port is not None
        yield master


@asynccontextmanager
async def open_replica(
    data_dir: Path, master_ha: str | None, broker_id: int = 1, **settings: Any
) -> AsyncIterator[BrokerHandle]:
    """A replica of :data:`NAME` following the master at ``master_ha`` (``host:port``;
    None: where the name servers of ``namesrv_addr`` say it is)."""
    async with open_broker(
        data_dir, broker_name=NAME, broker_id=broker_id, ha_master_addr=master_ha, **settings
    ) as replica:
        assert replica.follower is not None and replica.ha_port is None
        yield replica


def ha_addr(master: BrokerHandle) -> str:
    return f"127.0.0.1:{master.ha_port}"


def follower(replica: BrokerHandle) -> Follower:
    assert replica.follower is not None
    return replica.follower


async def wait_caught_up(master: BrokerHandle, replica: BrokerHandle) -> None:
    """Wait until the replica's log reaches the master's streamable end."""
    link = follower(replica)
    with trio.fail_after(CATCH_UP_S):
        while replica.broker.store.log.end < master.broker.store.replicable_end:
            await link.progress.wait()


async def wait_replicas(master: BrokerHandle, count: int) -> ReplicationStatistics:
    """Wait until exactly ``count`` replicas are connected to the master."""
    replicas = master.broker.replicas
    with trio.fail_after(CATCH_UP_S):
        await replicas.wait_until(lambda s: len(s.replicas) == count)
    return replicas.statistics()


def log_image(store: MessageStore) -> bytes:
    """The whole log, from its first byte to its end (what both sides must agree on)."""
    parts, pos = [], store.log.min_offset
    for _ in range(1_000_000):  # bounded: one segment's worth per step at most
        if pos >= store.log.end:
            break
        data = store.log.read_some(pos, 256 * 1024)
        parts.append(data)
        pos += len(data)
    return b"".join(parts)


def send_command(
    topic: str, key: str, body: bytes, queue_id: int = 0, extra: Mapping[str, str] | None = None
) -> RemotingCommand:
    """SEND_MESSAGE_V2 of one message with UNIQ_KEY ``key`` (and ``extra`` properties)."""
    properties = encode_properties({UNIQ_KEY: key, **(extra or {})})
    header = SendMessageRequestHeader(
        producer_group="ha_producer", topic=topic, default_topic="TBW102",
        default_topic_queue_nums=4, queue_id=queue_id, sys_flag=0,
        born_timestamp=1_700_000_000_000, flag=0, properties=properties,
    )  # fmt: skip
    return request(RequestCode.SEND_MESSAGE_V2, 0, send_header_to_v2_ext(header), body)


def batch_command(topic: str, keys: list[str], queue_id: int = 0) -> RemotingCommand:
    """SEND_BATCH_MESSAGE of one message per key (UNIQ_KEY = body = the key)."""
    header = SendMessageRequestHeader(
        producer_group="ha_producer", topic=topic, default_topic="TBW102",
        default_topic_queue_nums=4, queue_id=queue_id, sys_flag=0,
        born_timestamp=1_700_000_000_000, flag=0, properties="",
    )  # fmt: skip
    entries = [BatchEntry(key.encode(), {UNIQ_KEY: key}) for key in keys]
    return request(
        RequestCode.SEND_BATCH_MESSAGE, 0, send_header_to_v2_ext(header), encode_batch(entries)
    )


async def send(
    client: BrokerClient,
    topic: str,
    key: str,
    body: bytes,
    queue_id: int = 0,
    extra: Mapping[str, str] | None = None,
) -> RemotingCommand:
    return await client.request(send_command(topic, key, body, queue_id, extra))


async def handshake_as_replica(stream: trio.abc.Stream, offset: int = 0, epoch: int = 0) -> Epochs:
    """A hand-made replica's side of the handshake: HELLO, the master's EPOCHS, REPORT
    ``offset`` (bytes that follow the EPOCHS in the same read are dropped: callers drain)."""
    await stream.send_all(encode_hello(Hello(NAME, 1, epoch)))
    side = ReplicaSide(epoch)
    events: list[object] = []
    while not events:  # bounded by the caller's deadline
        data = await stream.receive_some(1 << 16)
        assert data, "the master closed during the handshake"
        events += side.receive(bytes(data))
    assert isinstance(events[0], Epochs), events[0]
    await stream.send_all(encode_report(offset))
    return events[0]


async def handshake_as_master(
    stream: trio.abc.Stream, epoch: int, end: int, history: tuple[tuple[int, int], ...] = ((1, 0),)
) -> Report:
    """A hand-made master's side: take HELLO, answer EPOCHS, return the first REPORT."""
    side = MasterSide()
    answered = False
    for _ in range(10_000):  # bounded: each pass reads at least one byte
        data = await stream.receive_some(1024)
        assert data, "the replica closed during the handshake"
        for event in side.receive(bytes(data)):
            if isinstance(event, Report):
                return event
            if not answered:
                await stream.send_all(encode_epochs(Epochs(epoch, end, history)))
                answered = True
    raise AssertionError("no report")
