"""Faults a real machine produces, on a DiskStore: damaged cache values and index rows, damaged
journals, full disks and read-only stores. Every fault is either injected (always) or real
(a tiny tmpfs, where this machine lets the tests mount one)."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._keys import serde as _serde
from durably._store.integrity import open_seal

from .conftest import script_env, write_script


# -- helpers -----------------------------------------------------------------------------------
def _value_files(root: Path) -> list[Path]:
    return sorted((root / "cache").glob("*/*/*.val"))


def _index(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "cache" / "cache.db", isolation_level=None)


def _payload(n: int) -> bytes:
    return bytes(range(256)) * (n // 256) + b"!" * (n % 256)


def _damage(data: bytes, how: str) -> bytes:
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "emptied":
        return b""
    flipped = bytearray(data)
    flipped[len(data) * 2 // 3] ^= 0x10
    return bytes(flipped)


def _aside(root: Path) -> list[Path]:
    folder = root / "damaged"
    return sorted(folder.iterdir()) if folder.exists() else []


class _Counter:
    def __init__(self) -> None:
        self.calls: list[Any] = []


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[durably.DiskStore]:
    store = durably.DiskStore(tmp_path / "s")
    durably.configure(store=store)
    yield store
    durably.configure()
    store.close()


# -- damaged cache values ----------------------------------------------------------------------
SIZES = {"inline": 1_000, "file": 100_000, "large": 300_000}


@pytest.mark.parametrize("damage", ["truncated", "emptied", "bit-flipped"])
@pytest.mark.parametrize("where", ["inline", "file", "large"])
def test_a_damaged_cache_value_is_a_miss_recomputed_and_kept_aside(
        disk: durably.DiskStore, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, where: str, damage: str) -> None:
    """inline: kept in diskcache's SQLite index; file: a value file; large: a streamed file."""
    monkeypatch.setattr(_serde, "SPILL_BYTES", 200_000)
    calls: list[int] = []

    @durably.task
    def make(n: int) -> bytes:
        calls.append(n)
        return _payload(n)

    n = SIZES[where]
    expected = make(n)
    key = make.cache_key(n)
    root = disk.path
    if where == "inline":
        with _index(root) as con:
            (value,) = con.execute("SELECT value FROM Cache WHERE key=?", (key,)).fetchone()
            con.execute("UPDATE Cache SET value=? WHERE key=?", (_damage(value, damage), key))
        damaged_bytes = _damage(value, damage)
    else:
        [file] = _value_files(root)
        damaged_bytes = _damage(file.read_bytes(), damage)
        file.write_bytes(damaged_bytes)
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert make(n) == expected
    assert calls == [n, n]  # a miss: recomputed, never a wrong value
    [kept] = _aside(root)
    assert key in caplog.text and str(kept) in caplog.text and "damaged" in caplog.text
    assert kept.name.startswith(key) and kept.read_bytes() == damaged_bytes
    assert make(n) == expected and calls == [n, n]  # the recomputed entry is sound


