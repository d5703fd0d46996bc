"""Routes across a cluster, as the gRPC front end answers them.

A standalone broker answers QueryRoute and QueryAssignment with its own queues at its own
gRPC endpoint. In a cluster (``namesrv_addr`` set) a topic's queues may live on several
brokers; the official 5.x clients talk to each queue's broker at the endpoint the route names
(the proxy's "local" mode, where every broker runs its own proxy), so the route must list
every broker's queues with that broker's gRPC endpoint. Where the route comes from is given to
the service (:class:`ClusterRoutes`, built by the application over the name servers): this
module only names the shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class PeerQueues:
    """One broker's queues of a topic, and where its gRPC front end listens."""

    broker_name: str
    host: str
    port: int
    #: RocketMQ's permission bits (``PERM_READ``/``PERM_WRITE``).
    perm: int
    read_queue_nums: int
    write_queue_nums: int


class ClusterRoutes(Protocol):
    """The cluster's route of a topic: every broker with a gRPC endpoint that holds queues of
    it (this one included), or None when the cluster does not know the topic or cannot be
    asked (the caller then answers from this broker alone)."""

    async def __call__(self, topic: str) -> list[PeerQueues] | None:
        """The brokers holding ``topic``'s queues, or None."""
        ...
