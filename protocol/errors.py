"""The error hierarchy. Every error carries the wire code a broker would answer with.

::

    TrimqError                      root of everything trimq raises (code, retriable)
    ├── ProtocolError               bytes or fields a peer sent are malformed
    │   ├── FrameError              framing is broken: the connection cannot continue
    │   │   └── FrameTooLargeError  a frame over the size limit (may be skippable, see ``fatal``)
    │   ├── HeaderError             a well-delimited frame whose header does not decode
    │   ├── FieldError              one named header/body field is missing or malformed
    │   ├── RecordError             a message record (or batch body) is malformed
    │   ├── ReceiptError            a pop receipt (``ExtraInfo``) is malformed
    │   └── IllegalNameError        a topic or group name breaks RocketMQ's rules
    ├── EncodeError                 a value cannot be put on the wire (caller's mistake)
    ├── RetryNameCollisionError     two (group, topic) pairs map to one V1 retry topic
    └── BrokerError                 a response code other than SUCCESS, from ``for_code``

Expected outcomes (no message yet, offset moved …) are values, not exceptions; these are for
input that is wrong. Decoders never let ``KeyError``/``struct.error``/``UnicodeDecodeError``
escape: they are mapped to a ``ProtocolError`` at the boundary.
"""

from __future__ import annotations

from typing import ClassVar

from protocol.codes import ResponseCode


class TrimqError(Exception):
    """Root of every error trimq raises.

    Attributes:
        code: the response code a broker answers with for this error.
        retriable: whether repeating the same request may succeed.
    """

    code: int = ResponseCode.SYSTEM_ERROR
    retriable: ClassVar[bool] = False

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ProtocolError(TrimqError):
    """Input from a peer is malformed. Answered with ``INVALID_PARAMETER`` by default:
    repeating the same bytes cannot succeed, so clients must not retry it."""

    code = ResponseCode.INVALID_PARAMETER
    #: True when the byte stream can no longer be trusted and the connection must close.
    fatal: bool = False


class FrameError(ProtocolError):
    """The framing itself is broken (bad length, unknown serialize type): close the connection."""

    fatal = True


class FrameTooLargeError(FrameError):
    """A frame longer than the decoder's limit.

    When the header could still be read, ``fatal`` is False: the decoder skips the rest of the
    frame and the caller can answer ``opaque`` with an error and keep the connection.
    """

    code = ResponseCode.MESSAGE_ILLEGAL

    def __init__(
        self,
        message: str,
        *,
        frame_size: int,
        limit: int,
        opaque: int | None = None,
        serialize_type: int | None = None,
        request_code: int | None = None,
        fatal: bool = True,
    ) -> None:
        super().__init__(message)
        self.frame_size = frame_size
        self.limit = limit
        self.opaque = opaque
        self.serialize_type = serialize_type
        self.request_code = request_code
        self.fatal = fatal


class HeaderError(ProtocolError):
    """A well-delimited frame whose header cannot be decoded.

    The frame has been consumed, so the stream stays in sync: the caller may answer
    ``opaque`` (when it could be recovered) with an error and go on reading.
    """

    def __init__(
        self, message: str, *, opaque: int | None = None, serialize_type: int | None = None
    ) -> None:
        super().__init__(message)
        self.opaque = opaque
        self.serialize_type = serialize_type


class FieldError(ProtocolError):
    """One field of a typed header or body is missing or malformed; ``field`` names it."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class RecordError(ProtocolError):
    """A message record, batch body or message id is malformed."""

    code = ResponseCode.MESSAGE_ILLEGAL


class ReceiptError(ProtocolError):
    """A pop receipt (``ExtraInfo``) or offset-info string is malformed."""


class IllegalNameError(ProtocolError):
    """A topic or group name breaks RocketMQ's character set or length rules."""


class EncodeError(TrimqError):
    """A value cannot be encoded in the requested wire format (the caller's mistake)."""


