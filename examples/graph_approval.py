"""An approval flow across two processes: draft → interrupt for approval → (reject with
feedback → redraft → ask again) → approve → publish.

    python examples/graph_approval.py start "durable workflows"
    python examples/graph_approval.py answer <run-id> "reject: shorter please"
    python examples/graph_approval.py answer <run-id> approve

Each command is a separate process: the run waits in the store between them.
"""

from __future__ import annotations

import argparse
import contextlib
import operator
from typing import Annotated, Any, TypedDict

import durably
from durably import END, START, StateGraph


class State(TypedDict):
    topic: str
    draft: str
    feedback: Annotated[list[str], operator.add]
    published: str


def write(state: State) -> dict[str, Any]:
    text = f"A post about {state['topic']}"
    for note in state["feedback"]:
        text += f" (revised: {note})"
    return {"draft": text}


def review(state: State) -> dict[str, Any]:
    verdict = str(durably.interrupt({"approve this draft?": state["draft"]}))
    if verdict.startswith("reject"):
        return {"feedback": [verdict.partition(":")[2].strip() or "try again"]}
    return {}


def after_review(state: State) -> str:
    # the review node added feedback when it rejected this draft
    return "write" if len(state["feedback"]) > state["draft"].count("(revised:") else "publish"


def publish(state: State) -> dict[str, Any]:
    return {"published": state["draft"].upper()}


builder = StateGraph(State, name="approval")
builder.add_node("write", write).add_node("review", review).add_node("publish", publish)
builder.add_edge(START, "write").add_edge("write", "review")
builder.add_conditional_edges("review", after_review, ["write", "publish"])
builder.add_edge("publish", END)
app = builder.compile(max_steps=12)


def report(run: Any) -> None:
    if run.status == "interrupted":
        [pending] = run.interrupts
        print(f"WAITING run={run.id} draft={pending.payload['approve this draft?']!r}")
    else:
        print(f"PUBLISHED {run.result['published']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.partition("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="draft a post and wait for its approval")
    start.add_argument("topic")
    answer = commands.add_parser("answer", help="answer the run waiting for approval")
    answer.add_argument("run_id")
    answer.add_argument("answer", help='"approve", or "reject: what to change"')
    args = parser.parse_args()
    if args.command == "start":
        report(app.run({"topic": args.topic, "draft": "", "feedback": [], "published": ""}))
    else:
        with contextlib.suppress(durably.RunInterrupted):  # asked again: reported below
            app.resume(args.run_id, args.answer)
        report(durably.get_run(args.run_id))
