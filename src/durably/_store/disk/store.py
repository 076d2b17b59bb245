"""Where results and journals live: the :class:`Store` protocol and :class:`DiskStore`.

A store holds two things:

- the **cache**: cache key → pickled result, shared by every run and process. Entries are
  evicted only under a size limit the user set, and every eviction is logged and counted.
- the **journals**: one per run, the append-only record of its steps (with their results), and
  a row per run (entrypoint, status, arguments, result). Journals are never evicted.

:class:`DiskStore` keeps the cache in a :class:`diskcache.Cache` and the journals in one SQLite
database in WAL mode beside it (``journal.sqlite3``): a step is appended in one small
transaction, committed before the task returns, and found again by ``(run_id, step_id)``
through an index, so neither a run's length nor the number of runs slows a step down and a
journal is never held whole in memory. A commit survives the process being killed at any
moment; with ``synchronous="full"`` it also survives a power cut.

Everything durably will unpickle is sealed (``_seal``): a checksum and, with a key, a
signature, checked before a byte reaches :mod:`pickle`. A damaged or foreign cache entry is a
miss: it is moved to ``damaged/`` with a warning naming it, and recomputed. A damaged journal
value raises :class:`~durably.CorruptJournalError` for its run alone — except the result of a
cacheable step, which is executed again (see :meth:`DiskStore.find_step`). Values larger than
``_serde.SPILL_BYTES`` live in files (the cache's value files, ``blobs/`` for journals),
streamed and never held twice in memory. Write failures (a full disk, a read-only store)
become a :class:`~durably.StoreError` naming the path and the fix, and never leave a
half-written value that could be read back.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import xxhash

from durably import store as store_api
from durably._keys import serde as _serde
from durably._keys.serde import Spilled, Unreadable
from durably._store.disk import checkpoint as _checkpoint
from durably._store.disk.blobs import (
    BLOB_REF,
    FileValue,
    Garbage,
    as_spilled,
    blob_ref,
    clean_tmp,
    disk_class,
    large_for_cache,
    large_from_cache,
    open_blob,
    same_content,
    set_aside,
    set_aside_before,
    share_bits,
    share_file,
    subdir,
    valid_blob_name,
)
from durably._store.disk.repair import repair_run, seal_old_blobs
from durably._store.disk.rows import (
    EVENT_COLS,
    EVENT_TYPES,
    RUN_COLS,
    RUN_TYPES,
    SCHEMA,
    SCHEMA_2,
    SCHEMA_3,
    SCHEMA_4,
    SCHEMA_5,
    SCHEMA_5_KEYS,
    SCHEMA_6,
    SCHEMA_6_EVENTS,
    SCHEMA_6_LEASES,
    STEP_COLS,
    STEP_TYPES,
    PackedRange,
    compact_replay,
    discard_leftover,
    garbage,
    immediate,
    key_row,
    pack_ranges,
    pack_replays,
    replayed_in_ranges,
    row_hash_sql,
    run_row,
    step_from_row,
    step_row,
    step_sid,
    unpack_ranges,
    unpack_replays,
)
from durably._store.disk.wal import BUSY, lost_commits
from durably._store.integrity import (
    _PLAIN,
    MAGIC_PLAIN,
    SigningKey,
    check_parts,
    check_private,
    env_key,
    key_from,
    open_seal,
    seal,
    set_process_key,
    unseal,
)
from durably._store.lease import Owner, _pid, me
from durably._store.records import (
    FINISHED_STEP,
    EventRecord,
    KeyRecord,
    Replay,
    ReplayRange,
    RunRecord,
    StepRecord,
    now,
)
from durably.exceptions import (
    CorruptJournalError,
    DefinitionError,
    NotFoundError,
    RunStateError,
    StoreError,
)
from durably.store import Store

__all__ = [
    "FINISHED_STEP",
    "JOURNAL_FORMAT",
    "STORE_FORMAT",
    "DiskStore",
    "EventRecord",
    "KeyRecord",
    "RunRecord",
    "StepRecord",
    "Store",
    "now",
    "seal",
    "set_default_key",
    "unseal",
]

log = logging.getLogger("durably")

#: Version of the directory layout (the ``FORMAT`` file); a store written by a newer durably
#: is refused.
STORE_FORMAT = 2
#: Version of the journal database (SQLite ``user_version``): 1 had no tracer columns and no
#: events, 2 stored result blobs unsealed, 3 seals every blob, 4 records replayed steps many
#: to a row (the replays table), 5 looks steps and key records up by short integer hashes
#: (``sid``, ``kid``), 6 writes fewer pages at the start and end of an attempt (see
#: SCHEMA_6), 7 records steps replayed from consecutive records as ranges (ReplayRange; the
#: tables are those of 6). Older journals are upgraded in place when first opened; a newer
#: one is refused.
JOURNAL_FORMAT = 7

# -- the process-wide signing key (durably.configure(key=...)) --------------------------------
_key_lock = threading.Lock()
_process_key: SigningKey | None = None
_key_generation = 0


def set_default_key(key: Any) -> None:
    """Sign with ``key`` in every :class:`DiskStore` not given its own (None: fall back to
    ``$DURABLY_KEY`` / ``$DURABLY_KEY_FILE``).

    Raises:
        DefinitionError: the key is not bytes or str, or shorter than 16 bytes.
    """
    global _process_key, _key_generation
    new = None if key is None else key_from(key, "configure(key=...)")
    with _key_lock:
        _process_key = new
        _key_generation += 1
        set_process_key(new)


def _ctx(*parts: str) -> bytes:
    """The context a signature binds a value to (which slot of which store it belongs in)."""
    return "\x00".join(parts).encode()


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


_FULL_HINT = ("the disk is full: free space, then rerun; finished steps are kept and nothing "
              "half-written is ever read back.")


def _disk_full(path: Path) -> bool:
    """Whether the file system of ``path`` (or of its nearest existing parent) has less than
    64 KiB free for an unprivileged writer: what an I/O error there most likely means."""
    for where in (path, *path.parents):
        try:
            st = os.statvfs(where)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize < 64 << 10
    return False


def _is_corrupt(exc: BaseException | None) -> bool:
    """Whether SQLite says the file is not a (sound) database."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    text = str(exc).lower()
    return type(exc) is sqlite3.DatabaseError or "malformed" in text or "not a database" in text


