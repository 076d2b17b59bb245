"""A resumed run that ended (failed, stopped, finished) journals its new attempt's start with
its first write: a resume that only replays commits once; one that executes takes the lease
and marks the run running before the first body runs; another process that resumed the run
meanwhile keeps it, and nothing of the refused attempt is journaled."""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._runtime.context import current_run
from durably.exceptions import RunStateError

from .conftest import run_script, script_env, write_script

FAIL = {"on": False}
EXECUTED: list[int] = []
BETWEEN: list[Callable[[], None]] = []  # called by the entrypoint after its first step
SEEN: dict[str, Any] = {}


@durably.task
def inc(x: int) -> int:
    EXECUTED.append(x)
    return x + 1


@durably.task
def looked_at(x: int) -> int:
    """Records what the journal says while its body executes."""
    EXECUTED.append(x)
    ctx = current_run.get()
    assert ctx is not None
    run_id, store = ctx.run_id, ctx.store
    SEEN["status"] = store.find_run(run_id).status
    SEEN["attempt"] = store.find_run(run_id).attempt
    SEEN["holder"] = store.run_holder(run_id)
    return x + 1


def _calls(n: int, step: Callable[[int], int]) -> int:
    """step(i) for i below n, summed (the hooks called after the first); raising while FAIL
    is set."""
    total = 0
    for i in range(n):
        total += step(i)
        if i == 0:
            for hook in BETWEEN:
                hook()
    if FAIL["on"]:
        raise RuntimeError("stop after the steps")
    return total


@durably.entrypoint
def job(n: int) -> int:
    return _calls(n, inc)


@durably.entrypoint
def grows(n: int) -> int:
    """Its steps, then one more step while FAIL is off."""
    total = sum(inc(i) for i in range(n))
    if FAIL["on"]:
        raise RuntimeError("stop after the steps")
    for hook in BETWEEN:
        hook()
    return total + looked_at(100)


@durably.entrypoint
def careless(n: int) -> int:
    """grows, which carries on when its next step is refused."""
    total = sum(inc(i) for i in range(n))
    if FAIL["on"]:
        raise RuntimeError("stop after the steps")
    for hook in BETWEEN:
        hook()
    try:
        return total + looked_at(100)
    except RunStateError:
        return -1


@pytest.fixture
def store(tmp_path: Path) -> Iterator[durably.DiskStore]:
    disk = durably.DiskStore(tmp_path / "s")
    durably.configure(store=disk)
    FAIL["on"] = False
    EXECUTED.clear()
    BETWEEN.clear()
    SEEN.clear()
    yield disk
    FAIL["on"] = False
    BETWEEN.clear()


def _commits(store: durably.DiskStore) -> int:
    """Commits in the journal's write-ahead log so far (frames that end a transaction: what
    a commit that wrote something leaves; SQLite copies the log back to the database only
    past thousands of pages)."""
    data = (store.path / "journal.sqlite3-wal").read_bytes()
    page = int.from_bytes(data[8:12], "big")
    frames = range(32, len(data) - 24 - page + 1, 24 + page)
    return sum(1 for at in frames if int.from_bytes(data[at + 4:at + 8], "big"))


def _failed_run(n: int, run_id: str = "r", entry: Any = job) -> None:
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        entry.run(n, run_id=run_id)
    FAIL["on"] = False
    EXECUTED.clear()


def _events(store: durably.DiskStore, run_id: str) -> list[tuple[str, int]]:
    return [(e.kind, e.attempt) for e in store.list_events(run_id)]


def test_a_resume_that_only_replays_commits_once(store: durably.DiskStore) -> None:
    _failed_run(5)
    before = _commits(store)
    run = job.run(5, run_id="r")
    assert run.result == 15 and run.counts()["replayed"] == 5 and EXECUTED == []
    assert _commits(store) == before + 1
    # what two commits journaled before: the attempt's start and end, its replays
    assert _events(store, "r") == [("run_started", 1), ("run_failed", 1),
                                   ("run_started", 2), ("run_finished", 2)]
    again = store.find_run("r")
    assert (again.status, again.attempt) == ("finished", 2)
    assert store.run_holder("r") is None
    assert [s.status for s in store.list_steps("r", attempt=2)] == ["replayed"] * 5


