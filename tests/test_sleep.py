"""Durable sleep: ``durably.sleep`` / ``durably.asleep`` journal their wake time as a step,
so a resumed run wakes at the time its first attempt set (DBOS's ``DBOS.sleep``).

The in-process tests drive the wall clock and the waits through the module's seams
(``_clock``, ``_wait``, ``_await``), so they assert exact wake times and waits without
timing anything; the subprocess test kills a real process during a real sleep."""

from __future__ import annotations

import _thread
import asyncio
import contextlib
import datetime
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._runtime import sleep as sleep_module

from .conftest import script_env, write_script


class FakeClock:
    """A wall clock that only the waits move; every wait is recorded."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now
        self.waits: list[float] = []
        self.interrupt_after: float | None = None  # Ctrl-C once this much was waited

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        assert seconds > 0
        self.waits.append(seconds)
        self.now += seconds
        if self.interrupt_after is not None and sum(self.waits) >= self.interrupt_after:
            self.interrupt_after = None
            raise KeyboardInterrupt

    async def await_(self, seconds: float) -> None:
        self.wait(seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(sleep_module, "_clock", fake.clock)
    monkeypatch.setattr(sleep_module, "_wait", fake.wait)
    monkeypatch.setattr(sleep_module, "_await", fake.await_)
    yield fake


def _wake_times(store: durably.Store, run_id: str) -> list[float]:
    """The wake times journaled by the run's sleep steps, in call order."""
    run = durably.get_run(run_id, store=store)
    found = []
    for step in run.steps:
        if step.task == "durably.sleep":
            data = store.find_step(run_id, step.step_id)
            assert data is not None
            found.append(pickle.loads(data))
    return found


def test_a_sleep_journals_its_wake_time_and_waits_until_it(disk_store: Any,
                                                           clock: FakeClock) -> None:
    @durably.entrypoint
    def nap(seconds: float) -> str:
        durably.sleep(seconds)
        return "awake"

    start = clock.now
    run = nap.run(60)
    assert run.result == "awake"
    assert [s.task for s in run.steps] == ["durably.sleep"]
    assert _wake_times(disk_store, run.id) == [start + 60]
    assert sum(clock.waits) == 60 and clock.now == start + 60
    assert max(clock.waits) <= sleep_module._SLICE  # (a run told to stop stops between)


def test_a_finished_sleep_is_not_slept_again_on_replay(disk_store: Any,
                                                       clock: FakeClock) -> None:
    @durably.entrypoint
    def nap(seconds: float) -> str:
        durably.sleep(seconds)
        return "awake"

    nap.run(30)
    clock.waits.clear()
    again = nap.run(30)
    assert again.result == "awake" and again.attempt == 2
    assert again.counts()["replayed"] == 1
    assert clock.waits == []


def test_interrupted_sleep_resumes_at_the_original_wake_time(disk_store: Any,
                                                             clock: FakeClock) -> None:
    """Ctrl-C 10 s into a 60 s sleep: the run is stopped; resumed 5 s later, it waits the
    45 s left, not 60 again (and a duration that differs on resume changes nothing: the
    step is found by its position)."""
    after: list[str] = []

    @durably.task(cache=False)
    def then(tag: str) -> str:
        after.append(tag)
        return tag

    @durably.entrypoint
    def nap(seconds: float) -> str:
        then("before")
        durably.sleep(seconds)
        return then("after")

    start = clock.now
    clock.interrupt_after = 10
    with pytest.raises(KeyboardInterrupt):
        nap(60)
    run = durably.list_runs(nap, store=disk_store)[0]
    assert run.status == "stopped"
    assert _wake_times(disk_store, run.id) == [start + 60]
    assert after == ["before"]
    clock.now += 5  # (the process is restarted meanwhile)
    clock.waits.clear()
    resumed = nap.run(60)
    assert resumed.id == run.id and resumed.result == "after"
    assert sum(clock.waits) == 45 and clock.now == start + 60
    assert after == ["before", "after"]  # the step before the sleep was not executed again
    assert _wake_times(disk_store, run.id) == [start + 60]


