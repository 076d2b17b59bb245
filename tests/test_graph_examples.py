"""The StateGraph examples of examples/graph_*.py, run as a user would (real processes)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import script_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(name: str, tmp_path: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *args],
                          env=script_env(tmp_path / "store"), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_agent_tools_loop(tmp_path: Path) -> None:
    out = _run("graph_agent_tools.py", tmp_path)
    assert "answer: It is 52.2 miles." in out
    assert 'n1 -.->|"tools"| n2' in out  # the router's declared outputs, dashed
    assert out == _run("graph_agent_tools.py", tmp_path)  # rerun: replayed, same result


def test_react_loop(tmp_path: Path) -> None:
    out = _run("graph_react.py", tmp_path)
    assert out.count("Thought:") == 3 and out.count("Observation:") == 2
    assert "answer: Paris, about 2.1 million people" in out


def test_parallel_researchers_merge_in_node_order(tmp_path: Path) -> None:
    out = _run("graph_researchers.py", tmp_path)
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("- ")] == [
        "- history", "- economics", "- technology"]


def test_research_workflow_is_bounded_and_asks_when_vague(tmp_path: Path) -> None:
    clear = _run("graph_research_workflow.py", tmp_path, "How do durable workflows resume?")
    assert "verdict: escalated after 2 revisions" in clear
    assert "draft ×3, review ×3, revise ×2, escalate ×1" in clear
    vague = _run("graph_research_workflow.py", tmp_path, "stuff?")
    assert "ASKED: {'please clarify': 'stuff?'}" in vague
    assert "question: How do durable workflows resume after a crash?" in vague


@pytest.mark.slow
def test_approval_flow_across_processes(tmp_path: Path) -> None:
    first = _run("graph_approval.py", tmp_path, "start", "durable workflows")
    run_id = re.search(r"run=(\S+)", first)
    assert run_id is not None and "draft='A post about durable workflows'" in first
    second = _run("graph_approval.py", tmp_path, "answer", run_id[1], "reject: shorter please")
    assert "WAITING" in second and "(revised: shorter please)" in second
    third = _run("graph_approval.py", tmp_path, "answer", run_id[1], "approve")
    assert third.strip() == "PUBLISHED A POST ABOUT DURABLE WORKFLOWS (REVISED: SHORTER PLEASE)"


