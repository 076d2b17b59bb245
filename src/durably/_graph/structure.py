"""The declared structure of a StateGraph, for drawing (Mermaid, DOT, SVG)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

N = TypeVar("N")

__all__ = ["END", "START", "Command", "GraphStructure", "Send"]

#: The virtual node every graph starts from.
START = "__start__"
#: The virtual node a path ends at.
END = "__end__"
RESERVED = {START, END}
#: Where a drawing sends a router that declares no destinations (any node, chosen as it runs).
DYNAMIC = "__dynamic__"
_SHOWN = {START: "START", END: "END", DYNAMIC: "any node"}


class Send:
    """One call of a node with an input of its own, returned by a router (LangGraph's
    ``Send``): a router returning ``[Send("grade", doc) for doc in state["docs"]]`` runs
    node ``grade`` once per document, all in the next super-step (in parallel, with the
    other nodes of that super-step), each given its ``doc`` instead of the state. Each
    call's update is applied to the state through the reducers, in the order the router
    returned them; two calls writing one key need a reducer on it.

    Args:
        node: The node to call: one of the router's declared destinations.
        arg: The node's input (picklable: it is journaled with the super-step before).

    Example:
        >>> Send("grade", {"doc": "a.txt"})
        Send(node='grade', arg={'doc': 'a.txt'})
    """

    __slots__ = ("arg", "node")

    def __init__(self, node: str, arg: object) -> None:
        self.node = node
        self.arg = arg

    def __repr__(self) -> str:
        return f"Send(node={self.node!r}, arg={self.arg!r})"

    def __reduce__(self) -> tuple[type[Send], tuple[str, object]]:
        return Send, (self.node, self.arg)


class Command(Generic[N]):
    """What a node returns to update the state and choose the next nodes itself
    (LangGraph's ``Command``): ``Command(update={...}, goto="review")``.

    The node's ``goto`` targets run in the next super-step, besides the targets of its
    edges and routers. They must be declared, as a router's are: in the node's return
    annotation (``-> Command[Literal["review", "__end__"]]``) or with
    ``add_node(name, fn, destinations=[...])``; the graph is validated and drawn from them.

    Args:
        update: The node's update (what it would return without a Command), or None.
        goto: A node name, ``END``, a :class:`Send`, or a list of them. Default: none.
        resume: Only for :meth:`~durably.stategraph.CompiledGraph.invoke`:
            ``app.invoke(Command(resume=answer), run_id=...)`` answers the run's pending
            interrupt, as ``app.resume(run_id, answer)`` does.
        graph: Not supported (LangGraph's ``Command.PARENT`` moves to a parent graph's
            node): a node returning it raises ``InvalidRouteError``.

    Example:
        >>> Command(update={"draft": "v2"}, goto="review")
        Command(update={'draft': 'v2'}, goto='review')
    """

    PARENT = "__parent__"

    __slots__ = ("goto", "graph", "resume", "update")

    def __init__(self, *, update: Any = None, goto: Any = (), resume: Any = None,
                 graph: str | None = None) -> None:
        self.update = update
        self.goto = goto
        self.resume = resume
        self.graph = graph

    def __repr__(self) -> str:
        shown = [f"{k}={getattr(self, k)!r}" for k in ("update", "goto", "resume", "graph")
                 if getattr(self, k) not in (None, ())]
        return f"Command({', '.join(shown)})"

    def __reduce__(self) -> Any:
        return _command, (self.update, self.goto, self.resume, self.graph)


def _command(update: Any, goto: Any, resume: Any, graph: str | None) -> Command[Any]:
    """A Command from its fields (unpickling)."""
    return Command(update=update, goto=goto, resume=resume, graph=graph)


@dataclasses.dataclass(frozen=True)
class GraphStructure:
    """A graph's declared structure, for drawing: nodes, edges (with ``dashed`` and a label
    for router outputs) and, with a run, the path it took.

    Attributes:
        name: The graph's name.
        nodes: Node names (with ``START`` and ``END``).
        edges: ``(source, target, label, conditional)`` tuples; a join appears as one edge
            per source, labelled ``join``.
        visits: With a run overlay: how many times each node ran in that run.
        stopped_at: With a run overlay: the node(s) where the run stopped (interrupted or
            failed), else empty.
        subgraphs: The structure of each node that is a subgraph, by node: drawn inside
            it (a Mermaid ``subgraph``, a DOT cluster), nested as deep as they go.
    """

    name: str
    nodes: tuple[str, ...]
    edges: tuple[tuple[str, str, str, bool], ...]
    visits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    stopped_at: tuple[str, ...] = ()
    subgraphs: Mapping[str, GraphStructure] = dataclasses.field(default_factory=dict)

    def to_mermaid(self) -> str:
        """Mermaid flowchart text; conditional edges dashed and labelled with the router's
        declared outputs; a subgraph node drawn as a ``subgraph`` block holding its own
        nodes and edges; with a run overlay, visited nodes bold with their counts and the
        node where the run stopped highlighted."""
        lines = ["flowchart TD"]
        classes: list[str] = []
        self._mermaid("n", "    ", lines, classes)
        lines.append("    classDef visited stroke-width:3px,fill:#d8f0dc")
        lines.append("    classDef stopped stroke-width:3px,fill:#ffe0b2,stroke:#ef6c00")
        return "\n".join(lines + classes) + "\n"

    def _mermaid(self, prefix: str, indent: str, lines: list[str],
                 classes: list[str]) -> None:
        ids = {n: f"{prefix}{i}" for i, n in enumerate(self.nodes)}
        for n in self.nodes:
            label = _SHOWN.get(n, n)
            if self.visits.get(n):
                label += f" ×{self.visits[n]}"
            sub = self.subgraphs.get(n)
            if sub is not None:
                lines.append(f'{indent}subgraph {ids[n]}["{_mm(label)}"]')
                sub._mermaid(f"{ids[n]}_n", indent + "    ", lines, classes)
                lines.append(f"{indent}end")
                continue
            shape = ("([", "])") if n in _SHOWN else ("[", "]")
            lines.append(f'{indent}{ids[n]}{shape[0]}"{_mm(label)}"{shape[1]}')
        for a, b, label, conditional in self.edges:
            arrow = "-.->" if conditional else "-->"
            text = f'|"{_mm(label)}"|' if label else ""
            lines.append(f"{indent}{ids[a]} {arrow}{text} {ids[b]}")
        for n, count in self.visits.items():
            if count and n in ids and n not in self.stopped_at and n not in self.subgraphs:
                classes.append(f"    class {ids[n]} visited")
        for n in self.stopped_at:
            if n in ids and n not in self.subgraphs:
                classes.append(f"    class {ids[n]} stopped")

    def to_dot(self) -> str:
        """Graphviz DOT text (conditional edges dashed and labelled; a subgraph node drawn as
        a cluster holding its own nodes and edges)."""
        lines = [f'digraph "{_dot(self.name)}" {{', "  rankdir=TB;",
                 '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", '
                 'fontname="Helvetica"];']
        if self.subgraphs:
            lines.insert(2, "  compound=true;")
        self._dot("n", "  ", lines)
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _dot(self, prefix: str, indent: str, lines: list[str]) -> None:
        ids = {n: f"{prefix}{i}" for i, n in enumerate(self.nodes)}
        for n in self.nodes:
            label = _SHOWN.get(n, n)
            if self.visits.get(n):
                label += f" ×{self.visits[n]}"
            sub = self.subgraphs.get(n)
            if sub is not None:
                lines.append(f"{indent}subgraph cluster_{ids[n]} {{")
                lines.append(f'{indent}  label="{_dot(label)}"; style=rounded;')
                sub._dot(f"{ids[n]}_n", indent + "  ", lines)
                lines.append(f"{indent}}}")
                continue
            attrs = [f'label="{_dot(label)}"']
            if n in _SHOWN:
                attrs.append("shape=oval" if n != DYNAMIC else 'shape=oval, style="dashed"')
            if n in self.stopped_at:
                attrs.append('fillcolor="#ffe0b2", penwidth=3')
            elif self.visits.get(n):
                attrs.append('fillcolor="#d8f0dc", penwidth=2')
            lines.append(f"{indent}{ids[n]} [{', '.join(attrs)}];")
        for a, b, label, conditional in self.edges:
            attrs = []
            if conditional:
                attrs.append("style=dashed")
            if label:
                attrs.append(f'label="{_dot(label)}"')
            # an edge to or from a subgraph: from its END, to its START, clipped at its box
            tail, head = ids[a], ids[b]
            if a in self.subgraphs:
                attrs.append(f"ltail=cluster_{tail}")
                tail = f"{tail}_n{self.subgraphs[a].nodes.index(END)}"
            if b in self.subgraphs:
                attrs.append(f"lhead=cluster_{head}")
                head = f"{head}_n{self.subgraphs[b].nodes.index(START)}"
            suffix = f" [{', '.join(attrs)}]" if attrs else ""
            lines.append(f"{indent}{tail} -> {head}{suffix};")

    def to_svg(self) -> str:
        """SVG drawn by Graphviz.

        Raises:
            RenderError: graphviz (the package or the ``dot`` program) is missing.
        """
        from durably.render import _pipe_svg

        return _pipe_svg(self.to_dot())


def _mm(text: str) -> str:
    return (text.replace("&", "#amp;").replace('"', "#quot;").replace("<", "#lt;")
            .replace(">", "#gt;"))


def _dot(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
