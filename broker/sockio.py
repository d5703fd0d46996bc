"""A plain TCP connection read and written with single non-blocking syscalls.

Why not the stream's ``receive_some`` / ``send_all``: trio's socket calls yield to the
scheduler after every call that succeeded without waiting (``cancel_shielded_checkpoint``),
and go through a conflict detector, an error-translating context manager and a memoryview
per call. With one request in flight that is two scheduler rounds per request beside the
work itself (py-spy: ~15 % of a send's broker CPU, docs/benchmarks.md). Here a read waits
for readability only when the socket is empty and yields once when it did not wait (others
still get their turn: the reader of a connection whose client never pauses cannot starve
the rest); a write takes what the socket takes now, and the caller hands any rest to the
stream's ``send_all``, which waits for the socket to drain.

Only for a :class:`trio.SocketStream` (:func:`raw_socket`): TLS and memory streams keep
their own calls. Errors are those of the stream API: :class:`trio.BrokenResourceError` for a
broken connection, :class:`trio.ClosedResourceError` for a closed socket.
"""

from __future__ import annotations

import os

import trio


def raw_socket(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under a plain TCP stream; None for TLS, memory and wrapping streams."""
    return stream.socket if type(stream) is trio.SocketStream else None


class SocketReader:
    """Reads a plain TCP socket (see the module docstring).

    After a read that took less than it asked for, the socket most likely has nothing left
    (a client waiting for its answer): the next read waits for readability first instead of
    finding out with a failed read (~2 µs a call); if bytes came meanwhile, the wait returns
    at the next scheduler pass."""

    def __init__(self, sock: trio.socket.SocketType, max_bytes: int) -> None:
        self.sock = sock
        self.max_bytes = max_bytes
        self._drained = False

    async def receive_some(self) -> bytes:
        """The next bytes from the peer, b"" at its end (``receive_some``'s contract).

        Raises:
            trio.BrokenResourceError: the connection broke.
            trio.ClosedResourceError: the socket was closed here.
        """
        sock = self.sock
        waited = self._drained
        if waited:
            if sock.fileno() < 0:
                raise trio.ClosedResourceError("the socket was closed")
            await trio.lowlevel.wait_readable(sock)
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        while True:  # bounded: each round but the last waits until the socket is readable
            fd = sock.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("the socket was closed")
            try:
                data = os.read(fd, self.max_bytes)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                waited = True
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"read failed: {exc}") from exc
            self._drained = len(data) < self.max_bytes
            if not waited:  # shielded: the bytes are read, they must not be lost
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data


def send_now(sock: trio.socket.SocketType, data: bytes) -> int:
    """Write what the socket takes without waiting; how many bytes (0 when it is full).

    Raises:
        trio.BrokenResourceError: the connection broke.
        trio.ClosedResourceError: the socket was closed here.
    """
    fd = sock.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the socket was closed")
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        raise trio.BrokenResourceError(f"write failed: {exc}") from exc
