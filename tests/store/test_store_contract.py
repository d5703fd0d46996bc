"""The MessageStore contract, over its public API, in both flush modes.

In SYNC mode a record is dispatched (readable, announced) only once it is durable, so the
tests call :func:`settle` (a flush) before they read.
"""

from __future__ import annotations

import itertools
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.store.api import (
    FlushMode,
    GetStatus,
    MessageToStore,
    PutResult,
    PutStatus,
    StoreClosedError,
    StoreError,
)
from broker.store.commitlog import segment_name
from broker.store.store import MessageStore
from broker.store.tickets import StoreStatistics
from protocol.message import (
    BLANK_MAGIC,
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    decode_record,
    decode_records,
)
from protocol.msgid import encode_offset_msg_id
from protocol.properties import CRC32, KEYS, TAGS, java_string_hash
from tests.store.support import Clock, bodies, crash, read_queue, store_config


@pytest.fixture(params=[FlushMode.ASYNC, FlushMode.SYNC], ids=["async", "sync"])
def mode(request: pytest.FixtureRequest) -> FlushMode:
    value: FlushMode = request.param
    return value


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path, mode: FlushMode, clock: Clock) -> Iterator[MessageStore]:
    s = MessageStore.open(store_config(tmp_path / "store", mode), clock_ms=clock)
    yield s
    s.close()


def settle(store: MessageStore) -> None:
    """Make what was put readable: SYNC mode dispatches only durable records."""
    if store.config.flush_mode is FlushMode.SYNC:
        store.flush()


def reopen(store: MessageStore) -> MessageStore:
    store.close()
    return MessageStore.open(store.config)


def put(
    store: MessageStore,
    topic: str,
    queue_id: int,
    body: bytes,
    properties: Mapping[str, str] | None = None,
    *,
    sys_flag: int = 0,
) -> PutResult:
    result = store.put_nowait(
        MessageToStore(topic, queue_id, body, dict(properties or {}), sys_flag=sys_flag)
    )
    assert result.status is PutStatus.PUT_OK, result.remark
    return result


# ---------------------------------------------------------------------- round trips


def test_put_get_round_trip_keeps_every_field(store: MessageStore, clock: Clock) -> None:
    sent: list[tuple[MessageToStore, PutResult]] = []
    for i in range(12):
        clock.now += 7
        props = {TAGS: f"tag{i % 3}", KEYS: f"k{i} shared", "custom": f"v{i}"}
        msg = MessageToStore(
            f"Topic{i % 2}",
            i % 3,
            b"body-%d-" % i + bytes(range(i * 10 % 256)),
            props,
            flag=i,
            born_timestamp=1_600_000_000_000 + i,
            born_host=(f"10.0.0.{i + 1}", 5000 + i),
            reconsume_times=i % 2,
        )
        result = store.put_nowait(msg)
        assert result.ok, result.remark
        assert result.store_timestamp == clock.now
        assert result.msg_id == encode_offset_msg_id("127.0.0.1", 10911, result.commit_log_offset)
        sent.append((msg, result))
    settle(store)
    for msg, result in sent:
        got = store.get(msg.topic, msg.queue_id, result.queue_offset, 1)
        assert got.status is GetStatus.FOUND
        assert got.offsets == (result.queue_offset,)
        assert got.commit_log_offsets == (result.commit_log_offset,)
        assert got.next_offset == result.queue_offset + 1
        assert len(got.body) == result.size
        [ext] = decode_records(got.body, verify_crc=True)
        assert ext.topic == msg.topic
        assert ext.queue_id == msg.queue_id
        assert ext.queue_offset == result.queue_offset
        assert ext.commit_log_offset == result.commit_log_offset
        assert ext.body == msg.body
        assert ext.flag == msg.flag
        assert ext.born_timestamp == msg.born_timestamp
        assert ext.born_host == msg.born_host
        assert ext.store_timestamp == result.store_timestamp
        assert ext.store_host == ("127.0.0.1", 10911)
        assert ext.reconsume_times == msg.reconsume_times
        assert {k: v for k, v in ext.properties.items() if k != CRC32} == msg.properties
        assert ext.properties[CRC32].isdigit()
        assert ext.properties[TAGS] == msg.properties[TAGS]
        assert ext.properties[KEYS] == msg.properties[KEYS]


