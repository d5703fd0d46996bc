"""Request dispatch: a registry keyed by request code, one module per request family.

A handler is ``async def handle(ctx, conn, cmd) -> RemotingCommand | None``; ``None`` means
"no reply" (only for oneway requests). Each server builds its own :class:`Registry` from an
explicit table (the broker's in ``broker.remoting.processors``, the name server's in
``broker.namesrv.processors``). :meth:`Registry.dispatch` maps unknown codes to
``REQUEST_CODE_NOT_SUPPORTED`` and errors to codes: a :class:`~protocol.errors.TrimqError`
carries its own code (a malformed header field is ``INVALID_PARAMETER`` naming the field),
anything else is a ``SYSTEM_ERROR`` and is logged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Generic, TypeVar

from broker.logs import get_logger
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import TrimqError

if TYPE_CHECKING:
    from broker.remoting.connection import Connection

Ctx = TypeVar("Ctx")
#: ``async def handle(ctx, conn, cmd)``, generic in the server's context type.
Handler = Callable[[Ctx, "Connection", RemotingCommand], Awaitable[RemotingCommand | None]]
_log = get_logger("dispatch")


class Registry(Generic[Ctx]):
    """Request code → handler for one kind of server."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handlers: dict[int, Handler[Ctx]] = {}
        #: Codes whose handler may wait for long (long polls): always run as their own task.
        self.parking: set[int] = set()
        #: Codes whose handler stores messages: in SYNC mode they wait for an fsync.
        self.storing: set[int] = set()

    def register(
        self,
        codes: Iterable[int],
        handler: Handler[Ctx],
        *,
        parks: bool = False,
        stores: bool = False,
    ) -> None:
        """Serve ``codes`` with ``handler``; ``parks``: it may hold the request (a long
        poll); ``stores``: it waits for durability in SYNC mode.

        Raises:
            ValueError: a code already has another handler (a table with a duplicate row).
        """
        for code in codes:
            if code in self.handlers and self.handlers[code] is not handler:
                raise ValueError(f"{self.name}: request code {code} already has a processor")
            self.handlers[int(code)] = handler
            if parks:
                self.parking.add(int(code))
            if stores:
                self.storing.add(int(code))

    def may_wait(self, code: int, *, sync: bool) -> bool:
        """Whether a request with ``code`` may wait long enough to need a task of its own."""
        return code in self.parking or (sync and code in self.storing)

    async def dispatch(
        self, ctx: Ctx, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | None:
        """Run the processor of ``cmd.code`` and return its reply (None: send nothing)."""
        handler = self.handlers.get(cmd.code)
        reply: RemotingCommand | None
        if handler is None:
            reply = cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported"
            )
        else:
            try:
                reply = await handler(ctx, conn, cmd)
            except TrimqError as exc:  # EncodeError included
                reply = cmd.response(exc.code, str(exc))
            except Exception as exc:  # a handler bug must cost one request, not the connection
                _log.exception("processor failed", server=self.name, code=cmd.code,
                               opaque=cmd.opaque)  # fmt: skip
                reply = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        return None if cmd.is_oneway else reply
