"""One admin session: requests to name servers and brokers, with failures as one-line errors.

Every command runs inside :func:`open_admin`, which opens a client instance (connections only;
the admin registers no group, so its heartbeats are empty). Name-server requests go to each
configured name server in turn, as ``MQClientAPIImpl`` does; a lone trimq broker answers them
itself, so its address works as the name server. Expected failures (an address that refuses
connections, a topic nobody knows, a broker answering an error code) become
:class:`AdminError`, whose message the CLI prints as is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from client.config import ClientConfig
from client.errors import ClientError, ConnectError, RequestTimeoutError
from client.instance import ClientInstance, open_instance
from protocol.bodies.route import ClusterInfo, TopicList, TopicRouteData
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError, ProtocolError, for_code
from protocol.headers.route import GetRouteInfoRequestHeader


class AdminError(Exception):
    """An expected failure of a command; its message is the one line the user sees."""


@dataclass(frozen=True, slots=True)
class BrokerRef:
    """One master broker: its cluster, name and address."""

    cluster: str
    name: str
    address: str


def describe(exc: Exception, address: str, what: str) -> AdminError:
    """The one-line message for a client-side failure talking to ``address``."""
    if isinstance(exc, ConnectError):
        return AdminError(f"cannot connect to {what} {address}")
    if isinstance(exc, RequestTimeoutError):
        return AdminError(f"{what} {address} did not answer in time")
    return AdminError(f"{what} {address}: {exc}")


class Admin:
    """Typed admin requests over one :class:`ClientInstance`."""

    def __init__(self, instance: ClientInstance) -> None:
        self.instance = instance
        self.config = instance.config

    def request(
        self, code: int, ext: dict[str, str] | None = None, body: bytes = b""
    ) -> RemotingCommand:
        """A request in the session's header encoding."""
        return self.instance.request(code, ext, body)

    async def invoke(self, address: str, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` to a broker and return its reply, whatever its code.

        Raises:
            AdminError: the broker could not be reached or did not answer in time.
        """
        try:
            return await self.instance.remoting.invoke(address, cmd)
        except ClientError as exc:
            raise describe(exc, address, "broker") from None

    async def broker(self, address: str, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` to a broker; a reply other than SUCCESS raises its error.

        Raises:
            AdminError: unreachable broker.
            BrokerError: the broker answered an error code.
        """
        reply = await self.invoke(address, cmd)
        if reply.code != ResponseCode.SUCCESS:
            raise for_code(reply.code, reply.remark)
        return reply

    async def namesrv(self, cmd: RemotingCommand) -> RemotingCommand:
        """Send ``cmd`` to the first name server that answers and return the reply.

        Raises:
            AdminError: no name server could be reached.
        """
        failures: list[str] = []
        for address in self.config.namesrv_addresses:
            try:
                return await self.instance.remoting.invoke(address, cmd)
            except ClientError as exc:
                failures.append(str(describe(exc, address, "name server")))
        raise AdminError("; ".join(failures))

    async def cluster_info(self) -> ClusterInfo:
        """The name server's view of every broker."""
        reply = await self.namesrv(self.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        return ClusterInfo.from_json(_checked(reply).body)

    async def brokers(self, cluster: str | None = None) -> list[BrokerRef]:
        """The master brokers, of one cluster or all, ordered by cluster and name.

        Raises:
            AdminError: the cluster is unknown.
        """
        info = await self.cluster_info()
        if cluster is not None and cluster not in info.cluster_addr_table:
            raise AdminError(f"cluster {cluster!r} does not exist")
        refs = [
            BrokerRef(data.cluster, name, data.master_addr)
            for name, data in info.broker_addr_table.items()
            if data.master_addr and (cluster is None or data.cluster == cluster)
        ]
        return sorted(refs, key=lambda r: (r.cluster, r.name))

    async def route(self, topic: str) -> TopicRouteData:
        """The route of ``topic`` from the name servers.

        Raises:
            AdminError: the topic does not exist.
        """
        ext = GetRouteInfoRequestHeader(topic=topic).to_ext()
        reply = await self.namesrv(self.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext))
        # A broker asked directly answers a topic that a send would create with the route it
        # will have (producers need that); the admin tells what exists.
        if reply.code == ResponseCode.TOPIC_NOT_EXIST or topic not in await self.topic_names():
            raise AdminError(f"topic {topic!r} does not exist")
        return TopicRouteData.from_json(_checked(reply).body)

    async def topic_names(self) -> list[str]:
        """Every topic the name servers know, sorted.

        Raises:
            AdminError: the name server refused.
        """
        reply = await self.namesrv(self.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        if reply.code != ResponseCode.SUCCESS:
            raise AdminError(f"name server cannot list topics: {reply.remark}")
        return sorted(TopicList.from_json(reply.body).topic_list)

    async def topic_brokers(self, topic: str) -> list[BrokerRef]:
        """The master brokers holding ``topic``."""
        route = await self.route(topic)
        refs = [
            BrokerRef(b.cluster, b.broker_name, b.master_addr)
            for b in route.broker_datas
            if b.master_addr
        ]
        return sorted(refs, key=lambda r: r.name)

    async def resolve(self, broker: str) -> BrokerRef:
        """A broker given by name or by ``host:port`` address.

        Raises:
            AdminError: no broker of that name or address is known.
        """
        for ref in await self.brokers():
            if broker in (ref.name, ref.address):
                return ref
        if ":" in broker:  # an address the name server does not list: use it as given
            return BrokerRef("", broker, broker)
        raise AdminError(f"broker {broker!r} does not exist")


def _checked(reply: RemotingCommand) -> RemotingCommand:
    if reply.code != ResponseCode.SUCCESS:
        raise for_code(reply.code, reply.remark)
    return reply


def describe_broker_error(exc: BrokerError | ProtocolError) -> str:
    """A one-line message for an error answer or a malformed reply."""
    if isinstance(exc, BrokerError):
        try:
            name = ResponseCode(exc.code).name
        except ValueError:
            name = str(exc.code)
        return f"broker answered {name}: {exc}"
    return f"malformed reply: {exc}"


@asynccontextmanager
async def open_admin(config: ClientConfig) -> AsyncIterator[Admin]:
    """Run an :class:`Admin` session for the block; connections close on exit."""
    async with open_instance(config) as (instance, _):
        yield Admin(instance)
