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
killed during one leaves the log as a killed writer's checkpoint does. The thread closes a
connection :data:`IDLE_SECONDS` after the last request for its database (at once when its
store is closed: :func:`release`), and ends once it has none. Before a fork, and at exit, a
checkpoint in progress is interrupted (SQLite stops it between two pages; an fsync under
way finishes first) and waited for: a child must not inherit SQLite's locks held by a
thread it does not have.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable
from urllib.parse import quote

from durably._store.lease import raise_after_fork

log = logging.getLogger("durably")

#: commits of one database (for the cache: rows written) between two requests: about
#: 3,000 pages of log for executed steps (three pages each), under the writers' own mark
EVERY = 1024
#: seconds without a request for a database before the thread closes its connection to
#: it; the thread ends once it has none (no thread is left idle for a fork to inherit)
IDLE_SECONDS = 1.0
#: seconds a fork waits for a checkpoint in progress to stop (as for a lease's renewal);
#: an entry of _forks older than this (its hook was cut short) no longer holds the thread
_FORK_SECONDS = 10.0
#: seconds the interpreter's exit waits for the thread (a checkpoint, then its closes)
_EXIT_SECONDS = 1.0

_lock = threading.Lock()  # guards the state below and the thread's decisions
_wake = threading.Event()
#: databases to checkpoint, by path: the ``synchronous`` setting of the store that asked
_pending: dict[str, str] = {}
_thread: list[threading.Thread | None] = [None]
_busy = [False]  # the thread is using SQLite (a fork waits: see _hold)
#: the connection checkpointing now (interrupted by a fork or the exit), or None, and the
#: database the thread is working on (its path), or ""
_active: list[sqlite3.Connection | None] = [None]
_active_path = [""]
#: forks in progress, by thread: when each began (the thread starts nothing meanwhile)
_forks: dict[int, float] = {}
#: threads whose fork() wait a Ctrl-C landed in: raised again once the fork is done
_interrupted_forks: set[int] = set()
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
            deleted meanwhile is skipped; one replaced gets a new connection).
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
        if _exiting[0]:
            return  # (the writer's own mark remains)
        _pending[path] = synchronous
        _wake.set()
        thread = _thread[0]
        if thread is None or not thread.is_alive():
            _start_locked()


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
        con = _active[0]
        if con is not None and _active_path[0] in wanted:  # (the store's close copies it)
            with contextlib.suppress(sqlite3.Error):
                con.interrupt()
    deadline = time.monotonic() + seconds
    while wanted & _open and time.monotonic() < deadline:
        thread = _thread[0]
        if thread is None or not thread.is_alive():
            return
        time.sleep(0.001)


def wait_idle(seconds: float) -> bool:
    """Wait until no checkpoint is pending or in progress (at most ``seconds``); whether
    it is so. For tests."""
    deadline = time.monotonic() + seconds
    while _pending or _busy[0]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _holding() -> bool:
    now = time.monotonic()
    # (a snapshot: a fork's hook may remove its entry meanwhile)
    return any(now - began < _FORK_SECONDS for began in tuple(_forks.values()))


def _close(con: sqlite3.Connection) -> None:
    with contextlib.suppress(sqlite3.Error):  # (its checkpoint at close was refused: the
        con.close()  # log keeps it)


#: a connection of the thread, and the (device, inode) of the file it opened
_Entry = tuple[sqlite3.Connection, tuple[int, int]]


def _uri(path: str) -> str:
    """The read-write URI of the database at ``path``: the path's bytes as the file
    system has them (a name that is not UTF-8 too), under an empty authority (a path that
    starts with ``//`` is not read as a host); ``mode=rw``, so that a database deleted
    meanwhile is not created again, empty."""
    return f"file://{quote(os.fsencode(os.path.abspath(path)))}?mode=rw"


def _checkpoint(cons: dict[str, _Entry], path: str, synchronous: str) -> None:
    """Checkpoint one database, through the thread's connection to the file now at
    ``path`` (a connection to a file since deleted or replaced is closed first)."""
    entry = cons.get(path)
    try:
        st = os.stat(path)
        here: tuple[int, int] | None = (st.st_dev, st.st_ino)
    except OSError:  # (deleted: nothing to checkpoint)
        here = None
    if entry is not None and entry[1] != here:
        del cons[path]
        _close(entry[0])
        entry = None
    if here is None:
        return
    if entry is None:
        con = sqlite3.connect(_uri(path), uri=True, timeout=0, isolation_level=None,
                              check_same_thread=False)
        entry = cons[path] = (con, here)
        con.execute(f"PRAGMA synchronous={synchronous.upper()}")
    _active[0] = entry[0]
    entry[0].execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def _start_locked() -> None:
    """Start the thread (under ``_lock``; none alive)."""
    thread = threading.Thread(target=_loop, name="durably-checkpoint", daemon=True)
    _thread[0] = thread
    try:
        thread.start()
    except RuntimeError:  # no new thread (the interpreter is shutting down)
        _thread[0] = None
        _pending.clear()


