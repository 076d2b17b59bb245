"""``keep_finished=True``: fixing the task that crashed a long job keeps what the job had
finished under the older code (issue #33, point 7), with real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import durably
from durably.testing import MemoryStore

from .conftest import run_script, script_env, write_script

N, BAD = 12, 5

JOB = """
import os
import durably

def mark(text):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(text + "\\n")

@durably.task
def process(i):
    mark(f"process {i}")
    if i == 5:
        raise ValueError(f"a bug on item {i}")
    return i * 10

@durably.task
def batch(lo, hi):
    mark(f"batch {lo}")
    return [process(i) for i in range(lo, hi)]

@durably.entrypoint
def job(n):
    return [process(i) for i in range(n)]

@durably.entrypoint
def nested(n):
    return batch(0, n)
"""

FIXED = JOB.replace("""    if i == 5:
        raise ValueError(f"a bug on item {i}")
""", "")

GO = """
import json, sys
import durably
import job

entry = getattr(job, sys.argv[1])
try:
    run = entry.run(12, keep_finished=sys.argv[2] == "keep")
except ValueError as exc:
    print(json.dumps({"failed": str(exc), "id": durably.list_runs(entry)[0].id}))
    sys.exit(0)
print(json.dumps({
    "id": run.id, "result": run.result, "summary": run.summary(),
    "steps": [[s.task, s.status, s.kept_from] for s in run.steps],
}))
"""


class Project:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = root / "count.txt"
        self.env = script_env(root / "store", COUNT_FILE=str(self.count),
                              PYTHONDONTWRITEBYTECODE="1")
        write_script(root / "job.py", JOB)
        self.go = write_script(root / "go.py", GO)

    def fix(self) -> None:
        write_script(self.root / "job.py", FIXED)

    def run(self, entry: str, mode: str = "exact") -> dict[str, Any]:
        proc = run_script_args(self.go, self.env, entry, mode)
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return result

    def executed(self) -> list[str]:
        """The bodies executed since the last call (the count file is emptied)."""
        lines = self.count.read_text().split("\n") if self.count.exists() else []
        self.count.write_text("")
        return [line for line in lines if line]


def run_script_args(path: Path, env: dict[str, str], *args: str
                    ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(path), *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=path.parent)
    assert proc.returncode == 0, f"script failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


def crashed(project: Project, entry: str = "job") -> str:
    """Run the buggy job (it fails on item 5), then fix the task; the run's id."""
    out = project.run(entry)
    assert "a bug on item 5" in out["failed"]
    project.executed()
    project.fix()
    return str(out["id"])


@pytest.mark.slow
def test_keep_finished_executes_only_the_steps_that_had_not_finished(project: Project
                                                                      ) -> None:
    run_id = crashed(project)
    out = project.run("job", "keep")
    assert out["id"] == run_id and out["result"] == [i * 10 for i in range(N)]
    assert project.executed() == [f"process {i}" for i in range(BAD, N)]
    kept = [s for s in out["steps"] if s[2]]
    assert [s[1] for s in kept] == ["cached"] * BAD and len(out["steps"]) == N
    assert f"{BAD} of the cached steps kept from older code" in out["summary"]
    assert "keep_finished=True" in out["summary"]
    # later attempts replay the kept steps exactly, with or without the option
    again = project.run("job")
    assert again["result"] == out["result"] and project.executed() == []
    assert {s[1] for s in again["steps"]} == {"replayed"}
    # nothing of the older code went to the cache under today's keys
    check = write_script(project.root / "check.py", """
        import job
        print([job.process.explain(i).hit for i in range(12)])
    """)
    hits = run_script(check, project.env).stdout.strip()
    assert hits == str([False] * BAD + [True] * (N - BAD))


@pytest.mark.slow
def test_an_exact_resume_says_how_many_steps_executed_again(project: Project) -> None:
    crashed(project)
    out = project.run("job")
    assert out["result"] == [i * 10 for i in range(N)]
    assert project.executed() == [f"process {i}" for i in range(N)]
    assert not any(s[2] for s in out["steps"])
    assert f"{BAD} steps that had finished executed again because their code changed" in \
        out["summary"]
    assert "keep_finished=True" in out["summary"]


@pytest.mark.slow
def test_steps_under_a_parent_that_crashed_are_kept(project: Project) -> None:
    crashed(project, "nested")
    out = project.run("nested", "keep")
    assert out["result"] == [i * 10 for i in range(N)]
    # the parent executes again (it never finished); its finished children are kept
    assert project.executed() == ["batch 0"] + [f"process {i}" for i in range(BAD, N)]
    assert sum(1 for s in out["steps"] if s[2]) == BAD


