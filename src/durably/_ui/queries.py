"""What the dashboard's pages show, read from a store through :mod:`durably.store`'s protocol
and the public run API (never by importing or running the user's code).

Values the journal holds pickled (interrupt payloads, custom events, tracebacks) are loaded
by :func:`safe_load`, which builds plain data and stands a placeholder in for any class that
is not a builtin: unpickling would otherwise import the user's modules.
"""

from __future__ import annotations

import builtins
import copyreg
import dataclasses
import datetime
import decimal
import io
import pickle
import threading
import time
from collections.abc import Iterable
from typing import Any

import durably
from durably._runtime.interrupt import record_answers
from durably._store import lease
from durably._trace.spans import time_saved
from durably._trace.tracer import short_repr
from durably.exceptions import RunStateError
from durably.store import EventRecord, StepRecord, Store

__all__ = ["RUN_ENDS", "RunsWatch", "answer_interrupts", "errors_of", "events_of",
           "pending_of", "result_of", "run_row", "safe_load", "step_counts",
           "step_page", "steps_after", "StepsCache", "with_origins"]

#: the journal's events that start and end an attempt
RUN_ENDS = ("run_started", "run_finished", "run_failed", "run_interrupted", "run_stopped")
#: builtins a pickle of plain data names (never eval, exec, getattr, open, __import__ ...)
_SAFE_BUILTINS = frozenset({
    "bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int", "list",
    "object", "range", "set", "slice", "str", "tuple", "Exception", "BaseException",
    "ArithmeticError", "AssertionError", "AttributeError", "KeyError", "IndexError",
    "LookupError", "NameError", "OSError", "RuntimeError", "TypeError", "ValueError",
    "ZeroDivisionError", "FileNotFoundError", "PermissionError", "TimeoutError",
    "NotImplementedError", "KeyboardInterrupt", "StopIteration", "ConnectionError",
})
_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("copyreg", "_reconstructor"): copyreg._reconstructor,  # type: ignore[attr-defined]
    ("collections", "OrderedDict"): __import__("collections").OrderedDict,
    ("datetime", "datetime"): datetime.datetime, ("datetime", "date"): datetime.date,
    ("datetime", "time"): datetime.time, ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone, ("decimal", "Decimal"): decimal.Decimal,
}


class _Placeholder:
    """An object of a class the dashboard does not import: shown as ``module.Name(...)``."""

    _where = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        args = ", ".join(short_repr(a, 60) for a in getattr(self, "args", ()))
        return f"{self._where}({args})"


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in _SAFE_BUILTINS:
            return getattr(builtins, name)
        if (module, name) in _SAFE_GLOBALS:
            return _SAFE_GLOBALS[(module, name)]
        return type(name, (_Placeholder,), {"_where": f"{module}.{name}"})


def safe_load(data: bytes | None) -> Any:
    """Unpickle ``data`` without importing anything: a class other than plain data's stands
    as a placeholder whose ``repr`` names it. None for None; a string saying so for a value
    that cannot be read this way (a large or binary-layout value)."""
    if data is None:
        return None
    if type(data) is not bytes:
        return "<a large value, not loaded by the dashboard>"
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - a value in another layout, or damaged: said, not raised
        return "<a value the dashboard cannot read>"


# -- the runs table ----------------------------------------------------------------------------
def _duration(events: list[EventRecord], attempt: int, status: str, now: float
              ) -> float | None:
    """Seconds the latest attempt took (so far, while it executes)."""
    mine = [e for e in events if e.attempt == attempt]
    starts = [e.time for e in mine if e.kind == "run_started"]
    ends = [e.time for e in mine if e.kind != "run_started"]
    if not starts:
        return None
    if ends:
        return max(0.0, ends[-1] - starts[-1])
    return max(0.0, now - starts[-1]) if status == "running" else None


#: the statuses of the steps counted (interrupted ones too, as the step table lists them)
COUNTED = ("ran", "cached", "replayed", "failed", "interrupted")


def result_of(store: Store, run: durably.Run[Any]) -> Any:
    """The run's result, loaded by :func:`safe_load` (never unpickled: nothing imported),
    or None when it has none recorded."""
    record = store.find_run(run.id)
    return None if record is None else safe_load(record.result)


def _counts(steps: Iterable[StepRecord]) -> dict[str, int]:
    """Steps by status, each by its last record (as :meth:`durably.Run.counts`)."""
    last: dict[str, str] = {}
    for s in steps:
        if s.status != "started":
            last[s.step_id] = s.status
    counts = {k: 0 for k in COUNTED}
    for status in last.values():
        if status in counts:
            counts[status] += 1
    return counts


