"""Repairing a journal: setting damaged rows aside (:meth:`DiskStore.repair_run`), and
sealing the blobs of a journal written before they were sealed (format 3)."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from durably._keys.serde import Spilled
from durably._store.disk.rows import (
    EVENT_COLS,
    EVENT_TYPES,
    RUN_COLS,
    RUN_TYPES,
    STEP_COLS,
    STEP_TYPES,
    compact_replay,
    garbage,
    immediate,
    pack_replays,
    replayed_in_ranges,
    unpack_ranges,
    unpack_replays,
)
from durably._store.integrity import SigningKey, open_seal, seal
from durably._store.records import FINISHED_STEP
from durably.exceptions import CorruptJournalError, NotFoundError

if TYPE_CHECKING:
    from durably._store.disk.store import DiskStore

__all__ = ["repair_run", "seal_old_blobs"]

log = logging.getLogger("durably")
_INT = (int,)


def _ctx(*parts: str) -> bytes:
    return "\x00".join(parts).encode()


def repair_run(store: DiskStore, run_id: str) -> list[str]:
    """See :meth:`DiskStore.repair_run`."""
    done: list[str] = []
    t = time.time()
    with store._write_journal, immediate(store._db()) as db:
        run = db.execute(f"SELECT rowid, {RUN_COLS} FROM runs WHERE run_id=?",
                         (run_id,)).fetchone()
        steps = db.execute(f"SELECT rowid, {STEP_COLS}, CAST(result AS BLOB) FROM steps "
                           "WHERE run_id=?",
                           (run_id,)).fetchall()
        if run is None and not steps and not db.execute(
                "SELECT 1 FROM replays WHERE run_id=? LIMIT 1", (run_id,)).fetchone():
            raise NotFoundError(
                f"no run {run_id!r} in the store at {store.path}. Fix: check the id with "
                "durably.list_runs().")

        def aside(what: str, reason: str, row: Sequence[Any], data: Any) -> None:
            db.execute("INSERT INTO set_aside (run_id, what, reason, time, row, data) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       (run_id, what, reason, t, repr(tuple(row))[:4000],
                        data if isinstance(data, bytes) else None))
            done.append(f"{what}: {reason}")

        def unsound(data: Any, context: tuple[str, ...]) -> str:
            if data is None:
                return ""
            value, why = store._open_journal_value(data, context, True, CorruptJournalError)
            if isinstance(value, Spilled):
                value.discard()
            return why

        damaged = []
        for rowid, *row in steps:
            data = row[-1]
            bad = garbage(row[:16], STEP_TYPES)
            if not bad and row[4] in FINISHED_STEP:
                bad = unsound(data, ("step", run_id, row[1])) if data is not None else \
                    "it has no recorded result"
            if bad:
                damaged.append((rowid, row, bad, data))
        # replay ranges name the records they replayed by their order: those that no
        # longer match set aside, and, before any record goes, all recorded step by step
        _check_ranges(db, run_id, aside, expand=bool(damaged))
        for rowid, row, bad, data in damaged:
            aside(f"step {row[1]!r} (task {row[3]!r})", bad, row[:15], data)
            db.execute("DELETE FROM steps WHERE rowid=?", (rowid,))
        replays = db.execute("SELECT rowid, attempt, steps FROM replays WHERE run_id=?",
                             (run_id,)).fetchall()
        for rowid, attempt, data in replays:
            bad = garbage((attempt,), (_INT,))
            if not bad:
                value, bad = open_seal(data)  # a checksum only (DiskStore.append_replays)
                if value is not None:
                    try:
                        if unpack_ranges(bytes(value)) is None:
                            unpack_replays(bytes(value))
                    except ValueError as exc:
                        bad = str(exc)
            if bad:
                aside(f"the record of steps replayed in attempt {attempt!r}", bad,
                      (run_id, attempt), data)
                db.execute("DELETE FROM replays WHERE rowid=?", (rowid,))
        if run is not None:
            rowid, *row = run
            bad = garbage(row, RUN_TYPES)
            if bad:
                aside("the run row", bad, row, None)
                db.execute("DELETE FROM runs WHERE rowid=?", (rowid,))
            else:
                if (why := unsound(row[8], ("args", run_id))):
                    aside("the run's arguments", why, row[:8], row[8])
                    db.execute("UPDATE runs SET args=NULL WHERE rowid=?", (rowid,))
                if (why := unsound(row[9], ("result", run_id))):
                    aside("the run's result", why, row[:8], row[9])
                    db.execute("UPDATE runs SET result=NULL, error=? WHERE rowid=?",
                               ("its stored result was damaged and set aside: rerun the "
                                "entrypoint with the same arguments to store it again",
                                rowid))
        events = db.execute(f"SELECT seq, {EVENT_COLS} FROM events WHERE run_id=?",
                            (run_id,)).fetchall()
        for seq, *row in events:
            bad = garbage(row, EVENT_TYPES)
            if not bad:
                bad = unsound(row[6], ("event", run_id, row[1], row[5]))
            if not bad:
                continue
            aside(f"its {row[1]!r} event", bad, row[:6], row[6])
            if row[1] == "answer" or garbage(row, EVENT_TYPES):
                db.execute("DELETE FROM events WHERE seq=?", (seq,))
            else:
                db.execute("UPDATE events SET data=NULL WHERE seq=?", (seq,))
    for line in done:
        log.warning("durably: repair_run(%r) set aside %s", run_id, line)
    return done


def _check_ranges(db: sqlite3.Connection, run_id: str,
                  aside: Callable[[str, str, Sequence[Any], Any], None], expand: bool) -> None:
    """Set aside the run's replay ranges that do not match the journal's records (the
    others of their row are written step by step); ``expand``: write every range step by
    step."""
    for rowid, attempt, data in db.execute(
            "SELECT rowid, attempt, steps FROM replays WHERE run_id=?", (run_id,)).fetchall():
        value, _ = open_seal(data) if type(attempt) is int else (None, "")
        try:
            ranges = unpack_ranges(bytes(value)) if value is not None else None
        except ValueError:
            ranges = None  # (damaged: set aside below, as any damaged row)
        if not ranges:
            continue
        unmatched: list[str] = []
        steps = [compact_replay(r) for r in replayed_in_ranges(
            db, run_id, [(attempt, ranges)], _collect(unmatched))]
        if not (expand or unmatched):
            continue
        for why in unmatched:
            aside(f"a range of steps replayed in attempt {attempt!r}", why, (run_id, attempt),
                  None)
        kept = [step for step in steps if step is not None]
        if kept:
            db.execute("UPDATE replays SET steps=? WHERE rowid=?",
                       (seal(pack_replays(kept)), rowid))
        else:
            db.execute("DELETE FROM replays WHERE rowid=?", (rowid,))


def _collect(into: list[str]) -> Callable[[str, int, str], None]:
    """A warn() for replayed_in_ranges that keeps the reasons."""
    return lambda _run, _attempt, why: into.append(why)


def seal_old_blobs(con: sqlite3.Connection, key: SigningKey | None) -> None:
    """Seal the blobs of a journal written before format 3 (in the upgrade's transaction)."""
    def sealed(data: Any, *context: str) -> Any:
        if not isinstance(data, bytes):
            return data
        return seal(data, key, _ctx(*context) if key is not None else b"")

    for rowid, run_id, step_id, data in con.execute(
            "SELECT rowid, run_id, step_id, result FROM steps WHERE result IS NOT NULL"
    ).fetchall():
        con.execute("UPDATE steps SET result=? WHERE rowid=?",
                    (sealed(data, "step", run_id, step_id), rowid))
    for rowid, run_id, args, result in con.execute(
            "SELECT rowid, run_id, args, result FROM runs").fetchall():
        con.execute("UPDATE runs SET args=?, result=? WHERE rowid=?",
                    (sealed(args, "args", run_id), sealed(result, "result", run_id), rowid))
    for seq, run_id, kind, key_, data in con.execute(
            "SELECT seq, run_id, kind, key, data FROM events WHERE data IS NOT NULL").fetchall():
        con.execute("UPDATE events SET data=? WHERE seq=?",
                    (sealed(data, "event", run_id, kind, key_), seq))
