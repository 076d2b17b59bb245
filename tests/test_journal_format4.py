"""Journal format 4: replayed steps recorded many to a row, and a run's start and end each
written in one transaction (DiskStore.batch)."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import durably
from durably._keys import serde as _serde
from durably._store.disk.rows import compact_replay, pack_replays, unpack_replays
from durably._store.disk.store import JOURNAL_FORMAT
from durably._store.records import StepRecord
from durably.exceptions import StoreError

_hex32 = st.binary(min_size=16, max_size=16).map(bytes.hex)
_replay = st.tuples(
    st.integers(0, 2**63 - 1),
    st.floats(allow_nan=False),
    st.floats(allow_nan=False),
    _hex32,
    st.none() | _hex32,
    st.just("") | _hex32,
    st.text(max_size=40),
)


@given(st.lists(_replay, max_size=30))
def test_replays_round_trip_through_their_row(replays: list[Any]) -> None:
    assert unpack_replays(pack_replays(replays)) == replays


@given(st.lists(_replay, min_size=1, max_size=5), st.data())
def test_a_damaged_row_of_replays_is_refused_never_misread(replays: list[Any],
                                                          data: st.DataObject) -> None:
    blob = pack_replays(replays)
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(ValueError):
        unpack_replays(blob[:cut])


def test_only_records_without_more_to_keep_are_made_compact() -> None:
    base = StepRecord("r", "ab" * 16, None, "inc", "replayed", 2, 5, 1.0, 1.5, None, "cd" * 16)
    assert compact_replay(base) == (5, 1.0, 1.5, "ab" * 16, None, "cd" * 16, "inc")
    for other in ({"status": "ran"}, {"inputs": "(1)"}, {"output": "2"}, {"error": "E"},
                  {"result_digest": "ee" * 16}, {"input_digests": ("x",)},
                  {"step_id": "not-hex"}, {"parent_id": "graph-node"}, {"cache_key": "k"}):
        assert compact_replay(StepRecord(**{**_fields(base), **other})) is None


def _fields(record: StepRecord) -> dict[str, Any]:
    return {name: getattr(record, name) for name in StepRecord.__dataclass_fields__}


def test_disk_store_returns_every_record_as_it_was_given(tmp_path: Path) -> None:
    """Compact replays, replays with more to keep and ordinary rows come back equal, in call
    order, for the whole run and for one attempt."""
    store = durably.DiskStore(tmp_path / "s")
    ran = StepRecord("r", "01" * 16, None, "inc", "ran", 1, 0, 1.0, 2.0, None, "aa" * 16,
                     "(1,)", "2", "bb" * 16, ("cc" * 16,))
    compact = StepRecord("r", "01" * 16, None, "inc", "replayed", 2, 1, 3.0, 3.0, None,
                         "aa" * 16)
    listened = StepRecord("r", "02" * 16, "01" * 16, "dec", "replayed", 2, 0, 2.5, 2.6, None,
                          "", "(2,)")
    graph = StepRecord("r", "node:a", None, "a", "replayed", 2, 2, 4.0, 4.0)
    executed = StepRecord("r", "03" * 16, None, "inc", "ran", 2, 3, 5.0, 6.0, None, "dd" * 16)
    store.append_steps([(ran, b"x")])
    store.append_steps([(compact, None), (listened, None), (graph, None), (executed, b"y")])
    assert store.list_steps("r") == [ran, listened, compact, graph, executed]
    assert store.list_steps("r", attempt=2) == [listened, compact, graph, executed]
    with _journal(tmp_path / "s") as con:
        assert con.execute("SELECT count(*) FROM replays").fetchone()[0] == 1
        assert con.execute("SELECT count(*) FROM steps WHERE status='replayed'"
                           ).fetchone()[0] == 2  # the two that have more than a replay keeps


@contextlib.contextmanager
def _journal(root: Path) -> Iterator[sqlite3.Connection]:
    con = sqlite3.connect(root / "journal.sqlite3", isolation_level=None, timeout=1)
    try:
        yield con
    finally:
        con.close()


def _assert_write_lock_free(con: sqlite3.Connection) -> None:
    """Another connection can take the database's write lock (nothing holds it)."""
    con.execute("BEGIN IMMEDIATE")
    con.execute("ROLLBACK")


