"""Interop: real third-party RocketMQ clients against an in-process broker.

Clients (installed by :mod:`scripts.interop_setup` into ``.interop/``, reused across runs):
``ali-ons@3.12.0`` (pure JavaScript, with ``urllib@2``), ``rocketmq==0.4.4`` (Python over
client-cpp 1.x) and ``rocketmq-python-cvs==2.1.0.3`` (Python over client-cpp 2.1). Each runs
as a driver subprocess (``ali_ons_driver.js``, ``cpp_driver.py``) that prints JSON lines;
every wait is bounded and only the drivers this test started are killed (by their pid).

One scenario per client, with the broker as the clients' name server:

1. produce batch 1 (TagA and TagB messages, one TagA body of ~6 KiB that ali-ons and the
   C++ clients compress with sysFlag bit 0);
2. consumer run 1 subscribes ``TagA``: exactly the TagA messages arrive with intact bodies;
   its handler answers "reconsume later" to one message once (the failure status, since
   the cpp wrappers turn an exception into success), so the client sends it back (36);
3. once the broker holds the run's commits, the consumer stops; batch 2 is produced;
4. consumer run 2 (same group) resumes from the committed offsets: no message of batch 1
   comes again from the topic, every TagA message of batch 2 arrives, and the failed message
   comes back through ``%RETRY%group`` (delay level 3 + 0 = 10 s, which the clients do not
   let us choose: ali-ons always sends back with level 0 and the cpp wrappers expose no
   context) with ``reconsume_times >= 1`` and ``RETRY_TOPIC`` naming the topic.

If a registry is unreachable the client's test is skipped; any other install failure fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.app import BrokerHandle
from protocol.codes import RequestCode, ResponseCode
from protocol.headers.admin import CreateTopicRequestHeader
from protocol.message import decode_record
from scripts.interop_setup import (
    CLIENTS,
    ClientEnv,
    ClientUnusable,
    RegistryUnreachable,
    SetupError,
    ensure,
)
from tests.broker.client import open_broker, open_client

pytestmark = pytest.mark.interop

HERE = Path(__file__).resolve().parent
TOPIC = "InteropTopic"
PRODUCER_GROUP = "interop_producer"
CONSUMER_GROUP = "interop_consumer"
RETRY_TOPIC = f"%RETRY%{CONSUMER_GROUP}"

#: Bounds (seconds). The whole scenario takes about 20 s per client when all goes well.
PRODUCE_TIMEOUT = 60.0
RECEIVE_TIMEOUT = 60.0  # run 2 includes the 10 s retry delay
COMMIT_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
SCENARIO_TIMEOUT = 240.0

#: Tags per batch: with 4 queues and round-robin sends, every queue gets both tags.
TAGS = ("TagA", "TagA", "TagB", "TagA", "TagB", "TagB", "TagA", "TagB")
LARGE_KEY = "b1-1"  # TagA, ~6 KiB: compressed by the clients (threshold 4 KiB)
FAIL_KEY = "b1-3"  # TagA: failed once by consumer run 1


# ---------------------------------------------------------------- the message plan
def body_of(key: str, tag: str) -> str:
    """Deterministic text bodies (no NUL: the cpp wrappers pass bodies as C strings)."""
    if key == LARGE_KEY:
        return "".join(f"{i:05d}:{key}:{i * 7919 % 10007:05d};" for i in range(400))
    return f"{key}|{tag}|héllo ✓"


@dataclass(frozen=True, slots=True)
class Planned:
    key: str
    tag: str
    body: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body.encode()).hexdigest()


def plan(batch: int) -> list[Planned]:
    keys = [f"b{batch}-{i}" for i in range(len(TAGS))]
    return [Planned(key, tag, body_of(key, tag)) for key, tag in zip(keys, TAGS, strict=True)]


def write_plan(path: Path, messages: list[Planned]) -> Path:
    items = [{"key": m.key, "tag": m.tag, "body": m.body} for m in messages]
    path.write_text(json.dumps({"topic": TOPIC, "messages": items}, ensure_ascii=False))
    return path


# ---------------------------------------------------------------- clients
@dataclass(frozen=True, slots=True)
class Client:
    """How one third-party client is driven."""

    name: str  # a key of scripts.interop_setup.CLIENTS
    #: Whether the topic must exist before the client asks a *name server* for its route:
    #: ali-ons throws on TOPIC_NOT_EXIST (it never falls back to TBW102). A standalone broker
    #: answers the route a first send will create (auto-create on), so the scenarios against
    #: one never create it; the cpp clients use TBW102 either way.
    create_topic: bool
    #: client-cpp 2.1 crashes (SIGSEGV) in DefaultMQPushConsumerImpl::
    #: shutdownMessageTraceInnerProducer when message trace is off: its driver exits
    #: without shutdown(), so only the closed connection tells the broker it left.
    shutdown: bool = True

    def command(self, env: ClientEnv, *args: str) -> list[str]:
        if env.node_modules is not None:
            return ["node", str(HERE / "ali_ons_driver.js"), *args]
        assert env.python is not None
        # -I: the client's venv only (no PYTHONPATH, no user site, not this repo).
        return [str(env.python), "-I", str(HERE / "cpp_driver.py"), *args]

    def environ(self, env: ClientEnv, home: Path) -> dict[str, str]:
        # HOME: the C++ clients write their logs under ~/logs/rocketmq-cpp; the 2.1 build of
        # rocketmq-python-cvs ignores HOME and writes to $ROCKETMQ_CLIENT_LOG_DIR (else
        # /logs/rocketmq-client, outside the test's directory).
        out = {
            **real_clock_environ(),
            "HOME": str(home),
            "ROCKETMQ_CLIENT_LOG_DIR": str(home / "logs" / "rocketmq-client"),
        }
        if env.node_modules is not None:
            out["NODE_PATH"] = str(env.node_modules)
        return out


def real_clock_environ() -> dict[str, str]:
    """This environment without ``faketime``'s preload: the suite's date-shift run
    (docs/testing.md) moves our code a year ahead, while third-party clients keep the real
    clock — client-cpp 1.x's timed waits mix the faked wall clock with the kernel's real one
    and its route lookups then time out, which says nothing about the broker."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("FAKETIME")}
    preload = [p for p in out.get("LD_PRELOAD", "").split() if "faketime" not in p]
    if preload:
        out["LD_PRELOAD"] = " ".join(preload)
    else:
        out.pop("LD_PRELOAD", None)
    return out


