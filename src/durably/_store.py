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
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import xxhash

from ._lease import Owner
from .exceptions import DefinitionError, StoreError

__all__ = [
    "STORE_FORMAT",
    "DiskStore",
    "EventRecord",
    "KeyRecord",
    "RunRecord",
    "StepRecord",
    "Store",
]

log = logging.getLogger("durably")

#: Version of the on-disk layout; a store written by a newer durably is refused. Format 1
#: (no tracer columns, no events table) is upgraded in place when first opened.
STORE_FORMAT = 2

FINISHED_STEP = ("ran", "cached")


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a run, as its journal records it.

    Attributes:
        run_id: The run the step belongs to.
        step_id: Stable identity of the step in the run (32 hex characters): parent step,
            cache key and occurrence; it never depends on timing.
        parent_id: The step that called this one, or None for a call from the entrypoint.
        task: The task's name.
        status: ``"ran"`` (executed), ``"cached"`` (served from the cross-run cache),
            ``"replayed"`` (served from this run's journal) or ``"failed"``.
        attempt: Which execution of the run (1 for the first, 2 after one resume, ...).
        position: Order of the call within its attempt (0-based).
        started: Start time, seconds since the epoch.
        ended: End time, seconds since the epoch.
        error: ``repr`` of the exception for a failed step, else None.
        cache_key: The cache key of the call (32 hex characters; empty for ``cache=False``).
        inputs: Short ``repr`` of the arguments (at most a few hundred characters), for
            steps that ran or were served from the cache; else None.
        output: Short ``repr`` of the result, likewise.
        result_digest: Digest of the result (32 hex characters), or "" when the result
            cannot be digested or carries no information (None, True, False).
        input_digests: Digests of the arguments and of the elements of list, tuple and
            dict arguments: a later step whose argument digest equals an earlier step's
            result digest received that result (a data-flow edge of the run graph).
    """

    run_id: str
    step_id: str
    parent_id: str | None
    task: str
    status: str
    attempt: int
    position: int
    started: float
    ended: float
    error: str | None = None
    cache_key: str = ""
    inputs: str | None = None
    output: str | None = None
    result_digest: str = ""
    input_digests: tuple[str, ...] = ()

    @property
    def duration(self) -> float:
        """Seconds from start to end."""
        return self.ended - self.started


@dataclasses.dataclass(slots=True)
class RunRecord:
    """The row of one run: what the store knows about it besides its steps."""

    run_id: str
    entrypoint: str
    name: str
    status: str
    created: float
    updated: float
    attempt: int
    input_digest: str
    args: bytes | None = None
    result: bytes | None = None
    error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class KeyRecord:
    """What a cache key was made of, kept beside the entry so ``explain`` can say why a call
    misses.

    Attributes:
        task: Task identity (``module:name``).
        cache_key: The key (32 hex characters).
        code: The code fingerprint, or ``"v:<version>"`` for a task with ``version=``.
        inputs: Digest of each argument, by name.
        parts: Fingerprint of each user function or class the code depends on, by
            qualified name (empty with ``version=``).
        created: When the entry was written, seconds since the epoch.
    """

    task: str
    cache_key: str
    code: str
    inputs: dict[str, str]
    parts: dict[str, str]
    created: float


@dataclasses.dataclass(frozen=True, slots=True)
class EventRecord:
    """A journaled event of a run besides its steps: an attempt starting or ending, an
    ``interrupt()`` and its answer, a custom event written from inside a task.

    Attributes:
        run_id: The run.
        kind: ``"run_started"``, ``"run_finished"``, ``"run_failed"``,
            ``"run_interrupted"``, ``"interrupt"``, ``"answer"`` or ``"custom"``.
        time: Seconds since the epoch.
        attempt: The attempt of the run it happened in (0 for answers given between
            attempts).
        step_id: The step it happened in, or None (the entrypoint's own body, or the run).
        key: The interrupt id for ``"interrupt"`` and ``"answer"``, else "".
        data: Pickled payload (interrupt payload, answer value, custom data), or None.
    """

    run_id: str
    kind: str
    time: float
    attempt: int
    step_id: str | None = None
    key: str = ""
    data: bytes | None = None


@runtime_checkable
class Store(Protocol):
    """What the runtime needs from a store. Every implementation passes one conformance
    suite (``tests/test_store.py``)."""

    def cache_get(self, key: str) -> bytes | None:
        """The stored bytes for a cache key, or None (a miss, or an entry found damaged)."""

    def cache_put(self, key: str, value: bytes, info: KeyRecord | None = None) -> None:
        """Store bytes under a cache key, atomically, with what the key was made of."""

    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        """Store several entries (each atomically; the batch may be cheaper than one by one)."""

    def list_keys(self, task: str, limit: int = 100) -> list[KeyRecord]:
        """Key records of a task's cache entries, newest first."""

    def find_run(self, run_id: str) -> RunRecord | None:
        """The run's record, or None."""

    def find_latest_run(self, entrypoint: str, input_digest: str) -> RunRecord | None:
        """The most recently updated run of that entrypoint with those inputs, or None."""

    def put_run(self, record: RunRecord) -> None:
        """Insert or replace a run's record, durably."""

    def acquire_run(self, run_id: str, owner: Owner) -> Owner | None:
        """Take the run's lease for ``owner`` unless a live owner holds it; return that
        holder (and take nothing) when the run is busy, else None. Atomic across processes."""

    def renew_run(self, run_id: str, owner: Owner) -> None:
        """Refresh the heartbeat of a lease ``owner`` holds."""

    def release_run(self, run_id: str, owner: Owner) -> None:
        """Give the lease up (only if ``owner`` holds it)."""

    def list_runs(self, entrypoint: str | None = None) -> list[RunRecord]:
        """Runs, most recently updated first; ``entrypoint`` filters by identity or name."""

    def find_step(self, run_id: str, step_id: str) -> bytes | None:
        """The result bytes of a finished (ran or cached) step of the run, or None."""

    def append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> None:
        """Append step records (with result bytes for finished ones), in one transaction."""

    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        """A run's step records in call order; ``attempt`` selects one execution."""

    def append_events(self, events: Sequence[EventRecord]) -> None:
        """Append events of runs, durably, in one transaction."""

    def list_events(self, run_id: str, kinds: Sequence[str] | None = None) -> list[EventRecord]:
        """A run's events in the order they were appended; ``kinds`` filters by kind."""

    def close(self) -> None:
        """Release files and connections; the store reopens on next use."""


def step_row(r: StepRecord) -> tuple[Any, ...]:
    """A step record as a row (fast: dataclasses.astuple deep-copies)."""
    return (r.run_id, r.step_id, r.parent_id, r.task, r.status, r.attempt, r.position,
            r.started, r.ended, r.error, r.cache_key, r.inputs, r.output, r.result_digest,
            " ".join(r.input_digests))


def step_from_row(row: Sequence[Any]) -> StepRecord:
    """The inverse of :func:`step_row`."""
    return StepRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8],
                      row[9], row[10], row[11], row[12], row[13] or "",
                      tuple(row[14].split()) if row[14] else ())


