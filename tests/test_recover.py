"""Recovering crashed runs: ``durably recover`` and ``durably.recover()`` resume the runs
whose process was killed (SIGKILL, for real), and leave alone the runs a live process
executes, the runs waiting for an answer, and (with ``--entrypoint``) other entrypoints'."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import durably

from .conftest import script_env, write_script

pytestmark = pytest.mark.slow

JOBS = """
import asyncio, os, sys, threading, time
import durably

def mark(text):
    with open(os.environ["MARKS"], "a") as f:
        f.write(text + "\\n")

@durably.task
def work(tag, i):
    mark(f"{tag}:{i}")
    return i

def stop(tag, i):
    if i == int(os.environ.get("STOP_AT", "-1")):
        sys.stdout.write(f"stopped {tag}\\n")  # (one write: the threads' lines never mix)
        sys.stdout.flush()
        time.sleep(600)

@durably.entrypoint
def pipeline(n):
    total = 0
    for i in range(n):
        total += work("pipeline", i)
        stop("pipeline", i)
    return total

@durably.entrypoint
def other(n):
    for i in range(n):
        work("other", i)
        stop("other", i)
    return "other done"

@durably.entrypoint
def busy(n):
    for i in range(n):
        work("busy", i)
        stop("busy", i)

@durably.entrypoint
def fragile(n):
    for i in range(n):
        work("fragile", i)
        stop("fragile", i)
    if os.environ.get("FAIL"):
        raise ValueError("still broken")
    return "mended"

@durably.entrypoint
async def apipeline(n):
    total = 0
    for i in range(n):
        total += work("apipeline", i)
        stop("apipeline", i)
        await asyncio.sleep(0)
    return total

@durably.entrypoint
def ask_later(n):
    for i in range(n):
        work("ask_later", i)
        stop("ask_later", i)
    return durably.interrupt("ok?")

@durably.entrypoint
def asker(n):
    work("asker", 0)
    return durably.interrupt("ok?")

def go(call):
    name, _, n = call.partition("=")
    try:
        out = globals()[name](int(n or 5))
        print("result", name, asyncio.run(out) if asyncio.iscoroutine(out) else out, flush=True)
    except durably.RunInterrupted:
        print("paused", name, flush=True)