def run_row(store: Store, run: durably.Run[Any], steps: StepsCache,
            expected: tuple[int, bool] | None = None) -> dict[str, Any]:
    """One row of the runs table: the run's record, its steps by status, duration, time
    saved (``saved``, of which ``saved_by_cache`` by the cache; None while it executes)
    and, while it executes, its progress: ``expected``, the steps of its previous
    attempt when that attempt finished (a total), else ``before``, the steps its previous
    attempt got to before it stopped (the total is at least this many)."""
    status = run.status
    running = status == "running"
    events = store.list_events(run.id, RUN_ENDS)
    if running:  # (its steps grow: counted at each look by one aggregate query, not read)
        counts: dict[str, int] = step_counts(store, run)[0]
        saved: float | None = None
        by_cache: float | None = None
    else:
        found = steps.of(run)
        counts, saved, by_cache = found["counts"], found["saved"], found["saved_by_cache"]
    return {
        "id": run.id, "name": run.name, "entrypoint": run.entrypoint, "status": status,
        "attempt": run.attempt, "created": run.created, "updated": run.updated,
        "counts": counts, "steps": sum(counts.values()),
        "duration": _duration(events, run.attempt, status, time.time()),
        "saved": saved, "saved_by_cache": by_cache,
        "expected": expected[0] if running and expected and expected[1] else None,
        "before": expected[0] if running and expected and not expected[1] else None,
        "error": run.error,
    }


class RunsWatch:
    """The rows of the newest ``limit`` runs, recomputed only for runs whose record changed
    (and for runs executing now, whose steps grow): shared by every open page."""

    def __init__(self, store: Store, steps: StepsCache, limit: int = 1_000) -> None:
        self.store = store
        self.limit = limit  # the newest runs shown
        self.steps = steps
        self._rows: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._expected: dict[tuple[str, int], tuple[int, bool]] = {}
        self._read: tuple[float, dict[str, dict[str, Any]]] | None = None
        self._lock = threading.Lock()
        self.total = 0  # the runs of the store, at the last look (more than limit: cut)

    def older(self, before: float) -> list[dict[str, Any]]:
        """The rows of the ``limit`` runs updated last before ``before`` (a time, seconds
        since the epoch; their records' ``updated``), newest first: the runs table's pages
        after the newest ``limit`` runs (not kept: read at each request)."""
        every = durably.list_runs(store=self.store)
        self.total = len(every)
        runs = [run for run in every if run.updated < before]
        return [run_row(self.store, run, self.steps, self._expected_of(run))
                for run in runs[:self.limit]]

    def rows(self, fresh_for: float = 0.0) -> dict[str, dict[str, Any]]:
        """Every run's row by run id (newest first); the rows read less than ``fresh_for``
        seconds ago, if any (every open page polls: one look at the store serves them all).
        """
        with self._lock:
            if self._read is not None and time.monotonic() - self._read[0] < fresh_for:
                return self._read[1]
            every = durably.list_runs(store=self.store)
            self.total = len(every)
            runs = every[:self.limit]
            fresh: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
            for run in reversed(runs):  # (oldest first: the newest runs' steps stay kept)
                sign = (run.attempt, run.updated, run.error)
                old = self._rows.get(run.id)
                if old is not None and old[0] == sign and old[1]["status"] != "running":
                    fresh[run.id] = old
                    continue
                fresh[run.id] = (sign, run_row(self.store, run, self.steps,
                                                  self._expected_of(run)))
            self._rows = fresh
            rows = {run.id: fresh[run.id][1] for run in runs}
            self._read = (time.monotonic(), rows)
            return rows

    def _expected_of(self, run: durably.Run[Any]) -> tuple[int, bool] | None:
        """The steps of the run's previous attempt, and whether it finished (an attempt
        stopped by Ctrl-C, a crash, an interrupt or a failure got part of the way only)."""
        if run.attempt < 2:
            return None
        key = (run.id, run.attempt)
        if key not in self._expected:
            before = self.store.list_steps(run.id, attempt=run.attempt - 1)
            ends = [e.kind for e in self.store.list_events(run.id, RUN_ENDS)
                    if e.attempt == run.attempt - 1]
            self._expected[key] = (len({s.step_id for s in before}),
                                   bool(ends) and ends[-1] == "run_finished")
        return self._expected[key]


