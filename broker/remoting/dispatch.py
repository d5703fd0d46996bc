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

import enum
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

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


class Later(enum.Enum):
    """The type of :data:`LATER`."""

    LATER = "LATER"


#: What a quick handler returns for a request that must wait after all.
LATER: Final = Later.LATER
#: ``def quick(ctx, conn, cmd)``: the reply of a request that may wait (a long poll) when it
#: need not, found without waiting, else :data:`LATER` (its :data:`Handler` then runs it
#: from the start in a task of its own, so the quick one must leave nothing half done).
QuickHandler = Callable[[Ctx, "Connection", RemotingCommand], RemotingCommand | Later | None]
#: ``def group(ctx, conn, cmds)``: the replies, in order, of consecutive requests of one code
#: that one read brought, run together without waiting (one journal write for a burst of
#: acks); each reply as its handler alone would give it (None: no reply).
GroupHandler = Callable[
    [Ctx, "Connection", Sequence[RemotingCommand]], list[RemotingCommand | None]
]

#: ``def store(ctx, conn, cmd)``: in SYNC mode, the part of a storing request that needs no
#: wait — its message appended now, in the reader, so a burst is stored in the order it
#: arrived — as a token for its ``settle``; None, with nothing done, when the request needs
#: its :data:`Handler` after all (a delayed or half message: run from the start in a task).
StoreHandler = Callable[[Ctx, "Connection", RemotingCommand], object | None]
#: ``async def settle(ctx, conn, stored)``: the replies, in order, of the ``(request,
#: token)`` pairs a burst's ``store`` calls gave, after one wait for all of them (their
#: fsync): a reply goes out only once its message is durable, as its handler alone would
#: answer it.
SettleHandler = Callable[
    [Ctx, "Connection", Sequence[tuple[RemotingCommand, object]]],
    Awaitable[list[RemotingCommand]],
]


class Registry(Generic[Ctx]):
    """Request code → handler for one kind of server."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handlers: dict[int, Handler[Ctx]] = {}
        #: Codes whose handler may wait for long (long polls): always run as their own task.
        self.parking: set[int] = set()
        #: Codes whose handler stores messages: in SYNC mode they wait for an fsync.
        self.storing: set[int] = set()
        #: Parking codes whose request may be answered at once, by these.
        self.quick: dict[int, QuickHandler[Ctx]] = {}
        #: Codes whose consecutive requests in one read run together, by these.
        self.groups: dict[int, GroupHandler[Ctx]] = {}
        #: Storing codes whose consecutive requests wait for one fsync together (SYNC mode).
        self.durable: dict[int, tuple[StoreHandler[Ctx], SettleHandler[Ctx]]] = {}

    def register(
        self,
        codes: Iterable[int],
        handler: Handler[Ctx],
        *,
        parks: bool = False,
        stores: bool = False,
        quick: QuickHandler[Ctx] | None = None,
        group: GroupHandler[Ctx] | None = None,
        durable: tuple[StoreHandler[Ctx], SettleHandler[Ctx]] | None = None,
    ) -> None:
        """Serve ``codes`` with ``handler``; ``parks``: it may hold the request (a long
        poll); ``stores``: it waits for durability in SYNC mode; ``quick``: answers a parking
        request at once when it need not wait (:meth:`answer_now`); ``group``: answers
        consecutive requests of one code together (:meth:`answer_group`); ``durable``: in
        SYNC mode, stores consecutive requests of one code now and waits for them together
        (:meth:`store_group`).

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
            if quick is not None:
                self.quick[int(code)] = quick
            if group is not None:
                self.groups[int(code)] = group
            if durable is not None:
                self.durable[int(code)] = durable

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
            except Exception as exc:  # a handler bug must cost one request, not the connection
                reply = self._failed(cmd, exc)
        return None if cmd.is_oneway else reply

    def answer_now(
        self, ctx: Ctx, conn: Connection, cmd: RemotingCommand
    ) -> RemotingCommand | Later | None:
        """The reply of ``cmd`` from its quick handler, without waiting (errors become error
        replies as in :meth:`dispatch`), or :data:`LATER`: it has none, or the request must
        wait (then :meth:`dispatch` it, in a task)."""
        quick = self.quick.get(cmd.code)
        if quick is None:
            return LATER
        try:
            reply = quick(ctx, conn, cmd)
        except Exception as exc:
            reply = self._failed(cmd, exc)
        if reply is LATER:
            return LATER
        return None if cmd.is_oneway else reply

    def answer_group(
        self, ctx: Ctx, conn: Connection, cmds: Sequence[RemotingCommand]
    ) -> list[RemotingCommand | None]:
        """The replies of ``cmds`` (consecutive requests of one code with a group handler),
        in order, None for a oneway one; a handler that raises answers every one of them
        as :meth:`dispatch` answers a handler's error."""
        try:
            replies = self.groups[cmds[0].code](ctx, conn, cmds)
        except Exception as exc:
            replies = [self._failed(cmd, exc) for cmd in cmds]
        return [None if cmd.is_oneway else r for cmd, r in zip(cmds, replies, strict=True)]

    def store_group(
        self,
        ctx: Ctx,
        conn: Connection,
        cmds: Sequence[RemotingCommand],
        refuse: Callable[[RemotingCommand], RemotingCommand | None] = lambda _: None,
    ) -> tuple[int, Coroutine[Any, Any, list[RemotingCommand | None]]]:
        """Store consecutive requests of one code with a ``durable`` pair now, in order,
        until one needs its handler: how many were taken (the rest must be dispatched each
        in a task), and the awaitable of the taken ones' replies, in order (None for a
        oneway one; close it unawaited when none was taken). A request that ``refuse``
        answers, or whose store raised, gets that answer (as :meth:`dispatch` would give
        it) with the others, after their wait."""
        store, settle = self.durable[cmds[0].code]
        answers: list[RemotingCommand | None] = []  # None: stored, answered by settle
        stored: list[tuple[RemotingCommand, object]] = []
        for cmd in cmds:
            answer = refuse(cmd)
            if answer is None:
                try:
                    token = store(ctx, conn, cmd)
                except Exception as exc:
                    answer = self._failed(cmd, exc)
                else:
                    if token is None:
                        break
                    stored.append((cmd, token))
            answers.append(answer)
        return len(answers), self._settled(ctx, conn, settle, cmds, answers, stored)

    async def _settled(
        self,
        ctx: Ctx,
        conn: Connection,
        settle: SettleHandler[Ctx],
        cmds: Sequence[RemotingCommand],
        answers: list[RemotingCommand | None],
        stored: list[tuple[RemotingCommand, object]],
    ) -> list[RemotingCommand | None]:
        replies: list[RemotingCommand] = []
        if stored:
            try:
                replies = await settle(ctx, conn, stored)
            except Exception as exc:  # a bug: every stored one answered as dispatch would
                replies = [self._failed(cmd, exc) for cmd, _ in stored]
        settled = iter(replies)
        out: list[RemotingCommand | None] = []
        for cmd, answer in zip(cmds, answers, strict=False):  # cmds: the taken ones first
            reply = next(settled) if answer is None else answer
            out.append(None if cmd.is_oneway else reply)
        return out

    def _failed(self, cmd: RemotingCommand, exc: Exception) -> RemotingCommand:
        """The reply to a request whose handler raised ``exc`` (called in the ``except``
        block: a bug is logged with its traceback)."""
        if isinstance(exc, TrimqError):  # EncodeError included
            return cmd.response(exc.code, str(exc))
        _log.exception("processor failed", server=self.name, code=cmd.code,
                       opaque=cmd.opaque)  # fmt: skip
        return cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
