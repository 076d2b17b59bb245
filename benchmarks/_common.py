"""Shared helpers for the benchmarks: repeated timing, medians, a table and a JSON file."""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def median_seconds(fn: Callable[[], Any], *, number: int = 1, repeat: int = 7) -> float:
    """Median over ``repeat`` rounds of the time of one call (``number`` calls a round)."""
    fn()  # warm up
    rounds = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        rounds.append((time.perf_counter() - t) / number)
    return statistics.median(rounds)


def report(name: str, rows: list[dict[str, Any]]) -> None:
    """Print rows as a table and write them, with the machine, to results/<name>.json."""
    width = max(len(r["measure"]) for r in rows)
    print(f"{'measure':<{width}}  {'durably':>12}  {'other':>12}  {'ratio':>7}  target")
    for r in rows:
        other = f"{r['other_s'] * 1e6:10.1f}us" if r.get("other_s") is not None else "-"
        ratio = f"{r['ratio']:7.3f}" if r.get("ratio") is not None else "      -"
        print(f"{r['measure']:<{width}}  {r['durably_s'] * 1e6:10.1f}us  {other:>12}  {ratio}  "
              f"{r.get('target', '')}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps({
        "benchmark": name, "python": sys.version, "machine": platform.platform(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows,
    }, indent=2))
    print(f"(written to {out})")
