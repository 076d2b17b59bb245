"""What ``compress=`` costs and saves: a task's result stored with zstandard (level 3, and
the ``--level`` given) against the same result stored as a plain pickle, for a compressible
and an incompressible value, measured in one process, interleaved.

Run: python benchmarks/bench_compress.py [--mb 64] [--level 9] [--repeat 5]

- **compressible**: a ``--mb`` MB numpy array of small integers with runs (a typical feature
  matrix or label column), and the same size of repetitive text (a log, a JSON dump);
- **incompressible**: ``--mb`` MB of random bytes (already-compressed data: images, archives).

For each value and setting: the **size** stored (the cache file, MB), the **write** time (a
miss: the task executes, its result is pickled, compressed and written; the body's own time
is the same for both and is included), and the **read** time (a hit, read from disk: the
store keeps no large value in memory). Ratios are compressed / plain: below 1 is a saving.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, median_seconds, positive_int, ratio, report

import durably


def _values(mb: int) -> dict[str, Any]:
    import numpy as np

    n = mb * 1_000_000
    rng = np.random.default_rng(0)
    labels = np.repeat(rng.integers(0, 16, n // 8 // 64), 64).astype(np.int64)
    line = b"2024-01-01T00:00:00 INFO worker-3 processed batch 1234 in 0.52 s (ok)\n"
    return {"int array (runs)": labels, "text (log lines)": (line * (n // len(line) + 1))[:n],
            "random bytes": os.urandom(n)}


def _returning(value: Any) -> Any:
    def body(i: int) -> Any:  # (i: a new input for each miss)
        return value

    return body


def _stored_mb(store: durably.DiskStore, key: str) -> float:
    from durably.store import value_bytes

    value = store.cache_get(key)
    assert value is not None
    return len(value_bytes(value)) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--mb", type=positive_int, default=64, help="value size, MB")
    parser.add_argument("--level", type=positive_int, default=9,
                        help="a second zstandard level to measure")
    parser.add_argument("--repeat", type=positive_int, default=5)
    opts = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-compress-"))
    store = durably.DiskStore(root / "store", memo_entries=0)
    durably.configure(store=store)
    rows: list[dict[str, Any]] = []
    counter = itertools.count()
    try:
        for label, value in _values(opts.mb).items():
            rows.append({"measure": f"{label}, {opts.mb} MB"})
            plain = durably.task(name=f"plain {label}", version="1", compress=False)(
                _returning(value))
            ref = {"size": 0.0, "write": 0.0, "read": 0.0}
            for level in (None, 3, opts.level):
                task = plain if level is None else durably.task(
                    name=f"{level} {label}", version="1", compress=level)(
                    _returning(value))
                write = median_seconds(lambda task=task: task(next(counter)),
                                       repeat=opts.repeat)
                i = next(counter)
                task(i)
                read = median_seconds(lambda task=task, i=i: task(i), repeat=opts.repeat)
                size = _stored_mb(store, task.cache_key(i))
                store.clear()
                if level is None:
                    ref = {"size": size, "write": write, "read": read}
                    rows.append({"measure": "  plain pickle: size (its times: the other "
                                 "column below)", "durably_mb": size})
                    continue
                rows.append({"measure": f"  compress={level}: size vs plain",
                             "durably_mb": size, "other_mb": ref["size"],
                             "ratio": ratio(size, ref["size"])})
                rows.append({"measure": f"  compress={level}: write (miss) vs plain",
                             "durably_s": write, "other_s": ref["write"],
                             "ratio": ratio(write, ref["write"])})
                rows.append({"measure": f"  compress={level}: read (hit) vs plain",
                             "durably_s": read, "other_s": ref["read"],
                             "ratio": ratio(read, ref["read"])})
    finally:
        durably.configure()
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    report("compress", rows, mb=opts.mb, level=opts.level, repeat=opts.repeat)


if __name__ == "__main__":
    main()
