"""Interop: RocketMQ transactional messages from a real third-party client, client-cpp 2.1's
transactional producer (``librocketmq.so`` of ``rocketmq-python-cvs==2.1.0.3``, whose Python
wrapper has no transactions: ``cpp_driver.py transact`` / ``checker`` bind its C API with
ctypes).

Each producer is a driver subprocess printing JSON lines (``executed``, ``sent``,
``half_sent``, ``checked`` ...); what consumers can see is read with raw pulls
(PULL_MESSAGE over our own Remoting client, every queue of the topic from offset 0), so
"consumed exactly once" means "stored in the topic exactly once". The brokers run with a 1 s
check interval and a 1 s check immunity. A cpp producer can only be checked once the broker
knows its connection belongs to the group, which its heartbeat says: client-cpp 2.1 sends it
at start and 10 ms later (to the brokers it knows a route to by then: none, unless a send
was quicker), then every 30 s, so a producer may be checked only about 30 s after its start
(hence the bounds). The check limit is 100, not RocketMQ's 15: the halves answered UNKNOWN at
every round are the tests' clock (see 3) and must outlive the wait for a late heartbeat; and
a broker that counted rounds in which no producer of the group is connected (as RocketMQ
does) must not give up on a half before anyone can be asked.

1. commit: the message arrives in its topic once, with its key, tag, body and unique id
   (the producer's msgId);
2. rollback: never in the topic. The rolled-back message is sent (and ended) before the
   committed one, on the same connection, so it is checked after the committed message is
   visible, and again at the end;
3. local UNKNOWN: the broker checks back (CHECK_TRANSACTION_STATE) the producer's connection
   and the checker's answer decides: one message committed by its check, one rolled back.
   A third message is answered UNKNOWN at every check: it stays invisible and is checked
   again each round. These rounds are the evidence that the broker has settled: once three
   more rounds have been seen after a decision, the decided halves must not be checked again;
4. a producer killed between its half message and its END_TRANSACTION (two processes that
   ``os._exit`` inside the local transaction): a producer of the same group started
   afterwards (``checker``) is checked back, and its answers hold (one commit, one rollback);
5. ``kill -9`` of a broker process (``--flush sync``) holding undecided halves, checked before
   the kill (and answered UNKNOWN): the broker restarted on the same data directory checks
   them again (a new ``checker`` producer of the group answers), the committed one arrives
   once, the rolled-back one never, and a message committed before the kill is neither
   checked again nor published twice (the new checker would answer "commit" if it were).

No check is ever sent for a transaction its producer ended itself, nor for a message of
another group (the checkers answer UNKNOWN and say ``known: false`` for keys not theirs).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from protocol.codes import RequestCode, ResponseCode
from protocol.headers.admin import CreateTopicRequestHeader
from protocol.message import MessageExt
from protocol.properties import UNIQ_KEY
from scripts.interop_setup import ClientEnv
from tests.broker.client import open_broker, open_client
from tests.broker.test_process import BrokerProcess
from tests.broker.test_restart import broker_process, kill9, pull_topic
from tests.interop.test_interop import CPP_21, DriverRun, LiveDriver, run_to_end

pytestmark = pytest.mark.interop

TOPIC = "TxInteropTopic"
PRODUCER_GROUP = "tx_producer"
CRASH_GROUP = "tx_crashed_producer"
RESTART_GROUP = "tx_restart_producer"
#: Broker settings of every test here (see the module docstring for the check limit).
TX_SETTINGS: dict[str, Any] = {
    "transaction_check_interval_s": 1.0,
    "transaction_immunity_s": 1.0,
    "transaction_check_max": 100,
}
#: Check rounds seen after a decision before the decided halves count as settled.
SETTLE_ROUNDS = 3
#: Bounds (seconds), generous for a loaded 2-core machine.
SEND_TIMEOUT = 60.0
CHECK_TIMEOUT = 120.0  # the client's heartbeat period (30 s) + immunity + intervals
VISIBLE_TIMEOUT = 30.0
SETTLE_TIMEOUT = 60.0
TEST_TIMEOUT = 420.0


# ---------------------------------------------------------------- the message plans
@dataclass(frozen=True, slots=True)
class Tx:
    """One transactional message: what its local transaction and its checker answer."""

    key: str
    tag: str
    local: str  # commit | rollback | unknown | crash
    check: str  # commit | rollback | unknown

    @property
    def body(self) -> str:
        # No NUL: the checker reads the body back as a C string.
        return f"{self.key}|{self.tag}|transactional héllo ✓"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body.encode()).hexdigest()


def write_plan(path: Path, messages: Sequence[Tx]) -> Path:
    items = [
        {"key": m.key, "tag": m.tag, "body": m.body, "local": m.local, "check": m.check}
        for m in messages
    ]
    path.write_text(json.dumps({"topic": TOPIC, "messages": items}, ensure_ascii=False))
    return path


# ---------------------------------------------------------------- drivers
@dataclass
class TxRun(DriverRun):
    """A driver run whose report ends with the client's transaction log lines (its log
    directory is its own: ``ROCKETMQ_CLIENT_LOG_DIR``)."""

    log_dir: Path | None = None

    def report(self) -> str:
        lines: list[str] = []
        if self.log_dir is not None:
            for path in sorted(self.log_dir.glob("*")):
                text = path.read_text(errors="replace").splitlines()
                lines += [line[:400] for line in text if "ransaction" in line or "eartbeat" in line]
        return f"{super().report()}\n--- client log (transactions, heartbeats):\n" + "\n".join(
            lines[-40:]
        )


@dataclass
class Drivers:
    """Starts the cpp-2.1 transactional drivers of one test."""

    env: ClientEnv
    tmp_path: Path
    count: int = 0

    def prepare(self, label: str, mode: str, group: str, messages: Sequence[Tx], address: str
                ) -> tuple[TxRun, list[str], dict[str, str]]:  # fmt: skip
        self.count += 1
        name = f"{self.count:02d}-{mode}"
        work = self.tmp_path / name
        (work / "home").mkdir(parents=True)
        run = TxRun(label, work / "stderr", log_dir=work / "logs")
        plan = write_plan(work / "plan.json", messages)
        command = CPP_21.command(
            self.env, mode, "--namesrv", address, "--group", group, "--plan", str(plan),
            "--log-level", "5",  # DEBUG: the client logs each END_TRANSACTION header
        )  # fmt: skip
        # This client build logs to $ROCKETMQ_CLIENT_LOG_DIR, else to /logs/rocketmq-client.
        environ = {**CPP_21.environ(self.env, work / "home"), "ROCKETMQ_CLIENT_LOG_DIR": str(
            work / "logs")}  # fmt: skip
        return run, command, environ

    async def start(self, nursery: trio.Nursery, label: str, mode: str, group: str,
                    messages: Sequence[Tx], address: str) -> LiveDriver:  # fmt: skip
        """A ``transact`` or ``checker`` driver that runs until :meth:`LiveDriver.stop`."""
        run, command, environ = self.prepare(label, mode, group, messages, address)
        driver = LiveDriver(run)
        await nursery.start(driver.serve, command, environ)
        await driver.wait_for("its start", lambda: bool(run.of("started")), SEND_TIMEOUT)
        return driver

    async def crash(self, label: str, group: str, message: Tx, address: str) -> TxRun:
        """A ``transact`` driver that dies in the local transaction of its one message."""
        assert message.local == "crash"
        run, command, environ = self.prepare(label, "transact", group, [message], address)
        await run_to_end(command, environ, run, SEND_TIMEOUT)
        assert run.returncode == 0, run.report()
        assert [e["key"] for e in run.of("half_sent")] == [message.key], run.report()
        assert not run.of("sent") and not run.of("executed"), run.report()
        return run


def checks(driver: LiveDriver, key: str) -> list[dict[str, Any]]:
    return [e for e in driver.run.of("checked") if e["key"] == key]


def checked_keys(driver: LiveDriver) -> set[str]:
    return {e["key"] for e in driver.run.of("checked")}


async def wait_checked(driver: LiveDriver, keys: set[str]) -> None:
    await driver.wait_for(
        f"checks of {sorted(keys)}", lambda: keys <= checked_keys(driver), CHECK_TIMEOUT
    )


def assert_sent(driver: LiveDriver, messages: Sequence[Tx]) -> dict[str, str]:
    """Every message was sent (SEND_OK) and its local transaction ran with its answer;
    returns the transaction id (``UNIQ_KEY``) of each key."""
    report = driver.run.report()
    sent = driver.run.of("sent")
    assert [e["key"] for e in sent] == [m.key for m in messages], report
    assert all(e["rc"] == 0 and e["status"] == 0 for e in sent), report
    executed = driver.run.of("executed")
    assert [(e["key"], e["local"]) for e in executed] == [(m.key, m.local) for m in messages]
    ids = {e["key"]: e["transaction_id"] for e in executed}
    # client-cpp 2.1: the send result's msgId is the message's unique id (its transaction id).
    assert all(ids[e["key"]] == e["msg_id"] and e["msg_id"] for e in sent), report
    return ids


def assert_checks_sane(driver: LiveDriver, messages: Sequence[Tx], ids: dict[str, str]) -> None:
    """Every check of ``driver`` was about one of its own undecided messages, carried the
    message as sent (real topic, tag, body, producer group, unique id) and got the plan's
    answer."""
    by_key = {m.key: m for m in messages}
    report = driver.run.report()
    for e in driver.run.of("checked"):
        assert e["known"], f"checked for a message not of this producer: {e}\n{report}"
        m = by_key[e["key"]]
        assert m.local in ("unknown", "crash"), f"{m.key} was ended by its producer\n{report}"
        assert (e["topic"], e["tag"], e["body_sha256"]) == (TOPIC, m.tag, m.sha256), report
        assert e["transaction_id"] == ids[m.key], report
        assert e["answer"] == m.check, report
    assert not driver.run.of("callback_error"), report


async def settle(clock: LiveDriver, key: str, watched: Sequence[LiveDriver]) -> None:
    """Wait for :data:`SETTLE_ROUNDS` more checks of ``key`` (answered UNKNOWN for ever) by
    ``clock``, then require that none of ``watched`` was checked meanwhile: the broker ran
    check rounds after their answers and asked nothing more."""
    before = len(checks(clock, key))
    seen = [len(d.run.of("checked")) for d in watched]
    await clock.wait_for(
        f"{SETTLE_ROUNDS} more check rounds of {key}",
        lambda: len(checks(clock, key)) >= before + SETTLE_ROUNDS,
        SETTLE_TIMEOUT,
    )
    for driver, count in zip(watched, seen, strict=True):
        late = driver.run.of("checked")[count:]
        if driver is clock:
            late = [e for e in late if e["key"] != key]
        assert not late, f"checked again after its answer: {late}\n{driver.run.report()}"


# ---------------------------------------------------------------- the topic
async def create_topic(port: int) -> None:
    """UPDATE_AND_CREATE_TOPIC (17) with 4 queues, as ``mqadmin updateTopic`` does."""
    header = CreateTopicRequestHeader(
        topic=TOPIC, default_topic="TBW102", read_queue_nums=4, write_queue_nums=4, perm=6,
        topic_filter_type="SINGLE_TAG", order=False,
    )  # fmt: skip
    async with open_client(port) as client:
        reply = await client.call(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def visible(port: int) -> list[MessageExt]:
    """Every message of the topic, as a consumer reading each queue from offset 0 gets it."""
    async with open_client(port) as client:
        return await pull_topic(client, TOPIC)


def keys_of(messages: Sequence[MessageExt]) -> Counter[str]:
    return Counter(key for m in messages for key in m.keys)


async def wait_visible(port: int, keys: set[str], *reports: LiveDriver) -> list[MessageExt]:
    """Poll the topic (every 0.5 s, bounded) until every key of ``keys`` is in it."""
    got: list[MessageExt] = []
    with trio.move_on_after(VISIBLE_TIMEOUT):
        for _ in range(int(VISIBLE_TIMEOUT / 0.5) + 1):  # bounded by the scope as well
            if keys <= set(keys_of(got := await visible(port))):
                break
            await trio.sleep(0.5)
    assert keys <= set(keys_of(got)), (
        f"{sorted(keys - set(keys_of(got)))} not in {TOPIC} within {VISIBLE_TIMEOUT} s: "
        f"{dict(keys_of(got))}\n" + "\n".join(d.run.report() for d in reports)
    )
    return got


def assert_published(
    messages: Sequence[MessageExt], want: Sequence[Tx], ids: dict[str, str]
) -> None:
    """``messages`` (the whole topic) hold each of ``want`` exactly once, intact, and
    nothing else."""
    by_key = {m.key: m for m in want}
    assert keys_of(messages) == Counter(m.key for m in want), dict(keys_of(messages))
    for stored in messages:
        (key,) = stored.keys
        tx = by_key[key]
        assert stored.topic == TOPIC and stored.tags == tx.tag, stored
        assert stored.body == tx.body.encode(), f"body of {key} changed: {stored.body!r}"
        assert stored.properties.get(UNIQ_KEY) == ids[key], (key, stored.properties)


# ---------------------------------------------------------------- scenarios 1 to 4
MAIN = [
    # Ended before COMMITTED on the same connection: invisible once COMMITTED is visible.
    Tx("rolled-back", "TagR", local="rollback", check="commit"),
    Tx("committed", "TagC", local="commit", check="rollback"),
    Tx("commit-by-check", "TagC", local="unknown", check="commit"),
    Tx("rollback-by-check", "TagR", local="unknown", check="rollback"),
    Tx("undecided", "TagU", local="unknown", check="unknown"),
]
CRASHED = [
    Tx("crashed-commit", "TagC", local="crash", check="commit"),
    Tx("crashed-rollback", "TagR", local="crash", check="rollback"),
]


@pytest.mark.parametrize("client_env", ["cpp-2.1"], indirect=True)
async def test_commit_rollback_check_back_and_a_crashed_producer(
    client_env: ClientEnv, tmp_path: Path
) -> None:
    drivers = Drivers(client_env, tmp_path)
    by_key = {m.key: m for m in MAIN + CRASHED}
    with trio.fail_after(TEST_TIMEOUT):
        async with open_broker(tmp_path / "data", **TX_SETTINGS) as broker, \
                trio.open_nursery() as nursery:  # fmt: skip
            address = f"127.0.0.1:{broker.port}"
            await create_topic(broker.port)
            producer = await drivers.start(
                nursery, "transactional producer", "transact", PRODUCER_GROUP, MAIN, address
            )
            await producer.wait_for(
                "every send", lambda: bool(producer.run.of("done")), SEND_TIMEOUT
            )
            ids = assert_sent(producer, MAIN)

            # 4: two producers of CRASH_GROUP die between the half message and its end;
            # a producer of the group started afterwards answers the checks.
            for m in CRASHED:
                crashed = await drivers.crash(f"crashing producer {m.key}", CRASH_GROUP, m, address)
                ids[m.key] = crashed.of("half_sent")[0]["transaction_id"]
            restarted = await drivers.start(
                nursery, "restarted producer", "checker", CRASH_GROUP, CRASHED, address
            )

            # 1 and 2: COMMITTED arrives; ROLLED_BACK, ended before it, does not.
            got = await wait_visible(broker.port, {"committed"}, producer)
            assert keys_of(got) == Counter({"committed": 1}), dict(keys_of(got))
            assert_published(got, [by_key["committed"]], ids)

            # 3: the unknown ones are checked back; the checker's answers decide.
            await wait_checked(producer, {"commit-by-check", "rollback-by-check", "undecided"})
            await wait_visible(broker.port, {"commit-by-check"}, producer)
            # 4: the restarted producer is checked back for the halves the crashed ones left.
            await wait_checked(restarted, {"crashed-commit", "crashed-rollback"})
            await wait_visible(broker.port, {"crashed-commit"}, restarted)

            # Settled: check rounds go on (UNDECIDED), the decided halves are not asked again.
            await settle(producer, "undecided", [producer, restarted])
            got = await visible(broker.port)
            published = ["committed", "commit-by-check", "crashed-commit"]
            assert_published(got, [by_key[k] for k in published], ids)

            assert_checks_sane(producer, MAIN, ids)
            assert_checks_sane(restarted, CRASHED, ids)
            assert checked_keys(producer) == {"commit-by-check", "rollback-by-check", "undecided"}
            assert checked_keys(restarted) == {"crashed-commit", "crashed-rollback"}
            # UNDECIDED, answered UNKNOWN, is asked again in later rounds.
            assert [e["times"] for e in checks(producer, "undecided")][:4] == [1, 2, 3, 4]

            for driver in (producer, restarted):
                await driver.stop()
                assert driver.run.returncode == 0 and driver.run.of("stopped"), driver.run.report()


# ---------------------------------------------------------------- scenario 5
BEFORE_KILL = [
    Tx("kept", "TagC", local="commit", check="commit"),  # "commit" if wrongly asked again
    Tx("restart-commit", "TagC", local="unknown", check="unknown"),
    Tx("restart-rollback", "TagR", local="unknown", check="unknown"),
    Tx("restart-undecided", "TagU", local="unknown", check="unknown"),
]
#: The same messages as the restarted producer answers them.
AFTER_KILL = [
    Tx("kept", "TagC", local="commit", check="commit"),
    Tx("restart-commit", "TagC", local="unknown", check="commit"),
    Tx("restart-rollback", "TagR", local="unknown", check="rollback"),
    Tx("restart-undecided", "TagU", local="unknown", check="unknown"),
]


@asynccontextmanager
async def transaction_broker(data_dir: Path) -> AsyncIterator[BrokerProcess]:
    """``python -m broker --flush sync`` on ``data_dir`` with :data:`TX_SETTINGS`."""
    async with broker_process(data_dir, flush="sync", **TX_SETTINGS) as broker:
        yield broker


@pytest.mark.parametrize("client_env", ["cpp-2.1"], indirect=True)
async def test_undecided_halves_survive_a_broker_kill9(
    client_env: ClientEnv, tmp_path: Path
) -> None:
    drivers = Drivers(client_env, tmp_path)
    data_dir = tmp_path / "data"
    by_key = {m.key: m for m in AFTER_KILL}
    undecided = {"restart-commit", "restart-rollback", "restart-undecided"}
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            async with transaction_broker(data_dir) as broker:
                address = f"127.0.0.1:{broker.port}"
                await create_topic(broker.port)
                producer = await drivers.start(
                    nursery, "producer before the kill", "transact", RESTART_GROUP,
                    BEFORE_KILL, address,
                )  # fmt: skip
                await producer.wait_for(
                    "every send", lambda: bool(producer.run.of("done")), SEND_TIMEOUT
                )
                ids = assert_sent(producer, BEFORE_KILL)
                await wait_visible(broker.port, {"kept"}, producer)
                # Checked and left undecided (UNKNOWN) before the kill ...
                await wait_checked(producer, undecided)
                # ... and KEPT's commit is rounds old when the broker is killed.
                await settle(producer, "restart-undecided", [])
                assert_checks_sane(producer, BEFORE_KILL, ids)
                assert keys_of(await visible(broker.port)) == Counter({"kept": 1})
                await producer.stop()
                await kill9(broker)

            async with transaction_broker(data_dir) as broker:
                address = f"127.0.0.1:{broker.port}"
                restarted = await drivers.start(
                    nursery, "producer after the kill", "checker", RESTART_GROUP, AFTER_KILL,
                    address,
                )  # fmt: skip
                # The halves are checked again, the answers decide ...
                await wait_checked(restarted, undecided)
                await wait_visible(broker.port, {"kept", "restart-commit"}, restarted)
                await settle(restarted, "restart-undecided", [restarted])
                # ... KEPT is not asked again, and nothing is there twice.
                assert_checks_sane(restarted, AFTER_KILL, ids)
                assert checked_keys(restarted) == undecided, restarted.run.report()
                got = await visible(broker.port)
                assert_published(got, [by_key["kept"], by_key["restart-commit"]], ids)
                await restarted.stop()
                assert restarted.run.returncode == 0, restarted.run.report()
