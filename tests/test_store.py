"""One conformance suite that every Store implementation passes, plus DiskStore specifics."""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import durably
from durably._store.disk.store import STORE_FORMAT
from durably._store.integrity import seal, unseal
from durably._store.records import RunRecord, StepRecord
from durably.testing import MemoryStore

from .conftest import run_script, script_env, write_script


def _run(run_id: str, entrypoint: str = "m:ep", digest: str = "d" * 32, **kw: Any) -> RunRecord:
    t = kw.pop("updated", time.time())
    return RunRecord(run_id=run_id, entrypoint=entrypoint, name=entrypoint.rpartition(":")[2],
                     status=kw.pop("status", "running"), created=t, updated=t,
                     attempt=kw.pop("attempt", 1), input_digest=digest, **kw)


def _step(run_id: str, step_id: str, status: str, position: int, attempt: int = 1
          ) -> StepRecord:
    return StepRecord(run_id, step_id, None, "t", status, attempt, position, 1.0, 2.0, None, "k")


# -- conformance -------------------------------------------------------------------------------
def test_is_a_store(store: Any) -> None:
    assert isinstance(store, durably.Store)


def test_cache_round_trip(store: Any) -> None:
    assert store.cache_get("missing") is None
    store.cache_put("k1", b"")
    store.cache_put("k2", b"\x00" * 100_000)
    assert store.cache_get("k1") == b""
    assert store.cache_get("k2") == b"\x00" * 100_000
    store.cache_put("k1", b"new")
    assert store.cache_get("k1") == b"new"


def test_runs_round_trip_and_order(store: Any) -> None:
    assert store.find_run("r1") is None
    store.put_run(_run("r1", updated=100.0))
    store.put_run(_run("r2", entrypoint="m:other", updated=200.0))
    store.put_run(_run("r3", updated=300.0, digest="e" * 32))
    assert [r.run_id for r in store.list_runs()] == ["r3", "r2", "r1"]
    assert [r.run_id for r in store.list_runs("m:ep")] == ["r3", "r1"]
    assert [r.run_id for r in store.list_runs("ep")] == ["r3", "r1"]  # by name too
    assert store.find_latest_run("m:ep", "d" * 32).run_id == "r1"
    assert store.find_latest_run("m:ep", "f" * 32) is None
    rec = store.find_run("r1")
    rec.status, rec.updated, rec.result = "finished", 400.0, b"res"
    store.put_run(rec)
    again = store.find_run("r1")
    assert (again.status, again.result) == ("finished", b"res")
    assert [r.run_id for r in store.list_runs()] == ["r1", "r3", "r2"]


def test_steps_finished_lookup_and_order(store: Any) -> None:
    store.append_steps([(_step("r", "a", "ran", 0), b"A")])
    store.append_steps([(_step("r", "b", "failed", 1), None),
                        (_step("r", "c", "cached", 2), b"C")])
    assert store.find_step("r", "a") == b"A"
    assert store.find_step("r", "b") is None  # a failed step is not a result
    assert store.find_step("r", "c") == b"C"
    assert store.find_step("other", "a") is None
    store.append_steps([(_step("r", "c", "replayed", 0, attempt=2), None),
                        (_step("r", "b", "ran", 1, attempt=2), b"B")])
    assert store.find_step("r", "b") == b"B"
    assert [(s.step_id, s.status) for s in store.list_steps("r", attempt=2)] == [
        ("c", "replayed"), ("b", "ran")]
    assert [s.attempt for s in store.list_steps("r")] == [1, 1, 1, 2, 2]
    assert store.list_steps("none") == []


# -- DiskStore ---------------------------------------------------------------------------------
def test_seal_detects_damage() -> None:
    sealed = seal(b"payload")
    assert unseal(sealed) == b"payload"
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    assert unseal(bytes(flipped)) is None
    assert unseal(sealed[:5]) is None
    assert unseal(b"") is None


