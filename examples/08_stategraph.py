"""A StateGraph with a router and a bounded cycle: draft → review → (revise → review)* → end.

Nodes are functions ``state -> partial update``; a reducer (``Annotated[list, operator.add]``)
merges a key's updates instead of replacing them; a router picks the next node from the
state; ``max_steps`` bounds every cycle. Each run is durable: every super-step is a
checkpoint in the run's journal, so a crashed run resumes at the super-step where it stopped
and invoking again with the same input replays the finished ones.

    python examples/08_stategraph.py      # runs the graph, prints its path and drawing
    python examples/08_stategraph.py      # again: replayed from the journal
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from durably import END, START, StateGraph


# --8<-- [start:graph]
class Essay(TypedDict):
    topic: str
    text: str
    score: int
    revisions: int
    log: Annotated[list[str], operator.add]  # reducer: updates are appended, not replaced


def draft(state: Essay) -> dict[str, object]:
    return {"text": f"{state['topic']} matters.", "log": ["draft"]}


def review(state: Essay) -> dict[str, object]:
    score = min(10, 3 * state["text"].count("."))  # a stand-in for a reviewer (or a model)
    return {"score": score, "log": [f"review: {score}/10"]}


def revise(state: Essay) -> dict[str, object]:
    extra = [" A crash costs minutes, not hours.", " Reruns are instant.",
             " Nothing runs twice."][state["revisions"] % 3]
    return {"text": state["text"] + extra, "revisions": state["revisions"] + 1,
            "log": [f"revision {state['revisions'] + 1}"]}


def good_enough(state: Essay) -> str:
    """The router: a deterministic function of the state (no model calls in a router)."""
    if state["score"] >= 8 or state["revisions"] >= 3:
        return "done"
    return "revise"


builder = StateGraph(Essay, name="essay")
builder.add_node("draft", draft).add_node("review", review).add_node("revise", revise)
builder.add_edge(START, "draft")
builder.add_edge("draft", "review")
builder.add_conditional_edges("review", good_enough, {"revise": "revise", "done": END})
builder.add_edge("revise", "review")  # the cycle, bounded by the router and by max_steps
app = builder.compile(max_steps=12)
# --8<-- [end:graph]


if __name__ == "__main__":
    run = app.run({"topic": "Durable execution", "text": "", "score": 0, "revisions": 0,
                   "log": []})
    final = run.result
    print("path:", " → ".join(final["log"]))
    print(f"final text ({final['revisions']} revisions, score {final['score']}):",
          final["text"])
    print(run.summary())
    print(app.get_graph(run.id).to_mermaid())  # the declared graph with the path taken
    # one checkpoint per super-step (and one for the input), newest first
    for snap in app.get_state_history(run.id)[::-1]:
        where = "the input" if snap.step < 0 else f"after super-step {snap.step}"
        print(f"  {where:<18} score {snap.values['score']:>2}, next {list(snap.next) or 'END'}")
