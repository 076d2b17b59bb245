"""Crash and resume a long job: kill it at any moment, run it again, and it continues exactly
where it stopped. A step that finished is never executed again in that run.

    python examples/03_crash_and_resume.py --crash-after 8   # kills itself (SIGKILL) after 8 items
    python examples/03_crash_and_resume.py                   # resumes: 8 replayed, the rest run

Press Ctrl-C halfway instead of ``--crash-after`` and rerun: the same happens. What re-executes
on resume is the entrypoint's own code between tasks (here the loop and the prints); every
task call in it is looked up in the journal first.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import durably

ITEMS = 20


# --8<-- [start:job]
@durably.task
def process(item: int) -> int:
    time.sleep(0.05)  # stands in for a slow API call, a model fit, a file to parse
    return item * item


# Set from the command line; read by the entrypoint's own code, so it is not an argument
# of the run (arguments name the run: the crashed run and the resumed one must be the same).
CRASH_AFTER: int | None = None


@durably.entrypoint
def long_job(n: int) -> int:
    total = 0
    for i in range(n):
        total += process(i)  # a finished step is committed to the journal before it returns
        print(f"  item {i + 1:>2}/{n} done", flush=True)
        if CRASH_AFTER is not None and i + 1 == CRASH_AFTER:
            print(f"  simulating a crash: SIGKILL after {CRASH_AFTER} items", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception handler runs
    return total
# --8<-- [end:job]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-after", type=int, default=None,
                        help="kill this process with SIGKILL after that many items")
    CRASH_AFTER = parser.parse_args().crash_after

    unfinished = [r for r in durably.list_runs(long_job) if r.status != "finished"]
    if unfinished:
        print(f"found run {unfinished[0].id} ({unfinished[0].status}, attempt "
              f"{unfinished[0].attempt}): continuing it")
    run = long_job.run(ITEMS)
    print("result:", run.result)
    print(run.summary())
