"""Push consumer: a listener gets the messages; see :class:`PushConsumer`."""

from __future__ import annotations

from client.push.consumer import PushConsumer as PushConsumer
from client.push.types import ConsumeResult as ConsumeResult
from client.push.types import Listener as Listener
from client.push.types import PushStatistics as PushStatistics

__all__ = ["ConsumeResult", "Listener", "PushConsumer", "PushStatistics"]
