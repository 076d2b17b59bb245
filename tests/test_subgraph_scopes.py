"""Subgraphs over their parent's state class, without names of their own: a subgraph whose
name (or a name nested in it) is its parent's is scoped under the path of nodes that leads to
it (``outer/mid``, ``outer/mid/inner``), so its steps, super-steps and checkpoints are its
own, and a run resumes inside nested subgraphs exactly."""

from __future__ import annotations

import operator
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from durably import END, START, StateGraph

from .conftest import script_env, write_script

pytestmark = pytest.mark.usefixtures("store")


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]


def _node(word: str, calls: list[str], fail: set[str] | None = None) -> Any:
    def node(state: Notes) -> dict[str, Any]:
        calls.append(word)
        if fail is not None and word in fail:
            raise RuntimeError(f"{word} failed")
        return {"notes": [word]}
    node.__name__ = node.__qualname__ = f"node_{word}"
    return node


def _nested(name: str | None, calls: list[str], fail: set[str] | None = None) -> Any:
    """outer: a -> mid -> b; mid: c -> inner -> d; inner: e -> f; every graph over Notes,
    named ``name`` (or all unnamed)."""
    def graph(first: str, sub: Any, last: str) -> Any:
        g = StateGraph(Notes, name=name)
        g.add_node(first, _node(first, calls, fail))
        g.add_node(last, _node(last, calls, fail))
        if sub is None:
            g.add_edge(START, first).add_edge(first, last).add_edge(last, END)
        else:
            g.add_node("sub", sub)
            g.add_edge(START, first).add_edge(first, "sub").add_edge("sub", last)
            g.add_edge(last, END)
        return g.compile()

    inner = graph("e", None, "f")
    mid = graph("c", inner, "d")
    return graph("a", mid, "b")


@pytest.mark.parametrize("name", ["same", None])
def test_nested_subgraphs_over_one_state_need_no_names(name: str | None) -> None:
    calls: list[str] = []
    outer = _nested(name, calls)
    run = outer.run({"notes": []})
    assert run.status == "finished"
    assert run.result["notes"] == ["a", "c", "e", "f", "d", "b"]
    tasks = [s.task for s in run.steps if not s.task.endswith("::superstep")]
    if name is not None:  # one name: each subgraph scoped under its path
        assert tasks == ["same.a", "same.sub", "same/sub.c", "same/sub.sub", "same/sub/sub.e",
                         "same/sub/sub.f", "same/sub.d", "same.b"]
    else:  # unnamed: each named after its structure, already apart
        assert len({t.rpartition(".")[0] for t in tasks}) == 3
    # the outer graph's checkpoints are its own super-steps only (the input, a, sub, b)
    assert len(outer.get_state_history(run.id)) == 4
    assert outer.get_state_history(run.id)[0].values["notes"] == [
        "a", "c", "e", "f", "d", "b"]
    assert outer.run({"notes": []}).counts()["ran"] == 0  # replayed whole
    # streamed with subgraphs: each update under the path of nodes that leads to it
    fresh = _nested(name, [])
    assert [(ns, list(chunk)) for ns, chunk in fresh.stream(
        {"notes": ["x"]}, mode="updates", subgraphs=True)] == [
        ((), ["a"]), (("sub",), ["c"]), (("sub", "sub"), ["e"]), (("sub", "sub"), ["f"]),
        (("sub",), ["sub"]), (("sub",), ["d"]), ((), ["sub"]), ((), ["b"])]


def test_a_subgraph_named_like_its_grandparent_is_scoped_too() -> None:
    calls: list[str] = []
    inner = StateGraph(Notes, name="top")
    inner.add_node("e", _node("e", calls)).add_edge(START, "e").add_edge("e", END)
    mid = StateGraph(Notes, name="middle")
    mid.add_node("sub", inner.compile()).add_edge(START, "sub").add_edge("sub", END)
    outer = StateGraph(Notes, name="top")
    outer.add_node("sub", mid.compile()).add_edge(START, "sub").add_edge("sub", END)
    run = outer.compile().run({"notes": []})
    assert run.result["notes"] == ["e"]
    assert "top/sub/sub.e" in {s.task for s in run.steps}
    # a subgraph with a name of its own keeps its steps' names (runs made before resume)
    other = StateGraph(Notes, name="own")
    other.add_node("e", _node("e", calls)).add_edge(START, "e").add_edge("e", END)
    parent = StateGraph(Notes, name="parent")
    parent.add_node("sub", other.compile()).add_edge(START, "sub").add_edge("sub", END)
    assert "own.e" in {s.task for s in parent.compile().run({"notes": []}).steps}


