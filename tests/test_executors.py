"""Fan-out: Task.map and Task.submit on threads and worker processes, with exact resume."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import pickle
import queue
import re
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
from durably._executors import fanout as _executors
from durably._executors import items as _items
from durably._executors import progress as _progress
from durably._executors import worker as _worker
from durably._runtime.interrupt import Interrupt, InterruptSignal
from durably.executors import Dask, Process, Thread
from durably.testing import MemoryStore

from .conftest import run_script, script_env, write_script


# -- tasks (module level: worker processes import them by name) ------------------------------
def _mark(log: str, text: str) -> None:
    with open(log, "a") as f:
        f.write(text + "\n")


def _lines(log: str | Path) -> list[str]:
    path = Path(log)
    return path.read_text().splitlines() if path.exists() else []


@durably.task(ignore=("log",))
def square(x: int, log: str) -> int:
    _mark(log, f"square {x}")
    return x * x


@durably.task
def add(a: int, b: int) -> int:
    return a + b


class TwoArgError(Exception):
    """Pickles in the worker, but cannot be rebuilt from its args in the caller."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(a)
        self.b = b


@durably.task
def asks_in_worker(x: int) -> Any:
    return durably.interrupt(f"item {x}?")


@durably.task
def odd_failure(x: int) -> int:
    if x == 1:
        raise TwoArgError("a", "b")
    return x


@durably.task(ignore=("log", "flags"))
def fragile(x: int, log: str, flags: str) -> int:
    """Fails while the file ``flags/x`` exists."""
    _mark(log, f"fragile {x}")
    if os.path.exists(os.path.join(flags, str(x))):
        raise ValueError(f"item {x} failed")
    return x + 100


@durably.task(ignore=("log", "flags"))
def fails_once(x: int, log: str, flags: str) -> int:
    """Fails the first time it runs with the file ``flags/x`` there (and removes it)."""
    _mark(log, f"fails_once {x}")
    flag = os.path.join(flags, str(x))
    if os.path.exists(flag):
        os.unlink(flag)
        raise ValueError(f"item {x} failed once")
    return x + 100


@durably.task(ignore=("log",))
def slow_square(x: int, log: str) -> int:
    _mark(log, f"slow_square {x}")
    time.sleep(0.05)
    return x * x


@durably.task(ignore=("log",))
def fan_in(k: int, log: str) -> int:
    """A map inside a map's item: 30 slow items, one at a time."""
    return sum(slow_square.map(range(k * 100, k * 100 + 30), [log] * 30, max_workers=1))


@durably.task(ignore=("log",))
def loop_in(k: int, log: str) -> int:
    """A loop of 30 slow task calls inside a map's item."""
    return sum(slow_square(x, log) for x in range(k * 100, k * 100 + 30))


@durably.task(ignore=("log",))
def slower_square(x: int, log: str) -> int:
    _mark(log, f"slower_square {x}")
    time.sleep(0.5)
    return x * x


@durably.task(ignore=("log",))
def fan_in_slower(k: int, log: str) -> int:
    """A map inside a map's item: 10 items of 0.5 s, one at a time."""
    return sum(slower_square.map(range(k * 100, k * 100 + 10), [log] * 10, max_workers=1))


@durably.task(ignore=("log",), timeout=0.3)
def fan_in_timed(k: int, log: str) -> int:
    """fan_in, abandoned by its timeout long before its map's end."""
    return sum(slow_square.map(range(k * 100, k * 100 + 30), [log] * 30, max_workers=1))


@durably.task(cache=False, ignore=("log",))
def side_effect(x: int, log: str) -> int:
    _mark(log, f"side_effect {x}")
    return x


@durably.task(ignore=("log",))
def inner(x: int, log: str) -> int:
    _mark(log, f"inner {x}")
    return x + 1


@durably.task(ignore=("log",))
def outer(x: int, log: str) -> int:
    _mark(log, f"outer {x}")
    return inner(x, log) * 2


@durably.task(cache=False, ignore=("log",))
def outer_side(x: int, log: str) -> int:
    return inner(x, log) * 3


@durably.task
def pid_of(x: int) -> tuple[int, int]:
    return x, os.getpid()


@durably.task
def asks(x: int) -> int:
    if x % 3 == 1:
        raise InterruptSignal([Interrupt(id=f"q{x}", payload=f"question {x}")])
    if x == 5:
        raise ValueError("five")
    return x


@durably.task(ignore=("log",))
async def asquare(x: int, log: str) -> int:
    _mark(log, f"asquare {x}")
    await asyncio.sleep(0)
    return x * x


@durably.task(ignore=("log",))
async def asquare_slow(x: int, log: str) -> int:
    _mark(log, f"asquare_slow {x}")
    await asyncio.sleep(0.05)
    return x * x


@durably.task(ignore=("log",))
async def askewed(x: int, log: str) -> int:
    """Item 1 is slower than the others: item 0 finishes alone, and item 2 starts."""
    _mark(log, f"askewed {x}")
    await asyncio.sleep(0.15 if x == 1 else 0.05)
    return x * x


@durably.task(ignore=("log",))
async def asquare_lingering(x: int, log: str) -> int:
    """Takes 0.3 s to clean up when cancelled."""
    _mark(log, f"asquare_lingering {x}")
    try:
        await asyncio.sleep(1.0)
    except asyncio.CancelledError:
        await asyncio.sleep(0.3)
        raise
    return x * x


class Scaler:
    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __durably_digest__(self) -> object:
        return self.factor

    @durably.task
    def scale(self, x: int) -> int:
        return self.factor * x


@pytest.fixture
def log(tmp_path: Path) -> str:
    return str(tmp_path / "calls.log")


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[durably.DiskStore]:
    store = durably.DiskStore(tmp_path / "shared-store")
    durably.configure(store=store)
    yield store
    durably.configure()
    store.close()


# -- map on threads -------------------------------------------------------------------------
def test_map_returns_results_in_input_order_whatever_finishes_first(store: Any) -> None:
    gate = threading.Event()

    @durably.task(version="1")  # closes over an Event: no fingerprint
    def slow_first(x: int) -> int:
        if x == 0:
            gate.wait(30)  # item 0 finishes after item 3
        elif x == 3:
            gate.set()
        return x * 10

    assert slow_first.map(range(4), max_workers=4) == [0, 10, 20, 30]


def test_map_zips_several_iterables_of_one_length_and_refuses_others(store: Any) -> None:
    """Iterables of different lengths are refused (the built-in map() drops the rest of the
    longer ones silently: a sweep missing points), naming the task and the lengths."""
    assert add.map(iter([1, 2]), (5, 5)) == [6, 7]
    assert add.map([], []) == []
    with pytest.raises(durably.DefinitionError, match=r"add\.map\(\) was given iterables of "
                       r"different lengths \[3, 4\]"):
        add.map([1, 2, 3], [10, 20, 30, 40])
    # an endless one (a constant, as with the built-in map) is refused, not read to the end
    # of memory
    with pytest.raises(durably.DefinitionError, match=r"different lengths \[2, '\?'\].*"
                       r"\[value\] \* n rather than itertools\.repeat"):
        add.map([1, 2], itertools.repeat(5))


def test_map_outside_a_run_is_cached(store: Any, log: str) -> None:
    assert square.map([1, 2, 3], [log] * 3) == [1, 4, 9]
    assert square.map([3, 2, 1, 4], [log] * 4) == [9, 4, 1, 16]
    assert sorted(_lines(log)) == ["square 1", "square 2", "square 3", "square 4"]
    assert square(2, log) == 4 and len(_lines(log)) == 4


