"""Helpers for testing code that uses durably.

:class:`MemoryStore` keeps the cache and the journals in memory: fast, isolated, gone with
the process. It passes the same conformance suite as :class:`~durably.DiskStore`.

:class:`StoreConformance` is that suite: a pytest base class a store's author subclasses
(``make_store(path)`` returns a new store) to run every behaviour durably relies on against
their store. It is imported on first use (it needs pytest; the rest of this module does
not).

Example:
    >>> import durably
    >>> from durably.testing import MemoryStore
    >>> store = MemoryStore()
    >>> @durably.entrypoint(store=store)
    ... def greet(name):
    ...     return "hi " + name
    >>> greet("ada"), len(store.list_runs())
    ('hi ada', 1)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durably._store.memory import MemoryStore

# the records a store works with, importable from here as in durably 0.1 (their home is
# durably.store)
from durably.store import EventRecord, KeyRecord, Owner, RunRecord, StepRecord  # noqa: F401

if TYPE_CHECKING:  # (imported on first use at run time: see __getattr__)
    from durably.testing._conformance import StoreConformance as StoreConformance

__all__ = ["MemoryStore", "StoreConformance"]


def __getattr__(name: str) -> Any:
    """``StoreConformance``, imported on first use: it imports pytest, which code that only
    uses :class:`MemoryStore` need not have."""
    if name == "StoreConformance":
        from durably.testing._conformance import StoreConformance

        return StoreConformance
    raise AttributeError(f"module 'durably.testing' has no attribute {name!r}")