def _loop() -> None:
    me = threading.current_thread()
    cons: dict[str, _Entry] = {}  # the thread's connection to each database asked for
    try:
        _serve(me, cons)
    except Exception as exc:  # noqa: BLE001 - (a bug): the thread gives its place up
        log.debug("durably: the checkpointing thread failed: %r", exc)
        while _holding():
            time.sleep(0.001)
        _busy[0] = True
        for con, _ in cons.values():
            _close(con)
        with _lock:
            _active[0], _active_path[0], _busy[0] = None, "", False
            if _thread[0] is me:
                _open.clear()
                _thread[0] = None
                if _pending and not _exiting[0]:
                    _start_locked()


def _serve(me: threading.Thread, cons: dict[str, _Entry]) -> None:
    asked: dict[str, float] = {}  # when each database was last asked for (monotonic)
    while True:
        woken = _wake.wait(IDLE_SECONDS)
        job: tuple[str, str] | None = None
        drop: set[str] = set()
        with _lock:
            if _thread[0] is not me:
                return
            working = not _holding()
            if working:
                now = time.monotonic()
                drop = {path for path in cons if _exiting[0] or path in _releasing or (
                    now - asked.get(path, 0.0) >= IDLE_SECONDS and path not in _pending)}
                _releasing.clear()
                if drop:
                    _wake.set()  # (then the requests, or the end)
                else:
                    _wake.clear()
                    if _pending and not _exiting[0]:
                        path = next(iter(_pending))  # (the oldest request first)
                        job = path, _pending.pop(path)
                        asked[path] = now
                        # (counted open from now on: release() waits for it, not past it)
                        _open.add(path)
                        _active_path[0] = path
                        if _pending:
                            _wake.set()
                    elif not cons and (_exiting[0] or not woken):
                        _thread[0] = None  # (ends using no SQLite: no overlap with the next)
                        return
                    else:
                        continue
                _busy[0] = True
        if not working:  # (a fork is waiting for nothing: this thread waits for it)
            time.sleep(0.001)
            continue
        try:
            if job is None:
                for path in drop:
                    con, _ = cons.pop(path)
                    asked.pop(path, None)
                    _close(con)
                    _open.discard(path)
            else:
                _checkpoint(cons, *job)
        except Exception as exc:  # noqa: BLE001 - interrupted, deleted, damaged...: the
            # writers' own checkpoints and checks remain; this connection is not reused
            log.debug("durably: no background checkpoint of %s: %s", job, exc)
            _active[0] = None
            if job is not None and job[0] in cons:
                con, _ = cons.pop(job[0])
                _close(con)
        finally:
            if job is not None and job[0] not in cons:
                _open.discard(job[0])
            _active[0], _active_path[0] = None, ""
            _busy[0] = False


def _interrupt_and_wait(seconds: float) -> None:
    """Interrupt a checkpoint in progress (SQLite stops it between two pages) and wait for
    the thread to stop using SQLite, ``seconds`` at most (an fsync under way is not cut
    short). A Ctrl-C meanwhile does not cut the wait short: before a fork it is raised
    again once the fork is done (see _after_fork_in_parent); at exit it is dropped."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if not _busy[0] or time.monotonic() >= deadline:
                return
            con = _active[0]
            if con is not None:
                with contextlib.suppress(sqlite3.Error):  # (closed meanwhile)
                    con.interrupt()
            time.sleep(0.0005)
        except KeyboardInterrupt:
            _interrupted_forks.add(threading.get_ident())


def _hold() -> None:
    """Before fork(): nothing starts using SQLite in the thread, and what is under way
    stops (a child must not inherit SQLite's locks held by a thread it does not have)."""
    me = threading.get_ident()
    while me not in _forks:
        try:
            with _lock:
                _forks[me] = time.monotonic()
        except KeyboardInterrupt:
            _interrupted_forks.add(me)
    _interrupt_and_wait(_FORK_SECONDS)


def _after_fork_in_parent() -> None:
    me = threading.get_ident()
    while me in _forks:
        try:
            with _lock:
                _forks.pop(me, None)
        except KeyboardInterrupt:
            _interrupted_forks.add(me)
    _wake.set()  # (requests that came meanwhile)
    if me in _interrupted_forks:
        _interrupted_forks.discard(me)
        # the Ctrl-C the wait held back, once fork() returned (raised in a hook, it would
        # be reported and dropped): SIGINT again, to the thread that forked
        raise_after_fork(me, sys._getframe(1))


def _after_fork_in_child() -> None:
    """The child has no checkpointing thread, and its parent's requests are not its own.
    The parent's connections are never closed here (closing one might delete a log the
    parent still uses): the frame of the thread that held them is never freed."""
    global _lock, _wake
    _lock, _wake = threading.Lock(), threading.Event()
    _pending.clear()
    _forks.clear()
    _interrupted_forks.clear()
    _open.clear()
    _releasing.clear()
    _thread[0] = _active[0] = None
    _active_path[0] = ""
    _busy[0] = _exiting[0] = False


os.register_at_fork(before=_hold, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


@atexit.register
def _close_at_exit() -> None:
    """As the interpreter exits: stop checkpointing, and let the thread close its
    connections (each copies what is left and deletes the log if it is the database's
    last), :data:`_EXIT_SECONDS` at most in all."""
    with _lock:
        _exiting[0] = True
        _wake.set()
    deadline = time.monotonic() + _EXIT_SECONDS
    _interrupt_and_wait(_EXIT_SECONDS)
    thread = _thread[0]
    if thread is not None and thread.is_alive():
        thread.join(max(deadline - time.monotonic(), 0.0))
