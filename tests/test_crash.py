"""Crash-resume with real subprocesses killed by SIGKILL, and cross-process cache keys."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import run_script, script_env, write_script

pytestmark = pytest.mark.slow

PIPELINE = """
import asyncio, os, sys, time
import durably

COUNT = os.environ["COUNT_FILE"]
SIDE = os.environ["SIDE_FILE"]
PAUSE_AFTER = int(os.environ.get("PAUSE_AFTER", "0"))

def mark(path, text):
    with open(path, "a") as f:
        f.write(text + "\\n")
        f.flush()
        os.fsync(f.fileno())

@durably.task
def work(i):
    mark(COUNT, str(i))
    return i * i

@durably.task(cache=False)
def append_line(i):
    mark(SIDE, f"line {i}")
    return i

@durably.task
async def awork(i):
    mark(COUNT, str(i))
    await asyncio.sleep(0)
    return i * i

@durably.task(cache=False)
async def aappend_line(i):
    mark(SIDE, f"line {i}")
    return i

def pause(i):
    if i == PAUSE_AFTER:
        print(f"returned {i}", flush=True)
        time.sleep(120)

@durably.entrypoint
def pipeline(n):
    total = 0
    for i in range(1, n + 1):
        total += work(i)
        append_line(i)
        pause(i)
    return total

@durably.entrypoint
async def apipeline(n):
    total = 0
    for i in range(1, n + 1):
        total += await awork(i)
        await aappend_line(i)
        pause(i)
    return total

if __name__ == "__main__":
    if sys.argv[1] == "plain":  # the same tasks outside any run: the cache alone
        print("result", sum(work(i) for i in range(1, 51)), flush=True)
    elif sys.argv[1] == "async":
        print("result", asyncio.run(apipeline(50)), flush=True)
    else:
        print("result", pipeline(50), flush=True)
"""


def _start(script: Path, env: dict[str, str], mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), mode], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=script.parent,
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_after_task_30_resumes_exactly(tmp_path: Path, mode: str) -> None:
    script = write_script(tmp_path / "pipeline.py", PIPELINE)
    count, side = tmp_path / "count.txt", tmp_path / "side.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), SIDE_FILE=str(side),
                     PAUSE_AFTER="30")
    with _start(script, env, mode) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        if line.strip() != "returned 30":
            proc.kill()
            pytest.fail(f"expected 'returned 30', got {line!r}: {proc.stderr.read()}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert count.read_text().split() == [str(i) for i in range(1, 31)]

    env["PAUSE_AFTER"] = "0"
    done = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"result {sum(i * i for i in range(1, 51))}"
    # bodies 1-30 never again, 31-50 exactly once
    assert count.read_text().split() == [str(i) for i in range(1, 51)]
    # the cache=False side effect happened exactly once per call
    assert side.read_text().splitlines() == [f"line {i}" for i in range(1, 51)]

    # a third run of the finished run executes no task body at all
    again = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == done.stdout
    assert count.read_text().split() == [str(i) for i in range(1, 51)]
    assert len(side.read_text().splitlines()) == 50

    # the cache entries the killed attempt had queued were restored on resume: another
    # program calling the same tasks outside any run executes none of them
    if mode == "sync":
        plain = subprocess.run([sys.executable, str(script), "plain"], env=env,
                               capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert plain.returncode == 0 and plain.stdout == done.stdout, plain.stderr
        assert count.read_text().split() == [str(i) for i in range(1, 51)]


HASHSEED = """
import dataclasses, os, sys
import durably

@dataclasses.dataclass(frozen=True)
class Config:
    names: frozenset
    weights: dict

@durably.task
def fit(config, tags, nested):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write("fit\\n")
    return sorted(config.names), sorted(tags)

config = Config(frozenset({"alpha", "beta", "gamma", "delta"}),
                {"x": 1.5, "y": 2, "z": [1, 2, {"k": "v"}]})
print(fit(config, {"a", "b", "c", "d", "e"}, {"outer": {"s": {"p", "q"}, "t": (1, "two")}}))
print(fit.cache_key(config, {"e", "d", "c", "b", "a"},
                    {"outer": {"t": (1, "two"), "s": {"q", "p"}}}))
"""


def test_cache_hits_across_processes_with_different_hash_seeds(tmp_path: Path) -> None:
    script = write_script(tmp_path / "seeded.py", HASHSEED)
    count = tmp_path / "count.txt"
    outputs = []
    for seed in ("0", "1", "4242"):
        env = script_env(tmp_path / "store", COUNT_FILE=str(count), PYTHONHASHSEED=seed)
        outputs.append(run_script(script, env).stdout)
    assert len(set(outputs)) == 1
    assert count.read_text().split() == ["fit"]


MAIN_RESULT = """
import dataclasses
import durably