def test_disk_store_is_lazy_private_and_marked(tmp_path: Path) -> None:
    root = tmp_path / "lazy"
    s = durably.DiskStore(root)
    assert not root.exists()
    s.cache_put("k", b"v")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert (root / "FORMAT").read_text().strip() == f"durably-store {STORE_FORMAT}"
    s.close()
    assert durably.DiskStore(root).cache_get("k") == b"v"


def test_damaged_cache_entry_is_a_miss_with_a_warning(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    s = durably.DiskStore(tmp_path / "s")
    s.cache_put("k", b"v" * 10)
    s.cache.set("k", b"garbage")  # what a bit flip or a torn write leaves behind
    with caplog.at_level(logging.WARNING, logger="durably"):
        assert s.cache_get("k") is None
    assert "damaged" in caplog.text and "k" in caplog.text


def test_store_path_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(durably.StoreError, match="is a file") as info:
        durably.DiskStore(f).cache_get("k")
    assert str(f) in str(info.value)


def test_store_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "future"
    root.mkdir()
    (root / "FORMAT").write_text(f"durably-store {STORE_FORMAT + 1}\n")
    with pytest.raises(durably.StoreError, match="newer durably"):
        durably.DiskStore(root).cache_get("k")


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "disk is full"),
        (OSError(errno.EACCES, "Permission denied"), "not writable"),
        (sqlite3.OperationalError("attempt to write a readonly database"), "not writable"),
        (sqlite3.OperationalError("database or disk is full"), "disk is full"),
    ],
)
def test_write_faults_become_store_errors_naming_path_and_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, hint: str) -> None:
    s = durably.DiskStore(tmp_path / "s")
    s.cache_put("ok", b"v")
    s.put_run(_run("r"))

    def fail(*args: Any, **kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(s.cache, "set", fail)
    with pytest.raises(durably.StoreError, match=hint) as info:
        s.cache_put("k", b"v")
    assert str(tmp_path / "s") in str(info.value)
    monkeypatch.undo()
    assert s.cache_get("ok") == b"v" and s.cache_get("k") is None
    assert s.find_run("r") is not None


def test_size_limit_evicts_loudly_and_never_touches_journals(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = durably.DiskStore(tmp_path / "s", size_limit=200_000)
    s.put_run(_run("keep"))
    s.append_steps([(_step("keep", "a", "ran", 0), b"x" * 50_000)])
    with caplog.at_level(logging.WARNING, logger="durably"):
        for i in range(100):
            s.cache_put(f"k{i}", b"y" * 5_000)
    assert s.evicted > 0 and s.stats()["evicted"] == s.evicted
    # said once as a warning (the limit is the user's: its work is no alarm), then at INFO
    warned = [r for r in caplog.records if "over its size limit" in r.getMessage()]
    assert len(warned) == 1 and "later evictions are logged at INFO" in warned[0].getMessage()
    assert s.cache.volume() <= 200_000
    # least recently stored go first
    assert s.cache_get("k99") is not None and s.cache_get("k0") is None
    assert s.find_step("keep", "a") == b"x" * 50_000


def test_a_size_limit_evicts_only_what_it_must_never_the_entry_just_written(
        tmp_path: Path) -> None:
    """Ten entries of a megabyte in a cache limited to ten megabytes: the oldest one goes,
    not all ten (diskcache's cull removes ten at a time, the entry just computed among
    them: a user's next call computed it again); an entry larger than the limit by itself
    is kept (over the limit) rather than removed as it is written."""
    s = durably.DiskStore(tmp_path / "s", size_limit=10_000_000)
    for i in range(10):
        s.cache_put(f"k{i}", bytes([i]) * 1_000_000)
    assert s.cache_get("k9") is not None and s.cache_get("k0") is None
    assert 8 <= s.stats()["cache_entries"] <= 9
    assert s.cache.volume() <= 10_000_000
    small = durably.DiskStore(tmp_path / "t", size_limit=500_000)
    small.cache_put("first", b"a" * 100_000)
    small.cache_put("huge", b"b" * 2_000_000)
    assert small.cache_get("huge") == b"b" * 2_000_000 and small.cache_get("first") is None


def test_no_size_limit_never_evicts(tmp_path: Path) -> None:
    s = durably.DiskStore(tmp_path / "s")
    for i in range(30):
        s.cache_put(f"k{i}", b"z" * 40_000)
    assert all(s.cache_get(f"k{i}") is not None for i in range(30))
    assert s.evicted == 0


def test_durably_dir_selects_the_default_store(tmp_path: Path) -> None:
    script = write_script(tmp_path / "p.py", """
        import durably

        @durably.task
        def f(x):
            return x + 1

        print(f(1))
    """)
    env = script_env(tmp_path / "chosen")
    assert run_script(script, env).stdout.strip() == "2"
    assert (tmp_path / "chosen" / "FORMAT").exists()
    assert not (tmp_path / ".durably").exists()
    del env["DURABLY_DIR"]
    run_script(script, env)
    assert (tmp_path / ".durably" / "FORMAT").exists()


def test_memory_store_is_independent() -> None:
    a, b = MemoryStore(), MemoryStore()
    a.cache_put("k", b"v")
    assert b.cache_get("k") is None


# -- leases ------------------------------------------------------------------------------------
def test_lease_is_exclusive_while_the_owner_lives(store: Any) -> None:

    from durably._store.lease import hold, let_go, me

    a, b = me(), me()
    hold(a)  # attempts of this process executing runs (a lease no attempt holds is taken over)
    hold(b)
    try:
        _exclusive(store, a, b)
    finally:
        let_go(a)
        let_go(b)


def _exclusive(store: Any, a: Any, b: Any) -> None:
    import dataclasses as dc

    from durably._store.lease import me

    assert store.run_holder("r") is None  # never leased
    assert store.acquire_run("r", a) is None
    assert store.run_holder("r").token == a.token  # held by a live attempt
    assert store.acquire_run("r", a) is None  # the owner may take it again
    holder = store.acquire_run("r", b)
    assert holder is not None and holder.token == a.token and holder.pid == os.getpid()
    assert store.renew_run("r", a) is True
    assert store.renew_run("r", b) is False  # b holds no lease of the run
    assert store.release_run("r", b) is False  # not b's to release
    assert store.acquire_run("r", b) is not None
    assert store.release_run("r", a) is True
    assert store.release_run("r", a) is False  # (released already)
    assert store.run_holder("r") is None
    assert store.acquire_run("r", b) is None
    # an owner whose process is gone is taken over, and holds nothing meanwhile
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    ghost = dc.replace(me(), pid=int(dead.stdout), started=None)
    assert store.acquire_run("g", ghost) is None
    assert store.run_holder("g") is None
    assert store.acquire_run("g", a) is None
    assert store.run_holder("g").token == a.token
    left = me()  # a lease of this process that no attempt holds: a leftover (not held)
    assert store.acquire_run("x", left) is None
    assert store.run_holder("x") is None


def test_a_lease_renewal_never_creates_a_deleted_journal(tmp_path: Path) -> None:
    from durably._store.lease import me

    store = durably.DiskStore(tmp_path / "s")
    owner = me()
    assert store.acquire_run("r", owner) is None
    store.renew_run_apart("r", owner)  # (its own connection, closed after)
    store.close()
    for extra in ("", "-wal", "-shm"):
        (store.path / f"journal.sqlite3{extra}").unlink(missing_ok=True)
    store._root = store.path  # (as an open store whose journal was deleted under it)
    with pytest.raises(sqlite3.Error):
        store.renew_run_apart("r", owner)
    assert not (store.path / "journal.sqlite3").exists()


# -- sealing with a key, temporary files -------------------------------------------------------
def test_a_signed_seal_rejects_tampering_other_keys_and_other_slots() -> None:
    from durably._store.integrity import (
        DAMAGED,
        FORGED,
        OTHER_KEY,
        UNSIGNED,
        SigningKey,
        open_seal,
    )

    key, other = SigningKey(b"a" * 32, "a"), SigningKey(b"b" * 32, "b")
    for payload in (b"payload", os.urandom(5000)):  # keyed BLAKE2b, then HMAC-SHA256
        sealed = seal(payload, key, b"slot-1")
        assert open_seal(sealed, key, b"slot-1") == (payload, "")
        assert open_seal(sealed, key, b"slot-2") == (None, FORGED)  # moved to another slot
        assert open_seal(sealed, other, b"slot-1") == (None, OTHER_KEY)
        assert open_seal(sealed) == (payload, "")  # no key: the checksum alone
        assert open_seal(seal(payload), key) == (None, UNSIGNED)
        flipped = bytearray(sealed)
        flipped[-1] ^= 1
        assert open_seal(bytes(flipped), key, b"slot-1") == (None, DAMAGED)


def test_temporary_files_of_dead_processes_are_removed_when_the_store_opens(
        tmp_path: Path) -> None:
    from durably._keys.serde import host_tag

    root = tmp_path / "s"
    store = durably.DiskStore(root)
    store.cache_put("k", b"v")
    store.close()
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout)
    (root / "tmp").mkdir(exist_ok=True)
    stale = root / "tmp" / f"spill-{dead}-{host_tag()}-abc.tmp"
    mine = root / "tmp" / f"spill-{os.getpid()}-{host_tag()}-abc.tmp"
    elsewhere = root / "tmp" / f"spill-{dead}-00000000-abc.tmp"  # another host's process
    for f in (stale, mine, elsewhere):
        f.write_bytes(b"partial")
    assert durably.DiskStore(root).cache_get("k") == b"v"
    assert not stale.exists() and mine.exists() and elsewhere.exists()


# -- value-file folders shared by processes ----------------------------------------------------
def _value_files(root: Path) -> list[Path]:
    return [p for p in (root / "cache").rglob("*.val")]


def test_overwriting_a_value_file_keeps_its_folders(tmp_path: Path) -> None:
    """diskcache removed emptied folders (``os.removedirs``), racing with another process
    creating the same folder for its own value file (ENOENT mid-write, seen with 8 writers)."""
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"a" * 100_000)
    (first,) = _value_files(tmp_path / "s")
    store.cache_put("k", b"b" * 100_000)  # replaces the entry; the old value file goes
    assert not first.exists()
    assert first.parent.is_dir() and first.parent.parent.is_dir()
    assert store.cache_get("k") == b"b" * 100_000


