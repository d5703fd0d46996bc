"""Transactional sends: the vocabulary and the END_TRANSACTION request (RocketMQ's
``TransactionMQProducer``).

A producer sends a *half* message, runs its local transaction, and tells the broker to commit
or roll back. Until then no consumer sees the message; if the producer never says (it
crashed, or answered UNKNOWN), the broker asks a live producer of the same group later — its
:data:`TransactionChecker` — until one decides.

The local transaction and the checker may be plain functions or coroutine functions; they
return a :class:`TransactionState`.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from client.message import Message, ReceivedMessage, SendReceipt
from protocol.headers.transaction import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    EndTransactionRequestHeader,
)

T = TypeVar("T")


class TransactionState(enum.StrEnum):
    """How a local transaction ended (Java's ``LocalTransactionState``)."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    #: Not known yet: the broker will ask the checker later.
    UNKNOWN = "UNKNOWN"

    @property
    def wire(self) -> int:
        """END_TRANSACTION's ``commitOrRollback`` value."""
        return _WIRE[self]


_WIRE = {
    TransactionState.COMMIT: TRANSACTION_COMMIT_TYPE,
    TransactionState.ROLLBACK: TRANSACTION_ROLLBACK_TYPE,
    TransactionState.UNKNOWN: TRANSACTION_NOT_TYPE,
}

#: Runs the local transaction of a half message the broker stored (``execute(message,
#: receipt)``); an exception counts as UNKNOWN.
LocalTransaction = Callable[[Message, SendReceipt], TransactionState | Awaitable[TransactionState]]
#: Answers a broker's question about a half message whose transaction it does not know.
TransactionChecker = Callable[[ReceivedMessage], TransactionState | Awaitable[TransactionState]]


@dataclass(frozen=True, slots=True)
class TransactionReceipt:
    """A transactional send: where the half message was stored, how the local transaction
    ended, and whether the broker confirmed the decision (if not — the connection broke, the
    broker refused — it will check back, so the outcome is still safe)."""

    receipt: SendReceipt
    state: TransactionState
    confirmed: bool
    #: Why the decision was not confirmed, if it was not.
    error: str | None = None


async def resolve(result: T | Awaitable[T]) -> T:
    """The value of a callback that may be a plain function or a coroutine function."""
    if inspect.isawaitable(result):
        return await result
    return result


def end_header(
    group: str,
    *,
    queue_offset: int,
    commit_offset: int,
    state: TransactionState,
    msg_id: str,
    transaction_id: str | None,
    from_check: bool,
) -> EndTransactionRequestHeader:
    """END_TRANSACTION for the half message at ``commit_offset`` (its queue offset in the
    half topic is ``queue_offset``)."""
    return EndTransactionRequestHeader(
        producer_group=group,
        tran_state_table_offset=queue_offset,
        commit_log_offset=commit_offset,
        commit_or_rollback=state.wire,
        from_transaction_check=from_check,
        msg_id=msg_id,
        transaction_id=transaction_id,
    )
