"""The Remoting side of :class:`broker.core.clients.ClientChannel`: a client's connection,
reached with oneway requests as RocketMQ's ``Broker2Client`` sends them (language ``JAVA``,
the broker's own opaques), dropped rather than waited for when the client reads too slowly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker.core.clients import TransactionCheck
from broker.core.offsets import OffsetReset
from broker.remoting.connection import Connection
from protocol.bodies.admin import ResetOffsetBody
from protocol.bodies.consumer import MessageQueue
from protocol.codes import RequestCode
from protocol.command import RemotingCommand, request
from protocol.headers.admin import ResetOffsetRequestHeader
from protocol.headers.client import NotifyConsumerIdsChangedRequestHeader
from protocol.headers.transaction import CheckTransactionStateRequestHeader


@dataclass(eq=False, slots=True)
class RemotingChannel:
    """One Remoting connection as the client registry sees it."""

    conn: Connection
    #: Names the queues of a reset notice (``MessageQueue.brokerName``).
    broker_name: str

    @property
    def channel_id(self) -> int:
        """The connection's id."""
        return self.conn.id

    def notify_consumer_ids_changed(self, group: str) -> bool:
        """NOTIFY_CONSUMER_IDS_CHANGED: the client rebalances ``group`` now."""
        header = NotifyConsumerIdsChangedRequestHeader(consumer_group=group)
        return self._send(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, header.to_ext())

    def notify_reset_offset(self, reset: OffsetReset, offsets: Mapping[int, int]) -> bool:
        """RESET_CONSUMER_CLIENT_OFFSET: the reset request's header, and the new offsets as a
        ``ResetOffsetBody``; Java clients move their offset store to them."""
        header = ResetOffsetRequestHeader(
            topic=reset.topic,
            group=reset.group,
            queue_id=reset.queue_id,
            offset=reset.offset,
            timestamp=reset.timestamp,
            is_force=reset.force,
        )
        body = reset_offset_body(reset.topic, self.broker_name, offsets)
        return self._send(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, header.to_ext(), body)

    def check_transaction_state(self, check: TransactionCheck) -> bool:
        """CHECK_TRANSACTION_STATE: the half's offsets and ids in the header, the half as a
        record in the body (its ``PGROUP`` names the group the producer checks for)."""
        header = CheckTransactionStateRequestHeader(
            tran_state_table_offset=check.queue_offset,
            commit_log_offset=check.commit_offset,
            msg_id=check.msg_id,
            transaction_id=check.transaction_id,
            offset_msg_id=check.offset_msg_id,
        )
        return self._send(RequestCode.CHECK_TRANSACTION_STATE, header.to_ext(), check.record)

    def _send(self, code: int, ext_fields: dict[str, str], body: bytes = b"") -> bool:
        note: RemotingCommand = request(
            code, self.conn.next_opaque(), ext_fields, body, oneway=True, language="JAVA"
        )
        return self.conn.notify_nowait(note)


def reset_offset_body(topic: str, broker_name: str, offsets: Mapping[int, int]) -> bytes:
    """``ResetOffsetBody`` JSON (fastjson's form) of queue id → offset on this broker: the
    admin's answer to a reset and the clients' notice carry the same bytes."""
    table = {MessageQueue(topic, broker_name, qid): offset for qid, offset in offsets.items()}
    return ResetOffsetBody(table).to_json()
