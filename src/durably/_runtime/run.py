"""The run handle: :class:`Run`, :func:`get_run` and :func:`list_runs`."""

from __future__ import annotations

import collections
import dataclasses
import operator
import os
import time
from collections.abc import Iterable
from typing import Any, Generic, Literal, TypeVar

from durably._keys import serde as _serde
from durably._runtime.config import StoreLike, default_store
from durably._runtime.history import Checkpoint, checkpoints, history_page, recorded_script
from durably._runtime.interrupt import Interrupt, pending_interrupts
from durably._runtime.keep import kept_steps, rerun_after_code_change
from durably._store.records import RunRecord, StepRecord
from durably._trace.spans import time_saved
from durably._trace.tracer import Event, RunGraph, build_graph
from durably.exceptions import (
    DefinitionError,
    NotFoundError,
    RunStateError,
    SerializationError,
    StoreError,
)
from durably.store import Store

__all__ = ["Run", "get_run", "list_runs"]

R = TypeVar("R")
_UNSET: Any = object()


class Run(Generic[R]):
    """One run of an entrypoint, read from its journal.

    Attributes:
        id: The run id.
        entrypoint: Identity of the entrypoint (``module:name``).
        name: The entrypoint's name.
        status: ``"running"`` (a process is executing it now), ``"crashed"`` (its process
            died while executing it: call again to resume), ``"finished"``, ``"failed"``,
            ``"interrupted"`` (waiting at ``interrupt()`` for ``resume``), ``"stopped"``
            (Ctrl-C, or the consumer of ``stream()`` stopped it; call again to resume) or
            ``"forked"`` (made by ``fork``, not executed yet). ``"crashed"`` is read from
            the run's lease each time: the journal says ``"running"`` until it is resumed.
        attempt: How many times the run was executed (1, then 2 after one resume, ...).
        created: When the run was first started, seconds since the epoch.
        updated: When its record last changed, seconds since the epoch.
        error: ``repr`` of the exception that failed the run, else None.
        resumed_from: For a run handle returned by ``Entrypoint.run``: the status the run had
            before this attempt (``"crashed"`` after a crash, ``"stopped"`` after Ctrl-C,
            ``"failed"``, ``"finished"`` for a rerun), or None for a new run.
        wall_time: For a handle returned by ``Entrypoint.run``: seconds this attempt took.
        script: For a run of an entrypoint defined in a script run as ``python job.py``:
            the script's absolute path (as its latest attempt recorded it), else None.
        thread: The conversation thread the run is a call on (``entrypoint.run(...,
            thread="t1")``), else None.

    Example:
        >>> import durably, tempfile
        >>> @durably.task
        ... def inc(x):
        ...     return x + 1
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... def count(n):
        ...     return [inc(i) for i in range(n)]
        >>> run = count.run(2)
        >>> run.status, run.result, run.counts()
        ('finished', [1, 2], {'ran': 2, 'cached': 0, 'replayed': 0, 'failed': 0})
        >>> again = count.run(2)
        >>> (again.id == run.id, again.attempt, again.counts()["replayed"])
        (True, 2, 2)
    """

    def __init__(self, record: RunRecord, store: Store, result: Any = _UNSET) -> None:
        self._record = record
        self._store = store
        self._result = result
        self.resumed_from: str | None = None
        self.wall_time: float | None = None
        self._pending: list[Interrupt] | None = None  # as the attempt raised them

    def __repr__(self) -> str:
        return f"<Run {self.id!r} of {self.name!r}: {self.status}, attempt {self.attempt}>"

    id = property(lambda self: self._record.run_id, doc="The run id.")
    entrypoint = property(lambda self: self._record.entrypoint)
    name = property(lambda self: self._record.name)

    @property
    def status(self) -> str:
        """The run's status (see the class's attributes); ``"crashed"`` for a run the journal
        says is running when no live process holds its lease.

        A handle read while its run was running reads the record again when the run holds
        no lease any more: it reports how that attempt ended, not a crash."""
        rec = self._record
        for _ in range(8):
            if rec.status != "running" or executing(self._store, self.id):
                return rec.status
            # no live lease: a crash, or the attempt ended (or another began) since the
            # record was read; the lease and the record change together, so a record
            # unchanged across the lease's check was running without a live process
            again = self._store.find_run(self.id)
            if again is None:
                return "crashed"
            if (again.status, again.attempt, again.updated) != (rec.status, rec.attempt,
                                                                rec.updated):
                self._record, self._result, self._pending = again, _UNSET, None
                rec = again
                continue
            return "crashed"
        return rec.status  # (a run starting and ending attempts faster than it is read)

    attempt = property(lambda self: self._record.attempt)
    created = property(lambda self: self._record.created)
    updated = property(lambda self: self._record.updated)
    error = property(lambda self: self._record.error)
    thread = property(lambda self: self._record.thread)

    @property
    def script(self) -> str | None:
        """The absolute path of the script that defines the run's entrypoint, when it ran as
        a script (``python job.py``; identity ``__main__.job:...``), as the run's latest
        attempt that knew it recorded it (a fork: as its source's, recorded by ``fork``);
        None for an entrypoint of an importable module (and for runs started before durably
        recorded it). ``durably resume`` and ``durably fork`` load the script from there."""
        if not self._record.entrypoint.startswith("__main__."):
            return None
        return recorded_script(self._store, self.id)

    @property
    def result(self) -> R:
        """The entrypoint's return value.

        Raises:
            RunStateError: the run has not finished (it failed, is interrupted or running),
                or its result could not be stored.
            CorruptJournalError: its stored result is damaged, or its file in ``blobs/`` is
                missing (rerunning the entrypoint stores it again).
            SerializationError: its type cannot be loaded here.
        """
        if self._result is not _UNSET:
            return self._result  # type: ignore[no-any-return]
        status = self.status  # (first: a handle read while the run ran reads it again)
        rec = self._record
        if rec.status != "finished":
            raise RunStateError(
                f"run {rec.run_id!r} is {status}, so it has no result"
                + (f" (error: {rec.error})" if rec.error else "")
                + (". Fix: answer it with resume(run_id, answer) (the entrypoint's or the "
                   "graph's), which continues the run" if rec.status == "interrupted" else
                   ". Fix: rerun the entrypoint with the same arguments to resume it.")
            )
        if rec.result is None:
            raise RunStateError(f"run {rec.run_id!r} finished, but its result could not be "
                                f"stored: {rec.error}")
        try:
            return _serde.loads(rec.result)  # type: ignore[no-any-return]
        except StoreError:
            raise  # (its file damaged or missing: said as it is, with its fix)
        except Exception as exc:  # noqa: BLE001 - report as ours, with the way out
            raise SerializationError(
                f"cannot load the result of run {rec.run_id!r} ({exc}): its type is defined in "
                "code that is not loaded here. Fix: read it from the script that defines the "
                "type (a class defined in a script lives in its __main__), or return plain "
                "data from the entrypoint."
            ) from None

    @property
    def steps(self) -> list[StepRecord]:
        """The steps of the run's latest attempt, in call order (including failed ones, and
        ``started`` ones: steps with nested steps that were executing when the attempt
        ended — a crash — and have no later record)."""
        return _latest_steps(self._store.list_steps(self.id, attempt=self.attempt))

    def records(self) -> list[StepRecord]:
        """Every step record of every attempt, in order (attempt, then position)."""
        return self._store.list_steps(self.id)

    def history(self, *, offset: int = 0, limit: int | None = None) -> list[Checkpoint]:
        """The run's checkpoints, newest first: one per step it finished (ran or cached)
        and one per ``interrupt()``. Each has an ``id`` to fork from
        (``durably.fork(run.id, at=checkpoint.id)``), the task, the time, and a view of the
        state there (the step's result or the interrupt's payload and answer).

        Args:
            offset: Skip this many of the newest checkpoints (0: from the newest).
            limit: At most this many checkpoints. Default: all. A page
                (``history(offset=500, limit=500)``: the same entries as
                ``history()[500:1000]``) reads the states of its checkpoints only: a
                100,000-step run's page takes a fraction of a second.

        Raises:
            DefinitionError: ``offset`` is not an int >= 0, or ``limit`` not an int >= 0
                or None.

        Example:
            >>> import durably, tempfile
            >>> @durably.task
            ... def add(a, b):
            ...     return a + b
            >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
            ... def total(n):
            ...     return add(add(1, 2), n)
            >>> [(c.kind, c.task, c.state) for c in total.run(10).history()]
            [('step', 'add', '13'), ('step', 'add', '3')]
            >>> [c.state for c in total.run(10).history(offset=1, limit=1)]  # a page
            ['3']
        """
        for name, value in (("offset", offset), ("limit", limit)):
            if (value is not None or name == "offset") and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise DefinitionError(
                    f"run.history({name}={value!r}): {name} is a number of checkpoints (an "
                    f"int, 0 or more{'' if name == 'offset' else ', or None for all'}). Fix: "
                    "run.history(offset=500, limit=500) for the second page of 500.")
        if offset == 0 and limit is None:
            return checkpoints(self._store, self._record)[::-1]
        return history_page(self._store, self._record, offset, limit)[0]

    @property
    def interrupts(self) -> list[Interrupt]:
        """The interrupts the run waits for (empty unless its status is ``interrupted``)."""
        if self._record.status != "interrupted":
            return []
        if self._pending is not None:
            return list(self._pending)
        return pending_interrupts(self._store, self.id, self.attempt)

    def graph(self, *, attempt: int | None = None, collapse: int | None = 20) -> RunGraph:
        """The graph of one attempt of the run, from its journal (works for a run read back
        by another process, a crashed run or a finished one).

        Args:
            attempt: Which attempt to draw. Default: the latest (for a fork not executed
                yet: attempt 0, the steps it inherited up to its checkpoint).
            collapse: More than this many calls of one task under one parent draw as one
                node (``parse ×1,200``, with counts per status); None or 0 draws every call.

        Raises:
            NotFoundError: the run has no such attempt.
            DefinitionError: ``collapse`` is not a number of calls.

        Returns:
            A :class:`~durably.RunGraph`: ``.nodes`` (steps, nested by call), ``.edges``
            (data flow), ``.to_mermaid()``, ``.to_dot()``, ``.to_svg()``, ``.save(path)``.

        Example:
            >>> import durably, tempfile
            >>> @durably.task
            ... def load(n):
            ...     return list(range(n))
            >>> @durably.task
            ... def total(xs):
            ...     return sum(xs)
            >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
            ... def pipeline(n):
            ...     return total(load(n))
            >>> g = pipeline.run(3).graph()
            >>> [n.task for n in g.nodes], [(g.node(e.source).task, g.node(e.target).task)
            ...                             for e in g.edges]
            (['load', 'total'], [('load', 'total')])
        """
        if collapse is not None:
            try:  # (an int, a numpy integer: anything that is an index; not True, not 2.5)
                limit = None if isinstance(collapse, bool) else operator.index(collapse)
            except TypeError:
                limit = None
            if limit is None or limit < 0:
                raise DefinitionError(f"run.graph(collapse=...) takes a number of calls (0 "
                                      f"or more), or None, not {collapse!r}. Fix: "
                                      "collapse=20, or collapse=None to draw every call.")
            collapse = limit
        rec = self._record
        latest = attempt is None or attempt == self.attempt
        attempt = self.attempt if attempt is None else attempt
        # a fork not executed yet is at attempt 0: the steps it inherited up to its
        # checkpoint (as ``durably show`` lists them) are its attempt 0's records
        first = 0 if self.attempt == 0 else 1
        if isinstance(attempt, bool) or not isinstance(attempt, int) or not (
                first <= attempt <= self.attempt):
            raise NotFoundError(
                f"run {self.id!r} has no attempt {attempt!r}: "
                + (f"it has attempts 1 to {self.attempt}" if self.attempt else
                   "it is a fork not executed yet, whose only attempt is 0 (the steps it "
                   "inherited)")
                + ". Fix: graph(attempt=None) draws the latest one.")
        ends = [e for e in self._store.list_events(self.id)
                if e.attempt == attempt and e.kind.startswith("run_")]
        # an earlier attempt's status is how it ended (one that started and never ended:
        # its process died); the latest one's is the run's status
        status = (self.status if latest else ends[-1].kind[4:] if len(ends) >= 2
                  else "crashed" if ends else rec.status)
        graph = build_graph(rec.run_id, rec.name, status, attempt,
                            self._store.list_steps(self.id), collapse)
        if len(ends) >= 2:
            graph = dataclasses.replace(graph, wall_time=ends[-1].time - ends[0].time)
        return graph

    def events(self) -> list[Event]:
        """The run's events rebuilt from its journal, in time order: attempts starting and
        ending (with their status, duration, output or error), steps (``step_started`` only
        for steps with nested steps; every step has its ``step_finished``, ``step_failed``
        or ``step_interrupted`` with its duration), interrupts and answers (``status`` is
        the interrupt id), and custom events (``data`` is the value written)."""
        found: list[Event] = []
        for s in self._store.list_steps(self.id):
            kind = {"failed": "step_failed", "interrupted": "step_interrupted",
                    "started": "step_started"}.get(s.status, "step_finished")
            if kind == "step_started":
                found.append(Event(kind, s.run_id, s.started, s.step_id, s.parent_id, s.task,
                                   inputs=s.inputs, attempt=s.attempt))
                continue
            found.append(Event(kind, s.run_id, s.ended, s.step_id, s.parent_id, s.task,
                               s.status, s.duration, s.inputs, s.output, s.error, s.attempt))
        for e in self._store.list_events(self.id):
            if e.kind in ("interrupt_code", "step_raised", "step_retry"):
                continue  # (bookkeeping: which code asked an interrupt; failures replayed)
            data: Any = None
            if e.data is not None:
                try:
                    data = _serde.loads(e.data)
                except Exception:  # noqa: BLE001 - a class gone from the code is still listed
                    data = None
            if e.kind.startswith("run_") and isinstance(data, dict):
                info = data
                found.append(Event(
                    e.kind, e.run_id, e.time, None, None, self.name, info.get("status", ""),
                    info.get("duration"), None, info.get("output"),
                    info.get("error") or info.get("interrupts"), e.attempt))
                continue
            found.append(Event(e.kind, e.run_id, e.time, e.step_id, None,
                               self.name if e.kind.startswith("run_") else "",
                               e.kind[4:] if e.kind.startswith("run_") else e.key,
                               data=data, attempt=e.attempt))
        found.sort(key=lambda ev: ev.time)
        return found

    def time_saved(self, by: Literal["replay", "cache"] | None = None) -> float:
        """Seconds the latest attempt did not spend executing steps, because the journal
        replayed them or the cross-run cache served them.

        - By replay: the wall-clock time covered by the original executions (in earlier
          attempts of this run) of the steps it replayed, steps that ran at the same time
          (a parallel map, a step and the steps it called) counted once: the union of
          their ``(started, ended)`` intervals, never a sum of durations.
        - By the cache: for each step served from the cache (or replayed from a record
          that was), the seconds the execution that produced its entry took
          (:attr:`StepRecord.saved <durably.store.StepRecord.saved>`), summed. Those
          executions happened in other runs, at other times: their intervals cannot be
          merged with this run's, so the items of a parallel map served from the cache
          count each, as if executed one after the other. An entry written without its
          duration (by an older durably) counts 0.

        Args:
            by: ``"replay"`` or ``"cache"`` for one of the two; None (default) for their
                sum.

        Returns:
            Seconds (float, 0.0 for none).

        Raises:
            DefinitionError: ``by`` is not ``"replay"``, ``"cache"`` or None.

        Example:
            >>> import durably, tempfile
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> @durably.task
            ... def double(x):
            ...     return 2 * x
            >>> @durably.entrypoint
            ... def hello(name):
            ...     return double(len(name))
            >>> hello.run("ada").time_saved()  # (double executed: nothing saved)
            0.0
            >>> again = hello.run("bob")  # a new run: double(3) served from the cache
            >>> again.counts()["cached"], again.time_saved("cache") > 0, again.time_saved("replay")
            (1, True, 0.0)
            >>> durably.configure(store=None)
        """
        if by not in (None, "replay", "cache"):
            raise DefinitionError(
                f"run.time_saved(by={by!r}): by is \"replay\" (time saved by the journal), "
                "\"cache\" (time saved by the cross-run cache) or None (both). Fix: pass one "
                "of those.")
        replay, cache = self._time_saved(self._store.list_steps(self.id))
        return replay if by == "replay" else cache if by == "cache" else replay + cache

    def _time_saved(self, records: list[StepRecord]) -> tuple[float, float]:
        """:meth:`time_saved` by replay and by the cache, from the run's records of every
        attempt."""
        return time_saved(records, self.attempt)

    def counts(self) -> dict[str, int]:
        """Steps of the latest attempt by status: ``ran``, ``cached``, ``replayed``,
        ``failed``; a step counts once, by its last record (a try that failed and was
        retried into a result counts as ``ran``)."""
        return _counts(self.steps)

    def summary(self) -> str:
        """One line: status, steps by status, wall time (when known), what happened before.

        Example: ``run 'index-3f2a…' finished: 1,001 steps — 0 ran, 1,001 replayed,
        0 cached, 0 failed — in 0.41 s (continued a finished run)``.
        """
        # the journal read once (every attempt's records: the latest attempt's are among
        # them, in the same order), not once for the counts and once for the time saved
        records = self._store.list_steps(self.id)
        c = _counts(_latest_steps([r for r in records if r.attempt == self.attempt]))
        total = sum(c.values())
        text = (
            f"run {self.id!r} {self.status}: {total:,} steps — {c['ran']:,} ran, "
            f"{c['replayed']:,} replayed, {c['cached']:,} cached, {c['failed']:,} failed"
        )
        if self.wall_time is not None:
            text += f" — in {self.wall_time:.2f} s"
        by_replay, by_cache = self._time_saved(records)
        if by_replay >= 0.01 and by_cache >= 0.01:
            text += (f", {by_replay + by_cache:,.2f} s saved ({by_replay:,.2f} s by the journal, "
                     f"{by_cache:,.2f} s by the cache)")
        elif by_replay >= 0.01:
            text += f", {by_replay:,.2f} s saved by the journal"
        elif by_cache >= 0.01:
            text += f", {by_cache:,.2f} s saved by the cache"
        changes, kept = self._code_changes(c)
        text += changes
        if self.status == "interrupted":
            text += (f" — waiting for {len(self.interrupts)} answer(s): resume with "
                     f"{self.name}.resume({self.id!r}, value)")
        if self.resumed_from == "forked":
            return text + " (first execution of a fork)"
        if self.resumed_from == "finished":
            return text + (" (reran a finished run: unchanged steps replayed from its journal)"
                           if c["replayed"] else " (reran a finished run: no step was "
                           "unchanged, so none was replayed)")
        how = {"interrupted": "resumed after an interrupt",
               "stopped": "resumed a run that was stopped by Ctrl-C or a closed stream",
               "crashed": "resumed a run whose process had died while executing it",
               "failed": "resumed a run that had failed"}.get(
            self.resumed_from or "", "resumed a run that had stopped before finishing")
        if self.resumed_from is None:
            return text
        if c["replayed"]:
            return text + f" ({how}: its finished steps were replayed)"
        if kept:
            return text + (f" ({how}: no step was replayed: its finished steps were kept from "
                           "older code)")
        # did the attempt before have finished steps to replay?
        had = any(s.status in ("ran", "cached", "replayed") for s in records
                  if s.attempt == self.attempt - 1)
        if not had:
            return text + f" ({how}: none of its steps had finished)"
        if not c["ran"]:
            return text + (f" ({how}: no step was replayed: "
                           + ("its steps were served from the cache)" if c["cached"] else
                              "this attempt called no step)"))
        return text + (f" ({how}: no step was replayed: the steps that had finished are of "
                       "tasks whose code or inputs changed since, so they executed again; "
                       "task.explain(...) says what changed)")

    def _code_changes(self, c: dict[str, int]) -> tuple[str, int]:
        """What the summary says of steps this attempt kept from older code
        (``keep_finished=True``), or else of finished steps it executed again because their
        code changed ("" when neither); and how many it kept."""
        if self.resumed_from is None and self.attempt < 2:
            return "", 0
        try:
            kept = kept_steps(self.steps) if c["cached"] else 0
            again = 0 if kept or not c["ran"] else rerun_after_code_change(self._store,
                                                                           self._record)
        except Exception:  # noqa: BLE001 - a summary never fails
            return "", 0
        if kept:
            return (f" — {kept:,} of the cached steps kept from older code (keep_finished=True: "
                    "finished before their task's code changed; s.kept_from in run.steps)",
                    kept)
        if again:
            one = again == 1
            return (f" — {again:,} step{'' if one else 's'} that had finished executed again "
                    f"because {'its' if one else 'their'} code changed; keep_finished=True "
                    f"would have kept {'its result' if one else 'their results'}", 0)
        return "", 0

    def refresh(self) -> Run[R]:
        """Read the run's record again from the store."""
        rec = self._store.find_run(self.id)
        if rec is not None:
            self._record = rec
            self._result = _UNSET
            self._pending = None
        return self


