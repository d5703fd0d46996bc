"""trimq's sans-IO RocketMQ Remoting protocol: bytes in, commands out; one connection's state
(opaques, pending replies, malformed-input answers) in :class:`RemotingConnection`.

Standard library and msgpack only: no sockets, no trio, no anyio (checked by import-linter).
"""

from __future__ import annotations

from protocol.codes import LanguageCode as LanguageCode
from protocol.codes import RequestCode as RequestCode
from protocol.codes import ResponseCode as ResponseCode
from protocol.codes import SerializeType as SerializeType
from protocol.command import FLAG_ONEWAY as FLAG_ONEWAY
from protocol.command import FLAG_RESPONSE as FLAG_RESPONSE
from protocol.command import RemotingCommand as RemotingCommand
from protocol.command import request as request
from protocol.connection import NEED_DATA as NEED_DATA
from protocol.connection import Closed as Closed
from protocol.connection import Event as Event
from protocol.connection import LocalProtocolError as LocalProtocolError
from protocol.connection import Malformed as Malformed
from protocol.connection import RemotingConnection as RemotingConnection
from protocol.connection import Request as Request
from protocol.connection import Response as Response
from protocol.connection import Role as Role
from protocol.connection import State as State
from protocol.connection import UnsolicitedResponse as UnsolicitedResponse
from protocol.errors import ProtocolError as ProtocolError
from protocol.errors import TrimqError as TrimqError
from protocol.frame import DEFAULT_MAX_FRAME_SIZE as DEFAULT_MAX_FRAME_SIZE
from protocol.frame import FrameDecoder as FrameDecoder
from protocol.frame import encode_command as encode_command

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "NEED_DATA",
    "Closed",
    "Event",
    "FrameDecoder",
    "LanguageCode",
    "LocalProtocolError",
    "Malformed",
    "ProtocolError",
    "RemotingCommand",
    "RemotingConnection",
    "Request",
    "RequestCode",
    "Response",
    "ResponseCode",
    "Role",
    "SerializeType",
    "State",
    "TrimqError",
    "UnsolicitedResponse",
    "encode_command",
    "request",
]
