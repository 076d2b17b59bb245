"""StateGraph: building, validation, super-steps, reducers, routers, cycles, interrupts,
checkpoints, resume after a crash, drawing — on every store."""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import operator
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import durably
from durably import END, START, StateGraph
from durably.stategraph import (
    CompiledGraph,
    GraphChangedError,
    GraphValidationError,
    InvalidRouteError,
    InvalidUpdateError,
    StepLimitError,
)
from tests.conftest import script_env, write_script

pytestmark = pytest.mark.usefixtures("store")


class Notes(TypedDict):
    topic: str
    notes: Annotated[list[str], operator.add]
    draft: str


def test_validation_lists_every_problem_at_once() -> None:
    b = StateGraph(Notes, name="broken")
    b.add_node("a", lambda s: {})
    b.add_node("a", lambda s: {})  # duplicate
    b.add_node(END, lambda s: {})  # reserved
    b.add_node("orphan", lambda s: {})  # unreachable, no way out
    b.add_node("stuck", lambda s: {})  # no way out
    b.add_edge(START, "a")
    b.add_edge("a", "stuck")
    b.add_edge("a", "ghost")  # unknown
    b.add_conditional_edges("orphan", lambda s: "a", ["a", "nowhere"])  # unknown destination
    with pytest.raises(GraphValidationError) as err:
        b.compile()
    problems = "\n".join(err.value.problems)
    for text in ("'a' is added twice", "'__end__' is reserved", "unknown node 'ghost'",
                 "declares unknown destination 'nowhere'; the nodes are",
                 "'orphan' is unreachable from START",
                 "'stuck' has no way out", "END is unreachable"):
        assert text in problems, text
    assert isinstance(err.value, durably.DefinitionError)


def test_no_start_edge_and_bad_state_type() -> None:
    b = StateGraph(Notes)
    b.add_node("a", lambda s: {}).add_edge("a", END)
    with pytest.raises(GraphValidationError, match="no edge from START"):
        b.compile()
    with pytest.raises(durably.DefinitionError, match="TypedDict, a dataclass or a pydantic"):
        StateGraph(int)  # type: ignore[type-var]


def test_parallel_super_step_merges_in_node_order_through_reducers() -> None:
    order: list[str] = []

    def slow(state: Notes) -> dict[str, Any]:
        import time

        time.sleep(0.05)  # finishes last, merged first: node order, not completion order
        order.append("slow")
        return {"notes": ["slow"]}

    def fast(state: Notes) -> dict[str, Any]:
        order.append("fast")
        return {"notes": ["fast"]}

    def write(state: Notes) -> dict[str, Any]:
        return {"draft": " + ".join(state["notes"])}

    b = StateGraph(Notes, name="fan")
    b.add_node("slow", slow).add_node("fast", fast).add_node("write", write)
    b.add_edge(START, "slow").add_edge(START, "fast").add_edge(["slow", "fast"], "write")
    b.add_edge("write", END)
    final = b.compile().invoke({"topic": "t", "notes": [], "draft": ""})
    assert final == {"topic": "t", "notes": ["slow", "fast"], "draft": "slow + fast"}
    assert order == ["fast", "slow"]


def test_two_nodes_writing_one_key_without_reducer_is_an_error_naming_both() -> None:
    b = StateGraph(Notes, name="clash")
    b.add_node("x", lambda s: {"draft": "x"}).add_node("y", lambda s: {"draft": "y"})
    b.add_edge(START, "x").add_edge(START, "y").add_edge("x", END).add_edge("y", END)
    with pytest.raises(InvalidUpdateError, match="'x' and 'y' both wrote state key 'draft'"):
        b.compile().invoke({"topic": "t", "notes": [], "draft": ""})


def test_a_join_waits_for_every_source() -> None:
    class S(TypedDict):
        trail: Annotated[list[str], operator.add]

    b = StateGraph(S, name="join")
    for n in ("a", "b1", "b2", "c"):
        b.add_node(n, lambda s, n=n: {"trail": [n]})
    b.add_edge(START, "a").add_edge(START, "b1").add_edge("b1", "b2")
    b.add_edge(["a", "b2"], "c").add_edge("c", END)
    b.add_edge("a", END)
    app = b.compile()
    assert app.invoke({"trail": []})["trail"] == ["a", "b1", "b2", "c"]
    history = app.get_state_history(durably.list_runs()[0].id)
    assert [h.next for h in history][::-1] == [("a", "b1"), ("b2",), ("c",), ()]


def test_routers_fan_out_map_and_end_and_reject_undeclared_values() -> None:
    class S(TypedDict):
        kind: str
        seen: Annotated[list[str], operator.add]

    def classify(state: S) -> Any:
        return {"both": ["search", "docs"], "none": END, "bad": "nowhere"}[state["kind"]]

    b = StateGraph(S, name="route")
    b.add_node("classify", lambda s: {"seen": ["classify"]})
    b.add_node("search", lambda s: {"seen": ["search"]})
    b.add_node("docs", lambda s: {"seen": ["docs"]})
    b.add_edge(START, "classify")
    b.add_conditional_edges("classify", classify, ["search", "docs", END])
    b.add_edge("search", END).add_edge("docs", END)
    app = b.compile()
    assert app.invoke({"kind": "both", "seen": []})["seen"] == ["classify", "search", "docs"]
    assert app.invoke({"kind": "none", "seen": []})["seen"] == ["classify"]
    with pytest.raises(InvalidRouteError, match=r"'classify'.*returned 'nowhere'.*\['search'"):
        app.invoke({"kind": "bad", "seen": []})

    m = StateGraph(S, name="mapped")
    m.add_node("go", lambda s: {"seen": ["go"]})
    m.add_edge(START, "go")
    m.add_conditional_edges("go", lambda s: len(s["seen"]) > 3, {True: END, False: "go"})
    assert m.compile().invoke({"kind": "", "seen": []})["seen"] == ["go"] * 4


def test_cycles_are_bounded_and_the_counter_pattern_escalates() -> None:
    class S(TypedDict):
        revisions: int
        status: str

    def review(state: S) -> str:
        if state["revisions"] >= 2:
            return "escalate"
        return "revise"

    b = StateGraph(S, name="review_loop")
    b.add_node("revise", lambda s: {"revisions": s["revisions"] + 1})
    b.add_node("escalate", lambda s: {"status": "escalated"})
    b.add_edge(START, "revise")
    b.add_conditional_edges("revise", review, ["revise", "escalate"])
    b.add_edge("escalate", END)
    assert b.compile().invoke({"revisions": 0, "status": ""}) == {"revisions": 2,
                                                                 "status": "escalated"}
    forever = StateGraph(S, name="forever")
    forever.add_node("spin", lambda s: {"revisions": s["revisions"] + 1})
    forever.add_edge(START, "spin")
    forever.add_conditional_edges("spin", lambda s: "spin", ["spin", END])
    with pytest.raises(StepLimitError, match="max_steps=5") as err:
        forever.compile(max_steps=5).invoke({"revisions": 0, "status": ""})
    assert err.value.path == [["spin"]] * 5


def test_dataclass_and_pydantic_states() -> None:
    @dataclasses.dataclass
    class D:
        n: int
        log: Annotated[list[int], operator.add] = dataclasses.field(default_factory=list)

    b = StateGraph(D, name="dc")
    b.add_node("inc", lambda s: {"n": s.n + 1, "log": [s.n]})
    b.add_edge(START, "inc").add_edge("inc", END)
    assert b.compile().invoke(D(1)) == D(2, [1])

    class P(pydantic.BaseModel):
        n: int
        word: str = ""

    p = StateGraph(P, name="pyd")
    p.add_node("name", lambda s: P(n=s.n, word="x" * s.n))  # an instance: changed fields
    p.add_edge(START, "name").add_edge("name", END)
    assert p.compile().invoke({"n": 3}) == P(n=3, word="xxx")


def test_a_bad_update_names_the_node() -> None:
    b = StateGraph(Notes, name="bad")
    b.add_node("oops", lambda s: ["not", "a", "dict"]).add_edge(START, "oops")
    b.add_edge("oops", END)
    with pytest.raises(InvalidUpdateError, match="node 'oops'"):
        b.compile().invoke({"topic": "", "notes": [], "draft": ""})
    u = StateGraph(Notes, name="unknown_key")
    u.add_node("n", lambda s: {"nope": 1}).add_edge(START, "n").add_edge("n", END)
    with pytest.raises(InvalidUpdateError, match=r"\['nope'\]"):
        u.compile().invoke({"topic": "", "notes": [], "draft": ""})


def test_nodes_are_journaled_and_never_run_twice_in_a_run() -> None:
    calls: list[str] = []
    fail = [True]

    def research(state: Notes) -> dict[str, Any]:
        calls.append("research")
        return {"notes": [f"about {state['topic']}"]}

    def write(state: Notes) -> dict[str, Any]:
        calls.append("write")
        if fail[0]:
            raise RuntimeError("writer crashed")
        return {"draft": state["notes"][0]}

    b = StateGraph(Notes, name="journaled")
    b.add_node("research", research).add_node("write", write)
    b.add_edge(START, "research").add_edge("research", "write").add_edge("write", END)
    app = b.compile()
    state = {"topic": "owls", "notes": [], "draft": ""}
    with pytest.raises(RuntimeError, match="writer crashed"):
        app.invoke(state)
    fail[0] = False
    assert app.invoke(state)["draft"] == "about owls"
    assert calls == ["research", "write", "write"]
    # a new run executes nodes again (not cached by default)...
    calls.clear()
    app.run(state, fresh=True)
    assert calls == ["research", "write"]


def test_interrupt_in_parallel_nodes_is_collected_and_resumed() -> None:
    class S(TypedDict):
        answers: Annotated[list[str], operator.add]

    b = StateGraph(S, name="ask_two")
    b.add_node("left", lambda s: {"answers": [str(durably.interrupt("left?"))]})
    b.add_node("right", lambda s: {"answers": [str(durably.interrupt("right?"))]})
    b.add_edge(START, "left").add_edge(START, "right")
    b.add_edge("left", END).add_edge("right", END)
    app = b.compile()
    with pytest.raises(durably.RunInterrupted) as paused:
        app.invoke({"answers": []})
    left, right = paused.value.interrupts
    assert (left.payload, right.payload) == ("left?", "right?")
    snapshot = app.get_state(paused.value.run_id)
    assert snapshot.status == "interrupted" and len(snapshot.interrupts) == 2
    final = app.resume(paused.value.run_id, {left.id: "L", right.id: "R"})
    assert final["answers"] == ["L", "R"]


def test_stream_modes_state_history_and_update_state() -> None:
    class S(TypedDict):
        n: int

    b = StateGraph(S, name="counter")
    b.add_node("double", lambda s: {"n": s["n"] * 2})
    b.add_node("inc", lambda s: {"n": s["n"] + 1})
    b.add_edge(START, "double").add_edge("double", "inc").add_edge("inc", END)
    app = b.compile()
    assert list(app.stream({"n": 1})) == [{"n": 2}, {"n": 3}]
    assert list(app.stream({"n": 5}, mode="updates")) == [{"double": {"n": 10}},
                                                          {"inc": {"n": 11}}]
    kinds = {e.kind for e in app.stream({"n": 7}, mode="events")}
    assert {"run_started", "step_finished", "graph_step", "run_finished"} <= kinds
    run_id = durably.list_runs()[0].id
    history = app.get_state_history(run_id)
    assert [(h.values["n"], h.next, h.step) for h in history] == [
        (15, (), 1), (14, ("inc",), 0), (7, ("double",), -1)]
    assert app.get_state(run_id) == history[0]
    new_id = app.update_state(run_id, {"n": 100}, as_node="double")
    assert new_id != run_id
    assert app.invoke(None, run_id=new_id) == {"n": 101}
    assert app.get_state(run_id).values == {"n": 15}  # history never rewritten
    fork = app.fork(run_id, at=history[1].checkpoint_id)
    assert fork.result == {"n": 15} and fork.id != run_id


def test_a_changed_graph_is_refused_on_resume_unless_migrated() -> None:
    """A node that finished in the run changed: its checkpoints came from other code, so
    the run is refused unless migrated. A node that never finished in it (the one waiting,
    the ones after) may change: it runs with the new code, as a task would."""
    class S(TypedDict):
        text: str

    def build(prep: Any, second: Any) -> Any:
        b = StateGraph(S, name="evolving")
        b.add_node("prep", prep)
        b.add_node("ask", lambda s: {"text": s["text"] + str(durably.interrupt("ok?"))})
        b.add_node("finish", second)
        b.add_edge(START, "prep").add_edge("prep", "ask").add_edge("ask", "finish")
        b.add_edge("finish", END)
        return b.compile()

    def prep(s: S) -> S:
        return {"text": s["text"] + "."}

    old = build(prep, lambda s: {"text": s["text"] + "!"})
    run = old.run({"text": "a"})
    assert run.status == "interrupted"
    # only "finish" changed (it never ran): resumed under the new graph, no migrate=
    assert build(prep, lambda s: {"text": s["text"] + "?"}).resume(run.id, "-y") == {
        "text": "a.-y?"}

    run = old.run({"text": "b"})
    new = build(lambda s: {"text": s["text"] + ","}, lambda s: {"text": s["text"].upper()})
    with pytest.raises(GraphChangedError, match="the code of node 'prep' changed") as err:
        new.resume(run.id, "-yes")
    assert err.value.changes == ["the code of node 'finish' changed",
                                 "the code of node 'prep' changed"]
    # the migrated state is a new input for "ask": a new step, so it asks again
    with pytest.raises(durably.RunInterrupted):
        new.resume(run.id, "-yes", migrate=lambda s: {"text": s["text"] + "~"})
    assert new.resume(run.id, "-sure") == {"text": "B.~-SURE"}


def test_a_graph_fixed_after_a_node_failed_continues_without_migrate() -> None:
    """The node that failed is fixed and the run called again: it continues (no super-step
    of it finished, so no checkpoint depends on the old code), as a plain entrypoint does."""
    @dataclasses.dataclass
    class S:
        x: int = 1

    def build(first: Any) -> Any:
        b = StateGraph(S, name="fixed_after_failure")
        b.add_node("first", first).add_edge(START, "first").add_edge("first", END)
        return b.compile()

    def broken(s: S) -> dict[str, int]:
        raise ValueError("a typo")

    with pytest.raises(ValueError, match="a typo"):
        build(broken).invoke({})
    assert build(lambda s: {"x": s.x + 1}).invoke({}) == S(2)


@pytest.mark.parametrize("how", ["stream", "astream"])
def test_stream_and_astream_take_migrate_too(how: str) -> None:
    """A run checkpointed under an older graph continues under the new one through
    stream() / astream() with migrate=, as through invoke(); without it, they raise
    GraphChangedError."""
    class S(TypedDict):
        text: str

    def build(first: Any, second: Any) -> Any:
        b = StateGraph(S, name=f"evolving_{how}")
        b.add_node("first", first)
        b.add_node("second", second)
        b.add_edge(START, "first").add_edge("first", "second").add_edge("second", END)
        return b.compile()

    def fail(s: S) -> dict[str, Any]:
        raise RuntimeError("stopped after the first node")

    with pytest.raises(RuntimeError):
        build(lambda s: {"text": s["text"] + "1"}, fail).invoke({"text": "a"})
    (run,) = durably.list_runs()
    # the first node (finished in the run) edited too: its checkpoint came from other code
    new = build(lambda s: {"text": s["text"] + str(1)}, lambda s: {"text": s["text"].upper()})

    def items(**kw: Any) -> list[Any]:
        if how == "stream":
            return list(new.stream(None, run_id=run.id, **kw))

        async def consume() -> list[Any]:
            return [item async for item in new.astream(None, run_id=run.id, **kw)]
        return asyncio.run(consume())

    with pytest.raises(GraphChangedError, match="migrate="):
        items()
    # a migrate that forgets to return the state, or returns an update: refused, and the
    # run can still be migrated right
    with pytest.raises(InvalidUpdateError, match="migrate returned None"):
        items(migrate=lambda s: s.update(text="x"))
    with pytest.raises(InvalidUpdateError, match=r"lacks \['text'\]"):
        items(migrate=lambda s: {})
    got = items(migrate=lambda s: {"text": s["text"] + "~"})
    assert got[-1] == {"text": "A1~"}  # migrated before the node that had not finished
    assert durably.get_run(run.id).status == "finished"


