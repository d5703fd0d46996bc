"""Consume queue: round trips across files, reopen, torn tails, truncation, search, retention,
write failures, and a stateful comparison against a list model."""

from __future__ import annotations

import bisect as std_bisect
import errno
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from broker.store.api import StoreClosedError, StoreCorruptError
from broker.store.consumequeue import ENTRY_SIZE, ConsumeQueue

Entry = tuple[int, int, int]


def make_entries(n: int, start_clo: int = 0) -> list[Entry]:
    """``n`` entries with increasing commit-log offsets and distinguishable fields."""
    return [(start_clo + 100 * i, 50 + i, (-1) ** i * i * 7919) for i in range(n)]


def open_queue(path: Path, per_file: int = 4) -> ConsumeQueue:
    return ConsumeQueue(path, "TopicA", 3, entries_per_file=per_file)


def fill(q: ConsumeQueue, entries: list[Entry]) -> list[int]:
    return [q.append(*e) for e in entries]


def file_names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def name_of(entry_index: int) -> str:
    return f"{entry_index * ENTRY_SIZE:020d}"


def assert_holds(q: ConsumeQueue, model: list[Entry], first: int = 0) -> None:
    """The queue serves exactly ``model`` from ``first``, through every read method."""
    assert (q.min_offset, q.max_offset) == (first, first + len(model))
    assert q.entries(first, len(model) + 5) == model
    for i, e in enumerate(model):
        assert q.entry(first + i) == e
    assert q.entry(first - 1) is None
    assert q.entry(first + len(model)) is None


@pytest.fixture
def _no_leaked_fds() -> Iterator[None]:
    before = set(os.listdir("/proc/self/fd"))
    yield
    assert set(os.listdir("/proc/self/fd")) <= before


# ---------------------------------------------------------------------- round trips


