"""The benchmark runner's verdict (benchmarks/run_all.py): a script that fails is never
counted as met. (The figures themselves are measured by the benchmarks, not here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

RUN_ALL = Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.py"


def _run_all(tmp_path: Path, *args: str, pythonpath: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["DURABLY_BENCH_RESULTS"] = str(tmp_path / "results")
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, str(RUN_ALL), *args], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_script_that_fails_is_named_as_not_measured_and_the_runner_exits_1(
        tmp_path: Path) -> None:
    broken = tmp_path / "broken" / "src" / "durably"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('broken on purpose')\n")
    proc = _run_all(tmp_path, "--only", "import, hashing",
                    pythonpath=str(broken.parent))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED, their targets not measured: import, hashing" in proc.stdout
    assert "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    assert summary["failed"] == ["import", "hashing"]
    assert summary["targets"] == []
    assert summary["commit"] is None and summary["src_modified"] is None  # (not a checkout)
    assert "broken on purpose" in summary["durably"]


def test_bad_options_are_refused_before_anything_runs(tmp_path: Path) -> None:
    for args, message in ((["--store-entries", "0"], "must be at least 1"),
                          (["--only", " , "], "names no benchmark"),
                          (["--only", "imports"], "unknown benchmark")):
        proc = _run_all(tmp_path, *args)
        assert proc.returncode == 2, args
        assert message in proc.stderr, (args, proc.stderr)
    assert not (tmp_path / "results").exists()
