"""A replica follows its master: connect to the HA port, report where the local log ends,
append what the master streams verbatim at the same offsets, report again.

``Follower.run`` loops for ever (owned by the broker's front nursery): connect, follow until
the link breaks, wait a back-off (0.1 s doubling to 5 s; reset once a link carried data),
connect again. Each report follows the appended bytes (ASYNC flush) or their fsync (SYNC
flush), so a master in sync mode counts a copy only once it is as durable on the replica as
the replica's flush mode makes it. The local log only ever holds whole records
(``MessageStore.append_replicated``): bytes of a record still arriving wait in memory, and
a replica that restarts reports its log end and is sent the rest from there.

Each link starts with the master's ``EPOCHS`` answer (its epoch, log end and epoch
history). The replica finds where its log stops agreeing with the master's
(:func:`~broker.ha.epoch.common_point`: the end of the newest epoch both histories hold with
the same start) and cuts its log back there before it reports where it ends — the tail an
old master wrote and never replicated before a promotion elsewhere goes (consume queues, key
index and consumer offsets with it: ``Storage.truncate_to``). Its own history then follows
the master's as its log grows. A stream from an epoch older than the newest this replica
accepted is refused (the connection is dropped); a newer epoch is remembered
(:class:`EpochHistory`). Metadata snapshots
(topics, groups, offsets) on the same stream are applied through
:class:`~broker.ha.metadata.ReplicaMetadata`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from broker.ha.confirm import ConfirmedOffset
from broker.ha.epoch import EpochEntry, EpochHistory, common_point
from broker.ha.master import HaSettings
from broker.ha.metadata import ReplicaMetadata
from broker.logs import get_logger
from broker.storage import Storage
from broker.store.api import FlushMode, StoreError
from broker.topics import TopicManager
from protocol.errors import ProtocolError
from protocol.ha import (
    Batch,
    Confirm,
    Epochs,
    Hello,
    Meta,
    Refused,
    ReplicaSide,
    encode_hello,
    encode_report,
)

_log = get_logger("ha.replica")

#: Where the master's HA port is: waits until it is known (a name-server reply may tell).
MasterAddress = Callable[[], Awaitable[str]]

BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0


@dataclass(frozen=True, slots=True)
class FollowerStatistics:
    """What :meth:`Follower.statistics` reports."""

    connected: bool
    #: Where the local log ends (what was last reported, or is about to be).
    offset: int
    #: The master's log end as of its last batch (lag = master_end - offset).
    master_end: int
    epoch: int
    #: Metadata snapshots applied (topics, groups, offsets) and skipped (unreadable).
    meta_applied: int
    meta_skipped: int
    #: Bytes cut from the local log because they diverged from a master's (all links).
    truncated: int
    #: The master's confirmed offset: reads stop before records ending past it.
    confirmed: int
    connects: int
    #: Links that ended (broken, refused, timed out).
    disconnects: int
    last_error: str


class _LinkEnded(Exception):
    """The link ended for a reason worth a log line."""


#: What ends one link and makes the follower reconnect (after a back-off).
_LINK_ERRORS = (
    OSError,
    trio.BrokenResourceError,
    trio.TooSlowError,
    ProtocolError,
    StoreError,
    _LinkEnded,
)


class Follower:
    """The replica's side of replication (see the module docstring)."""

    def __init__(
        self,
        storage: Storage,
        topics: TopicManager,
        master: MasterAddress,
        metadata: ReplicaMetadata,
        *,
        broker_name: str,
        broker_id: int,
        epochs: EpochHistory,
        confirmed: ConfirmedOffset,
        settings: HaSettings,
        min_queues: int = 4,
    ) -> None:
        self.storage = storage
        self.topics = topics
        self.metadata = metadata
        self._queues_known = -1
        self.master = master
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.epochs = epochs
        #: How far reads may go (the master's ``CONFIRM``s; the store applies it).
        self.confirmed = confirmed
        self.settings = settings
        #: Queues a topic learnt from its records gets at least (the broker's default).
        self.min_queues = min_queues
        self._connected = False
        self._master_end = 0
        self._connects = self._disconnects = 0
        self._last_error = ""
        self._truncated = 0
        #: The master's epoch history on the current link (adopted as the log grows).
        self._master_history: tuple[EpochEntry, ...] = ()
        #: Set whenever the local log grew by replicated bytes (tests wait on it).
        self.progress = trio.Event()
        self._changed = trio.Event()

    async def wait_until(self, check: Callable[[FollowerStatistics], bool]) -> None:
        """Return once ``check`` holds for the statistics (re-checked whenever a link
        starts or ends, or the log grows; callers bound the wait)."""
        while not check(self.statistics()):
            await self._changed.wait()

    def _change(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def statistics(self) -> FollowerStatistics:
        """A snapshot."""
        return FollowerStatistics(
            connected=self._connected,
            offset=self.storage.store.log.end,
            master_end=self._master_end,
            epoch=self.epochs.current,
            meta_applied=self.metadata.applied,
            meta_skipped=self.metadata.skipped,
            truncated=self._truncated,
            confirmed=self.confirmed.value,
            connects=self._connects,
            disconnects=self._disconnects,
            last_error=self._last_error,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the master until cancelled, reconnecting with back-off."""
        task_status.started()
        backoff = BACKOFF_MIN_S
        while True:
            address = await self.master()
            try:
                streamed = await self._follow(address)
            except _LINK_ERRORS as exc:
                streamed = False
                self._last_error = f"{type(exc).__name__}: {exc}"
                _log.warning("replication link ended", master=address, error=self._last_error)
            finally:
                if self._connected:
                    self._disconnects += 1
                self._connected = False
                self._change()
            backoff = BACKOFF_MIN_S if streamed else min(backoff * 2, BACKOFF_MAX_S)
            await trio.sleep(backoff)

    async def _follow(self, address: str) -> bool:
        """One link: returns whether any log bytes came over it."""
        host, _, port = address.rpartition(":")
        store = self.storage.store
        streamed = False
        with trio.fail_after(self.settings.handshake_s):
            stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            self._connected = True
            self._connects += 1
            self._change()
            hello = Hello(self.broker_name, self.broker_id, self.epochs.current)
            await stream.send_all(encode_hello(hello))
            side = ReplicaSide(min_epoch=self.epochs.current)
            reported = await self._agree(stream, side, address)
            await stream.send_all(encode_report(reported))
            _log.info("following master", master=address, offset=reported)
            pending = bytearray()
            while True:
                with trio.move_on_after(self.settings.idle_s) as idle:
                    data = await stream.receive_some(1024 * 1024)
                if idle.cancelled_caught:
                    raise _LinkEnded(f"master silent for {self.settings.idle_s} s")
                if not data:
                    return streamed
                heard = False
                for event in side.receive(data):
                    if isinstance(event, Refused):
                        raise _LinkEnded(f"refused by the master: {event.reason}")
                    heard = True
                    if isinstance(event, Epochs):
                        raise _LinkEnded("a second epoch history on one link")
                    if isinstance(event, Meta):
                        self._apply_metadata(event)
                    elif isinstance(event, Confirm):
                        self._apply_confirm(event)
                    else:
                        streamed |= self._apply(event, pending)
                sync = store.config.flush_mode is FlushMode.SYNC
                if sync and not await self.storage.wait_durable(store.log.end):
                    raise _LinkEnded("fsync failed")
                if heard:
                    reported = store.log.end
                    await stream.send_all(encode_report(reported))

    async def _agree(self, stream: trio.SocketStream, side: ReplicaSide, address: str) -> int:
        """Take the master's ``EPOCHS``, cut the local log back to the common point, adopt
        the master's history; returns where the local log now ends."""
        with trio.fail_after(self.settings.handshake_s):
            epochs = await _first_frame(stream, side)
        self.epochs.raise_to(epochs.epoch)
        store = self.storage.store
        master = tuple(EpochEntry(e, s) for e, s in epochs.history)
        point = common_point(self.epochs.entries, store.log.end, master, epochs.end)
        if point < store.log.end:
            _log.warning("log diverged from the master's: truncating", master=address,
                         log_end=store.log.end, common_point=point)  # fmt: skip
            self._truncated += await self.storage.truncate_to(point)
            self._queues_known = -1
            self.confirmed.cut_to(point)
            store.confirm(self.confirmed.value)
        self._master_history = master
        self.epochs.adopt(master, store.log.end)
        return store.log.end

    def _apply(self, batch: Batch, pending: bytearray) -> bool:
        """Append a batch's bytes (with any partial record held from the last one)."""
        self.epochs.raise_to(batch.epoch)
        self._master_end = batch.master_end
        if not batch.data:
            return False
        pending += batch.data
        start = batch.offset + len(batch.data) - len(pending)
        taken = self.storage.store.append_replicated(start, pending)
        del pending[:taken]
        if taken:
            self.epochs.adopt(self._master_history, self.storage.store.log.end)
            self._learn_topics()
            self.progress.set()
            self.progress = trio.Event()
            self._change()
        return True

    def _apply_confirm(self, confirm: Confirm) -> None:
        """Reads may now reach ``confirm.offset`` (it never goes back)."""
        self.epochs.raise_to(confirm.epoch)
        if self.confirmed.advance(confirm.offset):
            self.storage.store.confirm(self.confirmed.value)
            self._change()

    def _apply_metadata(self, meta: Meta) -> None:
        self.epochs.raise_to(meta.epoch)
        self.metadata.apply(meta.table, meta.data)
        self._change()

    def _learn_topics(self) -> None:
        """The master's topic configs arrive every few seconds: meanwhile a topic whose
        records arrive gets the queues they name — a topic not known yet at least
        ``min_queues`` (default permissions) — so that pulls of its queues are served at
        once (the next snapshot replaces it with the master's config). A known topic keeps
        its (the master's) queue counts unless a record names a queue past them."""
        store = self.storage.store
        if store.queue_count == self._queues_known:
            return
        for topic, queue_ids in store.topics().items():
            least = 0 if self.topics.get(topic) is not None else self.min_queues
            self.topics.ensure_queues(topic, max(max(queue_ids) + 1, least))
        self._queues_known = store.queue_count


async def _first_frame(stream: trio.SocketStream, side: ReplicaSide) -> Epochs:
    """The master's answer to ``HELLO``: its ``EPOCHS`` (a refusal or anything else ends
    the link). Nothing else comes before the replica's first report."""
    while True:  # bounded by the caller's handshake deadline
        data = await stream.receive_some(64 * 1024)
        if not data:
            raise _LinkEnded("the master closed during the handshake")
        events = side.receive(data)
        if not events:
            continue
        event = events[0]
        if isinstance(event, Refused):
            raise _LinkEnded(f"refused by the master: {event.reason}")
        if not isinstance(event, Epochs) or len(events) > 1:
            raise _LinkEnded(f"expected the master's epoch history, got {type(event).__name__}")
        return event
