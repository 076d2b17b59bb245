"""Ctrl-C on a run a script started: the person sees two lines (the run stopped after N
steps; the same command continues it), not a traceback through durably, and the process
ends by SIGINT as Python's does (a shell says 130). ``except KeyboardInterrupt:`` still
catches the plain KeyboardInterrupt, IPython still shows it, and a Ctrl-C outside any run
prints Python's traceback as ever. With worker processes, the message about the bodies the
stop waits for counts those running (and those queued on the workers), not every item
sent."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably._runtime import ctrl_c

from .conftest import script_env, write_script

STEPS = """
import os, signal, sys, time
from pathlib import Path
import durably

signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started in the background
HERE = Path(__file__).parent

def mark(name, text=""):
    (HERE / (name + ".tmp")).write_text(text)
    os.replace(HERE / (name + ".tmp"), HERE / name)

@durably.task
def step(i):
    with open(HERE / "ran.log", "a") as f:
        f.write(f"{i}\\n")
    if i == 3 and not (HERE / "go").exists():
        mark("ready", str(os.getpid()))
        while not (HERE / "go").exists():
            time.sleep(0.02)
    return i * i

@durably.entrypoint
def job(n):
    return [step(i) for i in range(n)]

if __name__ == "__main__":
    if os.environ.get("CATCH"):
        try:
            job.run(6)
        except KeyboardInterrupt as exc:
            print("caught", type(exc).__name__, flush=True)
        mark("outside", str(os.getpid()))
        while True:  # a Ctrl-C here is outside any run
            time.sleep(0.02)
    print(job.run(6).summary(), flush=True)
"""

MAP = """
import os, signal, sys, time
from pathlib import Path
import durably
from durably.executors import Process

signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started in the background
HERE = Path(__file__).parent

@durably.task
def prep(i):
    return i

@durably.task
def body(i):
    fd = os.open(HERE / "bodies.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{i}\\n".encode())  # one write: lines of two workers never mix
    os.close(fd)
    while not (HERE / "release").exists():
        time.sleep(0.02)
    return i * i

@durably.entrypoint
def pjob(n):
    return [prep(i) for i in range(3)] + body.map(range(n), executor=POOL)

if __name__ == "__main__":
    POOL = Process(max_workers=2)
    print(pjob.run(20).summary(), flush=True)
