"""Request processors, one module per family; importing this package registers them all."""

from __future__ import annotations

from broker.processors import admin, client, lock, route, send

__all__ = ["admin", "client", "lock", "route", "send"]
