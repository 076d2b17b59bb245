"""The workload the call-path and run-size benchmarks share: a trivial task and an entrypoint
that chains n calls of it (module level, as tasks usually are), failing after its steps while
``FAIL["on"]`` is set so that the next call resumes it."""

from __future__ import annotations

import durably

FAIL = {"on": False}  # the entrypoints raise after their steps while this is set


@durably.task
def inc(x: int) -> int:
    return x + 1


@durably.entrypoint
def chain(n: int, base: int) -> int:
    total = 0
    for i in range(n):
        total += inc(base + i)
    if FAIL["on"]:
        raise RuntimeError("stopped after the steps, to be resumed")
    return total
