"""Naming the other end of a connection, for both front ends' logs and bookkeeping."""

from __future__ import annotations

import trio


def peer_of(stream: trio.abc.Stream) -> str:
    """``host:port`` of the other end, ``?`` when the stream is no socket or cannot say."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "?"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


def host_of(peer: str) -> str:
    """The address part of a ``host:port`` peer name ("" when there is none)."""
    host, sep, _ = peer.rpartition(":")
    return host if sep else ""


class PeerCounts:
    """Connections open per source address, for a server's per-address cap.

    A stream that is no socket (``peer_of`` says ``?``: the tests' memory streams) has no
    address and is never counted or refused.
    """

    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    def admit(self, peer: str, limit: int | None) -> bool:
        """Count a new connection from ``peer``; False (and not counted) when its address
        already has ``limit`` open."""
        host = host_of(peer)
        if not host:
            return True
        count = self._open.get(host, 0)
        if limit is not None and count >= limit:
            return False
        self._open[host] = count + 1
        return True

    def release(self, peer: str) -> None:
        """A connection that :meth:`admit` counted ended."""
        host = host_of(peer)
        count = self._open.get(host, 0)
        if count <= 1:
            self._open.pop(host, None)
        else:
            self._open[host] = count - 1

    def __len__(self) -> int:
        """Addresses with a connection open."""
        return len(self._open)
