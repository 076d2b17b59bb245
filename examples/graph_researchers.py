"""Parallel researchers merged into one report through a reducer.

Three researcher nodes run in the same super-step (in parallel); each appends its findings
to `findings`, whose reducer is `operator.add`, so the merge is deterministic (node order,
not finishing order). A join then writes the report once all three have finished.

    python examples/graph_researchers.py
"""

from __future__ import annotations

import operator
import time
from typing import Annotated, Any, TypedDict

from durably import END, START, StateGraph


class State(TypedDict):
    topic: str
    findings: Annotated[list[str], operator.add]
    report: str


def researcher(angle: str, seconds: float) -> Any:
    def research(state: State) -> dict[str, Any]:
        time.sleep(seconds)  # pretend to read; they overlap in time
        return {"findings": [f"{angle}: what matters about {state['topic']}"]}

    research.__name__ = research.__qualname__ = f"research_{angle}"
    return research


def write_report(state: State) -> dict[str, Any]:
    lines = "\n".join(f"- {f}" for f in state["findings"])
    return {"report": f"# {state['topic']}\n{lines}"}


builder = StateGraph(State, name="researchers")
angles = {"history": 0.3, "economics": 0.1, "technology": 0.2}
for angle, seconds in angles.items():
    builder.add_node(angle, researcher(angle, seconds))
    builder.add_edge(START, angle)
builder.add_node("report", write_report)
builder.add_edge(list(angles), "report").add_edge("report", END)
app = builder.compile()

if __name__ == "__main__":
    started = time.perf_counter()
    final = app.invoke({"topic": "durable execution", "findings": [], "report": ""})
    print(final["report"])
    print(f"took {time.perf_counter() - started:.2f} s (the researchers ran in parallel)")
