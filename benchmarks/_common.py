"""Shared helpers for the benchmarks: repeated timing, medians, workers in fresh processes, a
table with pass/miss and a JSON file."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: where the JSON files and logs go ($DURABLY_BENCH_RESULTS, else results/ beside the scripts)
RESULTS = Path(os.environ.get("DURABLY_BENCH_RESULTS") or HERE / "results")


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


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(argv: list[str], *, timeout: float = 1800) -> dict[str, Any]:
    """Run ``python argv...`` in a fresh process; its last stdout line is a JSON object."""
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {argv} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def process_times(argv: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """Run ``python argv...`` to its end (its output discarded); its wall time and its CPU
    time (user + system, of it and the processes it waited for), in seconds. One at a
    time: the CPU time is this process's children's before and after."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, *argv], cwd=cwd, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def emit(result: dict[str, Any]) -> None:
    """What a worker process hands back: one JSON line on stdout."""
    print(json.dumps(result), flush=True)


def median_of(samples: list[dict[str, Any]], key: str) -> float | None:
    """Median of ``key`` over worker results that have it (None when none do)."""
    values = [s[key] for s in samples if s.get(key) is not None]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def verdict(row: dict[str, Any]) -> str:
    """``pass`` or ``miss`` for a row with a ``limit`` (checked with ``op`` on the field ``on``,
    default ``ratio``), else an empty string."""
    limit = row.get("limit")
    if limit is None:
        return ""
    value = row.get(row.get("on", "ratio"))
    if value is None:
        return "n/a"
    ok = value <= limit if row.get("op", "<=") == "<=" else value >= limit
    return "pass" if ok else "miss"


def _value(row: dict[str, Any], who: str) -> tuple[float | None, str]:
    for unit in ("mb", "kb", "n"):
        if f"{who}_{unit}" in row:
            return row[f"{who}_{unit}"], unit.upper() if unit != "n" else ""
    return row.get(f"{who}_s"), "s"


def fmt(value: float | None, unit: str = "s") -> str:
    """A time (seconds), a size (MB, KB) or a count ("") in a readable unit."""
    if value is None:
        return "-"
    if unit in ("MB", "KB"):
        return f"{value:.1f} {unit}"
    if unit == "":
        return f"{value:,.0f}"
    if value < 1e-3:
        return f"{value * 1e6:.1f} us"
    if value < 1:
        return f"{value * 1e3:.2f} ms"
    return f"{value:.2f} s"


def table(rows: list[dict[str, Any]]) -> str:
    """Rows as a text table: measure, durably, other, ratio, target, pass/miss."""
    width = max((len(r["measure"]) for r in rows), default=len("measure"))
    lines = [f"{'measure':<{width}}  {'durably':>10}  {'other':>10}  {'ratio':>7}  "
             f"{'result':<6}  target"]
    for r in rows:
        if len(r) == 1:  # a section title
            lines.append(r["measure"])
            continue
        d, unit = _value(r, "durably")
        o, _ = _value(r, "other")
        ratio_text = f"{r['ratio']:7.3f}" if r.get("ratio") is not None else "      -"
        lines.append(f"{r['measure']:<{width}}  {fmt(d, unit):>10}  {fmt(o, unit):>10}  "
                     f"{ratio_text}  {verdict(r):<6}  {r.get('target', '')}")
    return "\n".join(lines)


def report(name: str, rows: list[dict[str, Any]], **extra: Any) -> None:
    """Print rows as a table and write them, with the machine, to results/<name>.json."""
    for r in rows:
        if r.get("limit") is not None:
            r["result"] = verdict(r)
    print(table(rows))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps({
        "benchmark": name, "python": sys.version, "machine": platform.platform(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "rows": rows, **extra,
    }, indent=2))
    print(f"(written to {out})")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of rounds, samples, steps)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers of at least 1, sorted, distinct."""
    return sorted({positive_int(part.strip()) for part in text.split(",") if part.strip()})


def description(doc: str | None) -> str:
    """A script's ``--help`` description: its docstring's first paragraph, whole."""
    return (doc or "").partition("\n\n")[0].replace("\n", " ")

