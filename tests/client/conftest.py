"""Fixtures for client tests: a broker thread per test, and the backend to run on."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.config import ClientConfig
from tests.client.harness import BACKENDS, BrokerThread, broker_thread


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each client test runs once under trio and once under asyncio."""
    return str(request.param)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    """A fresh broker on 127.0.0.1 (it answers route queries itself)."""
    with broker_thread(tmp_path / "broker") as running:
        yield running


@pytest.fixture
def config(broker: BrokerThread) -> ClientConfig:
    """Client settings pointing at the broker as its name server."""
    return ClientConfig(namesrv_addr=broker.address, request_timeout=5.0)


@pytest.fixture
def unused_tcp_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