@pytest.mark.slow
def test_the_command_resumes_keeping_finished_steps(project: Project) -> None:
    run_id = crashed(project)
    command = Path(sys.executable).parent / "durably"
    environ = {k: v for k, v in project.env.items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(command), "resume", "job:job", run_id, "--keep-finished"],
                          cwd=project.root, env=environ, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "kept from older code" in proc.stdout and "result: [0, 10, 20" in proc.stdout
    assert project.executed() == [f"process {i}" for i in range(BAD, N)]
    show = subprocess.run([str(command), "show", run_id], cwd=project.root, env=environ,
                          capture_output=True, text=True, timeout=60)
    assert show.returncode == 0, show.stderr
    assert show.stdout.count("kept from older code (step ") == BAD, show.stdout


# -- in one process -------------------------------------------------------------------------
def test_the_key_under_older_code_is_the_key_the_task_makes() -> None:
    from durably._runtime.keep import _key

    @durably.task
    def f(x: int) -> int:
        return x

    spec = f.spec  # type: ignore[attr-defined]
    digest = spec.digest_inputs(spec.arguments(None, (3,), {}))
    assert _key(spec.identity, spec.code_version(), digest) == f.cache_key(3)


def test_keep_finished_is_checked_and_harmless_on_a_new_run() -> None:
    store = MemoryStore()

    @durably.task
    def g(x: int) -> int:
        return x + 1

    @durably.entrypoint(store=store)
    def pipe(n: int) -> list[int]:
        return [g(i) for i in range(n)]

    with pytest.raises(durably.DefinitionError, match="keep_finished"):
        pipe.run(2, keep_finished="yes")  # type: ignore[arg-type]
    run = pipe.run(2, keep_finished=True)
    assert run.result == [1, 2] and [s.status for s in run.steps] == ["ran", "ran"]
    assert pipe.resume(run.id, keep_finished=True) == [1, 2]


def test_resume_keep_finished_continues_a_failed_run(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from .conftest import load_source

    monkeypatch.setenv("COUNT_FILE", str(tmp_path / "count.txt"))
    durably.configure(store=durably.DiskStore(tmp_path / "store"))
    try:
        mod = load_source(tmp_path, monkeypatch, "keepjob", JOB)
        with pytest.raises(ValueError, match="a bug"):
            mod.job.run(8)
        run_id = durably.list_runs(mod.job)[0].id
        (tmp_path / "count.txt").write_text("")
        mod = load_source(tmp_path, monkeypatch, "keepjob", FIXED)
        assert mod.job.resume(run_id, keep_finished=True) == [i * 10 for i in range(8)]
        ran = (tmp_path / "count.txt").read_text().split()
        assert ran == [w for i in range(BAD, 8) for w in ("process", str(i))]
        steps = durably.get_run(run_id).steps
        assert [s.kept_from is not None for s in steps] == [True] * BAD + [False] * 3
    finally:
        durably.configure()
        os.environ.pop("COUNT_FILE", None)


_TWICE = """
import os, sys
import durably

@durably.task
def work(i):
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write(f"work {i}\\n")
    if i == KILL_AT:
        os.kill(os.getpid(), 9)
    return i * FACTOR

@durably.entrypoint
def job(n):
    return [work(i) for i in range(n)]

if __name__ == "__main__":
    print(job.run(6, keep_finished="keep" in sys.argv).result)
"""


@pytest.mark.slow
def test_a_second_fix_keeps_what_the_first_fix_finished(tmp_path: Path) -> None:
    """Killed (SIGKILL: the quick steps' batched cache writes, with their key records, are
    lost) under the original code, fixed, killed again under the first fix, fixed again:
    the steps finished under either older code are kept; only the rest executes."""
    count = tmp_path / "count.txt"
    env = script_env(tmp_path / "store", COUNT_FILE=str(count), PYTHONDONTWRITEBYTECODE="1")
    script = tmp_path / "twice.py"

    def attempt(kill_at: int, factor: int, *argv: str) -> subprocess.CompletedProcess[str]:
        write_script(script, _TWICE.replace("KILL_AT", str(kill_at))
                     .replace("FACTOR", str(factor)))
        return subprocess.run([sys.executable, str(script), *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)

    assert attempt(2, 1).returncode == -9  # items 0, 1 finished under v1
    assert attempt(4, 2, "keep").returncode == -9  # 0, 1 kept; 2, 3 finished under v2
    count.write_text("")
    done = attempt(-1, 3, "keep")
    assert done.returncode == 0, done.stderr
    assert count.read_text().split("\n")[:-1] == ["work 4", "work 5"]
    assert done.stdout.strip() == "[0, 1, 4, 6, 12, 15]"


def test_explain_of_a_code_change_names_keep_finished(store: Any) -> None:
    @durably.task(name="scaled")
    def first(x: int) -> int:
        return x * 2

    first(1)

    @durably.task(name="scaled")
    def second(x: int) -> int:
        return x * 3

    why = str(second.explain(1))
    assert "the code changed" in why and "keep_finished=True" in why and "kept_from" in why
