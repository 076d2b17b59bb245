"""A run checkpointed under another graph: the graph (its fingerprint) recorded with the
run, what changed since (:class:`GraphChangedError` unless ``migrate=`` is given), whether
the change touches anything the run checkpointed, and the journaled step that migrates the
state before the first super-step that had not finished.

Apart from the super-step loop: it runs once when a run starts or resumes, and reads the
run's recorded events and steps. :class:`Migration` is a part of the compiled graph (a
mixin)."""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from durably._decorators.tasks import Task
from durably._graph.builder import GraphChangedError
from durably._graph.state import InvalidUpdateError, comparable, describe_changes, parts_of
from durably._runtime.spec import Spec
from durably.exceptions import RunStateError

if TYPE_CHECKING:
    from durably._graph.builder import StateGraph
    from durably._graph.state import Schema
    from durably.store import Store


#: the graphs compiled in this process, by name: a run recorded under one of them is another
#: graph's (a name collision), not an older version of this one
_COMPILED: dict[str, weakref.WeakSet[Migration]] = {}


def note_compiled(app: Migration) -> None:
    """Remember a compiled graph under its name (see :func:`_named_alike`)."""
    _COMPILED.setdefault(app.name, weakref.WeakSet()).add(app)


def _named_alike(app: Migration, recorded: Mapping[str, Any]) -> bool:
    """Whether another graph compiled in this process under ``app``'s name, with other nodes
    or edges, has the recorded fingerprint: the run is that graph's (a graph rebuilt with
    edited node code, as in a notebook, is the same graph: its run continues or is
    migrated as always)."""
    return any(other is not app and comparable(other.fingerprint) == recorded
               and _structure(comparable(other.fingerprint))
               != _structure(comparable(app.fingerprint))
               for other in list(_COMPILED.get(app.name, ())))


def _structure(fingerprint: Mapping[str, Any]) -> tuple[Any, ...]:
    """A fingerprint's nodes (their names) and edges, without code."""
    return (sorted(fingerprint.get("nodes", {})), fingerprint.get("edges"),
            [r[:2] for r in fingerprint.get("routers", [])])


class Migration:
    """The compiled graph's check of a run's recorded graph, and the migration of its
    state."""

    graph: StateGraph[Any]
    schema: Schema
    name: str
    fingerprint: dict[str, Any]
    fingerprint_digest: str
    _migrate: contextvars.ContextVar[Callable[[Any], Any] | None]
    # the super-step's Task (Any: a Task is a descriptor, so mypy reads one declared in a
    # class body as bound on access; the compiled graph assigns the Task to each instance)
    _superstep: Any

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

    def _recorded(self, store: Store, run_id: str) -> dict[str, Any] | None:
        """The graph the run's checkpoints were last written under: ``{"fingerprint": ...,
        "migrate_at": super-step index or None}``."""
        from durably._keys import serde as _serde

        events = store.list_events(run_id, ("graph",))
        if not events or events[-1].data is None:
            return None
        recorded: dict[str, Any] = _serde.loads(events[-1].data)
        # (compared as comparable() reads it: routers' destinations as sets)
        return {**recorded, "fingerprint": comparable(recorded["fingerprint"])}

    def _changes(self, store: Store, run_id: str) -> list[str] | None:
        """What changed since the run's checkpoints were written (None: nothing, or nothing
        they depend on: see :meth:`_untouched`), raising GraphChangedError unless a
        migration is set."""
        recorded = self._recorded(store, run_id)
        if recorded is None or recorded["fingerprint"] == comparable(self.fingerprint):
            return None
        if self._migrate.get() is None and _named_alike(self, recorded["fingerprint"]):
            # another graph's run, even one nothing of which this graph's change touches
            changes = describe_changes(recorded["fingerprint"], comparable(self.fingerprint),
                                       recorded.get("parts"), parts_of(self.graph))
            what = "; ".join(changes) or "its structure differs"
            raise GraphChangedError(
                f"run {run_id!r} belongs to another graph named {self.name!r}, built in this "
                f"process with other nodes or edges ({what}): either two graphs share the "
                "name, and so the runs of one input, or this graph replaces that one (a "
                "notebook cell or a script's code run again after an edit). Fix: for two "
                "graphs, give each a name of its own (StateGraph(..., name=...)); for an "
                "edited graph, continue the run under it with migrate=lambda state: state "
                "(or a function that converts the state), or start anew with fresh=True. The "
                "run is left as it is.", changes)
        finished = {s.task for s in store.list_steps(run_id) if s.status in ("ran", "cached")}
        if self._untouched(recorded["fingerprint"], finished):
            return None  # nothing the change affects was checkpointed
        changes = describe_changes(recorded["fingerprint"], comparable(self.fingerprint),
                                   recorded.get("parts"), parts_of(self.graph))
        if self._migrate.get() is None:
            raise GraphChangedError(
                f"run {run_id!r} of graph {self.name!r} was checkpointed under another "
                f"graph: {'; '.join(changes) or 'the structure changed'}. Fix: restore the "
                "old graph to finish it, start a new run (invoke(..., fresh=True)), or "
                "continue it under the new graph with migrate=lambda state: state (or a "
                "function that converts the state). If it is another graph that has the same "
                "name, give each graph a name of its own (StateGraph(..., name=...)).",
                changes)
        return changes

    def _check_fingerprint(self, ctx: Any) -> int | None:
        """Record the graph with the run; return the super-step before which the state is
        migrated (a journaled step, so later attempts replay it), or None."""
        from durably._keys import serde as _serde
        from durably._store.records import EventRecord, now

        recorded = self._recorded(ctx.store, ctx.run_id)
        if recorded is not None and recorded["fingerprint"] == comparable(self.fingerprint):
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
        a sibling failed, would be replayed with its old code's result. A router's code is
        not structure (its destinations and source are): a router decides inside the
        super-step, whose journaled result keeps the decisions made (``next``), so a fixed
        router only decides the super-steps to come, never beside a replayed old decision
        (a router that returned an invalid value, fixed, resumes without ``migrate=``)."""
        new = comparable(self.fingerprint)
        on, nn = old.get("nodes", {}), new.get("nodes", {})
        changed = {n for n in {*on, *nn} if on.get(n) != nn.get(n)}
        if any(f"{self.name}.{n}" in finished for n in changed):
            return False
        if self._superstep.spec.name not in finished:
            return True
        def shape(routers: Any) -> list[Any]:
            return [r[:2] for r in routers or []]

        return shape(old.get("routers")) == shape(new.get("routers")) and all(
            old.get(k) == new.get(k) for k in {*old, *new} - {"nodes", "routers"})