def test_step_identity_does_not_depend_on_completion_order(store: Any) -> None:
    n = 6
    finished = [threading.Event() for _ in range(n)]
    order: list[int] = []

    @durably.task(ignore=("reverse",), version="1")
    def item(x: int, reverse: bool) -> int:
        if reverse and x + 1 < n:
            finished[x + 1].wait(30)  # item x finishes after item x + 1
        order.append(x)
        finished[x].set()
        return x

    @durably.entrypoint
    def job(count: int, reverse: bool) -> list[int]:
        return item.map(range(count), [reverse] * count, max_workers=count)

    first = job.run(n, True)
    assert first.result == list(range(n)) and order == list(reversed(range(n)))
    second = job.run(n, False, fresh=True)  # other completion order; served by the cache
    assert second.counts()["cached"] == n and second.id != first.id
    assert [s.step_id for s in sorted(first.steps, key=lambda s: s.position)] == [
        s.step_id for s in sorted(second.steps, key=lambda s: s.position)]
    again = job.run(n, True)
    assert again.id == first.id and again.counts()["replayed"] == n and again.counts()["ran"] == 0


def test_nested_tasks_in_thread_items_are_child_steps(store: Any, log: str) -> None:
    @durably.entrypoint
    def job(xs: list[int]) -> list[int]:
        return outer.map(xs, [log] * len(xs))

    run = job.run([1, 2, 3])
    assert run.result == [4, 6, 8]
    by_id = {s.step_id: s for s in run.steps}
    outers = [s for s in run.steps if s.task.endswith("outer")]
    inners = [s for s in run.steps if s.task.endswith("inner")]
    assert len(outers) == 3 and len(inners) == 3
    assert all(s.parent_id is None for s in outers)
    assert {by_id[s.parent_id].task for s in inners if s.parent_id} == {outers[0].task}
    assert all(s.parent_id in by_id for s in inners)


def test_duplicate_items_execute_once_the_others_are_served_from_the_cache(
        store: Any, log: str) -> None:
    """Items with one cache key execute once; the others are served from the cache once it
    finished (as a second call with those inputs would be), in a run (journaled as cached,
    replayed on resume), outside one, and on the event loop."""
    @durably.entrypoint
    def job(xs: list[int]) -> list[int]:
        return square.map(xs, [log] * len(xs), max_workers=4)

    xs = [3, 1, 3, 2, 3, 1]
    run = job.run(xs)
    assert run.result == [9, 1, 9, 4, 9, 1]
    assert sorted(_lines(log)) == ["square 1", "square 2", "square 3"]
    assert (run.counts()["ran"], run.counts()["cached"]) == (3, 3)
    again = job.run(xs)
    assert again.counts()["replayed"] == 6 and len(_lines(log)) == 3
    assert square.map([7, 7, 7], [log] * 3) == [49, 49, 49]
    assert asyncio.run(asquare.map([5, 5, 6, 5], [log] * 4)) == [25, 25, 36, 25]
    assert sorted(_lines(log)[3:]) == ["asquare 5", "asquare 6", "square 7"]


def test_a_duplicate_item_runs_when_the_first_failed_and_side_effects_all_run(
        store: Any, log: str, tmp_path: Path) -> None:
    """A duplicate waits for the first item of its key; when that one failed, it executes
    (as a second call would), and a ``cache=False`` task's every item executes."""
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / "1").touch()
    with pytest.raises(ExceptionGroup) as info:
        fails_once.map([1, 1, 2], [log] * 3, [str(flags)] * 3)
    assert [str(e) for e in info.value.exceptions] == ["item 1 failed once"]
    assert sorted(_lines(log)) == ["fails_once 1", "fails_once 1", "fails_once 2"]
    assert fails_once.map([1, 1, 2], [log] * 3, [str(flags)] * 3) == [101, 101, 102]
    assert len(_lines(log)) == 3  # all cached now
    assert side_effect.map([4, 4], [log] * 2) == [4, 4]
    assert _lines(log)[3:] == ["side_effect 4", "side_effect 4"]


async def _until_a_step_finished(entry: Any, *args: Any) -> None:
    """Stream an async run until its first finished step, then close the stream."""
    async with contextlib.aclosing(entry.stream(*args)) as events:
        async for event in events:
            if event.kind == "step_finished":
                break


@pytest.mark.parametrize("how", ["sync", "async"])
def test_a_closed_stream_stops_a_map_from_starting_more_items(store: Any, log: str,
                                                              how: str) -> None:
    """Leaving a stream() loop stops the run at its next step boundary: a map inside it
    starts no more items (those running finish and are journaled), and the next call
    executes exactly the rest."""
    @durably.entrypoint
    def job(n: int) -> int:
        return sum(slow_square.map(range(n), [log] * n, max_workers=2))

    @durably.entrypoint
    async def ajob(n: int) -> int:
        return sum(await asquare_slow.map(range(n), [log] * n, max_workers=2))

    entry: Any = job if how == "sync" else ajob
    if how == "sync":
        for event in entry.stream(20):
            if event.kind == "step_finished":
                break
    else:
        asyncio.run(_until_a_step_finished(entry, 20))
    first = _lines(log)
    assert 1 <= len(first) <= 6, first  # not all 20
    (run,) = durably.list_runs(entry)
    assert run.status == "stopped"
    total = entry(20) if how == "sync" else asyncio.run(entry(20))
    assert total == sum(x * x for x in range(20))
    assert sorted(_lines(log)) == sorted(f"{first[0].split()[0]} {x}" for x in range(20))


def test_an_async_item_running_when_a_stream_closes_finishes_and_is_journaled(
        store: Any, log: str) -> None:
    """Item 0 finishes alone and item 2 starts; the stream is closed; item 1 finishes and
    the map stops with item 2 running: item 2 is not cancelled mid-body (it was, and the
    next call executed it again), it finishes and is journaled, as on a thread."""
    @durably.entrypoint
    async def ajob(n: int) -> int:
        return sum(await askewed.map(range(n), [log] * n, max_workers=2))

    asyncio.run(_until_a_step_finished(ajob, 20))
    first = _lines(log)
    (run,) = durably.list_runs(ajob)
    assert run.status == "stopped" and run.counts()["ran"] == len(first) == 3, first
    assert asyncio.run(ajob(20)) == sum(x * x for x in range(20))
    assert sorted(_lines(log)) == sorted(f"askewed {x}" for x in range(20))  # each once


def _ctrl_c(*after: float) -> list[threading.Timer]:
    """A terminal's Ctrl-C ``after`` seconds: SIGINT, to the main thread (it wakes a map's
    wait)."""
    timers = [threading.Timer(t, signal.pthread_kill, (threading.main_thread().ident,
                                                       signal.SIGINT)) for t in after]
    for timer in timers:
        timer.start()
    return timers


@pytest.mark.parametrize("inside", ["map", "loop", "twice"])
@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_ctrl_c_stops_the_maps_inside_the_items_it_waits_for(store: Any, log: str,
                                                             inside: str) -> None:
    """After Ctrl-C a map waits for its running bodies; a map or a loop of task calls
    inside them starts nothing more meanwhile (both went on to their end), nor after a
    second Ctrl-C that stops the wait; the rerun executes exactly the rest."""
    body = {"map": fan_in, "loop": loop_in, "twice": fan_in_slower}[inside]
    size = 10 if inside == "twice" else 30

    @durably.entrypoint
    def job() -> int:
        return sum(body.map([0, 1], [log] * 2, max_workers=2))

    # twice: the second while the map waits for the bodies (their items take 0.5 s)
    timers = _ctrl_c(0.3, 0.5) if inside == "twice" else _ctrl_c(0.4)
    try:
        with pytest.raises(KeyboardInterrupt):
            job()
        if inside == "twice":
            time.sleep(1.0)  # the bodies run on (a second Ctrl-C stops the wait), then end
    finally:
        for timer in timers:
            timer.cancel()
    first = _lines(log)
    assert 2 <= len(first) <= size, first  # not all of both inner maps
    time.sleep(0.3)
    assert _lines(log) == first  # nothing started since
    expected = sum(x * x for k in (0, 1) for x in range(k * 100, k * 100 + size))
    assert job() == expected
    name = {"map": "slow_square", "loop": "slow_square", "twice": "slower_square"}[inside]
    assert sorted(_lines(log)) == sorted(f"{name} {x}" for k in (0, 1)
                                         for x in range(k * 100, k * 100 + size))


