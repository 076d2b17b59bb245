"""Where a graph goes next: the targets of a node's edges and routers, a node's Command
(``goto``), the joins that complete, and the frontier entries (a node's name, or a
:class:`Send` and its input).

Apart from the super-step that runs the nodes: routing reads the state after it and the
graph's declared edges, routers and destinations, and raises :class:`InvalidRouteError` for
an undeclared one. :class:`Routing` is a part of the compiled graph (a mixin)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from durably._graph.builder import InvalidRouteError, _Router, callable_name
from durably._graph.structure import END, Command, Send

if TYPE_CHECKING:
    from durably._graph.builder import StateGraph
    from durably._graph.state import Schema


#: what a super-step runs: a node's name (given the state), or a Send (given its input)
Target = str | Send


def _is_command(value: Any) -> bool:
    """A node's Command (durably's, or LangGraph's: ``langgraph.types.Command``)."""
    return isinstance(value, Command) or (
        type(value).__name__ == "Command" and hasattr(value, "goto")
        and hasattr(value, "update") and hasattr(value, "graph"))


def _as_send(value: Any) -> Any:
    """LangGraph's ``langgraph.types.Send`` as durably's (the same call); anything else as
    it is."""
    if not isinstance(value, Send) and type(value).__name__ == "Send" and hasattr(
            value, "node") and hasattr(value, "arg"):
        return Send(value.node, value.arg)
    return value


def _target_name(t: Target) -> str:
    """The node a frontier entry calls."""
    return t.node if isinstance(t, Send) else t


def _without(frontier: list[Target], targets: list[Target]) -> list[Target]:
    """``frontier`` without ``targets``: each node name, and one Send to the same node for
    each Send among them."""
    names = {t for t in targets if not isinstance(t, Send)}
    sends = [t.node for t in targets if isinstance(t, Send)]
    kept: list[Target] = []
    for t in frontier:
        if isinstance(t, Send) and t.node in sends:
            sends.remove(t.node)
        elif not isinstance(t, Send) and t in names:
            pass
        else:
            kept.append(t)
    return kept


def _kind(r: _Router) -> str:
    """What a router's allowed targets are, for its errors."""
    if r.dynamic:
        return "possible targets (the graph's nodes: it declares none)"
    return "destinations (from its annotation)" if r.inferred else "declared destinations"


