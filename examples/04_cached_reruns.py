"""Cached reruns during development: edit one function, rerun the script, and only that
function and what depends on its result execute again.

    python examples/04_cached_reruns.py     # run 1: everything executes (about 1 s)
    python examples/04_cached_reruns.py     # run 2: everything is served from the cache
    # now edit OUTLIER_LIMIT (or the body of clean) and run again:
    python examples/04_cached_reruns.py     # load is cached; clean and summarize execute

No entrypoint here: outside a run a task is a durable memoized function, like a cached
notebook cell. ``task.explain(...)`` says, before the call, whether it will be served from the
cache and, if not, what changed: an argument, a function or constant of your code, a version.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import durably

# --8<-- [start:tasks]
OUTLIER_LIMIT = 3.0  # configuration: edit it and rerun; the tasks that read it execute again


@durably.task
def load(n: int, seed: int = 0) -> list[float]:
    time.sleep(0.8)  # the expensive part: a download, a query, a simulation
    rng = random.Random(seed)
    return [rng.gauss(10, 2) for _ in range(n)] + [45.0, -30.0]  # two outliers


@durably.task
def clean(values: list[float]) -> list[float]:
    mean, sd = statistics.fmean(values), statistics.pstdev(values)
    return [v for v in values if abs(v - mean) <= OUTLIER_LIMIT * sd]


@durably.task
def summarize(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "mean": round(statistics.fmean(values), 3),
            "max": round(max(values), 3)}
# --8<-- [end:tasks]


def step(task: Any, *args: Any) -> Any:
    """Call a task, saying whether the cache served it and, if not, why."""
    why = task.explain(*args)
    started = time.perf_counter()
    result = task(*args)
    took = time.perf_counter() - started
    verdict = "cached" if why.hit else "ran"
    print(f"{task.__name__:<10} {verdict:<6} {took:6.3f} s" + ("" if why.hit else f"  ({why})"))
    return result


if __name__ == "__main__":
    raw = step(load, 500)
    kept = step(clean, raw)
    print("summary:", step(summarize, kept))
