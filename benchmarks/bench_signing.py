"""What signing costs: a signed store (a key configured) against an unsigned one, measured in
one process, interleaved.

Run: python benchmarks/bench_signing.py [--repeat 7] [--large-mb 256]

- **seal + check**: sealing a pickled value and checking it again (what every write and every
  read of the store does), for 100 B, 10 KB, 1 MB and 64 MB payloads: xxh3-64 only
  (unsigned) against xxh3-64 plus keyed BLAKE2b-256 (below 1 MiB) or HMAC-SHA256 (above).
- **call path**: a trivial task, on a ``DiskStore`` without and with a key: a cache hit outside
  a run, an executed step in a run (journal and cache writes), a replayed step on resume.
- **large value**: a ``--large-mb`` numpy array returned by a task outside a run, stored (it is
  streamed to a file) and loaded back from the cache (checked end to end first).

Ratios are signed / unsigned: 1.00 means free. The "durably" column is the signed store, the
"other" column the unsigned one. The call-path rows carry the threshold under which signing
would be cheap enough to be the default (1.10); it is not met, and signing stays opt-in (the
README's Security section gives the other reason).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, median_seconds, positive_int, report

import durably
from durably._store.integrity import SigningKey, open_seal, seal

KEY = SigningKey(os.urandom(32), "benchmark")


def seal_rows(repeat: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"measure": "seal + check a value (per value)"}]
    for label, size in (("100 B", 100), ("10 KB", 10_000), ("1 MB", 1_000_000),
                        ("64 MB", 64_000_000)):
        payload = os.urandom(size)
        number = max(1, 2_000_000 // max(size, 100))

        def plain(payload: bytes = payload) -> None:
            open_seal(seal(payload))

        def signed(payload: bytes = payload) -> None:
            open_seal(seal(payload, KEY, b"cache\x00k"), KEY, b"cache\x00k")

        u = median_seconds(plain, number=number, repeat=repeat)
        s = median_seconds(signed, number=number, repeat=repeat)
        rows.append({"measure": f"  {label}", "durably_s": s, "other_s": u, "ratio": s / u,
                     "throughput_gb_s": size / s / 1e9})
    return rows


def _stores(root: Path) -> dict[str, durably.DiskStore]:
    return {"unsigned": durably.DiskStore(root / "unsigned"),
            "signed": durably.DiskStore(root / "signed", key=os.urandom(32))}


def _pipeline(name: str, store: durably.DiskStore) -> tuple[Any, Any, durably.DiskStore]:
    @durably.task(name=f"inc_{name}")
    def inc(x: int) -> int:
        return x + 1

    @durably.entrypoint(store=store, name=f"job_{name}")
    def job(tag: str, n: int) -> int:
        return sum(inc(i) for i in range(n))

    return inc, job, store


def call_path_rows(repeat: int, steps: int) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="bench-signing-"))
    stores = _stores(root)
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        tasks = {name: _pipeline(name, store) for name, store in stores.items()}
        for r in range(repeat):
            for name, (inc, job, store) in tasks.items():
                durably.configure(store=store)
                inc(-1)
                t = time.perf_counter()
                for _ in range(2000):
                    inc(-1)
                samples.setdefault((name, "hit"), []).append((time.perf_counter() - t) / 2000)
                tag = f"{r}-{time.time()}"
                t = time.perf_counter()
                job.run(tag, steps)
                samples.setdefault((name, "executed"), []).append(
                    (time.perf_counter() - t) / steps)
                t = time.perf_counter()
                job.run(tag, steps)
                samples.setdefault((name, "replayed"), []).append(
                    (time.perf_counter() - t) / steps)
    finally:
        durably.configure()
        for store in stores.values():
            store.close()
        shutil.rmtree(root, ignore_errors=True)
    rows: list[dict[str, Any]] = [{"measure": f"call path (trivial task, {steps}-step runs)"}]
    for what, label in (("hit", "cache hit outside a run"), ("executed", "executed step"),
                        ("replayed", "replayed step")):
        s = statistics.median(samples[("signed", what)])
        u = statistics.median(samples[("unsigned", what)])
        rows.append({"measure": f"  {label}", "durably_s": s, "other_s": u, "ratio": s / u,
                     "limit": 1.10, "target": "≤ 1.10: cheap enough to sign by default"})
    return rows


def large_rows(repeat: int, megabytes: int) -> list[dict[str, Any]]:
    import numpy as np

    root = Path(tempfile.mkdtemp(prefix="bench-signing-large-"))
    stores = _stores(root)
    samples: dict[tuple[str, str], list[float]] = {}
    value = np.random.default_rng(0).random(megabytes * 1_000_000 // 8)
    try:
        for r in range(max(2, repeat // 2)):
            for name, store in stores.items():
                durably.configure(store=store)

                @durably.task(name=f"big_{name}_{r}")
                def big(n: int) -> Any:
                    return value

                t = time.perf_counter()
                big(r)
                samples.setdefault((name, "store"), []).append(time.perf_counter() - t)
                t = time.perf_counter()
                out = big(r)
                samples.setdefault((name, "load"), []).append(time.perf_counter() - t)
                assert out.shape == value.shape
                del out
                store.cache.clear()
    finally:
        durably.configure()
        for store in stores.values():
            store.close()
        shutil.rmtree(root, ignore_errors=True)
    rows: list[dict[str, Any]] = [{"measure": f"large value ({megabytes} MB array)"}]
    for what, label in (("store", "compute + store"), ("load", "load from the cache")):
        s = statistics.median(samples[("signed", what)])
        u = statistics.median(samples[("unsigned", what)])
        rows.append({"measure": f"  {label}", "durably_s": s, "other_s": u, "ratio": s / u})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--repeat", type=positive_int, default=7)
    parser.add_argument("--steps", type=positive_int, default=200)
    parser.add_argument("--large-mb", type=positive_int, default=256)
    opts = parser.parse_args()
    rows = seal_rows(opts.repeat) + call_path_rows(opts.repeat, opts.steps)
    if opts.large_mb > 0:
        rows += large_rows(opts.repeat, opts.large_mb)
    report("signing", rows, large_mb=opts.large_mb, steps=opts.steps)


if __name__ == "__main__":
    main()
