"""Request processors, one module per family; importing this package registers them all."""

from __future__ import annotations

from broker.remoting.processors import (
    ack,
    admin,
    client,
    cluster,
    lock,
    offsets,
    pop,
    pull,
    query,
    route,
    send,
    sendback,
)

__all__ = [
    "ack",
    "admin",
    "client",
    "cluster",
    "lock",
    "offsets",
    "pop",
    "pull",
    "query",
    "route",
    "send",
    "sendback",
]
