"""The PostgreSQL store's connections: a pool per process (opened on first use, after the
schema's migration on a connection of its own), up to two connections kept idle outside it
between statements, and statements retried on a fresh connection while the server cannot be
reached (a restart, a network cut). :class:`Connections` is mixed into
:class:`~durably._store.postgres.store.PostgresStore`, which sets the attributes it declares."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from durably._store.integrity import SigningKey, process_key
from durably._store.postgres.blobs import Blobs
from durably._store.postgres.options import fix_for, message, reachable_later
from durably._store.postgres.schema import check_key, migrate
from durably.exceptions import StoreError

__all__ = ["OPEN_SECONDS", "RETRY_SECONDS", "Connections"]

log = logging.getLogger("durably")
T = TypeVar("T")

#: how long a statement whose connection broke is retried (the server restarting)
RETRY_SECONDS = 60.0
#: how long a statement waits for another connection's lock inside :meth:`stopping` (the
#: end of an attempt that Ctrl-C stopped) before it fails
STOPPING_LOCK_SECONDS = 3.0
#: how long a store being opened waits for a server that refuses connections (starting up)
OPEN_SECONDS = 10.0
#: this process's id, kept current across os.fork() (os.getpid() is a system call, and the
#: pool is looked for before every statement)
_PID = [os.getpid()]
if hasattr(os, "register_at_fork"):  # (no fork on Windows)
    os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))
_IDLE = 0  # libpq's PQTRANS_IDLE (psycopg.pq.TransactionStatus.IDLE)
#: connections kept idle outside the pool at most (see PostgresStore._give): a run's thread
#: and its lease's heartbeat
_KEPT_IDLE = 2


def _mark(conn: Any) -> None:
    """A connection of a durably store's pool, marked so that :class:`_Expected` knows it."""
    conn.durably_pooled = True


class _Unbound:
    """The pool's reset of a connection given back: its lock wait unbounded again if
    :meth:`Connections.stopping` bounded it."""

    def __call__(self, conn: Any) -> None:
        if conn.__dict__.get("durably_bounded"):
            conn.durably_bounded = False
            if not conn.closed:  # (one the pool closed, as it was interrupted: nothing to do)
                conn.execute("RESET lock_timeout")

    def __repr__(self) -> str:  # (named so in the pool's warning about a closed one)
        return "<durably reset>"


_unbound = _Unbound()


class _Expected(logging.Filter):
    """psycopg_pool's warnings about a durably store's pool that only say what durably
    handles (a connection found closed after a restart or a dropped connection, a worker
    thread not stopped at once when the pool is dropped to reconnect, a connection attempt
    while the server is down: durably says when it gives up): demoted to DEBUG, so that
    they no longer print on stderr (Python's last-resort handler shows WARNING and above),
    but still reach a handler set up to show psycopg's debugging. Other pools' warnings,
    and every ERROR, are left as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and _about_durably(record.args):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def _about_durably(args: Any) -> bool:
    """Whether a log record's arguments name a durably pool (or its thread: ``durably
    SCHEMA...``) or one of its connections."""
    values = args.values() if isinstance(args, dict) else args or ()
    return any((isinstance(v, str) and v.startswith("durably "))
               or getattr(v, "durably_pooled", False) is True
               or (isinstance(v, Exception) and "<durably reset>" in str(v)) for v in values)


_EXPECTED = _Expected()


def _quiet_pool_log() -> None:
    """Install :class:`_Expected` on psycopg_pool's logger (once)."""
    pool_log = logging.getLogger("psycopg.pool")
    if _EXPECTED not in pool_log.filters:
        pool_log.addFilter(_EXPECTED)


