"""Large values: streamed to a file instead of held in memory (above ``_serde.SPILL_BYTES``),
on every store; and a 2 GB return value stored and loaded back with its peak memory measured
in a real subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._keys import serde as _serde
from durably._store.records import RunRecord, StepRecord

from .conftest import script_env, write_script

SMALL_SPILL = 100_000


@pytest.fixture(autouse=True)
def _small_spill(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_serde, "SPILL_BYTES", SMALL_SPILL)


def _value(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(256)) * (n // 256)


def test_a_large_pickle_is_streamed_to_a_file(tmp_path: Path) -> None:
    data = _serde.dumps(_value(500_000), what="x")
    assert isinstance(data, _serde.Spilled) and len(data) > SMALL_SPILL
    assert os.path.getsize(data.path) == data.offset + data.size
    assert _serde.loads(data) == _value(500_000)
    path = data.path
    del data
    assert not os.path.exists(path)  # nobody adopted it: removed with its handle
    assert not isinstance(_serde.dumps(_value(1_000), what="x"), _serde.Spilled)


def test_store_conformance_for_large_values(store: Any) -> None:
    big = _serde.dumps([_value(300_000), "tail"], what="x")
    store.cache_put("big", big)
    store.append_steps([(StepRecord("r", "s", None, "t", "ran", 1, 0, 1.0, 2.0, None, "big"),
                         big)])
    store.put_run(RunRecord("r", "m:ep", "ep", "finished", 1.0, 1.0, 1, "d" * 32, args=big,
                            result=big))
    del big
    for data in (store.cache_get("big"), store.find_step("r", "s"), store.find_run("r").result,
                 store.find_run("r").args, store.list_runs()[0].result):
        assert _serde.loads(data) == [_value(300_000), "tail"]


def test_large_results_in_runs_replay_fork_and_cache(store: Any) -> None:
    calls: list[int] = []

    @durably.task
    def make(seed: int) -> bytes:
        calls.append(seed)
        return _value(400_000, seed)

    @durably.entrypoint
    def job(seed: int) -> bytes:
        first = make(seed)
        second = make(seed + 1)
        return first[:10] + second  # a large run result too

    expected = _value(400_000)[:10] + _value(400_000, 1)
    run = job.run(0)
    assert run.result == expected and calls == [0, 1]
    assert job(0) == expected and calls == [0, 1]  # replayed from the journal
    assert make(1) == _value(400_000, 1) and calls == [0, 1]  # from the cache
    assert durably.get_run(run.id).result == expected
    first = next(cp for cp in run.history() if cp.kind == "step")
    forked = durably.fork(run.id, at=first.id)
    assert forked.result == expected and calls == [0, 1]


def test_a_large_value_is_checked_before_it_is_loaded(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", _serde.dumps(_value(300_000), what="x"))
    [file] = sorted((tmp_path / "s" / "cache").glob("*/*/*.val"))
    with open(file, "r+b") as f:
        f.seek(200_000)
        f.write(b"\xff")
    assert store.cache_get("k") is None
    assert len(list((tmp_path / "s" / "damaged").iterdir())) == 1


BIG = """
import json, os, resource, sys, time
import numpy as np
import durably

