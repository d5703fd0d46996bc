"""The master epochs a broker knows, and where each began in its commit log
(``<data-dir>/config/haEpoch``; docs/design.md §13).

Two things, kept in one file so that they change together:

* the **fence**: the newest master epoch this broker accepted (a replica) or serves under
  (a master). A replica refuses a stream from an older epoch (a deposed master that still
  streams); a master refuses a replica that knows a newer one.
* the **history**: ``(epoch, start)`` pairs, oldest first — the commit-log offset where each
  master epoch's bytes begin (RocketMQ 5's ``EpochFile``, Kafka's leader-epoch checkpoint).
  A master that was never promoted wrote everything under epoch 1 from offset 0; a promotion
  appends ``(new epoch, log end)``; a replica's history is its master's, up to its own log
  end. Two logs agree up to the end of the newest epoch both histories hold with the same
  start (:func:`common_point`): a replica truncates to that point before it appends, so a
  tail its old master wrote and never replicated is cut (a master never truncates).

The file is replaced atomically (temp file, fsync, rename, directory fsync): a crash leaves
the old history or the new one. A file holding one integer (written before histories
existed) reads as that fence with the history ``[(1, 0)]``: until promotions existed every
byte was the first master's.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from broker.store.files import atomic_write, read_optional

#: The epoch of a master that has never been promoted.
FIRST_EPOCH = 1
#: Entries a history keeps at most (the oldest go first: a truncation never reaches back
#: across hundreds of failovers).
MAX_ENTRIES = 1024


class EpochEntry(NamedTuple):
    """Master epoch ``epoch`` wrote the log from offset ``start`` on."""

    epoch: int
    start: int


class EpochHistory:
    """The fence and the history, durable (see the module docstring)."""

    entries: tuple[EpochEntry, ...]

    def __init__(self, path: Path, *, master: bool) -> None:
        """Load ``path``; without it, a master starts at epoch 1 from offset 0 — written at
        once, so that the broker still knows whose bytes it holds if it comes back as a
        replica — and a replica knows nothing yet (fence 0, empty history).

        Raises:
            ValueError: the file is not a history.
            OSError: a master's first history could not be written.
        """
        self.path = path
        self.fence, self.entries = 0, ()
        data = read_optional(path)
        if data is not None:
            self.fence, self.entries = _decode(path, data)
        if master and self.fence == 0:  # new, or a replica's that never heard of a master
            self._save(FIRST_EPOCH, (EpochEntry(FIRST_EPOCH, 0),))

    @property
    def current(self) -> int:
        """The fence: the newest epoch accepted or served under."""
        return self.fence

    @property
    def last_epoch(self) -> int:
        """The epoch of the newest bytes' writer (0 with an empty history)."""
        return self.entries[-1].epoch if self.entries else 0

    def raise_to(self, epoch: int) -> None:
        """Accept ``epoch`` as the fence if it is newer (a small blocking write: rare)."""
        if epoch > self.fence:
            self._save(epoch, self.entries)

    def begin(self, epoch: int, start: int) -> None:
        """This broker becomes master under ``epoch``, writing from ``start`` (its log end).

        Raises:
            ValueError: ``epoch`` is not newer than the fence.
            OSError: the history could not be made durable (nothing changed).
        """
        if epoch <= self.fence:
            raise ValueError(f"epoch {epoch} is not newer than {self.fence}")
        self._save(epoch, (*self.entries, EpochEntry(epoch, start)))

    def adopt(self, master: Sequence[EpochEntry], log_end: int) -> None:
        """Become the master's history up to ``log_end`` (a replica, after it truncated to
        the common point, and again as its log grows past the start of a master epoch):
        entries whose bytes this log holds. Written only when it changed."""
        entries = tuple(e for e in master if e.start < log_end)
        if entries != self.entries:
            self._save(self.fence, entries)

    def _save(self, fence: int, entries: tuple[EpochEntry, ...]) -> None:
        entries = entries[-MAX_ENTRIES:]
        payload = {"fence": fence, "history": [[e.epoch, e.start] for e in entries]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, (json.dumps(payload) + "\n").encode())
        self.fence, self.entries = fence, entries


def common_point(
    local: Sequence[EpochEntry], local_end: int, master: Sequence[EpochEntry], master_end: int
) -> int:
    """Where a replica's log (``local`` history, ending at ``local_end``) stops agreeing
    with its master's: the end of the newest epoch both hold with the same start — the
    smaller of the two ends of that epoch. 0 when they share none (RocketMQ then truncates
    everything too)."""
    theirs = {epoch: (start, end) for epoch, start, end in _spans(master, master_end)}
    for epoch, start, end in reversed(_spans(local, local_end)):
        span = theirs.get(epoch)
        if span is not None and span[0] == start:
            return min(end, span[1])
    return 0


def _spans(entries: Sequence[EpochEntry], log_end: int) -> list[tuple[int, int, int]]:
    """``(epoch, start, end)``: an epoch ends where the next begins, the last at the log's end."""
    if not entries:
        return []
    ends = [e.start for e in entries[1:]] + [log_end]
    return [(e.epoch, e.start, max(e.start, end)) for e, end in zip(entries, ends, strict=True)]


def _decode(path: Path, data: bytes) -> tuple[int, tuple[EpochEntry, ...]]:
    text = data.decode(errors="replace").strip()
    if text.isdigit() and text.isascii():  # the one-integer file of earlier builds
        fence = int(text)
        return fence, (EpochEntry(FIRST_EPOCH, 0),) if fence >= FIRST_EPOCH else ()
    try:
        obj = json.loads(text)
        fence = obj["fence"]
        entries = tuple(EpochEntry(int(e), int(s)) for e, s in obj["history"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not an epoch history ({exc})") from None
    if not isinstance(fence, int) or any(
        b.epoch <= a.epoch or b.start < a.start for a, b in itertools.pairwise(entries)
    ):
        raise ValueError(f"{path}: epochs must rise and their starts never fall")
    return fence, entries
