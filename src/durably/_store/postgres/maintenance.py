"""Looking after a PostgreSQL store (the capability ``"maintenance"``): cache statistics,
pruning, clearing, collecting blobs no row refers to, and setting a run's damaged journal
rows aside."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from durably.exceptions import NotFoundError
from durably.store import _open_value, match_tasks

if TYPE_CHECKING:
    from durably._store.postgres.store import PostgresStore

__all__ = ["cache_stats", "clear", "collect_values", "large_value_bytes", "prune",
           "repair_run"]

log = logging.getLogger("durably")

#: the task an entry is counted under when its key has no key record (as DiskStore's)
UNKNOWN_TASK = "(unknown task)"


def cache_stats(store: PostgresStore) -> dict[str, Any]:
    """What the cache holds, per task, and how often runs found their steps in it: the
    dict :meth:`durably.DiskStore.cache_stats` returns (``path`` is the store's URL, its
    password hidden; ``bytes`` and ``entry_bytes`` both the entries' sizes summed)."""
    sql = store._sql
    entries, size, oldest, newest = store._one("read the cache", sql(
        "SELECT count(*), coalesce(sum(size), 0), min(stored), max(stored) FROM {s}.cache"))
    runs = store._one("read the journal", sql("SELECT count(*) FROM {s}.runs"))[0]
    per_task: dict[str, dict[str, Any]] = {}
    for task, count, total in store._read("read the cache", sql(
            "SELECT coalesce(k.task, %s), count(*), coalesce(sum(c.size), 0) FROM {s}.cache c "
            "LEFT JOIN {s}.keys k ON k.cache_key = c.key GROUP BY 1"), (UNKNOWN_TASK,)):
        per_task[task] = {"task": task, "entries": int(count), "bytes": int(total), "ran": 0,
                          "cached": 0}
    for task, status, count in store._read("read the journal", sql(
            "SELECT k.task, s.status, count(*) FROM {s}.steps s JOIN {s}.keys k ON "
            "k.cache_key = s.cache_key WHERE s.status IN ('ran', 'cached') GROUP BY 1, 2")):
        entry = per_task.setdefault(task, {"task": task, "entries": 0, "bytes": 0, "ran": 0,
                                           "cached": 0})
        entry[status] += int(count)
    for entry in per_task.values():
        seen = entry["ran"] + entry["cached"]
        entry["hit_rate"] = entry["cached"] / seen if seen else None
    ran = sum(e["ran"] for e in per_task.values())
    cached = sum(e["cached"] for e in per_task.values())
    return {
        "path": store.where, "entries": int(entries), "bytes": int(size),
        "entry_bytes": int(size), "size_limit": None, "oldest": oldest, "newest": newest,
        "runs": int(runs), "ran": ran, "cached": cached,
        "hit_rate": cached / (ran + cached) if ran + cached else None,
        "tasks": sorted(per_task.values(), key=lambda e: (-e["bytes"], e["task"])),
    }


def prune(store: PostgresStore, older_than: float | None, max_size: int | None, *,
          max_entries: int | None = None, task: str | None = None,
          dry_run: bool = False) -> int:
    """Remove cache entries stored more than ``older_than`` seconds ago, then the oldest
    until at most ``max_entries`` are left and the entries take at most ``max_size`` bytes
    (as a DiskStore does); with ``task``, only that task's entries, counted and sized
    alone. Returns how many. Then the blobs no row refers to any more (not written in the
    last hour) are collected.

    Raises:
        ValueError: every limit is None, or one is negative.
        NotFoundError: ``task`` names no task that ever wrote to the cache.
    """
    if older_than is None and max_size is None and max_entries is None:
        raise ValueError("prune() needs older_than (seconds), max_size (bytes) or max_entries, "
                         "or several of them")
    if any(v is not None and v < 0 for v in (older_than, max_size, max_entries)):
        raise ValueError(f"prune() limits must not be negative, got older_than={older_than!r}, "
                         f"max_size={max_size!r}, max_entries={max_entries!r}")
    if task is not None:
        tasks = _tasks_named(store, task)
        rows = store._read("read the cache", store._sql(
            "SELECT c.key, c.size, c.stored FROM {s}.cache c JOIN {s}.keys k ON k.cache_key = "
            "c.key WHERE k.task = ANY(%s) ORDER BY c.stored, c.key"), (tasks,))
    else:
        rows = store._read("read the cache", store._sql(
            "SELECT key, size, stored FROM {s}.cache ORDER BY stored, key"))
    doomed: list[str] = []
    rest = [(key, int(size)) for key, size, _stored in rows]
    if older_than is not None:
        cutoff = time.time() - older_than
        doomed = [key for key, _size, stored in rows if stored < cutoff]
        rest = [(key, int(size)) for key, size, stored in rows if stored >= cutoff]
    if max_entries is not None and len(rest) > max_entries:
        over = len(rest) - max_entries
        doomed += [key for key, _size in rest[:over]]
        rest = rest[over:]
    if max_size is not None:
        total = sum(size for _key, size in rest)
        for key, size in rest:
            if total <= max_size:
                break
            doomed.append(key)
            total -= size
    if dry_run:
        return len(doomed)
    removed = store.cache_delete(doomed) if doomed else 0
    collect_values(store)
    return removed


def _tasks_named(store: PostgresStore, task: str) -> list[str]:
    """The task identities ``task`` names, else a :class:`NotFoundError`."""
    tasks = match_tasks(store.task_identities(), task)
    if not tasks:
        raise NotFoundError(
            f"no task named {task!r} has entries in the cache of {store.where}. Fix: the "
            "task's name or module:name, as `durably cache stats` lists them.")
    return tasks


def clear(store: PostgresStore, task: str | None, *, dry_run: bool = False) -> int:
    """Remove every cache entry, or those of one task (its identity or name); returns how
    many.

    Raises:
        NotFoundError: no task of that name ever wrote to the cache.
    """
    if task is None:
        if dry_run:
            return int(store._one("read the cache", store._sql(
                "SELECT count(*) FROM {s}.cache"))[0])
        return store._write("clear the cache", store._sql("DELETE FROM {s}.cache"))
    tasks = _tasks_named(store, task)
    if dry_run:
        return int(store._one("read the cache", store._sql(
            "SELECT count(*) FROM {s}.cache c JOIN {s}.keys k ON k.cache_key = c.key WHERE "
            "k.task = ANY(%s)"), (tasks,))[0])
    return sum(store.clear_task(t) for t in tasks)


def _referenced(store: PostgresStore) -> set[str]:
    rows = store._read("read the journal", store._sql(
        "SELECT blob FROM {s}.cache WHERE blob IS NOT NULL UNION "
        "SELECT blob FROM {s}.steps WHERE blob IS NOT NULL UNION "
        "SELECT blob FROM {s}.events WHERE blob IS NOT NULL UNION "
        "SELECT args_blob FROM {s}.runs WHERE args_blob IS NOT NULL UNION "
        "SELECT result_blob FROM {s}.runs WHERE result_blob IS NOT NULL UNION "
        "SELECT blob FROM {s}.set_aside WHERE blob IS NOT NULL"))
    return {row[0] for row in rows}


def large_value_bytes(store: PostgresStore) -> int:
    """Bytes the blob store holds (0 without one)."""
    if store.blobs is None:
        return 0
    return sum(size for _name, size, _when in store.blobs.listing())


def collect_values(store: PostgresStore, grace: float = 3600.0) -> tuple[int, int]:
    """Remove blobs no row refers to and not written in the last ``grace`` seconds (a blob
    is written before its row: a younger one may be waiting for it); returns (blobs
    removed, bytes freed)."""
    if store.blobs is None:
        return 0, 0
    listing = store.blobs.listing()  # (before the rows: a blob written after is not in it)
    used = _referenced(store)
    cutoff = time.time() - grace
    doomed = [(name, size) for name, size, when in listing
              if name not in used and when < cutoff]
    store.blobs.remove(name for name, _ in doomed)
    return len(doomed), sum(size for _, size in doomed)


def repair_run(store: PostgresStore, run_id: str) -> list[str]:
    """Set the run's journal rows whose values fail their checksum or signature, or whose
    blob is missing from the blob store, aside (into the table ``set_aside``), and remove
    the cache entries that lost the same blob; returns a line per row set aside or entry
    removed.

    Raises:
        NotFoundError: no run of that id.
    """
    from durably.store import _context

    if store.find_run(run_id) is None:
        raise NotFoundError(f"no run {run_id!r} in {store.where}")
    key = store.signing_key
    found: list[str] = []
    rows = store._read("read the journal", store._sql(
        "SELECT seq, step_id, task, status, attempt, position, value, blob, cache_key FROM "
        "{s}.steps WHERE run_id = %s AND (value IS NOT NULL OR blob IS NOT NULL)"), (run_id,))
    lost_keys: list[str] = []
    for seq, step_id, task, status, attempt, position, value, blob, cache_key in rows:
        payload, why = _opened(store, value, blob, key, _context(key, "step", run_id, step_id))
        if payload is not None:
            continue
        if cache_key and why == _MISSING:
            lost_keys.append(cache_key)
        what = f"step {step_id} (task {task!r}, {status}, attempt {attempt}, #{position})"
        _set_aside(store, run_id, "steps", seq, what, why, value, blob)
        found.append(f"{what}: {why}")
    rows = store._read("read the journal", store._sql(
        "SELECT seq, kind, key, data, blob FROM {s}.events WHERE run_id = %s AND "
        "(data IS NOT NULL OR blob IS NOT NULL)"), (run_id,))
    for seq, kind, ekey, value, blob in rows:
        payload, why = _opened(store, value, blob, key,
                               _context(key, "event", run_id, kind, ekey))
        if payload is not None:
            continue
        what = f"a {kind!r} event"
        _set_aside(store, run_id, "events", seq, what, why, value, blob)
        found.append(f"{what}: {why}")
    from durably._store.postgres.store import MissingBlobError

    for cache_key in lost_keys:  # (its cache entry lost the same blob: a miss, not an error)
        row = store._read("read the cache", store._sql(
            "SELECT value, blob FROM {s}.cache WHERE key = %s"), (cache_key,))
        try:
            if row:
                store._get_value(*row[0])
        except MissingBlobError:
            store.cache_delete([cache_key])
            found.append(f"cache entry {cache_key}: {_MISSING}")
    for line in found:
        log.warning("durably: run %r: %s is set aside", run_id, line)
    return found


def _opened(store: PostgresStore, value: Any, blob: str | None, key: Any, context: bytes
            ) -> tuple[bytes | None, str]:
    """A journal value checked, or (None, why): damaged, or its blob missing (another
    blob-store error is raised: an unreachable bucket is not a lost value)."""
    from durably._store.postgres.store import MissingBlobError

    try:
        data = store._get_value(value, blob) or b""
    except MissingBlobError:
        return None, _MISSING
    return _open_value(data, key, context)


_MISSING = "its large value is missing from the blob store"


def _set_aside(store: PostgresStore, run_id: str, table: str, seq: int, what: str, why: str,
               value: Any, blob: str | None) -> None:
    def move(conn: Any) -> None:
        with conn.transaction():
            conn.execute(store._sql(
                "INSERT INTO {s}.set_aside (run_id, what, why, row_data, value, blob, time) "
                f"SELECT %s, %s, %s, to_jsonb(t) - 'value' - 'data', %s, %s, %s FROM "
                f"{{s}}.{table} t WHERE seq = %s"),
                (run_id, what, why, value, blob, time.time(), seq))
            conn.execute(store._sql(f"DELETE FROM {{s}}.{table} WHERE seq = %s"), (seq,))
    store._do("set a damaged row aside", move)
