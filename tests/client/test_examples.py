"""The examples in ``examples/`` run against a real broker and do what they say."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.client.harness import BrokerThread

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, broker: BrokerThread, *args: str) -> str:
    env = {**os.environ, "NAMESRV_ADDR": broker.address, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_examples_produce_and_consume(broker: BrokerThread) -> None:
    """producer.py + sync_producer.py send; simple_consumer.py receives all of them."""
    out = run_example("producer.py", broker, "--topic", "Ex", "--count", "4")
    assert out.count("sent ") == 5  # 4 lines + the ordered summary
    out = run_example("sync_producer.py", broker, "--topic", "Ex", "--count", "2")
    assert out.count("sent ") == 2
    out = run_example(
        "simple_consumer.py", broker, "--topic", "Ex", "--expect", "9", "--seconds", "30"
    )
    assert "received 9" in out
    assert "b'hello 0'" in out and "b'sync 1'" in out and "b'shipped'" in out
