"""Journal format 6: the start and the end of an attempt write fewer pages (events without
AUTOINCREMENT, leases WITHOUT ROWID, no index of runs by update time); a format 5 journal is
upgraded in place with its events, leases and runs."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

import durably
from durably._store.disk.store import JOURNAL_FORMAT
from durably.exceptions import RunStateError

# the workload and helpers of the format 5 tests (store: a fixture)
from .test_journal_format5 import FAIL, NOTES, _journal, pipeline, store

__all__ = ["store"]


def _table_sql(con: sqlite3.Connection, name: str) -> str:
    row = con.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name=?",
                      (name,)).fetchone()
    return str(row[0])


def _index_names(con: sqlite3.Connection) -> set[str]:
    return {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='index'")}


def _as_format_5(root: Path) -> None:
    """Give the journal the shape format 5 wrote: events with AUTOINCREMENT, leases with a
    rowid, and the runs_by_time index (rows kept)."""
    statements = [
        "BEGIN IMMEDIATE",
        """CREATE TABLE events_5 (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, kind TEXT NOT NULL,
            time REAL NOT NULL, attempt INTEGER NOT NULL, step_id TEXT, key TEXT NOT NULL,
            data BLOB)""",
        "INSERT INTO events_5 SELECT * FROM events ORDER BY seq",
        "DROP TABLE events",
        "ALTER TABLE events_5 RENAME TO events",
        "CREATE INDEX events_by_run ON events (run_id, kind, seq)",
        """CREATE TABLE leases_5 (
            run_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, started INTEGER,
            token TEXT NOT NULL, heartbeat REAL NOT NULL)""",
        "INSERT INTO leases_5 SELECT * FROM leases",
        "DROP TABLE leases",
        "ALTER TABLE leases_5 RENAME TO leases",
        "CREATE INDEX runs_by_time ON runs (updated)",
        "PRAGMA user_version=5",
        "COMMIT",
    ]
    with _journal(root) as con:
        for statement in statements:
            con.execute(statement)


def test_a_new_journal_has_the_format_6_tables(store: durably.DiskStore) -> None:
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        pipeline.run(3, run_id="r")
    with _journal(store.path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT >= 6
        assert "AUTOINCREMENT" not in _table_sql(con, "events")
        assert "WITHOUT ROWID" in _table_sql(con, "leases")
        assert "runs_by_time" not in _index_names(con)
        assert "events_by_run" in _index_names(con)
        # the attempt's start and end events are in the order they were written
        kinds = [k for (k,) in con.execute("SELECT kind FROM events WHERE run_id='r' "
                                           "ORDER BY seq")]
    assert kinds == ["run_started", "run_failed"]


def test_a_format_5_journal_is_upgraded_with_its_events_leases_and_runs(
        store: durably.DiskStore) -> None:
    """Every event keeps its seq and contents, a live lease still keeps other processes out,
    runs list in the same order, and a failed run resumes without executing its side
    effects again; events written after the upgrade come after the old ones."""
    FAIL["on"] = True
    for name in ("first", "held", "second"):
        with pytest.raises(RuntimeError):
            pipeline.run(2, run_id=name)
        time.sleep(0.01)  # distinct update times
    NOTES.clear()
    with _journal(store.path) as con:
        # the lease of a process on another machine that is executing run "held" right now
        con.execute("INSERT INTO leases VALUES ('held', 'elsewhere', 7, NULL, 'tok', ?)",
                    (time.time(),))
        events = con.execute("SELECT * FROM events ORDER BY seq").fetchall()
        leases = con.execute("SELECT * FROM leases").fetchall()
    order = [r.run_id for r in store.list_runs()]
    assert order == ["second", "held", "first"]
    store.close()
    _as_format_5(store.path)
    with _journal(store.path) as con:
        assert "AUTOINCREMENT" in _table_sql(con, "events")  # (the format 5 shape, for real)

    reopened = durably.DiskStore(store.path)
    durably.configure(store=reopened)
    assert [r.run_id for r in reopened.list_runs()] == order
    with _journal(store.path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT
        assert con.execute("SELECT * FROM events ORDER BY seq").fetchall() == events
        assert con.execute("SELECT * FROM leases").fetchall() == leases
        assert "AUTOINCREMENT" not in _table_sql(con, "events")
        assert "WITHOUT ROWID" in _table_sql(con, "leases")
        assert "runs_by_time" not in _index_names(con)
    with pytest.raises(RunStateError, match="held by"):
        pipeline.run(2, run_id="held")
    FAIL["on"] = False
    run = pipeline.run(2, run_id="first")
    assert run.result == 2 and run.counts()["replayed"] == 4
    assert NOTES == []  # its cache=False steps did not execute again
    assert reopened.list_runs()[0].run_id == "first"  # the latest update
    with _journal(store.path) as con:
        newest = max(seq for (seq,) in con.execute("SELECT seq FROM events"))
        kinds = [k for (k,) in con.execute(
            "SELECT kind FROM events WHERE run_id='first' ORDER BY seq")]
        assert newest > max(row[0] for row in events)
    assert kinds == ["run_started", "run_failed", "run_started", "run_finished"]


def test_a_connection_opened_before_the_upgrade_still_writes(store: durably.DiskStore) -> None:
    """A process of the previous durably that had the journal open when another upgraded it
    goes on with the statements it knows: they work on the rebuilt tables."""
    pipeline(1)
    store.close()
    _as_format_5(store.path)
    with _journal(store.path) as old:
        old.execute("SELECT count(*) FROM leases").fetchone()  # (its schema read: format 5)
        reopened = durably.DiskStore(store.path)
        durably.configure(store=reopened)
        pipeline(2)  # upgraded now
        lease = ("x", "h", 1, None, "t", time.time())
        assert old.execute("INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) "
                           "DO NOTHING", lease).rowcount == 1
        assert old.execute("INSERT INTO leases VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) "
                           "DO NOTHING", lease).rowcount == 0
        old.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?, ?)", lease)
        assert old.execute("UPDATE leases SET heartbeat=? WHERE run_id=? AND token=?",
                           (time.time(), "x", "t")).rowcount == 1
        assert old.execute("DELETE FROM leases WHERE run_id=? AND token=?",
                           ("x", "t")).rowcount == 1
        old.execute("INSERT INTO events (run_id, kind, time, attempt, step_id, key, data) "
                    "VALUES ('x', 'note', 1.0, 1, NULL, '', NULL)")
        assert old.execute("SELECT kind FROM events ORDER BY seq DESC LIMIT 1"
                           ).fetchone() == ("note",)
        assert old.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT
