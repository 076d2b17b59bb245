"""StateGraph: explicit graphs of nodes over a typed state, run on the durable runtime.

A graph is built from nodes (functions ``state -> partial update``), edges, joins and
routers, validated all at once by :meth:`StateGraph.compile`, and executed in
**super-steps** (as in Pregel and LangGraph): every ready node runs in parallel, then their
updates are applied in node order through the state's reducers, then edges and routers pick
the next nodes.

On the runtime, a compiled graph is an entrypoint: each invocation is a run with a journal.
Each super-step is a journaled step (its result is the state after it: a checkpoint) and
each node call is a journaled step nested in it. A crashed run resumes at the super-step
where it stopped: finished super-steps replay from the journal, and in the super-step that
was running, nodes that had finished replay while the others execute. ``interrupt()`` in a
node pauses the run; interrupts of parallel nodes are collected together.

Routers are plain (sync) functions of the state and are re-evaluated only inside super-steps
that execute, so they must be deterministic (a router is not a place for an LLM call: make
that a node that writes its decision into the state, and route on the state).

Worth knowing: a run ends when no node is ready (as in LangGraph), also when a router returned
an empty list or a join never completed, without reaching END; a subgraph with another state
type reads and writes only the keys both states have; from async code, ``ainvoke``,
``aresume`` and ``astream`` run the graph in a worker thread (the run itself is synchronous).
"""

from __future__ import annotations

from durably._graph.builder import (
    GraphChangedError,
    GraphValidationError,
    InvalidRouteError,
    StateGraph,
    StepLimitError,
)
from durably._graph.state import InvalidUpdateError
from durably._graph.structure import END, START, Command, GraphStructure, Send

# isort: split
# (after the names above: the reference renders the names in the order they are imported.
# Sent, StepResult, Writes: journals of earlier releases name what a super-step journals
# here, its result, a subgraph node's writes, the updates of Send calls: they are found here
# when read back)
from durably._graph.checkpoints import Sent as Sent
from durably._graph.checkpoints import StateSnapshot
from durably._graph.checkpoints import StepResult as StepResult
from durably._graph.checkpoints import Writes as Writes
from durably._graph.compiled import CompiledGraph

# the errors a user catches are documented here: tracebacks and reprs name them here too
for _error in (GraphChangedError, GraphValidationError, InvalidRouteError, StepLimitError,
               InvalidUpdateError):
    _error.__module__ = __name__
del _error

__all__ = [
    "END",
    "START",
    "Command",
    "CompiledGraph",
    "GraphChangedError",
    "GraphStructure",
    "GraphValidationError",
    "InvalidRouteError",
    "InvalidUpdateError",
    "Send",
    "StateGraph",
    "StateSnapshot",
    "StepLimitError",
]
