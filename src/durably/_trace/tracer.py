"""The tracer: the events a run produces as it executes, and the run graph derived from its
journal.

Every step produces events (started; finished as ``ran``, ``cached`` or ``replayed``;
failed; interrupted) and every attempt of a run produces ``run_started`` and one of
``run_finished``, ``run_failed``, ``run_interrupted``, ``run_stopped``. Live events go to the
listener of :meth:`Entrypoint.stream`; the journal keeps what is needed to rebuild them
later (step rows carry times, status, parent, short reprs and digests; attempts, interrupts
and custom events are rows of the events table).

The run graph (:class:`RunGraph`) is built from the journal alone, so it works for a run read
back by another process, a crashed run, or a finished one:

- nodes are steps; a step called inside another step's body is nested in it (``parent``);
- a data-flow edge goes from step A to a later step B when an argument of B, or an element of
  a list, tuple or dict argument of B, is the object A returned or an element of A's list,
  tuple or dict result (a fan-out): B's journal row names A (see
  :mod:`durably._trace.producers`); rows of older journals recorded digests of results,
  matched by digest;
- more than ``collapse`` calls of one task under one parent draw as one node
  ``parse ×1,200`` with counts per status.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import operator
import reprlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from durably._keys.hashing import trace_digest
from durably._trace.producers import SOURCE, flow_elements
from durably._trace.spans import wall_span

_SHORT = 16  # hex digits of a digest compared for a data-flow edge

if TYPE_CHECKING:
    from durably._store.records import StepRecord

__all__ = ["Edge", "Event", "Node", "RunGraph", "build_graph", "flow_digests", "inputs_repr",
           "short_repr"]


class _ShortRepr(reprlib.Repr):
    """reprlib, with dicts in their own order (reprlib sorts their keys: a row
    ``{'id': 1, 'name': 'a'}`` must not read as ``{'name': ..., 'id': ...}``) and bytes sliced
    before repr (a 500 MB result must not be copied to be described)."""

    def repr1(self, x: Any, level: int) -> str:
        # reprlib's dispatch (the type's name, "repr_" + it looked up twice on the instance)
        # by the exact type instead, for the types a result is mostly made of: the same
        # method, so the same text; every step's result is described (a dict of a few
        # hundred entries: 44 us, a third of it that dispatch)
        method = _EXACT.get(type(x))
        if method is not None:
            return str(method(self, x, level))
        return str(super().repr1(x, level))

    def repr_dict(self, x: dict[Any, Any], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        shown = ", ".join(f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                          for k, v in itertools.islice(x.items(), self.maxdict))
        return "{" + shown + (", ..." if len(x) > self.maxdict else "") + "}"

    def repr_instance(self, x: Any, level: int) -> str:
        # a dataclass or pydantic model with its generated repr, field by field: its repr
        # is written whole before reprlib cuts it, and a graph's state grows with its run
        # (a list of messages: a megabyte written at every super-step to keep 80 characters)
        shown = _record_repr_args(x)
        if shown is None:
            return super().repr_instance(x, level)
        name, pairs = shown
        if level <= 0:
            return f"{name}(...)"
        first = list(itertools.islice(pairs, self.maxdict + 1))
        text = ", ".join(f"{k}={self.repr1(v, level - 1)}" for k, v in first[:self.maxdict])
        return f"{name}({text}{', ...' if len(first) > self.maxdict else ''})"

    def repr_bytes(self, x: bytes, level: int) -> str:
        if len(x) <= self.maxstring:
            return repr(x)
        return repr(x[: self.maxstring]) + f"...({len(x):,} bytes)"

    def repr_bytearray(self, x: bytearray, level: int) -> str:
        return f"bytearray({self.repr_bytes(bytes(x[: self.maxstring + 1]), level)})" \
            if len(x) > self.maxstring else repr(x)


def _record_repr_args(x: Any) -> tuple[str, Iterator[tuple[str, Any]]] | None:
    """The name and (field, value) pairs the repr of ``x`` writes, when it is the repr a
    dataclass or a pydantic model is generated with (not one of the class's own); else
    None."""
    t = type(x)
    method = t.__repr__
    if getattr(method, "__module__", None) == "pydantic.main" and hasattr(x, "__repr_args__"):
        return str(x.__repr_name__()), iter(x.__repr_args__())  # (its fields with repr=True)
    generated = getattr(getattr(method, "__wrapped__", None), "__qualname__", "")
    if generated == "__create_fn__.<locals>.__repr__" and dataclasses.is_dataclass(t):
        return t.__qualname__, ((f.name, getattr(x, f.name))
                                for f in dataclasses.fields(t) if f.repr)
    return None


#: the method reprlib's own dispatch picks for these exact types (a subclass, whose type's
#: name differs, goes through that dispatch)
_EXACT: dict[type, Any] = {
    t: getattr(_ShortRepr, "repr_" + t.__name__)
    for t in (str, int, dict, list, tuple, set, frozenset, bytes, bytearray)}
_REPR = _ShortRepr()
_REPR.maxstring = 60
_REPR.maxother = 60
_REPR.maxlong = 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 5
_REPR.maxdict = 4
_REPR.maxlevel = 3


def short_repr(obj: Any, limit: int = 120) -> str:
    """A short ``repr`` (reprlib: long strings, lists and dicts abbreviated with ``...``)."""
    kind = type(obj)
    if kind is int or kind is float or kind is bool or obj is None or (
            kind is str and len(obj) <= 60):
        text = repr(obj)  # what reprlib writes for these when it is this short
        if len(text) <= 40 and len(text) <= limit:
            return text
    try:
        text = _REPR.repr(obj)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not fail a step
        text = f"<{type(obj).__qualname__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def inputs_repr(arguments: Mapping[str, Any]) -> str:
    """``name=value, ...`` with short reprs, at most 300 characters."""
    text = ", ".join(f"{k}={short_repr(v, 80)}" for k, v in arguments.items())
    return text if len(text) <= 300 else text[:297] + "..."


def flow_digests(arguments: Mapping[str, Any], each: Mapping[str, str] | None = None,
                 taken: Mapping[str, list[str | None]] | None = None) -> tuple[str, ...]:
    """Digests a result may match: each argument, and each element of list, tuple and dict
    arguments (up to 10,000 elements). ``each`` gives argument digests already computed
    (the others are computed here), ``taken`` the digests of their elements taken with the
    key (None: not taken there)."""
    found: list[str] = []  # with repeats: three equal results passed on draw three edges
    for name, value in arguments.items():
        d = each[name] if each is not None and name in each else trace_digest(value)
        if d:
            found.append(d)
        elements = flow_elements(value)
        if elements is None:
            continue
        known = taken.get(name) if taken is not None else None
        if known is None or len(known) != len(value):
            known = [None] * len(value)
        for element, got in zip(elements, known, strict=True):
            d = trace_digest(element) if got is None else got
            if d:
                found.append(d)
    return tuple(found)


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """Something that happened in a run, as :meth:`Entrypoint.stream` yields it.

    Attributes:
        kind: ``"run_started"``, ``"run_finished"``, ``"run_failed"``,
            ``"run_interrupted"``, ``"run_stopped"``, ``"step_started"``,
            ``"step_finished"``, ``"step_failed"``, ``"step_interrupted"``, ``"custom"`` or
            ``"graph_step"`` (a StateGraph super-step ended: ``data`` has ``step``,
            ``values``, ``updates``, ``next`` and ``namespace``: ``()`` for the graph
            that was called, the node names down to a subgraph for its super-steps).
        run_id: The run.
        time: When it happened, seconds since the epoch.
        step_id: The step (step events and custom events written inside a task), else None.
        parent_id: The step that called this step, or None.
        task: The task's name (the entrypoint's name for run events).
        status: For ``step_finished``: ``"ran"``, ``"cached"`` or ``"replayed"``; for
            ``run_started``: ``"new"`` or the status the run had before this attempt.
        duration: Seconds, for finished, failed and interrupted steps and ended runs.
        inputs: Short ``repr`` of the arguments (step events; None for replayed steps
            unless they were recorded).
        output: Short ``repr`` of the result (``step_finished``, ``run_finished``).
        data: The custom event's value; the error ``repr`` of a failure; the list of
            :class:`~durably.Interrupt` of ``run_interrupted``; the result of
            ``run_finished`` (live events only).
        attempt: The attempt of the run.
    """

    kind: str
    run_id: str
    time: float
    step_id: str | None = None
    parent_id: str | None = None
    task: str = ""
    status: str = ""
    duration: float | None = None
    inputs: str | None = None
    output: str | None = None
    data: Any = None
    attempt: int = 0


# -- the run graph ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """A step of the run graph, or a group of calls of one task collapsed into one node.

    Attributes:
        id: The step id (32 hex characters), or ``"group:<parent>:<task>"`` for a group.
        task: The task's name.
        status: ``"ran"``, ``"cached"``, ``"replayed"``, ``"failed"``, ``"interrupted"`` or
            ``"started"`` (a step with nested steps that was still executing when the
            attempt ended: a crash); for a group, the most severe status among its members.
        parent: Id of the node it is nested in (the calling step), or None (the entrypoint).
        started: Start time of the (first) call, seconds since the epoch.
        duration: Seconds (for a group: the sum over its members).
        inputs: Short ``repr`` of the arguments (None for groups and unknown).
        output: Short ``repr`` of the result (None for groups, failures and unknown).
        error: The error ``repr`` of a failed step.
        count: How many calls the node stands for (1 for a step).
        statuses: For a group, calls by status (``{"ran": 3, "cached": 1197}``); for a step,
            ``{status: 1}``.
        steps: The step ids the node stands for.
    """

    id: str
    task: str
    status: str
    parent: str | None
    started: float
    duration: float
    inputs: str | None = None
    output: str | None = None
    error: str | None = None
    count: int = 1
    statuses: Mapping[str, int] = dataclasses.field(default_factory=dict)
    steps: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``task`` for one call, ``task ×1,200`` for a group."""
        return self.task if self.count == 1 else f"{self.task} ×{self.count:,}"


