"""Make an existing script durable: three decorators and nothing else changes.

The script below was an ordinary one: read a CSV, compute per-region totals, write a
report. Making it durable took three lines:

- ``@durably.task`` on each function that does real work (its result is cached by code and
  inputs, and journaled inside a run);
- ``@durably.task(cache=False)`` on the function with a side effect (journaled, so it happens
  once per run, but never served from another run's cache);
- ``@durably.entrypoint`` on ``main`` (each call is a run that resumes where it stopped).

The input file is passed as ``durably.file(path)``: its digest is the file's content, so
editing ``sales.csv`` makes ``load`` run again; a plain string path would not.

    python examples/02_make_a_script_durable.py    # run 1: every step executes
    python examples/02_make_a_script_durable.py    # run 2: every step is replayed
"""

from __future__ import annotations

import csv
import time
from collections import defaultdict
from pathlib import Path

import durably

DATA = Path("sales.csv")


# --8<-- [start:pipeline]
@durably.task
def load(path: durably.File) -> list[dict[str, str]]:
    time.sleep(0.1)  # a slow read
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@durably.task
def totals(rows: list[dict[str, str]]) -> dict[str, float]:
    by_region: dict[str, float] = defaultdict(float)
    for row in rows:
        by_region[row["region"]] += float(row["amount"])
    return dict(sorted(by_region.items()))


@durably.task(cache=False)  # a side effect: once per run, never from another run's cache
def write_report(summary: dict[str, float], out: str) -> str:
    lines = [f"{region:<8} {amount:>10.2f}" for region, amount in summary.items()]
    Path(out).write_text("\n".join(lines) + "\n")
    print(f"  wrote {out}")
    return out


@durably.entrypoint
def main(path: str = str(DATA), out: str = "report.txt") -> dict[str, float]:
    rows = load(durably.file(path))
    summary = totals(rows)
    write_report(summary, out)
    return summary
# --8<-- [end:pipeline]


def make_sample_data() -> None:
    regions = ["north", "south", "east", "west"]
    with DATA.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["region", "amount"])
        for i in range(200):
            w.writerow([regions[i % 4], f"{(i * 37) % 100 + 0.5:.2f}"])


if __name__ == "__main__":
    if not DATA.exists():
        make_sample_data()
    run = main.run()  # main() would return the same result; .run() returns the run handle
    print("totals:", run.result)
    print("steps:", ", ".join(f"{s.task} {s.status}" for s in run.steps))
    print(run.summary())