@dataclasses.dataclass
class Result:
    value: int

@durably.entrypoint
def job():
    return Result(7)

print(job.run().id)
"""


def test_result_whose_class_lives_in_a_script_is_a_clear_error_elsewhere(
        tmp_path: Path) -> None:
    import durably

    script = write_script(tmp_path / "mainres.py", MAIN_RESULT)
    run_id = run_script(script, script_env(tmp_path / "store")).stdout.strip()
    run = durably.get_run(run_id, store=durably.DiskStore(tmp_path / "store"))
    assert run.status == "finished"
    with pytest.raises(durably.SerializationError, match="not loaded here"):
        _ = run.result


BUSY = """
import os, sys, time
import durably

@durably.task
def step(i):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(f"{i}\\n")
    return i

@durably.entrypoint
def job(n):
    for i in range(n):
        step(i)
        if i == 2 and os.environ.get("PAUSE"):
            print("paused", flush=True)
            time.sleep(120)
    return n

try:
    print("result", job(6), flush=True)
except durably.RunStateError as exc:
    print("busy:", exc, flush=True)
"""


def test_second_process_cannot_execute_a_run_in_progress(tmp_path: Path) -> None:
    script = write_script(tmp_path / "busy.py", BUSY)
    count = tmp_path / "count.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), PAUSE="1")
    with subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as first:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == "paused"
        env.pop("PAUSE")
        second = run_script(script, env)
        assert "busy:" in second.stdout and f"process {first.pid}" in second.stdout
        assert "fresh=True" in second.stdout
        assert count.read_text().split() == ["0", "1", "2"]
        first.kill()
        first.communicate(timeout=30)
    # the owner died: its lease is taken over and the run resumes where it stopped
    third = run_script(script, env)
    assert third.stdout.strip() == "result 6"
    assert count.read_text().split() == ["0", "1", "2", "3", "4", "5"]


CRASHED = """
import os, time
import durably

@durably.task
def step(i):
    if i == 2 and os.environ.get("PAUSE"):
        print("paused", flush=True)
        time.sleep(120)
    return i

@durably.entrypoint
def job(n):
    return sum(step(i) for i in range(n))

run = job.run(4)
print(run.status, run.resumed_from, run.summary(), flush=True)
"""


def test_a_run_whose_process_died_reads_as_crashed_not_running(tmp_path: Path) -> None:
    from click.testing import CliRunner

    import durably
    from durably.cli import cli

    def runs(*options: str) -> str:
        done = CliRunner().invoke(cli, ["--dir", str(store.path), "runs", *options])
        assert done.exit_code == 0, done.output
        return done.output

    script = write_script(tmp_path / "crashed.py", CRASHED)
    store = durably.DiskStore(tmp_path / "store")
    env = script_env(store.path, PAUSE="1")
    with subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "paused"
        (run,) = durably.list_runs(store=store)
        assert run.status == "running"  # its process is alive, executing it
        assert run.id in runs("--status", "running") and run.id not in runs("-s", "crashed")
        proc.kill()
        proc.communicate(timeout=30)
    # the journal still says running; nobody holds the lease: the run crashed
    assert store.find_run(run.id).status == "running"  # type: ignore[union-attr]
    assert run.status == "crashed" and repr(run).endswith(": crashed, attempt 1>")
    assert durably.get_run(run.id, store=store).status == "crashed"
    assert run.id in runs("--status", "crashed") and run.id not in runs("-s", "running")
    assert "crashed" in runs()
    shown = CliRunner().invoke(cli, ["--dir", str(store.path), "show", run.id])
    assert "crashed (attempt 1): the process executing it died" in shown.output
    with pytest.raises(durably.RunStateError, match="is crashed, so it has no result"):
        _ = run.result

    env.pop("PAUSE")
    out = run_script(script, env).stdout
    assert out.startswith("finished crashed ")
    assert "resumed a run whose process had died while executing it" in out
    again = durably.get_run(run.id, store=store)
    assert again.status == "finished"
    assert again.graph(attempt=1).status == "crashed"  # the attempt that never ended
    assert again.graph().status == "finished"


PAST_JOURNAL = """
import os, signal
import durably

@durably.task
def step(i):
    if i == 3 and os.environ.get("KILL"):
        os.kill(os.getpid(), signal.SIGKILL)  # inside the first step the journal lacks
    if i == 3 and os.environ.get("FAIL"):
        raise RuntimeError("stopped after the steps")
    return i

@durably.entrypoint
def job(n):
    return sum(step(i) for i in range(n))

