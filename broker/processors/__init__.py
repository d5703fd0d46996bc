"""Request processors, one module per family; importing this package registers them all."""

from __future__ import annotations

from broker.processors import (
    admin,
    client,
    lock,
    offsets,
    pull,
    query,
    route,
    send,
    sendback,
)

__all__ = ["admin", "client", "lock", "offsets", "pull", "query", "route", "send", "sendback"]
