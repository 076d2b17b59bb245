"""Replayed steps recorded as ranges (journal format 7): a resumed attempt that replays its
steps in journal order records them as one range of records, not one record each, and the
records read back are those a record per step said: ids, parent, task, cache key, position.
Steps replayed out of order, on other threads, or with results read alone are recorded
exactly too; repair_run writes ranges step by step before it sets a record aside."""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durably
from durably._store.disk import rows as _rows_module
from durably._store.disk import steps as _steps
from durably._store.disk.rows import compact_replay, pack_ranges, pack_replays, unpack_ranges
from durably._store.disk.store import JOURNAL_FORMAT
from durably._store.integrity import open_seal, seal
from durably._store.records import ReplayRange

ORDER: dict[str, Any] = {"calls": [], "fail": False, "n": 0}


@durably.task
def inc(x: int) -> int:
    return x + 1


@durably.task(cache=False)
def note(x: int) -> int:
    return x * 2


@durably.task
def pair(x: int) -> int:
    return inc(x) + note(x)  # nested steps: a parent each


@durably.entrypoint
def calls(n: int, tag: str) -> int:
    """Calls ``ORDER["calls"]`` (indices below n) in that order; fails after them while
    ``ORDER["fail"]`` is set."""
    total = 0
    for i in ORDER["calls"]:
        total += (inc, note, pair)[i % 3](i)
    if ORDER["fail"]:
        raise RuntimeError("stopped after the steps, to be resumed")
    return total


@pytest.fixture
def store(disk_store: durably.DiskStore) -> durably.DiskStore:
    return disk_store  # (journal rows are looked at: a DiskStore only)


@pytest.fixture
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read-ahead windows of 4 records, so that a few steps cross several of them."""
    monkeypatch.setattr(_steps, "_AHEAD_ROWS", 4)


def _first_and_resumed(first: list[int], then: list[int], tag: str) -> durably.Run[int]:
    ORDER["calls"], ORDER["fail"] = first, True
    with pytest.raises(RuntimeError):
        calls(len(first), tag)
    ORDER["calls"], ORDER["fail"] = then, False
    return calls.run(len(first), tag)


def _records(store: durably.DiskStore, run_id: str, attempt: int) -> list[tuple[Any, ...]]:
    return [(s.position, s.step_id, s.parent_id, s.task, s.cache_key, s.status)
            for s in store.list_steps(run_id, attempt=attempt)]


def _calls(records: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The finished records of the entrypoint's own calls (a parent's "started" marker and
    its nested steps left out)."""
    return [r for r in records if r[2] is None and r[5] in ("ran", "cached")]


def _blobs(store: durably.DiskStore, run_id: str) -> list[bytes]:
    rows = store._db().execute("SELECT steps FROM replays WHERE run_id=? ORDER BY rowid",
                               (run_id,)).fetchall()
    return [bytes(open_seal(data)[0] or b"") for (data,) in rows]


def test_a_resume_in_journal_order_is_one_range(store: durably.DiskStore) -> None:
    """1,100 steps (three read-ahead windows) replayed in order: one range, and the same
    records, position by position, as the attempt that executed them."""
    steps = [i for i in range(1650) if i % 3 != 2]  # (flat: `pair` nests steps)
    run = _first_and_resumed(steps, steps, "in-order")
    # (a replayed call of `pair` does not run its nested steps: the calls' own records)
    executed = [(position, *rec[1:5], "replayed")
                for position, rec in enumerate(_calls(_records(store, run.id, 1)))]
    assert run.counts()["replayed"] == len(executed) == 1100
    assert _records(store, run.id, 2) == executed
    (blob,) = _blobs(store, run.id)
    ranges = unpack_ranges(blob)
    assert ranges is not None and len(ranges) == 1 and ranges[0][1] == len(executed)
    # its steps spread over the time the range took, in order
    times = [(s.started, s.ended) for s in store.list_steps(run.id, attempt=2)]
    assert all(a <= b <= c for (a, b), (c, _) in itertools.pairwise(times))


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 14), min_size=1, max_size=15, unique=True),
       st.randoms(use_true_random=False))
