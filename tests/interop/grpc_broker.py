"""What the gRPC interop tests (official Python and Node 5.x clients) share: the broker of a
test with its captured log, bounded waits, and making a consumer group orderly."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
from structlog.testing import capture_logs

from broker.app import BrokerHandle
from client.config import ClientConfig
from protocol.bodies.subscription import SubscriptionGroupConfig
from protocol.codes import RequestCode, ResponseCode
from tests.broker.client import open_broker, open_client

#: A message id of the 5.x clients: 17 bytes in hex (rocketmq-clients/docs/message_id.md).
MESSAGE_ID = re.compile(r"^[0-9A-F]{34}$")


@dataclass
class Running:
    """A broker of one test, with its captured log."""

    handle: BrokerHandle
    logs: list[MutableMapping[str, Any]]

    @property
    def endpoint(self) -> str:
        assert self.handle.grpc_port is not None
        return f"127.0.0.1:{self.handle.grpc_port}"

    @property
    def remoting(self) -> ClientConfig:
        """trimq's own client, with the broker as its name server."""
        return ClientConfig(namesrv_addr=self.handle.address, request_timeout=5.0)

    def now_ms(self) -> int:
        return self.handle.broker.clock.now_ms()

    def parked(self, group: str) -> int:
        """Pops of ``group`` parked (long-polling) now."""
        groups = self.handle.statistics().core.pop.hub.groups
        return groups[group].parked if group in groups else 0

    def in_flight(self) -> int:
        """Pop leases not yet acked."""
        return self.handle.statistics().core.pop.in_flight

    def errors(self) -> list[MutableMapping[str, Any]]:
        return [e for e in self.logs if e.get("log_level") in ("error", "critical")]


@asynccontextmanager
async def grpc_broker(tmp_path: Path, **settings: Any) -> AsyncIterator[Running]:
    """A broker with its gRPC port; the test fails if it logged an error."""
    with capture_logs() as logs:
        async with open_broker(tmp_path / "data", **settings) as handle:
            running = Running(handle, logs)
            yield running
    assert not running.errors(), f"the broker logged errors: {running.errors()}"


async def wait_until(what: str, predicate: Callable[[], bool], within: float) -> None:
    """Poll ``predicate`` every 20 ms, at most ``within`` seconds."""
    for _ in range(int(within / 0.02) + 1):
        if predicate():
            return
        await trio.sleep(0.02)
    assert predicate(), f"{what}: not within {within} s"


async def make_orderly(broker: Running, group: str, retry_max_times: int | None = None) -> None:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200), as ``mqadmin updateSubGroup -o true`` does
    (``retry_max_times``: also ``-r``; None keeps RocketMQ's default)."""
    config = SubscriptionGroupConfig(group, consume_message_orderly=True)
    if retry_max_times is not None:
        config = dataclasses.replace(config, retry_max_times=retry_max_times)
    async with open_client(broker.handle.port) as client:
        reply = await client.call(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, config.to_json()
        )
    assert reply.code == ResponseCode.SUCCESS, reply.remark