@dataclasses.dataclass(frozen=True, slots=True)
class Edge:
    """A data-flow edge: the result of ``source`` was an argument (or an element of one) of
    ``target``. ``count`` is how many step-to-step edges it stands for between groups."""

    source: str
    target: str
    count: int = 1


_SEVERITY = {"failed": 0, "interrupted": 1, "started": 2, "ran": 3, "cached": 4, "replayed": 5}


@dataclasses.dataclass(frozen=True)
class RunGraph:
    """The graph of one attempt of a run: steps as nodes (nested by call), data-flow edges.

    Build it with :meth:`Run.graph <durably.Run.graph>` or :meth:`Entrypoint.graph
    <durably.Entrypoint.graph>`. Render it with :meth:`to_mermaid`, :meth:`to_dot`,
    :meth:`to_svg` or :meth:`save`; in Jupyter it displays itself.

    Attributes:
        run_id: The run.
        name: The entrypoint's name.
        status: The run's status.
        attempt: The attempt drawn.
        nodes: The nodes in call order.
        edges: The data-flow edges, in order of their targets.
        time_saved: Seconds the cache and the journal saved in this attempt, as
            :meth:`Run.time_saved <durably.Run.time_saved>` counts them: the wall-clock time
            covered by the executions (in earlier attempts of the run) of the steps it
            replayed, steps that ran at the same time counted once (see
            :func:`~durably._trace.spans.wall_span`), plus the seconds the executions that
            produced the cache entries it was served took (:attr:`StepRecord.saved`).
        wall_time: Seconds from the attempt's start to its end (None while it runs or when
            unknown).
    """

    run_id: str
    name: str
    status: str
    attempt: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    time_saved: float = 0.0
    wall_time: float | None = None

    def node(self, id_or_task: str) -> Node:
        """The node with this id, or the first node of this task.

        Raises:
            KeyError: no such node.
        """
        for n in self.nodes:
            if n.id == id_or_task:
                return n
        for n in self.nodes:
            if n.task == id_or_task:
                return n
        raise KeyError(f"no node {id_or_task!r} in the graph of run {self.run_id!r}; nodes: "
                       f"{sorted({n.task for n in self.nodes})}")

    def children(self, parent: str | None) -> list[Node]:
        """Nodes nested directly in ``parent`` (None: at the top level), in call order."""
        return [n for n in self.nodes if n.parent == parent]

    def counts(self) -> dict[str, int]:
        """Steps by status over the whole graph (groups count each member)."""
        total: collections.Counter[str] = collections.Counter()
        for n in self.nodes:
            total.update(n.statuses or {n.status: n.count})
        return dict(total)

    # rendering lives in durably.render (imported lazily: it is not needed to run)
    def to_mermaid(self) -> str:
        """The graph as Mermaid flowchart text (``flowchart TD``)."""
        from durably.render import to_mermaid

        return to_mermaid(self)

    def to_dot(self) -> str:
        """The graph as Graphviz DOT text."""
        from durably.render import to_dot

        return to_dot(self)

    def to_svg(self) -> str:
        """The graph as SVG text, drawn by Graphviz.

        Raises:
            RenderError: the ``graphviz`` package or the ``dot`` program is missing (the
                message says how to install it).
        """
        from durably.render import to_svg

        return to_svg(self)

    def to_html(self) -> str:
        """A self-contained HTML report: the graph and a table of its steps."""
        from durably.render import to_html

        return to_html(self)

    def save(self, path: Any) -> Any:
        """Write the graph to ``path``; the format follows the suffix: ``.svg``, ``.dot``,
        ``.mmd`` (Mermaid) or ``.html`` (the report). Returns the path written
        (:class:`pathlib.Path`)."""
        from durably.render import save

        return save(self, path)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from durably.render import mimebundle

        return mimebundle(self, include=include, exclude=exclude)


