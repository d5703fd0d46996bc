"""The one table from the core's error codes (the Remoting ``ResponseCode`` catalogue every
:class:`~protocol.errors.TrimqError` carries) to v2 ``Code`` values, after the proxy's
``ResponseBuilder``; and the response ``Status`` built from it."""

from __future__ import annotations

from typing import Any, Final

from broker.store.api import PutStatus
from protocol.codes import ResponseCode
from protocol.errors import IllegalNameError, TrimqError
from protocol.grpc import schema
from protocol.grpc.codes import Code
from protocol.grpc.wire import text_field, varint

_BY_RESPONSE_CODE: Final = {
    ResponseCode.SUCCESS: Code.OK,
    ResponseCode.SYSTEM_BUSY: Code.TOO_MANY_REQUESTS,
    ResponseCode.POLLING_FULL: Code.TOO_MANY_REQUESTS,
    ResponseCode.FLOW_CONTROL: Code.TOO_MANY_REQUESTS,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED: Code.NOT_IMPLEMENTED,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: Code.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    ResponseCode.NO_PERMISSION: Code.FORBIDDEN,
    ResponseCode.SUBSCRIPTION_PARSE_FAILED: Code.ILLEGAL_FILTER_EXPRESSION,
    ResponseCode.INVALID_PARAMETER: Code.BAD_REQUEST,
    ResponseCode.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    ResponseCode.NO_MESSAGE: Code.INVALID_RECEIPT_HANDLE,
    ResponseCode.QUERY_NOT_FOUND: Code.NOT_FOUND,
    ResponseCode.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
}

_BY_PUT_STATUS: Final = {
    PutStatus.PUT_OK: Code.OK,
    PutStatus.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    # Sync replication's acknowledgements timed out (the message is stored on the master):
    # the proxy's mapping of FLUSH_SLAVE_TIMEOUT. Too few replicas in sync is a BrokerError
    # with SLAVE_NOT_AVAILABLE, refused before the append (HA_NOT_AVAILABLE above).
    PutStatus.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
}


def code_of(response_code: int | None) -> Code:
    """The v2 code of a core error code (INTERNAL_SERVER_ERROR for the rest, as the proxy)."""
    if response_code is None:
        return Code.INTERNAL_SERVER_ERROR
    try:
        return _BY_RESPONSE_CODE[ResponseCode(response_code)]
    except (ValueError, KeyError):
        return Code.INTERNAL_SERVER_ERROR


def code_of_put(status: PutStatus) -> Code:
    """The v2 code of a refused put."""
    return _BY_PUT_STATUS.get(status, Code.INTERNAL_SERVER_ERROR)


def code_of_error(exc: TrimqError, *, name_code: Code = Code.BAD_REQUEST) -> Code:
    """The v2 code of a core error; an illegal name gets ``name_code`` (ILLEGAL_TOPIC …)."""
    if isinstance(exc, IllegalNameError):
        return name_code
    return code_of(exc.code)


def status(code: int, message: str = "") -> Any:
    """A v2 ``Status``."""
    out = schema.Status()
    out.code = code
    out.message = message or Code(code).name
    return out


def status_bytes(code: int, message: str = "") -> bytes:
    """:func:`status`'s serialised body (what ``status(code, message).SerializeToString()``
    gives), written directly; the plain OK status is a constant."""
    if code == Code.OK and not message:
        return _OK_BYTES
    return _status_body(code, message)


def _status_body(code: int, message: str) -> bytes:
    text = text_field(b"\x12", message or Code(code).name)
    return b"\x08" + varint(code) + text if code else text


_OK_BYTES: Final = _status_body(Code.OK, "")