def run_row(r: RunRecord) -> tuple[Any, ...]:
    """A run record as a row."""
    return (r.run_id, r.entrypoint, r.name, r.status, r.created, r.updated, r.attempt,
            r.input_digest, r.args, r.result, r.error)


def key_row(r: KeyRecord) -> tuple[Any, ...]:
    """A key record as a row of the keys table."""
    return (r.cache_key, r.task, r.code, json.dumps(r.inputs, sort_keys=True),
            json.dumps(r.parts, sort_keys=True), r.created)


# -- cache values carry a checksum, so a damaged file is a miss, never a wrong result --------
_HEAD = struct.Struct("<4sQ")
_MAGIC = b"DRB1"


def seal(payload: bytes) -> bytes:
    """Prefix a payload with a magic number and its xxh3-64 checksum."""
    return _HEAD.pack(_MAGIC, xxhash.xxh3_64_intdigest(payload)) + payload


def unseal(data: bytes) -> bytes | None:
    """The payload of :func:`seal`, or None when the bytes are damaged."""
    if len(data) < _HEAD.size:
        return None
    magic, check = _HEAD.unpack_from(data)
    payload = data[_HEAD.size :]
    if magic != _MAGIC or xxhash.xxh3_64_intdigest(payload) != check:
        return None
    return payload


