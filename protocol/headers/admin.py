"""Admin and query family: topic management (UPDATE_AND_CREATE_TOPIC 17,
DELETE_TOPIC_IN_BROKER 215, GET_TOPIC_STATS_INFO 202), subscription groups
(DELETE_SUBSCRIPTIONGROUP 207, GET_SUBSCRIPTIONGROUP_CONFIG 352; UPDATE_AND_CREATE_ 200 and
GET_ALL_ 201 carry no header fields), consumer inspection
(GET_CONSUME_STATS 208, GET_CONSUMER_CONNECTION_LIST 203), offset reset
(INVOKE_BROKER_TO_RESET_OFFSET 222, and RESET_CONSUMER_CLIENT_OFFSET 220 broker → client) and
message lookup (QUERY_MESSAGE 12, VIEW_MESSAGE_BY_ID 33).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.headers._base import Header, Long, meta

#: ``TopicFilterType`` names; Java's ``checkFields`` rejects anything else.
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateTopicRequestHeader(Header):
    """``CreateTopicRequestHeader``: create or update a topic on a broker.

    Attributes:
        topic: the topic.
        default_topic: historical, sent as ``TBW102``.
        read_queue_nums: readable queues.
        write_queue_nums: writable queues.
        perm: ``PermName`` bits (2 write, 4 read, 1 inherit).
        topic_filter_type: ``SINGLE_TAG`` or ``MULTI_TAG``.
        topic_sys_flag: ``TopicSysFlag`` bits.
        order: orderly topic. Required, as in Java (which always sends it).
        attributes: ``+key=value,…`` topic attributes (5.x), e.g. message type.
        force: (5.x) apply even if attributes change incompatibly; always sent.
    """

    topic: str
    default_topic: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_filter_type: str = field(metadata=meta(choices=TOPIC_FILTER_TYPES))
    topic_sys_flag: int | None = None
    order: bool
    attributes: str | None = None
    force: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteTopicRequestHeader(Header):
    """``DeleteTopicRequestHeader``: delete a topic from a broker."""

    topic: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteSubscriptionGroupRequestHeader(Header):
    """``DeleteSubscriptionGroupRequestHeader``: delete a group's configuration.

    Attributes:
        group_name: the consumer group.
        clean_offset: (5.x) also remove the group's committed offsets.
    """

    group_name: str
    clean_offset: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class GetSubscriptionGroupConfigRequestHeader(Header):
    """``GetSubscriptionGroupConfigRequestHeader``: one group's configuration."""

    group: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GetTopicStatsInfoRequestHeader(Header):
    """``GetTopicStatsInfoRequestHeader``: per-queue min/max offsets of a topic."""

    topic: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumeStatsRequestHeader(Header):
    """``GetConsumeStatsRequestHeader``: a group's offsets and lag, on one topic or all."""

    consumer_group: str
    topic: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerConnectionListRequestHeader(Header):
    """``GetConsumerConnectionListRequestHeader``: the clients connected for a group."""

    consumer_group: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResetOffsetRequestHeader(Header):
    """``ResetOffsetRequestHeader``: move a group's offsets on a topic to a point in time.

    Attributes:
        topic: the topic.
        group: the consumer group.
        queue_id: one queue, or -1 (Java's default, always sent) for all.
        offset: (5.x) an explicit offset for ``queue_id`` instead of ``timestamp``.
        timestamp: reset to the first message stored at or after this time, in ms.
        is_force: also move offsets forward (otherwise only backward).
    """

    topic: str
    group: str
    queue_id: int = -1
    offset: Long | None = None
    timestamp: Long
    is_force: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryMessageRequestHeader(Header):
    """``QueryMessageRequestHeader``: messages of a topic by key, from the index.

    Attributes:
        topic: the topic.
        key: the message key (``KEYS``) or unique key to look up.
        max_num: at most this many results.
        begin_timestamp: store-time window start, in ms.
        end_timestamp: store-time window end, in ms.
    """

    topic: str
    key: str
    max_num: int
    begin_timestamp: Long
    end_timestamp: Long


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryMessageResponseHeader(Header):
    """``QueryMessageResponseHeader``: how current the index was when answering."""

    index_last_update_timestamp: Long
    index_last_update_phyoffset: Long


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewMessageRequestHeader(Header):
    """``ViewMessageRequestHeader``: one message by commit-log offset (from an offset id)."""

    offset: Long
