"""The PostgreSQL store: journals, leases and the cache index on a PostgreSQL server, large
values in object storage, so that a team, CI runners and a cluster share one cache and one
set of journals.

- **One round trip a step.** A connection of the process's pool is in autocommit mode: a
  journal write is one statement, its own transaction (no BEGIN/COMMIT round trips). The
  fencing of a step (its run still at the step's attempt) is part of that statement: the
  run's row is locked ``FOR SHARE`` while the step is inserted, so a takeover that bumps the
  attempt either waits for the insert (and the new attempt reads the step) or has happened
  (and the insert writes nothing). A step's statements (its cache lookup, its journal
  write) are made once, prepared on the server after ``prepare_threshold`` uses, and sent
  through libpq with their parameters encoded once per column type, not through a psycopg
  cursor (:mod:`.hot`: half the client CPU); a connection that ends a statement idle is kept for
  the next one of the process (two at most) rather than given back to the pool (whose lock
  and checks cost as much CPU as the statement), and given back when a thread waits for one.
- **Leases on the database's clock.** A lease's heartbeat is the server's ``now()``; its age
  is measured there too, so clients whose clocks differ agree on when it expires.
- **Values** are sealed above this backend (checksums, signatures: the base class, as this
  store does not declare ``"integrity"``); those over ``inline_limit`` bytes go to a blob
  store (:mod:`durably._store.postgres.blobs`) when one is named, written before their row.
  A value larger than 64 MiB arrives as a :class:`~durably.store.LargeValue` (a file, sealed
  in place by the base class) and is streamed to its blob and back to a local file: never
  held in memory whole, let alone twice.
- **Dropped connections** (a server restart, a network cut): a statement that fails because
  its connection broke is retried on a fresh connection until the server answers again
  (every write is idempotent: a record written twice is kept once); inside a transaction
  the block fails with a :class:`~durably.StoreError`, and nothing of it is kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from durably._keys.layouts import compression_level
from durably._store.integrity import (
    OTHER_KEY,
    UNSIGNED,
    SigningKey,
    _process_key_set,
    key_from,
)
from durably._store.lease import Owner
from durably._store.postgres import paged
from durably._store.postgres.ahead import Ahead
from durably._store.postgres.blobs import Blobs, blobs_from
from durably._store.postgres.connections import Connections
from durably._store.postgres.hot import Hot, execute
from durably._store.postgres.options import flag, split_url, whole
from durably._store.postgres.schema import check_schema_name
from durably._store.records import EventRecord, KeyRecord, Replay, RunRecord, StepRecord
from durably.exceptions import DefinitionError, RunStateError, StoreError
from durably.store import ReadAhead, ReplayRange, Store, value_bytes

__all__ = ["PostgresStore", "open_store"]

log = logging.getLogger("durably")
T = TypeVar("T")

#: the largest value kept in a row when no blob store is named (bytea's limit is 1 GiB)
_ROW_LIMIT = (1 << 30) - (1 << 20)

_STEP_COLS = ("run_id", "step_id", "parent_id", "task", "status", "attempt", "position",
              "started", "ended", "error", "cache_key", "inputs", "output", "result_digest",
              "input_digests", "output_digests", "saved", "value", "blob")
_STEP_TYPES = ("text", "text", "text", "text", "text", "int4", "int4", "float8", "float8",
               "text", "text", "text", "text", "text", "text", "text", "float8", "bytea",
               "text")
_RUN_COLS = ("run_id, entrypoint, name, status, created, updated, attempt, input_digest, "
             "args, args_blob, result, result_blob, error, thread")
_NOW = "(now() + %(shift)s * interval '1 second')"


class MissingBlobError(StoreError):
    """A row names a blob that is not in the blob store (deleted there, or another blob
    store is named here)."""


def _digests(values: tuple[str, ...]) -> str | None:
    return " ".join(values) if values else None


def _undigests(text: str | None) -> tuple[str, ...]:
    return () if text is None else tuple(text.split(" "))


class PostgresStore(Connections, Store):
    """A :class:`~durably.store.Store` on a PostgreSQL server, shared by every process and
    machine that opens the same URL (``pip install 'durably[postgres]'``).

    Args:
        url: A libpq URL, ``postgresql://user[:password]@host[:port]/dbname[?...]``
            (``postgres://`` too). Its query may carry this store's options (``schema``,
            ``blobs``, ``allow_unsigned``, ``inline_limit``, ``pool_size``,
            ``prepare_threshold``), read here and not passed to libpq; the rest is libpq's
            (``host=/run/postgresql`` for a Unix socket, ``sslmode=require``...). A password
            comes from the URL, ``$PGPASSWORD`` or ``~/.pgpass``; it is never written into
            the store, and messages show the URL with it hidden.
        schema: The PostgreSQL schema the tables live in (default ``"durably"``); made,
            and migrated, on first use.
        blobs: Where values larger than ``inline_limit`` bytes are kept: an fsspec URL
            (``s3://bucket/prefix``, ``/shared/dir``, ``memory://name``); default
            ``$DURABLY_BLOBS``; None: in the rows (up to 1 GiB each).
        blob_options: fsspec storage options for ``blobs`` (default
            ``$DURABLY_BLOBS_OPTIONS``, a JSON object), e.g. ``{"endpoint_url": ...}``.
        inline_limit: Bytes up to which a value is kept in its row (default 1 MiB).
        key: The signing key (bytes or str, 16 bytes at least); default the process's
            (``durably.configure(key=...)``, ``$DURABLY_KEY``, ``$DURABLY_KEY_FILE``).
        allow_unsigned: Open without a signing key. A shared store is code every reader
            unpickles: without a key, anyone who can write to the database can make every
            reader run code of theirs.
        pool_size: The most connections this process opens (default 8).
        prepare_threshold: psycopg's: a statement is prepared on the server after this many
            executions; None never prepares (PgBouncer in transaction mode).
        compress: Compress the results of tasks without their own ``compress=`` with
            zstandard: True (level 3) or a level 1-22; default False (see
            :class:`~durably.DiskStore`).

    Raises:
        DefinitionError: an option is wrong (the message says which and how to fix it).
        StoreError: on first use (or :meth:`check`): no signing key and not
            ``allow_unsigned``, a key other than the one the store's values are signed
            with (the store keeps its id, recorded by the first process that opened it
            with a key), psycopg is not installed, the server cannot be reached or the
            schema was made by a newer durably.

    Example:
        >>> from durably._store.postgres.store import PostgresStore
        >>> store = PostgresStore("postgresql://ada:s3cret@db.example/cache?schema=team",
        ...                       allow_unsigned=True)
        >>> store.where, store.schema
        ('postgresql://ada:***@db.example/cache (schema team)', 'team')
    """

    capabilities = frozenset({"large_values", "maintenance"})

    def __init__(self, url: str, *, schema: str | None = None,
                 blobs: str | Blobs | None = None, blob_options: dict[str, Any] | None = None,
                 inline_limit: int | None = None, key: bytes | str | SigningKey | None = None,
                 allow_unsigned: bool | None = None, pool_size: int | None = None,
                 prepare_threshold: int | str | None = "default",
                 compress: bool | int = False) -> None:
        from durably._store.urls import redact

        if not isinstance(url, str) or not url.strip():
            raise DefinitionError(f"PostgresStore(url) takes a postgresql:// URL, got {url!r}."
                                  " Fix: PostgresStore(\"postgresql://user@host/dbname\").")
        self._base, given = split_url(url)
        self._shown = redact(self._base)
        self.schema = check_schema_name(schema if schema is not None
                                        else given.get("schema", "durably"),
                                        "schema=" if schema is not None else "?schema=")
        self.inline_limit = whole(inline_limit if inline_limit is not None
                                   else given.get("inline_limit", 1 << 20), "inline_limit")
        self.pool_size = whole(pool_size if pool_size is not None
                                else given.get("pool_size", 8), "pool_size", least=1)
        if prepare_threshold == "default":
            prepare_threshold = given.get("prepare_threshold", 5)
        if isinstance(prepare_threshold, str):
            prepare_threshold = (None if prepare_threshold.lower() in ("none", "")
                                 else whole(prepare_threshold, "prepare_threshold"))
        self.prepare_threshold: int | None = prepare_threshold
        self.compress_level = compression_level(compress, "PostgresStore")
        if allow_unsigned is None:
            allow_unsigned = flag(given.get("allow_unsigned", "false"), "allow_unsigned")
        self.allow_unsigned = bool(allow_unsigned)
        self._given_key = (key if isinstance(key, SigningKey) or key is None
                           else key_from(key, "PostgresStore(key=...)"))
        blob_url = blobs if blobs is not None else given.get("blobs")
        self.blobs = blobs_from(blob_url, blob_options)
        self._pool: Any = None
        self._pid = 0
        self._open_lock = threading.Lock()
        self._waiting = 0  # threads waiting in the pool's getconn (changed under _wait_lock)
        self._wait_lock = threading.Lock()
        self._local = threading.local()
        self._shift = 0.0  # seconds added to the server's clock (tests of lease expiry)
        self._connected = False  # (once it has: a server that does not answer is an outage)
        #: a statement gave up waiting for the server: the next ones try once, not for
        #: RETRY_SECONDS each, until one gets through (a run failing in an outage says so
        #: at once, not after a minute for each of the writes its end makes)
        self._given_up = False
        self._warned_inline = False  # (said once: large values kept in rows)
        # the statements of every step, made once (see .hot: sent through libpq, prepared
        # on a connection after prepare_threshold uses)
        self._cache_one = Hot("durably_cache", self._sql(
            "SELECT value, blob FROM {s}.cache WHERE key = $1"), ("text",), ("bytea", "text"))
        # (and the seconds its execution took, from its key record: in the same statement)
        self._cache_timed = Hot("durably_cache_timed", self._sql(
            "SELECT c.value, c.blob, k.duration FROM {s}.cache c LEFT JOIN {s}.keys k ON "
            "k.cache_key = c.key WHERE c.key = $1"), ("text",), ("bytea", "text", "float8"))
        # (an INSERT ... SELECT from the run's row, locked FOR SHARE: its run id and
        # attempt are the row's; no row, nothing inserted. Its rowcount is 0 too for a
        # record written already, told apart by _current_attempt. A CTE returning the
        # run's row cost the server ~10 us more per step.)
        fields = [t for col, t in zip(_STEP_COLS[1:], _STEP_TYPES[1:], strict=True)
                  if col != "attempt"]
        numbers = iter(range(1, len(fields) + 1))
        self._journal_one = Hot("durably_step", self._sql(
            f"INSERT INTO {{s}}.steps ({', '.join(_STEP_COLS)}) SELECT r.run_id, " + ", ".join(
                "r.attempt" if col == "attempt" else f"${next(numbers)}::{t}"
                for col, t in zip(_STEP_COLS[1:], _STEP_TYPES[1:], strict=True))
            + f" FROM {{s}}.runs r WHERE r.run_id = ${len(fields) + 1} AND r.attempt = "
            f"${len(fields) + 2} FOR SHARE ON CONFLICT DO NOTHING"), [*fields, "text", "int4"])

    # -- identity ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The URL that opens this store again, with its options in the query (and the
        password, if the URL given had one)."""
        parts = urllib.parse.urlsplit(self._base)
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        query.append(("schema", self.schema))
        if self.allow_unsigned:
            query.append(("allow_unsigned", "true"))
        if self.inline_limit != 1 << 20:
            query.append(("inline_limit", str(self.inline_limit)))
        if self.pool_size != 8:
            query.append(("pool_size", str(self.pool_size)))
        if self.prepare_threshold != 5:
            query.append(("prepare_threshold", str(self.prepare_threshold).lower()))
        return urllib.parse.urlunsplit(parts._replace(
            query=urllib.parse.urlencode(query, safe="/")))

    def location(self) -> tuple[str, dict[str, Any]]:
        """:attr:`url`, and the blob store and the key given in code (``key=``, else
        ``durably.configure(key=...)``'s): a worker reopens the same store, signing with the
        same key. A key from the environment is read where the store is reopened."""
        options: dict[str, Any] = {}
        key = self._given_key if self._given_key is not None else _process_key_set()
        if key is not None:
            options["key"] = key
        if self.blobs is not None:
            options["blobs"] = self.blobs.url
            if self.blobs.options:
                options["blob_options"] = self.blobs.options
        if self.compress_level is not None:
            options["compress"] = self.compress_level
        return self.url, options

    def __repr__(self) -> str:
        return f"<PostgresStore {self.where}>"

    def _read(self, what: str, sql: str, params: Any = None) -> list[Any]:
        return self._do(what, lambda conn: conn.execute(sql, params).fetchall())

    def _one(self, what: str, sql: str, params: Any = None) -> Any:
        return self._do(what, lambda conn: conn.execute(sql, params).fetchone())

    def _write(self, what: str, sql: str, params: Any = None) -> int:
        def run(conn: Any) -> int:
            rowcount: int = conn.execute(sql, params).rowcount
            return rowcount
        return self._do(what, run)

    def _hot(self, what: str, hot: Hot, params: Sequence[Any]) -> Any:
        """The result of a statement made for every step (a cache lookup, a step's journal
        write): a :class:`psycopg.pq.PGresult` (see :mod:`.hot`)."""
        threshold = self.prepare_threshold
        return self._do(what, lambda conn: execute(conn, hot, params, threshold))

    def _sql(self, text: str) -> str:
        return text.replace("{s}", self.schema)

    # -- transactions --------------------------------------------------------------------------
    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """A transaction on one connection (pipelined: BEGIN travels with the first
        statement, COMMIT with the last)."""
        with self._transaction("BEGIN"):
            yield

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """A read-only transaction in REPEATABLE READ: its reads see one state."""
        with self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"):
            yield

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[None]:
        import psycopg

        if self._current() is not None:
            yield  # (inside another block of this thread: part of it)
            return
        deadline: float | None = time.monotonic() if self._given_up else None
        while True:  # (a connection that broke before BEGIN: another one, as in _do)
            try:
                pool = self._get_pool(deadline)
                conn = self._take(pool, deadline)
            except Exception as exc:  # noqa: BLE001 - _wait_for_server raises what is not
                deadline = self._wait_for_server("start a transaction", exc, deadline)
                continue
            try:
                conn.execute(begin)
                self._given_up = False
                break
            except Exception as exc:  # noqa: BLE001 - _wait_for_server raises what is not
                pool.putconn(conn)
                deadline = self._wait_for_server("start a transaction", exc, deadline)
        local = self._local
        try:
            local.conn, local.pid = conn, os.getpid()
            try:
                yield
            except BaseException:
                local.conn = None
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
                raise
            local.conn = None
            try:
                conn.execute("COMMIT")
            except psycopg.Error as exc:
                raise self._error("commit a transaction", exc) from exc
        except BaseException:
            local.conn = None
            pool.putconn(conn)
            raise
        local.conn = None
        self._give(pool, conn)

    def abandon(self) -> None:
        conn = self._current()
        if conn is not None:
            self._local.conn = None
            with contextlib.suppress(Exception):
                conn.execute("ROLLBACK")

    # -- values ----------------------------------------------------------------------------------
    def _put_value(self, data: bytes | None) -> tuple[bytes | None, str | None]:
        """How a value is kept: ``(bytes, None)`` in its row, or ``(None, blob name)``."""
        if data is None:
            return None, None
        if len(data) > self.inline_limit and self.blobs is not None:
            self._get_pool()  # (opened: the blobs' folder is the store's id)
            return None, self.blobs.put(data)  # (a LargeValue: streamed from its file)
        if len(data) > self.inline_limit and not self._warned_inline:
            self._warned_inline = True
            log.warning("durably: a value of %.1f MB is kept in a PostgreSQL row of %s, as no "
                        "blob store is named: every large value then passes through the "
                        "database (its size, its backups, its memory). Fix: name one for "
                        "values over %s bytes: DURABLY_BLOBS=s3://bucket/prefix (or a shared "
                        "directory), or blobs=...", len(data) / 1e6, self.where,
                        f"{self.inline_limit:,}")
        data = value_bytes(data)
        if len(data) > _ROW_LIMIT:
            raise StoreError(
                f"a value of {len(data):,} bytes is too large for a PostgreSQL row (1 GiB at "
                f"most) in {self.where}. Fix: name a blob store for large values "
                "(DURABLY_BLOBS=s3://bucket/prefix, or blobs=...).")
        return bytes(data), None

    def _get_value(self, data: Any, blob: str | None) -> bytes | None:
        if blob is None:
            return None if data is None else bytes(data)
        if self.blobs is None:
            raise StoreError(
                f"{self.where} keeps a large value in a blob store ({blob}), and none is named "
                "here. Fix: set DURABLY_BLOBS (and DURABLY_BLOBS_OPTIONS) as the processes "
                "that wrote it did, or pass blobs=...")
        self._get_pool()
        found = self.blobs.get(blob)
        if found is None:
            raise MissingBlobError(
                f"{self.where} refers to a large value that is not in the blob store "
                f"{self.blobs.url} (looked for {self.blobs.path(blob)}). Fix: "
                "DURABLY_BLOBS (and DURABLY_BLOBS_OPTIONS) must name the same place on every "
                "machine that uses this store. If the value was deleted there: a cache entry "
                "is removed with durably cache clear TASK; a run's lost values are set aside "
                "by PostgresStore(URL).repair_run(RUN_ID), after which its cacheable steps "
                "execute again.")
        return found

    # -- runs --------------------------------------------------------------------------------------
    def _run_params(self, rec: RunRecord) -> list[Any]:
        args, args_blob = self._put_value(rec.args)
        result, result_blob = self._put_value(rec.result)
        return [rec.run_id, rec.entrypoint, rec.name, rec.status, rec.created, rec.updated,
                rec.attempt, rec.input_digest, args, args_blob, result, result_blob, rec.error,
                rec.thread]

    def _run_from(self, row: Any) -> RunRecord:
        return RunRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7],
                         self._get_value(row[8], row[9]), self._get_value(row[10], row[11]),
                         row[12], row[13])

    def find_run(self, run_id: str) -> RunRecord | None:
        row = self._one("read a run", self._sql(
            f"SELECT {_RUN_COLS} FROM {{s}}.runs WHERE run_id = %s"), (run_id,))
        return None if row is None else self._run_from(row)

    def find_latest_run(self, entrypoint: str, input_digest: str) -> RunRecord | None:
        row = self._one("read a run", self._sql(
            f"SELECT {_RUN_COLS} FROM {{s}}.runs WHERE entrypoint = %s AND input_digest = %s "
            "ORDER BY updated DESC, written DESC LIMIT 1"), (entrypoint, input_digest))
        return None if row is None else self._run_from(row)

    def list_runs(self, entrypoint: str | None = None) -> list[RunRecord]:
        if entrypoint is None:
            rows = self._read("list runs", self._sql(
                f"SELECT {_RUN_COLS} FROM {{s}}.runs ORDER BY updated DESC, written DESC"))
        else:
            rows = self._read("list runs", self._sql(
                f"SELECT {_RUN_COLS} FROM {{s}}.runs WHERE entrypoint = %s OR name = %s "
                "ORDER BY updated DESC, written DESC"), (entrypoint, entrypoint))
        return [self._run_from(row) for row in rows]

    def list_thread_runs(self, thread: str) -> list[RunRecord]:
        rows = self._read("list runs", self._sql(
            f"SELECT {_RUN_COLS} FROM {{s}}.runs WHERE thread = %s "
            "ORDER BY updated DESC, written DESC"), (thread,))
        return [self._run_from(row) for row in rows]

    def put_run(self, record: RunRecord) -> None:
        self._write("write a run", self._sql(
            f"INSERT INTO {{s}}.runs ({_RUN_COLS}, written) VALUES (%s, %s, %s, %s, %s, %s, %s, "
            "%s, %b, %s, %b, %s, %s, %s, nextval('{s}.written')) ON CONFLICT (run_id) DO UPDATE "
            "SET entrypoint = excluded.entrypoint, name = excluded.name, status = "
            "excluded.status, created = excluded.created, updated = excluded.updated, attempt "
            "= excluded.attempt, input_digest = excluded.input_digest, args = excluded.args, "
            "args_blob = excluded.args_blob, result = excluded.result, result_blob = "
            "excluded.result_blob, error = excluded.error, thread = excluded.thread, "
            "written = excluded.written"),
            self._run_params(record))

    def put_run_if_current(self, record: RunRecord, previous: int | None = None) -> bool:
        wanted = record.attempt if previous is None else previous
        return self._write("write a run", self._sql(
            "UPDATE {s}.runs SET entrypoint = %s, name = %s, status = %s, created = %s, "
            "updated = %s, attempt = %s, input_digest = %s, args = %b, args_blob = %s, "
            "result = %b, result_blob = %s, error = %s, thread = %s, "
            "written = nextval('{s}.written') "
            "WHERE run_id = %s AND attempt = %s"),
            [*self._run_params(record)[1:], record.run_id, wanted]) == 1

    def delete_runs(self, run_ids: Iterable[str], *, dry_run: bool = False,
                    skip_executing: bool = False) -> list[str]:
        wanted = list(dict.fromkeys(run_ids))
        found = {row[0] for row in self._read("list runs", self._sql(
            "SELECT run_id FROM {s}.runs WHERE run_id = ANY(%s)"), (wanted,))}
        doomed = []
        for run_id in wanted:
            if run_id not in found:
                continue
            holder = self.run_holder(run_id)
            if holder is not None:
                if skip_executing:
                    continue
                raise RunStateError(
                    f"run {run_id!r} is executing ({holder.describe()}); it cannot be deleted. "
                    "Fix: wait for it to end, or stop that process first.")
            doomed.append(run_id)
        if doomed and not dry_run:
            def delete(conn: Any) -> None:
                with conn.transaction():
                    for table in ("steps", "events", "leases", "runs"):
                        conn.execute(self._sql(f"DELETE FROM {{s}}.{table} WHERE run_id = ANY(%s)"),
                                     (doomed,))
            self._do("delete runs", delete)
        return doomed

    # -- leases -----------------------------------------------------------------------------------
    def _owner(self, row: Any) -> Owner:
        host, pid, started, token, age = row
        return Owner(host, pid, started, token, time.time() - float(age))

    def acquire_run(self, run_id: str, owner: Owner) -> Owner | None:
        params = {"run": run_id, "host": owner.host, "pid": owner.pid, "started": owner.started,
                  "token": owner.token, "shift": self._shift}
        take = self._sql(
            "WITH mine AS (INSERT INTO {s}.leases AS l (run_id, host, pid, started, token, "
            f"heartbeat) VALUES (%(run)s, %(host)s, %(pid)s, %(started)s, %(token)s, {_NOW}) "
            "ON CONFLICT (run_id) DO UPDATE SET heartbeat = excluded.heartbeat "
            "WHERE l.token = excluded.token RETURNING 1) "
            "SELECT (SELECT count(*) FROM mine), h.host, h.pid, h.started, h.token, "
            f"extract(epoch FROM {_NOW} - h.heartbeat)::float8 "
            "FROM (SELECT 1) AS one LEFT JOIN {s}.leases h ON h.run_id = %(run)s")
        over = self._sql(
            "UPDATE {s}.leases SET host = %(host)s, pid = %(pid)s, started = %(started)s, "
            f"token = %(token)s, heartbeat = {_NOW} WHERE run_id = %(run)s AND token = %(old)s")
        holder: Owner | None = None
        for _ in range(100):
            row = self._one("take a run's lease", take, params)
            if row[0]:
                return None
            if row[4] is None:
                continue  # (released as we looked: try again)
            holder = self._owner(row[1:])
            if holder.alive(time.time()):
                return holder
            # the holder is dead: taken over, unless another process took it first
            if self._write("take a run's lease", over, {**params, "old": holder.token}) == 1:
                return None
        return holder

    def run_holder(self, run_id: str) -> Owner | None:
        row = self._one("read a run's lease", self._sql(
            f"SELECT host, pid, started, token, extract(epoch FROM {_NOW} - heartbeat)::float8 "
            "FROM {s}.leases WHERE run_id = %(run)s"), {"run": run_id, "shift": self._shift})
        if row is None:
            return None
        holder = self._owner(row)
        return holder if holder.alive(time.time()) else None

    def renew_run(self, run_id: str, owner: Owner) -> bool:
        return self._write("renew a run's lease", self._sql(
            f"UPDATE {{s}}.leases SET heartbeat = {_NOW} WHERE run_id = %(run)s AND token = "
            "%(token)s"), {"run": run_id, "token": owner.token, "shift": self._shift}) == 1

    def release_run(self, run_id: str, owner: Owner) -> bool:
        return self._write("release a run's lease", self._sql(
            "DELETE FROM {s}.leases WHERE run_id = %s AND token = %s"),
            (run_id, owner.token)) == 1

    # -- steps ------------------------------------------------------------------------------------
    def _step_arrays(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> list[list[Any]]:
        cols: list[list[Any]] = [[] for _ in _STEP_COLS]
        for rec, data in steps:
            value, blob = self._put_value(data)
            for col, item in zip(cols, (
                    rec.run_id, rec.step_id, rec.parent_id, rec.task, rec.status, rec.attempt,
                    rec.position, rec.started, rec.ended, rec.error, rec.cache_key, rec.inputs,
                    rec.output, rec.result_digest, _digests(rec.input_digests),
                    _digests(rec.output_digests), rec.saved or None, value, blob),
                    strict=True):
                col.append(item)
        return cols

    def _unnest(self) -> str:
        arrays = ", ".join(f"%b::{t}[]" for t in _STEP_TYPES)
        return f"SELECT * FROM unnest({arrays}) AS s({', '.join(_STEP_COLS)})"

    def append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> None:
        if not steps:
            return
        cols = ", ".join(_STEP_COLS)
        self._write("journal steps", self._sql(
            f"INSERT INTO {{s}}.steps ({cols}) {self._unnest()} ON CONFLICT DO NOTHING"),
            self._step_arrays(steps))

    def append_steps_if_current(self, steps: Sequence[tuple[StepRecord, bytes | None]]
                                ) -> bool:
        if not steps:
            return True
        cols = ", ".join(_STEP_COLS)
        if len(steps) == 1:  # (the common case, an executed step: plain parameters)
            rec, data = steps[0]
            value, blob = self._put_value(data)
            written = self._hot("journal a step", self._journal_one, (
                rec.step_id, rec.parent_id, rec.task, rec.status, rec.position, rec.started,
                rec.ended, rec.error, rec.cache_key, rec.inputs, rec.output,
                rec.result_digest, _digests(rec.input_digests), _digests(rec.output_digests),
                rec.saved or None, value, blob, rec.run_id, rec.attempt)).command_tuples
            # (none written: the run is no longer at this attempt, or the record was written
            # already, by this statement before a dropped connection)
            return written == 1 or self._current_attempt(rec.run_id, rec.attempt)
        # the run rows are locked FOR SHARE while the steps go in: a takeover (which updates
        # the run's attempt) waits for this statement, or has committed and is seen here
        sql = self._sql(
            f"WITH s AS ({self._unnest()}), "
            "cur AS (SELECT run_id, attempt FROM {s}.runs WHERE run_id IN "
            "(SELECT DISTINCT run_id FROM s) FOR SHARE), "
            "ok AS (SELECT s.* FROM s JOIN cur ON cur.run_id = s.run_id AND "
            "cur.attempt = s.attempt), "
            f"ins AS (INSERT INTO {{s}}.steps ({cols}) SELECT {cols} FROM ok "
            "ON CONFLICT DO NOTHING RETURNING 1) "
            "SELECT count(*) FROM ok")
        row = self._one("journal steps", sql, self._step_arrays(steps))
        return int(row[0]) == len(steps)

    def _current_attempt(self, run_id: str, attempt: int) -> bool:
        """Whether the run is at this attempt (an attempt never comes back once a later
        one has started)."""
        return self._one("read a run", self._sql(
            "SELECT 1 FROM {s}.runs WHERE run_id = %s AND attempt = %s"),
            (run_id, attempt)) is not None

    def _find_raw(self, run_id: str, step_id: str) -> bytes | None:
        row = self._one("read a step", self._sql(
            "SELECT value, blob FROM {s}.steps WHERE run_id = %s AND step_id = %s AND status "
            "IN ('ran', 'cached') AND (value IS NOT NULL OR blob IS NOT NULL) "
            "ORDER BY attempt, position LIMIT 1"), (run_id, step_id))
        return None if row is None else self._get_value(row[0], row[1])

    def find_step(self, run_id: str, step_id: str) -> bytes | None:
        return self._find_raw(run_id, step_id)

    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        cols = ", ".join(_STEP_COLS[:-2])
        if attempt is None:
            rows = self._read("list steps", self._sql(
                f"SELECT {cols} FROM {{s}}.steps WHERE run_id = %s "
                "ORDER BY attempt, position, seq"), (run_id,))
        else:
            rows = self._read("list steps", self._sql(
                f"SELECT {cols} FROM {{s}}.steps WHERE run_id = %s AND attempt = %s "
                "ORDER BY position, seq"), (run_id, attempt))
        return [StepRecord(*row[:14], _undigests(row[14]),  # type: ignore[call-arg]
                           _undigests(row[15]), row[16] or 0.0) for row in rows]

    def page_steps(self, run_id: str, attempt: int, *, after: int = -1,
                   limit: int = 100) -> list[StepRecord]:
        """See :meth:`durably.store.Journal.page_steps` (:mod:`.paged`: a LIMIT query)."""
        return paged.page_steps(self, run_id, attempt, after, limit)

    def count_steps(self, run_id: str, attempt: int) -> dict[str, dict[str, int]]:
        """See :meth:`durably.store.Journal.count_steps` (:mod:`.paged`: an aggregate)."""
        return paged.count_steps(self, run_id, attempt)

    def step_outline(self, run_id: str) -> list[tuple[str, str, str, float]]:
        """See :meth:`durably.store.Journal.step_outline` (one query of four columns)."""
        rows = self._read("list steps", self._sql(
            "SELECT step_id, task, status, ended FROM {s}.steps WHERE run_id = %s AND status "
            "IN ('ran', 'cached', 'interrupted') ORDER BY attempt, position, seq"), (run_id,))
        return [(row[0], row[1], row[2], row[3]) for row in rows]

    def finished_steps(self, run_id: str, step_ids: Iterable[str]) -> dict[str, StepRecord]:
        """See :meth:`durably.store.Journal.finished_steps` (one query for them all)."""
        wanted = list(dict.fromkeys(step_ids))
        if not wanted:
            return {}
        cols = ", ".join(_STEP_COLS[:-2])
        rows = self._read("read steps", self._sql(
            f"SELECT DISTINCT ON (step_id) {cols} FROM {{s}}.steps WHERE run_id = %s "
            "AND step_id = ANY(%s) AND status IN ('ran', 'cached') "
            "ORDER BY step_id, attempt, position, seq"), (run_id, wanted))
        return {row[1]: StepRecord(*row[:14], _undigests(row[14]),  # type: ignore[call-arg]
                                   _undigests(row[15]), row[16] or 0.0) for row in rows}

    def parents_of(self, run_id: str, step_ids: Iterable[str]) -> dict[str, str | None]:
        rows = self._read("read steps", self._sql(
            "SELECT DISTINCT ON (step_id) step_id, parent_id FROM {s}.steps WHERE run_id = %s "
            "AND step_id = ANY(%s) ORDER BY step_id, attempt, position"),
            (run_id, list(step_ids)))
        return {row[0]: row[1] for row in rows}

    def read_ahead(self, run_id: str) -> ReadAhead | None:
        return Ahead(self, run_id)

    def append_replays(self, run_id: str, attempt: int,
                       replays: Sequence[Replay | ReplayRange]) -> bool:
        """Replays given whole as step records, and the ranges of this store's read-ahead
        (see :class:`.ahead.Ahead`) copied from their records, in one statement each;
        fenced as :meth:`append_steps_if_current`."""
        ranges = [r for r in replays if type(r) is ReplayRange]
        each = [r for r in replays if type(r) is not ReplayRange]
        ok = True
        if each:
            ok = Store.append_replays(self, run_id, attempt, each)
        if not ranges or not ok:
            return ok
        cols: list[list[Any]] = [[] for _ in range(8)]
        for r in ranges:
            for col, item in zip(cols, (r.position, r.steps, r.anchor[0], r.anchor[1], r.skip,
                                        r.horizon, r.started, r.ended), strict=True):
                col.append(item)
        # each range's steps: its records, from its first one (attempt, position, seq) on in
        # journal order, as many as it has steps, none journaled after its page was read
        # (seq past its horizon); at consecutive positions, spread evenly over its time
        row = self._one("journal replayed steps", self._sql(
            "WITH r AS (SELECT * FROM unnest(%(position)s::int4[], %(steps)s::int4[], "
            "%(a_att)s::int4[], %(a_pos)s::int4[], %(a_seq)s::int8[], %(z_seq)s::int8[], "
            "%(started)s::float8[], %(ended)s::float8[]) "
            "AS r(position, steps, a_att, a_pos, a_seq, z_seq, started, ended)), "
            "cur AS (SELECT attempt FROM {s}.runs WHERE run_id = %(run)s AND attempt = "
            "%(attempt)s FOR SHARE), "
            "src AS (SELECT r.position + x.k - 1 AS position, x.step_id, x.parent_id, x.task, "
            "x.cache_key, r.started + (r.ended - r.started) * (x.k - 1) / r.steps AS started, "
            "r.started + (r.ended - r.started) * x.k / r.steps AS ended "
            "FROM r CROSS JOIN LATERAL (SELECT s.step_id, s.parent_id, s.task, s.cache_key, "
            "row_number() OVER (ORDER BY s.position, s.seq) AS k FROM {s}.steps s "
            "WHERE s.run_id = %(run)s AND s.attempt = r.a_att "
            "AND (s.position, s.seq) >= (r.a_pos, r.a_seq) "
            "AND s.seq <= r.z_seq AND s.status IN ('ran', 'cached') "
            "AND (s.value IS NOT NULL OR s.blob IS NOT NULL) "
            "ORDER BY s.position, s.seq LIMIT r.steps) x WHERE EXISTS (SELECT 1 FROM cur)), "
            "ins AS (INSERT INTO {s}.steps (run_id, step_id, parent_id, task, status, attempt, "
            "position, started, ended, cache_key, result_digest) SELECT %(run)s, step_id, "
            "parent_id, task, 'replayed', %(attempt)s, position, started, ended, cache_key, '' "
            "FROM src ON CONFLICT DO NOTHING RETURNING 1) "
            "SELECT EXISTS (SELECT 1 FROM cur)"),
            {"position": cols[0], "steps": cols[1], "a_att": cols[2], "a_pos": cols[3],
             "a_seq": cols[4], "z_seq": cols[5], "started": cols[6], "ended": cols[7],
             "run": run_id, "attempt": attempt})
        return bool(row[0])

    # -- events ----------------------------------------------------------------------------------
    def append_events(self, events: Sequence[EventRecord]) -> None:
        if not events:
            return
        cols: list[list[Any]] = [[] for _ in range(9)]
        for e in events:
            data, blob = self._put_value(e.data)
            for col, item in zip(cols, (e.run_id, e.kind, e.time, e.attempt, e.step_id, e.key,
                                        data, blob, len(cols[0])), strict=True):
                col.append(item)
        self._write("journal events", self._sql(
            "INSERT INTO {s}.events (run_id, kind, time, attempt, step_id, key, data, blob) "
            "SELECT r, k, t, a, st, ky, d, b FROM unnest(%b::text[], %b::text[], "
            "%b::float8[], %b::int4[], %b::text[], %b::text[], %b::bytea[], %b::text[], "
            "%b::int4[]) AS e(r, k, t, a, st, ky, d, b, n) ORDER BY n "
            "ON CONFLICT DO NOTHING"), cols)

    def list_events(self, run_id: str, kinds: Sequence[str] | None = None) -> list[EventRecord]:
        sql = ("SELECT run_id, kind, time, attempt, step_id, key, data, blob FROM {s}.events "
               "WHERE run_id = %s")
        params: list[Any] = [run_id]
        if kinds is not None:
            sql += " AND kind = ANY(%s)"
            params.append(list(kinds))
        rows = self._read("list events", self._sql(sql + " ORDER BY seq"), params)
        return [EventRecord(r[0], r[1], r[2], r[3], r[4], r[5], self._get_value(r[6], r[7]))
                for r in rows]

    # -- the cache --------------------------------------------------------------------------------
    def discard_cache(self, key: str, why: str, data: bytes | None = None) -> None:
        """An entry signed with another key (or unsigned, when this process has a key) is a
        miss here, and left for the processes that have its key: the store is shared, and one
        misconfigured process must not remove everyone's entries. A damaged one is removed."""
        if why in (OTHER_KEY, UNSIGNED):
            log.warning("durably: cache entry %s of %s is not served here: %s. Fix: use the "
                        "store's signing key (DURABLY_KEY_FILE) in every process that uses "
                        "it", key, self.where, why)
            return
        super().discard_cache(key, why, data)

    def cache_get(self, key: str) -> bytes | None:
        hot = self._cache_one
        row = hot.row(self._hot("read the cache", hot, (key,)))
        return None if row is None else self._get_value(row[0], row[1])

    def cache_get_timed(self, key: str) -> tuple[bytes, float] | None:
        """:meth:`cache_get` with the duration of its key record, read in the same
        statement (see :meth:`durably.store.Values.cache_get_timed`)."""
        hot = self._cache_timed
        row = hot.row(self._hot("read the cache", hot, (key,)))
        if row is None:
            return None
        data = self._get_value(row[0], row[1])
        return None if data is None else (data, float(row[2] or 0.0))

    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        if not items:
            return
        latest = {key: (value, info) for key, value, info in items}
        t = time.time()
        keys, values, blobs, sizes = [], [], [], []
        k_cols: list[list[Any]] = [[] for _ in range(7)]
        for key, (data, info) in latest.items():
            value, blob = self._put_value(data)
            keys.append(key)
            values.append(value)
            blobs.append(blob)
            sizes.append(len(data))
            if info is not None:
                for col, item in zip(k_cols, (key, info.task, info.code, json.dumps(info.inputs),
                                              json.dumps(info.parts), info.created,
                                              info.duration), strict=True):
                    col.append(item)
        if len(keys) == 1:  # (one entry, the common case: plain parameters, no arrays)
            key_row = ("WITH k AS (INSERT INTO {s}.keys (cache_key, task, code, inputs, parts, "
                       "created, duration) VALUES (%s, %s, %s, %s::jsonb, %s::jsonb, %s, %s) "
                       "ON CONFLICT (cache_key) DO UPDATE SET task = excluded.task, code = "
                       "excluded.code, inputs = excluded.inputs, parts = excluded.parts, "
                       "created = excluded.created, duration = excluded.duration) "
                       ) if k_cols[0] else ""
            self._write("write to the cache", self._sql(
                key_row + "INSERT INTO {s}.cache (key, value, blob, size, stored) VALUES "
                "(%s, %b, %s, %s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "blob = excluded.blob, size = excluded.size, stored = excluded.stored"),
                [*(col[0] for col in k_cols if col), keys[0], values[0], blobs[0], sizes[0],
                 t])
            return
        self._write("write to the cache", self._sql(
            "WITH k AS (INSERT INTO {s}.keys (cache_key, task, code, inputs, parts, created, "
            "duration) SELECT c, t, co, i::jsonb, p::jsonb, cr, d FROM unnest(%b::text[], "
            "%b::text[], %b::text[], %b::text[], %b::text[], %b::float8[], %b::float8[]) AS "
            "k(c, t, co, i, p, cr, d) ON CONFLICT (cache_key) DO UPDATE SET task = "
            "excluded.task, code = excluded.code, inputs = excluded.inputs, parts = "
            "excluded.parts, created = excluded.created, duration = excluded.duration) "
            "INSERT INTO {s}.cache (key, value, blob, size, stored) "
            "SELECT k, v, b, n, %s FROM unnest(%b::text[], %b::bytea[], %b::text[], "
            "%b::int8[]) AS c(k, v, b, n) ON CONFLICT (key) DO UPDATE SET value = "
            "excluded.value, blob = excluded.blob, size = excluded.size, stored = "
            "excluded.stored"),
            [*k_cols, t, keys, values, blobs, sizes])

    def cache_delete(self, keys: Iterable[str]) -> int:
        wanted = list(keys)
        if not wanted:
            return 0
        return self._write("remove cache entries", self._sql(
            "DELETE FROM {s}.cache WHERE key = ANY(%s)"), (wanted,))

    # -- key records ------------------------------------------------------------------------------
    def find_key(self, task: str, key: str) -> KeyRecord | None:
        rows = self._read("read key records", self._sql(
            "SELECT task, cache_key, code, inputs, parts, created, coalesce(duration, 0) "
            "FROM {s}.keys WHERE cache_key = %s AND task = %s"), (key, task))
        return KeyRecord(*rows[0]) if rows else None

    def list_keys(self, task: str, limit: int = 100) -> list[KeyRecord]:
        rows = self._read("read key records", self._sql(
            "SELECT task, cache_key, code, inputs, parts, created, coalesce(duration, 0) "
            "FROM {s}.keys WHERE task = %s ORDER BY created DESC LIMIT %s"), (task, limit))
        return [KeyRecord(*row) for row in rows]

    def clear_task(self, task: str) -> int:
        """Remove the task's cache entries; its key records are kept (as pruning keeps
        them), so ``explain`` still says what each removed key was made of and the cache's
        statistics still count the task's steps."""
        return self._write("clear a task's cache entries", self._sql(
            "DELETE FROM {s}.cache WHERE key IN (SELECT cache_key FROM {s}.keys "
            "WHERE task = %s)"), (task,))

    def task_identities(self) -> list[str]:
        return [row[0] for row in self._read("read key records", self._sql(
            "SELECT DISTINCT task FROM {s}.keys ORDER BY task"))]

    # -- the store --------------------------------------------------------------------------------
    def found(self) -> bool:
        """Whether the schema holds durably's tables. Looked up without making them (the
        pool's first connection would): a mistyped schema is not created by asking."""
        sql, params = "SELECT to_regclass(%s)", (f"{self.schema}.meta",)
        if self._pool is not None and self._pid == os.getpid():
            row = self._one("look for the store", sql, params)
        else:
            row = self._alone(lambda conn: conn.execute(sql, params).fetchone())
        return row is not None and row[0] is not None

    def check(self) -> None:
        """Connect now (and make or migrate the tables).

        Raises:
            StoreError: the server cannot be reached, the user cannot create the schema, or
                the schema was made by a newer durably.
        """
        self._get_pool()

    def close(self) -> None:
        """Close the pool's connections (it reopens on next use)."""
        with self._open_lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            self._drop_idle(pool)
            pool.close()

    # -- maintenance (see durably._store.postgres.maintenance) ----------------------------------
    def cache_size(self) -> int:
        row = self._one("read the cache", self._sql("SELECT coalesce(sum(size), 0) FROM {s}.cache"))
        return int(row[0])

    def large_value_bytes(self) -> int:
        from durably._store.postgres import maintenance

        return maintenance.large_value_bytes(self)

    def cache_stats(self) -> dict[str, Any]:
        from durably._store.postgres import maintenance

        return maintenance.cache_stats(self)

    def prune(self, older_than: float | None = None, max_size: int | None = None, *,
              max_entries: int | None = None, task: str | None = None,
              dry_run: bool = False) -> int:
        from durably._store.postgres import maintenance

        return maintenance.prune(self, older_than, max_size, max_entries=max_entries,
                                 task=task, dry_run=dry_run)

    def clear(self, task: str | None = None, *, dry_run: bool = False) -> int:
        from durably._store.postgres import maintenance

        return maintenance.clear(self, task, dry_run=dry_run)

    def collect_values(self, grace: float = 3600.0) -> tuple[int, int]:
        from durably._store.postgres import maintenance

        return maintenance.collect_values(self, grace)

    def repair_run(self, run_id: str) -> list[str]:
        from durably._store.postgres import maintenance

        return maintenance.repair_run(self, run_id)


def open_store(url: str, **options: Any) -> PostgresStore:
    """The store of a ``postgresql://`` URL: the entry point of the URL scheme (see
    :func:`durably.open_store`); ``options`` are :class:`PostgresStore`'s.

    Raises:
        DefinitionError: psycopg is not installed (the message says how to install it).
    """
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        from durably._store.urls import redact

        raise DefinitionError(
            f"the store URL {redact(url)!r} needs the PostgreSQL store's packages ({exc}). "
            "Fix: pip install 'durably[postgres]' (it installs psycopg 3 and psycopg_pool)."
        ) from None
    return PostgresStore(url, **options)
