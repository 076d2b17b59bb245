"""A large store: a cache hit on a store of 1,000,000 entries against a hit on an empty store,
and the time ``durably cache stats`` takes on it.

Run: python benchmarks/bench_store_scale.py [--entries 1000000 | --quick] [--store DIR]

The store is filled with ``cache_put_many`` in batches of 10,000 (each entry with its key
record, as a task's miss writes it); ``--quick`` uses 100,000 entries. ``--store DIR`` keeps
the filled store in DIR and reuses it on the next invocation (filled only up to
``--entries``). Hits on the two stores alternate over several rounds (medians).
``durably cache stats`` (entries, bytes and hit rate per task: every entry and key record is
read) is timed as a user runs it, a new process from start to exit, once the store is filled;
``DiskStore(path).stats()`` (totals only) in this process, on a new ``DiskStore`` object.
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, fmt, median_seconds, positive_int, report

import durably
from durably._store.records import KeyRecord

BATCH = 10_000


@durably.task
def inc(x: int) -> int:
    return x + 1


def fill(store: durably.DiskStore, entries: int) -> float:
    """Add entries until the store holds ``entries``; returns seconds per entry added (or 0)."""
    have = store.stats()["cache_entries"]
    if have >= entries:
        return 0.0
    start, t = have, time.perf_counter()
    now = time.time()
    while have < entries:
        batch = []
        for i in range(have, min(have + BATCH, entries)):
            key = xxhash.xxh3_128_hexdigest(f"filler/{i}".encode())
            info = KeyRecord("bench_store_scale:filler", key, "v:1",
                             {"i": xxhash.xxh3_128_hexdigest(str(i).encode())}, {}, now)
            batch.append((key, pickle.dumps(i, protocol=5), info))
        store.cache_put_many(batch)
        have += len(batch)
        if have % 100_000 == 0:
            print(f"  {have:,} entries, {time.perf_counter() - t:.0f} s", file=sys.stderr,
                  flush=True)
    return (time.perf_counter() - t) / (have - start)


def cli_cache_stats(path: Path) -> float:
    """Wall seconds of ``durably --dir PATH cache stats --json``, process start to exit."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "durably", "--dir", str(path), "cache",
                           "stats", "--json"], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"durably cache stats failed: {done.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--entries", type=positive_int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 entries")
    parser.add_argument("--store", help="keep the filled store in this directory")
    parser.add_argument("--rounds", type=positive_int, default=5)
    opts = parser.parse_args()
    entries = 100_000 if opts.quick else opts.entries
    with tempfile.TemporaryDirectory() as tmp:
        big_path = Path(opts.store) if opts.store else Path(tmp) / "big"
        empty, big = durably.DiskStore(Path(tmp) / "empty"), durably.DiskStore(big_path)
        print(f"filling {big_path} to {entries:,} entries", file=sys.stderr, flush=True)
        per_entry = fill(big, entries)
        big.close()

        cli = cli_cache_stats(big_path)
        t = time.perf_counter()
        stats = durably.DiskStore(big_path).stats()
        warm = time.perf_counter() - t

        hits: dict[str, list[float]] = {"empty": [], "big": []}
        for _ in range(opts.rounds):
            for name, store in (("empty", empty), ("big", big)):
                durably.configure(store=store)
                hits[name].append(median_seconds(lambda: inc(-1), number=2000, repeat=3))
        durably.configure()
        on_empty, on_big = (statistics.median(hits[k]) for k in ("empty", "big"))
        size = big.stats()["cache_entries"]
        big.close()
        empty.close()
    print(f"store: {size:,} entries, {stats['cache_bytes'] / 1e6:.0f} MB of values; filled at "
          f"{fmt(per_entry)} per entry" if per_entry else f"store: {size:,} entries (reused)")
    report("store_scale", [
        {"measure": f"hit on a store of {size:,} entries vs empty store", "durably_s": on_big,
         "other_s": on_empty, "ratio": on_big / on_empty, "target": "<= 1.5", "limit": 1.5},
        {"measure": "durably cache stats (a new process, start to exit)", "durably_s": cli,
         "other_s": None, "ratio": None, "target": "< 5 s (a few seconds)", "limit": 5.0,
         "on": "durably_s"},
        {"measure": "DiskStore.stats() (totals), new DiskStore in this process",
         "durably_s": warm, "other_s": None, "ratio": None, "target": "< 3 s", "limit": 3.0,
         "on": "durably_s"},
        {"measure": "fill: cache_put_many per entry (batches of 10,000)",
         "durably_s": per_entry or None, "other_s": None, "ratio": None, "target": "(info)"},
    ], entries=size, stats=json.loads(json.dumps(stats, default=str)), hits=hits)


if __name__ == "__main__":
    main()
