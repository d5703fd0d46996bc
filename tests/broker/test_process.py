"""``python -m broker`` as a process: start-up line, graceful SIGTERM/SIGINT, data kept.

The broker is started with ``--port 0``; its "broker started" JSON log line (stderr is not a
terminal, so logs are JSON lines) says which port it got. Every process started here is
killed by its pid if it is still alive when a test ends.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.config import BrokerConfig
from broker.remoting.processors import build_registry
from broker.store.api import GetStatus
from broker.store.store import MessageStore
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.headers.pull import PullMessageRequestHeader, PullSysFlag
from protocol.headers.send import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.message import decode_records
from tests.broker.client import TEST_SETTINGS, open_client

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
#: Bound on starting and on stopping one broker process (starting is generous: a loaded
#: 2-core machine can take seconds to start an interpreter).
START_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0


class BrokerProcess:
    """A running ``python -m broker`` and the log lines it wrote to stderr so far."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        #: Parsed JSON log lines (non-JSON lines are kept as ``{"raw": line}``).
        self.lines: list[dict[str, Any]] = []
        self.port = 0
        #: The gRPC front end's port from the started line (None: off, or a name server).
        self.grpc_port: int | None = None
        self._changed = trio.Event()

    async def drain(self) -> None:
        """Read stderr to EOF, one line at a time."""
        stream = self.process.stderr
        assert stream is not None
        pending = b""
        try:
            while data := await stream.receive_some(65536):
                pending += data
                *complete, pending = pending.split(b"\n")
                for line in complete:
                    self._add(line)
            if pending:
                self._add(pending)
        finally:
            self._wake()

    def _add(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").strip()
        if not text:
            return
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        self.lines.append(parsed if isinstance(parsed, dict) else {"raw": text})
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def find(self, event: str) -> dict[str, Any] | None:
        """The first log line of ``event``, if it was written."""
        return next((line for line in self.lines if line.get("event") == event), None)

    async def wait_for(self, event: str) -> dict[str, Any]:
        """Wait for a log line of ``event`` (callers bound the wait)."""
        while (line := self.find(event)) is None:
            if self.process.poll() is not None:
                # Exited: give the reader a moment to collect the last lines.
                await trio.sleep(0.2)
                line = self.find(event)
                assert line is not None, f"exited without {event!r}: {self.lines}"
                return line
            await self._changed.wait()
        return line

    async def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal the broker and wait (bounded) for it to exit; return its exit status."""
        self.process.send_signal(signum)
        with trio.fail_after(STOP_TIMEOUT):
            return await self.process.wait()


@asynccontextmanager
async def run_server_process(
    module: str, marker: str, args: list[str], env: dict[str, str]
) -> AsyncIterator[BrokerProcess]:
    """Start ``python -m MODULE ARGS`` and wait for its ``marker`` log line ("broker started",
    "namesrv started"), whose ``port`` it records. On exit the process is killed by its pid
    if still alive."""
    argv = [sys.executable, "-m", module, *args]
    process = await trio.lowlevel.open_process(
        argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        async with trio.open_nursery() as nursery:
            server = BrokerProcess(process)
            nursery.start_soon(server.drain)
            try:
                with trio.fail_after(START_TIMEOUT):
                    started = await server.wait_for(marker)
                server.port = int(started["port"])
                server.grpc_port = started.get("grpc_port")
                assert started["address"] == f"127.0.0.1:{server.port}"
                yield server
            finally:
                if process.poll() is None:
                    process.kill()  # this process only, by its pid
    finally:
        if process.poll() is None:
            process.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT):
            await process.wait()


def clean_env() -> dict[str, str]:
    """This process's environment without any ``TRIMQ_*`` setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}


@asynccontextmanager
async def run_broker(
    data_dir: Path, *args: str, **settings: object
) -> AsyncIterator[BrokerProcess]:
    """Start ``python -m broker --port 0 --data-dir DATA_DIR ARGS`` (with :data:`TEST_SETTINGS`
    and ``settings`` as ``TRIMQ_*`` variables) and wait for its "broker started" line."""
    env = clean_env()
    # Small preallocated segments, as in every test (also shows env settings reach it).
    env.update({f"TRIMQ_{k.upper()}": str(v) for k, v in {**TEST_SETTINGS, **settings}.items()})
    argv = ["--port", "0", "--data-dir", str(data_dir), *args]
    async with run_server_process("broker", "broker started", argv, env) as broker:
        yield broker


def send_v2(topic: str, body: bytes) -> RemotingCommand:
    header = SendMessageRequestHeader(
        producer_group="process_test",
        topic=topic,
        default_topic="TBW102",
        default_topic_queue_nums=4,
        queue_id=0,
        sys_flag=0,
        born_timestamp=1_700_000_000_000,
        flag=0,
        properties="KEYS\x01k1\x02",
    )
    return request(RequestCode.SEND_MESSAGE_V2, 0, header.to_v2_ext(), body)


def pull(topic: str, offset: int, *, suspend_ms: int = 0) -> RemotingCommand:
    header = PullMessageRequestHeader(
        consumer_group="process_group",
        topic=topic,
        queue_id=0,
        queue_offset=offset,
        max_msg_nums=32,
        sys_flag=int(PullSysFlag.SUSPEND) if suspend_ms else 0,
        commit_offset=0,
        suspend_timeout_millis=suspend_ms,
        subscription="*",
        sub_version=0,
    )
    return request(RequestCode.PULL_MESSAGE, 0, header.to_ext())


async def test_sigterm_stops_gracefully_and_messages_survive_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    topic, body = "Durable", b"persist me"
    with trio.fail_after(30):
        # First run: send, then SIGTERM.
        async with run_broker(data_dir) as broker:
            async with open_client(broker.port) as client:
                reply = await client.request(send_v2(topic, body))
                assert reply.code == ResponseCode.SUCCESS, reply.remark
                stored = SendMessageResponseHeader.from_ext(reply.ext_fields)
                assert (stored.queue_id, stored.queue_offset) == (0, 0)
            assert await broker.stop(signal.SIGTERM) == 0
            with trio.fail_after(STOP_TIMEOUT):
                stopped = await broker.wait_for("broker stopped")
            assert stopped["address"] == f"127.0.0.1:{broker.port}"
        first_port = broker.port

        # The store was closed cleanly and holds the message.
        config = BrokerConfig(data_dir=data_dir, **TEST_SETTINGS)
        with MessageStore.open(config.store_config(first_port)) as store:
            assert store.statistics().recovered_records == 0  # clean shutdown: nothing rescanned
            found = store.get(topic, 0, 0)
            assert found.status is GetStatus.FOUND
            (msg,) = decode_records(found.body)
            assert (msg.topic, msg.body, msg.keys) == (topic, body, ["k1"])

        # Second run on the same data dir: the topic and the message are served over TCP.
        async with run_broker(data_dir) as broker:
            async with open_client(broker.port) as client:
                route = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
                assert route.code == ResponseCode.SUCCESS
                if RequestCode.PULL_MESSAGE in build_registry().handlers:
                    reply = await client.request(pull(topic, 0))
                    assert reply.code == ResponseCode.SUCCESS, reply.remark
                    (msg,) = decode_records(reply.body)
                    assert (msg.body, msg.queue_offset) == (body, 0)
                    # A pull parked on the empty tail is answered when the broker stops.
                    parked = client.next_opaque()
                    await client.send(pull(topic, 1, suspend_ms=15_000)._replace(opaque=parked))
                    await trio.sleep(0.2)
                    assert not client.has_reply(parked)
                    # SIGINT stops it gracefully too.
                    assert await broker.stop(signal.SIGINT) == 0
                    answer = await client.reply(parked)
                    assert answer.code == ResponseCode.PULL_NOT_FOUND
                else:
                    assert await broker.stop(signal.SIGINT) == 0
            with trio.fail_after(STOP_TIMEOUT):
                await broker.wait_for("broker stopped")


async def test_the_started_line_names_the_grpc_port_which_answers_http2(tmp_path: Path) -> None:
    """``--grpc-port 0``: any free port, printed as ``grpc_port``; an HTTP/2 client gets the
    server's SETTINGS there (the RocketMQ 5 clients' front end is up)."""
    with trio.fail_after(30):
        async with run_broker(tmp_path / "data", "--grpc-port", "0") as broker:
            assert isinstance(broker.grpc_port, int) and broker.grpc_port not in (0, broker.port)
            stream = await trio.open_tcp_stream("127.0.0.1", broker.grpc_port)
            async with stream:
                await stream.send_all(
                    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                )
                head = await stream.receive_some(9)
                assert len(head) >= 4 and head[3] == 0x4  # a SETTINGS frame
        async with run_broker(tmp_path / "data", "--grpc-port", "off") as broker:
            assert broker.grpc_port is None


def test_a_port_that_cannot_be_bound_is_named_and_the_broker_exits_1(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**clean_env(), "TRIMQ_GRPC_PORT": "0", "TRIMQ_SEGMENT_SIZE": str(1 << 20)}
        argv = ["--port", "0", "--ha-port", str(port), "--data-dir", str(tmp_path / "data")]
        done = subprocess.run(
            [sys.executable, "-m", "broker", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1, done.stderr
    assert f"cannot listen on 127.0.0.1:{port} for replication (--ha-port" in done.stderr
    assert "Traceback" not in done.stderr
