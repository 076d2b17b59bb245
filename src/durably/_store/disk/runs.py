"""Runs in the journal: a run's record (entrypoint, status, attempt, arguments, result),
written in place and, for an attempt's final record, only while the run is still that
attempt's (fencing); the lease a live process holds on a run it executes; the run's events
(its questions and answers among them); listing, deleting and repairing runs.

Apart from the steps (:mod:`~durably._store.disk.steps`): a run's record and lease are
written once or twice an attempt, its steps at every call.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from durably._keys.serde import Unreadable
from durably._store.disk.base import DiskBase
from durably._store.disk.repair import repair_run
from durably._store.disk.rows import (
    EVENT_COLS,
    EVENT_TYPES,
    RUN_COLS,
    RUN_TYPES,
    garbage,
    immediate,
    run_row,
)
from durably._store.lease import Owner, me
from durably._store.records import EventRecord, RunRecord
from durably.exceptions import RunStateError, StoreError

if TYPE_CHECKING:
    from durably._store.disk.store import DiskStore

__all__ = ["RunJournal"]

log = logging.getLogger("durably")

#: a run's record, written in place when it exists (an upsert, not INSERT OR REPLACE: a
#: replaced row moves to a new rowid, which dirties two more pages of the table and its
#: pk index at every start and end of an attempt)
_RUN_UPSERT = "ON CONFLICT(run_id) DO UPDATE SET " + ", ".join(
    f"{c.strip()}=excluded.{c.strip()}" for c in RUN_COLS.split(",")[1:])
_PUT_RUN = f"INSERT INTO runs ({RUN_COLS}) VALUES ({', '.join('?' * 12)}) {_RUN_UPSERT}"
#: the same, only while the run is still the attempt's: its record has that attempt (a
#: run's record exists from its first attempt's start on: an UPDATE, a third faster than
#: an upsert whose SELECT looks the attempt up)
_PUT_RUN_IF_CURRENT = ("UPDATE runs SET " + ", ".join(
    f"{c.strip()}=?" for c in RUN_COLS.split(",")[1:]) + " WHERE run_id=? AND attempt=?")
#: the tables holding a run's rows besides runs (deleted with it: see delete_runs)
_RUN_TABLES = ("steps", "replays", "events", "set_aside", "leases")


class RunJournal(DiskBase):
    """The part of :class:`~durably.DiskStore` that journals runs, their leases and their
    events."""

    def find_run(self, run_id: str) -> RunRecord | None:
        row = self._query_one(f"SELECT {RUN_COLS} FROM runs WHERE run_id=?", (run_id,))
        return self._run_from_row(row, strict=True) if row else None

    def find_latest_run(self, entrypoint: str, input_digest: str) -> RunRecord | None:
        row = self._query_one(
            f"SELECT {RUN_COLS} FROM runs WHERE entrypoint=? AND input_digest=? "
            "ORDER BY updated DESC, rowid DESC LIMIT 1",
            (entrypoint, input_digest),
        )
        return self._run_from_row(row, strict=True) if row else None

    def _run_from_row(self, row: Sequence[Any], strict: bool) -> RunRecord | None:
        """A run's record; its arguments and result are opened when they are loaded. A
        damaged result reads as "not stored" (a rerun stores it again); damaged arguments
        raise CorruptJournalError when loaded."""
        bad = garbage(row, RUN_TYPES)
        if bad:
            run_id = row[0] if isinstance(row[0], str) else repr(row[0])
            error = self._corrupt(run_id, "its run row", f"the row is garbage ({bad})")
            if strict:
                raise error
            log.warning("durably: %s", error)
            return None
        rec = RunRecord(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7])
        rec.error = row[10] if isinstance(row[10], str) else None
        rec.thread = row[11] if isinstance(row[11], str) else None
        run_id = rec.run_id
        if row[8] is not None:
            args, why = self._open_journal_value(
                row[8], ("args", run_id), False,
                lambda why: self._corrupt(run_id, "its stored arguments", why))
            rec.args = args if args is not None else Unreadable(self._corrupt(
                run_id, "its stored arguments", why,
                f"Fix: call the entrypoint with the same arguments (and run_id={run_id!r}) "
                "to continue it, or repair_run() it."))
        if row[9] is not None:
            result, why = self._open_journal_value(
                row[9], ("result", run_id), False,
                lambda why: self._corrupt(run_id, "its stored result", why,
                                          "Fix: rerun the entrypoint with the same arguments: "
                                          "its steps replay and its result is stored again."))
            if result is None:
                rec.error = (f"its stored result is damaged ({why}). Fix: rerun the entrypoint "
                             "with the same arguments: its steps replay from the journal and "
                             "the result is stored again")
            rec.result = result
        return rec

    def put_run(self, record: RunRecord) -> None:
        self._journal_here()
        args = self._seal_blob(record.args, "args", record.run_id)
        result = self._seal_blob(record.result, "result", record.run_id)
        values = (*run_row(record)[:8], args, result, record.error, record.thread)
        with self._write_journal:
            self._db().execute(_PUT_RUN, values)

    def put_run_if_current(self, record: RunRecord, previous: int | None = None) -> bool:
        """:meth:`put_run` of an attempt's final record, only while the run is still that
        attempt's (no other process took it over: the stored record has
        ``record.attempt``), checked by the statement that writes it (a large value is
        sealed, and written to ``blobs/``, before): False, and nothing written, when it is
        not. With ``previous``: only while the stored record has that attempt instead (an
        attempt whose start is journaled with this write: the one before it must still be
        the run's last).

        Raises:
            StoreError: the journal cannot be written.
        """
        self._journal_here()
        args = self._seal_blob(record.args, "args", record.run_id)
        result = self._seal_blob(record.result, "result", record.run_id)
        values = (*run_row(record)[1:8], args, result, record.error, record.thread,
                  record.run_id,
                  record.attempt if previous is None else previous)
        with self._write_journal:
            return self._db().execute(_PUT_RUN_IF_CURRENT, values).rowcount == 1

    def acquire_run(self, run_id: str, owner: Owner) -> Owner | None:
        lease = (run_id, owner.host, owner.pid, owner.started, owner.token, time.time())
        with self._write_journal, immediate(self._db()) as db:
            if db.execute("INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?) "
                          "ON CONFLICT (run_id) DO NOTHING", lease).rowcount == 1:
                return None  # (the common case: nobody held it)
            holder = self._live_holder(db, run_id, owner)
            if holder is not None:
                return holder
            db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?)", lease)
        return None

    def check_run(self, run_id: str, owner: Owner) -> Owner | None:
        """The live holder of the run's lease other than ``owner``, else None, without
        taking the lease: for an attempt whose start and end are written in one transaction
        (an attempt that only replayed). A lease its process left behind (dead, or a damaged
        row: with a warning) is removed, as :meth:`acquire_run` would take it over.

        Raises:
            StoreError: the journal cannot be written.
        """
        with self._write_journal, immediate(self._db()) as db:
            return self._live_holder(db, run_id, owner, remove=True)

    def _live_holder(self, db: sqlite3.Connection, run_id: str, owner: Owner,
                     remove: bool = False) -> Owner | None:
        """The live holder of the run's lease row other than ``owner`` (inside a write
        transaction), else None; ``remove``: a row that is not live is deleted."""
        row = db.execute("SELECT host, pid, started, token, heartbeat FROM leases "
                         "WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            return None
        holder = Owner(*row)
        try:
            alive = holder.alive(time.time())
        except (TypeError, ValueError, OverflowError):  # a damaged lease row
            log.warning("durably: the lease of run %r at %s is damaged (%r); taking it "
                        "over", run_id, self.path, row)
            alive = False
        if holder.token != owner.token and holder.token not in self._unreleased and alive:
            return holder
        if remove and (not alive or holder.token in self._unreleased):
            db.execute("DELETE FROM leases WHERE run_id=?", (run_id,))
        return None

    def run_holder(self, run_id: str) -> Owner | None:
        """The owner of the run's lease if it is alive (the run is executing now), else
        None: no lease (the run is not executing), or one its process left behind when it
        died (on another host: not renewed for ``LEASE_SECONDS``)."""
        row = self._query_one("SELECT host, pid, started, token, heartbeat FROM leases "
                              "WHERE run_id=?", (run_id,))
        if row is None:
            return None
        holder = Owner(*row)
        try:
            alive = holder.alive(time.time())
        except (TypeError, ValueError, OverflowError):  # a damaged lease row: taken over
            return None
        return holder if alive and holder.token not in self._unreleased else None

    def renew_run(self, run_id: str, owner: Owner) -> bool:
        """Refresh the heartbeat of the lease ``owner`` holds; False if it holds none (the
        run was taken over by another process, or its lease removed)."""
        with self._write_journal:
            return self._db().execute(
                "UPDATE leases SET heartbeat=? WHERE run_id=? AND token=?",
                (time.time(), run_id, owner.token)).rowcount == 1

    def renew_run_apart(self, run_id: str, owner: Owner) -> bool:
        """:meth:`renew_run` from a thread that does nothing else (the lease's heartbeat),
        on a connection opened for it and closed after, so that none of that thread stays
        open (the journal's write-ahead log is removed when the last one closes). It waits
        at most 5 s for a journal another process keeps locked (the next beat tries
        again), and never creates a journal that was deleted meanwhile.

        Returns:
            False if ``owner`` holds no lease of the run (taken over, or removed), else True.

        Raises:
            sqlite3.Error: the journal cannot be written now.
        """
        root = self._root
        if root is None:
            return True
        con = sqlite3.connect(f"{(root / 'journal.sqlite3').as_uri()}?mode=rw", uri=True,
                              timeout=5.0, isolation_level=None)
        try:
            return con.execute("UPDATE leases SET heartbeat=? WHERE run_id=? AND token=?",
                               (time.time(), run_id, owner.token)).rowcount == 1
        finally:
            con.close()

    def release_run(self, run_id: str, owner: Owner) -> bool:
        """Give up the lease ``owner`` holds; False if it held none (the run was taken over
        by another process, or its lease removed)."""
        try:
            with self._write_journal:
                return self._db().execute("DELETE FROM leases WHERE run_id=? AND token=?",
                                          (run_id, owner.token)).rowcount == 1
        except StoreError:  # (a full disk): this process may take the lease over later
            self._unreleased.add(owner.token)
            raise

    def list_runs(self, entrypoint: str | None = None) -> list[RunRecord]:
        """Runs, most recently updated first (a run whose row is garbage is left out, with a
        warning)."""
        with self._read_journal:
            if entrypoint is None:
                rows = self._db().execute(
                    f"SELECT {RUN_COLS} FROM runs ORDER BY updated DESC, rowid DESC"
                ).fetchall()
            else:
                rows = self._db().execute(
                    f"SELECT {RUN_COLS} FROM runs WHERE entrypoint=? OR name=? "
                    "ORDER BY updated DESC, rowid DESC",
                    (entrypoint, entrypoint),
                ).fetchall()
        found = (self._run_from_row(row, strict=False) for row in rows)
        return [rec for rec in found if rec is not None]

    def list_thread_runs(self, thread: str) -> list[RunRecord]:
        """The runs on a conversation thread, most recently updated first (by the
        ``runs_by_thread`` index)."""
        with self._read_journal:
            rows = self._db().execute(
                f"SELECT {RUN_COLS} FROM runs WHERE thread=? ORDER BY updated DESC, rowid DESC",
                (thread,)).fetchall()
        found = (self._run_from_row(row, strict=False) for row in rows)
        return [rec for rec in found if rec is not None]

    def delete_runs(self, run_ids: Iterable[str], *, dry_run: bool = False,
                    skip_executing: bool = False) -> list[str]:
        """Delete runs from the journal: each run's record, steps, replays, events (its
        questions and answers among them), records set aside by :meth:`repair_run` and
        lease; then the files in ``blobs/`` that only they referred to. The cache is kept:
        a step of a deleted run still serves later calls. Each run is deleted in one
        transaction, all of it or nothing (a crash leaves at most unreferenced files in
        ``blobs/``, which :meth:`collect_blobs` removes). A call with the same arguments
        afterwards starts a new run.

        Args:
            run_ids: The runs' ids; an id with no run is skipped.
            dry_run: Check the runs and say which would be deleted; delete nothing.
            skip_executing: Leave out a run a live process is executing (not deleted, not
                returned) instead of raising.

        Returns:
            The ids of the runs deleted (with ``dry_run``: that would be), in the order given.

        Raises:
            RunStateError: a live process is executing one of the runs (its lease): checked
                for every run before the first is deleted, and then nothing is deleted; a
                run that started since stops the deletion there (those before it are
                deleted).
            StoreError: the journal or ``blobs/`` cannot be read or written.

        Example:
            >>> import durably, tempfile
            >>> store = durably.DiskStore(tempfile.mkdtemp())
            >>> @durably.entrypoint(store=store)
            ... def greet(name):
            ...     return f"hello {name}"
            >>> run = greet.run("ada")
            >>> store.delete_runs([run.id, "no-such-run"]) == [run.id]
            True
            >>> store.list_runs()
            []
        """
        if isinstance(run_ids, (str, bytes)):
            raise TypeError(f"delete_runs() takes a list of run ids, not one id: "
                            f"delete_runs([{run_ids!r}])")
        ids = list(dict.fromkeys(run_ids))
        for run_id in ids:
            if not isinstance(run_id, str):
                raise TypeError(f"delete_runs() takes run ids (str), not {run_id!r}")
        owner = me()
        with self._read_journal:
            db = self._db()
            found = [r for r in ids
                     if db.execute("SELECT 1 FROM runs WHERE run_id=?", (r,)).fetchone()]
        for run_id in list(found):
            holder = self.run_holder(run_id)
            if holder is not None:
                if not skip_executing:
                    raise self._executing(run_id, holder)
                found.remove(run_id)
        if dry_run:
            return found
        deleted: list[str] = []
        named: set[str] = set()  # the blobs/ files the deleted rows referred to
        try:
            for run_id in found:
                with self._write_journal, immediate(self._db()) as db:
                    holder = self._live_holder(db, run_id, owner)
                    if holder is not None:  # (started since: left as it is)
                        if skip_executing:
                            continue
                        raise self._executing(run_id, holder)
                    named |= self._blob_names(db, run_id)
                    gone = db.execute("DELETE FROM runs WHERE run_id=?", (run_id,)).rowcount
                    for table in _RUN_TABLES:
                        db.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
                if gone:
                    deleted.append(run_id)
        finally:
            if deleted:  # (and the files attempts left behind: see collect_blobs)
                self.collect_blobs(named=named)
        return deleted

    def _executing(self, run_id: str, holder: Owner) -> RunStateError:
        return RunStateError(
            f"run {run_id!r} at {self.path} is being executed by {holder.describe()}: a run "
            "is deleted only while no process executes it. Fix: wait for that attempt to end "
            "(or stop it), then delete the run again.")

    def append_events(self, events: Sequence[EventRecord]) -> None:
        if not events:
            return
        rows = [(e.run_id, e.kind, e.time, e.attempt, e.step_id, e.key,
                 self._seal_blob(e.data, "event", e.run_id, e.kind, e.key)) for e in events]
        with self._write_journal, immediate(self._db()) as db:
            db.executemany(f"INSERT INTO events ({EVENT_COLS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           rows)

    def list_events(self, run_id: str, kinds: Sequence[str] | None = None) -> list[EventRecord]:
        """A run's events in order; a damaged payload raises CorruptJournalError when it is
        loaded.

        Raises:
            CorruptJournalError: a row of the run is garbage.
        """
        sql = f"SELECT {EVENT_COLS} FROM events WHERE run_id=?"
        params: list[Any] = [run_id]
        if kinds is not None:
            sql += f" AND kind IN ({', '.join('?' * len(kinds))})"
            params.extend(kinds)
        with self._read_journal:
            rows = self._db().execute(sql + " ORDER BY seq", params).fetchall()
        found = []
        for row in rows:
            bad = garbage(row, EVENT_TYPES)
            if bad:
                raise self._corrupt(run_id, "an event row", f"the row is garbage ({bad})")
            r, k, t, a, s, key, d = row
            data: bytes | None = None
            if d is not None:
                what = f"the data of its {k!r} event {key}".rstrip()
                data, why = self._open_journal_value(
                    d, ("event", r, k, key), False,
                    lambda why, what=what: self._corrupt(run_id, what, why))
                if data is None:
                    data = Unreadable(self._corrupt(run_id, what, why))
            found.append(EventRecord(r, k, t, a, s, key, data))
        return found

    def repair_run(self, run_id: str) -> list[str]:
        """Set aside the damaged parts of a run's journal so that the run can continue.

        A finished step whose recorded result is damaged is removed from the journal (and
        kept in the ``set_aside`` table): it executes again when the run is resumed — for a
        ``cache=False`` task, its side effect happens again, which is why durably never does
        this by itself. Damaged arguments or results of the run are cleared (a rerun with
        the same arguments stores them again); a damaged answer to an ``interrupt()`` is
        removed (the question is asked again). A damaged record of replayed steps is removed
        (they only said which steps an attempt replayed). Every value is checked, large ones
        end to end.

        Args:
            run_id: The run.

        Returns:
            What was set aside, one line each (empty when nothing was damaged).

        Raises:
            NotFoundError: the store has no run with that id.

        Example:
            >>> import durably, tempfile
            >>> store = durably.DiskStore(tempfile.mkdtemp())
            >>> @durably.entrypoint(store=store)
            ... def job():
            ...     return 1
            >>> store.repair_run(job.run().id)
            []
        """
        return repair_run(cast("DiskStore", self), run_id)

    def _query_one(self, sql: str, params: tuple[Any, ...]) -> Any:
        with self._read_journal:
            return self._db().execute(sql, params).fetchone()
