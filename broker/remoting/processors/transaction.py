"""END_TRANSACTION (37): the Remoting adapter over
:class:`broker.core.transactions.TransactionService` (the rules live there).

Producers send it without the oneway flag and do not wait for the answer; as RocketMQ's
``EndTransactionProcessor``, an UNKNOWN resolution gets no answer at all, a commit or rollback
gets SUCCESS (or the error).
"""

from __future__ import annotations

from broker.core.transactions import EndRequest, Resolution
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.command import RemotingCommand
from protocol.headers.transaction import EndTransactionRequestHeader


async def end_transaction(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand | None:
    """Commit or roll back the half message at the header's commit-log offset."""
    header = EndTransactionRequestHeader.from_ext(cmd.ext_fields)
    request = EndRequest(
        group=header.producer_group,
        commit_offset=header.commit_log_offset,
        queue_offset=header.tran_state_table_offset,
        resolution=Resolution(header.commit_or_rollback),
        from_check=header.from_transaction_check,
        msg_id=header.msg_id,
    )
    outcome = await ctx.broker.transactions.end(request)
    if request.resolution is Resolution.UNKNOWN:
        return None
    return cmd.response(remark=outcome.remark or None)