if os.environ.get("STREAM"):
    for event in job.stream(5):
        pass
print("result", job(5), flush=True)
"""


@pytest.mark.parametrize("stream", [False, True])
def test_a_resumed_attempt_killed_past_its_journal_shows_what_it_replayed(
        tmp_path: Path, stream: bool) -> None:
    """A resumed attempt journals the steps it replayed before it executes its first new
    one (they are otherwise written at its end): killed there, its graph still shows them.
    Also when it is streamed (a listener buffers whole records)."""
    import durably

    script = write_script(tmp_path / "past.py", PAST_JOURNAL)
    store = durably.DiskStore(tmp_path / "store")
    first = subprocess.run([sys.executable, str(script)], env=script_env(store.path, FAIL="1"),
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert first.returncode == 1 and "stopped after the steps" in first.stderr
    more = {"STREAM": "1"} if stream else {}
    killed = subprocess.run([sys.executable, str(script)],
                            env=script_env(store.path, KILL="1", **more),
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    (run,) = durably.list_runs(store=store)
    assert run.status == "crashed" and run.attempt == 2
    replayed = [(s.status, s.position) for s in run.steps if s.attempt == 2]
    assert replayed == [("replayed", 0), ("replayed", 1), ("replayed", 2)]
    graph = run.graph(attempt=2)
    assert graph.status == "crashed" and len(graph.nodes) == 3
    assert run_script(script, script_env(store.path)).stdout == "result 10\n"


LEASED = """
import os, time
import durably
from durably._store import lease as _lease
_lease.RENEW_SECONDS = float(os.environ.get("RENEW", "30"))

@durably.task
def step(i):
    if i == 1 and os.environ.get("PAUSE"):
        print("paused", flush=True)
        time.sleep(float(os.environ["PAUSE"]))
    return i

@durably.entrypoint
def job(n):
    return sum(step(i) for i in range(n))

try:
    print("result", job(3), flush=True)
except durably.RunStateError as exc:
    print("busy:", exc, flush=True)
"""


def _paused(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "paused":
        proc.kill()
        pytest.fail(f"expected 'paused', got {line!r}: {proc.communicate()[1]}")
    return proc


def test_a_long_step_keeps_the_runs_lease_alive(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease is renewed while a step's body executes, not only between steps: seen
    from another host (judged by its heartbeat alone), a run inside a step longer than the
    lease's life still executes, and is never taken over."""
    import dataclasses
    import time

    import durably
    from durably._store import lease as _lease

    script = write_script(tmp_path / "leased.py", LEASED)
    store = durably.DiskStore(tmp_path / "store")
    env = script_env(store.path, PAUSE="4", RENEW="0.2")
    # this process stands for another machine sharing the store; leases live 1 s
    monkeypatch.setattr(_lease, "_ME", dataclasses.replace(_lease._ME, host="elsewhere"))
    monkeypatch.setattr(_lease, "LEASE_SECONDS", 1.0)
    with _paused([sys.executable, str(script)], env) as proc:
        (run,) = durably.list_runs(store=store)
        first = store.run_holder(run.id)
        assert first is not None
        time.sleep(2.0)  # twice the lease's life, inside the step
        holder = store.run_holder(run.id)
        assert holder is not None and holder.heartbeat > first.heartbeat
        assert run.status == "running"
        out, err = proc.communicate(timeout=60)
    assert out.strip() == "result 3", err


def test_a_lease_of_another_host_or_container_says_when_it_expires() -> None:
    """A run held by a process this one cannot look at (another machine, or a container's
    own pid namespace: its pid means nothing here) is judged by its lease's heartbeat: the
    message says so and how long until the lease expires, not that it runs "right now"."""
    import durably
    from durably._runtime.config import default_store
    from durably._store import lease as _lease

    fail = {"on": True}

    @durably.entrypoint
    def job(n: int) -> int:
        if fail["on"]:
            raise RuntimeError("stop")
        return n

    with pytest.raises(RuntimeError):
        job(1)
    run = durably.list_runs()[0]
    store = default_store()
    other = _lease.Owner("vm (pid namespace 4026532178)", 1, None, "their-token")
    assert store.acquire_run(run.id, other) is None
    fail["on"] = False
    with pytest.raises(durably.RunStateError) as err:
        job(1)
    text = str(err.value)
    assert "process 1 on vm (pid namespace 4026532178)" in text
    assert "cannot look at" in text and "renewed 0 s ago" in text
    assert re.search(r"once its lease expires, in 1[12]\d s", text), text
    assert "right now" not in text


