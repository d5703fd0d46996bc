"""Registration with the name servers (RocketMQ's ``registerBrokerAll``).

With ``namesrv_addr`` set, the broker registers its topics and queues with every name
server: once at start, then every ``register_interval_s`` (30 s), and promptly whenever a
topic is created, updated or deleted (:meth:`Registrar.poke`, called by the topic manager).
Each registration carries the topic table's data version, so a name server only re-reads
the topics when they changed.

Theory of operation: every name server has a registration loop of its own; each
registration uses a fresh connection under its own ``register_timeout_s`` cancel scope, so an
unreachable or silent name server costs only its own loop a timeout and never delays the
others; a failure is logged and retried at that loop's next round. Name servers never talk
to each other: the broker is what keeps them consistent, within one register interval once
they are reachable again.

With ``acl_access_key``/``acl_secret_key`` set, every request to a name server is signed
(RocketMQ ACL 1.0, as the broker's ``innerClientAuthenticationCredentials``), so a name
server with ``--acl-file`` accepts the registration.

A broker with a gRPC front end also puts its gRPC endpoint into each name server's KV config
(namespace :data:`GRPC_ENDPOINTS`, key: its Remoting address) after every registration, so any
broker can answer a gRPC route with the other brokers' endpoints (:class:`NamesrvRoutes`).

On a graceful stop (:meth:`Registrar.stop`) the loops finish the registrations under way
(briefly; a silent name server's is cancelled), then the broker unregisters from every name
server (concurrently, bounded), so it leaves the routes at once instead of after the name
servers' expiry time. A stop takes at most about 2 x ``STOP_GRACE_S``.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

import trio

from broker.config import BrokerConfig
from broker.grpc.cluster import PeerQueues
from broker.logs import get_logger
from broker.tls import client_context
from broker.topics import TopicManager
from protocol.acl import sign
from protocol.bodies.admin import KVTable
from protocol.bodies.broker import RegisterBrokerBody, TopicConfigSerializeWrapper
from protocol.bodies.namesrv import body_crc32, encode_register_body
from protocol.bodies.route import TopicRouteData
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.connection import NEED_DATA, Closed, Malformed, RemotingConnection, Response, Role
from protocol.errors import ProtocolError
from protocol.headers.route import (
    DeleteKVConfigRequestHeader,
    GetKVListByNamespaceRequestHeader,
    PutKVConfigRequestHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)

_log = get_logger("registration")
#: The name servers' KV namespace of the brokers' gRPC endpoints: Remoting address →
#: ``host:port`` of its gRPC front end.
GRPC_ENDPOINTS = "TRIMQ_GRPC_ENDPOINTS"
#: Bound on each phase of a graceful stop (finishing registrations; unregistering).
STOP_GRACE_S = 1.5
#: Largest reply accepted from a name server (a KV table at most).
_MAX_REPLY = 16 * 1024 * 1024


class NamesrvCallError(Exception):
    """A name server could not be asked, or did not answer properly."""


async def call_namesrv(
    addr: str, cmd: RemotingCommand, tls: ssl.SSLContext | None = None
) -> RemotingCommand:
    """Send ``cmd`` to ``addr`` on a new connection (TLS with ``tls``) and return the reply
    (callers bound the wait with a cancel scope). The connection carries this one request,
    so its opaque is the connection's first.

    Raises:
        NamesrvCallError: connecting, writing or reading failed, or the reply is malformed.
    """
    host, _, port = addr.rpartition(":")
    stream: trio.abc.Stream
    try:
        stream = await _connect(host, int(port), tls)
    except (OSError, trio.BrokenResourceError) as exc:
        raise NamesrvCallError(f"cannot connect: {exc}") from None
    protocol = RemotingConnection(Role.CLIENT, max_frame_size=_MAX_REPLY)
    _, data = protocol.send_request(cmd)
    async with stream:
        try:
            await stream.send_all(data)
            while True:  # bounded by the caller's cancel scope
                protocol.receive_data(await stream.receive_some(65536))
                reply = _reply_in(protocol)
                if reply is not None:
                    return reply
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise NamesrvCallError(f"connection failed: {exc}") from None
        except ProtocolError as exc:
            raise NamesrvCallError(f"malformed reply: {exc}") from None


async def _connect(host: str, port: int, tls: ssl.SSLContext | None) -> trio.abc.Stream:
    if tls is None:
        return await trio.open_tcp_stream(host, port)
    stream = await trio.open_ssl_over_tcp_stream(host, port, ssl_context=tls)
    try:
        await stream.do_handshake()  # here, so that a refused handshake is a connect error
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream


def _reply_in(protocol: RemotingConnection) -> RemotingCommand | None:
    """The reply, if it has arrived (a name server sends us nothing else we use).

    Raises:
        NamesrvCallError: the connection closed first, or the reply cannot be read.
    """
    while (event := protocol.next_event()) is not NEED_DATA:  # bounded by the bytes read
        if isinstance(event, Response):
            return event.command
        if isinstance(event, Closed):
            raise NamesrvCallError("connection closed before the reply")
        if isinstance(event, Malformed):
            raise NamesrvCallError(f"malformed reply: {event.error}")
    return None


class Registrar:
    """Keeps this broker registered with every name server (see the module docstring)."""

    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicManager,
        address: str,
        *,
        grpc_endpoint: str | None = None,
        ha_address: str | None = None,
    ) -> None:
        self.config = config
        #: The id registered under (0 once a replica is promoted: :meth:`promoted`).
        self.broker_id = config.broker_id
        #: ``host:port`` of a master's HA port, put into its registration's
        #: ``haServerAddr`` (the name servers hand it to the group's replicas).
        self.ha_address = ha_address
        #: A replica: its master's HA address, from the name servers' replies.
        self.master_ha_address: str | None = None
        self._master_known = trio.Event()
        self.topics = topics
        self.address = address
        #: ``host:port`` of this broker's gRPC front end, None when it has none.
        self.grpc_endpoint = grpc_endpoint
        self.namesrv_addrs = config.namesrv_addrs()
        #: Name servers whose last registration failed (for logging state changes only).
        self.failing: set[str] = set()
        #: Successful registrations per name server (tests and logs read it).
        self.registered: dict[str, int] = dict.fromkeys(self.namesrv_addrs, 0)
        self._pokes = {addr: trio.Event() for addr in self.namesrv_addrs}
        self._stopping = False
        self._stopped = trio.Event()
        self._loops = trio.CancelScope()
        self._tls = client_context(config.namesrv_tls_ca) if config.namesrv_tls else None
        #: With automatic failover (docs/ha.md): the epoch a master's registration carries
        #: (``trimqMasterEpoch``), so that name servers drop a stale master when a newer one
        #: registers and refuse the stale one's registrations. None: no epoch sent.
        self.master_epoch: Callable[[], int] | None = None

    def promoted(self, ha_address: str | None) -> None:
        """This replica became its group's master: register as brokerId 0 now, with its
        HA address (the name servers then drop its replica entry: one address, one id)."""
        self.broker_id = 0
        self.ha_address = ha_address
        self.poke()

    def poke(self) -> None:
        """Register again now with every name server (a topic changed)."""
        for event in self._pokes.values():
            event.set()

    async def run(self) -> None:
        """Keep registering with every name server until :meth:`stop`: one loop per name
        server, so a slow or unreachable one never holds up another."""
        try:
            with self._loops:
                async with trio.open_nursery() as nursery:
                    for addr in self.namesrv_addrs:
                        nursery.start_soon(self._loop, addr)
        finally:
            self._stopped.set()

    async def _loop(self, addr: str) -> None:
        while not self._stopping:
            self._pokes[addr] = poked = trio.Event()
            await self._register_one(addr, self._register_request())
            with trio.move_on_after(self.config.register_interval_s):
                await poked.wait()

    async def stop(self) -> None:
        """Stop registering, then unregister everywhere; at most about 2 x ``STOP_GRACE_S``.

        Registrations under way get ``STOP_GRACE_S`` to finish (one still in flight could
        otherwise reach a name server after the unregistration and put the broker back);
        those that do not (a silent name server) are cancelled. A stop must stay well inside
        a supervisor's grace period (docker: 10 s), whatever the name servers do."""
        self._stopping = True
        self.poke()
        with trio.move_on_after(STOP_GRACE_S):
            await self._stopped.wait()
        self._loops.cancel()
        with trio.move_on_after(STOP_GRACE_S):  # bounded even if run() never started
            await self._stopped.wait()
        async with trio.open_nursery() as nursery:
            for addr in self.namesrv_addrs:
                nursery.start_soon(self._unregister_one, addr)

    # ------------------------------------------------------------------ requests
    def _register_request(self) -> RemotingCommand:
        wrapper = TopicConfigSerializeWrapper(self.topics.all(), self.topics.data_version)
        body = encode_register_body(RegisterBrokerBody(wrapper), compressed=False)
        header = RegisterBrokerRequestHeader(
            broker_name=self.config.broker_name,
            broker_addr=self.address,
            cluster_name=self.config.cluster,
            ha_server_addr=self.ha_address or self.address,
            broker_id=self.broker_id,
            compressed=False,
            body_crc32=body_crc32(body),
            trimq_master_epoch=(
                self.master_epoch()
                if self.master_epoch is not None and self.broker_id == 0
                else None
            ),
        )
        return request(RequestCode.REGISTER_BROKER, 0, header.to_ext(), body)

    async def _ask(
        self, addr: str, cmd: RemotingCommand, what: str, bound_s: float
    ) -> RemotingCommand | None:
        """``cmd``'s reply, bounded by ``bound_s``; None on failure."""
        access_key, secret_key = self.config.acl_access_key, self.config.acl_secret_key
        if access_key is not None and secret_key is not None:
            cmd = sign(cmd, access_key, secret_key)
        with trio.move_on_after(bound_s):
            try:
                reply = await call_namesrv(addr, cmd, self._tls)
            except NamesrvCallError as exc:
                self._failed(addr, what, str(exc))
                return None
            if reply.code != ResponseCode.SUCCESS:
                self._failed(addr, what, f"code {reply.code}: {reply.remark}")
                return None
            return reply
        self._failed(addr, what, f"no reply within {bound_s} s")
        return None

    async def master_ha_addr(self) -> str:
        """A replica's master HA address: as soon as a name server has named it."""
        await self._master_known.wait()
        assert self.master_ha_address is not None
        return self.master_ha_address

    def _learn_master(self, reply: RemotingCommand) -> None:
        """A replica's registration is answered with its master's addresses (none while
        the group has no master registered)."""
        answer = RegisterBrokerResponseHeader.from_ext(reply.ext_fields)
        if self.broker_id == 0 or not answer.ha_server_addr:
            return
        if answer.ha_server_addr != self.master_ha_address:
            _log.info("master HA address", address=answer.ha_server_addr)
        self.master_ha_address = answer.ha_server_addr
        self._master_known.set()

    async def _register_one(self, addr: str, cmd: RemotingCommand) -> None:
        reply = await self._ask(addr, cmd, "register", self.config.register_timeout_s)
        if reply is None:
            return
        self._learn_master(reply)
        if addr in self.failing or self.registered[addr] == 0:
            _log.info("registered with namesrv", namesrv=addr, broker=self.config.broker_name,
                      topics=len(self.topics.all()))  # fmt: skip
        self.failing.discard(addr)
        self.registered[addr] += 1
        if self.grpc_endpoint is not None:  # after the count: the routes are there already
            header = PutKVConfigRequestHeader(
                namespace=GRPC_ENDPOINTS, key=self.address, value=self.grpc_endpoint
            )
            put = request(RequestCode.PUT_KV_CONFIG, 0, header.to_ext())
            await self._ask(addr, put, "gRPC endpoint", self.config.register_timeout_s)

    async def _unregister_one(self, addr: str) -> None:
        header = UnRegisterBrokerRequestHeader(
            broker_name=self.config.broker_name,
            broker_addr=self.address,
            cluster_name=self.config.cluster,
            broker_id=self.broker_id,
        )
        cmd = request(RequestCode.UNREGISTER_BROKER, 0, header.to_ext())
        timeout = min(self.config.register_timeout_s, STOP_GRACE_S)
        if await self._ask(addr, cmd, "unregister", timeout) is not None:
            _log.info("unregistered from namesrv", namesrv=addr, broker=self.config.broker_name)
        if self.grpc_endpoint is not None:
            forget = DeleteKVConfigRequestHeader(namespace=GRPC_ENDPOINTS, key=self.address)
            delete = request(RequestCode.DELETE_KV_CONFIG, 0, forget.to_ext())
            await self._ask(addr, delete, "forget gRPC endpoint", timeout)

    def _failed(self, addr: str, what: str, error: str) -> None:
        self.failing.add(addr)
        _log.warning(f"{what} with namesrv failed", namesrv=addr, error=error,
                     retry_in_s=self.config.register_interval_s)  # fmt: skip


