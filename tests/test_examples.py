"""Every example in examples/ runs as it is, without arguments, or prints its usage; the demo
resumes after SIGKILL and Ctrl-C."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import script_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEMO = EXAMPLES / "stdlib_index.py"

pytestmark = pytest.mark.slow


# examples whose run without arguments is not a working run but their usage (exit status 2)
USAGE = {"graph_approval.py": "{start,answer}"}
# examples whose run without arguments takes long: here --help, which must print their usage;
# their work is tested elsewhere (the digits sweep without arguments by test_docs_examples.py,
# the demo on a part of the standard library below)
LONG = {"10_digits_sweep.py", "stdlib_index.py"}


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_every_example_runs_as_it_is_or_prints_its_usage(name: str, tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / name, tmp_path / name)  # (its file name is part of its tasks' names)
    args = ["--help"] if name in LONG else []
    proc = subprocess.run([sys.executable, name, *args], cwd=tmp_path,
                          env=script_env(tmp_path / "store"), capture_output=True, text=True,
                          timeout=120)
    said = f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stdout + proc.stderr, said
    if name in USAGE:
        assert proc.returncode == 2, said
        assert proc.stderr.startswith(f"usage: {name} ") and USAGE[name] in proc.stderr, said
    elif args:
        assert proc.returncode == 0 and proc.stdout.startswith(f"usage: {name} "), said
    else:
        assert proc.returncode == 0 and proc.stdout.strip(), said


def _demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, str(DEMO), *args], env=script_env(cwd / ".durably"), cwd=cwd,
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _counts(summary: str) -> dict[str, int]:
    line = next(x for x in summary.splitlines() if x.startswith("run '"))
    return {k: int(v.replace(",", "")) for v, k in re.findall(r"([\d,]+) (ran|replayed|cached)",
                                                             line)}


def test_demo_second_run_is_served_from_the_store(tmp_path: Path) -> None:
    first = _demo(tmp_path, "--limit", "40")
    assert "40 files" in first.stdout
    assert _counts(first.stdout) == {"ran": 42, "replayed": 0, "cached": 0}
    report = (tmp_path / "stdlib_report.md").read_text()
    assert "Top identifiers" in report and "40 files" in report
    # the run's graph is saved as an HTML report, and the demo says where
    html = tmp_path / "stdlib_report.html"
    assert f"run graph and step table: {html}" in first.stdout
    page = html.read_text()
    assert "index_file ×40" in page and "<table" in page
    second = _demo(tmp_path, "--limit", "40")
    assert _counts(second.stdout) == {"ran": 0, "replayed": 42, "cached": 0}
    assert "everything was served from the store" in second.stdout
    # the report is a side effect journaled in the run: not written again
    (tmp_path / "stdlib_report.md").unlink()
    _demo(tmp_path, "--limit", "40")
    assert not (tmp_path / "stdlib_report.md").exists()
    # a different run (other arguments) reuses the cached per-file results
    third = _demo(tmp_path, "--limit", "45", "--report", "other.md")
    assert _counts(third.stdout) == {"ran": 5 + 2, "replayed": 0, "cached": 40}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_demo_killed_halfway_continues_and_says_so(tmp_path: Path, sig: signal.Signals) -> None:
    args = [sys.executable, str(DEMO), "--limit", "400"]
    env = script_env(tmp_path / ".durably")
    with subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "250/400" in line:
                proc.send_signal(sig)
                break
        else:
            pytest.fail("the demo never reported progress")
        proc.communicate(timeout=60)
    assert proc.returncode != 0
    again = _demo(tmp_path, "--limit", "400")
    assert ("an unfinished run exists (" in again.stdout and
            (", stopped)" if sig == signal.SIGINT else ", crashed)") in again.stdout)
    assert ("resumed a run that was stopped by Ctrl-C" if sig == signal.SIGINT
            else "resumed a run whose process had died while executing it") in again.stdout
    counts = _counts(again.stdout)
    assert counts["replayed"] >= 250 and counts["ran"] <= 152
    assert counts["replayed"] + counts["ran"] == 402
