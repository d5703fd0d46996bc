"""The pop journal: round trips, rotation, crash recovery at every point, failing writes."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.pop.journal import SNAPSHOT, Journal, JournalUnusableError, Recovered

# Values that survive a msgpack round trip unchanged (lists, not tuples; no NaN).
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.floats(allow_nan=False)
)
values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
op_lists = st.lists(values, min_size=1, max_size=12)


@contextmanager
def scratch() -> Iterator[Path]:
    """A fresh directory per Hypothesis example (``tmp_path`` is shared by all examples)."""
    with tempfile.TemporaryDirectory() as name:
        yield Path(name)


def reopen(directory: Path, **kwargs: bool) -> Recovered:
    journal, recovered = Journal.open(directory, **kwargs)
    journal.close()
    return recovered


def journal_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("journal.*"))


def write_ops(directory: Path, ops: list[Any]) -> list[int]:
    """Append ``ops`` to a fresh journal; return the file size after each frame."""
    journal, _ = Journal.open(directory)
    ends = []
    for op in ops:
        journal.append(op)
        ends.append(journal.size)
    journal.close()
    return ends


# ------------------------------------------------------------------ round trips
def test_fresh_directory_recovers_nothing(tmp_path: Path) -> None:
    journal, recovered = Journal.open(tmp_path / "pop")
    journal.close()
    assert recovered == Recovered(None, [], 0, [], 0)
    assert [p.name for p in journal_files(tmp_path / "pop")] == ["journal.0000000001"]


def test_round_trip_and_replay_after_reopen(tmp_path: Path) -> None:
    ops: list[Any] = [["pop", 1, "g", b"\x00"], {"ack": [1, 2]}, None, 2**64 - 1]
    journal, _ = Journal.open(tmp_path)
    for op in ops:
        journal.append(op)
    assert journal.appended == len(ops)
    assert journal.size == journal_files(tmp_path)[0].stat().st_size
    journal.close()
    journal, recovered = Journal.open(tmp_path)
    assert recovered.ops == ops
    assert recovered.files == journal_files(tmp_path)
    journal.append("more")  # continues the same file
    journal.close()
    assert reopen(tmp_path).ops == [*ops, "more"]
    assert len(journal_files(tmp_path)) == 1


def test_tuples_come_back_as_lists_and_int_keys_survive(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.append(("a", (1, 2)))
    journal.append({3: "x"})
    journal.close()
    assert reopen(tmp_path).ops == [["a", [1, 2]], {3: "x"}]


def test_unserialisable_op_writes_nothing(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    with pytest.raises(TypeError):
        journal.append(object())
    assert journal.size == 0
    journal.append(1)
    journal.close()
    assert reopen(tmp_path).ops == [1]


def test_append_after_close_is_refused(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.close()
    journal.close()  # idempotent
    with pytest.raises(JournalUnusableError, match="closed"):
        journal.append(1)
    journal.sync()  # a late sync from a worker is harmless


# ------------------------------------------------------------------ rotation
def test_rotate_then_reopen(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.append(1)
    journal.append(2)
    state = {"ops": [1, 2]}
    writer = journal.rotate(state)
    state["ops"].append(99)  # serialised by rotate: later changes are not in the snapshot
    journal.append(3)
    writer()
    journal.sync()
    journal.close()
    recovered = reopen(tmp_path)
    assert recovered.state == {"ops": [1, 2]}
    assert recovered.ops == [3]
    assert recovered.generation == 2
    assert [p.name for p in journal_files(tmp_path)] == ["journal.0000000002"]


def test_crash_before_the_snapshot_writer_ran(tmp_path: Path) -> None:
    """(a) Old snapshot + every generation since it is replayed."""
    journal, _ = Journal.open(tmp_path)
    journal.append("a")
    journal.rotate(["a"])()
    journal.append("b")
    journal.rotate(["a", "b"])  # the writer never runs: killed first
    journal.append("c")
    journal.close()
    recovered = reopen(tmp_path)
    assert (recovered.state, recovered.ops, recovered.generation) == (["a"], ["b", "c"], 2)
    assert len(recovered.files) == 2


def test_crash_after_snapshot_before_old_files_deleted(tmp_path: Path) -> None:
    """(b) The new snapshot wins; files it covers are ignored and removed."""
    journal, _ = Journal.open(tmp_path)
    journal.append("a")
    old = journal_files(tmp_path)[0]
    saved = old.read_bytes()
    writer = journal.rotate(["a"])
    journal.append("b")
    writer()
    old.write_bytes(saved)  # as if the deletion never happened
    journal.close()
    recovered = reopen(tmp_path)
    assert (recovered.state, recovered.ops) == (["a"], ["b"])
    assert not old.exists()


def test_a_late_writer_never_replaces_a_newer_snapshot(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.append("a")
    first = journal.rotate(["a"])
    journal.append("b")
    second = journal.rotate(["a", "b"])
    journal.append("c")
    second()
    first()  # finishes last: must do nothing
    journal.close()
    recovered = reopen(tmp_path)
    assert (recovered.state, recovered.ops) == (["a", "b"], ["c"])


def test_writer_in_a_thread_while_appending(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    for i in range(50):
        journal.append(i)
    writer = journal.rotate(list(range(50)))
    thread = threading.Thread(target=writer)
    thread.start()
    for i in range(50, 100):
        journal.append(i)
    thread.join(timeout=30)
    assert not thread.is_alive()
    journal.close()
    recovered = reopen(tmp_path)
    assert recovered.state + recovered.ops == list(range(100))


def test_rotate_in_fsync_mode(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path, fsync=True)
    journal.append(1)
    writer = journal.rotate([1])
    journal.append(2)
    writer()
    journal.close()
    recovered = reopen(tmp_path, fsync=True)
    assert (recovered.state, recovered.ops) == ([1], [2])


# ------------------------------------------------------------------ torn tails
@given(ops=op_lists, data=st.data())
def test_torn_tail_recovers_exactly_the_complete_frames(
    ops: list[Any], data: st.DataObject
) -> None:
    """(c) Any truncation point: a prefix comes back, holding every fully written frame."""
    with scratch() as directory:
        ends = write_ops(directory, ops)
        cut = data.draw(st.integers(0, ends[-1]), label="cut")
        os.truncate(journal_files(directory)[0], cut)
        complete = sum(1 for end in ends if end <= cut)
        recovered = reopen(directory)
        assert recovered.ops == ops[:complete]
        assert recovered.torn_tail_bytes == cut - ([0, *ends][complete])
        assert journal_files(directory)[0].stat().st_size == cut - recovered.torn_tail_bytes


def test_torn_at_every_byte_of_the_last_frame_then_append(tmp_path: Path) -> None:
    """(c, e) Every cut of the last frame of the last file; appending afterwards replays."""
    ops: list[Any] = ["x" * 10, {"k": [1, 2, 3]}, "last op"]
    source = tmp_path / "source"
    journal, _ = Journal.open(source)
    journal.append("before rotate")
    journal.rotate(None)  # writer never ran: two generations, the first one complete
    ends = []
    for op in ops:
        journal.append(op)
        ends.append(journal.size)
    journal.close()
    for cut in range(ends[-2], ends[-1]):  # bounded: the last frame's bytes
        directory = tmp_path / f"cut{cut}"
        shutil.copytree(source, directory)
        os.truncate(journal_files(directory)[-1], cut)
        journal, recovered = Journal.open(directory)
        assert recovered.ops == ["before rotate", *ops[:-1]]
        assert recovered.torn_tail_bytes == cut - ends[-2]
        journal.append("after")
        journal.close()
        assert reopen(directory).ops == ["before rotate", *ops[:-1], "after"]


def test_corrupt_tail_of_the_last_file_is_truncated(tmp_path: Path) -> None:
    ends = write_ops(tmp_path, ["a", "b", "c"])
    path = journal_files(tmp_path)[0]
    data = bytearray(path.read_bytes())
    data[ends[1] + 9] ^= 0xFF  # inside the last frame's payload
    path.write_bytes(bytes(data))
    recovered = reopen(tmp_path)
    assert (recovered.ops, recovered.torn_tail_bytes) == (["a", "b"], ends[2] - ends[1])


# ------------------------------------------------------------------ refusals
@given(ops=op_lists, data=st.data())
def test_corruption_in_an_earlier_file_is_refused(ops: list[Any], data: st.DataObject) -> None:
    """(d) Any flipped byte in a complete (non-last) file raises, naming file and offset."""
    with scratch() as directory:
        ends = write_ops(directory, ops)
        journal, _ = Journal.open(directory)
        journal.rotate(None)
        journal.append("later")
        journal.close()
        path = journal_files(directory)[0]
        raw = bytearray(path.read_bytes())
        pos = data.draw(st.integers(0, ends[-1] - 1), label="pos")
        raw[pos] ^= data.draw(st.integers(1, 255), label="xor")
        path.write_bytes(bytes(raw))
        with pytest.raises(ValueError, match=rf"{path.name} at offset \d+"):
            Journal.open(directory)


def test_unreadable_snapshot_is_refused(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.rotate({"state": 1})()
    journal.close()
    snapshot = tmp_path / SNAPSHOT
    snapshot.write_bytes(snapshot.read_bytes()[:-1])
    with pytest.raises(ValueError, match="snapshot"):
        Journal.open(tmp_path)
    snapshot.write_bytes(b"")  # an empty frame list is not a snapshot either
    with pytest.raises(ValueError, match="snapshot"):
        Journal.open(tmp_path)


def test_missing_generation_is_refused(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.append(1)
    journal.rotate(None)
    journal.append(2)
    journal.rotate(None)
    journal.close()
    journal_files(tmp_path)[1].unlink()
    with pytest.raises(ValueError, match="gaps"):
        Journal.open(tmp_path)


def test_journal_without_its_snapshot_is_refused(tmp_path: Path) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.rotate([])()
    journal.close()
    (tmp_path / SNAPSHOT).unlink()  # journal.2 alone: the history before it is gone
    with pytest.raises(ValueError, match="gaps"):
        Journal.open(tmp_path)


# ------------------------------------------------------------------ failing writes
def half_write(real: Callable[[int, Any], int]) -> Callable[[int, Any], int]:
    def write(fd: int, data: Any) -> int:
        real(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    return write


def failing(code: int, message: str) -> Callable[..., NoReturn]:
    def fail(*_args: object) -> NoReturn:
        raise OSError(code, message)

    return fail


def test_failed_write_is_rolled_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.append("a")
    size = journal.size
    with monkeypatch.context() as m:
        m.setattr(os, "write", half_write(os.write))
        with pytest.raises(OSError, match="No space"):
            journal.append("b" * 100)
    assert journal.size == size == journal_files(tmp_path)[0].stat().st_size
    journal.append("c")  # still usable: the disk may have room again
    journal.close()
    recovered = reopen(tmp_path)
    assert (recovered.ops, recovered.torn_tail_bytes) == (["a", "c"], 0)


def test_failed_rollback_refuses_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, _ = Journal.open(tmp_path)
    journal.append("a")
    with monkeypatch.context() as m:
        m.setattr(os, "write", half_write(os.write))
        m.setattr(os, "ftruncate", failing(errno.EIO, "Input/output error"))
        with pytest.raises(OSError, match="No space"):
            journal.append("b" * 100)
    with pytest.raises(JournalUnusableError, match="truncate"):
        journal.append("c")
    with pytest.raises(JournalUnusableError):
        journal.rotate(["a"])  # would leave the torn frame in a non-last file
    journal.close()
    journal, recovered = Journal.open(tmp_path)
    assert recovered.ops == ["a"]
    assert recovered.torn_tail_bytes > 0
    journal.append("c")
    journal.close()
    assert reopen(tmp_path).ops == ["a", "c"]


def test_failed_fsync_refuses_until_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal, _ = Journal.open(tmp_path, fsync=True)
    journal.append("a")
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", failing(errno.EIO, "I/O error"))
        with pytest.raises(OSError, match="I/O error"):
            journal.append("b")
    with pytest.raises(JournalUnusableError, match="fsync"):
        journal.append("c")
    journal.close()
    assert reopen(tmp_path).ops == ["a"]  # the failed op was truncated back


# ------------------------------------------------------------------ model check
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("append"), values),
            st.tuples(st.just("rotate"), st.sampled_from(["write", "skip", "late"])),
            st.tuples(st.just("reopen"), st.booleans()),
        ),
        max_size=25,
    )
)
def test_recovery_matches_a_model(steps: list[tuple[str, Any]]) -> None:
    """Any mix of appends, rotations (writer run, never run, run late) and restarts."""
    with scratch() as directory:
        model: list[Any] = []
        journal, _ = Journal.open(directory)
        pending: list[Callable[[], None]] = []
        for kind, arg in steps:  # bounded by the list
            if kind == "append":
                journal.append(arg)
                model.append(arg)
            elif kind == "rotate":
                writer = journal.rotate(model)
                if arg == "write":
                    writer()
                elif arg == "late":
                    pending.append(writer)
            else:
                if arg:  # late writers finish before the "crash"
                    for writer in pending:
                        writer()
                pending.clear()
                journal.close()
                journal, recovered = Journal.open(directory)
                assert (recovered.state or []) + recovered.ops == model
        journal.close()
        recovered = reopen(directory)
        assert (recovered.state or []) + recovered.ops == model