TAKEN_OVER = """
import dataclasses, os, sys, time
import durably
from durably._store import lease as _lease
_lease.RENEW_SECONDS = float(os.environ.get("RENEW", "30"))
if os.environ.get("OTHER_HOST"):  # another machine sharing the store: leases live 1 s
    _lease._ME = dataclasses.replace(_lease._ME, host="elsewhere")
    _lease.LEASE_SECONDS = 1.0

@durably.task
def step(i):
    with open(os.environ["LOG"], "a") as f:
        f.write(f"{os.environ['WHO']} {i}\\n")
    if i == 1 and os.environ.get("GO"):
        print("paused", flush=True)
        while not os.path.exists(os.environ["GO"]):
            time.sleep(0.05)
        time.sleep(1.5)  # (its lease's thread looks at its leases every 0.5 s)
    return i + 10

@durably.entrypoint
def job(n):
    return sum(step(i) for i in range(n))

try:
    print("result", job(3), flush=True)
except durably.RunStateError as exc:
    print("lost:", exc, flush=True)
"""


@pytest.mark.parametrize("noticed", ["by_renewal", "at_the_end"])
def test_a_process_that_lost_its_lease_never_overwrites_the_run(tmp_path: Path,
                                                                noticed: str) -> None:
    """A process stopped (SIGSTOP) longer than its lease's life is taken over by a process
    of another host, which finishes the run. Continued, the stopped process finds its lease
    gone: at its next renewal (it stops before its next step) or at its end. It raises
    RunStateError, and the run's record stays the other attempt's."""
    import time

    import durably

    script = write_script(tmp_path / "taken.py", TAKEN_OVER)
    store = durably.DiskStore(tmp_path / "store")
    log = tmp_path / "log"
    renew = "0.2" if noticed == "by_renewal" else "30"
    go = tmp_path / "go"
    env = script_env(store.path, LOG=str(log), WHO="A", GO=str(go), RENEW=renew)
    with _paused([sys.executable, str(script)], env) as a:
        try:
            a.send_signal(signal.SIGSTOP)
            time.sleep(1.5)  # past the lease's life, seen from the other host
            b = run_script(script, script_env(store.path, LOG=str(log), WHO="B",
                                              OTHER_HOST="1"))
            assert b.stdout.strip() == "result 33", b.stderr
        finally:
            a.send_signal(signal.SIGCONT)
            go.touch()  # A's step 1 goes on
        out, err = a.communicate(timeout=60)
    assert a.returncode == 0, err
    assert out.startswith("lost:") and "lost the run's lease" in out, (out, err)
    executed = log.read_text().split("\n")
    # B replayed A's step 0, and executed 1 (A never finished it) and 2
    assert [e for e in executed if e.startswith("B")] == ["B 1", "B 2"]
    if noticed == "by_renewal":  # A stopped at its next step boundary: 2 never started
        assert [e for e in executed if e.startswith("A")] == ["A 0", "A 1"]
        assert "The attempt stopped" in out
    (run,) = durably.list_runs(store=store)
    assert (run.status, run.attempt, run.result) == ("finished", 2, 33)
    assert "lost its lease" in err
    # A's late record of step 1 is not journaled: a replay would serve it instead of B's
    ran = [(s.attempt, s.position) for s in store.list_steps(run.id) if s.status == "ran"]
    assert ran == [(1, 0), (2, 1), (2, 2)]


def test_a_killed_process_not_yet_reaped_holds_no_lease(tmp_path: Path) -> None:
    """A process killed but not yet waited for by its parent (a zombie) still answers
    os.kill(pid, 0): its run reads crashed, and can be resumed."""
    import time

    import durably

    script = write_script(tmp_path / "leased.py", LEASED)
    store = durably.DiskStore(tmp_path / "store")
    with _paused([sys.executable, str(script)], script_env(store.path, PAUSE="60")) as proc:
        (run,) = durably.list_runs(store=store)
        assert run.status == "running"
        os.kill(proc.pid, signal.SIGKILL)
        stat = Path(f"/proc/{proc.pid}/stat")
        deadline = time.monotonic() + 30
        while stat.read_bytes().rpartition(b")")[2].split()[0] != b"Z":
            assert time.monotonic() < deadline, "the killed process never became a zombie"
            time.sleep(0.01)
        # (its other threads end a moment after its main one: till then it may execute)
        while run.status != "crashed":
            assert time.monotonic() < deadline, "a killed process still holds its lease"
            time.sleep(0.01)
        assert run_script(script, script_env(store.path)).stdout.strip() == "result 3"
        proc.wait(timeout=30)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a pid namespace needs root and unshare(1)")