class Routing:
    """The compiled graph's routing: the next frontier from edges, routers, Commands and
    joins."""

    graph: StateGraph[Any]
    name: str
    schema: Schema

    def _next_from(self, node: str, state: dict[str, Any]) -> list[Target]:
        """The targets of ``node``'s plain edges and routers (joins are handled apart): node
        names, once each, and every :class:`Send` its routers returned."""
        targets: list[Target] = []
        for sources, target in self.graph.edges:
            if sources == (node,) and target not in targets:
                targets.append(target)
        for r in self.graph.routers:
            if r.source == node:
                for t in self._route(r, state):
                    if isinstance(t, Send) or t not in targets:
                        targets.append(t)
        return [t for t in targets if isinstance(t, Send) or t != END]

    def _route(self, r: _Router, state: dict[str, Any]) -> list[Target]:
        try:
            out = r.fn(self.schema.build(state))
        except Exception as e:  # (its type and traceback kept: a note added, as a node's)
            note = (f"durably: raised by router {callable_name(r.fn)!r} (after node "
                    f"{r.source!r}) of graph {self.name!r}")
            if note not in getattr(e, "__notes__", ()):
                e.add_note(note)
            raise
        values = list(out) if isinstance(out, (list, tuple)) else [out]
        targets: list[Target] = []
        for v in values:
            v = _as_send(v)
            if _is_command(v):
                raise InvalidRouteError(
                    f"router {callable_name(r.fn)!r} (after {r.source!r}) returned {v!r:.200}: a "
                    "router returns node names, END or Sends; a Command (an update and where "
                    "to go) is what a node returns. Fix: return the names (or Sends), or "
                    "move the decision into the node and return the Command from it.")
            allowed = list(self.graph.nodes) if r.dynamic else r.names
            if isinstance(v, Send):
                if not isinstance(v.node, str) or v.node not in allowed or v.node == END:
                    raise InvalidRouteError(
                        f"router {callable_name(r.fn)!r} (after {r.source!r}) returned {v!r:.200}, "
                        f"whose node is not among its {_kind(r)} "
                        f"{[n for n in allowed if n != END]}. Fix: send to one of them, or "
                        "declare the node in add_conditional_edges.")
                from durably._keys import serde as _serde

                # journaled with the super-step: refused here, naming the router
                _serde.dumps(v.arg, what=f"the input of {v.node!r} sent by router "
                             f"{callable_name(r.fn)!r} (after {r.source!r})")
                targets.append(v)
                continue
            if r.mapping is not None:
                if v == END and v not in r.mapping:
                    targets.append(END)  # (always allowed)
                elif v not in r.mapping:
                    raise InvalidRouteError(
                        f"router {callable_name(r.fn)!r} (after {r.source!r}) returned "
                        f"{v!r}, which is not among its declared outputs {list(r.mapping)}. "
                        "Fix: return one of them, or declare it in add_conditional_edges.")
                else:
                    targets.append(r.mapping[v])
            else:
                if v != END and (not isinstance(v, str) or v not in allowed):
                    raise InvalidRouteError(
                        f"router {callable_name(r.fn)!r} (after node {r.source!r}) returned "
                        f"{v!r:.200}, which is not among its {_kind(r)} "
                        f"{[n for n in allowed if n != END] + [END]}. Fix: return one of them"
                        + (" (or add the node)." if r.dynamic else
                           ", or declare it in add_conditional_edges."))
                targets.append(v)
        return targets

    def _gotos(self, node: str, command: Any) -> list[Target]:
        """Where a node's Command goes: its ``goto`` as a list of node names and Sends
        (``END`` left out), each checked against the node's declared destinations.

        Raises:
            InvalidRouteError: an undeclared destination, ``graph=`` or ``resume=``."""
        declared = self.graph.node_options[node]["destinations"]
        fix = (f"Fix: declare where it may go: add_node({node!r}, fn, destinations=[...]) or "
               "annotate the node -> Command[Literal[...]].")
        if command.graph is not None:
            raise InvalidRouteError(
                f"node {node!r} returned {command!r:.200}: Command(graph=...) (going to a "
                "node of a parent graph) is not supported. Fix: return the update, and route "
                "in the parent graph on the state it writes.")
        if getattr(command, "resume", None) is not None:
            raise InvalidRouteError(
                f"node {node!r} returned {command!r:.200}: resume= answers an interrupt from "
                "outside the run (app.invoke(Command(resume=answer), run_id=...)), not from a "
                "node. Fix: return Command(update=..., goto=...).")
        goto = command.goto
        targets = list(goto) if isinstance(goto, (list, tuple)) else [goto]
        out: list[Target] = []
        for t in targets:
            t = _as_send(t)
            name = t.node if isinstance(t, Send) else t
            if not isinstance(name, str) or name not in declared:
                raise InvalidRouteError(
                    f"node {node!r} returned a Command going to {t!r:.200}, which is not "
                    f"among its declared destinations {declared}. {fix}")
            if isinstance(t, Send) and name == END:
                raise InvalidRouteError(f"node {node!r} returned a Command sending to END. "
                                        "Fix: send to a node.")
            if t != END:
                out.append(t)
        return out

    def _advance(self, finished: list[str], state: dict[str, Any],
                 joins: dict[str, list[str]], frontier: Sequence[Target] = ()
                 ) -> tuple[list[Target], dict[str, list[str]]]:
        """The next frontier once ``finished`` have run (starting from ``frontier``): their
        edges and routers (node names once each, every Send), and the joins they complete."""
        frontier_next = list(frontier)
        joins = {k: list(v) for k, v in joins.items()}
        for n in finished:
            for t in self._next_from(n, state):
                if isinstance(t, Send) or t not in frontier_next:
                    frontier_next.append(t)
            for sources, target in self.graph.edges:
                if len(sources) > 1 and n in sources:
                    key = f"{'|'.join(sources)}>{target}"
                    done = joins.setdefault(key, [])
                    if n not in done:
                        done.append(n)
                    if set(done) == set(sources):
                        del joins[key]
                        if target != END and target not in frontier_next:
                            frontier_next.append(target)
        return frontier_next, joins
