"""``RemotingConnection``: the protocol state of one Remoting connection, sans-IO (h11's shape).

Theory of operation: the I/O layer feeds whatever bytes arrive to :meth:`receive_data`
(``b""`` when the peer closed its side) and calls :meth:`next_event` until it returns
:data:`NEED_DATA`; what it wants to write it gets as bytes from :meth:`send_request`,
:meth:`send_response` and :meth:`answer_malformed`. No sockets, no clocks, no tasks: the same
object serves the trio server, the anyio client, the name-server registration and the
benchmarks' raw clients, and tests drive two of them against each other in memory.

What it owns, so that no I/O loop writes it again:

* **opaques**: requests get theirs from one counter per connection (:meth:`next_opaque`);
  RocketMQ only needs an opaque to be unique among the requests still awaiting a reply on
  that connection, so the counter skips those and wraps before it leaves Java's ``int``.
* **pending replies**: every request sent without the oneway flag is pending until the
  response with its opaque arrives. That response comes out as a :class:`Response`; any other
  response (the requester gave up: :meth:`abandon`; an answer to a oneway notification that
  a client sent anyway; a duplicate) comes out as an :class:`UnsolicitedResponse`, not
  dropped, because the test clients and the broker decide differently what it means.
  :meth:`close` hands back what is still pending, so the I/O layer can fail its waiters at
  once instead of letting them time out.
* **malformed input**: a frame that was well delimited but unreadable (a bad header, a frame
  over ``max_frame_size`` whose header could be read) is a :class:`Malformed` event and the
  stream stays in sync; :meth:`answer_malformed` is what a server answers it with. Broken
  framing raises :class:`~protocol.errors.ProtocolError` from :meth:`next_event`, and keeps
  raising it (the connection is in the ERROR state for good, as in h11 and
  :class:`~protocol.frame.FrameDecoder`): nothing after it can be trusted, close the socket.

Both sides of a Remoting connection send requests (the broker notifies clients; clients
answer transaction checks), so the role changes little: it decides who answers malformed
frames (the server; a client's malformed frame is most likely a response, and answering a
response would only confuse the server).

Misuse by the caller (a response to a oneway request, a request on a closed connection, two
pending requests on one opaque) raises :class:`LocalProtocolError`, never a peer's error.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal

from protocol.codes import SerializeType
from protocol.command import FLAG_ONEWAY, FLAG_RESPONSE, RemotingCommand
from protocol.errors import (
    EncodeError,
    FrameTooLargeError,
    HeaderError,
    ProtocolError,
    TrimqError,
)
from protocol.frame import DEFAULT_MAX_FRAME_SIZE, FrameDecoder, encode_command

#: Largest opaque: Java reads it as an ``int``, and the ROCKETMQ binary header packs it so.
MAX_OPAQUE = 2**31 - 1
#: A malformed request's answer carries at most this much of the error text.
_REMARK_LIMIT = 512
_KNOWN_TYPES = frozenset(int(t) for t in SerializeType)


class LocalProtocolError(TrimqError):
    """We, not the peer, tried to break the protocol: a bug in the caller (h11's name)."""


class Role(enum.Enum):
    """Which end of the connection this object is."""

    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    """One direction's state: ``their_state`` is what the peer did, ``our_state`` what we did."""

    OPEN = "open"
    #: The peer closed cleanly (EOF at a frame boundary), or we called :meth:`close`.
    CLOSED = "closed"
    #: The peer's framing broke; only ever ``their_state``.
    ERROR = "error"


class _NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


#: :meth:`RemotingConnection.next_event` has nothing complete: feed more bytes first.
NEED_DATA: Final = _NeedData.NEED_DATA


@dataclass(frozen=True, slots=True)
class Request:
    """A request from the peer; answer it with :meth:`RemotingConnection.send_response`
    unless ``command.is_oneway``."""

    command: RemotingCommand


@dataclass(frozen=True, slots=True)
class Response:
    """The response to one of our pending requests; its opaque is no longer pending."""

    command: RemotingCommand


@dataclass(frozen=True, slots=True)
class UnsolicitedResponse:
    """A response whose opaque is not pending: its requester gave up (see
    :meth:`RemotingConnection.abandon`), it answers a oneway request, or it is a duplicate."""

    command: RemotingCommand


@dataclass(frozen=True, slots=True)
class Malformed:
    """A well-delimited frame that could not be read; the stream is still in sync.

    ``error`` is a :class:`~protocol.errors.HeaderError` or a non-fatal
    :class:`~protocol.errors.FrameTooLargeError`, carrying the opaque when it could be read.
    """

    error: ProtocolError

    @property
    def opaque(self) -> int | None:
        """The frame's opaque, when its header gave it away."""
        if isinstance(self.error, (HeaderError, FrameTooLargeError)):
            return self.error.opaque
        return None


@dataclass(frozen=True, slots=True)
class Closed:
    """The peer closed the connection at a frame boundary (no more events will come)."""


#: What :meth:`RemotingConnection.next_event` returns besides :data:`NEED_DATA`.
Event = Request | Response | UnsolicitedResponse | Malformed | Closed
_CLOSED: Final = Closed()


def _after(opaque: int) -> int:
    return opaque + 1 if opaque < MAX_OPAQUE else 1


class RemotingConnection:
    """One connection's Remoting protocol state (see the module docstring).

    Args:
        role: which end we are; a server answers malformed requests.
        max_frame_size: largest frame accepted from the peer, length field included. It also
            bounds the responses we encode: a peer with the same limit (the broker and the
            name server use one setting for both directions) would refuse anything larger.
        serialize_type: header encoding of the requests we send; ``None`` keeps each
            command's own. Responses always use their request's.
    """

    def __init__(
        self,
        role: Role,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        serialize_type: SerializeType | None = None,
    ) -> None:
        self.role = role
        self.serialize_type = serialize_type
        self._decoder = FrameDecoder(max_frame_size)
        self._pending: set[int] = set()
        self._next_opaque = 1
        self._eof = False
        self._their_state = State.OPEN
        self._our_state = State.OPEN
        self._error: ProtocolError | None = None

    def __repr__(self) -> str:
        return (
            f"<RemotingConnection {self.role.value} ours={self._our_state.value} "
            f"theirs={self._their_state.value} pending={len(self._pending)}>"
        )

    # ------------------------------------------------------------------ state
    @property
    def max_frame_size(self) -> int:
        """Largest frame accepted from the peer (and encoded as a response)."""
        return self._decoder.max_frame_size

    @property
    def their_state(self) -> State:
        """OPEN, CLOSED once :class:`Closed` was returned, ERROR once framing broke."""
        return self._their_state

    @property
    def our_state(self) -> State:
        """OPEN until :meth:`close`."""
        return self._our_state

    @property
    def pending(self) -> frozenset[int]:
        """Opaques of our requests still awaiting their response."""
        return frozenset(self._pending)

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as events (fewer than 8: no frame can be
        complete, which is how a server tells the last request of a burst)."""
        return self._decoder.buffered

    # ------------------------------------------------------------------ receiving
    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes from the peer; ``b""`` means it closed its side (EOF).

        Raises:
            LocalProtocolError: bytes after EOF (the I/O layer read past the end).
        """
        if self._eof:
            if data:
                raise LocalProtocolError("received data after EOF")
            return
        if not data:
            self._eof = True
        self._decoder.feed(data)

    def next_event(self) -> Event | Literal[_NeedData.NEED_DATA]:
        """The next event, or :data:`NEED_DATA` when no complete frame is buffered.

        Raises:
            ProtocolError: the framing is broken (including EOF mid-frame); the connection
                is in the ERROR state and raises the same error on every later call.
        """
        if self._error is not None:
            raise self._error
        if self._their_state is State.CLOSED:
            return _CLOSED
        try:
            cmd = self._decoder.next_command()
        except ProtocolError as exc:
            if exc.fatal:
                self._their_state = State.ERROR
                self._error = exc
                raise
            return Malformed(exc)
        if cmd is None:
            if self._eof:
                self._their_state = State.CLOSED
                return _CLOSED
            return NEED_DATA
        if not cmd.flag & FLAG_RESPONSE:
            return Request(cmd)
        if cmd.opaque in self._pending:
            self._pending.remove(cmd.opaque)
            return Response(cmd)
        return UnsolicitedResponse(cmd)

    # ------------------------------------------------------------------ sending
    def next_opaque(self) -> int:
        """A fresh opaque, for a request the caller builds and writes itself (a broker
        notification queued as a command, frames encoded ahead of a pipelined burst).

        Skips the opaques still pending and wraps at :data:`MAX_OPAQUE` to 1.
        """
        opaque = self._next_opaque
        while opaque in self._pending:  # bounded: at most len(pending) steps
            opaque = _after(opaque)
        self._next_opaque = _after(opaque)
        return opaque

    def send_request(self, cmd: RemotingCommand, *, oneway: bool = False) -> tuple[int, bytes]:
        """Encode ``cmd`` as our request with a fresh opaque (``cmd.opaque`` is ignored).

        Unless the request is oneway (``oneway``, or ``cmd`` already flagged so) its opaque
        is pending until the response arrives.

        Returns:
            The opaque and the frame to write.

        Raises:
            LocalProtocolError: the connection is closed, or ``cmd`` is a response.
            EncodeError: ``cmd`` cannot be encoded (nothing is then pending).
        """
        self._check_open()
        if cmd.flag & FLAG_RESPONSE:
            raise LocalProtocolError(f"send_request was given a response (code {cmd.code})")
        opaque = self.next_opaque()
        flag = cmd.flag | FLAG_ONEWAY if oneway else cmd.flag
        stype = cmd.serialize_type if self.serialize_type is None else self.serialize_type
        # Built field by field: dataclasses.replace costs several times more, per request.
        sending = RemotingCommand(
            cmd.code, opaque, flag, cmd.language, cmd.version, cmd.remark,
            cmd.ext_fields, cmd.body, stype,
        )  # fmt: skip
        data = encode_command(sending)
        if not flag & FLAG_ONEWAY:
            self._pending.add(opaque)
        return opaque, data

    def expect_response(self, opaque: int) -> None:
        """Make ``opaque`` pending for a request the caller encoded and wrote itself (with
        :meth:`next_opaque`), so that its response is matched like any other.

        Raises:
            LocalProtocolError: the connection is closed, or ``opaque`` is already pending
                (two requests could not tell their replies apart).
        """
        self._check_open()
        if opaque in self._pending:
            raise LocalProtocolError(f"opaque {opaque} already awaits a response")
        self._pending.add(opaque)

    def send_response(self, request: RemotingCommand, reply: RemotingCommand) -> bytes:
        """Encode ``reply`` as the response to the peer's ``request``.

        The reply goes out on the request's opaque, flagged as a response, in the request's
        serialize type, whatever the handler built (``request.response(...)`` already does
        all three, and is then encoded as is).

        Raises:
            LocalProtocolError: ``request`` is oneway or a response: nothing may answer it.
            EncodeError: ``reply`` cannot be encoded or exceeds ``max_frame_size``; the
                caller still owes the request an answer (a plain error, say).
        """
        if request.flag & (FLAG_ONEWAY | FLAG_RESPONSE):
            raise LocalProtocolError(
                f"request {request.opaque} (code {request.code}) takes no response"
            )
        if (
            reply.opaque != request.opaque
            or not reply.flag & FLAG_RESPONSE
            or reply.serialize_type is not request.serialize_type
        ):
            reply = reply._replace(
                opaque=request.opaque,
                flag=reply.flag | FLAG_RESPONSE,
                serialize_type=request.serialize_type,
            )
        return encode_command(reply, max_frame_size=self.max_frame_size)

    def answer_malformed(self, event: Malformed) -> bytes | None:
        """What a server answers a malformed request with, or ``None`` when nothing can be
        answered (no opaque recovered; or we are the client).

        The answer is the error's response code (``INVALID_PARAMETER`` for a bad header,
        ``MESSAGE_ILLEGAL`` for an oversize frame) on the recovered opaque, in the frame's
        serialize type when that is one we know (else JSON), with the error text as remark:
        the client learns which request failed and why, and is not left waiting for it.
        """
        error = event.error
        opaque = event.opaque
        if self.role is not Role.SERVER or opaque is None:
            return None
        assert isinstance(error, (HeaderError, FrameTooLargeError))  # opaque says so
        stype = error.serialize_type
        reply = RemotingCommand(
            code=error.code,
            opaque=opaque,
            flag=FLAG_RESPONSE,
            remark=str(error)[:_REMARK_LIMIT],
            serialize_type=SerializeType(stype) if stype in _KNOWN_TYPES else SerializeType.JSON,
        )
        try:
            return encode_command(reply)
        except EncodeError:  # an opaque the peer's header type held but this one cannot
            return None

    # ------------------------------------------------------------------ ending
    def abandon(self, opaque: int) -> bool:
        """Stop waiting for ``opaque``'s response (its requester timed out or was cancelled);
        if it still comes it is an :class:`UnsolicitedResponse`. False if it was not pending.
        """
        if opaque in self._pending:
            self._pending.remove(opaque)
            return True
        return False

    def close(self) -> tuple[int, ...]:
        """We are done with the connection (the peer closed it, its framing broke, or we
        close it): no more requests may be sent. Idempotent.

        Returns:
            The opaques still pending, in order, now forgotten: their responses will never
            come, so the I/O layer should fail their waiters.
        """
        self._our_state = State.CLOSED
        pending = tuple(sorted(self._pending))
        self._pending.clear()
        return pending

    def _check_open(self) -> None:
        if self._our_state is not State.OPEN or self._their_state is not State.OPEN:
            raise LocalProtocolError(
                f"cannot send a request: ours {self._our_state.value}, "
                f"theirs {self._their_state.value}"
            )
