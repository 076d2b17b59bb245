"""Hello, task: a function whose result is kept on disk by its code and its inputs.

    python examples/01_hello_task.py     # first run: the task executes
    python examples/01_hello_task.py     # second run: served from the store, instantly

The store lives in ``$DURABLY_DIR`` (default ``./.durably``).
"""

from __future__ import annotations

import time

import durably


@durably.task  # cached by code + inputs; the call looks exactly as before
def slow_square(x: int) -> int:
    print(f"  computing slow_square({x}) ...")
    time.sleep(0.2)  # stands in for real work
    return x * x


@durably.entrypoint  # every call is a run with a journal
def hello(numbers: list[int]) -> int:
    return sum(slow_square(n) for n in numbers)


if __name__ == "__main__":
    # Outside a run a task is a durable memoized function: f(3) and f(x=3) share one entry.
    print("explain before calling:", slow_square.explain(3))
    print("slow_square(3) =", slow_square(3), "| slow_square(x=3) =", slow_square(x=3))

    # Inside a run every call is a journaled step.
    run = hello.run([1, 2, 3])
    print("result:", run.result)
    for step in run.steps:  # ran: executed; cached: from the cache; replayed: from the journal
        print(f"  step {step.task}: {step.status}")
    print(run.summary())
    if run.counts()["ran"] == 0:
        print("nothing executed: every step was served from the store")
