"""Profile one of durably's call paths, to see where a missed target's time goes.

Run: python benchmarks/profile_paths.py hit|executed|replayed [--steps 100] [--seconds 5]
     [--spy]

Runs the same workload as ``bench_call_path.py`` (a trivial task; runs of ``--steps`` steps)
for ``--seconds`` under cProfile and prints, for the top functions, their share of the time
including what they call (``incl``) and excluding it (``self``). ``--spy`` runs the workload
without cProfile (its overhead distorts small functions) for a sampling profiler instead:

    py-spy record -r 1000 -o hit.svg -- python benchmarks/profile_paths.py hit --spy
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_call_path import FAIL, chain, inc, next_base

import durably


def workload(path: str, steps: int, profiler: cProfile.Profile | None) -> Callable[[], None]:
    """One repetition of ``path``; the profiler (if any) runs during the measured part only."""
    @contextlib.contextmanager
    def measured() -> Iterator[None]:
        if profiler is not None:
            profiler.enable()
        try:
            yield
        finally:
            if profiler is not None:
                profiler.disable()

    def hit() -> None:
        with measured():
            for _ in range(1000):
                inc(-1)

    def executed() -> None:
        base = next_base()
        with measured():
            chain.run(steps, base)

    def replayed() -> None:
        base = next_base()
        FAIL["on"] = True
        with contextlib.suppress(RuntimeError):
            chain.run(steps, base)
        FAIL["on"] = False
        with measured():
            chain.run(steps, base)

    inc(-1)
    return {"hit": hit, "executed": executed, "replayed": replayed}[path]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("path", choices=("hit", "executed", "replayed"))
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--spy", action="store_true", help="no cProfile (for py-spy)")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        durably.configure(store=durably.DiskStore(Path(tmp) / "store"))
        chain.run(10, next_base())  # warm up
        profiler = cProfile.Profile()
        work = workload(opts.path, opts.steps, None if opts.spy else profiler)
        end = time.perf_counter() + opts.seconds
        while time.perf_counter() < end:
            work()
        if opts.spy:
            return
    stats = pstats.Stats(profiler)
    raw = stats.stats  # type: ignore[attr-defined]
    total = max(ct for _, _, _, ct, _ in raw.values())  # the measured call, whole
    rows = sorted(raw.items(), key=lambda kv: kv[1][3], reverse=True)
    print(f"{opts.path}: {total:.2f} s profiled")
    print(f"{'incl':>6} {'self':>6}  function")
    for (file, line, name), (_, _, tt, ct, _) in rows[: opts.top]:
        where = "/".join(Path(file).parts[-2:]) if file != "~" else ""
        print(f"{100 * ct / total:5.1f}% {100 * tt / total:5.1f}%  {name}  {where}:{line}")


if __name__ == "__main__":
    main()
