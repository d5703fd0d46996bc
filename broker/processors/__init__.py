"""Request processors, one module per family; importing this package registers them all."""

from __future__ import annotations

from broker.processors import client, route, send

__all__ = ["client", "route", "send"]
