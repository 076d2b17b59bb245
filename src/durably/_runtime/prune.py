"""Pruning and clearing the cache from Python: :func:`prune` (``durably cache prune``) and
what :meth:`Task.clear <durably.Task.clear>` and it return, :class:`Removed`.

Only the cache is touched: journals are kept, so a run still replays the steps it finished.
They ask the store's capability ``"maintenance"`` (:class:`durably.store.Store`), which
:class:`~durably.DiskStore` and ``PostgresStore`` declare.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from durably._runtime.config import StoreLike, default_store
from durably._runtime.run import _store_of
from durably._runtime.spec import Spec
from durably.exceptions import DefinitionError, StoreError
from durably.store import Store

__all__ = ["Removed", "clear_task", "prune"]


@dataclasses.dataclass(frozen=True)
class Removed:
    """What a prune or a clear removed from the cache.

    Attributes:
        entries: How many cache entries were removed (with ``dry_run``: would be).
        bytes: The bytes the removed entries took, their own sizes, as the cache's
            statistics count a task's ``bytes``
            (:meth:`~durably.store.Store.cache_entry_bytes` before minus after, so other
            processes writing meanwhile count too; a ``DiskStore``'s files on disk may
            shrink less, as SQLite keeps the pages it freed for later entries). None with
            ``dry_run``, or when the store cannot tell (it lacks the capability
            ``"maintenance"``).

    Example:
        >>> Removed(entries=3, bytes=4096)
        Removed(entries=3, bytes=4096)
    """

    entries: int
    bytes: int | None


def _seconds(what: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise DefinitionError(f"durably.prune({what}=...) must be seconds >= 0 or a "
                         f"datetime.timedelta (30 days: datetime.timedelta(days=30)), not "
                         f"{value!r}")
    return float(value)


def _count(what: str, value: Any, unit: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DefinitionError(f"durably.prune({what}=...) must be a whole number of {unit} >= 0, "
                         f"not {value!r}")
    return value


def _maintained(store: Store, what: str) -> Store:
    if "maintenance" not in store.capabilities:
        raise StoreError(
            f"{what}: the store {store.where} ({type(store).__name__}) cannot prune or clear "
            "its cache: it does not declare the capability \"maintenance\" (its "
            f"capabilities: {sorted(store.capabilities) or 'none'}). Fix: use a store that "
            "does (durably.DiskStore, or a PostgresStore), or remove one task's entries with "
            "task.clear(), which every store supports.")
    return store


def prune(*, older_than: float | datetime.timedelta | None = None,
          max_size: int | None = None, max_entries: int | None = None,
          task: Any = None, store: StoreLike = None, dry_run: bool = False) -> Removed:
    """Remove cache entries by age, count and size, oldest first (``durably cache prune``,
    from Python). Journals are kept, so runs still replay their finished steps; the next
    call of a removed entry executes.

    Entries stored more than ``older_than`` ago go first; then the oldest of the rest until
    at most ``max_entries`` are left; then the oldest until the cache takes at most
    ``max_size`` bytes. With ``task``, only that task's entries are looked at, and the
    limits count that task's entries alone (``max_size``: their own sizes).

    Args:
        older_than: Seconds (or a :class:`datetime.timedelta`): remove the entries stored
            longer ago than that.
        max_size: Bytes: then remove the oldest entries until the cache (or the task's
            entries) take at most that much (0: every entry).
        max_entries: Then remove the oldest entries until at most this many are left.
        task: Only this task's entries: the task itself, its name or its identity
            (``module:name``).
        store: The store. Default: the configured store.
        dry_run: Count what would be removed; remove nothing.

    Returns:
        A :class:`Removed` (``.entries``, ``.bytes``).

    Raises:
        DefinitionError: no limit was given, or one is negative or of the wrong type, or
            ``task`` is not a task or a name.
        ValueError: ``max_size`` is below what a DiskStore's cache takes with no entry.
        NotFoundError: ``task`` never wrote to this store's cache.
        StoreError: the store lacks the capability ``"maintenance"`` (a ``MemoryStore``),
            or cannot be read or written.

    Example:
        >>> import durably, tempfile
        >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
        >>> @durably.task
        ... def square(x):
        ...     return x * x
        >>> [square(x) for x in range(5)]
        [0, 1, 4, 9, 16]
        >>> durably.prune(max_entries=2, task=square).entries
        3
        >>> durably.prune(older_than=3600, dry_run=True)
        Removed(entries=0, bytes=None)
        >>> durably.configure()
    """
    age = _seconds("older_than", older_than)
    size = _count("max_size", max_size, "bytes")
    count = _count("max_entries", max_entries, "entries")
    if age is None and size is None and count is None:
        raise DefinitionError("durably.prune() needs older_than (seconds), max_size (bytes) or "
                         "max_entries, or several: durably.prune(older_than=30 * 86400)")
    name: str | None = None
    if task is not None:
        spec = getattr(task, "spec", None)
        if isinstance(task, str):
            name = task
        elif isinstance(spec, Spec) and spec.kind == "task":
            name = spec.identity
        else:
            raise DefinitionError(f"durably.prune(task=...) takes a task, its name or its "
                             f"module:name, not {task!r}")
    st = _maintained(_store_of(store), "durably.prune()")
    before = None if dry_run else st.cache_entry_bytes()
    entries = st.prune(age, size, max_entries=count, task=name, dry_run=dry_run)
    return Removed(entries, None if before is None else max(0, before - st.cache_entry_bytes()))


def clear_task(spec: Spec) -> Removed:
    """Remove the cache entries of the task ``spec`` describes (see :meth:`Task.clear
    <durably.Task.clear>`)."""
    from durably._runtime.context import live_run

    ctx = live_run()
    if ctx is not None:  # inside a run: its store (the task's calls use it), its queue too
        store = ctx.store
        ctx.flush_cache()  # the entries its cheap steps queued: written now, then removed
    else:
        store = spec.store or default_store()
    measured = "maintenance" in store.capabilities
    before = store.cache_entry_bytes() if measured else None
    entries = int(store.clear_task(spec.identity))
    return Removed(entries, None if before is None else max(0, before - store.cache_entry_bytes()))
