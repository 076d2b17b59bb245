"""A ReAct loop (thought → action → observation) as a StateGraph with a scripted fake LLM.

Each turn is three nodes; a router decides after each observation whether to think again or
finish. A counter in the state and an explicit `give_up` node bound the loop before
max_steps would stop it.

    python examples/graph_react.py
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from durably import END, START, StateGraph

SCRIPT = [  # what the fake model "thinks" and which action it takes, turn by turn
    ("I should look up the capital of France.", ("search", "capital of France")),
    ("Paris it is; now its population.", ("search", "population of Paris")),
    ("I know enough to answer.", ("finish", "Paris, about 2.1 million people")),
]
WORLD = {"capital of France": "Paris", "population of Paris": "2.1 million (city proper)"}
MAX_TURNS = 5


class State(TypedDict):
    question: str
    turn: int
    trace: Annotated[list[str], operator.add]
    answer: str


def thought(state: State) -> dict[str, Any]:
    text, _ = SCRIPT[min(state["turn"], len(SCRIPT) - 1)]
    return {"trace": [f"Thought: {text}"]}


def action(state: State) -> dict[str, Any]:
    kind, arg = SCRIPT[min(state["turn"], len(SCRIPT) - 1)][1]
    if kind == "finish":
        return {"trace": [f"Action: finish[{arg}]"], "answer": arg}
    return {"trace": [f"Action: {kind}[{arg}]"]}


def observation(state: State) -> dict[str, Any]:
    query = state["trace"][-1].partition("[")[2].rstrip("]")
    return {"trace": [f"Observation: {WORLD.get(query, 'nothing found')}"],
            "turn": state["turn"] + 1}


def after_action(state: State) -> str:
    return END if state["answer"] else "observation"


def after_observation(state: State) -> str:
    return "give_up" if state["turn"] >= MAX_TURNS else "thought"


def give_up(state: State) -> dict[str, Any]:
    return {"answer": "I could not find out."}


builder = StateGraph(State, name="react")
for name, fn in [("thought", thought), ("action", action), ("observation", observation),
                 ("give_up", give_up)]:
    builder.add_node(name, fn)
builder.add_edge(START, "thought").add_edge("thought", "action")
builder.add_conditional_edges("action", after_action, ["observation", END])
builder.add_conditional_edges("observation", after_observation, ["thought", "give_up"])
builder.add_edge("give_up", END)
app = builder.compile(max_steps=3 * MAX_TURNS + 2)

if __name__ == "__main__":
    final = app.invoke({"question": "What is the capital of France and how big is it?",
                        "turn": 0, "trace": [], "answer": ""})
    print("\n".join(final["trace"]))
    print("answer:", final["answer"])
