"""Transactional sends with our own clients against a real broker over TCP: local commit and
rollback, an unknown outcome settled by the broker's check-back, a checker in another
producer of the group, and the blocking facade with plain functions in worker threads."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from client import sync
from client.admin import main as admin_main
from client.config import ClientConfig
from client.message import Message, ReceivedMessage, SendReceipt
from client.producer import Producer
from client.simple_consumer import SimpleConsumer
from client.transaction import TransactionState
from tests.client.harness import BrokerThread, broker_thread, run

pytestmark = pytest.mark.integration

#: Check-backs within a fraction of a second, so the tests do not wait for RocketMQ's 6 s.
FAST_CHECKS = {"transaction_immunity_s": 0.3, "transaction_check_interval_s": 0.3}
GROUP = "txn_client_group"
#: A log line (timestamp first) of the broker running in this process.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d ")


@pytest.fixture
def fast_broker(tmp_path: Path) -> Iterator[BrokerThread]:
    with broker_thread(tmp_path / "broker", **FAST_CHECKS) as running:
        yield running


async def bodies_of(consumer: SimpleConsumer, count: int) -> list[bytes]:
    """Receive and ack until ``count`` messages came (bounded), then one more empty poll."""
    got: list[ReceivedMessage] = []
    with anyio.fail_after(20):
        while len(got) < count:
            batch = await consumer.receive(32, invisible_duration=30, await_duration=2)
            for m in batch:
                await consumer.ack(m)
            got += batch
    assert await consumer.receive(32, 30, await_duration=1) == []
    return sorted(m.body for m in got)


async def _local_decisions(config: ClientConfig) -> None:
    async with (
        SimpleConsumer(config, group="c1", subscription={"TxnA": "*"}) as consumer,
        Producer(config, group=GROUP) as producer,
    ):

        def commit(message: Message, receipt: SendReceipt) -> TransactionState:
            assert receipt.message_id and message.body == b"kept"
            return TransactionState.COMMIT

        async def rollback(message: Message, receipt: SendReceipt) -> TransactionState:
            return TransactionState.ROLLBACK

        kept = await producer.send_in_transaction(Message("TxnA", b"kept", tag="t"), commit)
        assert kept.state is TransactionState.COMMIT and kept.confirmed, kept
        dropped = await producer.send_in_transaction(Message("TxnA", b"dropped"), rollback)
        assert dropped.state is TransactionState.ROLLBACK and dropped.confirmed, dropped
        with pytest.raises(ValueError, match="delayed"):
            await producer.send_in_transaction(Message("TxnA", b"x", delay_level=2), commit)
        assert await bodies_of(consumer, 1) == [b"kept"]


def test_local_commit_and_rollback(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """COMMIT publishes the message once; ROLLBACK never does; a delayed one is refused."""
    run(backend, _local_decisions, config)


async def _check_back(config: ClientConfig) -> None:
    asked: list[str] = []

    async def checker(message: ReceivedMessage) -> TransactionState:
        asked.append(message.message_id)
        return TransactionState.COMMIT if message.body == b"commit" else TransactionState.ROLLBACK

    async with (
        SimpleConsumer(config, group="c2", subscription={"TxnB": "*"}) as consumer,
        Producer(config, group=GROUP) as sender,
        # Another client id: one client's heartbeats would replace the other's channel.
        Producer(
            dataclasses.replace(config, instance_name="checker"),
            group=GROUP,
            checker=checker,
            topics=["TxnB"],
        ),
    ):
        unknown = await sender.send_in_transaction(
            Message("TxnB", b"commit"), lambda m, r: TransactionState.UNKNOWN
        )
        assert unknown.state is TransactionState.UNKNOWN and not unknown.confirmed

        def fails(message: Message, receipt: SendReceipt) -> TransactionState:
            raise RuntimeError("local transaction broke")

        with pytest.raises(RuntimeError, match="broke"):
            await sender.send_in_transaction(Message("TxnB", b"rollback"), fails)
        # Both are settled by the check-back, which reaches the producer with the checker.
        assert await bodies_of(consumer, 1) == [b"commit"]
        assert unknown.receipt.message_id in asked and len(set(asked)) == 2


def test_unknown_and_failed_local_transactions_are_settled_by_check_back(
    fast_broker: BrokerThread, backend: str
) -> None:
    config = ClientConfig(namesrv_addr=fast_broker.address, request_timeout=5.0)
    run(backend, _check_back, config)


def test_sync_facade_runs_plain_callbacks_in_worker_threads(fast_broker: BrokerThread) -> None:
    config = ClientConfig(namesrv_addr=fast_broker.address, request_timeout=5.0)
    threads: set[str] = set()

    def checker(message: ReceivedMessage) -> TransactionState:
        threads.add(threading.current_thread().name)
        return TransactionState.COMMIT

    def unknown(message: Message, receipt: SendReceipt) -> TransactionState:
        threads.add(threading.current_thread().name)
        return TransactionState.UNKNOWN

    with (
        sync.SimpleConsumer(config, group="c3", subscription={"TxnC": "*"}) as consumer,
        sync.Producer(config, group=GROUP, checker=checker) as producer,
    ):
        done = producer.send_in_transaction(Message("TxnC", b"by check"), unknown)
        assert done.state is TransactionState.UNKNOWN
        got: list[ReceivedMessage] = []
        for _ in range(20):  # bounded: each receive long-polls up to 2 s
            got += consumer.receive(32, 30, await_duration=2)
            if got:
                break
        assert [m.body for m in got] == [b"by check"]
    assert threads and threading.main_thread().name not in threads


async def _abandon(config: ClientConfig) -> None:
    async with Producer(config, group=GROUP) as producer:
        unknown = await producer.send_in_transaction(
            Message("TxnDead", b"never decided", keys=["dead-1"]),
            lambda m, r: TransactionState.UNKNOWN,
        )
        assert not unknown.confirmed


def test_an_abandoned_transaction_is_listed_for_admins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past the check limit (here 1 check, answered by nobody's decision) the half message is
    in TRANS_CHECK_MAX_TIME_TOPIC, where ``trimq-admin consumeMessage`` shows it."""
    settings = {**FAST_CHECKS, "transaction_check_max": 1}
    with broker_thread(tmp_path / "broker", **settings) as broker:
        config = ClientConfig(namesrv_addr=broker.address, request_timeout=5.0)
        run("trio", _abandon, config)
        # A check counts only when a producer of the group is online to be asked: keep one
        # online (answering UNKNOWN) until the half is discarded.
        listed: list[dict[str, object]] = []
        for _ in range(100):  # bounded: 100 × 0.1 s, each a CLI pull
            code = admin_main(
                ["-n", broker.address, "--timeout", "5", "--json", "consumeMessage",
                 "-t", "TRANS_CHECK_MAX_TIME_TOPIC"]
            )  # fmt: skip
            out, _ = capsys.readouterr()
            # The broker thread logs to the same stdout: keep the CLI's JSON only.
            text = "\n".join(line for line in out.splitlines() if not LOG_LINE.match(line))
            if code == 0 and (listed := json.loads(text)):
                break
            run("trio", _stay_online, config)
        assert [m["keys"] for m in listed] == [["dead-1"]]
        assert listed[0]["body"] == "never decided"


async def _stay_online(config: ClientConfig) -> None:
    """A producer of the group that answers nothing (UNKNOWN), online for 0.1 s."""
    async with Producer(
        config, group=GROUP, checker=lambda m: TransactionState.UNKNOWN, topics=["TxnDead"]
    ):
        await anyio.sleep(0.1)