def _latest_steps(records: list[StepRecord]) -> list[StepRecord]:
    """:attr:`Run.steps` of one attempt's records: a ``started`` record only for a step
    that has no later one (it was executing when the attempt ended)."""
    closed = {r.step_id for r in records if r.status != "started"}
    return [r for r in records if r.status != "started" or r.step_id not in closed]


def _counts(steps: list[StepRecord]) -> dict[str, int]:
    """:meth:`Run.counts` of :attr:`Run.steps`: each step by its last record's status."""
    last = {s.step_id: s.status for s in steps}
    c = collections.Counter(last.values())
    return {k: c.get(k, 0) for k in ("ran", "cached", "replayed", "failed")}


def executing(store: Store, run_id: str) -> bool:
    """Whether a live process holds the run's lease."""
    return store.run_holder(run_id) is not None


def _store_of(store: Store | str | os.PathLike[str] | None, where: str = "store=...") -> Store:
    """The store given (a store, or a path or URL opening one), else the configured one."""
    if store is None:
        return default_store()
    from durably._store.urls import store_from

    found: Store = store_from(store, where)
    return found


def get_run(run_id: str, *, store: StoreLike = None) -> Run[Any]:
    """Read a run back from the store, from any process.

    Args:
        run_id: The run's id (``Run.id``), or the start of it that only one run's id starts
            with (as the ``durably`` command takes it: ``durably show pipeline-3f2a``).
        store: The store to read. Default: the configured store.

    Returns:
        The :class:`Run` handle.

    Raises:
        NotFoundError: no run with that id, or whose id starts with it, in the store; or the
            start of an id that several runs' ids start with (the message lists them). Also
            a :class:`LookupError`.

    Example:
        >>> import durably, tempfile
        >>> store = durably.DiskStore(tempfile.mkdtemp())
        >>> @durably.entrypoint(store=store)
        ... def hello(name):
        ...     return f"hello {name}"
        >>> run = hello.run("ada")
        >>> durably.get_run(run.id, store=store).result
        'hello ada'
        >>> durably.get_run(run.id[:12], store=store).id == run.id
        True
    """
    st = _store_of(store)
    rec = st.find_run(run_id)
    if rec is None and run_id:
        found = [r for r in st.list_runs() if r.run_id.startswith(run_id)]
        if len(found) == 1:
            rec = found[0]
        elif found:
            shown = ", ".join(r.run_id for r in found[:10]) + (", ..." if len(found) > 10
                                                                 else "")
            raise NotFoundError(
                f"the run id prefix {run_id!r} is ambiguous: {len(found)} runs in the store at "
                f"{st.where!r} have ids starting with it ({shown}). Fix: give more of the "
                "id, or the whole id.")
    if rec is None:
        raise NotFoundError(
            f"no run {run_id!r} in the store at {st.where!r}, and no run id starts with it. "
            "Fix: check the id with durably.list_runs(), or pass store=... (or set "
            "DURABLY_DIR) for the store that holds it."
        )
    return Run(rec, st)


