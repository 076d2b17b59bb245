"""Task calls from threads the run did not hand its context to (a plain ThreadPoolExecutor,
joblib with threads): they join the run as its steps when their place in it is unambiguous,
else a warning says, once per run, that they are outside it (issue #33, point 6)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import durably

from .conftest import script_env, write_script


def test_pool_calls_in_an_entrypoint_are_steps_of_the_run(store: Any) -> None:
    """A cache=False side effect called from a plain pool with distinct inputs: each
    executes once over two calls of the entrypoint (the second replays the finished run),
    and the run lists the calls as its steps, journaled by its attempt."""
    done: list[int] = []

    @durably.task(cache=False)
    def send(i: int) -> int:
        done.append(i)
        return i * 10

    @durably.entrypoint
    def job(n: int) -> list[int]:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return list(pool.map(send, range(n)))

    first = job.run(8)
    assert first.result == [i * 10 for i in range(8)]
    assert sorted(done) == list(range(8))
    steps = first.steps
    assert sorted(s.inputs or "" for s in steps) == sorted(f"i={i}" for i in range(8))
    assert {(s.task.rsplit(".", 1)[-1], s.status, s.parent_id, s.attempt) for s in steps} == {
        ("send", "ran", None, first.attempt)}
    again = job.run(8)
    assert again.id == first.id and again.result == first.result
    assert sorted(done) == list(range(8))  # never again
    assert again.counts()["replayed"] == 8


def test_a_pool_inside_a_task_nests_its_calls_under_that_task(store: Any) -> None:
    """The parent of a joined call is the step the run is executing (a task whose body
    waits for its pool); a task called inside a joined step is that step's child."""
    done: list[int] = []

    @durably.task(cache=False)
    def send(i: int) -> int:
        done.append(i)
        return i

    @durably.task
    def prepare(i: int) -> int:
        return send(i) + 1  # nested inside a step the pool's thread joined

    @durably.task
    def stage(n: int) -> list[int]:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            return list(pool.map(prepare, range(n)))

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return stage(n)

    run = job.run(5)
    assert run.result == [1, 2, 3, 4, 5]
    by_task: dict[str, list[Any]] = {}
    for s in run.steps:
        by_task.setdefault(s.task.rsplit(".", 1)[-1], []).append(s)
    (stage_step,) = by_task["stage"]
    assert stage_step.parent_id is None
    assert {s.parent_id for s in by_task["prepare"]} == {stage_step.step_id}
    prepared = {s.step_id for s in by_task["prepare"]}
    assert len(by_task["send"]) == 5 and {s.parent_id for s in by_task["send"]} == prepared
    assert job.run(5).result == run.result and sorted(done) == list(range(5))


CRASH = """
import concurrent.futures, os, sys, time
import durably

SIDE = os.environ["SIDE_FILE"]
PAUSE = os.environ.get("PAUSE") == "1"

def mark(text):
    with open(SIDE, "a") as f:
        f.write(text + "\\n")
        f.flush()
        os.fsync(f.fileno())

@durably.task(cache=False)
def send(i):
    mark(f"sent {i}")
    return i

@durably.entrypoint
def job(n):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = list(pool.map(send, range(n // 2)))
    if PAUSE:
        print("paused", flush=True)
        time.sleep(120)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        second = list(pool.map(send, range(n // 2, n)))
    return sum(first + second)

if __name__ == "__main__":
    print("result", job(40), flush=True)
"""


@pytest.mark.slow
def test_a_pool_run_killed_midway_never_repeats_a_finished_call(tmp_path: Path) -> None:
    """SIGKILL between two pools of side effects; the rerun executes only the second."""
    script = write_script(tmp_path / "pool_job.py", CRASH)
    side = tmp_path / "side.txt"
    env = script_env(tmp_path / "store", SIDE_FILE=str(side), PAUSE="1")
    with subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=tmp_path) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        if line.strip() != "paused":
            proc.kill()
            pytest.fail(f"expected 'paused', got {line!r}: {proc.stderr.read()}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert sorted(side.read_text().splitlines()) == sorted(f"sent {i}" for i in range(20))

    env["PAUSE"] = "0"
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"result {sum(range(40))}"
    assert sorted(side.read_text().splitlines()) == sorted(f"sent {i}" for i in range(40))
    again = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == done.stdout, again.stderr
    assert len(side.read_text().splitlines()) == 40  # each call exactly once, ever


def _outside_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "does not know" in str(w.message)]