def test_a_resume_takes_the_lease_before_its_first_body_executes(
        store: durably.DiskStore) -> None:
    _failed_run(3, entry=grows)
    run = grows.run(3, run_id="r")
    assert run.result == 6 + 101 and EXECUTED == [100]
    assert SEEN["status"] == "running" and SEEN["attempt"] == 2
    holder = SEEN["holder"]
    assert holder is not None and holder.pid == os.getpid()
    assert _events(store, "r") == [("run_started", 1), ("run_failed", 1),
                                   ("run_started", 2), ("run_finished", 2)]


@contextlib.contextmanager
def _write_lock_held(store: durably.DiskStore) -> Iterator[None]:
    """Another connection holds the journal's write lock inside the block (a long write of
    another process)."""
    import sqlite3

    other = sqlite3.connect(store.path / "journal.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_resume_of_an_ended_run_reads_it_without_the_write_lock(
        store: durably.DiskStore) -> None:
    """Another connection holds the journal's write lock (a long write of another process):
    an attempt of a run that ended reads the run and replays its steps meanwhile, and
    waits for the lock only to journal its end."""
    _failed_run(3)
    replayed = threading.Event()
    BETWEEN.append(replayed.set)  # (called once the first step replayed)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(_catch(lambda: job.run(3, run_id="r"))))
    try:
        with _write_lock_held(store):
            thread.start()
            assert replayed.wait(10), "the resume waited for the write lock before replaying"
            assert thread.is_alive()  # its end waits for the lock
    finally:
        thread.join(30)
    (run,) = got
    assert (run.status, run.result, run.attempt) == ("finished", 6, 2)
    assert EXECUTED == []


def test_a_resume_of_an_ended_run_held_by_a_live_process_is_refused_at_once(
        store: durably.DiskStore) -> None:
    """A live process of another machine holds the run (it resumed it, and executes it): a
    call that finds it so stops before its first step, and journals nothing."""
    _failed_run(3)
    before = (store.find_run("r"), _events(store, "r"), store.list_steps("r"))
    _held_elsewhere(store, "r")()
    BETWEEN.append(lambda: pytest.fail("a step was called"))
    with pytest.raises(RunStateError, match="held by process 7 on elsewhere"):
        job.run(3, run_id="r")
    assert (store.find_run("r"), _events(store, "r"), store.list_steps("r")) == before


