"""The numbered examples in examples/ and the notebook run, and print the evidence they
promise (served from the store on the second run, resumed after SIGKILL, answered from
another process, ...); the docs name every example and every CLI command.

Each example is copied into a temporary directory (keeping its file name, which is part of
its tasks' identity) and run there in a subprocess, with ``DURABLY_DIR`` pointing at a store
of its own.
"""

from __future__ import annotations

import ast
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import script_env

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"

pytestmark = pytest.mark.slow

# the examples this module runs, and the test that runs each
TESTED = {
    "01_hello_task.py": "test_hello_task",
    "02_make_a_script_durable.py": "test_make_a_script_durable",
    "03_crash_and_resume.py": "test_crash_and_resume",
    "04_cached_reruns.py": "test_cached_reruns_after_an_edit",
    "05_interrupt_and_approval.py": "test_interrupt_answered_by_another_process",
    "06_parallel_fan_out.py": "test_parallel_fan_out",
    "07_run_graph.py": "test_run_graph_files",
    "08_stategraph.py": "test_stategraph_router_and_cycle",
    "09_fork_and_replay.py": "test_fork_and_replay_with_changed_code",
    "10_digits_sweep.py": "test_digits_sweep",
    "notebook.ipynb": "test_notebook_second_execution_is_served_from_the_store",
}


def _copy(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copy(EXAMPLES / name, target)
    return target


def _run(script: Path, *args: str, expect: int = 0, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, script.name, *args], cwd=script.parent,
        env=script_env(script.parent / "store", **(env or {})), capture_output=True, text=True,
        timeout=timeout,
    )
    assert proc.returncode == expect, (
        f"{script.name} {' '.join(args)} exited {proc.returncode}, expected {expect}:\n"
        f"{proc.stdout}\n{proc.stderr}")
    return proc


def _counts(stdout: str) -> dict[str, int]:
    """Steps by status from the ``run.summary()`` line."""
    line = next(x for x in stdout.splitlines() if x.startswith("run '"))
    found = re.findall(r"([\d,]+) (ran|replayed|cached|failed)\b", line)
    return {k: int(v.replace(",", "")) for v, k in found}


def test_every_example_is_tested_and_documented() -> None:
    present = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".ipynb"))
    assert set(TESTED) <= set(present)
    assert set(TESTED.values()) <= set(globals())
    # examples of other modules are run by their own tests (test_examples.py, ...)
    tests = "".join(p.read_text(encoding="utf-8") for p in Path(__file__).parent.glob("test_*.py")
                    if p.name != Path(__file__).name)
    assert [n for n in present if n not in TESTED and n not in tests] == [], \
        "every example in examples/ is run by a test"
    listed = (DOCS / "examples.md").read_text(encoding="utf-8")
    assert [n for n in present if n not in listed] == [], "docs/examples.md lists every example"


def test_every_public_name_is_in_the_api_reference() -> None:
    import durably
    import durably.exceptions
    import durably.stategraph

    api = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    # rendered on the exceptions and StateGraph pages
    elsewhere = set(durably.exceptions.__all__) | set(durably.stategraph.__all__)
    missing = [n for n in durably.__all__
               if n not in elsewhere and f"::: durably.{n}\n" not in api]
    assert missing == [], "add them to docs/reference/api.md"


def test_every_cli_command_is_documented() -> None:
    click = pytest.importorskip("click")
    from durably.cli import cli

    text = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    ctx = click.Context(cli)
    names = []
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            names += [f"{name} {sub}" for sub in command.list_commands(ctx)]
        else:
            names.append(name)
    assert names, "the CLI has no commands?"
    assert [n for n in names if f"durably {n}" not in text] == []


def test_hello_task(tmp_path: Path) -> None:
    script = _copy(tmp_path, "01_hello_task.py")
    first = _run(script).stdout
    assert "computing slow_square(3)" in first and "would execute" in first
    assert "step slow_square: ran" in first and "step slow_square: cached" in first
    assert _counts(first) == {"ran": 2, "replayed": 0, "cached": 1, "failed": 0}
    second = _run(script).stdout
    assert "computing" not in second and "would be served from the cache" in second
    assert _counts(second) == {"ran": 0, "replayed": 3, "cached": 0, "failed": 0}
    assert "nothing executed" in second


def test_make_a_script_durable(tmp_path: Path) -> None:
    script = _copy(tmp_path, "02_make_a_script_durable.py")
    first = _run(script).stdout
    assert "steps: load ran, totals ran, write_report ran" in first
    assert (tmp_path / "report.txt").read_text().startswith("east")
    second = _run(script).stdout
    assert "steps: load replayed, totals replayed, write_report replayed" in second
    assert "wrote" not in second  # the side effect happened once in this run
    # the input is a durably.file: editing the data makes load (and what follows) run
    with (tmp_path / "sales.csv").open("a") as f:
        f.write("north,1000.00\n")
    third = _run(script).stdout
    assert "steps: load ran, totals ran, write_report ran" in third
    assert "'north': 3425.0" in third


