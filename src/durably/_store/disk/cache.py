"""The cache: cache key → sealed value, in a :class:`diskcache.Cache` beside the journal,
shared by every run and process; the small values kept in memory once read; damaged entries
set aside; eviction under the size limit the user set; the key records (what each key was
made of, in the journal's ``keys`` table); and the maintenance of the cache
(:mod:`~durably._store.disk.maintenance`).

Apart from the journal (:mod:`~durably._store.disk.runs`, :mod:`~durably._store.disk.steps`):
another database, with its own connection, lock, damage and limits; a step of a deleted run
still serves later calls from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from durably._keys import serde as _serde
from durably._keys.serde import Spilled, Unreadable
from durably._store.disk import checkpoint as _checkpoint
from durably._store.disk.base import _WAL_PAGES, DiskBase, _is_corrupt
from durably._store.disk.blobs import (
    FileValue,
    Garbage,
    as_spilled,
    disk_class,
    large_for_cache,
    large_from_cache,
    set_aside,
    set_aside_before,
    share_bits,
    share_file,
    subdir,
)
from durably._store.disk.rows import immediate, key_row, row_hash
from durably._store.disk.signing import _ctx
from durably._store.integrity import open_seal, seal
from durably._store.lease import _pid
from durably._store.records import KeyRecord
from durably.exceptions import CorruptJournalError, NotFoundError, StoreError

if TYPE_CHECKING:
    from durably._store.disk.store import DiskStore

__all__ = ["CacheValues"]

log = logging.getLogger("durably")

#: the column diskcache updates on a read, by eviction policy (None: nothing)
_EVICT_ON_GET: dict[str, Any] = {"none": None, "least-recently-stored": None}


_FETCH = ("SELECT mode, filename, value, tag FROM Cache WHERE key = ? AND raw = 1 AND "
          "(expire_time IS NULL OR expire_time > ?)")


def _cache_fetch(cache: Any, con: sqlite3.Connection, key: str) -> tuple[Any, float]:
    """What ``cache.get(key, tag=True)`` returns for a str key (the value, None for a miss,
    and its tag: the seconds the execution that produced it took, see
    :meth:`CacheValues.cache_put_many`), read the way its own fast path reads it (durably's
    caches keep no statistics and update nothing on a read), without the rest of its
    per-call work: a miss costs one indexed SELECT."""
    if cache.statistics or _EVICT_ON_GET.get(cache.eviction_policy, "?") is not None:
        value, tag = cache.get(key, tag=True)
        return value, _seconds(tag)
    row = con.execute(_FETCH, (key, time.time())).fetchone()
    if row is None:
        return None, 0.0
    tag = row[3]  # (a float durably wrote, else NULL: _seconds, inlined on every hit)
    try:
        return (cache._disk.fetch(row[0], row[1], row[2], False),
                tag if type(tag) is float and tag > 0 else 0.0)
    except OSError:  # removed between the SELECT and the read (as Cache.get)
        return None, 0.0


def _seconds(tag: Any) -> float:
    """The duration a cache row's tag holds (0.0 for none: an entry written without it)."""
    return float(tag) if type(tag) in (float, int) and tag > 0 else 0.0


_MEMO_VALUE = 64 * 1024  # the largest cache value kept in memory once read
_MEMO_BYTES = 16 * 2**20  # all of them together
_MEMO_RECHECK = 0.05  # seconds between two looks for another connection's writes


def _index_damaged(path: Path) -> bool | None:
    """Whether the SQLite file at ``path`` fails ``PRAGMA quick_check`` or reads as no
    database (read on a connection of its own: seconds for an index of millions of entries,
    paid only when damage was met); False when it passes; None when that cannot be told (it
    is missing, locked, or cannot be opened)."""
    if not path.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error:
        return None
    try:
        return bool(con.execute("PRAGMA quick_check(1)").fetchone()[0] != "ok")
    except sqlite3.Error as exc:
        return True if _is_corrupt(exc) else None
    finally:
        con.close()


