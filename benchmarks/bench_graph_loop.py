"""An agent loop as a StateGraph: one node appends a message to a growing list at every
super-step, durably against LangGraph's StateGraph with its SQLite checkpointer.

Run: python benchmarks/bench_graph_loop.py [--steps 100,400] [--message 1000] [--rounds 3]
     [--state typeddict|pydantic]

Each round builds both graphs afresh in one process and runs each to ``--steps`` super-steps,
one after the other; a figure is the median over rounds. Both keep every checkpoint (durably:
its journal; LangGraph: ``SqliteSaver``), so either can resume after a crash.

- **time per super-step**: wall time of the run / super-steps. The state grows by one
  message (``--message`` bytes of text) per super-step, so a checkpoint that writes the whole
  state costs more at every step.
- **checkpoint storage**: bytes on disk once the run ended and its database was closed
  (durably: the store's directory; LangGraph: the SQLite file). durably journals each
  super-step's updates, and the whole state every 64th (``FULL_STATE_EVERY``); LangGraph's
  ``SqliteSaver`` writes the whole checkpoint at every super-step.

``--state pydantic`` runs both with the same state as a pydantic model (``Chat`` as a
``BaseModel``) instead of a ``TypedDict``.
"""

from __future__ import annotations

import argparse
import hashlib
import operator
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import description, positive_int, report

import durably


class Chat(TypedDict):
    messages: Annotated[list[str], operator.add]
    n: int


def chat_model() -> Any:
    """``Chat`` as a pydantic model (pydantic is imported only for ``--state pydantic``)."""
    import pydantic

    class ChatModel(pydantic.BaseModel):
        messages: Annotated[list[str], operator.add] = []
        n: int = 0

    return ChatModel


STATE: dict[str, Any] = {"type": Chat}  # the state class both graphs use (see --state)


def field(state: Any, name: str) -> Any:
    """A field of a state, whether a dict (TypedDict) or a model (pydantic)."""
    return state[name] if isinstance(state, dict) else getattr(state, name)


def message(i: int, size: int) -> str:
    """The i-th message: ``size`` characters of text that does not compress away."""
    seed = hashlib.sha256(str(i).encode()).hexdigest()
    return (seed * (size // len(seed) + 1))[:size - 8] + f"{i:08d}"


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_durably(tmp: Path, steps: int, size: int) -> tuple[float, int]:
    store = durably.DiskStore(tmp / "durably")
    durably.configure(store=store)
    g = durably.StateGraph(STATE["type"], name="agent")
    g.add_node("think", lambda s: {"messages": [message(field(s, "n"), size)],
                                   "n": field(s, "n") + 1})
    g.add_conditional_edges("think",
                            lambda s: durably.END if field(s, "n") >= steps else "think",
                            ["think", durably.END])
    g.add_edge(durably.START, "think")
    app = g.compile(max_steps=steps + 10)
    t = time.perf_counter()
    final = app.invoke({"messages": [], "n": 0})
    elapsed = time.perf_counter() - t
    assert field(final, "n") == steps and len(field(final, "messages")) == steps
    store.close()
    durably.configure()
    return elapsed, dir_bytes(tmp / "durably")


def run_langgraph(tmp: Path, steps: int, size: int) -> tuple[float, int]:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    path = tmp / "langgraph.sqlite"
    con = sqlite3.connect(str(path), check_same_thread=False)
    g = StateGraph(STATE["type"])
    g.add_node("think", lambda s: {"messages": [message(field(s, "n"), size)],
                                   "n": field(s, "n") + 1})
    g.add_conditional_edges("think", lambda s: END if field(s, "n") >= steps else "think",
                            ["think", END])
    g.add_edge(START, "think")
    app = g.compile(checkpointer=SqliteSaver(con))
    config: Any = {"configurable": {"thread_id": "t"}, "recursion_limit": steps + 10}
    t = time.perf_counter()
    final = app.invoke({"messages": [], "n": 0}, config)
    elapsed = time.perf_counter() - t
    assert field(final, "n") == steps and len(field(final, "messages")) == steps
    con.close()
    return elapsed, sum(p.stat().st_size for p in tmp.glob("langgraph.sqlite*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=description(__doc__))
    parser.add_argument("--steps", default="100,400", help="super-steps per run, comma-separated")
    parser.add_argument("--message", type=positive_int, default=1000, help="bytes per message")
    parser.add_argument("--rounds", type=positive_int, default=3)
    parser.add_argument("--state", choices=("typeddict", "pydantic"), default="typeddict",
                        help="the state: a TypedDict (default) or a pydantic model")
    opts = parser.parse_args()
    if opts.state == "pydantic":
        STATE["type"] = chat_model()
    kind = "" if opts.state == "typeddict" else f" ({opts.state} state)"
    rows: list[dict[str, Any]] = []
    for steps in (int(s) for s in opts.steps.split(",")):
        got: dict[str, list[float]] = {"d_s": [], "l_s": [], "d_b": [], "l_b": []}
        for r in range(opts.rounds):
            print(f"{steps} super-steps, round {r + 1}/{opts.rounds}", file=sys.stderr,
                  flush=True)
            with tempfile.TemporaryDirectory() as tmp:
                d_s, d_b = run_durably(Path(tmp), steps, opts.message)
                l_s, l_b = run_langgraph(Path(tmp), steps, opts.message)
            got["d_s"].append(d_s / steps)
            got["l_s"].append(l_s / steps)
            got["d_b"].append(d_b)
            got["l_b"].append(l_b)
        med = {k: statistics.median(v) for k, v in got.items()}
        rows.append({"measure": f"agent loop{kind}, {steps} super-steps: time per super-step",
                     "durably_s": med["d_s"], "other_s": med["l_s"],
                     "ratio": med["d_s"] / med["l_s"], "target": "(info) vs LangGraph"})
        rows.append({"measure": f"agent loop{kind}, {steps} super-steps: checkpoint storage",
                     "durably_mb": med["d_b"] / 1e6, "other_mb": med["l_b"] / 1e6,
                     "ratio": med["d_b"] / med["l_b"], "target": "(info) vs SqliteSaver"})
    report("graph_loop", rows, message_bytes=opts.message, rounds=opts.rounds,
           state=opts.state)


if __name__ == "__main__":
    main()
