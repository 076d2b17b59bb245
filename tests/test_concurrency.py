"""Several processes on one store at once: no error, no damaged entry, the right result in each;
identical concurrent calls may compute twice (there is no lock per cache key: documented);
one run is executed by one process at a time (its lease)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import durably
from durably._store.integrity import open_seal

from .conftest import script_env, write_script

pytestmark = pytest.mark.slow

PIPELINE = """
import os, sys, time
import durably
from durably._keys import serde as _serde
_serde.SPILL_BYTES = 150_000  # every 5th value is streamed to a file
MARKS = os.environ["MARKS"]

def mark(text):
    fd = os.open(MARKS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, (text + "\\n").encode())
    os.close(fd)

def wait_for(path, timeout=60):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.005)

@durably.task(name="work")
def work(i):
    mark(f"work {i} {os.getpid()}")
    time.sleep(0.01)
    size = 200_000 if i % 5 == 4 else 50_000 if i % 5 == 2 else 10
    return bytes([i]) * size

@durably.task(cache=False, name="side")
def side(i):
    mark(f"side {i} {os.getpid()}")
    if os.environ.get("PAUSE_AT") == str(i):
        print("paused", flush=True)
        time.sleep(120)
    time.sleep(float(os.environ.get("SIDE_SLEEP", "0")))
    return i

@durably.entrypoint(name="pipeline")
def pipeline(n):
    return sum(len(work(i)) + side(i) for i in range(n))

if __name__ == "__main__":
    mode, n = sys.argv[1], int(sys.argv[2])
    if os.environ.get("GO"):
        wait_for(os.environ["GO"])
    try:
        if mode == "fresh":
            print("result", pipeline.run(n, fresh=True).result, flush=True)
        else:
            print("result", pipeline(n), flush=True)
    except durably.RunStateError as exc:
        print("busy:", exc, flush=True)
"""

SAME_KEY = """
import os, sys, time
import durably

