"""The name server's processors behind the shared Remoting server, over a memory stream (no
socket, mock clock): the same ``handle_stream`` the broker runs."""

from __future__ import annotations

import struct

import trio
import trio.testing

from broker.namesrv.config import NamesrvConfig
from broker.namesrv.context import NamesrvContext
from broker.namesrv.processors import NAMESRV
from broker.namesrv.routes import RouteTable
from broker.remoting.server import BoundRegistry, ServerLimits, handle_stream
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.route import GetKVConfigResponseHeader
from tests.broker.client import attach_client


async def test_name_server_requests_over_a_memory_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ctx = NamesrvContext(NamesrvConfig(), RouteTable())
    client_end, server_end = trio.testing.memory_stream_pair()
    ns_key = {"namespace": "ns", "key": "k"}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            handle_stream, BoundRegistry(NAMESRV, ctx), ServerLimits.of(ctx.config), ctx.server,
            server_end,
        )  # fmt: skip
        async with attach_client(client_end) as client:
            put = await client.call(RequestCode.PUT_KV_CONFIG, {**ns_key, "value": "v"})
            assert put.code == ResponseCode.SUCCESS
            got = await client.call(RequestCode.GET_KV_CONFIG, ns_key)
            assert GetKVConfigResponseHeader.from_ext(got.ext_fields).value == "v"
            route = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"})
            assert route.code == ResponseCode.TOPIC_NOT_EXIST
            unknown = await client.call(RequestCode.SEND_MESSAGE)
            assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            header = b'{"code":106,"opaque":77,"flag":"not a number"}'
            await client.send_raw(struct.pack(">II", 4 + len(header), len(header)) + header)
            assert (await client.reply(77)).code == ResponseCode.INVALID_PARAMETER
            assert ctx.server.connections == 1
    stats = ctx.server.statistics()
    assert (stats.connections, stats.accepted, stats.requests, stats.malformed) == (0, 1, 4, 1)
