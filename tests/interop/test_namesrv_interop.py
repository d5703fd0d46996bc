"""Interop through the name server: real third-party clients are given the address of
``trimq-namesrv`` (not of a broker) and produce and consume through the broker registered
there.

The clients ask the name server for the topic's route (GET_ROUTEINFO_BY_TOPIC), find the
broker in it, and talk to that broker; the cpp clients also ask for the TBW102 route and
let the broker auto-create the topic, ali-ons needs it created first (as its users do).
Installs, skips and driver handling are those of ``test_interop``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from scripts.interop_setup import ClientEnv
from tests.broker.client import open_broker
from tests.interop.test_interop import (
    ALI_ONS,
    CPP_1X,
    PRODUCE_TIMEOUT,
    PRODUCER_GROUP,
    RECEIVE_TIMEOUT,
    TOPIC,
    Client,
    DriverRun,
    LiveDriver,
    client_env,
    create_topic,
    plan,
    run_to_end,
    write_plan,
)
from tests.namesrv.support import brokers_of, open_namesrv, wait_until

pytestmark = pytest.mark.interop

__all__ = ["client_env"]  # the fixture, shared with test_interop
GROUP = "namesrv_interop_consumer"
CASES = [
    pytest.param(ALI_ONS, "ali-ons", id="ali-ons"),
    pytest.param(CPP_1X, "cpp-1.x", id="rocketmq-0.4.4-cpp-1.x"),
]


@pytest.mark.parametrize(("client", "client_env"), CASES, indirect=["client_env"])
async def test_clients_find_the_broker_through_the_name_server(
    client: Client, client_env: ClientEnv, tmp_path: Path
) -> None:
    messages = plan(1)
    home = tmp_path / "home"
    home.mkdir()
    env = client.environ(client_env, home)
    with trio.fail_after(180):
        async with open_namesrv() as ns, trio.open_nursery() as nursery:
            namesrv = f"127.0.0.1:{ns.port}"
            async with open_broker(tmp_path / "data", namesrv_addr=namesrv) as broker:

                async def registered() -> bool:
                    return await brokers_of(ns.port, "TBW102") == ["broker-a"]

                await wait_until(registered, 10)
                if client.create_topic:
                    await create_topic(broker, TOPIC)

                def command(*args: str) -> list[str]:
                    return client.command(client_env, *args, "--namesrv", namesrv)

                produced = DriverRun(f"{client.name} producer", tmp_path / "produce.err")
                plan_file = write_plan(tmp_path / "plan.json", messages)
                await run_to_end(
                    command("produce", "--group", PRODUCER_GROUP, "--plan", str(plan_file)),
                    env, produced, PRODUCE_TIMEOUT,
                )  # fmt: skip
                assert produced.returncode == 0 and produced.of("done"), produced.report()
                assert len(produced.of("sent")) == len(messages), produced.report()
                # The topic is in the name server's route (auto-created ones registered too).
                assert await brokers_of(ns.port, TOPIC) == ["broker-a"]
                stored = sum(broker.broker.store.max_offset(TOPIC, q) for q in range(4))
                assert stored == len(messages)

                consumer = LiveDriver(DriverRun(f"{client.name} consumer", tmp_path / "c.err"))
                args = ["consume", "--group", GROUP, "--topic", TOPIC, "--expression", "*"]
                await nursery.start(consumer.serve, command(*args), env)
                want = {m.key for m in messages}
                await consumer.wait_for(
                    "every message, found through the name server",
                    lambda: {e["key"] for e in consumer.run.of("received")} >= want,
                    RECEIVE_TIMEOUT,
                )
                await consumer.stop()
                assert consumer.run.returncode == 0, consumer.run.report()
