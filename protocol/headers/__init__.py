"""Typed request and response headers: ``RemotingCommand.ext_fields`` ⇄ frozen dataclasses.

Sans-IO and standard library only. Every header class has ``Header.from_ext(ext)`` (raising
:class:`~protocol.errors.FieldError` naming the bad field) and ``header.to_ext()``; see
``protocol.headers._base`` for the field conventions. To decode an incoming request by its
code, use :func:`decode_request_header`: it knows that SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE
use one-letter field names (``send_header_from_v2_ext``).

One module per request family: ``send``, ``pull``, ``offsets``, ``client``, ``route`` (name
server), ``pop``, ``admin``, ``transaction``. LOCK_BATCH_MQ / UNLOCK_BATCH_MQ, HEART_BEAT and
BATCH_ACK_MESSAGE carry no header fields (their JSON bodies live in ``protocol.bodies``).
"""

from __future__ import annotations

from protocol.headers._base import LONG as LONG
from protocol.headers._base import Codec as Codec
from protocol.headers._base import FieldInfo as FieldInfo
from protocol.headers._base import FieldKind as FieldKind
from protocol.headers._base import Header as Header
from protocol.headers._base import Long as Long
from protocol.headers._base import codec_of as codec_of
from protocol.headers._base import fields_of as fields_of
from protocol.headers._base import from_ext as from_ext
from protocol.headers._base import meta as meta
from protocol.headers._base import plain_int as plain_int
from protocol.headers._base import to_ext as to_ext
from protocol.headers.admin import TOPIC_FILTER_TYPES as TOPIC_FILTER_TYPES
from protocol.headers.admin import CreateTopicRequestHeader as CreateTopicRequestHeader
from protocol.headers.admin import (
    DeleteSubscriptionGroupRequestHeader as DeleteSubscriptionGroupRequestHeader,
)
from protocol.headers.admin import DeleteTopicRequestHeader as DeleteTopicRequestHeader
from protocol.headers.admin import (
    GetConsumerConnectionListRequestHeader as GetConsumerConnectionListRequestHeader,
)
from protocol.headers.admin import GetConsumeStatsRequestHeader as GetConsumeStatsRequestHeader
from protocol.headers.admin import (
    GetSubscriptionGroupConfigRequestHeader as GetSubscriptionGroupConfigRequestHeader,
)
from protocol.headers.admin import GetTopicStatsInfoRequestHeader as GetTopicStatsInfoRequestHeader
from protocol.headers.admin import QueryMessageRequestHeader as QueryMessageRequestHeader
from protocol.headers.admin import QueryMessageResponseHeader as QueryMessageResponseHeader
from protocol.headers.admin import ResetOffsetRequestHeader as ResetOffsetRequestHeader
from protocol.headers.admin import ViewMessageRequestHeader as ViewMessageRequestHeader
from protocol.headers.client import (
    GetConsumerListByGroupRequestHeader as GetConsumerListByGroupRequestHeader,
)
from protocol.headers.client import (
    NotifyConsumerIdsChangedRequestHeader as NotifyConsumerIdsChangedRequestHeader,
)
from protocol.headers.client import UnregisterClientRequestHeader as UnregisterClientRequestHeader
from protocol.headers.offsets import BOUNDARY_LOWER as BOUNDARY_LOWER
from protocol.headers.offsets import BOUNDARY_UPPER as BOUNDARY_UPPER
from protocol.headers.offsets import (
    GetEarliestMsgStoretimeRequestHeader as GetEarliestMsgStoretimeRequestHeader,
)
from protocol.headers.offsets import (
    GetEarliestMsgStoretimeResponseHeader as GetEarliestMsgStoretimeResponseHeader,
)
from protocol.headers.offsets import GetMaxOffsetRequestHeader as GetMaxOffsetRequestHeader
from protocol.headers.offsets import GetMaxOffsetResponseHeader as GetMaxOffsetResponseHeader
from protocol.headers.offsets import GetMinOffsetRequestHeader as GetMinOffsetRequestHeader
from protocol.headers.offsets import GetMinOffsetResponseHeader as GetMinOffsetResponseHeader
from protocol.headers.offsets import (
    QueryConsumerOffsetRequestHeader as QueryConsumerOffsetRequestHeader,
)
from protocol.headers.offsets import (
    QueryConsumerOffsetResponseHeader as QueryConsumerOffsetResponseHeader,
)
from protocol.headers.offsets import SearchOffsetRequestHeader as SearchOffsetRequestHeader
from protocol.headers.offsets import SearchOffsetResponseHeader as SearchOffsetResponseHeader
from protocol.headers.offsets import (
    UpdateConsumerOffsetRequestHeader as UpdateConsumerOffsetRequestHeader,
)
from protocol.headers.pop import INIT_MODE_MAX as INIT_MODE_MAX
from protocol.headers.pop import INIT_MODE_MIN as INIT_MODE_MIN
from protocol.headers.pop import POP_TIMEOUT_SLACK_MS as POP_TIMEOUT_SLACK_MS
from protocol.headers.pop import AckMessageRequestHeader as AckMessageRequestHeader
from protocol.headers.pop import (
    ChangeInvisibleTimeRequestHeader as ChangeInvisibleTimeRequestHeader,
)
from protocol.headers.pop import (
    ChangeInvisibleTimeResponseHeader as ChangeInvisibleTimeResponseHeader,
)
from protocol.headers.pop import PopMessageRequestHeader as PopMessageRequestHeader
from protocol.headers.pop import PopMessageResponseHeader as PopMessageResponseHeader
from protocol.headers.pull import PullMessageRequestHeader as PullMessageRequestHeader
from protocol.headers.pull import PullMessageResponseHeader as PullMessageResponseHeader
from protocol.headers.pull import PullSysFlag as PullSysFlag
from protocol.headers.pull import build_pull_sys_flag as build_pull_sys_flag
from protocol.headers.pull import clear_commit_offset_flag as clear_commit_offset_flag
from protocol.headers.registry import REQUEST_HEADERS as REQUEST_HEADERS
from protocol.headers.registry import RESPONSE_HEADERS as RESPONSE_HEADERS
from protocol.headers.registry import decode_request_header as decode_request_header
from protocol.headers.route import DeleteKVConfigRequestHeader as DeleteKVConfigRequestHeader
from protocol.headers.route import GetKVConfigRequestHeader as GetKVConfigRequestHeader
from protocol.headers.route import GetKVConfigResponseHeader as GetKVConfigResponseHeader
from protocol.headers.route import (
    GetKVListByNamespaceRequestHeader as GetKVListByNamespaceRequestHeader,
)
from protocol.headers.route import GetRouteInfoRequestHeader as GetRouteInfoRequestHeader
from protocol.headers.route import (
    GetTopicsByClusterRequestHeader as GetTopicsByClusterRequestHeader,
)
from protocol.headers.route import PutKVConfigRequestHeader as PutKVConfigRequestHeader
from protocol.headers.route import RegisterBrokerRequestHeader as RegisterBrokerRequestHeader
from protocol.headers.route import RegisterBrokerResponseHeader as RegisterBrokerResponseHeader
from protocol.headers.route import UnRegisterBrokerRequestHeader as UnRegisterBrokerRequestHeader
from protocol.headers.send import V2_SEND_CODES as V2_SEND_CODES
from protocol.headers.send import V2_WIRE_NAMES as V2_WIRE_NAMES
from protocol.headers.send import (
    ConsumerSendMsgBackRequestHeader as ConsumerSendMsgBackRequestHeader,
)
from protocol.headers.send import SendMessageRequestHeader as SendMessageRequestHeader
from protocol.headers.send import SendMessageResponseHeader as SendMessageResponseHeader
from protocol.headers.send import send_header_from_v2_ext as send_header_from_v2_ext
from protocol.headers.send import send_header_to_v2_ext as send_header_to_v2_ext
from protocol.headers.transaction import TRANSACTION_COMMIT_TYPE as TRANSACTION_COMMIT_TYPE
from protocol.headers.transaction import TRANSACTION_NOT_TYPE as TRANSACTION_NOT_TYPE
from protocol.headers.transaction import TRANSACTION_ROLLBACK_TYPE as TRANSACTION_ROLLBACK_TYPE
from protocol.headers.transaction import (
    CheckTransactionStateRequestHeader as CheckTransactionStateRequestHeader,
)
from protocol.headers.transaction import EndTransactionRequestHeader as EndTransactionRequestHeader