def test_any_replay_order_is_recorded_exactly(tmp_path_factory: pytest.TempPathFactory,
                                              first: list[int], rnd: Any) -> None:
    """Whatever order and subset of its steps a resumed attempt calls (windows of 4
    records: ranges cross them, start and stop anywhere), each replayed step's record names
    the record it replayed, at the position it was called."""
    s = durably.DiskStore(tmp_path_factory.mktemp("order") / "store")
    durably.configure(store=s)
    saved = _steps._AHEAD_ROWS
    _steps._AHEAD_ROWS = 4
    try:
        then = [i for i in first if rnd.random() < 0.8]
        if rnd.random() < 0.5:
            rnd.shuffle(then)
        if rnd.random() < 0.5 and then:  # a stretch in order, then the rest
            cut = rnd.randrange(len(then))
            then = sorted(then[:cut]) + then[cut:]
        run = _first_and_resumed(first, then, "any")
        # the record of each call of `first` (a replayed call's nested steps do not run)
        executed = dict(zip(first, _calls(_records(s, run.id, 1)), strict=True))
        expected = [(position, *executed[i][1:5], "replayed")
                    for position, i in enumerate(then)]
        assert _records(s, run.id, 2) == expected
    finally:
        _steps._AHEAD_ROWS = saved
        durably.configure()
        s.close()


def test_steps_replayed_on_threads_keep_records_of_their_own(
        store: durably.DiskStore, small_windows: None) -> None:
    """Items of a thread map replay on other threads: each gets its own record; the run's
    own thread records ranges; the counts add up."""

    @durably.entrypoint
    def fan(n: int) -> int:
        head = sum(inc(i) for i in range(n))
        return head + sum(inc.map(range(100, 100 + n), executor="thread"))

    first = fan.run(9)
    again = fan.run(9)
    assert again.result == first.result
    assert again.counts()["replayed"] == first.counts()["ran"] == 18
    replayed = sorted((s.step_id, s.position) for s in store.list_steps(again.id, attempt=2))
    executed = sorted((s.step_id, s.position) for s in store.list_steps(again.id, attempt=1))
    assert [s for s, _ in replayed] == [s for s, _ in executed]


def _rebuild(i: int) -> Rebuilt:
    if os.environ.get("DURABLY_TEST_UNLOADABLE"):
        raise ValueError("this result cannot be loaded any more")
    return Rebuilt(i)


class Rebuilt:
    """A result that cannot be loaded while $DURABLY_TEST_UNLOADABLE is set."""

    def __init__(self, i: int) -> None:
        self.i = i

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _rebuild, (self.i,)


@durably.task
def make(i: int) -> Any:
    return Rebuilt(i) if i == 2 else i


@durably.entrypoint
def job(n: int) -> int:
    return sum(1 for i in range(n) if make(i) is not None)


