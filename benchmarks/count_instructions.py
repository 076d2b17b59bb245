"""Count the CPU instructions of one of durably's call paths: a figure that does not move
with the machine's load, for comparing two versions of the code.

Run: python benchmarks/count_instructions.py replayed|executed|hit|cached [--steps 100]
     [--src PATH ...]

Timings on a shared machine move by 30 % between runs; instruction counts move by well under
1 %. This runs the workload of ``bench_call_path.py`` (a trivial task; runs of ``--steps``
steps) under Valgrind's callgrind twice, with 10 and with 40 repetitions, and prints the
difference divided by 30 repetitions: the instructions of one resumed run (``replayed``),
one executed run (``executed``), one new run whose steps are all served from the cache
(``cached``: hits inside a run, each journaled with the time it saved) or 1,000 hits
outside a run (``hit``), start-up excluded.
Each ``--src`` (a checkout's ``src`` folder) is measured in turn, for an A/B comparison:

    python benchmarks/count_instructions.py replayed --src /tmp/old/src --src src

Needs ``valgrind`` (Debian: ``apt-get install valgrind``); each measurement takes about 20 s.
Instructions are not time (a cache miss or a system call costs more than its instructions),
so a change that saves instructions is confirmed with the timed benchmarks.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: the workload, run in a child process: ``setup`` journals the runs (failing after their
#: steps, so that the next call resumes them), ``measure`` repeats the measured call
WORKLOAD = """
import contextlib, sys
sys.path.insert(0, {here!r})
import durably
from _workload import FAIL, chain, inc
durably.configure(store=durably.DiskStore({store!r}))
what, mode, count, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
bases = [10**9 + 10**6 * k for k in range(count)]
if what == "hit":
    inc(-1)
    for _ in range(count * 1000 if mode == "measure" else 0):
        inc(-1)
elif what == "cached":
    for base in bases:  # setup: the runs that execute the steps; measure: new runs, all hits
        chain.run(steps, base, fresh=mode == "measure")
elif what == "executed":
    for base in bases if mode == "measure" else ():
        chain.run(steps, base)
else:
    FAIL["on"] = mode == "setup"
    for base in bases:
        with contextlib.suppress(RuntimeError):
            chain.run(steps, base)
"""


def instructions(src: str | None, what: str, count: int, steps: int, tmp: Path) -> int:
    """Instructions of ``count`` repetitions of the workload, start-up included."""
    store = tmp / "store"
    shutil.rmtree(store, ignore_errors=True)
    script = tmp / "workload.py"
    script.write_text(WORKLOAD.format(here=str(HERE), store=str(store)))
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    args = [what, "setup", str(count), str(steps)]
    subprocess.run([sys.executable, str(script), *args], env=env, check=True)
    args[1] = "measure"
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         str(script), *args], env=env, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("what", choices=["replayed", "executed", "hit", "cached"])
    parser.add_argument("--steps", type=int, default=100, help="steps per run (default 100)")
    parser.add_argument("--src", action="append",
                        help="a checkout's src folder to measure (repeatable; default: the "
                             "durably this Python imports)")
    opts = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed. Fix: apt-get install valgrind")
    unit = {"replayed": "resumed run", "executed": "executed run", "hit": "1,000 hits",
            "cached": "run of hits"}
    for src in opts.src or [None]:
        with tempfile.TemporaryDirectory() as tmp:
            low = instructions(src, opts.what, 10, opts.steps, Path(tmp))
            high = instructions(src, opts.what, 40, opts.steps, Path(tmp))
        per = (high - low) / 30
        steps = (f" of {opts.steps} steps ({per / opts.steps:,.0f} a step, its share of the "
                 "run included)") if opts.what != "hit" else ""
        print(f"{src or 'durably'}: {per:,.0f} instructions per {unit[opts.what]}{steps}")


if __name__ == "__main__":
    main()