def test_the_drawing_shows_the_nesting() -> None:
    outer = _nested("same", [])
    graph = outer.get_graph()
    assert set(graph.subgraphs) == {"sub"} and set(graph.subgraphs["sub"].subgraphs) == {"sub"}
    assert graph.subgraphs["sub"].name == "same/sub"
    mermaid = outer.get_graph().to_mermaid()
    assert mermaid.splitlines()[:20] == [
        "flowchart TD",
        '    n0(["START"])',
        '    n1["a"]',
        '    n2["b"]',
        '    subgraph n3["sub"]',
        '        n3_n0(["START"])',
        '        n3_n1["c"]',
        '        n3_n2["d"]',
        '        subgraph n3_n3["sub"]',
        '            n3_n3_n0(["START"])',
        '            n3_n3_n1["e"]',
        '            n3_n3_n2["f"]',
        '            n3_n3_n3(["END"])',
        "            n3_n3_n0 --> n3_n3_n1",
        "            n3_n3_n1 --> n3_n3_n2",
        "            n3_n3_n2 --> n3_n3_n3",
        "        end",
        '        n3_n4(["END"])',
        "        n3_n0 --> n3_n1",
        "        n3_n1 --> n3_n3",
    ]
    assert "    n1 --> n3" in mermaid and "    n3 --> n2" in mermaid
    dot = outer.get_graph().to_dot()
    assert "compound=true;" in dot
    assert "  subgraph cluster_n3 {" in dot and "    subgraph cluster_n3_n3 {" in dot
    # an edge into a subgraph goes to its START, out of it from its END, clipped at its box
    assert "  n1 -> n3_n0 [lhead=cluster_n3];" in dot
    assert "  n3_n4 -> n2 [ltail=cluster_n3];" in dot
    assert "    n3_n1 -> n3_n3_n0 [lhead=cluster_n3_n3];" in dot
    assert dot.count("{") == dot.count("}")
    # a graph without subgraphs is drawn as before
    flat = StateGraph(Notes, name="flat")
    flat.add_node("a", _node("a", [])).add_edge(START, "a").add_edge("a", END)
    assert "subgraph" not in flat.compile().get_graph().to_mermaid()
    assert "compound" not in flat.compile().get_graph().to_dot()


@pytest.mark.parametrize("name", ["same", None])
def test_a_failure_inside_nested_subgraphs_resumes_exactly(name: str | None) -> None:
    calls: list[str] = []
    fail = {"f"}
    outer = _nested(name, calls, fail)
    with pytest.raises(RuntimeError, match="f failed"):
        outer.invoke({"notes": []})
    assert calls == ["a", "c", "e", "f"]
    fail.clear()
    run = outer.run({"notes": []})
    assert run.result["notes"] == ["a", "c", "e", "f", "d", "b"]
    # a, c and e finished in the failed attempt: replayed, never executed again
    assert calls == ["a", "c", "e", "f", "f", "d", "b"]
    assert run.attempt == 2


SCRIPT = """
import operator, os, sys
from typing import Annotated, TypedDict
from durably import END, START, StateGraph

class Notes(TypedDict):
    notes: Annotated[list, operator.add]

LOG = os.environ["LOG_FILE"]

def node(word):
    def fn(state):
        with open(LOG, "a") as f:
            f.write(word + "\\n")
        if os.environ.get("CRASH_AT") == word:
            os._exit(9)
        return {"notes": [word]}
    fn.__name__ = fn.__qualname__ = "node_" + word
    return fn

def graph(first, sub, last):
    g = StateGraph(Notes, name="chat")
    g.add_node(first, node(first)).add_node(last, node(last))
    if sub is None:
        g.add_edge(START, first).add_edge(first, last).add_edge(last, END)
    else:
        g.add_node("sub", sub).add_edge(START, first).add_edge(first, "sub")
        g.add_edge("sub", last).add_edge(last, END)
    return g.compile()

app = graph("a", graph("c", graph("e", None, "f"), "d"), "b")

if __name__ == "__main__":
    print(app.invoke({"notes": []})["notes"], flush=True)
"""


@pytest.mark.slow
def test_a_process_killed_inside_nested_subgraphs_resumes_exactly(tmp_path: Path) -> None:
    script = write_script(tmp_path / "nested.py", SCRIPT)
    log = tmp_path / "log.txt"
    env = script_env(tmp_path / "store", LOG_FILE=str(log))
    killed = subprocess.run([sys.executable, str(script)], env={**env, "CRASH_AT": "f"},
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert killed.returncode == 9, killed.stderr
    assert log.read_text().split() == ["a", "c", "e", "f"]
    resumed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "['a', 'c', 'e', 'f', 'd', 'b']"
    # the killed node executes again (it never finished); the nodes before it do not
    assert log.read_text().split() == ["a", "c", "e", "f", "f", "d", "b"]
