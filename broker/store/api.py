"""The store's public vocabulary: inputs, results, status values and the upward signal.

Expected outcomes are values (``PutStatus``, ``GetStatus``), not exceptions: a full disk is a
``PutStatus.DISK_ERROR``, a pull past the end is ``GetStatus.OFFSET_OVERFLOW_ONE``. Exceptions
are reserved for misuse (``StoreClosedError``) and for corruption found where none can be
(``StoreCorruptError``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple, Protocol

from protocol.errors import TrimqError
from protocol.msgid import encode_offset_msg_id

#: ``(ip, port)`` as the record codec takes it.
Host = tuple[str, int]
#: Whether a stored record (its bytes) passes a consumer's property filter (SQL92).
RecordFilter = Callable[[bytes], bool]


class PutStatus(enum.Enum):
    """Outcome of a put (RocketMQ's ``PutMessageStatus`` where it has one)."""

    PUT_OK = "PUT_OK"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"  # body too large, bad topic, unencodable properties
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    DISK_ERROR = "DISK_ERROR"  # ENOSPC, EIO, read-only directory: nothing was appended
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"  # the store is read-only after a disk error
    # Set by sync replication (broker.core), never by the store: the message *is* stored
    # (on the master), but fewer copies than asked for acknowledged it in time. (Too few
    # replicas in sync is refused before the append: SLAVE_NOT_AVAILABLE, nothing stored.)
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"


#: Outcomes of a put whose message was appended to the log (readable, has a msgId).
STORED_STATUSES = frozenset({PutStatus.PUT_OK, PutStatus.FLUSH_SLAVE_TIMEOUT})


class GetStatus(enum.Enum):
    """Outcome of a read (RocketMQ's ``GetMessageStatus``)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # entries existed but the tag filter took none
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # the queue has never held a message
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # below the min offset (retention removed it)
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # == max offset: caught up, park the pull
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # beyond the max offset
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"  # unknown topic or queue id


class FlushMode(enum.Enum):
    """``async``: fsync on an interval. ``sync``: a put is durable only after its fsync."""

    ASYNC = "async"
    SYNC = "sync"


#: The properties of a message that has none (shared: read-only).
NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})


class MessageToStore(NamedTuple):
    """What a producer's send becomes before the store assigns offsets and a store time.

    A named tuple rather than a frozen dataclass: one is built per message on the send path,
    and a frozen dataclass's ``__init__`` cost 3.4 µs against 0.65 µs."""

    topic: str
    queue_id: int
    body: bytes
    properties: Mapping[str, str] = NO_PROPERTIES
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: Host = ("127.0.0.1", 0)
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    #: The properties exactly as the producer sent them (SEND_MESSAGE's ``properties``):
    #: stored as they are, saving a re-encode. Must describe the same map as ``properties``.
    properties_text: str | None = None


class PutResult(NamedTuple):
    """Where a put landed. ``end_offset`` is what a sync-mode put waits to see flushed.

    A named tuple rather than a dataclass: one is built per message on the put hot path.
    """

    status: PutStatus
    commit_log_offset: int = -1
    size: int = 0
    queue_offset: int = -1
    store_timestamp: int = 0
    remark: str = ""
    store_host: Host = ("127.0.0.1", 0)

    @property
    def ok(self) -> bool:
        """True when the message was appended."""
        return self.status is PutStatus.PUT_OK

    @property
    def stored(self) -> bool:
        """True when the message is in the log, even if not replicated as asked."""
        return self.status in STORED_STATUSES

    @property
    def end_offset(self) -> int:
        """Commit-log offset just past this record."""
        return self.commit_log_offset + self.size

    @property
    def msg_id(self) -> str:
        """The offset message id (store host + commit-log offset), "" when not stored."""
        if not self.stored:
            return ""
        return encode_offset_msg_id(self.store_host[0], self.store_host[1], self.commit_log_offset)


@dataclass(frozen=True, slots=True)
class GetResult:
    """A read of one consume queue.

    ``body`` is the stored records back to back, exactly the bytes a PULL/POP response body
    carries; ``offsets`` are their queue offsets. ``next_offset`` is where the next read of
    this queue should start (past filtered-out entries too).
    """

    status: GetStatus
    next_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""
    offsets: tuple[int, ...] = ()
    commit_log_offsets: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        """How many messages ``body`` holds."""
        return len(self.offsets)


class ArrivalListener(Protocol):
    """Told about every message once it is dispatched to its consume queue.

    The broker's long-polling hub implements it. It is called synchronously from the store;
    an exception it raises is caught and counted by the store, never allowed to stall
    dispatch (RocketMQ weak spot 17).
    """

    def arriving(
        self,
        topic: str,
        queue_id: int,
        queue_offset: int,
        tags_code: int,
        store_timestamp: int,
        properties: Mapping[str, str],
    ) -> None: ...


class StoreError(TrimqError):
    """Misuse of the store or damage it cannot work around."""


class StoreClosedError(StoreError):
    """The store was used after :meth:`close`."""


class StoreCorruptError(StoreError):
    """On-disk state contradicts itself beyond what recovery may repair."""
