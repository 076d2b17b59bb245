"""What the parts of :class:`~durably.DiskStore` share: the contexts that turn OS and SQLite
errors into a :class:`~durably.StoreError` (every read and write of the cache and of the
journal runs in one), the size the write-ahead logs grow to, and :class:`DiskBase`.

DiskStore is its core (:mod:`durably._store.disk.store`: opening, format, connections,
locks, transactions) and parts, each a class of methods in a module of its own:
:mod:`~durably._store.disk.cache` (the cache and its key records),
:mod:`~durably._store.disk.values` (how journal values are sealed and opened, and the files
in ``blobs/``), :mod:`~durably._store.disk.runs` (runs, leases, events) and
:mod:`~durably._store.disk.steps` (steps, replays, the read-ahead of a resumed run). The
parts use the store's attributes and each other's methods: :class:`DiskBase` declares them,
so that each module type-checks alone. This module is the lowest of them: the parts import
it, and it imports none of them.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durably._store.disk import checkpoint as _checkpoint
from durably._store.integrity import SigningKey
from durably.exceptions import CorruptJournalError, StoreError

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Iterable

    from durably._store.disk.store import DiskStore
    from durably._store.lease import Owner

__all__ = ["DiskBase"]


def _is_corrupt(exc: BaseException | None) -> bool:
    """Whether SQLite says the file is not a (sound) database."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    text = str(exc).lower()
    return type(exc) is sqlite3.DatabaseError or "malformed" in text or "not a database" in text


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
    """The errors of the journal's writes, translated; before each write, that the journal
    is still the store's (a store deleted while a run executes is noticed at its next step,
    not after its last: :meth:`DiskStore._journal_here`); and before the first write of a
    store whose write-ahead log could not be checked when it was opened (another
    connection held the write lock), that check (see :meth:`DiskStore._check_wal`)."""

    __slots__ = ()

    def __enter__(self) -> None:
        store = self.store
        if store._read_only:
            raise store.read_only_error(self.action)
        store._journal_here()
        if store._wal_unchecked:
            store._check_wal_before_write()

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            store = self.store
            store._journal_writes += 1
            if store._journal_writes >= _checkpoint.EVERY:
                store._journal_writes = 0
                store._checkpoint_soon("journal.sqlite3")
            return
        super().__exit__(kind, exc, tb)


#: pages the write-ahead log of the journal and of the cache grows to before the commit
#: that crosses the mark copies it back into the database (a checkpoint: two fsyncs, tens
#: of ms for a log this size). Background checkpoints (see _checkpoint), asked for every
#: 1,024 commits, do most of that work while the run goes on; as a log starts over only
#: once a checkpoint copied all of it with no commit meanwhile, under steady writes the
#: commit that crosses this mark copies the rest (a little later when it finds the
#: background checkpoint at work: about 36 MiB of log at 2 KiB pages for one writer, 45
#: MiB for two). The log is deleted when the database's last connection closes.
_WAL_PAGES = 16384


class DiskBase:
    """The state of a :class:`~durably.DiskStore` as its parts use it: the attributes
    ``DiskStore.__init__`` sets, and (for the type checker only) the methods one part calls
    that another defines. It adds nothing at run time: a DiskStore's methods are its own
    and its parts'."""

    size_limit: int | None
    synchronous: str
    memo_entries: int
    evicted: int
    _lock: threading.RLock
    _local: threading.local
    _cache: Any
    _root: Path | None
    _key: SigningKey | None
    _key_gen: int
    _warned: set[str]
    _unreleased: set[str]
    _cache_writes: int
    _memo: dict[str, tuple[bytes, float]]
    _memo_bytes: int
    _memo_signer: bytes | None
    _memo_gen: int
    _memo_until: float
    _watch: sqlite3.Connection | None
    _watch_pid: int
    _watch_version: int
    _read_cache: _Translate
    _write_cache: _Translate
    _read_journal: _Translate
    _write_journal: _WriteJournal
    _read_only: bool

    if TYPE_CHECKING:
        # -- the core (durably._store.disk.store) ------------------------------------------
        @property
        def path(self) -> Path: ...
        def _open(self) -> Path: ...
        def _db(self) -> sqlite3.Connection: ...
        def _signing(self) -> SigningKey | None: ...
        def _translate(self, where: str | Path, action: str) -> _Translate: ...
        def store_error(self, exc: BaseException, where: str | Path, action: str
                        ) -> StoreError: ...
        def read_only_error(self, action: str) -> StoreError: ...
        def _journal_here(self) -> None: ...
        def _checkpoint_soon(self, *parts: str) -> None: ...
        def snapshot(self) -> contextlib.AbstractContextManager[None]: ...

        # -- journal values (durably._store.disk.values) -----------------------------------
        def _seal_blob(self, value: bytes | None, *context: str,
                       placed: list[str] | None = None, reuse: bytes | None = None
                       ) -> bytes | None: ...
        def _open_journal_value(self, data: Any, context: tuple[str, ...], eager: bool,
                                error: Any) -> tuple[bytes | None, str]: ...
        def _corrupt(self, run_id: str, what: str, why: str, fix: str = ""
                     ) -> CorruptJournalError: ...
        def _blob_names(self, db: sqlite3.Connection, run_id: str | None = None
                        ) -> set[str]: ...
        def collect_blobs(self, grace: float = 3600.0, *, named: Iterable[str] = (),
                          dry_run: bool = False) -> tuple[int, int]: ...

        # -- runs (durably._store.disk.runs) -----------------------------------------------
        def run_holder(self, run_id: str) -> Owner | None: ...
