"""The synchronous storage engine (docs/design.md §4): commit log, consume queues, key index,
consumer offsets, recovery. No trio here: ``broker.storage`` runs the fsyncs in threads."""

from __future__ import annotations

from broker.store.api import ArrivalListener as ArrivalListener
from broker.store.api import FlushMode as FlushMode
from broker.store.api import GetResult as GetResult
from broker.store.api import GetStatus as GetStatus
from broker.store.api import MessageToStore as MessageToStore
from broker.store.api import PutResult as PutResult
from broker.store.api import PutStatus as PutStatus
from broker.store.api import StoreClosedError as StoreClosedError
from broker.store.api import StoreCorruptError as StoreCorruptError
from broker.store.api import StoreError as StoreError
from broker.store.config import StoreConfig as StoreConfig
from broker.store.store import MessageStore as MessageStore

__all__ = [
    "ArrivalListener",
    "FlushMode",
    "GetResult",
    "GetStatus",
    "MessageStore",
    "MessageToStore",
    "PutResult",
    "PutStatus",
    "StoreClosedError",
    "StoreConfig",
    "StoreCorruptError",
    "StoreError",
]
