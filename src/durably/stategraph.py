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

import asyncio
import concurrent.futures
import contextlib
import contextvars
import copy
import dataclasses
import inspect
import itertools
import json
import operator
import pickle
import threading
import types
from collections.abc import AsyncIterator, Callable, Generator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import xxhash

from durably._decorators.decorators import Entrypoint, Task
from durably._graph.builder import (
    GraphChangedError,
    GraphValidationError,
    InvalidRouteError,
    StateGraph,
    StepLimitError,
    _Router,
)
from durably._graph.state import (
    _NOTHING,
    InvalidUpdateError,
    describe_changes,
    fingerprint_of,
    parts_of,
)
from durably._graph.structure import END, START, Command, GraphStructure, Send
from durably._runtime.context import current_run
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.run import Run
from durably._runtime.runtime import Spec
from durably._trace.tracer import Event, short_repr
from durably.exceptions import CorruptJournalError, DefinitionError, RunStateError
from durably.store import Store


def _run_beside_loop(afn: Callable[[Any], Any], state: Any) -> Any:
    """An async node of a graph invoked synchronously from a thread whose event loop is
    running (a notebook cell, a web handler): run on a loop of its own in a thread of its
    own, with the caller's context (the run, the step), while the caller waits (its own
    loop cannot run it: ``asyncio.run`` refuses to nest)."""
    with concurrent.futures.ThreadPoolExecutor(1, "durably-async-node") as thread:
        return thread.submit(contextvars.copy_context().run, asyncio.run, afn(state)).result()


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

S = TypeVar("S")



# -- snapshots and structure -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StateSnapshot:
    """The state of a graph run at one checkpoint (after one super-step).

    Attributes:
        values: The state (a dict for a TypedDict state, else an instance).
        next: The nodes of the next super-step (empty when the run ended).
        step: The super-step number (0-based; -1 for the input before any step).
        checkpoint_id: The id to fork from (``app.fork(run_id, at=...)``).
        run_id: The run.
        status: The run's status.
        interrupts: Pending interrupts (when the run waits at this point).
    """

    values: Any
    next: tuple[str, ...]
    step: int
    checkpoint_id: str
    run_id: str
    status: str
    interrupts: tuple[Any, ...] = ()


class StepResult(dict):  # type: ignore[type-arg]
    """What a super-step journals: its index, next nodes, joins, updates (node by node),
    fingerprint, and the state after it, pickled: whole (``blob``) every
    :data:`FULL_STATE_EVERY` super-steps (from the first) and whenever the bytes of the
    state before it are not known, else as a splice of those bytes (``delta``, see
    :func:`_splice`). A state that plain pickle refuses, holds a large buffer or pickles to
    16 MiB or more is kept as the object (``state``, see :func:`_pickled_state`), as
    journals of earlier versions kept every state. Shown (history, ``durably show``) as the
    updates and the next nodes."""

    __slots__ = ()

    def __repr__(self) -> str:
        # abbreviated (reprlib): a step's output is shown short, and a state of many
        # megabytes must not be written out whole on every super-step to be cut
        shown = short_repr(self["state"], 1000) if "state" in self else \
            "update " + short_repr(self.get("updates"), 1000)
        return f"{shown} → next {self.get('next')}"


#: super-steps 0, 64, 128, ... (and any whose previous state's bytes are not known: after a
#: migration, after a fork's edited checkpoint, after a journal of an earlier version)
#: journal the whole pickled state; the others only where its bytes differ from the
#: previous one's, so a state that grows at every super-step (an agent's messages) is not
#: written out whole each time (quadratic in the run's length)
FULL_STATE_EVERY = 64
_CHUNK = 1 << 16  # bytes compared at once when looking for where two pickles differ
#: a state pickled to this many bytes or more is journaled as the object (spilled to a file)
_WHOLE_BYTES = 16 << 20


class _Handoff:
    """Between the super-step loop and the super-step it calls: whether to journal the whole
    state, the bytes of the state before it (``base``; None: not known), and what the
    super-step computed when it executed (its journaled result may hold only a splice)."""

    __slots__ = ("base", "blob", "state", "whole")

    def __init__(self, whole: bool, base: bytes | None) -> None:
        self.whole = whole
        self.base = base
        self.state: dict[str, Any] | None = None
        self.blob: bytes | None = None


_handoff: contextvars.ContextVar[_Handoff | None] = contextvars.ContextVar(
    "durably_graph_handoff", default=None)


def _splice(old: bytes, new: bytes) -> tuple[int, int, bytes]:
    """``(head, tail, middle)`` with ``new == old[:head] + middle + old[len(old) - tail:]``:
    the bytes around the one region where ``new`` differs from ``old`` are not kept (a list
    that grew by a message: about the message's bytes). Exact whatever changed, in place or
    not: it compares the pickles, not the objects.

    Example:
        >>> _splice(b"abcdef", b"abXYef")
        (2, 2, b'XY')
        >>> _spliced(b"abcdef", _splice(b"abcdef", b"abef"))
        b'abef'
    """
    limit = min(len(old), len(new))
    head = 0
    while head + _CHUNK <= limit and old[head:head + _CHUNK] == new[head:head + _CHUNK]:
        head += _CHUNK
    hi = min(head + _CHUNK, limit)
    while head < hi:  # the longest equal run from head, bisected
        mid = (head + hi + 1) // 2
        if old[head:mid] == new[head:mid]:
            head = mid
        else:
            hi = mid - 1
    room = limit - head  # the tail never overlaps the head
    end_old, end_new = len(old), len(new)
    tail = 0
    while tail + _CHUNK <= room and (old[end_old - tail - _CHUNK:end_old - tail]
                                     == new[end_new - tail - _CHUNK:end_new - tail]):
        tail += _CHUNK
    hi = min(tail + _CHUNK, room)
    while tail < hi:
        mid = (tail + hi + 1) // 2
        if old[end_old - mid:end_old - tail] == new[end_new - mid:end_new - tail]:
            tail = mid
        else:
            hi = mid - 1
    return head, tail, new[head:end_new - tail]


_ATOMIC = frozenset({str, int, float, bool, type(None), bytes, complex})


def _deepcopy(value: Any) -> Any:
    """``copy.deepcopy(value)``, with exact dicts and lists of plain values copied here
    without deepcopy's dispatch for every element: a node's copy of a state of message
    dicts, 2 to 3 times faster. The same result: atomic values (str, numbers, None...) are
    the same objects (a NaN too), containers new ones, shared ones shared in the copy (the
    same memo), and everything else (tuples, subclasses, objects) through copy.deepcopy.

    Example:
        >>> shared = {"k": [1.5, "a"]}
        >>> state = {"messages": [shared, shared], "n": 2}
        >>> out = _deepcopy(state)
        >>> out == state, out["messages"][0] is out["messages"][1] is not shared
        (True, True)
    """
    memo: dict[int, Any] = {}
    deepcopy = copy.deepcopy
    atomic = _ATOMIC

    def copied(v: Any) -> Any:
        t = type(v)
        if t is dict:
            got = memo.get(id(v))
            if got is not None:
                return got
            out: dict[Any, Any] = {}
            memo[id(v)] = out
            for k, x in v.items():
                out[k if type(k) in atomic else deepcopy(k, memo)] = \
                    x if type(x) in atomic else copied(x)
            return out
        if t is list:
            got = memo.get(id(v))
            if got is not None:
                return got
            items: list[Any] = []
            memo[id(v)] = items
            items.extend([x if type(x) in atomic else copied(x) for x in v])
            return items
        if getattr(t.__deepcopy__ if hasattr(t, "__deepcopy__") else None, "__module__",
                   None) == "pydantic.main" and type(getattr(v, "__dict__", None)) is dict:
            # a pydantic model (a state, a message): its __deepcopy__ copies its __dict__
            # with deepcopy, which finds the copy made here in the memo
            copied(v.__dict__)
        return deepcopy(v, memo)

    return value if type(value) in atomic else copied(value)


