"""A replica's confirmed offset: how far its reads may go (docs/design.md §13, "Reads on a
replica"; RocketMQ 5's ``confirmOffset``, Kafka's high watermark).

The master sends its confirmed offset (``CONFIRM`` frames): with sync replication, the end
of what ``--min-insync-replicas`` copies hold (what a SEND_OK promises); with async
replication, whatever it has streamed (then the replica serves every record it holds, as
durable as its own ``--flush`` makes it). The replica's store serves consume-queue reads
only of records ending at or before it (``MessageStore.confirm``): a consumer never reads a
message that a failover to another in-sync replica may take back.

The value is kept in ``config/haConfirmed``, written by the store's checkpoints (and the
clean close): a replica restarted while its master is down serves what was confirmed
before. A crash loses at most the last interval's advance — an older value, so fewer reads,
never more.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from broker.store.files import StateFile, read_optional


class ConfirmedOffset:
    """The newest confirmed offset a replica heard of, persisted at checkpoints."""

    def __init__(self, path: Path) -> None:
        """Load ``path`` (0 without it).

        Raises:
            ValueError: the file does not hold an offset.
        """
        self.path = path
        data = read_optional(path)
        try:
            self.value = int(data) if data is not None else 0
        except ValueError:
            raise ValueError(f"{path}: not an offset") from None
        # What the file says (0 when absent: nothing to write until it moves).
        self._file = StateFile(path, _encode(self.value))

    def advance(self, offset: int) -> bool:
        """Take ``offset`` if it is newer; returns whether it was (never goes back)."""
        if offset <= self.value:
            return False
        self.value = offset
        return True

    def cut_to(self, offset: int) -> None:
        """The log was cut back to ``offset`` (a diverged tail): what was confirmed past it
        was another master's and is gone; the new master confirms its own bytes there."""
        self.value = min(self.value, offset)

    def before_checkpoint(self) -> Callable[[], None]:
        """A storage checkpoint hook: the writer persists the value taken now (run in a
        worker thread; nothing when the file holds it already)."""
        return self._file.writer(_encode(self.value))


def _encode(value: int) -> bytes:
    return f"{value}\n".encode()
