"""Errors the client raises, as a small hierarchy under :class:`protocol.errors.TrimqError`.

::

    TrimqError
    ├── BrokerError (protocol)       the broker answered a non-SUCCESS code (``for_code``)
    └── ClientError                  something on the client side of the wire
        ├── ConnectError            could not reach an address (or it is backing off)
        ├── ConnectionLostError     the connection closed before the reply arrived
        ├── RequestTimeoutError     no reply within the request's timeout
        ├── NoRouteError            no name server knows the topic / no usable queue
        ├── SendFailedError         every send attempt failed within the total timeout
        ├── SubscriptionRefusedError a broker refused a subscription's filter expression
        └── ClientClosedError       the producer/consumer is not running

``retriable`` says whether trying again (on another broker) may help; the producer's retry
loop relies on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from protocol.codes import ResponseCode
from protocol.errors import TrimqError


class ClientError(TrimqError):
    """Root of client-side errors."""

    code = ResponseCode.SYSTEM_ERROR


class ConnectError(ClientError):
    """An address could not be reached, or it failed recently and is backing off."""

    retriable: ClassVar[bool] = True

    def __init__(self, message: str, *, address: str) -> None:
        super().__init__(message)
        self.address = address


class ConnectionLostError(ClientError):
    """The connection closed while a reply was awaited."""

    retriable: ClassVar[bool] = True


class RequestTimeoutError(ClientError):
    """No reply arrived within the request's timeout."""

    retriable: ClassVar[bool] = True


class NoRouteError(ClientError):
    """No route for a topic: no name server knows it, or it has no usable queue."""

    code = ResponseCode.TOPIC_NOT_EXIST


class SendFailedError(ClientError):
    """Every attempt of a send failed; ``attempts`` lists ``(broker name, error)``."""

    def __init__(self, message: str, *, attempts: list[tuple[str, Exception]]) -> None:
        super().__init__(message)
        self.attempts = attempts


class ClientClosedError(ClientError):
    """The client is not running (used outside its ``async with`` block)."""


class SubscriptionRefusedError(ClientError):
    """A broker refused a subscription's filter (``SUBSCRIPTION_PARSE_FAILED``): it does not
    serve the expression's type (SQL92 on a broker run with ``--enable-property-filter
    false``, RocketMQ's ``enablePropertyFilter = false``) or cannot parse the expression.
    Repeating the request cannot succeed, so it is not retriable.

    Attributes:
        topic: the subscribed topic.
        broker: the broker name that refused.
        expression: the filter expression text.
        expression_type: ``TAG`` or ``SQL92``.
        remark: the broker's explanation.
    """

    code = ResponseCode.SUBSCRIPTION_PARSE_FAILED

    def __init__(
        self, *, topic: str, broker: str, expression: str, expression_type: str, remark: str
    ) -> None:
        super().__init__(
            f"broker {broker!r} refused the {expression_type} subscription {expression!r} "
            f"on topic {topic!r}: {remark}"
        )
        self.topic = topic
        self.broker = broker
        self.expression = expression
        self.expression_type = expression_type
        self.remark = remark


@contextmanager
def single_error() -> Iterator[None]:
    """Re-raise an exception group that holds one exception as that exception.

    A client's ``async with`` runs its start-up inside the instance's task group, which wraps
    whatever start-up raises in an exception group; callers should see the
    :class:`SubscriptionRefusedError` (or ``ConnectError`` …) itself.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        exc: BaseException = group
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if exc is group:
            raise
        raise exc from None
