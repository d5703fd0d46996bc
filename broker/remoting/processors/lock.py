"""LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42): queue locks for orderly consumers, the Remoting
adapter over :meth:`broker.core.admin.AdminService.lock_queues` / ``unlock_queues``.
"""

from __future__ import annotations

from collections.abc import Iterable

from broker.locks import QueueName
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.bodies.consumer import (
    LockBatchRequestBody,
    LockBatchResponseBody,
    MessageQueue,
    UnlockBatchRequestBody,
)
from protocol.command import RemotingCommand


def queue_names(mqs: Iterable[MessageQueue]) -> list[QueueName]:
    """The core's names of wire queues."""
    return [QueueName(mq.topic, mq.broker_name, mq.queue_id) for mq in mqs]


async def lock_batch(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Lock the requested queues for the client; answer the ones it now holds."""
    body = LockBatchRequestBody.from_json(cmd.body)
    granted = ctx.broker.admin.lock_queues(
        body.consumer_group, body.client_id, queue_names(body.mq_set)
    )
    held = tuple(MessageQueue(q.topic, q.broker_name, q.queue_id) for q in granted)
    return cmd.response(body=LockBatchResponseBody(held).to_json())


async def unlock_batch(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Release the client's locks on the requested queues."""
    body = UnlockBatchRequestBody.from_json(cmd.body)
    ctx.broker.admin.unlock_queues(body.consumer_group, body.client_id, queue_names(body.mq_set))
    return cmd.response()