def test_append_returns_consecutive_offsets_and_reads_from_memory(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    model = make_entries(11)
    assert fill(q, model) == list(range(11))
    assert file_names(tmp_path) == []  # nothing reached the OS yet
    assert q.buffered == 11
    assert_holds(q, model)
    q.close()


def test_write_out_rolls_files_and_reads_span_memory_and_disk(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    model = make_entries(6)
    fill(q, model)
    fds = q.write_out()
    assert len(fds) == 3  # two files and the directory (files were created)
    assert file_names(tmp_path) == [name_of(0), name_of(4)]
    assert (tmp_path / name_of(0)).stat().st_size == 4 * ENTRY_SIZE
    assert (tmp_path / name_of(4)).stat().st_size == 2 * ENTRY_SIZE
    more = make_entries(7, start_clo=10_000)
    fill(q, more)  # entries 6..12: memory, while 0..5 are on disk
    model += more
    for start in range(len(model)):
        for count in range(len(model) - start + 2):
            assert q.entries(start, count) == model[start : start + count]
    assert q.write_out()  # file 4 grew, files 8 and 12 were created
    assert q.write_out() == []  # nothing new since
    assert_holds(q, model)
    q.close()


def test_entries_out_of_range_and_non_positive_counts(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(3))
    assert q.entries(-1, 5) == []
    assert q.entries(3, 5) == []
    assert q.entries(0, 0) == []
    assert q.entries(0, -1) == []
    q.close()


def test_reopen_after_close_gives_the_same_entries(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    model = make_entries(10)
    fill(q, model)
    q.close()  # close writes out
    q = open_queue(tmp_path)
    assert_holds(q, model)
    more = make_entries(3, start_clo=5000)
    assert fill(q, more) == [10, 11, 12]
    q.sync()
    q.close()
    assert_holds(open_queue(tmp_path), model + more)


def test_reopen_with_a_full_last_file_appends_to_a_new_file(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(8))
    q.close()
    q = open_queue(tmp_path)
    assert q.append(1, 2, 3) == 8
    q.close()
    assert file_names(tmp_path) == [name_of(0), name_of(4), name_of(8)]


def test_default_file_names_match_rocketmq(tmp_path: Path) -> None:
    q = ConsumeQueue(tmp_path, "T", 0)
    q.append(0, 1, 2)
    q.close()
    assert file_names(tmp_path) == ["00000000000000000000"]
    assert name_of(300_000) == "00000000000006000000"


def test_entries_reads_one_pread_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    q = open_queue(tmp_path, per_file=5)
    model = make_entries(40)
    fill(q, model)
    q.write_out()
    calls: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        calls.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    assert q.entries(3, 32) == model[3:35]  # files 0, 5, ..., 30: seven files
    assert len(calls) == 7
    calls.clear()
    assert q.entries(10, 5) == model[10:15]
    assert calls == [5 * ENTRY_SIZE]
    q.close()


# ---------------------------------------------------------------------- opening damaged dirs


@pytest.mark.parametrize("garbage", range(1, ENTRY_SIZE))
def test_torn_trailing_entry_is_cut_on_open(tmp_path: Path, garbage: int) -> None:
    q = open_queue(tmp_path)
    model = make_entries(6)
    fill(q, model)
    q.close()
    with (tmp_path / name_of(4)).open("ab") as f:
        f.write(b"\xab" * garbage)
    q = open_queue(tmp_path)
    assert_holds(q, model)
    assert (tmp_path / name_of(4)).stat().st_size == 2 * ENTRY_SIZE
    assert len(q.write_out()) == 1  # the truncated file is reported for fsync
    assert q.append(7, 7, 7) == 6
    q.close()
    assert_holds(open_queue(tmp_path), [*model, (7, 7, 7)])


def test_torn_first_entry_of_a_new_file(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    model = make_entries(4)
    fill(q, model)
    q.close()
    (tmp_path / name_of(4)).write_bytes(b"\x01" * 7)
    assert_holds(open_queue(tmp_path), model)


@pytest.mark.usefixtures("_no_leaked_fds")
def test_gap_between_files_is_corruption(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(12))
    q.close()
    (tmp_path / name_of(4)).unlink()
    with pytest.raises(StoreCorruptError, match="a gap"):
        open_queue(tmp_path)


@pytest.mark.usefixtures("_no_leaked_fds")
def test_short_file_before_the_last_ends_the_queue_there(tmp_path: Path) -> None:
    """Power loss can keep a new file while the growth of the one before it was lost: the
    queue ends at the short file (recovery re-dispatches the rest from the commit log)."""
    q = open_queue(tmp_path)
    entries = make_entries(6)
    fill(q, entries)
    q.close()
    os.truncate(tmp_path / name_of(0), 3 * ENTRY_SIZE)
    q = open_queue(tmp_path)
    assert q.max_offset == 3
    assert q.entries(0, 10) == entries[:3]
    assert not (tmp_path / name_of(4)).exists()
    q.close()


def test_oversized_or_misnamed_file_is_corruption(tmp_path: Path) -> None:
    (tmp_path / name_of(0)).write_bytes(b"\0" * 5 * ENTRY_SIZE)
    with pytest.raises(StoreCorruptError):
        open_queue(tmp_path)
    (tmp_path / name_of(0)).unlink()
    (tmp_path / f"{ENTRY_SIZE * 3:020d}").write_bytes(b"")
    with pytest.raises(StoreCorruptError, match="entries_per_file"):
        open_queue(tmp_path)


def test_unrelated_files_are_ignored_and_directory_created(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    (tmp_path / "000000000000000000x0").write_text("")
    q = open_queue(tmp_path / "a" / "b")
    assert (q.min_offset, q.max_offset) == (0, 0)
    q.close()
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset) == (0, 0)
    q.close()


# ---------------------------------------------------------------------- truncation


@pytest.mark.parametrize("per_file", [4, 5])
@pytest.mark.parametrize("written", [0, 6, 13])
def test_truncate_everywhere(tmp_path: Path, per_file: int, written: int) -> None:
    model = make_entries(13)
    for cut in range(len(model) + 2):
        path = tmp_path / f"{cut}"
        q = open_queue(path, per_file)
        fill(q, model[:written])
        q.write_out()
        fill(q, model[written:])
        q.truncate(cut)
        assert_holds(q, model[:cut])
        # Later files are gone, and the holding file is no longer than its entries.
        on_disk = sum(p.stat().st_size for p in path.iterdir())
        assert on_disk == min(cut, written) * ENTRY_SIZE
        assert max(int(n) // ENTRY_SIZE for n in file_names(path) or ["0"]) <= max(cut, written)
        assert q.append(1, 1, 1) == min(cut, 13)
        q.close()
        assert_holds(open_queue(path, per_file), [*model[:cut], (1, 1, 1)])


def test_truncate_below_min_restarts_the_queue_there(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(14))
    q.write_out()
    assert q.delete_files_before(10**9) == 3
    assert q.min_offset == 12
    q.truncate(6)
    assert (q.min_offset, q.max_offset) == (6, 6)
    assert file_names(tmp_path) == [name_of(4)]
    assert q.entries(4, 5) == []  # the pre-blanks are never served
    q.close()
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset) == (6, 6)
    assert q.append(9, 9, 9) == 6
    q.close()
    assert_holds(open_queue(tmp_path), [(9, 9, 9)], first=6)


@pytest.mark.parametrize("offset", [0, 3, 4, 8, 9])
def test_reset_survives_reopen(tmp_path: Path, offset: int) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(5))
    q.reset(offset)
    assert (q.min_offset, q.max_offset) == (offset, offset)
    q.close()
    q = open_queue(tmp_path)
    assert (q.min_offset, q.max_offset) == (offset, offset)
    assert q.first_at_or_after(0) == offset
    with pytest.raises(ValueError, match="negative"):
        q.reset(-1)
    q.close()


# ---------------------------------------------------------------------- append_at


def test_append_at_is_idempotent_for_identical_entries(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    model = make_entries(6)
    fill(q, model[:5])
    q.write_out()
    for i, e in enumerate(model[:5]):
        q.append_at(i, *e)  # on disk and in memory alike: no-op
    q.append_at(5, *model[5])
    assert_holds(q, model)
    with pytest.raises(StoreCorruptError, match="holds"):
        q.append_at(2, 1, 2, 3)
    with pytest.raises(StoreCorruptError, match="outside"):
        q.append_at(7, 1, 2, 3)
    q.write_out()
    q.delete_files_before(10**9)
    with pytest.raises(StoreCorruptError, match="outside"):
        q.append_at(0, *model[0])
    q.close()


# ---------------------------------------------------------------------- search


@settings(max_examples=60)
@given(
    gaps=st.lists(st.integers(0, 50), max_size=40),
    written=st.integers(0, 40),
    per_file=st.integers(1, 6),
    target=st.integers(-10, 2200),
)
def test_first_at_or_after_and_bisect_match_a_list(
    gaps: list[int], written: int, per_file: int, target: int
) -> None:
    offsets = [sum(gaps[: i + 1]) for i in range(len(gaps))]  # non-decreasing
    with tempfile.TemporaryDirectory() as d:
        q = open_queue(Path(d), per_file)
        for i, clo in enumerate(offsets):
            if i == written:
                q.write_out()
            q.append(clo, 10, i)
        expected = std_bisect.bisect_left(offsets, target)
        assert q.first_at_or_after(target) == expected
        calls = 0

        def key(e: Entry) -> int:
            nonlocal calls
            calls += 1
            return e[0] * 2

        assert q.bisect(key, target * 2) == expected
        assert calls <= len(offsets).bit_length()
        q.close()


def test_search_respects_min_offset(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(10))
    q.write_out()
    assert q.delete_files_before(450) == 1
    assert q.first_at_or_after(0) == 4
    assert q.first_at_or_after(450) == 5
    assert q.first_at_or_after(10**9) == 10
    assert q.bisect(lambda e: e[1], 0) == 4
    q.close()


# ---------------------------------------------------------------------- retention


def test_delete_files_before_never_deletes_the_active_file(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    model = make_entries(12)  # files 0, 4, 8; the last is full and holds max - 1
    fill(q, model)
    q.write_out()
    assert q.delete_files_before(0) == 0
    assert q.delete_files_before(300) == 0  # entry 3, file 0's last, is at 300
    assert q.delete_files_before(301) == 1
    assert q.min_offset == 4
    assert q.delete_files_before(10**9) == 1  # file 8 holds max - 1: it stays
    assert (q.min_offset, file_names(tmp_path)) == (8, [name_of(8)])
    assert q.delete_files_before(10**9) == 0
    assert_holds(q, model[8:], first=8)
    q.close()
    assert_holds(open_queue(tmp_path), model[8:], first=8)


def test_delete_files_before_waits_for_written_out_files(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(10))
    assert q.delete_files_before(10**9) == 0  # nothing on disk yet
    q.write_out()
    fds_before = q.write_out()
    assert fds_before == []
    assert q.delete_files_before(10**9) == 2
    assert q.write_out() != []  # the directory changed
    q.close()


# ---------------------------------------------------------------------- failures


def failing_pwrite(
    fail_on: int, partial: int = 0
) -> tuple[Callable[[int, bytes, int], int], list[int]]:
    """A pwrite that fails its ``fail_on``-th call (0-based) once, after writing ``partial``."""
    real = os.pwrite
    calls: list[int] = []

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        calls.append(offset)
        if len(calls) - 1 == fail_on:
            if partial:
                real(fd, bytes(data)[:partial], offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    return pwrite, calls


@pytest.mark.parametrize(("fail_on", "partial"), [(0, 0), (0, 30), (1, 0), (1, 45)])
def test_failed_write_out_keeps_memory_and_retry_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_on: int, partial: int
) -> None:
    q = open_queue(tmp_path)
    model = make_entries(7)
    fill(q, model[:2])
    q.write_out()
    fill(q, model[2:])  # spans files 0 and 4
    pwrite, _ = failing_pwrite(fail_on, partial)
    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(OSError, match="No space") as info:
        q.write_out()
    assert info.value.errno == errno.ENOSPC
    assert_holds(q, model)  # nothing lost from memory
    assert q.write_out()
    assert_holds(q, model)
    q.close()
    assert_holds(open_queue(tmp_path), model)


def test_truncate_after_a_partial_write_does_not_resurrect_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = open_queue(tmp_path)
    model = make_entries(4)
    fill(q, model[:1])
    q.write_out()
    fill(q, model[1:])
    pwrite, _ = failing_pwrite(0, partial=2 * ENTRY_SIZE + 3)
    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(OSError, match="No space"):
        q.write_out()
    q.truncate(2)  # entry 2 landed on disk but is now gone from the queue
    q.close()
    assert_holds(open_queue(tmp_path), model[:2])


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.pwrite

    def short_pwrite(fd: int, data: bytes, offset: int) -> int:
        return real(fd, bytes(data)[:7], offset)

    monkeypatch.setattr(os, "pwrite", short_pwrite)
    q = open_queue(tmp_path)
    model = make_entries(6)
    fill(q, model)
    q.close()
    monkeypatch.undo()
    assert_holds(open_queue(tmp_path), model)


def test_pwrite_without_progress_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
    q = open_queue(tmp_path)
    q.append(1, 2, 3)
    with pytest.raises(OSError, match="no progress"):
        q.write_out()
    assert q.buffered == 1
    monkeypatch.undo()
    q.close()


def test_file_shortened_behind_the_queue_is_corruption(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(3))
    q.write_out()
    os.truncate(tmp_path / name_of(0), ENTRY_SIZE)
    with pytest.raises(StoreCorruptError, match="behind"):
        q.entries(0, 3)
    q.close()


# ---------------------------------------------------------------------- lifetime


def test_closed_queue_refuses_file_access(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(3))
    q.close()
    q.close()  # idempotent
    with pytest.raises(StoreClosedError):
        q.entries(0, 1)


def test_destroy_removes_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "TopicA" / "3"
    q = open_queue(path)
    fill(q, make_entries(9))
    q.write_out()
    q.destroy()
    assert not path.exists()


def test_sync_fsyncs_what_write_out_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    q = open_queue(tmp_path)
    fill(q, make_entries(5))
    q.sync()
    assert len(synced) == 3  # two files and the directory
    q.close()


# ---------------------------------------------------------------------- stateful


class ConsumeQueueMachine(RuleBasedStateMachine):
    """The queue against a list: index = queue offset, entries below ``first`` are gone."""

    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.path = Path(self._tmp.name) / "cq"
        self.model: list[Entry] = []
        self.first = 0
        self.next_clo = 0
        self.per_file = 1
        self.q: ConsumeQueue | None = None

    @property
    def queue(self) -> ConsumeQueue:
        assert self.q is not None
        return self.q

    @initialize(per_file=st.integers(1, 5))
    def start(self, per_file: int) -> None:
        self.per_file = per_file
        self.q = open_queue(self.path, per_file)

    @rule(n=st.integers(1, 7), tags=st.integers(-(2**63), 2**63 - 1))
    def append(self, n: int, tags: int) -> None:
        for _ in range(n):
            entry = (self.next_clo, 1 + self.next_clo % 97, tags)
            self.next_clo += 1 + self.next_clo % 3
            assert self.queue.append(*entry) == len(self.model)
            self.model.append(entry)

    @rule()
    def write_out(self) -> None:
        self.queue.write_out()

    @rule()
    def sync(self) -> None:
        self.queue.sync()

    @rule(fail_on=st.integers(0, 2), partial=st.integers(0, 45))
    def failing_write_out(self, fail_on: int, partial: int) -> None:
        pwrite, calls = failing_pwrite(fail_on, partial)
        with mock.patch.object(os, "pwrite", pwrite):
            try:
                self.queue.write_out()
            except OSError:
                assert len(calls) == fail_on + 1

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        cut = data.draw(st.integers(0, len(self.model) + 2))
        self.queue.truncate(cut)
        if cut < self.first:
            self.model = self.model[:cut]
            self.first = cut
        del self.model[cut:]

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(0, len(self.model) + 6))
        self.queue.reset(offset)
        self.model = [(-1, -1, -1)] * offset  # placeholders below first: never compared
        self.first = offset

    @rule()
    def reopen(self) -> None:
        self.queue.close()
        self.q = open_queue(self.path, self.per_file)

    @rule(data=st.data())
    def delete_files_before(self, data: st.DataObject) -> None:
        bound = data.draw(st.integers(0, self.next_clo + 5))
        before = self.queue.min_offset
        deleted = self.queue.delete_files_before(bound)
        after = self.queue.min_offset
        assert (deleted == 0) == (after == before)
        if deleted:
            assert after % self.per_file == 0
            assert after < len(self.model)  # the entry max - 1 survives
            assert all(e[0] < bound for e in self.model[before:after])
        self.first = after

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(self.first - 1, len(self.model) + 1))
        count = data.draw(st.integers(0, 12))
        expected = self.model[start : start + count] if start >= self.first else []
        assert self.queue.entries(start, count) == expected

    @rule(data=st.data())
    def search(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(-1, self.next_clo + 1))
        clos = [e[0] for e in self.model[self.first :]]
        assert self.queue.first_at_or_after(target) == self.first + std_bisect.bisect_left(
            clos, target
        )

    @precondition(lambda self: self.q is not None)
    @invariant()
    def bounds_match(self) -> None:
        assert (self.queue.min_offset, self.queue.max_offset) == (self.first, len(self.model))

    def teardown(self) -> None:
        if self.q is not None:
            self.q.close()
        self._tmp.cleanup()


ConsumeQueueMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
TestConsumeQueueMachine = ConsumeQueueMachine.TestCase


@pytest.mark.usefixtures("_no_leaked_fds")
def test_close_releases_every_fd(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    fill(q, make_entries(13))
    q.write_out()
    q.entries(0, 13)
    q.truncate(5)
    q.close()
