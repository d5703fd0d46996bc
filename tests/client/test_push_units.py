"""Pure parts of the push consumer: allocation, process queue, cache budget, options, and the
listener runner's per-message deadline (trio's autojump clock: no real waiting)."""

from __future__ import annotations

import threading

import pytest
import structlog
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from client.message import ReceivedMessage
from client.push import ConsumeResult
from client.push.allocate import allocate_averagely
from client.push.process_queue import CacheBudget, ProcessQueue
from client.push.pull_mode import tag_matches
from client.push.runtime import PushOptions, Runtime, is_async_listener
from client.push.types import Outcome
from protocol.bodies.consumer import MessageQueue
from protocol.message import MessageExt


@pytest.fixture(autouse=True)
def _default_logging() -> None:
    """Log through structlog's defaults: a test that configured structlog with pytest's
    captured stream (closed after that test) would make every later log call fail."""
    structlog.reset_defaults()


def _mq(i: int, topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, "broker-a", i)


def _msg(offset: int, body: bytes = b"xx") -> ReceivedMessage:
    return ReceivedMessage.of(MessageExt(topic="T", body=body, queue_offset=offset), "broker-a")


# ---------------------------------------------------------------------- allocation
def test_allocate_averagely_blocks_and_extra() -> None:
    """8 queues over 3 clients: contiguous blocks of 3, 3, 2 in sorted client order."""
    queues = [_mq(i) for i in reversed(range(8))]
    cids = ["c", "a", "b"]
    got = {cid: [q.queue_id for q in allocate_averagely(cid, queues, cids)] for cid in cids}
    assert got == {"a": [0, 1, 2], "b": [3, 4, 5], "c": [6, 7]}


def test_allocate_more_clients_than_queues() -> None:
    """Clients beyond the number of queues get nothing; an unknown client gets nothing."""
    queues = [_mq(0), _mq(1)]
    assert [allocate_averagely(c, queues, ["a", "b", "c"]) for c in "abc"] == [
        [_mq(0)], [_mq(1)], [],
    ]  # fmt: skip
    assert allocate_averagely("zz", queues, ["a"]) == []


@given(st.integers(0, 40), st.integers(1, 12))
def test_allocate_partitions(n_queues: int, n_clients: int) -> None:
    """Every queue goes to exactly one client; shares differ by at most one."""
    queues = [_mq(i) for i in range(n_queues)]
    cids = [f"c{i:02}" for i in range(n_clients)]
    shares = [allocate_averagely(c, queues, cids) for c in cids]
    flat = [q for share in shares for q in share]
    assert sorted(flat) == sorted(queues)
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1


# ---------------------------------------------------------------------- process queue
def test_process_queue_commits_smallest_unfinished() -> None:
    """removeMessage's rule: commit = smallest unfinished offset, else next offset."""
    pq = ProcessQueue(next_offset=10)
    added = pq.put([_msg(10), _msg(11), _msg(12)], next_offset=13)
    assert len(added) == 3 and pq.count == 3 and pq.commit_offset == 10
    assert pq.remove(11) == 2
    assert pq.commit_offset == 10  # 10 still running holds the offset back (seed 003)
    assert pq.remove(10) == 2 and pq.commit_offset == 12
    assert pq.remove(10) is None  # finished twice: nothing happens
    assert pq.remove(12) == 2 and pq.commit_offset == 13 and pq.cached_bytes == 0


def test_process_queue_duplicates_filtered_and_span() -> None:
    """Duplicates are skipped; a pull that found nothing still moves next_offset on; span
    and head follow the offsets held."""
    pq = ProcessQueue(next_offset=0)
    pq.put([_msg(0), _msg(5)], next_offset=6)
    assert pq.put([_msg(5)], next_offset=6) == []
    assert pq.span == 5 and pq.head() is not None and pq.head().queue_offset == 0  # type: ignore[union-attr]
    pq.put([], next_offset=9)  # filtered messages: the offset moves on
    assert pq.next_offset == 9
    assert pq.clear() == (2, 4) and pq.commit_offset == 9 and pq.head() is None


# ---------------------------------------------------------------------- cache budget
def test_cache_budget_never_overshoots() -> None:
    """Concurrent reservations together never exceed the message limit; bytes over the
    limit stop all fetching until released."""
    budget = CacheBudget(max_messages=10, max_bytes=100)
    assert budget.try_reserve(8) == 8
    assert budget.try_reserve(8) == 2  # only what is left
    assert budget.try_reserve(1) == 0
    budget.fill(8, 3, 30)  # a fetch reserved 8 and brought 3: 5 come back
    assert budget.cached == 3 and budget.reserved == 2
    assert budget.try_reserve(32) == 5
    budget.fill(2, 2, 80)
    budget.fill(5, 0, 0)
    assert budget.cached_bytes == 110 and budget.try_reserve(1) == 0  # over the byte limit
    budget.release(2, 80)
    assert budget.try_reserve(1) == 1 and budget.peak_cached == 5
    with pytest.raises(ValueError, match="reserved"):
        budget.fill(1, 2, 0)


