"""``durably resume`` and ``durably fork`` on runs a script started as ``python job.py``
(entrypoint ``__main__.job:...``): the run records the script's path, and the command loads
the script as ``python job.py`` did (its folder first on sys.path, so its own imports work)
without running its ``if __name__ == "__main__":`` block; the finished steps replay. A
script no longer where the run recorded it is an error giving the command that works."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durably

from .conftest import script_env

HELPER = """
def double(x):
    return 2 * x
"""

JOB = """
import os, time
from pathlib import Path
import durably
from helper import double  # next to the script: found as python job.py finds it

@durably.task
def step(i):
    with open(os.environ["STEP_LOG"], "a") as f:
        f.write(f"{i}\\n")
    if i == 2 and os.environ.get("HANG"):
        Path(os.environ["HANGING"]).write_text(str(os.getpid()))
        while True:
            time.sleep(0.05)
    return double(i)

@durably.task
def review(total):
    return durably.interrupt({"total": total})

@durably.entrypoint
def job(n):
    total = sum(step(i) for i in range(n))
    if os.environ.get("NO_REVIEW"):
        return total
    return f"{total}: {review(total)}"

if __name__ == "__main__":
    print("main block", job.run(4).status, flush=True)
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "helper.py").write_text(HELPER)
    (folder / "job.py").write_text(JOB)
    return folder


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return script_env(tmp_path / "store", STEP_LOG=str(tmp_path / "steps.log"), **extra)


