"""Consumer offsets of a pull-mode push consumer, kept locally and persisted to the brokers
(RocketMQ's ``RemoteBrokerOffsetStore``): updated as messages finish (only forwards),
piggy-backed on every pull, written with UPDATE_CONSUMER_OFFSET every ``persist_interval``
and when a queue is given up or the consumer stops.
"""

from __future__ import annotations

import structlog

from client.instance import ClientInstance
from client.push import pull_api
from protocol.bodies.consumer import MessageQueue
from protocol.errors import TrimqError
from protocol.naming import is_retry_topic

_log = structlog.get_logger("trimq.client.push")


class OffsetStore:
    """Local offsets of the queues a consumer owns, persisted to their brokers."""

    def __init__(self, instance: ClientInstance, group: str, *, consume_from: str) -> None:
        self.instance = instance
        self.group = group
        self.consume_from = consume_from
        self._offsets: dict[MessageQueue, int] = {}
        self._persisted: dict[MessageQueue, int] = {}

    def get(self, mq: MessageQueue) -> int | None:
        """The local offset of ``mq``, ``None`` if unknown."""
        return self._offsets.get(mq)

    def update(self, mq: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Move ``mq``'s offset (forward only unless ``increase_only`` is false)."""
        current = self._offsets.get(mq)
        if current is None or not increase_only or offset > current:
            self._offsets[mq] = offset

    async def start_offset(self, mq: MessageQueue) -> int:
        """Where to start pulling ``mq``: the group's committed offset, else ``consume_from``
        (the group's retry topic always from its first message, as Java does, so retries
        sent back before the queue was assigned are not skipped).

        Raises:
            TrimqError: the broker could not answer.
        """
        committed = await pull_api.query_offset(self.instance, self.group, mq)
        if committed is not None and committed >= 0:
            self._offsets[mq] = self._persisted[mq] = committed
            return committed
        first = self.consume_from == "first" or is_retry_topic(mq.topic)
        start = await pull_api.queue_offset(self.instance, mq, first=first)
        # Not marked persisted: the next persist writes it, so a restart resumes here
        # instead of computing "last" again and skipping what arrived in between.
        self._offsets[mq] = start
        return start

    async def persist(self, mq: MessageQueue) -> None:
        """Write ``mq``'s offset to its broker if it moved (failures are logged)."""
        offset = self._offsets.get(mq)
        if offset is None or self._persisted.get(mq) == offset:
            return
        try:
            await pull_api.update_offset(self.instance, self.group, mq, offset)
        except TrimqError as exc:
            _log.warning("offset persist failed", queue=str(mq), error=str(exc))
            return
        self._persisted[mq] = offset

    async def persist_all(self) -> None:
        """Persist every queue's offset."""
        for mq in list(self._offsets):
            await self.persist(mq)

    def remove(self, mq: MessageQueue) -> None:
        """Forget ``mq`` (after its last persist)."""
        self._offsets.pop(mq, None)
        self._persisted.pop(mq, None)