def _pickled_state(state: dict[str, Any]) -> bytes | None:
    """The state pickled for a checkpoint: protocol 3, whose stream has no frame headers and
    no memo numbers on new objects' puts in the way of :func:`_splice` (protocol 4's frames
    put a length at the start that changes with any change). None, and the object is
    journaled as before (by the journal's own pickler, which refuses open files and spills
    large values to a file without a second copy), when plain pickle cannot (a lambda, a
    class only protocol 4 finds), when a value holds a large buffer (an array: never
    copied here), or when it comes to :data:`_WHOLE_BYTES` or more."""
    for value in state.values():
        size = getattr(value, "nbytes", None)
        if isinstance(value, (bytes, bytearray, str)):
            size = len(value)
        if isinstance(size, int) and size >= _WHOLE_BYTES // 4:
            return None
    try:
        data = pickle.dumps(state, protocol=3)
    except Exception:  # noqa: BLE001 - journaled as the object: the journal says what fails
        return None
    return data if len(data) < _WHOLE_BYTES else None


def _spliced(old: bytes, delta: tuple[int, int, bytes]) -> bytes:
    """The bytes :func:`_splice` was given as ``new``."""
    head, tail, middle = delta
    return old[:head] + middle + old[len(old) - tail:]


class Writes(list):  # type: ignore[type-arg]
    """The update of a subgraph node: the writes of its nodes, in the order applied."""

    __slots__ = ()


class Sent(list):  # type: ignore[type-arg]
    """The updates of a node's calls by :class:`Send` in one super-step, one per call in the
    order the routers returned them (each a dict, or a subgraph's :class:`Writes`)."""

    __slots__ = ()


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


def _writes(update: dict[str, Any] | list[Any]) -> list[dict[str, Any]]:
    """A node's update as the writes applied in turn (a subgraph's writes, Send calls')."""
    if not isinstance(update, list):
        return [update]
    return [w for one in update for w in _writes(one)]


#: the nodes (names) whose subgraphs the code running now is inside, outermost first: () in
#: the top graph's own super-steps; ("research",) inside the subgraph node "research"
_namespace: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "durably_graph_namespace", default=())
#: the stream being served answers an interrupt: it shows only the super-steps that execute
_executed_only: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "durably_graph_executed_only", default=False)


def _merged(update: dict[str, Any] | list[dict[str, Any]],
            reducers: Mapping[str, Callable[[Any, Any], Any]]) -> dict[str, Any]:
    """One dict for display (``stream(mode="updates")``). A subgraph node's writes to a key
    with a reducer are combined with it, ``reducer(first, second)`` and so on (two appends
    show both: exact for a reducer like ``operator.add`` or ``add_messages``), on copies (a
    reducer that changes its argument in place never touches the run's writes); a key
    without one, or whose reducer cannot combine two writes, shows the later write."""
    if isinstance(update, list):
        update = _writes(update)
        if len(update) > 1:
            with contextlib.suppress(Exception):  # (uncopyable: shown from the writes)
                update = copy.deepcopy(update)
        merged: dict[str, Any] = {}
        for one in update:
            for key, value in one.items():
                reducer = reducers.get(key)
                if reducer is not None and key in merged:
                    with contextlib.suppress(Exception):  # display only: the later write
                        value = reducer(merged[key], value)
                merged[key] = value
        return merged
    return update


# -- the compiled graph ------------------------------------------------------------------------
class _Cancel:
    """Lets async code stop a run that executes in a worker thread: the run's context is
    attached when the graph starts executing, and a stop (before or after that) makes the run
    raise ``StopRun`` at its next step boundary (status ``stopped``: resumable)."""

    __slots__ = ("ctx", "stopped")

    def __init__(self) -> None:
        self.ctx: Any = None
        self.stopped = False

    def attach(self, ctx: Any) -> None:
        self.ctx = ctx
        if self.stopped:
            ctx.stop = True

    def stop(self) -> None:
        self.stopped = True
        ctx = self.ctx
        if ctx is not None:
            ctx.stop = True


