"""Request dispatch: a registry keyed by request code, one module per request family.

A handler is ``async def handle(ctx, conn, cmd) -> RemotingCommand | None``; ``None`` means
"no reply" (only for oneway requests). Families register themselves with :func:`processor`;
:func:`dispatch` maps unknown codes to ``REQUEST_CODE_NOT_SUPPORTED`` and errors to codes:
a :class:`~protocol.errors.TrimqError` carries its own code (a malformed header field is
``INVALID_PARAMETER`` naming the field), anything else is a ``SYSTEM_ERROR`` and is logged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from broker.logs import get_logger
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import EncodeError, TrimqError

if TYPE_CHECKING:
    from broker.connection import Connection
    from broker.context import BrokerContext

Handler = Callable[
    ["BrokerContext", "Connection", RemotingCommand], Awaitable[RemotingCommand | None]
]

PROCESSORS: dict[int, Handler] = {}
#: Codes whose handler may wait for long (long polls): always run as their own task.
PARKING: set[int] = set()
#: Codes whose handler stores messages: in SYNC mode they wait for an fsync.
STORING: set[int] = set()
_log = get_logger("dispatch")


def processor(
    *codes: int, parks: bool = False, stores: bool = False
) -> Callable[[Handler], Handler]:
    """Register the decorated handler for ``codes``; ``parks``: it may hold the request (a
    long poll); ``stores``: it waits for durability in SYNC mode."""

    def register(handler: Handler) -> Handler:
        for code in codes:
            if code in PROCESSORS and PROCESSORS[code] is not handler:
                raise ValueError(f"request code {code} already has a processor")
            PROCESSORS[int(code)] = handler
            if parks:
                PARKING.add(int(code))
            if stores:
                STORING.add(int(code))
        return handler

    return register


def may_wait(code: int, *, sync: bool) -> bool:
    """Whether a request with ``code`` may wait long enough to need a task of its own."""
    return code in PARKING or (sync and code in STORING)


async def dispatch(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand | None:
    """Run the processor of ``cmd.code`` and return its reply (None: send nothing)."""
    handler = PROCESSORS.get(cmd.code)
    reply: RemotingCommand | None
    if handler is None:
        reply = cmd.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
        )
    else:
        try:
            reply = await handler(ctx, conn, cmd)
        except (TrimqError, EncodeError) as exc:
            reply = cmd.response(exc.code, str(exc))
        except Exception as exc:  # a handler bug must cost one request, not the connection
            _log.exception("processor failed", code=cmd.code, opaque=cmd.opaque)
            reply = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
    return None if cmd.is_oneway else reply