class _Planted:
    """A pickle that creates a file when it is loaded: proof that nothing was unpickled."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (str(self.path), "w"))


GARBAGE = ["pickle row", "path outside the cache", "text value", "integer value"]


@pytest.mark.parametrize("garbage", GARBAGE)
def test_a_garbage_index_row_is_never_loaded_nor_followed(
        disk: durably.DiskStore, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        garbage: str) -> None:
    calls: list[int] = []

    @durably.task
    def make(n: int) -> bytes:
        calls.append(n)
        return _payload(n)

    expected = make(500)
    key = make.cache_key(500)
    planted = tmp_path / "planted"
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    update = {
        "pickle row": ("mode=4, filename=NULL, value=?", (pickle.dumps(_Planted(planted)),)),
        "path outside the cache": ("mode=2, filename=?, value=NULL",
                                   (os.path.join("..", "..", "victim.txt"),)),
        "text value": ("mode=1, filename=NULL, value=?", ("some text",)),
        "integer value": ("mode=1, filename=NULL, value=?", (42,)),
    }[garbage]
    with _index(disk.path) as con:
        con.execute(f"UPDATE Cache SET {update[0]} WHERE key=?", (*update[1], key))
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert make(500) == expected
    assert calls == [500, 500]
    assert not planted.exists()  # the pickle row was never unpickled
    assert victim.read_text() == "not yours"  # a path outside the cache is never touched
    [kept] = _aside(disk.path)
    assert key in caplog.text and str(kept) in caplog.text
    assert make(500) == expected and calls == [500, 500]


def test_a_row_whose_file_is_missing_is_a_plain_miss(disk: durably.DiskStore) -> None:
    calls: list[int] = []

    @durably.task
    def make(n: int) -> bytes:
        calls.append(n)
        return _payload(n)

    expected = make(100_000)
    [file] = _value_files(disk.path)
    file.unlink()
    assert make(100_000) == expected and calls == [100_000, 100_000]


def test_a_garbage_cache_index_is_moved_aside_and_the_cache_starts_empty(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "s"
    store = durably.DiskStore(root)
    store.cache_put("k", b"v")
    store.put_run(_record("r"))
    store.close()
    (root / "cache" / "cache.db").write_bytes(b"this is not a database" * 100)
    for extra in ("cache.db-wal", "cache.db-shm"):
        (root / "cache" / extra).unlink(missing_ok=True)
    store = durably.DiskStore(root)
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert store.cache_get("k") is None
    assert "cache index" in caplog.text and "damaged" in caplog.text
    [kept] = _aside(root)
    assert (kept / "cache.db").read_bytes().startswith(b"this is not")
    store.cache_put("k", b"again")
    assert store.cache_get("k") == b"again"
    assert store.find_run("r") is not None  # the journal is untouched
    store.close()


def _record(run_id: str) -> Any:
    from durably._store.records import RunRecord

    return RunRecord(run_id, "m:ep", "ep", "finished", 1.0, 1.0, 1, "d" * 32)


# -- damaged journals --------------------------------------------------------------------------
def _journal(root: Path) -> sqlite3.Connection:
    return sqlite3.connect(root / "journal.sqlite3", isolation_level=None)


def _flip_column(root: Path, sql: str, params: tuple[Any, ...] = ()) -> int:
    """Flip a bit in the blob the query selects (rowid, blob) in each row; returns rows hit."""
    table = sql.split(" FROM ")[1].split()[0]
    column = sql.split("SELECT rowid, ")[1].split()[0]
    with _journal(root) as con:
        rows = con.execute(sql, params).fetchall()
        for rowid, blob in rows:
            con.execute(f"UPDATE {table} SET {column}=? WHERE rowid=?",
                        (_damage(blob, "bit-flipped"), rowid))
    return len(rows)


def _pipeline(counter: _Counter) -> tuple[Any, Any, Any]:
    @durably.task(name="square")
    def square(i: int) -> int:
        counter.calls.append(("square", i))
        return i * i

    @durably.task(cache=False, name="notify")
    def notify(i: int) -> int:
        counter.calls.append(("notify", i))
        return i

    @durably.entrypoint(name="job")
    def job(n: int) -> int:
        total = sum(square(i) for i in range(n))
        notify(total)
        return total

    return square, notify, job


def test_a_damaged_result_of_a_cacheable_step_is_recomputed_never_loaded(
        disk: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    c = _Counter()
    _, _, job = _pipeline(c)
    run = job.run(3)
    disk.cache.clear()  # so the damaged step must execute again, not come from the cache
    hit = _flip_column(disk.path, "SELECT rowid, result FROM steps WHERE task='square' "
                                  "AND status='ran' AND run_id=? LIMIT 1", (run.id,))
    assert hit == 1
    c.calls.clear()
    with caplog.at_level(logging.WARNING, logger="durably"):
        again = job.run(3)
    assert again.id == run.id and again.result == 5
    assert c.calls == [("square", 0)]  # the damaged step alone, never the side effect
    assert "cacheable" in caplog.text and run.id in caplog.text
    c.calls.clear()
    assert job.run(3).result == 5 and c.calls == []  # the new record is found from now on


def test_a_damaged_side_effect_step_raises_for_that_run_alone(
        disk: durably.DiskStore) -> None:
    c = _Counter()
    square, _, job = _pipeline(c)
    bad = job.run(3)
    good = job.run(4)
    _flip_column(disk.path, "SELECT rowid, result FROM steps WHERE task='notify' AND run_id=?",
                 (bad.id,))
    c.calls.clear()
    with pytest.raises(durably.CorruptJournalError) as info:
        job(3)
    message = str(info.value)
    assert bad.id in message and "'notify'" in message and "repair_run" in message
    assert "fresh=True" in message and c.calls == []
    # other runs, listing and the cache keep working
    assert job.run(4).result == good.result and c.calls == []
    assert {r.id for r in durably.list_runs(job)} == {bad.id, good.id}
    assert square(2) == 4 and c.calls == []
    # the user decides: repair, and the side effect happens again, once
    lines = disk.repair_run(bad.id)
    assert len(lines) == 1 and "notify" in lines[0]
    assert job(3) == 5 and c.calls == [("notify", 5)]
    assert job(3) == 5 and c.calls == [("notify", 5)]


@pytest.mark.parametrize("value", ["'garbage'", "7", "2.5", "CAST(X'80ff41' AS TEXT)"])
@pytest.mark.parametrize("steps", [3, 200])
@pytest.mark.parametrize("task", ["square", "notify"])
def test_a_result_stored_as_text_or_a_number_is_damage_said_for_its_step(
        disk: durably.DiskStore, caplog: pytest.LogCaptureFixture, task: str, steps: int,
        value: str) -> None:
    """A journaled result that is TEXT (UTF-8 or not) or a number, not a BLOB (a tool or a
    hand edited the journal), read ahead with the steps it is replayed among (200 of them:
    the window's size is counted): a cacheable step executes again (with a warning), a side
    effect raises CorruptJournalError saying what is wrong, and repair_run sets it aside;
    never a bare TypeError or a StoreError for the whole resume."""
    c = _Counter()
    _, _, job = _pipeline(c)
    run = job.run(steps)
    total = sum(i * i for i in range(steps))
    disk.cache.clear()
    with _journal(disk.path) as con:
        hit = con.execute(f"UPDATE steps SET result={value} WHERE rowid = (SELECT rowid FROM "
                          "steps WHERE task=? AND run_id=? LIMIT 1)", (task, run.id)).rowcount
    assert hit == 1
    c.calls.clear()
    if task == "square":
        with caplog.at_level(logging.WARNING, logger="durably"):
            again = job.run(steps)
        assert again.result == total and c.calls == [("square", 0)]
        assert "cacheable" in caplog.text and run.id in caplog.text
        return
    with pytest.raises(durably.CorruptJournalError) as info:
        job(steps)
    message = str(info.value)
    assert "damaged" in message and "'notify'" in message
    assert "repair_run" in message and c.calls == []
    assert len(disk.repair_run(run.id)) == 1  # set aside: the side effect happens once more
    assert job(steps) == total and c.calls == [("notify", total)]


def test_a_garbage_step_row_raises_for_that_run_alone(disk: durably.DiskStore) -> None:
    c = _Counter()
    _, _, job = _pipeline(c)
    bad, good = job.run(2), job.run(5)
    with _journal(disk.path) as con:
        con.execute("UPDATE steps SET position='first', started=x'00' WHERE run_id=? AND "
                    "rowid=(SELECT min(rowid) FROM steps WHERE run_id=?)", (bad.id, bad.id))
    with pytest.raises(durably.CorruptJournalError, match="garbage") as info:
        durably.get_run(bad.id).steps  # noqa: B018
    assert bad.id in str(info.value) and "repair_run" in str(info.value)
    assert len(durably.get_run(good.id).steps) == 6
    assert [r.id for r in durably.list_runs(job)] == [good.id, bad.id]
    assert disk.repair_run(bad.id)
    c.calls.clear()
    assert job(2) == 1
    assert c.calls == []  # the step set aside comes from the cache
    assert len(durably.get_run(bad.id).steps) == 3


def test_a_damaged_run_result_reads_as_not_stored_and_a_rerun_stores_it_again(
        disk: durably.DiskStore) -> None:
    c = _Counter()
    _, _, job = _pipeline(c)
    run = job.run(3)
    _flip_column(disk.path, "SELECT rowid, result FROM runs WHERE run_id=?", (run.id,))
    with pytest.raises(durably.RunStateError, match="damaged") as info:
        durably.get_run(run.id).result  # noqa: B018
    assert "rerun the entrypoint" in str(info.value)
    assert [r.id for r in durably.list_runs(job)] == [run.id]
    c.calls.clear()
    assert job(3) == 5 and c.calls == []  # replayed from the journal
    assert durably.get_run(run.id).result == 5


def test_damaged_arguments_and_answers_raise_for_that_run(disk: durably.DiskStore) -> None:
    asked: list[str] = []

    @durably.task(name="approve")
    def approve(item: str) -> str:
        asked.append(item)
        return str(durably.interrupt(f"approve {item}?"))

    @durably.entrypoint
    def review(item: str) -> str:
        return approve(item)

    first = review.run("a")
    assert first.status == "interrupted"
    _flip_column(disk.path, "SELECT rowid, args FROM runs WHERE run_id=?", (first.id,))
    with pytest.raises(durably.CorruptJournalError, match="arguments") as info:
        review.resume(first.id, "yes")
    assert first.id in str(info.value) and "same arguments" in str(info.value)
    assert review.run("a").status == "interrupted"  # called with its arguments: it goes on
    assert review.resume(first.id, "yes") == "yes"
    # a damaged answer: the run raises; repair removes the answer; the question comes again
    second = review.run("b")
    review.resume(second.id, "ok")
    _flip_column(disk.path, "SELECT rowid, data FROM events WHERE run_id=? AND kind='answer'",
                 (second.id,))
    with _journal(disk.path) as con:  # make the run continue from the interrupt
        con.execute("DELETE FROM steps WHERE run_id=? AND task='approve' AND status='ran'",
                    (second.id,))
    with pytest.raises(durably.CorruptJournalError, match="answer"):
        review("b")
    assert any("answer" in line for line in disk.repair_run(second.id))
    assert review.run("b").status == "interrupted"


def test_a_garbage_journal_file_stops_runs_not_the_cache(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "s"
    store = durably.DiskStore(root)
    durably.configure(store=store)
    c = _Counter()
    square, _, job = _pipeline(c)
    job(3)
    store.close()
    for name in ("journal.sqlite3-wal", "journal.sqlite3-shm"):
        (root / name).unlink(missing_ok=True)
    (root / "journal.sqlite3").write_bytes(b"\x00garbage" * 4096)
    store = durably.DiskStore(root)
    durably.configure(store=store)
    with pytest.raises(durably.CorruptJournalError) as info:
        job(3)
    assert "journal.sqlite3" in str(info.value) and "Fix:" in str(info.value)
    c.calls.clear()
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert square(1) == 1 and square(7) == 49  # a hit, and a miss that is stored
    assert c.calls == [("square", 7)]
    assert square(7) == 49 and c.calls == [("square", 7)]
    assert "key records" in caplog.text
    # the fix the message gives, followed as written: a new journal, the cache kept
    text = str(info.value)
    assert "JOURNAL" in text and "move" in text
    store.close()
    (root / "journal.sqlite3").rename(tmp_path / "journal.sqlite3.damaged")
    (root / "JOURNAL").unlink()
    store = durably.DiskStore(root)
    durably.configure(store=store)
    job(3)  # a new run in a new journal
    assert [r.status for r in durably.list_runs()] == ["finished"]
    store.close()
    durably.configure()


# -- full disk and read-only store: injected -------------------------------------------------
class _FailingConnection:
    """A journal connection whose writes of chosen statements fail like SQLite would."""

    def __init__(self, con: sqlite3.Connection, error: Exception, when: Callable[[str], bool]
                 ) -> None:
        self.con, self.error, self.when = con, error, when

    def execute(self, sql: str, *args: Any) -> Any:
        if self.when(sql):
            raise self.error
        return self.con.execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        if self.when(sql):
            raise self.error
        return self.con.executemany(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


JOURNAL_FAULTS = [
    (sqlite3.OperationalError("database or disk is full"), "disk is full"),
    (sqlite3.OperationalError("attempt to write a readonly database"), "not writable"),
    (sqlite3.OperationalError("disk I/O error"), "check the path"),
]


@pytest.mark.parametrize(("error", "hint"), JOURNAL_FAULTS, ids=["ENOSPC", "read-only", "EIO"])
def test_a_failed_journal_write_is_a_store_error_and_the_run_resumes(
        disk: durably.DiskStore, error: Exception, hint: str) -> None:
    c = _Counter()
    _, _, job = _pipeline(c)
    real = disk._db()
    state = {"steps": 0}

    def third_step(sql: str) -> bool:
        if sql.startswith("INSERT INTO steps"):
            state["steps"] += 1
            return state["steps"] >= 3
        return False

    disk._local.con = _FailingConnection(real, error, third_step)
    with pytest.raises(durably.StoreError, match=hint) as info:
        job(5)
    assert str(disk.path / "journal.sqlite3") in str(info.value) and "Fix:" in str(info.value)
    assert c.calls == [("square", 0), ("square", 1), ("square", 2)]
    disk._local.con = real  # space freed, permissions fixed
    c.calls.clear()
    assert job(5) == 30
    # the two journaled steps never ran again; the one whose journal write failed comes from
    # the cache (its entry was queued before the journal write) and is journaled now
    assert c.calls == [("square", 3), ("square", 4), ("notify", 30)]
    assert [s.status for s in durably.get_run(job.run(5).id).steps] == ["replayed"] * 6


def test_a_failed_run_record_write_is_a_store_error_and_leaves_the_run_resumable(
        disk: durably.DiskStore) -> None:
    c = _Counter()
    _, _, job = _pipeline(c)
    real = disk._db()
    disk._local.con = _FailingConnection(
        real, sqlite3.OperationalError("database or disk is full"),
        lambda sql: sql.startswith(("INSERT INTO runs", "DELETE FROM leases")))
    with pytest.raises(durably.StoreError, match="disk is full"):
        job(3)
    disk._local.con = real
    c.calls.clear()
    assert job(3) == 5  # the lease this process could not release is taken over
    assert c.calls == [("square", 0), ("square", 1), ("square", 2), ("notify", 5)]


def test_a_large_value_that_does_not_fit_fails_cleanly(
        disk: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_serde, "SPILL_BYTES", 100_000)
    written = {"n": 0}
    real_write = _serde._os_write

    def full_after_1mb(fd: int, data: Any) -> int:
        if written["n"] > 1_000_000:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real_write(fd, memoryview(data)[:65536])
        written["n"] += n
        return n

    monkeypatch.setattr(_serde, "_os_write", full_after_1mb)
    calls: list[int] = []

    @durably.task
    def big(n: int) -> bytes:
        calls.append(n)
        return _payload(n)

    with pytest.raises(durably.StoreError, match="disk is full") as info:
        big(3_000_000)
    assert str(disk.path / "tmp") in str(info.value) and "Nothing was stored" in str(info.value)
    written_bytes = int(str(info.value).split(" bytes so far")[0].rpartition("(")[2]
                        .replace(",", ""))
    assert written_bytes > 1_000_000  # what was written before the disk filled (said 0)
    assert list((disk.path / "tmp").iterdir()) == []  # the partial file is gone
    assert disk.cache_get(big.cache_key(3_000_000)) is None
    monkeypatch.setattr(_serde, "_os_write", real_write)
    assert big(3_000_000) == _payload(3_000_000) and calls == [3_000_000, 3_000_000]
    assert big(3_000_000) == _payload(3_000_000) and len(calls) == 2


def test_a_failed_cache_file_write_leaves_no_partial_file(
        disk: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    disk.cache_put("ok", b"x" * 50_000)
    before = _value_files(disk.path)
    import builtins

    real_open = builtins.open

    class _Full:
        def __init__(self, f: Any) -> None:
            self.f = f

        def write(self, data: Any) -> int:
            self.f.write(memoryview(data)[:1000])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.f.close()

    def opener(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(path, mode, *args, **kwargs)
        return _Full(f) if mode == "xb" and str(path).endswith(".val") else f

    monkeypatch.setattr(builtins, "open", opener)
    with pytest.raises(durably.StoreError, match="disk is full"):
        disk.cache_put("k", b"y" * 50_000)
    monkeypatch.undo()
    assert _value_files(disk.path) == before  # no half-written file left taking the space
    assert disk.cache_get("k") is None and disk.cache_get("ok") == b"x" * 50_000


# -- full disk and read-only store: real (a tiny tmpfs) ---------------------------------------
def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           str(where)], capture_output=True, check=False)
    return done.returncode == 0


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, "6m"):
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN on Linux); the "
                    "injected faults above exercise the same code paths")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


FILLER = """
import os, sys
import durably

COUNT = os.environ["COUNT_FILE"]

def mark(text):
    with open(COUNT, "a") as f:
        f.write(text + "\\n")

@durably.task
def chunk(i):
    mark(f"chunk {i}")
    return bytes([i]) * 150_000 + os.urandom(16)

@durably.task(cache=False)
def notify(total):
    mark(f"notify {total}")
    return total

@durably.entrypoint
def fill(n):
    total = sum(len(chunk(i)) for i in range(n))
    notify(total)
    return total

try:
    print("result", fill(int(sys.argv[1])), flush=True)
except durably.StoreError as exc:
    print("store error:", exc, flush=True)
    sys.exit(3)
"""


def test_a_real_full_disk_fails_cleanly_and_the_run_resumes_after_space_is_freed(
        tiny_fs: Path, tmp_path: Path) -> None:
    script = write_script(tmp_path / "filler.py", FILLER)
    count = tmp_path / "count.txt"
    ballast = tiny_fs / "ballast"
    ballast.write_bytes(os.urandom(4_500_000))
    env = script_env(tiny_fs / "store", COUNT_FILE=str(count))
    full = subprocess.run([sys.executable, str(script), "12"], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert full.returncode == 3, full.stdout + full.stderr
    assert "disk is full" in full.stdout and str(tiny_fs / "store") in full.stdout
    assert count.read_text().count("chunk") >= 1
    ballast.unlink()  # space freed
    resumed = subprocess.run([sys.executable, str(script), "12"], env=env, capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.strip() == f"result {12 * 150_016}"
    lines = count.read_text().splitlines()
    # each chunk ran once, except the one whose journal write hit the full disk (ran twice)
    per_chunk = [lines.count(f"chunk {i}") for i in range(12)]
    assert all(n in (1, 2) for n in per_chunk) and per_chunk.count(2) <= 1, per_chunk
    assert lines.count(f"notify {12 * 150_016}") == 1
    # nothing half-written is ever read back: every value in the store is sound
    _assert_store_sound(tiny_fs / "store")


def _assert_store_sound(root: Path) -> None:
    store = durably.DiskStore(root)
    try:
        with _journal(root) as con:
            for (blob,) in con.execute("SELECT result FROM steps WHERE result IS NOT NULL"):
                assert open_seal(blob)[0] is not None
        with _index(root) as con:
            keys = [k for (k,) in con.execute("SELECT key FROM Cache")]
        for key in keys:
            assert store.cache_get(key) is not None, key
        assert not (root / "damaged").exists()
    finally:
        store.close()


def test_a_real_read_only_store_is_a_store_error_and_the_run_resumes(
        tiny_fs: Path, tmp_path: Path) -> None:
    script = write_script(tmp_path / "filler.py", FILLER)
    count = tmp_path / "count.txt"
    env = script_env(tiny_fs / "store", COUNT_FILE=str(count))
    first = subprocess.run([sys.executable, str(script), "3"], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    try:
        ro = subprocess.run([sys.executable, str(script), "5"], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
        assert ro.returncode == 3, ro.stdout + ro.stderr
        assert "not writable" in ro.stdout and str(tiny_fs / "store") in ro.stdout
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_fs)], check=True)
    again = subprocess.run([sys.executable, str(script), "5"], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    lines = count.read_text().splitlines()
    assert [lines.count(f"chunk {i}") for i in range(5)] == [1, 1, 1, 1, 1]
    _assert_store_sound(tiny_fs / "store")


BIG = """
import os, sys
import durably
from durably._keys import serde as _serde
@durably.task
def big(n):
    return b"x" * n

try:
    big(int(sys.argv[1]))
except durably.StoreError as exc:
    print("store error:", exc, flush=True)
    sys.exit(3)
print("stored", flush=True)
"""


def test_a_value_larger_than_a_real_disk_fails_cleanly(tiny_fs: Path, tmp_path: Path) -> None:
    script = write_script(tmp_path / "big.py", BIG)
    env = script_env(tiny_fs / "store")
    done = subprocess.run([sys.executable, str(script), str(80 << 20)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "disk is full" in done.stdout and "Nothing was stored" in done.stdout
    assert list((tiny_fs / "store" / "tmp").iterdir()) == []
    assert os.statvfs(tiny_fs).f_bfree * os.statvfs(tiny_fs).f_frsize > 5 << 20  # space back
    ok = subprocess.run([sys.executable, str(script), str(1 << 20)], env=env,
                        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ok.stdout.strip() == "stored", ok.stdout + ok.stderr


def test_an_io_error_on_a_full_disk_says_the_disk_is_full(
        disk: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite reports a full disk as "disk I/O error" when it cannot size a -shm file: the
    error said to check permissions; the free space of the store's file system tells."""
    error = sqlite3.OperationalError("disk I/O error")
    assert "permissions" in str(disk.store_error(error, "cache", "open the cache"))

    class Full:
        f_bavail, f_frsize = 3, 4096

    monkeypatch.setattr(os, "statvfs", lambda path: Full())
    said = str(disk.store_error(error, "cache", "open the cache"))
    assert "the disk is full" in said and str(disk.path / "cache") in said


@durably.task
def _three_kb(i: int) -> bytes:
    return bytes([i]) * 3000


def test_a_cache_index_found_damaged_by_a_read_is_moved_aside_not_fatal(
        disk: durably.DiskStore, caplog: pytest.LogCaptureFixture) -> None:
    """A damaged page of cache.db met by a read (not at open) failed every call of the task,
    every run calling it, and `durably cache clear`: the cache is moved to damaged/ with a
    warning, as when it is found damaged at open, and the call is a miss."""
    for i in range(30):
        _three_kb(i)
    disk.close()
    index = disk.path / "cache" / "cache.db"
    con = sqlite3.connect(index)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    [(root,)] = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'Cache'")
    page = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(index, "r+b") as f:  # the table's root page: its child pointers garbled
        f.seek((root - 1) * page + 8)
        f.write(b"\xff" * 200)
    fresh = durably.DiskStore(disk.path)
    durably.configure(store=fresh)
    with caplog.at_level("WARNING", logger="durably"):
        assert _three_kb(3) == bytes([3]) * 3000  # a miss, executed
    assert "cache index" in caplog.text and "damaged" in caplog.text
    assert any(p.name.startswith("cache") for p in (disk.path / "damaged").iterdir())
    assert _three_kb(3) == bytes([3]) * 3000
    assert fresh.cache_get(_three_kb.cache_key(3)) is not None  # the new cache works


def test_a_cache_index_damaged_while_a_process_uses_it_is_moved_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Damage met by the look at what other connections wrote (the in-memory values' check)
    deadlocked the call (a lock taken twice); and a second user of the store, still reading
    the moved index, moved the new, healthy cache aside too. The damaged cache is moved
    once; the other users let go of it and use the new one."""
    root = tmp_path / "s"
    first = durably.DiskStore(root)
    durably.configure(store=first)
    assert _three_kb(1) == bytes([1]) * 3000
    assert _three_kb(1) == bytes([1]) * 3000  # (a hit: the in-memory values are in use)
    second = durably.DiskStore(root, memo_entries=0)
    assert second.cache_get(_three_kb.cache_key(1)) is not None  # it has the index open
    index = root / "cache" / "cache.db"
    sqlite3.connect(index).execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    with open(index, "r+b") as f:  # every page damaged, the header too
        f.write(b"\xde\xad\xbe\xef" * (index.stat().st_size // 4))
    first._memo_until = 0.0  # (the next hit looks at the index again at once)
    with caplog.at_level("WARNING", logger="durably"):
        assert _three_kb(1) == bytes([1]) * 3000  # (a deadlock before)
        assert _three_kb(2) == bytes([2]) * 3000
        assert second.cache_get(_three_kb.cache_key(2)) in (None, _serde.dumps(
            bytes([2]) * 3000, what="x"))
        second.cache_put("k-second", b"v")
    assert len(list((root / "damaged").iterdir())) == 1  # moved once
    assert "moved it aside already" in caplog.text
    third = durably.DiskStore(root)
    assert third.cache_get("k-second") is not None  # the second user writes the new cache
    assert third.cache_get(_three_kb.cache_key(2)) is not None


def test_a_store_deleted_while_a_run_executes_is_noticed_at_the_next_step(
        tmp_path: Path) -> None:
    """The store's directory removed while a run executes: its steps went on being written
    to the unlinked journal, and the run reported itself finished with nothing kept (a
    rerun executed every side effect again); then it was noticed only after the last step.
    The write of the step that finished after the deletion raises StoreError naming the
    journal, and no later step executes."""
    import shutil

    store = durably.DiskStore(tmp_path / "s")
    durably.configure(store=store)
    done: list[int] = []

    @durably.task(cache=False)
    def effect(i: int) -> int:
        if i == 3:
            shutil.rmtree(tmp_path / "s")  # (another shell: rm -rf)
        done.append(i)
        return i

    @durably.entrypoint
    def job(n: int) -> int:
        return sum(effect(i) for i in range(n))

    assert job(2) == 1  # a run kept in full
    with pytest.raises(durably.StoreError, match="was deleted while this process used it") \
            as info:
        job(6)
    assert str(tmp_path / "s" / "journal.sqlite3") in str(info.value)
    assert done == [0, 1, 0, 1, 2, 3]  # (steps 4 and 5 never started)
