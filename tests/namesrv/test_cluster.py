"""Name servers and brokers together over TCP, in-process on 127.0.0.1:0.

Intervals are short (tenths of a second) so that expiry and convergence are seen quickly;
every wait is bounded by ``wait_until`` or ``fail_after``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.app import BrokerHandle, serve_broker
from broker.config import BrokerConfig
from broker.namesrv.app import serve_namesrv
from broker.namesrv.config import NamesrvConfig
from broker.registration import STOP_GRACE_S
from protocol.codes import ResponseCode
from tests.broker.client import TEST_SETTINGS, open_broker, open_client
from tests.broker.test_process import send_v2
from tests.namesrv.support import brokers_of, create_topic, open_namesrv, route_of, wait_until

pytestmark = pytest.mark.integration


async def test_two_brokers_register_and_topic_changes_appear_at_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_namesrv() as ns:
            addr = f"127.0.0.1:{ns.port}"
            async with (
                open_broker(tmp_path / "a", broker_name="broker-a", namesrv_addr=addr) as a,
                open_broker(tmp_path / "b", broker_name="broker-b", namesrv_addr=addr) as b,
            ):

                async def both_hold(topic: str) -> bool:
                    return await brokers_of(ns.port, topic) == ["broker-a", "broker-b"]

                await wait_until(lambda: both_hold("TBW102"), 5)
                # The register interval is 30 s: these changes travel by re-registration.
                async with open_client(a.port) as ca, open_client(b.port) as cb:
                    await create_topic(ca, "Shared", queues=4)
                    await create_topic(cb, "Shared", queues=8)
                    await create_topic(ca, "OnlyA")
                    took = await wait_until(lambda: both_hold("Shared"), 2)
                    route = await route_of(ns.port, "Shared")
                    assert route is not None
                    assert [q.write_queue_nums for q in route.queue_datas] == [4, 8]
                    assert [d.master_addr for d in route.broker_datas] == [a.address, b.address]
                    assert await brokers_of(ns.port, "OnlyA") == ["broker-a"]
                    # Auto-created on a send through TBW102: registered at once as well.
                    sent = await cb.request(send_v2("AutoCreated", b"hello"))
                    assert sent.code == ResponseCode.SUCCESS, sent.remark

                    async def auto() -> bool:
                        return await brokers_of(ns.port, "AutoCreated") == ["broker-b"]

                    await wait_until(auto, 2)
                assert took < 2


@asynccontextmanager
async def crashable_broker(data_dir: Path, **settings: Any) -> AsyncIterator[BrokerHandle]:
    """A broker whose exit is a cancellation, as a crash would be: it never unregisters."""
    config = BrokerConfig(host="127.0.0.1", port=0, data_dir=data_dir,
                          **{**TEST_SETTINGS, **settings})  # fmt: skip
    async with trio.open_nursery() as nursery:
        handle: BrokerHandle = await nursery.start(serve_broker, config)
        yield handle
        nursery.cancel_scope.cancel()


async def test_a_silent_broker_expires_and_a_stopped_one_leaves_at_once(tmp_path: Path) -> None:
    expire = 0.6
    fast = {"register_interval_s": 0.1}
    with trio.fail_after(30):
        async with open_namesrv(broker_expire_s=expire, scan_interval_s=0.02) as ns:
            addr = f"127.0.0.1:{ns.port}"
            async with open_broker(tmp_path / "b", broker_name="broker-b", namesrv_addr=addr,
                                   **fast):  # fmt: skip
                async with crashable_broker(tmp_path / "a", broker_name="broker-a",
                                            namesrv_addr=addr, **fast):  # fmt: skip

                    async def both() -> bool:
                        return await brokers_of(ns.port, "TBW102") == ["broker-a", "broker-b"]

                    await wait_until(both, 5)
                    # Renewals keep it: alive well past the expiry time.
                    await trio.sleep(expire * 2)
                    assert await both()
                crashed = trio.current_time()

                async def a_gone() -> bool:
                    return await brokers_of(ns.port, "TBW102") == ["broker-b"]

                await wait_until(a_gone, 5, every=0.01)
                silent = trio.current_time() - crashed
                # Last renewal at most one interval before the crash; one scan of slack.
                assert expire - 0.1 - 0.05 <= silent <= expire + 0.02 + 0.5, silent
            # broker-b stopped gracefully: it unregistered, no expiry needed.
            assert await route_of(ns.port, "TBW102") is None
            assert ns.ctx.routes.live() == {}


async def test_two_name_servers_one_down_then_back_converge(tmp_path: Path) -> None:
    interval = 0.3
    with trio.fail_after(30):
        async with open_namesrv() as ns1, trio.open_nursery() as nursery:
            ns2 = await nursery.start(serve_namesrv, NamesrvConfig(port=0))
            port2 = ns2.port
            addrs = f"127.0.0.1:{ns1.port};127.0.0.1:{port2}"
            async with open_broker(tmp_path / "a", namesrv_addr=addrs, register_interval_s=interval,
                                   register_timeout_s=0.5) as broker:  # fmt: skip

                async def on(port: int, topic: str) -> bool:
                    return await brokers_of(port, topic) == ["broker-a"]

                await wait_until(lambda: on(ns1.port, "TBW102"), 5)
                await wait_until(lambda: on(port2, "TBW102"), 5)
                ns2.stop()  # name server 2 goes away; its routes with it
                await trio.sleep(0.05)
                async with open_client(broker.port) as client:
                    await create_topic(client, "WhileDown")
                # Name server 1 learns it at once: the dead one blocks nothing.
                took = await wait_until(lambda: on(ns1.port, "WhileDown"), 2)
                assert took < 0.5, took
                await trio.sleep(interval)  # a failed round or two against the dead one
                ns2 = await nursery.start(serve_namesrv, NamesrvConfig(port=port2))
                restarted = trio.current_time()
                await wait_until(lambda: on(port2, "WhileDown"), 5, every=0.01)
                converged = trio.current_time() - restarted
                assert converged <= interval + 0.3, converged
            ns2.stop()


async def test_a_silent_name_server_does_not_delay_the_others(tmp_path: Path) -> None:
    """A name server that accepts connections and never answers costs only its own loop."""
    held: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    with trio.fail_after(30):
        async with open_namesrv() as ns, trio.open_nursery() as nursery:
            serve = partial(trio.serve_tcp, hold, 0, host="127.0.0.1")
            (listener,) = await nursery.start(serve)
            silent = listener.socket.getsockname()[1]
            addrs = f"127.0.0.1:{silent};127.0.0.1:{ns.port}"
            async with open_broker(tmp_path / "a", namesrv_addr=addrs,
                                   register_timeout_s=1.0) as broker:  # fmt: skip

                async def on(topic: str) -> bool:
                    return await brokers_of(ns.port, topic) == ["broker-a"]

                assert await wait_until(lambda: on("TBW102"), 5) < 0.5
                async with open_client(broker.port) as client:
                    await create_topic(client, "Prompt")
                assert await wait_until(lambda: on("Prompt"), 2) < 0.5
                assert held, "the broker never tried the silent name server"
                await wait_until(_failing(broker, f"127.0.0.1:{silent}"), 3)
                stopping = trio.current_time()
            # A graceful stop stays bounded although one name server never answers.
            assert trio.current_time() - stopping < 2 * STOP_GRACE_S + 1
            assert await brokers_of(ns.port, "TBW102") == []  # it did unregister
            nursery.cancel_scope.cancel()


def _failing(broker: BrokerHandle, addr: str) -> Any:
    async def check() -> bool:
        return broker.registrar is not None and addr in broker.registrar.failing

    return check
