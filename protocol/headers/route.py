"""Name server family: routes (GET_ROUTEINFO_BY_TOPIC 105, GET_TOPICS_BY_CLUSTER 224), broker
registration (REGISTER_BROKER 103, UNREGISTER_BROKER 104) and the KV config store
(PUT_KV_CONFIG 100, GET_KV_CONFIG 101, DELETE_KV_CONFIG 102, GET_KVLIST_BY_NAMESPACE 219).

Java keeps the name server headers in ``remoting/.../protocol/header/namesrv/``.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.headers._base import Header, Long


@dataclass(frozen=True, slots=True, kw_only=True)
class GetRouteInfoRequestHeader(Header):
    """``GetRouteInfoRequestHeader``: the route (queues and broker addresses) of a topic.

    Attributes:
        topic: the topic.
        accept_standard_json_only: (5.x) the client wants standard JSON for the route body
            (quoted map keys); older clients accept both forms anyway.
    """

    topic: str
    accept_standard_json_only: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetTopicsByClusterRequestHeader(Header):
    """``GetTopicsByClusterRequestHeader``: the topics of a cluster."""

    cluster: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterBrokerRequestHeader(Header):
    """``RegisterBrokerRequestHeader``: a broker's periodic registration with a name server.

    The topic configs travel in the body (``RegisterBrokerBody``, zlib-compressed when
    ``compressed``).

    Attributes:
        broker_name: the broker group name (``broker-a``).
        broker_addr: ``host:port`` clients connect to.
        cluster_name: its cluster.
        ha_server_addr: ``host:port`` of its HA service.
        broker_id: 0 for a master, > 0 for slaves.
        heartbeat_timeout_millis: how long the name server keeps it without a new
            registration (name server default 120 s when absent).
        enable_acting_master: 5.x slave-acting-master mode.
        compressed: the body is compressed (Java's primitive ``boolean``: always sent).
        body_crc32: CRC32 of the body, 0 when not computed (always sent).
        trimq_master_epoch: trimq's own: a master elected through etcd sends its epoch
            (the etcd revision of its master key, docs/ha.md), so that a name server
            drops a stale master when a newer one registers and refuses the stale one's
            later registrations. RocketMQ's name servers ignore the unknown field; a
            registration without it is treated as before.
    """

    broker_name: str
    broker_addr: str
    cluster_name: str
    ha_server_addr: str
    broker_id: Long
    heartbeat_timeout_millis: Long | None = None
    enable_acting_master: bool | None = None
    compressed: bool = False
    body_crc32: int = 0
    trimq_master_epoch: Long | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RegisterBrokerResponseHeader(Header):
    """``RegisterBrokerResponseHeader``: the master's addresses, for a slave."""

    ha_server_addr: str | None = None
    master_addr: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class UnRegisterBrokerRequestHeader(Header):
    """``UnRegisterBrokerRequestHeader``: a broker shutting down leaves the name server."""

    broker_name: str
    broker_addr: str
    cluster_name: str
    broker_id: Long


@dataclass(frozen=True, slots=True, kw_only=True)
class GetKVConfigRequestHeader(Header):
    """``GetKVConfigRequestHeader``: read ``key`` in ``namespace`` of the KV config store."""

    namespace: str
    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GetKVConfigResponseHeader(Header):
    """``GetKVConfigResponseHeader``: the value (absent with QUERY_NOT_FOUND)."""

    value: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PutKVConfigRequestHeader(Header):
    """``PutKVConfigRequestHeader``: set ``key`` in ``namespace`` to ``value``."""

    namespace: str
    key: str
    value: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteKVConfigRequestHeader(Header):
    """``DeleteKVConfigRequestHeader``: remove ``key`` from ``namespace``."""

    namespace: str
    key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GetKVListByNamespaceRequestHeader(Header):
    """``GetKVListByNamespaceRequestHeader``: every key and value of ``namespace``."""

    namespace: str
