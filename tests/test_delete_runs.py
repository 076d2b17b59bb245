"""Deleting runs (DiskStore.delete_runs, durably.delete_runs, `durably delete`) and collecting
the files in blobs/ no journal refers to (DiskStore.collect_blobs): every row of a deleted run
goes, other runs and the cache stay, a run being executed is never deleted, a killed deletion
leaves the store readable, and a large value shared with another run (a fork) is kept."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import durably
import durably.testing
from durably._keys import serde as _serde

from .conftest import script_env, write_script

CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _small_spill(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values over 100 kB go to blobs/ (the journal's large values), as 64 MiB ones do."""
    monkeypatch.setattr(_serde, "SPILL_BYTES", 100_000)


@durably.task
def make(n: int, seed: int) -> bytes:
    CALLS.append(f"make{seed}")
    return os.urandom(8) * (n // 8) if n > 8 else b"small"


@durably.entrypoint
def job(n: int, seed: int) -> bytes:
    return make(n, seed) + b"!"


@durably.entrypoint
def broken(seed: int) -> int:
    make(10, seed)
    raise ValueError("broken on purpose")


def _rows(store: durably.DiskStore, run_id: str) -> dict[str, int]:
    """How many rows each journal table holds for the run."""
    with contextlib.closing(sqlite3.connect(store.path / "journal.sqlite3")) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id=?", (run_id,))
                .fetchone()[0]
                for t in ("runs", "steps", "replays", "events", "set_aside", "leases")}


def _inodes(store: durably.DiskStore) -> set[int]:
    folder = store.path / "blobs"
    return {p.stat().st_ino for p in folder.iterdir()} if folder.exists() else set()


def _names(store: durably.DiskStore) -> set[str]:
    folder = store.path / "blobs"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


def test_a_deleted_run_leaves_no_row_and_the_cache_and_other_runs_stay(
        disk_store: durably.DiskStore) -> None:
    CALLS.clear()
    first = job.run(10, 1)
    job.run(10, 1)  # a second attempt: replays journaled
    other = job.run(10, 2)
    assert _rows(disk_store, first.id)["replays"] == 1
    kept = _rows(disk_store, other.id)
    assert disk_store.delete_runs([first.id]) == [first.id]
    assert set(_rows(disk_store, first.id).values()) == {0}
    assert _rows(disk_store, other.id) == kept
    assert durably.get_run(other.id).result == other.result
    with pytest.raises(durably.NotFoundError):
        durably.get_run(first.id)
    # the cache is kept: called again, the run is new and its step a cache hit
    again = job.run(10, 1)
    assert (again.attempt, again.counts()["cached"], CALLS) == (1, 1, ["make1", "make2"])
    assert again.result == first.result
    assert disk_store.delete_runs(["no-such-run", first.id, first.id]) == [first.id]


def test_the_large_values_of_a_deleted_run_are_removed_and_a_forks_are_kept(
        disk_store: durably.DiskStore) -> None:
    """A fork refers to its source's large step results under names of its own (hard links
    to the same files): deleting the source removes its names only, and the fork reads."""
    source = job.run(300_000, 3)
    assert len(_names(disk_store)) == 2  # the step's result and the run's
    fork = durably.fork(source.id)
    assert fork.result == source.result and fork.counts()["replayed"] == 1
    before = _names(disk_store)
    assert len(before) == 4
    assert disk_store.delete_runs([source.id]) == [source.id]
    assert len(_names(disk_store)) == 2 and _names(disk_store) < before
    assert durably.get_run(fork.id).result == source.result
    # the fork resumes (replays its copied step, whose file is still there)
    assert job.run(300_000, 3, run_id=fork.id).result == source.result
    assert disk_store.delete_runs([fork.id]) == [fork.id]
    # the name its first attempt's result had (the second linked the file anew) is kept
    # through the grace: no row referred to it when the fork was deleted
    assert len(_names(disk_store)) == 1
    assert disk_store.collect_blobs(grace=0)[0] == 1
    assert _names(disk_store) == set()


