"""How a run scales: cost per step and peak memory from 100 to 100,000 steps, and the time to
resume a 10,000-step run.

Run: python benchmarks/bench_run_scale.py [--sizes 100,1000,10000,100000] [--quick]

Every measurement is one fresh process on a fresh store, so peaks of memory never mix: it
warms up (a 10-step run: fingerprint, journal connection), then runs an entrypoint of N
trivial steps on new inputs that fails after its last step (every step executed and
journaled), then calls it again (every step replayed from the journal) and reports the wall
and CPU times of both calls and its peak RSS. Each size is repeated in several processes
(medians; two at 100,000 steps, about 10 s each), the sizes taken in turn round after round.

- **cost per step**: time of the run less that of an empty run (the fixed cost of starting
  and ending a run, median of 5), / N; the figure is cost(largest) / cost(smallest), target
  <= 1.3 (flat), for executed and for replayed steps, checked twice: on CPU time (user +
  system), which the other users of a shared machine barely touch though the sizes are
  measured minutes apart, and on wall time, which also counts waiting for the disk. Bytes
  written to disk per step and context switches (waits, preemptions) say which it was.
- **the store's share** (info): a run of 100 steps, on a fresh store and again on the store
  the largest run left (same process): a run's steps cost more on a large store (its cache
  and journal indexes no longer fit in the CPU's caches) whatever the run's own length.
- **resume of a 10,000-step run**: wall time of the resuming call, target < 1 s.
- **peak RSS**: growth of the peak resident memory from 1,000 to 100,000 steps, target < 50 MB
  (the journal is not held in memory).
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, emit, median_of, peak_rss_mb, positive_ints, ratio, report, worker
from _workload import FAIL, chain

import durably

REPEATS = {100: 7, 1_000: 5, 10_000: 3, 100_000: 2}  # processes per size (1 above)
QUICK = {100: 5, 1_000: 3, 10_000: 2, 100_000: 1}
SMALL = 100  # steps of the runs that measure the store's own share (small_runs)


def attempt_pair(steps: int, base: int) -> dict[str, float]:
    """A run of ``steps`` steps that fails after them, then its resume: wall and CPU seconds
    of each call, and the run handle of the resume."""
    out: dict[str, Any] = {}
    FAIL["on"] = True
    t, c, io = time.perf_counter(), time.process_time(), io_counters()
    with contextlib.suppress(RuntimeError):
        chain.run(steps, base)
    out["executed"], out["executed_cpu"] = time.perf_counter() - t, time.process_time() - c
    out.update({f"executed_{k}": v - io[k] for k, v in io_counters().items()})
    out["rss_executed_mb"] = peak_rss_mb()
    FAIL["on"] = False
    t, c, io = time.perf_counter(), time.process_time(), io_counters()
    out["run"] = chain.run(steps, base)
    out["resumed"], out["resumed_cpu"] = time.perf_counter() - t, time.process_time() - c
    out.update({f"resumed_{k}": v - io[k] for k, v in io_counters().items()})
    return out


def io_counters() -> dict[str, int]:
    """Bytes written to disk (file system blocks of 512 bytes) and voluntary (waits) and
    involuntary (preemption) context switches of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"written_bytes": r.ru_oublock * 512, "waits": r.ru_nvcsw, "preempted": r.ru_nivcsw}


def run_worker(steps: int) -> dict[str, Any]:
    """One process: warm up, time empty runs (the fixed cost of starting and ending a run and
    its resume), then run ``steps`` executed steps (then fail) and resume (all replayed)."""
    with tempfile.TemporaryDirectory() as tmp:
        durably.configure(store=durably.DiskStore(Path(tmp) / "store"))
        chain(10, -100)
        empty = [attempt_pair(0, -1 - i) for i in range(5)]
        fixed = {f"fixed_{k}": statistics.median(e[k] for e in empty)
                 for k in ("executed", "executed_cpu", "resumed", "resumed_cpu")}
        # (in the workers of large runs only: the small runs' own figures stay those of a
        # nearly empty store)
        large = steps >= 10_000
        small_before = small_runs(10**9, fixed["fixed_executed_cpu"]) if large else None
        rss_before = peak_rss_mb()
        out = attempt_pair(steps, 0)
        rss_peak = peak_rss_mb()  # before the check below, which reads the whole journal
        small_after = small_runs(2 * 10**9, fixed["fixed_executed_cpu"]) if large else None
        run = out.pop("run")
        counts = run.counts()
        if counts["replayed"] != steps or run.attempt != 2:
            raise AssertionError(f"expected {steps} replayed steps, got {counts}")
        net = {f"{k}_net": out[k] - fixed[f"fixed_{k}"]
               for k in ("executed", "executed_cpu", "resumed", "resumed_cpu")}
        return {"steps": steps, **out, **fixed, **net, "rss_before_mb": rss_before,
                "rss_peak_mb": rss_peak, "small_before_cpu": small_before,
                "small_after_cpu": small_after}