def test_subgraph_and_async_nodes() -> None:
    class S(TypedDict):
        items: Annotated[list[str], operator.add]

    inner = StateGraph(S, name="inner")

    async def fetch(state: S) -> dict[str, Any]:
        return {"items": ["fetched"]}

    inner.add_node("fetch", fetch).add_edge(START, "fetch").add_edge("fetch", END)
    outer = StateGraph(S, name="outer")
    outer.add_node("sub", inner.compile()).add_node("after", lambda s: {"items": ["after"]})
    outer.add_edge(START, "sub").add_edge("sub", "after").add_edge("after", END)
    final = outer.compile().invoke({"items": ["start"]})
    assert final["items"][0] == "start" and final["items"][-1] == "after"
    assert "fetched" in final["items"]


def test_a_sync_invoke_inside_a_running_event_loop_runs_an_async_node() -> None:
    """``app.invoke`` from a notebook cell or a web handler (an event loop running in the
    thread): an async node runs on a loop of its own, inside the run; it raised asyncio's
    RuntimeError ("cannot be called from a running event loop") and failed the run."""
    class S(TypedDict):
        n: int

    async def bump(state: S) -> dict[str, Any]:
        await asyncio.sleep(0)
        seen.append(state["n"])
        return {"n": state["n"] + 1}

    seen: list[Any] = []
    g = StateGraph(S, name="in_loop")
    g.add_node("bump", bump).add_edge(START, "bump").add_edge("bump", END)
    app = g.compile()

    async def handler() -> Any:
        return app.invoke({"n": 0}, run_id="in-a-loop")

    assert asyncio.run(handler()) == {"n": 1}
    run = durably.get_run("in-a-loop")
    assert run.status == "finished" and len(seen) == 1
    assert [s.status for s in run.steps if s.task.endswith("bump")] == ["ran"]
    assert asyncio.run(handler()) == {"n": 1} and len(seen) == 1  # replayed, in a loop too


def _drawn() -> CompiledGraph[Any]:
    """A graph with a router whose mapping declares its outputs, and an interrupt."""
    class S(TypedDict):
        n: int

    b = StateGraph(S, name="drawn")
    b.add_node("work", lambda s: {"n": s["n"] + 1})
    b.add_node("ask", lambda s: {"n": int(durably.interrupt("more?"))})
    b.add_edge(START, "work")
    b.add_conditional_edges("work", lambda s: "ask" if s["n"] > 1 else "work",
                            {"ask": "ask", "again": "work"})
    b.add_edge("ask", END)
    return b.compile()


def test_drawing_declared_structure_and_run_overlay() -> None:
    app = _drawn()
    text = app.get_graph().to_mermaid()
    assert 'n1 -.->|"ask"| n2' in text and 'n1 -.->|"again"| n1' in text
    assert "n0 --> n1" in text and "n2 --> n3" in text
    dot = app.get_graph().to_dot()
    assert 'style=dashed, label="again"' in dot
    with pytest.raises(InvalidRouteError):  # "work" is not a declared output of the mapping
        app.invoke({"n": 0})
    run = app.run({"n": 5})
    assert run.status == "interrupted"
    overlay = app.get_graph(run.id)
    assert overlay.visits == {"work": 1} and overlay.stopped_at == ("ask",)
    assert "class n2 stopped" in overlay.to_mermaid()


def test_the_declared_structure_draws_as_svg(require_dot: str) -> None:
    svg = _drawn().get_graph().to_svg()
    assert svg.rstrip().endswith("</svg>")
    assert svg.count('class="node"') == 4 and ">work<" in svg and ">ask<" in svg


def test_a_killed_graph_run_resumes_at_its_super_step(tmp_path: Path) -> None:
    script = write_script(tmp_path / "graph_job.py", """
        import operator, os, signal, sys
        from typing import Annotated, TypedDict
        from durably import StateGraph, START, END

        class S(TypedDict):
            done: Annotated[list[str], operator.add]

        def node(name):
            def run(state):
                with open(os.environ["LOG"], "a") as log:
                    log.write(name + "\\n")
                if name == os.environ.get("KILL_AT"):
                    os.kill(os.getpid(), signal.SIGKILL)
                return {"done": [name]}
            return run

        b = StateGraph(S, name="job")
        for n in ("a", "b", "c", "d"):
            b.add_node(n, node(n))
        b.add_edge(START, "a").add_edge("a", "b").add_edge("a", "c")
        b.add_edge(["b", "c"], "d").add_edge("d", END)
        app = b.compile()
        if __name__ == "__main__":
            print(app.invoke({"done": []})["done"])
    """)
    log = tmp_path / "log.txt"
    env = script_env(tmp_path / "store", LOG=str(log), KILL_AT="d")
    killed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL
    env.pop("KILL_AT")
    again = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "['a', 'b', 'c', 'd']"
    lines = log.read_text().split()
    assert sorted(lines[:3]) == ["a", "b", "c"] and lines[3:] == ["d", "d"]  # only d again


# -- found by a new user trying to break it --------------------------------------------------
class Log(TypedDict):
    log: Annotated[list[str], operator.add]
    count: int


def _one(name: str, node: Any, graph: str) -> Any:
    b = StateGraph(Log, name=graph)
    b.add_node(name, node).add_edge(START, name).add_edge(name, END)
    return b.compile()


def test_a_subgraph_writes_what_its_nodes_wrote_not_its_whole_state() -> None:
    sub = _one("i1", lambda s: {"log": ["i1"]}, "inner")
    b = StateGraph(Log, name="outer")
    b.add_node("pre", lambda s: {"log": ["pre"]}).add_node("sub", sub)
    b.add_edge(START, "pre").add_edge("pre", "sub").add_edge("sub", END)
    assert b.compile().invoke({"log": ["seed"], "count": 0})["log"] == ["seed", "pre", "i1"]
    par = StateGraph(Log, name="outer_par")
    par.add_node("counter", lambda s: {"count": 1}).add_node("sub", sub)
    par.add_edge(START, "counter").add_edge(START, "sub").add_edge(["counter", "sub"], END)
    assert par.compile().invoke({"log": [], "count": 0}) == {"log": ["i1"], "count": 1}


def test_instances_write_only_what_they_set_or_changed() -> None:
    class PS(pydantic.BaseModel):
        topic: str = ""
        notes: Annotated[list[str], operator.add] = []
        score: int = 0

    g = StateGraph(PS, name="pyd_writer")
    g.add_node("w", lambda s: PS(notes=["from writer"])).add_edge(START, "w").add_edge("w", END)
    assert g.compile().invoke(PS(topic="owls", notes=["seed"], score=3)) == PS(
        topic="owls", notes=["seed", "from writer"], score=3)

    def bump(s: PS) -> PS:
        s.score += 1
        return s

    h = StateGraph(PS, name="pyd_bump")
    h.add_node("bump", bump).add_edge(START, "bump").add_edge("bump", END)
    assert h.compile().invoke(PS(topic="owls", notes=["seed"], score=3)) == PS(
        topic="owls", notes=["seed"], score=4)


def test_nodes_get_their_own_copy_of_the_state() -> None:
    seen: list[list[str]] = []

    def mutate(s: Log) -> dict[str, Any]:
        s["log"].append("MUTATED")
        return {}

    def look(s: Log) -> dict[str, Any]:
        import time

        time.sleep(0.05)
        seen.append(list(s["log"]))
        return {}

    b = StateGraph(Log, name="copies")
    b.add_node("mutate", mutate).add_node("look", look)
    b.add_edge(START, "mutate").add_edge(START, "look").add_edge(["mutate", "look"], END)
    initial: Log = {"log": ["x"], "count": 0}
    assert b.compile().invoke(initial)["log"] == ["x"]
    assert seen == [["x"]] and initial["log"] == ["x"]


class Chat(TypedDict):
    messages: Annotated[list[Any], operator.add]
    n: int


@pytest.mark.parametrize("picklable", [True, False])
def test_nodes_get_their_own_copy_at_every_super_step(picklable: bool) -> None:
    """At every super-step (the state picklable or not: a lambda in it), two nodes that
    mutate their message dicts in place, in parallel, never see each other's changes or
    leak them."""
    seen: list[tuple[str, int, list[Any]]] = []
    helper = (lambda: 1) if not picklable else None

    def writer(s: Chat) -> dict[str, Any]:
        for m in s["messages"]:
            m["seen_by"] = "writer"  # in place, on every message
        s["messages"].append({"role": "junk"})
        seen.append(("writer", s["n"], [dict(m) for m in s["messages"]]))
        return {"messages": [{"role": "ai", "k": s["n"], "f": helper}], "n": s["n"] + 1}

    def reader(s: Chat) -> dict[str, Any]:
        time.sleep(0.02)  # (after the writer's changes, were they shared)
        seen.append(("reader", s["n"], [dict(m) for m in s["messages"]]))
        return {}

    b = StateGraph(Chat, name=f"own_copies_{picklable}")
    b.add_node("writer", writer).add_node("reader", reader)
    b.add_edge(START, "writer").add_edge(START, "reader")
    b.add_edge(["writer", "reader"], "join").add_node("join", lambda s: {})
    b.add_conditional_edges("join", lambda s: END if s["n"] >= 4 else "fan", ["fan", END])
    b.add_node("fan", lambda s: {}).add_edge("fan", "writer").add_edge("fan", "reader")
    final = b.compile().invoke({"messages": [{"role": "user"}], "n": 0})
    expected = [{"role": "user"}] + [{"role": "ai", "k": k, "f": helper} for k in range(4)]
    assert final["messages"] == expected and final["n"] == 4
    assert len(seen) == 8
    for who, n, messages in seen:
        before = [{"role": "user"}] + [{"role": "ai", "k": k, "f": helper} for k in range(n)]
        if who == "reader":
            assert messages == before
        else:
            assert messages == [{**m, "seen_by": "writer"} for m in before] + [{"role": "junk"}]


@dataclasses.dataclass
class Scores:
    scores: Annotated[list[float], operator.add]
    n: int = 0


def test_a_node_returning_its_state_object_writes_only_what_it_changed_nan_included() -> None:
    """A node's copy keeps the state's own objects where deepcopy does (a NaN float): a field
    it did not change is not written again, so a reduced list holding NaN is not doubled."""
    import math

    def step(s: Scores) -> Scores:
        s.n += 1  # only n changes
        return s

    b = StateGraph(Scores, name="nan_scores")
    b.add_node("step", step).add_edge(START, "step")
    b.add_conditional_edges("step", lambda s: END if s.n >= 3 else "step", ["step", END])
    out = b.compile().invoke({"scores": [1.0, math.nan]})
    assert out.n == 3 and len(out.scores) == 2 and math.isnan(out.scores[1])


class _Keep:
    """An object whose deepcopy is itself (a shared config, a sentinel)."""

    def __deepcopy__(self, memo: Any) -> _Keep:
        return self


_KEEP = _Keep()
_atoms = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
          | st.text(max_size=5) | st.binary(max_size=3) | st.just(_KEEP))


def _shape(value: Any, copied: Any, seen: dict[int, int]) -> list[Any]:
    """The copy's shape against its original: the types, where an atomic value is the same
    object, and which containers of the copy are one object (aliasing, by first visit)."""
    t = type(value)
    out: list[Any] = [t.__name__, type(copied).__name__]
    if t in (dict, list, tuple, set, frozenset, collections.defaultdict):
        out.append(seen.setdefault(id(copied), len(seen)))
        if id(copied) in seen and seen[id(copied)] != len(seen) - 1:
            return out  # met before: its contents were compared then
        if isinstance(value, dict):  # (keys and values: never their pairs, new tuples)
            pairs = zip([*value, *value.values()], [*copied, *copied.values()], strict=True)
        else:
            pairs = zip(value, copied, strict=True)
        for a, b in pairs:
            out.append(_shape(a, b, seen))
        return out
    out.append(copied is value)
    return out


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_a_node_s_copy_is_deepcopy_s_copy(data: st.DataObject) -> None:
    """superstep._deepcopy gives what copy.deepcopy gives: equal values, atomic values the
    same objects, new containers, shared containers shared (through tuples, subclasses and
    objects copied by deepcopy too), objects whose __deepcopy__ returns themselves kept."""
    from durably._graph.superstep import _deepcopy

    pool: list[Any] = []

    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return (st.lists(inner, max_size=4)
                | st.dictionaries(st.text(max_size=3) | st.integers(), inner, max_size=4)
                | st.lists(inner, max_size=3).map(tuple)
                | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(
                    lambda d: collections.defaultdict(list, d)))

    value = data.draw(st.recursive(_atoms, extend, max_leaves=25))
    shared = data.draw(st.recursive(_atoms, extend, max_leaves=5))
    pool.append(shared)
    state = {"a": value, "b": [shared, (shared, 1)], "c": {"again": shared}, "d": pool}
    ours, theirs = _deepcopy(state), copy.deepcopy(state)
    assert _shape(state, ours, {}) == _shape(state, theirs, {})
    assert ours == theirs or repr(ours) == repr(theirs)  # (NaN is never equal to itself)


