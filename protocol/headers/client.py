"""Client bookkeeping family: UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38) and the
broker-to-client NOTIFY_CONSUMER_IDS_CHANGED (40).

HEART_BEAT (34) has no header fields: everything is in its JSON body (``protocol.bodies``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.headers._base import Header, meta


@dataclass(frozen=True, slots=True, kw_only=True)
class UnregisterClientRequestHeader(Header):
    """``UnregisterClientRequestHeader``: a client leaves one producer or consumer group.

    Clients send one request per group, naming either ``producer_group`` or
    ``consumer_group``; the C++ clients also send the other one as an empty string, so
    treat ``""`` like absent.

    Attributes:
        client_id: the client id from its heartbeats (wire name ``clientID``).
        producer_group: the producer group it leaves.
        consumer_group: the consumer group it leaves.
    """

    client_id: str = field(metadata=meta(wire="clientID"))
    producer_group: str | None = None
    consumer_group: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GetConsumerListByGroupRequestHeader(Header):
    """``GetConsumerListByGroupRequestHeader``: the client ids of a group, for rebalancing."""

    consumer_group: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NotifyConsumerIdsChangedRequestHeader(Header):
    """``NotifyConsumerIdsChangedRequestHeader``: broker → client, "rebalance ``consumer_group``
    now" (sent oneway)."""

    consumer_group: str