def test_incoming_crc_property_is_replaced(store: MessageStore) -> None:
    result = put(store, "T", 0, b"x", {CRC32: "bogus", "a": "b"})
    settle(store)
    [ext] = decode_records(store.get("T", 0, 0).body, verify_crc=True)
    assert ext.properties["a"] == "b"
    assert ext.properties[CRC32] != "bogus"
    assert ext.commit_log_offset == result.commit_log_offset


def test_queue_offsets_are_dense_per_queue(store: MessageStore) -> None:
    expected: dict[tuple[str, int], int] = {}
    order = [("A", 0), ("A", 1), ("B", 0), ("A", 0), ("A", 0), ("B", 0), ("A", 2), ("A", 1)] * 4
    last_end = 0
    for i, key in enumerate(order):
        result = put(store, key[0], key[1], b"%d" % i)
        assert result.queue_offset == expected.get(key, 0)
        assert result.commit_log_offset >= last_end  # the log only grows
        last_end = result.end_offset
        expected[key] = result.queue_offset + 1
    settle(store)
    for (topic, qid), count in expected.items():
        assert store.min_offset(topic, qid) == 0
        assert store.max_offset(topic, qid) == count
        assert len(read_queue(store, topic, qid)) == count
    assert store.topics() == {"A": [0, 1, 2], "B": [0]}


def test_get_body_is_the_exact_stored_records(store: MessageStore) -> None:
    for i in range(30):
        put(store, "T", i % 2, b"payload %d " % i * (i % 5 + 1), {TAGS: "t"})
    settle(store)
    for qid in (0, 1):
        got = store.get("T", qid, 2, 9)
        assert got.count == 9
        stored = [store.message_at(o) for o in got.commit_log_offsets]
        assert all(s is not None for s in stored)
        assert got.body == b"".join(s for s in stored if s is not None)
        assert [m.queue_offset for m in decode_records(got.body, verify_crc=True)] == list(
            got.offsets
        )


# ---------------------------------------------------------------------- statuses