def list_runs(entrypoint: Any = None, *, thread: str | None = None,
              store: StoreLike = None) -> list[Run[Any]]:
    """The runs in the store, most recently updated first.

    Args:
        entrypoint: Only runs of this entrypoint: the decorated function itself, its name, or
            its identity (``module:name``). Default: all runs.
        thread: Only the calls on this conversation thread
            (``entrypoint.run(..., thread=...)``). Default: runs on any thread or none.
        store: The store to read. Default: the configured store.

    Returns:
        A list of :class:`Run`, newest first.

    Raises:
        TypeError: ``entrypoint`` is a task, or not an entrypoint or a name.
        DefinitionError: ``thread`` is not a str.

    Example:
        >>> import durably, tempfile
        >>> store = durably.DiskStore(tempfile.mkdtemp())
        >>> @durably.entrypoint(store=store)
        ... def square(x):
        ...     return x * x
        >>> _ = square(2), square(3)
        >>> [r.result for r in durably.list_runs(square, store=store)]
        [9, 4]
    """
    st = _store_of(store)
    key = entrypoint
    spec = getattr(entrypoint, "_self_spec", None)
    if spec is not None and spec.kind != "entrypoint":
        raise TypeError(
            f"list_runs() takes an entrypoint; {spec.name!r} is a {spec.kind}, and only "
            "entrypoints have runs"
        )
    if spec is not None:
        key = spec.identity
        if store is None and spec.store is not None:
            st = spec.store
    elif entrypoint is not None and not isinstance(entrypoint, str):
        raise TypeError(
            f"list_runs(entrypoint=...) takes an entrypoint or its name, not {entrypoint!r}"
        )
    if thread is None:
        return [Run(rec, st) for rec in st.list_runs(key)]
    if not isinstance(thread, str):
        raise DefinitionError(f"list_runs(thread=...) takes a thread id (a str), not "
                              f"{thread!r}. Fix: list_runs(thread=\"t1\")")
    return [Run(rec, st) for rec in st.list_thread_runs(thread)
            if key is None or key in (rec.entrypoint, rec.name)]