class NamesrvRoutes:
    """A :class:`~broker.grpc.cluster.ClusterRoutes` over the name servers: a topic's route
    (GET_ROUTEINFO_BY_TOPIC) joined with the brokers' gRPC endpoints (their KV namespace
    :data:`GRPC_ENDPOINTS`), asked of the name servers in order and kept ``ttl_s`` seconds (the
    clients themselves refresh routes every 30 s). A broker that registered no gRPC endpoint
    is left out; so is one without a master address."""

    def __init__(
        self,
        namesrv_addrs: list[str],
        *,
        timeout_s: float,
        ttl_s: float = 5.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.namesrv_addrs = namesrv_addrs
        self.tls = tls
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self._routes: dict[str, tuple[float, list[PeerQueues] | None]] = {}

    async def __call__(self, topic: str) -> list[PeerQueues] | None:
        now = trio.current_time()
        cached = self._routes.get(topic)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        found = await self._lookup(topic)
        if len(self._routes) >= _MAX_CACHED_ROUTES:
            self._routes.clear()
        self._routes[topic] = (now, found)
        return found

    async def _lookup(self, topic: str) -> list[PeerQueues] | None:
        route_cmd = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 0, {"topic": topic})
        kv = GetKVListByNamespaceRequestHeader(namespace=GRPC_ENDPOINTS)
        kv_cmd = request(RequestCode.GET_KVLIST_BY_NAMESPACE, 0, kv.to_ext())
        for addr in self.namesrv_addrs:
            with trio.move_on_after(self.timeout_s):
                try:
                    route_reply = await call_namesrv(addr, route_cmd, self.tls)
                    if route_reply.code == ResponseCode.TOPIC_NOT_EXIST:
                        return None
                    kv_reply = await call_namesrv(addr, kv_cmd, self.tls)
                except NamesrvCallError as exc:
                    _log.info("route lookup failed", namesrv=addr, topic=topic, error=str(exc))
                    continue
                if route_reply.code != ResponseCode.SUCCESS:
                    continue
                try:
                    route = TopicRouteData.from_json(route_reply.body)
                    endpoints = (
                        dict(KVTable.from_json(kv_reply.body).table)
                        if kv_reply.code == ResponseCode.SUCCESS
                        else {}
                    )
                except ProtocolError as exc:
                    _log.warning("bad route from namesrv", namesrv=addr, error=str(exc))
                    continue
                return _peer_queues(route, endpoints)
        return None


#: Topics whose cluster route is kept at most (then the cache starts over).
_MAX_CACHED_ROUTES = 10_000


def _peer_queues(route: TopicRouteData, endpoints: dict[str, str]) -> list[PeerQueues]:
    masters = {b.broker_name: b.master_addr for b in route.broker_datas}
    out: list[PeerQueues] = []
    for queues in sorted(route.queue_datas, key=lambda q: q.broker_name):
        master = masters.get(queues.broker_name)
        endpoint = endpoints.get(master) if master else None
        if endpoint is None:
            continue
        host, _, port = endpoint.rpartition(":")
        if not (port.isdigit() and port.isascii()):
            continue
        peer = PeerQueues(
            queues.broker_name, host, int(port), queues.perm,
            queues.read_queue_nums, queues.write_queue_nums,
        )  # fmt: skip
        out.append(peer)
    return out