def test_a_node_s_copy_of_a_pydantic_state_is_deepcopy_s_copy() -> None:
    """A pydantic model (a state, a message in it) is copied as copy.deepcopy copies it (its
    __dict__ by the fast path): equal, independent, with its private attributes, extra
    fields and set fields; a model with its own __deepcopy__ keeps it."""
    from durably._graph.superstep import _deepcopy

    class Message(pydantic.BaseModel):
        role: str
        content: list[dict[str, Any]]

    class State(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")
        messages: list[Message] = []
        n: int = 0
        _seen: set[str] = pydantic.PrivateAttr(default_factory=set)

    class Pinned(pydantic.BaseModel):
        n: int = 0

        def __deepcopy__(self, memo: Any = None) -> Pinned:
            return self

    state = State(messages=[Message(role="user", content=[{"t": "hi"}])], note="x")
    state._seen.add("a")
    pinned = Pinned()
    for value in (state, {"s": state, "again": state, "p": pinned}):
        ours, theirs = _deepcopy(value), copy.deepcopy(value)
        assert ours == theirs
    ours = _deepcopy({"s": state, "again": state, "p": pinned})
    assert ours["s"] is ours["again"] is not state and ours["p"] is pinned
    copied = ours["s"]
    assert copied.model_fields_set == state.model_fields_set == {"messages", "note"}
    assert copied._seen == {"a"} and copied._seen is not state._seen
    assert copied.model_extra == {"note": "x"}
    copied.messages[0].content[0]["t"] = "changed"
    copied.messages.append(Message(role="ai", content=[]))
    assert state.messages == [Message(role="user", content=[{"t": "hi"}])]


def test_node_names_never_collide_with_internal_steps() -> None:
    app = _one("superstep", lambda s: {"log": ["x"]}, "named")
    app.invoke({"log": [], "count": 0})
    run_id = durably.list_runs()[0].id
    assert app.get_state(run_id).values["log"] == ["x"]
    assert app.get_graph(run_id).visits == {"superstep": 1}


def test_validation_of_joins_names_and_state_types() -> None:
    b = StateGraph(Log, name="same")
    b.add_node("a", lambda s: {}).add_node("sub", _one("i", lambda s: {}, "same"))
    b.add_node("c", lambda s: {})
    b.add_edge(START, "a").add_edge("a", "sub").add_edge([START, "a"], "c")
    b.add_edge("sub", END).add_edge("c", END).add_edge(START, 3)  # type: ignore[arg-type]
    with pytest.raises(GraphValidationError) as err:
        b.compile()
    text = "\n".join(err.value.problems)
    assert "START cannot be part of a join" in text
    assert "graph name" not in text  # (a subgraph named like its parent is scoped: allowed)
    assert "node names are strings" in text
    with pytest.raises(durably.DefinitionError, match="TypedDict"):
        StateGraph(dict)


def test_update_state_as_one_of_several_pending_nodes_keeps_the_others() -> None:
    def b_node(s: Log) -> dict[str, Any]:
        return {"log": [f"b={durably.interrupt('b?')}"]}

    g = StateGraph(Log, name="pending")
    g.add_node("pre", lambda s: {"log": ["pre"]}).add_node("a", lambda s: {"log": ["a"]})
    g.add_node("b", b_node).add_node("c", lambda s: {"log": ["c"]})
    g.add_edge(START, "pre").add_edge("pre", "a").add_edge("pre", "b")
    g.add_edge(["a", "b"], "c").add_edge("c", END)
    app = g.compile()
    run = app.run({"log": [], "count": 0})
    assert app.get_state(run.id).next == ("a", "b")
    new = app.update_state(run.id, {"log": ["human"]}, as_node="b")
    assert app.get_state(new).next == ("a",)
    assert app.invoke(None, run_id=new)["log"] == ["pre", "human", "a", "c"]


def test_update_state_before_the_first_super_step_finished() -> None:
    def review(s: Log) -> dict[str, Any]:
        return {"log": [f"review={durably.interrupt('ok?')}"]}

    g = StateGraph(Log, name="first_review")
    g.add_node("review", review).add_node("after", lambda s: {"log": ["after"]})
    g.add_edge(START, "review").add_edge("review", "after").add_edge("after", END)
    app = g.compile()
    run = app.run({"log": [], "count": 0})
    new = app.update_state(run.id, {"log": ["reviewed by hand"]}, as_node="review")
    assert app.invoke(None, run_id=new)["log"] == ["reviewed by hand", "after"]


def test_runs_of_other_graphs_and_missing_runs_are_refused() -> None:
    a = _one("a", lambda s: {"log": ["a"]}, "graph_a")
    b = _one("b", lambda s: {"log": ["b"]}, "graph_b")
    a.invoke({"log": [], "count": 0})
    run_id = durably.list_runs()[0].id
    for call in (lambda: b.get_state(run_id), lambda: b.get_graph(run_id),
                 lambda: b.update_state(run_id, {"count": 1}),
                 lambda: b.invoke(None, run_id=run_id)):
        with pytest.raises(durably.RunStateError, match="belongs to"):
            call()
    with pytest.raises(durably.NotFoundError):
        a.invoke(None, run_id="no-such-run")
    with pytest.raises(durably.DefinitionError, match="needs run_id"):
        a.invoke(None)


def _pre_then_ask(name: str) -> Any:
    """START -> pre -> ask (asks '?') -> END."""
    def ask(s: Log) -> dict[str, Any]:
        return {"log": [f"ask={durably.interrupt('?')}"]}

    g = StateGraph(Log, name=name)
    g.add_node("pre", lambda s: {"log": ["pre"]}).add_node("ask", ask)
    g.add_edge(START, "pre").add_edge("pre", "ask").add_edge("ask", END)
    return g.compile()


def test_stream_ends_with_the_interrupt_and_replays_finished_super_steps() -> None:
    app = _pre_then_ask("streamed")
    chunks = list(app.stream({"log": [], "count": 0}, mode="updates"))
    assert chunks[0] == {"pre": {"log": ["pre"]}}
    assert [i.payload for i in chunks[1]["__interrupt__"]] == ["?"]
    again = list(app.stream({"log": [], "count": 0}, mode="updates"))
    assert again[0] == {"pre": {"log": ["pre"]}} and "__interrupt__" in again[1]


def test_async_api_invokes_resumes_and_streams_while_the_loop_keeps_serving() -> None:
    """ainvoke / aresume / astream: the run executes in a worker thread, so the event loop
    that awaits it keeps running other tasks meanwhile."""
    release = threading.Event()

    def slow(s: Log) -> dict[str, Any]:
        if not release.wait(10):  # set by a coroutine of the caller's loop
            raise TimeoutError("the event loop was blocked")
        return {"log": ["slow"]}

    def ask(s: Log) -> dict[str, Any]:
        return {"log": [f"ask={durably.interrupt('?')}"]}

    g = StateGraph(Log, name="awaited")
    g.add_node("slow", slow).add_node("ask", ask)
    g.add_edge(START, "slow").add_edge("slow", "ask").add_edge("ask", END)
    app = g.compile()

    async def main() -> tuple[Any, ...]:
        async def unblock() -> None:
            await asyncio.sleep(0.05)
            release.set()

        helper = asyncio.create_task(unblock())
        with pytest.raises(durably.RunInterrupted) as paused:
            await app.ainvoke({"log": [], "count": 0})
        await helper
        final = await app.aresume(paused.value.run_id, "yes")
        chunks = [c async for c in app.astream({"log": ["b"], "count": 0}, mode="updates")]
        return paused.value.run_id, final, chunks

    run_id, final, chunks = asyncio.run(main())
    assert final["log"] == ["slow", "ask=yes"]
    assert app.get_state(run_id).status == "finished"
    assert chunks[0] == {"slow": {"log": ["slow"]}} and "__interrupt__" in chunks[1]


def test_leaving_astream_early_stops_the_run_resumably() -> None:
    calls: list[str] = []

    def step(name: str) -> Any:
        def node(s: Log) -> dict[str, Any]:
            calls.append(name)
            return {"log": [name]}
        return node

    g = StateGraph(Log, name="left_early")
    g.add_node("a", step("a")).add_node("b", step("b")).add_node("c", step("c"))
    g.add_edge(START, "a").add_edge("a", "b").add_edge("b", "c").add_edge("c", END)
    app = g.compile()

    async def first_only() -> Any:
        stream = app.astream({"log": [], "count": 0})
        async for values in stream:
            await stream.aclose()  # the consumer went away after the first super-step
            return values
        return None

    assert asyncio.run(first_only())["log"] == ["a"]
    (run,) = durably.list_runs()
    assert run.status == "stopped" and calls == ["a"]
    assert app.invoke({"log": [], "count": 0})["log"] == ["a", "b", "c"]
    assert calls == ["a", "b", "c"]  # the finished super-step replayed, not executed


@pytest.mark.parametrize("how", ["ainvoke", "astream"])
def test_cancelling_an_async_call_stops_the_run_resumably(how: str) -> None:
    """A timeout around ainvoke / astream while a node runs: the run stops at its next step
    boundary (it does not run on to the end), the timeout propagates, and the run resumes
    without executing its finished nodes again."""
    calls: list[str] = []
    started = threading.Event()  # node "a" runs: cancelling now stops the run mid-node

    def step(name: str, seconds: float) -> Any:
        def node(s: Log) -> dict[str, Any]:
            calls.append(name)
            started.set()
            time.sleep(seconds)
            return {"log": [name]}
        return node

    g = StateGraph(Log, name=f"cancelled_{how}")
    g.add_node("a", step("a", 0.6)).add_node("b", step("b", 0)).add_node("c", step("c", 0))
    g.add_edge(START, "a").add_edge("a", "b").add_edge("b", "c").add_edge("c", END)
    app = g.compile()
    state = {"log": [], "count": 0}

    async def consume() -> None:
        if how == "ainvoke":
            await app.ainvoke(state)
        else:
            async for _ in app.astream(state):
                pass

    async def main() -> None:
        call = asyncio.ensure_future(consume())
        # (a timer from the call's start raced the run's thread: wait for node "a" itself)
        assert await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call, 0.05)  # while node "a" sleeps on

    asyncio.run(main())
    (run,) = durably.list_runs()
    assert run.status == "stopped" and calls == ["a"]  # "b" and "c" never started
    assert app.invoke(state)["log"] == ["a", "b", "c"]
    assert calls == ["a", "b", "c"]  # "a" finished before the stop: replayed


def test_fresh_runs_after_an_edit_instead_of_a_graph_changed_error() -> None:
    first = _one("n", lambda s: {"log": ["v1"]}, "edited")
    first.invoke({"log": [], "count": 0})
    second = _one("n", lambda s: {"log": ["v2"]}, "edited")
    with pytest.raises(GraphChangedError, match="fresh=True"):
        second.invoke({"log": [], "count": 0})
    assert second.invoke({"log": [], "count": 0}, fresh=True)["log"] == ["v2"]


def _nested_graphs(ask: bool = False) -> Any:
    """outer: pre → (sub ∥ side) → END; sub: s1 → deep → s2; deep: d1 (asks, if ``ask``)."""
    def d1(s: Log) -> dict[str, Any]:
        said = durably.interrupt("ok?") if ask else "-"
        return {"log": [f"d1{said}"], "count": s["count"] + 100}

    deep = _one("d1", d1, "deep")
    sub = StateGraph(Log, name="sub_g")
    sub.add_node("s1", lambda s: {"log": ["s1"], "count": s["count"] + 1})
    sub.add_node("deep", deep).add_node("s2", lambda s: {"log": ["s2"], "count": 7})
    sub.add_edge(START, "s1").add_edge("s1", "deep").add_edge("deep", "s2")
    sub.add_edge("s2", END)
    outer = StateGraph(Log, name="outer_g")
    outer.add_node("pre", lambda s: {"log": ["pre"]}).add_node("sub", sub.compile())
    outer.add_node("side", lambda s: {"log": ["side"]})
    outer.add_edge(START, "pre").add_edge("pre", "sub").add_edge("pre", "side")
    outer.add_edge(["sub", "side"], END)
    return outer.compile()


def test_updates_of_a_subgraph_node_show_every_write_through_the_reducers() -> None:
    items = list(_nested_graphs().stream({"log": [], "count": 0}, mode="updates"))
    # the reducer key shows all three writes of the subgraph, in order (it showed only the
    # last, ["s2"]); a key without a reducer shows the last write
    assert items == [{"pre": {"log": ["pre"]}},
                     {"sub": {"log": ["s1", "d1-", "s2"], "count": 7},
                      "side": {"log": ["side"]}}]


def test_stream_with_subgraphs_yields_each_level_under_its_namespace() -> None:
    app = _nested_graphs()
    items = list(app.stream({"log": [], "count": 0}, mode="updates", subgraphs=True))
    assert items == [
        ((), {"pre": {"log": ["pre"]}}),
        (("sub",), {"s1": {"log": ["s1"], "count": 1}}),
        (("sub", "deep"), {"d1": {"log": ["d1-"], "count": 101}}),
        (("sub",), {"deep": {"log": ["d1-"], "count": 101}}),
        (("sub",), {"s2": {"log": ["s2"], "count": 7}}),
        ((), {"sub": {"log": ["s1", "d1-", "s2"], "count": 7}, "side": {"log": ["side"]}}),
    ]
    values = list(app.stream({"log": ["v"], "count": 0}, subgraphs=True))
    assert [ns for ns, _ in values] == [(), ("sub",), ("sub", "deep"), ("sub",), ("sub",), ()]
    # a subgraph's items are its own state: what its nodes wrote on the state it was given
    assert values[2][1] == {"log": ["v", "pre", "s1", "d1-"], "count": 101}
    assert values[-1][1] == {"log": ["v", "pre", "s1", "d1-", "s2", "side"], "count": 7}
    # without subgraphs=True the same run shows only the top graph, as before
    assert list(app.stream({"log": ["v"], "count": 0})) == [v for ns, v in values if not ns]

    async def collect() -> list[Any]:
        return [item async for item in app.astream({"log": [], "count": 0}, mode="updates",
                                                   subgraphs=True, fresh=True)]

    assert asyncio.run(collect()) == items
    with pytest.raises(durably.DefinitionError, match="subgraphs"):
        next(app.stream({"log": [], "count": 0}, subgraphs="yes"))  # type: ignore[arg-type]


def test_stream_with_subgraphs_ends_with_the_interrupt_and_resumes_inside() -> None:
    app = _nested_graphs(ask=True)
    start = {"log": [], "count": 0}
    first = list(app.stream(start, mode="updates", subgraphs=True))
    assert [ns for ns, _ in first] == [(), ("sub",), ()]
    assert first[1] == (("sub",), {"s1": {"log": ["s1"], "count": 1}})
    assert [i.payload for i in first[-1][1]["__interrupt__"]] == ["ok?"]
    # streamed again before the answer: the parent's finished super-step and the
    # subgraph's are replayed from the journal and yielded again, then the same interrupt
    again = list(app.stream(start, mode="updates", subgraphs=True))
    assert again[:2] == first[:2] and "__interrupt__" in again[-1][1]
    run = app.run(start)
    assert run.status == "interrupted"
    final = app.resume(run.id, "yes")
    assert final == {"log": ["pre", "s1", "d1yes", "s2", "side"], "count": 7}


def _agent_loop(name: str, steps: int, reducer_calls: list[int], ask_at: int | None = None,
                think: Any = None) -> Any:
    """A loop of one node, ``steps`` super-steps, appending a message each time (through a
    reducer that counts its calls); with ``ask_at``, it interrupts at that count."""
    def add(a: list[str], b: list[str]) -> list[str]:
        reducer_calls[0] += 1
        return a + b

    class Chat(TypedDict):
        messages: Annotated[list[str], add]
        n: int

    def default_think(s: Chat) -> dict[str, Any]:
        said = durably.interrupt("go on?") if s["n"] == ask_at else ""
        return {"messages": [f"m{s['n']}{said}"], "n": s["n"] + 1}

    g = StateGraph(Chat, name=name)
    g.add_node("think", think or default_think)
    g.add_conditional_edges("think", lambda s: END if s["n"] >= steps else "think",
                            ["think", END])
    g.add_edge(START, "think")
    return g.compile(max_steps=10_000)


def test_super_steps_journal_their_updates_and_a_whole_state_every_64(store: Any) -> None:
    calls = [0]
    app = _agent_loop("chatty", 150, calls)
    values = list(app.stream({"messages": [], "n": 0}))
    final = {"messages": [f"m{i}" for i in range(150)], "n": 150}
    assert values[-1] == final
    assert calls[0] == 150  # each update applied once: the executed loop reuses the state
    run = app.run({"messages": [], "n": 0})
    name = app._superstep.spec.name
    results = [durably._keys.serde.loads(store.find_step(run.id, s.step_id))
               for s in store.list_steps(run.id) if s.task == name and s.status == "ran"]
    assert [i for i, r in enumerate(results) if "blob" in r] == [0, 64, 128]
    assert all(r["updates"] == {"think": {"messages": [f"m{i}"], "n": i + 1}}
               and r["index"] == i for i, r in enumerate(results))
    # the others keep where the pickled state differs from the one before: the new message
    # and n, a few bytes, however long the conversation
    assert all("blob" not in r and len(r["delta"][2]) < 40
               for i, r in enumerate(results) if i % 64)
    # replayed (a second call), the history and get_state rebuild every checkpoint
    calls[0] = 0
    assert app.invoke({"messages": [], "n": 0}) == final
    history = app.get_state_history(run.id)
    assert [h.values for h in reversed(history[:-1])] == values
    assert app.get_state(run.id).values == final and history[0].next == ()
    assert history[100].values == values[49] and history[100].next == ("think",)


def test_a_resume_rebuilds_the_state_from_updates_and_forks_from_a_rebuilt_one() -> None:
    calls = [0]
    app = _agent_loop("asking", 100, calls, ask_at=70)
    run = app.run({"messages": [], "n": 0})
    assert run.status == "interrupted"
    assert app.get_state(run.id).values["n"] == 70
    final = app.resume(run.id, "!")
    assert final["messages"] == [f"m{i}" for i in range(70)] + ["m70!"] + [
        f"m{i}" for i in range(71, 100)]
    # a fork at a checkpoint journaled as updates only (super-step 66, state after it: 67)
    checkpoint = app.get_state_history(run.id)[-68]
    assert checkpoint.values["n"] == 67 and checkpoint.values["messages"][-1] == "m66"
    forked = app.update_state(run.id, {"messages": ["human"]})  # at the latest
    assert app.get_state(forked).values["messages"][-1] == "human"
    # a migration lands on a state rebuilt from updates
    seen: list[int] = []

    def migrate(s: Any) -> Any:
        seen.append(s["n"])
        return {**s, "messages": [*s["messages"], "migrated"]}

    again = _agent_loop("asking", 100, calls, ask_at=80)  # other code: node "think" changed
    run2 = app.run({"messages": ["b"], "n": 0})
    assert run2.status == "interrupted" and app.get_state(run2.id).values["n"] == 70
    with pytest.raises(durably.RunInterrupted):
        again.resume(run2.id, "?", migrate=migrate)  # n=80 asks again in the new code
    assert seen == [70]
    state = again.get_state(run2.id).values
    assert state["n"] == 80 and state["messages"][:2] == ["b", "m0"]
    assert state["messages"][70:72] == ["m69", "migrated"]