_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, entrypoint TEXT NOT NULL, name TEXT NOT NULL,
    status TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    attempt INTEGER NOT NULL, input_digest TEXT NOT NULL,
    args BLOB, result BLOB, error TEXT);
CREATE INDEX IF NOT EXISTS runs_by_inputs ON runs (entrypoint, input_digest, updated);
CREATE INDEX IF NOT EXISTS runs_by_time ON runs (updated);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL, attempt INTEGER NOT NULL, position INTEGER NOT NULL,
    step_id TEXT NOT NULL, parent_id TEXT, task TEXT NOT NULL, status TEXT NOT NULL,
    started REAL NOT NULL, ended REAL NOT NULL, error TEXT, cache_key TEXT NOT NULL,
    result BLOB);
CREATE INDEX IF NOT EXISTS steps_by_id ON steps (run_id, step_id, status);
CREATE INDEX IF NOT EXISTS steps_by_order ON steps (run_id, attempt, position);
CREATE TABLE IF NOT EXISTS leases (
    run_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, started INTEGER,
    token TEXT NOT NULL, heartbeat REAL NOT NULL);
CREATE TABLE IF NOT EXISTS keys (
    cache_key TEXT PRIMARY KEY, task TEXT NOT NULL, code TEXT NOT NULL,
    inputs TEXT NOT NULL, parts TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS keys_by_task ON keys (task, created);
"""

# format 2: the tracer's columns on steps, and the events table
_SCHEMA_2 = """
ALTER TABLE steps ADD COLUMN inputs TEXT;
ALTER TABLE steps ADD COLUMN output TEXT;
ALTER TABLE steps ADD COLUMN result_digest TEXT;
ALTER TABLE steps ADD COLUMN input_digests TEXT;
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, kind TEXT NOT NULL,
    time REAL NOT NULL, attempt INTEGER NOT NULL, step_id TEXT, key TEXT NOT NULL,
    data BLOB);