def test_crash_and_resume(tmp_path: Path) -> None:
    script = _copy(tmp_path, "03_crash_and_resume.py")
    crashed = _run(script, "--crash-after", "8", expect=-signal.SIGKILL).stdout
    assert "item  8/20 done" in crashed and "item  9/20" not in crashed
    resumed = _run(script).stdout
    assert re.search(r"found run \S+ \(crashed, attempt 1\): continuing it", resumed)
    assert _counts(resumed) == {"ran": 12, "replayed": 8, "cached": 0, "failed": 0}
    assert "result: 2470" in resumed and "resumed a run" in resumed


def test_cached_reruns_after_an_edit(tmp_path: Path) -> None:
    script = _copy(tmp_path, "04_cached_reruns.py")

    def statuses(stdout: str) -> dict[str, str]:
        return {m[0]: m[1] for m in re.findall(r"^(load|clean|summarize)\s+(ran|cached)",
                                                  stdout, re.M)}

    first = _run(script).stdout
    assert statuses(first) == {"load": "ran", "clean": "ran", "summarize": "ran"}
    second = _run(script).stdout
    assert statuses(second) == {"load": "cached", "clean": "cached", "summarize": "cached"}
    # edit the configuration constant clean() reads, as a developer would
    source = script.read_text()
    script.write_text(source.replace("OUTLIER_LIMIT = 3.0", "OUTLIER_LIMIT = 2.0"))
    third = _run(script).stdout
    assert statuses(third) == {"load": "cached", "clean": "ran", "summarize": "ran"}
    clean_line = next(x for x in third.splitlines() if x.startswith("clean"))
    assert "the code changed" in clean_line and "OUTLIER_LIMIT" in clean_line


def test_interrupt_answered_by_another_process(tmp_path: Path) -> None:
    script = _copy(tmp_path, "05_interrupt_and_approval.py")
    paused = _run(script).stdout
    assert "drafting" in paused
    match = re.search(r"run (\S+) is waiting for an answer: Publish this draft\?", paused)
    assert match, paused
    run_id = match.group(1)
    answered = _run(script, "answer", run_id, "yes").stdout  # a second process
    assert "result: published: This week in durable Python" in answered
    assert "drafting" not in answered  # the finished draft was replayed, not redone
    assert "steps: write_draft replayed, ask_editor ran, publish ran" in answered
    again = _run(script, "answer", run_id, "yes").stdout
    assert "cannot answer" in again and "not interrupted" in again


def test_parallel_fan_out(tmp_path: Path) -> None:
    script = _copy(tmp_path, "06_parallel_fan_out.py")
    first = _run(script).stdout
    assert "24 pages" in first
    assert _counts(first) == {"ran": 25, "replayed": 0, "cached": 0, "failed": 0}
    took = float(re.search(r"words in ([\d.]+) s", first).group(1))  # type: ignore[union-attr]
    assert took < 4.8  # 24 waits of 0.2 s overlap on 8 threads
    second = _run(script).stdout
    assert _counts(second) == {"ran": 0, "replayed": 25, "cached": 0, "failed": 0}
    # worker processes: another run (other arguments), served by the cross-run cache...
    cached = _run(script, "--executor", "process").stdout
    assert _counts(cached) == {"ran": 0, "replayed": 0, "cached": 25, "failed": 0}
    # ...and, in a new store, one whose items execute in worker processes
    shutil.rmtree(tmp_path / "store")
    fresh = _run(script, "--executor", "process", "--items", "4").stdout
    assert _counts(fresh) == {"ran": 5, "replayed": 0, "cached": 0, "failed": 0}