def test_a_map_inside_a_body_abandoned_by_its_timeout_starts_nothing_more(
        store: Any, log: str) -> None:
    """A body past its ``timeout=`` is abandoned (a thread cannot be stopped): a map inside
    it starts no more items, even once the run has ended."""
    @durably.entrypoint
    def job() -> int:
        try:
            return fan_in_timed(0, log)
        except TimeoutError:
            return -1

    assert job() == -1
    time.sleep(0.3)
    started = len(_lines(log))
    time.sleep(0.5)
    assert started <= 10 and len(_lines(log)) == started, _lines(log)


def test_a_cancelled_async_map_does_not_stop_another_map_of_the_run(store: Any,
                                                                     log: str) -> None:
    """An async map cancelled by a timeout around it stops its own items; a map running
    beside it in the same run goes on to its end, and the run finishes."""
    @durably.entrypoint
    async def job() -> list[int]:
        async def guarded() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asquare_lingering.map(range(100, 140), [log] * 40,
                                                             max_workers=2), 0.2)

        _, fast = await asyncio.gather(guarded(), asquare_slow.map(range(20), [log] * 20,
                                                                   max_workers=2))
        return fast

    run = asyncio.run(job.run())
    assert run.status == "finished" and run.result == [x * x for x in range(20)]


def test_duplicates_in_a_forks_first_attempt_execute_side_by_side(store: Any,
                                                                   log: str) -> None:
    """A fork's first attempt reads no cache, so its duplicate items execute (as before):
    together, not one after another waiting for a cache entry that is never read."""
    barrier = threading.Barrier(2, timeout=5)

    @durably.task(ignore=("log",))
    def meet(x: int, log: str) -> int:
        _mark(log, f"meet {x}")
        if os.environ.get("DURABLY_TEST_MEET"):
            barrier.wait()  # the two copies after the fork's step at once, or an error
        return x

    @durably.entrypoint
    def job() -> list[int]:
        return meet.map([1, 1, 1], [log] * 3, max_workers=3)

    run = job.run()
    assert run.result == [1, 1, 1]
    os.environ["DURABLY_TEST_MEET"] = "1"
    try:
        fork = job.fork(run.id, at=run.steps[0].step_id)
    finally:
        del os.environ["DURABLY_TEST_MEET"]
    assert fork.result == [1, 1, 1] and _lines(log).count("meet 1") == 3  # 1, then 2


def test_map_of_a_method(store: Any) -> None:
    scaler = Scaler(3)
    assert scaler.scale.map([1, 2, 3]) == [3, 6, 9]
    assert Scaler(3).scale.map([4]) == [12]


def test_max_workers_bounds_the_items_running_at_once(store: Any) -> None:
    lock = threading.Lock()
    state = {"now": 0, "most": 0}

    @durably.task(version="1")
    def tracked(x: int) -> int:
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        threading.Event().wait(0.01)
        with lock:
            state["now"] -= 1
        return x

    assert tracked.map(range(12), max_workers=2) == list(range(12))
    assert 1 <= state["most"] <= 2
    state["most"] = 0
    assert tracked.map(range(100, 106), executor=Thread(max_workers=1)) == list(range(100, 106))
    assert state["most"] == 1


# -- failures -------------------------------------------------------------------------------
def test_failures_raise_one_group_and_a_rerun_executes_only_them(store: Any, log: str,
                                                                 tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    for x in (1, 4):
        (flags / str(x)).touch()

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return fragile.map(range(n), [log] * n, [str(flags)] * n)

    with pytest.raises(ExceptionGroup) as info:
        job(6)
    group = info.value
    assert [str(e) for e in group.exceptions] == ["item 1 failed", "item 4 failed"]
    assert "2 of 6 items" in str(group)
    (run,) = durably.list_runs(job)
    statuses = sorted((s.status, s.task.rpartition(".")[2]) for s in run.steps)
    assert statuses.count(("ran", "fragile")) == 4 and statuses.count(("failed", "fragile")) == 2
    assert sorted(_lines(log)) == [f"fragile {x}" for x in range(6)]

    for flag in flags.iterdir():
        flag.unlink()
    assert job(6) == [100, 101, 102, 103, 104, 105]
    assert sorted(_lines(log)[6:]) == ["fragile 1", "fragile 4"]
    # outside that run: the four that finished the first time were cached too
    assert fragile.map(range(6), [log] * 6, [str(flags)] * 6) == [100, 101, 102, 103, 104, 105]
    assert len(_lines(log)) == 8


def test_failures_outside_a_run_keep_the_finished_items_cached(store: Any, log: str,
                                                               tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / "2").touch()
    with pytest.raises(ExceptionGroup) as info:
        fragile.map(range(4), [log] * 4, [str(flags)] * 4)
    assert info.group_contains(ValueError, match="item 2 failed")
    (flags / "2").unlink()
    assert fragile.map(range(4), [log] * 4, [str(flags)] * 4) == [100, 101, 102, 103]
    assert sorted(_lines(log)) == sorted([f"fragile {x}" for x in range(4)] + ["fragile 2"])


def test_interrupts_of_several_items_are_merged_in_input_order(store: Any) -> None:
    with pytest.raises(InterruptSignal) as info:
        asks.map(range(8))
    assert [i.id for i in info.value.interrupts] == ["q1", "q4", "q7"]
    assert [i.payload for i in info.value.interrupts] == ["question 1", "question 4",
                                                          "question 7"]
    assert any("five" in note for note in getattr(info.value, "__notes__", []))
    # the items that finished were kept
    assert asks.explain(0).hit and asks.explain(6).hit and not asks.explain(5).hit


def test_interrupts_inside_a_run_journal_the_other_items(store: Any) -> None:
    @durably.entrypoint
    def job(n: int) -> list[str]:
        try:
            asks.map(range(n), max_workers=3)
        except InterruptSignal as signal:
            return [i.id for i in signal.interrupts]
        return []

    run = job.run(8)
    assert run.result == ["q1", "q4", "q7"]
    statuses = [s.status for s in run.steps if s.task.endswith("asks")]
    assert statuses.count("ran") == 4 and statuses.count("failed") == 1


# -- submit ---------------------------------------------------------------------------------
def test_submit_returns_futures_for_wait_and_as_completed(store: Any, log: str) -> None:
    futures = [square.submit(x, log) for x in range(5)]
    done, _ = concurrent.futures.wait(futures)
    assert len(done) == 5
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures)) == [
        0, 1, 4, 9, 16]
    hit = square.submit(3, log)
    assert hit.done() and hit.result() == 9
    assert len(_lines(log)) == 5


def test_submit_inside_a_run_is_journaled_in_submission_order(store: Any, tmp_path: Path,
                                                              log: str) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / "1").touch()

    @durably.entrypoint
    def job(n: int) -> list[Any]:
        futures = [fragile.submit(x, log, str(flags)) for x in range(n)]
        out: list[Any] = []
        for f in futures:
            try:
                out.append(f.result())
            except ValueError as exc:
                out.append(str(exc))
        return out

    first = job.run(3)
    assert first.result == [100, "item 1 failed", 102]
    (flags / "1").unlink()
    # the run caught the failure: part of its history, replayed (through the future)
    second = job.run(3)
    assert second.result == [100, "item 1 failed", 102]
    assert second.counts()["replayed"] == 2 and second.counts()["failed"] == 1
    assert sorted(_lines(log)) == ["fragile 0", "fragile 1", "fragile 2"]
    third = job.run(3, fresh=True)  # a new run executes it again (the rest from the cache)
    assert third.result == [100, 101, 102]
    assert sorted(_lines(log)) == ["fragile 0", "fragile 1", "fragile 1", "fragile 2"]


def test_executor_submit_and_errors(store: Any) -> None:
    with Thread(max_workers=2) as pool:
        assert pool.submit(add, 2, b=3).result() == 5
    with pytest.raises(durably.DefinitionError, match="durably task"):
        Thread().submit(len, [1])
    with pytest.raises(durably.DefinitionError, match="executor must be"):
        add.map([1], [2], executor="gpu")
    with pytest.raises(ValueError, match="max_workers") as bad:
        add.map([1], [2], max_workers=0)
    assert isinstance(bad.value, durably.DefinitionError)  # durably's, and a ValueError
    with pytest.raises(TypeError, match="at least one iterable"):
        add.map()
    with pytest.raises(TypeError):
        add.map([1, 2])  # one argument missing: raised before anything runs


