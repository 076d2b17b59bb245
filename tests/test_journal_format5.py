"""Journal format 5: a step is found by ``sid`` (a 63-bit hash of its run and step ids) and a
key record is unique by ``kid`` (a hash of its cache key), so the journal's random-key indexes
hold short integers; older journals are upgraded in place."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import durably
from durably._store.disk import maintenance as _maintenance
from durably._store.disk import steps as steps_module
from durably._store.disk.rows import row_hash, row_hash_sql, step_sid
from durably._store.disk.store import JOURNAL_FORMAT
from durably._store.records import KeyRecord, StepRecord

FAIL = {"on": False}
NOTES: list[int] = []


@durably.task
def inc(x: int) -> int:
    return x + 1


@durably.task(cache=False)
def note(x: int) -> int:
    NOTES.append(x)
    return -x


@durably.entrypoint
def pipeline(n: int) -> int:
    total = 0
    for i in range(n):
        total += inc(i) + note(i)
    if FAIL["on"]:
        raise RuntimeError("stop after the steps")
    return total


@pytest.fixture
def store(tmp_path: Path) -> Iterator[durably.DiskStore]:
    disk = durably.DiskStore(tmp_path / "s")
    durably.configure(store=disk)
    FAIL["on"] = False
    NOTES.clear()
    yield disk
    FAIL["on"] = False


@contextlib.contextmanager
def _journal(root: Path) -> Iterator[sqlite3.Connection]:
    con = sqlite3.connect(root / "journal.sqlite3", isolation_level=None, timeout=5)
    try:
        yield con
    finally:
        con.close()


def _indexes(con: sqlite3.Connection, table: str) -> set[str]:
    return {name for (name,) in con.execute(
        "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name=? AND sql IS NOT NULL",
        (table,))}


def _as_format_4(root: Path) -> None:
    """Give the journal the shape format 4 wrote: no sid column, the (run_id, step_id,
    status) text index, and key records keyed by their cache key."""
    with _journal(root) as con:
        con.execute("BEGIN IMMEDIATE")
        con.execute("DROP INDEX steps_by_sid")
        con.execute("DROP INDEX steps_unhashed")
        con.execute("ALTER TABLE steps DROP COLUMN sid")
        con.execute("CREATE INDEX steps_by_id ON steps (run_id, step_id, status)")
        con.execute("""CREATE TABLE keys_4 (
            cache_key TEXT PRIMARY KEY, task TEXT NOT NULL, code TEXT NOT NULL,
            inputs TEXT NOT NULL, parts TEXT NOT NULL, created REAL NOT NULL)""")
        con.execute("INSERT INTO keys_4 SELECT cache_key, task, code, inputs, parts, created "
                    "FROM keys")
        con.execute("DROP TABLE keys")
        con.execute("ALTER TABLE keys_4 RENAME TO keys")
        con.execute("CREATE INDEX keys_by_task ON keys (task, created)")
        con.execute("PRAGMA user_version=4")
        con.execute("COMMIT")


def _key_rows(con: sqlite3.Connection) -> set[tuple[Any, ...]]:
    return set(con.execute("SELECT cache_key, task, code, inputs, parts, created FROM keys"))


def test_a_new_journal_has_the_format_5_indexes(store: durably.DiskStore) -> None:
    assert pipeline(3) == sum(i + 1 - i for i in range(3))
    with _journal(store.path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT
        assert _indexes(con, "steps") == {"steps_by_sid", "steps_unhashed", "steps_by_order"}
        assert _indexes(con, "keys") == {"keys_by_kid", "keys_by_task"}
        assert con.execute("SELECT count(*) FROM steps WHERE sid IS NULL").fetchone()[0] == 0
        rows = con.execute("SELECT run_id, step_id, sid FROM steps").fetchall()
        assert len(rows) == 6
        assert all(sid == step_sid(run_id, step) for run_id, step, sid in rows)
        keys = con.execute("SELECT kid, cache_key FROM keys").fetchall()
        assert len(keys) == 3  # one per inc call; note is cache=False
        assert all(kid == row_hash(key) for kid, key in keys)


def test_the_step_lookup_uses_the_sid_index(store: durably.DiskStore) -> None:
    """Not the run's order index (a scan of the run's steps per lookup: quadratic resume)."""
    pipeline(50)
    pipeline.run(40)
    with _journal(store.path) as con:
        plan = " ".join(str(row) for row in con.execute(
            "EXPLAIN QUERY PLAN SELECT result, attempt, position FROM steps WHERE sid=? AND "
            "run_id=? AND step_id=? AND status IN ('ran', 'cached') ORDER BY rowid LIMIT 1",
            (1, "r", "s")))
    assert "USING INDEX steps_by_sid (sid=?)" in plan, plan


def test_a_format_4_journal_is_upgraded_and_its_run_resumes(store: durably.DiskStore) -> None:
    """Every step row gets its sid and every key record its kid; the failed run replays its
    finished steps (its cache=False steps do not run again) and the cache stats and key
    records read as before."""
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        pipeline.run(4, run_id="old")
    assert NOTES == [0, 1, 2, 3]
    stats = _maintenance.cache_stats(store)
    with _journal(store.path) as con:
        keys = _key_rows(con)
    store.close()
    _as_format_4(store.path)

    reopened = durably.DiskStore(store.path)
    durably.configure(store=reopened)
    assert _maintenance.cache_stats(reopened) == stats
    FAIL["on"] = False
    run = pipeline.run(4, run_id="old")
    assert run.result == sum(i + 1 - i for i in range(4))
    assert run.counts()["replayed"] == 8
    assert NOTES == [0, 1, 2, 3]  # not executed again
    with _journal(store.path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT
        assert "steps_by_id" not in _indexes(con, "steps")
        assert all(sid == step_sid(r, s) for r, s, sid in
                   con.execute("SELECT run_id, step_id, sid FROM steps"))
        assert _key_rows(con) == keys
        assert all(kid == row_hash(k) for kid, k in con.execute("SELECT kid, cache_key FROM keys"))
    assert inc.explain(2).hit  # its cache entry and key records are found as before
    miss = inc.explain(9)
    assert not miss.hit and miss.nearest is not None
    assert miss.nearest.cache_key in {row[0] for row in keys}


def test_steps_sharing_a_sid_are_told_apart_by_their_ids(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index only narrows the search: two steps whose sids collide (forced here) are
    matched on their run and step ids, each run getting its own result."""
    monkeypatch.setattr(steps_module, "step_sid", lambda run_id, step_id: 7)
    a = StepRecord("run-a", "01" * 16, None, "t", "ran", 1, 0, 1.0, 2.0, None, "")
    b = StepRecord("run-b", "01" * 16, None, "t", "ran", 1, 0, 1.0, 2.0, None, "")
    c = StepRecord("run-a", "02" * 16, None, "t", "ran", 1, 1, 1.0, 2.0, None, "")
    store.append_steps([(a, b"a"), (b, b"b"), (c, b"c")])
    with _journal(store.path) as con:
        assert {sid for (sid,) in con.execute("SELECT sid FROM steps")} == {7}
    for run_id, step_id, want in (("run-b", "01" * 16, b"b"), ("run-a", "02" * 16, b"c"),
                                  ("run-a", "01" * 16, b"a")):
        store.close()  # no read-ahead window: each lookup goes to the index
        assert store.find_step(run_id, step_id) == want
    store.close()
    assert store.find_step("run-c", "01" * 16) is None


