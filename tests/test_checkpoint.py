"""The journal's and the cache's write-ahead logs are checkpointed in a background thread
(durably._store.disk.checkpoint)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._store.disk import checkpoint as _checkpoint

from .conftest import run_script, script_env, write_script


def _steps_in_file_alone(journal: Path, tmp: Path) -> int:
    """Steps rows the database file holds by itself: what checkpoints copied out of the
    log (a copy of the file, opened without its -wal)."""
    copy = tmp / "alone.sqlite3"
    shutil.copyfile(journal, copy)
    con = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT count(*) FROM steps").fetchone()[0])
    finally:
        con.close()


def test_a_run_s_steps_are_checkpointed_into_the_database_while_it_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "EVERY", 16)
    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)

    @durably.task
    def double(x: int) -> int:
        return 2 * x

    seen: list[int] = []

    @durably.entrypoint
    def job(n: int) -> int:
        total = 0
        for i in range(n):
            total += double(i)
            if i == 60:  # (in the middle of the run: the thread works while it goes on)
                assert _checkpoint.wait_idle(10.0)
                seen.append(_steps_in_file_alone(store.path / "journal.sqlite3", tmp_path))
        return total

    try:
        assert job(100) == 9900
        assert _checkpoint.wait_idle(10.0)
        # without checkpoints, every row would still be in the log only (SQLite's own mark
        # is thousands of pages away)
        assert seen and seen[0] >= 32
        # (at least half: the rows of the last checkpoint's interval may still be in the log
        # only, and how many depends on how the run's commits fell: 76 was seen under load)
        assert _steps_in_file_alone(store.path / "journal.sqlite3", tmp_path) >= 50
        # the cache is checkpointed too (its rows are written at the run's end)
        monkeypatch.setattr(_checkpoint, "EVERY", 1)
        assert job(120) == 14280
        assert _checkpoint.wait_idle(10.0)
        copy = tmp_path / "cache-alone.db"
        shutil.copyfile(store.path / "cache" / "cache.db", copy)
        con = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        assert con.execute("SELECT count(*) FROM Cache").fetchone()[0] >= 120
        con.close()
    finally:
        durably.configure()
        store.close()


def test_a_database_deleted_before_its_checkpoint_is_not_created_again(tmp_path: Path) -> None:
    gone = tmp_path / "gone" / "journal.sqlite3"
    gone.parent.mkdir()
    _checkpoint.request(str(gone))
    assert _checkpoint.wait_idle(10.0)
    assert not gone.exists()
    assert list(gone.parent.iterdir()) == []


def test_the_thread_ends_when_idle_and_closes_its_connections(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "IDLE_SECONDS", 0.05)
    db = tmp_path / "j.sqlite3"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (x)")
    con.execute("INSERT INTO t VALUES (1)")
    _checkpoint.request(str(db))
    deadline = time.monotonic() + 10
    while _checkpoint._thread[0] is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _checkpoint._thread[0] is None
    assert _checkpoint.wait_idle(10.0)  # (its connections closed)
    con.close()
    # the last connection closed deletes the log: the thread's is closed too
    assert not Path(f"{db}-wal").exists()
    # and a later request starts a new thread
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("INSERT INTO t VALUES (2)")
    _checkpoint.request(str(db))
    assert _checkpoint.wait_idle(10.0)
    con.close()


def test_forks_during_checkpoints_never_hang_the_child_and_exit_deletes_the_log(
        tmp_path: Path) -> None:
    """A child forked while the thread checkpoints uses the same store at once (no lock of
    SQLite's inherited held); a process that exits closes the thread's connections, so the
    journal's log is deleted as before."""
    script = write_script(tmp_path / "forks.py", """
        import os, sys
        import durably
        from durably._store.disk import checkpoint as _checkpoint
        _checkpoint.EVERY = 2

        @durably.task
        def inc(x):
            return x + 1

        @durably.entrypoint
        def job(base, n):
            return sum(inc(base + i) for i in range(n))

        children = []
        for k in range(12):
            job(1000 * k, 200)  # (requests a checkpoint every other commit)
            pid = os.fork()
            if pid == 0:
                code = 0 if job(10**6 + k, 5) == 5 * (10**6 + k) + 15 else 3
                os._exit(code)
            children.append(pid)
        for pid in children:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
        print("ok")
    """)
    proc = run_script(script, script_env(tmp_path / "store"), timeout=120)
    assert proc.stdout.strip() == "ok"
    assert (tmp_path / "store" / "journal.sqlite3").exists()
    assert not (tmp_path / "store" / "journal.sqlite3-wal").exists()


def test_closing_a_store_closes_the_thread_s_connections_to_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a store is closed no connection of the thread keeps its log: the journal's log
    is removed by the close, as before there was a thread (the directory can be copied
    or moved whole)."""
    monkeypatch.setattr(_checkpoint, "EVERY", 4)
    root = tmp_path / "store"
    job = _job()
    store = durably.DiskStore(root)
    durably.configure(store=store)
    try:
        assert job(40) == 820
        assert _checkpoint.wait_idle(10.0)
        assert str(root / "journal.sqlite3") in _checkpoint._open
    finally:
        durably.configure()
        store.close()
    assert str(root / "journal.sqlite3") not in _checkpoint._open
    assert str(root / "cache" / "cache.db") not in _checkpoint._open
    assert not (root / "journal.sqlite3-wal").exists()
    again = durably.DiskStore(root)
    assert [r.status for r in again.list_runs()] == ["finished"]
    again.close()


def _job() -> Any:
    @durably.task
    def inc(x: int) -> int:
        return x + 1

    @durably.entrypoint
    def job(n: int) -> int:
        return sum(inc(i) for i in range(n))

    return job


def test_a_store_deleted_and_made_again_at_its_path_is_checkpointed_not_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "EVERY", 4)
    root = tmp_path / "store"
    job = _job()
    first = durably.DiskStore(root)
    durably.configure(store=first)
    try:
        assert job(50) == 1275
        assert _checkpoint.wait_idle(10.0)
        shutil.rmtree(root)  # (first is not closed: the thread still has its connection)
        second = durably.DiskStore(root)
        durably.configure(store=second)
        assert job(60) == 1830
        assert _checkpoint.wait_idle(10.0)
        assert _steps_in_file_alone(root / "journal.sqlite3", tmp_path) >= 40
        second.close()
    finally:
        durably.configure()
        first.close()


def test_a_connection_not_asked_for_lately_is_closed_while_others_keep_the_thread_busy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_checkpoint, "EVERY", 4)
    monkeypatch.setattr(_checkpoint, "IDLE_SECONDS", 0.2)
    job = _job()
    a, b = durably.DiskStore(tmp_path / "a"), durably.DiskStore(tmp_path / "b")
    try:
        durably.configure(store=a)
        assert job(20) == 210
        assert _checkpoint.wait_idle(10.0)
        assert str(a.path / "journal.sqlite3") in _checkpoint._open
        durably.configure(store=b)
        end = time.monotonic() + 1.0
        k = 0
        while time.monotonic() < end:  # (b asks every few steps)
            k += 1
            assert job(20 + k) == (20 + k) * (21 + k) // 2
        assert str(b.path / "journal.sqlite3") in _checkpoint._open
        assert str(a.path / "journal.sqlite3") not in _checkpoint._open
    finally:
        durably.configure()
        a.close()
        b.close()


@pytest.mark.parametrize("name", [
    b"/st\xff re?#",  # not UTF-8, and characters a URI gives a meaning to
    b"//",  # a path that starts with // (read as a URI's host, it was never checkpointed)
])
def test_a_store_at_an_unusual_path_is_checkpointed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: bytes) -> None:
    monkeypatch.setattr(_checkpoint, "EVERY", 4)
    if name == b"//":
        root = Path("//" + str(tmp_path).lstrip("/")) / "store"
        assert str(root).startswith("//")
    else:
        root = Path(os.fsdecode(os.fsencode(tmp_path) + name))
    store = durably.DiskStore(root)
    durably.configure(store=store)
    try:
        assert _job()(40) == 820
        assert _checkpoint.wait_idle(10.0)
        assert _steps_in_file_alone(root / "journal.sqlite3", tmp_path) >= 30
    finally:
        durably.configure()
        store.close()


def test_one_thread_at_a_time_uses_sqlite_even_while_the_last_one_closes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that comes while the thread closes its idle connections (a close may
    checkpoint, with fsyncs) is taken by that thread afterwards: no second thread starts
    beside it, which a fork would then not wait for."""
    monkeypatch.setattr(_checkpoint, "IDLE_SECONDS", 0.1)
    db = tmp_path / "j.sqlite3"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (x)")
    _checkpoint.request(str(db))
    assert _checkpoint.wait_idle(10.0)
    first = _checkpoint._thread[0]
    closing = []
    real_close = _checkpoint._close

    def slow_close(c: sqlite3.Connection) -> None:
        closing.append(c)
        time.sleep(0.5)
        real_close(c)

    monkeypatch.setattr(_checkpoint, "_close", slow_close)
    deadline = time.monotonic() + 10
    while not closing and time.monotonic() < deadline:
        time.sleep(0.005)
    assert closing and _checkpoint._busy[0]
    con.execute("INSERT INTO t VALUES (1)")
    _checkpoint.request(str(db))
    assert _checkpoint._thread[0] is first and first is not None and first.is_alive()
    assert _checkpoint.wait_idle(10.0)
    assert os.path.getsize(db) >= 8192  # (the row's page was copied, by the same thread)
    con.close()


@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_a_ctrl_c_while_fork_waits_for_a_checkpoint_is_raised_after_the_fork(
        tmp_path: Path) -> None:
    script = write_script(tmp_path / "ctrlc.py", """
        import os, signal, threading, time
        from durably._store.disk import checkpoint as _checkpoint
        _checkpoint._busy[0] = True  # (a checkpoint in progress, for 0.4 s)
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        threading.Timer(0.4, _checkpoint._busy.__setitem__, (0, False)).start()
        t = time.monotonic()
        waited = None
        try:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            waited = time.monotonic() - t
            os.waitpid(pid, 0)
            time.sleep(2.0)
            print("no interrupt", waited)
        except KeyboardInterrupt:
            print("interrupted after the fork", waited is not None and waited >= 0.35)
    """)
    proc = run_script(script, script_env(tmp_path / "store"), timeout=60)
    assert proc.stdout.strip() == "interrupted after the fork True", proc.stderr
    assert "Exception ignored" not in proc.stderr


def _wal_db(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE t (x)")
    return con


def test_release_waits_for_a_connection_the_thread_is_opening(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "j.sqlite3"
    con = _wal_db(db)
    real = _checkpoint._checkpoint
    started = []

    def slow(*args: Any) -> None:  # (the thread took the request, and has not opened yet)
        started.append(1)
        time.sleep(0.3)
        real(*args)

    monkeypatch.setattr(_checkpoint, "_checkpoint", slow)
    _checkpoint.request(str(db))
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.001)
    _checkpoint.release([str(db)], seconds=5.0)
    assert _checkpoint.wait_idle(10.0)
    assert str(db) not in _checkpoint._open
    con.close()
    assert not Path(f"{db}-wal").exists()  # (the last connection closed: none of the thread's)


def test_a_failure_of_the_thread_itself_loses_no_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "j.sqlite3"
    con = _wal_db(db)
    failures = []
    real = _checkpoint._holding

    def once() -> bool:
        if not failures:
            failures.append(1)
            raise RuntimeError("dictionary changed size during iteration")
        return real()

    monkeypatch.setattr(_checkpoint, "_holding", once)
    deadline = time.monotonic() + 10
    while _checkpoint._thread[0] is not None and time.monotonic() < deadline:
        time.sleep(0.01)  # (a thread of an earlier test ends first: this one starts anew)
    _checkpoint.request(str(db))
    assert _checkpoint.wait_idle(10.0)
    assert failures
    assert os.path.getsize(db) >= 8192  # (served by the thread that took its place)
    con.close()


def test_requests_are_served_oldest_first(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A database that asks again and again while its checkpoints run never keeps another
    one waiting."""
    a, b = tmp_path / "a.sqlite3", tmp_path / "b.sqlite3"
    cons = [_wal_db(a), _wal_db(b)]
    served: list[str] = []
    real = _checkpoint._checkpoint

    def slow(c: Any, path: str, synchronous: str) -> None:
        served.append(Path(path).name)
        time.sleep(0.05)
        real(c, path, synchronous)

    monkeypatch.setattr(_checkpoint, "_checkpoint", slow)
    _checkpoint.request(str(b))
    deadline = time.monotonic() + 10
    while not served and time.monotonic() < deadline:
        time.sleep(0.001)
    _checkpoint.request(str(a))  # (while b's checkpoint runs)
    end = time.monotonic() + 0.6
    while time.monotonic() < end:
        _checkpoint.request(str(b))
        time.sleep(0.01)
    assert _checkpoint.wait_idle(10.0)
    assert served[:2] == ["b.sqlite3", "a.sqlite3"], served
    for con in cons:
        con.close()
