"""The core every producer and consumer runs on: connections, routes, heartbeats.

:class:`ClientInstance` plays the part of RocketMQ's ``MQClientInstance``: it asks name
servers for topic routes (sticking to the one that answered last, moving on when it fails, so
a partition of the name servers heals by itself — seed 002), refreshes the routes in use every
``route_refresh_interval``, sends heartbeats with the groups it runs to every broker of those
routes, and unregisters those groups on exit. It runs in a task group its owner opens with
:func:`open_instance`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.abc
import structlog

from client.config import ClientConfig
from client.errors import ClientError, NoRouteError
from client.remoting import RemotingClient
from protocol.bodies.admin import ResetOffsetBody
from protocol.bodies.consumer import MessageQueue
from protocol.bodies.heartbeat import ConsumerData, HeartbeatData, ProducerData
from protocol.bodies.route import BrokerData, TopicRouteData, is_readable, is_writeable
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand, request
from protocol.errors import BrokerError, ProtocolError, for_code
from protocol.headers.admin import ResetOffsetRequestHeader
from protocol.headers.client import (
    NotifyConsumerIdsChangedRequestHeader,
    UnregisterClientRequestHeader,
)
from protocol.headers.route import GetRouteInfoRequestHeader

_log = structlog.get_logger("trimq.client")

#: Called with the group named in a broker's NOTIFY_CONSUMER_IDS_CHANGED.
RebalanceHook = Callable[[str], None]
#: Called with (group, topic, queue → offset) of a broker's RESET_CONSUMER_CLIENT_OFFSET.
ResetHook = Callable[[str, str, dict[MessageQueue, int]], None]
#: ``hook(request, broker address)``: a broker asks a producer about a half message.
CheckHook = Callable[[RemotingCommand, str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """A topic's route with the queues a producer writes and a consumer reads."""

    topic: str
    data: TopicRouteData
    #: Writable queues on brokers with a master address, ordered by broker then queue id.
    write_queues: tuple[MessageQueue, ...]
    #: Readable queues, same order.
    read_queues: tuple[MessageQueue, ...]

    @classmethod
    def build(cls, topic: str, data: TopicRouteData) -> TopicRoute:
        """Derive the queue lists from the name server's answer."""
        masters = {b.broker_name for b in data.broker_datas if b.master_addr}
        writes: list[MessageQueue] = []
        reads: list[MessageQueue] = []
        for q in sorted(data.queue_datas, key=lambda q: q.broker_name):
            if q.broker_name not in masters:
                continue
            if is_writeable(q.perm):
                writes += (MessageQueue(topic, q.broker_name, i) for i in range(q.write_queue_nums))
            if is_readable(q.perm):
                reads += (MessageQueue(topic, q.broker_name, i) for i in range(q.read_queue_nums))
        return cls(topic, data, tuple(writes), tuple(reads))


def check(reply: RemotingCommand) -> RemotingCommand:
    """Return ``reply`` if it is SUCCESS, else raise the matching :class:`BrokerError`."""
    if reply.code != ResponseCode.SUCCESS:
        raise for_code(reply.code, reply.remark)
    return reply


