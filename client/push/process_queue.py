"""Per-queue bookkeeping of pulled messages, and the consumer-wide cache budget. Pure: no I/O,
no clock (times come in as arguments).

Theory of operation (RocketMQ ``ProcessQueue``):

* A pull hands :meth:`ProcessQueue.put` the messages it found plus the offset to pull next
  (``next_offset``, which also covers messages the tag filter skipped).
* A message stays in the queue until its consumption is finished — succeeded, sent back, or
  dead-lettered — and :meth:`ProcessQueue.remove` takes it out.
* The offset to commit is the smallest offset still in the queue, or ``next_offset`` when the
  queue is empty (``removeMessage``'s rule). So a message that never finishes holds the
  committed offset back: at-least-once, and a restart replays what came after it (seed 003);
  the per-message consume timeout bounds how long that can last.
* Orderly consumption takes the head message (:meth:`ProcessQueue.head`) and removes it only
  when it is finished, so the queue is consumed one message at a time, in offset order.

:class:`CacheBudget` bounds what all process queues of a consumer (or a pop consumer's
buffer) hold: a fetch first reserves room for the messages it may bring, so concurrent
fetches together can never overshoot ``max_messages``. Bytes cannot be known before a fetch
arrives, so they only stop further fetching once over the limit.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from client.message import ReceivedMessage

#: RocketMQ ``consumeConcurrentlyMaxSpan``: stop pulling a queue when the offsets it holds
#: span more than this (a stuck head would otherwise let the queue grow without bound).
DEFAULT_MAX_SPAN = 2000


@dataclass(slots=True)
class ProcessQueue:
    """The messages of one queue between their pull and the end of their consumption."""

    #: The offset the next pull starts from (one past everything pulled so far).
    next_offset: int
    _offsets: list[int] = field(default_factory=list)
    _messages: dict[int, ReceivedMessage] = field(default_factory=dict)
    cached_bytes: int = 0
    #: Set when the queue is no longer ours (rebalanced away, shutting down): late results
    #: of its messages must not commit anything.
    dropped: bool = False

    def put(self, messages: list[ReceivedMessage], next_offset: int) -> list[ReceivedMessage]:
        """Add a pull's messages; returns the ones that are new (a duplicate offset is
        skipped, as in Java). ``next_offset`` never moves backwards."""
        added = []
        for message in messages:
            offset = message.queue_offset
            if offset in self._messages:
                continue
            bisect.insort(self._offsets, offset)
            self._messages[offset] = message
            self.cached_bytes += len(message.body)
            added.append(message)
        if added:
            next_offset = max(next_offset, self._offsets[-1] + 1)
        self.next_offset = max(self.next_offset, next_offset)
        return added

    def remove(self, offset: int) -> int | None:
        """Finish the message at ``offset``; returns its body size, ``None`` if it was not
        here (finished already)."""
        message = self._messages.pop(offset, None)
        if message is None:
            return None
        del self._offsets[bisect.bisect_left(self._offsets, offset)]
        self.cached_bytes -= len(message.body)
        return len(message.body)

    @property
    def commit_offset(self) -> int:
        """The offset that may be committed: the smallest unfinished one, else ``next_offset``."""
        return self._offsets[0] if self._offsets else self.next_offset

    def head(self) -> ReceivedMessage | None:
        """The unfinished message with the smallest offset (orderly consumption's next)."""
        return self._messages[self._offsets[0]] if self._offsets else None

    @property
    def count(self) -> int:
        """Messages held."""
        return len(self._offsets)

    @property
    def span(self) -> int:
        """Largest minus smallest offset held (``getMaxSpan``); 0 when empty."""
        return self._offsets[-1] - self._offsets[0] if self._offsets else 0

    def clear(self) -> tuple[int, int]:
        """Drop everything (the queue is gone); returns (messages, bytes) released."""
        released = (len(self._offsets), self.cached_bytes)
        self._offsets.clear()
        self._messages.clear()
        self.cached_bytes = 0
        return released


@dataclass(slots=True)
class CacheBudget:
    """Counts messages and bytes a consumer holds against its limits (see module doc).

    ``cached`` and ``reserved`` messages together never exceed ``max_messages``.
    """

    max_messages: int
    max_bytes: int
    cached: int = 0
    reserved: int = 0
    cached_bytes: int = 0
    peak_cached: int = 0

    def __post_init__(self) -> None:
        if self.max_messages < 1 or self.max_bytes < 1:
            raise ValueError("cache limits must be positive")

    def try_reserve(self, wanted: int) -> int:
        """Reserve room for up to ``wanted`` messages; returns how many (0 = wait)."""
        if self.cached_bytes >= self.max_bytes:
            return 0
        granted = max(0, min(wanted, self.max_messages - self.cached - self.reserved))
        self.reserved += granted
        return granted

    def fill(self, reserved: int, messages: int, size: int) -> None:
        """A fetch that reserved ``reserved`` brought ``messages`` (≤ reserved) of ``size``
        bytes; the unused part of the reservation is returned."""
        if messages > reserved:
            raise ValueError(f"a fetch brought {messages} messages for {reserved} reserved")
        self.reserved -= reserved
        self.cached += messages
        self.cached_bytes += size
        self.peak_cached = max(self.peak_cached, self.cached)

    def release(self, messages: int, size: int) -> None:
        """Messages finished (or dropped) and leave the cache."""
        self.cached -= messages
        self.cached_bytes -= size
