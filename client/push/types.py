"""What a push consumer's listener returns and what the consumer reports.

A listener is a sync or async callable ``(ReceivedMessage) -> ConsumeResult``. Anything but
``ConsumeResult.SUCCESS`` — ``RETRY_LATER``, ``SUSPEND``, ``None``, another value, a raised
exception — is a failure, as RocketMQ counts ``RECONSUME_LATER``, a ``null`` return and an
exception (``ConsumeReturnType``). A call that runs past ``consume_timeout`` is a failure too
(:attr:`Outcome.TIMEOUT`) and its late result is ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias

from client.message import ReceivedMessage


class ConsumeResult(enum.Enum):
    """A listener's verdict on one message.

    ``SUCCESS`` is RocketMQ's ``CONSUME_SUCCESS`` / ``SUCCESS``; ``RETRY_LATER`` is
    ``RECONSUME_LATER`` (concurrent consumption: the message comes back later through the
    retry topic); ``SUSPEND`` is ``SUSPEND_CURRENT_QUEUE_A_MOMENT`` (orderly consumption: the
    same message is retried after ``suspend_interval``, the queue waits). In concurrent mode
    ``SUSPEND`` counts as ``RETRY_LATER`` and in orderly mode ``RETRY_LATER`` as ``SUSPEND``.
    """

    SUCCESS = "SUCCESS"
    RETRY_LATER = "RETRY_LATER"
    SUSPEND = "SUSPEND"


#: A message listener: sync (run in a worker thread) or async (run as a task).
Listener: TypeAlias = Callable[
    [ReceivedMessage], "ConsumeResult | Awaitable[ConsumeResult] | object"
]


class Outcome(enum.Enum):
    """How one listener call ended, as the consumer sees it."""

    SUCCESS = "success"
    FAILURE = "failure"
    TIMEOUT = "timeout"
    #: Not called: the consumer was shutting down when the message's turn came.
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class PushStatistics:
    """A snapshot of a push consumer (see :meth:`PushConsumer.statistics`).

    Attributes:
        cached_messages: messages fetched and not finished (waiting or being consumed).
        cached_bytes: their body bytes.
        peak_cached_messages: the most ``cached_messages`` ever was.
        active_calls: listener calls running now.
        peak_active_calls: the most listener calls that ever ran at once.
        consumed: calls that returned ``SUCCESS``.
        failed: calls that failed (result, exception or timeout).
        timed_out: calls that ran past ``consume_timeout``.
        dead_lettered: messages the client sent to the DLQ (orderly retry limit).
        assigned_queues: queues this consumer pulls from (pull mode).
    """

    cached_messages: int
    cached_bytes: int
    peak_cached_messages: int
    active_calls: int
    peak_active_calls: int
    consumed: int
    failed: int
    timed_out: int
    dead_lettered: int
    assigned_queues: int
