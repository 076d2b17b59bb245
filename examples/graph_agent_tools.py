"""An agent ⇄ tools loop as a StateGraph, with a scripted fake LLM.

The agent node asks the "LLM" what to do; a router sends tool calls to the tools node and
the final answer to END. The loop is bounded by max_steps and every node call is journaled:
kill the script halfway and run it again, and finished steps are not executed twice.

    python examples/graph_agent_tools.py
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from durably import END, START, StateGraph


class State(TypedDict):
    question: str
    messages: Annotated[list[dict[str, Any]], operator.add]


def fake_llm(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A scripted model: call the calculator, then the unit converter, then answer."""
    tool_results = [m for m in messages if m["role"] == "tool"]
    if len(tool_results) == 0:
        return {"role": "assistant", "tool": "multiply", "args": [12, 7]}
    if len(tool_results) == 1:
        return {"role": "assistant", "tool": "km_to_miles", "args": [tool_results[0]["content"]]}
    return {"role": "assistant", "content": f"It is {tool_results[-1]['content']} miles."}


TOOLS = {
    "multiply": lambda a, b: a * b,
    "km_to_miles": lambda km: round(km * 0.621371, 2),
}


def agent(state: State) -> dict[str, Any]:
    history = [{"role": "user", "content": state["question"]}, *state["messages"]]
    return {"messages": [fake_llm(history)]}


def tools(state: State) -> dict[str, Any]:
    call = state["messages"][-1]
    result = TOOLS[call["tool"]](*call["args"])
    return {"messages": [{"role": "tool", "tool": call["tool"], "content": result}]}


def route(state: State) -> str:
    return "tools" if "tool" in state["messages"][-1] else END


builder = StateGraph(State, name="agent_tools")
builder.add_node("agent", agent).add_node("tools", tools)
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", route, ["tools", END])
builder.add_edge("tools", "agent")
app = builder.compile(max_steps=10)

if __name__ == "__main__":
    final = app.invoke({"question": "How many miles are 12 x 7 km?", "messages": []})
    for message in final["messages"]:
        print(message)
    print("answer:", final["messages"][-1]["content"])
    print(app.get_graph().to_mermaid())
