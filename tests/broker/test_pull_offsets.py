"""Classic pull, long polling, consumer and queue offsets, and message lookup over real TCP.

Each test runs a broker in-process on 127.0.0.1 (any free port) through the shared test
client of ``tests.broker.client``. Long-poll tests keep their suspend timeouts short and bound
every wait with ``trio.fail_after``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker.app import BrokerHandle
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.headers.admin import (
    QueryMessageRequestHeader,
    QueryMessageResponseHeader,
    ViewMessageRequestHeader,
)
from protocol.headers.offsets import (
    GetEarliestMsgStoretimeRequestHeader,
    GetMaxOffsetRequestHeader,
    GetMinOffsetRequestHeader,
    QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader,
    UpdateConsumerOffsetRequestHeader,
)
from protocol.headers.pull import (
    PullMessageRequestHeader,
    PullMessageResponseHeader,
    build_pull_sys_flag,
)
from protocol.headers.send import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.message import MessageExt, decode_records
from protocol.msgid import decode_offset_msg_id
from protocol.properties import KEYS, TAGS, UNIQ_KEY, encode_properties
from tests.broker.client import BrokerClient, open_broker, open_client
from tests.broker.memory import MemoryBroker, open_memory_broker

pytestmark = pytest.mark.integration

TIMEOUT = 10
GROUP = "pull_test_group"
TOPIC = "PullTopic"


# ---------------------------------------------------------------- helpers
async def send(
    client: BrokerClient,
    body: bytes,
    *,
    topic: str = TOPIC,
    queue_id: int = 0,
    tags: str | None = None,
    keys: str | None = None,
    uniq_key: str | None = None,
) -> SendMessageResponseHeader:
    """Send one message (SEND_MESSAGE, V1 names) and return the broker's answer."""
    properties = {TAGS: tags, KEYS: keys, UNIQ_KEY: uniq_key}
    header = SendMessageRequestHeader(
        producer_group="pull_test_producer",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=int(time.time() * 1000),
        flag=0,
        properties=encode_properties({k: v for k, v in properties.items() if v}),
    )
    reply = await client.call(RequestCode.SEND_MESSAGE, header.to_ext(), body)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return SendMessageResponseHeader.from_ext(reply.ext_fields)


def pull_request(
    offset: int,
    *,
    topic: str = TOPIC,
    queue_id: int = 0,
    max_nums: int = 32,
    suspend_ms: int = 0,
    subscription: str = "*",
    expression_type: str | None = None,
    commit_offset: int | None = None,
    opaque: int = 0,
) -> RemotingCommand:
    """A PULL_MESSAGE request as the C++ clients build it (SUBSCRIPTION always set)."""
    sys_flag = build_pull_sys_flag(
        commit_offset=commit_offset is not None, suspend=suspend_ms > 0, subscription=True
    )
    header = PullMessageRequestHeader(
        consumer_group=GROUP,
        topic=topic,
        queue_id=queue_id,
        queue_offset=offset,
        max_msg_nums=max_nums,
        sys_flag=sys_flag,
        commit_offset=commit_offset or 0,
        suspend_timeout_millis=suspend_ms,
        subscription=subscription,
        sub_version=0,
        expression_type=expression_type,
    )
    return request(RequestCode.PULL_MESSAGE, opaque, header.to_ext())


async def pull(client: BrokerClient, offset: int, **kwargs: Any) -> RemotingCommand:
    """Send a pull (see :func:`pull_request`) and wait for its reply."""
    return await client.request(pull_request(offset, **kwargs))


def pulled(reply: RemotingCommand) -> PullMessageResponseHeader:
    return PullMessageResponseHeader.from_ext(reply.ext_fields)


def messages(reply: RemotingCommand) -> list[MessageExt]:
    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
    return decode_records(reply.body, verify_crc=True)


async def offset_call(client: BrokerClient, code: int, ext: dict[str, str]) -> int:
    reply = await client.call(code, ext)
    assert reply.code == ResponseCode.SUCCESS, (reply.code, reply.remark)
    return int(reply.ext_fields["offset"])


async def max_offset(client: BrokerClient, queue_id: int = 0, topic: str = TOPIC) -> int:
    header = GetMaxOffsetRequestHeader(topic=topic, queue_id=queue_id)
    return await offset_call(client, RequestCode.GET_MAX_OFFSET, header.to_ext())