def test_collect_blobs_removes_only_old_files_nothing_refers_to(
        disk_store: durably.DiskStore) -> None:
    run = job.run(300_000, 4)
    folder = disk_store.path / "blobs"
    referred = _names(disk_store)
    old = os.urandom(16).hex()
    young = os.urandom(16).hex()
    (folder / old).write_bytes(b"x" * 1000)
    (folder / young).write_bytes(b"y" * 10)
    (folder / "not-a-blob.txt").write_bytes(b"z")
    past = time.time() - 7200
    os.utime(folder / old, (past, past))
    # (ctime is the time the file last changed: set back through a fresh store's grace)
    assert disk_store.collect_blobs(dry_run=True) == (0, 0)  # ctime is now: both young
    assert disk_store.collect_blobs(grace=0, dry_run=True) == (2, 1010)
    assert _names(disk_store) == referred | {old, young, "not-a-blob.txt"}
    assert disk_store.collect_blobs(grace=0, named=[old]) == (2, 1010)
    assert _names(disk_store) == referred | {"not-a-blob.txt"}
    assert durably.get_run(run.id).result == run.result
    with pytest.raises(ValueError, match="grace"):
        disk_store.collect_blobs(grace=-1)
    assert durably.DiskStore(disk_store.path.parent / "empty").collect_blobs() == (0, 0)


def test_a_young_unreferenced_file_is_kept_unless_named(
        disk_store: durably.DiskStore) -> None:
    """A write under way puts its large value in blobs/ before the row that refers to it
    commits: a file younger than the grace is never removed, unless the caller names it."""
    job.run(300_000, 5)
    name = os.urandom(16).hex()
    (disk_store.path / "blobs" / name).write_bytes(b"pending")
    assert disk_store.collect_blobs() == (0, 0)
    assert disk_store.collect_blobs(named=[name]) == (1, 7)


def test_a_finished_run_called_again_adds_names_not_copies(
        disk_store: durably.DiskStore) -> None:
    """Each call of a finished run with a large result links the stored file under a new
    name (no copy): collect_blobs removes the names left unreferenced."""
    run = job.run(300_000, 6)
    inodes = _inodes(disk_store)
    for _ in range(3):
        assert job.run(300_000, 6).result == run.result
    assert _inodes(disk_store) == inodes
    names = len(_names(disk_store))
    assert names > 2
    assert disk_store.collect_blobs(grace=0) == (names - 2, 0)  # (no space: other names)
    assert len(_names(disk_store)) == 2 and _inodes(disk_store) == inodes
    assert durably.get_run(run.id).result == run.result
    assert job.run(300_000, 6).attempt == 5


def test_the_function_filters_by_age_status_and_entrypoint(
        disk_store: durably.DiskStore) -> None:
    done = job.run(10, 7)
    with pytest.raises(ValueError, match="on purpose"):
        broken(8)
    [failed] = durably.list_runs(broken)
    assert failed.status == "failed"
    assert durably.delete_runs(status="failed", dry_run=True) == [failed.id]
    assert durably.delete_runs(older_than=3600) == []
    assert durably.delete_runs(entrypoint=broken, status=["finished"]) == []
    assert durably.delete_runs([done.id, failed.id], status="failed") == [failed.id]
    assert [r.id for r in durably.list_runs()] == [done.id]
    assert durably.delete_runs(done.id, entrypoint="job", older_than=0) == [done.id]
    assert durably.list_runs() == []