def test_a_pool_inside_fan_out_items_warns_once_per_run(store: Any) -> None:
    """Inside the items of a map, which run at once, nothing tells which item made a pool's
    call: it is not joined, and one warning a run names the task, says it is not journaled
    and gives the fixes."""
    done: list[int] = []

    @durably.task(cache=False)
    def send(i: int) -> int:
        done.append(i)
        return i

    @durably.task
    def item(k: int) -> list[int]:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            return list(pool.map(send, range(k * 10, k * 10 + 3)))

    @durably.entrypoint
    def job(ks: list[int]) -> list[list[int]]:
        return item.map(ks)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = job.run([1, 2, 3])
    (message,) = _outside_warnings(caught)
    assert run.result == [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    assert ".send'" in message and "not journaled" in message
    assert "send.map(" in message and "send.submit(" in message
    assert "contextvars.copy_context().run" in message
    assert all(s.task.endswith(".item") for s in run.steps)  # the calls are outside it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job.run([4, 5])  # another run: said again, once
    assert len(_outside_warnings(caught)) == 1


def test_a_thread_alive_before_the_run_warns_instead_of_joining(store: Any) -> None:
    """A pool whose threads were started before the run (created outside the entrypoint)
    may serve anyone: its calls are not joined, and a warning says so."""
    @durably.task(cache=False)
    def send(i: int) -> int:
        return i

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(len, [1]).result() == 1  # its thread is started

        @durably.entrypoint
        def job() -> list[int]:
            return list(pool.map(send, range(3)))

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = job.run()
    (message,) = _outside_warnings(caught)
    assert "alive before the run began" in message
    assert run.result == [0, 1, 2] and run.steps == []


def test_joblib_threads_join_the_run(store: Any) -> None:
    joblib = pytest.importorskip("joblib", reason="joblib is not installed")
    done: list[int] = []

    @durably.task(cache=False)
    def send(i: int) -> int:
        done.append(i)
        return -i

    @durably.entrypoint
    def job(n: int) -> list[int]:
        out: list[int] = joblib.Parallel(n_jobs=2, prefer="threads")(
            joblib.delayed(send)(i) for i in range(n))
        return out

    run = job.run(6)
    assert run.result == [0, -1, -2, -3, -4, -5]
    assert sorted(s.inputs or "" for s in run.steps) == sorted(f"i={i}" for i in range(6))
    assert job.run(6).result == run.result
    assert sorted(done) == list(range(6))


def test_pool_calls_outside_any_run_are_unchanged(store: Any) -> None:
    """No run active: a pool's calls are plain cached calls, without a warning (pytest
    makes warnings errors)."""
    calls: list[int] = []

    @durably.task
    def square(i: int) -> int:
        calls.append(i)
        return i * i

    @durably.task(cache=False)
    def send(i: int) -> int:
        calls.append(-i)
        return i

    for _ in range(2):
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            assert list(pool.map(square, range(4))) == [0, 1, 4, 9]
            assert list(pool.map(send, range(1, 3))) == [1, 2]
    assert sorted(calls) == [-2, -2, -1, -1, 0, 1, 2, 3]  # squares once, sends each time


def test_a_pool_thread_leaves_the_run_when_it_ends(store: Any) -> None:
    """A pool thread that joined a run keeps no trace of it once the run ended: its next
    call outside any run is a plain call again, and for the next run it is a thread alive
    before the run began (a warning, not a join)."""
    done: list[int] = []

    @durably.task(cache=False)
    def send(i: int) -> int:
        done.append(i)
        return i

    pool = concurrent.futures.ThreadPoolExecutor(1)  # its thread starts inside the run
    try:
        @durably.entrypoint
        def job() -> int:
            return pool.submit(send, 1).result()

        run = job.run()
        assert [s.task.rsplit(".", 1)[-1] for s in run.steps] == ["send"]
        assert pool.submit(send, 1).result() == 1  # outside any run: executes
        assert done == [1, 1]

        @durably.entrypoint
        def other() -> int:
            return send(2)

        # an entrypoint called there is a run of its own, not a part of the ended run
        assert [s.task.rsplit(".", 1)[-1] for s in pool.submit(other.run).result().steps] == [
            "send"]
        assert done == [1, 1, 2]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert job.run().result == 1
        (message,) = _outside_warnings(caught)
        assert "alive before the run began" in message
    finally:
        pool.shutdown()


def test_a_run_does_not_keep_threads_alive_past_the_interpreter_s_exit(tmp_path: Path) -> None:
    """A run noted the threads alive when it began; holding them (a process pool's manager
    thread) made its exit callback fail at interpreter exit: 'Exception ignored in
    weakref_cb ... NoneType has no attribute util'."""
    script = write_script(tmp_path / "pool_exit.py", """
        import durably

        @durably.task
        def sq(x):
            return x * x

        @durably.entrypoint
        def ep(n):
            return sq.map(range(n), executor="process", progress=False)

        if __name__ == "__main__":
            print(sq.map([1, 2], executor="process", progress=False))
            print(ep.run(3).status)
        """)
    done = subprocess.run([sys.executable, str(script)], env=script_env(tmp_path / "s"),
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[1,", "4]", "finished"]
    assert "Exception ignored" not in done.stderr, done.stderr
