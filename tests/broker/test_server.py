"""The broker over real TCP: routes, sends, heartbeats and groups, and malformed input.

Every test runs a broker in-process on 127.0.0.1 (any free port) and talks to it with the
small test client of ``tests.broker.client``. Where real clients' frames exist
(``tests/fixtures/captures``) they are sent again, byte for byte where possible. The last
section drives the Remoting server itself (``handle_stream``) over memory streams, with a
fake dispatcher, on the mock clock.
"""

from __future__ import annotations

import json
import math
import struct
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from broker.remoting.connection import Connection
from broker.remoting.dispatch import LATER, Later
from broker.remoting.processors import build_registry
from broker.remoting.server import (
    Dispatcher,
    ServerLimits,
    ServerState,
    ServerStatistics,
    handle_stream,
)
from protocol.batch import BatchEntry, encode_batch
from protocol.bodies.consumer import GetConsumerListByGroupResponseBody
from protocol.bodies.heartbeat import (
    ConsumerData,
    ConsumeType,
    HeartbeatData,
    MessageModel,
    SubscriptionData,
)
from protocol.bodies.route import PERM_READ, PERM_WRITE, TopicRouteData
from protocol.codes import RequestCode, ResponseCode, SerializeType
from protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand, request
from protocol.connection import RemotingConnection, Response, Role, UnsolicitedResponse
from protocol.frame import encode_command
from protocol.headers.send import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.message import decode_record
from protocol.msgid import decode_offset_msg_id
from protocol.properties import DELAY, TAGS, UNIQ_KEY, encode_properties
from tests.broker.client import BrokerClient, attach_client, open_broker, open_client
from tests.broker.test_pull_offsets import pull_request
from tests.protocol.captures import Capture, all_captures, capture

pytestmark = pytest.mark.integration

TIMEOUT = 10


# ---------------------------------------------------------------- helpers
def send_header(
    topic: str,
    *,
    queue_id: int = 0,
    properties: dict[str, str] | None = None,
    reconsume_times: int | None = None,
    max_reconsume_times: int | None = None,
) -> SendMessageRequestHeader:
    return SendMessageRequestHeader(
        producer_group="test_producer_group",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=queue_id,
        sys_flag=0,
        born_timestamp=1_700_000_000_000,
        flag=0,
        properties=encode_properties(properties or {TAGS: "TagA"}),
        reconsume_times=reconsume_times,
        max_reconsume_times=max_reconsume_times,
    )


def send_v1(header: SendMessageRequestHeader, body: bytes = b"hello") -> RemotingCommand:
    return request(RequestCode.SEND_MESSAGE, 0, header.to_ext(), body)


def send_v2(header: SendMessageRequestHeader, body: bytes = b"hello") -> RemotingCommand:
    return request(RequestCode.SEND_MESSAGE_V2, 0, header.to_v2_ext(), body)


def route_request(topic: str) -> RemotingCommand:
    return request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 0, {"topic": topic})


async def get_route(client: BrokerClient, topic: str) -> TopicRouteData:
    reply = await client.request(route_request(topic))
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return TopicRouteData.from_json(reply.body)


def sent(reply: RemotingCommand) -> SendMessageResponseHeader:
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return SendMessageResponseHeader.from_ext(reply.ext_fields)


def raw_frame(header: bytes, body: bytes = b"", serialize_type: int = 0) -> bytes:
    """A well-delimited frame around any header bytes."""
    return struct.pack(">II", 4 + len(header) + len(body), (serialize_type << 24) | len(header)) + (
        header + body
    )


def heartbeat_body(client_id: str, group: str, topic: str = "T") -> bytes:
    consumer = ConsumerData(
        group_name=group,
        consume_type=ConsumeType.CONSUME_PASSIVELY,
        message_model=MessageModel.CLUSTERING,
        subscription_data_set=(SubscriptionData(topic=topic, sub_string="*"),),
    )
    return HeartbeatData(client_id=client_id, consumer_data_set=(consumer,)).to_json()


async def consumer_ids(client: BrokerClient, group: str) -> list[str]:
    reply = await client.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return list(GetConsumerListByGroupResponseBody.from_json(reply.body).consumer_id_list)


async def assert_usable(client: BrokerClient) -> None:
    """The connection still answers requests."""
    reply = await client.request(route_request("TBW102"))
    assert reply.code == ResponseCode.SUCCESS


# ---------------------------------------------------------------- routes
async def test_route_of_unknown_topic_is_topic_not_exist_with_auto_create_off(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path, auto_create_topic=False) as broker,
            open_client(broker.port) as client,
        ):
            reply = await client.request(route_request("NoSuchTopic"))
            assert reply.code == ResponseCode.TOPIC_NOT_EXIST
            assert reply.flag & FLAG_RESPONSE
            assert "NoSuchTopic" in (reply.remark or "")


async def test_route_of_a_topic_a_send_will_create(tmp_path: Path) -> None:
    """Auto-create on: the route it will have (ali-ons never falls back to TBW102)."""
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            route = await get_route(client, "NotYetSent")
            (queues,) = route.queue_datas
            assert queues.write_queue_nums == queues.read_queue_nums == 4
            assert broker.broker.topics.get("NotYetSent") is None


