"""Looking after a :class:`~durably.DiskStore`'s cache: what it holds (per task, with the hit
rate of runs), and removing entries by age, by size or by task.

Only the cache is touched. The journals (the ``runs``, ``steps`` and ``events`` tables) are
never evicted, so a run whose cache entries are removed still replays its finished steps from
its own journal; a later run executes those steps again, or finds them in the cache once
another run wrote them back. The key records (the ``keys`` table: what each key was made of)
are kept as well: :meth:`Task.explain <durably.Task.explain>` compares a call against them,
and says when an entry with exactly that key was removed.

The entries' times and sizes come from diskcache's own table (``store_time``, and the value's
length, in its SQLite database or in its file); their tasks from the key records. An entry
written without a key record (after a crash, a run puts back the entries its last attempt had
not yet written) is counted under :data:`UNKNOWN_TASK`.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from durably._store.disk.rows import row_hash
from durably._store.disk.store import DiskStore
from durably.exceptions import NotFoundError
from durably.store import match_tasks as matching

__all__ = ["UNKNOWN_TASK", "cache_stats", "clear", "entry_bytes", "match_tasks", "prune",
           "task_identities"]

#: The task an entry is counted under when its key has no key record.
UNKNOWN_TASK = "(unknown task)"

_CHUNK = 500  # entries deleted per diskcache transaction


@dataclasses.dataclass(frozen=True, slots=True)
class _Entry:
    key: Any
    stored: float
    size: int


def _entries(store: DiskStore) -> list[_Entry]:
    """Every entry of the cache, oldest first: its key, when it was stored (seconds since the
    epoch) and its size (bytes: the value's length in the database, or its file's size)."""
    cache = store.cache
    rows = cache._sql(
        f"SELECT key, raw, store_time, {_ENTRY_SIZE} FROM Cache ORDER BY store_time, rowid"
    ).fetchall()
    disk = cache.disk
    return [_Entry(disk.get(key, bool(raw)), float(stored or 0.0), int(size or 0))
            for key, raw, stored, size in rows]


#: an entry's own size: its value's length in the database, or its file's size
_ENTRY_SIZE = "CASE WHEN filename IS NULL THEN COALESCE(length(value), 0) ELSE size END"


def entry_bytes(store: DiskStore) -> int:
    """The cache entries' own sizes summed, in bytes (as :func:`cache_stats` counts them).

    Example:
        >>> import tempfile
        >>> store = DiskStore(tempfile.mkdtemp())
        >>> store.cache_put("k1", b"abc"); store.cache_put("k2", b"de")
        >>> entry_bytes(store) == cache_stats(store)["entry_bytes"]
        True
    """
    (total,) = store.cache._sql(f"SELECT COALESCE(sum({_ENTRY_SIZE}), 0) FROM Cache").fetchone()
    return int(total)


def _key_tasks(store: DiskStore) -> dict[str, str]:
    """Cache key → task identity, from the key records."""
    rows = store._db().execute("SELECT cache_key, task FROM keys").fetchall()
    return {key: task for key, task in rows}


def _tasks_of(store: DiskStore, keys: list[str]) -> dict[str, str]:
    """Cache key → task identity for these keys, from their key records (found by kid)."""
    found: dict[str, str] = {}
    db = store._db()
    for i in range(0, len(keys), 500):
        chunk = keys[i:i + 500]
        kids = [row_hash(key) for key in chunk]
        found.update(db.execute(
            f"SELECT cache_key, task FROM keys WHERE kid IN ({', '.join('?' * len(kids))})",
            kids))
    return found


def task_identities(store: DiskStore) -> list[str]:
    """The identities (``module:name``) of the tasks that have key records, sorted."""
    rows = store._db().execute("SELECT DISTINCT task FROM keys ORDER BY task").fetchall()
    return [task for (task,) in rows]


def match_tasks(store: DiskStore, task: str) -> list[str]:
    """The task identities ``task`` names (see :func:`durably.store.match_tasks`)."""
    return matching(task_identities(store), task)


def _step_counts(store: DiskStore, key_tasks: dict[str, str]) -> Counter[tuple[str, str]]:
    """``(task identity, status) → steps`` for the ``ran`` and ``cached`` steps of every
    run's journal whose cache key has a key record (``key_tasks``, from :func:`_key_tasks`):
    the steps whose results were cached. Steps of ``cache=False`` tasks, and steps that
    depended on an answer to ``interrupt()``, were never cached, so they are neither hits nor
    misses."""
    rows = store._db().execute(
        "SELECT cache_key, status, count(*) FROM steps "
        "WHERE status IN ('ran', 'cached') AND cache_key != '' GROUP BY 1, 2"
    )
    counts: Counter[tuple[str, str]] = Counter()
    for key, status, n in rows:
        task = key_tasks.get(key)
        if task is not None:
            counts[(task, status)] += n
    return counts


def _rate(cached: int, ran: int) -> float | None:
    return cached / (cached + ran) if cached + ran else None


def cache_stats(store: DiskStore) -> dict[str, Any]:
    """What the store's cache holds, per task, and how often runs found their steps in it.

    Args:
        store: The store (its cache and journal are read, not changed).

    Returns:
        A dict: ``path`` (the store directory), ``entries`` (int), ``bytes`` (the cache's
        volume on disk, int bytes, as diskcache counts it), ``entry_bytes`` (the entries'
        own sizes summed, int bytes), ``size_limit`` (int bytes, or None), ``oldest`` and
        ``newest`` (when the oldest and newest entries were stored, seconds since the epoch,
        or None), ``runs`` (int), ``ran`` and ``cached`` (steps of every run's journal that
        executed, or were served from the cache, counting only steps whose results are
        cached: not those of ``cache=False`` tasks or of tasks that asked a person),
        ``hit_rate`` (``cached / (cached + ran)``, or None without such steps),
        and ``tasks``: one dict per task (``task``, ``entries``, ``bytes``, ``ran``,
        ``cached``, ``hit_rate``), largest first. Calls made outside runs are not journaled,
        so they count in the entries but not in the hit rate.

    Raises:
        StoreError: the store cannot be opened or read.

    Example:
        >>> import tempfile
        >>> stats = cache_stats(DiskStore(tempfile.mkdtemp()))
        >>> stats["entries"], stats["tasks"], stats["hit_rate"]
        (0, [], None)
    """
    with store._translate("journal.sqlite3", "read the journal"):
        key_tasks = _key_tasks(store)
        steps = _step_counts(store, key_tasks)
        runs = int(store._db().execute("SELECT count(*) FROM runs").fetchone()[0])
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    with store._translate("cache", "read the cache"):
        cache = store.cache
        volume = int(cache.volume())
        oldest, newest = cache._sql(
            "SELECT min(store_time), max(store_time) FROM Cache").fetchone()
        # rows as they come, no object per entry: a store of 1,000,000 entries is read in
        # about a second (a key stored pickled, not raw, is none of durably's: unknown task)
        unseen: list[tuple[str, int]] = []
        for key, raw, size in cache._sql(f"SELECT key, raw, {_ENTRY_SIZE} FROM Cache"):
            task = key_tasks.get(key) if raw and type(key) is str else UNKNOWN_TASK
            if task is None:  # no key record when they were read: looked for again below
                unseen.append((key, size or 0))
                continue
            counts[task] = counts.get(task, 0) + 1
            sizes[task] = sizes.get(task, 0) + (size or 0)
    # a process writing meanwhile writes its cache entries first and their key records after:
    # entries newer than the key records read above are looked up again, in the records as
    # they are now (else a running job's latest batch would read as of no task)
    with store._translate("journal.sqlite3", "read the journal"):
        found = _tasks_of(store, [key for key, _ in unseen])
    for key, size in unseen:
        task = found.get(key, UNKNOWN_TASK)
        counts[task] = counts.get(task, 0) + 1
        sizes[task] = sizes.get(task, 0) + size
    names = set(counts) | {task for task, _ in steps}
    tasks: list[dict[str, Any]] = [
        {
            "task": task,
            "entries": counts.get(task, 0),
            "bytes": sizes.get(task, 0),
            "ran": steps[(task, "ran")],
            "cached": steps[(task, "cached")],
            "hit_rate": _rate(steps[(task, "cached")], steps[(task, "ran")]),
        }
        for task in names
    ]
    tasks.sort(key=lambda t: (-t["bytes"], -t["entries"], t["task"]))
    ran = sum(n for (_, status), n in steps.items() if status == "ran")
    cached = sum(n for (_, status), n in steps.items() if status == "cached")
    return {
        "path": str(store.path),
        "entries": sum(counts.values()),
        "bytes": volume,
        "entry_bytes": sum(sizes.values()),
        "size_limit": store.size_limit,
        "oldest": float(oldest) if oldest is not None else None,
        "newest": float(newest) if newest is not None else None,
        "runs": runs,
        "ran": ran,
        "cached": cached,
        "hit_rate": _rate(cached, ran),
        "tasks": tasks,
    }


def delete_keys(store: DiskStore, keys: Iterable[Any]) -> int:
    """Delete cache entries by key, a few hundred per transaction; the number removed (an
    entry another process removed meanwhile is not counted)."""
    cache = store.cache
    batch: list[Any] = []
    removed = 0

    def flush() -> int:
        store._discard_cache_leftover()
        try:
            with cache.transact(retry=True):
                store._local.cache_tx = True
                try:
                    done = sum(1 for key in batch if cache.delete(key, retry=True))
                finally:
                    store._local.cache_tx = False
        except BaseException:
            store._discard_cache_leftover()  # (Ctrl-C inside diskcache, after its BEGIN)
            raise
        store.forget_memo(batch)  # after: a read between could bring a key back
        batch.clear()
        return done

    with store._translate("cache", "delete cache entries"):
        for key in keys:
            batch.append(key)
            if len(batch) >= _CHUNK:
                removed += flush()
        if batch:
            removed += flush()
    return removed


def _empty_volume(store: DiskStore) -> int:
    """What the cache's index takes on disk with no entry: a page for each of its tables
    and indexes, the header page and, when it frees pages as it goes (auto_vacuum), a
    pointer-map page."""
    sql = store.cache._sql
    page = int(sql("PRAGMA page_size").fetchone()[0])
    trees = int(sql("SELECT count(*) FROM sqlite_master WHERE rootpage > 0").fetchone()[0])
    vacuum = int(sql("PRAGMA auto_vacuum").fetchone()[0]) != 0
    return page * (trees + 1 + vacuum)


def prune(store: DiskStore, older_than: float | None = None, max_size: int | None = None, *,
          max_entries: int | None = None, task: str | None = None,
          dry_run: bool = False) -> int:
    """Remove cache entries by age, by size and by count, oldest first; journals are never
    touched.

    Args:
        store: The store.
        older_than: Remove the entries stored more than this many seconds ago. None: no
            age limit.
        max_size: Then remove the oldest remaining entries until the cache's volume on disk
            is at most this many bytes (with ``task``: until that task's entries take at
            most this many bytes). None: no size limit; 0: every entry.
        max_entries: Then remove the oldest remaining entries until at most this many are
            left (with ``task``: of that task). None: no limit.
        task: Only this task's entries: its identity (``module:name``) or its name.
        dry_run: Count what would be removed, and remove nothing.

    Returns:
        How many entries were removed (with ``dry_run``: would be).

    Raises:
        ValueError: every limit is None, or one is negative, or ``max_size`` is below what
            the cache's files take with no entry (its index: removing every entry would not
            reach it; 0 removes them all).
        NotFoundError: ``task`` names no task that ever wrote to this cache.
        StoreError: the store cannot be opened, read or written.

    Example:
        >>> import tempfile
        >>> store = DiskStore(tempfile.mkdtemp())
        >>> store.cache_put("k1", b"old"); store.cache_put("k2", b"new")
        >>> prune(store, max_size=0, dry_run=True), prune(store, older_than=3600)
        (2, 0)
        >>> prune(store, max_entries=1), len(store.cache)
        (1, 1)
    """
    if older_than is None and max_size is None and max_entries is None:
        raise ValueError("prune() needs older_than (seconds), max_size (bytes) or max_entries, "
                         "or several of them")
    if any(v is not None and v < 0 for v in (older_than, max_size, max_entries)):
        raise ValueError(f"prune() limits must not be negative, got older_than={older_than!r}, "
                         f"max_size={max_size!r}, max_entries={max_entries!r}")
    matched: set[str] | None = None
    if task is not None:
        with store._translate("journal.sqlite3", "read the journal"):
            matched = _matched(store, task)
            key_tasks = _key_tasks(store)
    removed = 0
    for _ in range(4):  # the volume counts SQLite pages: check again after a round
        with store._translate("cache", "read the cache"):
            entries = _entries(store)
            volume = int(store.cache.volume())
        if matched is not None:  # (a task's entries: their own sizes, not the files')
            entries = [e for e in entries
                       if isinstance(e.key, str) and key_tasks.get(e.key) in matched]
            volume = sum(e.size for e in entries)
        else:
            floor = _empty_volume(store)
            if max_size and max_size < floor and removed == 0:
                raise ValueError(
                    f"a cache size limit of {max_size:,} bytes is below what the cache takes "
                    f"with no entry ({floor:,} bytes: its index); removing every entry would "
                    "not reach it. Fix: give a larger size, or 0 to remove every entry "
                    "(durably cache clear does the same).")
        doomed: list[Any] = []
        rest = entries
        if older_than is not None:
            cutoff = time.time() - older_than
            doomed = [e.key for e in entries if e.stored < cutoff]
            rest = [e for e in entries if e.stored >= cutoff]
            volume -= sum(e.size for e in entries if e.stored < cutoff)
            older_than = None  # done in the first round
        if max_entries is not None and len(rest) > max_entries:
            over = len(rest) - max_entries
            doomed += [e.key for e in rest[:over]]
            volume -= sum(e.size for e in rest[:over])
            rest = rest[over:]
            max_entries = None  # done in the first round
        if max_size is not None:
            for e in rest:
                if volume <= max_size:
                    break
                doomed.append(e.key)
                volume -= max(e.size, 1)
        if not doomed:
            break
        if dry_run:
            return removed + len(doomed)
        removed += delete_keys(store, doomed)
        if max_size is None or matched is not None or store.cache.volume() <= max_size:
            break
    return removed


def _matched(store: DiskStore, task: str) -> set[str]:
    """The task identities ``task`` names, else a :class:`NotFoundError` listing those the
    cache has."""
    matched = set(match_tasks(store, task))
    if not matched:
        known = task_identities(store)
        shown = ", ".join(known[:10]) + (f" (+{len(known) - 10} more)"
                                          if len(known) > 10 else "")
        raise NotFoundError(
            f"no task {task!r} ever wrote to the cache at {store.path}. Fix: name a task "
            "by its identity (module:name) or its name"
            + (f"; tasks: {shown}" if known else "; the cache has no task entries") + ".")
    return matched


def clear(store: DiskStore, task: str | None = None, *, dry_run: bool = False) -> int:
    """Remove every cache entry, or a task's entries; journals are never touched.

    Args:
        store: The store.
        task: Only this task's entries: its identity (``module:name``) or its name (every
            task of that name). Entries without a key record belong to no task: only
            clearing everything removes them. Default: every entry.
        dry_run: Count what would be removed, and remove nothing.

    Returns:
        How many entries were removed (with ``dry_run``: would be).

    Raises:
        NotFoundError: no task of that identity or name ever wrote to this cache.
        StoreError: the store cannot be opened, read or written.

    Example:
        >>> import tempfile
        >>> store = DiskStore(tempfile.mkdtemp())
        >>> store.cache_put("k1", b"a"); store.cache_put("k2", b"b")
        >>> clear(store, dry_run=True), clear(store), clear(store)
        (2, 2, 0)
    """
    if task is None:
        if dry_run:
            with store._translate("cache", "read the cache"):
                return len(store.cache)
        with store._translate("cache", "clear the cache"):
            try:
                return int(store.cache.clear(retry=True))
            finally:
                store.forget_memo()
    with store._translate("journal.sqlite3", "read the journal"):
        matched = _matched(store, task)
        key_tasks = _key_tasks(store)
    with store._translate("cache", "read the cache"):
        keys = [e.key for e in _entries(store)
                if isinstance(e.key, str) and key_tasks.get(e.key) in matched]
    if dry_run:
        return len(keys)
    return delete_keys(store, keys)
