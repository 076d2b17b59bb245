"""A hit on a large numpy result: ``@durably.task(mmap=True)`` against joblib's
``Memory(mmap_mode="r")``, side by side.

Run: python benchmarks/bench_mmap.py [--mb 1024] [--repeat 3]

A task returns a ``--mb`` MB float64 array. Each library's entry is written once (its own
process), then every hit is timed in a fresh process (imports and the function's definition
done first, not timed), after a first call of the process on a small entry (which opens the
store; timed apart, as info): the call, then reading the array's first and last element.
Reported: the median wall time of the hit, and its memory, as the growth of the process's
resident set (current, and peak) across the hit. The hits are taken in turn, durably then
joblib, round after round. Times of a few milliseconds on a shared machine are noisy: the
ratio is the figure, and only its order of magnitude.

- **mmap hit**: durably ``mmap=True`` vs joblib ``mmap_mode="r"``; both return a read-only
  ``numpy.memmap`` of the stored file and read none of it. durably checks the file's size,
  the checksum of its description and each array's ``.npy`` header on a hit (not the arrays'
  bytes: see docs/how-to/large-results.md); joblib checks nothing.
- **plain hit** (info): durably without ``mmap=True`` (the array is read back into memory and
  its checksum verified), to show what the option saves.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, emit, positive_int, ratio, report, worker

SCRIPT = str(Path(__file__).resolve())


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def _peak_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(kind: str, root: str, mb: int) -> None:
    """One process: define the task, call it (``write``: the miss; ``hit``: timed)."""
    import time

    import numpy as np

    n = mb * 1_000_000 // 8

    def make(n: int) -> Any:
        a = np.empty(n)
        a.fill(1.5)
        a[-1] = 7.0
        return a

    if kind.startswith("joblib"):
        import joblib

        func = joblib.Memory(root, mmap_mode="r", verbose=0).cache(make)
    else:
        import durably

        durably.configure(store=durably.DiskStore(root))
        func = durably.task(name="make", version="1", mmap=kind.startswith("durably_mmap"))(
            make)
    if kind.endswith("write"):
        func(n)
        func(8)
        emit({})
        return
    t = time.perf_counter()
    func(8)  # the first call of the process: a hit on a small entry (opens the store)
    first = time.perf_counter() - t
    rss, peak = _rss_mb(), _peak_mb()
    t = time.perf_counter()
    a = func(n)
    value = float(a[0]) + float(a[-1])
    seconds = time.perf_counter() - t
    assert value == 8.5, value
    emit({"seconds": seconds, "first_s": first, "rss_mb": _rss_mb() - rss,
          "peak_mb": _peak_mb() - peak, "memmap": isinstance(a, np.memmap)})


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--mb", type=positive_int, default=1024, help="array size, MB")
    parser.add_argument("--repeat", type=positive_int, default=3,
                        help="fresh processes per measurement")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.child[0], opts.child[1], int(opts.child[2]))
        return
    root = Path(tempfile.mkdtemp(prefix="bench-mmap-"))
    kinds = ("durably_mmap", "joblib", "durably_plain")
    try:
        for kind in kinds:
            worker([SCRIPT, "--child", f"{kind}_write", str(root / kind), str(opts.mb)])
        samples: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for _ in range(opts.repeat):
            for kind in kinds:
                samples[kind].append(worker([SCRIPT, "--child", kind, str(root / kind),
                                             str(opts.mb)]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert all(s["memmap"] for s in samples["durably_mmap"] + samples["joblib"])

    def med(kind: str, key: str) -> float:
        return statistics.median(s[key] for s in samples[kind])

    d, j, p = (med(k, "seconds") for k in kinds)
    size = f"{opts.mb:,} MB"
    rows: list[dict[str, Any]] = [
        {"measure": f"mmap hit on a {size} array: durably vs joblib", "durably_s": d,
         "other_s": j, "ratio": ratio(d, j), "target": "<= 3.0", "limit": 3.0},
        {"measure": "  resident memory growth of the hit", "durably_mb": med(
            "durably_mmap", "rss_mb"), "other_mb": med("joblib", "rss_mb"),
         "target": "< 50 MB", "limit": 50.0, "on": "durably_mb"},
        {"measure": "  peak memory growth of the hit", "durably_mb": med(
            "durably_mmap", "peak_mb"), "other_mb": med("joblib", "peak_mb"),
         "target": "< 50 MB", "limit": 50.0, "on": "durably_mb"},
        {"measure": "(info) first call of a process (opens the store), small entry",
         "durably_s": med("durably_mmap", "first_s"), "other_s": med("joblib", "first_s"),
         "ratio": ratio(med("durably_mmap", "first_s"), med("joblib", "first_s"))},
        {"measure": f"(info) durably mmap hit vs plain hit ({size} read, checked)",
         "durably_s": d, "other_s": p, "ratio": ratio(d, p)},
        {"measure": "(info)   peak memory growth: mmap vs plain", "durably_mb": med(
            "durably_mmap", "peak_mb"), "other_mb": med("durably_plain", "peak_mb")},
    ]
    report("mmap", rows, mb=opts.mb, repeat=opts.repeat, samples=samples)


if __name__ == "__main__":
    main()