def build_graph(run_id: str, name: str, status: str, attempt: int,
                steps: list[StepRecord], collapse: int | None = 20) -> RunGraph:
    """The graph of ``attempt`` from the run's step records of every attempt (``steps``).

    Records of earlier attempts give replayed steps their inputs, outputs, digests and the
    time they took when they ran.
    """
    first: dict[str, StepRecord] = {}  # step id -> the record of the attempt that finished it
    for s in steps:
        if s.status in ("ran", "cached") and s.step_id not in first:
            first[s.step_id] = s
    current = [s for s in steps if s.attempt == attempt]
    # a step has one node: its last record in this attempt (a failed try then a replay...)
    last: dict[str, StepRecord] = {}
    for s in current:
        last[s.step_id] = s
    ordered = [s for s in current if last[s.step_id] is s]

    saved: dict[str, tuple[float, float]] = {}
    by_cache = 0.0  # seconds the cache saved: durations of executions in other runs
    nodes: list[Node] = []
    for s in ordered:
        origin = first.get(s.step_id, s)
        if s.status in ("cached", "replayed"):
            if origin.status == "cached":
                by_cache += origin.saved
            elif origin is not s:
                saved[s.step_id] = (origin.started, origin.ended)
        nodes.append(Node(
            id=s.step_id, task=s.task, status=s.status, parent=s.parent_id, started=s.started,
            duration=s.duration if s.status != "replayed" else origin.duration,
            inputs=s.inputs if s.inputs is not None else origin.inputs,
            output=(s.output if s.output is not None else origin.output)
            if s.status not in ("failed", "interrupted") else None,
            error=s.error, statuses={s.status: 1}, steps=(s.step_id,),
        ))
    # data flow: a later argument (or element) equal to an earlier result (or an element of
    # it); of several equal results, the most recent ones (a pass-through step is the
    # source, not the step before). A result is there once its step returned: after the
    # steps it called (a step is not drawn as the source of its own children). Digests are
    # compared by their first 16 hex digits (results' elements are kept that long).
    producers: dict[str, list[str]] = collections.defaultdict(list)
    edges: list[Edge] = []
    seen: set[tuple[str, str]] = set()
    parent_of = {s.step_id: s.parent_id for s in ordered}
    # steps whose results wait (until the steps they called are past), with their end
    returning: list[tuple[str, str, tuple[str, ...], float]] = []

    def returned(step: str, out: str, elements: tuple[str, ...], ended: float = 0.0) -> None:
        producers[out[:_SHORT]].append(step)
        # and each element of a list, tuple or dict result: a later step given one of
        # them received a part of it (a fan-out: rows = load(); process(row) per row)
        for d in dict.fromkeys(d[:_SHORT] for d in elements if d):
            if d != out[:_SHORT]:
                producers[d].append(step)

    for s in ordered:
        origin = first.get(s.step_id, s)
        if returning:
            callers: set[str] = set()  # the steps s was called inside (still running)
            up = s.parent_id
            while up is not None and up not in callers:
                callers.add(up)
                up = parent_of.get(up)
            waiting: list[tuple[str, str, tuple[str, ...], float]] = []
            released: list[tuple[str, str, tuple[str, ...], float]] = []
            for item in returning:
                (waiting if item[0] in callers else released).append(item)
            # in the order they returned: a step called inside another returned before it
            # (a list of scores made by evaluate() came from evaluate, not from the last
            # score, when report() received it)
            for item in sorted(released, key=operator.itemgetter(3)):
                returned(*item)
            returning = waiting
        digests = s.input_digests or origin.input_digests
        for d, times in collections.Counter(
                d if d[:1] == SOURCE else d[:_SHORT] for d in digests).items():
            if d[:1] == SOURCE:  # the step that produced it, named (see _trace.producers)
                named = [d[1:]] if d[1:] in parent_of else []
            elif d in producers:
                named = producers[d][-times:]
            else:
                continue
            for source in named:
                if source != s.step_id and (source, s.step_id) not in seen:
                    seen.add((source, s.step_id))
                    edges.append(Edge(source, s.step_id))
        out = s.result_digest or origin.result_digest
        if out and s.status not in ("failed", "interrupted", "started"):
            returning.append((s.step_id, out, s.output_digests or origin.output_digests,
                              s.ended))
    graph = RunGraph(run_id, name, status, attempt, tuple(nodes), tuple(edges),
                     wall_span(saved.values()) + by_cache)
    if collapse:
        while True:  # again: the children of a collapsed group may collapse in turn
            smaller = _collapse(graph, collapse)
            if smaller is graph:
                break
            graph = smaller
    return graph


