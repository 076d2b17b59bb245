"""Digest speed: small argument sets and a 200 MB array, against the alternatives.

Run: python benchmarks/bench_hashing.py   (needs the `bench` extra: pip install -e '.[bench]')

Ratios are measured in one process on the same inputs: for the large array, "ratio" is durably's
throughput divided by raw xxh3-128's on the same buffer (target >= 0.8; the two are timed in
turn, 7 times, medians); joblib.hash and pickle+xxh3 are printed beside it as the tools people
use instead.
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, median_seconds, report

import durably
from durably._keys.hashing import encode_arguments


def interleaved(a: Callable[[], Any], b: Callable[[], Any], repeat: int = 7
                ) -> tuple[float, float]:
    """Median times of ``a`` and ``b``, timed in turn (a slow second lands on both)."""
    a(), b()
    ta, tb = [], []
    for _ in range(repeat):
        for fn, out in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    argparse.ArgumentParser(description=description(__doc__)).parse_args()  # (--help)
    rows = []
    small = {"n": 3, "name": "alpha", "lr": 0.01, "tags": ("a", "b")}
    d_small = median_seconds(lambda: encode_arguments(small), number=20_000)
    p_small = median_seconds(lambda: xxhash.xxh3_128_hexdigest(pickle.dumps(small)),
                             number=20_000)
    rows.append({"measure": "digest of 4 small arguments", "durably_s": d_small,
                 "other_s": p_small, "ratio": d_small / p_small,
                 "target": "<= 5 us (other: pickle + xxh3, not canonical)",
                 "limit": 5e-6, "on": "durably_s"})
    try:
        import joblib

        j_small = median_seconds(lambda: joblib.hash(small), number=2_000)
        rows.append({"measure": "  ... vs joblib.hash", "durably_s": d_small, "other_s": j_small,
                     "ratio": d_small / j_small, "target": "lower is better"})
    except ImportError:
        joblib = None

    big = np.random.default_rng(0).random(25_000_000)  # 200 MB of float64
    raw, ours = interleaved(lambda: xxhash.xxh3_128_hexdigest(big), lambda: durably.digest(big))
    rows.append({"measure": "digest of a 200 MB float64 array", "durably_s": ours,
                 "other_s": raw, "ratio": raw / ours,
                 "target": ">= 0.8 of raw xxh3-128 throughput (ratio = raw time / ours)",
                 "limit": 0.8, "op": ">="})
    pick = median_seconds(lambda: xxhash.xxh3_128_hexdigest(pickle.dumps(big, protocol=5)),
                          repeat=3)
    rows.append({"measure": "  ... pickle + xxh3", "durably_s": ours, "other_s": pick,
                 "ratio": ours / pick, "target": "lower is better"})
    if joblib is not None:
        jb = median_seconds(lambda: joblib.hash(big), repeat=3)
        rows.append({"measure": "  ... joblib.hash", "durably_s": ours, "other_s": jb,
                     "ratio": ours / jb, "target": "lower is better"})
    try:
        import pandas as pd

        wide = pd.DataFrame(np.zeros((100, 20_000)))
        block = np.ascontiguousarray(wide.to_numpy())
        rows.append({"measure": "digest of a 100 x 20,000 float DataFrame",
                     "durably_s": median_seconds(lambda: durably.digest(wide), repeat=3),
                     "other_s": median_seconds(lambda: xxhash.xxh3_128_hexdigest(block)),
                     "ratio": None, "target": "near raw speed (one block)"})
    except ImportError:
        pass
    view = big[::2]
    rows.append({"measure": "digest of a strided 100 MB view", "durably_s":
                 median_seconds(lambda: durably.digest(view), repeat=3), "other_s": None,
                 "ratio": None, "target": "copies once to contiguous"})
    print(f"200 MB array: {big.nbytes / ours / 1e9:.1f} GB/s durably, "
          f"{big.nbytes / raw / 1e9:.1f} GB/s raw xxh3-128")
    report("hashing", rows)


if __name__ == "__main__":
    main()
