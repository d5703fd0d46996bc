"""Transaction family: END_TRANSACTION (37, producer → broker) and CHECK_TRANSACTION_STATE
(39, broker → producer).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.headers._base import Header, Long, meta

#: ``MessageSysFlag`` transaction types, the values of ``commitOrRollback``.
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
_COMMIT_OR_ROLLBACK = (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE)


@dataclass(frozen=True, slots=True, kw_only=True)
class EndTransactionRequestHeader(Header):
    """``EndTransactionRequestHeader``: commit or roll back a half message.

    Attributes:
        topic: the half message's topic; only newer clients send it (for ACL).
        producer_group: the producer's group.
        tran_state_table_offset: the half message's consume-queue offset.
        commit_log_offset: the half message's commit-log offset.
        commit_or_rollback: 0 unknown, 8 commit, 12 rollback (Java's ``checkFields``
            rejects any other value, and so do we).
        from_transaction_check: the answer to a CHECK_TRANSACTION_STATE (always sent).
        msg_id: the half message's id.
        transaction_id: the transaction id returned by the send.
    """

    topic: str | None = None
    producer_group: str
    tran_state_table_offset: Long
    commit_log_offset: Long
    commit_or_rollback: int = field(metadata=meta(choices=_COMMIT_OR_ROLLBACK))
    from_transaction_check: bool = False
    msg_id: str
    transaction_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckTransactionStateRequestHeader(Header):
    """``CheckTransactionStateRequestHeader``: the broker asks a producer about a half message.

    Attributes:
        tran_state_table_offset: the half message's consume-queue offset.
        commit_log_offset: its commit-log offset.
        msg_id: its unique id (``UNIQ_KEY``).
        transaction_id: its transaction id.
        offset_msg_id: its offset-based id.
    """

    tran_state_table_offset: Long
    commit_log_offset: Long
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None
