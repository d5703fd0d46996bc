"""Automatic failover through etcd (docs/ha.md, docs/design.md §13 Phase B).

Per broker group, under ``/trimq/<cluster>/<brokerName>/``:

- ``master``: held by the master's lease (TTL ``--etcd-lease-ttl-s``, default 3 s). Its
  value says who (broker id, Remoting and HA addresses); the **epoch** of a master is the
  etcd revision at which its key was created, so every new master has a larger one.
- ``insync``: the in-sync set, ``{"epoch": E, "members": [ids]}``, written only by the
  master of epoch E, with a compare on the master key's create revision (it still holds
  it) and on the set's own mod revision (compare-and-set). It holds no lease: it must
  outlive the master, since it says who may replace it. The master is a member; a replica
  is one while it is connected and has acknowledged the log as it stood one check earlier
  (``isr_interval_s``), so a replica lagging by more than that drops out.
- ``candidates/<id>``: during an election, each in-sync replica's log end (under its own
  lease).

**Election.** Only a member of the in-sync set may campaign (no unclean election); a
fresh group (no set yet) is started by broker id 0 alone. When the master key is gone,
every replica stops following (so it acknowledges nothing more to the old master), then
publishes its candidacy; the member with the longest log (ties: the lowest id) takes the
key with a txn that also checks the in-sync set has not moved, once every other member has
published or ``candidacy_wait_s`` passed. Every SEND_OK message was acknowledged by at
least one replica, every replica's log is a prefix of the master's, so the longest
in-sync log holds every acknowledged message. The winner writes a new in-sync set of
itself alone (the others join as they catch up with it: a replica shorter than the new
master must not be able to replace it) and promotes itself with the key's revision as its
epoch (:meth:`RoleService.promote`). Other replicas raise their epoch to it and follow the
new master's HA address (a stream from an older epoch is then refused).

**Fencing.** A master renews its lease every TTL/3. Writes are accepted only until
TTL/2 after the *sending* of the last renewal etcd confirmed (the store asks
:meth:`Election.write_refusal` on every put: a deadline, so a master frozen by SIGSTOP is
fenced the moment it runs again, before any timer fires). etcd expires the key no sooner
than TTL after it received that renewal, so a fenced master has stopped writing before any
replica can win. A master whose lease is lost steps down for good: it stays fenced (writes
SERVICE_NOT_AVAILABLE) until an operator restarts it as a replica.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from broker.ha.acks import ReplicaSet
from broker.ha.etcd import EtcdClient, EtcdError, KeyValue
from broker.logs import get_logger
from protocol.errors import BrokerError
from protocol.etcd import Compare, Delete, Get, Put, Target

_log = get_logger("ha.election")

#: Why a broker that is not (or no longer) its group's elected master refuses writes.
FENCED_REFUSAL = (
    "the broker is fenced: it does not hold its group's master lease in etcd "
    "(writes go to the elected master)"
)


@dataclass(frozen=True, slots=True)
class ElectionSettings:
    """``--etcd-endpoints`` and ``--etcd-lease-ttl-s``, and the timings derived from them."""

    ttl_s: int = 3
    #: How often a replica reads the master key (takeover = lease expiry + at most this).
    poll_s: float = 0.2
    #: How often a master recomputes its in-sync set (and how far behind a member may be).
    isr_interval_s: float = 0.5
    #: How long the longest in-sync candidate waits for the others to publish their logs.
    candidacy_wait_s: float = 1.0


@dataclass(frozen=True, slots=True)
class MasterRecord:
    """The master key: who holds it, under which epoch (its create revision)."""

    broker_id: int
    address: str
    ha_address: str
    epoch: int
    lease: int

    @classmethod
    def from_kv(cls, kv: KeyValue) -> MasterRecord:
        value = _json(kv.value)
        return cls(
            broker_id=_as_int(value.get("brokerId"), -1),
            address=str(value.get("address", "")),
            ha_address=str(value.get("haAddress", "")),
            epoch=kv.create_revision,
            lease=kv.lease,
        )


@dataclass(frozen=True, slots=True)
class InSyncSet:
    """The in-sync key: members and the master epoch that wrote it."""

    epoch: int
    members: frozenset[int]
    #: The broker id of the master that wrote it (-1: unknown).
    master: int = -1
    #: The key's mod revision (0: no key), for compare-and-set.
    mod_revision: int = 0

    def encode(self) -> bytes:
        return json.dumps(
            {"epoch": self.epoch, "master": self.master, "members": sorted(self.members)}
        ).encode()

    @classmethod
    def from_kv(cls, kv: KeyValue | None) -> InSyncSet | None:
        if kv is None:
            return None
        value = _json(kv.value)
        raw = value.get("members", [])
        members = frozenset(_as_int(m, -1) for m in raw) if isinstance(raw, list) else frozenset()
        master = _as_int(value.get("master"), -1)
        return cls(_as_int(value.get("epoch"), 0), members, master, kv.mod_revision)


def _candidacy(log_end: int) -> bytes:
    return json.dumps({"logEnd": log_end}).encode()


def _as_int(value: object, default: int) -> int:
    """An integer field of our own JSON values (a malformed one reads as ``default``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit() and value.isascii():
        return int(value)
    return default


def _json(data: bytes) -> dict[str, object]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class ElectionStatistics:
    """What tests and logs read."""

    #: The epoch this broker holds mastership under (0: not master).
    master_epoch: int = 0
    #: Whether writes are refused by the fence now.
    fenced: bool = True
    campaigns: int = 0
    wins: int = 0
    step_downs: int = 0
    #: The master this broker follows (None: none known, or it is the master).
    following: MasterRecord | None = None
    last_error: str = ""
    #: Elections seen lost to another member's longer log.
    deferred: int = 0
    members: frozenset[int] = field(default_factory=frozenset)


class Keys:
    """The group's etcd keys."""

    def __init__(self, cluster: str, broker_name: str) -> None:
        self.prefix = f"/trimq/{cluster}/{broker_name}/".encode()
        self.master = self.prefix + b"master"
        self.insync = self.prefix + b"insync"
        self.candidates = self.prefix + b"candidates/"

    def candidate(self, broker_id: int) -> bytes:
        return self.candidates + str(broker_id).encode()


async def read_master(client: EtcdClient, keys: Keys) -> MasterRecord | None:
    """The group's master key as it is now (None: no master holds it).

    Raises:
        EtcdError: etcd could not be asked.
    """
    kv = await client.get(keys.master)
    return None if kv is None else MasterRecord.from_kv(kv)


async def read_insync(client: EtcdClient, keys: Keys) -> InSyncSet | None:
    """The group's in-sync set as it is now (None: the group never had a master).

    Raises:
        EtcdError: etcd could not be asked.
    """
    return InSyncSet.from_kv(await client.get(keys.insync))


#: Follows the given master (a replica's HA link) until cancelled.
FollowMaster = Callable[[MasterRecord], Awaitable[None]]


class Election:
    """One broker's side of its group's election (see the module docstring).

    The broker wires in: ``promote(epoch)`` (a replica that won), ``follow`` (an async
    function that follows the given master until cancelled), ``log_end`` (where the local
    log ends), and reads :meth:`write_refusal` from its store's put path.
    """

    def __init__(
        self,
        client: EtcdClient,
        settings: ElectionSettings,
        *,
        cluster: str,
        broker_name: str,
        broker_id: int,
        address: str,
        replicas: ReplicaSet,
        is_replica: Callable[[], bool],
        log_end: Callable[[], int],
        promote: Callable[[int], object],
        become_master: Callable[[int], None],
        follow: FollowMaster,
        ha_address: Callable[[], str],
    ) -> None:
        self.client = client
        self.settings = settings
        self.keys = Keys(cluster, broker_name)
        self.broker_id = broker_id
        self.address = address
        self.replicas = replicas
        self.is_replica = is_replica
        self.log_end = log_end
        #: A replica that won: ``RoleService.promote(epoch)``.
        self.promote = promote
        #: A broker started as master that won: raise its epoch, serve its HA port.
        self.become_master = become_master
        #: A replica follows the elected master with this (cancelled when it changes).
        self.follow = follow
        self._follow_scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        #: Where this broker serves its HA port ("" while it serves none): put into its
        #: master key (a promoted replica opens its HA port only after the promotion).
        self.ha_address = ha_address
        #: The epoch of the last mastership won (kept after a step-down: registrations
        #: carry it, so name servers refuse a deposed master's).
        self._won_epoch = 0
        self.stats = ElectionStatistics()
        #: Writes are accepted while ``trio.current_time()`` is before this.
        self._valid_until = -math.inf
        self._lease = 0
        self._lease_ttl = settings.ttl_s
        self._stepped_down = False
        self._changed = trio.Event()
        #: The master a replica should follow now (its HA address and epoch), or None.
        self.leader: MasterRecord | None = None
        self._leader_changed = trio.Event()

    # ------------------------------------------------------------------ the broker's view
    def write_refusal(self) -> str | None:
        """Why a put must be refused now (None: accept). Called on every put."""
        if trio.current_time() < self._valid_until:
            return None
        return FENCED_REFUSAL

    def registered_epoch(self) -> int:
        """The epoch a master's name-server registration carries: the last one it won,
        0 if it never won (either is refused once a newer master registered)."""
        return self._won_epoch

    async def wait_until(self, check: Callable[[ElectionStatistics], bool]) -> None:
        """Return once ``check`` holds (callers bound the wait)."""
        while not check(self.stats):
            await self._changed.wait()

    async def wait_leader_change(self, seen: MasterRecord | None) -> MasterRecord | None:
        """The master to follow once it differs from ``seen``."""
        while self.leader == seen:
            await self._leader_changed.wait()
        return self.leader

    def _change(self) -> None:
        self.stats.fenced = self.write_refusal() is not None
        self._changed.set()
        self._changed = trio.Event()

    def _set_leader(self, record: MasterRecord | None) -> None:
        """Follow ``record`` (None: nobody). The old link is cancelled synchronously: its
        task never runs again, so no acknowledgement leaves after this returns."""
        if record == self.leader:
            return
        if self._follow_scope is not None:
            self._follow_scope.cancel()
            self._follow_scope = None
        self.leader = record
        self.stats.following = record
        if record is not None and self.is_replica() and self._nursery is not None:
            scope = self._follow_scope = trio.CancelScope()
            self._nursery.start_soon(self._follow_in, scope, record)
        self._leader_changed.set()
        self._leader_changed = trio.Event()
        self._change()

    async def _follow_in(self, scope: trio.CancelScope, record: MasterRecord) -> None:
        with scope:
            _log.info("following elected master", epoch=record.epoch, master=record.ha_address)
            await self.follow(record)

    # ------------------------------------------------------------------ the loop
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take part in the group's election until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                while not self._stepped_down:  # a step-down ends the loop (see the docstring)
                    try:
                        await self._round()
                    except EtcdError as exc:
                        self.stats.last_error = str(exc)
                        self._lease = 0  # it may have expired meanwhile: a fresh one next time
                        _log.warning("etcd call failed", error=str(exc))
                    await trio.sleep(self.settings.poll_s)
                # Deposed: keep refusing writes, follow nobody, until restarted as a replica.
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await self._revoke()

    async def _round(self) -> None:
        """One look at the master key: follow it, or campaign when it is gone."""
        record = await read_master(self.client, self.keys)
        if record is not None:
            if record.broker_id == self.broker_id:
                # Our own key: this life's (a txn whose reply was lost: taken again once it
                # lapses, since nothing renews it) or an earlier life's, until it lapses.
                return
            if record.ha_address:
                self._set_leader(record)
            return
        # No master: stop following first, so this replica acknowledges nothing more to a
        # master that may still be answering sends, then campaign if in sync.
        self._set_leader(None)
        insync = await read_insync(self.client, self.keys)
        if insync is None:
            if self.broker_id != 0 or self.is_replica():
                return  # a fresh group is started by its broker id 0
        elif self.broker_id not in insync.members:
            return  # not in sync: never an unclean election
        await self._campaign(insync)

    async def _campaign(self, insync: InSyncSet | None) -> None:
        # A fresh lease per campaign: one from an earlier campaign may have expired
        # unrenewed (a candidate renews nothing until it wins).
        granted = await self.client.lease_grant(self.settings.ttl_s)
        lease = self._lease = granted.lease_id
        self._lease_ttl = granted.ttl_s
        self.stats.campaigns += 1
        if insync is not None and not await self._longest(insync, lease):
            return
        value = json.dumps(
            {"brokerId": self.broker_id, "address": self.address, "haAddress": self.ha_address()}
        ).encode()
        mod = insync.mod_revision if insync is not None else 0
        me = frozenset({self.broker_id})
        result = await self.client.txn(
            [
                Compare(self.keys.master, Target.CREATE, 0),
                Compare(self.keys.insync, Target.MOD, mod),
            ],
            [
                Put(self.keys.master, value, lease),
                # The new set is the winner alone: a replica shorter than its log must not
                # replace it (the others join as they catch up).
                Put(self.keys.insync, InSyncSet(0, me, self.broker_id).encode()),
                Delete(self.keys.candidate(self.broker_id)),
            ],
        )
        if not result.succeeded:
            return
        await self._won(result.revision, lease)

    async def _longest(self, insync: InSyncSet, lease: int) -> bool:
        """Publish this broker's log end; whether it is the one to take the key now."""
        mine = self.log_end()
        await self.client.txn(
            [],
            [
                Put(
                    self.keys.candidate(self.broker_id),
                    json.dumps({"logEnd": mine}).encode(),
                    lease,
                )
            ],
        )
        # The old master never campaigns again (a stepped-down master stays out): do not
        # wait for it.
        others = insync.members - {self.broker_id, insync.master}
        deadline = trio.current_time() + self.settings.candidacy_wait_s
        while True:  # bounded by the deadline
            # The whole group's keys: the candidacies, and a master key if one won meanwhile.
            group = await self.client.range(self.keys.prefix, prefix=True)
            ends: dict[int, int] = {}
            for kv in group.kvs:
                if kv.key == self.keys.master:
                    return False  # elected already: follow it next round
                tail = kv.key.removeprefix(self.keys.candidates)
                if tail != kv.key and tail.isdigit() and tail.isascii():
                    ends[int(tail)] = _as_int(_json(kv.value).get("logEnd"), -1)
            best = max(ends.items(), key=lambda item: (item[1], -item[0]), default=None)
            if best is not None and best[0] != self.broker_id and best[1] >= mine:
                self.stats.deferred += 1
                return False  # a longer (or equal, lower-id) log: let it win
            if others <= ends.keys() or trio.current_time() >= deadline:
                return True
            await trio.sleep(self.settings.poll_s)

    async def _won(self, epoch: int, lease: int) -> None:
        # Renew at once so that the fence starts from a known point: the key lives at least
        # TTL after etcd took this renewal, which was after ``sent``.
        sent = trio.current_time()
        ttl = await self.client.lease_keepalive(lease, timeout_s=self._lease_ttl / 2)
        if ttl <= 0:
            return  # the lease expired under us: the key went with it
        self._set_leader(None)
        try:
            if self.is_replica():
                self.promote(epoch)
            else:
                self.become_master(epoch)
        except (BrokerError, OSError, ValueError) as exc:
            # Cannot serve as master (the epoch could not be stored): give the key back at
            # once so that another member takes it, and stay out.
            _log.error("elected, but cannot become master", epoch=epoch, error=str(exc))
            self._stepped_down = True
            await self._revoke()
            return
        self._valid_until = sent + self._lease_ttl / 2
        self._won_epoch = self.stats.master_epoch = epoch
        self.stats.wins += 1
        _log.warning("elected master", epoch=epoch, broker_id=self.broker_id)
        self._change()
        await self._hold(epoch, lease)

    # ------------------------------------------------------------------ holding the key
    async def _hold(self, epoch: int, lease: int) -> None:
        """Renew the lease and keep the in-sync set until the lease is lost; then stay
        fenced for good (a stop of the broker cancels this and revokes the lease)."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._keep_insync, epoch, nursery.cancel_scope)
                nursery.start_soon(self._publish_ha_address, epoch, lease)
                nursery.start_soon(self._watch_fence)
                await self._renew(lease)
                nursery.cancel_scope.cancel()
        finally:
            self._valid_until = -math.inf
            self.stats.master_epoch = 0
            self._stepped_down = True
            self._change()
        self.stats.step_downs += 1
        _log.error(
            "lost the master lease: fenced, writes refused (restart as a replica)", epoch=epoch
        )
        await self._revoke()  # if it still exists (the set moved under us): give it up

    async def _watch_fence(self) -> None:
        """Keep :attr:`ElectionStatistics.fenced` true to the deadline (waiters see the
        fence close when it does, not at the next event)."""
        while True:  # ends with the holding nursery
            until = self._valid_until
            await trio.sleep_until(until)
            if self._valid_until == until:
                self._change()  # closed: wait for a renewal to move the deadline
                while self._valid_until == until:  # bounded: ends with the nursery
                    await self._changed.wait()

    async def _renew(self, lease: int) -> None:
        """Renew every TTL/3 until the lease is lost. A renewal confirmed by etcd opens the
        fence until TTL/2 after it was sent; a failed one leaves the fence to close by
        itself. The lease is given up once etcd says it is gone, or when nothing renewed it
        for a whole TTL (it has expired at etcd by then)."""
        renewed = trio.current_time()
        while True:  # ends when the lease is lost
            await trio.sleep(self._lease_ttl / 3)
            sent = trio.current_time()
            try:
                ttl = await self.client.lease_keepalive(lease, timeout_s=self._lease_ttl / 3)
            except EtcdError as exc:
                self.stats.last_error = str(exc)
                _log.warning("lease renewal failed", error=str(exc), fenced=self.fenced)
                if trio.current_time() - renewed >= self._lease_ttl:
                    return
                continue
            if ttl <= 0:
                return
            # The lease exists, so the key it holds is still ours (nobody else deletes it).
            renewed = sent
            self._valid_until = sent + self._lease_ttl / 2
            self._change()

    @property
    def fenced(self) -> bool:
        """Whether writes are refused now."""
        return self.write_refusal() is not None

    async def _keep_insync(self, epoch: int, holding: trio.CancelScope) -> None:
        """Write the in-sync set whenever it changes (compare-and-set while master); a
        set changed by someone else means this broker is no longer master: step down."""
        members = frozenset({self.broker_id})
        mod = -1  # unknown: read first
        last_end = self.log_end()
        written: frozenset[int] | None = None
        while True:  # ends with the holding nursery
            try:
                if mod < 0:
                    current = await read_insync(self.client, self.keys)
                    mod = current.mod_revision if current is not None else 0
                    if current is not None and current.epoch == epoch:
                        written = current.members  # ours (a reply that was lost)
                if members != written:
                    new = InSyncSet(epoch, members, self.broker_id)
                    result = await self.client.txn(
                        [
                            Compare(self.keys.master, Target.CREATE, epoch),
                            Compare(self.keys.insync, Target.MOD, mod),
                        ],
                        [Put(self.keys.insync, new.encode())],
                        [Get(self.keys.master)],
                    )
                    if not result.succeeded:
                        kvs = result.ranges[0].kvs if result.ranges else ()
                        if not kvs or kvs[0].create_revision != epoch:
                            _log.error("the master key is not ours any more: stepping down")
                            holding.cancel()
                            return
                        mod = -1  # the set moved (our own write whose reply was lost?)
                        continue
                    mod, written = result.revision, members
                    self.stats.members = members
                    self._change()
                    _log.info("in-sync set", epoch=epoch, members=sorted(members))
            except EtcdError as exc:
                self.stats.last_error = str(exc)
                mod = -1
            await trio.sleep(self.settings.isr_interval_s)
            end = self.log_end()
            replicas = self.replicas.statistics().replicas
            acked = {r.broker_id for r in replicas if r.acked >= last_end}
            members = frozenset({self.broker_id} | acked)
            last_end = end

    async def _publish_ha_address(self, epoch: int, lease: int) -> None:
        """Put the HA address into the master key once it is known (a promoted replica
        opens its HA port only after the promotion)."""
        published = b""  # unknown: written once at least
        while True:  # ends with the holding nursery
            value = json.dumps(
                {
                    "brokerId": self.broker_id,
                    "address": self.address,
                    "haAddress": self.ha_address(),
                }
            ).encode()
            if value != published:
                try:
                    result = await self.client.txn(
                        [Compare(self.keys.master, Target.CREATE, epoch)],
                        [Put(self.keys.master, value, lease)],
                    )
                except EtcdError as exc:
                    self.stats.last_error = str(exc)
                else:
                    if result.succeeded:
                        published = value
            await trio.sleep(self.settings.poll_s)

    async def _revoke(self) -> None:
        """A broker that stops gives its lease back: its key goes at once, so a replica
        need not wait for the TTL (a crash still waits for it)."""
        if self._lease:
            self._valid_until = -math.inf
            try:
                await self.client.lease_revoke(self._lease, timeout_s=1.0)
            except EtcdError as exc:
                _log.warning("lease revoke failed", error=str(exc))
            self._lease = 0
