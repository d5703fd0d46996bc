"""Clients over a name server and two brokers: failover and consuming from both."""

from __future__ import annotations

import time
from contextlib import suppress
from pathlib import Path

import anyio
import pytest

from broker.app import BrokerHandle
from client.config import ClientConfig
from client.errors import ClientError, NoRouteError
from client.instance import open_instance
from client.message import Message, ReceivedMessage, SendReceipt
from client.producer import Producer
from client.push import ConsumeResult, PushConsumer
from client.simple_consumer import SimpleConsumer
from protocol.codes import RequestCode
from protocol.headers.admin import CreateTopicRequestHeader
from tests.client.harness import BrokerThread, cluster, run

pytestmark = pytest.mark.integration
TOPIC = "CT"


async def create_everywhere(config: ClientConfig, brokers: list[BrokerThread]) -> None:
    """The topic on every broker, and its route listing them all."""
    header = CreateTopicRequestHeader(
        topic=TOPIC, default_topic="TBW102", read_queue_nums=2, write_queue_nums=2, perm=6,
        topic_filter_type="SINGLE_TAG", order=False,
    )  # fmt: skip
    async with open_instance(config) as (instance, _):
        for b in brokers:
            cmd = instance.request(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
            await instance.call(b.address, cmd)
        # The brokers re-register on the change; until the name server has heard of it,
        # the topic has no route at all (NoRouteError) or lacks a broker.
        with anyio.fail_after(10):
            while True:
                with suppress(NoRouteError):
                    route = await instance.route(TOPIC, refresh=True)
                    if len({q.broker_name for q in route.write_queues}) >= len(brokers):
                        break
                await anyio.sleep(0.1)


def _registrations(handle: BrokerHandle) -> int:
    assert handle.registrar is not None
    return sum(handle.registrar.registered.values())


def wait_registered(broker: BrokerThread) -> None:
    """Block until ``broker`` has registered with its name server (polled, at most 10 s)."""
    for _ in range(200):  # bounded: 10 s
        if broker.call(_registrations):
            return
        time.sleep(0.05)
    raise AssertionError(f"{broker.address} did not register with its name server")


async def _failover(
    config: ClientConfig, brokers: list[BrokerThread]
) -> tuple[list[SendReceipt], list[float]]:
    await create_everywhere(config, brokers)
    receipts: list[SendReceipt] = []
    durations: list[float] = []
    async with Producer(config, send_timeout=3.0) as producer:
        for i in range(120):  # bounded
            if i == 40:
                await anyio.to_thread.run_sync(brokers[0].kill)  # broker-a dies mid-run
            start = anyio.current_time()
            receipts.append(await producer.send(Message(TOPIC, f"m{i}".encode())))
            durations.append(anyio.current_time() - start)
    return receipts, durations


async def _drain(config: ClientConfig, expected: int) -> set[str]:
    seen: set[str] = set()
    async with SimpleConsumer(
        config, group="cg", subscription={TOPIC: "*"}, consume_from="first"
    ) as consumer:
        with anyio.move_on_after(20):
            while len(seen) < expected:
                got = await consumer.receive(32, 30, await_duration=0.5)
                seen |= {m.message_id for m in got}
                await consumer.ack_many(got)
    return seen


def test_producer_fails_over_and_nothing_acknowledged_is_lost(tmp_path: Path, backend: str) -> None:
    """broker-a is killed after 40 sends: every later send succeeds on broker-b within the
    send timeout; after broker-a restarts, a consumer of the group gets every acknowledged
    message from both brokers."""
    with cluster(tmp_path) as (namesrv, brokers):
        config = ClientConfig(
            namesrv_addr=namesrv.address, request_timeout=2.0, connect_timeout=1.0
        )
        receipts, durations = run(backend, _failover, config, brokers)
        assert len(receipts) == 120 and max(durations) < 3.0
        before = {r.queue.broker_name for r in receipts[:40]}
        after = {r.queue.broker_name for r in receipts[45:]}
        assert before == {"broker-a", "broker-b"} and after == {"broker-b"}
        # broker-a comes back on its port with its data (a crash restart).
        port = brokers[0].port
        brokers[0] = BrokerThread(
            tmp_path / "broker-a", broker_name="broker-a", namesrv_addr=namesrv.address,
            register_interval_s=1.0, port=port,
        ).start()  # fmt: skip
        wait_registered(brokers[0])  # in broker-a's route again, from the restarted one
        seen = run(backend, _drain, config, len(receipts))
        assert {r.message_id for r in receipts} <= seen


async def _sends_fail_cleanly(config: ClientConfig, brokers: list[BrokerThread]) -> float:
    await create_everywhere(config, brokers)
    for b in brokers:
        await anyio.to_thread.run_sync(b.kill)
    async with Producer(config, send_timeout=2.0) as producer:
        start = anyio.current_time()
        with pytest.raises(ClientError):
            await producer.send(Message(TOPIC, b"x"))
        return anyio.current_time() - start


def test_all_brokers_down_fails_within_timeout(tmp_path: Path, backend: str) -> None:
    """Every broker dead: the send fails with a client error, within its total timeout."""
    with cluster(tmp_path) as (namesrv, brokers):
        config = ClientConfig(
            namesrv_addr=namesrv.address, request_timeout=1.0, connect_timeout=0.5
        )
        assert run(backend, _sends_fail_cleanly, config, brokers) < 3.0


async def _push_over_two(config: ClientConfig, brokers: list[BrokerThread], mode: str) -> None:
    await create_everywhere(config, brokers)
    seen: dict[str, str] = {}
    all_in = anyio.Event()

    async def listener(message: ReceivedMessage) -> ConsumeResult:
        seen[message.message_id] = message.broker_name
        if len(seen) >= 60:
            all_in.set()
        return ConsumeResult.SUCCESS

    group = f"push_{mode}"
    async with PushConsumer(
        config, group=group, subscription={TOPIC: "*"}, listener=listener, mode=mode,
        consume_from="first", long_poll=1.0,
    ), PushConsumer(
        config, group=group, subscription={TOPIC: "*"}, listener=listener, mode=mode,
        consume_from="first", long_poll=1.0,
    ):  # fmt: skip
        async with Producer(config) as producer:
            sent = {
                (await producer.send(Message(TOPIC, f"{i}".encode()))).message_id for i in range(60)
            }
        with anyio.fail_after(30):
            await all_in.wait()
    assert set(seen) == sent
    assert set(seen.values()) == {"broker-a", "broker-b"}


@pytest.mark.parametrize("mode", ["pop", "pull"])
def test_one_group_over_two_brokers_gets_everything(
    tmp_path: Path, backend: str, mode: str
) -> None:
    """Two push consumers of one group, topic on two brokers: every message, from both."""
    with cluster(tmp_path) as (namesrv, brokers):
        config = ClientConfig(namesrv_addr=namesrv.address)
        run(backend, _push_over_two, config, brokers, mode)


async def _ack_many_with_a_broker_gone(
    config: ClientConfig, brokers: list[BrokerThread]
) -> tuple[Exception | None, int, set[str]]:
    await create_everywhere(config, brokers)
    async with Producer(config) as producer:
        for i in range(20):  # bounded: both brokers get some (round robin over 4 queues)
            await producer.send(Message(TOPIC, f"a{i}".encode()))
    async with SimpleConsumer(
        config, group="cg_ack", subscription={TOPIC: "*"}, consume_from="first"
    ) as consumer:
        got: list[ReceivedMessage] = []
        with anyio.fail_after(20):
            while {m.broker_name for m in got} != {"broker-a", "broker-b"} or len(got) < 20:
                got += await consumer.receive(32, 60, await_duration=0.5)  # bounded: fail_after
        await anyio.to_thread.run_sync(brokers[0].kill)  # broker-a dies before the acks
        raised: Exception | None = None
        try:
            await consumer.ack_many(got)
        except Exception as exc:  # what it raises is the subject (an ExceptionGroup too)
            raised = exc
        # broker-b's acks went through: nothing of it comes back within its 60 s.
        again = await consumer.receive(32, 60, await_duration=1.0)
    on_b = sum(1 for m in got if m.broker_name == "broker-b")
    return raised, on_b, {m.broker_name for m in again}


def test_ack_many_with_a_broker_gone_raises_a_client_error(tmp_path: Path, backend: str) -> None:
    """Messages popped from two brokers, one killed before ``ack_many``: it raises one
    ClientError (never an exception group), and the live broker's messages are acked."""
    with cluster(tmp_path) as (namesrv, brokers):
        config = ClientConfig(
            namesrv_addr=namesrv.address, request_timeout=2.0, connect_timeout=1.0
        )
        raised, on_b, again = run(backend, _ack_many_with_a_broker_gone, config, brokers)
        assert isinstance(raised, ClientError), repr(raised)
        assert on_b > 0 and "broker-b" not in again