def small_runs(base: int, fixed_cpu: float) -> float:
    """CPU seconds per executed step of a run of 100 steps on new inputs (median of 5; the
    fixed cost of a run taken off): measured on a fresh store, and again on the store a large
    run left, it tells how much of a large run's cost per step is the store's size (its
    cache and journal indexes) and not the run's length."""
    costs = []
    for k in range(5):
        costs.append(attempt_pair(SMALL, base + 1000 * k)["executed_cpu"])
    return (statistics.median(costs) - fixed_cpu) / SMALL


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--sizes", type=positive_ints, default="100,1000,10000,100000",
                        help="run sizes in steps, comma-separated (at least two)")
    parser.add_argument("--quick", action="store_true", help="fewer processes per size")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        emit(run_worker(opts.worker))
        return
    sizes = opts.sizes
    if len(sizes) < 2:
        parser.error(f"--sizes needs at least two run sizes to compare, not {sizes}")
    counts = {n: (QUICK if opts.quick else REPEATS).get(n, 1) for n in sizes}
    samples: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for r in range(max(counts.values())):
        for n in sizes:
            if r < counts[n]:
                print(f"round {r + 1}: {n:,} steps", file=sys.stderr, flush=True)
                samples[n].append(worker([__file__, "--worker", str(n)]))

    def per_step(n: int, key: str) -> float | None:
        value = median_of(samples[n], key)
        return value / n if value is not None else None

    def per_step_kb(n: int, key: str) -> float | None:
        value = median_of(samples[n], key)
        return value / n / 1024 if value is not None else None

    rows: list[dict[str, Any]] = []
    for n in sizes:
        for key, what in (("executed", "executed"), ("resumed", "replayed")):
            rows.append({"measure": f"{what} step, run of {n:,}: CPU (wall)",
                         "durably_s": per_step(n, f"{key}_cpu_net"),
                         "other_s": per_step(n, f"{key}_net"),
                         "ratio": None, "target": "(per step; other = wall time)"})
    small, large = sizes[0], sizes[-1]
    for key, what in (("executed", "executed"), ("resumed", "replayed")):
        d, o = per_step(large, f"{key}_cpu_net"), per_step(small, f"{key}_cpu_net")
        rows.append({"measure": f"{what} step CPU cost, {large:,} vs {small:,} steps",
                     "durably_s": d, "other_s": o, "ratio": ratio(d, o), "target": "<= 1.3 (flat)",
                     "limit": 1.3})
        d, o = per_step(large, f"{key}_net"), per_step(small, f"{key}_net")
        rows.append({"measure": f"{what} step wall time, {large:,} vs {small:,} steps",
                     "durably_s": d,
                     "other_s": o, "ratio": ratio(d, o), "target": "<= 1.3 (flat)",
                     "limit": 1.3})
    before = median_of(samples[large], "small_before_cpu")
    after = median_of(samples[large], "small_after_cpu")
    if before is not None and after is not None:
        rows.append({"measure": f"executed step CPU, run of {SMALL}: on the store a run of "
                                f"{large:,} left vs on a fresh one",
                     "durably_s": after, "other_s": before, "ratio": ratio(after, before),
                     "target": "(info: the store's share)"})
    for n in sizes:
        rows.append({"measure": f"disk writes per executed step, run of {n:,}",
                     "durably_kb": per_step_kb(n, "executed_written_bytes"), "other_kb": None,
                     "ratio": None, "target": "(info: WAL + checkpoints)"})
    for n in sizes:
        waits = median_of(samples[n], "executed_waits")
        preempted = median_of(samples[n], "executed_preempted")
        rows.append({"measure": f"waits (preempted) per 1,000 executed steps, run of {n:,}",
                     "durably_n": 1000 * waits / n if waits is not None else None,
                     "other_n": 1000 * preempted / n if preempted is not None else None,
                     "ratio": None, "target": "(info: context switches)"})
    if 10_000 in samples:
        rows.append({"measure": "resume of a 10,000-step run (whole call)",
                     "durably_s": median_of(samples[10_000], "resumed"), "other_s": None,
                     "ratio": None, "target": "< 1 s", "limit": 1.0, "on": "durably_s"})
    for n in sizes:
        rows.append({"measure": f"peak RSS, run of {n:,}",
                     "durably_mb": median_of(samples[n], "rss_peak_mb"), "other_mb": None,
                     "ratio": None, "target": "(whole process)"})
    base = 1_000 if 1_000 in samples else small
    growth = median_of(samples[large], "rss_peak_mb") - median_of(samples[base], "rss_peak_mb")
    rows.append({"measure": f"peak RSS growth, {base:,} -> {large:,} steps", "durably_mb": growth,
                 "other_mb": None, "ratio": None, "target": "< 50 MB", "limit": 50.0,
                 "on": "durably_mb"})
    report("run_scale", rows, samples={str(n): s for n, s in samples.items()})


if __name__ == "__main__":
    main()
