"""Journal values: how a value the journal holds (a run's arguments and result, a step's
result, an event's data) is sealed when written (a checksum and, with a key, a signature; a
large one written to ``blobs/``, the journal keeping a reference to it) and opened when read,
and the files in ``blobs/``: their size, and their collection once no row refers to them.

Apart from the runs (:mod:`~durably._store.disk.runs`) and steps
(:mod:`~durably._store.disk.steps`) whose values these are: both seal and open them the same
way, and a file in ``blobs/`` may be referred to by any of their rows.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

from durably._keys import serde as _serde
from durably._keys.serde import Spilled, Unreadable
from durably._store.disk.base import DiskBase
from durably._store.disk.blobs import (
    BLOB_REF,
    as_spilled,
    blob_ref,
    open_blob,
    same_content,
    valid_blob_name,
)
from durably._store.disk.signing import _ctx
from durably._store.integrity import open_seal, seal
from durably.exceptions import CorruptJournalError

__all__ = ["JournalValues", "Sealed"]

#: the columns a reference to a file in blobs/ may be in: (table, column, only short values)
_REF_COLUMNS = (("runs", "args", True), ("runs", "result", True), ("steps", "result", True),
                ("events", "data", True), ("set_aside", "data", False),
                ("set_aside", "row", False))
_REF_LARGEST = 4096  # a sealed reference's length is far below this (about 250 bytes)
_REF_NAME = re.compile(rb'"blob": ?"([0-9a-f]{32})"')  # (a name in a reference's JSON)


class Sealed(bytes):
    """A journal value sealed already (:meth:`DiskStore.seal_ahead`): written as it is.

    Attributes:
        placed: The file sealing it put in ``blobs/`` (a large value), else None: removed
            by :meth:`DiskStore.discard_ahead` when the write it was sealed for is not made.
    """

    placed: str | None = None


class JournalValues(DiskBase):
    """The part of :class:`~durably.DiskStore` that seals and opens journal values and
    looks after ``blobs/``."""

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
            >>> from durably import DiskStore
            >>> from durably.store import RunRecord
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

    # -- blobs/ ----------------------------------------------------------------------------
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

    def collect_values(self, grace: float = 3600.0) -> tuple[int, int]:
        """Remove files in ``blobs/`` no journal row refers to (see :meth:`collect_blobs`)."""
        return self.collect_blobs(grace)

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
            >>> from durably import DiskStore
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
