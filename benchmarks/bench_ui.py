"""The dashboard on a big run: the CPU time `durably ui` takes to open a 100,000-step run's page
and its next page of steps, for the three shapes a big run takes.

Run: python benchmarks/bench_ui.py [--steps 100000] [--repeat 3]

One DiskStore holds three runs of N trivial steps (built first, about a minute at 100,000):
- **first attempt**: every step executed (``ran``);
- **resumed**: a run that failed after its N steps, resumed: its second attempt replayed them
  all (the store keeps them as replay ranges, not a row each);
- **all cached**: another entrypoint calling the same task on the same inputs: every step
  served from the cache (``cached``).

For each run, a new dashboard (``create_app``, so nothing it kept from an earlier request
helps) is asked through Starlette's TestClient for the run's page (``/runs/{id}``: counts,
the first page of steps, time saved), then for the next page of steps (``?after=``, the link
the page shows), then for the runs table's rows (``/api/runs``: the counts and progress the
live pages poll). CPU seconds (user + system) of this process per request, median of
``--repeat`` rounds; target < 1 s for the run page and the next page.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, positive_int, report
from _workload import FAIL, chain, inc

import durably

TOKEN = "bench"


@durably.entrypoint
def chain_again(n: int, base: int) -> int:
    """The steps of ``chain(n, base)`` again, in another run: every one a cache hit."""
    return sum(inc(base + i) for i in range(n))


def build(steps: int) -> dict[str, str]:
    """The three runs, by shape: their run ids."""
    FAIL["on"] = False
    first = chain.run(steps, 0)
    cached = chain_again.run(steps, 0)
    FAIL["on"] = True
    with contextlib.suppress(RuntimeError):
        chain.run(steps, 10**9)
    FAIL["on"] = False
    resumed = chain.run(steps, 10**9)
    shapes = {"first attempt": first, "resumed": resumed, "all cached": cached}
    for name, status in (("first attempt", "ran"), ("resumed", "replayed"),
                         ("all cached", "cached")):
        counts = shapes[name].counts()
        if counts[status] != steps:
            raise AssertionError(f"the {name} run has {counts}, not {steps} {status} steps")
    return {name: run.id for name, run in shapes.items()}


def cpu(fn: Any) -> tuple[float, Any]:
    """CPU seconds of this process (user + system) taken by ``fn()``, and what it returned."""
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def open_run(store: durably.Store, run_id: str) -> dict[str, float]:
    """CPU seconds of the run page, its next page of steps and the runs table's rows, asked
    of a new dashboard (nothing kept from earlier requests)."""
    from starlette.testclient import TestClient

    from durably._ui.app import create_app

    with TestClient(create_app(store, TOKEN), base_url="http://127.0.0.1:8765",
                    headers={"x-durably-token": TOKEN}) as client:
        page_s, page = cpu(lambda: client.get(f"/runs/{run_id}"))
        if page.status_code != 200:
            raise AssertionError(f"/runs/{run_id}: {page.status_code}")
        found = re.search(r'<a href="([^"]+)">next ›</a>', page.text)
        if found is None:
            raise AssertionError(f"/runs/{run_id} has no link to its next page of steps")
        link = html.unescape(found.group(1))
        next_s, after = cpu(lambda: client.get(link))
        if after.status_code != 200:
            raise AssertionError(f"{link}: {after.status_code}")
        runs_s, runs = cpu(lambda: client.get("/api/runs"))
        if runs.status_code != 200:
            raise AssertionError(f"/api/runs: {runs.status_code}")
        pages = {}
        for number in (1, 100):  # (page 100 of 500 checkpoints: the 50,000th from the end)
            pages[number], history = cpu(
                lambda n=number: client.get(f"/runs/{run_id}/history?page={n}"))
            if history.status_code != 200 or 'name="at"' not in history.text:
                raise AssertionError(f"/runs/{run_id}/history?page={number}: "
                                     f"{history.status_code}")
    return {"page": page_s, "next": next_s, "runs": runs_s, "history 1": pages[1],
            "history 100": pages[100]}


def fork_at(store: durably.Store, run_id: str, newest: int) -> float:
    """CPU seconds of the dashboard's Fork at the ``newest``-th checkpoint from the end (what
    the Fork button of history page 100 posts): the fork's steps copied, not executed."""
    from durably._runtime.history import NO_UPDATE, make_fork
    from durably._ui.queries import safe_load

    source = store.find_run(run_id)
    assert source is not None
    (at,) = durably.get_run(run_id, store=store).history(offset=newest, limit=1)
    seconds, _ = cpu(lambda: make_fork(store, source, at.id, NO_UPDATE, load=safe_load))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--steps", type=positive_int, default=100_000,
                        help="steps of each run (default 100,000)")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="rounds of requests per run (medians)")
    opts = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = durably.DiskStore(Path(tmp) / "store")
        durably.configure(store=store)
        t = time.perf_counter()
        runs = build(opts.steps)
        print(f"built three runs of {opts.steps:,} steps in {time.perf_counter() - t:.0f} s",
              file=sys.stderr, flush=True)
        for shape, run_id in runs.items():
            samples = [open_run(store, run_id) for _ in range(opts.repeat)]
            for key, what, limit in (("page", "run page", 1.0),
                                     ("next", "next page of steps", 1.0),
                                     ("runs", "runs table rows, all three runs (/api/runs)", None),
                                     ("history 1", "history page 1", 1.0),
                                     ("history 100", "history page 100", 1.0)):
                row: dict[str, Any] = {
                    "measure": f"{shape}, {opts.steps:,} steps: {what} (CPU)",
                    "durably_s": statistics.median(s[key] for s in samples),
                    "other_s": None, "ratio": None,
                    "target": "< 1 s" if limit else "(info)"}
                if limit:
                    row.update(limit=limit, on="durably_s", op="<=")
                rows.append(row)
        if opts.steps > 50_000:  # (after the pages: the forks are runs of the store too)
            rows.append({"measure": f"first attempt, {opts.steps:,} steps: a fork at the "
                                    "50,000th checkpoint from the end (CPU; 50,000 steps "
                                    "copied)",
                         "durably_s": fork_at(store, runs["first attempt"], 50_000),
                         "other_s": None, "ratio": None, "target": "(info)"})
        durably.configure(store=None)
    report("ui", rows, steps=opts.steps)


if __name__ == "__main__":
    main()
