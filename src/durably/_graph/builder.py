"""The StateGraph builder (nodes, edges, joins, routers; validation) and the graph errors.
Public names are re-exported by :mod:`durably.stategraph`."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import inspect
import itertools
import json
import re
import sys
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import xxhash

from durably._graph.state import Schema
from durably._graph.structure import END, RESERVED, START
from durably.exceptions import DefinitionError, DurablyError, RunStateError
from durably.store import Store

if TYPE_CHECKING:
    from durably._graph.compiled import CompiledGraph

__all__ = [
    "GraphChangedError",
    "GraphValidationError",
    "InvalidRouteError",
    "StateGraph",
    "StepLimitError",
]

S = TypeVar("S")


# -- errors ------------------------------------------------------------------------------------
class GraphValidationError(DefinitionError):
    """The graph is not well formed. ``problems`` lists every problem found (compile checks
    everything at once)."""

    def __init__(self, name: str, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"graph {name!r} has {len(problems)} problem(s):\n- "
                         + "\n- ".join(problems))


class InvalidRouteError(DurablyError):
    """A router returned a destination it did not declare."""


class StepLimitError(DurablyError):
    """The run exceeded ``max_steps`` super-steps. ``path`` lists the nodes of each
    super-step taken."""

    def __init__(self, message: str, path: list[list[str]]) -> None:
        super().__init__(message)
        self.path = path


class GraphChangedError(RunStateError):
    """A run is resumed under a graph whose structure or node code changed since its
    checkpoints were written. ``changes`` says what changed; pass ``migrate=`` to accept."""

    def __init__(self, message: str, changes: list[str]) -> None:
        super().__init__(message)
        self.changes = changes


# -- the builder -------------------------------------------------------------------------------
@dataclasses.dataclass
class _Router:
    source: str
    fn: Callable[[Any], Any]
    mapping: dict[Any, str] | None  # router output -> node (None: outputs are node names)
    names: list[str]  # declared destinations (node names or END)
    dynamic: bool = False  # none declared nor annotated: any node (or END), checked at run
    inferred: bool = False  # names read from the router's ``-> Literal[...]`` annotation


class StateGraph(Generic[S]):
    """Build a graph of nodes over a state type.

    Args:
        state: A ``TypedDict``, dataclass or pydantic model class. Per-key reducers come
            from ``Annotated[type, reducer]`` (for example ``Annotated[list[str],
            operator.add]``), where a reducer is ``(current, update) -> merged``; keys
            without one are replaced by updates.
        name: The graph's name (the name of its runs and of its steps). Default: the state
            type's name with ``graph`` and 8 hex digits of its structure appended
            (``Stategraph-1f0c9a2e``): its nodes, edges, routers (destinations and
            ``path_map``), reducers and subgraphs, functions by qualified name, not code
            (fixing a node's code keeps its runs). So two graphs over one state type never
            share runs; name a graph to keep its runs across changes to its structure (then a
            run checkpointed under another structure raises
            :class:`~durably.stategraph.GraphChangedError`, and ``migrate=`` continues it).

    Raises:
        DefinitionError: ``state`` is not a TypedDict, dataclass or pydantic model.

    Example:
        >>> import operator, tempfile
        >>> from typing import Annotated, TypedDict
        >>> import durably
        >>> from durably import StateGraph, START, END
        >>> class State(TypedDict):
        ...     topic: str
        ...     notes: Annotated[list[str], operator.add]
        >>> def search(state): return {"notes": [f"web on {state['topic']}"]}
        >>> def docs(state): return {"notes": [f"docs on {state['topic']}"]}
        >>> builder = StateGraph(State, name="research")
        >>> _ = builder.add_node("search", search).add_node("docs", docs)
        >>> _ = builder.add_edge(START, "search").add_edge(START, "docs")
        >>> _ = builder.add_edge(["search", "docs"], END)
        >>> app = builder.compile(store=durably.DiskStore(tempfile.mkdtemp()))
        >>> app.invoke({"topic": "owls", "notes": []})["notes"]
        ['web on owls', 'docs on owls']
    """

    def __init__(self, state: type[S], *, name: str | None = None) -> None:
        caller = sys._getframe(1)
        self.schema = Schema(state, {**caller.f_globals, **caller.f_locals})
        self.name = name or f"{state.__name__}graph"
        self.named = name is not None  # (else compile() adds a digest of the structure)
        self.nodes: dict[str, Any] = {}
        self.node_options: dict[str, dict[str, Any]] = {}
        self.edges: list[tuple[tuple[str, ...], str]] = []
        self.routers: list[_Router] = []
        self.problems: list[str] = []
        self.module = _caller_module()

    def add_node(self, name: Any, fn: Any = None, *, cache: bool = False,
                 destinations: Sequence[str] | None = None) -> StateGraph[S]:
        """Add a node: ``fn(state) -> update`` (sync or async), or a compiled graph (a
        subgraph: it runs on the current state, and its update is what its own nodes wrote,
        applied in order through this graph's reducers).

        Args:
            name: Unique node name (not ``START``/``END``); or the function alone, named by
                its ``__name__`` (``add_node(fetch)``, as LangGraph allows).
            fn: The node function, or a :class:`CompiledGraph`.
            cache: True to also serve the node from the cross-run cache when its code and
                input state are unchanged. Default False: a node is journaled in its run
                (never executed twice there) but executes in every new run, as agents and
                LLM calls usually should.
            destinations: The nodes (and/or ``END``) a node returning
                :class:`~durably.Command` may ``goto``. Default: read from its return
                annotation (``-> Command[Literal["a", "b"]]``), else none.

        Returns:
            The builder (calls chain).
        """
        if fn is None and not isinstance(name, str) and callable(name):
            # named as LangGraph names it: its __name__ (a partial, an object: its class's)
            fn, name = name, getattr(name, "__name__", None) or type(name).__name__
        if not isinstance(name, str) or not name:
            self.problems.append(f"a node name must be a non-empty string, not {name!r}")
            return self
        if name in RESERVED:
            self.problems.append(f"node name {name!r} is reserved (START/END)")
            return self
        if name in self.nodes:
            self.problems.append(f"node {name!r} is added twice")
            return self
        if not (callable(fn) or hasattr(fn, 'fingerprint_digest')):
            self.problems.append(f"node {name!r} is not callable: {fn!r}")
            return self
        if destinations is None:
            destinations = _command_destinations(fn)
        elif isinstance(destinations, str) or not all(
                isinstance(d, str) for d in destinations):
            self.problems.append(f"add_node({name!r}, destinations={destinations!r}): give a "
                                 "list of node names (and/or END)")
            return self
        self.nodes[name] = fn
        self.node_options[name] = {"cache": cache, "destinations": list(destinations or ())}
        return self

    def add_sequence(self, nodes: Sequence[Any]) -> StateGraph[S]:
        """Add nodes that run one after the other, each a function (named by its
        ``__name__``) or a ``(name, function)`` pair, with an edge from each to the next
        (LangGraph's ``add_sequence``); the first still needs an edge into it.

        Returns:
            The builder.
        """
        if not nodes:
            self.problems.append("add_sequence([]) names no node: give it at least one")
            return self
        names: list[str] = []
        for node in nodes:
            name, fn = node if isinstance(node, tuple) else (
                getattr(node, "__name__", None) or type(node).__name__, node)
            self.add_node(name, fn)
            names.append(name)
        for a, b in itertools.pairwise(names):
            self.add_edge(a, b)
        return self

    def set_entry_point(self, name: str) -> StateGraph[S]:
        """``add_edge(START, name)`` (LangGraph's name for it)."""
        return self.add_edge(START, name)

    def set_finish_point(self, name: str) -> StateGraph[S]:
        """``add_edge(name, END)`` (LangGraph's name for it)."""
        return self.add_edge(name, END)

    def add_edge(self, source: str | Sequence[str], target: str) -> StateGraph[S]:
        """Add an edge. ``add_edge([a, b], c)`` is a join: ``c`` runs once both ``a`` and
        ``b`` have finished. Several edges out of one node fan out: their targets run in the
        same super-step.

        Returns:
            The builder.
        """
        if isinstance(source, str):
            sources: tuple[str, ...] = (source,)
        elif isinstance(source, (list, tuple)) and source:
            sources = tuple(source)
        else:
            self.problems.append(f"add_edge({source!r}, {target!r}): the source must be a node "
                                 "name or a non-empty list of names")
            return self
        bad = [x for x in (*sources, target) if not isinstance(x, str)]
        if bad:
            self.problems.append(f"add_edge({source!r}, {target!r}): node names are strings, "
                                 f"not {bad}")
            return self
        self.edges.append((sources, target))
        return self

    def add_conditional_edges(self, source: str, router: Callable[[Any], Any],
                              destinations: Sequence[str] | Mapping[Any, str] | None = None
                              ) -> StateGraph[S]:
        """Route from ``source`` by a function of the state.

        Args:
            source: The node after which the router runs (or ``START``).
            router: ``state -> name``, a list of names (fan out), or ``END``.
            destinations: What the router may return: a list of node names, or a
                mapping from router outputs to node names. Default: read from the router's
                return annotation (``-> Literal["a", "b"]``), else any node (a *dynamic*
                router: each value it returns is checked when it returns it, and the
                drawing shows one dynamic edge). ``END`` is always allowed. The graph is
                drawn and validated from them, and a router returning anything else raises
                :class:`InvalidRouteError` at run time.

        Example:
            >>> from typing import Literal, TypedDict
            >>> from durably import StateGraph, START, END
            >>> class S(TypedDict):
            ...     n: int
            >>> def more(state: S) -> Literal["inc", "__end__"]:
            ...     return "inc" if state["n"] < 3 else END
            >>> b = StateGraph(S, name="count")
            >>> _ = b.add_node("inc", lambda s: {"n": s["n"] + 1}).add_edge(START, "inc")
            >>> _ = b.add_conditional_edges("inc", more)  # destinations from the annotation
            >>> b.routers[0].names
            ['inc', '__end__']

        Returns:
            The builder.
        """
        if not callable(router):
            self.problems.append(f"the router of {source!r} is not callable: {router!r}")
            return self
        if not destinations:
            inferred = _literal_destinations(router, command=False)
            self.routers.append(_Router(source, router, None, inferred or [],
                                        dynamic=not inferred, inferred=bool(inferred)))
            return self
        if isinstance(destinations, Mapping):
            mapping = dict(destinations)
            names = list(dict.fromkeys(mapping.values()))
        else:
            mapping = None
            names = list(destinations)
        self.routers.append(_Router(source, router, mapping, names))
        return self

    def compile(self, *, max_steps: int = 25, store: Store | None = None,
                name: str | None = None, interrupt_before: Sequence[str] | str = (),
                interrupt_after: Sequence[str] | str = (),
                timeout: float | None = None) -> CompiledGraph[S]:
        """Validate the graph and make it runnable.

        Args:
            max_steps: The most super-steps one run may take (cycles are bounded by it).
            store: Where its runs live. Default: the configured store.
            name: Override the graph's name (see :class:`StateGraph`).
            interrupt_before: Nodes (or ``"*"``: every node) before which a run pauses, as
                if the graph called ``durably.interrupt({"before": [...], "step": n})``
                between two super-steps: the run is interrupted, and ``app.resume(run_id,
                True)`` (any answer but None; ``update_state`` first to change the state)
                continues it with that super-step (LangGraph's breakpoints).
            interrupt_after: Nodes (or ``"*"``) after whose super-step a run pauses, the
                same way (``{"after": [...], "step": n}``).
            timeout: Seconds one call of a run (``invoke``, ``resume``, ...) may take, as
                ``@entrypoint(timeout=...)``: then the run stops (``stopped``, resumable:
                ``app.invoke(None, run_id=...)`` continues it, with the whole timeout
                again) and the call raises :class:`~durably.RunTimeoutError`. Default None.

        Returns:
            A :class:`CompiledGraph`.

        Raises:
            GraphValidationError: lists every problem at once: unknown nodes in edges, nodes
                with no way out, nodes unreachable from ``START``, ``END`` unreachable,
                duplicate or reserved names, routers without destinations.
        """
        if not isinstance(max_steps, int) or max_steps < 1:
            raise DefinitionError(f"compile(max_steps=...) must be a positive int, not "
                                  f"{max_steps!r}")
        named = name is not None or self.named
        name = name or self.name
        problems = list(self.problems) + self._check()
        breakpoints: dict[str, frozenset[str]] = {}
        for option, given in (("interrupt_before", interrupt_before),
                              ("interrupt_after", interrupt_after)):
            nodes = [given] if isinstance(given, str) else list(given)
            if nodes == ["*"]:
                nodes = list(self.nodes)
            unknown = [n for n in nodes if n not in self.nodes]
            if unknown:
                problems.append(f"compile({option}=...) names {unknown}, which are not nodes; "
                                f"the nodes are {sorted(self.nodes)} (or '*' for all)")
            breakpoints[option] = frozenset(nodes)
        if problems:
            raise GraphValidationError(name, problems)
        if not named:  # two graphs over one state type never share runs (nor steps)
            name = f"{name}-{self._structure_digest()}"
        # (here: the compiled graph is made of this module's errors and routers, so its module
        # imports this one)
        from durably._decorators.entrypoints import _timeout_option
        from durably._graph.compiled import CompiledGraph

        app = CompiledGraph(self._snapshot(), name, max_steps, store,
                            breakpoints["interrupt_before"], breakpoints["interrupt_after"])
        app._entry._self_timeout = _timeout_option(timeout, "compile(timeout=...)")
        return app

    def _structure_digest(self) -> str:
        """8 hex digits of the graph's structure: its nodes and the functions they call, its
        edges, its routers (their functions, destinations and ``path_map``), its state's
        reducers and each subgraph's own structure. Functions are known by qualified name,
        not code: fixing a node's code keeps its runs (whose checkpoints say what changed),
        while graphs calling other functions never share runs."""
        return xxhash.xxh3_64_hexdigest(json.dumps(self._shape()).encode())[:8]

    def _shape(self) -> list[Any]:
        """The graph's structure as JSON (see :meth:`_structure_digest`)."""
        def who(fn: Any) -> Any:
            inner = getattr(fn, "graph", None)
            if hasattr(fn, "fingerprint_digest") and isinstance(inner, StateGraph):
                return ["graph", str(getattr(fn, "name", "")), inner._shape()]
            return callable_name(fn, qualified=True)

        return [
            {n: who(fn) for n, fn in sorted(self.nodes.items())},
            sorted([list(sources), target] for sources, target in self.edges),
            sorted([r.source, who(r.fn), sorted(set(map(str, r.names)) - {END}),
                    sorted([repr(k), v] for k, v in (r.mapping or {}).items())]
                   for r in self.routers),
            {k: who(fn) for k, fn in sorted(self.schema.reducers.items())},
            {n: sorted(o.get("destinations") or ()) for n, o in sorted(self.node_options.items())},
        ]

    def _snapshot(self) -> StateGraph[S]:
        """A copy of this builder as it is now: what a compiled graph runs, so that nodes and
        edges added to the builder later never reach a graph compiled before."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.nodes = dict(self.nodes)
        copy.node_options = {n: dict(o) for n, o in self.node_options.items()}
        copy.edges = list(self.edges)
        copy.routers = [dataclasses.replace(r, names=list(r.names),
                                            mapping=None if r.mapping is None else dict(r.mapping))
                        for r in self.routers]
        copy.problems = list(self.problems)
        return copy

    def _check(self) -> list[str]:
        problems: list[str] = []
        known = set(self.nodes) | RESERVED
        out: dict[str, set[str]] = {n: set() for n in [START, *self.nodes]}
        for sources, target in self.edges:
            if len(sources) > 1 and START in sources:
                problems.append(f"edge {list(sources)} -> {target!r}: START cannot be part of "
                                f"a join. Fix: add_edge(START, ...) separately")
            for s in sources:
                if s not in known:
                    problems.append(f"edge {list(sources)} -> {target!r}: unknown node {s!r}")
                elif s == END:
                    problems.append(f"edge {list(sources)} -> {target!r}: END has no way out")
                else:
                    out[s].add(target)
            if target not in known:
                problems.append(f"edge {list(sources)} -> {target!r}: unknown node {target!r}")
            elif target == START:
                problems.append(f"edge {list(sources)} -> START: nothing goes into START")
        for r in self.routers:
            if r.source not in known or r.source == END:
                problems.append(f"router {callable_name(r.fn)!r}: unknown source node {r.source!r}")
                continue
            out[r.source].add(END)  # (always allowed)
            if r.dynamic:
                out[r.source].update(self.nodes)
            for d in r.names:
                if d not in known or d == START:
                    where = "its return annotation names" if r.inferred else "declares"
                    problems.append(f"router {callable_name(r.fn)!r} (after {r.source!r}): "
                                    f"{where} unknown destination {d!r}; the nodes are "
                                    f"{sorted(self.nodes)} and END")
                else:
                    out[r.source].add(d)
        if not out[START]:
            problems.append("no edge from START. Fix: add_edge(START, '<first node>')")
        for n, options in self.node_options.items():
            for d in options["destinations"]:
                if d not in known or d == START:
                    problems.append(f"node {n!r} declares unknown destination {d!r} (where "
                                    "its Command may go)")
                else:
                    out[n].add(d)
        for n in self.nodes:
            if not out[n]:
                problems.append(f"node {n!r} has no way out. Fix: add_edge({n!r}, END) or an "
                                "edge to the next node (a node that returns Command(goto=...) "
                                f"declares where it may go: add_node({n!r}, fn, "
                                "destinations=[...]) or -> Command[Literal[...]])")
        seen = _reach(START, out)
        for n in self.nodes:
            if n not in seen:
                problems.append(f"node {n!r} is unreachable from START")
        if END not in seen and out[START]:
            problems.append("END is unreachable: every path loops forever")
        return problems


def callable_name(fn: Any, *, qualified: bool = False) -> str:
    """How a node's, router's or reducer's function is named in messages (its ``__name__``;
    a ``functools.partial``'s function's; a callable object's class's), or with
    ``qualified`` its ``module:qualname`` (what an unnamed graph's identity knows it by)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not hasattr(fn, "__qualname__") or not callable(fn):
        fn = type(fn)
    if not qualified:
        return str(getattr(fn, "__name__", None) or type(fn).__name__)
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', '?')}"


def _command_destinations(fn: Any) -> list[str] | None:
    """The destinations a node function declares in its return annotation,
    ``Command[Literal["a", "b"]]`` (durably's Command or LangGraph's), else None."""
    return _literal_destinations(fn, command=True)


def _literal_destinations(fn: Any, *, command: bool) -> list[str] | None:
    """The names in ``fn``'s return annotation: ``Command[Literal["a", "b"]]`` (``command``:
    a node's) or ``Literal["a", "b"]`` (a router's), else None."""
    if isinstance(fn, functools.partial):
        fn = fn.func
    elif callable(fn) and not isinstance(fn, type) and not inspect.isroutine(fn) and not hasattr(
            fn, "__annotations__"):
        fn = type(fn).__call__  # a callable object: its __call__'s annotation
    raw = getattr(fn, "__annotations__", {}).get("return") if callable(fn) else None
    if raw is None:
        return None
    if isinstance(raw, str):  # (from __future__ import annotations): resolved if it can be
        with contextlib.suppress(Exception):  # a name not resolvable here: read as text
            raw = typing.get_type_hints(fn).get("return", raw)
    if isinstance(raw, str):
        pattern = (r"\s*(?:\w+\.)*Command\[\s*(?:\w+\.)*Literal\[(.*)\]\s*\]\s*" if command
                   else r"\s*(?:\w+\.)*Literal\[(.*)\]\s*")
        found = re.fullmatch(pattern, raw)
        if found is None:
            return None
        try:
            names = ast.literal_eval(f"({found.group(1)},)")
        except (ValueError, SyntaxError):
            return None
        return [str(n) for n in names]
    if command:
        origin = typing.get_origin(raw)
        if getattr(origin, "__name__", "") != "Command":
            return None
        args = typing.get_args(raw)
        if len(args) != 1:
            return None
        raw = args[0]
    if typing.get_origin(raw) is not typing.Literal:
        return None
    return [str(n) for n in typing.get_args(raw)]


def _reach(start: str, out: Mapping[str, set[str]]) -> set[str]:
    seen = {start}
    todo = [start]
    while todo:
        for t in out.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def _caller_module() -> str:
    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", "__main__"))