def _collapse(graph: RunGraph, limit: int) -> RunGraph:
    """Groups of more than ``limit`` calls of one task under one parent become one node."""
    groups: dict[tuple[str | None, str], list[Node]] = collections.defaultdict(list)
    for n in graph.nodes:
        groups[(n.parent, n.task)].append(n)
    big = {k for k, members in groups.items() if len(members) > limit}
    if not big:
        return graph
    rename: dict[str, str] = {}
    for (parent, task), members in groups.items():
        if (parent, task) in big:
            gid = f"group:{parent or ''}:{task}"
            for m in members:
                rename[m.id] = gid
    # nested nodes of collapsed members move into the group
    def mapped(node_id: str | None) -> str | None:
        return rename.get(node_id, node_id) if node_id is not None else None

    nodes: list[Node] = []
    done: set[str] = set()
    for n in graph.nodes:
        key = (n.parent, n.task)
        parent = mapped(n.parent)
        if key in big:
            gid = rename[n.id]
            if gid in done:
                continue
            done.add(gid)
            members = groups[key]
            # every call a member stands for: a member may be a group itself (the calls
            # of one task under each of the collapsed calls of its caller: a nested map)
            statuses: collections.Counter[str] = collections.Counter()
            for m in members:
                statuses.update(m.statuses or {m.status: m.count})
            worst = min(statuses, key=lambda st: _SEVERITY.get(st, 5))
            nodes.append(Node(
                id=gid, task=n.task, status=worst, parent=parent, started=members[0].started,
                duration=sum(m.duration for m in members),
                count=sum(m.count for m in members), statuses=dict(statuses),
                steps=tuple(step for m in members for step in (m.steps or (m.id,))),
                error=next((m.error for m in members if m.error), None),
            ))
        elif n.id not in rename:
            nodes.append(dataclasses.replace(n, parent=parent))
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for e in graph.edges:
        a, b = rename.get(e.source, e.source), rename.get(e.target, e.target)
        if a != b:
            counts[(a, b)] += e.count
    edges = tuple(Edge(a, b, c) for (a, b), c in counts.items())
    return dataclasses.replace(graph, nodes=tuple(nodes), edges=edges)