# -- async tasks ----------------------------------------------------------------------------
def test_async_map_and_submit_gather_on_the_event_loop(store: Any, log: str) -> None:
    async def main() -> tuple[list[int], list[int]]:
        mapped = await asquare.map(range(4), [log] * 4, max_workers=2)
        futures = [asquare.submit(x, log) for x in range(3, 6)]
        return mapped, list(await asyncio.gather(*futures))

    assert asyncio.run(main()) == ([0, 1, 4, 9], [9, 16, 25])
    assert sorted(_lines(log)) == [f"asquare {x}" for x in range(6)]


def test_async_map_inside_an_async_run_replays(store: Any, log: str) -> None:
    @durably.entrypoint
    async def job(n: int) -> int:
        return sum(await asquare.map(range(n), [log] * n))

    first = asyncio.run(job.run(5))
    assert first.result == 30 and first.counts()["ran"] == 5
    again = asyncio.run(job.run(5))
    assert again.result == 30 and again.counts()["replayed"] == 5
    assert len(_lines(log)) == 5


def test_async_submit_needs_a_running_loop(store: Any, log: str) -> None:
    with pytest.raises(RuntimeError, match="running event loop"):
        asquare.submit(1, log)


# -- progress -------------------------------------------------------------------------------
def test_progress_bar_counts_ran_and_cached(store: Any, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_progress, "_PROGRESS_DELAY", 0)
    add.map([1, 2], [1, 1])
    capsys.readouterr()
    add.map([1, 2, 3, 4], [1, 1, 1, 1], progress=True)
    err = capsys.readouterr().err
    assert "ran 2, cached 2" in err and "4/4" in err
    add.map([5, 6], [1, 1])  # not a terminal: off
    assert capsys.readouterr().err == ""


def test_progress_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLY_PROGRESS", "0")
    assert not _executors.progress_enabled(None)
    assert _executors.progress_enabled(True)
    monkeypatch.setenv("DURABLY_PROGRESS", "1")
    assert _executors.progress_enabled(None) and not _executors.progress_enabled(False)
    monkeypatch.delenv("DURABLY_PROGRESS")
    assert not _executors.progress_enabled(None)  # pytest captures stderr: not a terminal
    with pytest.raises(durably.DefinitionError):
        _executors.progress_enabled("yes")  # type: ignore[arg-type]


# -- worker processes -----------------------------------------------------------------------
@pytest.mark.slow
def test_process_map_runs_in_other_processes_in_input_order(disk: Any) -> None:
    out = pid_of.map(range(6), executor="process")
    assert [x for x, _ in out] == list(range(6))
    assert os.getpid() not in {pid for _, pid in out}
    assert Scaler(2).scale.map([1, 2], executor="process") == [2, 4]


@pytest.mark.slow
def test_nested_tasks_in_a_worker_process_are_cached(disk: Any, log: str) -> None:
    assert outer.map([1, 2, 3], [log] * 3, executor="process") == [4, 6, 8]
    assert sorted(_lines(log)) == ["inner 1", "inner 2", "inner 3", "outer 1", "outer 2",
                                   "outer 3"]
    assert inner(2, log) == 3  # cached by the worker, in the caller's store
    assert outer.map([1, 2, 3], [log] * 3, executor="process") == [4, 6, 8]
    assert len(_lines(log)) == 6


@pytest.mark.slow
def test_a_signing_key_given_in_code_travels_to_worker_processes(tmp_path: Path,
                                                                 log: str) -> None:
    store = durably.DiskStore(tmp_path / "signed-store", key=b"k" * 32)
    durably.configure(store=store)
    try:
        assert outer.map([1, 2], [log] * 2, executor="process") == [4, 6]
        assert inner(2, log) == 3  # signed by the worker with the same key: a hit here
        assert sorted(_lines(log)) == ["inner 1", "inner 2", "outer 1", "outer 2"]
    finally:
        durably.configure()
        store.close()