def test_an_attempt_resumed_meanwhile_by_another_keeps_nothing_of_its_replay(
        store: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """Another attempt (another thread here: another process alike) resumes and finishes the
    run while this one replays: nothing of this one is journaled, and since every step it
    called came from the journal, its call returns the run's result (no error: two
    processes calling a finished run at once both get it)."""
    _failed_run(3)

    def other() -> None:
        BETWEEN.clear()  # (the other attempt calls no hook)
        done = job.run(3, run_id="r")
        assert done.status == "finished"

    BETWEEN.append(lambda: _in_thread(other))
    with caplog.at_level(logging.INFO, logger="durably"):
        run = job.run(3, run_id="r")
    assert (run.status, run.result) == ("finished", 6)
    assert "resumed by another process while this call replayed it" in caplog.text
    rec = store.find_run("r")
    assert (rec.status, rec.attempt) == ("finished", 2)  # the other attempt's
    assert _events(store, "r") == [("run_started", 1), ("run_failed", 1),
                                   ("run_started", 2), ("run_finished", 2)]
    assert EXECUTED == []
    assert job.run(3, run_id="r").result == 6  # the run goes on


def test_an_error_of_an_attempt_resumed_meanwhile_is_the_error_of_its_call(
        store: durably.DiskStore) -> None:
    """The entrypoint raises after replaying only, and another attempt finished the run
    meanwhile: the call raises the entrypoint's error (said to be unjournaled in a note),
    not an error about the other process; the run is as the other attempt left it."""
    _failed_run(3)

    def other_then_fail() -> None:
        BETWEEN.clear()
        _in_thread(lambda: None if job.run(3, run_id="r").status == "finished" else 1 / 0)
        raise ValueError("the entrypoint's own error")

    BETWEEN.append(other_then_fail)
    with pytest.raises(ValueError, match="the entrypoint's own error") as caught:
        job.run(3, run_id="r")
    notes = caught.value.__notes__
    assert any("resumed by another process while this call replayed it" in n for n in notes)
    assert not any("failed; its finished steps are kept" in n for n in notes), notes
    rec = store.find_run("r")
    assert (rec.status, rec.attempt) == ("finished", 2)  # the other attempt's
    assert _events(store, "r") == [("run_started", 1), ("run_failed", 1),
                                   ("run_started", 2), ("run_finished", 2)]
    assert EXECUTED == []


@durably.task
def held_while_executing(x: int) -> int:
    """What the journal says while its body executes, kept per call."""
    ctx = current_run.get()
    assert ctx is not None
    rec = ctx.store.find_run(ctx.run_id)
    holder = ctx.store.run_holder(ctx.run_id)
    SEEN.setdefault("items", []).append(
        (x, rec.status, rec.attempt, holder is not None and holder.pid == os.getpid()))
    return x * 2


def _on_threads(xs: range) -> list[int]:
    """held_while_executing on each x, called from threads of the user's own pool."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(contextvars.copy_context().run, held_while_executing, x)
                   for x in xs]
        return [f.result() for f in futures]


@durably.entrypoint
def fan(n: int) -> int:
    got = _on_threads(range(n))
    if FAIL["on"]:
        raise RuntimeError("stop after the steps")
    return sum(got) + sum(_on_threads(range(n, 2 * n)))


def test_items_on_threads_execute_only_once_the_attempt_holds_the_run(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first new item of a fan-out on threads journals the attempt's start; the other
    threads wait for it: no body executes before the lease is held (the start is made
    slow here, so that they would)."""
    real = durably.DiskStore.acquire_run

    def slow(self: Any, run_id: str, owner: Any) -> Any:
        time.sleep(0.2)  # (inside the transaction that journals the start)
        return real(self, run_id, owner)

    monkeypatch.setattr(durably.DiskStore, "acquire_run", slow)
    _failed_run(8, entry=fan)
    SEEN.clear()
    run = fan.run(8, run_id="r")
    assert run.result == sum(range(16)) * 2
    assert sorted(x for x, *_ in SEEN["items"]) == list(range(8, 16))
    assert {item[1:] for item in SEEN["items"]} == {("running", 2, True)}, SEEN["items"]


def _held_elsewhere(store: durably.DiskStore, run_id: str) -> Callable[[], None]:
    """A hook that gives the run's lease to a process of another machine, renewed now (as
    if it resumed the run meanwhile and executes it)."""
    def hook() -> None:
        with store.batch():
            store._db().execute("INSERT INTO leases VALUES (?, 'elsewhere', 7, NULL, 'tok', ?)",
                                (run_id, time.time()))
    return hook


def test_a_call_of_a_run_a_live_process_executes_is_refused_without_the_write_lock(
        store: durably.DiskStore) -> None:
    """The run is running, its lease held by a live process (of another machine here), and
    another connection holds the journal's write lock: a call of the run is refused at once
    (it reads the lease in a snapshot), not after waiting for the lock."""
    _failed_run(3)
    with store.batch():
        store._db().execute("UPDATE runs SET status='running' WHERE run_id='r'")
    _held_elsewhere(store, "r")()
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(_catch(lambda: job.run(3, run_id="r"))))
    try:
        with _write_lock_held(store):
            thread.start()
            thread.join(10)
            assert not thread.is_alive(), "the call waited for the write lock before refusing"
    finally:
        thread.join(90)
    (error,) = got
    assert isinstance(error, RunStateError), error
    assert "held by process 7 on elsewhere" in str(error)
    assert store.find_run("r").status == "running" and EXECUTED == []


def test_a_new_process_is_refused_a_run_a_live_process_executes_without_the_write_lock(
        tmp_path: Path) -> None:
    """As above, from a process that opens the journal while the write lock is held (its
    check of the journal's write-ahead log, which takes that lock, waits for its first
    write): refused without waiting for the lock (its busy timeout is 60 s)."""
    script = write_script(tmp_path / "call.py", """
        import time
        import durably

        @durably.task
        def inc(x):
            return x + 1

        @durably.entrypoint
        def job(n):
            return sum(inc(i) for i in range(n))

        started = time.monotonic()
        try:
            print("result", job.run(3, run_id="r").result)
        except durably.RunStateError as exc:
            print(f"refused after {time.monotonic() - started:.0f} s: {exc}")
    """)
    env = script_env(tmp_path / "s")
    assert run_script(script, env).stdout.strip() == "result 6"
    store = durably.DiskStore(tmp_path / "s")
    with store.batch():
        store._db().execute("UPDATE runs SET status='running' WHERE run_id='r'")
    _held_elsewhere(store, "r")()
    with _write_lock_held(store):
        out = run_script(script, env, timeout=120).stdout.strip()
    assert out.startswith("refused after "), out
    assert int(out.split()[2]) < 30, out  # (not the lock's 60 s)
    assert "held by process 7 on elsewhere" in out
    store.close()