def test_the_function_refuses_unclear_requests(disk_store: durably.DiskStore) -> None:
    job.run(10, 9)
    with pytest.raises(ValueError, match="needs run ids or a filter"):
        durably.delete_runs()
    with pytest.raises(ValueError, match="'done' is not a run status"):
        durably.delete_runs(status="done")
    with pytest.raises(ValueError, match="older_than"):
        durably.delete_runs(older_than=-1)
    with pytest.raises(TypeError, match="takes run ids"):
        disk_store.delete_runs([3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not one id"):
        disk_store.delete_runs("job-1")
    with pytest.raises(TypeError, match="takes run ids"):
        durably.delete_runs(123)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="30 \\* 86400"):
        durably.delete_runs(older_than="30d")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grace"):
        disk_store.collect_blobs(grace="1h")  # type: ignore[arg-type]
    assert durably.delete_runs(older_than=0, store=durably.testing.MemoryStore()) == []
    assert len(durably.list_runs()) == 1


def test_a_run_being_executed_is_refused_by_id_and_left_out_by_a_filter(
        disk_store: durably.DiskStore) -> None:
    started, release = threading.Event(), threading.Event()

    @durably.task
    def wait() -> int:
        started.set()
        assert release.wait(30)
        return 1

    @durably.entrypoint
    def slow() -> int:
        return wait()

    done = job.run(10, 10)
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(slow.run()))
    thread.start()
    try:
        assert started.wait(30)
        [live] = [r.id for r in durably.list_runs() if r.id != done.id]
        with pytest.raises(durably.RunStateError, match="is being executed by process"):
            durably.delete_runs([done.id, live])
        assert len(durably.list_runs()) == 2  # nothing deleted
        assert durably.delete_runs(older_than=0) == [done.id]
    finally:
        release.set()
        thread.join(30)
    assert box[0].status == "finished" and box[0].result == 1
    assert durably.delete_runs(older_than=0) == [live]


