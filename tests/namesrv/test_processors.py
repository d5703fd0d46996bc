"""The name server's requests over TCP (in-process on 127.0.0.1:0), one client at a time."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest
import trio

from protocol.bodies.broker import (
    DataVersion,
    RegisterBrokerBody,
    TopicConfig,
    TopicConfigSerializeWrapper,
)
from protocol.bodies.namesrv import KVTable, body_crc32, encode_register_body
from protocol.bodies.route import ClusterInfo, TopicList, TopicRouteData
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.route import (
    GetKVConfigResponseHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)
from tests.broker.client import BrokerClient, open_client
from tests.namesrv.support import open_namesrv

pytestmark = pytest.mark.integration

ADDR = "127.0.0.1:10911"


def register_ext(
    body: bytes, *, compressed: bool = False, crc: int | None = None, broker_id: int = 0
) -> dict[str, str]:
    return RegisterBrokerRequestHeader(
        broker_name="broker-a", broker_addr=ADDR if broker_id == 0 else "127.0.0.1:10921",
        cluster_name="DefaultCluster", ha_server_addr="127.0.0.1:10912", broker_id=broker_id,
        compressed=compressed, body_crc32=body_crc32(body) if crc is None else crc,
    ).to_ext()  # fmt: skip


def register_body(*topics: str, compressed: bool = False) -> bytes:
    table = {t: TopicConfig(t, read_queue_nums=4, write_queue_nums=4) for t in topics}
    wrapper = TopicConfigSerializeWrapper(table, DataVersion(1, 1))
    return encode_register_body(RegisterBrokerBody(wrapper), compressed=compressed)


async def register(client: BrokerClient, *topics: str, compressed: bool = False) -> None:
    body = register_body(*topics, compressed=compressed)
    reply = await client.call(
        RequestCode.REGISTER_BROKER, register_ext(body, compressed=compressed), body
    )
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def test_register_route_cluster_topics_and_unregister() -> None:
    with trio.fail_after(10):
        async with open_namesrv() as ns, open_client(ns.port) as client:
            missing = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"})
            assert missing.code == ResponseCode.TOPIC_NOT_EXIST
            assert "No topic route info in name server for the topic: T1" in (missing.remark or "")
            await register(client, "T1", "TBW102")
            reply = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"})
            assert reply.code == ResponseCode.SUCCESS
            # Exactly the shape real 4.x clients accepted (reference/wire-facts.md).
            assert reply.body == (
                b'{"orderTopicConf":null,"queueDatas":[{"brokerName":"broker-a",'
                b'"readQueueNums":4,"writeQueueNums":4,"perm":6,"topicSysFlag":0}],'
                b'"brokerDatas":[{"cluster":"DefaultCluster","brokerName":"broker-a",'
                b'"brokerAddrs":{"0":"127.0.0.1:10911"}}],"filterServerTable":{}}'
            )
            info = ClusterInfo.from_json(
                (await client.call(RequestCode.GET_BROKER_CLUSTER_INFO)).body
            )
            assert info.cluster_addr_table == {"DefaultCluster": ("broker-a",)}
            assert info.broker_addr_table["broker-a"].master_addr == ADDR
            listed = await client.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
            assert TopicList.from_json(listed.body).topic_list == ("T1", "TBW102")
            by_cluster = await client.call(
                RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "DefaultCluster"}
            )
            assert TopicList.from_json(by_cluster.body).topic_list == ("T1", "TBW102")
            header = UnRegisterBrokerRequestHeader(
                broker_name="broker-a", broker_addr=ADDR, cluster_name="DefaultCluster",
                broker_id=0,
            )  # fmt: skip
            gone = await client.call(RequestCode.UNREGISTER_BROKER, header.to_ext())
            assert gone.code == ResponseCode.SUCCESS
            again = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"})
            assert again.code == ResponseCode.TOPIC_NOT_EXIST


async def test_compressed_registration_and_a_slave_learning_its_master() -> None:
    with trio.fail_after(10):
        async with open_namesrv() as ns, open_client(ns.port) as client:
            await register(client, "Zipped", compressed=True)
            route = TopicRouteData.from_json(
                (await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Zipped"})).body
            )
            assert route.queue_datas[0].write_queue_nums == 4
            body = register_body("Zipped")
            reply = await client.call(
                RequestCode.REGISTER_BROKER, register_ext(body, broker_id=1), body
            )
            answer = RegisterBrokerResponseHeader.from_ext(reply.ext_fields)
            assert (answer.master_addr, answer.ha_server_addr) == (ADDR, "127.0.0.1:10912")


async def test_kv_config() -> None:
    ns_key = {"namespace": "ORDER_TOPIC_CONFIG", "key": "Ordered"}
    with trio.fail_after(10):
        async with open_namesrv() as ns, open_client(ns.port) as client:
            absent = await client.call(RequestCode.GET_KV_CONFIG, ns_key)
            assert absent.code == ResponseCode.QUERY_NOT_FOUND
            listed = await client.call(
                RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"}
            )
            assert listed.code == ResponseCode.QUERY_NOT_FOUND
            put = await client.call(RequestCode.PUT_KV_CONFIG, {**ns_key, "value": "broker-a:4"})
            assert put.code == ResponseCode.SUCCESS
            got = await client.call(RequestCode.GET_KV_CONFIG, ns_key)
            assert GetKVConfigResponseHeader.from_ext(got.ext_fields).value == "broker-a:4"
            listed = await client.call(
                RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ORDER_TOPIC_CONFIG"}
            )
            assert KVTable.from_json(listed.body).table == {"Ordered": "broker-a:4"}
            # The order configuration rides on the topic's route.
            await register(client, "Ordered")
            route = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Ordered"})
            assert TopicRouteData.from_json(route.body).order_topic_conf == "broker-a:4"
            deleted = await client.call(RequestCode.DELETE_KV_CONFIG, ns_key)
            assert deleted.code == ResponseCode.SUCCESS
            absent = await client.call(RequestCode.GET_KV_CONFIG, ns_key)
            assert absent.code == ResponseCode.QUERY_NOT_FOUND


async def test_kv_config_survives_a_restart_when_it_has_a_file(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    ns_key = {"namespace": "ns", "key": "k"}
    with trio.fail_after(10):
        async with open_namesrv(kv_config_path=path) as ns, open_client(ns.port) as client:
            await client.call(RequestCode.PUT_KV_CONFIG, {**ns_key, "value": "v"})
        async with open_namesrv(kv_config_path=path) as ns, open_client(ns.port) as client:
            got = await client.call(RequestCode.GET_KV_CONFIG, ns_key)
            assert GetKVConfigResponseHeader.from_ext(got.ext_fields).value == "v"


async def test_bad_requests_get_clear_errors_and_the_connection_stays() -> None:
    good = register_body("T1")
    with trio.fail_after(10):
        async with open_namesrv() as ns, open_client(ns.port) as client:
            cases = [
                (RequestCode.REGISTER_BROKER, register_ext(b"{]"), b"{]",
                 ResponseCode.INVALID_PARAMETER, "not JSON"),
                (RequestCode.REGISTER_BROKER, register_ext(good, crc=12345), good,
                 ResponseCode.SYSTEM_ERROR, "crc32 not match"),
                (RequestCode.REGISTER_BROKER, register_ext(b"x", compressed=True), b"x",
                 ResponseCode.INVALID_PARAMETER, "compressed body"),
                (RequestCode.REGISTER_BROKER, {"brokerName": "b"}, b"",
                 ResponseCode.INVALID_PARAMETER, "brokerAddr"),
                (RequestCode.GET_ROUTEINFO_BY_TOPIC, {}, b"",
                 ResponseCode.INVALID_PARAMETER, "topic"),
                (RequestCode.PUT_KV_CONFIG, {"namespace": "", "key": "k", "value": "v"}, b"",
                 ResponseCode.INVALID_PARAMETER, "namespace"),
                (RequestCode.SEND_MESSAGE, {}, b"",
                 ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "not supported"),
            ]  # fmt: skip
            for code, ext, body, want, words in cases:
                reply = await client.call(code, ext, body)
                assert (reply.code, words in (reply.remark or "")) == (want, True), reply.remark
            bomb = zlib.compress(b"\0" * (ns.ctx.config.max_frame_size + 1))
            reply = await client.call(
                RequestCode.REGISTER_BROKER, register_ext(bomb, compressed=True), bomb
            )
            assert reply.code == ResponseCode.INVALID_PARAMETER and "beyond" in (reply.remark or "")
            # A frame whose header is not JSON: answered, then the connection still works.
            header = b'{"code":106,"opaque":77,"flag":"not a number"}'
            await client.send_raw(struct.pack(">II", 4 + len(header), len(header)) + header)
            assert (await client.reply(77)).code == ResponseCode.INVALID_PARAMETER
            info = await client.call(RequestCode.GET_BROKER_CLUSTER_INFO)
            assert info.code == ResponseCode.SUCCESS
            assert ns.ctx.routes.live() == {}