def _insert_new_small(cache: Any, items: Sequence[tuple[str, Any]],
                      durations: dict[str, float]) -> list[tuple[str, Any]]:
    """Insert the small values of keys the cache does not hold yet in one ``executemany``
    (what ``Cache.set`` would write for them, row for row: diskcache's own triggers keep its
    count and size); returns the other items, for ``Cache.set`` (a value kept in a file, or a
    key that is there already, whose old file ``set`` removes). Inside ``cache.transact()``."""
    from diskcache.core import MODE_RAW

    limit = cache._disk.min_file_size
    last = dict(items)  # one row per key: the last value given for it
    small = [k for k, d in last.items() if type(d) is bytes and len(d) < limit]
    if len(small) < 2:
        return list(last.items())
    con = cache._con
    there: set[str] = set()
    for i in range(0, len(small), 500):
        chunk = small[i:i + 500]
        there.update(k for (k,) in con.execute(
            f"SELECT key FROM Cache WHERE raw = 1 AND key IN ({', '.join('?' * len(chunk))})",
            chunk))
    t = time.time()
    con.executemany(
        "INSERT INTO Cache (key, raw, store_time, expire_time, access_time, access_count, tag, "
        "size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, ?, 0, ?, NULL, ?)",
        [(k, t, t, durations.get(k), MODE_RAW, sqlite3.Binary(last[k])) for k in small
         if k not in there])
    new = set(small) - there
    return [(k, d) for k, d in last.items() if k not in new]


