"""``python -m broker.namesrv`` and ``python -m broker --namesrv-addr`` as processes.

Both start on port 0 and say which port they got in their "started" JSON log lines; SIGTERM
stops both with exit status 0, and the broker unregisters on its way out. Every process
started here is killed by its pid if it is still alive when the test ends.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.broker.test_process import (
    REPO,
    STOP_TIMEOUT,
    BrokerProcess,
    clean_env,
    run_broker,
    run_server_process,
)
from tests.namesrv.support import brokers_of, route_of, wait_until

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def run_namesrv(*args: str) -> AsyncIterator[BrokerProcess]:
    """Start ``python -m broker.namesrv --port 0 ARGS`` and wait for "namesrv started"."""
    argv = ["--port", "0", *args]
    async with run_server_process("broker.namesrv", "namesrv started", argv, clean_env()) as ns:
        yield ns


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