if __name__ == "__main__":
    threads = [threading.Thread(target=go, args=(c,)) for c in sys.argv[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
"""

SCRIPT = """
import os, time
import durably

@durably.entrypoint
def main():
    if not os.environ.get("RECOVERING"):
        print("stopped script", flush=True)
        time.sleep(600)
    return "script done"

if __name__ == "__main__":
    main()
"""


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A directory with an importable module ``jobs`` (and a script), and the environment
    of its processes (a store of its own, the marks file)."""
    root = tmp_path / "project"
    root.mkdir()
    write_script(root / "jobs.py", JOBS)
    write_script(root / "script.py", SCRIPT)
    env = script_env(tmp_path / "store", MARKS=str(tmp_path / "marks.txt"))
    yield root, env


def _start(root: Path, env: dict[str, str], *argv: str, stop_at: int = 2
           ) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, *argv], cwd=root, env={**env, "STOP_AT":
                            str(stop_at)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _wait_stopped(proc: subprocess.Popen[str], count: int) -> None:
    """Wait for ``count`` "stopped ..." markers: each run has journaled its steps before
    the marker, and sleeps there."""
    assert proc.stdout is not None
    seen = 0
    while seen < count:
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            assert proc.stderr is not None
            pytest.fail(f"the process ended before its markers: {proc.stderr.read()}")
        seen += line.count("stopped ")


def _crash(root: Path, env: dict[str, str], *argv: str, runs: int) -> None:
    """Start a process executing ``runs`` runs, wait until each stopped on purpose after
    some steps, and SIGKILL it: its runs are crashed."""
    with _start(root, env, *argv) as proc:
        try:
            _wait_stopped(proc, runs)
        finally:
            proc.kill()  # (SIGKILL)
            proc.wait(timeout=30)


def _cli(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durably", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def _marks(env: dict[str, str]) -> list[str]:
    return Path(env["MARKS"]).read_text().split()


def _statuses(store: durably.Store) -> dict[str, str]:
    return {r.id: r.status for r in durably.list_runs(store=store)}


def test_cli_recovers_crashed_runs_and_leaves_the_others(
        project: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = project
    _crash(root, env, "-m", "jobs", "pipeline", "other", "fragile", runs=3)
    _crash(root, env, "script.py", runs=1)  # a script's run: its recorded script is loaded
    paused = subprocess.run([sys.executable, "-m", "jobs", "asker"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=120)
    assert paused.stdout.split() == ["paused", "asker"], paused.stderr
    live = _start(root, env, "-m", "jobs", "busy")  # executing, with a live lease
    try:
        _wait_stopped(live, 1)
        store = durably.DiskStore(tmp_path / "store")
        before = _statuses(store)
        assert sorted(before.values()) == ["crashed"] * 4 + ["interrupted", "running"]
        crashed = {run_id for run_id, s in before.items() if s == "crashed"}

        listed = _cli(root, env, "recover", "--dry-run")
        assert listed.returncode == 0, listed.stderr
        assert {line.split()[0] for line in listed.stdout.splitlines()[1:]} == crashed
        assert _statuses(store) == before  # (nothing resumed)

        only = _cli(root, env, "recover", "--entrypoint", "other")
        assert only.returncode == 0, only.stderr
        (line,) = only.stdout.splitlines()
        assert re.match(r"run 'other-\w+' finished: 5 steps — 2 ran, 3 replayed", line), line
        after_one = _statuses(store)
        assert sorted(after_one.values()) == ["crashed"] * 3 + [
            "finished", "interrupted", "running"]

        done = _cli(root, {**env, "FAIL": "1", "RECOVERING": "1"}, "recover")  # (fragile
        # fails again)
        assert done.returncode == 1, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 3, lines  # one per crashed run
        by_task = {re.match(r"run '(\w+)", ln).group(1).split("-")[0]: ln  # type: ignore[union-attr]
                   for ln in lines}
        assert re.match(r"run 'pipeline-\w+' finished: 5 steps — 2 ran, 3 replayed",
                        by_task["pipeline"])
        assert "(resumed a run whose process had died" in by_task["pipeline"]
        assert by_task["fragile"].endswith("failed: ValueError('still broken')")
        assert re.match(r"run 'main-\w+' finished", by_task["main"]), by_task["main"]
        assert "1 of 3 crashed runs were not recovered" in done.stderr

        statuses = _statuses(store)
        assert sorted(statuses.values()) == ["failed", "finished", "finished", "finished",
                                             "interrupted", "running"]
        assert live.poll() is None  # the live run was not touched
        # every step executed once: the three each run had finished were replayed
        marks = _marks(env)
        for tag in ("pipeline", "other", "fragile"):
            assert sorted(m for m in marks if m.startswith(f"{tag}:")) == [
                f"{tag}:{i}" for i in range(5)]
        results = {r.name: r.result for r in durably.list_runs(store=store)
                   if r.status == "finished"}
        assert results == {"pipeline": 10, "other": "other done", "main": "script done"}

        again = _cli(root, env, "recover")  # nothing crashed is left
        assert again.returncode == 0 and "no crashed runs" in again.stdout, again.stdout
        store.close()
    finally:
        os.kill(live.pid, signal.SIGKILL)
        live.wait(timeout=30)
        live.stdout.close()  # type: ignore[union-attr]
        live.stderr.close()  # type: ignore[union-attr]


def test_recover_from_python_returns_each_runs_outcome(
        project: tuple[Path, dict[str, str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, env = project
    _crash(root, env, "-m", "jobs", "pipeline", "apipeline", "ask_later", runs=3)
    store = durably.DiskStore(tmp_path / "store")
    durably.configure(store=store)
    monkeypatch.syspath_prepend(str(root))  # (importable, as on PYTHONPATH)
    monkeypatch.setenv("MARKS", env["MARKS"])
    monkeypatch.delitem(sys.modules, "jobs", raising=False)
    try:
        recovered = durably.recover()
        assert sorted((r.entrypoint, r.outcome, r.error) for r in recovered) == [
            ("jobs:apipeline", "finished", None), ("jobs:ask_later", "interrupted", None),
            ("jobs:pipeline", "finished", None)]
        (paused,) = [r for r in recovered if r.outcome == "interrupted"]
        assert paused.run is not None and paused.run.status == "interrupted"
        assert [i.payload for i in paused.run.interrupts] == ["ok?"]
        for r in recovered:
            if r is paused:
                continue
            assert r.run is not None and r.run.result == 10
            assert r.run.counts() == {"ran": 2, "cached": 0, "replayed": 3, "failed": 0}
            assert r.run.resumed_from == "crashed"
            assert str(r) == r.run.summary()
        assert durably.recover() == []  # nothing crashed any more
        marks = _marks(env)
        for tag in ("pipeline", "apipeline"):
            assert sorted(m for m in marks if m.startswith(f"{tag}:")) == [
                f"{tag}:{i}" for i in range(5)]
    finally:
        sys.modules.pop("jobs", None)
        durably.configure()
        store.close()


def test_recover_filters_by_entrypoint_and_skips_what_it_cannot_import(
        project: tuple[Path, dict[str, str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, env = project
    (root / "jobs.py").rename(root / "vanishing.py")  # (a name no other test imports)
    _crash(root, env, "-m", "vanishing", "pipeline", "other", runs=2)
    (root / "vanishing.py").unlink()  # its module is gone
    store = durably.DiskStore(tmp_path / "store")
    monkeypatch.syspath_prepend(str(root))
    try:
        (skipped,) = durably.recover("other", store=store)
        assert (skipped.entrypoint, skipped.outcome, skipped.run) == (
            "vanishing:other", "skipped", None)
        assert skipped.error is not None and "cannot import module 'vanishing'" in skipped.error
        assert str(skipped).startswith("run 'other-")

        cli = _cli(root, env, "recover", "-e", "vanishing:other")
        assert cli.returncode == 1
        (line,) = cli.stdout.splitlines()
        assert line.startswith("run 'other-") and "skipped: cannot import module" in line
        assert "1 of 1 crashed runs were not recovered" in cli.stderr
        assert sorted(_statuses(store).values()) == ["crashed", "crashed"]
    finally:
        store.close()


def test_recover_inside_a_run_is_refused(tmp_path: Path) -> None:
    @durably.entrypoint(store=durably.DiskStore(tmp_path / "s"))
    def outer() -> None:
        durably.recover()

    with pytest.raises(durably.RunStateError, match="inside a run"):
        outer()