class CacheValues(DiskBase):
    """The part of :class:`~durably.DiskStore` that holds the cache and its key records."""

    @property
    def cache(self) -> Any:
        """The underlying :class:`diskcache.Cache` (opened on first use)."""
        root = self._open()
        c = self._cache
        if c is None:
            with self._lock:
                if self._cache is None:
                    self._cache = self._open_cache(root)
                c = self._cache
        return c

    def _open_cache(self, root: Path) -> Any:
        import diskcache

        folder = root / "cache"
        if self._read_only:  # (diskcache's Cache writes its settings when it opens)
            from durably._store.disk.readonly import ReadOnlyCache

            with self._translate(folder, "open the cache"):
                return ReadOnlyCache(folder, self.read_only_error("write the cache"),
                                     disk_class())
        limited = self.size_limit is not None
        for retry in (False, True):
            try:
                with self._translate(folder, "open the cache"):
                    if share_bits(root):
                        subdir(root, "cache")
                    cache = diskcache.Cache(
                        str(folder),
                        disk=disk_class(),
                        eviction_policy="least-recently-stored" if limited else "none",
                        size_limit=self.size_limit if limited else 2**62,
                        cull_limit=0,
                        statistics=False,
                        # a modest page cache and no memory map: a run of 100,000 steps
                        # must not grow by diskcache's defaults (32 MB + a 64 MB mmap)
                        sqlite_cache_size=2**11,
                        sqlite_mmap_size=0,
                        sqlite_wal_autocheckpoint=_WAL_PAGES,
                    )
                    for name in ("cache.db", "cache.db-wal", "cache.db-shm"):
                        share_file(root, folder / name)  # SQLite creates them 0644
                    return cache
            except StoreError as exc:
                if retry or not _is_corrupt(exc.__cause__):
                    raise
                dest = set_aside(root, "cache", path=str(folder))
                log.warning("durably: the cache index %s is damaged (%s): the cache was moved "
                            "to %s and starts empty", folder / "cache.db", exc.__cause__, dest)
        raise AssertionError("unreachable")

    # -- maintenance -----------------------------------------------------------------------
    def clear_task(self, task: str) -> int:
        """Remove the cache entries of the task of this identity (see ``Task.clear``); 0
        when it never wrote to this cache."""
        from durably._store.disk.maintenance import clear

        try:
            return clear(cast("DiskStore", self), task)
        except NotFoundError:
            return 0

    def cache_delete(self, keys: Iterable[str]) -> int:
        """Remove these cache entries, a few hundred per transaction; returns how many there
        were (an entry another process removed meanwhile is not counted).

        Raises:
            StoreError: the cache cannot be written.
        """
        from durably._store.disk.maintenance import delete_keys

        return delete_keys(cast("DiskStore", self), keys)

    def task_identities(self) -> list[str]:
        """The identities (``module:name``) of the tasks that have key records, sorted."""
        from durably._store.disk.maintenance import task_identities

        with self._read_journal:
            return task_identities(cast("DiskStore", self))

    def cache_size(self) -> int:
        """Bytes the cache's files take on disk."""
        with self._read_cache:
            return int(self.cache.volume())

    def cache_entry_bytes(self) -> int:
        """Bytes the cache's entries take, their own sizes summed (a value's length in the
        database, or its file's size), as :meth:`cache_stats` counts them: less than
        :meth:`cache_size`, which counts the database's pages, free ones included."""
        from durably._store.disk.maintenance import entry_bytes

        with self._read_cache:
            return entry_bytes(cast("DiskStore", self))

    def cache_stats(self) -> dict[str, Any]:
        """What the cache holds, per task (the CLI's ``durably cache stats``)."""
        from durably._store.disk.maintenance import cache_stats

        return cache_stats(cast("DiskStore", self))

    def prune(self, older_than: float | None = None, max_size: int | None = None, *,
              max_entries: int | None = None, task: str | None = None,
              dry_run: bool = False) -> int:
        """Remove cache entries by age, then by count and size, oldest first (journals are
        never touched); see :meth:`durably.store.Store.prune`."""
        from durably._store.disk.maintenance import prune

        return prune(cast("DiskStore", self), older_than, max_size, max_entries=max_entries,
                     task=task, dry_run=dry_run)

    def clear(self, task: str | None = None, *, dry_run: bool = False) -> int:
        """Remove every cache entry, or a task's (its identity or name); see
        :meth:`durably.store.Store.clear`."""
        from durably._store.disk.maintenance import clear

        return clear(cast("DiskStore", self), task, dry_run=dry_run)

    # -- cache -----------------------------------------------------------------------------
    def cache_get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or None: a miss, or an entry found damaged or
        (with a key) not signed with it — that entry is moved to ``damaged/`` with a warning
        naming it, so the caller recomputes it. A large value comes back as a file handle
        (:class:`~durably._keys.serde.Spilled`) checked end to end."""
        memo = self.memo_entries
        if memo:
            kept = self._memo.get(key)
            if kept is not None and self._memo_current():
                return kept[0]
        found = self._cache_read(key, memo)
        return None if found is None else found[0]

    def cache_get_timed(self, key: str) -> tuple[bytes, float] | None:
        """:meth:`cache_get`, with the seconds the execution that produced the value took
        (kept in the entry's row of the cache index, read with it; 0.0 for an entry written
        without it), as :meth:`durably.store.Values.cache_get_timed` says."""
        memo = self.memo_entries
        if memo:
            kept = self._memo.get(key)
            if kept is not None and self._memo_current():
                return kept
        return self._cache_read(key, memo)

    def _cache_read(self, key: str, memo: int) -> tuple[bytes, float] | None:
        """The entry of ``key`` read from the cache's index (see :meth:`cache_get`), kept in
        memory when small (``memo``: the store's ``memo_entries``)."""
        cache = self.cache
        signer = self._signing()
        with self._read_cache:
            con = cache._con
            if con.in_transaction:
                self._discard_cache_leftover()  # (it would hold the cache's lock for good)
            gen = -1
            if memo:
                self._memo_current()  # drops what is stale before this read
                gen = self._memo_gen
                if self._cache is not cache:  # (found damaged by that look: moved aside)
                    return None
            try:
                found, seconds = _cache_fetch(cache, con, key)
            except sqlite3.OperationalError as exc:
                if "decode" not in str(exc):
                    raise
                found, seconds = Garbage(f"its index row holds text that is not UTF-8 ({exc})",
                                         b""), 0.0
            except sqlite3.DatabaseError as exc:
                if not _is_corrupt(exc):
                    raise
                self._cache_index_damaged(exc)  # (a miss: the cache starts empty)
                return None
        if found is None:
            return None
        context = _ctx("cache", key) if signer is not None else b""
        if type(found) is bytes:
            payload, why = open_seal(found, signer, context)
            if payload is None:
                self._cache_damaged(key, why, data=found)
                return None
            if memo and len(payload) <= _MEMO_VALUE:
                return self._remember(key, (payload, seconds), gen)
            return payload, seconds
        if isinstance(found, FileValue):
            if found.file is None:
                payload, why = open_seal(found.data, signer, context)
                if payload is None:
                    self._cache_damaged(key, why, path=found.path, data=found.data)
                    return None
                if memo and len(payload) <= _MEMO_VALUE:
                    return self._remember(key, (payload, seconds), gen)
                return payload, seconds
            try:
                value, why = large_from_cache(self._open(), found, signer, context)
            except OSError as exc:
                raise self.store_error(exc, Path(found.path), "read a cache value") from exc
            if value is None:
                self._cache_damaged(key, why, path=found.path)
                return None
            return value, seconds
        if isinstance(found, Garbage):
            self._cache_damaged(key, found.why, data=found.as_bytes())
        return None

    def _memo_current(self) -> bool:
        """Whether the values kept in memory still stand: the signing key is the same, and no
        other connection has committed to the cache since the last look (SQLite's ``PRAGMA
        data_version`` on a connection of the store's own that writes nothing, so it sees
        every writer: other processes, other threads, diskcache used directly; looked at
        every ``_MEMO_RECHECK`` seconds at most). Else they are dropped (and False)."""
        signer = self._signing()
        sid = signer.id if signer is not None else None
        if sid == self._memo_signer and time.monotonic() < self._memo_until \
                and self._watch_pid == _pid[0]:
            return True
        root = self._open()
        with self._lock:
            pid = os.getpid()
            if self._watch is None or self._watch_pid != pid:  # or a forked child's first look
                self._watch_version = -1
                self._watch = self._watch_connection(root / "cache" / "cache.db")
                self._watch_pid = pid
            try:
                with self._read_cache:
                    version = self._watch.execute("PRAGMA data_version").fetchone()[0]
            except StoreError:
                if self._watch is not None:  # (a damaged cache, moved aside: nothing held)
                    raise
                self._drop_memo()
                return False
            current = version == self._watch_version and sid == self._memo_signer
            if not current:
                self._drop_memo()
                self._watch_version, self._memo_signer = version, sid
            self._memo_until = time.monotonic() + _MEMO_RECHECK
            return current

    def _watch_connection(self, path: Path) -> sqlite3.Connection:
        """A connection of the store's own to the cache's index, that writes nothing."""
        if self._read_only:
            from durably._store.disk.readonly import connect_read_only

            with self._read_cache:
                if not path.exists():  # (no cache: nothing ever changes)
                    return sqlite3.connect(":memory:", check_same_thread=False)
                return connect_read_only(path)
        return sqlite3.connect(str(path), timeout=60.0, isolation_level=None,
                               check_same_thread=False)

    def _drop_memo(self) -> None:
        """Empty what memory holds, and refuse values read before now (lock held)."""
        self._memo, self._memo_bytes = {}, 0
        self._memo_gen += 1

    def _remember(self, key: str, entry: tuple[bytes, float], gen: int
                  ) -> tuple[bytes, float]:
        """Keep a small entry (its payload and duration) in memory; returns it."""
        with self._lock:
            memo = self._memo
            if gen != self._memo_gen or key in memo:
                return entry  # forgotten since it was read: it may be what was cleared
            memo[key] = entry
            self._memo_bytes += len(entry[0])
            while len(memo) > self.memo_entries or self._memo_bytes > _MEMO_BYTES:
                self._memo_bytes -= len(memo.pop(next(iter(memo)))[0])
        return entry

    def forget_memo(self, keys: Iterable[str] | None = None) -> None:
        """Drop the cache values kept in memory (all, or those of ``keys``): called when this
        process changes the cache behind a connection's back (prune, clear, eviction)."""
        with self._lock:
            if keys is None:
                self._drop_memo()
                return
            self._memo_gen += 1
            for key in keys:
                entry = self._memo.pop(key, None)
                if entry is not None:
                    self._memo_bytes -= len(entry[0])

    def discard_cache(self, key: str, why: str, data: bytes | None = None) -> None:
        """Take a cache entry that must not be served out of the cache: its value (``data``,
        as :meth:`cache_get` returned it) is kept in ``damaged/`` in the store, and a
        warning names the key, ``why`` and where it was kept. The runtime calls it for an
        entry whose value cannot be loaded (then the task executes again).

        Args:
            key: The cache key.
            why: What is wrong with it, for the warning ("its value cannot be loaded ...").
            data: The entry's bytes, to keep (None: nothing kept; a large value's file is
                moved there).

        Raises:
            StoreError: the store cannot be opened.

        Example:
            >>> import durably, tempfile
            >>> store = durably.DiskStore(tempfile.mkdtemp())
            >>> store.cache_put("k1", b"not a pickle")
            >>> store.discard_cache("k1", "its value cannot be loaded", b"not a pickle")
            >>> store.cache_get("k1") is None
            True
        """
        root = self._open()
        if set_aside_before(root, key):  # (one copy of a key's value is enough)
            with contextlib.suppress(Exception):
                self.cache.delete(key)
            self.forget_memo((key,))
            log.warning("durably: cache entry %s at %s is removed: %s (a copy was kept in "
                        "%s before)", key, self.path, why, root / "damaged")
        elif isinstance(data, Spilled):  # (a large value: its file in the cache)
            self._cache_damaged(key, why, path=data.path)
        else:
            self._cache_damaged(key, why, data=data)

    def _cache_index_damaged(self, exc: BaseException) -> Path:
        """The cache's index (``cache.db``) was found damaged by a read or a write: move the
        cache aside to ``damaged/`` (as when it is found damaged at open) and start an empty
        one at the next use; where it was moved. The index there now is checked first
        (``PRAGMA quick_check``, on a connection of its own): one that is sound was started
        again by another process or thread that moved the damaged one already, and is left
        alone, as is one that cannot be checked; this object only lets go of the damaged
        one. A connection another thread holds on it keeps the moved copy until it meets the
        damage in turn."""
        root = self._open()
        folder = root / "cache"
        with self._lock:
            cache, self._cache = self._cache, None
            if cache is not None:
                with contextlib.suppress(Exception):
                    cache.close()
            watch, self._watch, self._watch_version = self._watch, None, -1
            if watch is not None and self._watch_pid == _pid[0]:
                with contextlib.suppress(Exception):
                    watch.close()
            self._drop_memo()
            damaged = _index_damaged(folder / "cache.db")
            if not damaged:
                log.warning("durably: the cache index this process had open at %s was found "
                            "damaged (%s); %s: the cache in %s is used from now on",
                            folder / "cache.db", exc,
                            "another process or thread has moved it aside already"
                            if damaged is False else "the one there now cannot be checked",
                            folder)
                return folder
            try:
                dest = set_aside(root, "cache", path=str(folder))
            except OSError as move:
                log.warning("durably: the damaged cache %s could not be moved aside: %s",
                            folder, move)
                return folder
        log.warning("durably: the cache index %s is damaged (%s): the cache was moved to %s "
                    "and starts empty", folder / "cache.db", exc, dest)
        return dest

    def _cache_damaged(self, key: str, why: str, *, path: str | None = None,
                       data: bytes | None = None) -> None:
        """Keep a damaged entry aside, drop it from the cache, warn naming both."""
        root = self._open()
        try:
            dest = set_aside(root, key, path=path, data=data)
        except OSError as exc:
            dest = Path(f"(not kept: {exc})")
        with contextlib.suppress(Exception):
            self.cache.delete(key)
        self.forget_memo((key,))
        log.warning("durably: cache entry %s at %s is damaged: %s. It was set aside as %s "
                    "and will be recomputed.", key, self.path, why, dest)

    def _discard_cache_leftover(self) -> None:
        """Roll back a transaction that an interrupted write (a KeyboardInterrupt inside
        diskcache, between its BEGIN and its block) left open on this thread's cache
        connection: it was never committed, holds the cache's write lock (other processes
        wait on it) and would swallow this thread's later writes. Never one of durably's own,
        open now; do not call durably's store methods inside your own
        ``store.cache.transact()`` block."""
        if getattr(self._local, "cache_tx", False):
            return
        cache = self.cache
        con = cache._con
        if con.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")
            if cache._txn_id == threading.get_ident():
                cache._txn_id = None

    def cache_put(self, key: str, value: bytes, info: KeyRecord | None = None) -> None:
        self.cache_put_many(((key, value, info),))

    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        if not items:
            return
        cache = self.cache
        signer = self._signing()
        prepared: list[tuple[str, Any]] = []
        temps: list[str] = []
        # the seconds the execution that produced each value took, in its row's tag (read
        # with the value on a hit: see cache_get_timed); None when unknown
        durations = {key: info.duration for key, _, info in items
                     if info is not None and info.duration > 0}
        try:
            for key, value, _ in items:
                if isinstance(value, Unreadable):
                    raise value.error
                if isinstance(value, Spilled) or len(value) > _serde.SPILL_BYTES:
                    context = _ctx("cache", key) if signer is not None else b""
                    with self._write_cache:
                        prepared.append((key, large_for_cache(self._open(), as_spilled(value),
                                                              signer, context, temps)))
                else:
                    context = _ctx("cache", key) if signer is not None else b""
                    prepared.append((key, seal(value, signer, context)))
            with self._write_cache:
                self._discard_cache_leftover()
                try:
                    if len(prepared) == 1:
                        key, data = prepared[0]
                        cache.set(key, data, tag=durations.get(key))
                    else:
                        with cache.transact():
                            self._local.cache_tx = True
                            try:
                                for key, data in _insert_new_small(cache, prepared, durations):
                                    cache.set(key, data, tag=durations.get(key))
                            finally:
                                self._local.cache_tx = False
                except BaseException:
                    # (Ctrl-C inside diskcache, after its BEGIN): never left holding the lock
                    self._discard_cache_leftover()
                    raise
        finally:
            if self._memo:  # the value a key had before is read again
                self.forget_memo(key for key, _, _ in items)
            for temp in temps:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
        self._cache_writes += len(items)
        if self._cache_writes >= _checkpoint.EVERY:
            self._cache_writes = 0
            self._checkpoint_soon("cache", "cache.db")
        infos = [key_row(info) for _, _, info in items if info is not None]
        if infos:
            try:
                with self._write_journal, immediate(self._db()) as db:
                    db.executemany(
                        "INSERT OR REPLACE INTO keys (kid, cache_key, task, code, inputs, "
                        "parts, created, duration) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", infos)
            except CorruptJournalError as exc:  # the cache keeps working without its records
                if "keys" not in self._warned:
                    self._warned.add("keys")
                    log.warning("durably: %s (key records are not written; explain() cannot "
                                "say why a call misses)", exc)
        with self._write_cache:
            if self.size_limit is not None and cache.volume() > self.size_limit:
                removed = self._evict(self.size_limit, {key for key, _, _ in items})
                if removed:
                    self.forget_memo()
                    self.evicted += removed
                    # the limit the user set, at work: said once at WARNING, then at INFO
                    (log.warning if self.evicted == removed else log.info)(
                        "durably: cache at %s is over its size limit (%d bytes): evicted %d "
                        "entries (%d this session)%s",
                        self.path, self.size_limit, removed, self.evicted,
                        "; later evictions are logged at INFO" if self.evicted == removed
                        else "")

    def _evict(self, limit: int, keep: set[str]) -> int:
        """Remove the least recently stored cache entries until the cache's volume is at
        most ``limit`` bytes, never those in ``keep`` (just written); the number removed.
        (diskcache's own cull removes ten at a time: ten entries of a megabyte in a cache
        limited to ten megabytes all went, the one just computed among them.)"""
        cache = self.cache
        disk = cache.disk
        removed = 0
        for _ in range(10_000):  # (bounded: another process may be filling it meanwhile)
            over = int(cache.volume()) - limit
            if over <= 0:
                break
            rows = cache._sql(
                "SELECT key, raw, CASE WHEN filename IS NULL THEN COALESCE(length(value), 0) "
                "ELSE size END FROM Cache ORDER BY store_time, rowid LIMIT 64").fetchall()
            doomed = []
            for key, raw, size in rows:
                name = disk.get(key, bool(raw))
                if name in keep:
                    continue
                doomed.append(name)
                over -= max(int(size or 0), 1)
                if over <= 0:
                    break
            if not doomed:
                break  # only what was just written is left: kept, though over the limit
            removed += sum(1 for name in doomed if cache.delete(name, retry=True))
            self.forget_memo(doomed)
        return removed

    def find_key(self, task: str, key: str) -> KeyRecord | None:
        with self._read_journal:
            row = self._db().execute(
                "SELECT task, cache_key, code, inputs, parts, created, duration FROM keys "
                "WHERE kid=? AND cache_key=? AND task=?", (row_hash(key), key, task)).fetchone()
        if row is None:
            return None
        t, k, c, i, p, cr, d = row
        return KeyRecord(t, k, c, json.loads(i), json.loads(p), cr, d or 0.0)

    def list_keys(self, task: str, limit: int = 100) -> list[KeyRecord]:
        with self._read_journal:
            rows = self._db().execute(
                "SELECT task, cache_key, code, inputs, parts, created, duration FROM keys "
                "WHERE task=? ORDER BY created DESC LIMIT ?", (task, limit)).fetchall()
        return [KeyRecord(t, k, c, json.loads(i), json.loads(p), cr, d or 0.0)
                for t, k, c, i, p, cr, d in rows]

    def stats(self) -> dict[str, Any]:
        """Cache entries (int), cache volume (bytes), runs (int) and evictions this session."""
        cache = self.cache
        runs = self._db().execute("SELECT count(*) FROM runs").fetchone()[0]
        return {
            "path": str(self.path),
            "cache_entries": len(cache),
            "cache_bytes": cache.volume(),
            "size_limit": self.size_limit,
            "evicted": self.evicted,
            "runs": runs,
        }
