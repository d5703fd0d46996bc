"""The broker's Remoting processors: one module per request family, registered here in one
explicit table (as RocketMQ's ``BrokerController.registerProcessor`` lists them), not by
import side effects."""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.acl import AclGuard
from broker.core.broker import Broker
from broker.remoting.context import BrokerContext
from broker.remoting.dispatch import (
    GroupHandler,
    Handler,
    QuickHandler,
    Registry,
    SettleHandler,
    StoreHandler,
)
from broker.remoting.processors import (
    ack,
    admin,
    client,
    cluster,
    groups,
    lock,
    offsets,
    pop,
    pull,
    query,
    route,
    send,
    sendback,
    transaction,
)
from broker.remoting.server import BoundRegistry, ServerState
from protocol.acl import authorize_request
from protocol.codes import RequestCode


@dataclass(frozen=True, slots=True)
class Entry:
    """One row of the table: request codes, their handler, and how it runs."""

    codes: tuple[int, ...]
    handler: Handler[BrokerContext]
    #: It may hold the request (a long poll): always its own task.
    parks: bool = False
    #: It waits for durability in SYNC flush mode: its own task there.
    stores: bool = False
    #: Answers a request that ``parks`` at once when it need not wait (in the reader).
    quick: QuickHandler[BrokerContext] | None = None
    #: Answers consecutive requests of its code in one read together (in the reader).
    group: GroupHandler[BrokerContext] | None = None
    #: SYNC flush mode: stores consecutive requests of its code in the reader, in order,
    #: and answers them after one wait for their fsync (one task for the burst).
    durable: tuple[StoreHandler[BrokerContext], SettleHandler[BrokerContext]] | None = None


#: Every request code the broker serves.
TABLE: tuple[Entry, ...] = (
    Entry((RequestCode.ACK_MESSAGE,), ack.ack_message, group=ack.ack_messages),
    Entry((RequestCode.BATCH_ACK_MESSAGE,), ack.batch_ack_message),
    Entry((RequestCode.CHANGE_MESSAGE_INVISIBLETIME,), ack.change_invisible_time),
    Entry((RequestCode.UPDATE_AND_CREATE_TOPIC,), admin.create_topic),
    Entry((RequestCode.DELETE_TOPIC_IN_BROKER,), admin.delete_topic),
    Entry((RequestCode.GET_TOPIC_STATS_INFO,), admin.topic_stats),
    Entry((RequestCode.GET_CONSUME_STATS,), admin.consume_stats),
    Entry((RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,), groups.update_group),
    Entry((RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,), groups.all_groups),
    Entry((RequestCode.DELETE_SUBSCRIPTIONGROUP,), groups.delete_group),
    Entry((RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG,), groups.get_group),
    Entry((RequestCode.HEART_BEAT,), client.heartbeat),
    Entry((RequestCode.UNREGISTER_CLIENT,), client.unregister),
    Entry((RequestCode.GET_CONSUMER_LIST_BY_GROUP,), client.consumer_list),
    Entry((RequestCode.GET_BROKER_CLUSTER_INFO,), cluster.cluster_info),
    Entry((RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,), cluster.topic_list),
    Entry((RequestCode.GET_BROKER_RUNTIME_INFO,), cluster.broker_runtime_info),
    Entry((RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,), cluster.reset_offset),
    Entry((RequestCode.GET_ALL_CONSUMER_OFFSET,), cluster.all_consumer_offsets),
    Entry((RequestCode.PROMOTE_REPLICA,), cluster.promote_replica),
    Entry((RequestCode.LOCK_BATCH_MQ,), lock.lock_batch),
    Entry((RequestCode.UNLOCK_BATCH_MQ,), lock.unlock_batch),
    Entry((RequestCode.QUERY_CONSUMER_OFFSET,), offsets.query_consumer_offset),
    Entry((RequestCode.UPDATE_CONSUMER_OFFSET,), offsets.update_consumer_offset),
    Entry((RequestCode.GET_MAX_OFFSET,), offsets.get_max_offset),
    Entry((RequestCode.GET_MIN_OFFSET,), offsets.get_min_offset),
    Entry((RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,), offsets.search_offset_by_timestamp),
    Entry((RequestCode.GET_EARLIEST_MSG_STORETIME,), offsets.get_earliest_msg_storetime),
    Entry((RequestCode.POP_MESSAGE,), pop.pop_message, parks=True, quick=pop.pop_message_now),
    Entry(
        (
            RequestCode.PULL_MESSAGE,
            RequestCode.LITE_PULL_MESSAGE,
        ),
        pull.pull_message,
        parks=True,
        quick=pull.pull_message_now,
    ),
    Entry((RequestCode.VIEW_MESSAGE_BY_ID,), query.view_message_by_id),
    Entry((RequestCode.QUERY_MESSAGE,), query.query_message),
    Entry((RequestCode.GET_ROUTEINFO_BY_TOPIC,), route.get_route),
    Entry(
        (
            RequestCode.SEND_MESSAGE,
            RequestCode.SEND_MESSAGE_V2,
        ),
        send.send_message,
        stores=True,
        durable=(send.store_message, send.settle_messages),
    ),
    Entry((RequestCode.SEND_BATCH_MESSAGE,), send.send_batch, stores=True),
    Entry((RequestCode.CONSUMER_SEND_MSG_BACK,), sendback.send_back, stores=True),
    Entry((RequestCode.END_TRANSACTION,), transaction.end_transaction, stores=True),
)


def build_registry() -> Registry[BrokerContext]:
    """A registry holding :data:`TABLE`."""
    registry: Registry[BrokerContext] = Registry("broker")
    for entry in TABLE:
        registry.register(
            entry.codes,
            entry.handler,
            parks=entry.parks,
            stores=entry.stores,
            quick=entry.quick,
            group=entry.group,
            durable=entry.durable,
        )
    return registry


def broker_dispatcher(broker: Broker) -> BoundRegistry[BrokerContext]:
    """The broker's Remoting front end: its processors bound to a new context (the broker
    and a fresh :class:`ServerState`, ``dispatcher.ctx.server``); a closing connection
    leaves its consumer groups. SYNC flush mode lets storing requests wait in a task. With
    ``acl_file`` set, every request passes the ACL guard first (``dispatcher.guard``).

    Raises:
        broker.acl.AclFileError: the ACL file is not valid.
    """
    ctx = BrokerContext(broker, ServerState())
    acl_file = broker.config.acl_file
    return BoundRegistry(
        build_registry(),
        ctx,
        sync=broker.config.stores_wait,
        on_close=ctx.connection_closed,
        guard=None if acl_file is None else AclGuard(acl_file, authorize_request),
        state=ctx.server,
        send_queue_wait_s=_bound_s(broker.config.send_queue_wait_ms),
        queue_wait_s=_bound_s(broker.config.queue_wait_ms),
    )


def _bound_s(ms: int) -> float:
    return ms / 1000 if ms > 0 else math.inf