async def test_default_topic_route_points_at_this_broker(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            route = await get_route(client, "TBW102")
            (queues,) = route.queue_datas
            assert queues.broker_name == "broker-a"
            assert queues.write_queue_nums == queues.read_queue_nums == 4
            assert queues.perm & PERM_READ and queues.perm & PERM_WRITE
            (brokers,) = route.broker_datas
            assert brokers.cluster == "DefaultCluster"
            assert brokers.broker_addrs == {0: f"127.0.0.1:{broker.port}"}
            assert broker.address == f"127.0.0.1:{broker.port}"


# ---------------------------------------------------------------- sends
async def test_send_v1_v2_and_batch_answer_ids_queues_and_offsets(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            store = broker.broker.store
            first = sent(await client.request(send_v1(send_header("Orders"), b"one")))
            assert (first.queue_id, first.queue_offset) == (0, 0)
            host, port, offset = decode_offset_msg_id(first.msg_id)
            assert (host, port, offset) == ("127.0.0.1", broker.port, 0)

            second = sent(await client.request(send_v2(send_header("Orders"), b"two")))
            assert (second.queue_id, second.queue_offset) == (0, 1)
            host, port, offset2 = decode_offset_msg_id(second.msg_id)
            assert (host, port) == ("127.0.0.1", broker.port)
            assert offset2 > offset
            record = store.message_at(offset2)
            assert record is not None
            msg, _ = decode_record(record)
            assert (msg.topic, msg.body, msg.queue_offset) == ("Orders", b"two", 1)
            assert msg.commit_log_offset == offset2
            assert msg.properties[TAGS] == "TagA"

            entries = [
                BatchEntry(b"b%d" % i, {UNIQ_KEY: f"UNIQ{i}", TAGS: "TagB"}) for i in range(3)
            ]
            header = send_header("Orders", queue_id=1)
            batch = request(
                RequestCode.SEND_BATCH_MESSAGE, 0, header.to_v2_ext(), encode_batch(entries)
            )
            third = sent(await client.request(batch))
            assert (third.queue_id, third.queue_offset) == (1, 0)
            ids = third.msg_id.split(",")
            assert len(ids) == 3
            offsets = [decode_offset_msg_id(i)[2] for i in ids]
            assert offsets == sorted(offsets) and offsets[0] > offset2
            assert third.batch_uniq_id == "UNIQ0,UNIQ1,UNIQ2"
            for i, at in enumerate(offsets):
                record = store.message_at(at)
                assert record is not None
                msg, _ = decode_record(record)
                assert (msg.body, msg.queue_id, msg.queue_offset) == (b"b%d" % i, 1, i)

            assert store.max_offset("Orders", 0) == 2
            assert store.max_offset("Orders", 1) == 3
            # The topic was auto-created from TBW102 with 4 queues.
            (queues,) = (await get_route(client, "Orders")).queue_datas
            assert queues.write_queue_nums == queues.read_queue_nums == 4


async def test_a_batch_is_appended_as_one_unit_even_with_sync_flush(tmp_path: Path) -> None:
    size = 20
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path, flush="sync") as broker,
            open_client(broker.port) as client,
        ):
            header = send_header("Batched")
            entries = [BatchEntry(b"b%d" % i) for i in range(size)]
            batch = request(
                RequestCode.SEND_BATCH_MESSAGE, 0, header.to_v2_ext(), encode_batch(entries)
            )
            replies: list[SendMessageResponseHeader] = []

            async def single(i: int) -> None:
                sent(await client.request(send_v2(header, b"s%d" % i)))

            async def send_batch() -> None:
                replies.append(sent(await client.request(batch)))

            # Single sends to the same queue race the batch; none may land inside it.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_batch)
                for i in range(size):
                    nursery.start_soon(single, i)
            (reply,) = replies
            offsets = []
            for msg_id in reply.msg_id.split(","):
                record = broker.broker.store.message_at(decode_offset_msg_id(msg_id)[2])
                assert record is not None
                offsets.append(decode_record(record)[0].queue_offset)
            first = reply.queue_offset
            assert offsets == list(range(first, first + size))
            assert broker.broker.store.max_offset("Batched", 0) == 2 * size


