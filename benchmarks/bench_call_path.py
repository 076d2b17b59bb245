"""The call path on a trivial task: a cache hit outside a run, an executed step inside a run,
a replayed step on resume; durably against diskcache, joblib, LangGraph and DBOS.

Run: python benchmarks/bench_call_path.py [--steps 100] [--rounds 5] [--repeat 7]

Every ratio compares figures measured in the same process, interleaved: one sample of each
contender in turn, ``--repeat`` times, medians. durably, diskcache, joblib and LangGraph share
one process; DBOS, which starts background threads at launch, gets its own, where durably is
measured again beside it. Both processes are started ``--rounds`` times, one after the other;
a figure is the median over rounds, so a slow minute on a shared machine lands on every
library alike. Ratios are durably / alternative: lower is better.

- **hit**: the task called outside a run on a warm cache entry (durably: digest, key, store
  lookup, unpickle; diskcache: ``Cache.memoize``; joblib: ``Memory.cache``).
- **executed step**: a run of ``--steps`` trivial steps on new inputs, wall time / steps
  (starting and ending the run included). durably commits each step to its journal before the
  task returns (``synchronous=normal``: survives the process being killed; the ``full`` rows
  also survive a power cut, like SQLite's default that LangGraph and DBOS keep). LangGraph's
  functional API uses ``SqliteSaver``, which writes a task's result from a background thread;
  DBOS uses a SQLite system database and records each ``@DBOS.step`` before it returns.
- **replayed step on resume**: a run of ``--steps`` steps that fails after its last step is
  called again, and every step comes from the journal (LangGraph: ``invoke(None, config)`` on
  the same thread_id, its documented resume after an error, served from the checkpoint's
  pending writes; the benchmark checks that no task executes again). Wall time of the
  resuming call / steps.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, emit, median_of, positive_int, ratio, report, worker
from _workload import FAIL, chain, inc

import durably

_bases = itertools.count(1)
Sample = Callable[[], float]  # one measurement: seconds per call or per step


def next_base() -> int:
    """A fresh input range, so every step of a new run misses every cache."""
    return next(_bases) * 10_000_000


def interleave(samples: dict[str, Sample], repeat: int) -> dict[str, float]:
    """Median of ``repeat`` samples of each measurement, taken in turn (after one warm-up)."""
    for sample in samples.values():
        sample()
    got: dict[str, list[float]] = {name: [] for name in samples}
    for _ in range(repeat):
        for name, sample in samples.items():
            got[name].append(sample())
    return {name: statistics.median(values) for name, values in got.items()}


def per_call(fn: Callable[[], Any], number: int) -> Sample:
    """A sample: the mean time of ``number`` calls of ``fn``."""
    def sample() -> float:
        t = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t) / number
    return sample


def per_step(run: Callable[[int, int], Any], steps: int, before: Callable[[], Any] = list
             ) -> Sample:
    """A sample: ``run(steps, base)`` on new inputs, seconds per step."""
    def sample() -> float:
        before()
        base = next_base()
        t = time.perf_counter()
        run(steps, base)
        return (time.perf_counter() - t) / steps
    return sample


def per_resumed_step(start: Callable[[int, int], Any], resume: Callable[[int, int], Any],
                     check: Callable[[int, Any], None], steps: int,
                     before: Callable[[], Any] = list) -> Sample:
    """A sample: a run of ``steps`` steps fails after them (untimed); ``resume(steps, base)``
    finishes it, seconds per step; ``check(steps, what resume returned)`` (untimed) makes sure
    nothing executed again."""
    def sample() -> float:
        before()
        base = next_base()
        FAIL["on"] = True
        with contextlib.suppress(RuntimeError):
            start(steps, base)
        FAIL["on"] = False
        t = time.perf_counter()
        done = resume(steps, base)
        elapsed = time.perf_counter() - t
        check(steps, done)
        return elapsed / steps
    return sample


def check_run(n: int, run: durably.Run[int], status: str = "replayed") -> None:
    """Every step of the run had ``status`` (the figure measures what it says)."""
    if run.counts()[status] != n:
        raise AssertionError(f"expected {n} {status} steps, got {run.counts()}")


def durably_samples(tmp: Path, steps: int) -> dict[str, Sample]:
    normal = durably.DiskStore(tmp / "durably")
    full = durably.DiskStore(tmp / "durably-full", synchronous="full")
    # every hit read from SQLite (a new process's first hit on each key, or a store another
    # connection keeps writing): the values kept in memory turned off
    from_disk = durably.DiskStore(tmp / "durably", memo_entries=0)

    def use_normal() -> None:
        durably.configure(store=normal)

    def use_full() -> None:
        durably.configure(store=full)

    use_normal()
    check_run(steps, chain.run(steps, next_base()), "ran")
    return {
        "durably.hit": lambda: (use_normal(), per_call(lambda: inc(-1), 2000)())[1],
        "durably.hit_disk": lambda: (durably.configure(store=from_disk),
                                     per_call(lambda: inc(-1), 2000)())[1],
        "durably.executed": per_step(chain.run, steps, use_normal),
        "durably.replayed": per_resumed_step(chain.run, chain.run, check_run, steps, use_normal),
        "durably.executed_full": per_step(chain.run, steps, use_full),
    }


# -- the alternatives ------------------------------------------------------------------------
def diskcache_samples(tmp: Path) -> dict[str, Sample]:
    import diskcache

    cache = diskcache.Cache(str(tmp / "diskcache"))

    @cache.memoize()
    def inc(x: int) -> int:
        return x + 1

    return {"diskcache.hit": per_call(lambda: inc(-1), 2000)}


def joblib_samples(tmp: Path) -> dict[str, Sample]:
    import joblib

    def inc(x: int) -> int:
        return x + 1

    cached = joblib.Memory(str(tmp / "joblib"), verbose=0).cache(inc)
    return {"joblib.hit": per_call(lambda: cached(-1), 300)}


def langgraph_samples(tmp: Path, steps: int) -> dict[str, Sample]:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.func import entrypoint, task

    calls = [0]

    @task
    def inc(x: int) -> int:
        calls[0] += 1
        return x + 1

    def body(inputs: dict[str, int]) -> int:
        total = 0
        for i in range(inputs["n"]):
            total += inc(inputs["base"] + i).result()
        if FAIL["on"]:
            raise RuntimeError("stopped after the steps, to be resumed")
        return total

    saver = SqliteSaver(sqlite3.connect(str(tmp / "langgraph.sqlite"), check_same_thread=False))
    chain = entrypoint(checkpointer=saver)(body)
    plain = entrypoint()(body)

    def config(base: int) -> dict[str, Any]:
        return {"configurable": {"thread_id": f"t{base}"}}

    def resume(n: int, base: int) -> int:
        calls[0] = 0
        return int(chain.invoke(None, config(base)))

    def check(n: int, result: int) -> None:
        if calls[0]:
            raise AssertionError(f"LangGraph executed {calls[0]} tasks again on resume")

    return {
        "langgraph.executed": per_step(
            lambda n, b: chain.invoke({"n": n, "base": b}, config(b)), steps),
        "langgraph.executed_plain": per_step(
            lambda n, b: plain.invoke({"n": n, "base": b}), steps),
        "langgraph.replayed": per_resumed_step(
            lambda n, b: chain.invoke({"n": n, "base": b}, config(b)), resume, check, steps),
    }


def main_worker(tmp: Path, steps: int, repeat: int) -> dict[str, float]:
    """durably, diskcache, joblib and LangGraph in one process, interleaved."""
    return interleave({**durably_samples(tmp, steps), **diskcache_samples(tmp),
                       **joblib_samples(tmp), **langgraph_samples(tmp, steps)}, repeat)


def dbos_worker(tmp: Path, steps: int, repeat: int) -> dict[str, float]:
    """DBOS (launched, with its background threads) and durably beside it, interleaved."""
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "durably-bench",
        "system_database_url": f"sqlite:///{tmp / 'dbos.sqlite'}",
        "run_admin_server": False,
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def step(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def workflow(n: int, base: int) -> int:
        return sum(step(base + i) for i in range(n))

    DBOS.launch()
    try:
        ours = durably_samples(tmp, steps)
        return interleave({"dbos.executed": per_step(workflow, steps),
                           "durably.executed": ours["durably.executed"],
                           "durably.executed_full": ours["durably.executed_full"]}, repeat)
    finally:
        DBOS.destroy()


WORKERS = {"main": main_worker, "dbos": dbos_worker}


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--steps", type=positive_int, default=100,
                        help="steps per run (default 100)")
    parser.add_argument("--rounds", type=positive_int, default=5, help="processes of each kind")
    parser.add_argument("--repeat", type=positive_int, default=7, help="samples per process")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        with tempfile.TemporaryDirectory() as tmp:
            emit(WORKERS[opts.worker](Path(tmp), opts.steps, opts.repeat))
        return

    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in WORKERS}
    for r in range(opts.rounds):
        for name in WORKERS:
            print(f"round {r + 1}/{opts.rounds}: {name}", file=sys.stderr, flush=True)
            samples[name].append(worker([__file__, "--worker", name, "--steps", str(opts.steps),
                                         "--repeat", str(opts.repeat)]))
    rows: list[dict[str, Any]] = []

    def row(measure: str, where: str, ours: str, theirs: str | None, target: str,
            limit: float | None = None) -> None:
        d = median_of(samples[where], ours)
        o = median_of(samples[where], theirs) if theirs else None
        rows.append({"measure": measure, "durably_s": d, "other_s": o, "ratio": ratio(d, o),
                     "target": target, "limit": limit})

    row("hit outside a run vs diskcache memoize", "main", "durably.hit", "diskcache.hit",
        "<= 0.5", 0.5)
    row("hit outside a run vs joblib.Memory", "main", "durably.hit", "joblib.hit",
        "<= 0.15", 0.15)
    row("  ... hit read from disk (memo_entries=0) vs diskcache", "main", "durably.hit_disk",
        "diskcache.hit", "(info: a first hit, or a store others write)")
    row("executed step vs LangGraph + SqliteSaver", "main", "durably.executed",
        "langgraph.executed", "<= 0.2", 0.2)
    row("executed step vs DBOS (SQLite)", "dbos", "durably.executed", "dbos.executed",
        "<= 0.05", 0.05)
    row("  ... durably synchronous=full vs LangGraph", "main", "durably.executed_full",
        "langgraph.executed", "(info: an fsync per commit, like theirs)")
    row("  ... durably synchronous=full vs DBOS", "dbos", "durably.executed_full",
        "dbos.executed", "(info: an fsync per commit, like theirs)")
    row("  ... vs LangGraph without checkpointer", "main", "durably.executed",
        "langgraph.executed_plain", "(info)")
    row("replayed step on resume vs LangGraph resumed task", "main", "durably.replayed",
        "langgraph.replayed", "<= 0.05", 0.05)
    report("call_path", rows, steps=opts.steps, rounds=opts.rounds, repeat=opts.repeat,
           samples=samples)


if __name__ == "__main__":
    main()