def test_watching_a_graph_never_changes_what_it_does() -> None:
    """Found by a review of stream(subgraphs=True): a graph streamed inside a node is its own
    top level; a reducer that extends in place is shown on copies; a subgraph state its type
    refuses between two nodes is shown as a dict; 80 subgraphs waiting to emit let go."""
    research = _one("look", lambda s: {"log": ["looked"]}, "research_g")

    def call(s: Log) -> dict[str, Any]:
        return {"log": [repr(item) for item in research.stream(
            {"log": [], "count": s["count"]}, mode="updates", subgraphs=True)]}

    calling = _one("call", call, "calling_g")
    own = repr(((), {"look": {"log": ["looked"]}}))
    assert calling.invoke({"log": [], "count": 1})["log"] == [own]
    assert list(calling.stream({"log": [], "count": 2}))[-1]["log"] == [own]

    def extend(current: list[str], new: list[str]) -> list[str]:
        current.extend(new)  # (in place: what the docs ask reducers not to do)
        return current

    class Ext(TypedDict):
        log: Annotated[list[str], extend]

    deep = StateGraph(Ext, name="ext_deep")
    deep.add_node("a", lambda s: {"log": ["a"]}).add_node("b", lambda s: {"log": ["b"]})
    deep.add_edge(START, "a").add_edge("a", "b").add_edge("b", END)
    mid = StateGraph(Ext, name="ext_mid")
    mid.add_node("deep", deep.compile()).add_edge(START, "deep").add_edge("deep", END)
    top = StateGraph(Ext, name="ext_top")
    top.add_node("mid", mid.compile()).add_edge(START, "mid").add_edge("mid", END)
    app = top.compile()
    assert app.invoke({"log": ["x"]}) == {"log": ["x", "a", "b"]}
    assert list(app.stream({"log": ["y"]}))[-1] == {"log": ["y", "a", "b"]}

    class Outer(pydantic.BaseModel):
        log: Annotated[list[str], operator.add] = []

    class Inner(pydantic.BaseModel):
        log: Annotated[list[str], operator.add] = []
        status: str = "pending"

        @pydantic.field_validator("status")
        @classmethod
        def known(cls, v: str) -> str:
            if v not in ("pending", "done"):
                raise ValueError(f"unknown status {v!r}")
            return v

    strict = StateGraph(Inner, name="strict_inner")
    strict.add_node("finish", lambda s: {"log": ["finish"], "status": "finished"})
    strict.add_edge(START, "finish").add_edge("finish", END)
    host = StateGraph(Outer, name="strict_outer")
    host.add_node("s", strict.compile()).add_edge(START, "s").add_edge("s", END)
    happ = host.compile()
    assert happ.invoke(Outer(), fresh=True).log == ["finish"]
    items = list(happ.stream(Outer(), mode="updates", fresh=True, subgraphs=True))
    assert items[0] == (("s",), {"finish": {"log": ["finish"], "status": "finished"}})
    assert items[-1] == ((), {"s": {"log": ["finish"]}})

    wait = threading.Event()

    def slow(s: Log) -> dict[str, Any]:
        wait.wait(0.5)
        return {"log": ["a"]}

    many = StateGraph(Log, name="many_outer")
    names = [f"n{i}" for i in range(80)]
    for i, n in enumerate(names):
        inner = StateGraph(Log, name=f"many_inner{i}")
        inner.add_node("a", slow).add_node("b", lambda s: {"log": ["b"]})
        inner.add_edge(START, "a").add_edge("a", "b").add_edge("b", END)
        many.add_node(n, inner.compile()).add_edge(START, n)
    many.add_edge(names, END)
    left: list[str] = []

    def consume() -> None:
        stream = many.compile().stream({"log": [], "count": 0}, mode="updates",
                                       subgraphs=True, run_id="many")
        for _ in stream:
            time.sleep(1.0)  # every other subgraph is waiting to emit meanwhile
            break
        stream.close()
        left.append(durably.get_run("many").status)

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    consumer.join(60)
    assert left == ["stopped"]  # (it hung: only 64 waiting threads were let go)


def test_checkpoints_rebuild_without_running_reducers_again() -> None:
    """Found by a review of the first version, which rebuilt a checkpoint by applying the
    updates through the reducers again: a reducer that gives ids (add_messages does, with
    uuid4) gave new ones at every rebuild, so deleting by id failed; one that changes its
    argument in place made every snapshot the last; a migration after a changed reducer saw
    a state that never was; a fork after a migration lost it."""
    import uuid

    def with_ids(current: list[dict[str, str]], new: list[dict[str, str]]
                 ) -> list[dict[str, str]]:
        # as add_messages does: an item without an id, the input's too, gets a new one
        merged = [m if m.get("id") else {**m, "id": uuid.uuid4().hex} for m in current]
        for item in new:
            if "remove" in item:
                merged = [m for m in merged if m["id"] != item["remove"]]
            else:
                merged.append({**item, "id": item.get("id") or uuid.uuid4().hex})
        return merged

    class Chat(TypedDict):
        messages: Annotated[list[dict[str, str]], with_ids]
        n: int

    def talk(s: Chat) -> dict[str, Any]:
        if s["n"] % 3 == 2:  # forget the oldest reply, by its id
            return {"messages": [{"remove": s["messages"][1]["id"]}], "n": s["n"] + 1}
        return {"messages": [{"text": f"reply {s['n']}"}], "n": s["n"] + 1}

    g = StateGraph(Chat, name="ids_chat")
    g.add_node("talk", talk).add_edge(START, "talk")
    g.add_conditional_edges("talk", lambda s: END if s["n"] >= 9 else "talk", ["talk", END])
    app = g.compile()
    run = app.run({"messages": [{"text": "hi"}], "n": 0})
    final = run.result
    assert [m["text"] for m in final["messages"]] == ["hi", "reply 4", "reply 6", "reply 7"]
    assert app.get_state(run.id).values == final == app.get_state(run.id).values
    assert app.invoke({"messages": [{"text": "hi"}], "n": 0}) == final  # replayed

    def extend(current: list[int], new: list[int]) -> list[int]:
        current.extend(new)  # (in place: what the docs ask reducers not to do)
        return current

    class Log2(TypedDict):
        log: Annotated[list[int], extend]
        n: int

    g2 = StateGraph(Log2, name="in_place_log")
    g2.add_node("step", lambda s: {"log": [s["n"]], "n": s["n"] + 1}).add_edge(START, "step")
    g2.add_conditional_edges("step", lambda s: END if s["n"] >= 3 else "step", ["step", END])
    app2 = g2.compile()
    run2 = app2.run({"log": [], "n": 0})
    assert [h.values["log"] for h in reversed(app2.get_state_history(run2.id))] == [
        [], [0], [0, 1], [0, 1, 2]]

    def build(sign: int) -> Any:
        def inc(s: Log) -> dict[str, Any]:
            if s["count"] == 3:
                durably.interrupt("go on?")
            return {"count": s["count"] + 1, "log": [str(s["count"] * sign)]}

        b = StateGraph(Log, name="migrated_then_forked")
        b.add_node("inc", inc).add_edge(START, "inc")
        b.add_conditional_edges("inc", lambda s: END if s["count"] >= 8 else "inc",
                                ["inc", END])
        return b.compile()

    build(1).run({"log": [], "count": 0}, run_id="mf")  # pauses at super-step 3
    v2 = build(-1)  # the node's code edited: resumed with migrate=
    with pytest.raises(durably.RunInterrupted):
        v2.resume("mf", "yes", migrate=lambda s: {**s, "log": [*s["log"], "migrated"]})
    done = v2.resume("mf", "yes")
    assert done["log"] == ["0", "1", "2", "migrated", "-3", "-4", "-5", "-6", "-7"]
    at5 = next(h for h in v2.get_state_history("mf") if h.step == 5)
    assert at5.values["log"] == ["0", "1", "2", "migrated", "-3", "-4", "-5"]
    fork = v2.fork("mf", at=at5.checkpoint_id)
    assert fork.result == done and v2.get_state(fork.id).values == done


def test_a_checkpoint_is_never_rebuilt_from_other_bytes_than_it_was_cut_from() -> None:
    """A checkpoint journaled as a splice of the previous one's bytes carries their digest:
    spliced onto other bytes (the super-step before it set aside and executed again
    differently), it is refused with CorruptJournalError instead of read as garbage."""
    from durably._graph.checkpoints import _pickled_state, _splice

    app = _one("n", lambda s: {"count": s["count"] + 1}, "spliced")
    before = _pickled_state({"log": ["a"], "count": 1})
    after = _pickled_state({"log": ["a", "b"], "count": 2})
    assert before is not None and after is not None
    import xxhash

    delta = (*_splice(before, after), xxhash.xxh3_64_intdigest(before))
    state, blob = app._state_after(before, {"index": 5, "delta": delta})
    assert state == {"log": ["a", "b"], "count": 2} and blob == after
    other = _pickled_state({"log": ["x"], "count": 1})
    with pytest.raises(durably.CorruptJournalError, match="super-step 5"):
        app._state_after(other, {"index": 5, "delta": delta})
    with pytest.raises(durably.CorruptJournalError):
        app._state_after(None, {"index": 5, "delta": delta})
    # with the state before it at hand (the loop and the history have it), its updates are
    # applied through the reducers, as when it ran
    result = {"index": 5, "delta": delta, "updates": {"n": {"log": ["b"], "count": 2}}}
    assert app._state_after(other, result, {"log": ["x"], "count": 1}) == (
        {"log": ["x", "b"], "count": 2}, None)


@settings(deadline=None, max_examples=300)
@given(st.binary(max_size=300), st.binary(max_size=300), st.binary(max_size=40),
       st.sampled_from([1, 2, 7, 1 << 16]))
def test_a_splice_rebuilds_exactly_the_bytes_it_was_cut_from(
        common: bytes, old_part: bytes, new_part: bytes, chunk: int) -> None:
    from durably._graph import checkpoints

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoints, "_CHUNK", chunk)  # the chunked compare and its bisection
        for old, new in ((common + old_part + common, common + new_part + common),
                         (old_part, new_part), (common + old_part, common),
                         (common, common + new_part), (common, common)):
            head, tail, middle = checkpoints._splice(old, new)
            assert checkpoints._spliced(old, (head, tail, middle)) == new
            assert head + tail <= min(len(old), len(new))


def test_a_journal_of_an_earlier_release_names_the_super_step_s_classes_in_stategraph() -> None:
    """Journals written before the compiled graph moved to durably._graph name what a
    super-step journals durably.stategraph.StepResult, .Writes and .Sent: read back as
    they are now."""
    import pickle

    from durably._graph.checkpoints import Sent, StepResult, Writes
    from durably._keys import serde

    result = StepResult(index=1, updates={"a": Writes([{"x": 1}]), "b": Sent([{"y": 2}])})
    old = pickle.dumps(result, protocol=0).replace(b"durably._graph.checkpoints\n",
                                                   b"durably.stategraph\n")
    assert b"durably.stategraph" in old and b"_graph" not in old
    back = serde.loads(old)
    assert type(back) is StepResult and back == result
    assert type(back["updates"]["a"]) is Writes and type(back["updates"]["b"]) is Sent


def test_a_super_step_set_aside_by_repair_executes_again_and_the_run_goes_on(
        tmp_path: Path) -> None:
    """Found by a review: the super-step after one set aside and executed again (an id-giving
    reducer gives new ids) was a splice of bytes that no longer exist, and the run could
    never resume. Its updates are applied to the state as it is now; before the resume,
    get_state says why it cannot show the latest checkpoint instead of an older one."""
    import sqlite3
    import uuid

    def with_ids(current: list[dict[str, str]], new: list[dict[str, str]]
                 ) -> list[dict[str, str]]:
        return [m if m.get("id") else {**m, "id": uuid.uuid4().hex} for m in current + new]

    class Chat(TypedDict):
        messages: Annotated[list[dict[str, str]], with_ids]
        n: int

    store = durably.DiskStore(tmp_path / "repaired")
    g = StateGraph(Chat, name="repaired_chat")
    g.add_node("talk", lambda s: {"messages": [{"text": f"r{s['n']}"}], "n": s["n"] + 1})
    g.add_edge(START, "talk")
    g.add_conditional_edges("talk", lambda s: END if s["n"] >= 20 else "talk", ["talk", END])
    app = g.compile(store=store)
    app.invoke({"messages": [{"text": "hi"}], "n": 0}, run_id="rep")
    db = sqlite3.connect(tmp_path / "repaired" / "journal.sqlite3")
    torn = [r[0] for r in db.execute(
        "SELECT step_id FROM steps WHERE run_id='rep' AND task='repaired_chat::superstep' "
        "AND status='ran' ORDER BY attempt, position")][5]
    db.execute("UPDATE steps SET result = CAST(substr(result, 1, length(result) - 3) || "
               "x'414141' AS BLOB) WHERE run_id='rep' AND step_id=?", (torn,))
    db.commit()
    db.close()
    store.repair_run("rep")
    with pytest.raises(durably.CorruptJournalError, match="super-step 19"):
        app.get_state("rep")
    assert [h.step for h in app.get_state_history("rep")][-6:] == [4, 3, 2, 1, 0, -1]
    final = app.invoke(None, run_id="rep")
    assert final["n"] == 20 and [m["text"] for m in final["messages"]] == [
        "hi", *(f"r{i}" for i in range(20))]
    latest = app.get_state("rep").values
    # (the super-steps after the repaired one are rebuilt by applying their updates again:
    # a reducer that makes up ids makes them up again, the rest is the same)
    assert [m["text"] for m in latest["messages"]] == [m["text"] for m in final["messages"]]
    assert latest["messages"][:6] == final["messages"][:6] and latest["n"] == 20
    assert [h.step for h in app.get_state_history("rep")] == list(range(19, -2, -1))
    store.close()


@dataclasses.dataclass
class _Tally:
    items: Annotated[list[str], operator.add] = dataclasses.field(default_factory=list)
    count: int = 0
    label: str = "none"


class _PTally(pydantic.BaseModel):
    items: Annotated[list[str], operator.add] = pydantic.Field(default_factory=list)
    count: int = 0


@pytest.mark.parametrize("state_type", [_Tally, _PTally])
def test_parallel_nodes_returning_their_state_object_from_an_input_without_defaults(
        state_type: Any) -> None:
    """A field left out of the input was shown to the nodes as its default: two parallel
    nodes returning their state object unchanged there do not both write it."""
    def tag(name: str) -> Callable[[Any], Any]:
        def node(s: Any) -> Any:
            s.items = [name]
            s.count = s.count  # assigned, unchanged (pydantic: a field set explicitly)
            return s
        return node

    b = StateGraph(state_type, name=f"parallel_{state_type.__name__}")
    b.add_node("a", tag("a")).add_node("b", tag("b"))
    b.add_edge(START, "a").add_edge(START, "b").add_edge("a", END).add_edge("b", END)
    app = b.compile()
    out = app.invoke({})
    assert sorted(out.items) == ["a", "b"] and out.count == 0
    # a node that does change a defaulted field still writes it
    c = StateGraph(state_type, name=f"change_{state_type.__name__}")
    c.add_node("n", lambda s: state_type(items=["x"], count=5))
    c.add_edge(START, "n").add_edge("n", END)
    assert c.compile().invoke({}).count == 5


_LIMIT_GRAPH = """
import durably
from typing import TypedDict
from durably import StateGraph, START, END

LIMIT = $V

def clip(x):
    return min(x, LIMIT)

class S(TypedDict):
    n: int

def grow(s):
    return {"n": clip(s["n"] * 10)}

def route(s):
    return "ask" if s["n"] < LIMIT * 2 else END

def ask(s):
    return {"n": s["n"] + int(durably.interrupt("more?"))}

b = StateGraph(S, name="limits")
b.add_node("ask", ask).add_node("grow", grow)
b.add_edge(START, "grow").add_conditional_edges("grow", route, ["ask", END])
b.add_edge("ask", END)
app = b.compile()
"""


def test_a_changed_graph_names_the_helper_or_constant_that_changed_in_a_node() -> None:
    """GraphChangedError names what changed inside a node's or a router's code (a module
    constant, a helper), not only the node; a change of the node's own body names the node
    alone."""
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(_LIMIT_GRAPH.replace("$V", "100"), ns)
    run = ns["app"].run({"n": 1})
    assert run.status == "interrupted"
    exec(_LIMIT_GRAPH.replace("$V", "50"), ns)
    with pytest.raises(GraphChangedError) as err:
        ns["app"].resume(run.id, "2")
    assert err.value.changes == [
        "the code of node 'grow' changed (__main__.LIMIT)",
        'the code of router ["grow", ["ask"]] changed (__main__.LIMIT)']
    exec(_LIMIT_GRAPH.replace("$V", "100").replace("s[\"n\"] * 10", "s[\"n\"] * 20"), ns)
    with pytest.raises(GraphChangedError) as err:
        ns["app"].resume(run.id, "2")
    assert err.value.changes == ["the code of node 'grow' changed"]
    exec(_LIMIT_GRAPH.replace("$V", "100"), ns)
    assert ns["app"].resume(run.id, "2") == {"n": 12}