async def test_a_refused_batch_stores_nothing(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            header = send_header("AllOrNothing").to_v2_ext()
            limit = broker.broker.config.max_message_size
            for bad, remark in [
                (BatchEntry(b"later", {DELAY: "2"}), "DELAY=2"),
                (BatchEntry(b"x" * (limit + 1)), f"exceeds {limit}"),
            ]:
                body = encode_batch([BatchEntry(b"fine"), bad, BatchEntry(b"fine too")])
                reply = await client.call(RequestCode.SEND_BATCH_MESSAGE, header, body)
                assert reply.code == ResponseCode.MESSAGE_ILLEGAL
                assert remark in (reply.remark or "")
                assert broker.broker.store.max_offset("AllOrNothing", 0) == 0
            reply = await client.call(RequestCode.SEND_BATCH_MESSAGE, header, b"")
            assert reply.code == ResponseCode.MESSAGE_ILLEGAL
            reply = await client.call(RequestCode.SEND_BATCH_MESSAGE, header, b"\x00\x01garbage")
            assert reply.code == ResponseCode.MESSAGE_ILLEGAL


async def test_send_with_queue_id_minus_one_picks_a_valid_queue(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            chosen = set()
            for _ in range(8):
                reply = sent(await client.request(send_v2(send_header("Any", queue_id=-1))))
                assert 0 <= reply.queue_id < 4
                chosen.add(reply.queue_id)
            assert len(chosen) > 1  # spread over the queues
            total = sum(broker.broker.store.max_offset("Any", q) for q in range(4))
            assert total == 8


async def test_send_to_a_queue_past_the_write_queues_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            sent(await client.request(send_v2(send_header("Four", queue_id=0))))
            reply = await client.request(send_v2(send_header("Four", queue_id=4)))
            # RocketMQ's msgCheck answers SYSTEM_ERROR with a remark naming the queue.
            assert reply.code == ResponseCode.SYSTEM_ERROR
            remark = reply.remark or ""
            assert "queueId 4" in remark and "4 write queues" in remark and "Four" in remark
            assert broker.broker.store.max_offset("Four", 4) == 0
            await assert_usable(client)


@pytest.mark.parametrize("topic", ["a b", "../x", ""])
async def test_send_to_an_illegal_topic_name_is_invalid_parameter(
    tmp_path: Path, topic: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            for make in (send_v1, send_v2):
                reply = await client.request(make(send_header(topic)))
                assert reply.code == ResponseCode.INVALID_PARAMETER
                remark = reply.remark or ""
                if topic:
                    assert "illegal character" in remark and repr(topic) in remark
                else:
                    assert "empty" in remark
            assert broker.broker.topics.get(topic) is None
            await assert_usable(client)


async def test_retry_send_past_max_reconsume_times_lands_in_the_dlq(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            store = broker.broker.store
            retry, dlq = "%RETRY%cg", "%DLQ%cg"
            ok = sent(await client.request(send_v1(send_header(retry, reconsume_times=3))))
            assert ok.queue_id == 0
            assert store.max_offset(retry, 0) == 1

            # Past the group's own limit (sent by the client) ...
            header = send_header(retry, reconsume_times=3, max_reconsume_times=2)
            to_dlq = sent(await client.request(send_v2(header, b"dead")))
            # ... and past the broker's default (16) when the client sends none.
            header = send_header(retry, reconsume_times=17)
            sent(await client.request(send_v1(header, b"dead too")))
            assert store.max_offset(retry, 0) == 1
            assert store.max_offset(dlq, 0) == 2

            record = store.message_at(decode_offset_msg_id(to_dlq.msg_id)[2])
            assert record is not None
            msg, _ = decode_record(record)
            assert (msg.topic, msg.body, msg.reconsume_times) == (dlq, b"dead", 3)
            assert msg.properties[TAGS] == "TagA"
            (queues,) = (await get_route(client, dlq)).queue_datas
            assert queues.write_queue_nums == 1


async def test_delayed_send_is_accepted_and_held_back(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            header = send_header("Later", properties={DELAY: "3", TAGS: "T"})
            sent(await client.request(send_v2(header)))
            # Level 3 is 10 s: held in SCHEDULE_TOPIC_XXXX, not in its topic yet.
            assert broker.broker.store.max_offset("Later", 0) == 0
            assert broker.broker.store.max_offset("SCHEDULE_TOPIC_XXXX", 2) == 1
            # Level 0 means "not delayed".
            header = send_header("Later", properties={DELAY: "0"})
            sent(await client.request(send_v2(header)))
            assert broker.broker.store.max_offset("Later", 0) == 1


# ---------------------------------------------------------------- heartbeats and groups
async def test_captured_heartbeats_register_groups_and_retry_topics(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            # ali-ons: enum names as strings; client-cpp: integers, subVersion as a string.
            for name, group, client_id in [
                ("ali-ons-11-10911-code34.hex", "interop_consumer_group", "127.0.0.1@10743"),
                (
                    "cpp-client-09-10911-code34.hex",
                    "interop_cpp_consumer_group",
                    "11064-127.0.0.1@DEFAULT",
                ),
            ]:
                reply = await client.request(capture(name).decode())
                assert reply.code == ResponseCode.SUCCESS, reply.remark
                assert await consumer_ids(client, group) == [client_id]
                (queues,) = (await get_route(client, f"%RETRY%{group}")).queue_datas
                assert queues.write_queue_nums == 1
            # A producer-only heartbeat joins no consumer group.
            reply = await client.request(capture("cpp-client-04-10911-code34.hex").decode())
            assert reply.code == ResponseCode.SUCCESS
            assert broker.broker.clients.producer_ids("interop_cpp_producer_group") != []
            assert await consumer_ids(client, "interop_cpp_producer_group") == []
            # The captured GET_CONSUMER_LIST_BY_GROUP, as ali-ons sent it.
            reply = await client.request(capture("ali-ons-13-10911-code38.hex").decode())
            body = GetConsumerListByGroupResponseBody.from_json(reply.body)
            assert body.consumer_id_list == ("127.0.0.1@10743",)


async def test_membership_changes_notify_the_other_members(tmp_path: Path) -> None:
    group = "interop_cpp_consumer_group"
    first_id, second_id = "11064-127.0.0.1@DEFAULT", "127.0.0.1@11452#DEFAULT"
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path) as broker,
            open_client(broker.port) as first,
            open_client(broker.port) as second,
            open_client(broker.port) as third,
        ):
            # client-cpp 1.x joins (and is told, like every member, that the group changed).
            reply = await first.request(capture("cpp-client-09-10911-code34.hex").decode())
            assert reply.code == ResponseCode.SUCCESS
            await first.wait_notifications(1)
            # client-cpp 2.1 joins the same group: the first member is notified.
            reply = await second.request(capture("cpp21-client-08-10911-code34.hex").decode())
            assert reply.code == ResponseCode.SUCCESS
            await first.wait_notifications(2)
            notice = first.notifications[-1]
            assert notice.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
            assert notice.flag & FLAG_ONEWAY and not notice.flag & FLAG_RESPONSE
            assert notice.ext_fields["consumerGroup"] == group
            assert sorted(await consumer_ids(first, group)) == sorted([first_id, second_id])
            # A repeated heartbeat from a known member is not a change.
            seen = len(first.notifications)
            reply = await second.request(capture("cpp21-client-08-10911-code34.hex").decode())
            assert reply.code == ResponseCode.SUCCESS

            # A third member joins, then unregisters: the others hear of both.
            body = heartbeat_body("third@1", group)
            assert (await third.call(RequestCode.HEART_BEAT, body=body)).code == 0
            await first.wait_notifications(seen + 1)
            await second.wait_notifications(2)
            assert len(first.notifications) == seen + 1  # the repeat did not notify
            reply = await third.call(
                RequestCode.UNREGISTER_CLIENT, {"clientID": "third@1", "consumerGroup": group}
            )
            assert reply.code == ResponseCode.SUCCESS
            await first.wait_notifications(seen + 2)
            await second.wait_notifications(3)
            assert sorted(await consumer_ids(first, group)) == sorted([first_id, second_id])

            # client-cpp 2.1 never unregisters: closing its connection is leaving.
            await second.stream.aclose()
            await first.wait_notifications(seen + 3)
            assert first.notifications[-1].ext_fields["consumerGroup"] == group
            assert await consumer_ids(first, group) == [first_id]
            await trio.sleep(0.05)
            assert len(first.notifications) == seen + 3 == 5
            assert all(
                n.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED for n in first.notifications
            )


async def test_oneway_requests_get_no_reply_but_take_effect(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            body = heartbeat_body("oneway@1", "oneway_group")
            beat = request(RequestCode.HEART_BEAT, 501, body=body, oneway=True)
            route = request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, 502, {"topic": "TBW102"}, oneway=True
            )
            unknown = request(9999, 503, oneway=True)
            for cmd in (beat, route, unknown):
                await client.send(cmd)
            assert await consumer_ids(client, "oneway_group") == ["oneway@1"]
            await assert_usable(client)
            await trio.sleep(0.1)
            assert not any(client.has_reply(o) for o in (501, 502, 503))


# ---------------------------------------------------------------- many requests, all clients
async def test_pipelined_requests_on_one_connection_are_all_answered(tmp_path: Path) -> None:
    count = 200
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            opaques = [client.next_opaque() for _ in range(count)]
            frames = [
                encode_command(
                    RemotingCommand(
                        code=RequestCode.SEND_MESSAGE_V2,
                        opaque=opaque,
                        ext_fields=send_header("Piped", queue_id=2).to_v2_ext(),
                        body=b"m%d" % i,
                    )
                )
                for i, opaque in enumerate(opaques)
            ]
            await client.send_raw(b"".join(frames))  # all in flight before any reply
            replies = [await client.reply(opaque) for opaque in opaques]
            queue_offsets = sorted(sent(reply).queue_offset for reply in replies)
            assert queue_offsets == list(range(count))
            assert broker.broker.store.max_offset("Piped", 2) == count


#: What a request from a captured client may be answered with, by request code. Codes other
#: helpers are still adding answer REQUEST_CODE_NOT_SUPPORTED until they exist.
_ACCEPTABLE = {
    RequestCode.GET_ROUTEINFO_BY_TOPIC: {ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST},
    RequestCode.SEND_MESSAGE: {ResponseCode.SUCCESS},
    RequestCode.SEND_MESSAGE_V2: {ResponseCode.SUCCESS},
    RequestCode.HEART_BEAT: {ResponseCode.SUCCESS},
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: {ResponseCode.SUCCESS},
    RequestCode.UNREGISTER_CLIENT: {ResponseCode.SUCCESS},
    RequestCode.QUERY_CONSUMER_OFFSET: {
        ResponseCode.SUCCESS,
        ResponseCode.QUERY_NOT_FOUND,
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
    },
    RequestCode.UPDATE_CONSUMER_OFFSET: {
        ResponseCode.SUCCESS,
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
    },
    RequestCode.PULL_MESSAGE: {
        ResponseCode.SUCCESS,
        ResponseCode.PULL_NOT_FOUND,
        ResponseCode.PULL_RETRY_IMMEDIATELY,
        ResponseCode.PULL_OFFSET_MOVED,
        ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
    },
}


async def test_every_captured_request_is_answered_on_its_opaque(tmp_path: Path) -> None:
    by_client: dict[str, list[Capture]] = defaultdict(list)
    for cap in all_captures():
        if not cap.is_response:
            by_client[cap.client].append(cap)
    assert len(by_client) >= 3
    # Pulls of empty queues are held at most suspend_max_ms.
    async with open_broker(tmp_path, suspend_max_ms=200) as broker:
        with trio.fail_after(30):
            for caps in by_client.values():
                async with open_client(broker.port) as client:
                    # Byte for byte, in the order the client sent them, one at a time (some
                    # captures share an opaque).
                    for cap in caps:
                        cmd = cap.decode()
                        await client.send_raw(cap.raw)
                        reply = await client.reply(cmd.opaque)
                        assert reply.flag & FLAG_RESPONSE
                        assert reply.serialize_type is SerializeType.JSON
                        assert reply.code != ResponseCode.SYSTEM_ERROR, (cap.path.name, reply)
                        expected = _ACCEPTABLE.get(RequestCode(cmd.code))
                        assert expected is not None, cap.path.name
                        assert reply.code in expected, (cap.path.name, reply.code, reply.remark)
            async with open_client(broker.port) as client:
                await assert_usable(client)
            store = broker.broker.store
            assert sum(store.max_offset("InteropTopic", q) for q in range(4)) >= 3


@pytest.mark.parametrize(
    "serialize_type", [SerializeType.JSON, SerializeType.ROCKETMQ, SerializeType.MSGPACK]
)
async def test_replies_use_the_serialize_type_of_the_request(
    tmp_path: Path, serialize_type: SerializeType
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            cmd = request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC,
                0,
                {"topic": "TBW102"},
                serialize_type=serialize_type,
            )
            reply = await client.request(cmd)
            assert reply.code == ResponseCode.SUCCESS
            assert reply.serialize_type is serialize_type
            reply = await client.request(
                send_v1(send_header("Typed")).with_serialize_type(serialize_type)
            )
            assert reply.serialize_type is serialize_type
            assert sent(reply).queue_offset == 0


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("code", [9999, RequestCode.PUT_KV_CONFIG])
async def test_unknown_request_codes_are_not_supported(tmp_path: Path, code: int) -> None:
    assert code not in build_registry().handlers
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            reply = await client.call(code, {"topic": "T"})
            assert reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            assert str(code) in (reply.remark or "")
            await assert_usable(client)


async def test_malformed_json_headers_are_answered_and_the_connection_kept(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            # The opaque can be recovered: the reply goes to it.
            for opaque, header in [
                (71, {"code": 105, "opaque": 71, "flag": "not a number"}),
                (72, {"opaque": 72, "flag": 0}),  # no code
                (73, {"code": 105, "opaque": 73, "remark": 5}),
                (74, {"code": 105, "opaque": 74, "extFields": ["not", "a", "map"]}),
            ]:
                await client.send_raw(raw_frame(json.dumps(header).encode()))
                reply = await client.reply(opaque)
                assert reply.code == ResponseCode.INVALID_PARAMETER
                assert reply.flag & FLAG_RESPONSE
                assert reply.remark
            # Not JSON at all: nothing to answer, but the stream is still in sync.
            await client.send_raw(raw_frame(b'{"code":105,"opaque":75,'))
            await client.send_raw(raw_frame(b"\xff\xfe not utf-8"))
            await assert_usable(client)
            assert not client.has_reply(75)
            assert not client.closed.is_set()


async def test_header_fields_of_the_wrong_type_name_the_field(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            ext = send_header("Typed").to_ext()
            ext["queueId"] = "abc"
            reply = await client.call(RequestCode.SEND_MESSAGE, ext, b"x")
            assert reply.code == ResponseCode.INVALID_PARAMETER
            assert "queueId" in (reply.remark or "") and "abc" in (reply.remark or "")

            v2 = send_header("Typed").to_v2_ext()
            v2["e"] = "abc"
            reply = await client.call(RequestCode.SEND_MESSAGE_V2, v2, b"x")
            assert reply.code == ResponseCode.INVALID_PARAMETER
            assert "abc" in (reply.remark or "")
            assert "'e'" in (reply.remark or "") or "queueId" in (reply.remark or "")

            del v2["b"]  # the topic
            v2["e"] = "0"
            reply = await client.call(RequestCode.SEND_MESSAGE_V2, v2, b"x")
            assert reply.code == ResponseCode.INVALID_PARAMETER
            assert "topic" in (reply.remark or "")

            reply = await client.call(RequestCode.HEART_BEAT, body=b"{not json")
            assert reply.code == ResponseCode.INVALID_PARAMETER

            assert broker.broker.store.max_offset("Typed", 0) == 0
            await assert_usable(client)


async def test_oversize_frame_is_answered_and_skipped(tmp_path: Path) -> None:
    limit = 4096
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path, max_frame_size=limit) as broker,
            open_client(broker.port) as client,
        ):
            big = send_v2(send_header("Big"), b"x" * (3 * limit))
            reply = await client.request(big, opaque=81)
            assert reply.code == ResponseCode.MESSAGE_ILLEGAL
            assert str(limit) in (reply.remark or "")
            # The rest of the frame was skipped: the next request in the same write works.
            small = send_v2(send_header("Big"), b"small")
            frames = encode_command(
                RemotingCommand(code=big.code, opaque=82, ext_fields=big.ext_fields, body=big.body)
            ) + encode_command(
                RemotingCommand(
                    code=small.code, opaque=83, ext_fields=small.ext_fields, body=small.body
                )
            )
            await client.send_raw(frames)
            assert (await client.reply(82)).code == ResponseCode.MESSAGE_ILLEGAL
            assert sent(await client.reply(83)).queue_offset == 0
            assert broker.broker.store.max_offset("Big", 0) == 1
            await assert_usable(client)


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
        struct.pack(">II", 2, 0),  # length shorter than the type/header-length word
        struct.pack(">II", 10, 20) + b"x" * 10,  # header longer than the frame
    ],
)
async def test_garbage_closes_that_connection_only(tmp_path: Path, garbage: bytes) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path) as broker,
            open_client(broker.port) as bad,
            open_client(broker.port) as good,
        ):
            await assert_usable(good)
            await bad.send_raw(garbage)
            await bad.wait_closed()
            assert bad.error is None
            await assert_usable(good)
            async with open_client(broker.port) as fresh:
                await assert_usable(fresh)
            # The broker's per-connection clean-up ran (it exposes a counter, not an event).
            with trio.fail_after(2):
                while broker.statistics().remoting.connections != 1:  # noqa: ASYNC110
                    await trio.sleep(0.01)


