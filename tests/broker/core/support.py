"""A complete broker without any front end, for tests of the core services: the same
:func:`broker.core.broker.open_broker` the broker process runs, on a temporary directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.core.broker import Broker, open_broker
from broker.pop.reader import PopRequest, PopResult
from broker.store.api import MessageToStore, PutStatus
from broker.topics import PERM_READ_WRITE, TopicConfig
from tests.broker.client import TEST_SETTINGS

#: The port the core's broker puts into its address (nothing listens there).
PORT = 10911


@asynccontextmanager
async def core_broker(data_dir: Path, **settings: Any) -> AsyncIterator[Broker]:
    """Open a broker on ``data_dir`` with ``settings`` over :data:`TEST_SETTINGS`."""
    config = BrokerConfig(
        host="127.0.0.1", port=0, data_dir=data_dir, **{**TEST_SETTINGS, **settings}
    )
    async with open_broker(config, port=PORT) as broker:
        yield broker


def create(broker: Broker, topic: str, queues: int = 1) -> None:
    """Create ``topic`` with ``queues`` read and write queues."""
    broker.admin.create_topic(
        TopicConfig(topic, read_queue_nums=queues, write_queue_nums=queues, perm=PERM_READ_WRITE)
    )


def put(broker: Broker, topic: str, body: bytes, queue_id: int = 0) -> int:
    """Store one message (dispatched at once in ASYNC mode); its queue offset."""
    result = broker.store.put_nowait(MessageToStore(topic, queue_id, body))
    assert result.status is PutStatus.PUT_OK, result
    return result.queue_offset


def pop(broker: Broker, group: str, topic: str, queue_id: int = 0) -> PopResult:
    """One pop of up to 32 messages, 60 s invisible, without parking."""
    request = PopRequest(group, topic, queue_id, max_nums=32, invisible_ms=60_000)
    return broker.pop.pop_nowait(request, broker.clock.now_ms())