def _read_only(path: Path) -> bool:
    """Whether ``path`` (or its nearest existing parent) is on a read-only filesystem or not
    writable by this process (SQLite often says only "unable to open database file")."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                if os.statvfs(folder).f_flag & getattr(os, "ST_RDONLY", 1):
                    return True
            except (OSError, AttributeError):
                pass
            return not os.access(folder if folder.is_dir() else folder.parent, os.W_OK)
    return False


class Sealed(bytes):
    """A journal value sealed already (:meth:`DiskStore.seal_ahead`): written as it is.

    Attributes:
        placed: The file sealing it put in ``blobs/`` (a large value), else None: removed
            by :meth:`DiskStore.discard_ahead` when the write it was sealed for is not made.
    """

    placed: str | None = None


class _Translate:
    __slots__ = ("action", "store", "where")

    def __init__(self, store: DiskStore, where: str | Path, action: str) -> None:
        self.store, self.where, self.action = store, where, action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, StoreError):
            return
        if self.where == "cache" and _is_corrupt(exc):  # (found by a read or a write)
            dest = self.store._cache_index_damaged(exc)
            raise StoreError(f"cannot {self.action} at {self.store.path / 'cache'}: {exc}: "
                             f"the cache index is damaged. It was moved to {dest} and the "
                             "cache starts empty (runs' journals are kept). Fix: call "
                             "again.") from exc
        if isinstance(exc, (OSError, sqlite3.Error)) or (
                type(exc).__name__ == "Timeout" and type(exc).__module__.startswith("diskcache")):
            raise self.store.store_error(exc, self.where, self.action) from exc


class _WriteJournal(_Translate):
    """The errors of the journal's writes, translated; and before the first write of a
    store whose write-ahead log could not be checked when it was opened (another
    connection held the write lock), that check (see :meth:`DiskStore._check_wal`)."""

    __slots__ = ()

    def __enter__(self) -> None:
        if self.store._wal_unchecked:
            self.store._check_wal_before_write()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            store = self.store
            store._journal_writes += 1
            if store._journal_writes >= _checkpoint.EVERY:
                store._journal_writes = 0
                store._checkpoint_soon("journal.sqlite3")
            return
        super().__exit__(kind, exc, tb)


_TRUE = ("1", "true", "yes", "on")
#: the column diskcache updates on a read, by eviction policy (None: nothing)
_EVICT_ON_GET: dict[str, Any] = {"none": None, "least-recently-stored": None}


_FETCH = ("SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1 AND "
          "(expire_time IS NULL OR expire_time > ?)")


def _cache_fetch(cache: Any, con: sqlite3.Connection, key: str) -> Any:
    """What ``cache.get(key)`` returns for a str key, read the way its own fast path reads
    it (durably's caches keep no statistics and update nothing on a read), without the rest
    of its per-call work: a miss costs one indexed SELECT."""
    if cache.statistics or _EVICT_ON_GET.get(cache.eviction_policy, "?") is not None:
        return cache.get(key)
    row = con.execute(_FETCH, (key, time.time())).fetchone()
    if row is None:
        return None
    try:
        return cache._disk.fetch(row[0], row[1], row[2], False)
    except OSError:  # removed between the SELECT and the read (as Cache.get)
        return None


class _Batch:
    """:meth:`DiskStore.batch`: a class, so that a KeyboardInterrupt landing between its
    BEGIN and its block rolls the transaction back (see :class:`immediate`)."""

    __slots__ = ("begin", "store", "tx")

    def __init__(self, store: DiskStore, begin: str = "BEGIN IMMEDIATE") -> None:
        self.store, self.begin = store, begin
        self.tx: immediate | None = None

    def __enter__(self) -> None:
        # no Python code may run between the BEGIN and the return (a `with` here would run
        # its __exit__ there): a KeyboardInterrupt in that gap would leave it open
        store = self.store
        tx = None
        if store._wal_unchecked and self.begin != "BEGIN":
            store._check_wal_before_write()  # (before the transaction begins)
        try:
            # (depth: the frame running `with store.batch()`)
            tx = immediate(store._db(), depth=2, begin=self.begin)
            tx.__enter__()
            self.tx = tx
            return None
        except BaseException as exc:  # (Ctrl-C after the BEGIN): never left open
            if tx is not None:
                tx.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, (OSError, sqlite3.Error)):
                raise store.store_error(exc, "journal.sqlite3", "read the journal" if
                                        self.begin == "BEGIN" else "write the journal") from exc
            raise

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        tx, self.tx = self.tx, None
        if tx is not None:
            with (self.store._read_journal if self.begin == "BEGIN"
                  else self.store._write_journal):
                tx.__exit__(kind, exc, tb)


def _in_call_order(record: StepRecord) -> tuple[int, int]:
    return record.attempt, record.position

_MEMO_VALUE = 64 * 1024  # the largest cache value kept in memory once read
_MEMO_BYTES = 16 * 2**20  # all of them together
_MEMO_RECHECK = 0.05  # seconds between two looks for another connection's writes
#: a run's record, written in place when it exists (an upsert, not INSERT OR REPLACE: a
#: replaced row moves to a new rowid, which dirties two more pages of the table and its
#: pk index at every start and end of an attempt)
_RUN_UPSERT = "ON CONFLICT(run_id) DO UPDATE SET " + ", ".join(
    f"{c.strip()}=excluded.{c.strip()}" for c in RUN_COLS.split(",")[1:])
_PUT_RUN = f"INSERT INTO runs ({RUN_COLS}) VALUES ({', '.join('?' * 11)}) {_RUN_UPSERT}"
#: the same, only while the run is still the attempt's: its record has that attempt (a
#: run's record exists from its first attempt's start on: an UPDATE, a third faster than
#: an upsert whose SELECT looks the attempt up)
_PUT_RUN_IF_CURRENT = ("UPDATE runs SET " + ", ".join(
    f"{c.strip()}=?" for c in RUN_COLS.split(",")[1:]) + " WHERE run_id=? AND attempt=?")
_AHEAD_BYTES = 8 << 20  # the results a replay's read-ahead keeps in memory, at most
#: a step's result as read: as its bytes whatever its type (a TEXT value that is not UTF-8,
#: written by a tool or a hand, would fail the whole read; as bytes it is damage said for
#: its step, and repair_run can set it aside)
_RESULT = "CAST(result AS BLOB)"
_REF_LEN = len(BLOB_REF)  # (a payload that starts with BLOB_REF names a file in blobs/)
#: the tables holding a run's rows besides runs (deleted with it: see delete_runs)
_RUN_TABLES = ("steps", "replays", "events", "set_aside", "leases")
#: the columns a reference to a file in blobs/ may be in: (table, column, only short values)
_REF_COLUMNS = (("runs", "args", True), ("runs", "result", True), ("steps", "result", True),
                ("events", "data", True), ("set_aside", "data", False),
                ("set_aside", "row", False))
_REF_LARGEST = 4096  # a sealed reference's length is far below this (about 250 bytes)
_REF_NAME = re.compile(rb'"blob": ?"([0-9a-f]{32})"')  # (a name in a reference's JSON)
_AHEAD_LARGEST = 65536  # the largest result the read-ahead keeps (larger: read alone)
_AHEAD_MISS: Any = object()  # a step the read-ahead's window has no entry for
_AHEAD_ROWS = 512  # the rows a read-ahead reads at once
#: replay ranges an attempt buffers before they are journaled
_AHEAD_RANGES = 2048
#: every DiskStore of this process: a forked child gives each a new lock (one a thread of
#: the parent held at the fork would never be released in the child: its first use of the
#: store hung)
_STORES: weakref.WeakSet[DiskStore] = weakref.WeakSet()


def _new_locks_in_child() -> None:
    global _key_lock
    _key_lock = threading.Lock()
    for store in list(_STORES):
        store._lock = threading.RLock()


os.register_at_fork(after_in_child=_new_locks_in_child)
_new_range = tuple.__new__
#: bytes of a page of a new journal. Each commit appends every page it changed to the
#: write-ahead log, whole: an executed step changes three (its row and two index entries),
#: so a trivial step wrote 12 KiB to the log with SQLite's default of 4,096 (14 KiB to the
#: disk with the checkpoints). Pages of 2,048 bytes halve that (8 KiB to the disk in a run
#: of 1,000 steps, 12 KiB in one of 100,000) and a step's commit costs 2-4 us less; a row
#: larger than a page spills into overflow pages, about the same bytes in all. SQLite sets
#: it once, when the database is created: an older journal keeps its own, and a process of
#: an older durably reads either.
_PAGE_SIZE = 2048
#: pages the write-ahead log of the journal and of the cache grows to before the commit
#: that crosses the mark copies it back into the database (a checkpoint: two fsyncs, tens
#: of ms for a log this size). Background checkpoints (see _checkpoint), asked for every
#: 1,024 commits, do most of that work while the run goes on; as a log starts over only
#: once a checkpoint copied all of it with no commit meanwhile, under steady writes the
#: commit that crosses this mark copies the rest (a little later when it finds the
#: background checkpoint at work: about 36 MiB of log at 2 KiB pages for one writer, 45
#: MiB for two). The log is deleted when the database's last connection closes.
_WAL_PAGES = 16384


def _wal_mode(con: sqlite3.Connection, seconds: float = 60.0) -> None:
    """Switch a journal to WAL mode. SQLite answers "database is locked" at once, without
    its busy timeout, while another connection opens the same new file: wait as diskcache
    does (seen with a dozen processes opening a new store at one instant)."""
    deadline = time.monotonic() + seconds
    delay = 0.001
    while True:
        try:
            con.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _write_replacing(path: Path, text: str) -> None:
    """Write a small file whole, atomically: a temporary file of this thread, renamed over
    ``path`` (two threads, or two processes, writing the same marker at once both succeed)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _insert_new_small(cache: Any, items: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
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
        "size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, 0, ?, NULL, ?)",
        [(k, t, t, MODE_RAW, sqlite3.Binary(last[k])) for k in small if k not in there])
    new = set(small) - there
    return [(k, d) for k, d in last.items() if k not in new]


_INSERT_STEP = f"INSERT INTO steps ({STEP_COLS}, result, sid) VALUES ({', '.join('?' * 17)})"
#: the same, only while the run is still the step's attempt's (its record has that attempt)
_INSERT_STEP_IF_CURRENT = (f"INSERT INTO steps ({STEP_COLS}, result, sid) SELECT "
                           f"{', '.join('?' * 17)} WHERE (SELECT attempt FROM runs WHERE "
                           "run_id=?) = ?")


class ReadAhead(store_api.ReadAhead):
    """The finished steps of a run being resumed, read ahead in journal order (512 at a
    time, at most 8 MB of results), and the steps replayed from them, recorded as ranges.

    A resumed run calls its steps in the order it journaled them, so most replayed steps
    are the record after the one replayed before, at the position after it: such steps are
    recorded together, as one :class:`ReplayRange` (each step's ids, parent, key and task
    are those of its record), instead of one replay record each. Made by
    :meth:`DiskStore.read_ahead`; one thread uses it (``thread``): the one that made it.
    """

    __slots__ = ("anchor", "count", "due", "ended", "first", "generation", "horizon", "ids",
                 "index", "last", "last_id", "next_position", "opened", "position", "ranges",
                 "run_id", "skip", "started", "store", "tail", "thread", "values")

    def __init__(self, store: DiskStore, run_id: str,
                 tail: tuple[int, int, bool] = (0, -1, False)) -> None:
        self.store, self.run_id = store, run_id
        self.thread = threading.get_ident()
        self.ranges: list[ReplayRange] = []  # closed ranges, not yet taken
        self.due = False  # as many closed ranges as an attempt buffers: take them
        # the open range: ``count`` steps from ``position``, replayed from the records after
        # ``anchor`` (skipping ``skip``; the first is ``first``), between ``started`` and
        # ``ended``; ``last_id``: the record before the window's first
        self.count = self.position = self.skip = 0
        self.anchor: tuple[int, int, bool] = (0, -1, False)
        self.first = self.last_id = ""
        self.started = self.ended = 0.0
        self.horizon = self.opened = 0  # the journal's last step rowid when read, opened
        self.next_position = -1  # the position that extends the open range (-1: none open)
        self.ids: Sequence[str] = ()
        self._fill(tail, False)

    @property
    def buffered(self) -> bool:
        return bool(self.count or self.ranges)

    def _fill(self, tail: tuple[int, int, bool], continues: bool) -> None:
        """Read the records after ``tail`` (``(attempt, position, inclusive)``: from it);
        ``continues``: the open range's last step is the record before the first read."""
        if continues:
            self.last_id = self.ids[-1]
        elif self.count:
            self._close()
        self.tail = tail
        # (before the records: one journaled after them has a greater rowid)
        self.horizon = self.store._horizon()
        ids, self.values, self.generation = self.store._ahead_rows(self.run_id, *tail)
        self.ids = ids
        self.index: dict[str, int] | None = None  # (made when a step is asked for out of
        # order: see _taken)
        # the record the open range ends with: ``ids[last]``, or the one before (-1); -2: none
        self.last = -1 if continues else -2

    def _close(self) -> None:
        """Close the open range, if any."""
        if self.count:
            last = self.last
            self.ranges.append(_new_range(ReplayRange, (  # (ReplayRange(), without its frame)
                self.position, self.count, self.anchor, self.skip, self.first,
                self.ids[last] if last >= 0 else self.last_id, self.started, self.ended,
                self.opened)))
            self.count = 0
            if len(self.ranges) >= _AHEAD_RANGES:
                self.due = True
        self.last = -2
        self.next_position = -1

    def _note(self, i: int, position: int, started: float) -> None:
        """Record the step at ``position`` as replayed from the record ``ids[i]``."""
        if i == self.last + 1 and position == self.next_position and self.count:
            self.count += 1
        else:
            self._close()
            self.count, self.position, self.started = 1, position, started
            self.anchor, self.skip, self.first = self.tail, i, self.ids[i]
            self.opened = self.horizon
        self.last = i
        self.next_position = position + 1
        self.ended = started

    def replay(self, step_id: str, position: int, started: float) -> bytes | None:
        """:meth:`DiskStore.find_step` for the attempt's step at ``position`` (its start:
        ``started``, seconds since the epoch), recorded as replayed when found.

        Raises:
            CorruptJournalError: as :meth:`DiskStore.find_step`.
        """
        i = self.last + 1
        ids = self.ids
        if position == self.next_position and i < len(ids) and ids[i] == step_id:
            # the record after the one replayed last, at the next position: the open range
            # goes on (a plain value, checked with the key in use: values are bytes only
            # while the store has no key, which changes only with the key generation)
            value = self.values[i]
            if type(value) is bytes and self.generation == _key_generation:
                self.count += 1
                self.last = i
                self.next_position = position + 1
                self.ended = started
                return value
        else:
            i = self._taken(step_id)
            if i < 0:
                return None
        found = self._value(i, step_id)
        if found is not None:
            self._note(i, position, started)
        return found

    def find(self, step_id: str) -> bytes | None:
        """:meth:`DiskStore.find_step`, not recorded as a replay."""
        i = self._taken(step_id)
        return self._value(i, step_id) if i >= 0 else None

    def _taken(self, step_id: str) -> int:
        """The index of the step's first record among those read, taken out of the index
        (read further when it is not among them), or -1 if it has no record. (A record
        replayed in order stays in the index: a step is asked for once.)"""
        index = self.index
        i = (self._indexed(step_id, max(self.last + 1, 0)) if index is None
             else index.pop(step_id, -1))
        return i if i >= 0 else self._seek(step_id)

    def _value(self, i: int, step_id: str) -> bytes | None:
        """The result of the record ``ids[i]`` (read and checked alone unless it is a plain
        value checked with the key in use)."""
        value = self.values[i]
        if type(value) is bytes:
            if self.generation == _key_generation and self.store._key is None:
                return value
            value = _AHEAD_MISS  # a key was set since: read and checked again
        elif type(value) is tuple:
            value = value[0]  # not a plain value: checked by _step_value
        else:
            value = _AHEAD_MISS  # too large to keep here
        return self.store._find_alone(self.run_id, step_id, value)

    def _seek(self, step_id: str) -> int:
        """Read the records from the step's first one on (or, past the last record read,
        the next ones) and return its index, or -1 if it has no record."""
        ids = self.ids
        if len(ids) == _AHEAD_ROWS and self.last == len(ids) - 1 \
                and (tail := self._key_of_last()) is not None:
            # past the records read so far, the last of which was replayed last: the next
            # ones (continuing the open range)
            self._fill(tail, True)
            i = self._indexed(step_id, 0)
            if i >= 0:
                return i
        found = [key for key in self.store._step_rows("attempt, position", self.run_id,
                                                      step_id, -1)
                 if type(key[0]) is int and type(key[1]) is int]  # (not garbage)
        if not found:
            return -1
        # the step's first record in journal order, and the records after it
        self._fill((*min(found), True), False)
        return self._indexed(step_id, 0)

    def _indexed(self, step_id: str, expected: int) -> int:
        """The index of the step's first record among those read, taken out of the index,
        or -1: ``expected`` when its record is there (in order: no index made), else looked
        up in the index, made now (each step's first record in journal order wins)."""
        ids = self.ids
        if expected < len(ids) and ids[expected] == step_id:
            return expected
        index = self.index = dict(zip(reversed(ids), range(len(ids) - 1, -1, -1), strict=True))
        return index.pop(step_id, -1)

    def _key_of_last(self) -> tuple[int, int, bool] | None:
        """``(attempt, position, False)`` of the last record read (the records of its step
        after the tail, in journal order: as many as the window holds); None if they are
        not there any more."""
        ids, tail = self.ids, self.tail
        step = ids[-1]
        start = tail[:2]
        after = sorted(key for key in map(tuple, self.store._step_rows(
            "attempt, position", self.run_id, step, -1))
            if type(key[0]) is int and type(key[1]) is int  # (not garbage)
            and (key > start or (tail[2] and key == start)))
        n = ids.count(step)
        if len(after) < n:
            return None
        attempt, position = after[n - 1]
        return attempt, position, False

    def retract(self) -> None:
        """Take back the step recorded last (its result could not be loaded)."""
        if self.count > 1:
            self.count -= 1
            self.last -= 1  # (the record before it: -1, the one before the window's first)
        else:
            self.count = 0
            self.last = -2
        self.next_position = -1

    def take_ranges(self) -> list[ReplayRange]:
        """The ranges recorded so far (the open one closed), handed over to be journaled."""
        self._close()
        taken, self.ranges, self.due = self.ranges, [], False
        return taken


class DiskStore(Store):
    """The default store: a directory holding a diskcache cache and a SQLite journal.

    Nothing touches the disk until the first read or write. The directory is created readable
    by its owner only (mode 0o700), and a directory other users can write (or that belongs to
    another user) is refused unless ``allow_shared``: whoever can write a store can make
    durably load their pickles.

    Args:
        path: The store directory. Default: ``$DURABLY_DIR`` if set, else ``./.durably``
            (resolved against the working directory when the store is first used).
        size_limit: Cache size limit in bytes. Default None: the cache is never evicted.
            With a limit, the least recently stored entries are evicted once the cache grows
            past it; each eviction is logged on the ``durably`` logger and counted in
            :meth:`stats`. Journals are never evicted.
        synchronous: ``"normal"`` (default; a commit survives the process being killed) or
            ``"full"`` (a commit also survives a power cut; slower).
        key: A signing key (bytes or str, at least 16 bytes) for this store. Default: the key
            of ``durably.configure(key=...)``, else ``$DURABLY_KEY``, else the file named by
            ``$DURABLY_KEY_FILE``, else none. With a key, every value is signed when written
            and verified before it is unpickled; a value not signed with it is never loaded
            (a cache entry is recomputed, a journal value raises
            :class:`~durably.CorruptJournalError`).
        allow_shared: Accept a directory other users can write (default: ``True`` when
            ``$DURABLY_ALLOW_SHARED`` is ``1``, else False). Share a store only with people
            you trust, and give them a key (see the README's Security section).
        memo_entries: How many small cache values (up to 64 KiB each, 16 MiB in all) this
            object keeps in memory once read, so a repeated hit skips SQLite (default 4096;
            0 turns it off). A hit is served from memory only while no other connection
            has written the cache since (SQLite's ``PRAGMA data_version``, looked at every
            0.05 s at most), so an entry cleared or replaced by another process or thread is
            read again from disk from 0.05 s after that write on.

    Raises:
        DefinitionError: an argument has the wrong type (at construction).
        StoreError: (on first use) the path is a file, is not writable, is writable by other
            users, or holds a store written by a newer durably.

    Example:
        >>> import durably, tempfile
        >>> store = durably.DiskStore(tempfile.mkdtemp())
        >>> store.cache_put("k", b"v"); store.cache_get("k")
        b'v'
    """

    capabilities = frozenset({"integrity", "large_values", "maintenance"})

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        size_limit: int | None = None,
        synchronous: str = "normal",
        key: bytes | str | None = None,
        allow_shared: bool | None = None,
        memo_entries: int = 4096,
    ) -> None:
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise DefinitionError(
                f"DiskStore(path) takes a directory path (str or pathlib.Path), not {path!r}. "
                "Fix: DiskStore(\"/path/to/store\")."
            )
        if synchronous not in ("normal", "full"):
            raise ValueError(f"synchronous must be 'normal' or 'full', not {synchronous!r}. "
                             "Fix: synchronous=\"full\" to survive power cuts, else leave it out.")
        if size_limit is not None and (not isinstance(size_limit, int) or size_limit <= 0
                                       or isinstance(size_limit, bool)):
            raise ValueError(f"size_limit must be a positive number of bytes, not "
                             f"{size_limit!r}. Fix: size_limit=10 * 2**30 for 10 GiB, or leave "
                             "it out for no limit.")
        if isinstance(memo_entries, bool) or not isinstance(memo_entries, int) \
                or memo_entries < 0:
            raise ValueError(f"memo_entries must be a number of entries (0 or more), not "
                             f"{memo_entries!r}. Fix: memo_entries=0 to read every hit from "
                             "disk, or leave it out.")
        if allow_shared is not None and not isinstance(allow_shared, bool):
            raise DefinitionError(f"DiskStore(allow_shared=...) must be True or False, not "
                                  f"{allow_shared!r}. Fix: allow_shared=True.")
        self._given = Path(path).expanduser() if path is not None else None
        self._given_key = None if key is None else key_from(key, "DiskStore(key=...)")
        self.size_limit = size_limit
        self.synchronous = synchronous
        self.allow_shared = allow_shared
        self._lock = threading.RLock()  # (reentrant: a damaged cache met under it is moved)
        _STORES.add(self)
        self._local = threading.local()
        self._wal_sound = False  # the journal's write-ahead log was checked (see _check_wal)
        self._wal_unchecked = False  # not yet: its write lock was held when it was opened
        #: commits to the journal, and cache rows written, since the last request for a
        #: checkpoint of each in the background (see _checkpoint)
        self._journal_writes = self._cache_writes = 0
        self._cache: Any = None
        self._root: Path | None = None
        self._pid = 0
        self._key: SigningKey | None = None
        self._key_gen = -1
        self._warned: set[str] = set()
        self._unreleased: set[str] = set()  # leases of this process it could not release
        self.evicted = 0
        self._memo: dict[str, bytes] = {}  # cache key -> payload, oldest first
        self.memo_entries = memo_entries
        self._memo_bytes = 0
        self._memo_signer: bytes | None = None
        self._memo_gen = 0  # bumped by every forget: a value read before is not remembered
        self._memo_until = 0.0  # no need to look for others' writes before then (monotonic)
        self._watch: sqlite3.Connection | None = None  # sees every other connection's commit
        self._watch_pid = 0
        self._watch_version = -1
        self._read_cache = _Translate(self, "cache", "read the cache")
        self._write_cache = _Translate(self, "cache", "write the cache")
        self._read_journal = _Translate(self, "journal.sqlite3", "read the journal")
        self._write_journal = _WriteJournal(self, "journal.sqlite3", "write the journal")

    def __repr__(self) -> str:
        return f"DiskStore({str(self.path)!r})"

    @property
    def where(self) -> str:
        """The store's directory, as messages name it."""
        return str(self.path)

    @property
    def path(self) -> Path:
        """The store directory (absolute once the store was used)."""
        if self._root is not None:
            return self._root
        if self._given is not None:
            return self._given
        return Path(os.environ.get("DURABLY_DIR") or ".durably").expanduser()

    @property
    def url(self) -> str:
        """The store directory, absolute, as a ``file://`` URL: ``open_store(store.url)``,
        ``configure(store=store.url)`` or ``$DURABLY_STORE`` open the same directory."""
        return self.path.absolute().as_uri()

    def location(self) -> tuple[str, dict[str, Any]]:
        """:attr:`url` and the options given to the constructor; a signing key given in code
        travels with them (one from the environment is read where the store is opened)."""
        return self.url, {
            "size_limit": self.size_limit, "synchronous": self.synchronous,
            "key": self._given_key, "allow_shared": self.allow_shared,
            "memo_entries": self.memo_entries}

    def found(self) -> bool:
        """Whether the directory holds a store (its ``FORMAT`` file)."""
        return (self.path / "FORMAT").is_file()

    def check(self) -> None:
        """Open the store now (checks, format, key).

        Raises:
            StoreError: the store cannot be opened or written here.
        """
        self.path_checked()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as its :meth:`location` (as joblib's ``Memory`` pickles with its location):
        unpickled, it reopens the same directory."""
        from durably._store.urls import (
            open_store_for_pickle,  # (imported late: it imports this module)
        )

        return (open_store_for_pickle, self.location())

    @property
    def signed(self) -> bool:
        """Whether values are signed and verified: a key is configured (``key=``,
        ``configure(key=...)``, ``$DURABLY_KEY`` or ``$DURABLY_KEY_FILE``)."""
        return self._signing() is not None

    # -- opening ---------------------------------------------------------------------------
    def _open(self) -> Path:
        root = self._root
        if root is not None and self._pid == _pid[0]:
            return root
        with self._lock:
            if self._root is not None and self._pid == os.getpid():
                return self._root
            root = self.path.absolute()
            with self._translate(root, "open the store"):
                if root.exists() and not root.is_dir():
                    raise StoreError(
                        f"the store path {root} is a file, not a directory. Fix: point "
                        "DURABLY_DIR (or DiskStore(path)) at a directory, or remove the file."
                    )
                root.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._key_gen = -1
                self._signing()  # a bad key file is reported when the store opens
                self._check_private(root)
                self._check_format(root)
                clean_tmp(root / "tmp")
                if share_bits(root):  # a shared store: its members spill into tmp/ too
                    subdir(root, "tmp")
            self._root = root
            self._pid = os.getpid()
            self._cache = None
            self._local = threading.local()
            _serde.set_spill_dir(root / "tmp")
            return root

    def path_checked(self) -> Path:
        """Open the store now (checks, format, key) and return its directory.

        Raises:
            StoreError: the store cannot be opened or written here.
        """
        root = self._open()
        self._db()
        return root

    def _signing(self) -> SigningKey | None:
        """The key values are signed with, or None (resolved again after configure())."""
        if self._key_gen != _key_generation:
            with _key_lock:
                gen, process = _key_generation, _process_key
            self._key = self._given_key or process or env_key()
            self._key_gen = gen
        return self._key

    def _shared(self) -> bool:
        if self.allow_shared is not None:
            return self.allow_shared
        return os.environ.get("DURABLY_ALLOW_SHARED", "").strip().lower() in _TRUE

    def _check_private(self, root: Path) -> None:
        """Refuse a directory others can write: they could make durably load their pickles;
        and refuse symbolic links and (for a private store) parts others own or can write."""
        parts = check_parts(root, self._shared())
        if parts:
            raise StoreError(
                f"refusing the store {root}: {parts}. durably never follows links inside a "
                "store and, for a private store, accepts only parts that you alone can "
                f"write. Fix: replace the links by real folders (or move the store aside), "
                f"and chmod -R go-w {root} (chown it to yourself).")
        problems = check_private(root)
        if not problems:
            return
        if self._shared():
            if self._signing() is None and "shared" not in self._warned:
                self._warned.add("shared")
                log.warning("durably: the store %s is shared (%s) and no signing key is "
                            "configured: values written by the other users will be loaded. "
                            "Set DURABLY_KEY_FILE to a key file the sharers hold.",
                            root, problems)
            return
        raise StoreError(
            f"refusing the store {root}: {problems}. A store holds pickles that durably "
            "loads, so whoever can write it can run code in your processes. Fix: "
            f"chmod 700 {root} (and make it yours), or, to share it on purpose with people "
            "you trust, pass DiskStore(path, allow_shared=True) or set DURABLY_ALLOW_SHARED=1 "
            "and give them a signing key (DURABLY_KEY_FILE)."
        )

    def _check_format(self, root: Path) -> None:
        marker = root / "FORMAT"
        if marker.exists():
            text = marker.read_text().strip()
            try:
                found = int(text.rpartition(" ")[2])
            except ValueError:
                raise StoreError(
                    f"{marker} is damaged ({text[:40]!r}); expected 'durably-store "
                    f"{STORE_FORMAT}'. Fix: restore it, or move the store away and start anew."
                ) from None
            if found > STORE_FORMAT:
                raise StoreError(
                    f"the store {root} was written by a newer durably (format {found}; this "
                    f"version reads format {STORE_FORMAT}). Fix: upgrade durably, or use "
                    "another DURABLY_DIR."
                )
            if found < STORE_FORMAT:  # the journal upgrades itself when it is opened
                self._write_marker(root, marker)
        else:
            self._write_marker(root, marker)

    @staticmethod
    def _write_marker(root: Path, marker: Path) -> None:
        _write_replacing(marker, f"durably-store {STORE_FORMAT}\n")

    def _translate(self, where: str | Path, action: str) -> _Translate:
        """A context that turns OS and SQLite errors into a StoreError naming the path."""
        return _Translate(self, where, action)

    def store_error(self, exc: BaseException, where: str | Path, action: str) -> StoreError:
        """The StoreError (or CorruptJournalError) for an OS or SQLite error, naming the
        path and saying what to do."""
        path = where if isinstance(where, Path) else self.path / where
        text = str(exc).lower()
        code = getattr(exc, "errno", None)
        if _is_corrupt(exc):
            if path.name.startswith("journal"):
                return CorruptJournalError(
                    f"cannot {action} at {path}: {exc}: the journal file is damaged. Fix: "
                    f"restore it (with its -wal file) from a backup; 'sqlite3 {path} .recover' "
                    f"may salvage rows. Or start a new journal: move {path} (and its -wal, "
                    f"-shm files) aside and delete {path.with_name('JOURNAL')}, which marks "
                    "that the store had one (its runs are lost; the cache keeps working)."
                )
            hint = f"the cache index is damaged: move {path} aside; the cache starts empty."
        elif "full" in text or code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            hint = _FULL_HINT
        elif ("readonly" in text or "read-only" in text or "permission" in text
              or code in (errno.EACCES, errno.EPERM, errno.EROFS) or _read_only(path)):
            hint = ("the store is not writable: fix its permissions (chmod u+rwx), mount it "
                    "read-write, or set DURABLY_DIR to a writable directory.")
        elif type(exc).__name__ == "Timeout" or "locked" in text:
            hint = ("another process holds the store's lock for too long: retry, or look for "
                    "a hung process using this store.")
        elif _disk_full(path):  # (SQLite may say only "disk I/O error" on a full disk)
            hint = _FULL_HINT
        else:
            hint = "check the path and its permissions, or set DURABLY_DIR to another one."
        return StoreError(f"cannot {action} at {path}: {exc}. Fix: {hint}")

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

    def _db(self) -> sqlite3.Connection:
        root = self._open()
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is not None:
            if con.in_transaction:  # left open by an interrupted write, unless a block runs
                discard_leftover(con)
            return con
        path = root / "journal.sqlite3"
        with self._translate(path, "open the journal"):
            con = sqlite3.connect(
                str(path), timeout=60.0, isolation_level=None, check_same_thread=False
            )
            try:
                # the marker is looked at before the version is read: a process creating the
                # journal writes it only after its schema committed, so a marker seen first
                # means a version 0 read after it is a lost journal, not a racing creator
                marker = root / "JOURNAL"
                had_marker = marker.exists()
                version = con.execute("PRAGMA user_version").fetchone()[0]
                if version == 0 and had_marker:
                    raise StoreError(
                        f"the journal {path} is missing or empty, but this store had one "
                        f"({marker} says so): its runs would start over and their side effects "
                        "happen again. Fix: restore journal.sqlite3 together with its "
                        "journal.sqlite3-wal file (never delete the -wal file: after a crash it "
                        f"holds the latest steps), or, to start a new journal on purpose, "
                        f"delete {marker}.")
                if version > JOURNAL_FORMAT:
                    raise StoreError(
                        f"the journal {path} was written by a newer durably (format {version}"
                        f"; this version reads format {JOURNAL_FORMAT}). Fix: upgrade durably, "
                        "or use another DURABLY_DIR."
                    )
                share_file(root, path)  # before its -wal and -shm, which copy its mode
                if version == 0:  # (no effect once the file has its first table)
                    con.execute(f"PRAGMA page_size={_PAGE_SIZE}")
                _wal_mode(con)
                con.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
                con.execute(f"PRAGMA wal_autocheckpoint={_WAL_PAGES}")
                if not self._wal_sound:
                    # (before anything is written after a crash; while another connection
                    # holds the write lock, before this store's first write instead: a read
                    # does not wait for the lock)
                    self._check_wal(con, path, wait=version < JOURNAL_FORMAT)
                if version < JOURNAL_FORMAT:
                    self._upgrade(con)
                if not marker.exists():  # from now on a lost journal is noticed
                    _write_replacing(marker,
                                     "this store has a journal: journal.sqlite3 (+ -wal)\n")
                    share_file(root, marker)
            except BaseException:
                con.close()
                raise
        with contextlib.suppress(OSError):
            self._local.ino = os.stat(path).st_ino
        self._local.con = con
        return con

    def _journal_here(self) -> None:
        """Before a run's record is written: the journal this thread's connection writes is
        still the store's (not deleted, nor replaced, since it was opened). A store deleted
        while a run executed took the run's steps with it: the run must not report it
        finished, as if they were kept.

        Raises:
            StoreError: the journal file is gone or is another one.
        """
        ino = getattr(self._local, "ino", None)
        if ino is None or getattr(self._local, "con", None) is None:
            return
        path = (self._root or self.path) / "journal.sqlite3"
        try:
            now: int | None = os.stat(path).st_ino
        except OSError:
            now = None
        if now != ino:
            raise StoreError(
                f"the journal {path} was {'deleted' if now is None else 'replaced'} while "
                "this process used it: what it wrote since went to the file that was there "
                "before, so the steps of the runs it executed meanwhile are not kept. Fix: "
                "never delete a store in use; restart the process (or configure a new "
                "DiskStore), and call again: those steps execute again.")

    def clear_task(self, task: str) -> int:
        """Remove the cache entries of the task of this identity (see ``Task.clear``); 0
        when it never wrote to this cache."""
        from durably._store.disk.maintenance import clear

        try:
            return clear(self, task)
        except NotFoundError:
            return 0

    def cache_delete(self, keys: Iterable[str]) -> int:
        """Remove these cache entries, a few hundred per transaction; returns how many there
        were (an entry another process removed meanwhile is not counted).

        Raises:
            StoreError: the cache cannot be written.
        """
        from durably._store.disk.maintenance import delete_keys

        return delete_keys(self, keys)

    def task_identities(self) -> list[str]:
        """The identities (``module:name``) of the tasks that have key records, sorted."""
        from durably._store.disk.maintenance import task_identities

        with self._read_journal:
            return task_identities(self)

    def cache_size(self) -> int:
        """Bytes the cache's files take on disk."""
        with self._read_cache:
            return int(self.cache.volume())

    def large_value_bytes(self) -> int:
        """Bytes the files in ``blobs/`` take (hard links to one file counted once)."""
        sizes: dict[tuple[int, int], int] = {}
        try:
            for entry in os.scandir(self.path / "blobs"):
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    sizes[(st.st_dev, st.st_ino)] = st.st_size
        except OSError:
            return 0
        return sum(sizes.values())

    def cache_stats(self) -> dict[str, Any]:
        """What the cache holds, per task (the CLI's ``durably cache stats``)."""
        from durably._store.disk.maintenance import cache_stats

        return cache_stats(self)

    def prune(self, older_than: float | None = None, max_size: int | None = None, *,
              dry_run: bool = False) -> int:
        """Remove cache entries by age, then by size, oldest first (journals are never
        touched); see :meth:`durably.store.Store.prune`."""
        from durably._store.disk.maintenance import prune

        return prune(self, older_than, max_size, dry_run=dry_run)

    def clear(self, task: str | None = None, *, dry_run: bool = False) -> int:
        """Remove every cache entry, or a task's (its identity or name); see
        :meth:`durably.store.Store.clear`."""
        from durably._store.disk.maintenance import clear

        return clear(self, task, dry_run=dry_run)

    def collect_values(self, grace: float = 3600.0) -> tuple[int, int]:
        """Remove files in ``blobs/`` no journal row refers to (see :meth:`collect_blobs`)."""
        return self.collect_blobs(grace)

    def _check_wal_before_write(self) -> None:
        """:meth:`_check_wal`, waiting for the write lock, before a write (outside a
        transaction: a write inside one was checked when it began)."""
        con = self._db()
        if not con.in_transaction:
            self._check_wal(con, self._open() / "journal.sqlite3", wait=True)

    def _check_wal(self, con: sqlite3.Connection, path: Path, wait: bool = True) -> None:
        """Refuse a journal whose write-ahead log lost commits behind a damaged frame (see
        :mod:`durably._store.disk.wal`): read as it is, its runs' latest steps would look unfinished
        and execute again. The damaged log is copied aside first (``-wal.damaged``): the
        last connection to close checkpoints the log and deletes it, so that copy is what
        keeps the journal refused until the user decides. Once per store object, until
        the log is found sound."""
        wal = path.with_name(path.name + "-wal")
        kept = path.with_name(path.name + "-wal.damaged")
        lost = lost_commits(con, path, wait)
        if lost == BUSY:
            self._wal_unchecked = True  # (checked before the first write: _WriteJournal)
            if not wait:
                return
            # (the write that follows would wait for the lock as long: it fails the same
            # way, and never writes over a log that could not be checked)
            raise self.store_error(sqlite3.OperationalError("database is locked"), path,
                                   "write the journal")
        if lost is None and not kept.exists():
            self._wal_sound = True
            self._wal_unchecked = False
            return
        if lost is not None and not kept.exists():
            with contextlib.suppress(OSError):  # (a full disk: refused all the same)
                tmp = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
                shutil.copyfile(wal, tmp)
                os.replace(tmp, kept)
        if lost is not None:
            what = "the commit" if lost[1] == 1 else f"the {lost[1]} commits"
            where = f"is damaged at frame {lost[0]}: {what} written from it on cannot be read"
        else:
            where = ("was found damaged: the commits written after the damaged frame cannot "
                     "be read")
        raise StoreError(
            f"the journal {path} cannot be read whole: its write-ahead log {wal} {where} "
            "(SQLite stops at the first damaged frame; a copy of the damaged log is kept at "
            f"{kept}). Read as it is, the latest steps of the runs written then would "
            "look unfinished, and steps with side effects (cache=False) would execute again. "
            "Fix: restore journal.sqlite3 and journal.sqlite3-wal together from a backup of "
            f"the store, then delete {kept.name}; or, to go on without those commits (their "
            "steps execute again when their runs resume), stop the processes using the store, "
            "run: python -c \"import sqlite3; sqlite3.connect("
            f"'{path}').execute('PRAGMA wal_checkpoint(TRUNCATE)')\", then delete {kept.name}.")

    def _upgrade(self, con: sqlite3.Connection) -> None:
        """Create the journal's tables, or upgrade them from an older format, in one
        transaction (a racing process sees the new format and does nothing). Format 3 seals
        the blobs of older journals (signing them with the key in use: trust on upgrade)."""
        key = self._signing()
        with immediate(con):
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version >= JOURNAL_FORMAT:
                return
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    con.execute(statement)
            if version < 2:
                columns = {row[1] for row in con.execute("PRAGMA table_info(steps)")}
                for statement in SCHEMA_2.split(";"):
                    statement = statement.strip()
                    if not statement:
                        continue
                    column = statement.split()[5] if statement.startswith("ALTER") else None
                    if column is None or column not in columns:
                        con.execute(statement)
            con.execute(SCHEMA_3)
            for statement in SCHEMA_4.split(";"):
                if statement.strip():
                    con.execute(statement)
            if 1 <= version < 3:
                seal_old_blobs(con, key)
            con.create_function("durably_row_hash", 1, row_hash_sql, deterministic=True)
            if "sid" not in {row[1] for row in con.execute("PRAGMA table_info(steps)")}:
                con.execute("ALTER TABLE steps ADD COLUMN sid INTEGER")
            keyed = "kid" in {row[1] for row in con.execute("PRAGMA table_info(keys)")}
            for statement in (SCHEMA_5 + ";" + ("" if keyed else SCHEMA_5_KEYS)).split(";"):
                if statement.strip():
                    con.execute(statement)
            made = dict(con.execute(
                "SELECT name, sql FROM sqlite_master WHERE type='table' AND name IN "
                "('events', 'leases')").fetchall())
            for schema, due in ((SCHEMA_6_EVENTS, "AUTOINCREMENT" in made["events"]),
                                (SCHEMA_6_LEASES, "WITHOUT ROWID" not in made["leases"]),
                                (SCHEMA_6, True)):
                for statement in schema.split(";") if due else ():
                    if statement.strip():
                        con.execute(statement)
            con.execute(f"PRAGMA user_version={JOURNAL_FORMAT}")

    # -- cache -----------------------------------------------------------------------------
    def cache_get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or None: a miss, or an entry found damaged or
        (with a key) not signed with it — that entry is moved to ``damaged/`` with a warning
        naming it, so the caller recomputes it. A large value comes back as a file handle
        (:class:`~durably._keys.serde.Spilled`) checked end to end."""
        memo = self.memo_entries
        if memo:
            payload = self._memo.get(key)
            if payload is not None and self._memo_current():
                return payload
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
                found = _cache_fetch(cache, con, key)
            except sqlite3.OperationalError as exc:
                if "decode" not in str(exc):
                    raise
                found = Garbage(f"its index row holds text that is not UTF-8 ({exc})", b"")
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
            elif memo and len(payload) <= _MEMO_VALUE:
                self._remember(key, payload, gen)
            return payload
        if isinstance(found, FileValue):
            if found.file is None:
                payload, why = open_seal(found.data, signer, context)
                if payload is None:
                    self._cache_damaged(key, why, path=found.path, data=found.data)
                elif memo and len(payload) <= _MEMO_VALUE:
                    self._remember(key, payload, gen)
                return payload
            try:
                value, why = large_from_cache(self._open(), found, signer, context)
            except OSError as exc:
                raise self.store_error(exc, Path(found.path), "read a cache value") from exc
            if value is None:
                self._cache_damaged(key, why, path=found.path)
            return value
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
                self._watch = sqlite3.connect(str(root / "cache" / "cache.db"), timeout=60.0,
                                              isolation_level=None, check_same_thread=False)
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

    def _drop_memo(self) -> None:
        """Empty what memory holds, and refuse values read before now (lock held)."""
        self._memo, self._memo_bytes = {}, 0
        self._memo_gen += 1

    def _remember(self, key: str, payload: bytes, gen: int) -> None:
        with self._lock:
            memo = self._memo
            if gen != self._memo_gen or key in memo:
                return  # forgotten since it was read: it may be what was cleared
            memo[key] = payload
            self._memo_bytes += len(payload)
            while len(memo) > self.memo_entries or self._memo_bytes > _MEMO_BYTES:
                self._memo_bytes -= len(memo.pop(next(iter(memo))))

    def forget_memo(self, keys: Iterable[str] | None = None) -> None:
        """Drop the cache values kept in memory (all, or those of ``keys``): called when this
        process changes the cache behind a connection's back (prune, clear, eviction)."""
        with self._lock:
            if keys is None:
                self._drop_memo()
                return
            self._memo_gen += 1
            for key in keys:
                payload = self._memo.pop(key, None)
                if payload is not None:
                    self._memo_bytes -= len(payload)

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

    def _checkpoint_soon(self, *parts: str) -> None:
        """Ask for a checkpoint, in the background, of the store's database at ``parts``
        under its directory (see :mod:`durably._store.disk.checkpoint`)."""
        _checkpoint.request(str(self._open().joinpath(*parts)), self.synchronous)

    def cache_put(self, key: str, value: bytes, info: KeyRecord | None = None) -> None:
        self.cache_put_many(((key, value, info),))

    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        if not items:
            return
        cache = self.cache
        signer = self._signing()
        prepared: list[tuple[str, Any]] = []
        temps: list[str] = []
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
                        cache.set(*prepared[0])
                    else:
                        with cache.transact():
                            self._local.cache_tx = True
                            try:
                                for key, data in _insert_new_small(cache, prepared):
                                    cache.set(key, data)
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
                        "parts, created) VALUES (?, ?, ?, ?, ?, ?, ?)", infos)
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

    def list_keys(self, task: str, limit: int = 100) -> list[KeyRecord]:
        with self._read_journal:
            rows = self._db().execute(
                "SELECT task, cache_key, code, inputs, parts, created FROM keys WHERE task=? "
                "ORDER BY created DESC LIMIT ?", (task, limit)).fetchall()
        return [KeyRecord(t, k, c, json.loads(i), json.loads(p), cr) for t, k, c, i, p, cr in rows]

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

    # -- journal values --------------------------------------------------------------------
    def _seal_blob(self, value: bytes | None, *context: str,
                   placed: list[str] | None = None, reuse: bytes | None = None
                   ) -> bytes | None:
        """A journal value as it is stored: sealed, large ones as a reference to blobs/
        (``placed``: the file put there is appended to it). ``reuse``: the value the journal
        holds for it now (a run's stored result: every call of a finished run ends with it
        again); when it is in blobs/ with the same bytes, the reference names a new hard link
        to its file instead of a new copy (see :func:`blob_ref`)."""
        if value is None:
            return None
        if type(value) is Sealed:
            return value
        if isinstance(value, Unreadable):
            raise value.error
        signer = self._signing()
        ctx = _ctx(*context) if signer is not None else b""
        if isinstance(value, Spilled) or len(value) > _serde.SPILL_BYTES:
            root = self._open()
            with self._translate(root / "blobs", "store a large value"):
                spilled = as_spilled(value)
                ref: bytes | None = None
                if isinstance(reuse, Spilled) and same_content(spilled, reuse, root):
                    # (a hard link to its file: no space; collected meanwhile: a copy)
                    with contextlib.suppress(FileNotFoundError):
                        ref = blob_ref(root, reuse, signer, placed)
                value = ref if ref is not None else blob_ref(root, spilled, signer, placed)
        return seal(value, signer, ctx)

    def seal_ahead(self, value: bytes, *context: str, reuse: bytes | None = None) -> Sealed:
        """``value`` as the journal will store it (sealed; a large one written to blobs/
        now, the journal keeping a reference), for a write that follows: a large value is
        sealed before a transaction, which then does not keep other writers waiting while
        it is. ``context``: where it goes, as the write will say (``"result", run_id``).
        ``reuse``: the value stored there so far, as read from the journal (a run's result
        when its attempt started): a large one with the same bytes is referred to, not
        written again.

        Raises:
            StoreError: blobs/ cannot be written.

        Example:
            >>> import tempfile
            >>> store = DiskStore(tempfile.mkdtemp())
            >>> rec = RunRecord("r1", "m:f", "f", "finished", 1.0, 1.0, 1, "d")
            >>> rec.result = store.seal_ahead(b"x" * 2_000_000, "result", "r1")
            >>> store.put_run(rec)  # (written as it is: nothing sealed in the transaction)
            >>> store.find_run("r1").result == b"x" * 2_000_000
            True
        """
        placed: list[str] = []
        data = self._seal_blob(value, *context, placed=placed, reuse=reuse)
        assert data is not None
        sealed = Sealed(data)
        if placed:
            sealed.placed = placed[0]
        return sealed

    def discard_ahead(self, sealed: bytes) -> None:
        """Remove the file :meth:`seal_ahead` put in ``blobs/`` for a write that was not
        made (another process's record stands): no journal refers to it."""
        if isinstance(sealed, Sealed) and sealed.placed is not None:
            with contextlib.suppress(OSError):
                os.unlink(sealed.placed)

    def _open_journal_value(self, data: Any, context: tuple[str, ...], eager: bool,
                            error: Any) -> tuple[bytes | None, str]:
        """A journal value's payload (bytes, or a Spilled for a large one), or (None, why)."""
        signer = self._signing()
        payload, why = open_seal(data, signer, _ctx(*context) if signer is not None else b"")
        if payload is None:
            return None, why
        if payload.startswith(BLOB_REF):
            return open_blob(self._open(), payload, signer, eager, error)
        return payload, ""

    def _corrupt(self, run_id: str, what: str, why: str, fix: str = "") -> CorruptJournalError:
        return CorruptJournalError(
            f"the journal of run {run_id!r} at {self.path} is damaged: {what} cannot be "
            f"trusted: {why}. " + (fix or (
                f"Fix: call durably.DiskStore({str(self.path)!r}).repair_run({run_id!r}) to "
                "set the damaged rows aside (the steps they recorded run again), or start a "
                "new run with fresh=True."))
        )

    # -- journals --------------------------------------------------------------------------
    def find_run(self, run_id: str) -> RunRecord | None:
        row = self._query_one(f"SELECT {RUN_COLS} FROM runs WHERE run_id=?", (run_id,))
        return self._run_from_row(row, strict=True) if row else None

    def find_latest_run(self, entrypoint: str, input_digest: str) -> RunRecord | None:
        row = self._query_one(
            f"SELECT {RUN_COLS} FROM runs WHERE entrypoint=? AND input_digest=? "
            "ORDER BY updated DESC, rowid DESC LIMIT 1",
            (entrypoint, input_digest),
        )
        return self._run_from_row(row, strict=True) if row else None

    def _run_from_row(self, row: Sequence[Any], strict: bool) -> RunRecord | None:
        """A run's record; its arguments and result are opened when they are loaded. A
        damaged result reads as "not stored" (a rerun stores it again); damaged arguments
        raise CorruptJournalError when loaded."""
        bad = garbage(row, RUN_TYPES)
        if bad:
            run_id = row[0] if isinstance(row[0], str) else repr(row[0])
            error = self._corrupt(run_id, "its run row", f"the row is garbage ({bad})")
            if strict:
                raise error
            log.warning("durably: %s", error)
            return None
        rec = RunRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7])
        rec.error = row[10] if isinstance(row[10], str) else None
        run_id = rec.run_id
        if row[8] is not None:
            args, why = self._open_journal_value(
                row[8], ("args", run_id), False,
                lambda why: self._corrupt(run_id, "its stored arguments", why))
            rec.args = args if args is not None else Unreadable(self._corrupt(
                run_id, "its stored arguments", why,
                f"Fix: call the entrypoint with the same arguments (and run_id={run_id!r}) "
                "to continue it, or repair_run() it."))
        if row[9] is not None:
            result, why = self._open_journal_value(
                row[9], ("result", run_id), False,
                lambda why: self._corrupt(run_id, "its stored result", why,
                                          "Fix: rerun the entrypoint with the same arguments: "
                                          "its steps replay and its result is stored again."))
            if result is None:
                rec.error = (f"its stored result is damaged ({why}). Fix: rerun the entrypoint "
                             "with the same arguments: its steps replay from the journal and "
                             "the result is stored again")
            rec.result = result
        return rec

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """Make the journal writes this thread does inside one transaction: they all commit
        when the block ends, or none of them when it raises. durably starts and ends each run
        this way (its lease, record and events: one commit instead of four), and a lease
        taken this way is seen by other processes only with the run's record.

        Cache writes are not part of it (the cache is another database). Other threads and
        processes writing the journal wait for the block to end, so keep it short.

        Raises:
            StoreError: the journal cannot be written (the block's writes are rolled back).

        Example:
            >>> import tempfile
            >>> store = DiskStore(tempfile.mkdtemp())
            >>> rec = RunRecord("r1", "m:f", "f", "running", 1.0, 1.0, 1, "d")
            >>> with store.batch():
            ...     store.put_run(rec)
            ...     store.append_events([EventRecord("r1", "custom", 1.0, 1)])
            >>> (store.find_run("r1").status, len(store.list_events("r1")))
            ('running', 1)
        """
        return _Batch(self)

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """Make the journal reads this thread does inside one read transaction: they all see
        the journal as it was when the first of them read it (other processes' commits
        after that are not seen), and no write lock is taken, so writers never wait for
        the block. durably reads the run an attempt resumes this way (its record, lease,
        questions and first steps: one consistent view) when the run had ended.

        Do not write inside it (a write would need the lock the block did not take).

        Raises:
            StoreError: the journal cannot be read.

        Example:
            >>> import tempfile
            >>> store = DiskStore(tempfile.mkdtemp())
            >>> store.put_run(RunRecord("r1", "m:f", "f", "failed", 1.0, 1.0, 1, "d"))
            >>> with store.snapshot():
            ...     (store.find_run("r1").status, store.run_holder("r1"))
            ('failed', None)
        """
        return _Batch(self, "BEGIN")

    def abandon(self) -> None:
        """Roll back the journal transaction this thread's connection has open: the caller
        left the ``with batch()`` block that began it without ending it (a KeyboardInterrupt
        landed as its ``__exit__`` was entered)."""
        con = getattr(self._local, "con", None)
        if con is not None:
            discard_leftover(con, force=True)

    def put_run(self, record: RunRecord) -> None:
        self._journal_here()
        args = self._seal_blob(record.args, "args", record.run_id)
        result = self._seal_blob(record.result, "result", record.run_id)
        values = (*run_row(record)[:8], args, result, record.error)
        with self._write_journal:
            self._db().execute(_PUT_RUN, values)

    def put_run_if_current(self, record: RunRecord, previous: int | None = None) -> bool:
        """:meth:`put_run` of an attempt's final record, only while the run is still that
        attempt's (no other process took it over: the stored record has
        ``record.attempt``), checked by the statement that writes it (a large value is
        sealed, and written to ``blobs/``, before): False, and nothing written, when it is
        not. With ``previous``: only while the stored record has that attempt instead (an
        attempt whose start is journaled with this write: the one before it must still be
        the run's last).

        Raises:
            StoreError: the journal cannot be written.
        """
        self._journal_here()
        args = self._seal_blob(record.args, "args", record.run_id)
        result = self._seal_blob(record.result, "result", record.run_id)
        values = (*run_row(record)[1:8], args, result, record.error, record.run_id,
                  record.attempt if previous is None else previous)
        with self._write_journal:
            return self._db().execute(_PUT_RUN_IF_CURRENT, values).rowcount == 1

    def acquire_run(self, run_id: str, owner: Owner) -> Owner | None:
        lease = (run_id, owner.host, owner.pid, owner.started, owner.token, time.time())
        with self._write_journal, immediate(self._db()) as db:
            if db.execute("INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?) "
                          "ON CONFLICT (run_id) DO NOTHING", lease).rowcount == 1:
                return None  # (the common case: nobody held it)
            holder = self._live_holder(db, run_id, owner)
            if holder is not None:
                return holder
            db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?)", lease)
        return None

    def check_run(self, run_id: str, owner: Owner) -> Owner | None:
        """The live holder of the run's lease other than ``owner``, else None, without
        taking the lease: for an attempt whose start and end are written in one transaction
        (an attempt that only replayed). A lease its process left behind (dead, or a damaged
        row: with a warning) is removed, as :meth:`acquire_run` would take it over.

        Raises:
            StoreError: the journal cannot be written.
        """
        with self._write_journal, immediate(self._db()) as db:
            return self._live_holder(db, run_id, owner, remove=True)

    def _live_holder(self, db: sqlite3.Connection, run_id: str, owner: Owner,
                     remove: bool = False) -> Owner | None:
        """The live holder of the run's lease row other than ``owner`` (inside a write
        transaction), else None; ``remove``: a row that is not live is deleted."""
        row = db.execute("SELECT host, pid, started, token, heartbeat FROM leases "
                         "WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            return None
        holder = Owner(*row)
        try:
            alive = holder.alive(time.time())
        except (TypeError, ValueError, OverflowError):  # a damaged lease row
            log.warning("durably: the lease of run %r at %s is damaged (%r); taking it "
                        "over", run_id, self.path, row)
            alive = False
        if holder.token != owner.token and holder.token not in self._unreleased and alive:
            return holder
        if remove and (not alive or holder.token in self._unreleased):
            db.execute("DELETE FROM leases WHERE run_id=?", (run_id,))
        return None

    def run_holder(self, run_id: str) -> Owner | None:
        """The owner of the run's lease if it is alive (the run is executing now), else
        None: no lease (the run is not executing), or one its process left behind when it
        died (on another host: not renewed for ``LEASE_SECONDS``)."""
        row = self._query_one("SELECT host, pid, started, token, heartbeat FROM leases "
                              "WHERE run_id=?", (run_id,))
        if row is None:
            return None
        holder = Owner(*row)
        try:
            alive = holder.alive(time.time())
        except (TypeError, ValueError, OverflowError):  # a damaged lease row: taken over
            return None
        return holder if alive and holder.token not in self._unreleased else None

    def renew_run(self, run_id: str, owner: Owner) -> bool:
        """Refresh the heartbeat of the lease ``owner`` holds; False if it holds none (the
        run was taken over by another process, or its lease removed)."""
        with self._write_journal:
            return self._db().execute(
                "UPDATE leases SET heartbeat=? WHERE run_id=? AND token=?",
                (time.time(), run_id, owner.token)).rowcount == 1

    def renew_run_apart(self, run_id: str, owner: Owner) -> bool:
        """:meth:`renew_run` from a thread that does nothing else (the lease's heartbeat),
        on a connection opened for it and closed after, so that none of that thread stays
        open (the journal's write-ahead log is removed when the last one closes). It waits
        at most 5 s for a journal another process keeps locked (the next beat tries
        again), and never creates a journal that was deleted meanwhile.

        Returns:
            False if ``owner`` holds no lease of the run (taken over, or removed), else True.

        Raises:
            sqlite3.Error: the journal cannot be written now.
        """
        root = self._root
        if root is None:
            return True
        con = sqlite3.connect(f"{(root / 'journal.sqlite3').as_uri()}?mode=rw", uri=True,
                              timeout=5.0, isolation_level=None)
        try:
            return con.execute("UPDATE leases SET heartbeat=? WHERE run_id=? AND token=?",
                               (time.time(), run_id, owner.token)).rowcount == 1
        finally:
            con.close()

    def release_run(self, run_id: str, owner: Owner) -> bool:
        """Give up the lease ``owner`` holds; False if it held none (the run was taken over
        by another process, or its lease removed)."""
        try:
            with self._write_journal:
                return self._db().execute("DELETE FROM leases WHERE run_id=? AND token=?",
                                          (run_id, owner.token)).rowcount == 1
        except StoreError:  # (a full disk): this process may take the lease over later
            self._unreleased.add(owner.token)
            raise

    def list_runs(self, entrypoint: str | None = None) -> list[RunRecord]:
        """Runs, most recently updated first (a run whose row is garbage is left out, with a
        warning)."""
        with self._read_journal:
            if entrypoint is None:
                rows = self._db().execute(
                    f"SELECT {RUN_COLS} FROM runs ORDER BY updated DESC, rowid DESC"
                ).fetchall()
            else:
                rows = self._db().execute(
                    f"SELECT {RUN_COLS} FROM runs WHERE entrypoint=? OR name=? "
                    "ORDER BY updated DESC, rowid DESC",
                    (entrypoint, entrypoint),
                ).fetchall()
        found = (self._run_from_row(row, strict=False) for row in rows)
        return [rec for rec in found if rec is not None]

    def delete_runs(self, run_ids: Iterable[str], *, dry_run: bool = False,
                    skip_executing: bool = False) -> list[str]:
        """Delete runs from the journal: each run's record, steps, replays, events (its
        questions and answers among them), records set aside by :meth:`repair_run` and
        lease; then the files in ``blobs/`` that only they referred to. The cache is kept:
        a step of a deleted run still serves later calls. Each run is deleted in one
        transaction, all of it or nothing (a crash leaves at most unreferenced files in
        ``blobs/``, which :meth:`collect_blobs` removes). A call with the same arguments
        afterwards starts a new run.

        Args:
            run_ids: The runs' ids; an id with no run is skipped.
            dry_run: Check the runs and say which would be deleted; delete nothing.
            skip_executing: Leave out a run a live process is executing (not deleted, not
                returned) instead of raising.

        Returns:
            The ids of the runs deleted (with ``dry_run``: that would be), in the order given.

        Raises:
            RunStateError: a live process is executing one of the runs (its lease): checked
                for every run before the first is deleted, and then nothing is deleted; a
                run that started since stops the deletion there (those before it are
                deleted).
            StoreError: the journal or ``blobs/`` cannot be read or written.

        Example:
            >>> import durably, tempfile
            >>> store = durably.DiskStore(tempfile.mkdtemp())
            >>> @durably.entrypoint(store=store)
            ... def greet(name):
            ...     return f"hello {name}"
            >>> run = greet.run("ada")
            >>> store.delete_runs([run.id, "no-such-run"]) == [run.id]
            True
            >>> store.list_runs()
            []
        """
        if isinstance(run_ids, (str, bytes)):
            raise TypeError(f"delete_runs() takes a list of run ids, not one id: "
                            f"delete_runs([{run_ids!r}])")
        ids = list(dict.fromkeys(run_ids))
        for run_id in ids:
            if not isinstance(run_id, str):
                raise TypeError(f"delete_runs() takes run ids (str), not {run_id!r}")
        owner = me()
        with self._read_journal:
            db = self._db()
            found = [r for r in ids
                     if db.execute("SELECT 1 FROM runs WHERE run_id=?", (r,)).fetchone()]
        for run_id in list(found):
            holder = self.run_holder(run_id)
            if holder is not None:
                if not skip_executing:
                    raise self._executing(run_id, holder)
                found.remove(run_id)
        if dry_run:
            return found
        deleted: list[str] = []
        named: set[str] = set()  # the blobs/ files the deleted rows referred to
        try:
            for run_id in found:
                with self._write_journal, immediate(self._db()) as db:
                    holder = self._live_holder(db, run_id, owner)
                    if holder is not None:  # (started since: left as it is)
                        if skip_executing:
                            continue
                        raise self._executing(run_id, holder)
                    named |= self._blob_names(db, run_id)
                    gone = db.execute("DELETE FROM runs WHERE run_id=?", (run_id,)).rowcount
                    for table in _RUN_TABLES:
                        db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
                if gone:
                    deleted.append(run_id)
        finally:
            if deleted:  # (and the files attempts left behind: see collect_blobs)
                self.collect_blobs(named=named)
        return deleted

    def _executing(self, run_id: str, holder: Owner) -> RunStateError:
        return RunStateError(
            f"run {run_id!r} at {self.path} is being executed by {holder.describe()}: a run "
            "is deleted only while no process executes it. Fix: wait for that attempt to end "
            "(or stop it), then delete the run again.")

    def _blob_names(self, db: sqlite3.Connection, run_id: str | None = None) -> set[str]:
        """The names of the files in ``blobs/`` that the journal's rows refer to (only the
        run's rows, with ``run_id``), read with ``db`` (inside a transaction)."""
        names: set[str] = set()
        for table, column, small in _REF_COLUMNS:
            where = f"instr(CAST({column} AS BLOB), ?) > 0"
            if small:  # (a reference is short: a larger value is read no further)
                where = f"length({column}) <= {_REF_LARGEST} AND {where}"
            params: tuple[Any, ...] = (BLOB_REF,)
            if run_id is not None:
                where, params = f"run_id=? AND {where}", (run_id, BLOB_REF)
            for (data,) in db.execute(
                    f"SELECT CAST({column} AS BLOB) FROM {table} WHERE {where}", params):
                names.update(m.decode("ascii") for m in _REF_NAME.findall(data))
        return names

    def collect_blobs(self, grace: float = 3600.0, *, named: Iterable[str] = (),
                      dry_run: bool = False) -> tuple[int, int]:
        """Remove the files in ``blobs/`` that no journal row refers to: large values of
        deleted runs, and those left by attempts that were killed or refused between
        writing a large value and journaling it. A file changed less than ``grace`` seconds
        ago is kept (a write under way may be about to refer to it), unless it is in
        ``named`` (files whose references were deleted). A file no journal refers to is
        never read again, so removing it loses nothing.

        Args:
            grace: Keep files younger than this many seconds (changed or linked since).
            named: Names of files in ``blobs/`` removed whatever their age once nothing
                refers to them.
            dry_run: Count what would be removed; remove nothing.

        Returns:
            ``(files, bytes)`` removed (with ``dry_run``: that would be); the bytes are
            those freed (a file with hard links elsewhere, in the cache say, frees none).

        Raises:
            ValueError: ``grace`` is negative.
            StoreError: the journal or ``blobs/`` cannot be read.

        Example:
            >>> import tempfile
            >>> DiskStore(tempfile.mkdtemp()).collect_blobs()
            (0, 0)
        """
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace >= 0:
            raise ValueError(f"collect_blobs(grace=...) must be seconds >= 0, not {grace!r}")
        root = self._open()
        folder = root / "blobs"
        named = set(named)
        try:
            files = [e for e in os.scandir(folder) if valid_blob_name(e.name)]
        except FileNotFoundError:
            return 0, 0
        except OSError as exc:
            raise self.store_error(exc, folder, "read blobs/") from exc
        if not files:
            return 0, 0
        with self.snapshot(), self._read_journal:  # (one view of every row)
            referred = self._blob_names(self._db())
        cutoff = time.time() - grace
        doomed: list[tuple[os.DirEntry[str], os.stat_result]] = []
        for entry in files:  # (every file looked at before any is removed: removing a
            # name of a file with other links makes its other names look changed now)
            if entry.name in referred:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise self.store_error(exc, entry.path, "read blobs/") from exc
            if entry.name in named or max(st.st_mtime, st.st_ctime) <= cutoff:
                doomed.append((entry, st))
        links: dict[tuple[int, int], int] = {}  # the names removed of each file
        for _, st in doomed:
            links[(st.st_dev, st.st_ino)] = links.get((st.st_dev, st.st_ino), 0) + 1
        freed = sum({(st.st_dev, st.st_ino): st.st_size for _, st in doomed
                     if links[(st.st_dev, st.st_ino)] >= st.st_nlink}.values())
        removed = 0
        for entry, _ in doomed:
            if not dry_run:
                try:
                    os.unlink(entry.path)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise self.store_error(exc, entry.path, "remove a file of blobs/") from exc
            removed += 1
        return removed, freed

    def find_step(self, run_id: str, step_id: str) -> bytes | None:
        """The result of a finished step of the run, or None.

        A recorded result that fails its checksum or signature is never loaded. For a
        cacheable task (``cache=True``: declared safe to serve from any run or to compute
        again) it reads as missing, with a warning: the step is served from the cache or
        executed again. For a ``cache=False`` task, which may have side effects, it raises
        :class:`~durably.CorruptJournalError`: executing it again is the user's decision
        (:meth:`repair_run`).

        Raises:
            CorruptJournalError: the recorded result of a ``cache=False`` step is damaged.
        """
        window = getattr(self._local, "window", None)
        if window is None or window.run_id != run_id:
            found = self._step_rows("attempt, position", run_id, step_id, -1)
            if not found:
                return None
            # from the step's first record on: a resumed run asks for the next ones next
            window = self._local.window = ReadAhead(self, run_id, (*min(found), True))
        return window.find(step_id)

    def _find_alone(self, run_id: str, step_id: str, data: Any = _AHEAD_MISS) -> bytes | None:
        """:meth:`find_step` without a read-ahead. ``data``: the result of the step's first
        record, when known."""
        if data is _AHEAD_MISS:
            found = self._step_rows(_RESULT, run_id, step_id, 1)
            if not found:
                return None
            data = found[0][0]
        value, why = self._step_value(run_id, step_id, data)
        if value is not None:
            return value
        return self._find_step_slow(run_id, step_id, why)

    def _step_rows(self, columns: str, run_id: str, step_id: str, limit: int
                   ) -> list[Any]:
        """``columns`` of the finished records of a step of a run, first written first (at
        most ``limit``; -1: all). They are found by sid, and, when that finds fewer than
        ``limit``, among rows without one: written by a process of an older durably that
        had the journal open before it was upgraded (``steps_unhashed``, empty otherwise)."""
        finished = "run_id=? AND step_id=? AND status IN ('ran', 'cached') ORDER BY rowid"
        with self._read_journal:
            db = self._db()
            rows = db.execute(
                f"SELECT rowid, {columns} FROM steps WHERE sid=? AND {finished} LIMIT ?",
                (step_sid(run_id, step_id), run_id, step_id, limit)).fetchall()
            if limit < 0 or len(rows) < limit:
                older = db.execute(
                    f"SELECT rowid, {columns} FROM steps WHERE sid IS NULL AND {finished}",
                    (run_id, step_id)).fetchall()
                if older:  # (rare: merged in the order they were written)
                    rows = sorted(rows + older)[:None if limit < 0 else limit]
        return [row[1:] for row in rows]

    def parents_of(self, run_id: str, step_ids: Iterable[str]) -> dict[str, str | None]:
        """The parent (``parent_id``) of each of these steps of the run that has a record,
        whatever its status; found by sid (and among rows without one)."""
        wanted = list(step_ids)
        found: dict[str, str | None] = {}
        with self._read_journal:
            db = self._db()
            for i in range(0, len(wanted), 400):
                chunk = wanted[i:i + 400]
                marks = ", ".join("?" * len(chunk))
                sids = [step_sid(run_id, step) for step in chunk]
                rows = db.execute(f"SELECT step_id, parent_id FROM steps WHERE sid IN ({marks}) "
                                  "AND run_id=?", (*sids, run_id)).fetchall()
                rows += db.execute(f"SELECT step_id, parent_id FROM steps WHERE sid IS NULL AND "
                                   f"run_id=? AND step_id IN ({marks})", (run_id, *chunk)
                                   ).fetchall()
                asked = set(chunk)
                for step, parent in rows:
                    if step in asked:
                        found.setdefault(step, parent)
        return found

    def read_ahead(self, run_id: str) -> ReadAhead:
        """Read the first finished steps of a run that is being resumed, before its first
        step asks: for :meth:`find_step` in this thread, and for the attempt, whose replays
        :meth:`ReadAhead.replay` records as ranges."""
        window = ReadAhead(self, run_id)
        self._local.window = window
        return window

    def _horizon(self) -> int:
        """The rowid of the last step record journaled (0: none)."""
        with self._read_journal:
            row = self._db().execute("SELECT max(rowid) FROM steps").fetchone()
        return row[0] or 0

    def _ahead_rows(self, run_id: str, attempt: int, position: int, inclusive: bool
                    ) -> tuple[Sequence[str], list[Any], int]:
        """The next finished steps of the run after ``(attempt, position)`` (``inclusive``:
        from it) in journal order (a resumed run replays them in that order): one query for
        the next 512 instead of one per step. Returns their step ids, the value of each, and
        the key generation the values were checked with. A value is a plain result's
        payload, its checksum checked; any other result as ``(data,)``; None for a result
        too large to keep here (over 64 KiB, or past 8 MB in all: read alone when asked
        for). The journal is never held whole."""
        with self._read_journal:
            rows = self._db().execute(
                f"SELECT step_id, CASE WHEN length(result) <= {_AHEAD_LARGEST} THEN {_RESULT} END "
                "FROM steps WHERE run_id=? AND status IN ('ran', 'cached') AND "
                f"(attempt, position) {'>=' if inclusive else '>'} (?, ?) "
                f"ORDER BY attempt, position LIMIT {_AHEAD_ROWS}",
                (run_id, attempt, position)).fetchall()
        generation = _key_generation
        if not rows:
            return (), [], generation
        ids, results = zip(*rows, strict=True)
        del rows  # (its results, once the values are made)
        values: list[Any] = list(results)
        del results
        if (len(values) * _AHEAD_LARGEST > _AHEAD_BYTES
                and sum(map(len, filter(None, values))) > _AHEAD_BYTES):
            size = 0
            for i, data in enumerate(values):
                if data is not None:
                    size += len(data)
                    if size > _AHEAD_BYTES:
                        values[i] = None
        if self._key is None and self._key_gen == generation:
            # (_step_value's common case, with open_plain inlined, for every step at once, in
            # a comprehension: a third faster than a loop): a plain value's payload when its
            # header is the one sealing it without a key would write (magic and checksum: a
            # fifth faster than reading them apart); any other value as (data,)
            check, header = xxhash.xxh3_64_intdigest, _PLAIN.pack
            values = [
                p if (type(d) is bytes and d[:12] == header(MAGIC_PLAIN, check(p := d[12:]))
                      and p[:_REF_LEN] != BLOB_REF)
                else None if d is None else (d,)
                for d in values]
        else:
            values = [None if d is None else (d,) for d in values]
        return ids, values, generation

    def _step_value(self, run_id: str, step_id: str, data: Any) -> tuple[bytes | None, str]:
        if data is None:
            return None, "it has no recorded result"
        if self._key is None and self._key_gen == _key_generation and type(data) is bytes:
            payload, why = open_seal(data)  # the common case, kept short: unsigned, small
            if payload is None or not payload.startswith(BLOB_REF):
                return payload, why
        return self._open_journal_value(
            data, ("step", run_id, step_id), True,
            lambda why: self._corrupt(run_id, f"the result of step {step_id}", why))

    def _find_step_slow(self, run_id: str, step_id: str, why: str) -> bytes | None:
        """Another, sound record of the step (written when it ran again), else the verdict on
        the damaged one."""
        rows = self._step_rows(f"{_RESULT}, cache_key, task", run_id, step_id, -1)
        for data, _, _ in rows:  # (the damaged one among them reads as damaged again)
            value, _why = self._step_value(run_id, step_id, data)
            if value is not None:
                return value
        if not rows:  # set aside meanwhile (repair_run): not in the journal any more
            return None
        _, cache_key, task = rows[0]
        what = f"the recorded result of step {step_id} (task {task!r})"
        if isinstance(cache_key, str) and cache_key:
            log.warning("durably: the journal of run %r at %s is damaged: %s cannot be "
                        "trusted (%s); the task is cacheable, so it is taken from the cache or "
                        "executed again", run_id, self.path, what, why)
            return None
        raise self._corrupt(run_id, what, why, (
            f"durably will not execute {task!r} again by itself: it finished in this run, and "
            "a cache=False task may have side effects. Fix: if running it again is safe, call "
            f"durably.DiskStore({str(self.path)!r}).repair_run({run_id!r}) and rerun; else "
            "start a new run with fresh=True."))

    def append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> None:
        """Journal step records (with the results of finished steps). Records of replayed
        steps are kept compactly, many to a row (:meth:`append_replays`)."""
        self._append_steps(steps, checked=False)

    def append_steps_if_current(self, steps: Sequence[tuple[StepRecord, bytes | None]]
                                ) -> bool:
        """:meth:`append_steps`, only while each step's run is still its attempt's (no other
        process took it over: the run's record has the step's attempt), checked by each
        row's INSERT itself. A step that ends after its own attempt did (a thread the user
        started) is still journaled. False, and nothing written but replay records, when a
        row is refused.

        Raises:
            StoreError: the journal cannot be written.
        """
        return self._append_steps(steps, checked=True)

    def _append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]], *,
                      checked: bool) -> bool:
        if not steps:
            return True
        rows = []
        replays: dict[tuple[str, int], list[Replay]] = {}
        for rec, data in steps:
            compact = compact_replay(rec) if rec.status == "replayed" and data is None else None
            if compact is not None:
                replays.setdefault((rec.run_id, rec.attempt), []).append(compact)
            else:
                rows.append((*step_row(rec),
                             self._seal_blob(data, "step", rec.run_id, rec.step_id),
                             step_sid(rec.run_id, rec.step_id))
                            + ((rec.run_id, rec.attempt) if checked else ()))
        sql = _INSERT_STEP_IF_CURRENT if checked else _INSERT_STEP
        with self._write_journal:
            db = self._db()
            if len(rows) == 1 and not replays:
                return db.execute(sql, rows[0]).rowcount == 1
            with immediate(db):
                written = db.executemany(sql, rows).rowcount if rows else 0
                for (run_id, attempt), found in replays.items():
                    if not self._append_replays(run_id, attempt, found, checked=checked):
                        written -= 1  # (refused: that run's attempt is not its last)
        return written == len(rows)

    def append_replays(self, run_id: str, attempt: int,
                       replays: Sequence[Replay | ReplayRange]) -> bool:
        """Journal steps of ``attempt`` served from the run's journal, many to a row: what a
        replayed step's :class:`StepRecord` holds, without building one (75 bytes a step),
        or a :class:`ReplayRange` of steps replayed from consecutive records (81 bytes a
        range). :meth:`list_steps` returns them as records of status ``"replayed"``.

        Args:
            run_id: The run.
            attempt: The attempt that replayed them.
            replays: ``(position, started, ended, step_id, parent_id, cache_key, task)`` of
                each step (ids are 32 hex digits; ``parent_id`` may be None, ``cache_key``
                "" for a ``cache=False`` task), or ranges (made by :class:`ReadAhead`).

        Returns:
            False, and nothing written, if the run's stored record is not ``attempt``'s
            (another attempt took the run over: fencing).

        Raises:
            StoreError: the journal cannot be written.
        """
        return self._append_replays(run_id, attempt, replays, checked=True)

    def _append_replays(self, run_id: str, attempt: int,
                        replays: Sequence[Replay | ReplayRange], *, checked: bool) -> bool:
        ranges: list[ReplayRange] = []
        steps: list[Replay] = []
        for r in replays:
            if type(r) is ReplayRange:
                ranges.append(r)
            else:
                steps.append(r)  # type: ignore[arg-type]  # (a Replay)
        # a checksum, never a signature: the row is parsed, never unpickled, so a store opened
        # with another key (to look inside it) still lists its replays
        blobs = ([pack_replays(steps)] if steps else []) + (
            [pack_ranges(ranges)] if ranges else [])
        for blob in blobs:
            with self._write_journal:
                if checked:
                    if self._db().execute(
                            "INSERT INTO replays (run_id, attempt, steps) SELECT ?, ?, ? WHERE "
                            "EXISTS (SELECT 1 FROM runs WHERE run_id=? AND attempt=?)",
                            (run_id, attempt, seal(blob), run_id, attempt)).rowcount != 1:
                        return False
                else:
                    self._db().execute(
                        "INSERT INTO replays (run_id, attempt, steps) VALUES (?, ?, ?)",
                        (run_id, attempt, seal(blob)))
        return True

    def _replayed(self, run_id: str, attempt: int | None) -> list[StepRecord]:
        """The records of the run's replayed steps kept by :meth:`append_replays`. They only
        say which steps an attempt replayed: a damaged row is left out, with a warning
        (:meth:`repair_run` sets it aside), and never stops a run from continuing."""
        sql = "SELECT attempt, steps FROM replays WHERE run_id=?"
        params: tuple[Any, ...] = (run_id,)
        if attempt is not None:
            sql, params = sql + " AND attempt=?", (run_id, attempt)
        with self._read_journal:
            rows = self._db().execute(sql + " ORDER BY rowid", params).fetchall()
        found: list[StepRecord] = []
        ranged: list[tuple[int, list[PackedRange]]] = []
        for at, data in rows:
            payload, why = (None, "the row is garbage") if type(at) is not int \
                else open_seal(data)
            if payload is not None:
                try:
                    ranges = unpack_ranges(payload)
                    if ranges is not None:
                        ranged.append((at, ranges))
                        continue
                    found.extend(StepRecord(run_id, step, parent, task, "replayed", at,
                                            position, started, ended, None, key)
                                 for position, started, ended, step, parent, key, task
                                 in unpack_replays(payload))
                    continue
                except ValueError as exc:
                    why = str(exc)
            self._warn_replays(run_id, at, why)
        if ranged:
            with self._read_journal:
                found += replayed_in_ranges(self._db(), run_id, ranged, self._warn_replays)
        return found

    def _warn_replays(self, run_id: str, attempt: Any, why: str) -> None:
        warned = f"replays {run_id} {attempt!r}"
        if warned not in self._warned:
            self._warned.add(warned)
            log.warning("durably: the journal of run %r at %s is damaged: a record of steps "
                        "replayed in attempt %r cannot be trusted (%s); they are left out "
                        "of its records (they only said which steps were replayed). Fix: "
                        "durably.DiskStore(%r).repair_run(%r) sets the row aside", run_id,
                        self.path, attempt, why, str(self.path), run_id)

    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        """A run's step records in call order.

        Raises:
            CorruptJournalError: a row of the run is garbage.
        """
        with self._read_journal:
            if attempt is None:
                rows = self._db().execute(
                    f"SELECT {STEP_COLS} FROM steps WHERE run_id=? ORDER BY attempt, position",
                    (run_id,),
                ).fetchall()
            else:
                rows = self._db().execute(
                    f"SELECT {STEP_COLS} FROM steps WHERE run_id=? AND attempt=? "
                    "ORDER BY position",
                    (run_id, attempt),
                ).fetchall()
        for row in rows:
            bad = garbage(row, STEP_TYPES)
            if bad:
                raise self._corrupt(run_id, "a step row", f"the row is garbage ({bad})")
        records = [step_from_row(row) for row in rows]
        replayed = self._replayed(run_id, attempt)
        if replayed:
            records.extend(replayed)
            records.sort(key=_in_call_order)
        return records

    def append_events(self, events: Sequence[EventRecord]) -> None:
        if not events:
            return
        rows = [(e.run_id, e.kind, e.time, e.attempt, e.step_id, e.key,
                 self._seal_blob(e.data, "event", e.run_id, e.kind, e.key)) for e in events]
        with self._write_journal, immediate(self._db()) as db:
            db.executemany(f"INSERT INTO events ({EVENT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           rows)

    def list_events(self, run_id: str, kinds: Sequence[str] | None = None) -> list[EventRecord]:
        """A run's events in order; a damaged payload raises CorruptJournalError when it is
        loaded.

        Raises:
            CorruptJournalError: a row of the run is garbage.
        """
        sql = f"SELECT {EVENT_COLS} FROM events WHERE run_id=?"
        params: list[Any] = [run_id]
        if kinds is not None:
            sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params.extend(kinds)
        with self._read_journal:
            rows = self._db().execute(sql + " ORDER BY seq", params).fetchall()
        found = []
        for row in rows:
            bad = garbage(row, EVENT_TYPES)
            if bad:
                raise self._corrupt(run_id, "an event row", f"the row is garbage ({bad})")
            r, k, t, a, s, key, d = row
            data: bytes | None = None
            if d is not None:
                what = f"the data of its {k!r} event {key}".rstrip()
                data, why = self._open_journal_value(
                    d, ("event", r, k, key), False,
                    lambda why, what=what: self._corrupt(run_id, what, why))
                if data is None:
                    data = Unreadable(self._corrupt(run_id, what, why))
            found.append(EventRecord(r, k, t, a, s, key, data))
        return found

    def repair_run(self, run_id: str) -> list[str]:
        """Set aside the damaged parts of a run's journal so that the run can continue.

        A finished step whose recorded result is damaged is removed from the journal (and
        kept in the ``set_aside`` table): it executes again when the run is resumed — for a
        ``cache=False`` task, its side effect happens again, which is why durably never does
        this by itself. Damaged arguments or results of the run are cleared (a rerun with
        the same arguments stores them again); a damaged answer to an ``interrupt()`` is
        removed (the question is asked again). A damaged record of replayed steps is removed
        (they only said which steps an attempt replayed). Every value is checked, large ones
        end to end.

        Args:
            run_id: The run.

        Returns:
            What was set aside, one line each (empty when nothing was damaged).

        Raises:
            NotFoundError: the store has no run with that id.

        Example:
            >>> import durably, tempfile
            >>> store = durably.DiskStore(tempfile.mkdtemp())
            >>> @durably.entrypoint(store=store)
            ... def job():
            ...     return 1
            >>> store.repair_run(job.run().id)
            []
        """
        return repair_run(self, run_id)

    def _query_one(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self._read_journal:
            return self._db().execute(sql, params).fetchone()

    def close(self) -> None:
        with self._lock:
            if self._root is not None and self._pid == _pid[0]:
                _checkpoint.release([str(self._root / "journal.sqlite3"),
                                     str(self._root / "cache" / "cache.db")])
            con = getattr(self._local, "con", None)
            if con is not None:
                con.close()
            self._local = threading.local()
            self._drop_memo()
            if self._watch is not None and self._watch_pid == _pid[0]:
                self._watch.close()
            self._watch, self._watch_version = None, -1
            if self._cache is not None:
                self._cache.close()
                self._cache = None
            if self._root is not None and _serde._spill_dir == str(self._root / "tmp"):
                _serde.set_spill_dir(None)
            self._root = None