def test_an_attempt_that_must_execute_is_refused_while_another_holds_the_run(
        store: durably.DiskStore) -> None:
    """Another process took the run's lease while this attempt replayed: this one stops
    before the first body it would execute, and journals nothing."""
    _failed_run(3, entry=grows)
    before = (store.find_run("r"), _events(store, "r"), store.list_steps("r"))
    BETWEEN.append(_held_elsewhere(store, "r"))
    with pytest.raises(RunStateError, match="held by"):
        grows.run(3, run_id="r")
    assert EXECUTED == []  # looked_at's body never ran
    assert (store.find_run("r"), _events(store, "r"), store.list_steps("r")) == before


def test_a_refusal_caught_by_the_entrypoint_still_ends_the_attempt_with_it(
        store: durably.DiskStore) -> None:
    _failed_run(3, entry=careless)
    before = (store.find_run("r"), _events(store, "r"), store.list_steps("r"))
    BETWEEN.append(_held_elsewhere(store, "r"))
    with pytest.raises(RunStateError, match="resumed by another process"):
        careless.run(3, run_id="r")
    assert EXECUTED == []
    assert (store.find_run("r"), _events(store, "r"), store.list_steps("r")) == before


def _in_thread(fn: Callable[[], None]) -> None:
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: errors.extend(
        [r] if isinstance(r := _catch(fn), BaseException) else []))
    thread.start()
    thread.join(30)
    assert not errors, errors


