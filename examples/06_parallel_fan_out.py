"""Parallel fan-out: ``task.map`` runs one step per item on threads (or processes, or a Dask
cluster) and returns the results in input order.

    python examples/06_parallel_fan_out.py                      # 24 items, 8 threads: ~0.6 s
    python examples/06_parallel_fan_out.py                      # again: replayed, instant
    python examples/06_parallel_fan_out.py --executor process   # CPU-bound work: processes

Each item's step identity is assigned in input order before anything runs, so it never
depends on which item finishes first: a fan-out killed halfway and run again executes exactly
the items that had not finished. Failures of some items raise an ``ExceptionGroup`` after the
others finished (and were journaled). ``--executor process`` needs the
``if __name__ == "__main__":`` guard below, as multiprocessing always does.
"""

from __future__ import annotations

import argparse
import time

import durably


@durably.task
def fetch(page: int) -> dict[str, int]:
    time.sleep(0.2)  # waiting on the network: threads overlap the waits
    return {"page": page, "words": 100 + (page * 37) % 50}


@durably.task
def combine(pages: list[dict[str, int]]) -> int:
    return sum(p["words"] for p in pages)


@durably.entrypoint
def crawl(n: int, executor: str = "thread") -> int:
    pages = fetch.map(range(n), executor=executor, max_workers=8)  # one step per page
    return combine(pages)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=24)
    parser.add_argument("--executor", default="thread", choices=["thread", "process"])
    args = parser.parse_args()

    started = time.perf_counter()
    run = crawl.run(args.items, args.executor)
    took = time.perf_counter() - started
    print(f"{args.items} pages, {run.result:,} words in {took:.2f} s "
          f"(one at a time: {0.2 * args.items:.1f} s)")
    print(run.summary())
