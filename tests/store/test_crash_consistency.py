"""Crash consistency: damage every byte of the log's last records, reopen, and check that
recovery keeps exactly the records before the damage, serves nothing after it, never raises,
and leaves a store that takes new puts and agrees with itself after another reopen.

Damage kinds, at every commit-log offset of the last three records (headers, bodies, CRC
tails) and of the blank marker between them: the segment file cut there (``truncate``), the
rest of the segment zeroed from there (``zero``: the file keeps its preallocated size), and
the one byte flipped (``flip``). Log variants: a checkpoint in the middle (recovery scans only
after it), a clean close in the middle followed by more puts, no checkpoint file, and a
corrupt checkpoint file (both: a full scan).

Consume-queue damage: the process dies in the middle of a checkpoint, after the queues' new
entries were written out but before the checkpoint file named them; those entries are then
cut mid-entry or have bytes flipped, and recovery must rebuild them from the log.

One pristine directory per variant, kept in memory and restored for each damage point.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.store.api import MessageToStore
from broker.store.commitlog import segment_name
from broker.store.consumequeue import ENTRY_SIZE
from broker.store.record import BLANK_SIZE
from broker.store.store import MessageStore
from protocol.properties import TAGS
from tests.store.support import bodies, crash, read_queue, store_config

SEGMENT = 4096
TOPIC = "Crash"
QUEUES = 2
#: One consume-queue file per queue in the log tests (fewer files to restore per point).
LOG_CQ_ENTRIES = 256
DAMAGED_RECORDS = 3
#: How the log was left: a checkpoint in the middle; a clean close in the middle, then more
#: puts; no checkpoint file; a corrupt one (the last two: recovery scans everything).
VARIANTS = ("checkpoint", "clean-close", "no-checkpoint", "corrupt-checkpoint")


@dataclass(frozen=True, slots=True)
class Rec:
    offset: int
    end: int
    queue_id: int
    body: bytes


@dataclass(slots=True)
class Snapshot:
    """A whole store directory in memory, restored much faster than ``copytree``."""

    dirs: list[str]
    files: dict[str, bytes]

    @classmethod
    def take(cls, root: Path) -> Snapshot:
        paths = sorted(root.rglob("*"))
        return cls(
            [str(p.relative_to(root)) for p in paths if p.is_dir()],
            {str(p.relative_to(root)): p.read_bytes() for p in paths if p.is_file()},
        )

    def restore(self, root: Path) -> None:
        """Make ``root`` hold exactly the snapshot (whatever it held before)."""
        shutil.rmtree(root, ignore_errors=True)
        os.mkdir(root)
        for rel in self.dirs:  # sorted: parents first
            os.mkdir(root / rel)
        for rel, data in self.files.items():
            fd = os.open(root / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                assert os.write(fd, data) == len(data)
            finally:
                os.close(fd)


@dataclass(slots=True)
class Pristine:
    snapshot: Snapshot
    records: list[Rec]  # in log order
    scan_from: int  # where recovery must start scanning

    @property
    def damaged(self) -> list[Rec]:
        return self.records[-DAMAGED_RECORDS:]

    def damage_offsets(self) -> list[int]:
        """Every byte of the last records, and of a blank marker between them."""
        out: list[int] = []
        for prev, rec in zip([None, *self.damaged], self.damaged, strict=False):
            if prev is not None and prev.end != rec.offset:  # a segment roll: the marker
                out += range(prev.end, prev.end + BLANK_SIZE)
            out += range(rec.offset, rec.end)
        return out


def put(store: MessageStore, records: list[Rec], n: int) -> None:
    for _ in range(n):
        i = len(records)
        body = b"%03d" % i + b"x" * (i % 5)  # small records: fewer damage points to try
        result = store.put_nowait(MessageToStore(TOPIC, i % QUEUES, body, {TAGS: "abc"[i % 3]}))
        assert result.ok, result.remark
        records.append(Rec(result.commit_log_offset, result.end_offset, i % QUEUES, body))


def put_until_roll(store: MessageStore, records: list[Rec]) -> None:
    """Put until a record lands in a new segment, then one more: the last three records
    then straddle a blank marker."""
    for _ in range(100):  # a segment holds ~30 records
        put(store, records, 1)
        if len(records) >= 2 and records[-2].end != records[-1].offset:
            put(store, records, 1)
            return
    raise AssertionError("no segment roll")


def build(root: Path, variant: str) -> Pristine:
    root.mkdir()
    config = store_config(root, segment_size=SEGMENT, cq_entries_per_file=LOG_CQ_ENTRIES)
    records: list[Rec] = []
    store = MessageStore.open(config)
    put(store, records, 45)  # a segment and a half
    if variant == "clean-close":
        store.close()
        store = MessageStore.open(config)
    else:
        store.checkpoint()
    safe = store.log.end
    put_until_roll(store, records)
    store.flush()  # every record is on disk; no checkpoint covers the last ones
    crash(store)
    scan_from = safe
    if variant == "no-checkpoint":
        (root / "checkpoint").unlink()
        scan_from = 0
    elif variant == "corrupt-checkpoint":
        data = bytearray((root / "checkpoint").read_bytes())
        data[len(data) // 2] ^= 0x01
        (root / "checkpoint").write_bytes(bytes(data))
        scan_from = 0
    assert len({r.offset // SEGMENT for r in records}) >= 3
    assert records[-3].end < records[-2].offset == records[-2].offset // SEGMENT * SEGMENT
    assert records[-DAMAGED_RECORDS].offset >= safe  # the damage is after the checkpoint
    return Pristine(Snapshot.take(root), records, scan_from)


def segment_path(root: Path, offset: int) -> Path:
    return root / "commitlog" / segment_name(offset - offset % SEGMENT)


def cut(root: Path, offset: int) -> None:
    os.truncate(segment_path(root, offset), offset % SEGMENT)


def zero(root: Path, offset: int) -> None:
    with segment_path(root, offset).open("r+b") as f:
        f.seek(offset % SEGMENT)
        f.write(bytes(SEGMENT - offset % SEGMENT))


def flip_byte(path: Path, pos: int) -> None:
    with path.open("r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ 0xFF]))


def flip(root: Path, offset: int) -> None:
    flip_byte(segment_path(root, offset), offset % SEGMENT)


DAMAGE: dict[str, Callable[[Path, int], None]] = {"truncate": cut, "zero": zero, "flip": flip}


def assert_serves(store: MessageStore, records: list[Rec]) -> None:
    for q in range(QUEUES):
        want = [r.body for r in records if r.queue_id == q]
        assert read_queue(store, TOPIC, q, batch=32) == want, f"queue {q}"
        assert store.max_offset(TOPIC, q) == len(want)


def survivors(pristine: Pristine, kind: str, at: int) -> list[Rec]:
    """The records that must survive damage of ``kind`` at ``at``: those before it.

    One exception: a flipped byte in a blank marker's size field that leaves a size of at
    least a marker's still reads as a blank marker, which (whatever its size) means "the rest
    of this segment is unused", so the intact records after it are kept.
    """
    records = pristine.records
    for prev, nxt in itertools.pairwise(records):
        marker = prev.end
        if kind == "flip" and prev.end != nxt.offset and marker <= at < marker + 4:
            size = bytearray((SEGMENT - marker % SEGMENT).to_bytes(4, "big"))
            size[at - marker] ^= 0xFF
            if int.from_bytes(size, "big", signed=True) >= BLANK_SIZE:
                return records
    return [r for r in records if r.end <= at]


def check_recovery(pristine: Pristine, work: Path, kind: str, at: int) -> None:
    """Restore, damage, reopen: exactly the :func:`survivors` are served; then new puts, and
    a second reopen — after a clean close for even ``at``, after another crash for odd ``at``
    (recovery then rescans the same stretch: what it cut must stay cut)."""
    pristine.snapshot.restore(work)
    if kind in DAMAGE:
        DAMAGE[kind](work, at)
    kept = survivors(pristine, kind, at)
    config = store_config(work, segment_size=SEGMENT, cq_entries_per_file=LOG_CQ_ENTRIES)
    crash_again = at % 2 == 1
    with MessageStore.open(config) as store:
        stats = store.statistics()
        assert stats.recovery_scanned_from == pristine.scan_from
        assert stats.recovered_records == sum(r.offset >= pristine.scan_from for r in kept)
        bound = at if len(kept) < len(pristine.records) else kept[-1].end
        assert kept[-1].end <= store.log.end <= bound  # cut at or before the damage
        assert_serves(store, kept)
        after = list(kept)
        put(store, after, QUEUES)
        assert after[len(kept)].offset >= kept[-1].end
        for new in after[len(kept) :]:  # each new record lands right after the survivors
            got = store.get(TOPIC, new.queue_id, store.max_offset(TOPIC, new.queue_id) - 1)
            assert bodies(got) == [new.body]
        if crash_again:
            store.flush()
            crash(store)
    store = MessageStore.open(config)
    if crash_again:
        stats = store.statistics()
        assert stats.recovery_scanned_from == pristine.scan_from
        assert stats.recovered_records == sum(r.offset >= pristine.scan_from for r in after)
    else:
        assert store.statistics().recovered_records == 0
    assert_serves(store, after)
    crash(store)  # quicker than a close, and the next restore wipes the directory anyway


@pytest.fixture
def work(tmp_path: Path) -> Iterator[Path]:
    """Where the damaged copies go: tmpfs when there is one (thousands of restores and
    reopens are bound by file-system calls, about twice as fast there), else ``tmp_path``."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="trimq-crash-") as scratch:
            yield Path(scratch) / "work"
    else:
        yield tmp_path / "work"


