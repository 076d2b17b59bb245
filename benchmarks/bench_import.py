"""Import time: ``import durably`` against ``import langgraph.func``, each in fresh processes.

Run: python benchmarks/bench_import.py [--repeat 9]

Each sample is a new interpreter that times the import statement alone (interpreter start-up
excluded); the imports alternate, after one untimed import of each (byte-code compiled,
files in the OS cache). The interpreters run without ``PYTHONDONTWRITEBYTECODE``, so the warm-up
writes the byte-code caches of durably's sources as any first import (or a pip install) does:
with it set, every sample would compile durably's source again (an editable install has no
caches), while pip compiled langgraph's at install time.

Figures are medians of the CPU time (user + system) of the import: on a shared machine its
wall time mostly measures the other users (printed beside it; on a quiet machine the two agree,
as every file read is served from memory). Targets: ratio <= 0.5, durably under 150 ms.

A third import, durably's four core dependencies alone, alternates with the two (info): with
wrapt 2.x it is most of ``import durably`` (wrapt 2.2 and later import asyncio, and every
2.x importlib.metadata; wrapt 1.17 imports neither, and durably's own modules import
asyncio only when an async task or stream runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, positive_int, report

PROBE = ("import time; t, c = time.perf_counter(), time.process_time(); import {module}; "
         "print(time.process_time() - c, time.perf_counter() - t)")


# byte-code caches are written (see the module docstring)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def import_seconds(module: str) -> tuple[float, float]:
    """CPU and wall seconds ``import module`` takes in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)],
                         capture_output=True, text=True, check=True, env=ENV)
    cpu, wall = out.stdout.strip().splitlines()[-1].split()
    return float(cpu), float(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--repeat", type=positive_int, default=9)
    opts = parser.parse_args()
    # durably's four core dependencies alone (info): most of `import durably` is theirs
    deps = "wrapt, cloudpickle, diskcache, xxhash"
    modules = ("durably", "langgraph.func", deps)
    samples: dict[str, list[tuple[float, float]]] = {m: [] for m in modules}
    for m in modules:
        import_seconds(m)  # warm up
    for _ in range(opts.repeat):
        for m in modules:
            samples[m].append(import_seconds(m))
    cpu = [statistics.median(s[0] for s in samples[m]) for m in modules]
    wall = [statistics.median(s[1] for s in samples[m]) for m in modules]
    report("import", [
        {"measure": "import durably vs import langgraph.func (CPU)", "durably_s": cpu[0],
         "other_s": cpu[1], "ratio": cpu[0] / cpu[1], "target": "<= 0.5", "limit": 0.5},
        {"measure": "import durably (CPU)", "durably_s": cpu[0], "other_s": None,
         "ratio": None, "target": "< 150 ms", "limit": 0.150, "on": "durably_s"},
        {"measure": "  ... wall time", "durably_s": wall[0], "other_s": wall[1],
         "ratio": wall[0] / wall[1], "target": "(info)"},
        {"measure": f"  ... of which its dependencies (wrapt {version('wrapt')}, cloudpickle, "
                    "diskcache, xxhash; CPU)", "durably_s": cpu[2], "other_s": None,
         "ratio": None, "target": "(info: wrapt 2.x imports asyncio and importlib.metadata)"},
    ], samples=samples)


if __name__ == "__main__":
    main()
