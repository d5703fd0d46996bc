"""Which typed header each request code carries, and a decoder that dispatches on it.

``REQUEST_HEADERS`` maps a request code to the class its ``extFields`` decode to. The V2 send
codes (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, SEND_REPLY_MESSAGE_V2) map to the same
:class:`SendMessageRequestHeader` as SEND_MESSAGE, but their fields have one-letter names, so
``REQUEST_HEADERS[code].from_ext`` is wrong for them: call :func:`decode_request_header`,
which handles that, or :func:`send_header_from_v2_ext` directly.

Codes that carry no header fields (HEART_BEAT, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ,
BATCH_ACK_MESSAGE, GET_BROKER_CLUSTER_INFO, …) and codes trimq does not know are absent:
:func:`decode_request_header` returns ``None`` for them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from protocol.codes import RequestCode as C
from protocol.command import RemotingCommand
from protocol.headers import admin, client, offsets, pop, pull, route, send, transaction
from protocol.headers._base import Header

REQUEST_HEADERS: Mapping[int, type[Header]] = MappingProxyType(
    {
        C.SEND_MESSAGE: send.SendMessageRequestHeader,
        C.SEND_MESSAGE_V2: send.SendMessageRequestHeader,  # one-letter names, see above
        C.SEND_BATCH_MESSAGE: send.SendMessageRequestHeader,  # one-letter names
        C.SEND_REPLY_MESSAGE: send.SendMessageRequestHeader,
        C.SEND_REPLY_MESSAGE_V2: send.SendMessageRequestHeader,  # one-letter names
        C.CONSUMER_SEND_MSG_BACK: send.ConsumerSendMsgBackRequestHeader,
        C.PULL_MESSAGE: pull.PullMessageRequestHeader,
        C.LITE_PULL_MESSAGE: pull.PullMessageRequestHeader,
        C.QUERY_CONSUMER_OFFSET: offsets.QueryConsumerOffsetRequestHeader,
        C.UPDATE_CONSUMER_OFFSET: offsets.UpdateConsumerOffsetRequestHeader,
        C.SEARCH_OFFSET_BY_TIMESTAMP: offsets.SearchOffsetRequestHeader,
        C.GET_MAX_OFFSET: offsets.GetMaxOffsetRequestHeader,
        C.GET_MIN_OFFSET: offsets.GetMinOffsetRequestHeader,
        C.GET_EARLIEST_MSG_STORETIME: offsets.GetEarliestMsgStoretimeRequestHeader,
        C.UNREGISTER_CLIENT: client.UnregisterClientRequestHeader,
        C.GET_CONSUMER_LIST_BY_GROUP: client.GetConsumerListByGroupRequestHeader,
        C.NOTIFY_CONSUMER_IDS_CHANGED: client.NotifyConsumerIdsChangedRequestHeader,
        C.END_TRANSACTION: transaction.EndTransactionRequestHeader,
        C.CHECK_TRANSACTION_STATE: transaction.CheckTransactionStateRequestHeader,
        C.PUT_KV_CONFIG: route.PutKVConfigRequestHeader,
        C.GET_KV_CONFIG: route.GetKVConfigRequestHeader,
        C.DELETE_KV_CONFIG: route.DeleteKVConfigRequestHeader,
        C.GET_KVLIST_BY_NAMESPACE: route.GetKVListByNamespaceRequestHeader,
        C.REGISTER_BROKER: route.RegisterBrokerRequestHeader,
        C.UNREGISTER_BROKER: route.UnRegisterBrokerRequestHeader,
        C.GET_ROUTEINFO_BY_TOPIC: route.GetRouteInfoRequestHeader,
        C.GET_TOPICS_BY_CLUSTER: route.GetTopicsByClusterRequestHeader,
        C.POP_MESSAGE: pop.PopMessageRequestHeader,
        C.ACK_MESSAGE: pop.AckMessageRequestHeader,
        C.CHANGE_MESSAGE_INVISIBLETIME: pop.ChangeInvisibleTimeRequestHeader,
        C.UPDATE_AND_CREATE_TOPIC: admin.CreateTopicRequestHeader,
        C.DELETE_TOPIC_IN_BROKER: admin.DeleteTopicRequestHeader,
        C.GET_TOPIC_STATS_INFO: admin.GetTopicStatsInfoRequestHeader,
        C.DELETE_SUBSCRIPTIONGROUP: admin.DeleteSubscriptionGroupRequestHeader,
        C.GET_SUBSCRIPTIONGROUP_CONFIG: admin.GetSubscriptionGroupConfigRequestHeader,
        C.GET_CONSUME_STATS: admin.GetConsumeStatsRequestHeader,
        C.GET_CONSUMER_CONNECTION_LIST: admin.GetConsumerConnectionListRequestHeader,
        C.INVOKE_BROKER_TO_RESET_OFFSET: admin.ResetOffsetRequestHeader,
        C.RESET_CONSUMER_CLIENT_OFFSET: admin.ResetOffsetRequestHeader,
        C.QUERY_MESSAGE: admin.QueryMessageRequestHeader,
        C.VIEW_MESSAGE_BY_ID: admin.ViewMessageRequestHeader,
    }
)

#: The header of a successful response, by the code of the request it answers. Codes whose
#: responses carry no header fields are absent.
RESPONSE_HEADERS: Mapping[int, type[Header]] = MappingProxyType(
    {
        C.SEND_MESSAGE: send.SendMessageResponseHeader,
        C.SEND_MESSAGE_V2: send.SendMessageResponseHeader,
        C.SEND_BATCH_MESSAGE: send.SendMessageResponseHeader,
        C.SEND_REPLY_MESSAGE: send.SendMessageResponseHeader,
        C.SEND_REPLY_MESSAGE_V2: send.SendMessageResponseHeader,
        C.PULL_MESSAGE: pull.PullMessageResponseHeader,
        C.LITE_PULL_MESSAGE: pull.PullMessageResponseHeader,
        C.QUERY_CONSUMER_OFFSET: offsets.QueryConsumerOffsetResponseHeader,
        C.SEARCH_OFFSET_BY_TIMESTAMP: offsets.SearchOffsetResponseHeader,
        C.GET_MAX_OFFSET: offsets.GetMaxOffsetResponseHeader,
        C.GET_MIN_OFFSET: offsets.GetMinOffsetResponseHeader,
        C.GET_EARLIEST_MSG_STORETIME: offsets.GetEarliestMsgStoretimeResponseHeader,
        C.GET_KV_CONFIG: route.GetKVConfigResponseHeader,
        C.REGISTER_BROKER: route.RegisterBrokerResponseHeader,
        C.POP_MESSAGE: pop.PopMessageResponseHeader,
        C.CHANGE_MESSAGE_INVISIBLETIME: pop.ChangeInvisibleTimeResponseHeader,
        C.QUERY_MESSAGE: admin.QueryMessageResponseHeader,
    }
)


def decode_request_header(cmd: RemotingCommand) -> Header | None:
    """Decode a request's ``extFields`` into the typed header its code carries.

    The V2 send codes are decoded from their one-letter names. Returns ``None`` for codes
    without header fields or unknown to trimq (see the module docstring).

    Raises:
        FieldError: a required field is missing or malformed; ``field`` names it.
    """
    if cmd.code in send.V2_SEND_CODES:
        return send.send_header_from_v2_ext(cmd.ext_fields)
    cls = REQUEST_HEADERS.get(cmd.code)
    return None if cls is None else cls.from_ext(cmd.ext_fields)
