"""The compiled graph (made by :meth:`StateGraph.compile`): its public methods, which run
a graph as durable runs (``invoke``, ``run``, ``resume``, ``stream``, and from async code
``ainvoke``, ``aresume``, ``astream``), read its checkpoints (``get_state``,
``get_state_history``), fork them (``update_state``, ``fork``) and draw it (``get_graph``).

Apart from how a run executes, which :class:`CompiledGraph` inherits from its parts:
:class:`~durably._graph.execution.Execution` (the durable pieces and the super-step loop),
:class:`~durably._graph.superstep.Supersteps` (one super-step),
:class:`~durably._graph.routing.Routing` (where it goes next) and
:class:`~durably._graph.migration.Migration` (a run checkpointed under another graph).
Re-exported by :mod:`durably.stategraph`, where it is documented."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import itertools
import json
import operator
import threading
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import xxhash

# (GraphChangedError, InvalidRouteError, StepLimitError: named by its methods' Raises:, which
# the reference links from here)
from durably._graph.builder import (  # noqa: F401
    GraphChangedError,
    InvalidRouteError,
    StepLimitError,
)
from durably._graph.checkpoints import StateSnapshot, StepResult
from durably._graph.execution import Execution, _call_breakpoints, _Cancel, _executed_only
from durably._graph.migration import note_compiled
from durably._graph.routing import Target, _is_command, _target_name, _without
from durably._graph.state import InvalidUpdateError, fingerprint_of
from durably._graph.structure import DYNAMIC, END, START, GraphStructure
from durably._runtime.run import Run
from durably._trace.tracer import short_repr
from durably.exceptions import (
    CorruptJournalError,
    DefinitionError,
    RunInterrupted,
    RunStateError,
)
from durably.store import Store

if TYPE_CHECKING:
    from durably._graph.builder import StateGraph

S = TypeVar("S")


#: what :meth:`CompiledGraph.stream` yields, by mode
_MODES = ("values", "updates", "debug", "custom", "events")


def _stream_mode(mode: str | Sequence[str], stream_mode: str | Sequence[str] | None
                 ) -> str | Sequence[str]:
    """``stream(mode=...)``, or LangGraph's ``stream_mode=``, which names the same."""
    if stream_mode is None:
        return mode
    if mode != "values":
        raise DefinitionError(
            f"stream() was given mode={mode!r} and stream_mode={stream_mode!r}, two names of "
            "one option. Fix: pass one of them.")
    return stream_mode


