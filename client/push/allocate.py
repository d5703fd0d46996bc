"""Client-side queue allocation for pull mode (RocketMQ's ``AllocateMessageQueueAveragely``).

Every consumer of the group sorts the same queue list and the same client-id list, so each
computes the same split without talking to the others: client *i* gets a contiguous block of
``len(queues) // len(clients)`` queues, and the first ``len(queues) % len(clients)`` clients
one more; clients beyond the number of queues get nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from protocol.bodies.consumer import MessageQueue


def queue_sort_key(mq: MessageQueue) -> tuple[str, str, int]:
    """Java's ``MessageQueue.compareTo``: topic, then broker name, then queue id."""
    return (mq.topic, mq.broker_name, mq.queue_id)


def allocate_averagely(
    client_id: str, queues: Iterable[MessageQueue], client_ids: Iterable[str]
) -> list[MessageQueue]:
    """The queues ``client_id`` owns among ``client_ids`` (empty if it is not among them)."""
    mqs: Sequence[MessageQueue] = sorted(set(queues), key=queue_sort_key)
    cids = sorted(set(client_ids))
    if client_id not in cids or not mqs:
        return []
    index = cids.index(client_id)
    mod = len(mqs) % len(cids)
    if len(mqs) <= len(cids):
        size = 1
    elif mod > 0 and index < mod:
        size = len(mqs) // len(cids) + 1
    else:
        size = len(mqs) // len(cids)
    start = index * size if mod > 0 and index < mod else index * size + mod
    return list(mqs[start : start + min(size, len(mqs) - start)]) if start < len(mqs) else []
