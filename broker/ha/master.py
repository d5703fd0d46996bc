"""The master's HA port: one task pair per connected replica, streaming the commit log.

``serve_ha_master`` accepts replicas on its listeners (a nursery per connection, all owned
by the server's nursery, which the broker's front nursery owns). A connection starts with the
replica's ``HELLO``: the master checks the replica belongs to its group and knows no newer
epoch, and answers ``EPOCHS`` — its epoch, log end and epoch history — from which the
replica finds where its log stops agreeing with the master's and cuts it back there (the
master never cuts its own). Then the replica's first ``REPORT`` says where its log ends: it
must end inside the master's, not ahead (a replica that did not cut a diverged tail) and
not before the master's first byte (retention deleted it; seeding from the middle is not
built yet).
Then two tasks run until either ends: the reader takes the replica's reports
(:meth:`ReplicaSet.acked`), the writer streams raw log bytes from the replica's offset in
batches of at most ``batch_bytes``, up to ``MessageStore.replicable_end``. When it has caught
up it waits on :class:`LogGrowth`, which the store signals on every append (ASYNC) or fsync
(SYNC): no polling. An idle link carries a heartbeat (an empty batch) every
``heartbeat_s``; a replica silent for ``idle_s`` is dropped (RocketMQ: 5 s and 20 s).
A third task sends the metadata a promoted replica needs (topics, groups, offsets:
:mod:`broker.ha.metadata`) at once and then whenever it changed, checked every
``meta_interval_s``; the senders share the stream through a lock. The confirmed offset
(``CONFIRM``: how far a replica may serve reads) follows each batch with async replication
(everything streamed is confirmed); with sync replication a fourth task sends it whenever
the offset enough copies hold moves (:attr:`ReplicaSet.high_water`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import trio

from broker.ha.acks import Replica, ReplicaSet
from broker.ha.epoch import EpochEntry
from broker.ha.metadata import TABLES, MasterMetadata
from broker.logs import get_logger
from broker.store.api import StoreError
from broker.store.store import MessageStore
from protocol.errors import ProtocolError
from protocol.ha import (
    Epochs,
    Hello,
    MasterSide,
    Report,
    encode_batch,
    encode_confirm,
    encode_epochs,
    encode_meta,
    encode_refused,
)

_log = get_logger("ha.master")
_F = TypeVar("_F", Hello, Report)


@dataclass(frozen=True, slots=True)
class HaSettings:
    """Timing and sizes of the HA link (both ends)."""

    #: Largest batch of log bytes in one frame (RocketMQ ``haTransferBatchSize``: 32 KiB).
    batch_bytes: int = 256 * 1024
    #: An idle link carries a heartbeat this often (RocketMQ ``haSendHeartbeatInterval``).
    heartbeat_s: float = 5.0
    #: A peer silent this long is dropped (RocketMQ ``haHousekeepingInterval``).
    idle_s: float = 20.0
    #: A new connection must introduce itself within this.
    handshake_s: float = 10.0
    #: How often the master checks its metadata for changes to send (RocketMQ: 3 s).
    meta_interval_s: float = 3.0


class LogGrowth:
    """Set on every growth of the streamable log; the writers wait on it."""

    def __init__(self) -> None:
        self._event = trio.Event()
        #: ``_event`` was handed out: a writer may wait on it. Until then a growth has
        #: nobody to wake, so a put costs no new Event (a put calls :meth:`notify`).
        self._taken = False

    def notify(self) -> None:
        """The store grew (called synchronously from the store, on the trio thread)."""
        if self._taken:
            self._event.set()
            self._event = trio.Event()
            self._taken = False

    def event(self) -> trio.Event:
        """The event the next growth sets: take it *before* looking at the log, then wait
        on it only if the log had nothing new (no await in between)."""
        self._taken = True
        return self._event


class _Refusal(Exception):
    """The replica may not follow this master; the reason is sent to it."""


@dataclass(frozen=True, slots=True)
class MasterLink:
    """What every replica connection of one master shares."""

    store: MessageStore
    replicas: ReplicaSet
    growth: LogGrowth
    broker_name: str
    epoch: int
    #: Where each master epoch began in this master's log (sent in ``EPOCHS``).
    history: tuple[EpochEntry, ...]
    settings: HaSettings
    #: Topics, groups and offsets, sent to every replica (RocketMQ's SlaveSynchronize).
    metadata: MasterMetadata


class _Sender:
    """One stream, two sending tasks (log and metadata): a trio stream takes one
    ``send_all`` at a time."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._lock = trio.Lock()

    async def send(self, frame: bytes) -> None:
        async with self._lock:
            await self._stream.send_all(frame)