def test_a_run_in_another_pid_namespace_is_not_judged_by_our_pids(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A container with its own pids but the host's name (host networking) shares the
    store: its lease names pid 1, which here is another process. Its run reads running
    while it executes (not crashed), a second process cannot take it over, and once it is
    killed its heartbeat stops and the run reads crashed."""
    import time

    import durably
    from durably._store import lease as _lease

    script = write_script(tmp_path / "leased.py", LEASED)
    store = durably.DiskStore(tmp_path / "store")
    monkeypatch.setattr(_lease, "LEASE_SECONDS", 1.0)
    env = script_env(store.path, PAUSE="60", RENEW="0.2")
    args = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
            sys.executable, str(script)]
    with _paused(args, env) as proc:
        (run,) = durably.list_runs(store=store)
        holder = store.run_holder(run.id)
        assert holder is not None and holder.pid == 1 and "pid namespace" in holder.host
        assert run.status == "running"
        env.pop("PAUSE")
        assert "busy:" in run_script(script, env).stdout
        proc.kill()
        proc.communicate(timeout=30)
    time.sleep(1.5)  # the lease's life, without a heartbeat
    assert run.status == "crashed"


FORKS = """
import os, signal, sys
import durably
from durably._store import lease as _lease
_lease.RENEW_SECONDS = 1e-5  # the lease's thread renews without pause

@durably.task(cache=False)
def forker(run_id):
    hung = 0
    for i in range(int(os.environ["FORKS"])):
        pid = os.fork()
        if pid == 0:  # SQLite in the child, while the parent's thread may be renewing
            signal.alarm(5)
            os._exit(0 if durably.get_run(run_id).status == "running" else 3)
        _, status = os.waitpid(pid, 0)
        hung += os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0
    return hung

@durably.entrypoint
def parent():
    return forker("parent")

print("children that hung or failed:", parent.run(run_id="parent").result, flush=True)
"""


def test_processes_forked_during_a_run_never_inherit_sqlites_locks(tmp_path: Path) -> None:
    """fork() waits for a lease renewal in progress: a child forked while the renewing
    thread was opening its connection inherited SQLite's lock held, and hung at its first
    connection (one fork in ten, renewing without pause)."""
    script = write_script(tmp_path / "forks.py", FORKS)
    out = run_script(script, script_env(tmp_path / "store", FORKS="100"), timeout=300)
    assert out.stdout.strip() == "children that hung or failed: 0"


MAIN_EXITS = """
import ctypes, os, threading, time
import durably

started = threading.Event()

@durably.task
def step(i):
    if i == 1:
        print("paused", flush=True)
        started.set()
        time.sleep(float(os.environ["PAUSE"]))
    return i

@durably.entrypoint
def job(n):
    return sum(step(i) for i in range(n))

worker = threading.Thread(target=lambda: print("worker:", job.run(3).status, flush=True))
worker.start()
started.wait()
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the worker goes on
"""


def test_a_process_whose_main_thread_ended_still_holds_its_lease(tmp_path: Path) -> None:
    """/proc says "zombie" for a process whose main thread ended while others run: its
    run still executes (it is neither crashed nor taken over)."""
    import durably

    script = write_script(tmp_path / "main_exits.py", MAIN_EXITS)
    store = durably.DiskStore(tmp_path / "store")
    with _paused([sys.executable, str(script)], script_env(store.path, PAUSE="3")) as proc:
        (run,) = durably.list_runs(store=store)
        assert run.status == "running"
        out, err = proc.communicate(timeout=60)
    assert out.strip() == "worker: finished", err


def _run_phase(script: Path, env: dict[str, str], name: str, code: int = 0) -> str:
    """Run ``script`` with ``PHASE=name``; it must exit with ``code``: its output."""
    done = subprocess.run([sys.executable, str(script)], env={**env, "PHASE": name},
                          capture_output=True, text=True, timeout=120, cwd=script.parent)
    assert done.returncode == code, done.stderr
    return done.stdout


RESTORE = """
import os, sys, time
import durably
from durably._runtime import attempt as _attempt
from durably._runtime import context as _context
from durably._runtime import step as _step

PHASE = os.environ["PHASE"]
_context.CACHE_BATCH = _attempt._CACHE_BATCH = 50  # (2048): batches of 50 cheap steps
_step._WRITE_THROUGH = 0.01  # (0.1 s): a step of 20 ms writes its entry at once

def mark(text):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(text + "\\n")

@durably.task
def sq(i):
    mark(f"sq {i}")
    return i * i

@durably.task
def review(draft):
    return f"{draft} [{durably.interrupt({'approve?': draft})}]"

@durably.task
def slow(i):
    time.sleep(0.02)  # over 10 ms: its cache entry is written at once, never queued
    return -i

@durably.entrypoint
def job(n):
    verdict = review("owls")
    total = sum(slow(i) for i in range(40))
    total += sum(sq(i) for i in range(n))  # 320: the last 20 queued
    if PHASE == "approve":
        os._exit(3)  # killed: the run's queued cache writes are lost
    return total, verdict

if __name__ == "__main__":
    if PHASE == "restore-crash":  # killed again while the resume puts the entries back
        from durably import DiskStore
        real = DiskStore.cache_put_many
        def put(self, items):
            if len(items) > 10:
                os._exit(4)
            return real(self, items)
        DiskStore.cache_put_many = put
    if PHASE == "outside":
        for i in range(320):
            sq(i)
        try:
            print("review", review("owls"))
        except durably.NoActiveRunError:
            print("review asks again")
    elif PHASE == "approve":
        job.resume(os.environ["RUN_ID"], "approved")
    else:
        try:
            print("result", job(320))
        except durably.RunInterrupted as paused:
            print("paused", paused.run_id)
"""


@pytest.mark.parametrize("killed_again", [False, True], ids=["resumed", "killed-again"])
def test_a_killed_attempts_cache_entries_are_put_back_but_not_an_answers(
        tmp_path: Path, killed_again: bool) -> None:
    """A killed attempt's queued cache writes are put back by the next resume, and only
    those (slower steps wrote their entries at once; a slow step also writes the queued
    ones before it executes, so they come last here). When that resume is killed as it
    puts them back, the one after puts them back (it looked only at the attempt before it, which
    executed nothing). A step that depends on an answer to interrupt() is never put in the
    cache, by a resume either (it was)."""
    script = write_script(tmp_path / "restore.py", RESTORE)
    count = tmp_path / "count.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), PHASE="first")

    run_id = _run_phase(script, env, "first").split()[-1]  # the question
    env["RUN_ID"] = run_id
    _run_phase(script, env, "approve", 3)  # answered, 360 steps run, killed before its end
    if killed_again:
        _run_phase(script, env, "restore-crash", 4)
    total = sum(i * i for i in range(320)) - sum(range(40))
    assert _run_phase(script, env, "last") == f"result ({total}, 'owls [approved]')\n"
    assert len(count.read_text().split("\n")) - 1 == 320  # each executed once
    # another program calling the same tasks outside any run finds every entry cached, and
    # the answer is not served from the cache: the task asks again
    assert _run_phase(script, env, "outside") == "review asks again\n"
    assert len(count.read_text().split("\n")) - 1 == 320


ASKED_DEEP = """
import os, sys
import durably

PHASE = os.environ["PHASE"]  # (read again inside tasks: a global is part of their code)

@durably.task
def g(x):
    return durably.interrupt("answer?") + x

@durably.task
def c(x):
    out = g(x) + "c"
    if os.environ["PHASE"] == "kill-in-c":
        os._exit(3)
    return out

@durably.task
def p(x):
    out = c(x) + "p"
    if os.environ["PHASE"] == "fail-in-p":
        raise ConnectionError("the network went down")
    return out

@durably.entrypoint
def main(x):
    out = p(x)
    if os.environ["PHASE"] == "kill-after-p":
        os._exit(3)
    return out

if __name__ == "__main__":
    if PHASE == "outside":
        for task in (p, c):
            try:
                print(task.__name__, "served", task("a"))
            except durably.NoActiveRunError:
                print(task.__name__, "asks again")
    elif PHASE == "first":
        try:
            main("a")
        except durably.RunInterrupted as paused:
            print(paused.run_id)
    elif PHASE in ("kill-in-c", "fail-in-p"):
        try:
            main.resume(os.environ["RUN_ID"], "ANS!")
        except ConnectionError:
            pass
    else:
        print(main("a"))
"""


@pytest.mark.parametrize("path", [("fail-in-p",), ("kill-in-c", "kill-after-p")],
                         ids=["failed", "killed-twice"])
def test_callers_of_an_answered_step_are_never_cached(tmp_path: Path,
                                                     path: tuple[str, ...]) -> None:
    """p calls c calls g, which asks a person. The answer reaches c and p (their results
    depend on it), so neither is ever cached, even when they finish in a later attempt
    than g (replaying it from the journal): when p failed after c returned, or the run was
    killed in c and again after p (the resume put back the queued entries)."""
    script = write_script(tmp_path / "deep.py", ASKED_DEEP)
    env = script_env(tmp_path / "store", PHASE="first")

    env["RUN_ID"] = _run_phase(script, env, "first").strip()
    for name in path:
        _run_phase(script, env, name, 3 if name.startswith("kill") else 0)
    assert _run_phase(script, env, "last") == "ANS!acp\n"
    assert _run_phase(script, env, "outside") == "p asks again\nc asks again\n"


def test_process_pool_workers_exit_when_their_run_s_process_is_killed(tmp_path: Path) -> None:
    """A process map's workers hold both ends of the pool's queue: with the process that
    made the pool killed (SIGKILL), they used to wait for work forever. They exit."""
    import time

    script = write_script(tmp_path / "fanout.py", """
        import os, time
        import durably

        @durably.task
        def slow(x):
            with open(f"worker-{os.getpid()}", "w"):
                pass
            time.sleep(60)
            return x

        @durably.entrypoint
        def main():
            return slow.map(range(4), executor="process", max_workers=2)

        if __name__ == "__main__":
            main()
    """)
    proc = subprocess.Popen([sys.executable, str(script)], env=script_env(tmp_path / "store"),
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("worker-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        status = Path(f"/proc/{pid}/stat")
        return not (status.exists() and status.read_text().split(") ")[1][0] == "Z")

    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:  # (never leave them behind, even when the test fails)
        os.kill(pid, signal.SIGKILL)
    assert left == []


DAMAGED_WAL = """
import os, sys, time
import durably

@durably.task(cache=False)
def effect(i):
    with open(os.environ["LOG"], "a") as f:
        f.write(f"effect {i}\\n")
    return i

@durably.entrypoint
def job(n):
    total = sum(effect(i) for i in range(n))
    if os.environ.get("HOLD"):
        print("paused", flush=True)
        time.sleep(60)
    return total

try:
    print("result", job(200), flush=True)
except durably.StoreError as exc:
    print("refused:", exc, flush=True)
"""


def _killed_after_effects(tmp_path: Path) -> tuple[Path, Path, Path, dict[str, str]]:
    """DAMAGED_WAL's job SIGKILLed after its 200 side effects, all committed to the
    journal's write-ahead log: (script, side-effect log, store, environment to run it
    again)."""
    script = write_script(tmp_path / "job.py", DAMAGED_WAL)
    log = tmp_path / "effects.log"
    store = tmp_path / "store"
    env = script_env(store, LOG=str(log), HOLD="1")
    proc = _paused([sys.executable, str(script)], env)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert len(log.read_text().splitlines()) == 200
    env.pop("HOLD")
    return script, log, store, env


def _garble(path: Path, at: int, size: int = 16) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\xde\xad\xbe\xef" * (size // 4))


def test_a_damaged_write_ahead_log_is_found_when_its_lock_was_held_at_open(
        tmp_path: Path) -> None:
    """As above (the log damaged in the middle), while another connection holds the
    journal's write lock as the process opens it: the process does not wait for the lock to
    check the log there, but it checks it before its first write, and is refused then; no
    finished step executes again."""
    import sqlite3
    import threading

    script, log, store, env = _killed_after_effects(tmp_path)
    wal = store / "journal.sqlite3-wal"
    _garble(wal, wal.stat().st_size // 3)
    log.write_text("")
    holder = sqlite3.connect(str(store / "journal.sqlite3"), isolation_level=None,
                             check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")

    def release() -> None:
        holder.execute("ROLLBACK")
        holder.close()

    timer = threading.Timer(3.0, release)  # (the process opens the journal meanwhile)
    timer.start()
    try:
        again = run_script(script, env)
    finally:
        timer.join()
    assert again.stdout.startswith("refused:"), again.stdout
    assert "is damaged at frame" in again.stdout
    assert log.read_text() == ""  # no step executed again


def test_a_write_is_refused_while_the_write_ahead_log_cannot_be_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of the log could not get the journal's write lock when the store was
    opened, nor before its first write (another connection held it past the busy timeout:
    simulated): the write fails with the lock's StoreError instead of writing over a log
    that may hide lost commits; reads go on; once the check is made, writes do."""
    import durably
    from durably._store.disk import store as _store
    from durably._store.disk.wal import BUSY
    from durably._store.records import RunRecord
    from durably.exceptions import StoreError

    path = tmp_path / "s"
    writer = durably.DiskStore(path)  # (kept open: its log keeps its frames)
    writer.put_run(RunRecord("r", "m:f", "f", "finished", 1.0, 1.0, 1, "d" * 32))
    monkeypatch.setattr(_store, "lost_commits", lambda con, journal, wait=True: BUSY)
    store = durably.DiskStore(path)
    assert store.find_run("r").attempt == 1  # (a read: the check waits for a write)
    with pytest.raises(StoreError, match="database is locked"):
        store.put_run(RunRecord("r", "m:f", "f", "finished", 1.0, 2.0, 2, "d" * 32))
    with pytest.raises(StoreError, match="database is locked"), store.batch():
        pass
    assert writer.find_run("r").attempt == 1
    monkeypatch.undo()
    store.put_run(RunRecord("r", "m:f", "f", "finished", 1.0, 2.0, 2, "d" * 32))
    assert writer.find_run("r").attempt == 2
    store.close()
    writer.close()


