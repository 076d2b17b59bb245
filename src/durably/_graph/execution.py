"""A compiled graph on the durable runtime: the durable pieces it is made of (a task per
node, the super-step, defaults and migration tasks, the entrypoint), and the super-step loop
a run executes (each super-step a journaled step; a replayed one's state rebuilt from its
checkpoint), with what lets async code stop it.

Apart from the public methods (:mod:`durably._graph.compiled`), which start, resume, stream
and read runs; apart from one super-step (:mod:`durably._graph.superstep`). :class:`Execution`
is a part of the compiled graph (a mixin)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import inspect
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import xxhash

from durably._decorators.entrypoints import Entrypoint
from durably._decorators.tasks import Task
from durably._graph.builder import StepLimitError
from durably._graph.checkpoints import FULL_STATE_EVERY, Writes, _spliced
from durably._graph.migration import Migration
from durably._graph.routing import Target, _target_name
from durably._graph.structure import START
from durably._graph.superstep import (
    Supersteps,
    _Handoff,
    _handoff,
    _merged,
    _namespace,
    _writes,
)
from durably._runtime.cancel import on_cancel
from durably._runtime.context import current_run
from durably._runtime.spec import Spec
from durably._trace.tracer import Event
from durably.exceptions import CorruptJournalError

if TYPE_CHECKING:
    from durably.store import Store


def _run_beside_loop(afn: Callable[[Any], Any], state: Any) -> Any:
    """An async node of a graph invoked synchronously from a thread whose event loop is
    running (a notebook cell, a web handler): run on a loop of its own in a thread of its
    own, with the caller's context (the run, the step), while the caller waits (its own
    loop cannot run it: ``asyncio.run`` refuses to nest)."""
    with concurrent.futures.ThreadPoolExecutor(1, "durably-async-node") as thread:
        return thread.submit(contextvars.copy_context().run, asyncio.run, afn(state)).result()


async def _cancellable(work: Any) -> Any:
    """An async node's coroutine, cancelled (``CancelledError`` at its ``await``) when a
    sibling node of its super-step fails or its run is cancelled (see
    :mod:`durably._runtime.cancel`)."""
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    assert me is not None  # (asyncio.run's task)
    unwatch = on_cancel(lambda: loop.call_soon_threadsafe(me.cancel))
    try:
        return await work
    finally:
        unwatch()


#: the stream being served answers an interrupt: it shows only the super-steps that execute
_executed_only: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "durably_graph_executed_only", default=False)


#: the breakpoints a call adds to the graph's own (``invoke(..., interrupt_before=[...],
#: interrupt_after=[...])``), for the super-steps it executes: (before, after)
_call_breakpoints: contextvars.ContextVar[tuple[frozenset[str], frozenset[str]] | None] = (
    contextvars.ContextVar("durably_graph_call_breakpoints", default=None))


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


class Execution(Supersteps, Migration):
    """The compiled graph's durable pieces and its super-step loop."""

    max_steps: int
    interrupt_before: frozenset[str]
    interrupt_after: frozenset[str]
    _cancel: contextvars.ContextVar[_Cancel | None]
    # the migration's and the defaults' Tasks (Any: as Migration._superstep)
    _migration: Any
    _defaults: Any

    #: the subgraphs this graph runs, by node (a subgraph scoped under its path, see
    #: :meth:`_scoped`)
    _subgraphs: dict[str, Execution]
    #: whether every subgraph of this graph is scoped under its path (a scoped graph's are)
    _scope_all: bool

    def _names(self) -> set[str]:
        """The names of this graph and of every graph nested in it."""
        return {self.name}.union(*(sub._names() for sub in self._subgraphs.values()))

    def _scoped(self, node: str, sub: Execution) -> Execution:
        """The subgraph a node runs: ``sub`` itself, or, when its name or a name nested in
        it is this graph's (a subgraph over its parent's state needs no name of its own),
        a copy named by the path of nodes that leads to it (``outer/mid``, and in it
        ``outer/mid/inner``): its steps, super-steps and checkpoints are its own. Only such
        a subgraph is scoped, so the steps of any other keep their names."""
        if not self._scope_all and self.name not in sub._names():
            return sub
        scoped = type(sub)(sub.graph, f"{self.name}/{node}", sub.max_steps,  # type: ignore[call-arg]
                           cast(Any, sub)._entry.spec.store, sub.interrupt_before,
                           sub.interrupt_after,
                           scope_all=True)
        return scoped

    # -- construction of the durable pieces ------------------------------------------------
    def _node_task(self, name: str, fn: Any) -> Task[Any, Any]:
        schema = self.schema
        if isinstance(fn, Execution):  # a compiled graph (the only class made of Execution)
            sub = self._scoped(name, fn)
            self._subgraphs[name] = sub

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
                    return asyncio.run(_cancellable(afn(state)))
                return _run_beside_loop(lambda s: _cancellable(afn(s)), state)

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
        breaks = self._breakpoints_of(ctx) if top and ctx is not None else None
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
            if breaks is not None:
                breaks.check("before", path[-1], index)
            elif self.interrupt_before:
                self._breakpoint("before", self.interrupt_before, path[-1], index)
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
            if breaks is not None:
                breaks.check("after", result["nodes"], index)
            elif self.interrupt_after:
                self._breakpoint("after", self.interrupt_after, result["nodes"], index)
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

    def _breakpoints_of(self, ctx: Any) -> _Breakpoints:
        """The breakpoints of a run's top level: the graph's, and those the call adds."""
        added = _call_breakpoints.get() or (frozenset(), frozenset())
        from durably._keys import serde as _serde

        asked: dict[tuple[str, int], Any] = {}
        for e in ctx.store.list_events(ctx.run_id, ("interrupt",)):
            if e.step_id is None and e.data is not None:
                payload = _serde.loads(e.data)
                if isinstance(payload, dict) and payload.get("graph") == self.name:
                    for when in ("before", "after"):
                        if when in payload and isinstance(payload.get("step"), int):
                            asked.setdefault((when, payload["step"]), payload)
        name = self._superstep.spec.name
        finished = len({s.step_id for s in ctx.store.list_steps(ctx.run_id)
                        if s.task == name and s.status in ("ran", "cached")})
        return _Breakpoints(self.interrupt_before | added[0], self.interrupt_after | added[1],
                            asked, finished, self.name)

    def _breakpoint(self, when: str, nodes: frozenset[str], ran: list[str],
                    index: int) -> None:
        """``interrupt_before`` / ``interrupt_after``: a pause of the run between two
        super-steps, an ``interrupt()`` of the graph's own (answered, it replays)."""
        hit = [n for n in ran if n in nodes]
        if hit:
            from durably._runtime.interrupt import interrupt

            interrupt({when: hit, "step": index, "graph": self.name})

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


@dataclasses.dataclass
class _Breakpoints:
    """The breakpoints of a run's top level for a call that adds some: a breakpoint the
    journal asked at a place is asked there again (answered, it replays; the pause it made is
    answered); a place the run passed before (a super-step that finished) is passed again,
    whatever this call's breakpoints, so that a replay asks what it asked; the places to come
    pause at the graph's breakpoints and the call's (LangGraph's per-call breakpoints)."""

    before: frozenset[str]
    after: frozenset[str]
    asked: dict[tuple[str, int], Any]
    finished: int  # super-steps finished in the run's journal (they finish in order)
    graph: str

    def check(self, when: str, ran: list[str], index: int) -> None:
        from durably._runtime.interrupt import interrupt

        journaled = self.asked.get((when, index))
        if journaled is not None:
            interrupt(journaled)
            return
        passed = index < self.finished if when == "before" else index + 1 < self.finished
        if passed:
            return
        nodes = self.before if when == "before" else self.after
        hit = [n for n in ran if n in nodes]
        if hit:
            interrupt({when: hit, "step": index, "graph": self.graph})
