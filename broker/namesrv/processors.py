"""The name server's request processors and their registry (:data:`NAMESRV`).

Registration (REGISTER_BROKER 103, UNREGISTER_BROKER 104), route queries
(GET_ROUTEINFO_BY_TOPIC 105, GET_BROKER_CLUSTER_INFO 106, GET_ALL_TOPIC_LIST_FROM_NAMESERVER
206, GET_TOPICS_BY_CLUSTER 224) and the KV config (PUT/GET/DELETE_KV_CONFIG 100/101/102,
GET_KVLIST_BY_NAMESPACE 219). Any other code is answered REQUEST_CODE_NOT_SUPPORTED by the
registry. Answers and remarks follow RocketMQ's ``DefaultRequestProcessor``.
"""

from __future__ import annotations

from broker.logs import get_logger
from broker.namesrv.context import NamesrvContext
from broker.namesrv.routes import Registration
from broker.remoting.connection import Connection
from broker.remoting.dispatch import Registry
from protocol.bodies.namesrv import (
    NAMESPACE_ORDER_TOPIC_CONFIG,
    KVTable,
    body_crc32,
    decode_register_body,
)
from protocol.bodies.route import TopicList
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.route import (
    DeleteKVConfigRequestHeader,
    GetKVConfigRequestHeader,
    GetKVConfigResponseHeader,
    GetKVListByNamespaceRequestHeader,
    GetRouteInfoRequestHeader,
    GetTopicsByClusterRequestHeader,
    PutKVConfigRequestHeader,
    RegisterBrokerRequestHeader,
    RegisterBrokerResponseHeader,
    UnRegisterBrokerRequestHeader,
)

_log = get_logger("namesrv")
#: RocketMQ points clients at this page when a topic has no route.
_FAQ = "See http://rocketmq.apache.org/docs/faq/ for further details."


# ------------------------------------------------------------------ brokers
async def register_broker(
    ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Add or renew a broker and (for a master whose data version changed) its topics."""
    header = RegisterBrokerRequestHeader.from_ext(cmd.ext_fields)
    if header.body_crc32 and body_crc32(cmd.body) != header.body_crc32:
        _log.warning("registration body crc32 mismatch", broker=header.broker_addr)
        return cmd.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
    body = decode_register_body(
        cmd.body, compressed=header.compressed, max_size=ctx.config.max_frame_size
    )
    wrapper = body.topic_config_serialize_wrapper
    timeout = header.heartbeat_timeout_millis
    result = ctx.routes.register(
        Registration(
            cluster=header.cluster_name,
            broker_addr=header.broker_addr,
            broker_name=header.broker_name,
            broker_id=header.broker_id,
            ha_server_addr=header.ha_server_addr,
            topics=wrapper.topic_config_table,
            data_version=wrapper.data_version,
            timeout_s=None if timeout is None else timeout / 1000,
            master_epoch=header.trimq_master_epoch,
        ),
        ctx.now(),
    )
    if result.first:
        _log.info("broker registered", broker=header.broker_name, address=header.broker_addr,
                  broker_id=header.broker_id, cluster=header.cluster_name,
                  topics=len(wrapper.topic_config_table))  # fmt: skip
    elif result.topics_applied:
        _log.info("broker topics changed", broker=header.broker_name,
                  address=header.broker_addr, topics=len(wrapper.topic_config_table))  # fmt: skip
    reply = RegisterBrokerResponseHeader(
        ha_server_addr=result.ha_server_addr, master_addr=result.master_addr
    )
    order = ctx.kv.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
    return cmd.response(ext_fields=reply.to_ext(), body=KVTable(order).to_json() if order else b"")


async def unregister_broker(
    ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Remove a broker address at once (its graceful shutdown)."""
    h = UnRegisterBrokerRequestHeader.from_ext(cmd.ext_fields)
    if ctx.routes.unregister(h.cluster_name, h.broker_addr, h.broker_name, h.broker_id):
        _log.info("broker unregistered", broker=h.broker_name, address=h.broker_addr,
                  broker_id=h.broker_id)  # fmt: skip
    return cmd.response()


# ------------------------------------------------------------------ routes
async def get_route(ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """The topic's queues and brokers, or TOPIC_NOT_EXIST."""
    header = GetRouteInfoRequestHeader.from_ext(cmd.ext_fields)
    order = ctx.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, header.topic)
    route = ctx.routes.route(header.topic, order_topic_conf=order)
    if route is None:
        return cmd.response(
            ResponseCode.TOPIC_NOT_EXIST,
            f"No topic route info in name server for the topic: {header.topic}\n{_FAQ}",
        )
    return cmd.response(body=route.to_json())


async def cluster_info(
    ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """``brokerAddrTable`` and ``clusterAddrTable``."""
    return cmd.response(body=ctx.routes.cluster_info().to_json())


async def all_topics(
    ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Every topic some registered broker holds."""
    return cmd.response(body=TopicList(tuple(ctx.routes.topics())).to_json())


async def topics_by_cluster(
    ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """The topics of one cluster's brokers."""
    header = GetTopicsByClusterRequestHeader.from_ext(cmd.ext_fields)
    topics = ctx.routes.topics_of_cluster(header.cluster)
    return cmd.response(body=TopicList(tuple(topics)).to_json())


# ------------------------------------------------------------------ KV config
async def put_kv(ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Set one key (and persist the table when it has a file)."""
    h = PutKVConfigRequestHeader.from_ext(cmd.ext_fields)
    ctx.kv.put(h.namespace, h.key, h.value)
    await ctx.persist_kv()
    return cmd.response()


async def get_kv(ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """One value, or QUERY_NOT_FOUND."""
    h = GetKVConfigRequestHeader.from_ext(cmd.ext_fields)
    value = ctx.kv.get(h.namespace, h.key)
    if value is None:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {h.namespace} Key: {h.key}"
        )
    return cmd.response(ext_fields=GetKVConfigResponseHeader(value=value).to_ext())


async def delete_kv(ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Remove one key (success whether or not it existed, as in RocketMQ)."""
    h = DeleteKVConfigRequestHeader.from_ext(cmd.ext_fields)
    if ctx.kv.delete(h.namespace, h.key):
        await ctx.persist_kv()
    return cmd.response()


async def kv_list(ctx: NamesrvContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Every key of a namespace as a KVTable, or QUERY_NOT_FOUND."""
    h = GetKVListByNamespaceRequestHeader.from_ext(cmd.ext_fields)
    table = ctx.kv.namespace(h.namespace)
    if table is None:
        return cmd.response(
            ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {h.namespace}"
        )
    return cmd.response(body=KVTable(table).to_json())


#: Every request code the name server serves (one explicit table).
NAMESRV: Registry[NamesrvContext] = Registry("namesrv")
NAMESRV.register((RequestCode.REGISTER_BROKER,), register_broker)
NAMESRV.register((RequestCode.UNREGISTER_BROKER,), unregister_broker)
NAMESRV.register((RequestCode.GET_ROUTEINFO_BY_TOPIC,), get_route)
NAMESRV.register((RequestCode.GET_BROKER_CLUSTER_INFO,), cluster_info)
NAMESRV.register((RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,), all_topics)
NAMESRV.register((RequestCode.GET_TOPICS_BY_CLUSTER,), topics_by_cluster)
NAMESRV.register((RequestCode.PUT_KV_CONFIG,), put_kv)
NAMESRV.register((RequestCode.GET_KV_CONFIG,), get_kv)
NAMESRV.register((RequestCode.DELETE_KV_CONFIG,), delete_kv)
NAMESRV.register((RequestCode.GET_KVLIST_BY_NAMESPACE,), kv_list)