__all__ = [
    "BOUNDARY_LOWER",
    "BOUNDARY_UPPER",
    "INIT_MODE_MAX",
    "INIT_MODE_MIN",
    "LONG",
    "POP_TIMEOUT_SLACK_MS",
    "REQUEST_HEADERS",
    "RESPONSE_HEADERS",
    "TOPIC_FILTER_TYPES",
    "TRANSACTION_COMMIT_TYPE",
    "TRANSACTION_NOT_TYPE",
    "TRANSACTION_ROLLBACK_TYPE",
    "V2_SEND_CODES",
    "V2_WIRE_NAMES",
    "AckMessageRequestHeader",
    "ChangeInvisibleTimeRequestHeader",
    "ChangeInvisibleTimeResponseHeader",
    "CheckTransactionStateRequestHeader",
    "Codec",
    "ConsumerSendMsgBackRequestHeader",
    "CreateTopicRequestHeader",
    "DeleteKVConfigRequestHeader",
    "DeleteSubscriptionGroupRequestHeader",
    "DeleteTopicRequestHeader",
    "EndTransactionRequestHeader",
    "FieldInfo",
    "FieldKind",
    "GetConsumeStatsRequestHeader",
    "GetConsumerConnectionListRequestHeader",
    "GetConsumerListByGroupRequestHeader",
    "GetEarliestMsgStoretimeRequestHeader",
    "GetEarliestMsgStoretimeResponseHeader",
    "GetKVConfigRequestHeader",
    "GetKVConfigResponseHeader",
    "GetKVListByNamespaceRequestHeader",
    "GetMaxOffsetRequestHeader",
    "GetMaxOffsetResponseHeader",
    "GetMinOffsetRequestHeader",
    "GetMinOffsetResponseHeader",
    "GetRouteInfoRequestHeader",
    "GetSubscriptionGroupConfigRequestHeader",
    "GetTopicStatsInfoRequestHeader",
    "GetTopicsByClusterRequestHeader",
    "Header",
    "Long",
    "NotifyConsumerIdsChangedRequestHeader",
    "PopMessageRequestHeader",
    "PopMessageResponseHeader",
    "PullMessageRequestHeader",
    "PullMessageResponseHeader",
    "PullSysFlag",
    "PutKVConfigRequestHeader",
    "QueryConsumerOffsetRequestHeader",
    "QueryConsumerOffsetResponseHeader",
    "QueryMessageRequestHeader",
    "QueryMessageResponseHeader",
    "RegisterBrokerRequestHeader",
    "RegisterBrokerResponseHeader",
    "ResetOffsetRequestHeader",
    "SearchOffsetRequestHeader",
    "SearchOffsetResponseHeader",
    "SendMessageRequestHeader",
    "SendMessageResponseHeader",
    "UnRegisterBrokerRequestHeader",
    "UnregisterClientRequestHeader",
    "UpdateConsumerOffsetRequestHeader",
    "ViewMessageRequestHeader",
    "build_pull_sys_flag",
    "clear_commit_offset_flag",
    "codec_of",
    "decode_request_header",
    "fields_of",
    "from_ext",
    "meta",
    "send_header_from_v2_ext",
    "send_header_to_v2_ext",
    "to_ext",
]
