"""The demo's rerun speed-up: first run of examples/stdlib_index.py vs the second (all
replayed from the store), in fresh subprocesses on a fresh store. Target: >= 20x.

Run: python benchmarks/bench_demo_rerun.py [--limit N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, positive_int, process_times, report

DEMO = Path(__file__).resolve().parent.parent / "examples" / "stdlib_index.py"


def timed(args: list[str], cwd: str, env: dict[str, str]) -> float:
    return process_times([str(DEMO), *args], cwd, env)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--limit", type=positive_int, default=None,
                        help="passed to the demo: how many items it processes")
    opts = parser.parse_args()
    args = ["--limit", str(opts.limit)] if opts.limit else []
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DURABLY_DIR": str(Path(tmp) / "store")}
        first = timed(args, tmp, env)
        second = min(timed(args, tmp, env) for _ in range(3))
    print(f"first run {first:.2f} s, rerun {second:.2f} s: {first / second:.1f}x faster")
    report("demo_rerun", [{"measure": "demo rerun (whole process) vs first run",
                           "durably_s": second, "other_s": first, "ratio": first / second,
                           "target": ">= 20x", "limit": 20.0, "op": ">="}])


if __name__ == "__main__":
    main()