class _PNotes(pydantic.BaseModel):
    notes: Annotated[list[str], operator.add] = []
    count: int = 0
    topic: str = ""


def test_a_pydantic_node_returning_its_state_writes_only_what_it_changed() -> None:
    """The node's copy of a state without some fields has only the others set: returning
    it (or a model_copy of it) after changing one field writes that field alone, so a
    reduced list is not appended to itself, and parallel nodes do not clash."""
    def bump(s: _PNotes) -> _PNotes:
        s.count += 1
        return s

    b = StateGraph(_PNotes, name="pyd_bump")
    b.add_node("bump", bump).add_edge(START, "bump").add_edge("bump", END)
    assert b.compile().invoke({"notes": ["start"]}) == _PNotes(notes=["start"], count=1)
    c = StateGraph(_PNotes, name="pyd_copy")
    c.add_node("copy", lambda s: s.model_copy(update={"count": s.count + 1}))
    c.add_edge(START, "copy").add_edge("copy", END)
    assert c.compile().invoke({"notes": ["a"]}) == _PNotes(notes=["a"], count=1)

    class Two(pydantic.BaseModel):
        topic: str = ""
        a: str = ""
        b: str = ""

    def set_field(name: str) -> Callable[[Two], Two]:
        def node(s: Two) -> Two:
            setattr(s, name, name.upper())
            return s
        return node

    p = StateGraph(Two, name="pyd_parallel")
    p.add_node("na", set_field("a")).add_node("nb", set_field("b"))
    p.add_edge(START, "na").add_edge(START, "nb").add_edge("na", END).add_edge("nb", END)
    assert p.compile().invoke({"topic": "owls"}) == Two(topic="owls", a="A", b="B")


class _Config:
    """A value whose == is identity: a node's copy of it is equal only by content."""

    def __init__(self, k: int) -> None:
        self.k = k


@pytest.mark.parametrize("data", [[1, 2], "numpy", _Config(1)], ids=["list", "array", "object"])
def test_parallel_nodes_leave_a_field_without_value_equality_unwritten(data: Any) -> None:
    """A field holding an array (== has no single answer) or an object compared by identity
    is not a write when a node returns its state object without changing it."""
    import numpy as np

    value = np.arange(3.0) if data == "numpy" else data

    @dataclasses.dataclass
    class S:
        data: Any = None
        a: int = 0
        b: int = 0

    def set_a(s: S) -> S:
        s.a = 1
        return s

    def set_b(s: S) -> S:
        s.b = 1
        return s

    g = StateGraph(S, name=f"identity_fields_{type(value).__name__}")
    g.add_node("na", set_a).add_node("nb", set_b)
    g.add_edge(START, "na").add_edge(START, "nb").add_edge("na", END).add_edge("nb", END)
    out = g.compile().invoke(S(data=value))
    assert (out.a, out.b) == (1, 1)
    # a node that does change the object's content still writes it
    def change(s: S) -> S:
        s.data = _Config(2) if isinstance(s.data, _Config) else s.data * 2
        return s

    h = StateGraph(S, name=f"changed_fields_{type(value).__name__}")
    h.add_node("change", change).add_edge(START, "change").add_edge("change", END)
    changed = h.compile().invoke(S(data=value)).data
    assert (changed.k == 2) if isinstance(value, _Config) else list(changed) == list(value * 2)


def test_a_reduced_field_left_out_of_the_input_starts_from_its_default() -> None:
    """The node was shown the default of a field the input left out: its update goes
    through the reducer from that default, as it would from an input holding it."""
    @dataclasses.dataclass
    class S:
        total: Annotated[int, operator.add] = 10
        log: Annotated[list[str], operator.add] = dataclasses.field(
            default_factory=lambda: ["seed"])

    g = StateGraph(S, name="reduced_defaults")
    g.add_node("step", lambda s: {"total": 1, "log": ["x"]})
    g.add_edge(START, "step").add_edge("step", END)
    app = g.compile()
    assert app.invoke({}) == app.invoke(S(), fresh=True) == S(11, ["seed", "x"])


def test_pydantic_aliases_and_dataclass_init_false_fields_build_the_state() -> None:
    """The state is built by field name whatever a pydantic field's alias; a dataclass's
    init=False field is set after the instance is made."""
    class A(pydantic.BaseModel):
        count: int = pydantic.Field(default=0, alias="Count")

    g = StateGraph(A, name="aliased")
    g.add_node("inc", lambda s: {"count": s.count + 1}).add_edge(START, "inc")
    g.add_edge("inc", END)
    assert g.compile().invoke({"count": 5}).count == 6

    @dataclasses.dataclass
    class D:
        x: int
        y: int = dataclasses.field(init=False, default=0)

    d = StateGraph(D, name="init_false")
    d.add_node("n", lambda s: {"y": s.x + s.y + 1}).add_edge(START, "n").add_edge("n", END)
    out = d.compile().invoke(D(x=1))
    assert (out.x, out.y) == (1, 2)


def test_update_state_with_a_pydantic_instance_writes_the_fields_set_in_it() -> None:
    """update_state(values) reads an instance as a node's return: the fields set in it,
    not the defaults of the others."""
    class S(pydantic.BaseModel):
        topic: str = ""
        n: int = 0

    g = StateGraph(S, name="update_pyd")
    g.add_node("inc", lambda s: {"n": s.n + 1}).add_edge(START, "inc").add_edge("inc", END)
    app = g.compile()
    run = app.run({"topic": "owls"})
    fork = app.update_state(run.id, S(n=5))
    assert app.get_state(fork).values == S(topic="owls", n=5)


def test_an_update_a_pydantic_state_rejects_fails_its_super_step_naming_the_node() -> None:
    """A node's dict update skips the model's validators: the state it makes is validated
    before it is checkpointed, and the run fails naming the node (it used to finish with
    the invalid state)."""
    class S(pydantic.BaseModel):
        x: int = 1

        @pydantic.field_validator("x")
        @classmethod
        def positive(cls, v: int) -> int:
            if v < 0:
                raise ValueError("x must be >= 0")
            return v

    g = StateGraph(S, name="validated")
    g.add_node("neg", lambda s: {"x": -5}).add_edge(START, "neg").add_edge("neg", END)
    with pytest.raises(InvalidUpdateError, match=r"(?s)node 'neg'\) is not a valid S:.*x must be"):
        g.compile().invoke({})
    assert durably.list_runs()[0].status == "failed"


def test_a_default_factory_field_left_out_of_the_input_is_made_once() -> None:
    """A field the input leaves out gets its default once, at the first super-step: every
    node and every read see the same value (a default factory made a new one each time)."""
    import itertools

    counter = itertools.count()

    class P(pydantic.BaseModel):
        topic: str
        request_id: int = pydantic.Field(default_factory=lambda: next(counter))
        notes: list[str] = pydantic.Field(default_factory=list)
        seen: list[int] = []

    def s1(s: P) -> P:
        s.notes.append("from s1")  # in place, on a field the input left out
        s.seen = [s.request_id]
        return s

    g = StateGraph(P, name="factory_once")
    g.add_node("s1", s1).add_node("s2", lambda s: {"seen": [*s.seen, s.request_id]})
    g.add_edge(START, "s1").add_edge("s1", "s2").add_edge("s2", END)
    app = g.compile()
    run = app.run({"topic": "t"})
    made = run.result["request_id"]
    assert run.result["seen"] == [made, made] and run.result["notes"] == ["from s1"]
    assert app.get_state(run.id).values.request_id == made
    assert app.get_state(run.id).values.request_id == made


def test_a_pydantic_state_is_kept_as_its_type_validates_it() -> None:
    """A nested model given as a dict, a tuple given as a list, a validator's rewrite: the
    state keeps the validated values the nodes see, so a node returning its state object
    unchanged writes nothing there (parallel nodes did clash on it)."""
    class Config(pydantic.BaseModel):
        depth: int = 1

    class S(pydantic.BaseModel):
        config: Config = Config()
        tags: tuple[str, ...] = ()
        name: str = ""
        a: bool = False
        b: bool = False

        @pydantic.field_validator("name")
        @classmethod
        def lower(cls, v: str) -> str:
            return v.lower()

    def flag(name: str) -> Callable[[S], S]:
        def node(s: S) -> S:
            setattr(s, name, True)
            return s
        return node

    g = StateGraph(S, name="validated_values")
    g.add_node("name", lambda s: {"name": "HELLO"})
    g.add_node("a", flag("a")).add_node("b", flag("b"))
    g.add_edge(START, "name").add_edge("name", "a").add_edge("name", "b")
    g.add_edge(["a", "b"], END)
    out = g.compile().invoke({"config": {"depth": 3}, "tags": ["x", "y"]})
    assert out == S(config=Config(depth=3), tags=("x", "y"), name="hello", a=True, b=True)


def test_a_node_that_finished_in_a_super_step_a_sibling_failed_may_not_change() -> None:
    """Its result is in the journal: edited, the run is refused (it would replay the old
    result silently); the sibling that failed may change."""
    class S(TypedDict, total=False):
        a_out: str
        b_out: str

    def build(a_version: str, fail: bool) -> Any:
        def b(s: S) -> dict[str, str]:
            if fail:
                raise RuntimeError("b failed")
            return {"b_out": "b-ok"}

        g = StateGraph(S, name="sibling_failed")
        g.add_node("a", eval(f"lambda s: {{'a_out': 'a-{a_version}'}}"))
        g.add_node("b", b).add_edge(START, "a").add_edge(START, "b")
        g.add_edge(["a", "b"], END)
        return g.compile()

    with pytest.raises(RuntimeError, match="b failed"):
        build("v1", True).invoke({})
    with pytest.raises(GraphChangedError, match="the code of node 'a' changed"):
        build("v2", False).invoke({})
    assert build("v1", False).invoke({}) == {"a_out": "a-v1", "b_out": "b-ok"}


def test_a_default_factory_field_is_the_same_when_the_first_super_step_resumes() -> None:
    """The defaults of the fields the input leaves out are made by a journaled step: a
    node interrupted in the first super-step sees the same value when the run resumes, so
    its question is the one answered (it used to ask again with a new id, forever)."""
    import itertools

    counter = itertools.count(100)

    class P(pydantic.BaseModel):
        question: str
        request_id: int = pydantic.Field(default_factory=lambda: next(counter))
        answer: str = ""

    def approve(s: P) -> dict[str, Any]:
        return {"answer": str(durably.interrupt(f"approve {s.request_id}?"))}

    g = StateGraph(P, name="approve_defaults")
    g.add_node("approve", approve).add_edge(START, "approve").add_edge("approve", END)
    app = g.compile()
    with pytest.raises(durably.RunInterrupted) as paused:
        app.invoke({"question": "q"})
    assert paused.value.interrupts[0].payload == "approve 100?"
    assert app.resume(paused.value.run_id, "yes") == P(question="q", request_id=100,
                                                        answer="yes")


def test_update_state_refuses_values_a_pydantic_state_rejects() -> None:
    class S(pydantic.BaseModel):
        n: int = 0

    g = StateGraph(S, name="update_invalid")
    g.add_node("inc", lambda s: {"n": s.n + 1}).add_edge(START, "inc").add_edge("inc", END)
    app = g.compile()
    run = app.run({})
    with pytest.raises(InvalidUpdateError, match=r"update_state\(\{'n': 'zzz'\}\) makes a state"):
        app.update_state(run.id, {"n": "zzz"})


def test_an_invalid_update_of_one_of_parallel_nodes_names_that_node() -> None:
    class S(pydantic.BaseModel):
        note: str = ""
        count: int = 0

    g = StateGraph(S, name="one_bad_of_two")
    g.add_node("good", lambda s: {"count": 1}).add_node("bad", lambda s: {"note": 5})
    g.add_edge(START, "good").add_edge(START, "bad").add_edge(["good", "bad"], END)
    with pytest.raises(InvalidUpdateError, match=r"\(the updates of node 'bad'\)"):
        g.compile().invoke({})


def test_langgraph_s_builder_shortcuts() -> None:
    """What code ported from LangGraph reaches for: add_node(fn) named by the function,
    add_sequence, set_entry_point / set_finish_point."""
    def fetch(s: Log) -> dict[str, Any]:
        return {"log": ["fetch"], "count": s["count"] + 1}

    def clean(s: Log) -> dict[str, Any]:
        return {"log": ["clean"]}

    def report(s: Log) -> dict[str, Any]:
        return {"log": [f"report {s['count']}"]}

    g = StateGraph(Log, name="shortcuts")
    g.add_sequence([fetch, ("tidy", clean)]).add_node(report)
    g.set_entry_point("fetch").add_edge("tidy", "report").set_finish_point("report")
    assert g.compile().invoke({"log": [], "count": 0}) == {
        "log": ["fetch", "clean", "report 1"], "count": 1}


# -- Send: one node called once per item, each with its own input ---------------------------
class Jokes(TypedDict):
    subjects: list[str]
    jokes: Annotated[list[str], operator.add]
    best: str


def _joke_graph(name: str, joke: Callable[[dict[str, str]], Any],
                send: Callable[[str, Any], Any] = durably.Send) -> Any:
    def plan(s: Jokes) -> dict[str, Any]:
        return {"subjects": ["cats", "dogs", "owls"]}

    def fan_out(s: Jokes) -> list[Any]:
        return [send("joke", {"subject": x}) for x in s["subjects"]]

    def pick(s: Jokes) -> dict[str, Any]:
        return {"best": s["jokes"][-1]}

    b = StateGraph(Jokes, name=name)
    b.add_node("plan", plan).add_node("joke", joke).add_node("pick", pick)
    b.add_edge(START, "plan").add_conditional_edges("plan", fan_out, ["joke"])
    b.add_edge("joke", "pick").add_edge("pick", END)
    return b.compile()


def test_send_calls_a_node_once_per_item_with_its_own_input() -> None:
    """Each Send is one call of its node in the next super-step, given the Send's input
    instead of the state; the calls' updates go through the reducers in the order sent,
    and the node's edges lead on once (``pick`` runs once, after every call)."""
    seen: list[Any] = []

    def joke(arg: dict[str, str]) -> dict[str, Any]:
        seen.append(arg)
        return {"jokes": [f"joke about {arg['subject']}"]}

    app = _joke_graph("jokes", joke)
    out = app.invoke({"subjects": [], "jokes": []})
    assert out["jokes"] == ["joke about cats", "joke about dogs", "joke about owls"]
    assert out["best"] == "joke about owls"
    assert sorted(a["subject"] for a in seen) == ["cats", "dogs", "owls"]
    run = app.run({"subjects": [], "jokes": []}, fresh=True)
    history = app.get_state_history(run.id)
    assert [h.next for h in history] == [(), ("pick",), ("joke", "joke", "joke"), ("plan",)]
    assert app.get_graph(run.id).visits == {"plan": 1, "joke": 3, "pick": 1}
    chunks = list(app.stream({"subjects": [], "jokes": []}, mode="updates", fresh=True))
    assert chunks[1] == {"joke": {"jokes": ["joke about cats", "joke about dogs",
                                            "joke about owls"]}}


def test_a_send_call_interrupted_resumes_alone() -> None:
    """One of three Send calls asks a human: on resume with the answer, the two that
    finished replay from the journal and only the asking one executes again."""
    calls: list[str] = []

    def joke(arg: dict[str, str]) -> dict[str, Any]:
        calls.append(arg["subject"])
        if arg["subject"] == "owls":
            answer = durably.interrupt("a joke about owls?")
            return {"jokes": [f"owls ({answer})"]}
        return {"jokes": [arg["subject"]]}

    app = _joke_graph("asking_jokes", joke)
    run = app.run({"subjects": [], "jokes": []})
    assert run.status == "interrupted"
    assert [i.payload for i in run.interrupts] == ["a joke about owls?"]
    assert app.get_state(run.id).next == ("joke", "joke", "joke")
    calls.clear()
    out = app.resume(run.id, "yes")
    assert out["jokes"] == ["cats", "dogs", "owls (yes)"] and calls == ["owls"]


def test_langgraph_s_send_is_taken_as_durably_s() -> None:
    """Code ported from LangGraph keeps its ``langgraph.types.Send``: the same call."""
    class Send:  # (as langgraph.types.Send is: a node and its input)
        def __init__(self, node: str, arg: Any) -> None:
            self.node, self.arg = node, arg

    app = _joke_graph("ported_jokes", lambda a: {"jokes": [a["subject"]]}, send=Send)
    assert app.invoke({"subjects": [], "jokes": []})["jokes"] == ["cats", "dogs", "owls"]


