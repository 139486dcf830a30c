"""Durable state and the append-only event log; the only code that talks SQL."""

from sluice.store.base import (
    DuplicateError,
    EventRecord,
    NewEvent,
    NodeRecord,
    QueueRecord,
    Store,
    StoreInUse,
    StoreNotOpened,
    StoreUnavailable,
    TenantRecord,
    UsageRow,
)
from sluice.store.memory import MemoryStore

__all__ = [
    "DuplicateError",
    "EventRecord",
    "MemoryStore",
    "NewEvent",
    "NodeRecord",
    "QueueRecord",
    "Store",
    "StoreInUse",
    "StoreNotOpened",
    "StoreUnavailable",
    "TenantRecord",
    "UsageRow",
]


def open_store(url: str) -> Store:
    """A SqlStore for a SQLAlchemy URL (sqlite:///path or postgresql://...), or memory://."""
    if url == "memory://":
        return MemoryStore()
    from sluice.store.sql import SqlStore

    return SqlStore(url)