"""


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> str:
    """The text of ``path`` once the script made it (a hang guard, not a time budget: the
    test fails after 60 s)."""
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, f"the script ended first: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)
    return path.read_text()


@contextlib.contextmanager
def _started(args: list[str], cwd: Path, env: dict[str, str]
             ) -> Iterator[subprocess.Popen[str]]:
    with subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:  # (a failed test): never left running
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.slow
def test_ctrl_c_ends_a_script_with_two_lines_and_the_same_command_continues(
        tmp_path: Path) -> None:
    """Started by a shell, as a person would: Ctrl-C on step 3 of 6 ends the script with
    the two lines (3 finished steps; the command), exit status 130 and no traceback; that
    command, run again, continues the run without executing steps 0 to 2 again."""
    write_script(tmp_path / "job.py", STEPS)
    env = script_env(tmp_path / "store")
    shell = ["sh", "-c", '"$@"; echo "exit status $?" >&2', "sh", sys.executable, "job.py"]
    with _started(shell, tmp_path, env) as proc:
        pid = int(_wait_for(tmp_path / "ready", proc))
        os.kill(pid, signal.SIGINT)  # python only, as a terminal's Ctrl-C would
        out, err = proc.communicate(timeout=60)
    *said, status = err.splitlines()
    assert status == "exit status 130", err
    assert "Traceback" not in err and len(said) == 2, err
    assert re.fullmatch(r"durably: Ctrl-C stopped run 'job-[0-9a-f]+' after 3 finished steps "
                        r"\(kept in its journal\)\.", said[0]), said
    command = shlex.join([sys.executable, "job.py"])
    assert said[1] == f"Run the same command again to continue it: {command}", said
    assert out == ""

    (tmp_path / "go").touch()
    again = subprocess.run(shlex.split(said[1].partition(": ")[2]), cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "3 ran, 3 replayed" in again.stdout, again.stdout
    # step 3 was executing when Ctrl-C came: it runs again; 0 to 2 never do
    assert (tmp_path / "ran.log").read_text().split() == ["0", "1", "2", "3", "3", "4", "5"]


@pytest.mark.slow
def test_a_ctrl_c_the_script_catches_is_a_keyboard_interrupt_and_one_outside_runs_is_not_changed(
        tmp_path: Path) -> None:
    """``except KeyboardInterrupt:`` catches the run's stop (a plain KeyboardInterrupt);
    a later Ctrl-C outside any run ends the script with Python's own traceback."""
    write_script(tmp_path / "job.py", STEPS)
    env = script_env(tmp_path / "store", CATCH="1")
    with _started([sys.executable, "job.py"], tmp_path, env) as proc:
        os.kill(int(_wait_for(tmp_path / "ready", proc)), signal.SIGINT)
        os.kill(int(_wait_for(tmp_path / "outside", proc)), signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert out == "caught KeyboardInterrupt\n"
    assert proc.returncode == -signal.SIGINT
    assert "Ctrl-C stopped run" not in err, err
    assert err.startswith("Traceback") and err.splitlines()[-1] == "KeyboardInterrupt", err


@pytest.mark.slow
def test_ctrl_c_on_worker_processes_counts_the_bodies_running(tmp_path: Path) -> None:
    """Two workers, twenty items: the message names the 2 bodies running (and those
    already queued on the workers, which run too), not the twenty items sent; the final
    line counts the steps journaled; the rerun executes only the items that never ran."""
    write_script(tmp_path / "pjob.py", MAP)
    env = script_env(tmp_path / "store")
    bodies = tmp_path / "bodies.log"
    with _started([sys.executable, "pjob.py"], tmp_path, env) as proc:
        lines: queue.SimpleQueue[str] = queue.SimpleQueue()

        def read() -> None:
            with contextlib.suppress(ValueError, OSError):
                for line in proc.stderr or ():
                    lines.put(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 60
        while not bodies.exists() or len(bodies.read_text().split()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "no two bodies"
            time.sleep(0.02)  # both workers hold a blocked body
        proc.send_signal(signal.SIGINT)
        warning = lines.get(timeout=60)
        (tmp_path / "release").touch()
        proc.wait(timeout=60)
        reader.join(timeout=60)
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    found = re.fullmatch(r"durably: Ctrl-C: 'body' starts nothing more; waiting for its 2 "
                         r"running bodies(?: \(and (\d+) queued on the workers, too late to "
                         r"cancel\))? to finish, journaling each \(Ctrl-C again to kill the "
                         r"worker processes\)\n", warning)
    assert found, warning
    queued = int(found.group(1) or 0)
    assert queued <= 3, warning  # (a pool queues at most one more than its workers)
    ran = sorted(int(x) for x in bodies.read_text().split())
    assert len(ran) == 2 + queued, (ran, warning)
    assert proc.returncode == -signal.SIGINT
    assert len(rest) == 2 and "Traceback" not in "".join(rest), rest
    assert f"after {3 + 2 + queued} finished steps" in rest[0], rest

    bodies.unlink()
    again = subprocess.run([sys.executable, "pjob.py"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    rerun = sorted(int(x) for x in bodies.read_text().split())
    assert sorted(ran + rerun) == list(range(20)), (ran, rerun)  # each body once


# -- in this process ----------------------------------------------------------------------
@durably.task
def _stop_here(i: int) -> int:
    if i == 2:
        raise KeyboardInterrupt  # as a Ctrl-C landing in the body
    return i


@durably.entrypoint
def _stopped_job(n: int) -> list[int]:
    return [_stop_here(i) for i in range(n)]


def test_the_hook_speaks_only_for_a_run_stopped_by_ctrl_c(
        disk_store: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stop is a plain KeyboardInterrupt. With Python's own hook in place, durably's is
    installed: it prints the two lines for that exception only, and hands any other (a
    KeyboardInterrupt outside a run, an error) to Python's hook."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    with pytest.raises(KeyboardInterrupt) as caught:
        _stopped_job(4)
    assert type(caught.value) is KeyboardInterrupt
    assert sys.excepthook is ctrl_c._excepthook
    sys.excepthook(KeyboardInterrupt, caught.value, caught.value.__traceback__)
    err = capsys.readouterr().err
    run = durably.list_runs(_stopped_job)[0]
    assert run.status == "stopped"
    assert err.startswith(f"durably: Ctrl-C stopped run {run.id!r} after 2 finished steps")
    assert len(err.splitlines()) == 2 and "Traceback" not in err

    for other in (KeyboardInterrupt(), ValueError("boom")):
        sys.excepthook(type(other), other, None)
        err = capsys.readouterr().err
        assert "Ctrl-C stopped run" not in err and type(other).__name__ in err, err


def test_a_hook_of_the_users_is_left_alone(disk_store: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A process with its own sys.excepthook (the user's, IPython's) keeps it: durably
    installs nothing, the KeyboardInterrupt reaches that hook as ever."""
    def mine(*args: Any) -> None:
        pass

    monkeypatch.setattr(sys, "excepthook", mine)
    with pytest.raises(KeyboardInterrupt):
        _stopped_job(4)
    assert sys.excepthook is mine


@pytest.mark.slow
def test_a_notebook_shows_the_keyboard_interrupt_as_ever_and_its_kernel_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupting the kernel (Jupyter's stop button: SIGINT) during a run stops the run;
    the cell shows its KeyboardInterrupt as IPython does, and the kernel runs the next cell
    (the same cell, run again, continues the run)."""
    import nbclient
    import nbformat

    monkeypatch.setenv("DURABLY_DIR", str(tmp_path / "store"))  # the kernel inherits it
    ready = tmp_path / "ready"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in (
        f"""import os, time, durably
from pathlib import Path
READY = Path({str(ready)!r})

@durably.task
def step(i):
    if i == 2 and not READY.exists():
        READY.with_suffix(".tmp").write_text(str(os.getpid()))
        os.replace(READY.with_suffix(".tmp"), READY)
        while True:
            time.sleep(0.02)
    return i

@durably.entrypoint
def job(n):
    return [step(i) for i in range(n)]""",
        "job(4)",
        "print('kernel alive', 1 + 1)",
        "print(job.run(4).summary())",
    )]
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})

    def interrupt() -> None:  # as Jupyter's stop button does (interrupt_mode "signal")
        deadline = time.monotonic() + 120  # (a hang guard)
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(int(ready.read_text()), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    client.execute()
    cells = nb.cells
    (error,) = [o for o in cells[1].outputs if o.output_type == "error"]
    assert error.ename == "KeyboardInterrupt"
    texts = "".join(o.get("text", "") for c in cells for o in c.outputs)
    assert "Ctrl-C stopped run" not in texts
    assert texts.startswith("kernel alive 2\n"), texts
    assert "2 replayed" in texts, texts  # step 2 was interrupted: 0 and 1 replay