def test_send_mistakes_are_named() -> None:
    """A Send to a node the router did not declare is refused naming the router; two calls
    writing a key without a reducer are refused naming both calls (a write would be lost)."""
    g = StateGraph(Log, name="bad_send")
    g.add_node("gen", lambda s: {"log": ["gen"]})
    g.add_conditional_edges(START, lambda s: [durably.Send("ghost", 1)], ["gen"])
    g.add_edge("gen", END)
    with pytest.raises(InvalidRouteError, match=r"returned Send\(node='ghost', arg=1\), whose "
                       r"node is not among its declared destinations \['gen'\]"):
        g.compile().invoke({"log": [], "count": 0})
    h = StateGraph(Log, name="clashing_sends")
    h.add_node("count", lambda n: {"count": n})
    h.add_conditional_edges(START, lambda s: [durably.Send("count", n) for n in (1, 2)],
                            ["count"])
    h.add_edge("count", END)
    with pytest.raises(InvalidUpdateError, match=r"'count \(Send call 1\)' and 'count \(Send "
                       r"call 2\)' both wrote state key 'count'"):
        h.compile().invoke({"log": [], "count": 0})
    lock = threading.Lock()
    k = StateGraph(Log, name="unpicklable_send")
    k.add_node("gen", lambda x: {"log": ["gen"]})
    k.add_conditional_edges(START, lambda s: [durably.Send("gen", lock)], ["gen"])
    k.add_edge("gen", END)
    with pytest.raises(durably.SerializationError, match=r"the input of 'gen' sent by router "
                       r"'<lambda>' \(after '__start__'\)"):
        k.compile().invoke({"log": [], "count": 0})


def test_update_state_keeps_the_inputs_of_pending_sends() -> None:
    """A fork made by update_state at a checkpoint whose next super-step holds Send calls
    continues with those calls and their inputs (not with the node given the state)."""
    def joke(arg: dict[str, str]) -> dict[str, Any]:
        if arg["subject"] == "owls":
            durably.interrupt("owls?")
        return {"jokes": [arg["subject"]]}

    app = _joke_graph("forked_jokes", joke)
    run = app.run({"subjects": [], "jokes": []})
    assert run.status == "interrupted"
    fork = app.update_state(run.id, {"jokes": ["seed"]})
    assert app.get_state(fork).next == ("joke", "joke", "joke")
    forked = app.run(None, run_id=fork)
    assert forked.status == "interrupted"
    assert app.resume(fork, "ok")["jokes"] == ["seed", "cats", "dogs", "owls"]


def test_a_killed_run_resumes_its_send_calls_without_repeating_them(tmp_path: Path) -> None:
    """A process killed while three Send calls run (two finished, the third kills it):
    the next process executes only the unfinished call, then the rest of the graph."""
    script = write_script(tmp_path / "send_job.py", """
        import operator, os, signal
        from typing import Annotated, TypedDict
        from durably import StateGraph, Send, START, END

        class S(TypedDict):
            items: list[int]
            squares: Annotated[list[int], operator.add]

        def square(n):
            if n == 3 and os.environ.get("KILL"):
                import time
                time.sleep(1.0)  # the other two calls finish and are journaled first
                os.kill(os.getpid(), signal.SIGKILL)
            with open(os.environ["LOG"], "a") as log:
                log.write(f"{n}\\n")
            return {"squares": [n * n]}

        b = StateGraph(S, name="squares")
        b.add_node("square", square)
        b.add_conditional_edges(START, lambda s: [Send("square", n) for n in s["items"]],
                                ["square"])
        b.add_edge("square", END)
        if __name__ == "__main__":
            print(b.compile().invoke({"items": [1, 2, 3], "squares": []})["squares"])
    """)
    log = tmp_path / "log.txt"
    env = script_env(tmp_path / "store", LOG=str(log), KILL="1")
    killed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert sorted(log.read_text().split()) == ["1", "2"]
    env.pop("KILL")
    again = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "[1, 4, 9]"
    assert sorted(log.read_text().split()) == ["1", "2", "3"]  # 1 and 2 not again


def test_builder_shortcuts_name_callables_as_langgraph_does() -> None:
    """add_node(partial) is named 'partial', a callable object by its class; an empty
    add_sequence is refused when the graph compiles."""
    import functools

    class Tally:
        def __call__(self, s: Log) -> dict[str, Any]:
            return {"count": s["count"] + 1}

    def note(s: Log, text: str) -> dict[str, Any]:
        return {"log": [text]}

    g = StateGraph(Log, name="named_callables")
    g.add_node(functools.partial(note, text="hi")).add_node(Tally())
    g.add_edge(START, "partial").add_edge("partial", "Tally").add_edge("Tally", END)
    assert g.compile().invoke({"log": [], "count": 0}) == {"log": ["hi"], "count": 1}
    empty = StateGraph(Log, name="empty_sequence").add_sequence([])
    with pytest.raises(GraphValidationError, match="names no node"):
        empty.compile()


def test_a_resumed_graph_does_not_repeat_the_side_effects_of_earlier_super_steps() -> None:
    """A graph resumes after its last checkpoint: the side effect a node of an earlier
    super-step made is not reached again, and the one the failed node made is replayed;
    nothing is sent twice, and nothing warns."""
    import warnings

    sent: list[str] = []
    down = {"on": True}

    @durably.task(cache=False)
    def send(text: str) -> None:
        sent.append(text)

    def notify(s: Log) -> dict[str, Any]:
        send(f"start {s['count']}")
        return {"count": s["count"] + 1}

    def finish(s: Log) -> dict[str, Any]:
        send("end")  # (reached again on resume: replayed)
        if down["on"]:
            raise ConnectionError("down")
        return {"log": ["done"]}

    g = StateGraph(Log, name="effects_graph")
    g.add_node("notify", notify).add_node("finish", finish)
    g.add_edge(START, "notify").add_edge("notify", "finish").add_edge("finish", END)
    app = g.compile()
    with pytest.raises(ConnectionError):
        app.invoke({"log": [], "count": 0})
    down["on"] = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert app.invoke({"log": [], "count": 0}) == {"log": ["done"], "count": 1}
    assert sent == ["start 0", "end"]


