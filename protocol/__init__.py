"""trimq's sans-IO RocketMQ Remoting protocol: bytes in, commands out.

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
from protocol.errors import ProtocolError as ProtocolError
from protocol.errors import TrimqError as TrimqError
from protocol.frame import DEFAULT_MAX_FRAME_SIZE as DEFAULT_MAX_FRAME_SIZE
from protocol.frame import FrameDecoder as FrameDecoder
from protocol.frame import encode_command as encode_command

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "FrameDecoder",
    "LanguageCode",
    "ProtocolError",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "SerializeType",
    "TrimqError",
    "encode_command",
    "request",
]