def test_a_key_put_again_keeps_one_record(store: durably.DiskStore) -> None:
    record = KeyRecord("m:t", "k" * 32, "code", {"x": "d1"}, {}, 1.0)
    later = KeyRecord("m:t", "k" * 32, "code", {"x": "d1"}, {}, 2.0)
    store.cache_put_many([("k" * 32, b"v", record)])
    store.cache_put_many([("k" * 32, b"v", later)])
    assert store.list_keys("m:t") == [later]


@given(st.text(max_size=60), st.text(max_size=60))
def test_row_hash_is_a_sqlite_integer_and_step_sid_hashes_run_slash_step(
        run_id: str, step_id: str) -> None:
    assert 0 <= row_hash(run_id) < 2**63
    assert step_sid(run_id, step_id) == row_hash(f"{run_id}/{step_id}")
    assert row_hash_sql(run_id.encode()) == row_hash_sql(run_id) == row_hash(run_id)


def test_steps_an_older_process_writes_after_the_upgrade_are_found(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process of the previous durably that opened the journal before another upgraded
    it goes on writing rows without sid and key records without kid (its statements, here
    verbatim). Their steps are still found, so a resume never runs a finished cache=False
    step again; their key records are kept and read."""
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        pipeline.run(3, run_id="mixed")
    with _journal(store.path) as con:  # what the old process would have written instead
        con.execute("UPDATE steps SET sid = NULL")
        con.execute("INSERT OR REPLACE INTO keys (cache_key, task, code, inputs, parts, "
                    "created) VALUES ('00' || hex(randomblob(15)), 'old:task', 'c', '{}', "
                    "'{}', 1.0)")
        assert con.execute("SELECT count(*) FROM steps WHERE sid IS NULL").fetchone()[0] == 6
    store.close()
    FAIL["on"] = False
    run = pipeline.run(3, run_id="mixed")
    assert run.counts()["replayed"] == 6
    assert NOTES == [0, 1, 2]  # the cache=False steps were not executed again
    assert [k.task for k in store.list_keys("old:task")] == ["old:task"]
    # and a step written with a sid and again without one (a repeat) reads as the first one
    a = StepRecord("r", "01" * 16, None, "t", "ran", 1, 0, 1.0, 2.0, None, "")
    store.append_steps([(a, b"with")])
    monkeypatch.setattr(steps_module, "step_sid", lambda run_id, step_id: None)
    store.append_steps([(a, b"without")])
    monkeypatch.undo()
    store.close()
    assert store.find_step("r", "01" * 16) == b"with"


def test_garbage_rows_of_a_format_4_journal_do_not_stop_its_upgrade(
        store: durably.DiskStore) -> None:
    """Text that is not UTF-8 (in another run's step, and a key) and a NULL cache key (which
    the old primary key allowed) are copied as they are (their hash is NULL); the store
    opens and its sound runs resume."""
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        pipeline.run(2, run_id="sound")
    store.close()
    _as_format_4(store.path)
    with _journal(store.path) as con:
        con.execute("INSERT INTO steps (run_id, step_id, task, status, attempt, position, "
                    "started, ended, cache_key) SELECT 'other', CAST(x'ff' AS TEXT), 't', "
                    "'ran', 1, 99, 0, 0, ''")
        con.execute("INSERT INTO keys VALUES (CAST(x'fe' AS TEXT), 't', 'c', '{}', '{}', 1)")
        con.execute("INSERT INTO keys VALUES (NULL, 't', 'c', '{}', '{}', 1)")
    reopened = durably.DiskStore(store.path)
    durably.configure(store=reopened)
    FAIL["on"] = False
    assert pipeline.run(2, run_id="sound").counts()["replayed"] == 4
    assert NOTES == [0, 1]
    with _journal(store.path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT
        assert con.execute("SELECT count(*) FROM keys WHERE task='t'").fetchone()[0] == 2
        assert con.execute("SELECT count(*) FROM keys WHERE kid IS NULL").fetchone()[0] == 1