# -- one run -----------------------------------------------------------------------------------
class StepsCache:
    """The steps of a run's latest attempt, its counts and its time saved, read by one
    ``list_steps`` and kept while the run's record is unchanged (a run that executes is
    read again each time): paging through a 100,000-step run reads its journal once."""

    def __init__(self, store: Store, keep: int = 200_000) -> None:
        self.store = store
        self._kept: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._keep = keep  # step records kept, all runs together (least recently used go)
        self._lock = threading.Lock()

    def kept(self, run: durably.Run[Any]) -> dict[str, Any] | None:
        """What :meth:`of` would return, if it is kept (the run unchanged and not
        executing), else None: never read."""
        status = run.status
        with self._lock:
            kept = self._kept.get(run.id)
            if kept is not None and kept[0] == (run.attempt, run.updated, status) and \
                    status != "running":
                return kept[1]
        return None

    def of(self, run: durably.Run[Any]) -> dict[str, Any]:
        """``steps`` (the latest attempt's, in call order), ``counts``, ``saved`` (seconds,
        as :meth:`durably.Run.time_saved`) and ``saved_by_cache`` (its part by the cache,
        ``time_saved("cache")``)."""
        status = run.status
        sign = (run.attempt, run.updated, status)
        with self._lock:
            kept = self._kept.get(run.id)
            if kept is not None and kept[0] == sign and status != "running":
                self._kept[run.id] = self._kept.pop(run.id)  # (used last: kept longest)
                return kept[1]
        records = self.store.list_steps(run.id)
        latest = [s for s in records if s.attempt == run.attempt]
        closed = {s.step_id for s in latest if s.status != "started"}
        steps = [s for s in latest if s.status != "started" or s.step_id not in closed]
        by_replay, by_cache = time_saved(records, run.attempt)
        found = {"steps": steps, "counts": _counts(steps), "saved": by_replay + by_cache,
                 "saved_by_cache": by_cache}
        with self._lock:
            self._kept.pop(run.id, None)
            self._kept[run.id] = (sign, found)
            held = sum(len(k[1]["steps"]) for k in self._kept.values())
            while held > self._keep and len(self._kept) > 1:
                gone = self._kept.pop(next(iter(self._kept)))
                held -= len(gone[1]["steps"])
        return found


def step_counts(store: Store, run: durably.Run[Any]) -> tuple[dict[str, int], list[str], int]:
    """The latest attempt's steps by status (:data:`COUNTED`), its tasks' names (sorted)
    and how many steps it has (other statuses included), from one aggregate query
    (:meth:`~durably.store.Journal.count_steps`)."""
    counted = store.count_steps(run.id, run.attempt)
    counts = {k: sum(c.get(k, 0) for c in counted.values()) for k in COUNTED}
    return counts, sorted(counted), sum(sum(c.values()) for c in counted.values())


def steps_after(store: Store, run: durably.Run[Any], after: int, size: int
                ) -> tuple[list[StepRecord], int | None]:
    """The rows of the latest attempt's next ``size`` calls after position ``after`` (a
    ``"started"`` record left out when its call has a later one), read a page at a time
    (:meth:`~durably.store.Journal.page_steps`), and the position the next page starts after
    (None: this is the last page)."""
    want = size + 16
    while True:
        records = store.page_steps(run.id, run.attempt, after=after, limit=want)
        order = list(dict.fromkeys(r.position for r in records))
        if len(records) < want:  # (the attempt's last records)
            kept, more = order[:size], len(order) > size
            break
        if len(order) > size:
            kept, more = order[:size], True
            break
        if len(order) > 1:  # (the last call may go on in the next records: on the next page)
            kept, more = order[:-1], True
            break
        want *= 4  # (one call with more records than a page: read it whole)
    last = kept[-1] if kept else after
    mine = [r for r in records if r.position <= last]
    closed = {r.step_id for r in mine if r.status != "started"}
    return ([r for r in mine if r.status != "started" or r.step_id not in closed],
            last if more else None)


def with_origins(store: Store, run: durably.Run[Any], rows: list[StepRecord]
                 ) -> list[StepRecord]:
    """The rows of a page of the step table, each replayed step's with the inputs and
    output of the record that finished it (an earlier attempt's, or the one a fork
    copied), as ``durably show`` shows its output, and the seconds that execution took as
    its duration (the graph's ``ran in``): a replay's own record carries none of them. The
    records that finished them are read for these rows only
    (:meth:`~durably.store.Journal.finished_steps`), never the whole journal."""
    replayed = [r.step_id for r in rows if r.status == "replayed" and r.output is None]
    if not replayed:
        return rows
    origins = store.finished_steps(run.id, replayed)
    shown = []
    for r in rows:
        o = origins.get(r.step_id) if r.status == "replayed" and r.output is None else None
        shown.append(r if o is None else dataclasses.replace(
            r, inputs=r.inputs if r.inputs is not None else o.inputs, output=o.output,
            ended=r.started + o.duration))
    return shown


