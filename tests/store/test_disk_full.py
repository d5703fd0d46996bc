"""Writes stop when the disk is full past ``disk_full_ratio`` and resume once it is not;
reads go on. The disk's usage comes from an injected probe, never the machine's."""

from __future__ import annotations

from pathlib import Path

import trio

from broker.app import BrokerHandle, serve_broker
from broker.config import BrokerConfig
from broker.storage import Storage
from broker.store.api import GetStatus, MessageToStore, PutStatus
from broker.store.config import StoreConfig
from broker.store.store import MessageStore
from protocol.codes import ResponseCode
from tests.broker.client import TEST_SETTINGS, open_client
from tests.broker.test_pull_offsets import pull


def test_puts_are_refused_while_the_disk_is_full_and_reads_go_on(tmp_path: Path) -> None:
    used = [0.5]
    config = StoreConfig(tmp_path, segment_size=8192, disk_probe=lambda _: used[0])
    store = MessageStore.open(config)
    try:
        assert store.put_nowait(MessageToStore("T", 0, b"before")).ok
        used[0] = 0.95
        assert store.put_nowait(MessageToStore("T", 0, b"not yet seen")).ok  # not checked yet
        storage = Storage(store)
        storage.retention_once(0.0)  # the periodic check finds it full
        refused = store.put_nowait(MessageToStore("T", 0, b"refused"))
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "95% full" in (refused.remark or "")
        got = store.get("T", 0, 0, 32)
        assert got.status is GetStatus.FOUND and len(got.offsets) == 2
        used[0] = 0.7
        storage.retention_once(0.0)
        assert store.put_nowait(MessageToStore("T", 0, b"after")).ok
    finally:
        store.close()


def test_a_zero_ratio_never_refuses(tmp_path: Path) -> None:
    config = StoreConfig(tmp_path, disk_full_ratio=0, disk_probe=lambda _: 1.0)
    store = MessageStore.open(config)
    try:
        assert store.put_nowait(MessageToStore("T", 0, b"x")).ok
    finally:
        store.close()


async def test_a_full_disk_refuses_sends_over_tcp_and_pulls_still_work(tmp_path: Path) -> None:
    settings = {**TEST_SETTINGS, "disk_full_ratio": 0.9}
    config = BrokerConfig(host="127.0.0.1", port=0, data_dir=tmp_path, **settings)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            handle: BrokerHandle = await nursery.start(
                lambda task_status: serve_broker(
                    config, disk_probe=lambda _: 0.97, task_status=task_status
                )
            )
            async with open_client(handle.port) as client:
                reply = await client.call(
                    10, {"producerGroup": "g", "topic": "PullTopic", "defaultTopic": "TBW102",
                         "defaultTopicQueueNums": "4", "queueId": "0", "sysFlag": "0",
                         "bornTimestamp": "0", "flag": "0", "properties": ""},
                    b"body",
                )  # fmt: skip
                assert reply.code == ResponseCode.SERVICE_NOT_AVAILABLE, reply.remark
                assert "full" in (reply.remark or "")
                pulled = await pull(client, 0)
                assert pulled.code != ResponseCode.SYSTEM_ERROR  # reads are answered
            await handle.stop()