class Connections:
    """The connection handling of :class:`~durably._store.postgres.store.PostgresStore`."""

    _pool: Any
    _pid: int
    _open_lock: threading.Lock
    _wait_lock: threading.Lock
    _waiting: int
    _local: threading.local
    _connected: bool
    _given_up: bool
    _base: str
    _shown: str
    schema: str
    blobs: Blobs | None
    pool_size: int
    prepare_threshold: int | None
    allow_unsigned: bool

    _given_key: SigningKey | None

    @property
    def signing_key(self) -> SigningKey | None:
        """The key given (``key=``), else the process's."""
        return self._given_key if self._given_key is not None else process_key()

    @property
    def where(self) -> str:
        """The URL (password hidden) and the schema."""
        return f"{self._shown} (schema {self.schema})"

    # -- connections ---------------------------------------------------------------------------
    def _get_pool(self, until: float | None = None) -> Any:
        """The process's pool, opened if need be (waiting for the server until ``until``, a
        ``time.monotonic()``, else :data:`OPEN_SECONDS`)."""
        pool = self._pool
        if pool is not None and self._pid == _PID[0]:
            return pool
        with self._open_lock:
            if self._pool is not None and self._pid != os.getpid():
                # a forked child: the parent's pool is left alone, never closed here (its
                # connections' sockets are the parent's; psycopg ends a connection only in
                # the process that opened it)
                self._pool = None
            if self._pool is None:
                self._pool = self._open(until)
                self._pid = os.getpid()
            return self._pool

    def _unsigned(self) -> StoreError:
        return StoreError(
            f"the PostgreSQL store {self._shown} has no signing key, and a shared store "
            "is code that every reader unpickles: anyone who can write to the database "
            "could make every reader run code of theirs. Fix: make a key once (python -c "
            "\"import secrets; print(secrets.token_hex(32))\" > durably.key; chmod 600 "
            "durably.key), share it with the store's users as a secret, and set "
            "DURABLY_KEY_FILE=durably.key (or durably.configure(key=...)); or pass "
            "allow_unsigned=True (?allow_unsigned=true) for a store only you write to.")

    def _kwargs(self) -> dict[str, Any]:
        """psycopg's options of every connection: autocommit (a statement is its own
        transaction), and when statements are prepared."""
        return {"autocommit": True, "prepare_threshold": self.prepare_threshold}

    def _no_psycopg(self, exc: ImportError) -> StoreError:
        return StoreError(f"the PostgreSQL store {self._shown} needs psycopg ({exc}). Fix: "
                          "pip install 'durably[postgres]'.")

    def _open(self, until: float | None = None) -> Any:
        if self.signing_key is None and not self.allow_unsigned:
            raise self._unsigned()
        try:
            from psycopg_pool import ConnectionPool
        except ImportError as exc:
            raise self._no_psycopg(exc) from exc
        key = self.signing_key

        def opened(conn: Any) -> str:
            store_id = migrate(conn, self.schema, self._shown)
            check_key(conn, self.schema, self._shown, key)  # (the key its values have)
            return store_id

        store_id = self._alone(opened, until)
        if self.blobs is not None:
            self.blobs.scope = store_id  # (its blobs apart from other stores' in one place)
        self._connected = True
        _quiet_pool_log()
        pool: Any = ConnectionPool(self._base, kwargs=self._kwargs(), min_size=1,
                                   max_size=self.pool_size, configure=_mark, reset=_unbound,
                                   timeout=RETRY_SECONDS, name=f"durably {self.schema}", open=True)
        #: its connections taken and not in use (see _take): the pool's own, so that a
        #: connection is only ever given back to the pool it came from
        pool.durably_idle = collections.deque()
        return pool

    def _alone(self, work: Callable[[Any], T], until: float | None = None) -> T:
        """``work(connection)`` on a connection of its own (not the pool's), retried while
        the server cannot be reached (until ``until``, a ``time.monotonic()``, else for
        :data:`OPEN_SECONDS`)."""
        try:
            import psycopg
        except ImportError as exc:
            raise self._no_psycopg(exc) from exc
        kwargs = self._kwargs()
        try:  # (the URL's own connect_timeout, else 10 s: what the pool connects with too)
            given = psycopg.conninfo.conninfo_to_dict(self._base)
        except psycopg.Error as exc:
            raise self._bad_url(exc) from None
        if "connect_timeout" not in given:
            kwargs["connect_timeout"] = 10
        deadline = until if until is not None else time.monotonic() + OPEN_SECONDS
        while True:
            connected = False
            try:
                with psycopg.connect(self._base, **kwargs) as conn:
                    connected = True
                    return work(conn)
            except psycopg.OperationalError as exc:
                if self._connected and time.monotonic() > deadline:
                    raise self._error("reconnect", exc) from None
                if not reachable_later(exc) or time.monotonic() > deadline:
                    raise StoreError(
                        f"cannot connect to the PostgreSQL store {self._shown}: "
                        f"{message(exc)}. Fix: check the host, port, database, user and "
                        "options in the URL, and the password (in the URL, $PGPASSWORD or "
                        "~/.pgpass).") from None
                time.sleep(0.5)
            except psycopg.Error as exc:
                if not connected:  # (an option libpq does not take: never the schema's)
                    raise self._bad_url(exc) from None
                raise StoreError(f"the PostgreSQL store {self._shown} cannot be prepared "
                                 f"(schema {self.schema}): {message(exc)}. Fix: give the "
                                 "user the right to create the schema (GRANT CREATE ON "
                                 "DATABASE ...), or create it for them.") from None

    def _bad_url(self, exc: Exception) -> StoreError:
        return StoreError(f"the PostgreSQL store's URL {self._shown} is not one libpq takes: "
                          f"{message(exc)}. Fix: check its options (?connect_timeout=10, "
                          "?sslmode=require, ...: libpq's connection parameters, plus "
                          "durably's schema=, blobs=, allow_unsigned=, inline_limit=, "
                          "pool_size=, prepare_threshold=).")

    def _do(self, what: str, work: Callable[[Any], T]) -> T:
        """``work(connection)``: on this thread's transaction's connection, or on one of
        the pool's, retried on a fresh connection while the server cannot be reached."""
        import psycopg

        conn = self._current()
        if conn is not None:
            try:
                return work(conn)
            except psycopg.Error as exc:
                raise self._error(what, exc) from exc
        deadline: float | None = time.monotonic() if self._given_up else None
        while True:
            try:
                pool = self._get_pool(deadline)
                conn = self._take(pool, deadline)
                try:
                    done = work(conn)
                except BaseException:
                    pool.putconn(conn)  # (the pool checks it, and drops it if it broke)
                    raise
                self._give(pool, conn)
                self._given_up = False
                return done
            except Exception as exc:  # noqa: BLE001 - _wait_for_server raises what is not
                # the connection broke (a restart, a network cut): once the server is back,
                # the statement is run again on a new one (every write is idempotent)
                deadline = self._wait_for_server(what, exc, deadline)

    @contextlib.contextmanager
    def stopping(self) -> Iterator[None]:
        """A block in which this thread's statements wait :data:`STOPPING_LOCK_SECONDS` at
        most for another connection's lock (``lock_timeout``), then fail with a
        StoreError (see :meth:`durably.store.Journal.stopping`)."""
        local = self._local
        before = getattr(local, "stopping", False)
        local.stopping = True
        try:
            yield
        finally:
            local.stopping = before

    def _take(self, pool: Any, deadline: float | None) -> Any:
        """A connection for one statement or transaction (its lock wait bounded inside
        :meth:`stopping`)."""
        conn = self._take_one(pool, deadline)
        if getattr(self._local, "stopping", False) and not conn.__dict__.get("durably_bounded"):
            try:
                conn.execute(f"SET lock_timeout = '{STOPPING_LOCK_SECONDS * 1000:.0f}ms'")
            except BaseException:
                pool.putconn(conn)
                raise
            conn.durably_bounded = True
        return conn

    def _take_one(self, pool: Any, deadline: float | None) -> Any:
        """A connection for one statement or transaction: an idle one this store kept
        (:meth:`_give`), without the pool's lock and bookkeeping (they cost as much CPU as
        a small statement's round trip), else the pool's (waiting up to ``deadline``)."""
        idle: collections.deque[Any] = pool.durably_idle
        try:
            return idle.pop()
        except IndexError:
            pass
        with self._wait_lock:
            self._waiting += 1
        try:
            # looked at again now that _give sees this thread waiting: a connection kept
            # between the first look and the count is taken here, never left idle while
            # this thread waits for the pool
            try:
                return idle.pop()
            except IndexError:
                wait = None if deadline is None else max(deadline - time.monotonic(), 0.1)
                return pool.getconn(timeout=wait)
        finally:
            with self._wait_lock:
                self._waiting -= 1

    def _give(self, pool: Any, conn: Any) -> None:
        """Keep a connection that ended a statement or a transaction idle for the next one
        of this process (:meth:`_take`); to the pool instead while a thread waits for one
        there, if it is not idle and open, or if :data:`_KEPT_IDLE` are kept already (the
        pool closes those it has had idle for a while: a process that once used many
        threads does not keep their connections open). The pool bounds how many there
        are: every connection kept here was taken from it."""
        # (libpq's status, read without psycopg's ConnectionInfo; a closed connection's is
        # UNKNOWN)
        idle: collections.deque[Any] = pool.durably_idle
        if conn.pgconn.transaction_status != _IDLE or self._pool is not pool \
                or len(idle) >= _KEPT_IDLE or conn.__dict__.get("durably_bounded"):
            pool.putconn(conn)  # (a pool closed meanwhile closes it; a bounded one: reset)
            return
        idle.append(conn)
        if self._pool is not pool:  # (dropped meanwhile: see _drop_idle)
            self._drop_idle(pool)
        elif self._waiting:  # (read after the append: see _take)
            with contextlib.suppress(IndexError):
                pool.putconn(idle.pop())

    def _drop_idle(self, pool: Any) -> None:
        """Close the pool's connections kept idle: it is no longer this store's (closed or
        dropped; the one that drops it does this after, and :meth:`_give` after keeping
        one, so that none stays open)."""
        idle: collections.deque[Any] = pool.durably_idle
        while True:
            try:
                conn = idle.pop()
            except IndexError:
                return
            with contextlib.suppress(Exception):
                conn.close()

    def _wait_for_server(self, what: str, exc: Exception, deadline: float | None) -> float:
        """After ``exc``: the deadline to retry until, if the server may come back by
        itself (its pool is dropped: a new one connects as soon as it answers, where the
        old one would back off); else, or past the deadline, raise the StoreError."""
        import psycopg

        if isinstance(exc, StoreError) and deadline is None and not self._connected:
            raise exc  # (the store could not be opened the first time: said why)
        if not isinstance(exc, (psycopg.Error, StoreError)):
            raise exc
        if not (isinstance(exc, StoreError) or reachable_later(exc)):
            raise self._error(what, exc) from exc
        now = time.monotonic()
        deadline = deadline or now + RETRY_SECONDS
        if now > deadline:
            self._given_up = True
            cause = exc.__cause__ or exc.__context__ if isinstance(exc, StoreError) else exc
            if isinstance(exc, StoreError):  # (its pool could not connect again: said first)
                what = f"{what}, as it could not reconnect in {RETRY_SECONDS:.0f} s"
            raise self._error(what, cause or exc) from exc
        log.debug("durably: %s: %s; retrying", what, exc)
        with self._open_lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            self._drop_idle(pool)
            with contextlib.suppress(Exception):
                pool.close(timeout=0)
        time.sleep(0.2)
        return deadline

    def _error(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"the PostgreSQL store {self.where} could not {what}: "
                          f"{message(exc)}. {fix_for(exc)}")

    def _current(self) -> Any:
        """This thread's transaction's connection, or None."""
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is not None and local.pid != os.getpid():
            local.conn = conn = None
        return conn