def test_read_statuses_and_next_offsets(store: MessageStore) -> None:
    for i in range(5):
        put(store, "T", 1, b"m%d" % i)
    settle(store)

    got = store.get("Unknown", 0, 0)
    assert (got.status, got.next_offset) == (GetStatus.NO_MATCHED_LOGIC_QUEUE, 0)
    assert store.get("T", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE  # known topic
    assert store.get("T", 7, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE

    got = store.get("T", 1, 0, 3)
    assert (got.status, got.next_offset, got.min_offset, got.max_offset) == (
        GetStatus.FOUND, 3, 0, 5,
    )  # fmt: skip
    assert bodies(got) == [b"m0", b"m1", b"m2"]
    got = store.get("T", 1, 3, 32)
    assert (got.status, got.next_offset, bodies(got)) == (GetStatus.FOUND, 5, [b"m3", b"m4"])

    got = store.get("T", 1, -1)
    assert (got.status, got.next_offset) == (GetStatus.OFFSET_TOO_SMALL, 0)
    got = store.get("T", 1, 5)
    assert (got.status, got.next_offset, got.body) == (GetStatus.OFFSET_OVERFLOW_ONE, 5, b"")
    got = store.get("T", 1, 6)
    assert (got.status, got.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, 5)
    got = store.get("T", 1, 10_000)
    assert (got.status, got.next_offset, got.max_offset) == (
        GetStatus.OFFSET_OVERFLOW_BADLY, 5, 5,
    )  # fmt: skip


def test_no_message_in_queue_points_at_offset_zero(tmp_path: Path, mode: FlushMode) -> None:
    config = store_config(tmp_path, mode)
    store = MessageStore.open(config)
    put(store, "T", 0, b"never durable")
    crash(store)  # nothing was flushed: the queue exists, its only message is gone
    with MessageStore.open(config) as store:
        assert store.topics() == {"T": [0]}
        for offset in (0, 3):
            got = store.get("T", 0, offset)
            assert got.status is GetStatus.NO_MESSAGE_IN_QUEUE
            # Where the queue's first message will go (RocketMQ answers 0 too): a consumer
            # that was ahead before the crash must not skip the messages that come next.
            assert got.next_offset == 0
        assert put(store, "T", 0, b"again").queue_offset == 0
        settle(store)
        assert read_queue(store, "T", 0) == [b"again"]


def test_sync_mode_reads_nothing_before_the_flush(tmp_path: Path) -> None:
    with MessageStore.open(store_config(tmp_path, FlushMode.SYNC)) as store:
        put(store, "T", 0, b"a")
        assert store.get("T", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
        put(store, "T", 0, b"b")
        store.flush()
        put(store, "T", 0, b"c")
        assert store.max_offset("T", 0) == 2
        assert store.get("T", 0, 2).status is GetStatus.OFFSET_OVERFLOW_ONE
        store.flush()
        assert read_queue(store, "T", 0) == [b"a", b"b", b"c"]


def test_offset_too_small_after_retention(tmp_path: Path, mode: FlushMode) -> None:
    with MessageStore.open(store_config(tmp_path, mode)) as store:
        for i in range(80):
            put(store, "T", 0, b"%03d" % i * 100)
        store.checkpoint()
        assert len(store.log.segment_starts) > 3
        assert store.delete_expired(time.time() + 365 * 86400, scheduled=True) > 0
        low = store.min_offset("T", 0)
        assert 0 < low < 80
        got = store.get("T", 0, low - 1)
        assert (got.status, got.next_offset) == (GetStatus.OFFSET_TOO_SMALL, low)
        got = store.get("T", 0, low, 1)
        assert bodies(got) == [b"%03d" % low * 100]


# ---------------------------------------------------------------------- limits and filters


def test_max_count_and_max_bytes(store: MessageStore) -> None:
    sizes = [put(store, "T", 0, bytes([i]) * 100).size for i in range(10)]
    settle(store)
    got = store.get("T", 0, 0, 3)
    assert (got.count, got.next_offset) == (3, 3)
    got = store.get("T", 0, 4, 100)
    assert (got.count, got.next_offset) == (6, 10)
    # Byte budget: whole records only, as many as fit...
    got = store.get("T", 0, 0, 32, max_bytes=sizes[0] + sizes[1] + sizes[2] // 2)
    assert (got.count, got.next_offset) == (2, 2)
    got = store.get("T", 0, 0, 32, max_bytes=sizes[0] + sizes[1])
    assert got.count == 2
    # ...but at least one, however small the budget.
    got = store.get("T", 0, 5, 32, max_bytes=1)
    assert (got.count, got.next_offset, bodies(got)) == (1, 6, [bytes([5]) * 100])
    assert len(got.body) == sizes[5] > 1


def test_tag_filter_by_hash_set(store: MessageStore) -> None:
    tags = ["A", "B", "C", "", "A"]
    for i in range(20):
        tag = tags[i % len(tags)]
        put(store, "T", 0, b"%d" % i, {TAGS: tag} if tag else {})
    settle(store)
    code_a, code_c = java_string_hash("A"), java_string_hash("C")
    want_a = [b"%d" % i for i in range(20) if tags[i % 5] == "A"]
    got = store.get("T", 0, 0, 32, tags_codes=frozenset({code_a}))
    assert (got.status, bodies(got), got.next_offset) == (GetStatus.FOUND, want_a, 20)
    assert {m.properties[TAGS] for m in decode_records(got.body)} == {"A"}
    got = store.get("T", 0, 0, 2, tags_codes=frozenset({code_a}))
    assert bodies(got) == [b"0", b"4"]
    assert got.offsets == (0, 4)
    assert got.next_offset == 5  # just past the last one taken
    got = store.get("T", 0, 0, 32, tags_codes=frozenset({code_a, code_c}))
    assert bodies(got) == [b"%d" % i for i in range(20) if tags[i % 5] in ("A", "C")]
    got = store.get("T", 0, 0, 32, tags_codes=frozenset({java_string_hash("Z")}))
    assert (got.status, got.next_offset, got.body) == (GetStatus.NO_MATCHED_MESSAGE, 20, b"")
    got = store.get("T", 0, 1, 32, tags_codes=frozenset({code_a}))
    assert got.offsets[0] == 4  # filtered-out entries are skipped from the start offset on


# ---------------------------------------------------------------------- lookups


def test_offset_by_time_with_an_injected_clock(store: MessageStore, clock: Clock) -> None:
    base = clock.now
    for i in range(20):
        clock.now = base + 10 * i
        put(store, "T", 0, b"%d" % i)
    settle(store)
    assert store.offset_by_time("T", 0, 0) == 0
    assert store.offset_by_time("T", 0, base) == 0
    assert store.offset_by_time("T", 0, base + 1) == 1
    assert store.offset_by_time("T", 0, base + 50) == 5
    assert store.offset_by_time("T", 0, base + 55) == 6
    assert store.offset_by_time("T", 0, base + 190) == 19
    assert store.offset_by_time("T", 0, base + 191) == 20  # max offset: none that late
    assert store.offset_by_time("Unknown", 0, base) == 0


def test_message_at_commit_log_offsets(store: MessageStore) -> None:
    results = [put(store, "T", i % 2, b"\x00\x00\x10\x00" * 40 + bytes([i])) for i in range(60)]
    settle(store)
    gaps = [
        a.end_offset for a, b in itertools.pairwise(results) if a.end_offset != b.commit_log_offset
    ]
    assert gaps  # several segments, so blank markers
    store = reopen(store)  # reads now come from the files, not the in-memory tail
    try:
        for r in results:
            data = store.message_at(r.commit_log_offset)
            assert data is not None
            assert len(data) == r.size
            assert decode_record(data)[0].queue_offset == r.queue_offset
        # Not a record start: inside records (their bodies hold 4096 as a size field,
        # which reaches past their segment's end), blank markers, the end, outside.
        for r in results[::7]:
            for delta in range(1, r.size, 3):
                assert store.message_at(r.commit_log_offset + delta) is None
        for gap in gaps:
            assert store.message_at(gap) is None
        assert store.message_at(results[-1].end_offset) is None
        assert store.message_at(-1) is None
        assert store.message_at(10**12) is None
    finally:
        store.close()


# ---------------------------------------------------------------------- segments


def test_segment_roll_and_blank_markers(tmp_path: Path, mode: FlushMode) -> None:
    segment_size = 4096
    config = store_config(tmp_path, mode, segment_size=segment_size)
    sent: list[tuple[PutResult, bytes]] = []
    with MessageStore.open(config) as store:
        for i in range(45):
            body = bytes([65 + i % 26]) * (150 + 37 * i % 400)
            sent.append((put(store, "Roll", i % 2, body), body))
        settle(store)
        served = {q: read_queue(store, "Roll", q) for q in (0, 1)}
        assert served == {q: [body for _, body in sent][q::2] for q in (0, 1)}
    results = [r for r, _ in sent]
    for r in results:  # never straddles a segment
        assert r.commit_log_offset // segment_size == (r.end_offset - 1) // segment_size
    files = sorted(config.commitlog_dir.iterdir())
    assert [f.name for f in files] == [segment_name(i * segment_size) for i in range(len(files))]
    assert len(files) >= 4
    assert all(f.stat().st_size == segment_size for f in files)  # preallocated
    rolls = 0
    for a, b in itertools.pairwise(results):
        if a.end_offset == b.commit_log_offset:
            continue
        rolls += 1
        assert b.commit_log_offset % segment_size == 0
        assert b.commit_log_offset - a.end_offset < a.size + b.size
        data = files[a.end_offset // segment_size].read_bytes()
        rel = a.end_offset % segment_size
        size, magic = struct.unpack_from(">iI", data, rel)
        assert (size, magic) == (segment_size - rel, BLANK_MAGIC)
    assert rolls == len(files) - 1
    with MessageStore.open(config) as store:
        assert store.statistics().recovered_records == 0
        assert {q: read_queue(store, "Roll", q) for q in (0, 1)} == served


# ---------------------------------------------------------------------- illegal input


@pytest.mark.parametrize(
    ("topic", "queue_id", "properties"),
    [
        ("../x", 0, {}),
        ("a b", 0, {}),
        ("", 0, {}),
        ("a/b", 0, {}),
        ("\ud800", 0, {}),
        ("x" * 200, 0, {}),
        ("T", -1, {}),
        ("T", 65_536, {}),
        ("T", 0, {"k": "a\x01b"}),
        ("T", 0, {"k": "a\x02b"}),
        ("T", 0, {"k\x01": "v"}),
        ("T", 0, {"k": ""}),
        ("T", 0, {"k": "\udc80"}),
    ],
)
def test_illegal_messages_are_refused(
    store: MessageStore, topic: str, queue_id: int, properties: dict[str, str]
) -> None:
    end = store.log.end
    result = store.put_nowait(MessageToStore(topic, queue_id, b"body", properties))
    assert result.status is PutStatus.MESSAGE_ILLEGAL
    assert result.remark
    assert not result.ok
    assert store.log.end == end  # nothing appended
    assert not (store.config.data_dir / "x").exists()  # "../x" made no directory
    assert put(store, "T", 0, b"fine").queue_offset == 0


def test_oversized_bodies_and_properties(tmp_path: Path, mode: FlushMode) -> None:
    config = store_config(tmp_path, mode, segment_size=1 << 16, max_message_size=20_000)
    with MessageStore.open(config) as store:
        result = store.put_nowait(MessageToStore("T", 0, b"x" * 20_001))
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert "20001" in result.remark
        assert put(store, "T", 0, b"x" * 20_000).queue_offset == 0
        result = store.put_nowait(MessageToStore("T", 0, b"x", {"big": "v" * 40_000}))
        assert result.status is PutStatus.PROPERTIES_SIZE_EXCEEDED
        assert put(store, "T", 0, b"y").queue_offset == 1
        settle(store)
        assert read_queue(store, "T", 0) == [b"x" * 20_000, b"y"]
    small = store_config(tmp_path / "small", mode, segment_size=4096)
    with MessageStore.open(small) as store:  # fits max_message_size but no segment
        result = store.put_nowait(MessageToStore("T", 0, b"x" * 5000))
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert "does not fit" in result.remark


def test_put_after_close_raises(tmp_path: Path, mode: FlushMode) -> None:
    store = MessageStore.open(store_config(tmp_path, mode))
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosedError):
        store.put_nowait(MessageToStore("T", 0, b"late"))


# ---------------------------------------------------------------------- arrivals


@dataclass(frozen=True, slots=True)
class Arrival:
    topic: str
    queue_id: int
    queue_offset: int
    tags_code: int
    store_timestamp: int
    properties: dict[str, str]


class Recorder:
    """An ArrivalListener that records its calls and raises on every ``fail_every``-th."""

    def __init__(self, fail_every: int = 0) -> None:
        self.calls: list[Arrival] = []
        self.fail_every = fail_every

    def arriving(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        store_timestamp: int,
        properties: Mapping[str, str],
    ) -> None:
        self.calls.append(
            Arrival(topic, queue_id, queue_offset, tags_code, store_timestamp, dict(properties))
        )
        if self.fail_every and len(self.calls) % self.fail_every == 0:
            raise RuntimeError("a listener bug")


def test_listener_is_told_once_per_dispatched_message(
    tmp_path: Path, mode: FlushMode, clock: Clock
) -> None:
    recorder = Recorder()
    expected: list[Arrival] = []
    with MessageStore.open(store_config(tmp_path, mode), recorder, clock_ms=clock) as store:
        for i in range(10):
            clock.now += 1
            props = {TAGS: f"tag{i % 2}", "n": str(i)} if i % 3 else {"n": str(i)}
            r = put(store, f"T{i % 2}", i % 3, b"%d" % i, props)
            code = java_string_hash(props[TAGS]) if TAGS in props else 0
            expected.append(Arrival(f"T{i % 2}", i % 3, r.queue_offset, code, clock.now, props))
        put(store, "T0", 0, b"prepared", sys_flag=SYSFLAG_TRANSACTION_PREPARED)
        if mode is FlushMode.SYNC:
            assert recorder.calls == []  # nothing is announced before it is durable
            store.flush()
        assert recorder.calls == expected
        store.flush()
        assert recorder.calls == expected  # once each
    assert recorder.calls == expected  # close announces nothing twice


def test_a_raising_listener_does_not_stall_dispatch(tmp_path: Path, mode: FlushMode) -> None:
    recorder = Recorder(fail_every=2)
    with MessageStore.open(store_config(tmp_path, mode), recorder) as store:
        for i in range(9):
            put(store, "T", 0, b"%d" % i)
        settle(store)
        assert len(recorder.calls) == 9
        assert store.statistics().listener_errors == 4
        assert read_queue(store, "T", 0) == [b"%d" % i for i in range(9)]


def test_statistics_are_a_frozen_snapshot_of_the_counters(store: MessageStore) -> None:
    before = store.statistics()
    assert isinstance(before, StoreStatistics)
    assert (before.puts, before.put_errors, before.checkpoints, before.last_disk_error) == (
        0, 0, 0, "",
    )  # fmt: skip
    for i in range(3):
        put(store, "T", 0, b"%d" % i)
    store.checkpoint()
    after = store.statistics()
    assert (after.puts, after.checkpoints) == (3, 1)
    assert (before.puts, before.checkpoints) == (0, 0)  # a snapshot: not changed since
    with pytest.raises(AttributeError):
        after.puts = 0  # type: ignore[misc]


# ---------------------------------------------------------------------- transactions


def test_prepared_messages_are_stored_but_not_dispatched(tmp_path: Path, mode: FlushMode) -> None:
    config = store_config(tmp_path, mode)
    store = MessageStore.open(config)
    prepared = put(store, "Tx", 0, b"half", sys_flag=SYSFLAG_TRANSACTION_PREPARED)
    rolled_back = put(store, "Tx", 0, b"undone", sys_flag=SYSFLAG_TRANSACTION_ROLLBACK)
    committed = put(store, "Tx", 0, b"commit", sys_flag=SYSFLAG_TRANSACTION_COMMIT)
    plain = put(store, "Tx", 0, b"plain")
    settle(store)
    assert [committed.queue_offset, plain.queue_offset] == [0, 1]
    assert read_queue(store, "Tx", 0) == [b"commit", b"plain"]
    for r, sys_flag in ((prepared, SYSFLAG_TRANSACTION_PREPARED), (rolled_back, 0xC)):
        data = store.message_at(r.commit_log_offset)
        assert data is not None
        ext = decode_record(data)[0]
        assert ext.sys_flag & 0xC == sys_flag
    prepared_only = put(store, "TxOnly", 0, b"half", sys_flag=SYSFLAG_TRANSACTION_PREPARED)
    settle(store)
    assert store.get("TxOnly", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    store.flush()
    crash(store)  # recovery re-scans them: still not dispatched
    with MessageStore.open(config) as store:
        assert store.statistics().recovered_records >= 5
        assert read_queue(store, "Tx", 0) == [b"commit", b"plain"]
        assert store.get("TxOnly", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        assert store.message_at(prepared_only.commit_log_offset) is not None


# ---------------------------------------------------------------------- reopen


def test_clean_reopen_keeps_everything_and_scans_nothing(
    tmp_path: Path, mode: FlushMode, clock: Clock
) -> None:
    config = store_config(tmp_path, mode)
    results: list[PutResult] = []
    with MessageStore.open(config, clock_ms=clock) as store:
        for i in range(50):
            clock.now += 1
            results.append(put(store, f"T{i % 2}", i % 3, b"m%d" % i * 20, {TAGS: "x"}))
        settle(store)
        before = {(t, q): read_queue(store, t, q) for t, qs in store.topics().items() for q in qs}
        end = store.log.end
    for _ in range(2):
        with MessageStore.open(config, clock_ms=clock) as store:
            assert store.statistics().recovered_records == 0
            assert store.statistics().recovery_scanned_from == -1
            assert store.log.end == end
            after = {
                (t, q): read_queue(store, t, q) for t, qs in store.topics().items() for q in qs
            }
            assert after == before
            assert store.offset_by_time("T0", 0, results[0].store_timestamp + 1) == 1
    with MessageStore.open(config, clock_ms=clock) as store:
        r = put(store, "T0", 0, b"next")  # offsets continue where they were
        assert r.queue_offset == len(before[("T0", 0)])
        assert r.commit_log_offset >= end


def test_consumer_offsets_commit_persist_reload(tmp_path: Path, mode: FlushMode) -> None:
    config = store_config(tmp_path, mode)
    with MessageStore.open(config) as store:
        for i in range(6):
            put(store, "T", 0, b"%d" % i)
        store.offsets.commit("G1", "T", 0, 4)
        store.offsets.commit("G2", "T", 0, 6)
    store = MessageStore.open(config)
    assert store.offsets.query("G1", "T", 0) == 4
    assert store.offsets.query("G2", "T", 0) == 6
    assert store.offsets.query("G3", "T", 0) is None
    store.offsets.commit("G1", "T", 0, 5)
    store.checkpoint()  # persisted with the checkpoint, then the process dies
    store.offsets.commit("G2", "T", 0, 1_000)  # not persisted
    crash(store)
    store = MessageStore.open(config)
    assert store.offsets.query("G1", "T", 0) == 5
    assert store.offsets.query("G2", "T", 0) == 6
    # An offset beyond what recovery kept is pulled back to the queue's end.
    store.offsets.commit("G2", "T", 0, 50)
    store.checkpoint()
    crash(store)
    with MessageStore.open(config) as store:
        assert store.offsets.query("G2", "T", 0) == store.max_offset("T", 0) == 6


def test_a_second_open_of_the_same_directory_fails(tmp_path: Path, mode: FlushMode) -> None:
    config = store_config(tmp_path, mode)
    with MessageStore.open(config) as store:
        put(store, "T", 0, b"first")
        with pytest.raises(StoreError, match="already in use"):
            MessageStore.open(config)
        put(store, "T", 0, b"second")  # the failed open disturbed nothing
        settle(store)
        assert read_queue(store, "T", 0) == [b"first", b"second"]
    with MessageStore.open(config) as store:  # released at close
        assert store.statistics().recovered_records == 0
        assert read_queue(store, "T", 0) == [b"first", b"second"]