# ---------------------------------------------------------------- the server over memory streams
#: Request codes of the fake dispatcher: one parks until released, one answers at once.
PARK, QUICK, HOG = 9001, 9002, 9003


class FakeDispatcher:
    """Answers every request with its code in the remark; PARK waits for ``release``."""

    def __init__(
        self, queue_bound_s: float = math.inf, hog: Callable[[], object] = lambda: None
    ) -> None:
        self.release = trio.Event()
        self.closed: list[Connection] = []
        self.shortest_queue_bound_s = queue_bound_s
        self.hog = hog

    async def dispatch(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.code == PARK:
            await self.release.wait()
        elif cmd.code == HOG:
            self.hog()  # holds the event loop without a checkpoint (a CPU-bound burst)
        return None if cmd.is_oneway else cmd.response(remark=f"code {cmd.code}")

    def may_wait(self, code: int) -> bool:
        return code == PARK

    def answer_now(self, conn: Connection, cmd: RemotingCommand) -> RemotingCommand | Later | None:
        return LATER

    grouped: frozenset[int] = frozenset()

    def answer_group(
        self, conn: Connection, cmds: Sequence[RemotingCommand]
    ) -> list[RemotingCommand | None]:
        raise AssertionError("no grouped codes")

    durable_grouped: frozenset[int] = frozenset()

    def store_group(
        self, conn: Connection, cmds: Sequence[RemotingCommand]
    ) -> tuple[int, Coroutine[Any, Any, list[RemotingCommand | None]]]:
        raise AssertionError("no durable grouped codes")

    def queue_bound_s(self, code: int) -> float:
        return self.shortest_queue_bound_s

    def connection_closed(self, conn: Connection) -> None:
        self.closed.append(conn)


@asynccontextmanager
async def memory_server(
    dispatcher: Dispatcher, state: ServerState, limits: ServerLimits | None = None
) -> AsyncIterator[BrokerClient]:
    """``handle_stream`` on one end of a memory stream pair, the test client on the other;
    the client's close (EOF) ends the server's side too."""
    client_end, server_end = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle_stream, dispatcher, limits or ServerLimits(), state, server_end)
        await trio.testing.wait_all_tasks_blocked()  # the server has taken its connection
        async with attach_client(client_end) as client:
            yield client


