"""A store the user cannot write (a CI artifact, a colleague's copy: files and folders chmod
a-w) is inspected read-only: ``durably runs``, ``show``, ``graph`` and ``cache stats`` work,
and a write says the store is read-only, naming it.

The commands run in real subprocesses without the right to write: as root (CI), with every
capability dropped (``setpriv``), so that the permission bits bind as they do for a user.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import run_script, script_env, write_script
from .system import missing

pytestmark = pytest.mark.slow

DURABLY = Path(sys.executable).parent / "durably"

JOB = """
import durably


@durably.task
def square(x):
    return x * x


@durably.task
def total(xs):
    return sum(xs)


@durably.entrypoint
def pipeline(n):
    return total([square(x) for x in range(n)])


print(pipeline(4))
"""


def _unprivileged() -> list[str]:
    """The prefix that runs a command without the right to write what its mode forbids."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        missing("running as root, which writes read-only files, and setpriv (util-linux) is "
                "not on PATH to drop that right",
                "install util-linux, or run the tests as an unprivileged user")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", "--"]


def _chmod_tree(root: Path, writable: bool) -> None:
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            mode = path.stat().st_mode & 0o7777
            path.chmod(mode | 0o200 if writable else mode & ~0o222)
    mode = root.stat().st_mode & 0o7777
    root.chmod(mode | 0o200 if writable else mode & ~0o222)


@pytest.fixture
def read_only_store(tmp_path: Path) -> Iterator[Path]:
    """A store written by a real run, then made read-only (chmod -R a-w)."""
    store = tmp_path / "store"
    run_script(write_script(tmp_path / "job.py", JOB), script_env(store))
    _chmod_tree(store, writable=False)
    try:
        yield store
    finally:
        _chmod_tree(store, writable=True)


def _durably(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = script_env(store)
    return subprocess.run([*_unprivileged(), str(DURABLY), "--dir", str(store), *args],
                          env=env, capture_output=True, text=True, timeout=120)


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in [root, *root.rglob("*")]}


def test_the_read_commands_inspect_a_store_nobody_here_can_write(
        read_only_store: Path) -> None:
    probe = subprocess.run([*_unprivileged(), "sh", "-c", f"touch {read_only_store}/probe"],
                           capture_output=True, text=True)
    assert probe.returncode != 0, "the store is writable: the test would prove nothing"
    before = _snapshot(read_only_store)

    runs = _durably(read_only_store, "runs", "--json")
    assert runs.returncode == 0, runs.stderr
    [run] = json.loads(runs.stdout)
    assert run["status"] == "finished"

    show = _durably(read_only_store, "show", run["id"][:10])
    assert show.returncode == 0, show.stderr
    assert "finished" in show.stdout and "result      14" in show.stdout
    assert show.stdout.count("square") == 4

    graph = _durably(read_only_store, "graph", run["id"], "-f", "dot")
    assert graph.returncode == 0, graph.stderr
    assert graph.stdout.startswith("digraph") and graph.stdout.count("square") >= 4

    stats = _durably(read_only_store, "cache", "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout)
    assert data["entries"] == 5 and data["runs"] == 1
    assert {t["task"].rpartition(":")[2]: t["entries"] for t in data["tasks"]} == {
        "square": 4, "total": 1}

    assert _snapshot(read_only_store) == before  # nothing was written, not even a log


def test_a_write_to_a_read_only_store_says_so_and_names_it(read_only_store: Path) -> None:
    for args in (["delete", "--older-than", "0"], ["cache", "clear"]):
        done = _durably(read_only_store, *args)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stderr.startswith("durably: error: "), done.stderr
        assert "read-only" in done.stderr and str(read_only_store) in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    runs = _durably(read_only_store, "runs", "--json")
    assert len(json.loads(runs.stdout)) == 1  # deleted nothing


def test_a_run_on_a_read_only_store_fails_naming_it(read_only_store: Path,
                                                   tmp_path: Path) -> None:
    script = write_script(tmp_path / "again.py", JOB.replace("pipeline(4)", "pipeline(5)"))
    done = subprocess.run([*_unprivileged(), sys.executable, str(script)],
                          env=script_env(read_only_store), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert "StoreError" in done.stderr and "read-only" in done.stderr
    assert str(read_only_store) in done.stderr
