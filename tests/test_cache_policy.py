"""A task's cache policy: ``@task(expires_after=...)`` (an entry older than that is a miss),
``@task(cache_if=...)`` (a result it refuses is not cached) and ``task.refresh(...)`` (one call
executed again, its entry replaced). Only the cross-run cache follows them: a run's journal
replays what the run finished.

Expiry is tested on a clock the test moves (the time key records are written with and the
time entries are judged by), never by sleeping."""

from __future__ import annotations

import asyncio
import datetime
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._runtime import policy as _policy
from durably._runtime import spec as _spec

from .conftest import script_env, write_script


class Clock:
    """The wall clock of key records and of expiry, moved by the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.t = 1_800_000_000.0
        monkeypatch.setattr(_spec, "now", lambda: self.t)
        monkeypatch.setattr(_policy, "now", lambda: self.t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


# -- expires_after ----------------------------------------------------------------------------
def test_an_entry_older_than_expires_after_is_a_miss_and_is_replaced(
        store: durably.Store, clock: Clock) -> None:
    calls: list[int] = []

    @durably.task(expires_after=datetime.timedelta(hours=1))
    def fetch(x: int) -> int:
        calls.append(x)
        return x * 10 + len(calls)

    assert fetch(1) == 11
    clock.advance(3599)
    assert fetch(1) == 11 and calls == [1]  # younger than an hour: a hit
    assert fetch.explain(1).hit
    clock.advance(2)
    why = fetch.explain(1)
    assert not why.hit and why.expired and "expired" in str(why)
    assert why.nearest is not None and why.nearest.created == clock.t - 3601
    assert fetch(1) == 12 and calls == [1, 1]  # expired: executed again, entry replaced
    clock.advance(3599)
    assert fetch(1) == 12 and calls == [1, 1]  # the new entry is an hour younger
    assert fetch(2) == 23  # other inputs: their own entries and times


def test_expires_after_takes_seconds(disk_store: durably.DiskStore, clock: Clock) -> None:
    calls: list[int] = []

    @durably.task(expires_after=60)
    def f(x: int) -> int:
        calls.append(x)
        return x

    f(1), clock.advance(60), f(1)
    assert calls == [1]
    clock.advance(0.5)
    f(1)
    assert calls == [1, 1]


def test_an_entry_without_a_key_record_counts_as_expired(
        disk_store: durably.DiskStore, clock: Clock) -> None:
    """An entry whose time is unknown (put back without its key record) is not served."""
    calls: list[int] = []

    @durably.task(expires_after=3600)
    def f(x: int) -> int:
        calls.append(x)
        return x

    disk_store.cache_put(f.cache_key(1), pickle.dumps(5), None)  # no record of when
    assert f(1) == 1 and calls == [1]
    assert f(1) == 1 and calls == [1]  # written now, with its record: served


def test_inside_a_run_a_finished_step_replays_whatever_its_age(
        store: durably.Store, clock: Clock) -> None:
    calls: list[int] = []

    @durably.task(expires_after=60)
    def step(x: int) -> int:
        calls.append(x)
        return x + 1

    @durably.entrypoint
    def job(n: int) -> int:
        return step(n) + step(n + 100)

    first = job.run(1)
    assert [s.status for s in first.steps] == ["ran", "ran"]
    clock.advance(61)
    again = job.run(1)  # the same run: its journal is its history
    assert [s.status for s in again.steps if s.attempt == again.attempt] == [
        "replayed", "replayed"]
    assert calls == [1, 101]
    fresh = job.run(1, fresh=True)  # a new run reads the cache, where both expired
    assert [s.status for s in fresh.steps] == ["ran", "ran"]
    assert calls == [1, 101, 1, 101]
    clock.advance(30)
    newer = job.run(1, fresh=True)
    assert [s.status for s in newer.steps] == ["cached", "cached"]
    assert newer.result == 104 and calls == [1, 101, 1, 101]


@pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan"), True, "1h",
                                 datetime.timedelta(0)])
def test_a_bad_expires_after_is_refused_naming_the_task(bad: Any) -> None:
    with pytest.raises(durably.DefinitionError, match=r"expires_after=.*\.f' must be .* Fix"):
        @durably.task(expires_after=bad)
        def f(x: int) -> int:
            return x


def test_a_policy_on_a_cache_false_task_is_refused() -> None:
    with pytest.raises(durably.DefinitionError, match="cache=False, expires_after"):
        @durably.task(cache=False, expires_after=10)
        def f(x: int) -> int:
            return x
    with pytest.raises(durably.DefinitionError, match="cache=False, cache_if"):
        @durably.task(cache=False, cache_if=lambda r, d: True)
        def g(x: int) -> int:
            return x
    with pytest.raises(durably.DefinitionError, match="must be a callable"):
        @durably.task(cache_if=True)  # type: ignore[arg-type]
        def h(x: int) -> int:
            return x


# -- cache_if ---------------------------------------------------------------------------------
def test_cache_if_decides_which_results_are_cached(store: durably.Store) -> None:
    seen: list[tuple[Any, float]] = []
    calls: list[int] = []

    def non_empty(result: Any, duration: float) -> bool:
        seen.append((result, duration))
        return bool(result)

    @durably.task(cache_if=non_empty)
    def search(n: int) -> list[int]:
        calls.append(n)
        return list(range(n))

    assert search(0) == [] and search(0) == []
    assert calls == [0, 0]  # an empty result is never cached
    assert search(3) == [0, 1, 2] and search(3) == [0, 1, 2]
    assert calls == [0, 0, 3]  # a non-empty one is, and served
    assert [r for r, _ in seen] == [[], [], [0, 1, 2]]  # asked once per execution
    assert all(isinstance(d, float) and 0 <= d < 60 for _, d in seen)
    assert not search.explain(0).hit and search.explain(3).hit


def test_cache_if_is_given_the_duration_of_the_body(disk_store: durably.DiskStore,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The duration is the body's, as the step record shows it: only calls that took over a
    second are cached (the clock the call path reads is moved by the body itself)."""
    import durably._runtime.call as call_module
    import durably._runtime.step as step_module

    t = [1000.0]
    monkeypatch.setattr(call_module, "_wall_clock", lambda: t[0])
    monkeypatch.setattr(step_module, "now", lambda: t[0])
    calls: list[float] = []

    @durably.task(cache_if=lambda result, duration: duration > 1.0)
    def work(seconds: float) -> float:
        calls.append(seconds)
        t[0] += seconds  # the body "takes" that long
        return seconds

    @durably.entrypoint
    def job(seconds: float) -> float:
        return work(seconds)

    work(0.5), work(0.5), work(2.0), work(2.0)
    assert calls == [0.5, 0.5, 2.0]
    job(0.25), job.run(0.25, fresh=True), job(3.0), job.run(3.0, fresh=True)
    assert calls == [0.5, 0.5, 2.0, 0.25, 0.25, 3.0]
    assert [s.status for s in job.run(3.0, fresh=True).steps] == ["cached"]