def step_page(steps: list[StepRecord], page: int, size: int, task: str | None = None,
              status: str | None = None) -> tuple[list[StepRecord], int]:
    """One page (0-based) of ``steps``, and how many match; filtered by task name and
    status when given."""
    if task or status:
        steps = [s for s in steps
                 if (not task or s.task == task) and (not status or s.status == status)]
    return steps[page * size:(page + 1) * size], len(steps)


def pending_of(store: Store, run: durably.Run[Any]) -> list[dict[str, Any]]:
    """The interrupts the run waits for (the latest attempt's, unanswered), with their
    payloads loaded by :func:`safe_load`: ``id``, ``task``, ``step_id``, ``payload``."""
    if run.status != "interrupted":
        return []
    events = store.list_events(run.id, ("interrupt", "answer"))
    answered = {e.key for e in events if e.kind == "answer"}
    tasks = {s.step_id: s.task for s in store.list_steps(run.id, attempt=run.attempt)
             if s.status == "interrupted"}
    found: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind == "interrupt" and e.attempt == run.attempt and e.key not in answered:
            found.setdefault(e.key, {
                "id": e.key, "step_id": e.step_id, "payload": safe_load(e.data),
                "task": tasks.get(e.step_id or "", "") if e.step_id else run.name})
    return list(found.values())


def answer_interrupts(store: Store, run_id: str, answers: dict[str, Any]) -> None:
    """Journal ``answers`` (interrupt id -> value) to the run's pending interrupts exactly as
    ``resume`` journals them (:func:`durably._runtime.interrupt.record_answers`); the run
    continues when it is next resumed.

    The run's lease is held while its state is read and the answers journaled, as an
    attempt holds it (:meth:`~durably.store.Journal.acquire_run`): a ``resume`` starting
    meanwhile finds the run held and stops, and a run some process executes is refused.

    Raises:
        RunStateError: the run is not waiting for these answers (it is executing, or was
            answered or resumed meanwhile), or an id is not one of its pending interrupts.
    """
    owner = lease.me()
    lease.hold(owner)  # (a lease of this process's is alive while held)
    try:
        holder = store.acquire_run(run_id, owner)
        if holder is not None:
            raise RunStateError(
                f"run {run_id!r} is executing ({holder.describe()} holds it): it waits for "
                "no answer now. Fix: reload the page once it pauses again.")
        try:
            _answer_held(store, run_id, answers)
        finally:
            store.release_run(run_id, owner)
    finally:
        lease.let_go(owner)


def _answer_held(store: Store, run_id: str, answers: dict[str, Any]) -> None:
    """:func:`answer_interrupts`, the run's lease held."""
    run = durably.get_run(run_id, store=store)
    if run.status != "interrupted":
        raise RunStateError(f"run {run_id!r} is {run.status}, not waiting for an answer: "
                            "it was resumed or answered meanwhile. Fix: reload the page.")
    pending = pending_of(store, run)
    ids = {p["id"] for p in pending}
    unknown = sorted(set(answers) - ids)
    if unknown or not answers:
        raise RunStateError(f"run {run_id!r}: {unknown or 'no answer'} is not among its pending "
                            f"interrupts {sorted(ids)}. Fix: reload the page.")
    interrupts = [durably.Interrupt(p["id"], p["payload"], p["step_id"], p["task"])
                  for p in pending if p["id"] in answers]
    record_answers(store, run_id, run.attempt, interrupts,
                   {i.id: answers[i.id] for i in interrupts})


def errors_of(store: Store, run: durably.Run[Any]) -> list[dict[str, Any]]:
    """The failures of the run's steps (every attempt), newest first: ``task``, ``time``,
    ``error`` (the exception, as a placeholder when its class is not a builtin) and
    ``traceback`` (its text, as the step recorded it)."""
    found = []
    for e in store.list_events(run.id, ("step_raised",)):
        loaded = safe_load(e.data)
        if isinstance(loaded, tuple) and len(loaded) >= 3:
            exc, tb, task = loaded[0], loaded[1], loaded[2]
        else:
            exc, tb, task = loaded, "", ""
        found.append({"task": str(task), "time": e.time, "attempt": e.attempt,
                      "error": short_repr(exc, 300), "traceback": str(tb or "")})
    return found[::-1]


def events_of(store: Store, run: durably.Run[Any]) -> list[dict[str, Any]]:
    """The run's custom events (``get_writer()``'s), in order: ``time``, ``attempt``,
    ``value`` (a short repr)."""
    return [{"time": e.time, "attempt": e.attempt, "value": short_repr(safe_load(e.data), 300)}
            for e in store.list_events(run.id, ("custom",))]
