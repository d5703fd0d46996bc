"""Offset family: consumer offsets (QUERY_CONSUMER_OFFSET 14, UPDATE_CONSUMER_OFFSET 15) and
queue offsets (SEARCH_OFFSET_BY_TIMESTAMP 29, GET_MAX_OFFSET 30, GET_MIN_OFFSET 31,
GET_EARLIEST_MSG_STORETIME 32), requests and responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.headers._base import Header, Long, meta

#: ``BoundaryType`` names accepted in ``SearchOffsetRequestHeader.boundaryType``.
BOUNDARY_LOWER = "LOWER"
BOUNDARY_UPPER = "UPPER"


# ------------------------------------------------------------------ consumer offsets
@dataclass(frozen=True, slots=True, kw_only=True)
class QueryConsumerOffsetRequestHeader(Header):
    """``QueryConsumerOffsetRequestHeader``: the committed offset of a group on a queue.

    Attributes:
        consumer_group: the group.
        topic: the topic.
        queue_id: the queue.
        set_zero_if_not_found: (5.x) false asks for QUERY_NOT_FOUND when the group has no
            offset; absent or true keeps the default (offset 0 while the queue still starts
            at 0, QUERY_NOT_FOUND otherwise).
    """

    consumer_group: str
    topic: str
    queue_id: int
    set_zero_if_not_found: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class QueryConsumerOffsetResponseHeader(Header):
    """``QueryConsumerOffsetResponseHeader``: ``offset`` (with SUCCESS)."""

    offset: Long


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateConsumerOffsetRequestHeader(Header):
    """``UpdateConsumerOffsetRequestHeader``: commit ``commit_offset`` for a group's queue."""

    consumer_group: str
    topic: str
    queue_id: int
    commit_offset: Long


# ------------------------------------------------------------------ queue offsets
@dataclass(frozen=True, slots=True, kw_only=True)
class GetMaxOffsetRequestHeader(Header):
    """``GetMaxOffsetRequestHeader``.

    Attributes:
        topic: the topic.
        queue_id: the queue.
        committed: true (Java's default) for the max dispatched offset, false for the max
            in-flight one. Java's primitive ``boolean``: always sent.
    """

    topic: str
    queue_id: int
    committed: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMaxOffsetResponseHeader(Header):
    """``GetMaxOffsetResponseHeader``: one past the last message of the queue."""

    offset: Long


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMinOffsetRequestHeader(Header):
    """``GetMinOffsetRequestHeader``."""

    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GetMinOffsetResponseHeader(Header):
    """``GetMinOffsetResponseHeader``: the first offset still stored."""

    offset: Long


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOffsetRequestHeader(Header):
    """``SearchOffsetRequestHeader``: the queue offset of the message stored at ``timestamp``.

    Attributes:
        topic: the topic.
        queue_id: the queue.
        timestamp: store time to search for, in ms.
        boundary_type: ``LOWER`` (the default when absent) or ``UPPER``: which of several
            messages stored in the same millisecond to answer with.
    """

    topic: str
    queue_id: int
    timestamp: Long
    boundary_type: str | None = field(
        default=None, metadata=meta(choices=(BOUNDARY_LOWER, BOUNDARY_UPPER))
    )

    @property
    def boundary(self) -> str:
        """``boundary_type`` with Java's default (``LOWER``) applied."""
        return self.boundary_type or BOUNDARY_LOWER


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchOffsetResponseHeader(Header):
    """``SearchOffsetResponseHeader``."""

    offset: Long


@dataclass(frozen=True, slots=True, kw_only=True)
class GetEarliestMsgStoretimeRequestHeader(Header):
    """``GetEarliestMsgStoretimeRequestHeader``."""

    topic: str
    queue_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class GetEarliestMsgStoretimeResponseHeader(Header):
    """``GetEarliestMsgStoretimeResponseHeader``: store time of the first message, in ms."""

    timestamp: Long
