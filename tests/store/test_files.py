"""broker.store.files: atomic replace, the directory lock and the abort marker."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from broker.store import files
from broker.store.api import StoreError
from broker.store.files import AbortMarker, DirectoryLock, atomic_write, read_optional

REPO = Path(__file__).resolve().parents[2]


def _fail(*_args: object, **_kwargs: object) -> None:
    raise OSError(28, "No space left on device (simulated)")


# Calls, not the properties: mypy would narrow a property across the calls that change it.
def _held(lock: DirectoryLock) -> bool:
    return lock.held


def _exists(marker: AbortMarker) -> bool:
    return marker.exists


def _only(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# ---------------------------------------------------------------------- atomic_write


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    atomic_write(target, b"one")
    assert target.read_bytes() == b"one"
    atomic_write(target, b"two, longer")
    assert target.read_bytes() == b"two, longer"
    atomic_write(target, b"")
    assert target.read_bytes() == b""
    assert _only(tmp_path) == ["config.json"]


@pytest.mark.parametrize("step", ["write", "fsync", "replace"])
@pytest.mark.parametrize("existed", [True, False])
def test_atomic_write_failure_keeps_old_content_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, existed: bool
) -> None:
    target = tmp_path / "consumerOffset.json"
    if existed:
        target.write_bytes(b"old")
    monkeypatch.setattr(os, step, _fail)
    with pytest.raises(OSError, match="simulated"):
        atomic_write(target, b"new")
    monkeypatch.undo()
    assert read_optional(target) == (b"old" if existed else None)
    assert _only(tmp_path) == (["consumerOffset.json"] if existed else [])


def test_atomic_write_directory_fsync_failure_leaves_new_content_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "checkpoint"
    target.write_bytes(b"old")
    monkeypatch.setattr(files, "fsync_dir", _fail)
    with pytest.raises(OSError, match="simulated"):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert _only(tmp_path) == ["checkpoint"]


def test_atomic_write_fsyncs_file_before_rename_and_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: Path, dst: Path) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "x", b"data")
    assert events == ["fsync file", "replace", "fsync dir"]


def test_atomic_write_survives_short_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write

    def short_write(fd: int, data: bytes) -> int:
        return real_write(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", short_write)
    atomic_write(tmp_path / "x", b"0123456789")
    monkeypatch.undo()
    assert (tmp_path / "x").read_bytes() == b"0123456789"


def test_read_optional(tmp_path: Path) -> None:
    assert read_optional(tmp_path / "missing") is None
    (tmp_path / "present").write_bytes(b"abc")
    assert read_optional(tmp_path / "present") == b"abc"
    with pytest.raises(IsADirectoryError):
        read_optional(tmp_path)


# ---------------------------------------------------------------------- DirectoryLock


def test_second_lock_in_same_process_conflicts(tmp_path: Path) -> None:
    with DirectoryLock(tmp_path) as lock:
        assert _held(lock)
        assert (tmp_path / "lock").read_text().strip() == str(os.getpid())
        with pytest.raises(StoreError) as info:
            DirectoryLock(tmp_path)
        message = str(info.value)
        assert str(tmp_path) in message
        assert f"pid {os.getpid()}" in message
        assert _held(lock)  # the failed attempt must not have dropped the holder's lock
        with pytest.raises(StoreError):
            DirectoryLock(tmp_path)
    assert not _held(lock)
    assert (tmp_path / "lock").exists()  # never unlinked (see the class docstring)
    assert (tmp_path / "lock").read_bytes() == b""
    with DirectoryLock(tmp_path):
        pass


def test_release_is_idempotent(tmp_path: Path) -> None:
    lock = DirectoryLock(tmp_path)
    lock.release()
    lock.release()
    DirectoryLock(tmp_path).release()


def test_lock_in_missing_directory_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open lock file"):
        DirectoryLock(tmp_path / "nope")


def _python(code: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, str(directory)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_lock_conflicts_across_processes_and_dies_with_its_holder(tmp_path: Path) -> None:
    attempt = (
        "import sys; from pathlib import Path; from broker.store.files import DirectoryLock\n"
        "try:\n    DirectoryLock(Path(sys.argv[1]))\n"
        "except Exception as e:\n    print(e); sys.exit(3)\n"
    )
    with DirectoryLock(tmp_path):
        child = _python(attempt, tmp_path)
        assert child.returncode == 3, child.stderr
        assert f"pid {os.getpid()}" in child.stdout
    # A holder that dies without releasing leaves no stale lock: the kernel drops it.
    crash = (
        "import os, sys; from pathlib import Path; from broker.store.files import DirectoryLock\n"
        "DirectoryLock(Path(sys.argv[1])); os._exit(0)\n"
    )
    child = _python(crash, tmp_path)
    assert child.returncode == 0, child.stderr
    DirectoryLock(tmp_path).release()


# ---------------------------------------------------------------------- AbortMarker


def test_abort_marker_lifecycle(tmp_path: Path) -> None:
    marker = AbortMarker(tmp_path)
    assert not _exists(marker)
    marker.create()
    assert _exists(marker)
    assert (tmp_path / "abort").read_text().strip() == str(os.getpid())
    assert AbortMarker(tmp_path).exists  # what the next open sees after a crash
    marker.create()  # re-creating (a second open after a crash) is fine
    marker.remove()
    assert not _exists(marker)
    marker.remove()
    assert _only(tmp_path) == []


def test_a_state_file_is_rewritten_only_when_its_bytes_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config" / "state.json"
    writes: list[bytes] = []
    real = files.atomic_write

    def counting(p: Path, data: bytes) -> None:
        writes.append(data)
        real(p, data)

    monkeypatch.setattr(files, "atomic_write", counting)
    state = files.StateFile(path)
    state.writer(b"a")()  # the directory is made on the first write
    state.writer(b"a")()
    assert (path.read_bytes(), writes) == (b"a", [b"a"])
    state.writer(b"b")()
    state.writer(b"b")()
    assert (path.read_bytes(), writes) == (b"b", [b"a", b"b"])
    # Known at start-up: not written again until it changes.
    held = files.StateFile(path, b"b")
    held.writer(b"b")()
    assert writes == [b"a", b"b"]


def test_a_state_file_write_that_failed_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    state = files.StateFile(path)

    def failing(p: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "atomic_write", failing)
    with pytest.raises(OSError, match="No space"):
        state.writer(b"x")()
    monkeypatch.undo()
    state.writer(b"x")()  # not taken for written: tried again
    assert path.read_bytes() == b"x"