# -- Command: a node that chooses where to go; Command(resume=...) as an input -------------
class Loop(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def test_a_node_returning_command_updates_and_goes_where_it_says() -> None:
    """The destinations come from the return annotation (validated and drawn like a
    router's); goto=END ends the path; the node's edges still lead on."""
    def agent(s: Loop) -> durably.Command[Literal["tool", "__end__"]]:
        if s["n"] >= 2:
            return durably.Command(update={"log": ["done"]}, goto=END)
        return durably.Command(update={"log": [f"agent {s['n']}"]}, goto="tool")

    def tool(s: Loop) -> dict[str, Any]:
        return {"n": s["n"] + 1, "log": ["tool"]}

    g = StateGraph(Loop, name="commands")
    g.add_node("agent", agent).add_node("tool", tool)
    g.add_edge(START, "agent").add_edge("tool", "agent")
    app = g.compile()
    assert app.invoke({"n": 0, "log": []}) == {
        "n": 2, "log": ["agent 0", "tool", "agent 1", "tool", "done"]}
    mermaid = app.get_graph().to_mermaid()
    assert 'n1 -.->|"tool"| n2' in mermaid and 'n1 -.->|"END"| n3' in mermaid


def test_command_destinations_are_declared_and_checked() -> None:
    """Without a declaration the node has no way out (the message says how to declare
    one); add_node(destinations=...) declares them; a goto elsewhere is refused naming the
    node; LangGraph's Command and Send are taken as durably's."""
    def free(s: Loop) -> Any:
        return durably.Command(update={"log": ["free"]}, goto="tool")

    def tool(s: Loop) -> dict[str, Any]:
        return {"log": ["tool"]}

    def build(name: str, node: Any, **options: Any) -> Any:
        g = StateGraph(Loop, name=name)
        g.add_node("agent", node, **options).add_node("tool", tool)
        return g.add_edge(START, "agent").add_edge("tool", END)

    with pytest.raises(GraphValidationError, match=r"node 'agent' has no way out.*"
                       r"add_node\('agent', fn, destinations=\[\.\.\.\]\)"):
        build("undeclared", free).compile()
    assert build("declared", free, destinations=["tool"]).compile().invoke(
        {"n": 0, "log": []})["log"] == ["free", "tool"]
    with pytest.raises(InvalidRouteError, match=r"node 'agent' returned a Command going to "
                       r"'agent', which is not among its declared destinations \['tool'\]"):
        build("elsewhere", lambda s: durably.Command(goto="agent"),
              destinations=["tool"]).compile().invoke({"n": 0, "log": []})
    with pytest.raises(GraphValidationError, match=r"declares unknown destination 'ghost'"):
        build("ghost", free, destinations=["tool", "ghost"]).compile()

    class Command:  # (as langgraph.types.Command is)
        def __init__(self, update: Any = None, goto: Any = ()) -> None:
            self.update, self.goto, self.graph, self.resume = update, goto, None, None

    class Send:  # (as langgraph.types.Send is)
        def __init__(self, node: str, arg: Any) -> None:
            self.node, self.arg = node, arg

    ported = build("ported", lambda s: Command({"log": ["lg"]}, [Send("tool", s)]),
                   destinations=["tool"])
    assert ported.compile().invoke({"n": 0, "log": []})["log"] == ["lg", "tool"]
    with pytest.raises(InvalidRouteError, match=r"Command\(graph=\.\.\.\) .* is not supported"):
        build("parent", lambda s: durably.Command(goto="tool", graph=durably.Command.PARENT),
              destinations=["tool"]).compile().invoke({"n": 0, "log": []})


def test_command_resume_answers_an_interrupt_in_invoke_run_and_stream() -> None:
    """LangGraph's way of answering: invoke / run / stream(Command(resume=answer),
    run_id=...); stream shows the resumed run's updates (resume() alone cannot)."""
    def ask(s: Loop) -> dict[str, Any]:
        return {"log": [f"answer {durably.interrupt('ok?')}"]}

    g = StateGraph(Loop, name="answered_by_command")
    g.add_node("ask", ask).add_edge(START, "ask").add_edge("ask", END)
    app = g.compile()
    first = app.run({"n": 0, "log": []})
    assert first.status == "interrupted"
    chunks = list(app.stream(durably.Command(resume="yes"), run_id=first.id, mode="updates"))
    assert chunks == [{"ask": {"log": ["answer yes"]}}]
    second = app.run({"n": 1, "log": []})
    assert app.invoke(durably.Command(resume="sure"), run_id=second.id)["log"] == [
        "answer sure"]
    third = app.run({"n": 2, "log": []})
    done = app.run(durably.Command(resume="fine"), run_id=third.id)
    assert done.status == "finished" and done.result["log"] == ["answer fine"]
    with pytest.raises(durably.DefinitionError, match=r"needs run_id=\.\.\."):
        app.invoke(durably.Command(resume="x"))
    with pytest.raises(durably.DefinitionError, match=r"Command\(resume=answer\) alone"):
        app.invoke(durably.Command(goto="ask"), run_id=third.id)


def test_update_state_at_an_earlier_checkpoint_or_the_input_and_fork_from_the_input() -> None:
    """update_state(at=...) forks from any checkpoint of get_state_history ('' : the
    input), fork(at='') runs the input anew; an update given to the generic fork at a
    super-step (which would replace the graph's checkpoint with it) is refused, naming
    update_state."""
    g = StateGraph(Log, name="two_steps")
    g.add_node("a", lambda s: {"count": s["count"] + 1})
    g.add_node("b", lambda s: {"count": s["count"] * 10})
    app = g.add_edge(START, "a").add_edge("a", "b").add_edge("b", END).compile()
    run = app.run({"log": [], "count": 1})
    assert run.result["count"] == 20
    history = app.get_state_history(run.id)
    assert [(h.step, h.next) for h in history] == [(1, ()), (0, ("b",)), (-1, ("a",))]
    after_a = history[1].checkpoint_id
    fork = app.update_state(run.id, {"count": 100}, at=after_a[:8])
    assert app.invoke(None, run_id=fork)["count"] == 1000
    fork = app.update_state(run.id, {"count": 7}, at="")
    assert app.invoke(None, run_id=fork)["count"] == 80
    anew = app.fork(run.id, at="")
    assert anew.result["count"] == 20 and anew.counts()["ran"] >= 2
    with pytest.raises(durably.NotFoundError, match=r"has no checkpoint 'zzzzzz'"):
        app.update_state(run.id, {"count": 7}, at="zzzzzz")
    with pytest.raises(durably.DefinitionError, match=r"is a super-step of graph 'two_steps'.*"
                       r"app\.update_state\(run_id, values, at=checkpoint_id\)"):
        durably.fork(run.id, at=after_a, update={"count": 100})


def test_pending_interrupts_read_back_keep_the_order_the_run_reported() -> None:
    """Parallel nodes that ask: the run reports them in node order (a fan-out: input
    order); read back from the journal (get_run, another process) they come in that order
    too, not in the order the threads happened to ask."""
    def slow(s: Log) -> dict[str, Any]:
        time.sleep(0.3)  # asks after "quick", though first in node order
        return {"log": [durably.interrupt("slow?")]}

    def quick(s: Log) -> dict[str, Any]:
        return {"log": [durably.interrupt("quick?")]}

    g = StateGraph(Log, name="two_askers")
    g.add_node("slow", slow).add_node("quick", quick)
    g.add_edge(START, "slow").add_edge(START, "quick").add_edge(["slow", "quick"], END)
    app = g.compile()
    streamed = [c for c in app.stream({"log": [], "count": 0}, mode="updates")]
    asked = [i.payload for i in streamed[-1]["__interrupt__"]]
    assert asked == ["slow?", "quick?"]
    run = durably.list_runs(app._entry)[0]
    assert [i.payload for i in durably.get_run(run.id).interrupts] == asked


def test_update_state_as_a_node_reroutes_from_the_new_state() -> None:
    """update_state(as_node=X) at a checkpoint where X ran: X's routers choose again from
    the updated state (its old choice, made from the old state, is dropped: a branch the
    new state rules out ran anyway, and old Sends ran beside the new ones), as LangGraph."""
    class Scored(TypedDict):
        score: int
        log: Annotated[list[str], operator.add]

    g = StateGraph(Scored, name="rerouted")
    g.add_node("review", lambda s: {"log": ["review"]})
    g.add_node("revise", lambda s: {"log": ["revise"]})
    g.add_edge(START, "review").add_edge("revise", END)
    g.add_conditional_edges("review", lambda s: END if s["score"] >= 5 else "revise",
                            ["revise", END])
    app = g.compile()
    run = app.run({"score": 3, "log": []})
    after_review = next(h for h in app.get_state_history(run.id) if h.step == 0)
    assert after_review.next == ("revise",)
    fork = app.update_state(run.id, {"score": 10}, at=after_review.checkpoint_id,
                            as_node="review")
    assert app.get_state(fork).next == ()
    assert app.invoke(None, run_id=fork) == {"score": 10, "log": ["review"]}

    def grade(doc: str) -> dict[str, Any]:
        return {"grades": [f"{doc}:ok"]}

    class Docs(TypedDict):
        docs: list[str]
        grades: Annotated[list[str], operator.add]

    h = StateGraph(Docs, name="resent")
    h.add_node("plan", lambda s: {}).add_node("grade", grade)
    h.add_edge(START, "plan").add_edge("grade", END)
    h.add_conditional_edges("plan", lambda s: [durably.Send("grade", d) for d in s["docs"]],
                            ["grade"])
    docs = h.compile()
    run = docs.run({"docs": ["a", "b", "c"], "grades": []})
    after_plan = next(s for s in docs.get_state_history(run.id) if s.step == 0)
    fork = docs.update_state(run.id, {"docs": ["x", "y"]}, at=after_plan.checkpoint_id,
                             as_node="plan")
    assert docs.get_state(fork).next == ("grade", "grade")
    assert docs.invoke(None, run_id=fork)["grades"] == ["x:ok", "y:ok"]


def test_command_corners_from_code_ported_from_langgraph() -> None:
    """A router returning a Command is told routers return names or Sends; a callable
    object's __call__ annotation and a partial's function declare destinations; an update
    given as (key, value) pairs is applied in turn; a Send in a goto that cannot be
    pickled is named with the node's result."""
    import functools

    def tool(s: Loop) -> dict[str, Any]:
        return {"log": ["tool"]}

    bad = StateGraph(Loop, name="router_command")
    bad.add_node("a", lambda s: {}).add_edge(START, "a").add_edge("a", END)
    bad.add_conditional_edges("a", lambda s: durably.Command(goto="a"), ["a", END])
    with pytest.raises(InvalidRouteError, match=r"a router returns node names, END or Sends"):
        bad.compile().invoke({"n": 0, "log": []})

    class Agent:
        def __call__(self, s: Loop) -> durably.Command[Literal["tool"]]:
            return durably.Command(update=[("log", ["a1"]), ("log", ["a2"])], goto="tool")

    def agent(s: Loop, tag: str) -> durably.Command[Literal["tool"]]:
        return durably.Command(update={"log": [tag]}, goto="tool")

    for name, node, expected in (("callable_agent", Agent(), ["a1", "a2", "tool"]),
                                 ("partial_agent", functools.partial(agent, tag="p"),
                                  ["p", "tool"])):
        g = StateGraph(Loop, name=name)
        g.add_node("agent", node).add_node("tool", tool)
        app = g.add_edge(START, "agent").add_edge("tool", END).compile()
        assert app.invoke({"n": 0, "log": []})["log"] == expected
        assert 'n1 -.->|"tool"| n2' in app.get_graph().to_mermaid()

    lock = threading.Lock()
    k = StateGraph(Loop, name="unpicklable_goto")
    k.add_node("a", lambda s: durably.Command(goto=durably.Send("tool", lock)),
               destinations=["tool"]).add_node("tool", lambda x: {})
    k.add_edge(START, "a").add_edge("tool", END)
    with pytest.raises(durably.SerializationError, match=r"the result of task "
                       r"'unpicklable_goto\.a' \(at result\.goto\.arg\).*"
                       r"cannot be pickled.*_thread\.lock"):
        k.compile().invoke({"n": 0, "log": []})


def test_a_stream_that_answers_shows_only_what_executes() -> None:
    """stream(Command(resume=...)) shows the super-steps that execute, not those replayed
    from the journal (a chat showed their messages twice), as LangGraph's; a stream of the
    input still shows them all."""
    app = _pre_then_ask("answered_stream")
    first = app.run({"log": [], "count": 0})
    chunks = list(app.stream(durably.Command(resume="y"), run_id=first.id, mode="updates"))
    assert chunks == [{"ask": {"log": ["ask=y"]}}]


# -- graph identity and isolation --------------------------------------------------------------
def _append(word: str) -> Callable[[Notes], dict[str, Any]]:
    def node(state: Notes) -> dict[str, Any]:
        return {"notes": [word]}
    node.__name__ = node.__qualname__ = f"append_{word}"
    return node


def test_a_compiled_graph_is_a_snapshot_of_its_builder() -> None:
    """Nodes and edges added to the builder after compile() never reach an app compiled
    before (it kept reading the builder: KeyError, or an endless loop)."""
    b = StateGraph(Notes, name="snapshot")
    b.add_node("a", _append("a")).add_edge(START, "a").add_edge("a", END)
    first = b.compile()
    b.add_node("c", _append("c")).add_edge("a", "c").add_edge("c", END)
    assert first.invoke({"topic": "t", "notes": [], "draft": ""})["notes"] == ["a"]
    assert 'label="c"' not in first.get_graph().to_dot()
    second = b.compile(name="snapshot-2")
    assert second.invoke({"topic": "t", "notes": [], "draft": ""})["notes"] == ["a", "c"]


def test_two_graphs_over_one_state_never_share_runs() -> None:
    """Two unnamed graphs over one state type: each has runs of its own, and calling one
    never changes the status of the other's run."""
    one = StateGraph(Notes)
    one.add_node("a", _append("one")).add_edge(START, "a").add_edge("a", END)
    two = StateGraph(Notes)
    two.add_node("b", _append("two")).add_edge(START, "b").add_edge("b", END)
    app_one, app_two = one.compile(), two.compile()
    assert app_one.name != app_two.name and app_one.name.startswith("Notesgraph-")
    state = {"topic": "t", "notes": [], "draft": ""}
    first = app_one.run(state)
    assert first.status == "finished" and first.result["notes"] == ["one"]
    second = app_two.run(state)
    assert second.status == "finished" and second.result["notes"] == ["two"]
    assert second.id != first.id
    assert durably.get_run(first.id).status == "finished"
    # the same graph built again (a rerun of the script) continues its run
    again = StateGraph(Notes)
    again.add_node("a", _append("one")).add_edge(START, "a").add_edge("a", END)
    assert again.compile().run(state).id == first.id


class Entries(TypedDict):
    log: Annotated[list[str], operator.add]


def _one_node(fn: Callable[[Any], Any], state: type[Any] = Entries) -> Any:
    g = StateGraph(state)
    g.add_node("work", fn).add_edge(START, "work").add_edge("work", END)
    return g.compile()


def test_unnamed_graphs_calling_other_functions_never_share_runs() -> None:
    """An unnamed graph is known by its nodes' functions (by qualified name), its routers'
    functions, destinations and path_map, its reducers and its subgraphs' structure: graphs
    differing in any of them never continue, finish or refuse each other's runs; a graph
    whose node's *code* was fixed is the same graph and resumes its failed run."""
    def fetch(s: Entries) -> dict[str, Any]:
        raise ConnectionError("service down")

    def summarize(s: Entries) -> dict[str, Any]:
        return {"log": ["summary"]}

    fetcher, summarizer = _one_node(fetch), _one_node(summarize)
    with pytest.raises(ConnectionError):
        fetcher.invoke({"log": []})
    failed = durably.list_runs(fetcher.name)[0]
    run = summarizer.run({"log": []})
    assert run.id != failed.id and run.result == {"log": ["summary"]}
    assert durably.get_run(failed.id).status == "failed"

    # the node's code fixed, under the same qualified name: the same graph, the same run
    def fetch(s: Entries) -> dict[str, Any]:  # type: ignore[no-redef]
        return {"log": ["fetched"]}

    fixed = _one_node(fetch)
    assert fixed.name == fetcher.name
    assert fixed.run({"log": []}).id == failed.id
    assert durably.get_run(failed.id).status == "finished"

    def route_a(s: Entries) -> str:
        return "b"

    def route_b(s: Entries) -> str:
        return "b"

    def routed(router: Any, path_map: Any = None, subgraph: Any = None,
               state: type[Any] = Entries) -> str:
        g = StateGraph(state)
        g.add_node("a", summarize).add_node("b", subgraph or summarize)
        g.add_edge(START, "a").add_conditional_edges("a", router, path_map or ["b"])
        g.add_edge("b", END)
        return g.compile().name

    class Replaced(TypedDict):
        log: list[str]

    inner_a, inner_b = _one_node(summarize), _one_node(fetch)
    names = [routed(route_a), routed(route_b), routed(route_a, {"x": "b"}),
             routed(route_a, {"y": "b"}), routed(route_a, subgraph=inner_a),
             routed(route_a, subgraph=inner_b), routed(route_a, state=Replaced)]
    assert len(set(names)) == len(names), names
    # destinations mean a set, END always allowed: the same graph
    assert routed(route_a, ["b", END]) == routed(route_a, [END, "b"]) == routed(route_a)


def test_router_destinations_are_a_set_with_end_implied() -> None:
    """A graph whose router lists its destinations in another order, or END or not, is the
    same graph: its run continues (no GraphChangedError "router ... was removed")."""
    def a(s: Entries) -> dict[str, Any]:
        return {"log": ["a"]}

    def b(s: Entries) -> dict[str, Any]:
        return {"log": ["b"]}

    def r(s: Entries) -> str:
        return "b"

    def build(destinations: list[str]) -> Any:
        g = StateGraph(Entries, name="router-set")
        g.add_node("a", a).add_node("b", b).add_edge(START, "a").add_edge("b", END)
        g.add_conditional_edges("a", r, destinations)
        return g.compile()

    first = build(["b", END]).run({"log": []})
    assert first.result == {"log": ["a", "b"]}
    for destinations in ([END, "b"], ["b"], ["b", END]):
        again = build(destinations).run({"log": []})
        assert (again.id, again.result) == (first.id, first.result)
    with pytest.raises(GraphChangedError, match="router"):
        g = StateGraph(Entries, name="router-set")
        g.add_node("a", a).add_node("b", b).add_node("c", b).add_edge(START, "a")
        g.add_edge("b", END).add_edge("c", END)
        g.add_conditional_edges("a", r, ["b", "c"])
        g.compile().run({"log": []})


class Counted(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


def test_a_fixed_router_resumes_its_run_without_migrate() -> None:
    """A router that returned an invalid value after deciding earlier super-steps: fixed
    (its code, same function), the run resumes without migrate= and keeps the decisions
    journaled."""
    ran: list[str] = []

    def a(s: Counted) -> dict[str, Any]:
        ran.append("a")
        return {"log": ["a"], "n": s["n"] + 1}

    def c(s: Counted) -> dict[str, Any]:
        ran.append("c")
        return {"log": ["c"]}

    def build(route: Any) -> Any:
        g = StateGraph(Counted)
        g.add_node("a", a).add_node("c", c).add_edge(START, "a").add_edge("c", END)
        g.add_conditional_edges("a", route)
        return g.compile()

    def route(s: Counted) -> str:
        return "a" if s["n"] < 3 else "BAD"

    with pytest.raises(InvalidRouteError, match="'BAD'"):
        build(route).invoke({"log": [], "n": 0})
    failed = durably.list_runs()[0]

    def route(s: Counted) -> str:  # type: ignore[no-redef]
        return "a" if s["n"] < 3 else "c"

    ran.clear()
    run = build(route).run({"log": [], "n": 0})
    assert run.id == failed.id and run.status == "finished"
    assert run.result == {"log": ["a", "a", "a", "c"], "n": 3}
    assert ran == ["c"]  # the super-steps that finished were replayed, not run again


def test_a_partial_router_s_errors_name_its_function() -> None:
    """A functools.partial router: its unknown destination and its bad value at run time
    raise durably's errors naming the router's function (they raised AttributeError)."""
    import functools

    def log(word: str) -> Callable[[Entries], dict[str, Any]]:
        return lambda s: {"log": [word]}

    def pick(s: Entries, to: str) -> Literal["work", "nowhere"]:
        return to  # type: ignore[return-value]

    g = StateGraph(Entries)
    g.add_node("work", log("w")).add_node("first", log("f"))
    g.add_edge(START, "first").add_conditional_edges("first", functools.partial(pick, to="x"))
    g.add_edge("work", END)
    with pytest.raises(GraphValidationError, match=r"router 'pick' .*'nowhere'"):
        g.compile()

    def pick2(s: Entries, to: str) -> str:
        return to

    g = StateGraph(Entries)
    g.add_node("work", log("w")).add_node("first", log("f"))
    g.add_edge(START, "first").add_edge("work", END)
    g.add_conditional_edges("first", functools.partial(pick2, to="bad"), ["work"])
    with pytest.raises(InvalidRouteError, match=r"router 'pick2' \(after node 'first'\)"):
        g.compile().invoke({"log": []})


def test_a_subgraph_over_its_parent_s_state_needs_no_name() -> None:
    inner = StateGraph(Notes)
    inner.add_node("x", _append("inner")).add_edge(START, "x").add_edge("x", END)
    outer = StateGraph(Notes)
    outer.add_node("x", _append("outer")).add_node("sub", inner.compile())
    outer.add_edge(START, "x").add_edge("x", "sub").add_edge("sub", END)
    run = outer.compile().run({"topic": "t", "notes": [], "draft": ""})
    assert run.status == "finished"
    assert run.result["notes"] == ["outer", "inner"]


def test_a_graph_changed_error_says_to_name_graphs_apart() -> None:
    state = {"topic": "t", "notes": [], "draft": ""}
    one = StateGraph(Notes, name="shared-name")
    one.add_node("a", _append("one")).add_edge(START, "a").add_edge("a", END)
    one.compile().invoke(state)
    two = StateGraph(Notes, name="shared-name")
    two.add_node("b", _append("two")).add_edge(START, "b").add_edge("b", END)
    with pytest.raises(GraphChangedError, match=r"name=\.\.\."):
        two.compile().invoke(state)


def test_a_graph_rebuilt_with_edits_in_one_process_is_told_to_migrate() -> None:
    """A notebook cell run again with a fixed node and a new one: the error offers both
    readings (two graphs, or an edited one) with migrate= for the edit, never "leave name=
    out"; migrate= then continues the run."""
    def a(s: Counted) -> dict[str, Any]:
        return {"log": ["a"]}

    def boom(s: Counted) -> dict[str, Any]:
        raise RuntimeError("fix me")

    def b(s: Counted) -> dict[str, Any]:
        return {"log": ["b"]}

    g = StateGraph(Counted, name="nb")
    g.add_node("a", a).add_node("x", boom).add_edge(START, "a").add_edge("a", "x")
    g.add_edge("x", END)
    with pytest.raises(RuntimeError, match="fix me"):
        g.compile().invoke({"log": [], "n": 0})
    g = StateGraph(Counted, name="nb")
    g.add_node("a", a).add_node("x", b).add_node("b", b).add_edge(START, "a")
    g.add_edge("a", "x").add_edge("x", "b").add_edge("b", END)
    app = g.compile()
    with pytest.raises(GraphChangedError) as err:
        app.invoke({"log": [], "n": 0})
    message = str(err.value)
    assert "migrate=lambda state: state" in message and "leave name= out" not in message
    assert app.invoke({"log": [], "n": 0}, migrate=lambda s: s)["log"] == ["a", "b", "b"]


def test_a_graph_named_like_another_never_changes_the_other_s_runs() -> None:
    """Two graphs given the same name= but other nodes: a call of the second on the first's
    input is refused before its attempt begins (the error says two graphs share the name and
    to pass a distinct name=), whatever the first's run's status; the first's runs keep
    their status and attempt, and the first graph goes on with them."""
    state = {"topic": "t", "notes": [], "draft": ""}
    fail = [False]

    def a(s: Notes) -> dict[str, Any]:
        if fail[0]:
            raise RuntimeError("a failed")
        return {"notes": ["one"]}

    one = StateGraph(Notes, name="same-name")
    one.add_node("a", a).add_edge(START, "a").add_edge("a", END)
    app_one = one.compile()
    finished = app_one.run(state)
    fail[0] = True
    other_input = {**state, "topic": "u"}
    with pytest.raises(RuntimeError):
        app_one.invoke(other_input)
    failed = durably.list_runs()[0]
    assert failed.status == "failed"
    two = StateGraph(Notes, name="same-name")
    two.add_node("b", _append("two")).add_edge(START, "b").add_edge("b", END)
    app_two = two.compile()
    calls = [lambda s: app_two.invoke(s), lambda s: app_two.run(s),
             lambda s: list(app_two.stream(s))]
    for call in calls:
        for state_in in (state, other_input):
            with pytest.raises(GraphChangedError) as err:
                call(state_in)
            message = str(err.value)
            assert "two graphs share the name" in message, message
            assert "a name of its own" in message, message
    assert durably.get_run(finished.id).status == "finished"
    assert durably.get_run(finished.id).attempt == 1
    assert durably.get_run(failed.id).status == "failed"
    assert durably.get_run(failed.id).attempt == 1
    fail[0] = False
    assert app_one.run(other_input).id == failed.id  # the first graph continues its run
    assert app_one.run(state).counts()["replayed"] == 1
    # given fresh=True, the second graph starts runs of its own
    assert app_two.run(state, fresh=True).result["notes"] == ["two"]


# -- routers, as LangGraph users write them ----------------------------------------------------
class Count(TypedDict):
    n: int
    seen: Annotated[list[str], operator.add]


def _inc(state: Count) -> dict[str, Any]:
    return {"n": state["n"] + 1, "seen": ["inc"]}


def test_end_is_always_a_valid_destination_of_a_router() -> None:
    b = StateGraph(Count, name="end-always")
    b.add_node("inc", _inc).add_edge(START, "inc")
    b.add_conditional_edges("inc", lambda s: "inc" if s["n"] < 3 else END, ["inc"])
    assert b.compile().invoke({"n": 0, "seen": []})["n"] == 3
    mapped = StateGraph(Count, name="end-always-mapped")
    mapped.add_node("inc", _inc).add_edge(START, "inc")
    mapped.add_conditional_edges("inc", lambda s: "again" if s["n"] < 2 else END,
                                 {"again": "inc"})
    assert mapped.compile().invoke({"n": 0, "seen": []})["n"] == 2


def more(state: Count) -> Literal["inc", "__end__"]:
    return "inc" if state["n"] < 4 else END


def test_a_router_s_destinations_come_from_its_literal_annotation() -> None:
    b = StateGraph(Count, name="literal-router")
    b.add_node("inc", _inc).add_edge(START, "inc").add_conditional_edges("inc", more)
    app = b.compile()
    assert app.invoke({"n": 0, "seen": []})["n"] == 4
    dot = app.get_graph().to_dot()
    assert dot.count("style=dashed") == 2  # inc -> inc, inc -> END: from its annotation
    assert "any node" not in dot

    def typo(state: Count) -> Literal["inc", "incc"]:
        return "inc"

    bad = StateGraph(Count, name="literal-typo")
    bad.add_node("inc", _inc).add_edge(START, "inc").add_edge("inc", END)
    bad.add_conditional_edges("inc", typo)
    with pytest.raises(GraphValidationError) as err:
        bad.compile()
    text = "\n".join(err.value.problems)
    assert "its return annotation names unknown destination 'incc'" in text
    assert "the nodes are ['inc'] and END" in text


def test_a_router_without_destinations_is_checked_as_it_runs() -> None:
    """A router that declares none and has no annotation may go to any node (or END): each
    value is checked when returned; a wrong one names the router, the node, the value and
    the allowed targets, and the run resumes once the router is fixed."""
    fixed = {"on": False}

    def route(state):  # type: ignore[no-untyped-def]
        if state["n"] < 2:
            return "inc"
        return END if fixed["on"] else "finish_up"

    b = StateGraph(Count, name="dynamic-router")
    b.add_node("inc", _inc).add_node("log", lambda s: {"seen": ["log"]})
    b.add_edge(START, "inc").add_conditional_edges("inc", route).add_edge("log", END)
    app = b.compile()
    dot = app.get_graph().to_dot()
    assert "any node" in dot and dot.count("style=dashed") == 1  # one dynamic edge
    with pytest.raises(InvalidRouteError) as err:
        app.invoke({"n": 0, "seen": []})
    message = str(err.value)
    for text in ("'route'", "'inc'", "'finish_up'", "'log'", "__end__"):
        assert text in message, text
    fixed["on"] = True
    state = app.invoke({"n": 0, "seen": []})  # the same run, resumed
    assert state["n"] == 2 and state["seen"] == ["inc", "inc"]
    assert len(durably.list_runs(app.name)) == 1


# -- errors name their node --------------------------------------------------------------------
def test_an_error_keeps_its_type_and_names_its_node_graph_and_super_step() -> None:
    def broken(state: Count) -> dict[str, Any]:
        raise KeyError("missing-key")

    b = StateGraph(Count, name="errors-named")
    b.add_node("inc", _inc).add_node("broken", broken)
    b.add_edge(START, "inc").add_edge("inc", "broken").add_edge("broken", END)
    with pytest.raises(KeyError) as err:
        b.compile().invoke({"n": 0, "seen": []})
    notes = getattr(err.value, "__notes__", [])
    assert ("durably: raised by node 'broken' of graph 'errors-named', in super-step 1"
            in notes), notes
    assert any(f.name == "broken" for f in err.traceback)  # (its own traceback)


def test_several_failing_nodes_are_each_named_in_the_group() -> None:
    # (both running when they fail: a node that fails cancels the siblings not started yet)
    both = threading.Barrier(2)

    def bad_a(state: Count) -> dict[str, Any]:
        both.wait(30)
        raise ValueError("a is wrong")

    def bad_b(state: Count) -> dict[str, Any]:
        both.wait(30)
        raise TypeError("b is wrong")

    b = StateGraph(Count, name="errors-grouped")
    b.add_node("a", bad_a).add_node("b", bad_b)
    b.add_edge(START, "a").add_edge(START, "b").add_edge(["a", "b"], END)
    with pytest.raises(ExceptionGroup) as err:
        b.compile().invoke({"n": 0, "seen": []})
    message = str(err.value)
    assert "'a' (ValueError: a is wrong)" in message and "'b' (TypeError: b is wrong)" in message
    by_type = {type(e): e for e in err.value.exceptions}
    assert "durably: raised by node 'a'" in by_type[ValueError].__notes__[0]


def test_an_error_raised_by_a_router_names_it() -> None:
    def pick(s: Count) -> str:
        raise KeyError("no such key")

    b = StateGraph(Count, name="errors-router")
    b.add_node("a", lambda s: {"n": 1}).add_edge(START, "a")
    b.add_conditional_edges("a", pick, [END])
    with pytest.raises(KeyError) as err:
        b.compile().invoke({"n": 0, "seen": []})
    assert ("durably: raised by router 'pick' (after node 'a') of graph 'errors-router'"
            in err.value.__notes__)


def test_failing_sends_to_one_node_are_told_apart() -> None:
    """Several Sends to one node that fail: the ExceptionGroup's message and each note
    number them (it said "2 nodes ... 'w' (...), 'w' (...)")."""
    from durably import Send

    both = threading.Barrier(2)

    def work(item: str) -> dict[str, Any]:
        both.wait(30)
        raise ValueError(f"bad {item}")

    b = StateGraph(Count, name="errors-sends")
    b.add_node("w", work)
    b.add_conditional_edges(START, lambda s: [Send("w", "p"), Send("w", "q")], ["w"])
    b.add_edge("w", END)
    with pytest.raises(ExceptionGroup) as err:
        b.compile().invoke({"n": 0, "seen": []})
    message = str(err.value)
    assert message.startswith("2 node calls of super-step 0")
    assert "'w' (Send #1) (ValueError: bad p)" in message
    assert "'w' (Send #2) (ValueError: bad q)" in message
    notes = sorted(e.__notes__[0] for e in err.value.exceptions)
    assert ["(Send #1)" in notes[0], "(Send #2)" in notes[1]] == [True, True]


# -- breakpoints: interrupt_before / interrupt_after ------------------------------------------
def test_a_state_updated_at_a_breakpoint_goes_on_past_it() -> None:
    """Paused at a breakpoint (before or after a node), update_state then invoke(None) on
    the fork continues through, as in LangGraph (it paused at the same breakpoint again);
    the run that paused still waits for its answer."""
    def node(word: str) -> Callable[[Entries], dict[str, Any]]:
        return lambda s: {"log": [word]}

    for option in ("interrupt_before", "interrupt_after"):
        g = StateGraph(Entries, name=f"bp-update-{option}")
        g.add_node("a", node("a")).add_node("b", node("b")).add_node("c", node("c"))
        g.add_edge(START, "a").add_edge("a", "b").add_edge("b", "c").add_edge("c", END)
        app = g.compile(**{option: ["b"]})
        paused = app.run({"log": []})
        assert paused.status == "interrupted"
        fork = app.update_state(paused.id, {"log": ["edited"]})
        done = app.invoke(None, run_id=fork)
        assert done["log"] == (["a", "edited", "b", "c"] if option == "interrupt_before"
                               else ["a", "b", "edited", "c"]), option
        assert durably.get_run(paused.id).status == "interrupted"
        assert app.resume(paused.id, True)["log"] == ["a", "b", "c"]


def test_messages_say_how_to_answer_and_name_the_router() -> None:
    """An interrupted run's result says to answer it with resume(run_id, answer) (not to
    rerun it); Command(resume=None) is told to answer with a value; an unknown destination
    in a router's annotation reads "router 'r' (after 'a'): its return annotation names"."""
    from durably import Command

    def ask(s: Entries) -> dict[str, Any]:
        return {"log": [str(durably.interrupt("ok?"))]}

    g = StateGraph(Entries, name="messages")
    g.add_node("ask", ask).add_edge(START, "ask").add_edge("ask", END)
    app = g.compile()
    paused = app.run({"log": []})
    with pytest.raises(durably.RunStateError, match=r"resume\(run_id, answer\)"):
        _ = paused.result
    with pytest.raises(durably.DefinitionError, match="never takes as an answer"):
        app.invoke(Command(resume=None), run_id=paused.id)
    # paused again after an answer: the graph's own name is no variable to call resume on
    g = StateGraph(Entries, name="messages-twice")
    g.add_node("ask", ask).add_node("again", ask).add_edge(START, "ask")
    g.add_edge("ask", "again").add_edge("again", END)
    twice = g.compile()
    first = twice.run({"log": []})
    with pytest.raises(durably.RunInterrupted, match=r"Answer with app\.resume\("):
        twice.resume(first.id, "yes")

    def r_typo(s: Entries) -> Literal["bb"]:
        return "bb"

    g = StateGraph(Entries, name="messages-router")
    g.add_node("a", ask).add_edge(START, "a").add_conditional_edges("a", r_typo)
    with pytest.raises(GraphValidationError,
                       match=r"router 'r_typo' \(after 'a'\): its return annotation names"):
        g.compile()


def test_breakpoints_given_per_call_pause_that_call() -> None:
    """interrupt_before / interrupt_after on invoke, run and stream (as LangGraph takes
    them): they pause the super-steps that call executes; a later call without them goes on
    (its replay asks again only what was asked); a node that does not exist is refused."""
    from durably import Command

    def node(word: str) -> Callable[[Entries], dict[str, Any]]:
        return lambda s: {"log": [word]}

    g = StateGraph(Entries, name="per-call-breakpoints")
    g.add_node("a", node("a")).add_node("act", node("act")).add_node("c", node("c"))
    g.add_edge(START, "a").add_edge("a", "act").add_edge("act", "c").add_edge("c", END)
    app = g.compile()
    paused = app.run({"log": []}, interrupt_before=["act"])
    assert [i.payload for i in paused.interrupts] == [
        {"before": ["act"], "step": 1, "graph": app.name}]
    assert app.resume(paused.id, True)["log"] == ["a", "act", "c"]
    # answered with invoke(Command(resume=...)) that adds a breakpoint for what it executes
    second = app.run({"log": ["2"]}, interrupt_before=["act"])
    with pytest.raises(durably.RunInterrupted) as err:
        app.invoke(Command(resume=True), run_id=second.id, interrupt_after=["c"])
    assert [i.payload for i in err.value.interrupts] == [
        {"after": ["c"], "step": 2, "graph": app.name}]
    assert app.resume(second.id, True)["log"] == ["2", "a", "act", "c"]
    items = list(app.stream({"log": ["3"]}, mode="updates", interrupt_after="*"))
    assert items[-1]["__interrupt__"][0].payload == {"after": ["a"], "step": 0,
                                                      "graph": app.name}
    # without per-call breakpoints nothing pauses
    assert app.invoke({"log": ["4"]})["log"] == ["4", "a", "act", "c"]
    with pytest.raises(durably.DefinitionError, match=r"interrupt_before= names \['zz'\]"):
        app.invoke({"log": ["5"]}, interrupt_before=["zz"])


def test_interrupt_before_and_after_pause_between_super_steps_and_resume() -> None:
    ran: list[str] = []

    def step(name: str) -> Callable[[Count], dict[str, Any]]:
        def node(state: Count) -> dict[str, Any]:
            ran.append(name)
            return {"seen": [name]}
        node.__name__ = node.__qualname__ = name
        return node

    b = StateGraph(Count, name="breakpoints")
    b.add_node("plan", step("plan")).add_node("act", step("act")).add_node("report",
                                                                           step("report"))
    b.add_edge(START, "plan").add_edge("plan", "act").add_edge("act", "report")
    b.add_edge("report", END)
    app = b.compile(interrupt_before=["act"], interrupt_after="report")
    with pytest.raises(durably.RunInterrupted) as paused:
        app.invoke({"n": 0, "seen": []})
    assert ran == ["plan"]
    assert paused.value.interrupts[0].payload == {"before": ["act"], "step": 1,
                                                  "graph": "breakpoints"}
    run_id = paused.value.run_id
    with pytest.raises(durably.RunInterrupted) as again:
        app.resume(run_id, "go on")
    assert ran == ["plan", "act", "report"]  # (plan replayed, not executed again)
    assert again.value.interrupts[0].payload["after"] == ["report"]
    assert app.resume(run_id, True)["seen"] == ["plan", "act", "report"]
    assert ran == ["plan", "act", "report"]
    everywhere = b.compile(name="breakpoints-all", interrupt_before="*")
    with pytest.raises(durably.RunInterrupted) as first:
        everywhere.invoke({"n": 0, "seen": []})
    assert first.value.interrupts[0].payload["before"] == ["plan"]
    with pytest.raises(GraphValidationError, match=r"names \['acts'\], which are not nodes"):
        b.compile(interrupt_after=["acts"])


# -- stream modes ------------------------------------------------------------------------------
def test_stream_modes_debug_custom_and_several_at_once() -> None:
    def think(state: Count) -> dict[str, Any]:
        durably.get_writer()({"progress": "thinking"})
        return {"n": state["n"] + 1, "seen": ["think"]}

    b = StateGraph(Count, name="stream-modes")
    b.add_node("think", think).add_node("say", lambda s: {"seen": ["say"]})
    b.add_edge(START, "think").add_edge("think", "say").add_edge("say", END)
    app = b.compile()
    state = {"n": 0, "seen": []}
    debug = list(app.stream(state, mode="debug", fresh=True))
    assert [(d["step"], d["node"]) for d in debug] == [(0, "think"), (1, "say")]
    assert debug[0]["update"] == {"n": 1, "seen": ["think"]}
    assert debug[1]["state"] == {"n": 1, "seen": ["think", "say"]}
    assert list(app.stream(state, mode="custom", fresh=True)) == [{"progress": "thinking"}]
    both = list(app.stream(state, mode=["updates", "custom"], fresh=True))
    assert both == [("custom", {"progress": "thinking"}),
                    ("updates", {"think": {"n": 1, "seen": ["think"]}}),
                    ("updates", {"say": {"seen": ["say"]}})]
    with pytest.raises(durably.DefinitionError, match="'debug'"):
        list(app.stream(state, mode=["updates", "tokens"]))
    # LangGraph's keyword names the same option, on stream and astream
    assert list(app.stream(state, stream_mode=["updates", "custom"], fresh=True)) == both

    async def collect() -> list[Any]:
        return [item async for item in app.astream(state, stream_mode="custom", fresh=True)]

    assert asyncio.run(collect()) == [{"progress": "thinking"}]
    with pytest.raises(durably.DefinitionError, match=r"stream_mode='custom'.*pass one"):
        list(app.stream(state, mode="updates", stream_mode="custom"))


def test_continuing_a_stopped_run_streams_only_what_executes_now() -> None:
    """stream(None, run_id=...) of a stopped run yields the super-steps executed by this
    call, not again those streamed before (as stream(resume=...) does, and LangGraph)."""
    def step(s: Count) -> dict[str, Any]:
        return {"n": s["n"] + 1}

    b = StateGraph(Count, name="stream-continue")
    b.add_node("step", step).add_edge(START, "step")
    b.add_conditional_edges("step", lambda s: "step" if s["n"] < 4 else END, ["step"])
    app = b.compile()
    first = []
    for item in app.stream({"n": 0, "seen": []}, mode="updates", run_id="sc1"):
        first.append(item)
        if len(first) == 2:
            break  # stops the run at its next step boundary
    assert durably.get_run("sc1").status == "stopped"
    rest = list(app.stream(None, run_id="sc1", mode="updates"))
    assert [*first, *rest] == [{"step": {"n": n}} for n in (1, 2, 3, 4)]
    assert durably.get_run("sc1").status == "finished"


def test_a_resumed_run_can_be_streamed_graph_and_entrypoint() -> None:
    def ask(state: Count) -> dict[str, Any]:
        return {"seen": [str(durably.interrupt("name?"))]}

    b = StateGraph(Count, name="stream-resume")
    b.add_node("ask", ask).add_edge(START, "ask").add_edge("ask", END)
    app = b.compile()
    items = list(app.stream({"n": 0, "seen": []}, mode="updates"))
    assert "__interrupt__" in items[-1]
    run_id = app.run({"n": 0, "seen": []}).id
    resumed = list(app.stream(resume="ada", run_id=run_id, mode="updates"))
    assert resumed == [{"ask": {"seen": ["ada"]}}]

    @durably.entrypoint
    def greet(who: str) -> str:
        return f"hello {durably.interrupt(f'greet {who}?')}"

    paused = greet.run("ada")
    assert paused.status == "interrupted"
    kinds = [(e.kind, e.data) for e in greet.stream_resume(paused.id, "there")]
    assert kinds[-1] == ("run_finished", "hello there")
    assert durably.get_run(paused.id).status == "finished"
