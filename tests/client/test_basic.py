"""Producer and simple consumer against a real broker over TCP, under trio and asyncio."""

from __future__ import annotations

import anyio
import pytest

from client.config import ClientConfig
from client.errors import ConnectError, SendFailedError
from client.message import Message
from client.producer import Producer, shard_queue
from client.simple_consumer import SimpleConsumer
from protocol.errors import IllegalNameError, NoMessageError
from tests.client.harness import BrokerThread, run

pytestmark = pytest.mark.integration


async def _send_receive_ack(config: ClientConfig) -> None:
    async with SimpleConsumer(
        config, group="g1", subscription={"T1": "*"}, consume_from="first"
    ) as consumer:
        async with Producer(config) as producer:
            receipts = [
                await producer.send(Message("T1", f"m{i}".encode(), tag="a", keys=[f"k{i}"]))
                for i in range(5)
            ]
        assert len({r.message_id for r in receipts}) == 5
        got = []
        for _ in range(10):  # bounded
            got += await consumer.receive(32, invisible_duration=30, await_duration=1)
            if len(got) >= 5:
                break
        assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(5)]
        by_id = {m.message_id: m for m in got}
        assert set(by_id) == {r.message_id for r in receipts}
        first = got[0]
        assert first.topic == "T1" and first.tag == "a" and first.delivery_attempt == 1
        assert first.keys and first.keys[0].startswith("k")
        for m in got:
            await consumer.ack(m)
        with pytest.raises(NoMessageError):
            await consumer.ack(got[0])  # acked already: a clear, typed answer
        assert await consumer.receive(32, 30, await_duration=0) == []


def test_send_receive_ack(broker: BrokerThread, config: ClientConfig, backend: str) -> None:
    """Messages sent are received once each with their tag, keys and ids, and acked."""
    # The consumer starts first: a new pop group starts at the end of the queues.
    run(backend, _send_receive_ack, config)


async def _batch_and_shard(config: ClientConfig) -> None:
    async with Producer(config) as producer:
        batch = await producer.send_batch([Message("T2", f"b{i}".encode()) for i in range(10)])
        assert len(batch) == 10 and len({r.queue for r in batch}) == 1
        assert [r.queue_offset for r in batch] == list(
            range(batch[0].queue_offset, batch[0].queue_offset + 10)
        )
        queues = {
            (await producer.send(Message("T2", b"x"), sharding_key="order-42")).queue
            for _ in range(6)
        }
        assert len(queues) == 1
        route = await producer.instance.route("T2")
        assert queues == {shard_queue(route.write_queues, "order-42")}


def test_batch_and_sharding_key(broker: BrokerThread, config: ClientConfig, backend: str) -> None:
    """A batch lands in one queue at consecutive offsets; a sharding key pins one queue."""
    run(backend, _batch_and_shard, config)


async def _invalid(config: ClientConfig) -> None:
    async with Producer(config) as producer:
        with pytest.raises(ValueError, match="empty"):
            await producer.send(Message("T3", b""))
        with pytest.raises(IllegalNameError):
            await producer.send(Message("bad topic!", b"x"))
        with pytest.raises(ValueError, match="exceeds"):
            await producer.send(Message("T3", b"x" * (4 * 1024 * 1024 + 1)))
        with pytest.raises(ValueError, match="reserved"):
            await producer.send(Message("T3", b"x", properties={"UNIQ_KEY": "1"}))


def test_invalid_messages_refused_before_sending(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """Invalid messages raise a clear error and nothing is sent."""
    run(backend, _invalid, config)


async def _broker_down(address: str) -> float:
    config = ClientConfig(namesrv_addr=address, request_timeout=1.0, connect_timeout=0.5)
    async with Producer(config, send_timeout=1.5) as producer:
        start = anyio.current_time()
        with pytest.raises(SendFailedError) as info:
            await producer.send(Message("T4", b"x"))
        assert any(isinstance(e, Exception) for _, e in info.value.attempts)
        return anyio.current_time() - start


def test_broker_down_at_start(backend: str, unused_tcp_port: int) -> None:
    """No broker: the send fails with every attempt listed, within its total timeout."""
    spent = run(backend, _broker_down, f"127.0.0.1:{unused_tcp_port}")
    assert spent < 3.0


async def _connect_error(address: str) -> None:
    config = ClientConfig(namesrv_addr=address, connect_timeout=0.5)
    async with Producer(config) as producer:
        with pytest.raises(ConnectError):
            await producer.instance.remoting.invoke(address, producer.instance.request(34))
        # Backing off: the next try fails at once without connecting.
        assert producer.instance.remoting.is_backing_off(address)


def test_connect_error_backs_off(backend: str, unused_tcp_port: int) -> None:
    """A refused connect raises ConnectError and puts the address on back-off."""
    run(backend, _connect_error, f"127.0.0.1:{unused_tcp_port}")


async def _concurrent(config: ClientConfig) -> None:
    async with Producer(config) as producer:
        receipts = []

        async def one(i: int) -> None:
            receipts.append(await producer.send(Message("T5", f"c{i}".encode())))

        async with anyio.create_task_group() as tg:
            for i in range(300):
                tg.start_soon(one, i)
        # Frames written together by one writer (coalesced) all arrived whole and in order.
        assert len({(r.queue, r.queue_offset) for r in receipts}) == 300
        assert len(producer.instance.remoting.addresses) == 1  # one connection for all


def test_concurrent_sends_share_one_connection(
    broker: BrokerThread, config: ClientConfig, backend: str
) -> None:
    """300 concurrent sends over one multiplexed connection each get their own receipt."""
    run(backend, _concurrent, config)