def _interrupt_first_call(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> None:
    """The first call of ``module.name`` raises KeyboardInterrupt (a Ctrl-C landing there);
    later calls run it."""
    real = getattr(module, name)
    calls = []

    def interrupted(*args: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(module, name, interrupted)


FAIL = {"on": False}


@durably.task
def inc(x: int) -> int:
    return x + 1


@durably.entrypoint
def chain(n: int) -> int:
    total = sum(inc(i) for i in range(n))
    if FAIL["on"]:
        raise RuntimeError("stop after the steps")
    return total


@pytest.fixture
def store(tmp_path: Path) -> Iterator[durably.DiskStore]:
    disk = durably.DiskStore(tmp_path / "s")
    durably.configure(store=disk)
    FAIL["on"] = False
    yield disk
    FAIL["on"] = False


def _failed_then_resumed(n: int) -> durably.Run[int]:
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        chain.run(n)
    FAIL["on"] = False
    return chain.run(n)


def test_a_resumed_run_journals_its_replays_in_one_row(store: durably.DiskStore) -> None:
    run = _failed_then_resumed(5)
    assert run.counts()["replayed"] == 5
    steps = run.steps
    assert [s.status for s in steps] == ["replayed"] * 5
    assert [s.position for s in steps] == list(range(5))
    first = {s.step_id: s for s in run.records() if s.attempt == 1}
    for s in steps:  # each names the step it replayed, as a record of its own did
        origin = first[s.step_id]
        assert (s.task, s.parent_id, s.cache_key, s.attempt) == (
            origin.task, origin.parent_id, origin.cache_key, 2)
        assert s.started <= s.ended
    with _journal(store.path) as con:
        assert con.execute("SELECT count(*) FROM replays").fetchone()[0] == 1
        assert con.execute("SELECT count(*) FROM steps WHERE status='replayed'"
                           ).fetchone()[0] == 0


def test_a_format_3_journal_is_upgraded_and_keeps_its_replayed_rows(
        store: durably.DiskStore) -> None:
    """A journal written by the previous version: replayed steps as rows, no replays table.
    It is upgraded in place; its blobs (sealed already) are not sealed twice."""
    run = _failed_then_resumed(3)
    replayed = [r for r in run.records() if r.status == "replayed"]
    assert replayed
    store.close()
    with _journal(store.path) as con:  # make it what format 3 wrote
        for r in replayed:
            con.execute(
                "INSERT INTO steps (run_id, step_id, parent_id, task, status, attempt, "
                "position, started, ended, error, cache_key) VALUES "
                "(?, ?, ?, ?, 'replayed', ?, ?, ?, ?, NULL, ?)",
                (r.run_id, r.step_id, r.parent_id, r.task, r.attempt, r.position, r.started,
                 r.ended, r.cache_key))
        con.execute("DROP TABLE replays")
        con.execute("PRAGMA user_version=3")
    before = run.records()
    reopened = durably.DiskStore(store.path)
    durably.configure(store=reopened)
    assert reopened.list_steps(run.id) == before
    with _journal(store.path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == JOURNAL_FORMAT
    # the step results were not sealed again: a new run of the same call still replays them
    again = chain.run(3)
    assert again.result == sum(i + 1 for i in range(3))
    step = before[0]
    assert _serde.loads(reopened.find_step(run.id, step.step_id)) == 1


def _serde_open(blob: bytes) -> bytes:
    from durably._store.integrity import open_seal

    payload, why = open_seal(blob)
    assert payload is not None, why
    return bytes(payload)


def test_a_damaged_row_of_replays_is_left_out_with_a_warning_and_repair_sets_it_aside(
        store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """The row only said which steps an attempt replayed: damaged, it never stops the run
    from being read, resumed or answered."""
    run = _failed_then_resumed(3)
    with _journal(store.path) as con:
        con.execute("UPDATE replays SET steps = substr(steps, 1, 40)")
    with caplog.at_level("WARNING", logger="durably"):
        records = run.records()
        run.records()
    assert [s.status for s in records] == ["ran"] * 3  # what attempt 1 ran is all there is
    warnings = [m for m in (r.getMessage() for r in caplog.records) if "attempt 2" in m]
    assert len(warnings) == 1 and run.id in warnings[0] and "repair_run" in warnings[0]
    FAIL["on"] = True  # the run goes on: a third attempt replays again
    with pytest.raises(RuntimeError):
        chain.run(3)
    FAIL["on"] = False
    assert chain.run(3).counts()["replayed"] == 3
    done = store.repair_run(run.id)
    assert len(done) == 1 and "replayed in attempt 2" in done[0]
    assert [s.status for s in store.list_steps(run.id, attempt=4)] == ["replayed"] * 3


def test_replays_are_listed_in_a_store_opened_with_another_key(
        store: durably.DiskStore, tmp_path: Path) -> None:
    """They are parsed, never unpickled: a checksum, no signature, so a store written
    without a key and opened with one (to look inside it) still lists them."""
    run = _failed_then_resumed(3)
    other = durably.DiskStore(store.path, key="another key of 32 bytes, at least")
    assert [s.status for s in other.list_steps(run.id, attempt=2)] == ["replayed"] * 3


def test_a_transaction_left_open_by_an_interrupted_write_is_rolled_back(
        store: durably.DiskStore) -> None:
    """Ctrl-C between BEGIN and COMMIT leaves the thread's connection in a transaction that
    was never committed; the next write must not join it (its writes would be lost with it,
    and other processes would wait on its lock)."""
    assert chain(1) == 1
    store._db().execute("BEGIN IMMEDIATE")  # what an ill-timed KeyboardInterrupt leaves
    assert chain(2) == 3
    with _journal(store.path) as other:
        statuses = other.execute("SELECT status FROM runs").fetchall()
        assert statuses == [("finished",), ("finished",)]
        _assert_write_lock_free(other)


def test_a_lease_this_process_left_behind_is_taken_over(store: durably.DiskStore) -> None:
    """An attempt interrupted (Ctrl-C) before it released its lease left a lease of this
    process that no attempt holds: the next call continues the run instead of refusing it as
    being executed in this process."""
    from durably._store.lease import hold, let_go, me

    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        chain.run(2)
    FAIL["on"] = False
    (rec,) = store.list_runs()
    assert store.acquire_run(rec.run_id, me()) is None  # a lease nobody holds any more
    run = chain.run(2)
    assert (run.status, run.attempt) == ("finished", 2)
    live = me()  # a lease an attempt of this process does hold is respected
    hold(live)
    try:
        assert store.acquire_run(rec.run_id, live) is None
        with pytest.raises(durably.RunStateError, match="in this process"):
            chain.run(2)
    finally:
        let_go(live)
        store.release_run(rec.run_id, live)


def test_a_streamed_attempt_keeps_the_inputs_of_its_replayed_steps(
        store: durably.DiskStore) -> None:
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        chain.run(2)
    FAIL["on"] = False
    events = list(chain.stream(2))
    shown = [e.inputs for e in events if e.kind == "step_finished"]
    (rec,) = store.list_runs()
    kept = [s.inputs for s in store.list_steps(rec.run_id, attempt=2)]
    assert shown == kept == ["x=0", "x=1"]


def test_a_large_result_is_sealed_outside_the_transaction_that_ends_the_attempt(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other processes' journal writes wait for that transaction: a large result (pickled,
    perhaps written to blobs/) is sealed before it, and written in it as it is, with the
    rest (the final record and the lease's release in one commit); a small one is sealed
    in it."""
    from durably._runtime import attempt as _attempt
    from durably._store.disk.values import Sealed

    seen: list[tuple[str, bool, bool]] = []
    sealed: list[bool] = []
    real_checked, real_seal = store.put_run_if_current, store.seal_ahead

    def put_run_if_current(record: Any, previous: Any = None) -> bool:  # (checked)
        seen.append((record.status, store._db().in_transaction,
                     isinstance(record.result, Sealed)))
        return real_checked(record, previous)

    def seal_ahead(value: bytes, *context: str, reuse: Any = None) -> Any:
        sealed.append(store._db().in_transaction)
        return real_seal(value, *context, reuse=reuse)

    monkeypatch.setattr(store, "put_run_if_current", put_run_if_current)
    monkeypatch.setattr(store, "seal_ahead", seal_ahead)
    assert chain(2) == 3
    assert seen[-1] == ("finished", True, False) and sealed == []
    monkeypatch.setattr(_attempt, "_BATCHED_RESULT", 4)  # every pickled result is larger
    assert chain(3) == 6
    assert seen[-1] == ("finished", True, True) and sealed == [False]
    assert store.find_run(chain.run(3).id).result is not None
    assert _serde.loads(store.find_run(chain.run(3).id).result) == 6


def test_a_run_start_that_fails_leaves_the_run_as_it_was(store: durably.DiskStore,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """The lease, the new attempt's record and its start event commit together: when the
    start event cannot be written, the run is not left 'running' in an attempt that never
    began, and its lease is free."""
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        chain.run(2)
    FAIL["on"] = False
    (failed,) = store.list_runs()
    real = store.append_events

    def full_disk(events: Any) -> None:
        if any(e.kind == "run_started" for e in events):
            raise StoreError("injected: the disk is full")
        real(events)

    monkeypatch.setattr(store, "append_events", full_disk)
    with pytest.raises(StoreError, match="injected"):
        chain.run(2)
    monkeypatch.setattr(store, "append_events", real)
    after = store.find_run(failed.run_id)
    assert after is not None
    assert (after.status, after.attempt) == ("failed", 1)
    run = chain.run(2)  # the lease is free
    assert (run.status, run.attempt, run.counts()["replayed"]) == ("finished", 2, 2)


def test_a_run_end_that_fails_in_its_transaction_is_written_step_by_step(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The end of an attempt (its replays, final status and lease) is one transaction; when it
    fails, each is written on its own: nothing is lost, the lease is released, and the error
    is said in a warning (the call returns: its run is journaled)."""
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        chain.run(4)
    FAIL["on"] = False
    real = store.append_replays
    calls = []

    def fails_once(*args: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise StoreError("injected: the journal is busy")
        return real(*args)

    monkeypatch.setattr(store, "append_replays", fails_once)
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert chain.run(4).result == 10
    assert "journaled on a second try" in caplog.text and "injected" in caplog.text
    (rec,) = store.list_runs()
    assert (rec.status, rec.attempt) == ("finished", 2)
    assert _serde.loads(rec.result) == 10
    assert [s.status for s in store.list_steps(rec.run_id, attempt=2)] == ["replayed"] * 4
    assert chain(4) == 10  # the lease was released: the finished run answers again


def test_batch_rolls_back_every_write_when_the_block_raises(tmp_path: Path) -> None:
    from durably._store.records import EventRecord, RunRecord

    store = durably.DiskStore(tmp_path / "s")
    with pytest.raises(KeyError), store.batch():
        store.put_run(RunRecord("r1", "m:f", "f", "running", 1.0, 1.0, 1, "d"))
        store.append_events([EventRecord("r1", "custom", 1.0, 1)])
        with store.batch():  # nested: part of the outer one
            store.append_steps([(StepRecord("r1", "s", None, "t", "ran", 1, 0, 1.0, 2.0),
                                 b"v")])
        raise KeyError("the block fails")
    assert store.find_run("r1") is None
    assert store.list_events("r1") == [] and store.list_steps("r1") == []


def test_the_write_ahead_logs_are_checkpointed_less_often_than_sqlite_s_default(
        tmp_path: Path) -> None:
    """A checkpoint costs two fsyncs: the journal's and the cache's logs grow to 16,384 pages
    before a writer's commit copies them, not SQLite's 1,000 (a checkpoint every ~170
    executed steps); background checkpoints keep them shorter (test_checkpoint.py)."""
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("ab" * 16, b"v", None)
    assert store._db().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 16384
    assert store.cache._con.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 16384
    store.close()
    again = durably.DiskStore(tmp_path / "s")  # each new connection, an existing store too
    assert again.cache_get("ab" * 16) == b"v"
    assert again._db().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 16384
    assert again.cache._con.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 16384


def test_a_batch_whose_end_never_ran_is_rolled_back_by_the_next_write(
        store: durably.DiskStore) -> None:
    """A KeyboardInterrupt landing as a block's ``__exit__`` is entered leaves its
    transaction open: once the block's frame is gone, the next write rolls it back instead
    of joining it (its writes would never be committed, and other processes would wait on
    its lock)."""
    from durably._store.records import EventRecord, RunRecord

    kept = []  # (as the traceback of the interrupt would keep it)

    def left_without_its_end() -> None:
        batch = store.batch()
        kept.append(batch)
        batch.__enter__()  # ... and its __exit__ never runs
        store.put_run(RunRecord("lost", "m:f", "f", "running", 1.0, 1.0, 1, "d"))

    left_without_its_end()
    assert store._db().in_transaction is False  # rolled back when next used
    assert chain(2) == 3
    store.append_events([EventRecord("r", "custom", 1.0, 1)])
    with _journal(store.path) as other:
        assert other.execute("SELECT run_id FROM runs WHERE run_id='lost'").fetchone() is None
        assert other.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
        assert other.execute("SELECT count(*) FROM events WHERE kind='custom'"
                             ).fetchone()[0] == 1
        _assert_write_lock_free(other)


def test_a_block_still_running_keeps_its_transaction(store: durably.DiskStore) -> None:
    from durably._store.records import EventRecord

    with store.batch():
        store.append_events([EventRecord("r", "custom", 1.0, 1)])
        assert store._db().in_transaction  # _db() did not take it for a leftover
        store.append_events([EventRecord("r", "custom", 2.0, 1)])
    assert len(store.list_events("r")) == 2


def test_an_attempt_interrupted_while_it_settles_ends_and_frees_its_lease(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after the body returned, while the attempt waits for work it submitted: the
    attempt still ends (stopped), so the same process can continue the run at once."""
    from durably._decorators import entrypoints as _entrypoint_module

    _interrupt_first_call(monkeypatch, _entrypoint_module, "_settle_submitted")
    with pytest.raises(KeyboardInterrupt):
        chain.run(2)
    (rec,) = store.list_runs()
    assert rec.status == "stopped"
    assert durably._runtime.context.current_run.get() is None
    run = chain.run(2)
    assert (run.status, run.attempt, run.counts()["replayed"]) == ("finished", 2, 2)


def test_a_cache_transaction_left_open_is_rolled_back(tmp_path: Path) -> None:
    """diskcache can be interrupted between its BEGIN and its block too: the cache's write
    lock must not stay held, nor later cache writes be swallowed."""
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("aa" * 16, b"one", None)
    store.cache._con.execute("BEGIN IMMEDIATE")  # what the interrupted write left
    store.cache_put("bb" * 16, b"two", None)
    other = durably.DiskStore(tmp_path / "s", memo_entries=0)
    assert other.cache_get("bb" * 16) == b"two"  # committed
    other.cache_put("cc" * 16, b"three", None)  # and the lock is free


def test_replays_with_a_forged_header_are_refused() -> None:
    """A row with a sound checksum but a header nested too deeply to parse is damaged (a
    ValueError, so the row is left out), not a RecursionError out of every listing."""
    import struct

    from durably._store.disk.rows import _REPLAYS_MAGIC

    forged = _REPLAYS_MAGIC + struct.pack("<II", 100_000, 0) + b"[" * 100_000
    with pytest.raises(ValueError, match="damaged"):
        unpack_replays(forged)


def test_large_results_of_cached_steps_are_journaled_at_once(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never held in memory for a batch, nor written in the transaction that ends the
    attempt."""
    from durably._runtime import context as _context

    assert chain(3) == 6  # fills the cache
    FAIL["on"] = False
    monkeypatch.setattr(_context, "LARGE_ROW", 0)
    seen: list[tuple[str, bool]] = []
    real = store.append_steps_if_current

    def append_steps_if_current(steps: Any) -> bool:  # (the run's steps, checked)
        seen.extend((rec.status, store._db().in_transaction) for rec, _ in steps)
        return real(steps)

    monkeypatch.setattr(store, "append_steps_if_current", append_steps_if_current)
    run = chain.run(3, run_id="another")  # a new run: its steps come from the cache
    assert run.counts()["cached"] == 3
    assert [s for s in seen if s[0] == "cached"] == [("cached", False)] * 3


@pytest.mark.parametrize("limited", [False, True])
def test_the_cache_read_returns_what_diskcache_get_returns(tmp_path: Path,
                                                           limited: bool) -> None:
    """durably reads an entry the way Cache.get's own fast path does: same answer for a
    miss, a small value, a value kept in a file, and with an eviction policy; with the
    entry's tag (the seconds its execution took, from its key record; 0.0 for none)."""
    from durably._store.disk.cache import _cache_fetch
    from durably._store.records import KeyRecord

    store = durably.DiskStore(tmp_path / "s", size_limit=10**9 if limited else None,
                              memo_entries=0)
    store.cache_put("aa" * 16, b"small", KeyRecord("m:t", "aa" * 16, "c", {}, {}, 1.0, 0.75))
    store.cache_put("bb" * 16, b"x" * 200_000, None)  # kept in a file by diskcache
    cache = store.cache
    for key, seconds in (("aa" * 16, 0.75), ("bb" * 16, 0.0), ("cc" * 16, 0.0)):
        (ours, took), (theirs, tag) = (_cache_fetch(cache, cache._con, key),
                                       cache.get(key, tag=True))
        assert took == seconds == (tag or 0.0)
        assert type(ours) is type(theirs)
        if isinstance(theirs, bytes) or theirs is None:
            assert ours == theirs
        else:
            assert ours.path == theirs.path
    assert store.cache_get("bb" * 16) is not None and store.cache_get("cc" * 16) is None


def test_an_attempt_interrupted_as_it_ends_leaves_no_run_around_this_context(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C landing in end_run before the context was reset: the thread must not stay
    inside the run (a later, different entrypoint would journal into it), and the run can be
    called again."""
    from durably._runtime import attempt as _attempt

    real = _attempt._leave
    _interrupt_first_call(monkeypatch, _attempt, "_leave")
    with pytest.raises(KeyboardInterrupt):
        chain.run(2)
    monkeypatch.setattr(_attempt, "_leave", real)
    assert durably._runtime.context.current_run.get() is None

    @durably.entrypoint
    def report(x: int) -> int:
        return inc(x)

    assert report.run(5).result == 6  # a run of its own
    (rec,) = [r for r in store.list_runs() if r.name == "chain"]
    assert [s.task for s in store.list_steps(rec.run_id)] == ["inc", "inc"]
    assert chain.run(2).status == "finished"  # its lease was not left held


def test_an_interrupted_cache_write_does_not_keep_the_cache_locked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C inside diskcache right after its BEGIN: the transaction is rolled back at once,
    not at this thread's next cache access (which may never come)."""
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("aa" * 16, b"one", None)
    cache = store.cache

    def interrupted_set(*args: Any, **kwargs: Any) -> None:
        cache._con.execute("BEGIN IMMEDIATE")
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "set", interrupted_set)
    with pytest.raises(KeyboardInterrupt):
        store.cache_put("bb" * 16, b"two", None)
    assert cache._con.in_transaction is False
    with contextlib.closing(sqlite3.connect(tmp_path / "s" / "cache" / "cache.db",
                                            isolation_level=None, timeout=1)) as other:
        _assert_write_lock_free(other)


def test_ctrl_c_during_a_thread_map_waits_for_the_bodies_still_running(
        store: durably.DiskStore) -> None:
    """The attempt ends only once the bodies it started have ended: else calling the run
    again would execute them a second time while they still run."""
    import signal
    import threading
    import time

    running: list[int] = []
    lock = threading.Lock()
    started = threading.Event()

    @durably.task(cache=False)
    def slow(i: int) -> int:
        with lock:
            running.append(i)
        started.set()
        time.sleep(0.4)
        with lock:
            running.remove(i)
        return i

    @durably.entrypoint
    def fan(n: int) -> int:
        return sum(slow.map(range(n), progress=False))

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        threading.Thread(target=lambda: (started.wait(10), signal.setitimer(
            signal.ITIMER_REAL, 0.05))).start()
        with pytest.raises(KeyboardInterrupt):
            fan.run(2)
        with lock:
            assert running == []  # no body of the ended attempt still runs
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert fan.run(2).result == 1


def _pack_one_by_one(replays: list[Any]) -> bytes:
    """pack_replays as format 4 first wrote it: one struct.pack per step."""
    import json
    import struct

    from durably._store.disk.rows import _REPLAY, _REPLAYS_MAGIC

    names: dict[str, int] = {}
    parts = []
    for position, started, ended, step, parent, key, task in replays:
        index = names.setdefault(task, len(names))
        parts.append(_REPLAY.pack(position, started, ended, bytes.fromhex(step),
                                  bytes.fromhex(parent) if parent is not None else bytes(16),
                                  bytes.fromhex(key) if key else bytes(16),
                                  (parent is not None) | (bool(key) << 1), index))
    header = json.dumps(list(names)).encode()
    return b"".join((_REPLAYS_MAGIC, struct.pack("<II", len(header), len(replays)), header,
                     *parts))


_hex32 = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)


@given(st.lists(st.tuples(st.integers(0, 2**63 - 1), st.floats(), st.floats(), _hex32,
                          st.none() | _hex32, st.just("") | _hex32,
                          st.sampled_from(["inc", "load", "é"])), max_size=40))
def test_replays_are_packed_to_the_bytes_format_4_defines(replays: list[Any]) -> None:
    """pack_replays converts the three ids of a step at once; its bytes are the layout format
    4 defines, field by field, so rows written before and after read alike."""
    assert pack_replays(replays) == _pack_one_by_one(replays)

