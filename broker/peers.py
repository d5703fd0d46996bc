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
