"""Checkpoints of the stores' write-ahead logs, in a background thread.

SQLite appends every commit to a database's write-ahead log and copies the log back into
the database (a *checkpoint*) once it grows past ``wal_autocheckpoint`` pages. That copy
runs inside the commit that crossed the mark, and waits for two fsyncs: on this machine a
run of 100,000 trivial steps stopped for it every ~2,700 steps, about 25 ms each time, an
eighth of its wall time. The store's writers count their commits instead and, every
:data:`EVERY`, ask this module's thread to checkpoint the database with ``PASSIVE`` (it
copies what it can without waiting for any lock, and never blocks a writer or a reader),
while the run goes on.

The writers keep their own ``wal_autocheckpoint``. A log starts over (from its first
frame) only when a checkpoint copied all of it and no commit came meanwhile, which under
steady writes a background checkpoint seldom manages: the commit that crosses the mark
copies the few frames left, with fsyncs of little, and the log starts over.

Nothing changes on disk: what a checkpoint copies and when it syncs are SQLite's; a process
killed during one leaves the log as a killed writer's checkpoint does. The thread ends, and
closes its connections, :data:`IDLE_SECONDS` after the last request; at exit, and before a
fork, a checkpoint in progress is interrupted (SQLite stops it between two pages) and
waited for: a child must not inherit SQLite's locks held by a thread it does not have.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from urllib.parse import quote

log = logging.getLogger("durably")

#: commits (or cache rows) of one database between two requests: about 3,000 pages of log
#: for executed steps (three pages each), under the writers' own mark of 8,192
EVERY = 1024
#: seconds without a request before the thread closes its connections and ends (no thread
#: is left idle for a fork to inherit, and a store's log is deleted as its last connection
#: closes)
IDLE_SECONDS = 2.0
#: seconds a fork or the interpreter's exit waits for a checkpoint in progress to stop
_WAIT_SECONDS = 5.0

_lock = threading.Lock()  # guards the state below and the thread's decisions
_wake = threading.Event()
#: databases to checkpoint, by path: the ``synchronous`` setting of the store that asked
_pending: dict[str, str] = {}
_thread: list[threading.Thread | None] = [None]
_busy = [False]  # the thread is using SQLite (a fork waits: see _hold)
#: the connection checkpointing now (interrupted by a fork or the exit), or None
_active: list[sqlite3.Connection | None] = [None]
_held = [False]  # a fork is in progress: nothing starts using SQLite
_exiting = [False]  # the interpreter exits: the thread closes its connections and ends
#: databases the thread has a connection to, and those it is to close (see release)
_open: set[str] = set()
_releasing: set[str] = set()


def request(path: str, synchronous: str = "normal") -> None:
    """Ask for a ``PASSIVE`` checkpoint of the SQLite database at ``path`` soon, in this
    process's checkpointing thread (started if none runs). Requests for one database made
    before it gets to them are one checkpoint.

    Args:
        path: An existing database in WAL mode (its file is never created: a database
            deleted meanwhile is skipped).
        synchronous: The writers' ``PRAGMA synchronous`` ("normal" or "full"), used by the
            checkpoint's own connection.

    Example:
        >>> import os, sqlite3, tempfile, pathlib
        >>> db = str(pathlib.Path(tempfile.mkdtemp()) / "j.sqlite3")
        >>> con = sqlite3.connect(db, isolation_level=None)
        >>> con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        'wal'
        >>> _ = con.execute("CREATE TABLE t (x)")  # (a page in the log, not yet in the file)
        >>> os.path.getsize(db)
        4096
        >>> request(db)
        >>> wait_idle(5.0)
        True
        >>> os.path.getsize(db)  # copied into the database
        8192
    """
    with _lock:
        if _held[0] or _exiting[0]:
            return  # (forking, or exiting: the writer's own mark remains)
        _pending[path] = synchronous
        _wake.set()
        thread = _thread[0]
        if thread is not None and thread.is_alive():
            return
        thread = threading.Thread(target=_loop, name="durably-checkpoint", daemon=True)
        _thread[0] = thread
        try:
            thread.start()
        except RuntimeError:  # no new thread (the interpreter is shutting down)
            _thread[0] = None
            _pending.clear()


def wait_idle(seconds: float) -> bool:
    """Wait until no checkpoint is pending or in progress (at most ``seconds``); whether
    it is so. For tests and benchmarks."""
    deadline = time.monotonic() + seconds
    while _pending or _busy[0]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def release(paths: Iterable[str], seconds: float = 1.0) -> None:
    """Forget these databases: their pending requests are dropped, and the thread closes
    its connections to them, waited for (``seconds`` at most). For a store being closed:
    its journal's log is then removed by the store's own close, as the database's last
    connection, and the directory may be copied or moved whole.

    Args:
        paths: Database paths, as given to :func:`request`.
        seconds: How long to wait for the thread.
    """
    wanted = set(paths)
    with _lock:
        for path in wanted:
            _pending.pop(path, None)
        if not wanted & _open:
            return
        _releasing.update(wanted)
        _wake.set()
    deadline = time.monotonic() + seconds
    while wanted & _open and time.monotonic() < deadline:
        thread = _thread[0]
        if thread is None or not thread.is_alive():
            return
        time.sleep(0.001)


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    # mode=rw: a database deleted since it asked is not created again, empty
    con = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=0,
                          isolation_level=None, check_same_thread=False)
    con.execute(f"PRAGMA synchronous={synchronous.upper()}")
    return con


def _close(con: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):  # (its checkpoint at close was refused: the
        con.close()  # log keeps it)


def _loop() -> None:
    me = threading.current_thread()
    cons: dict[str, sqlite3.Connection] = {}  # one connection to each database asked for
    while True:
        woken = _wake.wait(IDLE_SECONDS)
        path = synchronous = ""
        ending = False
        drop: set[str] = set()
        with _lock:
            if _thread[0] is not me:
                return
            held = _held[0] and not _exiting[0]
            if not held:
                drop = set(_releasing)
                _releasing.clear()
                ending = _exiting[0] or (not woken and not _pending)
                if ending:
                    _thread[0] = None
                elif not drop:
                    _wake.clear()
                    if not _pending:
                        continue
                    path, synchronous = _pending.popitem()
                    if _pending:
                        _wake.set()
                _busy[0] = True
        if held:  # (a fork waits for nothing: this thread waits for it)
            time.sleep(0.001)
            continue
        try:
            if ending:
                for con in cons.values():
                    _close(con)
                _open.clear()
                return
            if drop:  # (then the requests, at the next turn: _wake is still set)
                for gone in drop:
                    dropped = cons.pop(gone, None)
                    if dropped is not None:
                        _close(dropped)
                    _open.discard(gone)
                continue
            if path not in cons:
                cons[path] = _connect(path, synchronous)
                _open.add(path)
            _active[0] = cons[path]
            cons[path].execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            # (interrupted, deleted, damaged: the writers' own checkpoints and checks remain)
            log.debug("durably: no background checkpoint of %s: %s", path, exc)
            _active[0] = None
            dropped = cons.pop(path, None)
            if dropped is not None:
                _close(dropped)
            _open.discard(path)
        finally:
            _active[0] = None
            _busy[0] = False


def _interrupt_and_wait() -> None:
    """Interrupt a checkpoint in progress (SQLite stops it between two pages) and wait for
    the thread to stop using SQLite: :data:`_WAIT_SECONDS` at most (an fsync under way is
    not cut short)."""
    deadline = time.monotonic() + _WAIT_SECONDS
    while _busy[0] and time.monotonic() < deadline:
        con = _active[0]
        if con is not None:
            with contextlib.suppress(sqlite3.Error):  # (closed meanwhile)
                con.interrupt()
        time.sleep(0.0005)


def _hold() -> None:
    """Before fork(): nothing starts using SQLite, and what is under way stops (a child
    must not inherit SQLite's locks held by a thread it does not have)."""
    with _lock:
        _held[0] = True
    _interrupt_and_wait()


def _after_fork_in_parent() -> None:
    with _lock:
        _held[0] = False


def _after_fork_in_child() -> None:
    """The child has no checkpointing thread, and its parent's requests are not its own.
    The parent's connections are never closed here (closing one might delete a log the
    parent still uses): the frame of the thread that held them is never freed."""
    global _lock, _wake
    _lock, _wake = threading.Lock(), threading.Event()
    _pending.clear()
    _thread[0] = _active[0] = None
    _busy[0] = _held[0] = _exiting[0] = False
    _open.clear()
    _releasing.clear()


os.register_at_fork(before=_hold, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


@atexit.register
def _close_at_exit() -> None:
    """As the interpreter exits: stop checkpointing, and let the thread close its
    connections (each copies what is left and deletes the log if it is the database's
    last), 1 s at most."""
    with _lock:
        _exiting[0] = True
        _wake.set()
    _interrupt_and_wait()
    thread = _thread[0]
    if thread is not None and thread.is_alive():
        thread.join(1.0)