@durably.task
def make(n):
    a = np.empty(n // 8)
    a.fill(3.5)
    a[12345] = 42.0
    return a

@durably.task
def blob(n):
    return b"\\x07" * n

@durably.entrypoint
def job(n):
    a = make(n)
    return float(a[12345] + a[-1])

mode, n = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
if mode == "run":
    out = job(n)
elif mode == "cached":
    a = make(n)
    out = float(a[12345] + a[-1])
else:
    b = blob(n)
    out = float(len(b) + b[-1])
seconds = time.perf_counter() - t
print(json.dumps({"out": out, "seconds": seconds,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


@pytest.mark.slow
def test_a_2_gb_value_is_stored_and_loaded_without_being_held_twice(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each process holds the value once (about 2 GB) plus the interpreter; storing and
    loading stream through files. The figures are printed."""
    free = shutil.disk_usage(tmp_path).free
    size = 2_000_000_000
    if free < 3 * size:  # the value is written once (cache and journal share its file)
        size = max(200_000_000, (free // 3) // 8 * 8)
    script = write_script(tmp_path / "big.py", BIG)
    env = script_env(tmp_path / "store")
    figures = []
    for mode, what in (("run", "compute + store (in a run)"), ("run", "replay from journal"),
                       ("cached", "load from the cache"), ("bytes", "bytes: compute + store"),
                       ("bytes", "bytes: load from the cache")):
        t = time.perf_counter()
        done = subprocess.run([sys.executable, str(script), mode, str(size)], env=env,
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        found = json.loads(done.stdout.strip().splitlines()[-1])
        found["wall"] = time.perf_counter() - t
        figures.append((what, found))
        expected = 45.5 if mode != "bytes" else size + 7
        assert found["out"] == expected
        # never twice: the value once, plus the interpreter and numpy (well under 0.3x)
        assert found["peak_rss"] < 1.3 * size, (what, found)
    with capsys.disabled():
        print(f"\nlarge value: {size / 1e9:.2f} GB (disk free {free / 1e9:.0f} GB)")
        for what, f in figures:
            print(f"  {what:<28} {f['seconds']:6.2f} s   peak RSS {f['peak_rss'] / 1e9:5.2f} GB "
                  f"({f['peak_rss'] / size:.2f}x the value)")
    files = [p for p in (tmp_path / "store").rglob("*") if p.is_file() and p.stat().st_size > size]
    assert len({p.stat().st_ino for p in files}) == 2  # the array's file (cache + journal), bytes


def test_a_cache_value_replaced_while_read_is_still_journaled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process overwrote the entry between this one opening its file and pinning it
    (the cache's name is gone): the value read is kept by a private copy, so the run that
    journals it (a hard link to it in blobs/) does not fail with ENOENT."""
    from durably._store.disk import blobs as _blobs

    store = durably.DiskStore(tmp_path / "s")
    durably.configure(store=store)

    @durably.task
    def make() -> bytes:
        return b"v" * (SMALL_SPILL * 3)

    @durably.entrypoint
    def pipeline() -> int:
        return len(make())

    make()  # the cache holds it, in a file
    real_link = os.link
    removed: list[str] = []

    def link(src: Any, dst: Any) -> None:
        if not removed and str(src).endswith(".val"):
            os.unlink(src)  # the other process's overwrite removes the old file now
            removed.append(str(src))
        real_link(src, dst)

    monkeypatch.setattr(_blobs.os, "link", link)
    run = pipeline.run()
    assert removed and run.result == SMALL_SPILL * 3 and run.counts()["cached"] == 1
    monkeypatch.setattr(_blobs.os, "link", real_link)
    (step,) = run.records()
    assert store.find_step(run.id, step.step_id) is not None  # journaled, readable
    assert pipeline.run(run_id=run.id).counts()["replayed"] == 1
    assert not list((tmp_path / "s" / "tmp").glob("hold-*"))  # the private copy went


CALLS = {"n": 0}  # calls of the entrypoints below (a result that differs at each call)
HOOKS: list[Any] = []  # called by tagged() after its step


@durably.task
def made(seed: int) -> bytes:
    return _value(300_000, seed)


@durably.entrypoint
def built(seed: int) -> bytes:
    return made(seed) + b"!"  # pickled again at each call: a new spill file every time


@durably.task(cache=False)
def noted(count: int) -> int:
    return count


@durably.entrypoint
def stamped(seed: int) -> bytes:
    """built, executing a step at every call (a side effect on new inputs)."""
    CALLS["n"] += 1
    noted(CALLS["n"])
    return made(seed) + b"!"


@durably.entrypoint
def tagged(seed: int) -> bytes:
    CALLS["n"] += 1
    mine = CALLS["n"]
    data = made(seed)
    for hook in HOOKS:
        hook()
    return data + bytes([mine])  # (differs from the stored result at every call)


def _blob_files(store: durably.DiskStore) -> set[str]:
    folder = store.path / "blobs"
    return {p.name for p in folder.iterdir()} if folder.exists() else set()


def _blob_inodes(store: durably.DiskStore) -> set[int]:
    """The files in blobs/, whatever their names (hard links to one file: one)."""
    folder = store.path / "blobs"
    return {p.stat().st_ino for p in folder.iterdir()} if folder.exists() else set()


def _result_blob(store: durably.DiskStore, run_id: str) -> Path:
    """The file in blobs/ the run's stored result refers to."""
    import sqlite3

    from durably._store.disk.blobs import BLOB_REF
    from durably._store.integrity import open_seal

    with contextlib.closing(sqlite3.connect(store.path / "journal.sqlite3")) as con:
        (data,) = con.execute("SELECT result FROM runs WHERE run_id=?", (run_id,)).fetchone()
    payload, _ = open_seal(data)
    assert payload is not None and payload.startswith(BLOB_REF)
    return store.path / "blobs" / json.loads(payload[len(BLOB_REF):])["blob"]


@pytest.mark.parametrize("key", [None, b"k" * 16 + b"-a-test-signing-key"])
@pytest.mark.parametrize("entry", ["replays", "executes"])
def test_calls_of_a_finished_run_keep_one_copy_of_its_large_result(
        tmp_path: Path, key: bytes | None, entry: str) -> None:
    """Every call of a finished run journals its final record again: a large result the same
    as the stored one refers to the file the journal has (a new name linked to it, which no
    collection of blobs/ can race), instead of adding a copy to blobs/ at every call (a
    notebook cell run again and again); also when the call executes a step (its start then
    journals the run as running, without its result). The names left unreferenced take no
    space and are collected."""
    store = durably.DiskStore(tmp_path / "s", key=key)
    durably.configure(store=store)
    CALLS["n"] = 0
    job = built if entry == "replays" else stamped
    expected = _value(300_000, 1) + b"!"
    run = job.run(1)
    assert run.result == expected
    files = _blob_inodes(store)
    assert len(files) == 2  # the step's result and the run's
    for attempt in (2, 3, 4):
        again = job.run(1)
        assert (again.result, again.attempt, again.counts()["replayed"]) == (
            expected, attempt, 1)
        assert again.counts()["ran"] == (entry == "executes")
        assert _blob_inodes(store) == files
    assert len(_blob_files(store)) == 5
    assert store.collect_blobs(grace=0) == (3, 0)
    assert len(_blob_files(store)) == 2 and _blob_inodes(store) == files
    assert durably.get_run(run.id).result == expected
    assert durably.DiskStore(tmp_path / "s", key=key).find_run(run.id).status == "finished"


def test_a_damaged_copy_of_a_large_result_is_not_kept_for_the_next_call(
        tmp_path: Path) -> None:
    """The stored result is compared byte for byte, not by its digest: a file in blobs/
    damaged since (its length unchanged) is not referred to again; the next call writes a
    sound copy, and the run's result reads back."""
    store = durably.DiskStore(tmp_path / "s")
    durably.configure(store=store)
    expected = _value(300_000, 2) + b"!"
    run = built.run(2)
    damaged = _result_blob(store, run.id)
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    assert built(2) == expected
    assert _result_blob(store, run.id) != damaged
    assert durably.get_run(run.id).result == expected


def test_a_large_result_of_a_refused_attempt_leaves_no_file_behind(tmp_path: Path) -> None:
    """An attempt that only replayed, refused at its end because another one finished the
    run meanwhile, had written its large result to blobs/ before the transaction that was
    refused: the file is removed (no journal refers to it), the other attempt's stays."""
    import threading

    store = durably.DiskStore(tmp_path / "s")
    durably.configure(store=store)
    CALLS["n"] = 0
    HOOKS.clear()
    tagged.run(3, run_id="t")

    def other() -> None:
        HOOKS.clear()
        assert tagged.run(3, run_id="t").status == "finished"

    def in_thread() -> None:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(30)

    HOOKS.append(in_thread)
    try:
        run = tagged.run(3, run_id="t")
    finally:
        HOOKS.clear()
    assert run.result == _value(300_000, 3) + bytes([2])  # this call's, not journaled
    assert store.find_run("t").attempt == 2  # the other attempt's record stands
    assert durably.get_run("t").result == _value(300_000, 3) + bytes([3])
    # the step's file, the first attempt's result and the other attempt's: no other
    assert len(_blob_files(store)) == 3
    assert _result_blob(store, "t").name in _blob_files(store)


def test_a_missing_file_of_a_stored_result_is_said_to_be_missing(tmp_path: Path) -> None:
    """The file in blobs/ a finished run's result refers to was deleted: loading the result
    says so, naming the file and the fix (not that its type's code is not loaded); the
    rerun the fix names stores it again."""
    from durably.exceptions import CorruptJournalError

    durably.configure(store=durably.DiskStore(tmp_path / "s"))
    expected = _value(300_000, 4) + b"!"
    run = built.run(4)
    gone = _result_blob(durably.DiskStore(tmp_path / "s"), run.id)
    gone.unlink()
    with pytest.raises(CorruptJournalError, match="is missing") as caught:
        _ = durably.get_run(run.id).result
    assert str(gone) in str(caught.value) and "rerun the entrypoint" in str(caught.value)
    assert built(4) == expected
    assert durably.get_run(run.id).result == expected
