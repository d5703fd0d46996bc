"""``python -m broker.namesrv`` and ``python -m broker --namesrv-addr`` as processes.

Both start on port 0 and say which port they got in their "started" JSON log lines; SIGTERM
stops both with exit status 0, and the broker unregisters on its way out. Every process
started here is killed by its pid if it is still alive when the test ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.broker.test_process import REPO, START_TIMEOUT, STOP_TIMEOUT, BrokerProcess, run_broker
from tests.namesrv.support import brokers_of, route_of, wait_until

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def run_namesrv(*args: str) -> AsyncIterator[BrokerProcess]:
    """Start ``python -m broker.namesrv --port 0 ARGS`` and wait for "namesrv started"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    argv = [sys.executable, "-m", "broker.namesrv", "--port", "0", *args]
    process = await trio.lowlevel.open_process(
        argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        async with trio.open_nursery() as nursery:
            namesrv = BrokerProcess(process)
            nursery.start_soon(namesrv.drain)
            try:
                with trio.fail_after(START_TIMEOUT):
                    started = await namesrv.wait_for("namesrv started")
                namesrv.port = int(started["port"])
                yield namesrv
            finally:
                if process.poll() is None:
                    process.kill()  # this process only, by its pid
    finally:
        if process.poll() is None:
            process.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT):
            await process.wait()


async def test_namesrv_and_broker_processes_register_and_stop_cleanly(tmp_path: Path) -> None:
    with trio.fail_after(40):
        async with run_namesrv("--broker-expire-s", "60") as namesrv:
            addr = f"127.0.0.1:{namesrv.port}"
            async with run_broker(
                tmp_path / "data", "--namesrv-addr", addr, "--broker-name", "broker-p"
            ) as broker:

                async def registered() -> bool:
                    return await brokers_of(namesrv.port, "TBW102") == ["broker-p"]

                await wait_until(registered, 10)
                route = await route_of(namesrv.port, "TBW102")
                assert route is not None
                assert route.broker_datas[0].master_addr == f"127.0.0.1:{broker.port}"
                assert await broker.stop(signal.SIGTERM) == 0
                with trio.fail_after(STOP_TIMEOUT):
                    await broker.wait_for("unregistered from namesrv")
                    await broker.wait_for("broker stopped")
            # Gone at once: it unregistered (the expiry time is a minute).
            assert await route_of(namesrv.port, "TBW102") is None
            with trio.fail_after(STOP_TIMEOUT):
                await namesrv.wait_for("broker unregistered")
            assert await namesrv.stop(signal.SIGTERM) == 0
            with trio.fail_after(STOP_TIMEOUT):
                await namesrv.wait_for("namesrv stopped")


async def test_bad_settings_exit_2_with_a_message() -> None:
    result = await trio.run_process(
        [sys.executable, "-m", "broker.namesrv", "--scan-interval-s", "0"],
        cwd=REPO, capture_stderr=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert b"scan_interval_s must be positive" in result.stderr
