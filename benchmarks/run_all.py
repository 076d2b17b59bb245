"""The whole benchmark suite in one invocation: every script back to back, then one table of
medians, ratios, targets and pass/miss, and ``results/summary.json``.

Run: python benchmarks/run_all.py [--quick] [--store-entries N] [--only NAME,...] [--demo]

Each script runs in its own process and writes ``results/<name>.json`` (its full output goes
to ``results/<name>.log``); this runner reads them back. ``bench_postgres.py`` runs when a
PostgreSQL server is named (``$DURABLY_BENCH_POSTGRES`` or ``$DURABLY_TEST_POSTGRES``), and is
skipped with a line saying so otherwise. ``--quick`` fills the large store to
100,000 entries instead of 1,000,000 (about 30 s to fill at 1,000,000) and takes fewer rounds
and processes in the call path and run-size benchmarks. ``--demo`` adds the demo's
benchmarks: its rerun, and its first run against the same work undecorated.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import HERE, RESULTS, table, verdict

SUITE = {  # name -> (script, title, extra arguments for --quick)
    "import": ("bench_import.py", "import time", []),
    "hashing": ("bench_hashing.py", "digests", []),
    "call_path": ("bench_call_path.py", "call path (hit, executed, replayed)",
                  ["--rounds", "2", "--repeat", "5"]),
    "run_scale": ("bench_run_scale.py", "run size and memory", ["--quick"]),
    "store_scale": ("bench_store_scale.py", "large store", ["--quick"]),
    "mmap": ("bench_mmap.py", "large numpy result: mmap hit vs joblib",
             ["--mb", "256", "--repeat", "2"]),
    "compress": ("bench_compress.py", "compression: size, write, read",
                 ["--mb", "16", "--repeat", "3"]),
    "demo_rerun": ("bench_demo_rerun.py", "demo rerun", []),
    "demo_overhead": ("bench_demo_overhead.py", "demo first run vs undecorated, and rerun",
                      ["--repeat", "3"]),
    "postgres": ("bench_postgres.py", "PostgreSQL store vs LangGraph, DBOS", ["--quick"]),
}
#: the demo's benchmarks (whole runs of examples/stdlib_index.py: minutes), run with --demo
DEMO = ("demo_rerun", "demo_overhead")
#: benchmarks that need a server, by the environment variables that name one (any of them)
NEEDS = {"postgres": ("DURABLY_BENCH_POSTGRES", "DURABLY_TEST_POSTGRES")}


def provenance() -> dict[str, Any]:
    """Which durably was measured: the path it is imported from here (workers inherit this
    environment, PYTHONPATH included), the commit of the git checkout holding it and whether
    its ``src/`` has uncommitted edits (both None when it is not in a git checkout: an
    installed copy, an archive), and PYTHONPATH (set when another checkout was measured)."""
    probe = subprocess.run([sys.executable, "-c", "import durably; print(durably.__file__)"],
                           capture_output=True, text=True, check=False)
    where = probe.stdout.strip()
    commit: str | None = None
    dirty: bool | None = None
    if probe.returncode == 0 and where:
        package = Path(where).resolve().parent
        git = ["git", "-C", str(package)]
        top = subprocess.run([*git, "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, check=False)
        if top.returncode == 0:
            commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True,
                                    check=False).stdout.strip() or None
            status = subprocess.run([*git, "status", "--porcelain", "--", str(package.parent)],
                                    capture_output=True, text=True, check=False)
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    failure = (probe.stderr.strip().splitlines() or ["?"])[-1]
    return {"durably": where if probe.returncode == 0 else f"not importable: {failure}",
            "commit": commit,
            "src_modified": dirty, "pythonpath": os.environ.get("PYTHONPATH")}


def _entries(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0].replace("\n", " "))
    parser.add_argument("--quick", action="store_true",
                        help="100,000-entry store, fewer rounds and processes")
    parser.add_argument("--store-entries", type=_entries,
                        help="entries of the large store (at least 1)")
    parser.add_argument("--only", help="comma-separated: " + ", ".join(SUITE))
    parser.add_argument("--demo", action="store_true",
                        help="also run bench_demo_rerun.py and bench_demo_overhead.py")
    opts = parser.parse_args()
    if opts.only is not None:
        names = list(dict.fromkeys(n.strip() for n in opts.only.split(",") if n.strip()))
        if not names:
            parser.error(f"--only names no benchmark; choose from {list(SUITE)}")
    else:
        names = [n for n in SUITE if n not in DEMO or opts.demo]
    unknown = [n for n in names if n not in SUITE]
    if unknown:
        parser.error(f"unknown benchmark {unknown}; choose from {list(SUITE)}")
    measured = provenance()
    print(f"measuring durably at {measured['durably']} (commit {measured['commit']}, "
          f"src modified: {measured['src_modified']})", file=sys.stderr, flush=True)

    RESULTS.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    sections: dict[str, Any] = {}
    started, load_before = time.perf_counter(), os.getloadavg()
    for name in names:
        script, title, quick = SUITE[name]
        if name in NEEDS and not any(os.environ.get(v) for v in NEEDS[name]):
            print(f"== {title}: skipped, no server ({' or '.join(NEEDS[name])} unset; "
                  'eval "$(.ci/postgres start)" starts one)', file=sys.stderr, flush=True)
            sections[name] = {"skipped": f"{' or '.join(NEEDS[name])} unset"}
            continue
        args = list(quick) if opts.quick else []
        if name == "store_scale" and opts.store_entries is not None:
            args = ["--entries", str(opts.store_entries)]
        print(f"== {title}: {script} {' '.join(args)}", file=sys.stderr, flush=True)
        out = RESULTS / f"{name}.json"
        out.unlink(missing_ok=True)
        t = time.perf_counter()
        with open(RESULTS / f"{name}.log", "w") as log:
            code = subprocess.run([sys.executable, str(HERE / script), *args], stdout=log,
                                  stderr=subprocess.STDOUT, check=False).returncode
        seconds = time.perf_counter() - t
        if code != 0 or not out.exists():
            print(f"   failed ({code}); see {RESULTS / f'{name}.log'}", file=sys.stderr)
            sections[name] = {"error": code, "seconds": seconds}
            continue
        data = json.loads(out.read_text())
        sections[name] = {"seconds": seconds, "rows": data["rows"]}
        rows.append({"measure": f"[{title}]"})
        rows.extend(data["rows"])
        print(f"   {seconds:.0f} s", file=sys.stderr, flush=True)

    print(table(rows))
    checked = [r for r in rows if r.get("limit") is not None]
    missed = [r["measure"].strip() for r in checked if verdict(r) != "pass"]
    failed = [name for name, section in sections.items() if "error" in section]
    skipped = [name for name, section in sections.items() if "skipped" in section]
    print(f"\n{len(checked) - len(missed)} of {len(checked)} targets met"
          + (f"; missed: {'; '.join(missed)}" if missed else "")
          + (f"; FAILED, their targets not measured: {', '.join(failed)} (see their logs in "
             f"{RESULTS})" if failed else "")
          + (f"; skipped (no server): {', '.join(skipped)}" if skipped else "")
          + f". Ratios are durably / other (lower is better) unless the target says >=. "
          f"Suite: {time.perf_counter() - started:.0f} s; load average (1 min) "
          f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after, on "
          f"{os.cpu_count()} CPUs.")
    summary = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": sys.version,
        "machine": platform.platform(), "cpus": os.cpu_count(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        **measured, "quick": opts.quick, "failed": failed,
        "targets": [{**r, "result": verdict(r)} for r in checked], "benchmarks": sections,
    }
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"(written to {RESULTS / 'summary.json'})")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