@pytest.fixture
def no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """A simulated ``kill -9`` keeps the page cache, so no assertion here can see an fsync;
    skipping them keeps thousands of reopens fast."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.fixture(scope="module")
def pristines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Pristine]:
    root = tmp_path_factory.mktemp("pristine")
    return {v: build(root / v, v) for v in VARIANTS}


@pytest.mark.usefixtures("no_fsync")
@pytest.mark.parametrize("kind", list(DAMAGE))
@pytest.mark.parametrize("variant", VARIANTS)
def test_damaged_log_tail_recovers_to_the_last_intact_record(
    pristines: dict[str, Pristine], work: Path, variant: str, kind: str
) -> None:
    pristine = pristines[variant]
    offsets = pristine.damage_offsets()
    assert len(offsets) > 3 * 120
    for offset in offsets:
        check_recovery(pristine, work, kind, offset)


def test_undamaged_log_recovers_everything(pristines: dict[str, Pristine], work: Path) -> None:
    for pristine in pristines.values():
        check_recovery(pristine, work, "none", pristine.records[-1].end)


# ---------------------------------------------------------------------- consume queues


@dataclass(slots=True)
class QueuePristine:
    snapshot: Snapshot
    records: list[Rec]
    checkpointed: list[int]  # entries per queue named by the checkpoint file


@pytest.fixture(scope="module")
def queue_pristine(tmp_path_factory: pytest.TempPathFactory) -> QueuePristine:
    root = tmp_path_factory.mktemp("cq-pristine")
    config = store_config(root, segment_size=SEGMENT, cq_entries_per_file=8)
    records: list[Rec] = []
    store = MessageStore.open(config)
    put(store, records, QUEUES * 6)
    store.checkpoint()
    checkpointed = [store.max_offset(TOPIC, q) for q in range(QUEUES)]
    put(store, records, QUEUES * 4)  # queue files roll at 8 entries: new files, too
    store.checkpoint_begin()  # log and queues written out; the checkpoint file never is
    crash(store)
    return QueuePristine(Snapshot.take(root), records, checkpointed)


def queue_files(root: Path, queue_id: int) -> list[Path]:
    return sorted((root / "consumequeue" / TOPIC / str(queue_id)).iterdir())


def uncheckpointed_bytes(p: QueuePristine, root: Path) -> list[tuple[Path, int]]:
    """(file, byte position) of every byte of the entries the checkpoint does not name."""
    out: list[tuple[Path, int]] = []
    for q in range(QUEUES):
        first_byte = p.checkpointed[q] * ENTRY_SIZE
        for path in queue_files(root, q):
            start, size = int(path.name), path.stat().st_size
            out += [(path, pos - start) for pos in range(max(first_byte, start), start + size)]
    return out


@pytest.mark.usefixtures("no_fsync")
@pytest.mark.parametrize("kind", ["truncate", "flip"])
def test_damaged_queue_entries_after_the_checkpoint_are_rebuilt(
    queue_pristine: QueuePristine, work: Path, kind: str
) -> None:
    p = queue_pristine
    p.snapshot.restore(work)
    targets = [(path.relative_to(work), pos) for path, pos in uncheckpointed_bytes(p, work)]
    assert len(targets) == QUEUES * 4 * ENTRY_SIZE
    assert len({rel.parent for rel, _ in targets}) == QUEUES
    for rel, pos in targets:
        p.snapshot.restore(work)
        if kind == "truncate":
            os.truncate(work / rel, pos)
        else:
            flip_byte(work / rel, pos)
        config = store_config(work, segment_size=SEGMENT, cq_entries_per_file=8)
        with MessageStore.open(config) as store:  # the log is intact: everything is kept
            assert_serves(store, p.records)
            after = list(p.records)
            put(store, after, QUEUES)
            assert_serves(store, after)
        with MessageStore.open(config) as store:
            assert_serves(store, after)
