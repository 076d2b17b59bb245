"""Commits SQLite cannot read back from a damaged write-ahead log.

A journal's latest commits live in ``journal.sqlite3-wal`` until a checkpoint copies them
into the database file. SQLite reads that log frame by frame and stops at the first frame
whose checksum fails: everything written after it is ignored, silently, and the journal
reads as it was before. A finished step committed there would look unfinished, and a
``cache=False`` step (a side effect) would execute again.

The log's format is documented (https://www.sqlite.org/fileformat2.html#walformat): a
32-byte header, whose two salts every frame of the current log repeats, then frames of a
24-byte header (page number, the database size for the last frame of a commit, 0 for
others, the salts, a checksum) and a page. The wal-index (``-shm``) says how many frames
SQLite accepted (``mxFrame``). Frames of the current log past that point are either the
unfinished commit of a process killed while writing it (at most one commit frame), or commits
lost behind a damaged frame: two commit frames or more.

One sequence reads as damage without being one: two processes each killed in the
microseconds between writing a commit's last frame and publishing it in the wal-index, while
another connection kept the journal open (so no recovery read them back), with no restart of
the log in between. Those commits were never visible to anyone; accepting the "loss" (the fix
the error gives) loses nothing.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sqlite3
import struct
from pathlib import Path

__all__ = ["BUSY", "lost_commits"]

#: what :func:`lost_commits` returns when another connection holds the write lock longer
#: than it waits (no frame is numbered 0)
BUSY = (0, 0)
#: how long :func:`lost_commits` waits for the write lock when it is not to wait (ms): the
#: commits of durably's own processes take less
_BRIEF_MS = 100

_MAGICS = (0x377F0682, 0x377F0683)
_HEADER = 32
_FRAME_HEADER = 24
#: the wal-index header: mxFrame at byte 16 (native order), the log's salts at 32 (as in it)
_MX_FRAME = struct.Struct("=I")
_NOT_COMMIT = bytes(4)  # a frame header's database size: 0 for a frame that ends no commit


#: a descriptor of each wal-index read, by (device, inode), not closed while the file
#: exists: on Linux (POSIX locks), closing any descriptor of a file drops every lock this
#: process holds on it, SQLite's own locks on the wal-index included (a reader then sees a
#: torn index: SIGBUS)
_INDEX_FDS: dict[tuple[int, int], int] = {}


def _index_header(shm: Path) -> bytes:
    """The first 48 bytes of the wal-index (its header), read through a descriptor kept
    open while the file exists. A descriptor of a wal-index deleted since (its journal's
    last connection closed: SQLite deletes it) is closed first: nobody holds a lock on a
    file no connection uses, and its inode number may be given to a new file."""
    for key, kept in list(_INDEX_FDS.items()):
        if os.fstat(kept).st_nlink == 0:
            del _INDEX_FDS[key]
            os.close(kept)
    st = os.stat(shm)
    fd = _INDEX_FDS.get((st.st_dev, st.st_ino))
    if fd is None:
        fd = os.open(shm, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        opened = os.fstat(fd)
        _INDEX_FDS[(opened.st_dev, opened.st_ino)] = fd
    return os.pread(fd, 48, 0)


def lost_commits(con: sqlite3.Connection, journal: Path, wait: bool = True
                 ) -> tuple[int, int] | None:
    """``(frame, commits)`` when the write-ahead log of ``journal`` holds ``commits`` commits
    SQLite stopped reading at ``frame`` (the first frame it did not accept), counting from
    1; None when it holds none, or when that cannot be told (no log, a log another
    connection is writing, an index in another format).

    Takes the journal's write lock for the time it reads (``BEGIN IMMEDIATE``): no commit
    can be appended while the frames past the accepted ones are counted, waiting for it for
    the connection's busy timeout (``wait``), else 0.1 s: :data:`BUSY` when another
    connection holds it longer. Never raises for a journal it cannot lock or read: that is
    for the caller's own statements to say.
    """
    wal = journal.with_name(journal.name + "-wal")
    shm = journal.with_name(journal.name + "-shm")
    try:
        if os.path.getsize(wal) <= _HEADER:
            return None
        timeout = None if wait else con.execute("PRAGMA busy_timeout").fetchone()[0]
        if timeout is not None:
            con.execute(f"PRAGMA busy_timeout={_BRIEF_MS}")
        try:
            con.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY:
                return BUSY
            raise
        finally:
            if timeout is not None:
                con.execute(f"PRAGMA busy_timeout={int(timeout)}")
    except (OSError, sqlite3.Error):
        return None
    try:
        with open(wal, "rb") as log:  # (SQLite takes no lock on the log: closing it is safe)
            header = log.read(_HEADER)
            head = _index_header(shm)
            if len(header) < _HEADER or len(head) < 48:
                return None
            magic, _version, page_size = struct.unpack_from(">III", header)
            if magic not in _MAGICS or page_size < 512 or page_size & (page_size - 1):
                return None
            salts = header[16:24]
            if head[32:40] != salts:
                return None  # the index describes another log (one being restarted)
            accepted = _MX_FRAME.unpack_from(head, 16)[0]
            frame_size = _FRAME_HEADER + page_size
            frames = (os.fstat(log.fileno()).st_size - _HEADER) // frame_size
            commits = 0
            if frames > accepted:
                # (mapped: a log keeps its size when it restarts, thousands of stale frames)
                with mmap.mmap(log.fileno(), 0, access=mmap.ACCESS_READ) as view:
                    for at in range(_HEADER + accepted * frame_size,
                                    _HEADER + frames * frame_size, frame_size):
                        # a frame of the current log (its salts) that ends a commit
                        if view[at + 8:at + 16] == salts and view[at + 4:at + 8] != _NOT_COMMIT:
                            commits += 1
        # one commit frame past the accepted ones: the commit a killed process was writing
        return (accepted + 1, commits) if commits >= 2 else None
    except (OSError, ValueError, struct.error):
        return None
    finally:
        with contextlib.suppress(sqlite3.Error):
            con.execute("ROLLBACK")