async def test_memory_stream_parked_quick_malformed_and_oneway_requests(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dispatcher, state = FakeDispatcher(), ServerState()
    async with memory_server(dispatcher, state) as client:
        parked = client.next_opaque()
        await client.send(request(PARK, parked))
        # The parked request has a task of its own: the next one is answered meanwhile.
        assert (await client.call(QUICK)).remark == f"code {QUICK}"
        assert not client.has_reply(parked)
        assert (state.statistics().in_flight, state.connections) == (1, 1)
        with trio.move_on_after(1) as waited:
            await state.wait_drained()
        assert waited.cancelled_caught
        dispatcher.release.set()
        with trio.fail_after(1):
            await state.wait_drained()
        assert (await client.reply(parked)).remark == f"code {PARK}"
        # Malformed input is answered on its opaque; oneway requests run but get nothing.
        await client.send_raw(raw_frame(b'{"code":105,"opaque":71,"flag":"x"}'))
        assert (await client.reply(71)).code == ResponseCode.INVALID_PARAMETER
        await client.send(request(QUICK, 72, oneway=True))
        assert (await client.call(QUICK)).code == ResponseCode.SUCCESS
        assert not client.has_reply(72)
    assert state.statistics() == ServerStatistics(
        connections=0, accepted=1, refused=0, in_flight=0, requests=4, malformed=1,
        broken_framing=0, unsent=0,
    )  # fmt: skip
    assert len(dispatcher.closed) == 1 and dispatcher.closed[0].closed


async def test_memory_stream_drain_waits_for_a_reply_the_client_has_not_read(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_end, server_end = trio.testing.lockstep_stream_pair()  # send_all waits for a read
    state = ServerState()
    protocol = RemotingConnection(Role.CLIENT)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handle_stream, FakeDispatcher(), ServerLimits(), state, server_end)
        opaque, data = protocol.send_request(request(QUICK, 0))
        await client_end.send_all(data)
        await trio.testing.wait_all_tasks_blocked()
        assert not state.drained()
        with trio.move_on_after(1) as waited:
            await state.wait_drained()
        assert waited.cancelled_caught
        nursery.start_soon(state.wait_drained)
        protocol.receive_data(await client_end.receive_some())
        assert protocol.next_event() == Response(
            RemotingCommand(code=0, opaque=opaque, flag=FLAG_RESPONSE, remark=f"code {QUICK}")
        )
        with trio.fail_after(1):
            await state.wait_drained()
        await client_end.aclose()


async def test_memory_stream_connections_over_the_limit_are_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    state = ServerState()
    async with memory_server(FakeDispatcher(), state, ServerLimits(max_connections=1)) as first:
        client_end, server_end = trio.testing.memory_stream_pair()
        await handle_stream(FakeDispatcher(), ServerLimits(max_connections=1), state, server_end)
        assert await client_end.receive_some() == b""  # closed at once
        assert (await first.call(QUICK)).code == ResponseCode.SUCCESS
        assert state.statistics().refused == 1 and state.connections == 1


async def test_memory_stream_broken_framing_closes_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dispatcher, state = FakeDispatcher(), ServerState()
    async with memory_server(dispatcher, state) as client:
        await client.send_raw(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await client.wait_closed()
        assert client.error is None
        assert state.statistics().broken_framing == 1
        assert state.connections == 0 and len(dispatcher.closed) == 1


async def test_memory_stream_a_client_gone_mid_write_ends_only_its_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    client_end, server_end = trio.testing.memory_stream_pair()
    protocol = RemotingConnection(Role.CLIENT)
    await client_end.send_all(b"".join(protocol.send_request(request(QUICK, 0))[1] for _ in "abc"))
    await client_end.aclose()
    state = ServerState()
    # The writer's send fails (BrokenResourceError, inside the connection's nursery): the
    # handler ends quietly instead of taking the server down.
    await handle_stream(FakeDispatcher(), ServerLimits(), state, server_end)
    stats = state.statistics()
    assert (stats.connections, stats.requests, stats.in_flight, stats.unsent) == (0, 3, 0, 0)


# ---------------------------------------------------------------- system topics
@pytest.mark.parametrize(
    "topic",
    ["TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_TIMER_RECALL",
     "%DLQ%some_group", "%RETRY%g+SomeTopic"],
)  # fmt: skip
async def test_producers_cannot_write_system_dead_letter_or_pop_retry_topics(
    tmp_path: Path, topic: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
            for build in (send_v1, send_v2):
                reply = await client.request(build(send_header(topic)))
                assert reply.code == ResponseCode.NO_PERMISSION, (topic, reply.remark)
                assert "forbidden" in (reply.remark or "")
            batch = encode_batch([BatchEntry(b"x", {UNIQ_KEY: "b1"})])
            header = send_header(topic)
            cmd = request(RequestCode.SEND_BATCH_MESSAGE, 0, header.to_v2_ext(), batch)
            assert (await client.request(cmd)).code == ResponseCode.NO_PERMISSION
            assert broker.broker.store.max_offset(topic, 0) == 0
            # The connection goes on; the trace topic and a classic retry topic stay open.
            for allowed in ("RMQ_SYS_TRACE_TOPIC", "%RETRY%some_group"):
                sent(await client.request(send_v2(send_header(allowed))))


# ---------------------------------------------------------------- per-connection limits
async def test_memory_stream_waiting_requests_are_capped_per_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dispatcher, state = FakeDispatcher(), ServerState()
    limits = ServerLimits(max_waiting_per_connection=2)
    async with memory_server(dispatcher, state, limits) as client:
        parked = [client.next_opaque() for _ in range(2)]
        for opaque in parked:
            await client.send(request(PARK, opaque))
        # The third waits for nothing: SYSTEM_BUSY at once, never an empty-poll answer.
        busy = await client.call(PARK)
        assert busy.code == ResponseCode.SYSTEM_BUSY and "limit 2" in (busy.remark or "")
        assert (await client.call(QUICK)).code == ResponseCode.SUCCESS  # quick ones still run
        async with memory_server(dispatcher, state, limits) as other:
            other_opaque = other.next_opaque()
            await other.send(request(PARK, other_opaque))  # another connection's own budget
            await trio.testing.wait_all_tasks_blocked()
            assert not other.has_reply(other_opaque)
            dispatcher.release.set()  # every parked one is answered: the slots free
            assert (await other.reply(other_opaque)).code == ResponseCode.SUCCESS
        for opaque in parked:
            assert (await client.reply(opaque)).code == ResponseCode.SUCCESS
        assert (await client.call(PARK)).code == ResponseCode.SUCCESS
    assert state.statistics().busy == 1


async def test_memory_stream_idle_connections_are_closed_unless_something_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dispatcher, state = FakeDispatcher(), ServerState()
    limits = ServerLimits(idle_timeout_s=120)
    async with memory_server(dispatcher, state, limits) as client:
        # A parked poll keeps its connection: never idle while something waits.
        parked = client.next_opaque()
        await client.send(request(PARK, parked))
        await trio.sleep(300)
        assert not client.closed.is_set()
        dispatcher.release.set()
        assert (await client.reply(parked)).code == ResponseCode.SUCCESS
        # Traffic keeps it too; silence past the timeout closes it (between 120 and 125 s).
        await trio.sleep(100)
        assert (await client.call(QUICK)).code == ResponseCode.SUCCESS
        silent_from = trio.current_time()
        with trio.fail_after(200):
            await client.closed.wait()
        assert 120 <= trio.current_time() - silent_from <= 125
    assert state.statistics().idle_closed == 1


async def test_memory_stream_requests_that_waited_in_line_too_long_are_shed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # HOG takes the event loop for 1 s of (mock) time; the bound is 0.5 s.
    dispatcher = FakeDispatcher(0.5, hog=lambda: autojump_clock.jump(1))
    state = ServerState()
    async with memory_server(dispatcher, state) as client:
        # Behind HOG in the same read: the quick and the parking request are both late.
        opaques = [client.next_opaque() for _ in range(3)]
        burst = [request(HOG, opaques[0]), request(QUICK, opaques[1]), request(PARK, opaques[2])]
        await client.send_raw(b"".join(encode_command(c) for c in burst))
        assert (await client.reply(opaques[0])).code == ResponseCode.SUCCESS
        for opaque in opaques[1:]:
            shed = await client.reply(opaque)
            assert shed.code == ResponseCode.SYSTEM_BUSY
            assert "[TIMEOUT_CLEAN_QUEUE]" in (shed.remark or "")
            assert "period in queue: 1000ms, limit 500ms" in (shed.remark or "")
        # A parked request whose task could start only after HOG: shed in its task.
        parked, hog = client.next_opaque(), client.next_opaque()
        burst = [request(PARK, parked), request(HOG, hog)]
        await client.send_raw(b"".join(encode_command(c) for c in burst))
        assert (await client.reply(parked)).code == ResponseCode.SYSTEM_BUSY
        # Nothing is stuck: the next read runs normally.
        assert (await client.call(QUICK)).code == ResponseCode.SUCCESS
        assert state.statistics().in_flight == 0
    assert state.statistics().shed == 3


async def test_connections_per_source_address_are_capped(tmp_path: Path) -> None:
    async with open_broker(tmp_path, max_connections_per_ip=2) as broker:
        async with open_client(broker.port) as first, open_client(broker.port) as second:
            # The third from 127.0.0.1 is closed at once; the two keep working.
            async with open_client(broker.port) as third:
                with trio.fail_after(5):
                    await third.closed.wait()
            await assert_usable(first)
            await assert_usable(second)
            stats = broker.statistics().remoting
            assert (stats.refused_per_ip, stats.connections) == (1, 2)
        # Their slots are free again once they close.
        with trio.fail_after(5):
            while broker.statistics().remoting.connections:  # noqa: ASYNC110
                await trio.sleep(0.01)
        async with open_client(broker.port) as a, open_client(broker.port) as b:
            await assert_usable(a)
            await assert_usable(b)


async def test_a_client_that_never_reads_is_held_back_and_stalls_nobody(tmp_path: Path) -> None:
    """A client floods 1 KiB x 32 pulls and reads nothing: the broker stops reading it once
    its bounded reply queue is full (frames unsent stay bounded, so memory does), and
    another client is served meanwhile."""
    topic = "flooded"
    async with open_broker(tmp_path) as broker, open_client(broker.port) as client:
        for _ in range(32):
            sent_ok = await client.request(send_v2(send_header(topic), b"x" * 1024))
            assert sent_ok.code == ResponseCode.SUCCESS, sent_ok.remark
        # Ten 32-message pulls (~330 KiB of replies) per write.
        pulls = b"".join(encode_command(pull_request(0, topic=topic, opaque=o)) for o in range(10))
        flooder = await trio.open_tcp_stream("127.0.0.1", broker.port)
        sent = 0

        async def flood() -> None:
            nonlocal sent
            for _ in range(4000):  # 40,000 pulls (~1.3 GB of replies) if nothing held it back
                await flooder.send_all(pulls)
                sent += 1

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                # Wait until the flood is stuck: the broker no longer reads it.
                last, still_since = -1, trio.current_time()
                while trio.current_time() - still_since < 1.0:  # bounded by fail_after
                    await trio.sleep(0.05)
                    if sent != last:
                        last, still_since = sent, trio.current_time()
                assert sent < 4000
                stats = broker.statistics().remoting
                # The writer's queue and the batch it is writing, the reader's held
                # replies, and one reply per waiting task.
                assert stats.unsent <= 256 + 128 + 16 + 64, stats
                with trio.fail_after(2):
                    await assert_usable(client)
                nursery.cancel_scope.cancel()
        await trio.aclose_forcefully(flooder)
        with trio.fail_after(10):
            while broker.statistics().remoting.connections != 1:  # noqa: ASYNC110
                await trio.sleep(0.01)


async def test_unread_reply_bytes_past_the_cap_refuse_long_polls_busy(tmp_path: Path) -> None:
    """A consumer that pulls large batches and reads nothing: once 64 KiB of replies sit
    unsent on its connection, its next pulls are answered SYSTEM_BUSY (naming the bytes)
    instead of adding another ~33 KiB each; when it reads again, everything it asked for is
    answered and pulls work again."""
    topic = "bytes_capped"
    async with (
        open_broker(tmp_path, max_unsent_bytes_per_connection=64 * 1024) as broker,
        open_client(broker.port) as client,
    ):
        for _ in range(32):
            sent_ok = await client.request(send_v2(send_header(topic), b"x" * 1024))
            assert sent_ok.code == ResponseCode.SUCCESS, sent_ok.remark
        pulls = 3000  # ~100 MB of replies if nothing held them back
        frames = [encode_command(pull_request(0, topic=topic, opaque=o)) for o in range(pulls)]
        flooder = await trio.open_tcp_stream("127.0.0.1", broker.port)
        sent = 0

        async def flood() -> None:
            nonlocal sent
            for start in range(0, pulls, 50):
                await flooder.send_all(b"".join(frames[start : start + 50]))
                sent = start + 50

        codes: dict[int, int] = defaultdict(int)
        remarks: set[str] = set()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                # Until the broker stops reading the flooder (bounded by fail_after).
                last, still_since = -1, trio.current_time()
                while trio.current_time() - still_since < 1.0:
                    await trio.sleep(0.05)
                    if sent != last:
                        last, still_since = sent, trio.current_time()
                # Now read every reply: the flood goes on and ends.
                reader = RemotingConnection(Role.CLIENT)
                answered = 0
                while answered < pulls:
                    data = await flooder.receive_some(1 << 20)
                    assert data, "the broker closed the flooding connection"
                    reader.receive_data(data)
                    # Answers to opaques this protocol object never sent: "unsolicited".
                    while isinstance(event := reader.next_event(), UnsolicitedResponse):
                        answered += 1
                        codes[event.command.code] += 1
                        if event.command.code == ResponseCode.SYSTEM_BUSY:
                            remarks.add(event.command.remark or "")
        assert codes[ResponseCode.SUCCESS] > 0
        assert codes[ResponseCode.SYSTEM_BUSY] > 0, codes
        assert any("bytes of replies to this connection are unread" in r for r in remarks)
        assert broker.statistics().remoting.busy == codes[ResponseCode.SYSTEM_BUSY]
        # The connection is usable again once read.
        await flooder.send_all(encode_command(pull_request(0, topic=topic, opaque=pulls)))
        reader.receive_data(await flooder.receive_some(1 << 20))
        with trio.fail_after(TIMEOUT):
            while not isinstance(event := reader.next_event(), UnsolicitedResponse):
                reader.receive_data(await flooder.receive_some(1 << 20))
        assert event.command.code == ResponseCode.SUCCESS
        await flooder.aclose()