@pytest.mark.parametrize("where", ["middle", "last commit"])
def test_a_damaged_write_ahead_log_never_executes_a_finished_step_again(
        tmp_path: Path, where: str) -> None:
    """SIGKILLed after 200 side-effect steps, all committed to the journal's write-ahead log;
    then bytes of the log are garbled. SQLite stops reading at the damaged frame, so the
    commits after it would vanish and their steps execute again: the store is refused
    instead, with the fix, also after the last connection closed (a copy of the damaged
    log is kept), until the user accepts the loss. A damaged last commit reads as the
    commit a killed process was writing (no refusal: only that step executes again)."""
    script, log, store, env = _killed_after_effects(tmp_path)
    wal = store / "journal.sqlite3-wal"
    size = wal.stat().st_size
    if where == "middle":
        _garble(wal, size // 3)
    else:  # the page of the last frame: the last commit's
        page = int.from_bytes(wal.read_bytes()[8:12], "big")
        _garble(wal, size - page // 2)
    log.write_text("")
    again = run_script(script, env)
    if where == "last commit":
        assert again.stdout.strip() == "result 19900"
        assert len(log.read_text().splitlines()) <= 1  # at most the step of that commit
        return
    assert again.stdout.startswith("refused:"), again.stdout
    assert "is damaged at frame" in again.stdout and "PRAGMA wal_checkpoint" in again.stdout
    assert log.read_text() == ""  # no step executed again
    kept = store / "journal.sqlite3-wal.damaged"
    assert kept.exists()
    cli = subprocess.run([str(Path(sys.executable).parent / "durably"), "runs"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and "was found damaged" in cli.stderr  # still refused
    # the user accepts the loss: the fix the message gives
    import sqlite3

    sqlite3.connect(str(store / "journal.sqlite3")).execute("PRAGMA wal_checkpoint(TRUNCATE)")
    kept.unlink()
    done = run_script(script, env)
    assert done.stdout.strip() == "result 19900"
    assert 0 < len(log.read_text().splitlines()) < 200  # the lost commits' steps only


HITS_THEN_WORK = """
import os, sys, time
import durably

@durably.task
def hit(i):
    return i * 2

@durably.task
def work(i):
    return -i

@durably.entrypoint
def job(n, m):
    total = sum(hit(i) for i in range(n))  # served from the cache (warmed below)
    total += sum(work(i) for i in range(m))  # executed
    print("worked", flush=True)
    while not os.path.exists(os.environ["GO"]):  # (killed here)
        time.sleep(0.05)
    return total

if __name__ == "__main__":
    n, m = int(sys.argv[1]), int(sys.argv[2])
    if sys.argv[3] == "warm":
        print("warm", sum(hit(i) for i in range(n)), flush=True)  # the cache alone
    else:
        print("result", job(n, m), flush=True)
"""


@pytest.mark.parametrize(("hits", "executed"), [(50, 3), (1, 1)])
def test_cache_hits_before_an_executed_step_are_journaled_with_it(
        tmp_path: Path, hits: int, executed: int) -> None:
    """The journal rows of steps served from the cache are buffered, and go in with the
    next executed step's record: a run killed (SIGKILL) after its executed steps were
    journaled has every hit before them in its journal (and the dashboard counted them as
    they happened), without waiting for a later hit or the run's end."""
    import durably

    script = write_script(tmp_path / "hits.py", HITS_THEN_WORK)
    store = durably.DiskStore(tmp_path / "store")
    env = script_env(store.path, GO=str(tmp_path / "go"))
    args = [sys.executable, str(script), str(hits), str(executed)]
    warm = subprocess.run([*args, "warm"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert warm.returncode == 0, warm.stderr
    proc = subprocess.Popen([*args, "run"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "worked\n", proc.stderr
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    (run,) = durably.list_runs(store=store)
    assert run.status == "crashed"
    assert [(s.task, s.status) for s in run.steps] == (
        [("hit", "cached")] * hits + [("work", "ran")] * executed)
    assert run.counts() == {"ran": executed, "cached": hits, "replayed": 0, "failed": 0}
    (tmp_path / "go").touch()
    resumed = subprocess.run([*args, "run"], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    total = hits * (hits - 1) - executed * (executed - 1) // 2
    assert resumed.stdout.endswith(f"result {total}\n"), resumed.stderr
    again = durably.get_run(run.id, store=store)
    assert again.counts() == {"ran": 0, "cached": 0, "replayed": hits + executed, "failed": 0}