#: the statuses a run can have (:attr:`Run.status`)
RUN_STATUSES = ("running", "crashed", "finished", "failed", "interrupted", "stopped", "forked")


def delete_runs(run_ids: Iterable[str] | None = None, *, older_than: float | None = None,
                status: str | Iterable[str] | None = None, entrypoint: Any = None,
                dry_run: bool = False, store: StoreLike = None) -> list[str]:
    """Delete runs and their journals (records, steps, events, answers, and the large values
    in ``blobs/`` only they refer to): the runs named, or every run that matches the
    filters. The cache is kept, so their steps still serve later calls. A run a live
    process is executing is never deleted. A run waiting for an answer (``"interrupted"``:
    someone is still to answer its question) is matched by the filters only when
    ``status`` names ``"interrupted"`` (or when it is named by id): ``older_than=30 *
    86400`` alone leaves it. Like LangGraph's ``delete_thread`` or a DBOS garbage
    collection, for a store that grows with every run.

    Args:
        run_ids: The runs to delete. With filters too: only those of them that match.
        older_than: Only runs last updated more than this many seconds ago (``0``: any).
        status: Only runs with this status, or one of these: ``"crashed"``,
            ``"finished"``, ``"failed"``, ``"interrupted"``, ``"stopped"``, ``"forked"``.
            Default: any status but ``"interrupted"``.
        entrypoint: Only runs of this entrypoint (the decorated function, its name or its
            ``module:name``).
        dry_run: Say which runs would be deleted; delete nothing.
        store: The store. Default: the configured store (an entrypoint's own store, if it
            has one and ``store`` is not given).

    Returns:
        The ids of the runs deleted (with ``dry_run``: that would be). Runs named by id
        that do not exist are skipped; with filters, a run being executed is left out, and
        so is a run waiting for an answer unless ``status`` names ``"interrupted"``.

    Raises:
        ValueError: neither ``run_ids`` nor a filter was given (pass ``older_than=0`` to
            mean every run), ``older_than`` is negative, or ``status`` is not a status.
        RunStateError: a run named by id is being executed by a live process (nothing
            is deleted).
        StoreError: the store cannot be read or written.

    Example:
        >>> import durably, tempfile
        >>> store = durably.DiskStore(tempfile.mkdtemp())
        >>> @durably.entrypoint(store=store)
        ... def square(x):
        ...     return x * x
        >>> _ = square(2), square(3)
        >>> ids = [r.id for r in durably.list_runs(store=store)]
        >>> durably.delete_runs(status="finished", store=store, dry_run=True) == ids
        True
        >>> durably.delete_runs(ids[0], store=store) == ids[:1]
        True
        >>> durably.delete_runs(older_than=0, entrypoint=square, store=store) == ids[1:]
        True
        >>> durably.list_runs(store=store)
        []
    """
    statuses: set[str] | None = None
    if status is not None:
        statuses = {status} if isinstance(status, str) else set(status)
        wrong = sorted(statuses - set(RUN_STATUSES))
        if wrong:
            raise ValueError(f"delete_runs(status=...): {wrong[0]!r} is not a run status; "
                             f"use {', '.join(RUN_STATUSES[1:])}")
    if older_than is not None and (isinstance(older_than, bool) or not isinstance(
            older_than, (int, float)) or not older_than >= 0):
        raise ValueError(f"delete_runs(older_than=...) must be seconds >= 0 (a number: "
                         f"30 days is 30 * 86400), not {older_than!r}")
    if isinstance(run_ids, str):
        run_ids = [run_ids]
    elif isinstance(run_ids, bytes) or (
            run_ids is not None and not isinstance(run_ids, Iterable)):
        raise TypeError(f"delete_runs() takes run ids (a str or a list of them), not "
                        f"{run_ids!r}")
    filtered = older_than is not None or statuses is not None or entrypoint is not None
    if run_ids is None and not filtered:
        raise ValueError("delete_runs() needs run ids or a filter (older_than=, status=, "
                         "entrypoint=); older_than=0 deletes every run (but those waiting "
                         "for an answer: status='interrupted' deletes them)")
    st = _store_of(store)
    spec = getattr(entrypoint, "_self_spec", None)
    if store is None and spec is not None and spec.store is not None:
        st = spec.store  # (its runs are there, as list_runs reads them)
    delete = st.delete_runs
    if not filtered:
        assert run_ids is not None
        return list(delete(run_ids, dry_run=dry_run))
    runs = list_runs(entrypoint, store=st)
    cutoff = time.time() - older_than if older_than is not None else None
    named = set(run_ids) if run_ids is not None else None
    chosen = [r.id for r in runs
              if (cutoff is None or r.updated < cutoff)
              and (r.status in statuses if statuses is not None else
                   # (a question still to be answered is kept unless asked for or named)
                   named is not None or r.status != "interrupted")]
    if named is not None:
        chosen = [i for i in chosen if i in named]
    return list(delete(chosen, dry_run=dry_run, skip_executing=True))
