"""Fan-out throughput.

1. ``task.map`` over 10,000 trivial items that are all served from the store, against joblib
   ``Parallel`` + ``Memory`` (threads and loky; the faster counts) and LangGraph's functional
   API (``@task`` futures with a ``CachePolicy`` and a SQLite cache, like durably's on disk),
   measured in the same run. durably is measured three ways: outside a run (the cache
   alone), replaying a finished run (the journal), and a new run whose items are all in the
   cache (each item journaled as ``cached``).
2. CPU-bound items on the process executor against the thread executor on this machine
   (target on 2 cores: >= 1.7x).

Run: python benchmarks/bench_map.py [--items N] [--no-langgraph]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, positive_int, report

import durably


# -- the trivial item, for each library ------------------------------------------------------
@durably.task
def trivial(i: int) -> int:
    return i + 1


@durably.entrypoint
def job(n: int) -> int:
    return sum(trivial.map(range(n)))


def plain_trivial(i: int) -> int:
    return i + 1


@durably.task(cache=False)
def burn(n: int) -> int:
    """CPU-bound pure Python: no GIL release."""
    total = 0
    for i in range(n):
        total += i * i % 7
    return total


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``repeat`` calls (after one warm-up call)."""
    fn()
    rounds = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        rounds.append(time.perf_counter() - t)
    return statistics.median(rounds)


def bench_joblib(n: int, root: Path, repeat: int) -> dict[str, float]:
    import joblib

    cached = joblib.Memory(root / "joblib", verbose=0).cache(plain_trivial)
    out = {}
    for backend in ("threading", "loky"):
        def run(backend: str = backend) -> Any:
            return joblib.Parallel(n_jobs=2, backend=backend)(
                joblib.delayed(cached)(i) for i in range(n))
        out[backend] = timed(run, repeat)
    return out


def bench_langgraph(n: int, root: Path, repeat: int) -> float | None:
    try:
        from langgraph.cache.sqlite import SqliteCache
        from langgraph.func import entrypoint, task
        from langgraph.types import CachePolicy
    except ImportError:
        print("langgraph is not installed (pip install -e '.[bench]'): skipped")
        return None

    @task(cache_policy=CachePolicy())
    def lg_trivial(i: int) -> int:
        return i + 1

    @entrypoint(cache=SqliteCache(path=str(root / "langgraph.sqlite")))
    def lg_job(count: int) -> int:
        futures = [lg_trivial(i) for i in range(count)]
        return sum(f.result() for f in futures)

    return timed(lambda: lg_job.invoke(n), repeat)


def cpu_rows() -> list[dict[str, Any]]:
    """CPU-bound items: process pool (warm) vs thread pool, on this machine's cores."""
    work = [2_000_000] * 8
    threads = timed(lambda: burn.map(work, executor="thread", max_workers=2, progress=False), 3)
    processes = timed(lambda: burn.map(work, executor="process", max_workers=2,
                                       progress=False), 3)
    return [{"measure": f"CPU-bound items on {os.cpu_count()} cores"},
            {"measure": "  8 items: process executor vs thread executor",
             "durably_s": processes, "other_s": threads, "ratio": threads / processes,
             "target": ">= 1.7x on 2 cores", "limit": 1.7, "op": ">="}]


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--items", type=positive_int, default=10_000)
    parser.add_argument("--repeat", type=positive_int, default=5)
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--cpu-only", action="store_true", help="only process vs thread")
    opts = parser.parse_args()
    n = opts.items
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        durably.configure(store=durably.DiskStore(root / "durably"))
        if opts.cpu_only:
            rows += cpu_rows()
            durably.configure()
            report("map_cpu", rows)
            return
        expected = sum(range(1, n + 1))
        assert sum(trivial.map(range(n), progress=False)) == expected  # fill the cache
        outside = timed(lambda: trivial.map(range(n), progress=False), opts.repeat)
        assert job(n) == expected
        replay = timed(lambda: job(n), opts.repeat)
        new_run = timed(lambda: job.run(n, fresh=True), opts.repeat)

        joblib_s = bench_joblib(n, root, max(1, opts.repeat // 2))
        best_joblib = min(joblib_s.values())
        lg = None if opts.no_langgraph else bench_langgraph(n, root, 1)

        rows.append({"measure": f"map of {n:,} cached items"})
        rows.append({"measure": "  durably outside a run vs joblib Parallel+Memory",
                     "durably_s": outside, "other_s": best_joblib,
                     "ratio": best_joblib / outside, "target": "faster (ratio >= 1)",
                     "limit": 1.0, "op": ">=",
                     "joblib_threading_s": joblib_s["threading"],
                     "joblib_loky_s": joblib_s["loky"]})
        if lg is not None:
            rows.append({"measure": "  durably outside a run vs LangGraph futures + cache",
                         "durably_s": outside, "other_s": lg, "ratio": lg / outside,
                         "target": "faster (ratio >= 1)", "limit": 1.0, "op": ">="})
        rows.append({"measure": "  durably replaying a finished run (the journal)",
                     "durably_s": replay, "target": "< 1 s", "limit": 1.0, "on": "durably_s"})
        rows.append({"measure": "  durably in a new run, all from the cache",
                     "durably_s": new_run, "target": "< 1 s", "limit": 1.0,
                     "on": "durably_s"})

        rows += cpu_rows()
        durably.configure()

    print(f"items per second ({n:,} cached items):")
    for name, seconds in [("durably, outside a run", outside), ("durably, replay", replay),
                          ("durably, new run from the cache", new_run),
                          ("joblib Parallel+Memory (threading)", joblib_s["threading"]),
                          ("joblib Parallel+Memory (loky)", joblib_s["loky"])] + (
            [("LangGraph futures + SqliteCache", lg)] if lg is not None else []):
        print(f"  {name:<38} {n / seconds:>12,.0f}/s")
    report("map", rows, items=n)


if __name__ == "__main__":
    main()
