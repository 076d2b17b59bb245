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

This module is DiskStore's core: its arguments, opening (checks, format, key), the
journal's connection and format, locks, transactions (:meth:`DiskStore.batch`) and
closing. Its parts are in modules beside this one (see :mod:`durably._store.disk.base`):
the cache (:mod:`~durably._store.disk.cache`), journal values and ``blobs/``
(:mod:`~durably._store.disk.values`), runs (:mod:`~durably._store.disk.runs`) and steps
(:mod:`~durably._store.disk.steps`); the process-wide signing key is in
:mod:`~durably._store.disk.signing`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from durably._keys import serde as _serde
from durably._keys.layouts import compression_level
from durably._store.disk import checkpoint as _checkpoint
from durably._store.disk import signing
from durably._store.disk.base import _WAL_PAGES, _is_corrupt, _Translate, _WriteJournal
from durably._store.disk.blobs import clean_tmp, share_bits, share_file, subdir
from durably._store.disk.cache import CacheValues
from durably._store.disk.readonly import connect_read_only, store_read_only
from durably._store.disk.rows import (
    discard_leftover,
    immediate,
)
from durably._store.disk.runs import RunJournal
from durably._store.disk.steps import StepJournal
from durably._store.disk.upgrade import upgrade
from durably._store.disk.values import JournalValues
from durably._store.disk.wal import BUSY, lost_commits
from durably._store.integrity import (
    SigningKey,
    check_parts,
    check_private,
    env_key,
    key_differs,
    key_from,
    seal,
    unseal,
)
from durably._store.lease import _pid
from durably._store.records import (
    FINISHED_STEP,
    EventRecord,
    KeyRecord,
    RunRecord,
    StepRecord,
    now,
)
from durably.exceptions import (
    CorruptJournalError,
    DefinitionError,
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
#: tables are those of 6), 8 records a run's conversation thread, the duration of the
#: execution that produced a cache entry and the time a cached step saved (SCHEMA_8,
#: COLUMNS_8). Older journals are upgraded in place when first opened; a newer one is refused.
JOURNAL_FORMAT = 8


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


_TRUE = ("1", "true", "yes", "on")

#: the units of a size limit given as text: kB, MB, GB, TB count in powers of 1000 (as
#: disks are sold), KiB, MiB, GiB, TiB in powers of 1024; case does not matter
_SIZE_UNITS = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d[\d_]*(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*")
_SIZE_FORMS = ("a positive number of bytes (an int, e.g. 10 * 2**30), or text with a unit: "
               "'5GB', '5 GiB', '500MB', '1.5TiB' (kB, MB, GB, TB in powers of 1000; KiB, "
               "MiB, GiB, TiB in powers of 1024)")


def size_limit_bytes(value: object, argument: str = "DiskStore(size_limit=...)") -> int:
    """Bytes from a size limit: an int of bytes, or text such as ``"5GB"``, ``"5 GiB"``,
    ``"500MB"``, ``"1.5TiB"`` (kB, MB, GB, TB count in powers of 1000; KiB, MiB, GiB, TiB in
    powers of 1024; case does not matter).

    Args:
        value: The limit as given.
        argument: How messages name the argument.

    Returns:
        The limit in bytes (int, at least 1).

    Raises:
        DefinitionError: not one of those forms, or not positive; the message names the
            argument and the forms it takes.

    Example:
        >>> size_limit_bytes("5GB"), size_limit_bytes("5 GiB"), size_limit_bytes(500_000)
        (5000000000, 5368709120, 500000)
    """
    found: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        found = value
    elif isinstance(value, str):
        m = _SIZE.fullmatch(value)
        unit = _SIZE_UNITS.get(m.group(2).lower()) if m else None
        if m is not None and unit is not None:
            found = int(float(m.group(1).replace("_", "")) * unit)
    if found is None or found <= 0:
        raise DefinitionError(
            f"{argument} must be {_SIZE_FORMS}; {value!r} is not one"
            + (" (a limit is positive)" if found is not None else "")
            + ". Fix: size_limit=\"5GB\", or leave it out for no limit.")
    return found


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
        if self.begin != "BEGIN" and store._read_only:
            raise store.read_only_error("write the journal")
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


#: every DiskStore of this process: a forked child gives each a new lock (one a thread of
#: the parent held at the fork would never be released in the child: its first use of the
#: store hung)
_STORES: weakref.WeakSet[DiskStore] = weakref.WeakSet()


def _new_locks_in_child() -> None:
    for store in list(_STORES):
        store._lock = threading.RLock()


os.register_at_fork(after_in_child=_new_locks_in_child)
#: bytes of a page of a new journal. Each commit appends every page it changed to the
#: write-ahead log, whole: an executed step changes three (its row and two index entries),
#: so a trivial step wrote 12 KiB to the log with SQLite's default of 4,096 (14 KiB to the
#: disk with the checkpoints). Pages of 2,048 bytes halve that (8 KiB to the disk in a run
#: of 1,000 steps, 12 KiB in one of 100,000) and a step's commit costs 2-4 us less; a row
#: larger than a page spills into overflow pages, about the same bytes in all. SQLite sets
#: it once, when the database is created: an older journal keeps its own, and a process of
#: an older durably reads either.
_PAGE_SIZE = 2048


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


def _ignore_in_git(root: Path) -> None:
    """Write ``.gitignore`` (``*``) into a store directory durably has just created, so that a
    store made inside a project (``./.durably``) is never committed by accident. A directory
    that existed before is left as it is (it may be a folder the user made on purpose)."""
    _write_replacing(root / ".gitignore", "# created by durably: a store is never committed\n*\n")


class DiskStore(CacheValues, RunJournal, StepJournal, JournalValues, Store):
    """The default store: a directory holding a diskcache cache and a SQLite journal.

    Nothing touches the disk until the first read or write. The directory is created readable
    by its owner only (mode 0o700), and a directory other users can write (or that belongs to
    another user) is refused unless ``allow_shared``: whoever can write a store can make
    durably load their pickles. A directory durably creates also gets a ``.gitignore``
    (``*``), so a store inside a project is never committed by accident.

    Args:
        path: The store directory. Default: ``$DURABLY_DIR`` if set, else ``./.durably``
            (resolved against the working directory when the store is first used).
        size_limit: Cache size limit: int bytes, or text with a unit (``"5GB"``,
            ``"5 GiB"``, ``"500MB"``; kB, MB, GB, TB count in powers of 1000, KiB, MiB,
            GiB, TiB in powers of 1024), kept as int bytes. Default None: the cache is
            never evicted.
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
        compress: Compress the results of tasks that do not say otherwise with zstandard:
            True (level 3) or a level from 1 (fastest) to 22 (smallest); default False. A
            task's own ``compress=`` or ``mmap=True`` wins. Entries written either way load
            either way. Needs ``pip install 'durably[compress]'``.
        read_only: Open an existing store for reading only, as a store this process cannot
            write is opened (see :attr:`read_only`): its files are never written (the
            journal read with SQLite's ``mode=ro``, the cache without diskcache, which
            writes its settings when it opens); every write raises a
            :class:`~durably.StoreError`. Default False. ``durably ui --read-only`` opens
            its store so.

    Raises:
        DefinitionError: an argument has the wrong type, or ``size_limit`` is not a size
            (at construction).
        StoreError: (on first use) the path is a file, is not writable, is writable by other
            users, holds a store written by a newer durably, or one whose values are
            signed with another key than this process's (its ``KEY_ID`` file keeps the
            id of the first key that opened it).

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
        size_limit: int | str | None = None,
        synchronous: str = "normal",
        key: bytes | str | None = None,
        allow_shared: bool | None = None,
        memo_entries: int = 4096,
        compress: bool | int = False,
        read_only: bool = False,
    ) -> None:
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise DefinitionError(
                f"DiskStore(path) takes a directory path (str or pathlib.Path), not {path!r}. "
                "Fix: DiskStore(\"/path/to/store\")."
            )
        if synchronous not in ("normal", "full"):
            raise ValueError(f"synchronous must be 'normal' or 'full', not {synchronous!r}. "
                             "Fix: synchronous=\"full\" to survive power cuts, else leave it out.")
        if size_limit is not None:
            size_limit = size_limit_bytes(size_limit)
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
        self.compress_level = compression_level(compress, "DiskStore")
        self.size_limit = size_limit
        self.synchronous = synchronous
        self.allow_shared = allow_shared
        if not isinstance(read_only, bool):
            raise DefinitionError(f"DiskStore(read_only=...) must be True or False, not "
                                  f"{read_only!r}. Fix: read_only=True.")
        self._open_read_only = read_only
        self._lock = threading.RLock()  # (reentrant: a damaged cache met under it is moved)
        _STORES.add(self)
        self._local = threading.local()
        self._wal_sound = False  # the journal's write-ahead log was checked (see _check_wal)
        self._wal_unchecked = False  # not yet: its write lock was held when it was opened
        self._read_only = False  # opened for reading only: this process cannot write it
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
        self._memo: dict[str, tuple[bytes, float]] = {}  # key -> (payload, duration), oldest first
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
    def read_only(self) -> bool:
        """Whether the store was opened for reading only: it was given ``read_only=True``, or
        it holds a store this process cannot write (its directory, journal or cache is not
        writable, or on a read-only file system). Runs, steps, graphs and the cache can be
        read; every write raises a :class:`~durably.StoreError` saying the store is
        read-only. False until the store is first used.

        Example:
            >>> import durably, tempfile
            >>> store = durably.DiskStore(tempfile.mkdtemp())
            >>> store.check(); store.read_only
            False
        """
        return self._read_only

    def read_only_error(self, action: str) -> StoreError:
        """The error of a write (``action``, e.g. ``"write the journal"``) to a store
        opened read-only."""
        root = self.path
        if self._open_read_only:
            return StoreError(f"cannot {action}: the store {root} was opened for reading only "
                              "(DiskStore(read_only=True), durably ui --read-only). Fix: "
                              "open it without read_only to write it.")
        return StoreError(
            f"cannot {action}: the store {root} is read-only (not writable by this process: "
            "its directory, journal or cache, or the file system), so it was opened for "
            "reading only: runs, steps, graphs and cache statistics can be read, nothing can "
            f"be written. Fix: make it writable (chmod -R u+w {root}, or mount it "
            "read-write), or copy it to a writable directory and point DURABLY_DIR (or "
            "--dir) there.")

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
            "memo_entries": self.memo_entries, **(
                {} if self.compress_level is None else {"compress": self.compress_level}),
            **({"read_only": True} if self._open_read_only else {})}

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
    def signing_key(self) -> SigningKey | None:
        """The key this store signs with: its own ``key=``, else the process's (see
        :attr:`durably.store.Store.signing_key`); None: checksums only."""
        return self._signing()

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
                # (opened for reading: see read_only)
                read_only = (self._open_read_only and root.exists()) or store_read_only(root)
                if not read_only:
                    created = not root.exists()
                    root.mkdir(mode=0o700, parents=True, exist_ok=True)
                    if created:
                        _ignore_in_git(root)
                self._key_gen = -1
                self._signing()  # a bad key file is reported when the store opens
                self._check_private(root)
                self._read_only = read_only
                self._check_format(root)
                self._check_key(root, self._signing())
                if not read_only:
                    clean_tmp(root / "tmp")
                    if share_bits(root):  # a shared store: its members spill into tmp/ too
                        subdir(root, "tmp")
            self._root = root
            self._pid = os.getpid()
            self._cache = None
            self._local = threading.local()
            if not self._read_only:  # (else large values spill to the system's tmp)
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
        if self._key_gen != signing._key_generation:
            with signing._key_lock:
                gen, process = signing._key_generation, signing._process_key
            key = self._given_key or process or env_key()
            root = self._root
            if root is not None and key is not None and self._pid == _pid[0]:
                self._check_key(root, key)  # (a key configured after the store opened)
            self._key = key
            self._key_gen = gen
        return self._key

    def _check_key(self, root: Path, key: SigningKey | None) -> None:
        """Check that ``key`` is the key the store's values are signed with: the id of the
        first key that opened it (:attr:`SigningKey.id`, a hash of the key, as every
        signature carries it, never the key) is kept in its ``KEY_ID`` file; a store without
        one (made without a key, or by an older durably) takes this key's, unless it is
        read-only. Nothing is checked without a key.

        Raises:
            StoreError: the store's values were signed with another key.
        """
        if key is None:
            return
        marker = root / "KEY_ID"
        mine = key.id.hex()
        with self._translate(marker, "check the store's signing key"):
            try:
                recorded = marker.read_text().strip()
            except FileNotFoundError:
                if self._read_only:
                    return
                try:  # (of several processes recording theirs at once, the first wins)
                    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                except FileExistsError:
                    recorded = marker.read_text().strip()
                else:
                    with os.fdopen(fd, "w") as f:
                        f.write(mine + "\n")
                    share_file(root, marker)  # (its members read it too)
                    return
        if recorded and recorded != mine:
            raise key_differs(f"the store {root}", recorded, key)

    def _shared(self) -> bool:
        if self.allow_shared is not None:
            return self.allow_shared
        return os.environ.get("DURABLY_ALLOW_SHARED", "").strip().lower() in _TRUE

    def _check_private(self, root: Path) -> None:
        """Refuse a directory others can write: they could make durably load their pickles;
        and refuse symbolic links and (for a private store) parts others own or can write."""
        parts = check_parts(root, self._shared())
        if parts:
            links = "symbolic link" in parts
            raise StoreError(
                f"refusing the store {root}: {parts}. "
                + ("durably never follows links inside a store: replace the links by real "
                   "folders (or move the store aside). " if links else "")
                + "A private store is accepted only when you alone can write its parts "
                "(another user could make durably load their pickles). Fix: "
                f"chmod -R go-w {root} and chown it to yourself; or, for a store you mean "
                "to share or only read (a colleague's, a CI artifact), set "
                "DURABLY_ALLOW_SHARED=1 (and a signing key: DURABLY_KEY_FILE).")
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
            if found < STORE_FORMAT and not self._read_only:  # (the journal upgrades
                self._write_marker(root, marker)  # itself when it is opened)
        elif not self._read_only:
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
        if self._read_only and not _is_corrupt(exc) and (
                "readonly" in text or "read-only" in text or "permission" in text
                or code in (errno.EACCES, errno.EPERM, errno.EROFS)):
            return self.read_only_error(action)
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

    def _db(self) -> sqlite3.Connection:
        root = self._open()
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is not None:
            if con.in_transaction:  # left open by an interrupted write, unless a block runs
                discard_leftover(con)
            return con
        path = root / "journal.sqlite3"
        if self._read_only:
            return self._db_read_only(root, path)
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
            self._local.journal = str(path)
        self._local.con = con
        return con

    def _db_read_only(self, root: Path, path: Path) -> sqlite3.Connection:
        """This thread's connection to the journal of a store opened read-only (see
        :attr:`read_only`): ``mode=ro``; an empty journal in memory when the store has none
        (a store used outside runs only)."""
        with self._translate(path, "open the journal"):
            if not path.exists() and not (root / "JOURNAL").exists():
                con = sqlite3.connect(":memory:", isolation_level=None,
                                      check_same_thread=False)
                self._upgrade(con)
            else:
                con = connect_read_only(path)
            try:
                version = con.execute("PRAGMA user_version").fetchone()[0]
                if version != JOURNAL_FORMAT:
                    newer = version > JOURNAL_FORMAT
                    raise StoreError(
                        f"the journal {path} is in format {version} and this durably reads "
                        f"format {JOURNAL_FORMAT}: " + (
                            "it was written by a newer durably. Fix: upgrade durably."
                            if newer else "it is upgraded when the store is first opened by "
                            "a process that can write it, and this store is read-only. Fix: "
                            "copy the store to a writable directory and read the copy."))
            except BaseException:
                con.close()
                raise
        self._local.con = con
        return con

    def _journal_here(self) -> None:
        """Before each write of the journal (a step's, a run's record): the journal this
        thread's connection writes is still the store's (not deleted, nor replaced, since it
        was opened). A store deleted while a run executes took the run's steps with it: its
        next step must not write into the deleted file, nor the run report itself finished,
        as if they were kept. One ``stat`` of the journal's path (about a microsecond).

        Raises:
            StoreError: the journal file is gone or is another one.
        """
        local = self._local
        ino = getattr(local, "ino", None)
        if ino is None or getattr(local, "con", None) is None:
            return
        try:
            now: int | None = os.stat(local.journal).st_ino
        except OSError:
            now = None
        if now != ino:
            path = local.journal
            raise StoreError(
                f"the journal {path} was {'deleted' if now is None else 'replaced'} while "
                "this process used it: what it wrote since went to the file that was there "
                "before, so the steps of the runs it executed meanwhile are not kept. Fix: "
                "never delete a store in use; restart the process (or configure a new "
                "DiskStore), and call again: those steps execute again.")

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
        """Create the journal's tables, or upgrade them from an older format
        (:func:`~durably._store.disk.upgrade.upgrade`)."""
        upgrade(con, self._signing(), JOURNAL_FORMAT)

    def _checkpoint_soon(self, *parts: str) -> None:
        """Ask for a checkpoint, in the background, of the store's database at ``parts``
        under its directory (see :mod:`durably._store.disk.checkpoint`)."""
        _checkpoint.request(str(self._open().joinpath(*parts)), self.synchronous)

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