async def serve_ha_master(
    link: MasterLink,
    listeners: Sequence[trio.SocketListener],
    *,
    task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve replicas on ``listeners`` until cancelled (see the module docstring)."""
    previous = link.store.on_grow
    link.store.on_grow = link.growth.notify
    try:
        await trio.serve_listeners(
            partial(_serve_replica, link), list(listeners), task_status=task_status
        )
    finally:
        link.store.on_grow = previous


async def _serve_replica(link: MasterLink, stream: trio.SocketStream) -> None:
    peer = _peer(stream)
    side = MasterSide()
    async with stream:
        try:
            hello, start = await _handshake(link, stream, side)
        except _Refusal as refusal:
            _log.warning("replica refused", peer=peer, reason=str(refusal))
            await _send_quietly(stream, encode_refused(str(refusal)))
            return
        except (*_LINK_ERRORS, trio.TooSlowError, EOFError) as exc:
            _log.info("replica handshake failed", peer=peer, error=f"{type(exc).__name__}: {exc}")
            return
        replica = link.replicas.connected(hello.broker_id, peer, start)
        _log.info("replica connected", peer=peer, broker_id=hello.broker_id, offset=start)
        ended: list[str] = []
        sender = _Sender(stream)
        try:
            async with trio.open_nursery() as nursery:
                done = nursery.cancel_scope
                for task in (
                    partial(_read_reports, link, stream, side, replica),
                    partial(_stream_log, link, sender, start),
                    partial(_stream_metadata, link, sender),
                    partial(_stream_confirms, link, sender),
                ):
                    nursery.start_soon(_until_broken, task, done, ended)
        finally:
            link.replicas.disconnected(replica)
            _log.info("replica disconnected", peer=peer, broker_id=hello.broker_id,
                      acked=replica.acked, reason=ended[0] if ended else "stopped")  # fmt: skip


#: What ends one replica's link (the others' go on).
_LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError, StoreError)


async def _until_broken(
    task: Callable[[], Awaitable[None]], done: trio.CancelScope, ended: list[str]
) -> None:
    """Run one half of a link; whichever half ends first (the replica closed, fell silent,
    broke the protocol) ends the other through ``done``."""
    try:
        await task()
        ended.append("closed by the replica")
    except _LINK_ERRORS as exc:
        ended.append(f"{type(exc).__name__}: {exc}")
    finally:
        done.cancel()


async def _handshake(
    link: MasterLink, stream: trio.SocketStream, side: MasterSide
) -> tuple[Hello, int]:
    """The replica's HELLO, checked and answered with ``EPOCHS``; then its first REPORT,
    checked (raises :class:`_Refusal`)."""
    with trio.fail_after(link.settings.handshake_s):
        hello = await _next_frame(stream, side, Hello)
        _check_hello(link, hello)
        await stream.send_all(encode_epochs(_epochs_of(link)))
        report = await _next_frame(stream, side, Report)
    if report.offset < link.store.log.min_offset:
        raise _Refusal(
            f"the replica's log ends at {report.offset}, before this master's log starts "
            f"({link.store.log.min_offset}, retention): seeding a replica from the middle of "
            "a log is not supported yet"
        )
    if report.offset > link.store.log.end:
        raise _Refusal(
            f"the replica's log ends at {report.offset}, past this master's {link.store.log.end}"
            " (it did not cut its log back to the common point)"
        )
    return hello, report.offset


async def _next_frame(stream: trio.SocketStream, side: MasterSide, kind: type[_F]) -> _F:
    """The replica's next frame, which :class:`MasterSide` guarantees is a HELLO first and a
    REPORT after; the first one only (the replica sends nothing more until answered)."""
    while not (events := side.receive(await _receive(stream))):
        pass
    event = events[0]
    assert isinstance(event, kind)  # MasterSide's order
    return event


async def _receive(stream: trio.SocketStream) -> bytes:
    data = await stream.receive_some(64 * 1024)
    if not data:
        raise EOFError("the replica closed during the handshake")
    return data


def _check_hello(link: MasterLink, hello: Hello) -> None:
    if hello.broker_name != link.broker_name:
        raise _Refusal(f"this master serves {link.broker_name}, not {hello.broker_name}")
    if hello.broker_id == 0:
        raise _Refusal("broker id 0 is the master's")
    if hello.epoch > link.epoch:
        raise _Refusal(f"the replica knows epoch {hello.epoch}, newer than this master's")


def _epochs_of(link: MasterLink) -> Epochs:
    history = tuple((e.epoch, e.start) for e in link.history)
    return Epochs(link.epoch, link.store.log.end, history)


async def _read_reports(
    link: MasterLink, stream: trio.SocketStream, side: MasterSide, replica: Replica
) -> None:
    """Take the replica's acknowledgements; return when it closes or falls silent."""
    while True:
        with trio.move_on_after(link.settings.idle_s) as idle:
            data = await stream.receive_some(64 * 1024)
        if idle.cancelled_caught or not data:
            return
        for event in side.receive(data):
            if isinstance(event, Report):
                link.replicas.acked(replica, event.offset)


async def _stream_log(link: MasterLink, sender: _Sender, pos: int) -> None:
    """Send the log from ``pos`` for ever: a batch whenever there are bytes, else wait for
    growth, with a heartbeat when idle."""
    store, settings = link.store, link.settings
    while True:
        grown = link.growth.event()
        end = store.replicable_end
        if pos < end:
            data = store.log_bytes(pos, settings.batch_bytes)
            await sender.send(encode_batch(link.epoch, pos, end, data) + _async_confirm(link, end))
            pos += len(data)
            continue
        with trio.move_on_after(settings.heartbeat_s):
            await grown.wait()
            continue
        await sender.send(encode_batch(link.epoch, pos, end, b"") + _async_confirm(link, end))


def _async_confirm(link: MasterLink, end: int) -> bytes:
    """With async replication everything streamed is confirmed: a ``CONFIRM`` of ``end``
    rides with each batch (in the same write). Nothing with sync replication."""
    return b"" if link.replicas.policy.needed else encode_confirm(link.epoch, end)


async def _stream_confirms(link: MasterLink, sender: _Sender) -> None:
    """With sync replication: send the confirmed offset at once and whenever it rises
    (every replica hears it, the slow ones too: they serve what enough copies hold)."""
    if not link.replicas.policy.needed:
        await trio.sleep_forever()  # async: the log writer sends it
    sent = link.replicas.high_water
    await sender.send(encode_confirm(link.epoch, sent))
    while True:  # each pass waits for a rise
        sent = await link.replicas.wait_high_water_above(sent)
        await sender.send(encode_confirm(link.epoch, sent))


async def _stream_metadata(link: MasterLink, sender: _Sender) -> None:
    """Send each metadata table at once, then again whenever its version moved (checked
    every ``meta_interval_s``: offsets change with every commit, so a snapshot per change
    would cost more than the log itself)."""
    metadata, sent = link.metadata, dict[int, object]()
    while True:
        for table in TABLES:
            version = metadata.version(table)  # before the snapshot: a change after it resends
            if table not in sent or sent[table] != version:
                await sender.send(encode_meta(link.epoch, table, metadata.snapshot(table)))
                sent[table] = version
        await trio.sleep(link.settings.meta_interval_s)


async def _send_quietly(stream: trio.SocketStream, data: bytes) -> None:
    try:
        with trio.move_on_after(1.0):
            await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"