@durably.task(name="slow_square")
def slow_square(x):
    fd = os.open(os.environ["MARKS"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, f"started {os.getpid()}\\n".encode())
    os.close(fd)
    # wait until the other process has started the same call too (proves they overlap)
    deadline = time.monotonic() + 60
    while open(os.environ["MARKS"]).read().count("started") < 2:
        if time.monotonic() > deadline:
            raise SystemExit("the other process never started")
        time.sleep(0.005)
    return x * x

print("result", slow_square(12), flush=True)
"""


def _expected(n: int) -> int:
    return sum((200_000 if i % 5 == 4 else 50_000 if i % 5 == 2 else 10) + i for i in range(n))


def _start(script: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=script.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _assert_sound(root: Path) -> None:
    """Every cache entry and every journaled value of the store checks out."""
    store = durably.DiskStore(root)
    try:
        keys = [k for (k,) in store.cache._sql("SELECT key FROM Cache").fetchall()]
        assert keys and all(store.cache_get(k) is not None for k in keys)
        import sqlite3

        con = sqlite3.connect(root / "journal.sqlite3")
        blobs = [b for (b,) in con.execute("SELECT result FROM steps WHERE result IS NOT NULL")]
        con.close()
        assert blobs and all(open_seal(b)[0] is not None for b in blobs)
        assert not (root / "damaged").exists()
    finally:
        store.close()


def test_eight_processes_run_one_entrypoint_and_its_tasks_on_one_store(tmp_path: Path) -> None:
    script = write_script(tmp_path / "pipeline.py", PIPELINE)
    marks, go = tmp_path / "marks.txt", tmp_path / "go"
    env = script_env(tmp_path / "store", MARKS=str(marks), GO=str(go))
    procs = [_start(script, env, "fresh", "20") for _ in range(8)]
    time.sleep(0.5)  # let them all import durably, then start them at once on a new store
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and err == "", err
        assert out.strip() == f"result {_expected(20)}"
    lines = marks.read_text().splitlines()
    work = Counter(line.split()[1] for line in lines if line.startswith("work"))
    assert set(work) == {str(i) for i in range(20)}
    assert all(1 <= n <= 8 for n in work.values())  # identical calls may compute twice
    assert sum(1 for line in lines if line.startswith("side")) == 8 * 20  # one per run
    store = durably.DiskStore(tmp_path / "store")
    runs = store.list_runs()
    assert len(runs) == 8 and {r.status for r in runs} == {"finished"}
    store.close()
    _assert_sound(tmp_path / "store")
    # a ninth run executes no body: every entry the eight wrote is in the cache, sound
    env.pop("GO")
    before = len(lines)
    ninth = subprocess.run([sys.executable, str(script), "fresh", "20"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ninth.stdout.strip() == f"result {_expected(20)}", ninth.stderr
    after = marks.read_text().splitlines()[before:]
    assert not [line for line in after if line.startswith("work")]


def test_identical_concurrent_calls_may_compute_twice(tmp_path: Path) -> None:
    """There is no lock per cache key: two processes that miss the same key at once both
    execute the body; both get the result, and the cache keeps one sound entry."""
    script = write_script(tmp_path / "same.py", SAME_KEY)
    marks = tmp_path / "marks.txt"
    env = script_env(tmp_path / "store", MARKS=str(marks))
    procs = [_start(script, env) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "result 144", err
    assert marks.read_text().count("started") == 2  # computed twice, at the same time
    _assert_cache_only_sound(tmp_path / "store")
    third = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert third.stdout.strip() == "result 144" and marks.read_text().count("started") == 2


def _assert_cache_only_sound(root: Path) -> None:
    store = durably.DiskStore(root)
    try:
        keys = [k for (k,) in store.cache._sql("SELECT key FROM Cache").fetchall()]
        assert len(keys) == 1 and store.cache_get(keys[0]) is not None
    finally:
        store.close()


def test_processes_resuming_one_run_at_once_never_both_execute_it(tmp_path: Path) -> None:
    script = write_script(tmp_path / "pipeline.py", PIPELINE)
    marks, go = tmp_path / "marks.txt", tmp_path / "go"
    env = script_env(tmp_path / "store", MARKS=str(marks), PAUSE_AT="5")
    first = _start(script, env, "same", "12")
    assert first.stdout is not None and first.stdout.readline().strip() == "paused"
    first.kill()  # crashed in the middle: the run must be resumed, once
    first.communicate(timeout=30)
    env.pop("PAUSE_AT")
    env.update(GO=str(go), SIDE_SLEEP="0.05")
    procs = [_start(script, env, "same", "12") for _ in range(8)]
    time.sleep(0.5)
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    results = [out for out, _ in outs if out.startswith("result")]
    busy = [out for out, _ in outs if out.startswith("busy:")]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and err == "", err
    assert len(results) + len(busy) == 8 and results
    assert all(r.strip() == f"result {_expected(12)}" for r in results)
    for message in busy:  # the clear error: who holds the run, and what to do; or, for a
        # process that started once the run had finished (a slow start on a loaded machine)
        # and only replayed, that another one did so at the same time and ended first
        assert ("is being executed by process" in message
                or "was resumed by another process while this one replayed" in message)
        assert "Fix:" in message
    lines = marks.read_text().splitlines()
    sides = Counter(line.split()[1] for line in lines if line.startswith("side"))
    # steps 0-4 ran before the crash; 5 ran, then the process died before journaling it;
    # 5 again and 6-11 ran once, by whichever process held the run
    assert sides == Counter({str(i): 2 if i == 5 else 1 for i in range(12)})
    resumers = {line.split()[2] for line in lines if line.startswith("side")
                and int(line.split()[1]) >= 6}
    assert len(resumers) == 1
    _assert_sound(tmp_path / "store")


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads Linux's /proc/locks")
def test_a_second_store_object_on_a_path_keeps_sqlite_s_locks(tmp_path: Path) -> None:
    """On Linux, closing any descriptor of a file drops every POSIX lock the process holds
    on it. The journal's check of its write-ahead log (at a store object's first access)
    reads the wal-index: through a descriptor it never closes, so a second DiskStore on the
    same path (a notebook cell configuring the store again) leaves the first's SQLite
    locks in place (a review saw readers die of SIGBUS once they were dropped)."""
    import os

    first = durably.DiskStore(tmp_path / "s")

    @durably.entrypoint(store=first)
    def hello(x: int) -> int:
        return x

    hello(1)
    shm = os.stat(tmp_path / "s" / "journal.sqlite3-shm").st_ino

    def held() -> list[str]:
        # (each lock without /proc/locks' first field, its place in the system's list of
        # locks, which other processes' locks move)
        return [" ".join(line.split()[1:]) for line in Path("/proc/locks").read_text()
                .splitlines()
                if line.split()[4] == str(os.getpid()) and line.split()[5].endswith(f":{shm}")]

    before = held()
    assert before  # SQLite's lock on the wal-index, while the first store is open
    for _ in range(2):
        durably.DiskStore(tmp_path / "s").list_runs()
        assert held() == before
    assert hello(2) == 2


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads Linux's /proc/self/fd")
def test_a_store_reopened_after_each_crash_keeps_no_descriptor_of_an_old_wal_index(
        tmp_path: Path) -> None:
    """A supervisor reopening the store after each SIGKILLed worker: the descriptor the WAL
    check keeps on a wal-index is closed once that file is deleted (SQLite deletes it when
    the journal's last connection closes), so descriptors do not pile up, one per crash."""
    import os
    import signal

    from durably._store.disk import wal as _wal

    script = write_script(tmp_path / "worker.py", """
        import sys, time
        import durably

        @durably.task(cache=False)
        def step(i):
            return i

        @durably.entrypoint
        def job(n, tag):
            total = sum(step(i) for i in range(n))
            print("paused", flush=True)
            time.sleep(60)
            return total

        job(50, sys.argv[1])
        """)
    env = script_env(tmp_path / "s")
    for cycle in range(3):
        proc = subprocess.Popen([sys.executable, str(script), str(cycle)], env=env,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "paused"
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        assert (tmp_path / "s" / "journal.sqlite3-wal").stat().st_size > 32
        store = durably.DiskStore(tmp_path / "s")
        assert len(store.list_runs()) == cycle + 1  # (the check ran: a log was there)
        store.close()
        kept = [fd for fd in _wal._INDEX_FDS.values()
                if os.fstat(fd).st_ino and str(tmp_path) in os.readlink(f"/proc/self/fd/{fd}")]
        assert len(kept) <= 1, kept


def test_processes_calling_one_finished_run_at_once_all_get_its_result(tmp_path: Path) -> None:
    """Web workers or cron jobs that call one finished run (same arguments) at the same
    moment: each only replays it, and each gets its result; none executes a step, none is
    refused (an attempt that only replayed and finds at its end that another one was
    journaled meanwhile returns the journal's result without journaling itself)."""
    script = write_script(tmp_path / "pipeline.py", PIPELINE)
    marks, go = tmp_path / "marks.txt", tmp_path / "go"
    env = script_env(tmp_path / "store", MARKS=str(marks))
    first = subprocess.run([sys.executable, str(script), "same", "10"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert first.stdout.strip() == f"result {_expected(10)}", first.stderr
    executed = len(marks.read_text().splitlines())
    env["GO"] = str(go)
    for _batch in range(3):
        procs = [_start(script, env, "same", "10") for _ in range(6)]
        time.sleep(0.5)
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
        go.unlink()
        for p, (out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0 and err == "", err
            assert out.strip() == f"result {_expected(10)}"  # not "busy: ..."
    assert len(marks.read_text().splitlines()) == executed  # no body executed again
    store = durably.DiskStore(tmp_path / "store")
    (run,) = store.list_runs()
    assert run.status == "finished" and run.result is not None
    assert store.run_holder(run.run_id) is None
    store.close()
    _assert_sound(tmp_path / "store")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
def test_a_child_forked_while_a_thread_holds_a_store_s_lock_uses_the_store(
        tmp_path: Path) -> None:
    """A thread of the parent held the DiskStore's lock when another thread forked: the
    child inherited a lock nobody would release, and its first use of the store hung."""
    import threading

    store = durably.DiskStore(tmp_path / "s")
    store.cache_put("k", b"v")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with store._lock:
            held.set()
            release.wait(30)

    threading.Thread(target=holder, daemon=True).start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when the store answers (an alarm ends a hang)
        import signal

        signal.alarm(20)
        os._exit(0 if store.cache_get("k") == b"v" else 3)
    release.set()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# -- identical calls at once: wait= -------------------------------------------------------------
def test_identical_calls_at_once_wait_for_the_one_executing(tmp_path: Path) -> None:
    """@entrypoint(wait=...): the same input from several threads at once (a web server
    handling a request sent twice): one executes, the others wait for it and return its
    result; without wait=, a later caller gets RunBusyError at once."""
    import threading

    store = durably.DiskStore(tmp_path / "store")
    started, release = threading.Event(), threading.Event()
    executed: list[str] = []

    @durably.task(cache=False)
    def charge(order: str) -> str:
        executed.append(order)
        started.set()
        assert release.wait(30)
        return f"charged {order}"

    @durably.entrypoint(store=store, wait=60)
    def checkout(order: str) -> str:
        return charge(order)

    @durably.entrypoint(store=store, name="checkout_nowait")
    def checkout_nowait(order: str) -> str:
        return charge(order)

    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(checkout("o-1")))
    first.start()
    assert started.wait(30)
    waiting = [threading.Thread(target=lambda: results.append(checkout("o-1")))
               for _ in range(3)]
    for t in waiting:
        t.start()
    release.set()
    for t in [first, *waiting]:
        t.join(60)
    assert results == ["charged o-1"] * 4
    assert executed == ["o-1"]  # once, whoever asked

    started.clear()
    release.clear()
    other = threading.Thread(target=lambda: checkout_nowait("o-2"))
    other.start()
    assert started.wait(30)
    try:
        with pytest.raises(durably.RunBusyError, match="wait=seconds") as busy:
            checkout_nowait("o-2")
        assert busy.value.run_id.startswith("checkout_nowait-")
        brief = durably.entrypoint(store=store, name="checkout_nowait", wait=0.05)(
            checkout_nowait.__wrapped__)
        with pytest.raises(durably.RunBusyError):  # (held until released below)
            brief("o-2")
    finally:
        release.set()
        other.join(60)
    with pytest.raises(durably.DefinitionError, match="wait="):
        durably.entrypoint(wait=-1)
