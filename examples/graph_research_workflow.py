"""The research workflow: classify → (clarify | search ‖ docs) → draft → review → at most
two revisions → escalate.

The structure is guaranteed by the graph, not suggested by a prompt: a vague question goes
to `clarify` (which asks a person with interrupt()), a clear one to `search` and `docs` in
parallel; the draft is reviewed, revised at most twice (a counter in the state), and then
escalated to a person instead of looping. The fake "models" are scripted.

    python examples/graph_research_workflow.py "How do durable workflows resume?"
    python examples/graph_research_workflow.py "stuff?"          # asks for clarification
"""

from __future__ import annotations

import operator
import sys
from typing import Annotated, Any, TypedDict

import durably
from durably import END, START, StateGraph

MAX_REVISIONS = 2


class State(TypedDict):
    question: str
    sources: Annotated[list[str], operator.add]
    draft: str
    revisions: int
    verdict: str


def classify(state: State) -> dict[str, Any]:
    return {"verdict": "vague" if len(state["question"].split()) < 3 else "clear"}


def route_question(state: State) -> list[str] | str:
    return "clarify" if state["verdict"] == "vague" else ["search", "docs"]


def clarify(state: State) -> dict[str, Any]:
    better = durably.interrupt({"please clarify": state["question"]})
    return {"question": str(better), "verdict": "clear"}


def search(state: State) -> dict[str, Any]:
    return {"sources": [f"web: {state['question']}"]}


def docs(state: State) -> dict[str, Any]:
    return {"sources": [f"docs: {state['question']}"]}


def draft(state: State) -> dict[str, Any]:
    return {"draft": f"Answer v{state['revisions'] + 1} from {len(state['sources'])} sources"}


def review(state: State) -> dict[str, Any]:
    # a scripted strict reviewer: never satisfied, so the bound is what ends the loop
    return {"verdict": "needs work"}


def route_review(state: State) -> str:
    if state["verdict"] == "ok":
        return END
    return "revise" if state["revisions"] < MAX_REVISIONS else "escalate"


def revise(state: State) -> dict[str, Any]:
    return {"revisions": state["revisions"] + 1}


def escalate(state: State) -> dict[str, Any]:
    return {"verdict": f"escalated after {state['revisions']} revisions"}


builder = StateGraph(State, name="research_workflow")
for name, fn in [("classify", classify), ("clarify", clarify), ("search", search),
                 ("docs", docs), ("draft", draft), ("review", review), ("revise", revise),
                 ("escalate", escalate)]:
    builder.add_node(name, fn)
builder.add_edge(START, "classify")
builder.add_conditional_edges("classify", route_question, ["clarify", "search", "docs"])
builder.add_conditional_edges("clarify", lambda s: ["search", "docs"], ["search", "docs"])
builder.add_edge(["search", "docs"], "draft")
builder.add_edge("draft", "review")
builder.add_conditional_edges("review", route_review, ["revise", "escalate", END])
builder.add_edge("revise", "draft")
builder.add_edge("escalate", END)
app = builder.compile(max_steps=20)

if __name__ == "__main__":
    question = sys.argv[1] if len(sys.argv) > 1 else "How do durable workflows resume?"
    initial = {"question": question, "sources": [], "draft": "", "revisions": 0, "verdict": ""}
    run = app.run(initial)
    if run.status == "interrupted":
        print("ASKED:", run.interrupts[0].payload)
        final = app.resume(run.id, "How do durable workflows resume after a crash?")
    else:
        final = run.result
    print("question:", final["question"])
    print("sources:", final["sources"])
    print("draft:", final["draft"])
    print("verdict:", final["verdict"])
    visits = app.get_graph(run.id).visits
    print("nodes run:", ", ".join(f"{node} ×{n}" for node, n in visits.items()))
