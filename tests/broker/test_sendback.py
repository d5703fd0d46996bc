"""CONSUMER_SEND_MSG_BACK: failed messages come back through %RETRY%group, then %DLQ%group."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from broker.store.store import MessageStore
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.send import ConsumerSendMsgBackRequestHeader
from protocol.message import MessageExt, decode_records
from tests.broker.client import BrokerClient, open_broker, open_client
from tests.broker.memory import open_memory_broker
from tests.broker.test_timers import send


def messages(store: MessageStore, topic: str) -> list[MessageExt]:
    got = store.get(topic, 0, 0, 32)
    return decode_records(got.body) if got.body else []


async def send_back(
    client: BrokerClient,
    offset: int,
    *,
    delay_level: int = 0,
    max_reconsume_times: int | None = None,
) -> int:
    header = ConsumerSendMsgBackRequestHeader(
        offset=offset, group="cg", delay_level=delay_level, max_reconsume_times=max_reconsume_times
    )
    reply = await client.call(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext())
    return reply.code


async def test_failed_message_returns_through_the_retry_topic(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(10):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            store = broker.broker.store
            await send(client, "Orders", b"m1")
            (original,) = messages(store, "Orders")
            start = trio.current_time()
            code = await send_back(client, original.commit_log_offset, delay_level=1)
            assert code == ResponseCode.SUCCESS
            assert messages(store, "%RETRY%cg") == []  # level 1: one second later
            for _ in range(3000):  # bounded poll, 1 ms steps (free on the mock clock)
                if messages(store, "%RETRY%cg"):
                    break
                await trio.sleep(0.001)
            assert trio.current_time() - start == pytest.approx(1.0, abs=2e-3)
            (retry,) = messages(store, "%RETRY%cg")
            assert retry.body == b"m1"
            assert retry.reconsume_times == 1
            assert retry.properties["RETRY_TOPIC"] == "Orders"
            assert retry.properties["ORIGIN_MESSAGE_ID"] == "m1"  # the producer's UNIQ_KEY
            # A second failure of the retried message counts up.
            code = await send_back(client, retry.commit_log_offset, delay_level=1)
            assert code == ResponseCode.SUCCESS
            for _ in range(300):
                if len(messages(store, "%RETRY%cg")) == 2:
                    break
                await trio.sleep(0.01)
            second = messages(store, "%RETRY%cg")[1]
            assert second.reconsume_times == 2
            assert second.properties["RETRY_TOPIC"] == "Orders"


async def test_past_the_maximum_it_goes_to_the_dlq_at_once(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            store = broker.broker.store
            await send(client, "Orders", b"poison")
            (original,) = messages(store, "Orders")
            code = await send_back(client, original.commit_log_offset, max_reconsume_times=0)
            assert code == ResponseCode.SUCCESS
            (dead,) = messages(store, "%DLQ%cg")
            assert dead.body == b"poison"
            assert dead.properties["RETRY_TOPIC"] == "Orders"
            assert messages(store, "%RETRY%cg") == []
            # A negative delay level also means "dead-letter it now".
            code = await send_back(client, original.commit_log_offset, delay_level=-1)
            assert code == ResponseCode.SUCCESS
            assert len(messages(store, "%DLQ%cg")) == 2


async def test_unknown_offset_is_a_clear_error(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            code = await send_back(client, 123_456)
            assert code == ResponseCode.SYSTEM_ERROR
            await send(client, "Orders", b"still serving")
            assert broker.broker.store.max_offset("Orders", 0) == 1
