"""Helpers for name-server tests: run one in-process, ask it for routes, poll bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from broker.namesrv.app import NamesrvHandle, serve_namesrv
from broker.namesrv.config import NamesrvConfig
from protocol.bodies.route import TopicRouteData
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.admin import CreateTopicRequestHeader
from tests.broker.client import BrokerClient, open_client


@asynccontextmanager
async def open_namesrv(
    port: int = 0, *, clock: Callable[[], float] = trio.current_time, **settings: Any
) -> AsyncIterator[NamesrvHandle]:
    """Run a name server on 127.0.0.1 (any free port by default) whose registrations and
    expiry run on ``clock``; stopped on exit."""
    config = NamesrvConfig(host="127.0.0.1", port=port, **settings)
    async with trio.open_nursery() as nursery:
        handle: NamesrvHandle = await nursery.start(partial(serve_namesrv, config, clock=clock))
        try:
            yield handle
        finally:
            handle.stop()


async def route_of(port: int, topic: str) -> TopicRouteData | None:
    """Ask the name server on ``port`` for ``topic``'s route (None: TOPIC_NOT_EXIST)."""
    async with open_client(port) as client:
        reply = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if reply.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return TopicRouteData.from_json(reply.body)


async def brokers_of(port: int, topic: str) -> list[str]:
    """The broker names in ``topic``'s route on the name server at ``port``."""
    route = await route_of(port, topic)
    return [] if route is None else [q.broker_name for q in route.queue_datas]


async def wait_until(
    check: Callable[[], Awaitable[bool]], within: float, every: float = 0.02
) -> float:
    """Poll ``check`` until it holds (at most ``within`` seconds); return the time taken."""
    start = trio.current_time()
    with trio.fail_after(within):
        while not await check():  # noqa: ASYNC110 (polls state held elsewhere)
            await trio.sleep(every)
    return trio.current_time() - start


async def create_topic(client: BrokerClient, topic: str, queues: int = 4) -> None:
    """UPDATE_AND_CREATE_TOPIC on the broker ``client`` is connected to."""
    header = CreateTopicRequestHeader(
        topic=topic, default_topic="TBW102", read_queue_nums=queues, write_queue_nums=queues,
        perm=6, topic_filter_type="SINGLE_TAG", order=False,
    )  # fmt: skip
    reply = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark
