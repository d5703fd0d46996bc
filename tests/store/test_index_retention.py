"""The key index (query by UNIQ_KEY / KEYS) and retention of old segments."""

from __future__ import annotations

import os
from pathlib import Path

from broker.store.api import GetStatus, MessageToStore
from broker.store.config import StoreConfig
from broker.store.index import ROW_SIZE, KeyIndex
from broker.store.store import MessageStore
from protocol.message import decode_record


def config(path: Path) -> StoreConfig:
    # The disk probe says "empty": retention runs only when scheduled, whatever the disk.
    return StoreConfig(path, segment_size=8192, cq_entries_per_file=16, disk_probe=lambda _: 0.0)


def put_keyed(store: MessageStore, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        msg = MessageToStore(
            "TopicA",
            i % 2,
            b"m%d" % i,
            {"KEYS": f"order-{i % 10} all", "UNIQ_KEY": f"U{i:05d}"},
        )
        assert store.put_nowait(msg).ok


def bodies(records: list[bytes]) -> list[bytes]:
    return [decode_record(r)[0].body for r in records]


def test_lookup_by_uniq_key_and_keys_newest_first(tmp_path: Path) -> None:
    with MessageStore.open(config(tmp_path)) as store:
        put_keyed(store, 50)
        assert bodies(store.messages_by_key("TopicA", "U00007")) == [b"m7"]
        assert bodies(store.messages_by_key("TopicA", "order-3")) == [
            b"m43", b"m33", b"m23", b"m13", b"m3"
        ]  # fmt: skip
        assert len(store.messages_by_key("TopicA", "all", max_num=7)) == 7
        assert store.messages_by_key("OtherTopic", "order-3") == []


def test_lookup_honours_the_time_window(tmp_path: Path) -> None:
    now = [1_000]
    with MessageStore.open(config(tmp_path), clock_ms=lambda: now[0]) as store:
        for i in range(4):
            now[0] = 1_000 + i * 100
            store.put_nowait(MessageToStore("TopicA", 0, b"t%d" % i, {"KEYS": "k"}))
        got = store.messages_by_key("TopicA", "k", begin_ms=1_100, end_ms=1_200)
        assert bodies(got) == [b"t2", b"t1"]


def test_index_survives_clean_close_and_crash(tmp_path: Path) -> None:
    store = MessageStore.open(config(tmp_path))
    put_keyed(store, 30)
    store.checkpoint()
    put_keyed(store, 10, start=30)  # after the checkpoint: re-indexed by recovery
    store.log.write_out()
    store._release()  # simulated kill -9
    with MessageStore.open(config(tmp_path)) as store:
        assert bodies(store.messages_by_key("TopicA", "U00035")) == [b"m35"]
        assert len(store.messages_by_key("TopicA", "all", max_num=100)) == 40
    with MessageStore.open(config(tmp_path)) as store:
        assert store.statistics().recovered_records == 0
        assert len(store.messages_by_key("TopicA", "all", max_num=100)) == 40


def test_index_forgets_records_lost_in_a_crash(tmp_path: Path) -> None:
    store = MessageStore.open(config(tmp_path))
    put_keyed(store, 10)
    store.checkpoint()
    lost_from = store.log.end
    put_keyed(store, 5, start=10)
    ticket = store.checkpoint_begin()
    store.index.write(ticket.index_rows)  # index rows committed, then the machine dies
    store._release()
    # ...and the log bytes after the checkpoint never reached the disk.
    segment = store.config.commitlog_dir / f"{0:020d}"
    with segment.open("r+b") as f:
        f.seek(lost_from)
        f.write(bytes(store.log.end - lost_from))
    with MessageStore.open(config(tmp_path)) as store:
        assert store.log.end == lost_from
        # New records now sit where the lost ones were; stale rows would point at them.
        store.put_nowait(MessageToStore("TopicA", 0, b"new", {"KEYS": "fresh"}))
        assert store.messages_by_key("TopicA", "U00010") == []
        assert bodies(store.messages_by_key("TopicA", "fresh")) == [b"new"]
        assert store.messages_by_key("TopicA", "U00012") == []
        assert bodies(store.messages_by_key("TopicA", "U00003")) == [b"m3"]


def test_key_index_rows_in_flight_stay_visible(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, segment_size=1000)
    index.add("k", 10)
    batch = index.take()
    assert index.candidates("k", 10) == [10]  # taken, not yet written
    index.write(batch)
    index.written(batch)
    index.add("k", 20)
    index.add("other", 20)
    assert index.candidates("k", 10) == [20, 10]
    index.write(index.take())
    index.truncate_from(15)
    assert index.candidates("k", 10) == [10]
    index.delete_before(1000)
    assert index.candidates("k", 10) == []


def test_key_index_files_follow_segments_and_cut_at_the_offset(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, segment_size=1000)
    for offset in range(0, 3000, 10):
        index.add("k", offset)
        index.add(f"u{offset}", offset)
    batch = index.take()
    index.write(batch)
    index.written(batch)
    assert index.segments() == [0, 1000, 2000]
    index.truncate_from(1505)
    assert index.segments() == [0, 1000]
    assert index.candidates("k", 1000)[0] == 1500
    index.delete_before(1000)
    assert index.candidates("k", 1000)[-1] == 1000
    assert index.candidates("u1490", 5) == [1490]


def test_key_index_cuts_a_torn_or_zeroed_tail(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, segment_size=1 << 20)
    for offset in range(100):
        index.add("k", offset)
    batch = index.take()
    index.write(batch)
    path = tmp_path / f"{0:020d}.idx"
    with path.open("ab") as f:
        f.write(bytes(ROW_SIZE * 3) + b"\x01\x02")  # a crashed append: zeros and a torn row
    index.truncate_from(10**5)  # recovery scanned from an offset in the same segment
    assert path.stat().st_size == 100 * ROW_SIZE
    assert index.candidates("k", 1000) == list(range(99, -1, -1))


def test_lookup_survives_hash_collisions(tmp_path: Path) -> None:
    with MessageStore.open(config(tmp_path)) as store:
        put_keyed(store, 3)
        # Forge a row claiming that another key lives at record 0's offset.
        first = store.get("TopicA", 0, 0, 1).commit_log_offsets[0]
        store.index.add("forged", first)
        assert store.messages_by_key("TopicA", "forged") == []


#: "Now" for the retention tests: a fixed instant, so no test depends on the date.
NOW_S = 1_800_000_000.0


def age(store: MessageStore, starts: list[int], hours: float) -> None:
    """Segments ``starts`` were last written ``hours`` before NOW_S, the others at NOW_S
    (the kernel stamps files with the real date, which the tests must not depend on)."""
    for start in store.log.segment_starts:
        mtime = NOW_S - hours * 3600 if start in starts else NOW_S
        os.utime(store.config.commitlog_dir / f"{start:020d}", (mtime, mtime))


def test_retention_deletes_expired_segments_only_when_due(tmp_path: Path) -> None:
    with MessageStore.open(config(tmp_path)) as store:
        put_keyed(store, 600)
        store.checkpoint()
        starts = store.log.segment_starts
        assert len(starts) > 4
        age(store, starts[:3], hours=80)
        # Not scheduled and the disk is not full (the probe says 0 %): nothing happens.
        assert store.delete_expired(NOW_S) == 0
        assert store.delete_expired(NOW_S, scheduled=True) == 3
        assert store.log.min_offset == starts[3]
        low = store.min_offset("TopicA", 0)
        assert low > 0
        got = store.get("TopicA", 0, low, 4)
        assert got.status is GetStatus.FOUND
        assert got.count == 4
        assert store.get("TopicA", 0, 0, 4).status is GetStatus.OFFSET_TOO_SMALL
        assert all(
            decode_record(r)[0].commit_log_offset >= starts[3]
            for r in store.messages_by_key("TopicA", "all", max_num=1000)
        )
    with MessageStore.open(config(tmp_path)) as store:
        assert store.log.min_offset == starts[3]
        assert store.min_offset("TopicA", 0) == low


def test_retention_never_deletes_the_active_segment(tmp_path: Path) -> None:
    with MessageStore.open(config(tmp_path)) as store:
        put_keyed(store, 600)
        store.checkpoint()
        starts = store.log.segment_starts
        age(store, starts, hours=100)
        assert store.delete_expired(NOW_S, scheduled=True) == len(starts) - 1
        assert store.log.segment_starts == [starts[-1]]
        put_keyed(store, 5, start=600)
        assert store.get("TopicA", 0, store.max_offset("TopicA", 0) - 1, 1).count == 1


def test_retention_when_the_disk_is_fuller_than_the_ratio(tmp_path: Path) -> None:
    cfg = StoreConfig(tmp_path, segment_size=8192, cq_entries_per_file=16,
                      disk_probe=lambda _: 0.8)  # fmt: skip
    with MessageStore.open(cfg) as store:
        put_keyed(store, 600)
        store.checkpoint()
        age(store, store.log.segment_starts[:2], hours=80)
        assert store.delete_expired(NOW_S) == 2  # unscheduled, but the disk is past 0.75