def test_run_graph_files(tmp_path: Path) -> None:
    script = _copy(tmp_path, "07_run_graph.py")
    out = _run(script, env={"PATH": ""}).stdout  # without Graphviz's dot: no SVG, said so
    assert "flowchart TD" in out and "subgraph" in out
    assert "13 nodes" in out
    assert (tmp_path / "run_graph.mmd").read_text(encoding="utf-8").count("evaluate") >= 2
    html = (tmp_path / "run_graph.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and 'id="steps"' in html
    # the browser draws the report's graph (Viz.js inlined): it needs no dot
    assert '<script type="application/json" id="graph-dot">' in html and "Viz.js" in html
    assert "mermaid" not in html
    assert "skipped run_graph.svg" in out and "apt install graphviz" in out
    assert not (tmp_path / "run_graph.svg").exists()


def test_run_graph_files_with_graphviz(tmp_path: Path, require_dot: str) -> None:
    script = _copy(tmp_path, "07_run_graph.py")
    out = _run(script).stdout
    assert "wrote run_graph.svg" in out and "skipped" not in out
    assert "<svg" in (tmp_path / "run_graph.svg").read_text(encoding="utf-8")


def test_stategraph_router_and_cycle(tmp_path: Path) -> None:
    script = _copy(tmp_path, "08_stategraph.py")
    first = _run(script).stdout
    assert ("path: draft → review: 3/10 → revision 1 → review: 6/10 → revision 2 → "
            "review: 9/10") in first
    assert "-.->|\"revise\"|" in first and "review ×3" in first  # router edges, visits
    assert re.search(r"after super-step 5\s+score\s+9, next END", first)
    assert _counts(first)["ran"] == 12  # 6 super-steps and the 6 node calls in them
    second = _run(script).stdout
    assert _counts(second) == {"ran": 0, "replayed": 6, "cached": 0, "failed": 0}


def test_fork_and_replay_with_changed_code(tmp_path: Path) -> None:
    script = _copy(tmp_path, "09_fork_and_replay.py")
    first = _run(script).stdout
    assert "-- the durably team" in first and "outlining" in first
    assert re.search(r"[0-9a-f]{12}  step\s+outline", first)
    # change the code after the checkpoint, then fork at the outline with a new outline
    source = script.read_text()
    script.write_text(source.replace('SIGNATURE = "-- the durably team"',
                                     'SIGNATURE = "-- edited after the run"'))
    forked = _run(script, "fork").stdout
    assert "outlining" not in forked  # replayed from the copied journal
    assert "steps: outline replayed, write ran, sign ran" in forked
    assert "How a journal replays it" in forked and "-- edited after the run" in forked
    assert "the source run is unchanged: What durable execution is. Why" in forked


def test_digits_sweep(tmp_path: Path) -> None:
    script = _copy(tmp_path, "10_digits_sweep.py")
    first = _run(script, timeout=300).stdout
    assert "6 of 6 fits executed" in first
    best = re.search(r"best params: (\{.*?\}) \(cv accuracy ([\d.]+), test accuracy ([\d.]+)\)",
                     first)
    assert best, first
    assert set(ast.literal_eval(best.group(1))) == {"C", "gamma"}
    assert float(best.group(2)) > 0.9 and float(best.group(3)) > 0.9
    second = _run(script).stdout
    assert "0 of 6 fits executed" in second
    assert _counts(second) == {"ran": 0, "replayed": 8, "cached": 0, "failed": 0}
    assert best.group(0) in second


def _execute_notebook(path: Path, cwd: Path) -> list[Any]:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from jupyter_client.kernelspec import KernelSpecManager

    # the kernel must be this interpreter: jupyter_client runs "python" as sys.executable
    argv = KernelSpecManager().get_kernel_spec("python3").argv
    assert argv[0] in ("python", "python3", sys.executable), argv
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
    return [cell for cell in nb.cells if cell.cell_type == "code"]


def _stdout(cell: Any) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _steps(cells: list[Any]) -> list[dict[str, int]]:
    """The ``steps: {...}`` lines the run cells print, in order."""
    return [ast.literal_eval(line.partition("steps: ")[2])
            for cell in cells for line in _stdout(cell).splitlines()
            if line.startswith("steps: ")]


def test_notebook_second_execution_is_served_from_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    monkeypatch.setenv("DURABLY_DIR", str(store))  # the kernel inherits the environment
    notebook = EXAMPLES / "notebook.ipynb"

    first = _execute_notebook(notebook, tmp_path)
    assert f"store: {store}" in _stdout(first[0])
    errors = [o for c in first for o in c.outputs if o.output_type == "error"]
    assert errors == []
    run_cell, edited = _steps(first)
    assert run_cell == {"ran": 4, "cached": 0, "replayed": 0, "failed": 0}
    # the edited summarize cell: only that task ran; the expensive ones came from the store
    assert edited == {"ran": 1, "cached": 0, "replayed": 3, "failed": 0}
    graph = first[-1].outputs
    assert graph and graph[0].output_type == "execute_result"
    assert {"image/svg+xml", "text/html"} & set(graph[0].data)

    second = _execute_notebook(notebook, tmp_path)  # a new kernel: Restart & Run All
    assert [c for c in _steps(second)] == [
        {"ran": 0, "cached": 0, "replayed": 4, "failed": 0},
        {"ran": 0, "cached": 0, "replayed": 4, "failed": 0},
    ]
    took = [float(m) for c in second for m in re.findall(r"took ([\d.]+) s", _stdout(c))]
    assert len(took) == 2 and max(took) < 1.5  # the first execution slept 1.5 s
