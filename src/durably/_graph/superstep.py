"""Running one super-step: every node of the frontier (and every Send) called in parallel on
its own copy of the state, their interrupts and failures sorted out, their updates applied in
node order through the state's reducers, the next frontier chosen, and the state after it
journaled whole or as a splice of the state before it (the handoff with the loop).

Apart from the loop that calls it (:mod:`durably._graph.execution`): this is what one
journaled super-step computes. :class:`Supersteps` is a part of the compiled graph (a
mixin)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import copy
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import xxhash

from durably._graph.checkpoints import Sent, StepResult, Writes, _pickled_state, _splice
from durably._graph.routing import Routing, Target, _is_command
from durably._graph.state import _NOTHING, InvalidUpdateError
from durably._graph.structure import Send
from durably._runtime.attempt import is_cancelled
from durably._runtime.cancel import Siblings, siblings
from durably._runtime.context import StopRun
from durably._runtime.interrupt import InterruptSignal

if TYPE_CHECKING:
    from durably._decorators.tasks import Task


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


def _writes(update: dict[str, Any] | list[Any]) -> list[dict[str, Any]]:
    """A node's update as the writes applied in turn (a subgraph's writes, Send calls')."""
    if not isinstance(update, list):
        return [update]
    return [w for one in update for w in _writes(one)]


#: the nodes (names) whose subgraphs the code running now is inside, outermost first: () in
#: the top graph's own super-steps; ("research",) inside the subgraph node "research"
_namespace: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar(
    "durably_graph_namespace", default=())


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


class Supersteps(Routing):
    """The compiled graph's super-step: its nodes' calls, their updates through the
    reducers, and its journaled result."""

    name: str
    fingerprint_digest: str
    _tasks: dict[str, Task[Any, Any]]

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
            # once a node fails, the others are cancelled (durably.cancelled(); a step they
            # start raises; async ones get CancelledError): what finished is journaled
            with Siblings() as scope, concurrent.futures.ThreadPoolExecutor(
                    max_workers=len(calls)) as pool:
                futures = []
                for n, v in calls:
                    context = contextvars.copy_context()
                    context.run(siblings.set, scope)
                    future = pool.submit(context.run, self._call_node, n, v)
                    future.add_done_callback(scope.failed)
                    futures.append(future)
                for i, future in enumerate(futures):
                    try:
                        results[i] = future.result()
                    except BaseException as exc:  # noqa: BLE001 - sorted out below
                        errors[i] = exc
            if scope.cancelled and any(isinstance(e, Exception) for e in errors.values()):
                # the siblings stopped because one failed: the failure is what happened
                errors = {i: e for i, e in errors.items()
                          if not (isinstance(e, StopRun) or is_cancelled(e))}
        if errors:
            signals = [e for e in errors.values() if isinstance(e, InterruptSignal)]
            others = {n: e for n, e in errors.items() if not isinstance(e, InterruptSignal)}
            if others:
                fatal = [e for e in others.values() if not isinstance(e, Exception)]
                if fatal:
                    raise fatal[0]  # Ctrl-C, a stopped stream: not a node failure
                def called(i: int) -> str:
                    """The node of call ``i``; a Send's numbered among its node's Sends."""
                    if i < len(order):
                        return repr(calls[i][0])
                    k = 1 + sum(1 for j in range(len(order), i) if calls[j][0] == calls[i][0])
                    return f"{calls[i][0]!r} (Send #{k})"

                for i, e in others.items():  # (its type and traceback kept: a note added)
                    note = (f"durably: raised by node {called(i)} of graph {self.name!r}, "
                            f"in super-step {index}")
                    if note not in getattr(e, "__notes__", ()):
                        e.add_note(note)
                if len(others) == 1:
                    raise next(iter(others.values()))
                named = ", ".join(f"{called(i)} ({type(e).__name__}: {e!s:.80})"
                                  for i, e in others.items())
                what = "node calls" if any(i >= len(order) for i in others) else "nodes"
                raise ExceptionGroup(
                    f"{len(others)} {what} of super-step {index} of graph {self.name!r} failed: "
                    f"{named}", [e for e in others.values() if isinstance(e, Exception)])
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