class RetryNameCollisionError(TrimqError):
    """Two (group, topic) pairs would share one V1 pop retry topic; refused, never mixed."""

    code = ResponseCode.ILLEGAL_OPERATION


class BrokerError(TrimqError):
    """A broker answered with a response code other than ``SUCCESS``.

    Use :func:`for_code` to get the most specific subclass for a code.
    """

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message, code=code)


class BrokerSystemError(BrokerError):
    """The broker answered ``SYSTEM_ERROR``."""

    code = ResponseCode.SYSTEM_ERROR
    retriable = True


class SystemBusyError(BrokerError):
    """The broker answered ``SYSTEM_BUSY``."""

    code = ResponseCode.SYSTEM_BUSY
    retriable = True


class RequestCodeNotSupportedError(BrokerError):
    """The broker answered ``REQUEST_CODE_NOT_SUPPORTED``."""

    code = ResponseCode.REQUEST_CODE_NOT_SUPPORTED


class FlushDiskTimeoutError(BrokerError):
    """The broker answered ``FLUSH_DISK_TIMEOUT``."""

    code = ResponseCode.FLUSH_DISK_TIMEOUT
    retriable = True


class MessageIllegalError(BrokerError):
    """The broker answered ``MESSAGE_ILLEGAL``."""

    code = ResponseCode.MESSAGE_ILLEGAL


class ServiceNotAvailableError(BrokerError):
    """The broker answered ``SERVICE_NOT_AVAILABLE``."""

    code = ResponseCode.SERVICE_NOT_AVAILABLE
    retriable = True


class NoPermissionError(BrokerError):
    """The broker answered ``NO_PERMISSION``."""

    code = ResponseCode.NO_PERMISSION
    retriable = True


class TopicNotExistError(BrokerError):
    """The broker answered ``TOPIC_NOT_EXIST``."""

    code = ResponseCode.TOPIC_NOT_EXIST
    retriable = True


class TopicExistAlreadyError(BrokerError):
    """The broker answered ``TOPIC_EXIST_ALREADY``."""

    code = ResponseCode.TOPIC_EXIST_ALREADY


class QueryNotFoundError(BrokerError):
    """The broker answered ``QUERY_NOT_FOUND``."""

    code = ResponseCode.QUERY_NOT_FOUND


class SubscriptionGroupNotExistError(BrokerError):
    """The broker answered ``SUBSCRIPTION_GROUP_NOT_EXIST``."""

    code = ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST


class InvalidParameterError(BrokerError):
    """The broker answered ``INVALID_PARAMETER``."""

    code = ResponseCode.INVALID_PARAMETER


class NoMessageError(BrokerError):
    """The broker answered ``NO_MESSAGE``."""

    code = ResponseCode.NO_MESSAGE


class PollingFullError(BrokerError):
    """The broker answered ``POLLING_FULL``."""

    code = ResponseCode.POLLING_FULL
    retriable = True


class PollingTimeoutError(BrokerError):
    """The broker answered ``POLLING_TIMEOUT``."""

    code = ResponseCode.POLLING_TIMEOUT
    retriable = True


class FlowControlError(BrokerError):
    """The broker answered ``FLOW_CONTROL``."""

    code = ResponseCode.FLOW_CONTROL
    retriable = True


class IllegalOperationError(BrokerError):
    """The broker answered ``ILLEGAL_OPERATION``."""

    code = ResponseCode.ILLEGAL_OPERATION


_BY_CODE: dict[int, type[BrokerError]] = {
    int(cls.code): cls for cls in BrokerError.__subclasses__()
}


def for_code(code: int, remark: str | None = None) -> BrokerError:
    """Build the most specific :class:`BrokerError` for a response ``code``."""
    cls = _BY_CODE.get(code, BrokerError)
    try:
        label = ResponseCode(code).name
    except ValueError:
        label = f"code {code}"
    return cls(f"{label}: {remark}" if remark else label, code=code)
