"""A run's history as checkpoints, and forks: new runs that start from a checkpoint.

A **checkpoint** is a point of a run's history that can be forked from: one per step the run
finished (``ran`` or ``cached``, in the order they finished) and one per ``interrupt()``.
Forking at a checkpoint makes a new run whose journal holds the source run's finished steps up
to that point (and the answers to earlier interrupts); executing it replays those and
executes the rest with today's code. The source run is only read, never changed.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from durably._keys import serde as _serde
from durably._keys.hashing import trace_digests
from durably._runtime.failures import RAISED, RETRY
from durably._store.records import EventRecord, RunRecord, StepRecord, now
from durably._trace.tracer import short_repr
from durably.exceptions import DefinitionError, NotFoundError, RunStateError
from durably.store import Store

__all__ = ["Checkpoint", "checkpoints", "find_checkpoint", "history_page", "make_fork",
           "unused_update"]

NO_UPDATE: Any = object()


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """A point in a run's history that can be forked from.

    Attributes:
        id: The checkpoint id: the step id (32 hex characters) of a finished step, or the
            interrupt id (16 hex characters). Any unique prefix of 6 or more characters
            names it too.
        kind: ``"step"`` or ``"interrupt"``.
        task: The task of the step (for an interrupt: the task that called it, or the
            entrypoint's name).
        time: When the step finished or the interrupt was raised, seconds since the epoch.
        state: Short ``repr`` of the step's result, or of the interrupt's payload.
        answer: Short ``repr`` of the answer to an interrupt (None while pending, and for
            steps).
        steps_done: How many steps had finished at this point.
        step_id: The step (None for an interrupt raised in the entrypoint's own body).
    """

    id: str
    kind: str
    task: str
    time: float
    state: str | None
    answer: str | None = None
    steps_done: int = 0
    step_id: str | None = None


#: a checkpoint before it is read whole: its time, its order among those of the same time,
#: its id, its task, and for an interrupt its event (None for a step)
_Point = tuple[float, int, str, str, "EventRecord | None"]


def _points(store: Store, run: RunRecord) -> list[_Point]:
    """The run's checkpoints, oldest first, as read from its outline
    (:meth:`~durably.store.Journal.step_outline`) and its interrupt events: no step's
    output read, no payload unpickled."""
    points: list[_Point] = []
    seen: set[str] = set()
    tasks: dict[str, str] = {}
    for order, (step_id, task, status, ended) in enumerate(store.step_outline(run.run_id)):
        tasks[step_id] = task
        if status != "interrupted" and step_id not in seen:
            seen.add(step_id)
            points.append((ended, order, step_id, task, None))
    events = store.list_events(run.run_id, ("interrupt", "answer"))
    raised: set[str] = set()
    for order, e in enumerate(events):
        if e.kind != "interrupt" or e.key in raised:
            continue
        raised.add(e.key)
        points.append((e.time, -1_000_000 + order, e.key,
                       tasks.get(e.step_id, "") if e.step_id else run.name, e))
    points.sort(key=lambda p: (p[0], p[1]))
    return points


def _read_points(store: Store, run: RunRecord, points: list[_Point], done: list[int],
                 load: Callable[[bytes], Any]) -> list[Checkpoint]:
    """The checkpoints of ``points`` read whole: a step's state from the record that
    finished it (read for these steps only, unless they are many: then the journal whole,
    in one read), an interrupt's payload and answer unpickled by ``load``; ``done``: the
    steps finished at each."""
    steps = [p[2] for p in points if p[4] is None]
    if len(steps) > 1_000:
        outputs: dict[str, str | None] = {}
        for s in store.list_steps(run.run_id):
            if s.status in ("ran", "cached"):
                outputs.setdefault(s.step_id, s.output)
    else:
        outputs = {k: r.output for k, r in store.finished_steps(run.run_id, steps).items()}
    answers: dict[str, bytes | None] = {}
    if any(p[4] is not None for p in points):
        answers = {e.key: e.data for e in store.list_events(run.run_id, ("answer",))}
    found = []
    for (time, _, key, task, event), n in zip(points, done, strict=True):
        if event is None:
            found.append(Checkpoint(key, "step", task, time, outputs.get(key), steps_done=n,
                                    step_id=key))
            continue
        answer = answers.get(key)
        found.append(Checkpoint(key, "interrupt", task, time, _short_loaded(event.data, load),
                                None if answer is None else _short_loaded(answer, load),
                                steps_done=n, step_id=event.step_id))
    return found


def _steps_done(points: list[_Point]) -> list[int]:
    """How many steps had finished at each point (counted from the first)."""
    done, count = [], 0
    for p in points:
        count += p[4] is None
        done.append(count)
    return done


def checkpoints(store: Store, run: RunRecord, load: Callable[[bytes], Any] = _serde.loads
                ) -> list[Checkpoint]:
    """The run's checkpoints, oldest first; an interrupt's payload and answer are unpickled
    by ``load`` (the dashboard's loader imports nothing)."""
    points = _points(store, run)
    return _read_points(store, run, points, _steps_done(points), load)


def history_page(store: Store, run: RunRecord, offset: int, limit: int | None,
                 load: Callable[[bytes], Any] = _serde.loads) -> tuple[list[Checkpoint], int]:
    """The run's checkpoints newest first from the ``offset``-th (0: the newest), at most
    ``limit`` of them (None: all), and how many it has: the same entries as
    ``checkpoints(...)[::-1][offset:offset + limit]``, the states read for these only (the
    others are ordered by the run's outline, :meth:`~durably.store.Journal.step_outline`)."""
    points = _points(store, run)
    done = _steps_done(points)
    total = len(points)
    hi = total - offset
    lo = 0 if limit is None else max(0, hi - limit)
    if hi <= 0:
        return [], total
    return _read_points(store, run, points[lo:hi], done[lo:hi], load)[::-1], total


def _short_loaded(data: bytes | None, load: Callable[[bytes], Any]) -> str | None:
    if data is None:
        return None
    try:
        return short_repr(load(data))
    except Exception:  # noqa: BLE001 - a payload whose class is gone still has a checkpoint
        return "<not loadable here>"


def find_checkpoint(points: list[Checkpoint], at: str | None, run_id: str) -> int:
    """The index of the checkpoint ``at`` names (an id or a unique prefix of 6+ characters);
    the latest one when ``at`` is None.

    Raises:
        NotFoundError: no checkpoint, or no checkpoint with that id.
        RunStateError: the prefix names several checkpoints.
    """
    if not points:
        raise NotFoundError(f"run {run_id!r} has no checkpoints yet (no finished step, no "
                            "interrupt): there is nothing to fork from.")
    if at is None:
        return len(points) - 1
    if not isinstance(at, str) or len(at) < 6:
        raise NotFoundError(
            f"checkpoint {at!r}: give a checkpoint id (or 6+ of its first characters) from "
            f"run.history() of run {run_id!r}")
    matches = [i for i, p in enumerate(points) if p.id.startswith(at)]
    if not matches:
        raise NotFoundError(
            f"run {run_id!r} has no checkpoint {at!r}. Fix: pick one from "
            f"durably.get_run({run_id!r}).history() (newest first: "
            f"{[p.id[:12] for p in points[::-1][:5]]}).")
    if len(matches) > 1:
        raise RunStateError(f"checkpoint prefix {at!r} names {len(matches)} checkpoints of run "
                            f"{run_id!r}; give more characters.")
    return matches[0]


def recorded_script(store: Store, run_id: str, load: Callable[[bytes], Any] = _serde.loads
                    ) -> str | None:
    """The absolute path of the script (``python job.py``) that defines run ``run_id``'s
    entrypoint, as its latest attempt that knew it recorded it (a ``run_started`` event), or
    as the fork it is recorded it (a ``forked`` event: its source's); None if none did."""
    for event in reversed(store.list_events(run_id, ("run_started", "forked"))):
        try:
            info = load(event.data) if event.data is not None else None
        except Exception:  # noqa: BLE001 - an unreadable event names no script
            continue
        if isinstance(info, dict) and isinstance(info.get("script"), str):
            return info["script"]  # type: ignore[no-any-return]
    return None


def _forked_data(store: Store, source: RunRecord, load: Callable[[bytes], Any]
                 ) -> bytes | None:
    """The data of a fork's ``forked`` event: the script of its source's entrypoint, when it
    was run as one (``python job.py``), so that ``durably resume FORK`` loads it."""
    if not source.entrypoint.startswith("__main__."):
        return None
    script = recorded_script(store, source.run_id, load)
    return None if script is None else _serde.dumps({"script": script}, what="a run event")


def make_fork(store: Store, source: RunRecord, at: str | None, update: Any, *,
              graph_state: bool = False, load: Callable[[bytes], Any] = _serde.loads) -> str:
    """Write a new run whose journal holds ``source``'s history up to checkpoint ``at``;
    return its id. With ``update``, the checkpoint's step result is replaced by it (a step
    checkpoint) or the interrupt is answered with it (an interrupt checkpoint);
    ``graph_state``: the update is a StateGraph checkpoint (update_state's). ``at=""``:
    the run's input, before its first step (a fork that executes everything anew).
    ``load``: how the journal's values it reads are unpickled (the dashboard's loader
    imports nothing).

    Raises:
        DefinitionError: an update for the input (``at=""``), or for a StateGraph's
            super-step (whose result is the graph's checkpoint: ``update_state`` is the
            way to change its state).
    """
    fork_id = f"{source.run_id[:170]}-fork-{uuid.uuid4().hex[:8]}"
    if at == "":
        if update is not NO_UPDATE:
            raise DefinitionError(
                f"fork of run {source.run_id!r} at '' (its input): there is no step result "
                "there to replace with the update. Fix: fork at a checkpoint of "
                "run.history(), or start a new run with other arguments.")
        t = now()
        store.put_run(RunRecord(fork_id, source.entrypoint, source.name, "forked", t, t, 0,
                                source.input_digest, source.args))
        store.append_events([EventRecord(fork_id, "forked", t, 0, None,
                                         f"{source.run_id}@", _forked_data(store, source, load))])
        return fork_id
    # the checkpoints without their states (a fork at a checkpoint reads what it copies)
    points = [Checkpoint(key, "step" if event is None else "interrupt", task, time, None,
                         step_id=key if event is None else event.step_id)
              for time, _, key, task, event in _points(store, source)]
    index = find_checkpoint(points, at, source.run_id)
    target = points[index]
    if (update is not NO_UPDATE and target.kind == "step" and not graph_state
            and target.task.endswith("::superstep")):
        graph = target.task[:-len("::superstep")]
        raise DefinitionError(
            f"checkpoint {target.id[:12]} of run {source.run_id!r} is a super-step of graph "
            f"{graph!r}: its result is the graph's checkpoint, which an update cannot "
            "replace. Fix: app.update_state(run_id, values, at=checkpoint_id) (values as a "
            "node would return them; or as_node=...), or fork without an update.")
    keep = points[: index + 1] if target.kind == "step" else points[:index]
    wanted = [cp.id for cp in keep if cp.kind == "step"]
    if len(wanted) <= 1_000:  # (the records copied only; many: the journal in one read)
        records = store.finished_steps(source.run_id, wanted)
    else:
        records = {s.step_id: s for s in reversed(store.list_steps(source.run_id))
                   if s.status in ("ran", "cached")}  # reversed: the first finished wins
    copied: list[tuple[StepRecord, bytes | None]] = []
    answers: list[EventRecord] = []
    source_events = store.list_events(source.run_id, ("interrupt", "answer", RAISED, RETRY))
    source_answers = {e.key: e.data for e in source_events if e.kind == "answer"}
    # the failures the run went on from before the checkpoint: replayed in the fork too
    failed: dict[str, EventRecord] = {}
    for e in source_events:
        if e.kind == RAISED and e.step_id is not None and e.time <= target.time:
            failed[e.step_id] = e
        elif e.kind == RETRY and e.step_id is not None:
            failed.pop(e.step_id, None)
    asked: dict[str, EventRecord] = {}
    for e in source_events:
        if e.kind == "interrupt":
            asked.setdefault(e.key, e)
    t = now()
    for position, cp in enumerate(keep):
        if cp.kind == "interrupt":
            data = source_answers.get(cp.id)
            if data is not None:
                # the question too, so the fork's history (and a fork of the fork) has it
                q = asked.get(cp.id)
                if q is not None:
                    answers.append(EventRecord(fork_id, "interrupt", q.time, 0, q.step_id,
                                               cp.id, q.data))
                answers.append(EventRecord(fork_id, "answer", t, 0, None, cp.id, data))
            continue
        rec = records[cp.id]
        data = store.find_step(source.run_id, cp.id)
        if data is None:
            continue
        new = dataclasses.replace(rec, run_id=fork_id, attempt=0, position=position)
        if cp is target and update is not NO_UPDATE:
            data = _serde.dumps(update, what="the fork's update")
            digest, elements = trace_digests(update)
            new = dataclasses.replace(new, output=short_repr(update), result_digest=digest,
                                      output_digests=elements)
        copied.append((new, data))
    if target.kind == "interrupt" and update is not NO_UPDATE:
        # the question too: the fork's steps that depend on this answer (the step that asked
        # and its callers) are found by it, and never cached
        q = asked.get(target.id)
        if q is not None:
            answers.append(EventRecord(fork_id, "interrupt", q.time, 0, q.step_id, target.id,
                                       q.data))
        answers.append(EventRecord(fork_id, "answer", t, 0, None, target.id,
                                   _serde.dumps(update, what="the fork's answer")))
    store.put_run(RunRecord(fork_id, source.entrypoint, source.name, "forked", t, t, 0,
                            source.input_digest, source.args))
    store.append_steps(copied)
    raised = [EventRecord(fork_id, RAISED, e.time, 0, e.step_id, "", e.data)
              for e in failed.values()]
    store.append_events([*answers, *raised, EventRecord(
        fork_id, "forked", t, 0, None, f"{source.run_id}@{target.id}",
        _forked_data(store, source, load))])
    return fork_id


def unused_update(store: Store, fork_id: str) -> str | None:
    """After a fork's first attempt: why the update given for its checkpoint step was not
    used, or None (it was replayed, no step was updated, or the attempt ended before it).

    The updated result is journaled under the step's identity, which comes from its cache
    key: when the task's code (or its inputs) changed since the source run, today's call of
    it has another identity, executes, and the update is never read."""
    forked = store.list_events(fork_id, ("forked",))
    if not forked:
        return None
    source, _, target = forked[0].key.rpartition("@")
    copied = {s.step_id: s for s in store.list_steps(fork_id, attempt=0)}
    updated = copied.get(target)
    if updated is None:
        return None  # an interrupt checkpoint (answered), or a graph's
    steps = store.list_steps(fork_id, attempt=1)
    if any(s.step_id == target for s in steps):
        return None
    if not any(s.task == updated.task and s.status in ("ran", "cached")
               and s.step_id not in copied for s in steps):
        return None  # it did not get there (yet)
    return (f"durably: fork {fork_id!r}: the update given for checkpoint {target[:12]} "
            f"(task {updated.task!r}) was not used: that call of {updated.task!r} has "
            f"another cache key than in run {source!r} (its code or its inputs changed "
            "since), so it executed again instead. Fix: fork with the code the run had, or "
            f"give {updated.task!r} an explicit @task(version=...) (kept across edits), or "
            f"fork at a later checkpoint.")
