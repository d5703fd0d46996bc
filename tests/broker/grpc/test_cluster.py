"""gRPC routes in a cluster: a name server and two brokers, each with its gRPC front end.

Each broker puts its gRPC endpoint into the name server's KV config when it registers; a
QueryRoute or QueryAssignment on either broker then lists every broker's queues at that
broker's own endpoint, as the official clients need (they talk to each queue's broker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.bodies.admin import KVTable
from protocol.codes import RequestCode, ResponseCode
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.headers.route import GetKVListByNamespaceRequestHeader
from tests.broker.client import open_broker, open_client
from tests.broker.grpc.client import open_grpc_client, route_request, send_request
from tests.namesrv.support import brokers_of, create_topic, open_namesrv, wait_until

pytestmark = pytest.mark.integration

GRPC_ENDPOINTS = "TRIMQ_GRPC_ENDPOINTS"


async def endpoints_on(port: int) -> dict[str, str]:
    header = GetKVListByNamespaceRequestHeader(namespace=GRPC_ENDPOINTS)
    async with open_client(port) as client:
        reply = await client.call(RequestCode.GET_KVLIST_BY_NAMESPACE, header.to_ext())
    if reply.code != ResponseCode.SUCCESS:
        return {}
    return dict(KVTable.from_json(reply.body).table)


def assignment_request(topic: str, group: str) -> Any:
    req = schema.QueryAssignmentRequest()
    req.topic.name = topic
    req.group.name = group
    return req


def endpoint_of(queue: Any) -> tuple[str, str, int]:
    address = queue.broker.endpoints.addresses[0]
    return queue.broker.name, address.host, address.port


async def test_routes_and_assignments_name_every_broker_at_its_own_endpoint(
    tmp_path: Path,
) -> None:
    with trio.fail_after(40):
        async with open_namesrv() as ns:
            settings = {"namesrv_addr": f"127.0.0.1:{ns.port}", "register_interval_s": 30.0}
            async with (
                open_broker(tmp_path / "a", broker_name="broker-a", **settings) as a,
                open_broker(tmp_path / "b", broker_name="broker-b", **settings) as b,
            ):
                assert a.grpc_port is not None and b.grpc_port is not None
                wanted = {a.address: f"127.0.0.1:{a.grpc_port}",
                          b.address: f"127.0.0.1:{b.grpc_port}"}  # fmt: skip

                async def registered() -> bool:
                    return await endpoints_on(ns.port) == wanted

                await wait_until(registered, 20)
                async with open_client(a.port) as ca, open_client(b.port) as cb:
                    await create_topic(ca, "Spread", queues=2)
                    await create_topic(cb, "Spread", queues=3)

                    async def both() -> bool:
                        return await brokers_of(ns.port, "Spread") == ["broker-a", "broker-b"]

                    await wait_until(both, 20)
                async with open_grpc_client(b.grpc_port) as client:
                    reply = await client.unary("QueryRoute", route_request("Spread"))
                    route = reply.one(schema.QueryRouteResponse)
                    assert route.status.code == Code.OK
                    seen = [(*endpoint_of(q), q.id) for q in route.message_queues]
                    assert seen == [
                        ("broker-a", "127.0.0.1", a.grpc_port, 0),
                        ("broker-a", "127.0.0.1", a.grpc_port, 1),
                        ("broker-b", "127.0.0.1", b.grpc_port, 0),
                        ("broker-b", "127.0.0.1", b.grpc_port, 1),
                        ("broker-b", "127.0.0.1", b.grpc_port, 2),
                    ]
                    reply = await client.unary(
                        "QueryAssignment", assignment_request("Spread", "SpreadGroup")
                    )
                    assigned = reply.one(schema.QueryAssignmentResponse)
                    assert [
                        (*endpoint_of(x.message_queue), x.message_queue.id)
                        for x in assigned.assignments
                    ] == [
                        ("broker-a", "127.0.0.1", a.grpc_port, -1),
                        ("broker-b", "127.0.0.1", b.grpc_port, -1),
                    ]
                    # A topic the cluster does not know yet: this broker's planned route.
                    reply = await client.unary("QueryRoute", route_request("NewOnB"))
                    route = reply.one(schema.QueryRouteResponse)
                    assert {endpoint_of(q) for q in route.message_queues} == {
                        ("broker-b", "127.0.0.1", b.grpc_port)
                    }
                # A send through A's endpoint stays on A.
                async with open_grpc_client(a.grpc_port) as client:
                    reply = await client.unary("SendMessage", send_request("Spread", b"on a"))
                    assert reply.one(schema.SendMessageResponse).status.code == Code.OK
                assert (
                    a.broker.store.max_offset("Spread", 0) + a.broker.store.max_offset("Spread", 1)
                    == 1
                )
            # Both stopped: they removed their endpoints as they unregistered.
            assert await endpoints_on(ns.port) == {}