def test_a_result_that_no_longer_loads_is_not_recorded_as_replayed(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose journaled result cannot be loaded (a cacheable task) is computed
    again, with a warning; it is not recorded as replayed, and the steps before it are."""
    first = job.run(4)
    assert first.result == 4
    monkeypatch.setenv("DURABLY_TEST_UNLOADABLE", "1")
    with pytest.warns(UserWarning, match="cannot be loaded"):
        assert job(4) == 4
    statuses = [(s.position, s.status) for s in store.list_steps(first.id, attempt=2)]
    assert statuses[:2] == [(0, "replayed"), (1, "replayed")]
    assert statuses[2][1] != "replayed"


def test_repair_writes_ranges_step_by_step_before_it_sets_a_record_aside(
        store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """A damaged step record is set aside: the ranges that name records by their order are
    first written as a record per step, so the replayed attempt still lists every step."""
    steps = list(range(12))
    run = _first_and_resumed(steps, steps, "repair")
    before = _records(store, run.id, 2)
    victim = store.list_steps(run.id, attempt=1)[_records(store, run.id, 1).index(
        _calls(_records(store, run.id, 1))[5])]
    store._db().execute("UPDATE steps SET result=X'00' WHERE run_id=? AND step_id=?",
                        (run.id, victim.step_id))
    done = store.repair_run(run.id)
    assert any(victim.step_id in line for line in done)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert _records(store, run.id, 2) == before
    assert "damaged" not in caplog.text
    assert all(unpack_ranges(blob) is None for blob in _blobs(store, run.id))
    again = calls.run(12, "repair")  # the step set aside is executed again (or cached)
    counts = again.counts()
    assert counts["ran"] + counts["cached"] == 1 and counts["replayed"] == len(before) - 1


def _journal_late(store: durably.DiskStore, run_id: str, ended: float) -> None:
    """Journal a record of attempt 1 among the ones a range of attempt 2 names (positions
    spread first to make room), as a step of attempt 1 whose thread finished late would."""
    db = store._db()
    db.execute("UPDATE steps SET position=position*10 WHERE run_id=?", (run_id,))
    cols = [c[1] for c in db.execute("PRAGMA table_info(steps)")]
    row = dict(zip(cols, db.execute("SELECT * FROM steps WHERE run_id=? AND position=10",
                                    (run_id,)).fetchone(), strict=True))
    row.update(step_id="f" * 32, position=15, sid=None, ended=ended)  # between 10 and 20
    db.execute(f"INSERT INTO steps ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
               [row[c] for c in cols])


@pytest.mark.parametrize("when", ["after the range", "during the range"])
def test_a_record_journaled_late_among_a_range_is_told_apart(
        store: durably.DiskStore, caplog: pytest.LogCaptureFixture, when: str) -> None:
    """A step of an earlier attempt whose thread finished while (or after) the resume
    replayed the records around it: the range's records are still read right (the late
    record was journaled after they were read: its rowid is past the range's horizon)."""
    steps = list(range(6))
    run = _first_and_resumed(steps, steps, "late")
    replayed = store.list_steps(run.id, attempt=2)
    before = [(s.step_id, s.parent_id, s.task) for s in replayed]
    _journal_late(store, run.id, time.time() + 1 if when == "after the range"
                  else replayed[2].started)
    with caplog.at_level(logging.WARNING, logger="durably"):
        after = [(s.step_id, s.parent_id, s.task) for s in store.list_steps(run.id, attempt=2)]
    assert after == before and len(after) == 6
    assert "cannot be matched" not in caplog.text


def test_a_garbage_record_among_a_range_does_not_break_listing_or_repair(
        store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """A record whose position is not a number (garbage) among a range's: the run's records
    are listed (the range left out with a warning: its records are no longer in the order
    it names), and repair_run sets the garbage row and the range aside."""
    steps = list(range(6))
    run = _first_and_resumed(steps, steps, "garbage")
    store._db().execute("UPDATE steps SET position='zz', ended='x' WHERE run_id=? AND "
                        "attempt=1 AND position=2", (run.id,))
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert store.list_steps(run.id, attempt=2) == []
    assert "cannot be matched" in caplog.text
    done = store.repair_run(run.id)
    assert any("column 6 holds 'zz'" in line for line in done)
    assert calls.run(6, "garbage").counts()["replayed"] == 5  # the one set aside: again


def test_a_range_that_no_longer_matches_is_left_out_and_repair_sets_it_aside(
        store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """A record of a range's gone from the journal (deleted by hand) makes the range
    unreadable: it is left out with a warning, never misread, and repair_run sets it
    aside (the warning does not come back)."""
    steps = list(range(6))
    run = _first_and_resumed(steps, steps, "shifted")
    store._db().execute("DELETE FROM steps WHERE run_id=? AND attempt=1 AND position=2",
                        (run.id,))
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert store.list_steps(run.id, attempt=2) == []
    assert "cannot be matched to the journal's records" in caplog.text
    done = store.repair_run(run.id)
    assert any("a range of steps replayed in attempt 2" in line for line in done)
    caplog.clear()
    fresh = durably.DiskStore(store.path)
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert fresh.list_steps(run.id, attempt=2) == []
    assert caplog.text == ""
    fresh.close()


VERSION = {"v": 1}


@durably.task(cache=False)
def send(x: int) -> int:
    return x * 2


@durably.task
def caller(x: int) -> int:
    y = send(x) + VERSION["v"]  # (reads a configuration value: editing it edits the caller)
    if ORDER["fail"]:
        raise RuntimeError("stopped, to be resumed")
    return y


@durably.entrypoint
def sends(n: int) -> list[int]:
    return [caller(i) for i in range(n)]


def test_a_nested_side_effect_replayed_under_an_edited_caller_keeps_its_caller(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A side effect nested in a step is found by its callers' tasks and inputs whatever
    its caller's step id: replayed under a caller whose code changed, its record names
    the caller that called it in this attempt (not the one of the record it replayed)."""
    ORDER["fail"] = True
    with pytest.raises(RuntimeError):
        sends(3)
    ORDER["fail"] = False
    monkeypatch.setitem(VERSION, "v", 2)
    run = sends.run(3)
    records = store.list_steps(run.id, attempt=2)
    replayed = [s for s in records if s.status == "replayed"]
    assert [s.task for s in replayed] == ["send"]
    ids = {s.step_id for s in records if s.task == "caller"}
    assert replayed[0].parent_id in ids


@given(st.lists(st.tuples(st.integers(0, 2**40), st.integers(1, 2**31),
                          st.integers(0, 2**31), st.integers(-1, 2**40), st.booleans(),
                          st.integers(0, 2**20), st.floats(allow_nan=False),
                          st.floats(allow_nan=False)), max_size=20))
def test_ranges_round_trip(values: list[tuple[Any, ...]]) -> None:
    ranges = [ReplayRange(p, n, (a, q, flag), skip, f"{p:032x}", f"{n:032x}", t0, t1, skip)
              for p, n, a, q, flag, skip, t0, t1 in values]
    back = unpack_ranges(pack_ranges(ranges))
    assert back is not None
    assert [(r.position, r.steps, r.anchor, r.skip, r.started, r.ended, r.horizon)
            for r in ranges] == [(b[0], b[1], b[2], b[3], b[6], b[7], b[8]) for b in back]


def test_a_damaged_range_record_is_refused() -> None:
    blob = pack_ranges([ReplayRange(1, 2, (1, 0, False), 0, "a" * 32, "b" * 32, 1.0, 2.0, 9)])
    with pytest.raises(ValueError, match="wrong length"):
        unpack_ranges(blob[:-1])
    for impossible in (ReplayRange(1, 2**62, (1, 0, False), 0, "a", "b", 1.0, 2.0, 9),
                       ReplayRange(1, 2, (1, 0, False), 2**62, "a", "b", 1.0, 2.0, 9),
                       ReplayRange(-1, 2, (1, 0, False), 0, "a", "b", 1.0, 2.0, 9),
                       ReplayRange(1, 0, (1, 0, False), 0, "a", "b", 1.0, 2.0, 9)):
        with pytest.raises(ValueError, match="impossible range"):
            unpack_ranges(pack_ranges([impossible]))
    assert unpack_ranges(b"durably-replays-1\n") is None  # a record per step: not ranges


def test_an_older_journal_is_upgraded_to_format_7_and_its_records_still_read(
        store: durably.DiskStore) -> None:
    """A format 6 journal (a record per replayed step) is upgraded in place; its replay
    records read as before, and the next resume records a range."""
    steps = [0, 1, 3, 4]
    run = _first_and_resumed(steps, steps, "old")
    expected = _records(store, run.id, 2)
    each = [compact_replay(r) for r in store.list_steps(run.id, attempt=2)]
    assert None not in each
    path = store.path / "journal.sqlite3"
    store.close()
    with sqlite3.connect(path) as con:  # as format 6 wrote it
        con.execute("UPDATE replays SET steps=?", (seal(pack_replays(each)),))  # type: ignore[arg-type]
        con.execute("PRAGMA user_version=6")
    reopened = durably.DiskStore(store.path)
    durably.configure(store=reopened)
    try:
        assert _records(reopened, run.id, 2) == expected
        with sqlite3.connect(path) as con:
            assert con.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT >= 7
        assert calls.run(4, "old").counts()["replayed"] == 4
        assert _records(reopened, run.id, 3) == expected
        assert [unpack_ranges(b) is None for b in _blobs(reopened, run.id)] == [True, False]
    finally:
        durably.configure()
        reopened.close()


# -- a page of an attempt's steps, read from its ranges alone ---------------------------------
def _every_page_is_the_whole_reads(store: durably.DiskStore, run_id: str, attempt: int
                                   ) -> list[durably.store.StepRecord]:
    """Every page (each ``after`` from before the first position to past the last, several
    sizes: pages that start and end inside a range, and across ranges) is the one cut from
    the whole read; the counts are the whole read's. The whole read, returned."""
    whole = store.list_steps(run_id, attempt=attempt)
    last = max((s.position for s in whole), default=0)
    for limit in (1, 2, 3, 5, 8, len(whole) + 1):
        for after in range(-1, last + 2):
            expected = [s for s in whole if s.position > after][:limit]
            assert store.page_steps(run_id, attempt, after=after, limit=limit) == expected, (
                after, limit)
    assert store.count_steps(run_id, attempt) == durably.store.Journal.count_steps(
        store, run_id, attempt)
    return whole


def _wholly_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ranges read whole from here on (the slow ways), counted: one number each."""
    read: list[int] = []
    whole = _rows_module.replayed_in_ranges

    def counted(db: Any, run_id: str, ranged: Any, warn: Any) -> Any:
        read.append(sum(len(ranges) for _, ranges in ranged))
        return whole(db, run_id, ranged, warn)

    monkeypatch.setattr(_rows_module, "replayed_in_ranges", counted)
    return read


def test_a_page_of_a_resumed_attempt_reads_its_ranges_for_the_page_only(
        store: durably.DiskStore, small_windows: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt that replayed its steps in several ranges (a stretch in order, some out of
    order, some left out, new steps executed among them): every page and the counts are
    those of the whole read, and no range is read whole to serve them."""
    first = list(range(30))
    then = [*range(0, 12), 20, 21, 22, 5, 30, 31, *range(23, 30), 12, 13]
    run = _first_and_resumed(first, then, "pages")
    ranges = [r for b in _blobs(store, run.id) for r in (unpack_ranges(b) or [])]
    assert len(ranges) >= 3  # (the shape the test is about: several ranges)
    read = _wholly_read(monkeypatch)
    whole = _every_page_is_the_whole_reads(store, run.id, 2)
    assert read == []
    statuses = {s.status for s in whole}
    assert {"replayed", "ran"} <= statuses and len(whole) >= len(then)


def test_pages_of_an_attempt_that_replayed_records_of_several_attempts(
        store: durably.DiskStore, small_windows: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A third attempt replays steps the first attempt executed and steps the second one
    executed (ranges anchored in each): pages and counts are the whole read's."""
    ORDER["calls"], ORDER["fail"] = list(range(8)), True
    with pytest.raises(RuntimeError):
        calls(20, "three")
    ORDER["calls"] = list(range(16))
    with pytest.raises(RuntimeError):
        calls(20, "three")
    ORDER["calls"], ORDER["fail"] = [*range(10, 16), *range(0, 10), 16, 17], False
    run = calls.run(20, "three")
    assert run.attempt == 3
    anchors = {r[2][0] for b in _blobs(store, run.id) for r in (unpack_ranges(b) or [])}
    assert anchors >= {1, 2}
    read = _wholly_read(monkeypatch)
    whole = _every_page_is_the_whole_reads(store, run.id, 3)
    assert read == [] and sum(s.status == "replayed" for s in whole) == 16
    _every_page_is_the_whole_reads(store, run.id, 2)


def test_steps_replayed_on_threads_page_as_the_whole_read(
        store: durably.DiskStore, small_windows: None) -> None:
    """Records kept a step each (items replayed on other threads) beside ranges: pages and
    counts are the whole read's."""

    @durably.entrypoint
    def fan(n: int) -> int:
        head = sum(inc(i) for i in range(n))
        return head + sum(inc.map(range(100, 100 + n), executor="thread"))

    first = fan.run(9)
    again = fan.run(9)
    assert again.id == first.id and again.attempt == 2
    assert sum(s.status == "replayed" for s in _every_page_is_the_whole_reads(
        store, again.id, 2)) == 18


def test_records_kept_a_step_each_beside_ranges_page_as_the_whole_read(
        store: durably.DiskStore) -> None:
    """An attempt with ranges and records kept a step each (as repair_run and replays on
    other threads write them), their positions interleaved: pages and counts are the
    whole read's."""
    run = _first_and_resumed(list(range(8)), [0, 1, 2, 3, 6, 7], "mixed")
    # (calls 4 and 5, not replayed by the resume: kept a step each at positions 20 and 4)
    left = _calls(_records(store, run.id, 1))[4:6]
    assert store.append_replays(run.id, 2, [
        (position, 1.0, 2.0, step_id, parent, key, task)
        for position, (_, step_id, parent, task, key, _) in zip((20, 4), left, strict=True)])
    assert {unpack_ranges(b) is None for b in _blobs(store, run.id)} == {True, False}
    whole = _every_page_is_the_whole_reads(store, run.id, 2)
    assert [(s.position, s.status) for s in whole][4:] == [(4, "replayed"), (4, "replayed"),
                                                           (5, "replayed"), (20, "replayed")]


@pytest.mark.parametrize("when", ["after the range", "during the range"])
def test_a_page_among_a_late_record_is_the_whole_reads(
        store: durably.DiskStore, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """A record journaled late among a range's records: the page falls back to the slow
    ways for that range (it is read whole) and still gives the whole read's records."""
    steps = list(range(6))
    run = _first_and_resumed(steps, steps, "late-page")
    replayed = store.list_steps(run.id, attempt=2)
    _journal_late(store, run.id, time.time() + 1 if when == "after the range"
                  else replayed[2].started)
    read = _wholly_read(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="durably"):
        whole = _every_page_is_the_whole_reads(store, run.id, 2)
    assert len(whole) == 6 and read  # (the range that needed it, read whole)
    assert "cannot be matched" not in caplog.text


@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_a_page_of_a_damaged_range_leaves_it_out_with_the_warning(
        store: durably.DiskStore, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    """A range whose records are no longer where it says (one deleted by hand, or made
    garbage) is left out of pages and counts, as the whole read leaves it out, with the
    same warning; the attempt's other records are still paged."""
    steps = list(range(6))
    run = _first_and_resumed(steps, [*steps, 7, 8], "damaged-page")
    sql = ("DELETE FROM steps" if damage == "deleted"
           else "UPDATE steps SET position='zz', ended='x'")
    store._db().execute(f"{sql} WHERE run_id=? AND attempt=1 AND position=2", (run.id,))
    with caplog.at_level(logging.WARNING, logger="durably"):
        fresh = durably.DiskStore(store.path)  # (a store that has not warned yet)
        try:
            counted = fresh.count_steps(run.id, 2)  # (first: the warning is the count's)
            assert "cannot be matched to the journal's records" in caplog.text
            whole = _every_page_is_the_whole_reads(fresh, run.id, 2)
        finally:
            fresh.close()
    # the damaged range's steps are left out (and those of any range after the record
    # gone: they name records by their order); calls 7 and 8 (executed) are listed
    replayed = sum(s.status == "replayed" for s in whole)
    assert replayed < 6 and {s.task for s in whole if s.status == "ran"} == {
        "inc", "note", "pair"}
    assert sum(c.get("replayed", 0) for c in counted.values()) == replayed