@pytest.mark.slow
def test_process_failures_carry_the_remote_traceback(disk: Any, log: str,
                                                     tmp_path: Path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    (flags / "1").touch()

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return fragile.map(range(n), [log] * n, [str(flags)] * n, executor="process")

    with pytest.raises(ExceptionGroup) as info:
        job(3)
    (exc,) = info.value.exceptions
    assert isinstance(exc, ValueError) and "fragile" in str(exc.__cause__)
    (flags / "1").unlink()
    assert job(3) == [100, 101, 102]
    assert sorted(_lines(log)) == ["fragile 0", "fragile 1", "fragile 1", "fragile 2"]


@pytest.mark.slow
def test_arguments_that_cannot_travel_fail_that_item(disk: Any) -> None:
    @durably.task(ignore=("lock",))
    def locked(x: int, lock: Any) -> int:
        return x

    with pytest.raises(ExceptionGroup) as info:
        locked.map([1, 2], [threading.Lock(), None], executor="process")
    (exc,) = info.value.exceptions
    assert isinstance(exc, durably.SerializationError)
    assert re.search(r"cannot send argument 'lock' of '[^']*locked' to a worker process",
                     str(exc))


@durably.task
def returns_a_lock(x: int) -> Any:
    return threading.Lock()


@pytest.mark.slow
def test_a_result_that_cannot_travel_back_names_its_task_and_direction(disk: Any) -> None:
    """A result that cannot be pickled in the worker: the message says it cannot come back
    from the worker (it said 'to a worker process', and advised the thread executor, where
    it cannot be cached either), naming the task."""
    with pytest.raises(ExceptionGroup) as info:
        returns_a_lock.map([1], executor="process")
    (exc,) = info.value.exceptions
    assert isinstance(exc, durably.SerializationError)
    assert "cannot send the result of task 'returns_a_lock' back from the worker" in str(exc)


@pytest.mark.slow
def test_process_submit_and_interrupts(disk: Any, log: str) -> None:
    with Process(max_workers=1) as pool:
        assert pool.submit(square, 7, log).result() == 49
        with pytest.raises(InterruptSignal) as info:
            asks.map(range(5), executor=pool)
    assert [i.id for i in info.value.interrupts] == ["q1", "q4"]
    assert square(7, log) == 49 and _lines(log) == ["square 7"]


def test_a_worker_without_the_store_directory_caches_in_memory(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    missing = str(tmp_path / "not-here")
    with caplog.at_level(logging.WARNING, logger="durably"):
        _worker._use_store(("url", ("elsewhere", 1), Path(missing).as_uri(), {}))
    try:
        from durably._runtime.config import default_store

        assert isinstance(default_store(), MemoryStore)
        assert "not reachable" in caplog.text and missing in caplog.text
    finally:
        _worker._worker_store = None
        durably.configure()


def test_dask_executor_needs_a_client() -> None:
    pytest.importorskip("distributed")
    with pytest.raises(durably.DefinitionError, match=r"distributed\.Client"):
        add.map([1], [2], executor=Dask())


# -- scripts: __main__ tasks and crashes ----------------------------------------------------
MAIN_TASKS = """
import dataclasses, os, sys
import durably

@dataclasses.dataclass
class Point:
    x: int
    y: int

def mark(text):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(text + "\\n")

@durably.task
def norm(x, y):
    mark(f"norm {x}")
    return x * x + y * y

@durably.task
def describe(x):
    mark(f"describe {x}")
    return Point(norm(x, x + 1), os.getpid())

if __name__ == "__main__":
    before = durably.digest(Point(2, 3))
    out = describe.map(range(4), executor="process")
    assert all(isinstance(p, Point) for p in out), out
    print("values", [p.x for p in out])
    print("elsewhere", os.getpid() not in {p.y for p in out})
    print("nested", norm(2, 3))
    # results of a class sent by value came back without rewriting the class here
    print("same digest", durably.digest(Point(2, 3)) == before)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["file", "-c"])
def test_tasks_defined_in_main_run_on_worker_processes(tmp_path: Path, how: str) -> None:
    script = write_script(tmp_path / "main_tasks.py", MAIN_TASKS)
    count = tmp_path / "count.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count))
    expected = "values [1, 5, 13, 25]\nelsewhere True\nnested 13\nsame digest True\n"
    for attempt in (1, 2):
        if how == "file":
            out = run_script(script, env).stdout
        else:
            proc = subprocess.run([sys.executable, "-c", script.read_text()], env=env,
                                  capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert proc.returncode == 0, proc.stderr
            out = proc.stdout
        assert out == expected
        # the nested task ran in the workers and was cached for the caller; the second
        # script run executes nothing
        assert sorted(_lines(count)) == sorted(
            [f"describe {x}" for x in range(4)] + [f"norm {x}" for x in range(4)]), attempt


FANOUT = """
import os, signal, sys, time
import durably

signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started in a background job

def mark(text):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(text + "\\n")
        f.flush()
        os.fsync(f.fileno())

@durably.task
def work(i):
    mark(str(i))
    block = int(os.environ.get("BLOCK_FROM", "-1"))
    if 0 <= block <= i:
        os.write(1, f"blocked {i}\\n".encode())  # one write: lines of two threads never mix
        while not os.path.exists(os.environ["RELEASE_FILE"]):
            time.sleep(0.02)
    return i * 10

@durably.entrypoint
def pipeline(n, executor):
    return sum(work.map(range(n), executor=executor, max_workers=2))

if __name__ == "__main__":
    try:
        print("result", pipeline(int(os.environ["ITEMS"]), os.environ["EXECUTOR"]), flush=True)
    except KeyboardInterrupt:
        print("stopped", flush=True)
        raise
"""


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_sigkill_halfway_through_a_map_resumes_exactly_the_unfinished_items(
        tmp_path: Path, executor: str) -> None:
    n, block = 12, 6
    script = write_script(tmp_path / "fanout.py", FANOUT)
    count, release = tmp_path / "count.txt", tmp_path / "release"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), RELEASE_FILE=str(release),
                     BLOCK_FROM=str(block), ITEMS=str(n), EXECUTOR=executor)
    with subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                          start_new_session=True) as proc:
        watchdog = threading.Timer(120, os.killpg, (proc.pid, signal.SIGKILL))
        watchdog.start()
        try:
            assert proc.stdout is not None and proc.stderr is not None
            blocked, seen = 0, ""
            while blocked < 2:  # both workers hold a blocked item: nothing else can start
                line = proc.stdout.readline()
                seen += line
                if not line:
                    break
                blocked += line.count("blocked")
        finally:
            watchdog.cancel()
            os.killpg(proc.pid, signal.SIGKILL)  # the script and its worker processes
            proc.wait(timeout=30)
            release.touch()
        assert blocked == 2, f"{seen}\n{proc.stderr.read()}"
    assert proc.returncode == -signal.SIGKILL

    store = durably.DiskStore(tmp_path / "store")
    (run,) = store.list_runs()
    finished = set()
    for step in store.list_steps(run.run_id):
        data = store.find_step(run.run_id, step.step_id)
        if step.status == "ran" and data is not None:
            finished.add(pickle.loads(data) // 10)
    store.close()
    # an item is dispatched only once an earlier one is journaled (2 at a time): every item
    # before the blocked ones had finished, none after
    assert finished == set(range(block))
    assert set(range(block + 2)) <= {int(x) for x in _lines(count)}

    count.unlink()
    env["BLOCK_FROM"] = "-1"
    out = run_script(script, env)
    assert out.stdout == f"result {sum(i * 10 for i in range(n))}\n"
    assert sorted(int(x) for x in _lines(count)) == list(range(block, n))


ASYNC_FANOUT = FANOUT.replace(
    "def work(i):", "async def work(i):").replace(
    "def pipeline(n, executor):\n    return sum(work.map(",
    "async def pipeline(n, executor):\n    return sum(await work.map(").replace(
    'print("result", pipeline(',
    'import asyncio\n        print("result", asyncio.run(pipeline(').replace(
    'os.environ["EXECUTOR"]), flush=True)', 'os.environ["EXECUTOR"])), flush=True)')


@pytest.mark.slow
@pytest.mark.parametrize("executor,source", [("thread", FANOUT), ("process", FANOUT),
                                             ("process", ASYNC_FANOUT)],
                         ids=["thread", "process", "async-process"])
@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_ctrl_c_during_a_map_journals_the_bodies_that_end_while_it_waits(
        tmp_path: Path, executor: str, source: str) -> None:
    """After Ctrl-C a map starts nothing more but waits for the bodies already running (a
    thread cannot be stopped): each that ends meanwhile is journaled, so the rerun executes
    only the items that never started (before, they ran twice: their side effects too)."""
    n, block = 6, 2
    script = write_script(tmp_path / "fanout.py", source)
    count, release = tmp_path / "count.txt", tmp_path / "release"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), RELEASE_FILE=str(release),
                     BLOCK_FROM=str(block), ITEMS=str(n), EXECUTOR=executor)
    with _blocked_fanout(script, env, release) as (proc, _):  # items 2 and 3 hold both workers
        proc.send_signal(signal.SIGINT)  # the script only, as a terminal's Ctrl-C
        time.sleep(0.5)  # the map is waiting for its running bodies
        release.touch()
        _, err = proc.communicate(timeout=60)
    # (the script's KeyboardInterrupt ends it: two lines, no traceback; SIGINT, as Python does)
    assert proc.returncode == -signal.SIGINT and "Ctrl-C stopped run" in err, err
    assert "Traceback" not in err, err
    assert sorted(int(x) for x in _lines(count)) == list(range(block + 2))

    count.unlink()
    env["BLOCK_FROM"] = "-1"
    out = run_script(script, env)
    assert out.stdout == f"result {sum(i * 10 for i in range(n))}\n"
    assert sorted(int(x) for x in _lines(count)) == list(range(block + 2, n))


@pytest.mark.slow
@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_more_ctrl_c_on_threads_keep_waiting_and_journaling(tmp_path: Path) -> None:
    """Bodies on threads cannot be stopped, and the process ends only once they have: a
    second or third Ctrl-C says so (and how to stop now: kill) and goes on waiting,
    journaling them as they end (a user's second Ctrl-C lost four finished items,
    executed again by the rerun, without the process ending any sooner; a third did the
    same). Once the bodies end, the call stops, and a rerun executes only the rest."""
    script = write_script(tmp_path / "fanout.py", FANOUT)
    release, count = tmp_path / "release", tmp_path / "count.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count),
                     RELEASE_FILE=str(release), BLOCK_FROM="2", ITEMS="6", EXECUTOR="thread")
    with _blocked_fanout(script, env, release) as (proc, lines):
        for _ in range(3):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.5)  # (the stopped wait looks at its futures every 0.5 s)
        assert lines.empty()  # still waiting for the blocked bodies
        release.touch()  # they end: journaled, then the call stops
        assert lines.get(timeout=30) == "stopped\n"
        assert proc.wait(timeout=30) != 0
        err = proc.stderr.read() if proc.stderr else ""
    assert "waiting for its 2 running bodies" in err
    assert "on threads, which cannot be stopped" in err and "kill -9" in err
    out = run_script(script, {**env, "BLOCK_FROM": "-1"})
    assert out.stdout == f"result {sum(i * 10 for i in range(6))}\n"
    again = sorted(int(x) for x in _lines(str(count)))
    assert again == list(range(6)), again  # each item's body once


@pytest.mark.slow
@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_a_second_ctrl_c_on_worker_processes_stops_them_now(tmp_path: Path) -> None:
    """On worker processes a second Ctrl-C stops the bodies (the workers are killed, as
    kill -9 would): the process ends at once instead of when they end; those items
    execute again when the run resumes."""
    script = write_script(tmp_path / "fanout.py", FANOUT)
    release, count = tmp_path / "release", tmp_path / "count.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), RELEASE_FILE=str(release),
                     BLOCK_FROM="2", ITEMS="6", EXECUTOR="process")
    with _blocked_fanout(script, env, release) as (proc, lines):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        assert lines.get(timeout=30) == "stopped\n"
        assert proc.wait(timeout=30) != 0  # the bodies still block: they were killed
    out = run_script(script, {**env, "BLOCK_FROM": "-1"})
    assert out.stdout == f"result {sum(i * 10 for i in range(6))}\n"
    assert sorted(set(int(x) for x in _lines(str(count)))) == list(range(6))


@contextlib.contextmanager
def _blocked_fanout(script: Path, env: dict[str, str], release: Path
                    ) -> Iterator[tuple[subprocess.Popen[str], queue.SimpleQueue[str]]]:
    """Start the FANOUT script; once both workers hold a blocked item, give the process and
    a queue of its output lines. On the way out the bodies are released and the process
    waited for (killed if it has not exited 60 s later, or 120 s after its start)."""
    with subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, cwd=script.parent,
                          start_new_session=True) as proc:
        watchdog = threading.Timer(120, os.killpg, (proc.pid, signal.SIGKILL))
        watchdog.start()
        try:
            lines: queue.SimpleQueue[str] = queue.SimpleQueue()

            def read() -> None:
                with contextlib.suppress(ValueError, OSError):  # (closed by communicate)
                    for line in proc.stdout or ():
                        lines.put(line)

            threading.Thread(target=read, daemon=True).start()
            blocked = 0
            while blocked < 2:
                blocked += lines.get(timeout=60).count("blocked")
            yield proc, lines
        finally:
            release.touch()  # (the interpreter's exit joins the worker threads)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # hung: the test fails, the suite goes on
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            watchdog.cancel()


def _stopped_promptly(job: Any, *args: Any) -> BaseException | None:
    """Call the entrypoint in a thread (a hang fails the test, not the suite): what it
    raised."""
    raised: list[BaseException] = []

    def call() -> None:
        try:
            job(*args)
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            raised.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the map never returned after the stop"
    return raised[0] if raised else None


def test_a_stop_while_an_item_is_being_sent_does_not_wait_for_it_forever(
        store: Any, log: str, monkeypatch: pytest.MonkeyPatch) -> None:
    started = Thread._start
    calls = [0]

    def start_then_ctrl_c(self: Any, item: Any, target: Any, done: Any) -> None:
        calls[0] += 1
        if calls[0] == 3:  # as if Ctrl-C landed while the third item was being sent
            raise KeyboardInterrupt
        started(self, item, target, done)

    monkeypatch.setattr(Thread, "_start", start_then_ctrl_c)

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return square.map(range(n), [log] * n, max_workers=2)

    assert isinstance(_stopped_promptly(job, 6), KeyboardInterrupt)
    # items 0 and 1 were sent; one still queued in the pool when the stop came is cancelled
    # (nothing more starts), one running finishes and is journaled
    ran = sorted(_lines(log))
    assert set(ran) <= {"square 0", "square 1"}
    (run,) = durably.list_runs()
    assert run.status == "stopped"
    assert [s.status for s in run.steps if s.task.endswith("square")] == ["ran"] * len(ran)


def test_a_stop_right_after_an_item_was_sent_still_journals_it(
        store: Any, log: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C between an item's submit and its callback: its body runs, and no message will
    come; the stop's wait finds it done, journals it, and the rerun does not execute it."""
    started = Thread._start

    def sent_then_ctrl_c(self: Any, item: Any, target: Any, done: Any) -> None:
        if item.index != 2:
            started(self, item, target, done)
            return
        item.handle = self._executor().submit(_items._run_here, item.call, target.local,
                                              item.args, item.kwargs)
        raise KeyboardInterrupt  # before the callback was attached

    monkeypatch.setattr(Thread, "_start", sent_then_ctrl_c)

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return square.map(range(n), [log] * n, max_workers=3)

    assert isinstance(_stopped_promptly(job, 6), KeyboardInterrupt)
    monkeypatch.setattr(Thread, "_start", started)
    assert job(6) == [x * x for x in range(6)]
    assert sorted(_lines(log)) == [f"square {x}" for x in range(6)]  # each exactly once


def test_a_stop_while_a_batch_is_journaled_still_journals_the_rest_of_it(
        store: Any, log: str, monkeypatch: pytest.MonkeyPatch) -> None:
    drain, finish = _executors._drain, _executors._FanOut.finish
    interrupted: list[int] = []

    def slow_drain(inbox: Any) -> Any:
        time.sleep(0.3)  # both items end meanwhile: one batch of two
        return drain(inbox)

    def finish_then_ctrl_c(self: Any, item: Any, outcome: Any) -> None:
        if not interrupted:
            interrupted.append(item.index)
            raise KeyboardInterrupt  # as if Ctrl-C landed while the first was journaled
        finish(self, item, outcome)

    monkeypatch.setattr(_executors, "_drain", slow_drain)
    monkeypatch.setattr(_executors._FanOut, "finish", finish_then_ctrl_c)

    @durably.entrypoint
    def job(n: int) -> list[int]:
        return square.map(range(n), [log] * n, max_workers=2)

    assert isinstance(_stopped_promptly(job, 2), KeyboardInterrupt)
    (run,) = durably.list_runs()
    ran = [s for s in run.steps if s.task.endswith("square") and s.status == "ran"]
    assert len(ran) == 1 and len(interrupted) == 1  # the other item of the batch


def test_an_item_cancelled_by_its_own_body_is_not_a_none_result(store: Any) -> None:
    @durably.task
    async def gives_up(x: int) -> int:
        if x == 1:
            raise asyncio.CancelledError  # e.g. a future it awaited was cancelled
        return x

    @durably.entrypoint
    async def job() -> list[int]:
        return await gives_up.map(range(3))

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(job())
    (run,) = durably.list_runs()
    assert run.status != "finished"


# -- retry= and timeout= apply to every item ------------------------------------------------
@durably.task(ignore=("log",), retry=durably.Retry(attempts=3, backoff=0))
def flaky_twice(x: int, log: str) -> int:
    _mark(log, f"try {x}")
    if _lines(log).count(f"try {x}") < 3:
        raise ConnectionError(f"item {x}: not yet")
    return x


@pytest.mark.parametrize("executor", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_retry_applies_to_each_item(disk: Any, log: str, executor: str) -> None:
    @durably.entrypoint
    def job(n: int) -> list[int]:
        return flaky_twice.map(range(n), [log] * n, executor=executor)

    run = job.run(3)
    assert run.result == [0, 1, 2]
    assert sorted(_lines(log)) == sorted(f"try {x}" for x in range(3) for _ in range(3))
    if executor == "thread":  # each failed try is journaled by the call path
        statuses = [s.status for s in run.records() if s.task.endswith("flaky_twice")]
        assert statuses.count("failed") == 6 and statuses.count("ran") == 3


def test_timeout_applies_to_each_item(store: Any) -> None:
    release = threading.Event()

    @durably.task(timeout=3.0, version="1")  # generous: a loaded CI machine is slow
    def stuck(x: int) -> int:
        if x == 1:
            release.wait(60)
        return x

    try:
        with pytest.raises(ExceptionGroup) as info:
            stuck.map(range(3))
        assert len(info.value.exceptions) == 1, info.value.exceptions
        (exc,) = info.value.exceptions
        assert isinstance(exc, durably.TaskTimeoutError)
        assert stuck.explain(0).hit and stuck.explain(2).hit
    finally:
        release.set()


@durably.task(cache=False)
def die_if(x: int, die: bool) -> int:
    if die:
        os._exit(3)  # the worker process dies
    return x


@pytest.mark.slow
def test_a_dead_worker_fails_its_items_and_the_pool_recovers(disk: Any) -> None:
    from concurrent.futures.process import BrokenProcessPool

    with Process(max_workers=1) as pool:
        with pytest.raises(ExceptionGroup) as info:
            die_if.map([1], [True], executor=pool)
        assert info.group_contains(BrokenProcessPool)
        assert die_if.map([1, 2], [False, False], executor=pool) == [1, 2]


@pytest.mark.slow
def test_an_exception_that_cannot_be_rebuilt_fails_its_item_only(disk: Any) -> None:
    @durably.entrypoint
    def main(n: int) -> list[int]:
        return odd_failure.map(range(n), executor="process", max_workers=2)

    with pytest.raises(ExceptionGroup) as group:
        main(5)
    [failure] = group.value.exceptions
    assert isinstance(failure, RuntimeError) and "TwoArgError" in str(failure)
    run = durably.list_runs(main)[0]
    assert sorted(s.status for s in run.steps) == ["failed", "ran", "ran", "ran", "ran"]


@pytest.mark.slow
def test_retry_and_timeout_travel_with_main_tasks(tmp_path: Path) -> None:
    script = write_script(tmp_path / "main_retry.py", """
        import os, time, durably
        TRIES = os.environ["TRIES"]

        @durably.task(cache=False, retry=durably.Retry(attempts=3, backoff=0))
        def flaky(x):
            open(os.path.join(TRIES, str(time.time_ns())), "w").close()
            if len(os.listdir(TRIES)) < 3:
                raise ConnectionError("flaky")
            return x

        @durably.task(cache=False, timeout=0.2)
        def slow(x):
            time.sleep(2)
            return x

        if __name__ == "__main__":
            print(flaky.map([7], executor="process"))
            try:
                slow.map([1], executor="process")
            except ExceptionGroup as group:
                print([type(e).__name__ for e in group.exceptions])
    """)
    tries = tmp_path / "tries"
    tries.mkdir()
    out = run_script(script, script_env(tmp_path / "store", TRIES=str(tries))).stdout
    assert out.splitlines() == ["[7]", "['TaskTimeoutError']"]
    assert len(list(tries.iterdir())) == 3


def test_step_durations_are_the_bodies_not_the_wait_to_be_journaled(store: Any) -> None:
    import time

    @durably.entrypoint
    def main(n: int) -> list[int]:
        return add.map(range(n), [1] * n, max_workers=4)

    started = time.time()
    run = main.run(400)
    wall = time.time() - started
    durations = [s.duration for s in run.steps]
    assert len(durations) == 400 and sum(durations) <= wall * 4 + 0.05


def test_a_run_waits_for_its_submitted_steps_and_collects_their_interrupts(store: Any) -> None:
    import concurrent.futures as cf
    import time

    @durably.task
    def ask(x: int) -> Any:
        time.sleep(0.05 * x)
        return durably.interrupt({"q": x})

    @durably.entrypoint
    def main() -> list[Any]:
        futures = [ask.submit(x) for x in (1, 2, 3)]
        return [f.result() for f in cf.as_completed(futures)]

    with pytest.raises(durably.RunInterrupted) as paused:
        main()
    assert sorted(i.payload["q"] for i in paused.value.interrupts) == [1, 2, 3]

    @durably.entrypoint
    def forgets() -> str:
        add.submit(1000, 1)  # never waited for
        return "done"

    run = forgets.run()
    assert [s.status for s in durably.get_run(run.id).steps] == ["ran"]


def test_a_worker_seeing_an_empty_folder_at_the_store_path_caches_in_memory(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    empty = tmp_path / "same-path-elsewhere"
    empty.mkdir()  # another machine's folder at the store's path: no FORMAT, not the store
    with caplog.at_level(logging.WARNING, logger="durably"):
        _worker._use_store(("disk", ("elsewhere", 1), str(empty), None, "normal", None, None))
    try:
        from durably._runtime.config import default_store

        assert isinstance(default_store(), MemoryStore)
        assert list(empty.iterdir()) == []  # no orphan store created there
    finally:
        _worker._worker_store = None
        durably.configure()


@pytest.mark.slow
def test_interrupt_in_a_process_item_says_to_use_threads(disk: Any) -> None:
    @durably.entrypoint
    def main() -> list[Any]:
        return asks_in_worker.map(range(2), executor="process")

    with pytest.raises(ExceptionGroup) as group:
        main()
    assert all("worker process" in str(e) and "executor='thread'" in str(e)
               for e in group.value.exceptions)


FORKED_INSIDE_A_RUN = """
import multiprocessing, os, sys
import durably
from durably.executors import Process

def mark(text):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(text + "\\n")

@durably.task
def square(x):
    mark(f"square {x}")
    return x * x

def pool_item(x):  # a plain function: it calls the task in a forked pool worker
    return square(x)

@durably.task
def item(x):
    mark(f"item {x}")
    return square(x + 10)

@durably.task
def asks(x):
    return durably.interrupt(f"ok {x}?")

@durably.entrypoint
def sweep(n):
    with multiprocessing.get_context("fork").Pool(2) as pool:
        plain = pool.map(pool_item, range(n))
    fanned = item.map(range(n), executor=Process(max_workers=2, start_method="fork"))
    try:
        asks.map(range(1), executor=Process(max_workers=1, start_method="fork"))
    except ExceptionGroup as group:
        print("interrupt:", group.exceptions[0])
    if os.environ.get("FAIL"):
        raise RuntimeError("stopped after the fan-outs")
    return plain + fanned

if __name__ == "__main__":
    try:
        print("result", sweep(3))
    except RuntimeError as exc:
        print("failed:", exc)
    store = durably.DiskStore()
    (run,) = store.list_runs()
    steps = store.list_steps(run.run_id)
    print("status", run.status, "attempt", run.attempt)
    print("tasks", sorted({s.task.rsplit(":", 1)[-1] for s in steps}))
    print("positions unique", len({(s.attempt, s.position) for s in steps}) == len(steps))
"""


@pytest.mark.slow
def test_processes_forked_inside_a_run_are_not_part_of_it(tmp_path: Path) -> None:
    """A fork-start pool created in an entrypoint (multiprocessing's or
    ``Process(start_method="fork")``) inherits the run's context, but not the run: the tasks
    its workers call are cached calls, as on spawn or forkserver workers. Before, they were
    journaled into the parent's run at positions the parent also used, and their replay
    records were lost with the worker."""
    script = write_script(tmp_path / "forked.py", FORKED_INSIDE_A_RUN)
    count = tmp_path / "count.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count))
    first = run_script(script, {**env, "FAIL": "1"}).stdout
    second = run_script(script, env).stdout
    for out in (first, second):
        assert "worker process" in out and "executor='thread'" in out, out  # interrupt()
        # the run journals its own steps only: the fan-out's items, never the tasks the
        # workers called, and no two steps of an attempt share a position
        assert "tasks ['asks', 'item']" in out and "positions unique True" in out, out
    assert "status failed attempt 1" in first, first
    assert "status finished attempt 2" in second, second
    assert "result [0, 1, 4, 100, 121, 144]" in second, second
    # the resumed run replayed the items and the pool's calls came from the cache
    assert sorted(_lines(count)) == sorted(
        [f"square {x}" for x in (0, 1, 2, 10, 11, 12)] + [f"item {x}" for x in range(3)])


FORK_EDGES = """
import contextvars, multiprocessing, os, sys
import durably

def mark(text):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(text + "\\n")

@durably.task
def expensive(x):
    mark(f"expensive {x}")
    return x * 3

def use(x):
    return expensive(x)

@durably.task
def item(x):
    return expensive(x) + 1

@durably.task
def step(x):
    mark(f"step {x}")
    return x

def forker():
    return os.fork()

@durably.entrypoint
def other(x):
    return step(x)

@durably.entrypoint
def job(n):
    if contextvars.copy_context().run(forker) == 0:
        # the child is back in the context that holds the parent's run
        step(7)
        try:
            durably.get_writer()
        except durably.NoActiveRunError:
            mark("writer refused")
        other(8)  # an entrypoint called there is a run of its own, not inlined in the parent's
        os._exit(0)
    os.wait()
    first = [expensive(i) for i in range(n)]  # their cache writes are queued by the run
    # forkserver workers (the default) read the store
    assert item.map(range(n), executor="process") == [x + 1 for x in first]
    second = [expensive(i) for i in range(n, 2 * n)]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        again = pool.map(use, range(n, 2 * n))
    step(0)
    pid = os.fork()
    if pid == 0:  # a child leaving through sys.exit, not os._exit
        step(1)
        sys.exit(0)
    os.waitpid(pid, 0)
    step(2)
    return second == again

if __name__ == "__main__":
    print("result", job(3))
    store = durably.DiskStore()
    (run,) = [r for r in store.list_runs() if r.entrypoint.endswith(":job")]
    print("others", [r.status for r in store.list_runs() if r.entrypoint.endswith(":other")])
    print("run", run.status, run.attempt)
    print("steps", sorted(s.status for s in store.list_steps(run.run_id)))
    print("events", [e.kind for e in store.list_events(run.run_id)])
"""


@pytest.mark.slow
def test_a_forked_process_finds_the_run_s_results_and_never_ends_the_run(
        tmp_path: Path) -> None:
    """Results the run computed just before forking (their cache writes queued) are written
    first, so forked workers do not compute them again; and a child that leaves through
    ``sys.exit`` unwinds through the entrypoint without ending its parent's run (before, it
    wrote the run as failed and released its lease while the parent still ran it)."""
    script = write_script(tmp_path / "edges.py", FORK_EDGES)
    count = tmp_path / "count.txt"
    out = run_script(script, script_env(tmp_path / "store", COUNT_FILE=str(count))).stdout
    assert out.splitlines() == [
        "result True", "others ['finished']", "run finished 1", "steps " + str(["ran"] * 11),
        "events ['run_started', 'run_finished']"], out
    assert sorted(_lines(count)) == sorted(
        [f"expensive {x}" for x in range(6)] + [f"step {x}" for x in (0, 1, 2, 7, 8)]
        + ["writer refused"])


@pytest.mark.slow
def test_workers_use_a_store_the_caller_never_opened(tmp_path: Path, log: str) -> None:
    store = durably.DiskStore(tmp_path / "never-opened")  # cache=False items never read it
    durably.configure(store=store)
    try:
        assert outer_side.map([1, 2], [log] * 2, executor="process") == [6, 9]
        assert inner(1, log) == 2  # cached by a worker in this very store
        assert sorted(_lines(log)) == ["inner 1", "inner 2"]
    finally:
        durably.configure()
        store.close()


def test_the_stopped_wait_reads_futures_without_taking_their_locks() -> None:
    """After a Ctrl-C the wait asks its futures whether they ended or were cancelled; a
    second Ctrl-C landing inside ``Future.done()``'s ``with`` block can leave the future's
    lock held for ever. The wait reads the state without the lock, so a held lock (held by
    another thread here) neither blocks it nor changes its answers."""
    import concurrent.futures as cf

    running, finished, cancelled = cf.Future(), cf.Future(), cf.Future()
    running.set_running_or_notify_cancel()
    finished.set_result(1)
    cancelled.cancel()
    items = {}
    for index, future in enumerate((running, finished, cancelled)):
        item = _items._Item(index, None, (), {})  # type: ignore[arg-type]
        item.handle = future
        items[index] = item
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with running._condition, finished._condition, cancelled._condition:  # type: ignore[attr-defined]
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10)
    answers: list[Any] = []

    def ask() -> None:
        inflight = dict(items)
        answers.append([i.index for i, _ in _executors._ended_unseen(inflight)])
        batch = [(items[1], finished), (items[2], cancelled)]
        answers.append([i.index for i, _ in _executors._still_waited(batch, inflight, True)])
        answers.append(sorted(inflight))

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    asker.join(10)
    release.set()
    assert not asker.is_alive(), "the wait blocked on a future's lock"
    assert answers == [[1, 2], [1], [0, 1]]  # the cancelled one is no longer waited for


def test_a_process_map_nested_in_a_process_worker_lets_the_job_exit(tmp_path: Path) -> None:
    """outer.map(executor="process") whose items call inner.map(executor="process"): the
    nested pool is the item's own and is shut down after it; kept in the worker (as the
    caller's shared pool is), it kept the worker from exiting and the job hung at exit
    (found by a user: 3 runs in 4). Run three times: each must exit."""
    script = write_script(tmp_path / "nested_job.py", """
        import durably

        @durably.task
        def inner(x):
            return x * 2

        @durably.task
        def outer(i):
            return sum(inner.map(range(i), executor="process"))

        @durably.entrypoint
        def njob(n):
            return outer.map(range(n), executor="process")

        if __name__ == "__main__":
            print(njob(4))
    """)
    for attempt in range(3):
        env = script_env(tmp_path / f"store{attempt}")
        done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                              text=True, timeout=90, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[0, 0, 2, 6]"
        assert "Error" not in done.stderr, done.stderr


@durably.task(cache=False)
def submitted_failure(x: int) -> int:
    raise ValueError(f"bad {x}")


def test_a_run_that_finishes_without_asking_a_failed_submitted_call_warns(store: Any) -> None:
    """A submitted call that fails while nobody asks its future: the run finishes without
    it, and every rerun executes it again: said once, at the end, naming the task and the
    error. A future that was asked (and its error caught) is no cause for it."""
    @durably.entrypoint
    def fire_and_forget(n: int) -> int:
        submitted_failure.submit(n)
        return n

    @durably.entrypoint
    def asked(n: int) -> int:
        try:
            submitted_failure.submit(n).result()
        except ValueError:
            return -1
        return n

    with pytest.warns(UserWarning, match=r"finished, but 1 call\(s\) it submitted failed and "
                      r"nobody asked their futures \([^)]*submitted_failure: ValueError"):
        assert fire_and_forget(1) == 1
    import warnings

    @durably.entrypoint
    def asked_then_dropped(n: int) -> list[str]:
        futures = [submitted_failure.submit(i) for i in range(n)]
        return [repr(f.exception()) for f in concurrent.futures.as_completed(futures)]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert asked(2) == -1
        # asked through as_completed and exception(), then dropped: asked all the same
        assert len(asked_then_dropped(3)) == 3


@pytest.mark.slow
def test_workers_of_a_killed_caller_exit_though_nobody_reaped_it(tmp_path: Path) -> None:
    """A caller killed with SIGKILL that its supervisor has not reaped yet (it reads the
    output to its end first, as subprocess.run(capture_output=True) does) still answers to
    its pid, as a zombie: its worker processes, holding the output open, kept the
    supervisor waiting for ever. They look at their own parent too, and exit."""
    script = write_script(tmp_path / "fanout.py", FANOUT)
    env = script_env(tmp_path / "store", COUNT_FILE=str(tmp_path / "count.txt"),
                     RELEASE_FILE=str(tmp_path / "never"), BLOCK_FROM="0", ITEMS="4",
                     EXECUTOR="process")
    with subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, cwd=tmp_path,
                          start_new_session=True) as proc:
        try:
            assert proc.stdout is not None
            seen = b""
            while seen.count(b"blocked") < 2:  # both workers hold an item
                seen += proc.stdout.read1(1024)
            os.kill(proc.pid, signal.SIGKILL)  # not reaped: no wait() before EOF
            started = time.monotonic()
            reader = threading.Thread(target=proc.stdout.read)
            reader.start()
            reader.join(30)
            assert not reader.is_alive(), "the workers kept the killed caller's output open"
            assert time.monotonic() - started < 30
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_a_terminal_ctrl_c_keeps_the_bodies_running_on_worker_processes(
        tmp_path: Path) -> None:
    """A terminal's Ctrl-C goes to the whole process group, workers included: they ignore
    it, and the caller waits for their bodies and journals them (a worker stopped by it
    lost its body half-way, and its side effect happened again on the rerun)."""
    script = write_script(tmp_path / "fanout.py", FANOUT)
    release, count = tmp_path / "release", tmp_path / "count.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), RELEASE_FILE=str(release),
                     BLOCK_FROM="2", ITEMS="6", EXECUTOR="process")
    with _blocked_fanout(script, env, release) as (proc, lines):
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal sends it
        time.sleep(0.5)
        assert lines.empty()  # waiting for the blocked bodies, which go on
        release.touch()
        assert lines.get(timeout=30) == "stopped\n"
        assert proc.wait(timeout=30) != 0
    out = run_script(script, {**env, "BLOCK_FROM": "-1"})
    assert out.stdout == f"result {sum(i * 10 for i in range(6))}\n"
    marks = sorted(int(x) for x in _lines(str(count)))
    assert marks == list(range(6)), marks  # each item's body once