def test_a_folder_removed_between_makedirs_and_write_is_made_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from durably._store.disk import blobs as _blobs

    real = _blobs._write_new
    removed: list[str] = []

    def racing_write(path: str, data: bytes) -> None:
        if not removed:  # another process empties and removes the folder just now
            folder = os.path.dirname(path)
            shutil.rmtree(os.path.dirname(folder))
            removed.append(folder)
        real(path, data)

    monkeypatch.setattr(_blobs, "_write_new", racing_write)
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"c" * 100_000)
    assert removed and os.path.isdir(removed[0])
    assert store.cache_get("k") == b"c" * 100_000


# -- cache values kept in memory once read -----------------------------------------------------
def _count_disk_reads(store: durably.DiskStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys the store reads from its cache's SQLite index from now on."""
    from durably._store.disk import cache as _cache_module

    reads: list[str] = []
    real = _cache_module._cache_fetch

    def fetch(cache: Any, con: Any, key: str) -> Any:
        reads.append(key)
        return real(cache, con, key)

    monkeypatch.setattr(_cache_module, "_cache_fetch", fetch)
    return reads


def test_a_repeated_hit_is_served_from_memory(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"small")
    reads = _count_disk_reads(store, monkeypatch)
    assert [store.cache_get("k") for _ in range(5)] == [b"small"] * 5
    assert reads == ["k"]
    store.cache_put("k", b"replaced")  # a write by this store drops what it kept
    assert store.cache_get("k") == b"replaced" and reads == ["k", "k"]


def test_memo_entries_zero_reads_every_hit_from_disk(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store = durably.DiskStore(tmp_path / "s", memo_entries=0)
    store.cache_put("k", b"v")
    reads = _count_disk_reads(store, monkeypatch)
    assert [store.cache_get("k") for _ in range(3)] == [b"v"] * 3 and reads == ["k"] * 3


def test_memory_holds_small_values_only_and_a_bounded_number(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = durably.DiskStore(tmp_path / "s", memo_entries=3)
    big = b"x" * (64 * 1024 + 1)
    store.cache_put("big", big)
    for i in range(5):
        store.cache_put(f"k{i}", bytes([i]))
    reads = _count_disk_reads(store, monkeypatch)
    for key in ("big", "k0", "k1", "k2", "k3", "k4"):
        store.cache_get(key)
    reads.clear()
    for key in ("k4", "k3", "k2", "big", "k0"):
        assert store.cache_get(key) is not None
    assert reads == ["big", "k0"]  # too large; the oldest fell out


def test_another_connection_clearing_the_cache_is_seen(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"v")
    assert store.cache_get("k") == b"v" and store.cache_get("k") == b"v"  # now in memory
    other = durably.DiskStore(tmp_path / "s")  # its own connection, as another process has
    other.cache.clear()
    other.close()
    time.sleep(0.2)  # another connection's writes are looked for every 0.05 s
    assert store.cache_get("k") is None


def test_a_cache_cleared_by_the_cli_in_another_process_is_recomputed(tmp_path: Path) -> None:
    calls: list[int] = []
    durably.configure(store=durably.DiskStore(tmp_path / "s"))

    @durably.task
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert [square(3), square(3), square(3)] == [9, 9, 9] and calls == [3]
    subprocess.run([sys.executable, "-m", "durably", "cache", "clear"],
                   env=script_env(tmp_path / "s"), check=True, capture_output=True,
                   timeout=120)
    assert square(3) == 9 and calls == [3, 3]


def test_clear_and_prune_in_this_process_drop_what_memory_holds(tmp_path: Path) -> None:
    from durably._store.disk.maintenance import clear, prune

    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("a", b"1")
    store.cache_put("b", b"2")
    assert store.cache_get("a") == b"1" and store.cache_get("b") == b"2"
    assert store.cache_get("a") == b"1" and store.cache_get("b") == b"2"  # from memory
    assert prune(store, older_than=0) == 2
    assert store.cache_get("a") is None and store.cache_get("b") is None
    store.cache_put("a", b"1")
    assert store.cache_get("a") == b"1" and store.cache_get("a") == b"1"
    assert clear(store) == 1 and store.cache_get("a") is None


def test_a_new_signing_key_drops_what_memory_holds(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"unsigned")
    assert store.cache_get("k") == b"unsigned" and store.cache_get("k") == b"unsigned"
    try:
        durably.configure(key=b"k" * 32)
        assert store.cache_get("k") is None  # not signed with the new key: never loaded
    finally:
        durably.configure(key=None)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_memo_entries_must_be_a_count(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="memo_entries"):
        durably.DiskStore(tmp_path, memo_entries=bad)


def test_a_batch_of_new_existing_and_large_values_round_trips(tmp_path: Path) -> None:
    """cache_put_many inserts new small values in one statement and leaves the rest to
    diskcache's set; the cache must read as if every item had been set one by one."""
    store = durably.DiskStore(tmp_path / "s")
    big = b"L" * 200_000  # kept in a file
    store.cache_put("old", b"before")
    store.cache_put("old_big", big)
    items = [(f"k{i}", bytes([i]) * 10, None) for i in range(50)]
    items += [("old", b"after", None), ("old_big", b"small now", None), ("big", big, None),
              ("k3", b"last value wins", None)]
    store.cache_put_many(items)
    assert store.cache_get("k0") == b"\x00" * 10 and store.cache_get("k49") == b"1" * 10
    assert store.cache_get("k3") == b"last value wins"
    assert store.cache_get("old") == b"after" and store.cache_get("old_big") == b"small now"
    assert store.cache_get("big") == big
    cache = store.cache
    assert len(cache) == 53
    import warnings

    from diskcache.core import EmptyDirWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmptyDirWarning)  # folders are kept on purpose
        problems = cache.check()  # diskcache's own consistency check: counts, sizes, files
    assert [w for w in problems if w.category is not EmptyDirWarning] == []
    assert len(list((tmp_path / "s" / "cache").rglob("*.val"))) == 1  # old_big's file went


def test_threads_opening_a_new_journal_at_once_all_succeed(tmp_path: Path) -> None:
    """Each thread has its own journal connection; the first ones write the JOURNAL marker
    together (they shared one temporary file name: ENOENT for all but one)."""
    import threading

    for round_ in range(10):
        store = durably.DiskStore(tmp_path / f"s{round_}")
        store.path_checked()
        (tmp_path / f"s{round_}" / "JOURNAL").unlink(missing_ok=True)
        store.close()
        store = durably.DiskStore(tmp_path / f"s{round_}")
        store._open()
        barrier = threading.Barrier(8)
        errors: list[BaseException] = []

        def open_journal(store: durably.DiskStore = store, barrier: threading.Barrier = barrier,
                         errors: list[BaseException] = errors) -> None:
            barrier.wait()
            try:
                store.list_runs()
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)

        threads = [threading.Thread(target=open_journal) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert (tmp_path / f"s{round_}" / "JOURNAL").exists()
        assert not list((tmp_path / f"s{round_}").glob("*.tmp"))
        store.close()


def test_writes_through_the_diskcache_object_are_seen_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """store.cache is diskcache itself: a clear through it, on the thread whose hits are in
    memory, is seen like another process's (the store watches with a connection of its own)."""
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"v")
    assert store.cache_get("k") == b"v" and store.cache_get("k") == b"v"
    store.cache.clear()
    time.sleep(0.2)  # looked for every 0.05 s
    assert store.cache_get("k") is None


def test_a_value_read_before_a_clear_is_not_remembered_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread reads K, another clears the cache (and drops what memory holds), then the
    first would remember K: it must not, or the clearing thread would be served K."""
    from durably._store.disk import cache as _cache_module

    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"v")
    real = _cache_module._cache_fetch

    def get_then_cleared(cache: Any, con: Any, key: str) -> Any:
        found = real(cache, con, key)
        store.forget_memo()  # what the clear does once it committed
        return found

    monkeypatch.setattr(_cache_module, "_cache_fetch", get_then_cleared)
    assert store.cache_get("k") == b"v"  # read before the clear: returned, not remembered
    monkeypatch.setattr(_cache_module, "_cache_fetch", real)
    reads = _count_disk_reads(store, monkeypatch)
    store.cache_get("k")
    assert reads == ["k"]


def test_values_kept_in_a_file_up_to_64_kib_are_kept_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"m" * 40_000)  # diskcache keeps it in a file (over 32 KiB)
    store.cache_get("k")
    reads = _count_disk_reads(store, monkeypatch)
    assert store.cache_get("k") == b"m" * 40_000 and reads == []


def test_new_threads_do_not_empty_what_memory_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"v")
    store.cache_get("k")
    reads = _count_disk_reads(store, monkeypatch)
    got: list[bytes | None] = []
    for _ in range(5):
        t = threading.Thread(target=lambda: got.append(store.cache_get("k")))
        t.start()
        t.join()
    assert got == [b"v"] * 5 and reads == []


def test_process_workers_get_the_callers_memo_entries(tmp_path: Path) -> None:
    from durably._executors import worker as _worker
    from durably._runtime import config as _config

    where = list(_worker._describe_store(durably.DiskStore(tmp_path / "s", memo_entries=0)))
    where[1] = ("another-host", 1)  # as a worker process sees it
    _worker._use_store(tuple(where))
    try:
        store = _config.default_store()
        assert isinstance(store, durably.DiskStore) and store.memo_entries == 0
    finally:
        _worker._worker_store = None


def test_an_index_row_with_text_that_is_not_utf8_is_a_miss(tmp_path: Path) -> None:
    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"v")
    store.cache._sql("UPDATE Cache SET value = CAST(X'FFFE00' AS TEXT), mode = 1 "
                     "WHERE key = 'k'")
    assert store.cache_get("k") is None
    assert list((tmp_path / "s" / "damaged").iterdir())


def test_a_process_creating_the_journal_meanwhile_is_not_a_lost_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes open a new store at once: the second read user_version 0, then saw the
    JOURNAL marker the first wrote after creating the schema, and refused the journal as
    lost (seen under load in test_identical_concurrent_calls_may_compute_twice)."""
    first = durably.DiskStore(tmp_path / "s")
    second = durably.DiskStore(tmp_path / "s")
    first._open()
    second._open()
    real_exists = Path.exists
    raced: list[bool] = []

    def exists(self: Path, *args: Any, **kwargs: Any) -> bool:
        if self.name == "JOURNAL" and not raced:
            raced.append(True)
            first.list_runs()  # the other process creates the journal (and marker) now
        return real_exists(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", exists)
    assert second.list_runs() == [] and raced
    first.close()
    second.close()


def test_switching_a_new_journal_to_wal_waits_while_it_is_locked() -> None:
    """SQLite answers "database is locked" at once (no busy timeout) when several
    connections open one new journal together; durably waits as diskcache does."""
    from durably._store.disk.store import _wal_mode

    class Busy:
        def __init__(self, times: int, text: str = "database is locked") -> None:
            self.left, self.text, self.calls = times, text, 0

        def execute(self, sql: str) -> None:
            self.calls += 1
            if self.left:
                self.left -= 1
                raise sqlite3.OperationalError(self.text)

    con = Busy(3)
    _wal_mode(con)  # type: ignore[arg-type]
    assert con.calls == 4
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _wal_mode(Busy(10**6), seconds=0.05)  # type: ignore[arg-type]
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        _wal_mode(Busy(1, "disk I/O error"))  # type: ignore[arg-type]


@given(st.dictionaries(st.text(), st.text()) | st.dictionaries(st.text(), st.integers()))
def test_key_records_write_the_json_that_json_dumps_writes(d: dict[str, Any]) -> None:
    """The keys table's inputs and parts are written without building a JSON encoder per
    call; the text is json.dumps(sort_keys=True)'s, so explain reads rows of every version."""
    import json

    from durably._store.disk.rows import _sorted_json

    assert _sorted_json(d) == json.dumps(d, sort_keys=True)


def test_a_size_limit_below_the_cache_s_own_files_is_refused_not_a_wipe(
        tmp_path: Path) -> None:
    """prune(max_size=...) below what the cache takes with no entry (its SQLite index) could
    never be reached: every entry was removed and nothing shrank. It is refused, naming that
    size; 0 still removes every entry, and a reachable limit keeps the newest."""
    from durably._store.disk.maintenance import prune

    store = durably.DiskStore(tmp_path / "s")
    for i in range(12):
        store.cache_put(f"k{i}", b"x" * 17)
    with pytest.raises(ValueError, match="below what the cache takes with no entry"):
        prune(store, max_size=1_000)
    assert all(store.cache_get(f"k{i}") is not None for i in range(12))  # nothing removed
    volume = int(store.cache.volume())
    big = b"y" * 100_000
    store.cache_put("big-old", big)
    store.cache_put("big-new", big)
    assert prune(store, max_size=volume + 150_000) >= 1  # the oldest first, until it fits
    assert store.cache_get("big-new") == big
    assert prune(store, max_size=0) > 0 and store.cache_get("big-new") is None
    # a limit above the empty index, below the index of many entries: reachable, so done
    for i in range(300):
        store.cache_put(f"m{i}", bytes([i % 256]) * 3_000)
    assert prune(store, max_size=100_000) > 0 and store.cache.volume() <= 100_000


def test_a_run_record_copy_is_equal_and_apart() -> None:
    """RunRecord.copy (made at every resume) copies every field: a field added later and
    left out of it fails here."""
    import dataclasses as dc

    values: dict[str, Any] = {"run_id": "r", "entrypoint": "m:e", "name": "e",
                              "status": "failed", "created": 1.0, "updated": 2.0,
                              "attempt": 3, "input_digest": "d", "args": b"a",
                              "result": b"r", "error": "E", "thread": "t"}
    assert {f.name for f in dc.fields(RunRecord)} == set(values)
    rec = RunRecord(**values)
    copy = rec.copy()
    assert copy == rec == dc.replace(rec) and copy is not rec
    copy.status = "running"
    assert rec.status == "failed"


def test_a_new_journal_has_2_kib_pages_and_an_older_one_keeps_its_own(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    con = sqlite3.connect(old / "journal.sqlite3")  # (as an older durably made it)
    con.execute("PRAGMA page_size=4096")
    con.execute("PRAGMA journal_mode=WAL")
    con.close()
    for root, page in ((tmp_path / "new", 2048), (old, 4096)):
        store = durably.DiskStore(root)
        durably.configure(store=store)

        @durably.task
        def inc(x: int) -> int:
            return x + 1

        @durably.entrypoint
        def job(n: int) -> int:
            return sum(inc(i) for i in range(n))

        try:
            assert job(30) == 465
            assert job(30) == 465
            steps = store.list_steps(store.list_runs()[0].run_id)
            assert [s.status for s in steps].count("ran") == 30
        finally:
            durably.configure()
            store.close()
        con = sqlite3.connect(root / "journal.sqlite3")
        assert con.execute("PRAGMA page_size").fetchone()[0] == page
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        con.close()


@pytest.mark.parametrize("given,expected", [
    ("5GB", 5 * 10**9), ("5 GiB", 5 * 2**30), ("500MB", 500 * 10**6), ("500mb", 500 * 10**6),
    ("1.5TiB", int(1.5 * 2**40)), ("64kB", 64_000), ("2048", 2048), ("10_000 B", 10_000),
    (123_456, 123_456),
])
def test_a_size_limit_takes_bytes_or_the_common_units(tmp_path: Path, given: object,
                                                      expected: int) -> None:
    assert durably.DiskStore(tmp_path, size_limit=given).size_limit == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("given", ["5 parsecs", "GB", "", "-5GB", "0", 0, -1, 2.5, True, b"5GB"])
def test_a_size_limit_that_is_no_size_names_the_argument_and_the_forms(
        tmp_path: Path, given: object) -> None:
    with pytest.raises(durably.DefinitionError) as info:
        durably.DiskStore(tmp_path, size_limit=given)  # type: ignore[arg-type]
    message = str(info.value)
    assert "DiskStore(size_limit=...)" in message and repr(given) in message
    assert all(form in message for form in ("'5GB'", "'5 GiB'", "'500MB'", "int"))


def test_a_size_limit_in_a_store_url_takes_the_same_forms(tmp_path: Path) -> None:
    store = durably.open_store(f"{tmp_path.as_uri()}?size_limit=5GB")
    assert isinstance(store, durably.DiskStore) and store.size_limit == 5 * 10**9
    with pytest.raises(durably.DefinitionError, match=r"size_limit.*'5 GiB'"):
        durably.open_store(f"{tmp_path.as_uri()}?size_limit=lots")


def test_a_disk_store_reads_rows_of_older_journals_as_no_time_saved(
        disk_store: durably.DiskStore) -> None:
    """Cache rows without a tag, key records and step records without the format 8 columns'
    values (NULL: written before them) read as 0.0 time saved."""
    import sqlite3

    @durably.task
    def inc(x: int) -> int:
        return x + 1

    @durably.entrypoint
    def job(n: int, label: str) -> list[int]:
        return [inc(i) for i in range(n)]

    job.run(2, "first")
    before = job.run(2, "second")
    assert all(s.saved > 0 for s in before.steps if s.status == "cached")
    disk_store.close()
    root = disk_store.path
    with sqlite3.connect(root / "journal.sqlite3") as con:
        con.execute("UPDATE keys SET duration = NULL")
        con.execute("UPDATE steps SET saved = NULL")
    with sqlite3.connect(root / "cache" / "cache.db") as con:
        con.execute("UPDATE Cache SET tag = NULL")
    assert durably.get_run(before.id).time_saved() == 0.0
    (identity,) = [t for t in disk_store.task_identities() if t.endswith(".inc")]
    assert [r.duration for r in disk_store.list_keys(identity)] == [0.0, 0.0]
    third = job.run(2, "third")
    assert third.counts()["cached"] == 2 and third.time_saved() == 0.0