CREATE INDEX IF NOT EXISTS events_by_run ON events (run_id, kind, seq);
"""

_RUN_COLS = (
    "run_id, entrypoint, name, status, created, updated, attempt, input_digest, args, result, "
    "error"
)
_STEP_COLS = (
    "run_id, step_id, parent_id, task, status, attempt, position, started, ended, error, "
    "cache_key, inputs, output, result_digest, input_digests"
)
_EVENT_COLS = "run_id, kind, time, attempt, step_id, key, data"


@contextlib.contextmanager
def _immediate(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, taken at once (BEGIN IMMEDIATE), rolled back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


class _Translate:
    __slots__ = ("action", "store", "where")

    def __init__(self, store: DiskStore, where: str | Path, action: str) -> None:
        self.store, self.where, self.action = store, where, action

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, StoreError):
            return
        if isinstance(exc, (OSError, sqlite3.Error)):
            raise self.store.store_error(exc, self.where, self.action) from exc


class DiskStore:
    """The default store: a directory holding a diskcache cache and a SQLite journal.

    Nothing touches the disk until the first read or write. The directory is created readable
    by its owner only (mode 0o700).

    Args:
        path: The store directory. Default: ``$DURABLY_DIR`` if set, else ``./.durably``
            (resolved against the working directory when the store is first used).
        size_limit: Cache size limit in bytes. Default None: the cache is never evicted.
            With a limit, the least recently stored entries are evicted once the cache grows
            past it; each eviction is logged on the ``durably`` logger and counted in
            :meth:`stats`. Journals are never evicted.
        synchronous: ``"normal"`` (default; a commit survives the process being killed) or
            ``"full"`` (a commit also survives a power cut; slower).

    Raises:
        StoreError: (on first use) the path is a file, is not writable, or holds a store
            written by a newer durably.

    Example:
        >>> import durably, tempfile
        >>> store = durably.DiskStore(tempfile.mkdtemp())
        >>> store.cache_put("k", b"v"); store.cache_get("k")
        b'v'
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        size_limit: int | None = None,
        synchronous: str = "normal",
    ) -> None:
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise DefinitionError(
                f"DiskStore(path) takes a directory path (str or pathlib.Path), not {path!r}"
            )
        if synchronous not in ("normal", "full"):
            raise ValueError(f"synchronous must be 'normal' or 'full', not {synchronous!r}")
        if size_limit is not None and (not isinstance(size_limit, int) or size_limit <= 0):
            raise ValueError(f"size_limit must be a positive number of bytes, not {size_limit!r}")
        self._given = Path(path).expanduser() if path is not None else None
        self.size_limit = size_limit
        self.synchronous = synchronous
        self._lock = threading.Lock()
        self._local = threading.local()
        self._cache: Any = None
        self._root: Path | None = None
        self._pid = 0
        self.evicted = 0
        self._read_cache = _Translate(self, "cache", "read the cache")
        self._write_cache = _Translate(self, "cache", "write the cache")
        self._read_journal = _Translate(self, "journal.sqlite3", "read the journal")
        self._write_journal = _Translate(self, "journal.sqlite3", "write the journal")

    def __repr__(self) -> str:
        return f"DiskStore({str(self.path)!r})"

    @property
    def path(self) -> Path:
        """The store directory (absolute once the store was used)."""
        if self._root is not None:
            return self._root
        if self._given is not None:
            return self._given
        return Path(os.environ.get("DURABLY_DIR") or ".durably").expanduser()

    # -- opening ---------------------------------------------------------------------------
    def _open(self) -> Path:
        root = self._root
        if root is not None and self._pid == os.getpid():
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
                self._check_format(root)
            self._root = root
            self._pid = os.getpid()
            self._cache = None
            self._local = threading.local()
            return root

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
        tmp = root / f"FORMAT.{os.getpid()}.tmp"
        tmp.write_text(f"durably-store {STORE_FORMAT}\n")
        os.replace(tmp, marker)

    def _translate(self, where: str | Path, action: str) -> _Translate:
        """A context that turns OS and SQLite errors into a StoreError naming the path."""
        return _Translate(self, where, action)

    def store_error(self, exc: BaseException, where: str | Path, action: str) -> StoreError:
        path = where if isinstance(where, Path) else self.path / where
        text = str(exc).lower()
        if "full" in text or getattr(exc, "errno", None) == errno.ENOSPC:
            hint = "the disk is full: free space, then rerun; finished steps are kept."
        elif ("readonly" in text or "read-only" in text or "permission" in text
              or getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS)):
            hint = "the store is not writable: fix its permissions or set DURABLY_DIR."
        else:
            hint = "check the path and its permissions, or set DURABLY_DIR to another one."
        return StoreError(f"cannot {action} at {path}: {exc}. Fix: {hint}")

    @property
    def cache(self) -> Any:
        """The underlying :class:`diskcache.Cache` (opened on first use)."""
        root = self._open()
        c = self._cache
        if c is None:
            import diskcache

            with self._lock, self._translate(root / "cache", "open the cache"):
                if self._cache is None:
                    limited = self.size_limit is not None
                    self._cache = diskcache.Cache(
                        str(root / "cache"),
                        eviction_policy="least-recently-stored" if limited else "none",
                        size_limit=self.size_limit if limited else 2**62,
                        cull_limit=0,
                        statistics=False,
                    )
                c = self._cache
        return c

    def _db(self) -> sqlite3.Connection:
        root = self._open()
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is not None:
            return con
        path = root / "journal.sqlite3"
        with self._translate(path, "open the journal"):
            con = sqlite3.connect(
                str(path), timeout=60.0, isolation_level=None, check_same_thread=False
            )
            con.execute("PRAGMA journal_mode=WAL")
            con.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version > STORE_FORMAT:
                con.close()
                raise StoreError(
                    f"the journal {path} was written by a newer durably (format {version}). "
                    "Fix: upgrade durably, or use another DURABLY_DIR."
                )
            if version < STORE_FORMAT:
                _upgrade(con)
        self._local.con = con
        return con

    # -- cache -----------------------------------------------------------------------------
    def cache_get(self, key: str) -> bytes | None:
        cache = self.cache
        with self._read_cache:
            data = cache.get(key)
        if data is None:
            return None
        payload = unseal(data)
        if payload is None:
            log.warning("durably: cache entry %s at %s is damaged; recomputing it", key, self.path)
            with contextlib.suppress(Exception):
                cache.delete(key)
        return payload

    def cache_put(self, key: str, value: bytes, info: KeyRecord | None = None) -> None:
        self.cache_put_many(((key, value, info),))

    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        if not items:
            return
        cache = self.cache
        with self._write_cache:
            if len(items) == 1:
                cache.set(items[0][0], seal(items[0][1]))
            else:
                with cache.transact():
                    for key, value, _ in items:
                        cache.set(key, seal(value))
        infos = [key_row(info) for _, _, info in items if info is not None]
        if infos:
            with self._write_journal, _immediate(self._db()) as db:
                db.executemany(
                    "INSERT OR REPLACE INTO keys (cache_key, task, code, inputs, parts, "
                    "created) VALUES (?, ?, ?, ?, ?, ?)", infos)
        with self._write_cache:
            if self.size_limit is not None and cache.volume() > self.size_limit:
                removed = cache.cull()
                if removed:
                    self.evicted += removed
                    log.warning(
                        "durably: cache at %s is over its size limit (%d bytes): evicted %d "
                        "entries (%d this session)",
                        self.path, self.size_limit, removed, self.evicted,
                    )

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

    # -- journals --------------------------------------------------------------------------
    def find_run(self, run_id: str) -> RunRecord | None:
        row = self._query_one(f"SELECT {_RUN_COLS} FROM runs WHERE run_id=?", (run_id,))
        return RunRecord(*row) if row else None

    def find_latest_run(self, entrypoint: str, input_digest: str) -> RunRecord | None:
        row = self._query_one(
            f"SELECT {_RUN_COLS} FROM runs WHERE entrypoint=? AND input_digest=? "
            "ORDER BY updated DESC, rowid DESC LIMIT 1",
            (entrypoint, input_digest),
        )
        return RunRecord(*row) if row else None

    def put_run(self, record: RunRecord) -> None:
        values = run_row(record)
        with self._write_journal:
            self._db().execute(
                f"INSERT OR REPLACE INTO runs ({_RUN_COLS}) VALUES "
                f"({', '.join('?' * len(values))})",
                values,
            )

    def acquire_run(self, run_id: str, owner: Owner) -> Owner | None:
        with self._write_journal, _immediate(self._db()) as db:
            row = db.execute("SELECT host, pid, started, token, heartbeat FROM leases "
                             "WHERE run_id=?", (run_id,)).fetchone()
            if row is not None:
                holder = Owner(*row)
                if holder.token != owner.token and holder.alive(time.time()):
                    return holder
            db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?)",
                       (run_id, owner.host, owner.pid, owner.started, owner.token, time.time()))
        return None

    def renew_run(self, run_id: str, owner: Owner) -> None:
        with self._write_journal:
            self._db().execute("UPDATE leases SET heartbeat=? WHERE run_id=? AND token=?",
                               (time.time(), run_id, owner.token))

    def release_run(self, run_id: str, owner: Owner) -> None:
        with self._write_journal:
            self._db().execute("DELETE FROM leases WHERE run_id=? AND token=?",
                               (run_id, owner.token))

    def list_runs(self, entrypoint: str | None = None) -> list[RunRecord]:
        with self._read_journal:
            if entrypoint is None:
                rows = self._db().execute(
                    f"SELECT {_RUN_COLS} FROM runs ORDER BY updated DESC, rowid DESC"
                ).fetchall()
            else:
                rows = self._db().execute(
                    f"SELECT {_RUN_COLS} FROM runs WHERE entrypoint=? OR name=? "
                    "ORDER BY updated DESC, rowid DESC",
                    (entrypoint, entrypoint),
                ).fetchall()
        return [RunRecord(*row) for row in rows]

    def find_step(self, run_id: str, step_id: str) -> bytes | None:
        row = self._query_one(
            "SELECT result FROM steps WHERE run_id=? AND step_id=? AND status IN "
            "('ran', 'cached') LIMIT 1",
            (run_id, step_id),
        )
        return bytes(row[0]) if row else None

    def append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> None:
        if not steps:
            return
        rows = [(*step_row(rec), data) for rec, data in steps]
        sql = f"INSERT INTO steps ({_STEP_COLS}, result) VALUES ({', '.join('?' * 16)})"
        with self._write_journal:
            db = self._db()
            if len(rows) == 1:
                db.execute(sql, rows[0])
                return
            with _immediate(db):
                db.executemany(sql, rows)

    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        with self._read_journal:
            if attempt is None:
                rows = self._db().execute(
                    f"SELECT {_STEP_COLS} FROM steps WHERE run_id=? ORDER BY attempt, position",
                    (run_id,),
                ).fetchall()
            else:
                rows = self._db().execute(
                    f"SELECT {_STEP_COLS} FROM steps WHERE run_id=? AND attempt=? "
                    "ORDER BY position",
                    (run_id, attempt),
                ).fetchall()
        return [step_from_row(row) for row in rows]

    def append_events(self, events: Sequence[EventRecord]) -> None:
        if not events:
            return
        rows = [(e.run_id, e.kind, e.time, e.attempt, e.step_id, e.key, e.data) for e in events]
        with self._write_journal, _immediate(self._db()) as db:
            db.executemany(f"INSERT INTO events ({_EVENT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           rows)

    def list_events(self, run_id: str, kinds: Sequence[str] | None = None) -> list[EventRecord]:
        sql = f"SELECT {_EVENT_COLS} FROM events WHERE run_id=?"
        params: list[Any] = [run_id]
        if kinds is not None:
            sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params.extend(kinds)
        with self._read_journal:
            rows = self._db().execute(sql + " ORDER BY seq", params).fetchall()
        return [EventRecord(r, k, t, a, s, key, None if d is None else bytes(d))
                for r, k, t, a, s, key, d in rows]

    def _query_one(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self._read_journal:
            return self._db().execute(sql, params).fetchone()

    def close(self) -> None:
        with self._lock:
            con = getattr(self._local, "con", None)
            if con is not None:
                con.close()
            self._local = threading.local()
            if self._cache is not None:
                self._cache.close()
                self._cache = None
            self._root = None


def _upgrade(con: sqlite3.Connection) -> None:
    """Create the journal's tables, or upgrade them from an older format, in one
    transaction (a racing process sees the new format and does nothing)."""
    with _immediate(con):
        version = con.execute("PRAGMA user_version").fetchone()[0]
        if version >= STORE_FORMAT:
            return
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                con.execute(statement)
        if version < 2:
            columns = {row[1] for row in con.execute("PRAGMA table_info(steps)")}
            for statement in _SCHEMA_2.split(";"):
                statement = statement.strip()
                if not statement:
                    continue
                column = statement.split()[5] if statement.startswith("ALTER") else None
                if column is None or column not in columns:
                    con.execute(statement)
        con.execute(f"PRAGMA user_version={STORE_FORMAT}")


def now() -> float:
    """Wall-clock seconds since the epoch."""
    return time.time()