def _durably(args: list[str], cwd: Path, env: dict[str, str]
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "durably", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _steps(tmp_path: Path) -> list[str]:
    return (tmp_path / "steps.log").read_text().split()


def _interrupted(project: Path, env: dict[str, str]) -> durably.Run[object]:
    started = subprocess.run([sys.executable, "job.py"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=120)
    assert started.stdout == "main block interrupted\n", started.stderr
    (run,) = durably.list_runs(store=durably.DiskStore(Path(env["DURABLY_DIR"])))
    return run


@pytest.mark.slow
def test_durably_resume_answers_a_run_of_python_job_py_from_another_folder(
        tmp_path: Path, project: Path) -> None:
    env = _env(tmp_path)
    run = _interrupted(project, env)
    assert run.entrypoint == "__main__.job:job"
    assert run.script == str(project / "job.py")

    # from another folder, as the hint of `durably show` says (and by the run id alone)
    shown = _durably(["show", run.id], tmp_path, env)
    hint = [line for line in shown.stdout.splitlines() if line.startswith("answer with: ")]
    assert hint == [f"answer with: durably resume __main__.job:job {run.id} --value JSON"]
    command = shlex.split(hint[0].partition(": ")[2].replace("JSON", "'\"yes\"'"))
    done = _durably(command[1:], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "main block" not in done.stdout  # the script's __main__ block did not run
    assert done.stdout.endswith("result: '12: yes'\n"), done.stdout
    assert "1 ran, 4 replayed" in done.stdout, done.stdout
    assert _steps(tmp_path) == ["0", "1", "2", "3"]  # each step once

    again = _interrupted(project, {**env, "DURABLY_DIR": str(tmp_path / "store2")})
    done = _durably(["resume", again.id[:12], "--value", '"no"'], tmp_path,
                    {**env, "DURABLY_DIR": str(tmp_path / "store2")})
    assert done.returncode == 0 and done.stdout.endswith("result: '12: no'\n"), done.stderr


@pytest.mark.slow
def test_a_killed_run_of_python_job_py_is_continued_by_durably_resume(
        tmp_path: Path, project: Path) -> None:
    """Killed on step 2: `durably resume RUN` continues it (its recorded script loaded,
    its stored arguments) without executing steps 0 and 1 again."""
    hanging = tmp_path / "hanging"
    env = _env(tmp_path, HANG="1", HANGING=str(hanging), NO_REVIEW="1")
    with subprocess.Popen([sys.executable, "job.py"], cwd=project, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.monotonic() + 60  # (a hang guard)
        while not hanging.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
    (run,) = durably.list_runs(store=durably.DiskStore(tmp_path / "store"))
    done = _durably(["resume", run.id], tmp_path, {**env, "HANG": ""})
    assert done.returncode == 0 and done.stdout.endswith("result: 12\n"), done.stderr
    assert _steps(tmp_path) == ["0", "1", "2", "2", "3"]


@pytest.mark.slow
def test_a_script_moved_or_deleted_gives_the_command_that_works(tmp_path: Path,
                                                               project: Path) -> None:
    env = _env(tmp_path)
    run = _interrupted(project, env)
    moved = project.rename(tmp_path / "moved")
    refused = _durably(["resume", run.id, "--value", '"yes"'], moved, env)
    assert refused.returncode == 1
    fix = f"durably resume {run.id} --value '\"yes\"' --script job.py"
    assert refused.stderr == (
        f"durably: error: run {run.id!r} was started by the script {project / 'job.py'} "
        f"(`python job.py`), which is not there any more (moved or deleted). Fix: {fix}\n")
    done = _durably(shlex.split(fix)[1:], moved, env)
    assert done.returncode == 0 and done.stdout.endswith("result: '12: yes'\n"), done.stderr
    assert "1 ran, 4 replayed" in done.stdout, done.stdout

    other = _interrupted(moved, {**env, "DURABLY_DIR": str(tmp_path / "store2")})
    (moved / "job.py").unlink()  # deleted: no job.py here either
    refused = _durably(["resume", other.id, "--value", '"yes"'], moved,
                       {**env, "DURABLY_DIR": str(tmp_path / "store2")})
    assert refused.returncode == 1
    assert refused.stderr.endswith(f"Fix: durably resume {other.id} --value '\"yes\"' "
                                   "--script '<path of job.py>'\n"), refused.stderr


@pytest.mark.slow
def test_durably_fork_forks_a_run_of_python_job_py(tmp_path: Path, project: Path) -> None:
    env = _env(tmp_path)
    run = _interrupted(project, env)
    point = [p for p in run.history() if p.kind == "step"][-1]  # the oldest: step 0
    forked = _durably(["fork", run.id, "--at", point.id[:12]], tmp_path, env)
    assert forked.returncode == 3, forked.stderr  # it pauses at the interrupt again
    assert "main block" not in forked.stdout
    assert _steps(tmp_path) == ["0", "1", "2", "3", "1", "2", "3"]


@pytest.mark.slow
def test_a_script_resumed_by_durably_resume_maps_on_worker_processes(tmp_path: Path,
                                                                      project: Path) -> None:
    """Worker processes started by the command load the script as the command did (as
    ``__mp_main__``, without its ``__main__`` block): the script's task runs there."""
    (project / "pjob.py").write_text(PROCESS_JOB)
    env = _env(tmp_path)
    started = subprocess.run([sys.executable, "pjob.py"], cwd=project, env=env,
                             capture_output=True, text=True, timeout=120)
    assert started.stdout == "main block interrupted\n", started.stderr
    (run,) = durably.list_runs(store=durably.DiskStore(tmp_path / "store"))
    done = _durably(["resume", run.id, "--value", "4"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert "main block" not in done.stdout + done.stderr
    assert done.stdout.endswith(f"result: {2 * 100 + sum(2 * i for i in range(4))}\n")
    assert sorted(_steps(tmp_path), key=int) == ["0", "1", "2", "3", "100"]


PROCESS_JOB = """
import os
import durably
from helper import double

@durably.task
def body(i):
    with open(os.environ["STEP_LOG"], "a") as f:
        f.write(f"{i}\\n")
    return double(i)

@durably.entrypoint
def pjob():
    first = body(100)
    n = durably.interrupt("how many?")
    return first + sum(body.map(range(n), executor="process", max_workers=2))

if __name__ == "__main__":
    print("main block", pjob.run().status, flush=True)
"""
