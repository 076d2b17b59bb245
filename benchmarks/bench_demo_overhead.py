"""The demo's first run against the same work undecorated: ``examples/stdlib_index.py`` as a
user runs it on a fresh store (every file indexed, journaled and cached, the report, the
summary and the run's HTML graph written), against its undecorated twin, in fresh processes,
alternating; then the demo's rerun on the store its first run left. Targets: first run
<= 1.03 x the twin, rerun >= 20 x faster than the first run (CPU time of the processes;
wall time printed beside: bench_demo_rerun.py's figure, which a loaded machine moves most).

Run: python benchmarks/bench_demo_overhead.py [--limit N] [--repeat N]

The twin is the demo's own functions without durably: a process that imports the demo,
puts each task's undecorated function (its ``__wrapped__``) in the place of the task and
calls the entrypoint's undecorated body with the demo's defaults. It reads, tokenizes and
counts the same files and writes the same report; it does not copy the demo, so the two
cannot drift apart. It imports durably (the demo's module does), as the plain script would
not: that import's CPU time is printed beside the figures (it flatters the ratio by that much).

Each repetition runs the demo's first run (a new store), its rerun and the twin, the order
of the demo and the twin swapped every repetition; the figure is the median over
repetitions of the CPU time (user + system) of each process, start-up included. CPU time
moves less with the machine's load than wall time (also printed); the spread of the
repetitions is printed to show how noisy the machine was.

The processes run as a user's do: with Python's bytecode cache (``__pycache__``), written
by the first imports even where ``PYTHONDONTWRITEBYTECODE`` is set (a CI runner, a test
session): without it every process compiles durably's modules again (0.1-0.2 s of CPU time),
a cost no user's rerun pays.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, positive_int, process_times, report
from bench_demo_rerun import DEMO


def twin(limit: int | None, report_path: str) -> None:
    """The demo's work with its tasks and entrypoint undecorated (run in a child process)."""
    spec = importlib.util.spec_from_file_location("stdlib_index", DEMO)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    sys.modules["stdlib_index"] = demo
    spec.loader.exec_module(demo)
    import durably

    plain = {name: value.__wrapped__ for name, value in vars(demo).items()
             if isinstance(value, durably.Task | durably.Entrypoint)}
    entrypoints = [name for name, value in vars(demo).items()
                   if isinstance(value, durably.Entrypoint)]
    assert entrypoints == ["index_stdlib"], entrypoints
    vars(demo).update(plain)  # the entrypoint's body now calls the plain functions
    summary = demo.index_stdlib(sysconfig.get_paths()["stdlib"], limit, report=report_path)
    print(f"{summary['files']:,} files, {summary['lines']:,} lines")


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="passed to the demo: how many files it indexes (default: all)")
    parser.add_argument("--repeat", type=positive_int, default=5,
                        help="repetitions (first run, rerun, twin each), default 5")
    parser.add_argument("--twin", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", default="stdlib_report.md", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.twin:
        twin(opts.limit, opts.report)
        return
    limit = ["--limit", str(opts.limit)] if opts.limit else []
    first: list[tuple[float, float]] = []
    rerun: list[tuple[float, float]] = []
    plain: list[tuple[float, float]] = []
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        imports = [process_times(["-c", "import durably"], tmp, base) for _ in range(3)]
        for i in range(opts.repeat):
            where = Path(tmp, str(i))
            where.mkdir()
            env = {**base, "DURABLY_DIR": str(where / "store")}
            demo = [str(DEMO), *limit]
            undecorated = [__file__, "--twin", *limit, "--report", "plain_report.md"]
            for which in ("demo", "twin") if i % 2 == 0 else ("twin", "demo"):
                if which == "demo":
                    first.append(process_times(demo, str(where), env))
                    rerun.append(process_times(demo, str(where), env))
                else:
                    plain.append(process_times(undecorated, str(where), env))
            reports = [(where / name).read_text() for name in
                       ("stdlib_report.md", "plain_report.md")]
            assert reports[0] == reports[1], "the twin's report differs from the demo's"
    import_cpu = statistics.median(c for _, c in imports)

    def med(samples: list[tuple[float, float]], which: int) -> float:
        return statistics.median(s[which] for s in samples)

    def spread(samples: list[tuple[float, float]]) -> str:
        cpu = sorted(c for _, c in samples)
        return f"{cpu[0]:.2f}-{cpu[-1]:.2f} s"

    print(f"CPU time per process over {opts.repeat} repetitions (min-max): first run "
          f"{spread(first)}, twin {spread(plain)}, rerun {spread(rerun)}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("ratios per repetition (first run / twin, CPU): "
          + ", ".join(f"{f[1] / p[1]:.3f}" for f, p in zip(first, plain, strict=True)))
    rows = [
        {"measure": "demo first run vs undecorated twin (CPU)", "durably_s": med(first, 1),
         "other_s": med(plain, 1), "ratio": med(first, 1) / med(plain, 1),
         "target": "<= 1.03", "limit": 1.03},
        {"measure": "  the same, wall time (info)", "durably_s": med(first, 0),
         "other_s": med(plain, 0), "ratio": med(first, 0) / med(plain, 0)},
        {"measure": "  import durably, in both (info)", "durably_s": import_cpu,
         "other_s": med(plain, 1), "ratio": import_cpu / med(plain, 1)},
        {"measure": "demo rerun vs first run (CPU)", "durably_s": med(rerun, 1),
         "other_s": med(first, 1), "ratio": med(first, 1) / med(rerun, 1),
         "target": ">= 20x", "limit": 20.0, "op": ">="},
        {"measure": "  the same, wall time (info)", "durably_s": med(rerun, 0),
         "other_s": med(first, 0), "ratio": med(first, 0) / med(rerun, 0)},
    ]
    report("demo_overhead", rows, limit=opts.limit, repeat=opts.repeat,
           samples={"first": first, "rerun": rerun, "twin": plain, "import": imports})


if __name__ == "__main__":
    main()
