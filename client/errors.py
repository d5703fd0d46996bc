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
        └── ClientClosedError       the producer/consumer is not running

``retriable`` says whether trying again (on another broker) may help; the producer's retry
loop relies on it.
"""

from __future__ import annotations

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