# ---------------------------------------------------------------------- options, helpers
def test_options_defaults_and_validation() -> None:
    """RocketMQ's defaults; pop back-off doubles up to its cap; bad values are refused."""
    opts = PushOptions()
    assert opts.long_poll_s == 20.0 and PushOptions(mode="pull").long_poll_s == 15.0
    assert opts.consume_timeout == 900.0 and opts.invisible_ms == 910_000
    assert [opts.retry_backoff(a) for a in (1, 2, 3, 10)] == [1.0, 2.0, 4.0, 60.0]
    for bad in ({"mode": "push"}, {"consume_from": "middle"}, {"pull_batch_size": 33},
                {"consume_concurrency": 0}, {"consume_timeout": 0}):  # fmt: skip
        with pytest.raises(ValueError, match="must"):
            PushOptions(**bad)


def test_tag_matches_and_async_detection() -> None:
    """Tag expressions as RocketMQ reads them; async listeners are recognised."""
    assert tag_matches("*", None) and tag_matches("a || b", "b")
    assert not tag_matches("a || b", "c") and not tag_matches("a", None)

    async def coro(m: ReceivedMessage) -> ConsumeResult:
        return ConsumeResult.SUCCESS

    class Handler:
        async def __call__(self, m: ReceivedMessage) -> ConsumeResult:
            return ConsumeResult.SUCCESS

    assert is_async_listener(coro) and is_async_listener(Handler())
    assert not is_async_listener(lambda m: ConsumeResult.SUCCESS)


# ---------------------------------------------------------------------- runner (mock clock)
async def test_runner_outcomes_and_deadline(autojump_clock: trio.testing.MockClock) -> None:
    """Success, failures of every kind, and a timeout at the call's own deadline."""

    async def listener(m: ReceivedMessage) -> object:
        if m.body == b"ok":
            return ConsumeResult.SUCCESS
        if m.body == b"raise":
            raise RuntimeError("boom")
        if m.body == b"slow":
            await trio.sleep(1000)
        return ConsumeResult.RETRY_LATER if m.body == b"later" else None

    runtime = Runtime(listener, PushOptions(consume_timeout=7.5))
    assert await runtime.consume(_msg(0, b"ok")) is Outcome.SUCCESS
    assert await runtime.consume(_msg(1, b"raise")) is Outcome.FAILURE
    assert await runtime.consume(_msg(2, b"later")) is Outcome.FAILURE
    assert await runtime.consume(_msg(3, b"none")) is Outcome.FAILURE
    start = trio.current_time()
    assert await runtime.consume(_msg(4, b"slow")) is Outcome.TIMEOUT
    assert trio.current_time() - start == pytest.approx(7.5)  # its own deadline, no scan
    stats = runtime.statistics()
    assert (stats.consumed, stats.failed, stats.timed_out) == (1, 4, 1)


async def test_runner_concurrency_bound(autojump_clock: trio.testing.MockClock) -> None:
    """At most consume_concurrency calls run at once; a closing runner skips queued ones."""
    running = peak = 0

    async def listener(m: ReceivedMessage) -> ConsumeResult:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(1)
        running -= 1
        return ConsumeResult.SUCCESS

    runtime = Runtime(listener, PushOptions(consume_concurrency=3))
    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(runtime.consume, _msg(i))
    assert peak == 3 and runtime.statistics().peak_active_calls == 3
    runtime.closing = True
    assert await runtime.consume(_msg(99)) is Outcome.SKIPPED


async def test_runner_sync_listener_in_thread() -> None:
    """A sync listener runs in a worker thread; one past its deadline is abandoned: the
    call returns TIMEOUT while the thread is still blocked (it is released only after)."""
    release = threading.Event()

    def listener(m: ReceivedMessage) -> ConsumeResult:
        if m.body == b"slow":
            release.wait(30)
        return ConsumeResult.SUCCESS

    runtime = Runtime(listener, PushOptions(consume_timeout=0.2))
    try:
        assert await runtime.consume(_msg(0, b"ok")) is Outcome.SUCCESS
        start = trio.current_time()
        with trio.fail_after(10):  # not abandoned: it would wait the thread's 30 s
            assert await runtime.consume(_msg(1, b"slow")) is Outcome.TIMEOUT
        assert trio.current_time() - start >= 0.2  # not before its deadline
        assert not release.is_set()
    finally:
        release.set()
