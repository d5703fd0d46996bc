"""Pull family: PULL_MESSAGE (11) and LITE_PULL_MESSAGE (361) request and response headers, and
``PullSysFlag``.

A pull request's ``sysFlag`` says what else it carries: a piggy-backed offset commit
(the C++ clients send 7 = COMMIT_OFFSET | SUSPEND | SUBSCRIPTION), whether the broker may hold
it (long polling, up to ``suspendTimeoutMillis``), and whether ``subscription`` is a fresh
expression the broker must use instead of the one registered by heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntFlag

from protocol.headers._base import Header, Long, meta


class PullSysFlag(IntFlag):
    """``PullSysFlag`` bits of ``PullMessageRequestHeader.sysFlag``."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL_MESSAGE = 0x10


def build_pull_sys_flag(
    *,
    commit_offset: bool,
    suspend: bool,
    subscription: bool,
    class_filter: bool = False,
    lite_pull: bool = False,
) -> int:
    """Java's ``PullSysFlag.buildSysFlag``."""
    flag = PullSysFlag(0)
    if commit_offset:
        flag |= PullSysFlag.COMMIT_OFFSET
    if suspend:
        flag |= PullSysFlag.SUSPEND
    if subscription:
        flag |= PullSysFlag.SUBSCRIPTION
    if class_filter:
        flag |= PullSysFlag.CLASS_FILTER
    if lite_pull:
        flag |= PullSysFlag.LITE_PULL_MESSAGE
    return int(flag)


def clear_commit_offset_flag(sys_flag: int) -> int:
    """Java's ``PullSysFlag.clearCommitOffsetFlag`` (a slave must not commit)."""
    return sys_flag & ~PullSysFlag.COMMIT_OFFSET


@dataclass(frozen=True, slots=True, kw_only=True)
class PullMessageRequestHeader(Header):
    """``PullMessageRequestHeader``.

    Attributes:
        consumer_group: the pulling group.
        topic: topic to read (``%RETRY%<group>`` for the group's retries).
        queue_id: queue to read.
        queue_offset: first consume-queue offset wanted.
        max_msg_nums: at most this many messages (clients send 32).
        sys_flag: :class:`PullSysFlag` bits.
        commit_offset: the group's offset to commit when ``COMMIT_OFFSET`` is set (the
            JavaScript client sometimes sends -1: ignore negative commits).
        suspend_timeout_millis: how long the broker may hold the request when ``SUSPEND``
            is set and nothing is available.
        subscription: the filter expression (``*``, ``TagA || TagB``, SQL92) when
            ``SUBSCRIPTION`` is set.
        sub_version: the client's subscription version (a timestamp).
        expression_type: ``TAG`` (default when absent) or ``SQL92``.
        max_msg_bytes: optional byte cap on the response body.
        request_source: set by the proxy to mark where a pull came from.
        proxy_forward_client_id: the real client id when a proxy forwards (Java's wire
            name keeps its typo, ``proxyFrowardClientId``).
        lite_topic: RocketMQ 5.4 lite topics.
    """

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: Long
    max_msg_nums: int
    sys_flag: int
    commit_offset: Long
    suspend_timeout_millis: Long
    subscription: str | None = None
    sub_version: Long
    expression_type: str | None = None
    max_msg_bytes: int | None = None
    request_source: int | None = None
    proxy_forward_client_id: str | None = field(
        default=None, metadata=meta(wire="proxyFrowardClientId")
    )
    lite_topic: str | None = None

    @property
    def has_commit_offset(self) -> bool:
        """The request carries an offset commit (``commit_offset``)."""
        return bool(self.sys_flag & PullSysFlag.COMMIT_OFFSET)

    @property
    def has_suspend(self) -> bool:
        """The broker may hold the request up to ``suspend_timeout_millis``."""
        return bool(self.sys_flag & PullSysFlag.SUSPEND)

    @property
    def has_subscription(self) -> bool:
        """``subscription`` is a fresh expression that overrides the heartbeat's."""
        return bool(self.sys_flag & PullSysFlag.SUBSCRIPTION)

    @property
    def has_class_filter(self) -> bool:
        """Legacy class filter mode (filter servers; not supported by RocketMQ 5)."""
        return bool(self.sys_flag & PullSysFlag.CLASS_FILTER)

    @property
    def is_lite_pull(self) -> bool:
        """Sent by a lite pull consumer."""
        return bool(self.sys_flag & PullSysFlag.LITE_PULL_MESSAGE)


@dataclass(frozen=True, slots=True, kw_only=True)
class PullMessageResponseHeader(Header):
    """``PullMessageResponseHeader``: sent with FOUND and with the not-found codes 19/20/21.

    Attributes:
        suggest_which_broker_id: broker id to pull from next (0 = master).
        next_begin_offset: the offset to pull from next.
        min_offset: the queue's minimum offset.
        max_offset: the queue's maximum offset (one past the last message).
        offset_delta: for static topics (logic queues).
        topic_sys_flag: the topic's sys flag.
        group_sys_flag: the group's sys flag.
        forbidden_type: why the pull was refused, when it was.
    """

    suggest_which_broker_id: Long
    next_begin_offset: Long
    min_offset: Long
    max_offset: Long
    offset_delta: Long | None = None
    topic_sys_flag: int | None = None
    group_sys_flag: int | None = None
    forbidden_type: int | None = None