def _catch(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - handed back to the test
        return exc


KILLED_WHILE_REPLAYING = """
import os, sys, time
import durably

@durably.task
def step(i):
    print("executed", i, flush=True)
    return i

@durably.entrypoint
def job(n):
    total = 0
    for i in range(n):
        total += step(i)
        if os.environ.get("PAUSE") and i == n // 2:
            print("paused", flush=True)
            time.sleep(60)
    if os.environ.get("FAIL"):
        raise RuntimeError("stop")
    return total

print("result", job.run(int(sys.argv[1]), run_id="k").result, flush=True)
"""


def test_a_process_killed_while_it_replays_leaves_the_journal_as_it_was(
        tmp_path: Path) -> None:
    script = write_script(tmp_path / "killed.py", KILLED_WHILE_REPLAYING)
    env = script_env(tmp_path / "store")
    failed = subprocess.run([sys.executable, str(script), "6"], env={**env, "FAIL": "1"},
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode != 0 and failed.stdout.count("executed") == 6
    store = durably.DiskStore(tmp_path / "store")
    before = (store.find_run("k"), _events(store, "k"), store.list_steps("k"))
    store.close()
    with subprocess.Popen([sys.executable, str(script), "6"], env={**env, "PAUSE": "1"},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        # 4 steps replayed, none executed
        assert proc.stdout.readline().strip() == "paused", proc.communicate()
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    store = durably.DiskStore(tmp_path / "store")
    assert (store.find_run("k"), _events(store, "k"), store.list_steps("k")) == before
    store.close()
    done = subprocess.run([sys.executable, str(script), "6"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "result 15"  # every step replayed: none executed again


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_ctrl_c_as_the_commit_returns_is_a_ctrl_c(store: durably.DiskStore,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     where: str) -> None:
    """A Ctrl-C landing as the commit of a deferred start (or of an attempt that only
    replayed) returns: the commit stands, the call raises KeyboardInterrupt (not a
    RunStateError about another process), and the run reads as that attempt left it."""
    from durably._runtime import attempt as _attempt
    from durably._store.disk import rows as _records

    entry = grows if where == "start" else job
    _failed_run(3, entry=entry)
    if where == "end":
        assert job.run(3, run_id="r").status == "finished"  # attempt 2; 3 only replays
    armed = [False]
    real_exit, real_call = _records.immediate.__exit__, _attempt._Deferred.__call__

    def exit_then_ctrl_c(self: Any, kind: Any, exc: Any, tb: Any) -> None:
        real_exit(self, kind, exc, tb)
        if armed[0] and kind is None and not self.joined:
            armed[0] = False
            raise KeyboardInterrupt("as the commit returned")

    def arm(self: Any, ctx: Any, ending: bool = False) -> None:
        armed[0] = True
        real_call(self, ctx, ending)

    monkeypatch.setattr(_records.immediate, "__exit__", exit_then_ctrl_c)
    monkeypatch.setattr(_attempt._Deferred, "__call__", arm)
    with pytest.raises(KeyboardInterrupt):
        entry.run(3, run_id="r")
    monkeypatch.undo()
    rec = store.find_run("r")
    if where == "start":  # the start stands; the attempt ended by the Ctrl-C
        assert (rec.status, rec.attempt) == ("stopped", 2)
        assert EXECUTED == []  # stopped before looked_at's body
    else:
        assert (rec.status, rec.attempt) == ("finished", 3)
    assert store.run_holder("r") is None
    assert [e.attempt for e in store.list_events("r", ("run_started",))] == list(
        range(1, rec.attempt + 1))
    assert entry.run(3, run_id="r").status == "finished"


def test_a_lease_left_by_an_interrupted_attempt_is_taken_over_by_a_replay(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt Ctrl-C'd as it released its lease leaves it behind; the next call of the
    process, which only replays, removes it (as taking it over did): other processes are
    not kept out."""
    _failed_run(3, entry=grows)
    real = durably.DiskStore.release_run
    calls = [0]

    def interrupted(self: Any, run_id: str, owner: Any) -> bool:
        calls[0] += 1
        if calls[0] <= 2:
            raise KeyboardInterrupt  # twice: the release and the retry after it
        return real(self, run_id, owner)

    monkeypatch.setattr(durably.DiskStore, "release_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        grows.run(3, run_id="r")  # executes looked_at: takes the lease
    monkeypatch.undo()
    leftover = store._db().execute("SELECT pid FROM leases").fetchall()
    assert leftover == [(os.getpid(),)]
    assert grows.run(3, run_id="r").counts()["replayed"] == 4  # only replays
    assert store._db().execute("SELECT count(*) FROM leases").fetchone() == (0,)


def test_a_ctrl_c_before_the_start_commits_leaves_it_unwritten(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C landing as the deferred start's transaction ends, before its COMMIT: the
    start is not journaled (nor taken as journaled), the attempt ends stopped in one
    commit, its replays recorded once."""
    from durably._runtime import attempt as _attempt
    from durably._store.disk import store as _store

    _failed_run(3, entry=grows)
    armed = [False]
    real_exit, real_call = _store._Batch.__exit__, _attempt._Deferred.__call__

    def ctrl_c_first(self: Any, kind: Any, exc: Any, tb: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt("as the transaction was to commit")  # (left open)
        real_exit(self, kind, exc, tb)

    def arm(self: Any, ctx: Any, ending: bool = False) -> None:
        armed[0] = not ending
        real_call(self, ctx, ending)

    monkeypatch.setattr(_store._Batch, "__exit__", ctrl_c_first)
    monkeypatch.setattr(_attempt._Deferred, "__call__", arm)
    with pytest.raises(KeyboardInterrupt) as caught:
        grows.run(3, run_id="r")
    monkeypatch.undo()
    assert not getattr(caught.value, "__notes__", None)  # (no "lost the run's lease")
    rec = store.find_run("r")
    assert (rec.status, rec.attempt) == ("stopped", 2) and EXECUTED == []
    assert [s.status for s in store.list_steps("r", attempt=2)] == ["replayed"] * 3
    assert store.run_holder("r") is None
    again = grows.run(3, run_id="r")
    assert (again.status, again.attempt) == ("finished", 3) and EXECUTED == [100]


@pytest.mark.parametrize("ending", [KeyboardInterrupt, SystemExit])
def test_a_ctrl_c_ending_an_attempt_refused_at_its_end_goes_on(
        store: durably.DiskStore, ending: type[BaseException]) -> None:
    """Another attempt finished the run while this one replayed, and this one ends by a
    Ctrl-C (or sys.exit): that goes on, the refusal in a note; nothing of it is journaled."""
    _failed_run(3)

    def other_then_stop() -> None:
        BETWEEN.clear()
        _in_thread(lambda: None if job.run(3, run_id="r").status == "finished" else 1 / 0)
        raise ending()

    BETWEEN.append(other_then_stop)
    with pytest.raises(ending) as caught:
        job.run(3, run_id="r")
    assert any("resumed by another process" in n for n in caught.value.__notes__)
    rec = store.find_run("r")
    assert (rec.status, rec.attempt) == ("finished", 2)  # the other attempt's
    assert _events(store, "r") == [("run_started", 1), ("run_failed", 1),
                                   ("run_started", 2), ("run_finished", 2)]


@durably.task
def twice(x: int) -> int:
    """A step with a nested one: journaled after it, so a replay of it in call order is
    out of journal order (each starts a new replay range)."""
    return inc(x) * 2


@durably.entrypoint
def nested(n: int) -> int:
    return _calls(n, twice)


def test_replays_refused_when_journaled_on_the_way_leave_the_call_its_result(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt that only replays journals its start with its first batch of replay
    records (many out of order); another attempt finished the run before that: the batch
    is refused, the attempt goes on replaying without journaling, and its call returns the
    run's result, as when it is refused at its end (was: RunStateError)."""
    from durably._store.disk import steps as _steps

    monkeypatch.setattr(_steps, "_AHEAD_RANGES", 2)  # a batch every 2 ranges
    FAIL["on"] = True
    with pytest.raises(RuntimeError):
        nested.run(8, run_id="r")
    FAIL["on"] = False
    EXECUTED.clear()

    def other() -> None:
        BETWEEN.clear()
        assert nested.run(8, run_id="r").status == "finished"

    BETWEEN.append(lambda: _in_thread(other))
    run = nested.run(8, run_id="r")
    assert (run.status, run.result) == ("finished", sum((i + 1) * 2 for i in range(8)))
    assert EXECUTED == []
    rec = store.find_run("r")
    assert (rec.status, rec.attempt) == ("finished", 2)  # the other attempt's
    assert _events(store, "r") == [("run_started", 1), ("run_failed", 1),
                                   ("run_started", 2), ("run_finished", 2)]
    assert store.run_holder("r") is None


@durably.entrypoint
def stubborn(n: int) -> int:
    """Carries on after its next step is refused: the step after it stops the attempt."""
    total = sum(inc(i) for i in range(n))
    if FAIL["on"]:
        raise RuntimeError("stop after the steps")
    for hook in BETWEEN:
        hook()
    with contextlib.suppress(RunStateError):
        looked_at(100)
    return total + looked_at(101)


@durably.entrypoint
def grouped(n: int) -> int:
    """stubborn, whose refusal and the StopRun after it come out in one exception group (as
    from asyncio's TaskGroup, whose tasks the refusal stops at their next step)."""
    total = sum(inc(i) for i in range(n))
    if FAIL["on"]:
        raise RuntimeError("stop after the steps")
    for hook in BETWEEN:
        hook()
    errors: list[BaseException] = []
    for x in (100, 101):
        try:
            total += looked_at(x)
        except BaseException as exc:  # noqa: BLE001 - gathered, as a TaskGroup does
            errors.append(exc)
    raise BaseExceptionGroup("the tasks failed", errors)


def test_a_call_stopped_by_a_refusal_says_why_not_stoprun_in_a_group(
        store: durably.DiskStore) -> None:
    _failed_run(3, entry=grouped)
    BETWEEN.append(_held_elsewhere(store, "r"))
    with pytest.raises(RunStateError, match="resumed by another process"):
        grouped.run(3, run_id="r")
    assert EXECUTED == []


def test_a_call_stopped_by_a_refusal_says_why_not_stoprun(store: durably.DiskStore) -> None:
    """The attempt's start is refused before a step executes (another process holds the
    run); the entrypoint (or a thread of its own) goes on and calls another step, which
    stops it: the call raises RunStateError, never durably's internal StopRun (a
    BaseException that `except Exception` would not catch)."""
    _failed_run(3, entry=stubborn)
    before = (store.find_run("r"), _events(store, "r"), store.list_steps("r"))
    BETWEEN.append(_held_elsewhere(store, "r"))
    with pytest.raises(RunStateError, match="resumed by another process"):
        stubborn.run(3, run_id="r")
    assert EXECUTED == []
    assert (store.find_run("r"), _events(store, "r"), store.list_steps("r")) == before


def test_a_large_result_of_an_attempt_resumed_meanwhile_is_its_call_s_too(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt that only replayed and returns a large result (journaled apart, its start
    first) finds that another attempt finished the run meanwhile: as with a small result,
    its call returns the result it replayed, and nothing of it is journaled."""
    from durably._runtime import attempt as _attempt

    _failed_run(3)
    monkeypatch.setattr(_attempt, "_BATCHED_RESULT", 4)  # every result is "large"

    def other() -> None:
        BETWEEN.clear()
        assert job.run(3, run_id="r").status == "finished"

    BETWEEN.append(lambda: _in_thread(other))
    run = job.run(3, run_id="r")
    assert (run.status, run.result) == ("finished", 6)
    rec = store.find_run("r")
    assert (rec.status, rec.attempt) == ("finished", 2)  # the other attempt's
    assert _events(store, "r") == [("run_started", 1), ("run_failed", 1),
                                   ("run_started", 2), ("run_finished", 2)]
    assert store.run_holder("r") is None and EXECUTED == []


@pytest.mark.parametrize("entry", ["job", "grows"])
def test_an_end_whose_commit_times_out_once_is_journaled_on_a_second_try(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    """The transaction that ends an attempt fails with StoreError (another process held the
    journal's write lock past the busy timeout); the end is then journaled write by write,
    and it succeeds: the call returns its result (was: the first StoreError), for an
    attempt that only replayed (job) and for one that executed a step (grows)."""
    from durably._runtime import attempt as _attempt
    from durably.exceptions import StoreError

    entrypoint = job if entry == "job" else grows
    _failed_run(3, entry=entrypoint)
    real = _attempt._write_final
    calls = [0]

    def locked_once(*args: Any, **kwargs: Any) -> bool:
        calls[0] += 1
        if calls[0] == 1:
            raise StoreError("cannot write the journal: database is locked (held 60 s)")
        return real(*args, **kwargs)

    monkeypatch.setattr(_attempt, "_write_final", locked_once)
    run = entrypoint.run(3, run_id="r")
    assert calls[0] == 2 and run.status == "finished"
    assert run.result == (6 if entry == "job" else 107)
    rec = store.find_run("r")
    assert (rec.status, rec.attempt) == ("finished", 2)
    assert store.run_holder("r") is None


@durably.entrypoint
def offset(base: int) -> int:
    return sum(inc(base + i) for i in range(3))


def test_a_large_result_ends_its_attempt_in_one_commit_with_the_lease_s_release(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt that executed and returns a large result journals its final record and
    releases its lease in one commit, as with a small one: no moment where the journal says
    finished while the lease still holds the run (a call then was refused)."""
    from durably._runtime import attempt as _attempt

    def commits(base: int) -> int:
        before = _commits(store)
        assert offset.run(base).result == 3 * base + 6  # (steps on new inputs: executed)
        return _commits(store) - before

    offset.run(0)  # (the journal and its log made)
    small = commits(10)
    monkeypatch.setattr(_attempt, "_BATCHED_RESULT", 4)  # every result is "large"
    assert commits(20) == small


def test_a_large_result_of_an_attempt_that_only_replayed_is_journaled_in_one_commit(
        store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt that only replayed and returns a large result (sealed, and written to
    blobs/ if very large, before the transaction) journals its start and end in one commit,
    without a lease, as with a small one. When that commit fails, the start is journaled
    on its own, then the end: killed before the end, the record says running (crashed),
    never the final status."""
    from durably._runtime import attempt as _attempt

    _failed_run(3)
    monkeypatch.setattr(_attempt, "_BATCHED_RESULT", 4)  # every result is "large"
    real = _attempt._write_final

    def killed(*args: Any, **kwargs: Any) -> bool:
        raise SystemExit("killed before the end was written")

    monkeypatch.setattr(_attempt, "_write_final", killed)
    with pytest.raises(SystemExit):
        job.run(3, run_id="r")
    rec = store.find_run("r")
    assert (rec.status, rec.attempt, rec.result) == ("running", 2, None)
    assert store.run_holder("r") is None
    monkeypatch.setattr(_attempt, "_write_final", real)
    before = _commits(store)
    run = job.run(3, run_id="r")
    assert (run.result, run.attempt) == (6, 3) and EXECUTED == []
    assert run.resumed_from == "crashed"
    before = _commits(store)
    run = job.run(3, run_id="r")  # (a finished run: only replayed)
    assert (run.result, run.attempt) == (6, 4) and EXECUTED == []
    assert _commits(store) == before + 1
    rec = store.find_run("r")
    assert (rec.status, rec.attempt) == ("finished", 4)
    assert durably.get_run("r").result == 6  # (its sealed result reads back)
