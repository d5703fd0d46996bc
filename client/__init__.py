"""trimq client libraries on anyio (docs/design.md §6): they run under asyncio and trio.

``from client import Producer, SimpleConsumer, Message, ClientConfig``; blocking versions
with the same names are in :mod:`client.sync`. Subscriptions take tag expressions (``str``)
or :class:`FilterExpression` (``FilterExpression.sql("n > 5")`` for SQL92).
"""

from client.config import ClientConfig
from client.errors import (
    ClientClosedError,
    ClientError,
    ConnectError,
    ConnectionLostError,
    NoRouteError,
    RequestTimeoutError,
    SendFailedError,
    SubscriptionRefusedError,
)
from client.filters import FilterExpression, FilterType
from client.message import Message, ReceivedMessage, SendReceipt, SendStatus
from client.producer import Producer
from client.push import ConsumeResult, PushConsumer
from client.simple_consumer import SimpleConsumer
from client.transaction import TransactionReceipt, TransactionState

__all__ = [
    "ClientClosedError",
    "ClientConfig",
    "ClientError",
    "ConnectError",
    "ConnectionLostError",
    "ConsumeResult",
    "FilterExpression",
    "FilterType",
    "Message",
    "NoRouteError",
    "Producer",
    "PushConsumer",
    "ReceivedMessage",
    "RequestTimeoutError",
    "SendFailedError",
    "SendReceipt",
    "SendStatus",
    "SimpleConsumer",
    "SubscriptionRefusedError",
    "TransactionReceipt",
    "TransactionState",
]