def test_resumed_after_the_wake_time_goes_on_at_once(disk_store: Any,
                                                     clock: FakeClock) -> None:
    @durably.entrypoint
    def nap(seconds: float) -> str:
        durably.sleep(seconds)
        return "awake"

    clock.interrupt_after = 1
    with pytest.raises(KeyboardInterrupt):
        nap(3600)
    clock.now += 7200
    clock.waits.clear()
    assert nap(3600) == "awake"
    assert clock.waits == []


def test_the_wake_time_is_matched_by_position_not_by_duration(disk_store: Any,
                                                             clock: FakeClock) -> None:
    """sleep(deadline - time.time()): the duration differs on every attempt; the run
    wakes at the time the first attempt journaled."""
    deadline = clock.now + 100

    @durably.entrypoint
    def until(label: str) -> str:
        durably.sleep(deadline - sleep_module._clock())
        return label

    clock.interrupt_after = 20
    with pytest.raises(KeyboardInterrupt):
        until("x")
    clock.now += 30  # (restarted 30 s later: the duration computed now is 50 s)
    clock.waits.clear()
    assert until("x") == "x"
    assert sum(clock.waits) == 50 and clock.now == deadline


def test_several_sleeps_are_steps_of_their_own(disk_store: Any, clock: FakeClock) -> None:
    @durably.task
    def poll(i: int) -> int:
        durably.sleep(datetime.timedelta(seconds=10))  # (nested: a step under the task)
        return i

    @durably.entrypoint
    def loop(n: int) -> list[int]:
        out = []
        for i in range(n):
            durably.sleep(5)
            out.append(poll(i))
        return out

    start = clock.now
    run = loop.run(2)
    assert run.result == [0, 1]
    assert sum(clock.waits) == 30
    assert _wake_times(disk_store, run.id) == [start + 5, start + 15, start + 20,
                                               start + 30]
    parents = [s.parent_id for s in run.steps if s.task == "durably.sleep"]
    assert parents[0] is None and parents[1] is not None


def test_outside_a_run_it_is_a_plain_sleep(disk_store: Any, clock: FakeClock) -> None:
    durably.sleep(2.5)
    durably.sleep(datetime.timedelta(milliseconds=500))
    durably.sleep(-3)  # due already
    assert clock.waits == [2.5, 0.5]
    assert durably.list_runs(store=disk_store) == []


def test_async_sleep_is_durable_too(disk_store: Any, clock: FakeClock) -> None:
    @durably.entrypoint
    async def anap(seconds: float) -> str:
        await durably.asleep(seconds)
        return "awake"

    start = clock.now
    clock.interrupt_after = 4
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(anap(10))
    run = durably.list_runs(anap, store=disk_store)[0]
    assert _wake_times(disk_store, run.id) == [start + 10]
    clock.waits.clear()
    assert asyncio.run(anap(10)) == "awake"
    assert sum(clock.waits) == 6 and clock.now == start + 10


def test_outside_a_run_asleep_is_a_plain_asyncio_sleep(clock: FakeClock) -> None:
    asyncio.run(durably.asleep(1.5))
    assert clock.waits == [1.5]


@pytest.mark.parametrize("bad", ["10", None, True, float("nan"), float("inf"), 1e20])
def test_bad_durations_are_refused_with_the_fix(bad: Any) -> None:
    with pytest.raises(durably.DefinitionError, match=r"durably\.sleep\(seconds\)"):
        durably.sleep(bad)
    with pytest.raises(durably.DefinitionError, match=r"durably\.asleep\(seconds\)"):
        asyncio.run(durably.asleep(bad))


def test_a_closed_stream_stops_a_sleeping_run(disk_store: Any, clock: FakeClock) -> None:
    """A run told to stop stops at the next slice of its wait, resumable."""
    @durably.task
    def before() -> int:
        return 1

    @durably.entrypoint
    def nap() -> str:
        before()
        durably.sleep(3600)
        return "awake"

    events = nap.stream()
    for event in events:
        if event.kind == "step_finished" and event.task == "durably.sleep":
            break  # (the stream stops the run: see stream())
    events.close()
    run = durably.list_runs(nap, store=disk_store)[0]
    assert run.status == "stopped"
    assert clock.waits == []  # (stopped before its first wait: the stream is in lockstep)


