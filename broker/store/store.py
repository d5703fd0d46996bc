"""``MessageStore``: the synchronous storage engine the broker's trio layer drives.

Theory of operation (single-threaded core; only fsync and file writes of snapshots may run in
a worker thread, through the explicit ``*_begin`` / ``*_sync`` / ``*_end`` triples):

* ``put_nowait`` assigns the queue offset, stamps the store time, builds the record at the
  commit-log position it will occupy and appends it (in memory; written out in batches).
* Dispatch adds the consume-queue entry and tells the :class:`ArrivalListener`. In ``ASYNC``
  mode it happens inside the put; in ``SYNC`` mode only once the record is durable
  (``flush_end``), so no consumer ever sees a message that a crash could take back.
* ``flush_begin/flush_sync/flush_end`` is one group commit: every put appended before
  ``flush_begin`` becomes durable with one fsync, however many producers wait on it.
* ``checkpoint_begin/_sync/_end`` makes the log, every consume queue and the consumer
  offsets durable up to ``safe_offset`` and records that in the checkpoint file. After a crash,
  recovery truncates the consume queues to the checkpoint's sizes and re-dispatches only the
  records after ``safe_offset``; after a clean close (checkpoint ``clean``) it scans nothing.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from broker.store.api import (
    ArrivalListener,
    FlushMode,
    GetResult,
    GetStatus,
    MessageToStore,
    PutResult,
    PutStatus,
    RecordFilter,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
)
from broker.store.checkpoint import Checkpoint
from broker.store.commitlog import CommitLog, ScanEnd, size_at
from broker.store.config import StoreConfig
from broker.store.consumequeue import ConsumeQueue
from broker.store.files import AbortMarker, DirectoryLock
from broker.store.index import KeyIndex
from broker.store.offsets import ConsumerOffsets
from broker.store.reads import read_queue, record_at, records_with_key, store_timestamp_at
from broker.store.record import BLANK_SIZE, build_parts, check_record, encode_props, topic_prefix
from broker.store.tickets import (
    CheckpointTicket,
    FlushTicket,
    Pending,
    StoreCounters,
    StoreStatistics,
)
from protocol.errors import EncodeError, RecordError
from protocol.message import (
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    MessageExt,
    decode_record,
)
from protocol.msgid import ip_to_bytes
from protocol.naming import is_valid_topic
from protocol.properties import (
    CRC32,
    KEY_SEPARATOR,
    KEYS,
    TAGS,
    UNIQ_KEY,
    java_string_hash,
)

QueueKey = tuple[str, int]
#: Why a replica's store refuses a put (docs/design.md §13).
REPLICA_REFUSAL = "the broker is a replica: writes go to its master (broker id 0)"
#: Unwritten commit-log bytes that make a put write out on its own (bounds memory, and
#: surfaces a failing disk within a few MiB rather than at the next flush tick).
WRITE_OUT_THRESHOLD = 4 * 1024 * 1024
#: Consume-queue entries one read may skip over for a tag filter (RocketMQ: 16 000 bytes).
MAX_FILTER_SCAN = 800
MAX_QUEUE_ID = 65_536
_NOT_DISPATCHED = frozenset({SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK})


class MessageStore:
    """Commit log + consume queues + consumer offsets, with crash recovery.

    Use :meth:`open`; always :meth:`close` (a missing close is treated as a crash next time).
    """

    def __init__(
        self,
        config: StoreConfig,
        listener: ArrivalListener | None = None,
        *,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.listener = listener
        self._clock_ms = clock_ms or config.clock.now_ms
        config.config_dir.mkdir(parents=True, exist_ok=True)
        self._lock = DirectoryLock(config.data_dir)
        self._abort = AbortMarker(config.data_dir)
        self._checkpoint_path = config.data_dir / "checkpoint"
        self.log = CommitLog(
            config.commitlog_dir,
            config.segment_size,
            tail_cache_bytes=config.tail_cache_bytes,
            preallocate=config.preallocate,
        )
        self.offsets = ConsumerOffsets(config.config_dir / "consumerOffset.json")
        (config.data_dir / "index").mkdir(exist_ok=True)
        self.index = KeyIndex(config.data_dir / "index", config.segment_size)
        self._queues: dict[QueueKey, ConsumeQueue] = {}
        self._next_offset: dict[QueueKey, int] = {}
        self._mins: dict[QueueKey, tuple[int, int]] = {}
        self._topics: dict[str, tuple[bytes, int]] = {}  # topic -> (length + bytes, magic)
        self._ips: dict[str, bytes] = {}
        self._host = config.store_host
        self._tag_codes: dict[str, int] = {}
        self._async = config.flush_mode is FlushMode.ASYNC
        self._pending: list[Pending] = []
        self._store_ip = ip_to_bytes(config.store_host[0])
        self._store_port = config.store_host[1]
        self._store_family = (len(self._store_ip) == 16) << 1
        self.durable_offset = 0
        self.dispatched_offset = 0
        self.disk_error: OSError | None = None
        #: The disk's usage when it was last found at or past ``disk_full_ratio`` (puts are
        #: refused meanwhile), None when it was not.
        self.disk_full: float | None = None
        self._counters = StoreCounters()  # read through statistics()
        self._closed = False
        #: Called (on the caller's thread, synchronously) whenever ``replicable_end`` moves
        #: on: the HA master's stream tasks wait on it instead of polling the log.
        self.on_grow: Callable[[], None] | None = None
        #: Automatic failover (broker/ha/election.py): asked on every put; a reason means
        #: this master does not hold its lease in time and must not write (fenced:
        #: SERVICE_NOT_AVAILABLE with that reason). None: no election.
        self.write_fence: Callable[[], str | None] | None = None
        #: The confirmed offset (docs/design.md §13): a replica's, or a sync master's (what
        #: ``--min-insync-replicas`` copies hold). Consume-queue reads stop before the first
        #: record ending past it, and arrivals past it are told to the listener only once it
        #: covers them (:meth:`confirm`). None: no limit (an async master).
        self.read_limit: int | None = None
        #: Replicated records past ``read_limit`` whose arrival the listener has not heard
        #: of yet, in log order.
        self._unconfirmed: collections.deque[Pending] = collections.deque()

    @classmethod
    def open(
        cls,
        config: StoreConfig,
        listener: ArrivalListener | None = None,
        *,
        clock_ms: Callable[[], int] | None = None,
    ) -> MessageStore:
        """Open (and, after a crash, recover) the store in ``config.data_dir``."""
        store = cls(config, listener, clock_ms=clock_ms)
        store.check_disk()
        try:
            store._recover()
        except BaseException:
            for cq in store._queues.values():
                cq.close()
            store._release()
            raise
        store._abort.create()
        return store

    # ------------------------------------------------------------------ queues
    def _queue(self, key: QueueKey) -> ConsumeQueue:
        cq = self._queues.get(key)
        if cq is None:
            topic, queue_id = key
            directory = self.config.consumequeue_dir / topic / str(queue_id)
            cq = ConsumeQueue(
                directory, topic, queue_id, entries_per_file=self.config.cq_entries_per_file
            )
            self._queues[key] = cq
            self._next_offset[key] = cq.max_offset
        return cq

    def _discover_queues(self) -> None:
        root = self.config.consumequeue_dir
        if not root.is_dir():
            return
        for topic_dir in sorted(root.iterdir()):
            for queue_dir in sorted(topic_dir.iterdir()):
                if queue_dir.name.isdigit() and queue_dir.name.isascii():
                    self._queue((topic_dir.name, int(queue_dir.name)))

    @property
    def queue_count(self) -> int:
        """How many consume queues the store holds (a replica learns new topics by it)."""
        return len(self._queues)

    def topics(self) -> dict[str, list[int]]:
        """Every topic that holds or held messages, with its queue ids."""
        out: dict[str, list[int]] = {}
        for topic, queue_id in sorted(self._queues):
            out.setdefault(topic, []).append(queue_id)
        return out

    def promote(self) -> None:
        """This replica's store becomes a master's: it takes puts from now on and no
        replicated bytes (docs/design.md §13, manual promotion). Its log ends on a record
        boundary (``append_replicated`` keeps only whole records), so puts continue it."""
        self.config = dataclasses.replace(self.config, replica=False)
        self.confirm(None)

    def confirm(self, offset: int | None) -> None:
        """The confirmed offset moved to ``offset`` (None: no limit any more, a promotion
        or an async master): reads may now reach the records ending at or before it, and
        the listener hears of their arrival (parked pulls wake)."""
        self.read_limit = offset
        held = self._unconfirmed
        while held and (offset is None or held[0].end <= offset):
            self._tell_listener(held.popleft())

    # ------------------------------------------------------------------ put
    def put_nowait(self, msg: MessageToStore) -> PutResult:
        """Append one message. In SYNC mode the caller must wait for ``end_offset`` to be
        durable (``durable_offset``) before acknowledging it.

        Raises:
            StoreClosedError: after :meth:`close`.
        """
        if self._closed:
            raise StoreClosedError("the message store is closed")
        if self.config.replica:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=REPLICA_REFUSAL)
        if self.write_fence is not None and (fenced := self.write_fence()) is not None:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, remark=fenced)
        if self.disk_error is not None and not self._retry_write_out():
            self._counters.put_errors += 1
            return PutResult(PutStatus.DISK_ERROR, remark=self._counters.last_disk_error)
        if len(msg.body) > self.config.max_message_size:
            return _illegal(f"body of {len(msg.body)} bytes exceeds {self.config.max_message_size}")
        if self.disk_full is not None:
            self._counters.put_errors += 1
            return PutResult(
                PutStatus.SERVICE_NOT_AVAILABLE,
                remark=f"the disk is {self.disk_full:.0%} full (limit "
                f"{self.config.disk_full_ratio:.0%}): writes are refused until space is freed",
            )
        try:
            result = self._append(msg)
        except EncodeError as exc:
            status = PutStatus.PROPERTIES_SIZE_EXCEEDED if "properties of" in str(exc) else None
            return PutResult(status or PutStatus.MESSAGE_ILLEGAL, remark=str(exc))
        if self._async and self.on_grow is not None:
            self.on_grow()
        return result

    def _append(self, msg: MessageToStore) -> PutResult:
        # The put hot path (see docs/benchmarks.md): per-topic, per-host and per-tag work is
        # cached, attribute lookups are hoisted, and the record goes straight into the log's
        # tail in parts (RecordParts) rather than through an intermediate bytes object.
        key = (msg.topic, msg.queue_id)
        sys_flag = msg.sys_flag
        dispatched = sys_flag & SYSFLAG_TRANSACTION_MASK not in _NOT_DISPATCHED
        cq = self._queues.get(key)
        topic = self._topics.get(msg.topic)
        if cq is None or topic is None:
            cq, topic = self._first_put(msg, dispatched)
        text = msg.properties_text
        props = (
            text.encode()
            if text is not None and CRC32 not in text
            else encode_props(msg.properties)
        )
        born_ip, born_port = msg.born_host
        born_packed = self._ips.get(born_ip) or self._pack_ip(born_ip)
        queue_offset = self._next_offset[key] if dispatched else 0
        now = self._clock_ms()
        parts = build_parts(
            topic, props, msg.body, born_packed, born_port, self._store_ip, self._store_port,
            msg.queue_id, msg.flag, queue_offset, sys_flag, msg.born_timestamp, now,
            msg.reconsume_times, msg.prepared_transaction_offset, self.log,
        )  # fmt: skip
        offset, size = parts.offset, parts.total
        self._counters.puts += 1
        if dispatched:
            self._next_offset[key] = queue_offset + 1
            tags = msg.properties.get(TAGS)
            tags_code = (self._tag_codes.get(tags) or self._tag_code(tags)) if tags else 0
            pending = Pending(
                offset + size, msg.topic, msg.queue_id, queue_offset, offset, size, tags_code,
                now, msg.properties,
            )  # fmt: skip
            if self._async:
                assert cq is not None  # _first_put opened it
                cq.append(offset, size, tags_code)
                self.dispatched_offset = offset + size
                self._announce(pending)
            else:
                self._pending.append(pending)
        if self.log.end - self.log.written > WRITE_OUT_THRESHOLD:
            self._write_out_quietly()
        return PutResult(PutStatus.PUT_OK, offset, size, queue_offset, now, "", self._host)

    def _first_put(
        self, msg: MessageToStore, dispatched: bool
    ) -> tuple[ConsumeQueue | None, tuple[bytes, int]]:
        """Slow path of a put to a queue or topic not seen yet: validate, open, cache. A
        message that is never dispatched (a half transaction) opens no queue."""
        # Checked first: an illegal topic may not even encode (a lone surrogate).
        if not _legal_queue(msg.topic, msg.queue_id):
            raise EncodeError(f"illegal topic {msg.topic!r} or queue id {msg.queue_id}")
        topic = self._topics.get(msg.topic) or topic_prefix(msg.topic)
        self._topics[msg.topic] = topic
        key = (msg.topic, msg.queue_id)
        return (self._queue(key) if dispatched else self._queues.get(key)), topic

    def _pack_ip(self, ip: str) -> bytes:
        if len(self._ips) >= 4096:  # bounded: producers' addresses, usually few
            self._ips.clear()
        packed = self._ips[ip] = ip_to_bytes(ip)
        return packed

    def _tag_code(self, tags: str) -> int:
        if len(self._tag_codes) >= 65_536:  # bounded: tags are usually few, but not always
            self._tag_codes.clear()
        code = self._tag_codes[tags] = java_string_hash(tags)
        return code

    def _dispatch(self, p: Pending) -> None:
        self._queues[(p.topic, p.queue_id)].append(p.offset, p.size, p.tags_code)
        self.dispatched_offset = p.end
        self._announce(p)

    def _announce(self, p: Pending) -> None:
        """A record entered its queue: index it; tell the listener now if no confirmed
        offset limits reads or it covers the record, else once it does (:meth:`confirm`)."""
        limit = self.read_limit
        if limit is None or p.end <= limit:
            self._notify(p)
            return
        self._index_keys(p.topic, p.properties, p.offset)
        if self.listener is not None:
            self._unconfirmed.append(p)

    def _notify(self, p: Pending) -> None:
        """After a record entered its consume queue: index its keys, tell the listener."""
        self._index_keys(p.topic, p.properties, p.offset)
        self._tell_listener(p)

    def _tell_listener(self, p: Pending) -> None:
        if self.listener is None:
            return
        try:
            self.listener.arriving(
                p.topic, p.queue_id, p.queue_offset, p.tags_code, p.store_timestamp, p.properties
            )
        except Exception:  # a listener bug must never stall dispatch (RocketMQ weak spot 17)
            self._counters.listener_errors += 1

    def _index_keys(self, topic: str, properties: Mapping[str, str], offset: int) -> None:
        add = self.index.add
        uniq = properties.get(UNIQ_KEY)
        if uniq:
            add(uniq, offset)
        keys = properties.get(KEYS)
        if keys:
            if KEY_SEPARATOR in keys:
                for key in keys.split(KEY_SEPARATOR):
                    if key:
                        add(key, offset)
            else:
                add(keys, offset)

    # ------------------------------------------------------------------ disk errors
    def _write_out_quietly(self) -> list[int]:
        try:
            fds = self.log.write_out()
        except OSError as exc:
            self.note_disk_error(exc)
            return []
        self.disk_error = None
        return fds

    def _retry_write_out(self) -> bool:
        self._write_out_quietly()
        return self.disk_error is None

    def note_disk_error(self, exc: OSError) -> None:
        self.disk_error = exc
        self._counters.last_disk_error = f"disk error: {exc.strerror or exc} ({exc.filename or ''})"

    # ------------------------------------------------------------------ group commit
    def flush_begin(self) -> FlushTicket:
        """Write every appended byte out; the ticket says what to fsync and up to where.

        Raises:
            OSError: the write failed (the store answers DISK_ERROR until a retry succeeds).
        """
        try:
            fds = self.log.write_out()
        except OSError as exc:
            self.note_disk_error(exc)
            raise
        self.disk_error = None
        return FlushTicket(self.log.written, tuple(fds), self.log.write_generation)

    @staticmethod
    def flush_sync(ticket: FlushTicket) -> None:
        """The blocking part: fsync. Safe to run in a worker thread."""
        for fd in ticket.fds:
            os.fsync(fd)

    def flush_end(self, ticket: FlushTicket) -> int:
        """Record that ``ticket`` is durable; in SYNC mode dispatch what became durable."""
        self.log.synced(ticket.generation)
        grew = ticket.target > self.durable_offset
        self.durable_offset = max(self.durable_offset, ticket.target)
        if self._pending and self._pending[0].end <= self.durable_offset:
            ready = 0
            for p in self._pending:
                if p.end > self.durable_offset:
                    break
                self._dispatch(p)
                ready += 1
            del self._pending[:ready]
        if grew and not self._async and self.on_grow is not None:
            self.on_grow()
        return self.durable_offset

    def flush(self) -> int:
        """``flush_begin`` + ``flush_sync`` + ``flush_end`` in this thread."""
        ticket = self.flush_begin()
        self.flush_sync(ticket)
        return self.flush_end(ticket)

    # ------------------------------------------------------------------ checkpoint
    def checkpoint_begin(self, *, clean: bool = False) -> CheckpointTicket:
        """Prepare a checkpoint at the dispatched position (see the module docstring)."""
        flush = self.flush_begin()
        # Every record before the first undispatched one is in its consume queue.
        safe = self._pending[0].offset if self._pending else self.log.end
        queue_fds: list[int] = []
        for cq in self._queues.values():
            queue_fds += cq.write_out()
        cp = Checkpoint(
            safe_offset=safe,
            clean=clean,
            queue_sizes={key: cq.max_offset for key, cq in self._queues.items()},
            min_offset=self.log.min_offset,
            written_at_ms=self._clock_ms(),
        )
        changes = self.offsets.changes
        snapshot = self.offsets.snapshot() if self.offsets.dirty or clean else None
        rows = self.index.take()
        return CheckpointTicket(flush, tuple(queue_fds), cp, snapshot, changes, rows)

    def checkpoint_sync(self, ticket: CheckpointTicket) -> None:
        """The blocking part: fsync log and queues, write offsets and the checkpoint file."""
        self.flush_sync(ticket.flush)
        for fd in ticket.queue_fds:
            os.fsync(fd)
        if ticket.offsets_snapshot is not None:
            self.offsets.write_snapshot(ticket.offsets_snapshot)
        self.index.write(ticket.index_rows)
        ticket.checkpoint.save(self._checkpoint_path)

    def checkpoint_end(self, ticket: CheckpointTicket) -> None:
        """Record the completed checkpoint."""
        self.flush_end(ticket.flush)
        if ticket.offsets_snapshot is not None:
            self.offsets.mark_persisted(ticket.offsets_changes)
        self.index.written(ticket.index_rows)
        self._counters.checkpoints += 1

    def checkpoint(self) -> None:
        """A whole checkpoint in this thread."""
        ticket = self.checkpoint_begin()
        self.checkpoint_sync(ticket)
        self.checkpoint_end(ticket)

    # ------------------------------------------------------------------ replication
    @property
    def replicable_end(self) -> int:
        """How far the HA master may stream its log: every appended byte in ASYNC mode, only
        durable ones in SYNC mode (a replica then never holds a record that the master's own
        crash took back)."""
        return self.log.end if self._async else self.durable_offset

    def log_bytes(self, offset: int, max_size: int) -> bytes:
        """Raw log bytes from ``offset``: at most ``max_size``, never past ``replicable_end``
        nor across a segment boundary (the next call continues; see ``CommitLog.read_some``).
        Empty at ``replicable_end``.

        Raises:
            StoreError: ``offset`` is outside ``[log.min_offset, replicable_end]``.
        """
        end = self.replicable_end
        if not self.log.min_offset <= offset <= end:
            raise StoreError(f"log offset {offset} is outside [{self.log.min_offset}, {end}]")
        if offset == end or max_size <= 0:
            return b""
        return self.log.read_some(offset, min(max_size, end - offset))

    def append_replicated(self, offset: int, data: bytes | bytearray) -> int:
        """Append the master's log bytes verbatim at the master's ``offset`` (which must be
        this log's end) — whole records only, so this log always ends on a record boundary —
        and dispatch them as a put would (ASYNC: now; SYNC: once durable). Returns how many
        bytes were taken: the caller keeps the rest (a record not complete yet) and offers it
        again with the next bytes.

        Raises:
            StoreError: not a replica, ``offset`` is not where this log ends, or the bytes are
                not valid records (each is checked: size, magic, position field, CRC).
        """
        if not self.config.replica:
            raise StoreError("only a replica's store appends replicated bytes")
        if offset != self.log.end:
            raise StoreError(
                f"replicated bytes at offset {offset}, but this log ends at {self.log.end}"
            )
        pos = 0
        while pos < len(data):
            taken = self._replicate_one(data, pos, offset + pos)
            if taken == 0:
                break
            pos += taken
        if self.log.end - self.log.written > WRITE_OUT_THRESHOLD:
            self._write_out_quietly()
        if pos and self._async and self.on_grow is not None:
            self.on_grow()
        return pos

    def truncate_to(self, offset: int) -> int:
        """Cut a replica's log back to ``offset`` (a record boundary its master's log shares:
        the common point of their epoch histories), with every consume queue, the key index
        and the consumer offsets past it. Returns the bytes cut. Blocking (fsyncs): rare.

        Crash-safe: everything before ``offset`` is made durable and a checkpoint at
        ``offset`` is written *before* anything is cut, so a crash part-way recovers from
        that checkpoint — re-dispatching whatever of the tail is still on disk (the next
        handshake cuts it again) — and never from a checkpoint past the new end.

        Raises:
            StoreError: not a replica (a master never truncates), or ``offset`` is past the
                log's end.
            OSError: a write or fsync failed (nothing was cut unless the checkpoint was
                written; recovery then finishes the job).
        """
        if not self.config.replica:
            raise StoreError("only a replica's log is ever truncated")
        if offset > self.log.end:
            raise StoreError(f"cannot truncate to {offset}, past the log's end {self.log.end}")
        if offset == self.log.end:
            return 0
        cut = self.log.end - offset
        self.flush()  # every byte and entry durable, SYNC mode's held dispatches done
        sizes = {key: self._entries_before(cq, offset) for key, cq in self._queues.items()}
        for cq in self._queues.values():
            cq.sync()
        rows = self.index.take()
        self.index.write(rows)
        self.index.written(rows)
        Checkpoint(
            safe_offset=offset,
            clean=False,
            queue_sizes=sizes,
            min_offset=self.log.min_offset,
            written_at_ms=self._clock_ms(),
        ).save(self._checkpoint_path)
        for key, cq in self._queues.items():
            cq.truncate(sizes[key])
            cq.sync()
            self._next_offset[key] = cq.max_offset
            self.offsets.clamp(key[0], key[1], cq.min_offset, cq.max_offset)
        self.index.truncate_from(offset)
        self.log.truncate(offset)
        while self._unconfirmed and self._unconfirmed[-1].end > offset:
            self._unconfirmed.pop()  # arrivals of records that are gone
        self._mins.clear()
        self.durable_offset = self.dispatched_offset = offset
        return cut

    @staticmethod
    def _entries_before(cq: ConsumeQueue, offset: int) -> int:
        """The queue offset of ``cq``'s first entry at or past commit-log ``offset`` (entries
        are in log order): how many entries a truncation to ``offset`` keeps."""
        last = cq.entry(cq.max_offset - 1)
        if last is None or last[0] < offset:
            return cq.max_offset  # the common case: nothing of this queue is cut
        return cq.first_at_or_after(offset)

    def _replicate_one(self, data: bytes | bytearray, pos: int, phys: int) -> int:
        """Append the record (or end-of-segment blank) at ``data[pos:]``; 0 when it is not
        complete yet."""
        if len(data) - pos < BLANK_SIZE:
            return 0
        size = size_at(data, pos)
        if 0 < size <= self.log.segment_size and pos + size > len(data):
            return 0  # a record (or a blank's padding) still arriving
        check = check_record(data, pos, phys)
        if check.size == 0:
            raise StoreError(f"replicated bytes at offset {phys}: {check.reason}")
        if check.blank:
            seg_end = phys - phys % self.log.segment_size + self.log.segment_size
            if phys + check.size != seg_end or any(data[pos + BLANK_SIZE : pos + check.size]):
                raise StoreError(f"replicated bytes at offset {phys}: bad end-of-segment blank")
            self.log.append(bytes(data[pos : pos + check.size]))
            return check.size
        record = bytes(data[pos : pos + check.size])
        if phys % self.log.segment_size + check.size + BLANK_SIZE > self.log.segment_size:
            raise StoreError(f"replicated record at offset {phys} overruns its segment")
        self.log.append(record)
        self._counters.puts += 1
        self._dispatch_replicated(phys, record)
        return check.size

    def _dispatch_replicated(self, offset: int, record: bytes) -> None:
        msg, _ = decode_record(record)
        if msg.sys_flag & SYSFLAG_TRANSACTION_MASK in _NOT_DISPATCHED:
            return
        key = (msg.topic, msg.queue_id)
        self._queue(key)  # made if new: _dispatch appends to it
        expected = self._next_offset[key]
        if msg.queue_offset != expected:
            raise StoreError(
                f"replicated record at offset {offset} has queue offset {msg.queue_offset} in "
                f"{msg.topic}:{msg.queue_id}, which is at {expected}"
            )
        self._next_offset[key] = expected + 1
        tags = msg.properties.get(TAGS)
        tags_code = java_string_hash(tags) if tags else 0
        arrived = Pending(
            offset + len(record), msg.topic, msg.queue_id, msg.queue_offset, offset,
            len(record), tags_code, msg.store_timestamp, msg.properties,
        )  # fmt: skip
        if self._async:
            self._dispatch(arrived)  # SYNC mode: once its fsync is done, as a put's
        else:
            self._pending.append(arrived)

    # ------------------------------------------------------------------ reads
    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int = 32,
        *,
        max_bytes: int = 4 * 1024 * 1024,
        tags_codes: frozenset[int] | None = None,
        record_filter: RecordFilter | None = None,
    ) -> GetResult:
        """Read up to ``max_count`` messages (and ``max_bytes``, but at least one) from
        ``offset``; with ``tags_codes`` only messages whose tag hash is in the set, with
        ``record_filter`` only those it passes."""
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, 0, 0, 0)
        return read_queue(
            self.log, cq, self._queue_min(cq), offset, max_count, max_bytes, tags_codes,
            record_filter, self._readable_high(cq),
        )  # fmt: skip

    def _readable_high(self, cq: ConsumeQueue) -> int:
        """One past the last entry a read may serve: all of them, except on a replica
        those whose record ends past the confirmed offset (``read_limit``)."""
        high, limit = cq.max_offset, self.read_limit
        if limit is None:
            return high
        last = cq.entry(high - 1)
        if last is None or last[0] + last[1] <= limit:
            return high  # the common case: one entry read
        # Entries are in log order and records are whole on both sides, so an entry ends
        # past the limit exactly when it starts at or past it.
        return cq.first_at_or_after(limit)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """Smallest queue offset whose message is still held (0 for an unknown queue)."""
        cq = self._queues.get((topic, queue_id))
        return self._queue_min(cq) if cq else 0

    def _queue_min(self, cq: ConsumeQueue) -> int:
        # Retention deletes whole consume-queue files only, so the first entries of a queue
        # may point into deleted log segments: skip them (a binary search, cached until the
        # log's start moves again).
        log_min = self.log.min_offset
        if log_min == 0:
            return cq.min_offset
        key = (cq.topic, cq.queue_id)
        cached = self._mins.get(key)
        if cached is None or cached[0] != log_min:
            cached = (log_min, cq.first_at_or_after(log_min))
            self._mins[key] = cached
        return max(cached[1], cq.min_offset)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last queue offset (0 for an unknown queue)."""
        cq = self._queues.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def message_at(self, commit_log_offset: int) -> bytes | None:
        """The record at a commit-log offset (an offset msgId points there), or None when no
        valid record starts there."""
        return record_at(self.log, commit_log_offset)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First queue offset whose message was stored at or after ``timestamp_ms``
        (``max_offset`` when none was)."""
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            return 0
        return cq.bisect(lambda e: store_timestamp_at(self.log, e[0], e[1]), timestamp_ms)

    def messages_by_key(
        self,
        topic: str,
        key: str,
        max_num: int = 64,
        begin_ms: int = 0,
        end_ms: int = 2**63 - 1,
    ) -> list[bytes]:
        """Records of ``topic`` whose ``UNIQ_KEY`` or one of whose ``KEYS`` is ``key``,
        stored within ``[begin_ms, end_ms]``, newest first."""
        candidates = self.index.candidates(key, max_num * 8)
        return records_with_key(self.log, candidates, topic, key, max_num, begin_ms, end_ms)

    # ------------------------------------------------------------------ retention
    def disk_used_ratio(self) -> float:
        """Used fraction of the file system holding the data directory."""
        return self.config.disk_probe(self.config.data_dir)

    def check_disk(self) -> float | None:
        """Look at the disk: past ``disk_full_ratio`` puts are refused until a later check
        finds it below (reads go on). Returns the usage while full, else None."""
        limit = self.config.disk_full_ratio
        if limit <= 0:
            self.disk_full = None
            return None
        used = self.disk_used_ratio()
        self.disk_full = used if used >= limit else None
        return self.disk_full

    def delete_expired(self, now_s: float, *, scheduled: bool = False) -> int:
        """Delete commit-log segments older than ``retention_hours`` — only on the daily
        schedule or when the disk is fuller than ``disk_max_used_ratio`` (RocketMQ's
        ``deleteWhen`` / ``diskMaxUsedSpaceRatio``), and never the segment being written.
        Consume-queue files and index rows that point only into deleted segments go too.
        Returns the number of segments deleted."""
        if not scheduled and self.disk_used_ratio() < self.config.disk_max_used_ratio:
            return 0
        upto = self.log.expired_before(now_s - self.config.retention_hours * 3600)
        deleted = self.log.delete_segments_before(upto)
        if deleted:
            for cq in self._queues.values():
                cq.delete_files_before(self.log.min_offset)
            self.index.delete_before(self.log.min_offset)
        return len(deleted)

    # ------------------------------------------------------------------ statistics
    def statistics(self) -> StoreStatistics:
        """A snapshot of the counters (the live ones are bumped in place on the put path)."""
        c = self._counters
        return StoreStatistics(
            puts=c.puts,
            put_errors=c.put_errors,
            listener_errors=c.listener_errors,
            checkpoints=c.checkpoints,
            recovered_records=c.recovered_records,
            recovery_stop_reason=c.recovery_stop_reason,
            recovery_scanned_from=c.recovery_scanned_from,
            last_disk_error=c.last_disk_error,
        )

    # ------------------------------------------------------------------ recovery
    def _recover(self) -> None:
        try:
            cp = Checkpoint.load(self._checkpoint_path)
        except StoreCorruptError:
            cp = None  # an unreadable checkpoint costs a full scan, never a wrong answer
        self._discover_queues()
        if cp is not None and cp.clean and not self._abort.exists:
            self.log.set_end(cp.safe_offset)
            self.durable_offset = self.dispatched_offset = cp.safe_offset
            return
        start = cp.safe_offset if cp is not None else self.log.min_offset
        start = max(start, self.log.min_offset)
        sizes = cp.queue_sizes if cp is not None else {}
        for key, cq in self._queues.items():
            cq.truncate(sizes.get(key, cq.min_offset))
            self._next_offset[key] = cq.max_offset
        self._counters.recovery_scanned_from = start
        # Index rows past the checkpoint may be stale; re-dispatch adds back the real ones.
        self.index.truncate_from(start)
        end = self._redispatch(start)
        self.log.truncate(end)
        self.durable_offset = self.dispatched_offset = end
        for key, cq in self._queues.items():
            self.offsets.clamp(key[0], key[1], cq.min_offset, cq.max_offset)

    def messages_since(self, start: int) -> Iterator[MessageExt]:
        """Every readable record from commit-log offset ``start`` to the end of the log, in
        order (what a crash recovery re-dispatched: services find their own markers there)."""
        for item in self.log.scan(start):
            if isinstance(item, ScanEnd):
                return
            try:
                yield decode_record(item.data)[0]
            except RecordError:
                continue

    def _redispatch(self, start: int) -> int:
        for item in self.log.scan(start):
            if isinstance(item, ScanEnd):
                self._counters.recovery_stop_reason = item.reason
                return item.offset
            msg, _ = decode_record(item.data)
            self._counters.recovered_records += 1
            if msg.sys_flag & SYSFLAG_TRANSACTION_MASK in _NOT_DISPATCHED:
                continue
            key = (msg.topic, msg.queue_id)
            cq = self._queue(key)
            tags = msg.properties.get(TAGS)
            cq.append_at(
                msg.queue_offset, item.offset, len(item.data),
                java_string_hash(tags) if tags else 0,
            )  # fmt: skip
            self._next_offset[key] = cq.max_offset
            self._index_keys(msg.topic, msg.properties, item.offset)
        raise AssertionError("scan always ends with a ScanEnd")  # pragma: no cover

    # ------------------------------------------------------------------ topics
    def delete_topic(self, topic: str) -> None:
        """Forget a topic's consume queues and offsets (its records age out of the log)."""
        for key in [k for k in self._queues if k[0] == topic]:
            self._queues.pop(key).destroy()
            self._next_offset.pop(key, None)
        shutil.rmtree(self.config.consumequeue_dir / topic, ignore_errors=True)
        self.offsets.remove_topic(topic)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Flush everything, write a clean checkpoint, release the directory."""
        if self._closed:
            return
        try:
            if self.disk_error is None or self._retry_write_out():
                self.flush()  # dispatches what SYNC mode still held back
                ticket = self.checkpoint_begin(clean=True)
                self.checkpoint_sync(ticket)
                self.checkpoint_end(ticket)
                self._abort.remove()
        finally:
            self._closed = True
            for cq in self._queues.values():
                cq.close()
            self._release()

    def _release(self) -> None:
        self.log.close()
        self.index.close()
        self._lock.release()

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _legal_queue(topic: str, queue_id: int) -> bool:
    # The topic names a directory: never let a name like "../x" through, whatever the caller
    # checked already.
    return is_valid_topic(topic) and 0 <= queue_id < MAX_QUEUE_ID


def _illegal(remark: str) -> PutResult:
    return PutResult(PutStatus.MESSAGE_ILLEGAL, remark=remark)


def remove_store(data_dir: Path) -> None:
    """Delete a store directory (tests and benchmarks)."""
    shutil.rmtree(data_dir, ignore_errors=True)