class CompiledGraph(Execution, Generic[S]):
    """A validated graph, runnable as durable runs (made by
    :meth:`StateGraph.compile <durably.stategraph.StateGraph.compile>`).

    A compiled graph is also a node: ``builder.add_node("research", compiled)`` runs it as a
    subgraph on the parent's state.
    """

    def __init__(self, graph: StateGraph[S], name: str, max_steps: int,
                 store: Store | None, interrupt_before: frozenset[str] = frozenset(),
                 interrupt_after: frozenset[str] = frozenset(), *,
                 scope_all: bool = False) -> None:
        self.graph = graph
        self._scope_all = scope_all
        self._subgraphs = {}
        self.name = name
        self.max_steps = max_steps
        self.interrupt_before = interrupt_before
        self.interrupt_after = interrupt_after
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
        note_compiled(self)

    def __durably_digest__(self) -> str:
        """A compiled graph held by a node (a subgraph) is known by its structure and code."""
        return f"{self.name}:{self.fingerprint_digest}"

    # -- public API ------------------------------------------------------------------------
    def invoke(self, state: Any = None, *, run_id: str | None = None, fresh: bool = False,
               migrate: Callable[[Any], Any] | None = None,
               interrupt_before: Sequence[str] | str = (),
               interrupt_after: Sequence[str] | str = ()) -> Any:
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
                different graph (otherwise that raises
                :class:`~durably.stategraph.GraphChangedError`): to the
                state at the run's last checkpoint, before the first super-step that
                executes. Nodes whose input state it changed run as new steps (an
                ``interrupt()`` in them asks again).
            interrupt_before: Nodes (or ``"*"``) before which the super-steps this call
                executes pause, besides those of ``compile(interrupt_before=...)``, as
                LangGraph's per-call option (a later call that does not pass them goes on).
            interrupt_after: As ``interrupt_before``, after the node's super-step.

        Returns:
            The final state (a dict for a TypedDict state, else an instance).

        Raises:
            RunInterrupted: a node called ``interrupt()``; answer with :meth:`resume`.
            GraphChangedError: the run's checkpoints come from another graph.
            StepLimitError: more than ``max_steps`` super-steps.
            InvalidUpdateError: two nodes wrote one key without a reducer, or a node
                returned something that is not an update.
            InvalidRouteError: a router returned an undeclared destination.
            DefinitionError: ``interrupt_before`` / ``interrupt_after`` name no node.

        Exceptions raised by nodes propagate unchanged (several at once: ``ExceptionGroup``).
        """
        breaks = _call_breakpoints.set(self._call_breaks(interrupt_before, interrupt_after))
        try:
            return self._invoke(state, run_id, fresh, migrate)
        finally:
            _call_breakpoints.reset(breaks)

    def _invoke(self, state: Any, run_id: str | None, fresh: bool,
                migrate: Callable[[Any], Any] | None) -> Any:
        answering, answer = self._answer_in(state, run_id, fresh)
        if answering:
            return self.resume(run_id, answer, migrate=migrate)  # type: ignore[arg-type]
        args = self._input(state, run_id)
        token = self._migrate.set(migrate)
        try:
            self._check_continued(args, run_id, fresh)
            run = self._entry.run(args, run_id=run_id, fresh=fresh)
        finally:
            self._migrate.reset(token)
        if run.status == "interrupted":
            raise RunInterrupted(run.id, run.interrupts, "app")
        return self.schema.build(run.result)

    def run(self, state: Any = None, *, run_id: str | None = None, fresh: bool = False,
            migrate: Callable[[Any], Any] | None = None,
            interrupt_before: Sequence[str] | str = (),
            interrupt_after: Sequence[str] | str = ()) -> Run[Any]:
        """Like :meth:`invoke`, but return the :class:`~durably.Run` handle (status
        ``interrupted`` instead of raising; ``run.result`` is the final state as a dict)."""
        answering, answer = self._answer_in(state, run_id, fresh)
        breaks = _call_breakpoints.set(self._call_breaks(interrupt_before, interrupt_after))
        token = self._migrate.set(migrate)
        try:
            if answering:
                assert run_id is not None
                self._changes(self._store(), run_id)  # before the answer is journaled
                entry = self._entry
                resumed: Run[Any] = entry._self_resume(entry.__wrapped__, None, run_id, answer,
                                                       handle=True)
                return resumed
            args = self._input(state, run_id)
            self._check_continued(args, run_id, fresh)
            return self._entry.run(args, run_id=run_id, fresh=fresh)
        finally:
            _call_breakpoints.reset(breaks)
            self._migrate.reset(token)

    def _call_breaks(self, before: Sequence[str] | str, after: Sequence[str] | str
                     ) -> tuple[frozenset[str], frozenset[str]] | None:
        """A call's ``interrupt_before`` / ``interrupt_after``, checked (None: none).

        Raises:
            DefinitionError: one names something that is not a node."""
        found = []
        for option, given in (("interrupt_before", before), ("interrupt_after", after)):
            nodes = [given] if isinstance(given, str) else list(given)
            if nodes == ["*"]:
                nodes = list(self.graph.nodes)
            unknown = [n for n in nodes if n not in self.graph.nodes]
            if unknown:
                raise DefinitionError(
                    f"graph {self.name!r}: {option}= names {unknown}, which are not nodes. "
                    f"Fix: name nodes of the graph ({sorted(self.graph.nodes)}), or '*' for "
                    "all.")
            found.append(frozenset(nodes))
        return (found[0], found[1]) if found[0] or found[1] else None

    def _check_continued(self, args: dict[str, Any], run_id: str | None,
                         fresh: bool) -> None:
        """Before a call's attempt begins: refuse to continue a run checkpointed under
        another graph (GraphChangedError, unless ``migrate=`` is set), so that a graph
        sharing this one's name never changes the status of the other's run (the check
        made inside the attempt would end it ``failed``)."""
        from durably._runtime.attempt import _resolve_run
        from durably._runtime.context import live_run

        if fresh or live_run() is not None:
            return
        spec = self._entry.spec
        store = self._store()
        digest = spec.digest_inputs(spec.arguments(None, (args,), {}))
        try:
            found, existing = _resolve_run(store, spec, run_id, False, digest)
        except RunStateError:  # (said by the call itself, as always)
            return
        if existing is not None:
            self._changes(store, found)

    def _answer_in(self, state: Any, run_id: str | None, fresh: bool) -> tuple[bool, Any]:
        """(True, the answer) when the input is LangGraph's way of answering an interrupt,
        ``Command(resume=answer)`` (with ``run_id``), else (False, None).

        Raises:
            DefinitionError: a Command input without ``resume=`` or without ``run_id``."""
        if not _is_command(state):
            return False, None
        shown = f"{state!r:.200}"
        if state.resume is None and state.update is None and state.goto in ((), None):
            raise DefinitionError(
                f"graph {self.name!r}: the input {shown} answers an interrupt with None, "
                "which durably never takes as an answer (None is no answer). Fix: answer with "
                "a value, for example Command(resume=True), or app.resume(run_id, True).")
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
        except RunInterrupted as paused:  # (said by the graph's run: named as an app's)
            raise RunInterrupted(paused.run_id, paused.interrupts, "app") from None
        finally:
            self._migrate.reset(token)
        return self.schema.build(final)

    def stream(self, state: Any = None, *, mode: str | Sequence[str] = "values",
               run_id: str | None = None, fresh: bool = False,
               migrate: Callable[[Any], Any] | None = None, subgraphs: bool = False,
               resume: Any = None, stream_mode: str | Sequence[str] | None = None,
               interrupt_before: Sequence[str] | str = (),
               interrupt_after: Sequence[str] | str = ()) -> Generator[Any, None, None]:
        """Run the graph and yield as it goes.

        Args:
            state: The input state (as for :meth:`invoke`).
            mode: ``"values"``: the state after each super-step; ``"updates"``: a dict
                ``{node: update}`` per super-step (a subgraph node's update combines its
                nodes' writes to a key with the key's reducer, ``reducer(first, second)``:
                every write for ``operator.add`` or ``add_messages``; else the last write);
                ``"debug"``: one dict per node that ran, ``{"step": n, "node": name,
                "update": ..., "state": ...}`` (the state after its super-step);
                ``"custom"``: what nodes wrote with :func:`durably.get_writer`;
                ``"events"``: every :class:`~durably.Event` of the run (steps, nodes,
                custom events, the super-steps of subgraphs too). Several at once
                (``mode=["updates", "custom"]``): each item is a pair ``(mode, item)``, as
                in LangGraph.
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
            resume: With ``run_id``: answer the run's pending interrupt with this value and
                stream the resumed run (as ``stream(Command(resume=value), run_id=...)``).
            stream_mode: LangGraph's name of ``mode``: either may be given, not both.
            interrupt_before: As for :meth:`invoke`.
            interrupt_after: As for :meth:`invoke`.

        Super-steps replayed from the journal are yielded too, except when the stream
        continues a run (``stream(None, run_id=...)``) or answers it (``resume=``): then
        only the super-steps that execute now, as in LangGraph. When a node interrupts, the
        last item is ``{"__interrupt__": [Interrupt, ...]}`` (answer with :meth:`resume`).
        Breaking out of the loop stops the run at its next step boundary (resumable).

        Raises:
            DefinitionError: ``mode`` is not one of the five (or a list of them), both
                ``mode`` and ``stream_mode`` are given, or ``subgraphs`` is not a bool (at
                the first item).

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
        mode = _stream_mode(mode, stream_mode)
        modes = [mode] if isinstance(mode, str) else list(mode)
        if not modes or any(m not in _MODES for m in modes):
            raise DefinitionError(f"stream(mode=...) is one of {list(_MODES)} or a list of "
                                  f"them, not {mode!r}")
        several = not isinstance(mode, str)
        if not isinstance(subgraphs, bool):
            raise DefinitionError(f"stream(subgraphs=...) is True or False, not {subgraphs!r}")
        if resume is not None:
            if state is not None:
                raise DefinitionError("stream(state, resume=...): the answer continues the "
                                      "run run_id with the input it started with. Fix: "
                                      "stream(resume=answer, run_id=...).")
            from durably._graph.structure import Command

            state = Command(resume=resume)
        answering, answer = self._answer_in(state, run_id, fresh)
        # the run's thread starts at the first item, with a copy of this context: migrate=
        # is set in it for that moment only (a generator runs in its consumer's context)
        calls = self._call_breaks(interrupt_before, interrupt_after)
        token = self._migrate.set(migrate)
        # answering, or continuing a run (stream(None, run_id=...)): what executes from now
        # on, as LangGraph's stream shows it (the super-steps before were streamed then)
        only = _executed_only.set(answering or (state is None and run_id is not None))
        breaks = _call_breakpoints.set(calls)
        try:
            if answering:  # stream(Command(resume=answer), run_id=...): answer, then go on
                assert run_id is not None
                self._changes(self._store(), run_id)  # before the answer is journaled
                entry = self._entry
                stored, kwargs, on_lease = entry._self_answering(run_id, answer)
                events = entry._self_stream(entry.__wrapped__, None, stored, kwargs, run_id,
                                            False, on_lease)
            else:
                args = self._input(state, run_id)
                self._check_continued(args, run_id, fresh)
                events = self._entry.stream(args, run_id=run_id, fresh=fresh)
            first = next(events, None)
        finally:
            _call_breakpoints.reset(breaks)
            _executed_only.reset(only)
            self._migrate.reset(token)
        def shaped(namespace: tuple[str, ...], m: str, item: Any) -> Any:
            if several:
                return (namespace, m, item) if subgraphs else (m, item)
            return (namespace, item) if subgraphs else item

        try:
            for event in itertools.chain(() if first is None else (first,), events):
                if "events" in modes:
                    yield ("events", event) if several else event
                if event.kind == "graph_step":
                    namespace = event.data.get("namespace", ())
                    if namespace and not subgraphs:
                        continue  # a subgraph's own super-step
                    for m in modes:
                        if m == "values":
                            yield shaped(namespace, m, event.data["values"])
                        elif m == "updates":
                            yield shaped(namespace, m, event.data["updates"])
                        elif m == "debug":
                            for node, update in event.data["updates"].items():
                                yield shaped(namespace, m, {
                                    "step": event.data["step"], "node": node,
                                    "update": update, "state": event.data["values"]})
                elif event.kind == "custom" and "custom" in modes:
                    yield shaped((), "custom", event.data)
                elif event.kind == "run_interrupted" and modes != ["events"]:
                    item = {"__interrupt__": list(event.data)}  # as LangGraph's stream does
                    shown = next((m for m in ("updates", "values", "debug", "custom")
                                  if m in modes), modes[0])
                    yield shaped((), shown, item)
        finally:
            close = getattr(events, "close", None)  # (a generator)
            if close is not None:
                close()  # a run still going stops at its next step boundary

    # -- from async code (LangGraph's names): the run executes in a thread of its own -------
    async def ainvoke(self, state: Any = None, *, run_id: str | None = None,
                      fresh: bool = False, migrate: Callable[[Any], Any] | None = None,
                      interrupt_before: Sequence[str] | str = (),
                      interrupt_after: Sequence[str] | str = ()) -> Any:
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
            interrupt_before: As for :meth:`invoke`.
            interrupt_after: As for :meth:`invoke`.

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
                                     migrate=migrate, interrupt_before=interrupt_before,
                                     interrupt_after=interrupt_after)

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

    async def astream(self, state: Any = None, *, mode: str | Sequence[str] = "values",
                      run_id: str | None = None, fresh: bool = False,
                      migrate: Callable[[Any], Any] | None = None,
                      subgraphs: bool = False, resume: Any = None,
                      stream_mode: str | Sequence[str] | None = None,
                      interrupt_before: Sequence[str] | str = (),
                      interrupt_after: Sequence[str] | str = ()) -> AsyncIterator[Any]:
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
            resume: As for :meth:`stream`.
            stream_mode: As for :meth:`stream`.
            interrupt_before: As for :meth:`invoke`.
            interrupt_after: As for :meth:`invoke`.

        Yields:
            The items :meth:`stream` yields.

        Raises:
            DefinitionError: as for :meth:`stream`.
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
                                subgraphs=subgraphs, resume=resume, stream_mode=stream_mode,
                                interrupt_before=interrupt_before,
                                interrupt_after=interrupt_after)
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
            fork_id = make_fork(store, rec, snapshot.checkpoint_id, result, graph_state=True)
        else:
            fork_id = self._fork_from_input(store, rec, result)
        if at is None:
            self._pass_breakpoint(store, rec, fork_id)
        return fork_id

    def _pass_breakpoint(self, store: Store, rec: Any, fork_id: str) -> None:
        """A run paused at a breakpoint (``interrupt_before`` / ``interrupt_after``), its
        state updated at its latest checkpoint: the fork goes on past that breakpoint when
        continued (``invoke(None, run_id=fork)``), as LangGraph's does; the breakpoint is
        answered ``True`` in the fork (a breakpoint asking something else there, after
        ``as_node=``, is asked again: its question differs)."""
        from durably._keys import serde as _serde
        from durably._runtime.interrupt import pending_interrupts
        from durably._store.records import EventRecord, now

        if rec.status != "interrupted":
            return
        asked = {e.key: e for e in store.list_events(rec.run_id, ("interrupt",))}
        for pending in pending_interrupts(store, rec.run_id, rec.attempt):
            payload = pending.payload
            question = asked.get(pending.id)
            if (pending.step_id is None and question is not None and isinstance(payload, dict)
                    and payload.get("graph") == self.name and "step" in payload
                    and ("before" in payload or "after" in payload)):
                t = now()
                store.append_events([
                    EventRecord(fork_id, "interrupt", question.time, 0, None, pending.id,
                                question.data),
                    EventRecord(fork_id, "answer", t, 0, None, pending.id,
                                _serde.dumps(True, what="the breakpoint's answer"))])

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
        from durably._runtime.spec import step_identity
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
            elif r.dynamic:  # one edge: where it goes is known when it returns
                if DYNAMIC not in nodes:
                    nodes = (*nodes, DYNAMIC)
                edges.append((r.source, DYNAMIC, getattr(r.fn, "__name__", "router"), True))
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
        subgraphs = {n: cast(Any, sub).get_graph() for n, sub in self._subgraphs.items()}
        return GraphStructure(self.name, nodes, tuple(edges), visits, stopped, subgraphs)