def test_a_result_not_cached_is_journaled_and_never_executed_twice_in_its_run(
        store: durably.Store) -> None:
    calls: list[int] = []

    @durably.task(cache_if=lambda result, duration: False)
    def charge(amount: int) -> str:
        calls.append(amount)
        return f"receipt-{amount}-{len(calls)}"

    @durably.entrypoint
    def checkout(amount: int) -> str:
        return charge(amount)

    run = checkout.run(5)
    assert run.result == "receipt-5-1" and [s.status for s in run.steps] == ["ran"]
    again = checkout.run(5)  # the same run: replayed from its journal
    assert again.result == "receipt-5-1" and calls == [5]
    other = checkout.run(5, fresh=True)  # a new run: nothing was cached
    assert other.result == "receipt-5-2" and [s.status for s in other.steps] == ["ran"]


def test_a_cache_if_that_raises_is_a_durably_error_naming_the_task(
        store: durably.Store) -> None:
    def broken(result: Any, duration: float) -> bool:
        raise KeyError("oops")

    calls: list[int] = []

    @durably.task(cache_if=broken)
    def compute(x: int) -> int:
        calls.append(x)
        return x

    with pytest.raises(durably.DefinitionError, match=r"compute'.*cache_if=.*broken raised KeyError"
                       ) as info:
        compute(1)
    assert isinstance(info.value.__cause__, KeyError)
    assert not compute.explain(1).hit

    @durably.entrypoint
    def job() -> int:
        return compute(2)

    with pytest.raises(durably.DefinitionError, match="compute'"):
        job()
    run = durably.list_runs(job)[0]
    assert [s.status for s in run.steps] == ["failed"]  # journaled as the step's failure
    with pytest.raises(durably.DefinitionError):
        job()  # the next attempt executes it again (it is not a finished step)
    assert calls == [1, 2, 2]