def test_ctrl_c_during_a_map_stops_the_items_that_sleep(disk_store: Any,
                                                          clock: FakeClock) -> None:
    """Ctrl-C while items of a map on threads sleep: they stop at their next slice (a
    running body is otherwise waited for), and the run is stopped, resumable."""
    from durably._runtime.context import live_run

    first = threading.Event()

    def wait(seconds: float) -> None:  # (in an item's thread)
        clock.waits.append(seconds)
        clock.now += seconds
        if not first.is_set():
            first.set()
            ctx = live_run()
            assert ctx is not None
            _thread.interrupt_main()  # Ctrl-C, in the run's own thread
            deadline = time.monotonic() + 60
            while not ctx.halting:  # the map marks its running items as stopping
                assert time.monotonic() < deadline, "the map never stopped its items"
                time.sleep(0.001)

    clock.wait = wait  # type: ignore[method-assign]
    sleep_module._wait = wait  # (the fixture puts it back)

    @durably.task
    def nap(i: int) -> int:
        durably.sleep(3600)
        return i

    @durably.entrypoint
    def naps(n: int) -> list[int]:
        return nap.map(range(n), max_workers=1, progress=False)

    with pytest.raises(KeyboardInterrupt):
        naps(3)
    run = durably.list_runs(naps, store=disk_store)[0]
    assert run.status == "stopped"
    assert len(clock.waits) == 1  # the item stopped after the wait that saw Ctrl-C


SLEEPER = """
import os, sys, time
import durably

@durably.task(cache=False)
def mark(text):
    with open(os.environ["MARKS"], "a") as f:
        f.write(text + "\\n")
    return text

@durably.entrypoint
def nap(seconds):
    mark("before")
    t0 = time.time()
    durably.sleep(seconds)
    t1 = time.time()
    print(f"slept {t0!r} {t1!r}", flush=True)
    return mark("after")

if __name__ == "__main__":
    print("result", nap.run(float(sys.argv[1]), run_id="nap").result, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_a_sleep_resumes_at_the_original_wake_time(tmp_path: Path) -> None:
    script = write_script(tmp_path / "sleeper.py", SLEEPER)
    marks = tmp_path / "marks.txt"
    env = script_env(tmp_path / "store", MARKS=str(marks))
    seconds = 4.0
    with subprocess.Popen([sys.executable, str(script), str(seconds)], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        store = None
        try:
            # the marker: the sleep step is journaled (the process is then waiting)
            deadline = time.monotonic() + 120
            wake_at: list[float] = []
            while not wake_at:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the sleep step was never journaled"
                if (tmp_path / "store" / "journal.sqlite3").exists():
                    store = store or durably.DiskStore(tmp_path / "store")
                    with contextlib.suppress(durably.NotFoundError):
                        wake_at = _wake_times(store, "nap")
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert store is not None
    assert durably.get_run("nap", store=store).status == "crashed"
    assert marks.read_text().split() == ["before"]
    # resume with at most half of the sleep left (waiting for a time, not guessing one), so
    # that sleeping the whole duration again could not pass for waking at the wake time
    while time.time() < wake_at[0] - seconds / 2:
        time.sleep(0.05)
    done = subprocess.run([sys.executable, str(script), str(seconds)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    slept, result = done.stdout.splitlines()
    assert result == "result after"
    t0, t1 = (float(t) for t in slept.split()[1:])
    assert t1 >= wake_at[0]  # never before the original wake time
    assert t1 - t0 <= max(0.0, wake_at[0] - t0) + 1.0  # only what was left of it
    assert marks.read_text().split() == ["before", "after"]
    assert _wake_times(store, "nap") == wake_at  # the same step, replayed
    steps = durably.get_run("nap", store=store).steps
    assert [(s.task, s.status) for s in steps] == [
        ("mark", "replayed"), ("durably.sleep", "replayed"), ("mark", "ran")]
    store.close()