async def query_offset(
    client: BrokerClient, queue_id: int = 0, group: str = GROUP, topic: str = TOPIC
) -> RemotingCommand:
    header = QueryConsumerOffsetRequestHeader(consumer_group=group, topic=topic, queue_id=queue_id)
    return await client.call(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())


async def update_offset(client: BrokerClient, offset: int, queue_id: int = 0) -> RemotingCommand:
    header = UpdateConsumerOffsetRequestHeader(
        consumer_group=GROUP, topic=TOPIC, queue_id=queue_id, commit_offset=offset
    )
    return await client.call(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext())


async def wait_parked(broker: BrokerHandle | MemoryBroker, count: int = 1) -> None:
    """Wait until ``count`` pulls are parked in the broker's hub."""
    # A counter, not an event: the hub has nothing to wait on, so poll it briefly.
    while broker.statistics().core.pull_hub.parked < count:  # noqa: ASYNC110
        await trio.sleep(0.005)


# ---------------------------------------------------------------- plain pulls
async def test_send_then_pull_returns_the_stored_records(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            for i in range(3):
                await send(client, b"m%d" % i, tags="TagA")
            reply = await pull(client, 0)
            got = messages(reply)
            assert [m.body for m in got] == [b"m0", b"m1", b"m2"]
            assert [m.queue_offset for m in got] == [0, 1, 2]
            assert {(m.topic, m.queue_id) for m in got} == {(TOPIC, 0)}
            header = pulled(reply)
            assert (header.next_begin_offset, header.min_offset, header.max_offset) == (3, 0, 3)
            assert reply.ext_fields["suggestWhichBrokerId"] == "0"

            reply = await pull(client, 1, max_nums=1)
            assert [m.body for m in messages(reply)] == [b"m1"]
            assert pulled(reply).next_begin_offset == 2


async def test_pull_filters_by_tags(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            for tags in ("TagA", "TagB", "TagC", None):
                await send(client, (tags or "none").encode(), tags=tags)
            reply = await pull(client, 0, subscription="TagA ||TagC")
            assert [m.body for m in messages(reply)] == [b"TagA", b"TagC"]
            assert pulled(reply).next_begin_offset == 4  # past the skipped entries too

            reply = await pull(client, 0, subscription="TagZ")
            assert reply.code == ResponseCode.PULL_RETRY_IMMEDIATELY
            assert pulled(reply).next_begin_offset == 4

            everything = [b"TagA", b"TagB", b"TagC", b"none"]
            for expression in ("*", ""):
                reply = await pull(client, 0, subscription=expression)
                assert [m.body for m in messages(reply)] == everything

            reply = await pull(client, 0, subscription="*", expression_type="XPATH")
            assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "XPATH" in (reply.remark or "")


async def send_props(client: BrokerClient, body: bytes, props: dict[str, str]) -> None:
    header = SendMessageRequestHeader(
        producer_group="pull_test_producer", topic=TOPIC, default_topic="TBW102",
        default_topic_queue_nums=4, queue_id=0, sys_flag=0, born_timestamp=0, flag=0,
        properties=encode_properties(props),
    )  # fmt: skip
    reply = await client.call(RequestCode.SEND_MESSAGE, header.to_ext(), body)
    assert reply.code == ResponseCode.SUCCESS, reply.remark


SQL_MESSAGES: list[tuple[bytes, dict[str, str]]] = [
    (b"a1-red", {"a": "1", "color": "red", TAGS: "TagA"}),
    (b"a5-blue", {"a": "5", "color": "blue", TAGS: "TagB"}),
    (b"a9-red", {"a": "9", "color": "red", TAGS: "TagA"}),
    (b"no-a", {"color": "red"}),
]


@pytest.mark.parametrize(
    ("expression", "wanted"),
    [
        ("a > 3", [b"a5-blue", b"a9-red"]),
        ("a BETWEEN 1 AND 5 AND color = 'red'", [b"a1-red"]),
        ("color IN ('red') AND a IS NULL", [b"no-a"]),
        ("TAGS = 'TagA' OR color <> 'red'", [b"a1-red", b"a5-blue", b"a9-red"]),
        ("a > 100", []),
    ],
)
async def test_pull_filters_by_sql92_over_properties(
    tmp_path: Path, expression: str, wanted: list[bytes]
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            for body, props in SQL_MESSAGES:
                await send_props(client, body, props)
            reply = await pull(client, 0, subscription=expression, expression_type="SQL92")
            if wanted:
                assert [m.body for m in messages(reply)] == wanted
            else:
                assert reply.code == ResponseCode.PULL_RETRY_IMMEDIATELY
            assert pulled(reply).next_begin_offset == len(SQL_MESSAGES)


async def test_sql92_refusals_are_subscription_parse_failed(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            await send_props(client, b"x", {"a": "1"})
            reply = await pull(client, 0, subscription="a >", expression_type="SQL92")
            assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "position" in (reply.remark or ""), reply.remark
            await assert_pull_ok(client)
        async with (
            open_broker(tmp_path, enable_property_filter=False) as broker,
            open_client(broker.port) as client,
        ):
            reply = await pull(client, 0, subscription="a > 0", expression_type="SQL92")
            assert reply.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
            assert "SQL92" in (reply.remark or "")


async def assert_pull_ok(client: BrokerClient) -> None:
    assert (await pull(client, 0)).code == ResponseCode.SUCCESS


async def test_sql92_long_poll_is_answered_by_a_matching_message_only(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            await send_props(client, b"first", {"a": "0"})
            async with trio.open_nursery() as nursery:
                got: list[RemotingCommand] = []

                async def park() -> None:
                    got.append(await pull(
                        client, 1, subscription="a = 7", expression_type="SQL92",
                        suspend_ms=8000,
                    ))  # fmt: skip

                nursery.start_soon(park)
                await wait_parked(broker)
                await send_props(client, b"not it", {"a": "3"})
                await send_props(client, b"it", {"a": "7"})
            [reply] = got
            assert [m.body for m in messages(reply)] == [b"it"]
            assert pulled(reply).next_begin_offset == 3


async def test_bad_offsets_answer_offset_moved(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            for i in range(3):
                await send(client, b"m%d" % i)
            reply = await pull(client, 10)  # beyond the end
            assert reply.code == ResponseCode.PULL_OFFSET_MOVED
            assert pulled(reply).next_begin_offset == 3

            reply = await pull(client, 3)  # caught up, no suspend flag: answered at once
            assert reply.code == ResponseCode.PULL_NOT_FOUND
            assert pulled(reply).next_begin_offset == 3

            # Queue 1 of the topic exists but never held a message.
            reply = await pull(client, 0, queue_id=1)
            assert reply.code == ResponseCode.PULL_NOT_FOUND
            reply = await pull(client, 5, queue_id=1)
            assert reply.code == ResponseCode.PULL_OFFSET_MOVED
            assert pulled(reply).next_begin_offset == 0


async def test_pull_of_unknown_topic_or_queue_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            reply = await pull(client, 0, topic="NoSuchTopic")
            assert reply.code == ResponseCode.TOPIC_NOT_EXIST
            await send(client, b"x")
            reply = await pull(client, 0, queue_id=99)
            assert reply.code == ResponseCode.INVALID_PARAMETER
            assert "99" in (reply.remark or "")
            reply = await client.call(RequestCode.PULL_MESSAGE, {"topic": TOPIC})
            assert reply.code == ResponseCode.INVALID_PARAMETER  # required fields missing


# ---------------------------------------------------------------- long polling
async def test_long_poll_is_woken_by_a_send_to_its_queue(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await send(client, b"old")
            opaque = client.next_opaque()
            await client.send(pull_request(1, suspend_ms=5000, opaque=opaque))
            await wait_parked(broker)
            async with broker.connect() as producer:
                started = trio.current_time()
                await send(producer, b"new")
                reply = await client.reply(opaque, timeout=2)
                elapsed = trio.current_time() - started
            assert [m.body for m in messages(reply)] == [b"new"]
            assert pulled(reply).next_begin_offset == 2
            assert elapsed == 0  # woken by the send itself; the hold would be 5 s


async def test_long_poll_ignores_other_queues_and_other_tags(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await send(client, b"first", tags="TagA")
            started = trio.current_time()
            opaque = client.next_opaque()
            await client.send(pull_request(1, suspend_ms=600, subscription="TagA", opaque=opaque))
            await wait_parked(broker)
            await send(client, b"elsewhere", queue_id=1, tags="TagA")
            await send(client, b"other tag", tags="TagB")
            reply = await client.reply(opaque, timeout=3)
            elapsed = trio.current_time() - started
            assert reply.code == ResponseCode.PULL_NOT_FOUND
            assert elapsed == pytest.approx(0.6)  # its own suspend timeout, not a wake-up
            header = pulled(reply)
            assert header.next_begin_offset == 1
            assert header.max_offset == 2  # refreshed without re-reading
            # The client moves past the other tag with its next pull.
            reply = await pull(client, 1, subscription="TagA")
            assert reply.code == ResponseCode.PULL_RETRY_IMMEDIATELY
            assert pulled(reply).next_begin_offset == 2


async def test_suspend_is_capped_by_the_broker(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_memory_broker(tmp_path, suspend_max_ms=200) as broker,
            broker.connect() as client,
        ):
            await send(client, b"x")
            started = trio.current_time()
            reply = await pull(client, 1, suspend_ms=30_000)
            assert reply.code == ResponseCode.PULL_NOT_FOUND
            assert trio.current_time() - started == pytest.approx(0.2)  # the broker's cap


async def test_a_parked_pull_does_not_block_its_connection(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await send(client, b"x")
            opaque = client.next_opaque()
            await client.send(pull_request(1, suspend_ms=5000, opaque=opaque))
            await wait_parked(broker)
            started = trio.current_time()
            assert await max_offset(client) == 1
            assert trio.current_time() - started == 0  # answered beside the parked pull
            assert not client.has_reply(opaque)
            await send(client, b"wake")
            assert [m.body for m in messages(await client.reply(opaque))] == [b"wake"]


async def test_graceful_stop_answers_a_parked_pull(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            await send(client, b"x")
            opaque = client.next_opaque()
            await client.send(pull_request(1, suspend_ms=5000, opaque=opaque))
            await wait_parked(broker)
            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(broker.stop)
                reply = await client.reply(opaque, timeout=2)
            assert reply.code == ResponseCode.PULL_NOT_FOUND
            assert pulled(reply).next_begin_offset == 1
            assert trio.current_time() - started < 2.0


# ---------------------------------------------------------------- consumer offsets
async def test_commits_via_pull_and_update_then_query(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            for i in range(3):
                await send(client, b"m%d" % i)
            assert len(messages(await pull(client, 0, commit_offset=2))) == 3
            reply = await query_offset(client)
            assert (reply.code, reply.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "2")

            await pull(client, 0, commit_offset=-1)  # JavaScript client: ignored
            assert (await query_offset(client)).ext_fields["offset"] == "2"

            reply = await update_offset(client, 1)
            assert reply.code == ResponseCode.SUCCESS  # flag 0: answered
            assert (await query_offset(client)).ext_fields["offset"] == "1"
            assert (await update_offset(client, -1)).code == ResponseCode.SUCCESS
            assert (await query_offset(client)).ext_fields["offset"] == "1"
            assert broker.broker.store.offsets.query(GROUP, TOPIC, 0) == 1

            header = UpdateConsumerOffsetRequestHeader(
                consumer_group=GROUP, topic="NoSuchTopic", queue_id=0, commit_offset=1
            )
            reply = await client.call(RequestCode.UPDATE_CONSUMER_OFFSET, header.to_ext())
            assert reply.code == ResponseCode.TOPIC_NOT_EXIST


async def test_never_committed_group_starts_at_zero_while_message_zero_exists(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        # Small segments, so that retention can delete the first ones.
        async with (
            open_broker(tmp_path, segment_size=4096) as broker,
            open_client(broker.port) as client,
        ):
            await send(client, b"first")
            reply = await query_offset(client)
            assert (reply.code, reply.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "0")
            reply = await query_offset(client, queue_id=3)  # empty queue
            assert (reply.code, reply.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "0")
            header = QueryConsumerOffsetRequestHeader(
                consumer_group=GROUP, topic=TOPIC, queue_id=0, set_zero_if_not_found=False
            )
            reply = await client.call(RequestCode.QUERY_CONSUMER_OFFSET, header.to_ext())
            assert reply.code == ResponseCode.QUERY_NOT_FOUND

            for i in range(60):
                await send(client, b"filler %d" % i + b"." * 200)
            store = broker.broker.store
            await broker.broker.storage.flush_once()  # segments exist on disk once written out
            assert store.delete_expired(time.time() + 365 * 86400, scheduled=True) > 0
            low = store.min_offset(TOPIC, 0)
            assert low > 0
            min_header = GetMinOffsetRequestHeader(topic=TOPIC, queue_id=0)
            assert await offset_call(client, RequestCode.GET_MIN_OFFSET, min_header.to_ext()) == low
            reply = await query_offset(client)
            assert reply.code == ResponseCode.QUERY_NOT_FOUND
            # A committed offset is still answered, and a pull below the min is moved.
            assert (await update_offset(client, 0)).code == ResponseCode.SUCCESS
            assert (await query_offset(client)).ext_fields["offset"] == "0"
            reply = await pull(client, 0)
            assert reply.code == ResponseCode.PULL_OFFSET_MOVED
            assert pulled(reply).next_begin_offset == low


# ---------------------------------------------------------------- queue offsets
async def test_max_min_earliest_and_search_by_timestamp(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            for i in range(3):
                await send(client, b"m%d" % i)
                await trio.sleep(0.003)  # distinct store times
            stored = [m.store_timestamp for m in messages(await pull(client, 0))]
            assert stored == sorted(set(stored))
            assert await max_offset(client) == 3
            assert await max_offset(client, queue_id=2) == 0
            min_header = GetMinOffsetRequestHeader(topic=TOPIC, queue_id=0)
            assert await offset_call(client, RequestCode.GET_MIN_OFFSET, min_header.to_ext()) == 0

            earliest = GetEarliestMsgStoretimeRequestHeader(topic=TOPIC, queue_id=0)
            reply = await client.call(RequestCode.GET_EARLIEST_MSG_STORETIME, earliest.to_ext())
            assert int(reply.ext_fields["timestamp"]) == stored[0]
            empty = GetEarliestMsgStoretimeRequestHeader(topic=TOPIC, queue_id=2)
            reply = await client.call(RequestCode.GET_EARLIEST_MSG_STORETIME, empty.to_ext())
            assert int(reply.ext_fields["timestamp"]) == -1

            async def search(timestamp: int, boundary: str | None = None) -> int:
                header = SearchOffsetRequestHeader(
                    topic=TOPIC, queue_id=0, timestamp=timestamp, boundary_type=boundary
                )
                return await offset_call(
                    client, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, header.to_ext()
                )

            assert await search(0) == 0
            assert await search(stored[1]) == 1
            assert await search(stored[1] - 1) == 1
            assert await search(stored[1], "UPPER") == 1
            assert await search(stored[2] + 1) == 3  # after the last: the max offset


# ---------------------------------------------------------------- lookup
async def test_view_message_by_offset_id(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            await send(client, b"zero")
            answer = await send(client, b"one", tags="TagV")
            _, _, offset = decode_offset_msg_id(answer.msg_id)
            header = ViewMessageRequestHeader(offset=offset)
            reply = await client.call(RequestCode.VIEW_MESSAGE_BY_ID, header.to_ext())
            (msg,) = messages(reply)
            assert (msg.body, msg.tags, msg.commit_log_offset) == (b"one", "TagV", offset)
            assert msg.offset_msg_id == answer.msg_id

            for bad in (offset + 1, 10**9, -5):
                bad_header = ViewMessageRequestHeader(offset=bad)
                reply = await client.call(RequestCode.VIEW_MESSAGE_BY_ID, bad_header.to_ext())
                assert reply.code == ResponseCode.QUERY_NOT_FOUND, bad


async def test_query_message_by_key_and_unique_key(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            await send(client, b"a", keys="order-1 shared", uniq_key="UNIQ-A")
            await send(client, b"b", keys="order-2 shared", uniq_key="UNIQ-B", queue_id=1)
            await send(client, b"c", keys="order-1", topic="OtherTopic")

            async def query(key: str, *, unique: bool = False) -> RemotingCommand:
                header = QueryMessageRequestHeader(
                    topic=TOPIC, key=key, max_num=10, begin_timestamp=0, end_timestamp=2**62
                )
                ext = header.to_ext()
                if unique:
                    ext["_UNIQUE_KEY_QUERY"] = "true"
                return await client.call(RequestCode.QUERY_MESSAGE, ext)

            assert [m.body for m in messages(await query("order-1"))] == [b"a"]
            assert [m.body for m in messages(await query("shared"))] == [b"b", b"a"]  # newest 1st
            reply = await query("UNIQ-B", unique=True)
            assert [m.body for m in messages(reply)] == [b"b"]
            index = QueryMessageResponseHeader.from_ext(reply.ext_fields)
            assert index.index_last_update_phyoffset == broker.broker.store.dispatched_offset

            reply = await query("no-such-key")
            assert reply.code == ResponseCode.QUERY_NOT_FOUND
            assert "indexLastUpdateTimestamp" in reply.ext_fields
