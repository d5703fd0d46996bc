"""LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42): queue locks for orderly consumers.

The lock table is :class:`broker.locks.RebalanceLocks` on the broker context.
"""

from __future__ import annotations

import trio

from broker.context import BrokerContext
from broker.remoting.connection import Connection
from protocol.bodies.consumer import (
    LockBatchRequestBody,
    LockBatchResponseBody,
    UnlockBatchRequestBody,
)
from protocol.command import RemotingCommand


async def lock_batch(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Lock the requested queues for the client; answer the ones it now holds."""
    body = LockBatchRequestBody.from_json(cmd.body)
    granted = ctx.rebalance_locks.try_lock(
        body.consumer_group, body.client_id, body.mq_set, trio.current_time()
    )
    return cmd.response(body=LockBatchResponseBody(tuple(granted)).to_json())


async def unlock_batch(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Release the client's locks on the requested queues."""
    body = UnlockBatchRequestBody.from_json(cmd.body)
    ctx.rebalance_locks.unlock(body.consumer_group, body.client_id, body.mq_set)
    return cmd.response()
