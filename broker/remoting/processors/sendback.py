"""CONSUMER_SEND_MSG_BACK (36): a classic consumer hands back a message it failed to
consume — the Remoting adapter over :meth:`broker.core.send.SendService.send_back` (the rules,
retry topic, delay schedule and DLQ, live there)."""

from __future__ import annotations

from broker.core.send import SendBackRequest
from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.command import RemotingCommand
from protocol.headers.send import ConsumerSendMsgBackRequestHeader


async def send_back(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Re-queue a failed message on the group's retry topic, or dead-letter it."""
    header = ConsumerSendMsgBackRequestHeader.from_ext(cmd.ext_fields)
    await ctx.broker.sends.send_back(
        SendBackRequest(
            group=header.group,
            commit_offset=header.offset,
            delay_level=header.delay_level,
            max_reconsume_times=header.max_reconsume_times,
            origin_msg_id=header.origin_msg_id,
        )
    )
    return cmd.response()
