"""Name servers and brokers together over TCP, in-process on 127.0.0.1:0.

No assertion races the real clock. Expiry runs on a name-server clock the test steps
(:class:`SteppedClock`), so "not a step before its expiry time, gone at it" is exact. "At once"
means "by a registration the periodic loop cannot explain": the register interval is an hour,
so within a test only a poke (a topic change) registers again; likewise a registration timeout
far longer than any wait shows that a silent name server held nothing up. Every wait is bounded
(``wait_until`` or ``fail_after``), generously.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.app import BrokerHandle, serve_broker
from broker.config import BrokerConfig
from broker.namesrv.app import NamesrvHandle, serve_namesrv
from broker.namesrv.config import NamesrvConfig
from broker.registration import STOP_GRACE_S
from protocol.codes import ResponseCode
from tests.broker.client import TEST_SETTINGS, open_broker, open_client
from tests.broker.test_process import send_v2
from tests.namesrv.support import brokers_of, create_topic, open_namesrv, route_of, wait_until

pytestmark = pytest.mark.integration

#: A register interval no test lives to see twice: a registration after the start one can
#: only come from a poke.
NEVER_S = 3600.0


class SteppedClock:
    """A name server's clock (seconds) that moves only when the test steps it."""

    def __init__(self, start: float = 1024.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


def last_update(ns: NamesrvHandle, broker_name: str) -> float | None:
    """When the name server last heard from ``broker_name`` (its clock), None if gone."""
    return next(
        (live.last_update for live in ns.ctx.routes.live().values()
         if live.broker_name == broker_name),
        None,
    )  # fmt: skip


def holds(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """``check`` for :func:`wait_until`."""

    async def poll() -> bool:
        return check()

    return poll


async def test_two_brokers_register_and_topic_changes_appear_at_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with open_namesrv() as ns:
            addr = f"127.0.0.1:{ns.port}"
            never = {"namesrv_addr": addr, "register_interval_s": NEVER_S}
            async with (
                open_broker(tmp_path / "a", broker_name="broker-a", **never) as a,
                open_broker(tmp_path / "b", broker_name="broker-b", **never) as b,
            ):

                async def both_hold(topic: str) -> bool:
                    return await brokers_of(ns.port, topic) == ["broker-a", "broker-b"]

                await wait_until(lambda: both_hold("TBW102"), 10)
                # No periodic round within the test: these changes travel by the
                # re-registration each topic change triggers.
                async with open_client(a.port) as ca, open_client(b.port) as cb:
                    await create_topic(ca, "Shared", queues=4)
                    await create_topic(cb, "Shared", queues=8)
                    await create_topic(ca, "OnlyA")
                    await wait_until(lambda: both_hold("Shared"), 10)
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

                    await wait_until(auto, 10)


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
    """On the name server's stepped clock: a broker that stops registering is still there a
    step before ``broker_expire_s`` of silence and gone at it; one that keeps renewing stays
    past twice that; a gracefully stopped one is gone at once (the clock no longer moves)."""
    expire = 8.0  # steps below are exact in binary floating point
    clock = SteppedClock()
    with trio.fail_after(30):
        async with open_namesrv(broker_expire_s=expire, scan_interval_s=0.02, clock=clock) as ns:
            addr = f"127.0.0.1:{ns.port}"

            def renewed(name: str) -> Callable[[], Awaitable[bool]]:
                """``name`` registered at the clock's current time (after the last step)."""
                return holds(lambda: last_update(ns, name) == clock())

            async def step(seconds: float) -> None:
                """Step the clock, then wait for broker-b's renewal at the new time."""
                clock.step(seconds)
                await wait_until(renewed("broker-b"), 10)

            async def present() -> list[str]:
                return await brokers_of(ns.port, "TBW102")

            # broker-b renews every 50 ms; broker-a registers once, at its start, and then
            # crashes: it neither renews nor unregisters.
            fast = {"namesrv_addr": addr, "register_interval_s": 0.05}
            once = {"namesrv_addr": addr, "register_interval_s": NEVER_S}
            async with open_broker(tmp_path / "b", broker_name="broker-b", **fast):
                async with crashable_broker(tmp_path / "a", broker_name="broker-a", **once):
                    await wait_until(renewed("broker-a"), 10)
                silent_since = last_update(ns, "broker-a")
                assert silent_since == clock()
                await step(expire / 2)
                assert last_update(ns, "broker-a") == silent_since  # nothing came after
                await step(expire / 2 - 0.25)  # a step short of the expiry time
                await trio.sleep(0.2)  # scans run every 20 ms: none may drop it
                assert await present() == ["broker-a", "broker-b"]
                await step(0.25)  # silent for exactly broker_expire_s: the next scan drops it
                await wait_until(holds(lambda: last_update(ns, "broker-a") is None), 10)
                assert clock() - silent_since == expire
                assert await present() == ["broker-b"]
                # Renewals keep broker-b: it outlives twice the expiry time since it started.
                for _ in range(8):
                    await step(expire / 4)
                    assert await present() == ["broker-b"]
            # broker-b stopped gracefully: it unregistered, no expiry needed.
            assert await route_of(ns.port, "TBW102") is None
            assert ns.ctx.routes.live() == {}


async def test_a_topic_made_while_one_name_server_is_down_reaches_the_other(
    tmp_path: Path,
) -> None:
    """With name server 2 down, a topic change still reaches name server 1 at once: by the
    poke, since the periodic loop would not register again within the test."""
    with trio.fail_after(30):
        async with open_namesrv() as ns1, trio.open_nursery() as nursery:
            ns2: NamesrvHandle = await nursery.start(serve_namesrv, NamesrvConfig(port=0))
            port2 = ns2.port
            addrs = f"127.0.0.1:{ns1.port};127.0.0.1:{port2}"
            async with open_broker(tmp_path / "a", namesrv_addr=addrs,
                                   register_interval_s=NEVER_S) as broker:  # fmt: skip

                async def on(port: int, topic: str) -> bool:
                    return await brokers_of(port, topic) == ["broker-a"]

                await wait_until(lambda: on(ns1.port, "TBW102"), 10)
                await wait_until(lambda: on(port2, "TBW102"), 10)
                ns2.stop()  # name server 2 goes away; its routes with it
                async with open_client(broker.port) as client:
                    await create_topic(client, "WhileDown")
                await wait_until(lambda: on(ns1.port, "WhileDown"), 10)
                # The same poke tried name server 2, and failed.
                await wait_until(_failing(broker, f"127.0.0.1:{port2}"), 10)
            nursery.cancel_scope.cancel()


async def test_two_name_servers_one_down_then_back_converge(tmp_path: Path) -> None:
    """A name server that was down gets the topics it missed from the broker's periodic
    registration loop, which goes on after failed rounds (no topic changes once it is back:
    nothing else registers)."""
    interval = 0.3
    with trio.fail_after(30):
        async with open_namesrv() as ns1, trio.open_nursery() as nursery:
            ns2: NamesrvHandle = await nursery.start(serve_namesrv, NamesrvConfig(port=0))
            port2 = ns2.port
            addr2 = f"127.0.0.1:{port2}"
            addrs = f"127.0.0.1:{ns1.port};{addr2}"
            async with open_broker(tmp_path / "a", namesrv_addr=addrs, register_interval_s=interval,
                                   register_timeout_s=0.5) as broker:  # fmt: skip
                registrar = broker.registrar
                assert registrar is not None

                async def on(port: int, topic: str) -> bool:
                    return await brokers_of(port, topic) == ["broker-a"]

                await wait_until(lambda: on(ns1.port, "TBW102"), 10)
                await wait_until(lambda: on(port2, "TBW102"), 10)
                ns2.stop()  # name server 2 goes away; its routes with it
                await wait_until(_failing(broker, addr2), 10)  # a failed round against it
                async with open_client(broker.port) as client:
                    await create_topic(client, "WhileDown")
                await wait_until(lambda: on(ns1.port, "WhileDown"), 10)
                before = registrar.registered[addr2]
                ns2 = await nursery.start(serve_namesrv, NamesrvConfig(port=port2))
                await wait_until(lambda: on(port2, "WhileDown"), 10)
                assert registrar.registered[addr2] > before
                await wait_until(holds(lambda: addr2 not in registrar.failing), 10)
            ns2.stop()


async def test_a_silent_name_server_does_not_delay_the_others(tmp_path: Path) -> None:
    """A name server that accepts connections and never answers costs only its own loop: the
    other one is registered (at the start and on a topic change) while the registration with
    the silent one is still waiting for its reply; a graceful stop stays bounded; a
    registration without a reply within ``register_timeout_s`` counts as failed."""
    held: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        held.append(stream)
        await trio.sleep_forever()

    with trio.fail_after(30):
        async with open_namesrv() as ns, trio.open_nursery() as nursery:
            serve = partial(trio.serve_tcp, hold, 0, host="127.0.0.1")
            (listener,) = await nursery.start(serve)
            silent = f"127.0.0.1:{listener.socket.getsockname()[1]}"
            # A registration timeout longer than this whole test: had the loops waited for
            # one another, name server 1 would hear of nothing here.
            async with open_broker(tmp_path / "a", namesrv_addr=f"{silent};127.0.0.1:{ns.port}",
                                   register_interval_s=NEVER_S,
                                   register_timeout_s=60.0) as broker:  # fmt: skip
                registrar = broker.registrar
                assert registrar is not None

                async def on(topic: str) -> bool:
                    return await brokers_of(ns.port, topic) == ["broker-a"]

                await wait_until(lambda: on("TBW102"), 10)
                async with open_client(broker.port) as client:
                    await create_topic(client, "Prompt")
                await wait_until(lambda: on("Prompt"), 10)
                await wait_until(holds(lambda: bool(held)), 10)  # it did try the silent one
                assert registrar.registered[silent] == 0 and silent not in registrar.failing
                stopping = trio.current_time()
            # A graceful stop stays bounded although one name server never answers: about
            # 2 x STOP_GRACE_S, not the 60 s registration timeout.
            assert trio.current_time() - stopping < 2 * STOP_GRACE_S + 10
            assert await brokers_of(ns.port, "TBW102") == []  # it did unregister
            # A short registration timeout: the silent name server is marked failing.
            async with open_broker(tmp_path / "b", broker_name="broker-b", namesrv_addr=silent,
                                   register_timeout_s=0.2) as quick:  # fmt: skip
                await wait_until(_failing(quick, silent), 10)
            nursery.cancel_scope.cancel()


def _failing(broker: BrokerHandle, addr: str) -> Callable[[], Awaitable[bool]]:
    return holds(lambda: broker.registrar is not None and addr in broker.registrar.failing)