ALI_ONS = Client("ali-ons", create_topic=True)
CPP_1X = Client("cpp-1.x", create_topic=False)
CPP_21 = Client("cpp-2.1", create_topic=False, shutdown=False)

#: Registries found unreachable in this session: the other clients of the kind skip at once.
_unreachable: dict[str, str] = {}


@pytest.fixture
def client_env(request: pytest.FixtureRequest) -> ClientEnv:
    """The installed environment of ``request.param`` (a client name), or a skip/failure."""
    name: str = request.param
    kind = CLIENTS[name].kind
    if kind in _unreachable:
        pytest.skip(_unreachable[kind])
    try:
        return ensure(name)
    except RegistryUnreachable as exc:
        _unreachable[kind] = f"{kind} registry unreachable, {name} not installed: {exc}"
        pytest.skip(_unreachable[kind])
    except ClientUnusable as exc:
        pytest.skip(f"{name} cannot run here: {exc.report()}")
    except SetupError as exc:
        pytest.fail(f"installing {name} failed:\n{exc.report()}", pytrace=False)


# ---------------------------------------------------------------- driver processes
@dataclass
class DriverRun:
    """One driver subprocess: its JSON events, stray stdout lines and stderr file."""

    label: str
    stderr_path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    stray: list[str] = field(default_factory=list)
    returncode: int | None = None

    def of(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]

    def report(self) -> str:
        try:
            stderr = self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            stderr = ""
        events = "\n".join(json.dumps(e, sort_keys=True)[:300] for e in self.events)
        return (
            f"--- {self.label}: exit {self.returncode}, events:\n{events}\n"
            f"--- stray stdout:\n{''.join(self.stray)[-2000:]}\n--- stderr (tail):\n{stderr}"
        )

    def feed(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace")
        try:
            event = json.loads(text)
        except ValueError:
            self.stray.append(text + "\n")
            return
        if isinstance(event, dict) and "event" in event:
            self.events.append(event)
        else:
            self.stray.append(text + "\n")


async def _read_lines(stream: trio.abc.ReceiveStream, run: DriverRun) -> None:
    pending = b""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            run.feed(line)
    if pending.strip():
        run.feed(pending)


async def run_to_end(
    command: list[str], env: Mapping[str, str], run: DriverRun, within: float
) -> None:
    """Run a driver to its exit, within ``within`` seconds (it is killed past that)."""
    with run.stderr_path.open("wb") as stderr, trio.move_on_after(within) as scope:
        result = await trio.run_process(
            command, stdin=subprocess.DEVNULL, capture_stdout=True, stderr=stderr,
            check=False, env=env,
        )  # fmt: skip
        run.returncode = result.returncode
        for line in result.stdout.splitlines():
            run.feed(line)
    assert not scope.cancelled_caught, f"{run.label} did not finish in {within} s\n{run.report()}"


class LiveDriver:
    """A long-running driver (a consumer): started in a nursery, stopped by closing its
    standard input; killed (by pid, via trio's cancellation of ``run_process``) if it does
    not stop in time."""

    def __init__(self, run: DriverRun) -> None:
        self.run = run
        self.process: trio.Process | None = None
        self._done = trio.Event()

    async def serve(
        self,
        command: list[str],
        env: Mapping[str, str],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with self.run.stderr_path.open("wb") as stderr:
            try:
                async with trio.open_nursery() as nursery:
                    self.process = await nursery.start(
                        partial(trio.run_process, command, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, check=False, env=env)
                    )  # fmt: skip
                    assert self.process.stdout is not None
                    nursery.start_soon(_read_lines, self.process.stdout, self.run)
                    task_status.started()
            finally:
                if self.process is not None:
                    self.run.returncode = self.process.returncode
                self._done.set()

    async def wait_for(self, what: str, predicate: Callable[[], bool], within: float) -> None:
        """Poll ``predicate`` (every 50 ms, at most ``within`` seconds)."""
        with trio.move_on_after(within):
            while not predicate():
                if self._done.is_set():
                    break
                await trio.sleep(0.05)
        assert predicate(), f"{self.run.label}: {what} not seen within {within} s\n" + (
            self.run.report()
        )

    async def stop(self) -> None:
        """Close stdin (the driver's signal to stop) and wait for the exit, bounded."""
        assert self.process is not None and self.process.stdin is not None
        await self.process.stdin.aclose()
        with trio.move_on_after(STOP_TIMEOUT):
            await self._done.wait()
        if not self._done.is_set():
            self.process.kill()  # our own child, by its pid
            with trio.move_on_after(5):
                await self._done.wait()
            pytest.fail(f"{self.run.label} did not stop in {STOP_TIMEOUT} s\n{self.run.report()}")


# ---------------------------------------------------------------- broker helpers
async def create_topic(broker: BrokerHandle, topic: str) -> None:
    """UPDATE_AND_CREATE_TOPIC (17), as ``mqadmin updateTopic`` does."""
    header = CreateTopicRequestHeader(
        topic=topic, default_topic="TBW102", read_queue_nums=4, write_queue_nums=4, perm=6,
        topic_filter_type="SINGLE_TAG", order=False,
    )  # fmt: skip
    async with open_client(broker.port) as client:
        reply = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


def committed(broker: BrokerHandle) -> dict[int, int]:
    """The consumer group's committed offsets of the topic, by queue id."""
    return dict(broker.broker.store.offsets.table(CONSUMER_GROUP, TOPIC))


def from_topic(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """First deliveries, read from the topic itself (not copies from the retry topic)."""
    return [e for e in events if e["reconsume_times"] == 0 and not e["retry_topic"]]


def retried(events: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    return [e for e in events if e["key"] == key and e["reconsume_times"] >= 1]


# ---------------------------------------------------------------- the scenario
CASES = [
    pytest.param(ALI_ONS, "ali-ons", id="ali-ons"),
    pytest.param(CPP_1X, "cpp-1.x", id="rocketmq-0.4.4-cpp-1.x"),
    pytest.param(CPP_21, "cpp-2.1", id="rocketmq-python-cvs-2.1.0.3-cpp-2.1"),
]


@pytest.mark.parametrize(("client", "client_env"), CASES, indirect=["client_env"])
async def test_produce_filter_retry_restart(
    client: Client, client_env: ClientEnv, tmp_path: Path
) -> None:
    batch1, batch2 = plan(1), plan(2)
    by_key = {m.key: m for m in batch1 + batch2}
    tag_a = {m.key for m in batch1 + batch2 if m.tag == "TagA"}
    tag_a1 = {m.key for m in batch1 if m.tag == "TagA"}
    tag_a2 = tag_a - tag_a1
    home = tmp_path / "home"
    home.mkdir()
    env = client.environ(client_env, home)

    def command(*args: str) -> list[str]:
        return client.command(client_env, *args, "--namesrv", address)

    async def produce(batch: int, messages: list[Planned]) -> DriverRun:
        run = DriverRun(f"{client.name} producer {batch}", tmp_path / f"produce{batch}.err")
        plan_file = write_plan(tmp_path / f"plan{batch}.json", messages)
        await run_to_end(
            command("produce", "--group", PRODUCER_GROUP, "--plan", str(plan_file)),
            env, run, PRODUCE_TIMEOUT,
        )  # fmt: skip
        sent = run.of("sent")
        assert run.returncode == 0 and run.of("done"), run.report()
        assert [e["key"] for e in sent] == [m.key for m in messages], run.report()
        assert all(e["status"] in (0, "SEND_OK") for e in sent), run.report()
        return run

    def consumer(n: int, *extra: str) -> tuple[LiveDriver, list[str]]:
        args = ["consume", "--group", CONSUMER_GROUP, "--topic", TOPIC, "--expression", "TagA"]
        if not client.shutdown:
            args.append("--skip-shutdown")
        run = DriverRun(f"{client.name} consumer run {n}", tmp_path / f"consume{n}.err")
        return LiveDriver(run), command(*args, *extra)

    with trio.fail_after(SCENARIO_TIMEOUT):
        async with open_broker(tmp_path / "data") as broker, trio.open_nursery() as nursery:
            address = f"127.0.0.1:{broker.port}"
            await produce(1, batch1)  # the topic does not exist yet: the send creates it

            # Run 1: the TagA messages of batch 1 arrive; FAIL_KEY is failed once.
            run1, cmd1 = consumer(1, "--fail-key", FAIL_KEY)
            await nursery.start(run1.serve, cmd1, env)
            await run1.wait_for(
                "every TagA message of batch 1",
                lambda: {e["key"] for e in from_topic(run1.run.of("received"))} >= tag_a1,
                RECEIVE_TIMEOUT,
            )
            # At-least-once: an offset is committed once everything before it was consumed.
            # Wait until the broker holds, per queue, one past the last message run 1 took.
            needed: dict[int, int] = {}
            for e in from_topic(run1.run.of("received")):
                needed[e["queue_id"]] = max(needed.get(e["queue_id"], 0), e["queue_offset"] + 1)
            await run1.wait_for(
                f"commits {needed} on the broker",
                lambda: all(committed(broker).get(q, -1) >= o for q, o in needed.items()),
                COMMIT_TIMEOUT,
            )
            await run1.stop()
            committed1 = committed(broker)
            produced2 = await produce(2, batch2)
            assert produced2.of("sent")

            # Run 2 (same group): resumes at the commits, and gets the retried message.
            run2, cmd2 = consumer(2)
            await nursery.start(run2.serve, cmd2, env)

            def run2_done() -> bool:
                got = run2.run.of("received")
                first = {e["key"] for e in from_topic(got)}
                seen_retry = retried(run1.run.of("received") + got, FAIL_KEY)
                return first >= tag_a2 and bool(seen_retry)

            await run2.wait_for(
                "batch 2's TagA messages and the retried message", run2_done, RECEIVE_TIMEOUT
            )
            await run2.stop()

            runs = f"{run1.run.report()}\n{run2.run.report()}"
            events1, events2 = run1.run.of("received"), run2.run.of("received")
            events = events1 + events2
            for run in (run1, run2):
                assert run.run.returncode == 0 and run.run.of("stopped"), runs

            # Only TagA messages, with their bodies intact (the large one decompressed).
            assert {e["key"] for e in events} <= tag_a, runs
            assert all(e["tag"] == "TagA" for e in events), runs
            for e in events:
                want = by_key[e["key"]]
                assert (e["body_len"], e["body_sha256"]) == (
                    len(want.body.encode()),
                    want.sha256,
                ), f"body of {e['key']} changed\n{runs}"
            assert {e["key"] for e in from_topic(events)} == tag_a, runs
            large = [e for e in events if e["key"] == LARGE_KEY]
            assert large and large[0]["body_len"] > 4096, runs
            (record,) = broker.broker.store.messages_by_key(TOPIC, LARGE_KEY)
            stored, _ = decode_record(record)
            assert stored.sys_flag & 1, "the client did not compress the large body"
            assert len(stored.body) < len(by_key[LARGE_KEY].body), "stored body not compressed"

            # The failed message: failed once in run 1, then back through the retry topic.
            assert [e["key"] for e in events1 if e["failed"]] == [FAIL_KEY], runs
            again = retried(events, FAIL_KEY)
            assert again and all(e["retry_topic"] == TOPIC for e in again), runs
            assert broker.broker.store.max_offset(RETRY_TOPIC, 0) >= 1, "nothing in the retry topic"

            # Restart: run 1's commits covered what it took, and run 2 resumed there.
            assert all(committed1.get(q, -1) >= o for q, o in needed.items()), runs
            assert sum(committed1.values()) > 0
            for e in from_topic(events2):
                assert e["queue_offset"] >= committed1.get(e["queue_id"], 0), (
                    f"run 2 re-read {e['key']} below the committed offset "
                    f"{committed1.get(e['queue_id'])}\n{runs}"
                )
            assert not {e["key"] for e in from_topic(events2)} & tag_a1, runs


def test_client_table_matches_setup_script() -> None:
    """Every Remoting client the setup script knows is driven here (and the other way round);
    the RocketMQ 5 gRPC clients have tests of their own (``test_grpc_*``)."""
    remoting = {name for name in CLIENTS if not name.endswith("-grpc")}
    assert {c.name for c in (ALI_ONS, CPP_1X, CPP_21)} == remoting