class ClientInstance:
    """Connections, routes and heartbeats for one producer or consumer (see module doc)."""

    def __init__(self, task_group: anyio.abc.TaskGroup, config: ClientConfig) -> None:
        self.config = config
        self.client_id = config.client_id
        self.remoting = RemotingClient(task_group, config, on_request=self._on_request)
        self._routes: dict[str, TopicRoute] = {}
        self._brokers: dict[str, BrokerData] = {}
        self._namesrv_index = 0
        self.producer_groups: set[str] = set()
        #: Supplies the consumer groups to announce in heartbeats.
        self.consumer_data: Callable[[], Iterable[ConsumerData]] = tuple
        self.on_rebalance: RebalanceHook | None = None
        self.on_reset_offset: ResetHook | None = None
        #: Answers a broker's CHECK_TRANSACTION_STATE (a producer with a checker), given
        #: the request and the broker's address.
        self.on_check_transaction: CheckHook | None = None

    # ------------------------------------------------------------------ requests
    def request(
        self, code: int, ext: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        """Build a request in this client's header encoding."""
        return request(code, 0, ext, body, serialize_type=self.config.serialize_type)

    async def call(
        self,
        address: str,
        cmd: RemotingCommand,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> RemotingCommand:
        """Send ``cmd`` and return a SUCCESS reply, raising for any other code."""
        return check(await self.remoting.invoke(address, cmd, timeout))

    # ------------------------------------------------------------------ routes
    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        """The route of ``topic``: cached, or fetched from the name servers.

        Raises:
            NoRouteError: no name server knows the topic, or none answered.
        """
        cached = self._routes.get(topic)
        if cached is not None and not refresh:
            return cached
        return self.adopt_route(topic, await self._fetch_route(topic))

    def adopt_route(self, topic: str, data: TopicRouteData) -> TopicRoute:
        """Cache a route fetched elsewhere (the admin CLI asks name servers itself), so its
        brokers' addresses are known to requests that name a broker."""
        route = TopicRoute.build(topic, data)
        self._routes[topic] = route
        for broker in data.broker_datas:
            self._brokers[broker.broker_name] = broker
        return route

    async def prefetch_routes(self, topics: Iterable[str]) -> None:
        """Fetch the routes of ``topics`` now; a topic without one yet is only logged, since
        it may be created later (consumers look for it again as they run)."""
        for topic in topics:
            try:
                await self.route(topic)
            except NoRouteError as exc:
                _log.warning("no route yet", topic=topic, error=str(exc))

    def cached_route(self, topic: str) -> TopicRoute | None:
        """The last route fetched for ``topic``, without asking anyone."""
        return self._routes.get(topic)

    def forget_route(self, topic: str) -> None:
        """Stop refreshing ``topic``."""
        self._routes.pop(topic, None)

    async def _fetch_route(self, topic: str) -> TopicRouteData:
        servers = self.config.namesrv_addresses
        cmd = self.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, GetRouteInfoRequestHeader(topic=topic).to_ext()
        )
        errors: list[str] = []
        for i in range(len(servers)):
            index = (self._namesrv_index + i) % len(servers)
            address = servers[index]
            try:
                reply = await self.remoting.invoke(address, cmd)
            except ClientError as exc:
                errors.append(f"{address}: {exc}")
                continue
            if reply.code == ResponseCode.TOPIC_NOT_EXIST:
                self._namesrv_index = index
                raise NoRouteError(f"no route for topic {topic!r} ({address}: {reply.remark})")
            try:
                data = TopicRouteData.from_json(check(reply).body)
            except (BrokerError, ProtocolError) as exc:
                errors.append(f"{address}: {exc}")
                continue
            self._namesrv_index = index
            return data
        raise NoRouteError(f"no name server answered for topic {topic!r}: {'; '.join(errors)}")

    def broker_address(self, broker_name: str) -> str | None:
        """The master address of ``broker_name`` from the routes seen so far."""
        broker = self._brokers.get(broker_name)
        return None if broker is None else broker.master_addr

    def broker_addresses(self) -> dict[str, str]:
        """Every known broker name → master address."""
        return {n: b.master_addr for n, b in self._brokers.items() if b.master_addr}

    # ------------------------------------------------------------------ background
    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Refresh routes and send heartbeats until cancelled."""
        task_status.started()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._every, self.config.route_refresh_interval, self.refresh_routes)
            tg.start_soon(self._every, self.config.heartbeat_interval, self.heartbeat)

    @staticmethod
    async def _every(interval: float, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await anyio.sleep(interval)
            await job()

    async def refresh_routes(self) -> None:
        """Fetch every route in use again; a failure keeps the old route."""
        for topic in list(self._routes):
            try:
                await self.route(topic, refresh=True)
            except ClientError as exc:
                _log.warning("route refresh failed", topic=topic, error=str(exc))

    async def heartbeat(self) -> None:
        """Tell every known broker which groups this client runs (concurrently)."""
        data = HeartbeatData(
            client_id=self.client_id,
            producer_data_set=tuple(ProducerData(g) for g in sorted(self.producer_groups)),
            consumer_data_set=tuple(self.consumer_data()),
        )
        await self._tell_every_broker(
            "heartbeat", self.request(RequestCode.HEART_BEAT, body=data.to_json())
        )

    async def unregister(
        self, *, producer_group: str | None = None, consumer_group: str | None = None
    ) -> None:
        """Leave a group on every known broker: best effort, shielded from the caller's
        cancellation (a client leaving because it was cancelled still says so) and bounded
        by the request timeout."""
        header = UnregisterClientRequestHeader(
            client_id=self.client_id, producer_group=producer_group, consumer_group=consumer_group
        )
        cmd = self.request(RequestCode.UNREGISTER_CLIENT, header.to_ext())
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.request_timeout):
            await self._tell_every_broker("unregister", cmd)

    async def _tell_every_broker(self, what: str, cmd: RemotingCommand) -> None:
        """Send ``cmd`` to every known broker at once; a failure is logged, not raised."""

        async def one(address: str) -> None:
            try:
                await self.call(address, cmd)
            except (ClientError, BrokerError) as exc:
                _log.info(f"{what} failed", broker=address, error=str(exc))

        async with anyio.create_task_group() as tg:
            for address in set(self.broker_addresses().values()):
                tg.start_soon(one, address)

    async def _on_request(self, cmd: RemotingCommand, address: str) -> RemotingCommand | None:
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            try:
                group = NotifyConsumerIdsChangedRequestHeader.from_ext(
                    cmd.ext_fields
                ).consumer_group
            except ProtocolError:
                return None
            if self.on_rebalance is not None:
                self.on_rebalance(group)
            return None
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET:
            return self._on_reset(cmd)
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE and self.on_check_transaction:
            await self.on_check_transaction(cmd, address)
            return None
        return cmd.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"client does not serve code {cmd.code}"
        )

    def _on_reset(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """``mqadmin resetOffsetByTime`` moved a group's offsets: a pull consumer must move its
        in-memory position too, or its next commit would undo the reset."""
        try:
            header = ResetOffsetRequestHeader.from_ext(cmd.ext_fields)
            table = dict(ResetOffsetBody.from_json(cmd.body).offset_table)
        except ProtocolError as exc:
            _log.warning("bad reset-offset request", error=str(exc))
            return None if cmd.is_oneway else cmd.response(exc.code, exc.message)
        if self.on_reset_offset is not None:
            self.on_reset_offset(header.group, header.topic, table)
        return None if cmd.is_oneway else cmd.response()


@asynccontextmanager
async def open_instance(
    config: ClientConfig,
) -> AsyncIterator[tuple[ClientInstance, anyio.abc.TaskGroup]]:
    """Run a :class:`ClientInstance` (its connections and background jobs) for the block.

    Yields the instance and the task group its owner may start more tasks in; on exit every
    task is cancelled and every connection closed.
    """
    async with anyio.create_task_group() as tg:
        instance = ClientInstance(tg, config)
        await tg.start(instance.run)
        try:
            yield instance, tg
        finally:
            tg.cancel_scope.cancel()
            await instance.remoting.aclose()
