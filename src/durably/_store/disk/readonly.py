"""A :class:`~durably.DiskStore` this process cannot write (a CI artifact, a colleague's copy,
a read-only mount), opened for reading: whether a store is one, its databases opened with
SQLite's ``mode=ro``, and the cache read without diskcache (whose ``Cache`` writes its
settings when it opens).

A database in WAL mode is read through its ``-shm`` index, which SQLite creates (writes)
when the last connection deleted it on closing: without the right to create it, such a
database is opened ``immutable`` (no log to read: the database file is all of it). A log
left beside the database (a crash, or a writer still open) is read through its index.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from durably.exceptions import StoreError

__all__ = ["ReadOnlyCache", "connect_read_only", "store_read_only"]


def _writable(path: Path) -> bool:
    """Whether this process may write ``path`` (False on a read-only file system)."""
    try:
        if os.statvfs(path).f_flag & getattr(os, "ST_RDONLY", 1):
            return False
    except (OSError, AttributeError):
        pass
    return os.access(path, os.W_OK)


def store_read_only(root: Path) -> bool:
    """Whether ``root`` holds a store (its ``FORMAT`` or its journal) that this process cannot
    write: the directory, its journal, its cache folder or the cache's index is not
    writable. A directory that holds no store yet is not one (creating it says why not)."""
    if not (root.is_dir() and ((root / "FORMAT").exists()
                               or (root / "journal.sqlite3").exists())):
        return False
    parts = (root, root / "journal.sqlite3", root / "cache", root / "cache" / "cache.db")
    return any(part.exists() and not _writable(part) for part in parts)


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection to the SQLite database at ``path`` that never writes: ``mode=ro``, or,
    when its log's index cannot be created here and no log is left beside it,
    ``immutable`` (the database file holds every commit then).

    Raises:
        sqlite3.Error: the database cannot be read (the caller names the path).
    """
    uri = path.absolute().as_uri()
    con = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=60.0, isolation_level=None,
                          check_same_thread=False)
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return con
    except sqlite3.OperationalError as exc:
        con.close()
        wal = path.with_name(path.name + "-wal")
        if ("readonly" not in str(exc) and "unable to open" not in str(exc)) or (
                wal.exists() and wal.stat().st_size > 0):
            raise
    con = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, isolation_level=None,
                          check_same_thread=False)
    con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return con


#: the tables of an empty diskcache index (a read-only store with no cache yet)
_EMPTY_CACHE = """
CREATE TABLE Settings (key TEXT NOT NULL UNIQUE, value);
INSERT INTO Settings VALUES ('size', 0);
CREATE TABLE Cache (rowid INTEGER PRIMARY KEY, key BLOB, raw INTEGER, store_time REAL,
    expire_time REAL, access_time REAL, access_count INTEGER DEFAULT 0, tag BLOB,
    size INTEGER DEFAULT 0, mode INTEGER DEFAULT 0, filename TEXT, value BLOB);
"""


class ReadOnlyCache:
    """What the store reads of a :class:`diskcache.Cache` (its connection, ``_sql``,
    ``volume()``, ``_disk.fetch``), on a connection that never writes. Anything else a
    ``Cache`` has is a write here: it raises the store's read-only :class:`StoreError`."""

    statistics = False
    eviction_policy = "none"

    def __init__(self, folder: Path, error: StoreError, disk: Any) -> None:
        self.directory = str(folder)
        self._error = error
        index = folder / "cache.db"
        if index.exists():
            self._con = connect_read_only(index)
        else:
            self._con = sqlite3.connect(":memory:", isolation_level=None,
                                        check_same_thread=False)
            self._con.executescript(_EMPTY_CACHE)
        self._disk = disk(str(folder))

    def _sql(self, statement: str, *args: Any) -> sqlite3.Cursor:
        return self._con.execute(statement, *args)

    def volume(self) -> int:
        """Bytes on disk: the index's pages and the value files (as ``Cache.volume``)."""
        pages = self._con.execute("PRAGMA page_count").fetchone()[0]
        size = self._con.execute("PRAGMA page_size").fetchone()[0]
        row = self._con.execute("SELECT value FROM Settings WHERE key = 'size'").fetchone()
        return int(pages) * int(size) + int(row[0] if row else 0)

    def close(self) -> None:
        self._con.close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._error