class CompiledGraph(Generic[S]):
    """A validated graph, runnable as durable runs (made by :meth:`StateGraph.compile`).

    A compiled graph is also a node: ``builder.add_node("research", compiled)`` runs it as a
    subgraph on the parent's state.
    """

    def __init__(self, graph: StateGraph[S], name: str, max_steps: int,
                 store: Store | None) -> None:
        self.graph = graph
        self.name = name
        self.max_steps = max_steps
        self.schema = graph.schema
        self.fingerprint = fingerprint_of(graph)
        self.fingerprint_digest = xxhash.xxh3_64_hexdigest(
            json.dumps(self.fingerprint, sort_keys=True).encode())
        self._migrate: contextvars.ContextVar[Callable[[Any], Any] | None] = (
            contextvars.ContextVar(f"durably_migrate_{name}", default=None))
        self._cancel: contextvars.ContextVar[_Cancel | None] = contextvars.ContextVar(
            f"durably_cancel_{name}", default=None)
        self._tasks = {n: self._node_task(n, fn) for n, fn in graph.nodes.items()}
        self._superstep = self._superstep_task()
        self._migration = self._migration_task()
        self._defaults = self._defaults_task()
        self._entry = self._entrypoint(store)

    def __durably_digest__(self) -> str:
        """A compiled graph held by a node (a subgraph) is known by its structure and code."""
        return f"{self.name}:{self.fingerprint_digest}"

    # -- construction of the durable pieces ------------------------------------------------
    def _node_task(self, name: str, fn: Any) -> Task[Any, Any]:
        schema = self.schema
        if isinstance(fn, CompiledGraph):
            sub = fn

            def run_subgraph(state: Any) -> Any:
                values = schema.to_dict(state, f"the input of subgraph {name!r}")
                shared = {k: v for k, v in values.items() if k in sub.schema.fields}
                writes: list[dict[str, Any]] = []
                sub._execute(shared, top=False, writes=writes)
                # what the subgraph's nodes wrote, in order: the parent applies these
                # through its own reducers (never the subgraph's whole final state again)
                return Writes([{k: v for k, v in w.items() if k in schema.fields}
                               for w in writes])

            run_subgraph.__qualname__ = run_subgraph.__name__ = f"{self.name}.{name}"
            run_subgraph.__module__ = self.graph.module
            target: Any = run_subgraph
        elif inspect.iscoroutinefunction(fn):
            afn = fn

            def run_async(state: Any) -> Any:
                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    return asyncio.run(afn(state))
                return _run_beside_loop(afn, state)

            run_async.__wrapped__ = afn  # type: ignore[attr-defined]
            run_async.__qualname__ = run_async.__name__ = getattr(fn, "__qualname__", name)
            run_async.__module__ = getattr(fn, "__module__", self.graph.module)
            target = run_async
        elif not isinstance(fn, types.FunctionType) and not hasattr(fn, "__qualname__"):
            # a functools.partial or a callable object: a function of the graph's calls it
            # (its code, its bound arguments or the object's state are in the fingerprint:
            # a closure value)
            call = fn

            def run_callable(state: Any) -> Any:
                return call(state)

            run_callable.__qualname__ = run_callable.__name__ = f"{self.name}.{name}"
            run_callable.__module__ = self.graph.module
            target = run_callable
        else:
            target = fn
        cache = bool(self.graph.node_options[name]["cache"])
        spec = Spec(target, kind="task", name=f"{self.name}.{name}", cache=cache)
        return Task(target, spec)

    def _superstep_task(self) -> Task[Any, Any]:
        app = self

        def superstep(index: int, frontier: list[Target], state: dict[str, Any],
                      joins: dict[str, list[str]]) -> dict[str, Any]:
            return app._run_superstep(index, frontier, state, joins)

        superstep.__qualname__ = superstep.__name__ = f"{self.name}::superstep"
        superstep.__module__ = self.graph.module
        spec = Spec(superstep, kind="task", name=f"{self.name}::superstep", version="1",
                    cache=False, ignore=("frontier", "state", "joins"))
        return Task(superstep, spec)

    def _migration_task(self) -> Task[Any, Any]:
        app = self

        def migrate(index: int, state: dict[str, Any]) -> dict[str, Any]:
            fn = app._migrate.get()
            if fn is None:
                raise RunStateError(
                    f"graph {app.name!r}: the run must migrate its state before super-step "
                    f"{index}, but no migrate= function was given. Fix: pass migrate=... to "
                    "invoke(), resume() or stream().")
            new = fn(app.schema.build(state))
            if new is None:
                raise InvalidUpdateError(
                    f"graph {app.name!r}: migrate returned None; it returns the whole migrated "
                    "state. Fix: return the state (a function that changes it in place ends "
                    "with `return state`).")
            migrated = app.schema.to_dict(new, "the state returned by migrate")
            lost = [k for k in state if k not in migrated]
            if lost:
                raise InvalidUpdateError(
                    f"graph {app.name!r}: the state returned by migrate lacks {lost}, which "
                    "the run's state has; it returns the whole migrated state, not an update. "
                    "Fix: start from the state it is given ({**state, ...}).")
            return migrated

        migrate.__qualname__ = migrate.__name__ = f"{self.name}::migrate"
        migrate.__module__ = self.graph.module
        spec = Spec(migrate, kind="task", name=f"{self.name}::migrate", version="1",
                    cache=False, ignore=("state",))
        return Task(migrate, spec)

    def _defaults_task(self) -> Task[Any, Any]:
        schema = self.schema

        def defaults(state: dict[str, Any]) -> dict[str, Any]:
            return schema.complete(state)

        defaults.__qualname__ = defaults.__name__ = f"{self.name}::defaults"
        defaults.__module__ = self.graph.module
        spec = Spec(defaults, kind="task", name=f"{self.name}::defaults", version="1",
                    cache=False)
        return Task(defaults, spec)

    def _entrypoint(self, store: Store | None) -> Entrypoint[Any, Any]:
        app = self

        def run_graph(input: dict[str, Any]) -> dict[str, Any]:
            return app._execute(input, top=True)

        run_graph.__qualname__ = run_graph.__name__ = self.name
        run_graph.__module__ = self.graph.module
        spec = Spec(run_graph, kind="entrypoint", name=self.name, store=store)
        return Entrypoint(run_graph, spec)

    # -- execution -------------------------------------------------------------------------
    def _execute(self, values: dict[str, Any], *, top: bool,
                 writes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The super-step loop (inside a run): returns the final state as a dict; ``writes``
        collects every node's update in the order they were applied (for a subgraph)."""
        if top and _namespace.get():
            # a graph run of its own started inside a node: its super-steps are its own
            # top level, not a subgraph's of the graph whose node called it
            outer = _namespace.set(())
            try:
                return self._execute(values, top=True, writes=writes)
            finally:
                _namespace.reset(outer)
        ctx = current_run.get()
        cancel = self._cancel.get() if top else None
        if cancel is not None and ctx is not None:
            cancel.attach(ctx)  # ainvoke / astream: cancelling stops the run
        # a run checkpointed under another graph, resumed with migrate=: the state is
        # migrated by a journaled step before the first super-step that had not finished
        migrate_at = self._check_fingerprint(ctx) if top and ctx is not None else None
        state = dict(values)
        if self.schema.kind != "typeddict" and any(k not in state for k in self.schema.fields):
            # the defaults of the fields the input leaves out, made once by a journaled step
            # (a default factory's value is the same for every node, and when the run resumes:
            # an interrupt in the first super-step would otherwise ask again and again)
            state = self._defaults(state)
        blob: bytes | None = None  # the pickled state, as the last checkpoint journaled it
        frontier = self._next_from(START, state)
        joins: dict[str, list[str]] = {}
        path: list[list[str]] = []
        index = 0
        while frontier:
            if index >= self.max_steps:
                raise StepLimitError(
                    f"graph {self.name!r} reached max_steps={self.max_steps} super-steps "
                    f"without reaching END; path: {' → '.join('+'.join(p) for p in path)}. "
                    "Fix: keep a counter in the state and route to an explicit node (for "
                    "example 'escalate') before the limit, or raise max_steps.", path)
            path.append(list(dict.fromkeys(map(_target_name, frontier))))
            if index == migrate_at:
                state = self._migration(index, state)
                blob = None  # (the migrated state's bytes: the next checkpoint holds them)
            handoff = _Handoff(index % FULL_STATE_EVERY == 0, blob)
            token = _handoff.set(handoff)
            try:
                result = self._superstep(index, frontier, state, joins)
            finally:
                _handoff.reset(token)
            executed = handoff.state is not None  # (else replayed from the journal)
            if handoff.state is not None:
                state, blob = handoff.state, handoff.blob
            else:
                state, blob = self._state_after(blob, result, state)
            frontier, joins = result["next"], result["joins"]
            if writes is not None:
                for node in result["nodes"]:
                    writes.extend(_writes(result["updates"][node]))
            # a stream that answers an interrupt (stream(Command(resume=...))) shows what
            # executes, as LangGraph's does: the super-steps replayed from the journal were
            # streamed when they executed (a chat showed its messages twice); a stream of
            # the input shows them all
            if ctx is not None and ctx.listener is not None and (
                    executed or not _executed_only.get()):
                from durably._store.records import now

                reducers = self.schema.reducers
                try:
                    shown = self.schema.build(state)
                except Exception:  # noqa: BLE001 - watching a run never changes its outcome
                    shown = dict(state)  # (a state its type refuses between two nodes)
                ctx.emit(Event("graph_step", ctx.run_id, now(), task=self.name,
                               data={"step": index, "values": shown,
                                     "updates": {n: _merged(u, reducers) for n, u in
                                                 result["updates"].items()},
                                     "next": list(dict.fromkeys(map(_target_name, frontier))),
                                     "namespace": _namespace.get()},
                               attempt=ctx.attempt))
            index += 1
        return state

    def _state_after(self, base: bytes | None, result: Mapping[str, Any],
                     before: dict[str, Any] | None = None
                     ) -> tuple[dict[str, Any], bytes | None]:
        """The state after a journaled super-step, and its pickled bytes (None when not
        known): whole in its result, or its splice applied to ``base`` (the bytes of the
        state after the super-step before it). A new object each time. When the splice was
        cut from other bytes (the super-step before it was set aside by ``repair_run`` and
        executed again, differently), its updates are applied through the reducers to
        ``before``, that super-step's state as it is now, as it was applied when it ran.

        Raises:
            CorruptJournalError: neither is possible (``before`` is None).
        """
        state: dict[str, Any]
        if "state" in result:
            state = result["state"]
            return state, None
        if "blob" in result:
            blob: bytes = result["blob"]
        elif base is not None and xxhash.xxh3_64_intdigest(base) == result["delta"][3]:
            blob = _spliced(base, result["delta"][:3])
        elif before is not None:
            return self._apply(before, result["updates"]), None
        else:
            raise CorruptJournalError(
                f"graph {self.name!r}: the checkpoint of super-step {result.get('index')} "
                "holds only its change from the state after the super-step before it, and "
                "the journal does not have that state as it was (that super-step was set "
                "aside, or executed again after a repair). Fix: fork the run at an earlier "
                "checkpoint (durably fork), or start a new run with fresh=True.")
        from durably._keys import serde as _serde

        state = _serde.loads(blob)
        return state, blob

    def _recorded(self, store: Store, run_id: str) -> dict[str, Any] | None:
        """The graph the run's checkpoints were last written under: ``{"fingerprint": ...,
        "migrate_at": super-step index or None}``."""
        from durably._keys import serde as _serde

        events = store.list_events(run_id, ("graph",))
        if not events or events[-1].data is None:
            return None
        recorded: dict[str, Any] = _serde.loads(events[-1].data)
        return recorded

    def _changes(self, store: Store, run_id: str) -> list[str] | None:
        """What changed since the run's checkpoints were written (None: nothing, or nothing
        they depend on: see :meth:`_untouched`), raising GraphChangedError unless a
        migration is set."""
        recorded = self._recorded(store, run_id)
        if recorded is None or recorded["fingerprint"] == self.fingerprint:
            return None
        finished = {s.task for s in store.list_steps(run_id) if s.status in ("ran", "cached")}
        if self._untouched(recorded["fingerprint"], finished):
            return None  # nothing the change affects was checkpointed
        changes = describe_changes(recorded["fingerprint"], self.fingerprint,
                                   recorded.get("parts"), parts_of(self.graph))
        if self._migrate.get() is None:
            raise GraphChangedError(
                f"run {run_id!r} of graph {self.name!r} was checkpointed under another "
                f"graph: {'; '.join(changes) or 'the structure changed'}. Fix: restore the "
                "old graph to finish it, start a new run (invoke(..., fresh=True)), or "
                "continue it under the new graph with migrate=lambda state: state (or a "
                "function that converts the state).", changes)
        return changes

    def _check_fingerprint(self, ctx: Any) -> int | None:
        """Record the graph with the run; return the super-step before which the state is
        migrated (a journaled step, so later attempts replay it), or None."""
        from durably._keys import serde as _serde
        from durably._store.records import EventRecord, now

        recorded = self._recorded(ctx.store, ctx.run_id)
        if recorded is not None and recorded["fingerprint"] == self.fingerprint:
            at: int | None = recorded["migrate_at"]
            return at
        at = None
        if recorded is not None:
            # raises unless migrate= was given; None: nothing checkpointed is affected
            if self._changes(ctx.store, ctx.run_id) is None:
                at = recorded["migrate_at"]
            else:
                name = self._superstep.spec.name
                at = len({s.step_id for s in ctx.store.list_steps(ctx.run_id)
                          if s.task == name and s.status == "ran"})
        # the parts of each node's code too (not compared: they only name what changed)
        data = {"fingerprint": self.fingerprint, "migrate_at": at, "parts": parts_of(self.graph)}
        ctx.claim()
        ctx.store.append_events([EventRecord(ctx.run_id, "graph", now(), ctx.attempt, None,
                                             self.fingerprint_digest,
                                             _serde.dumps(data, what="the graph"))])
        return at

    def _untouched(self, old: Mapping[str, Any], finished: set[str]) -> bool:
        """Whether the run's journal is unaffected by the change from the recorded
        fingerprint ``old`` to this graph's (``finished``: the tasks of the run's finished
        steps): only nodes that never finished in the run changed (a fix to the node that
        failed, then a rerun, as for any task), and the structure too only while no
        super-step has finished (no checkpoint). A node that finished, even in a super-step
        a sibling failed, would be replayed with its old code's result."""
        new = self.fingerprint
        on, nn = old.get("nodes", {}), new.get("nodes", {})
        changed = {n for n in {*on, *nn} if on.get(n) != nn.get(n)}
        if any(f"{self.name}.{n}" in finished for n in changed):
            return False
        if self._superstep.spec.name not in finished:
            return True
        return all(old.get(k) == new.get(k) for k in {*old, *new} - {"nodes"})

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
        out = r.fn(self.schema.build(state))
        values = list(out) if isinstance(out, (list, tuple)) else [out]
        targets: list[Target] = []
        for v in values:
            v = _as_send(v)
            if _is_command(v):
                raise InvalidRouteError(
                    f"router {r.fn.__name__!r} (after {r.source!r}) returned {v!r:.200}: a "
                    "router returns node names, END or Sends; a Command (an update and where "
                    "to go) is what a node returns. Fix: return the names (or Sends), or "
                    "move the decision into the node and return the Command from it.")
            if isinstance(v, Send):
                if not isinstance(v.node, str) or v.node not in r.names or v.node == END:
                    raise InvalidRouteError(
                        f"router {r.fn.__name__!r} (after {r.source!r}) returned {v!r:.200}, "
                        f"whose node is not among its declared destinations "
                        f"{[n for n in r.names if n != END]}. Fix: send to one of them, or "
                        "declare the node in add_conditional_edges.")
                from durably._keys import serde as _serde

                # journaled with the super-step: refused here, naming the router
                _serde.dumps(v.arg, what=f"the input of {v.node!r} sent by router "
                             f"{r.fn.__name__!r} (after {r.source!r})")
                targets.append(v)
                continue
            if r.mapping is not None:
                if v not in r.mapping:
                    raise InvalidRouteError(
                        f"router {r.fn.__name__!r} (after {r.source!r}) returned {v!r}, which "
                        f"is not among its declared outputs {list(r.mapping)}. Fix: return "
                        "one of them, or declare it in add_conditional_edges.")
                targets.append(r.mapping[v])
            else:
                if v not in r.names:
                    raise InvalidRouteError(
                        f"router {r.fn.__name__!r} (after {r.source!r}) returned {v!r}, which "
                        f"is not among its declared destinations {r.names}. Fix: return one "
                        "of them, or declare it in add_conditional_edges.")
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

    def _run_superstep(self, index: int, frontier: list[Target], state: dict[str, Any],
                       joins: dict[str, list[str]]) -> dict[str, Any]:
        order = [n for n in self.graph.nodes if n in frontier]  # node order, not finish order
        sends = [t for t in frontier if isinstance(t, Send)]  # in the order routed
        # the fields the state leaves out get their defaults once, here (journaled with the
        # super-step: a default factory's value is the same for every node and every read)
        state = self.schema.complete(state)
        top = not _namespace.get()
        if self.schema.kind == "pydantic" and top:
            # the validated values, as the nodes see them (a nested model given as a dict,
            # a tuple given as a list): what a node returns is compared with those
            model = self._validate(state, index, order, before=True)
            state = self.schema.fields_of(model)
            views = {n: _deepcopy(model) for n in order}
        else:
            # each node gets its own copy: mutating it in place cannot leak into a sibling,
            # the checkpoint, or a replay (which would not repeat the mutation)
            views = {n: self.schema.build(_deepcopy(state)) for n in order}
        # the calls: each node of the frontier given its view of the state, then each Send's
        # node given its own input (a copy: the journaled frontier keeps the original)
        calls = [(n, views[n]) for n in order] + [(t.node, _deepcopy(t.arg)) for t in sends]
        results: list[Any] = [None] * len(calls)
        errors: dict[int, BaseException] = {}
        if len(calls) == 1:
            try:
                results[0] = self._call_node(*calls[0])
            except BaseException as exc:  # noqa: BLE001 - sorted out below
                errors[0] = exc
        else:
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(calls)) as pool:
                futures = [pool.submit(contextvars.copy_context().run, self._call_node, n, v)
                           for n, v in calls]
                for i, future in enumerate(futures):
                    try:
                        results[i] = future.result()
                    except BaseException as exc:  # noqa: BLE001 - sorted out below
                        errors[i] = exc
        if errors:
            signals = [e for e in errors.values() if isinstance(e, InterruptSignal)]
            others = {n: e for n, e in errors.items() if not isinstance(e, InterruptSignal)}
            if others:
                fatal = [e for e in others.values() if not isinstance(e, Exception)]
                if fatal:
                    raise fatal[0]  # Ctrl-C, a stopped stream: not a node failure
                if len(others) == 1:
                    raise next(iter(others.values()))
                raise ExceptionGroup(
                    f"{len(others)} nodes of super-step {index} of graph {self.name!r} failed",
                    [e for e in others.values() if isinstance(e, Exception)])
            raise InterruptSignal([i for s in signals for i in s.interrupts])
        updates: dict[str, Any] = {}
        gotos: list[Target] = []  # where nodes returning a Command go (in call order)
        for i, (n, _) in enumerate(calls):
            result = results[i]
            what = (f"the update returned by node {n!r}" if i < len(order) else
                    f"the update returned by node {n!r} (called by Send)")
            pairs = None
            if _is_command(result):
                gotos.extend(self._gotos(n, result))
                result = {} if result.update is None else result.update
                if isinstance(result, (list, tuple)) and result and all(
                        isinstance(w, tuple) and len(w) == 2 and isinstance(w[0], str)
                        for w in result):
                    pairs = result  # LangGraph's form: (key, value) writes, in turn
            if pairs is not None:
                update: Any = [self.schema.update_of({k: v}, state, what) for k, v in pairs]
            elif isinstance(result, Writes):
                update = list(result)
            else:
                update = self.schema.update_of(result, state, what)
            if i < len(order):
                updates[n] = update
            else:  # a Send's call: its node's updates, one per call
                sent = updates.setdefault(n, Sent())
                if not isinstance(sent, Sent):  # the node ran from the frontier too
                    sent = updates[n] = Sent([sent])
                sent.append(update)
        ran = list(updates)  # each node that ran, once (node order, then sends' order)
        started_from = state
        state = self._apply(state, updates)
        if self.schema.kind == "pydantic" and top:  # (a subgraph's is the parent's to keep)
            state = self.schema.fields_of(self._validate(
                state, index, self._culprits(started_from, updates, ran)))
        frontier_next, joins = self._advance(ran, state, joins)
        for t in gotos:
            if isinstance(t, Send) or t not in frontier_next:
                frontier_next.append(t)
        journaled = StepResult(index=index)
        pickled = _pickled_state(state)
        handoff = _handoff.get()
        if pickled is None:  # the journal pickles the object (and says what fails)
            journaled["state"] = state
        elif handoff is None or handoff.whole or handoff.base is None:
            journaled["blob"] = pickled
        else:
            # with a digest of the bytes it splices (a super-step executed again after a
            # repair may have left others): a rebuild from other bytes is refused
            journaled["delta"] = (*_splice(handoff.base, pickled),
                                  xxhash.xxh3_64_intdigest(handoff.base))
        if handoff is not None:
            handoff.state, handoff.blob = state, pickled
        journaled.update(next=frontier_next, joins=joins, updates=updates,
                         fingerprint=self.fingerprint_digest, nodes=ran)
        return journaled

    def _culprits(self, state: dict[str, Any],
                  updates: Mapping[str, dict[str, Any] | list[dict[str, Any]]],
                  order: list[str]) -> Callable[[], list[str]]:
        """The nodes of a super-step whose update alone makes ``state`` invalid (all of
        them when none does alone), found only when asked (after the combined state
        failed)."""
        def find() -> list[str]:
            if len(order) < 2:
                return order
            alone = []
            for n in order:
                try:
                    self.schema.build(self._apply(state, {n: updates[n]}))
                except Exception:  # noqa: BLE001 - this node's update is refused
                    alone.append(n)
            return alone or order
        return find

    def _validate(self, state: dict[str, Any], index: int,
                  order: list[str] | Callable[[], list[str]], before: bool = False) -> Any:
        """The pydantic state as its type validates it: at the start of a super-step (the
        input, a migrated or older checkpoint), and on the state its updates made (a node
        returning a dict skips the validators), before it is checkpointed: an invalid update
        fails the super-step, naming its nodes, instead of ending the run with it. (Not in
        a subgraph: the parent takes only its writes, and validates its own state.)

        Raises:
            InvalidUpdateError: the state is not valid for the state type."""
        try:
            return self.schema.build(state)
        except Exception as exc:
            order = order() if callable(order) else order
            nodes = " and ".join(map(repr, order))
            made = (f"the state super-step {index} of graph {self.name!r} starts from"
                    if before else
                    f"the state after super-step {index} of graph {self.name!r} (the "
                    f"updates of node{'s' if len(order) > 1 else ''} {nodes})")
            raise InvalidUpdateError(
                f"{made} is not a valid {self.schema.type.__name__}: {exc}. Fix: "
                + ("give an input the state type accepts." if before else
                   "return values the state type accepts.")) from exc

    def _call_node(self, node: str, view: Any) -> Any:
        """Call a node's task; inside it, the node is the innermost part of the namespace
        (what a subgraph's super-steps are streamed under)."""
        token = _namespace.set((*_namespace.get(), node))
        try:
            return self._tasks[node](view)
        finally:
            _namespace.reset(token)

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

    def _apply(self, state: dict[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
        """Apply the updates of one super-step in node order through the reducers. A
        subgraph's update is the list of its nodes' writes, applied in turn; a node called
        by :class:`Send` has one update per call (:class:`Sent`), each call a writer of its
        own."""
        writers: dict[str, list[str]] = {}
        new = dict(state)
        calls: list[tuple[str, Any]] = []
        for node, update in updates.items():
            if isinstance(update, Sent):
                calls.extend((f"{node} (Send call {j})", one) for j, one in enumerate(update, 1))
            else:
                calls.append((node, update))
        for node, update in calls:
            for one in _writes(update):
                for key, value in one.items():
                    reducer = self.schema.reducers.get(key)
                    if reducer is None:
                        writers.setdefault(key, [])
                        if node not in writers[key]:
                            writers[key].append(node)
                        new[key] = value
                        continue
                    try:
                        # a key the state does not hold yet starts from the default the
                        # nodes were shown (the state type's), if it has one
                        base = new[key] if key in new else self.schema.default(key)
                        new[key] = value if base is _NOTHING else reducer(base, value)
                    except Exception as exc:
                        exc.add_note(f"durably: in the reducer of state key {key!r}, "
                                     f"applying the update of node {node!r}")
                        raise
        clashes = {k: ns for k, ns in writers.items() if len(ns) > 1}
        if clashes:
            key, nodes = next(iter(clashes.items()))
            raise InvalidUpdateError(
                f"nodes {' and '.join(map(repr, nodes))} all wrote state key {key!r} in one "
                f"super-step, and {key!r} has no reducer, so one write would be lost. Fix: "
                "give the key a reducer in the state type (Annotated[<type>, reducer], for "
                "example operator.add for lists) or let one node write it."
                if len(nodes) > 2 else
                f"nodes {nodes[0]!r} and {nodes[1]!r} both wrote state key {key!r} in one "
                f"super-step, and {key!r} has no reducer, so one write would be lost. Fix: "
                "give the key a reducer in the state type (Annotated[<type>, reducer], for "
                "example operator.add for lists) or let one node write it.")
        return new

    # -- public API ------------------------------------------------------------------------
    def invoke(self, state: Any = None, *, run_id: str | None = None, fresh: bool = False,
               migrate: Callable[[Any], Any] | None = None) -> Any:
        """Run the graph to the end and return the final state.

        Args:
            state: The input state (a dict of keys, or an instance of the state type).
                None to continue the run ``run_id`` with the input it started with.
                ``Command(resume=answer)`` with ``run_id`` answers the run's pending
                interrupt (as :meth:`resume` does).
            run_id: Continue (or start) the run with this id. Default: derived from the
                graph and the input, so invoking again with the same input continues the
                same run.
            fresh: Start a new run even if one with this input exists (after editing the
                graph, to run it anew rather than continue the old run).
            migrate: ``state -> state`` applied once when the run was checkpointed under a
                different graph (otherwise that raises :class:`GraphChangedError`): to the
                state at the run's last checkpoint, before the first super-step that
                executes. Nodes whose input state it changed run as new steps (an
                ``interrupt()`` in them asks again).

        Returns:
            The final state (a dict for a TypedDict state, else an instance).

        Raises:
            RunInterrupted: a node called ``interrupt()``; answer with :meth:`resume`.
            GraphChangedError: the run's checkpoints come from another graph.
            StepLimitError: more than ``max_steps`` super-steps.
            InvalidUpdateError: two nodes wrote one key without a reducer, or a node
                returned something that is not an update.
            InvalidRouteError: a router returned an undeclared destination.

        Exceptions raised by nodes propagate unchanged (several at once: ``ExceptionGroup``).
        """
        answering, answer = self._answer_in(state, run_id, fresh)
        if answering:
            return self.resume(run_id, answer, migrate=migrate)  # type: ignore[arg-type]
        args = self._input(state, run_id)
        token = self._migrate.set(migrate)
        try:
            run = self._entry.run(args, run_id=run_id, fresh=fresh)
        finally:
            self._migrate.reset(token)
        if run.status == "interrupted":
            from durably.exceptions import RunInterrupted

            raise RunInterrupted(run.id, run.interrupts, "app")
        return self.schema.build(run.result)

    def run(self, state: Any = None, *, run_id: str | None = None, fresh: bool = False,
            migrate: Callable[[Any], Any] | None = None) -> Run[Any]:
        """Like :meth:`invoke`, but return the :class:`~durably.Run` handle (status
        ``interrupted`` instead of raising; ``run.result`` is the final state as a dict)."""
        answering, answer = self._answer_in(state, run_id, fresh)
        token = self._migrate.set(migrate)
        try:
            if answering:
                assert run_id is not None
                self._changes(self._store(), run_id)  # before the answer is journaled
                entry = self._entry
                resumed: Run[Any] = entry._self_resume(entry.__wrapped__, None, run_id, answer,
                                                       handle=True)
                return resumed
            return self._entry.run(self._input(state, run_id), run_id=run_id, fresh=fresh)
        finally:
            self._migrate.reset(token)

    def _answer_in(self, state: Any, run_id: str | None, fresh: bool) -> tuple[bool, Any]:
        """(True, the answer) when the input is LangGraph's way of answering an interrupt,
        ``Command(resume=answer)`` (with ``run_id``), else (False, None).

        Raises:
            DefinitionError: a Command input without ``resume=`` or without ``run_id``."""
        if not _is_command(state):
            return False, None
        shown = f"{state!r:.200}"
        if state.resume is None or state.update is not None or state.goto not in ((), None):
            raise DefinitionError(
                f"graph {self.name!r}: the input {shown} is a Command; as an input, a "
                "Command answers a run's interrupt: Command(resume=answer) alone. Fix: pass "
                "the input state, or Command(resume=answer) with run_id=...")
        if run_id is None or fresh:
            raise DefinitionError(
                f"graph {self.name!r}: {shown} answers the interrupt of a run, which needs "
                "run_id=... (and not fresh=True). Fix: app.invoke(Command(resume=answer), "
                "run_id=run.id)")
        return True, state.resume

    def _input(self, state: Any, run_id: str | None) -> dict[str, Any]:
        if state is None:
            if run_id is None:
                raise DefinitionError(
                    f"graph {self.name!r}: invoke(None) continues an existing run, so it needs "
                    "run_id=... Fix: pass the input state, or the id of the run to continue.")
            from durably._keys import serde as _serde

            run = self._own_run(run_id)
            if run._record.args is None:
                raise RunStateError(f"the input of run {run_id!r} was not stored; pass it "
                                    "again: invoke(state, run_id=...)")
            args, _ = _serde.loads(run._record.args)
            return dict(args[0])
        return self.schema.to_dict(state, "the input state")

    def _own_run(self, run_id: str) -> Run[Any]:
        """One of this graph's runs.

        Raises:
            NotFoundError: no such run.
            RunStateError: the run belongs to another graph or entrypoint.
        """
        from durably._runtime.run import get_run

        run = get_run(run_id, store=self._store())
        if run.entrypoint != self._entry.spec.identity:
            raise RunStateError(
                f"run {run_id!r} belongs to {run.entrypoint!r}, not to graph "
                f"{self._entry.spec.identity!r}. Fix: use the graph that made it.")
        return run

    def _store(self) -> Store:
        from durably._runtime.config import default_store

        return self._entry.spec.store or default_store()

    def resume(self, run_id: str, value: Any = None, *,
               migrate: Callable[[Any], Any] | None = None) -> Any:
        """Answer the pending interrupt(s) of a run and continue it; return the final state.

        Args:
            run_id: The interrupted run.
            value: The answer; several pending interrupts (parallel nodes) take a mapping
                ``{interrupt_id: value}``.
            migrate: As for :meth:`invoke`.

        Raises:
            RunInterrupted: the run paused again.
            RunStateError: the run is not interrupted.
        """
        token = self._migrate.set(migrate)
        try:
            self._changes(self._store(), run_id)  # before the answer is journaled
            final = self._entry.resume(run_id, value)
        finally:
            self._migrate.reset(token)
        return self.schema.build(final)

    def stream(self, state: Any = None, *, mode: str = "values", run_id: str | None = None,
               fresh: bool = False, migrate: Callable[[Any], Any] | None = None,
               subgraphs: bool = False) -> Generator[Any, None, None]:
        """Run the graph and yield as it goes.

        Args:
            state: The input state (as for :meth:`invoke`).
            mode: ``"values"``: the state after each super-step; ``"updates"``: a dict
                ``{node: update}`` per super-step (a subgraph node's update combines its
                nodes' writes to a key with the key's reducer, ``reducer(first, second)``:
                every write for ``operator.add`` or ``add_messages``; else the last write);
                ``"events"``: every :class:`~durably.Event` of the run (steps, nodes,
                custom events, the super-steps of subgraphs too).
            run_id: As for :meth:`invoke`.
            fresh: As for :meth:`run`.
            migrate: As for :meth:`invoke`.
            subgraphs: Also yield the super-steps of subgraphs as they execute, each item
                as a pair ``(namespace, item)``, as LangGraph's ``subgraphs=True`` does: the
                namespace is ``()`` for this graph's own super-steps and the interrupt,
                ``("research",)`` inside the subgraph node ``"research"``, and so on inward
                (node names, without LangGraph's task ids). A subgraph's super-steps are
                yielded when its node executes (or resumes), not when the parent's
                super-step is replayed whole from the journal. Not used with
                ``mode="events"``.

        Super-steps replayed from the journal are yielded too. When a node interrupts, the
        last item is ``{"__interrupt__": [Interrupt, ...]}`` (answer with :meth:`resume`).
        Breaking out of the loop stops the run at its next step boundary (resumable).

        Raises:
            DefinitionError: ``mode`` is not one of the three, or ``subgraphs`` is not a
                bool (at the first item).

        Example:
            >>> import durably, tempfile
            >>> from typing import TypedDict
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> class Doc(TypedDict):
            ...     text: str
            >>> inner = durably.StateGraph(Doc, name="inner")
            >>> _ = inner.add_node("shout", lambda s: {"text": s["text"].upper()})
            >>> _ = inner.add_edge(durably.START, "shout").add_edge("shout", durably.END)
            >>> outer = durably.StateGraph(Doc, name="outer")
            >>> _ = outer.add_node("edit", inner.compile())
            >>> _ = outer.add_edge(durably.START, "edit").add_edge("edit", durably.END)
            >>> for item in outer.compile().stream({"text": "hi"}, mode="updates",
            ...                                    subgraphs=True):
            ...     print(item)
            (('edit',), {'shout': {'text': 'HI'}})
            ((), {'edit': {'text': 'HI'}})
            >>> durably.configure()
        """
        if mode not in ("values", "updates", "events"):
            raise DefinitionError(f"stream(mode=...) is 'values', 'updates' or 'events', not "
                                  f"{mode!r}")
        if not isinstance(subgraphs, bool):
            raise DefinitionError(f"stream(subgraphs=...) is True or False, not {subgraphs!r}")
        answering, answer = self._answer_in(state, run_id, fresh)
        # the run's thread starts at the first item, with a copy of this context: migrate=
        # is set in it for that moment only (a generator runs in its consumer's context)
        token = self._migrate.set(migrate)
        only = _executed_only.set(answering)
        try:
            if answering:  # stream(Command(resume=answer), run_id=...): answer, then go on
                assert run_id is not None
                self._changes(self._store(), run_id)  # before the answer is journaled
                entry = self._entry
                stored, kwargs, on_lease = entry._self_answering(run_id, answer)
                events = entry._self_stream(entry.__wrapped__, None, stored, kwargs, run_id,
                                            False, on_lease)
            else:
                events = self._entry.stream(self._input(state, run_id), run_id=run_id,
                                            fresh=fresh)
            first = next(events, None)
        finally:
            _executed_only.reset(only)
            self._migrate.reset(token)
        try:
            for event in itertools.chain(() if first is None else (first,), events):
                if mode == "events":
                    yield event
                elif event.kind == "graph_step":
                    namespace = event.data.get("namespace", ())
                    if namespace and not subgraphs:
                        continue  # a subgraph's own super-step
                    item = event.data["values"] if mode == "values" else event.data["updates"]
                    yield (namespace, item) if subgraphs else item
                elif event.kind == "run_interrupted":
                    item = {"__interrupt__": list(event.data)}  # as LangGraph's stream does
                    yield ((), item) if subgraphs else item
        finally:
            close = getattr(events, "close", None)  # (a generator)
            if close is not None:
                close()  # a run still going stops at its next step boundary

    # -- from async code (LangGraph's names): the run executes in a thread of its own -------
    async def ainvoke(self, state: Any = None, *, run_id: str | None = None,
                      fresh: bool = False, migrate: Callable[[Any], Any] | None = None) -> Any:
        """:meth:`invoke` from async code: the run executes in a thread of its own, so the
        caller's event loop keeps serving. Async nodes run in that thread on an event loop of
        their own (objects bound to the caller's loop, such as its queues, cannot be awaited
        there). Cancelling the call (a timeout, Ctrl-C under ``asyncio.run``) stops the run
        at its next step boundary, resumable, before the cancellation propagates.

        Args:
            state: As for :meth:`invoke`.
            run_id: As for :meth:`invoke`.
            fresh: As for :meth:`invoke`.
            migrate: As for :meth:`invoke`.

        Returns:
            The final state, as :meth:`invoke` returns it.

        Raises:
            RunInterrupted: a node called ``interrupt()``; answer with :meth:`aresume`.
            GraphChangedError: as for :meth:`invoke`, like every other error it raises.

        Example:
            >>> import asyncio, tempfile, durably
            >>> from typing import TypedDict
            >>> from durably import StateGraph, START, END
            >>> class C(TypedDict):
            ...     n: int
            >>> b = StateGraph(C, name="ainvoke_doc")
            >>> _ = b.add_node("double", lambda s: {"n": s["n"] * 2})
            >>> _ = b.add_edge(START, "double")
            >>> _ = b.add_edge("double", END)
            >>> app = b.compile(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> asyncio.run(app.ainvoke({"n": 21}))
            {'n': 42}
        """
        return await self._in_thread(self.invoke, state, run_id=run_id, fresh=fresh,
                                     migrate=migrate)

    async def aresume(self, run_id: str, value: Any = None, *,
                      migrate: Callable[[Any], Any] | None = None) -> Any:
        """:meth:`resume` from async code (as :meth:`ainvoke`: a thread of its own;
        cancelling stops the run at its next step boundary).

        Args:
            run_id: The interrupted run.
            value: The answer (a mapping ``{interrupt_id: value}`` for several).
            migrate: As for :meth:`invoke`.

        Returns:
            The final state.

        Raises:
            RunInterrupted: the run paused again.
            RunStateError: the run is not interrupted.
        """
        return await self._in_thread(self.resume, run_id, value, migrate=migrate)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        cancel = _Cancel()

        def settle(result: Any, exc: BaseException | None) -> None:
            if not done.done():
                if exc is None:
                    done.set_result(result)
                else:
                    done.set_exception(exc)

        def work() -> None:
            self._cancel.set(cancel)  # (this thread's own copy of the caller's context)
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(settle, result, error)

        threading.Thread(target=contextvars.copy_context().run, args=(work,),
                         name="durably-graph", daemon=True).start()
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            cancel.stop()
            # the run ends (stopped) at its next step boundary: wait for it, so a retry
            # finds it resumable (cancelling again stops waiting)
            try:
                await asyncio.shield(done)
            except asyncio.CancelledError:
                raise
            except BaseException:  # noqa: BLE001 - the run's end (StopRun) is expected
                pass
            raise

    async def astream(self, state: Any = None, *, mode: str = "values",
                      run_id: str | None = None, fresh: bool = False,
                      migrate: Callable[[Any], Any] | None = None,
                      subgraphs: bool = False) -> AsyncIterator[Any]:
        """:meth:`stream` from async code (``async for``): the same items, from a run that
        executes in a thread of its own and waits while you handle each item. Leaving the
        loop early (``break``, an exception, cancelling the task) stops the run at its next
        step boundary, resumable, as with :meth:`stream`.

        Args:
            state: As for :meth:`stream`.
            mode: As for :meth:`stream`.
            run_id: As for :meth:`stream`.
            fresh: As for :meth:`stream`.
            migrate: As for :meth:`invoke`.
            subgraphs: As for :meth:`stream`.

        Yields:
            The items :meth:`stream` yields.

        Raises:
            DefinitionError: ``mode`` is not one of the three.
        """
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        closed: asyncio.Future[None] = loop.create_future()
        wanted = threading.Semaphore(0)
        cancel = _Cancel()

        def send(kind: str, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(arrived.put_nowait, (kind, value))

        def end() -> None:
            if not closed.done():
                closed.set_result(None)

        def pump() -> None:
            """Fetch one item per request, in this one thread, which also closes the
            stream (a generator is never closed while another thread runs it)."""
            self._cancel.set(cancel)
            items = self.stream(state, mode=mode, run_id=run_id, fresh=fresh, migrate=migrate,
                                subgraphs=subgraphs)
            try:
                while True:
                    wanted.acquire()
                    if cancel.stopped:
                        break
                    try:
                        item = next(items)
                    except StopIteration:
                        break
                    except BaseException as exc:  # noqa: BLE001 - raised in the consumer
                        send("error", exc)
                        break
                    send("item", item)
            finally:
                try:
                    items.close()  # a run still going stops at its next step boundary
                finally:
                    send("end", None)
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(end)

        threading.Thread(target=contextvars.copy_context().run, args=(pump,),
                         name="durably-graph-stream", daemon=True).start()
        try:
            while True:
                wanted.release()
                kind, value = await arrived.get()
                if kind == "end":
                    break
                if kind == "error":
                    raise value
                yield value
        finally:
            if not closed.done():
                cancel.stop()
                wanted.release()
                # the run ends (stopped) at its next step boundary: wait for it, so the run
                # is resumable once the loop is left (cancelling again stops waiting)
                await asyncio.shield(closed)

    def get_state(self, run_id: str) -> StateSnapshot:
        """The state at the run's latest checkpoint.

        Raises:
            NotFoundError: no such run.
            CorruptJournalError: the latest checkpoint cannot be rebuilt: a super-step
                before it (since the last whole state) was set aside by ``repair_run`` and
                has not executed again yet (resume the run: it does).
        """
        history, last = self._history(run_id)
        if history[0].step != last:
            raise CorruptJournalError(
                f"graph {self.name!r}: the state at the latest checkpoint of run {run_id!r} "
                f"(super-step {last}) cannot be rebuilt: a super-step before it was set "
                f"aside (repair_run) and has not executed again; the latest it can show is "
                f"super-step {history[0].step}. Fix: resume the run (it executes that "
                "super-step again), or read get_state_history() for the earlier ones.")
        return history[0]

    def get_state_history(self, run_id: str) -> list[StateSnapshot]:
        """The run's checkpoints (one per super-step, and the input), newest first. After a
        super-step set aside by ``repair_run``, the checkpoints up to the next whole state
        (:data:`FULL_STATE_EVERY`) are left out until the run executes it again.

        Raises:
            NotFoundError: no such run.
        """
        return self._history(run_id)[0]

    def _history(self, run_id: str) -> tuple[list[StateSnapshot], int]:
        """:meth:`get_state_history`, and the index of the run's last super-step (-1: none
        finished)."""
        from durably._keys import serde as _serde

        run = self._own_run(run_id)
        store = self._store()
        name = self._superstep.spec.name
        snapshots: list[StateSnapshot] = []
        seen: set[str] = set()
        first: dict[str, Any] = {}
        if run._record.args is not None:
            args, _ = _serde.loads(run._record.args)
            first = dict(args[0])
        snapshots.append(StateSnapshot(
            self.schema.build(first), tuple(map(_target_name, self._next_from(START, first))),
            -1, "", run.id, run.status))
        found: list[tuple[int, str, dict[str, Any]]] = []
        for s in store.list_steps(run.id):
            if (s.task != name or s.parent_id is not None  # not a subgraph's super-steps
                    or s.status not in ("ran", "cached") or s.step_id in seen):
                continue
            seen.add(s.step_id)
            data = store.find_step(run.id, s.step_id)
            if data is None:
                continue
            result = _serde.loads(data)
            found.append((result.get("index", len(found)), s.step_id, result))
        # in super-step order (one executed again after a repair is journaled later); a
        # delta needs the super-step just before it (else: unknown until a whole state)
        found.sort(key=operator.itemgetter(0))
        state: dict[str, Any] | None = first
        blob: bytes | None = None  # the bytes of the last checkpoint's state, if known
        previous = -1
        for index, step_id, result in found:
            whole = "state" in result or "blob" in result
            follows = state is not None and index == previous + 1
            if whole or follows:
                state, blob = self._state_after(blob, result, state if follows else None)
            else:  # a super-step missing before it: shown again from the next whole state
                state, blob = None, None
            previous = index
            if state is not None:
                snapshots.append(StateSnapshot(
                    self.schema.build(state), tuple(map(_target_name, result["next"])), index,
                    step_id, run.id, run.status))
        last = snapshots[-1]
        if run.status == "interrupted" and last.step == previous:
            snapshots[-1] = dataclasses.replace(last, interrupts=tuple(run.interrupts))
        return snapshots[::-1], previous

    def update_state(self, run_id: str, values: Any, *, as_node: str | None = None,
                     at: str | None = None) -> str:
        """Fork the run at its latest checkpoint (or at ``at``) with ``values`` applied
        (through the reducers, as if node ``as_node`` had written them); return the new
        run's id. The source run's history is never rewritten. Continue the fork with
        ``app.invoke(None, run_id=new_id)``.

        Args:
            run_id: The run.
            values: A partial update of the state.
            as_node: Apply it as this node's update: the next super-step runs that node's
                successors. Default: the next nodes stay those of the checkpoint.
            at: The checkpoint to fork from: a ``checkpoint_id`` of
                :meth:`get_state_history` (or a unique prefix of 6+ characters), ``""``
                for the input. Default: the latest.

        Returns:
            The id of the new run (status ``forked``).

        Raises:
            NotFoundError: no such run, it has no checkpoint yet, or none is ``at``.
            DefinitionError: ``as_node`` is not a node of the graph.
        """
        from durably._keys import serde as _serde
        from durably._runtime.history import make_fork

        snapshot = self.get_state(run_id) if at is None else self._snapshot_at(run_id, at)
        if as_node is not None and as_node not in self.graph.nodes:
            raise DefinitionError(f"update_state(as_node={as_node!r}): not a node of graph "
                                  f"{self.name!r} ({list(self.graph.nodes)})")
        store = self._store()
        rec = store.find_run(run_id)
        assert rec is not None
        old: dict[str, Any] = {"joins": {}, "nodes": [], "updates": {},
                               "fingerprint": self.fingerprint_digest}
        if snapshot.checkpoint_id:
            old = _serde.loads(store.find_step(run_id, snapshot.checkpoint_id) or b"")
        base = self.schema.to_dict(snapshot.values, "the state")
        # read as a node's return is: a pydantic instance writes the fields set in it
        update = self.schema.update_of(values, base, "values")
        state = self._apply(base, {as_node or "update_state": update})
        if self.schema.kind == "pydantic":
            try:  # refused here, not when the fork is read or continued
                state = self.schema.fields_of(self.schema.build(state))
            except Exception as exc:
                raise InvalidUpdateError(
                    f"update_state({values!r:.80}) makes a state that is not a valid "
                    f"{self.schema.type.__name__}: {exc}. Fix: give values the state type "
                    "accepts.") from exc
        # the checkpoint's frontier as journaled (a Send keeps its input), not the names
        nxt: list[Target] = list(old["next"]) if snapshot.checkpoint_id else self._next_from(
            START, base)
        joins = dict(old["joins"])
        if as_node is not None:  # as if as_node had just run: it leaves the frontier
            nxt = [n for n in nxt if n != as_node]
            if as_node in old.get("nodes", ()):
                # it ran in that super-step: what its edges and routers chose from the
                # state before the update gives way to what they choose from the state
                # after it (a router that now goes to END; Sends over the new items)
                nxt = _without(nxt, self._next_from(as_node, base))
            nxt, joins = self._advance([as_node], state, joins, nxt)
        old.pop("delta", None)  # (this checkpoint holds the whole state, as the object)
        old.pop("blob", None)
        result = StepResult({**old, "state": state, "next": nxt, "joins": joins,
                             "updates": {as_node or "update_state": update}})
        if snapshot.checkpoint_id:
            return make_fork(store, rec, snapshot.checkpoint_id, result, graph_state=True)
        return self._fork_from_input(store, rec, result)

    def _snapshot_at(self, run_id: str, at: str) -> StateSnapshot:
        """The snapshot of :meth:`get_state_history` whose checkpoint ``at`` names (an id or
        a unique prefix of 6+ characters; ``""``: the input).

        Raises:
            NotFoundError: none, or several."""
        from durably.exceptions import NotFoundError

        history = self.get_state_history(run_id)
        found = ([h for h in history if h.checkpoint_id == ""] if at == "" else
                 [h for h in history if isinstance(at, str) and len(at) >= 6
                  and h.checkpoint_id.startswith(at)])
        if len(found) != 1:
            raise NotFoundError(
                f"graph {self.name!r}: run {run_id!r} has "
                f"{'several checkpoints' if found else 'no checkpoint'} {at!r}. Fix: give a "
                "checkpoint_id of get_state_history() (or 6+ of its first characters), or "
                f"'' for the input: {[h.checkpoint_id[:12] for h in history]}")
        return found[0]

    def _fork_from_input(self, store: Store, rec: Any, result: dict[str, Any]) -> str:
        """A fork of a run that has no finished super-step: its first super-step is the
        update itself."""
        import uuid

        from durably._keys import serde as _serde
        from durably._runtime.runtime import step_identity
        from durably._store.records import EventRecord, RunRecord, StepRecord, now

        fork_id = f"{rec.run_id[:170]}-fork-{uuid.uuid4().hex[:8]}"
        key = self._superstep.spec.journal_key(None, (0, [], {}, {}), {})
        t = now()
        step = StepRecord(fork_id, step_identity(None, key, 0), None, self._superstep.spec.name,
                          "ran", 0, 0, t, t, None, "", None, short_repr(result["state"]))
        store.put_run(RunRecord(fork_id, rec.entrypoint, rec.name, "forked", t, t, 0,
                                rec.input_digest, rec.args))
        store.append_steps([(step, _serde.dumps(result, what="the updated state"))])
        store.append_events([EventRecord(fork_id, "forked", t, 0, None, f"{rec.run_id}@input")])
        return fork_id

    def fork(self, run_id: str, at: str | None = None, *, cache: bool = False) -> Run[Any]:
        """Replay a run up to a checkpoint (``StateSnapshot.checkpoint_id`` or any id from
        ``run.history()``) and execute the rest with today's code, as a new run."""
        return self._entry.fork(run_id, at, cache=cache)

    def get_graph(self, run_id: str | None = None) -> GraphStructure:
        """The declared structure, for drawing; with ``run_id``, the path that run took
        (nodes visited, with counts) and where it stopped.

        Example:
            >>> from typing import TypedDict
            >>> from durably import StateGraph, START, END
            >>> class S(TypedDict):
            ...     n: int
            >>> b = StateGraph(S, name="loop")
            >>> _ = b.add_node("inc", lambda s: {"n": s["n"] + 1})
            >>> _ = b.add_edge(START, "inc")
            >>> _ = b.add_conditional_edges("inc", lambda s: END if s["n"] > 2 else "inc",
            ...                             ["inc", END])
            >>> print(b.compile().get_graph().to_mermaid().splitlines()[5])
                n1 -.->|"inc"| n1
        """
        nodes = (START, *self.graph.nodes, END)
        edges: list[tuple[str, str, str, bool]] = []
        for sources, target in self.graph.edges:
            for s in sources:
                edges.append((s, target, "join" if len(sources) > 1 else "", False))
        for r in self.graph.routers:
            if r.mapping is not None:
                for out, target in r.mapping.items():
                    edges.append((r.source, target, str(out), True))
            else:
                for target in r.names:
                    label = "END" if target == END else target
                    edges.append((r.source, target, label, True))
        for n, options in self.graph.node_options.items():  # where a Command may go
            for target in options["destinations"]:
                edges.append((n, target, "END" if target == END else target, True))
        visits: dict[str, int] = {}
        stopped: tuple[str, ...] = ()
        if run_id is not None:

            run = self._own_run(run_id)
            prefix = f"{self.name}."
            counted: set[str] = set()
            for step in run.records():  # every attempt: a replayed super-step hides its nodes
                node = step.task[len(prefix):] if step.task.startswith(prefix) else ""
                if (node in self.graph.nodes and step.status in ("ran", "cached")
                        and step.step_id not in counted):
                    counted.add(step.step_id)
                    visits[node] = visits.get(node, 0) + 1
            stopped = tuple(dict.fromkeys(
                step.task[len(prefix):] for step in run.steps
                if step.status in ("interrupted", "failed") and step.task.startswith(prefix)
                and step.task[len(prefix):] in self.graph.nodes))
        return GraphStructure(self.name, nodes, tuple(edges), visits, stopped)