def test_an_attempt_replaying_a_run_deleted_meanwhile_stops(
        disk_store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt of an ended run takes its lease at its first write: a run deleted while it
    replayed is not written back half; the attempt raises and the run stays deleted."""
    hooks: list[Any] = []
    fail = {"on": True}

    @durably.task
    def second(x: int) -> int:
        return x * 2

    @durably.entrypoint
    def flow(x: int) -> int:
        a = make(10, x)
        for hook in hooks:
            hook()
        if fail["on"]:
            raise RuntimeError("fails after its first step")
        return second(len(a))

    with pytest.raises(RuntimeError):
        flow(11)
    [run] = durably.list_runs()
    fail["on"] = False
    hooks.append(lambda: durably.delete_runs([run.id]))
    # its first step replays, the run is deleted, then its second step would be the
    # attempt's first write
    with pytest.raises(durably.RunStateError, match="was deleted"):
        flow(11)
    assert durably.list_runs() == []
    hooks.clear()
    assert flow(11) == 16  # a new run


KILLED = """
import os, sys
import durably
from durably._keys import serde as _serde
_serde.SPILL_BYTES = 100_000

@durably.task
def make(n, seed):
    return os.urandom(n)

@durably.entrypoint
def job(n, seed):
    return make(n, seed) + b"!"

if sys.argv[1] == "fill":
    for seed in range(int(sys.argv[2])):
        job(150_000 if seed % 3 == 0 else 10, seed)
    print("filled", flush=True)
else:
    store = durably.DiskStore(os.environ["DURABLY_DIR"])
    print("deleting", flush=True)
    for run in store.list_runs():
        store.delete_runs([run.run_id])
        print("deleted", flush=True)
"""


def test_a_deletion_killed_at_any_moment_leaves_whole_runs(tmp_path: Path) -> None:
    """SIGKILL of a process deleting runs one by one: every run left is whole (its record,
    its steps and its result, large ones included, read back), the journal passes its
    integrity check, and a later deletion removes the rest and their files."""
    script = write_script(tmp_path / "killed.py", KILLED)
    store_dir = tmp_path / "store"
    env = script_env(store_dir)
    subprocess.run([sys.executable, str(script), "fill", "150"], env=env, check=True,
                   timeout=120, capture_output=True)
    store = durably.DiskStore(store_dir)
    try:
        results = {r.run_id: durably.get_run(r.run_id, store=store).result
                   for r in store.list_runs()}
        assert len(results) == 150
        for after in (3, 20, 40):  # (killed as it deletes the next ones)
            with subprocess.Popen([sys.executable, str(script), "delete"], env=env,
                                  stdout=subprocess.PIPE, text=True) as proc:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "deleting"
                for _ in range(after):
                    assert proc.stdout.readline().strip() == "deleted"
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
            with contextlib.closing(sqlite3.connect(store_dir / "journal.sqlite3")) as con:
                assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
                stray = [con.execute(f"SELECT count(*) FROM {t} WHERE run_id NOT IN "
                                     "(SELECT run_id FROM runs)").fetchone()[0]
                         for t in ("steps", "events", "replays", "leases")]
            assert stray == [0, 0, 0, 0]
            assert store.list_runs()  # (killed before the end)
            for rec in store.list_runs():
                assert durably.get_run(rec.run_id, store=store).result == results[rec.run_id]
                assert durably.get_run(rec.run_id, store=store).counts()["ran"] == 1
        left = [r.run_id for r in store.list_runs()]
        assert store.delete_runs(left) == left
        assert store.list_runs() == []
        # files a killed deletion left are young: kept through the grace, then collected
        store.collect_blobs(grace=0)
        assert _names(store) == set()
    finally:
        store.close()


CLI_JOBS = """
import durably

@durably.task
def step(x):
    return x + 1

@durably.entrypoint
def good(x):
    return step(x)

@durably.entrypoint
def bad(x):
    step(x)
    raise ValueError("bad on purpose")
"""


def _cli(*args: str, cwd: Path, store: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["DURABLY_DIR"] = str(store)
    return subprocess.run([str(Path(sys.executable).parent / "durably"), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=60)


def test_the_command_deletes_named_runs_or_those_the_filters_match(tmp_path: Path) -> None:
    write_script(tmp_path / "jobs.py", CLI_JOBS)
    start = write_script(tmp_path / "start.py", """
        import contextlib, jobs
        jobs.good(1); jobs.good(2)
        with contextlib.suppress(ValueError):
            jobs.bad(3)
    """)
    store = tmp_path / "store"
    subprocess.run([sys.executable, str(start)], env=script_env(store), cwd=tmp_path,
                   check=True, timeout=60)
    runs = durably.DiskStore(store).list_runs()
    ids = {r.name: [x.run_id for x in runs if x.name == r.name] for r in runs}
    [bad_id] = ids["bad"]
    usage = _cli("delete", cwd=tmp_path, store=store)
    assert usage.returncode == 2 and "needs RUN ids or a filter" in usage.stderr
    wrong = _cli("delete", "--status", "done", cwd=tmp_path, store=store)
    assert wrong.returncode == 2 and "'done' is not a run status" in wrong.stderr
    ambiguous = _cli("delete", "good-", cwd=tmp_path, store=store)
    assert ambiguous.returncode == 1 and "names 2 runs" in ambiguous.stderr
    dry = _cli("delete", "--status", "failed", "--dry-run", cwd=tmp_path, store=store)
    assert dry.returncode == 0 and dry.stdout.splitlines() == [
        bad_id, "would delete 1 run (dry run)"]
    assert len(durably.DiskStore(store).list_runs()) == 3
    typo = _cli("delete", "--older-than", "0", "-e", "godo", cwd=tmp_path, store=store)
    assert typo.returncode == 1 and "belongs to an entrypoint 'godo'" in typo.stderr
    assert "entrypoints with runs: bad (jobs:bad), good (jobs:good)" in typo.stderr
    listed = _cli("runs", "-e", "godo", cwd=tmp_path, store=store)
    assert listed.returncode == 0 and "no runs of 'godo'" in listed.stdout
    assert "entrypoints with runs: bad (jobs:bad), good (jobs:good)" in listed.stdout
    assert len(durably.DiskStore(store).list_runs()) == 3
    one = _cli("delete", bad_id[:8], cwd=tmp_path, store=store)
    assert one.returncode == 0 and one.stdout.splitlines()[0] == bad_id
    assert "deleted 1 run from" in one.stdout
    assert _cli("delete", "--older-than", "1d", cwd=tmp_path, store=store).stdout.startswith(
        "deleted 0 runs")
    rest = _cli("delete", "--older-than", "0", "-e", "good", cwd=tmp_path, store=store)
    assert rest.returncode == 0 and sorted(rest.stdout.splitlines()[:2]) == sorted(ids["good"])
    assert durably.DiskStore(store).list_runs() == []
    empty = _cli("delete", "-e", "good", "--older-than", "0", cwd=tmp_path, store=store)
    assert empty.returncode == 0 and empty.stdout.startswith("deleted 0 runs")
    gone = _cli("delete", bad_id, cwd=tmp_path, store=store)
    assert gone.returncode == 1 and "no run" in gone.stderr


def test_a_resume_of_a_run_deleted_as_it_starts_says_so(
        disk_store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """resume() checks the run is interrupted, then reads it again under its lease: a run
    deleted between the two raises NotFoundError, and no answer is recorded."""
    @durably.entrypoint
    def asker(x: int) -> Any:
        return durably.interrupt("ok?")

    run = asker.run(1)
    assert run.status == "interrupted"
    real = disk_store.find_run
    calls: list[str] = []

    def find_run(run_id: str) -> Any:
        found = real(run_id)
        if not calls:
            calls.append(run_id)
            durably.delete_runs([run_id])  # (another process, between the two reads)
        return found

    monkeypatch.setattr(disk_store, "find_run", find_run)
    with pytest.raises(durably.NotFoundError, match="was deleted while this resume"):
        asker.resume(run.id, "yes")
    assert calls == [run.id] and real(run.id) is None


ASKING_JOBS = """
import durably

@durably.task
def step(x):
    return x + 1

@durably.entrypoint
def done(x):
    return step(x)

@durably.entrypoint
def asks(x):
    return durably.interrupt({"approve": step(x)})
"""


def test_a_run_waiting_for_an_answer_is_deleted_only_when_asked_for(tmp_path: Path) -> None:
    """`durably delete --older-than 30d` deleted the runs still waiting for a person's
    answer with the finished ones: their questions were lost. The filters leave them unless
    --status interrupted is given (or the run is named)."""
    write_script(tmp_path / "jobs.py", ASKING_JOBS)
    start = write_script(tmp_path / "start.py", """
        import jobs
        jobs.done(1); jobs.done(2)
        assert jobs.asks.run(3).status == "interrupted"
        assert jobs.asks.run(4).status == "interrupted"
    """)
    store = tmp_path / "store"
    subprocess.run([sys.executable, str(start)], env=script_env(store), cwd=tmp_path,
                   check=True, timeout=60)
    runs = {r.run_id: r.status for r in durably.DiskStore(store).list_runs()}
    waiting = sorted(i for i, s in runs.items() if s == "interrupted")
    finished = sorted(i for i, s in runs.items() if s == "finished")
    assert len(waiting) == 2 and len(finished) == 2

    dry = _cli("delete", "--older-than", "0", "--dry-run", cwd=tmp_path, store=store)
    assert dry.returncode == 0 and sorted(dry.stdout.splitlines()[:-1]) == finished
    assert dry.stdout.splitlines()[-1] == (
        "would delete 2 runs (dry run); 2 runs are waiting for an answer (interrupted) and "
        "kept: add --status interrupted to delete them")
    swept = _cli("delete", "--older-than", "0", cwd=tmp_path, store=store)
    assert swept.returncode == 0 and sorted(swept.stdout.splitlines()[:-1]) == finished
    assert "2 runs are waiting for an answer (interrupted) and kept" in swept.stdout
    assert sorted(r.run_id for r in durably.DiskStore(store).list_runs()) == waiting

    # the library too: filters leave them; a run named by id, or status=, deletes them
    disk = durably.DiskStore(store)
    assert durably.delete_runs(older_than=0, store=disk) == []
    assert durably.delete_runs(entrypoint="asks", store=disk) == []
    assert durably.delete_runs([waiting[0]], older_than=0, store=disk) == [waiting[0]]
    disk.close()
    one = _cli("delete", "--older-than", "0", "--status", "interrupted", cwd=tmp_path,
               store=store)
    assert one.returncode == 0 and one.stdout.splitlines()[0] == waiting[1]
    assert "waiting for an answer" not in one.stdout
    assert durably.DiskStore(store).list_runs() == []