CRASH = """
import os, signal, sys
import durably

@durably.task
def kept(i):
    return i * 2

@durably.task(cache_if=lambda result, duration: False)
def refused(i):
    return i * 3

@durably.entrypoint
def job():
    out = [kept(1), kept(2), refused(1), refused(2)]
    if sys.argv[1] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # before the attempt writes its queued entries
    return out

if __name__ == "__main__":
    print(job())
    if sys.argv[1] == "resume":
        import json
        print(json.dumps([kept.explain(2).hit, refused.explain(1).hit,
                          refused.explain(2).hit]))
"""


@pytest.mark.slow
def test_a_run_resumed_after_a_crash_never_caches_a_refused_result(tmp_path: Path) -> None:
    """After a SIGKILL, a resumed run puts back into the cache the entries its quick steps
    had queued (from its journal), but not those of a task with cache_if=: it cannot tell
    which of their results were refused."""
    script = write_script(tmp_path / "crash_job.py", CRASH)
    env = script_env(tmp_path / "store")
    killed = subprocess.run([sys.executable, str(script), "kill"], env=env,
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert killed.returncode == -9, killed.stderr
    resumed = subprocess.run([sys.executable, str(script), "resume"], env=env,
                             capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    result, hits = resumed.stdout.splitlines()[-2:]
    assert result == "[2, 4, 3, 6]"
    # kept(2)'s queued entry was put back; refused(1), refused(2) were never cached
    assert json.loads(hits) == [True, False, False]


# -- refresh ----------------------------------------------------------------------------------
def test_refresh_executes_again_and_replaces_the_entry(store: durably.Store) -> None:
    source = {"apple": 1.0}

    @durably.task(version="1")
    def price(item: str) -> float:
        return source[item]

    assert price("apple") == 1.0
    source["apple"] = 2.0
    assert price("apple") == 1.0  # the cache cannot see the source
    assert price.refresh("apple") == 2.0
    assert price("apple") == 2.0  # the entry was replaced
    assert price.refresh(item="apple") == 2.0


def test_refresh_inside_a_run_is_a_step_that_ran_and_replays_on_rerun(
        store: durably.Store) -> None:
    calls: list[int] = []

    @durably.task
    def load(x: int) -> int:
        calls.append(x)
        return x * len(calls)

    @durably.entrypoint
    def job(x: int) -> int:
        return load(x) + load.refresh(x)

    assert load(3) == 3  # cached before the run
    run = job.run(3)
    assert [s.status for s in run.steps] == ["cached", "ran"]
    assert run.result == 3 + 6 and calls == [3, 3]
    again = job.run(3)  # its finished steps are never executed twice in the run
    assert again.result == 9 and calls == [3, 3]
    assert load(3) == 6  # the refreshed entry


def test_refresh_of_a_method_and_of_an_async_task(disk_store: durably.DiskStore) -> None:
    class Model:
        def __init__(self) -> None:
            self.calls = 0

        @durably.task(ignore=("self",))
        def predict(self, x: int) -> int:
            self.calls += 1
            return x + self.calls

    m = Model()
    assert m.predict(1) == 2 and m.predict(1) == 2
    assert m.predict.refresh(1) == 3 and m.predict(1) == 3 and m.calls == 2

    runs: list[int] = []

    @durably.task
    async def fetch(x: int) -> int:
        runs.append(x)
        return x + len(runs)

    assert asyncio.run(fetch(1)) == 2
    assert asyncio.run(fetch.refresh(1)) == 3
    assert asyncio.run(fetch(1)) == 3 and runs == [1, 1]


def test_refresh_whose_body_raises_keeps_the_entry(disk_store: durably.DiskStore) -> None:
    fail = [False]

    @durably.task(version="1")  # (fail is read by the body: pinned, its change is no edit)
    def f(x: int) -> int:
        if fail[0]:
            raise ConnectionError("down")
        return x

    assert f(1) == 1
    fail[0] = True
    with pytest.raises(ConnectionError):
        f.refresh(1)
    assert f(1) == 1 and f.explain(1).hit


def test_refresh_whose_result_cache_if_refuses_removes_the_entry(
        disk_store: durably.DiskStore) -> None:
    results = [[1], []]

    @durably.task(cache_if=lambda result, duration: bool(result))
    def f(x: int) -> list[int]:
        return results.pop(0)

    assert f(1) == [1] and f.explain(1).hit
    assert f.refresh(1) == []
    assert not f.explain(1).hit  # not served the result the refresh replaced


def test_a_task_sent_by_value_to_a_worker_keeps_its_policy() -> None:
    """A task a worker cannot import by name (a notebook's, a local one) travels by value,
    with its expiry and its cache_if."""
    import cloudpickle

    from durably._decorators.pickling import _task_by_value

    @durably.task(expires_after=90, cache_if=lambda result, duration: result > 1)
    def local(x: int) -> int:
        return x

    reduced = _task_by_value(local)
    assert reduced is not None
    rebuild, args = reduced
    rebuilt = rebuild(*cloudpickle.loads(cloudpickle.dumps(args)))
    policy = rebuilt.spec.policy
    assert policy is not None and policy.expires_after == 90.0
    assert policy.cache_if is not None and policy.cache_if(2, 0.0) and not policy.cache_if(1, 0.0)


def test_a_fan_out_follows_the_policy(store: durably.Store, clock: Clock) -> None:
    """Items with one key execute once and the others are served its new entry; an expired
    entry is not served to any of them; a result cache_if refuses is served to none."""
    calls: list[int] = []

    @durably.task(expires_after=60)
    def fetch(x: int) -> int:
        calls.append(x)
        return x

    assert fetch.map([1, 1, 2]) == [1, 1, 2] and sorted(calls) == [1, 2]
    clock.advance(61)
    assert fetch.map([1, 1]) == [1, 1] and sorted(calls) == [1, 1, 2]

    refused: list[int] = []

    @durably.task(cache_if=lambda result, duration: False)
    def never(x: int) -> int:
        refused.append(x)
        return x

    assert never.map([3, 3, 3]) == [3, 3, 3] and refused == [3, 3, 3]


@pytest.mark.slow
def test_a_side_effect_after_cache_hits_is_never_repeated_when_they_expire(
        tmp_path: Path) -> None:
    """Steps served from the cache are journaled before a cache=False step executes: killed
    after it, the run resumed once their entries expired (or were cleared) replays them as
    they were, so the side effect sees the same inputs and never executes again."""
    import signal

    from .conftest import script_env, write_script

    marks = tmp_path / "sent.txt"
    script = write_script(tmp_path / "ejob.py", f"""
        import os, sys, time
        import durably

        @durably.task(expires_after=3600)
        def fetch(i):
            return time.time()

        @durably.task(cache=False)
        def send(v):
            with open({str(marks)!r}, "a") as f:
                f.write(f"{{v}}\\n")
            return v

        @durably.entrypoint
        def job(n):
            v = send(fetch(n))
            if os.environ.get("DIE"):
                os.kill(os.getpid(), 9)
            return v

        if __name__ == "__main__":
            if sys.argv[1:] == ["warm"]:
                fetch(1)
            else:
                print(job(1))
    """)
    env = script_env(tmp_path / "store")
    subprocess.run([sys.executable, str(script), "warm"], env=env, check=True, timeout=120)
    killed = subprocess.run([sys.executable, str(script)], env={**env, "DIE": "1"},
                            timeout=120)
    assert killed.returncode == -signal.SIGKILL
    assert len(marks.read_text().splitlines()) == 1
    subprocess.run([sys.executable, "-m", "durably", "cache", "clear"], env=env, check=True,
                   timeout=120, capture_output=True)  # (as if its entry expired)
    done = subprocess.run([sys.executable, str(script)], env=env, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len(marks.read_text().splitlines()) == 1, marks.read_text()  # sent once
