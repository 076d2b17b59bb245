"""Index the Python standard library, durably.

Reads and tokenizes every ``.py`` file of the running interpreter's standard library (about
1,800 files, written by nobody on this team), counts identifiers per file (one task per file),
merges the counts (a task) and writes a small report (a side-effect task).

    python examples/stdlib_index.py               # first run: indexes everything
    python examples/stdlib_index.py               # second run: served from the store
    python examples/stdlib_index.py --limit 200   # a smaller run

Kill it with Ctrl-C (or ``kill -9``) halfway and run it again: it continues where it stopped.
Edit a file under the standard library and rerun: only that file is indexed again.
The store lives in ``$DURABLY_DIR`` (default ``./.durably``).
"""

from __future__ import annotations

import argparse
import collections
import io
import keyword
import os
import sys
import sysconfig
import time
import token
import tokenize
from pathlib import Path
from typing import Any

import durably


@durably.task
def index_file(source: durably.File) -> dict[str, Any]:
    """Tokenize one file; count its lines and identifiers (keywords left out)."""
    data = source.read_bytes()
    counts: collections.Counter[str] = collections.Counter()
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            if tok.type == token.NAME and not keyword.iskeyword(tok.string):
                counts[tok.string] += 1
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError) as exc:
        return {"lines": data.count(b"\n"), "identifiers": {}, "error": type(exc).__name__}
    return {"lines": data.count(b"\n"), "identifiers": dict(counts.most_common()), "error": None}


@durably.task
def merge(names: list[str], stats: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Merge per-file counts into totals and the top identifiers."""
    total: collections.Counter[str] = collections.Counter()
    for s in stats:
        total.update(s["identifiers"])
    biggest = sorted(zip(names, stats, strict=True), key=lambda p: -p[1]["lines"])[:5]
    return {
        "files": len(stats),
        "lines": sum(s["lines"] for s in stats),
        "unreadable": sorted(n for n, s in zip(names, stats, strict=True) if s["error"]),
        "distinct_identifiers": len(total),
        "top": total.most_common(top),
        "biggest_files": [(n, s["lines"]) for n, s in biggest],
    }


@durably.task(cache=False)
def write_report(summary: dict[str, Any], root: str, out: str) -> str:
    """Write the report (a side effect: journaled, so it happens once per run)."""
    lines = [
        f"# Identifiers of the standard library at {root}",
        "",
        f"{summary['files']:,} files, {summary['lines']:,} lines, "
        f"{summary['distinct_identifiers']:,} distinct identifiers.",
        "",
        "## Top identifiers",
        *(f"{i:>3}. {name:<24} {n:>9,}" for i, (name, n) in enumerate(summary["top"], 1)),
        "",
        "## Biggest files",
        *(f"- {name}: {n:,} lines" for name, n in summary["biggest_files"]),
    ]
    if summary["unreadable"]:
        lines += ["", f"Not tokenizable: {', '.join(summary['unreadable'])}"]
    Path(out).write_text("\n".join(lines) + "\n")
    return out


def stdlib_files(root: Path, limit: int | None) -> list[Path]:
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        files += [Path(folder, n) for n in names if n.endswith(".py")]
    files.sort()
    return files[:limit] if limit is not None else files


@durably.entrypoint
def index_stdlib(root: str, limit: int | None = None, top: int = 20,
                 report: str = "stdlib_report.md") -> dict[str, Any]:
    """Index the standard library under ``root``; return the merged summary."""
    base = Path(root)
    files = stdlib_files(base, limit)
    stats = []
    started = time.perf_counter()
    for i, path in enumerate(files, 1):
        stats.append(index_file(durably.file(path)))
        if i % 250 == 0 or i == len(files):
            print(f"  {i:>5,}/{len(files):,} files  ({time.perf_counter() - started:.1f} s)",
                  flush=True)
    names = [os.path.relpath(p, base) for p in files]
    summary = merge(names, stats, top)
    write_report(summary, root, report)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    parser.add_argument("--root", default=sysconfig.get_paths()["stdlib"],
                        help="directory to index (default: this interpreter's stdlib)")
    parser.add_argument("--limit", type=int, default=None, help="index only the first N files")
    parser.add_argument("--top", type=int, default=20, help="how many identifiers to list")
    parser.add_argument("--report", default="stdlib_report.md", help="where to write the report")
    parser.add_argument("--fresh", action="store_true", help="start a new run")
    args = parser.parse_args(argv)

    store = durably.DiskStore()
    print(f"durably store: {store.path.absolute()}")
    runs = [r for r in durably.list_runs(index_stdlib) if r.status != "finished"]
    if runs and not args.fresh:
        print(f"an unfinished run exists ({runs[0].id}, {runs[0].status}): continuing where "
              "it stopped if the arguments match")
    t0 = time.perf_counter()
    run = index_stdlib.run(args.root, args.limit, args.top, args.report, fresh=args.fresh)
    wall = time.perf_counter() - t0
    summary = run.result
    print(f"{summary['files']:,} files, {summary['lines']:,} lines; top identifiers: "
          + ", ".join(f"{name} ({n:,})" for name, n in summary["top"][:5]))
    report = Path(args.report).absolute()
    if report.exists():
        print(f"report: {report}")
    else:  # writing it is a journaled side effect: done once per run, not on every rerun
        print(f"report: not here ({report}); this run wrote it in an earlier attempt, "
              "perhaps elsewhere. Run with --fresh to write it again.")
    print(run.summary())
    # the run's graph (steps, data flow, cache hits) as one self-contained HTML page
    graph_file = run.graph().save(Path(args.report).with_suffix(".html").absolute())
    print(f"run graph and step table: {graph_file} (open it in a browser)")
    c = run.counts()
    if c["ran"] == 0:
        print(f"everything was served from the store ({c['replayed']:,} replayed, "
              f"{c['cached']:,} cached) in {wall:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
