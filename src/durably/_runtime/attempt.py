"""Runs and their attempts: :func:`begin_run` finds or creates an entrypoint's run, takes
its lease (or defers its start: an attempt that only replays writes nothing until it must)
and makes it the active run; :func:`end_run` journals the attempt's buffered records, the
run's final status and event, and releases the lease.

Apart from the call path (:mod:`durably._runtime.call`): this runs once an attempt, not
once a task call, and owns the run's lease and its record.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from durably._keys import serde as _serde
from durably._keys.hashing import trace_digest
from durably._runtime.call import _monotonic
from durably._runtime.config import default_store
from durably._runtime.context import CACHE_BATCH as _CACHE_BATCH
from durably._runtime.context import LARGE_ROW, RunContext, StopRun, current_run, current_step
from durably._runtime.ctrl_c import note_stopped, note_stopped_again
from durably._runtime.failures import RAISED, RETRY, released
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.policy import ADMITTING
from durably._runtime.spec import MAIN_MODULES, Spec
from durably._runtime.step import _WRITE_THROUGH
from durably._store.lease import LEASE_SECONDS, RENEW_SECONDS, Owner, _pid, beat, hold, let_go, me
from durably._store.records import EventRecord, RunRecord, StepRecord, now
from durably._trace.tracer import Event, short_repr
from durably.exceptions import (
    DefinitionError,
    RunBusyError,
    RunStateError,
    SerializationError,
    StoreError,
)
from durably.store import ReadAhead, Store

__all__ = ["Started", "begin_run", "end_run", "is_cancelled", "run_status",
           "validate_run_id"]

log = logging.getLogger("durably")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")
_MAX_ARGS_BYTES = 16 << 20  # arguments bigger than this are not kept with the run
#: a run result bigger than this is written outside the transaction that ends the attempt
#: (other processes' journal writes wait for that transaction)
_BATCHED_RESULT = LARGE_ROW


def is_cancelled(exc: BaseException | None) -> bool:
    """Whether ``exc`` is asyncio's ``CancelledError``, without importing asyncio (a sixth of
    ``import durably`` with wrapt 1.x, which does not import it either): none can have been
    raised in a process that never imported it."""
    aio = sys.modules.get("asyncio")
    return aio is not None and isinstance(exc, aio.CancelledError)



def validate_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise DefinitionError(
            f"invalid run_id {run_id!r}: use 1 to 200 letters, digits and . _ : @ + = -, starting "
            "with a letter or digit (for example run_id=\"nightly-2026-11-29\")"
        )
    return run_id


@functools.lru_cache(maxsize=1024)
def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:80] or "run"


class Started:
    """A run that :func:`begin_run` started: its record, context and context tokens."""

    __slots__ = ("ctx", "ended", "record", "resumed_from", "tokens", "wall")

    def __init__(self, record: RunRecord, ctx: RunContext, resumed_from: str | None) -> None:
        self.record = record
        self.ctx = ctx
        self.ended = False  # end_run was called
        self.tokens: tuple[Any, Any] | None = (current_run.set(ctx), current_step.set(None))
        self.resumed_from = resumed_from
        self.wall = now()


def begin_run(spec: Spec, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *,
              run_id: str | None, fresh: bool, listener: Callable[[Event], Any] | None = None,
              read_cache: bool = True, store: Store | None = None,
              on_lease: Callable[[Store, RunRecord | None], None] | None = None,
              thread: str | None = None) -> Started:
    """Find or create the run record and make the run active in this context.

    ``listener`` receives the run's live events; ``read_cache=False`` (a fork's first
    attempt) executes steps that are not in the run's journal instead of taking them from
    the cross-run cache. ``on_lease`` runs once the lease is held, with the run's record
    read again (resume journals its answers there, so two resumers cannot both answer).
    ``thread``: the conversation thread a new run is a call on (a run keeps its own)."""
    if not isinstance(fresh, bool):
        raise DefinitionError(f"fresh must be True or False, not {fresh!r}")
    store = store or spec.store or default_store()
    arguments = spec.arguments(instance, args, kwargs)
    input_digest = spec.digest_inputs(arguments)
    if run_id is not None:
        validate_run_id(run_id)
    try:
        stored_args: bytes | None = _serde.dumps((args, kwargs), what="the run's arguments")
        if stored_args is not None and len(stored_args) > _MAX_ARGS_BYTES:
            stored_args = None
    except SerializationError:
        stored_args = None
    outer = current_run.get(), current_step.get()  # (restored if interrupted below)
    ctx: RunContext | None = None
    owner = me()
    hold(owner)  # from now on, a lease of this process with its token is not a leftover
    leasing: str | None = None  # the run whose lease this attempt may hold
    ahead: ReadAhead | None = None  # the run's first steps, read with its record
    existing: RunRecord | None
    # the lease, the run's record and its start event commit together: one commit, and no
    # other process sees the lease without the record (a store without batch(): one each)
    try:
        ended = _ended_run(store, spec, run_id, input_digest, owner) if (
            not fresh and listener is None and on_lease is None and read_cache) else None
        if ended is not None:
            # a run that ended (failed, stopped, finished), read without a write lock: its
            # start is journaled with its first write, or with its end (see _Deferred)
            run_id, existing, events, ahead = ended
            deferred = True
            record, resumed_from, started_event = _attempt_record(
                spec, run_id, existing, input_digest, stored_args, thread)
        else:
            with _one_transaction(store):
                # read inside the transaction: no other process can start or end an attempt
                # of the run between this read and the lease (a store without batch(): read
                # again once the lease is held, below)
                run_id, existing = _resolve_run(store, spec, run_id, fresh, input_digest)
                leasing = run_id
                # a run that ended (failed, stopped, finished) is most often resumed to
                # replay its journal and execute what follows: its start is journaled with
                # its first write, or with its end (see _Deferred); only looked at by lease
                # now (a store without snapshot(): see _ended_run)
                deferred = (existing is not None and existing.status in _DEFERRED_FROM
                            and listener is None and on_lease is None and read_cache)
                holder = (store.check_run(run_id, owner) if deferred
                          else store.acquire_run(run_id, owner))
                if holder is not None:
                    raise _held(run_id, holder, owner)
                try:
                    if on_lease is not None:
                        on_lease(store, existing)
                    record, resumed_from, started_event = _attempt_record(
                        spec, run_id, existing, input_digest, stored_args, thread)
                    if not deferred:
                        store.put_run(record)
                    events = [] if existing is None else store.list_events(run_id, _ASKED)
                    if not deferred:
                        store.append_events([started_event])
                except BaseException:
                    if not deferred:
                        store.release_run(run_id, owner)  # never leave a lease behind
                    raise
        t = record.updated
        answers: dict[str, bytes] = {}
        asked: set[str] = set()
        questions: dict[str, bytes | None] = {}
        codes: dict[str, str] = {}  # the code that asked each question, if known
        failed_before: dict[str, bytes] = {}  # (see _failures)
        for e in events:
            if e.kind == "answer" and e.data is not None:
                answers[e.key] = e.data
            elif e.kind == RAISED and e.step_id is not None and e.data is not None:
                failed_before[e.step_id] = e.data
            elif e.kind == RETRY and e.step_id is not None:
                failed_before.pop(e.step_id, None)
            elif e.kind == "interrupt_code" and e.data is not None:
                codes[e.key] = e.data.decode("ascii", "replace")
            elif e.kind == "interrupt":
                questions[e.key] = e.data
                if e.step_id is not None:
                    asked.add(e.step_id)
    except BaseException:
        _abandon(store)
        try:
            if leasing is not None:
                # a Ctrl-C as the transaction committed: the lease is written, and would
                # refuse other processes while this one lives (only this attempt's token is
                # deleted: nothing, if it took none)
                with contextlib.suppress(Exception):
                    store.release_run(leasing, owner)
        finally:
            let_go(owner)
        raise
    # from here until the caller's try (which ends the attempt), a KeyboardInterrupt must not
    # leave the lease held or this context inside a run that nobody will end
    try:
        # renewed while the attempt executes, even inside a step's body (until let_go)
        renewal = _Renewal(store.renew_run_apart, run_id, owner)
        if not deferred:
            beat(owner, renewal)
        held = _answer_dependent(store, run_id, asked)
        if existing is not None and existing.status == "running":
            try:  # after a crash (the cache is another database: outside the transaction)
                _restore_cache(store, run_id, existing.attempt, held)
            except Exception as exc:  # noqa: BLE001 - the journal has every result
                log.warning("durably: run %r: the cache entries its crashed attempt had "
                            "queued could not be put back (%s); its journal has their results",
                            run_id, exc)
        ctx = RunContext(run_id, store, record.attempt, owner, name=spec.name,
                         listener=listener, answers=answers, read_cache=read_cache)
        ctx.replaying = existing is not None
        ctx.failed_before = failed_before
        if existing is not None and isinstance(existing.result, _serde.Spilled):
            ctx.stored_result = existing.result  # (a large one, kept in blobs/)
        if ahead is None and ctx.replaying:
            ahead = store.read_ahead(run_id)
        if listener is None:  # (a listener is shown each replayed step's whole record)
            ctx.ahead = ahead
        ctx.uncacheable.update(held)
        renewal.ctx = ctx
        if deferred:
            assert existing is not None
            ctx.deferred = _Deferred(store, record, existing.attempt, started_event, renewal)
            ctx.renew_at = math.inf  # (no lease to renew until it is taken)
        if renewal.lost:  # (found while the attempt was being set up)
            ctx.lose_lease()
        ctx.entry = spec
        for interrupt_id, payload in questions.items():
            if interrupt_id in answers and payload is not None:
                with contextlib.suppress(Exception):  # a payload class gone: keep the answer
                    ctx.asked[interrupt_id] = trace_digest(_serde.loads(payload))
                    if interrupt_id in codes:
                        ctx.asked_code[interrupt_id] = codes[interrupt_id]
        if listener is not None and hasattr(listener, "ctx"):
            listener.ctx = ctx  # so the consumer of a stream can stop the run
        if listener is not None:
            ctx.emit(Event("run_started", run_id, t, task=spec.name,
                           status=resumed_from or "new", attempt=record.attempt))
        return Started(record, ctx, resumed_from)
    except BaseException:
        if ctx is not None and current_run.get() is ctx:
            current_run.set(outer[0])
            current_step.set(outer[1])
        try:
            store.release_run(run_id, owner)
        finally:
            let_go(owner)
        raise


#: the events an attempt reads when it starts: the questions asked and answered so far
_ASKED = ("interrupt", "answer", "interrupt_code", RAISED, RETRY)


def _ended_run(store: Store, spec: Spec, run_id: str | None, input_digest: str, owner: Owner
               ) -> tuple[str, RunRecord, list[EventRecord], ReadAhead | None] | None:
    """The run a call resumes, if it had ended (failed, stopped, finished: see _Deferred) and
    no live process holds it: its id, record, questions and answers, and its first steps,
    read in one snapshot of a store that takes them (a DiskStore), without a write lock.
    None when the run is new, or in another state, or the store cannot take such a
    snapshot: the attempt starts in a write transaction instead.

    Raises:
        RunStateError: another live process holds the run (as when the lease is taken).
    """
    with store.snapshot():
        run_id, existing = _resolve_run(store, spec, run_id, False, input_digest)
        if existing is None:
            return None
        # (a run another live process executes is refused here too, without waiting for
        # the journal's write lock; in another state, the attempt starts as said above)
        holder = store.run_holder(run_id)
        if holder is not None and holder.token != owner.token:
            raise _held(run_id, holder, owner)
        if existing.status not in _DEFERRED_FROM:
            return None
        events = store.list_events(run_id, _ASKED)
        return run_id, existing, events, store.read_ahead(run_id)


def _attempt_record(spec: Spec, run_id: str, existing: RunRecord | None, input_digest: str,
                    args: bytes | None, thread: str | None = None
                    ) -> tuple[RunRecord, str | None, EventRecord]:
    """The record of the attempt that starts now (running), the status of the run it
    resumes (None: a new run; "crashed": one still running whose process died), and the
    attempt's start event."""
    t = now()
    record = RunRecord(
        run_id=run_id,
        entrypoint=spec.identity,
        name=spec.name,
        status="running",
        created=existing.created if existing else t,
        updated=t,
        attempt=(existing.attempt + 1) if existing else 1,
        input_digest=input_digest,
        args=args,
        thread=existing.thread if existing else thread,
    )
    resumed_from = None if existing is None else (
        "crashed" if existing.status == "running" else existing.status)
    started_event = EventRecord(
        run_id, "run_started", t, record.attempt,
        data=_started_data(resumed_from or "new", script_of(spec)))
    return record, resumed_from, started_event


@functools.lru_cache(maxsize=16)
def _started_data(status: str, script: str | None = None) -> bytes | None:
    """The data of a start event (the status the run is resumed from, and the path of the
    script that defines its entrypoint, if any), made once each."""
    info = {"status": status}
    if script is not None:
        info["script"] = script
    return _serde.dumps(info, what="a run event")


def script_of(spec: Spec) -> str | None:
    """The absolute path of the script that defines an entrypoint run as a script
    (``python job.py``: identity ``__main__.job:...``; in a process that loaded the script
    as ``__mp_main__``, as multiprocessing and ``durably resume`` do, too), else None."""
    module, sep, _ = spec.identity.partition(":")
    stem = module[len("__main__."):] if module.startswith("__main__.") and sep else ""
    if not stem:
        return None
    for alias in MAIN_MODULES:
        file = getattr(sys.modules.get(alias), "__file__", None)
        if isinstance(file, str) and os.path.splitext(os.path.basename(file))[0] == stem:
            return os.path.abspath(file)
    return None


class _Renewal:
    """The renewal of an attempt's lease by the lease's thread (see :func:`beat`): a lease
    found taken over stops the attempt (:meth:`RunContext.lose_lease`)."""

    __slots__ = ("ctx", "lost", "owner", "renew", "run_id")

    def __init__(self, renew: Callable[[str, Owner], bool | None], run_id: str,
                 owner: Owner) -> None:
        self.renew, self.run_id, self.owner = renew, run_id, owner
        self.ctx: RunContext | None = None
        self.lost = False

    def __call__(self) -> None:
        if self.renew(self.run_id, self.owner) is False:
            self.lost = True
            if self.ctx is not None:
                self.ctx.lose_lease()


#: the statuses of a run whose next attempt journals its start with its first write (see
#: _Deferred); not "running" (a crashed attempt: its queued cache entries are put back
#: first), "interrupted" (it waits for answers) nor "forked"
_DEFERRED_FROM = frozenset({"failed", "stopped", "finished"})


def _held(run_id: str, holder: Owner, owner: Owner) -> RunBusyError:
    """The error of an attempt that finds the run's lease held by ``holder``, alive."""
    if holder.pid == owner.pid and holder.host == owner.host:
        return RunBusyError(
            f"run {run_id!r} is being executed in this process right now (by another "
            "thread, or a stream() that is still open: close it with .close(), or "
            "finish iterating it). Fix: wait for it, or start a separate run with "
            "fresh=True or another run_id (or @entrypoint(wait=seconds) to wait for it and "
            "return its result).", run_id)
    if holder.host != owner.host:
        # another machine, or another pid namespace (a container): its process
        # cannot be looked at from here, only its lease's heartbeat
        age = max(0.0, time.time() - holder.heartbeat)
        left = max(0.0, LEASE_SECONDS - age)
        return RunBusyError(
            f"run {run_id!r} is held by {holder.describe()}, which this process "
            "cannot look at (another machine, or another container's pid namespace)"
            f": its lease was renewed {age:.0f} s ago. If that process is executing "
            "the run, two processes must not. If it died, the run can be resumed "
            f"once its lease expires, in {left:.0f} s (a lease not renewed for "
            f"{LEASE_SECONDS:.0f} s). Fix: wait for it to finish or expire (then "
            "rerun), or start a separate run with fresh=True or another run_id.", run_id)
    return RunBusyError(
        f"run {run_id!r} is being executed by {holder.describe()} right now; two "
        "processes must not execute one run. Fix: wait for it to finish (then rerun to "
        "get its result; @entrypoint(wait=seconds) waits for you), or start a separate run "
        "with fresh=True or another run_id.", run_id)


class _Deferred:
    """The start of an attempt that has only replayed so far (of a run that ended: see
    _DEFERRED_FROM). Replaying writes nothing, so the attempt takes the run's lease, marks
    its record running and journals its start event only when it first writes: before a
    step executes, or a record, event or batch of replays is journaled
    (:meth:`RunContext.claim`). An attempt that only replays journals its start with its
    end, in the one commit that ends it, without a lease: the run is resumed with one
    commit instead of two.

    Either way the write is refused, and nothing of the attempt journaled, unless the run
    is as the attempt found it: no other process holds its lease, and its last attempt is
    still the one before this one (another process that resumed it meanwhile, and maybe
    finished it, keeps it). A crash before then leaves the journal as it was: replaying
    wrote nothing, so nothing is lost."""

    __slots__ = ("event", "previous", "record", "renewal", "store")

    def __init__(self, store: Any, record: RunRecord, previous: int, event: EventRecord,
                 renewal: _Renewal) -> None:
        # (a copy: the attempt's record becomes its final one, which the start must not be)
        self.store, self.record, self.previous = store, record.copy(), previous
        self.event, self.renewal = event, renewal

    def __call__(self, ctx: RunContext, ending: bool = False) -> None:
        """Journal the attempt's start and start renewing the lease it took; ``ending``:
        inside the transaction that ends it, only check that no other process holds the
        run (no lease taken; the start event is journaled with the end's, by
        :func:`_write_final`).

        Raises:
            RunStateError: another process holds the run, or resumed it meanwhile."""
        store: Any = self.store  # (a store with batch(), check_run(), put_run_if_current())
        record, owner = self.record, ctx.owner
        # ctx.deferred stays set until the commit: other threads wait in claim() meanwhile
        # (ending: it is cleared once the transaction that ends the attempt commits)
        try:
            with _one_transaction(store):
                holder = (store.check_run(record.run_id, owner) if ending
                          else store.acquire_run(record.run_id, owner))
                if holder is not None:
                    raise _held(record.run_id, holder, owner)
                if not ending:
                    if not store.put_run_if_current(record, previous=self.previous):
                        raise _resumed_meanwhile(record, self.previous, store)
                    store.append_events([self.event])
        except BaseException as exc:
            if ending or isinstance(exc, RunStateError) or not _journaled(store, record):
                raise  # (rolled back: its start is still to be journaled)
            # committed, then interrupted as it returned (a Ctrl-C): the lease is held
            ctx.deferred = None
            self._held(ctx)
            raise
        if not ending:
            ctx.deferred = None
            self._held(ctx)

    def _held(self, ctx: RunContext) -> None:
        """The lease is taken: renew it from now on."""
        beat(ctx.owner, self.renewal)
        ctx.renew_at = _monotonic() + RENEW_SECONDS


def _journaled(store: Any, record: RunRecord) -> bool:
    """Whether the run's stored record is ``record`` as written (same attempt, status and
    time): a transaction interrupted as it returned (a Ctrl-C landing as its COMMIT ended)
    committed after all. What this thread's connection left open is rolled back first (it
    was not committed: read inside it, it would say so). False when that cannot be read."""
    try:
        _abandon(store)
        stored = store.find_run(record.run_id)
    except Exception:  # noqa: BLE001 - unreadable: taken as not written (the safe side)
        return False
    return (stored is not None and stored.attempt == record.attempt
            and stored.status == record.status and stored.updated == record.updated)


def _resumed_meanwhile(record: RunRecord, previous: int, store: Any) -> RunStateError:
    """The error of an attempt whose run another process resumed (or deleted) while it
    replayed; ``store`` is read to tell the two apart."""
    gone = False
    with contextlib.suppress(Exception):  # (unreadable: said as a resume)
        gone = store.find_run(record.run_id) is None
    if gone:
        return RunStateError(
            f"run {record.run_id!r} was deleted (durably.delete_runs, or durably delete) "
            "while this attempt replayed its journal: this attempt stopped before it executed "
            "or journaled anything. Fix: call the entrypoint again to start the run anew.")
    return RunStateError(
        f"run {record.run_id!r} was resumed by another process while this one replayed its "
        f"journal (its last attempt is no longer {previous}): two processes must not execute "
        "one run, so this attempt stopped before it executed or journaled anything. Fix: call "
        "it again once the other attempt ended, to get the run's result.")


def _own_run(record: RunRecord) -> bool:
    """Whether a call without ``run_id=`` and ``thread=`` may continue the run: neither a
    fork (continued by its id) nor a call on a conversation thread (continued on its
    thread)."""
    return "-fork-" not in record.run_id and record.thread is None


def _resolve_run(store: Store, spec: Spec, run_id: str | None, fresh: bool,
                 input_digest: str) -> tuple[str, RunRecord | None]:
    """The id of the run this call starts or continues, and its record if it exists.

    Raises:
        RunStateError: ``run_id`` names a run of another entrypoint or other arguments, or
            ``fresh=True`` names one that exists.
    """
    existing: RunRecord | None
    if run_id is None:
        base = f"{_slug(spec.name)}-" + xxhash.xxh3_64_hexdigest(
            f"{spec.identity}\x00{input_digest}".encode()
        )
        existing = None if fresh else store.find_latest_run(spec.identity, input_digest)
        if existing is not None and not _own_run(existing):
            # a fork is a what-if: calling the entrypoint again continues the run it forked
            # from, not the fork (forks are continued by their id); a conversation thread's
            # call is the thread's: a call without thread= never continues or returns it
            existing = next((r for r in store.list_runs(spec.identity)
                             if r.input_digest == input_digest and _own_run(r)), None)
        run_id = existing.run_id if existing else (
            f"{base}-{uuid.uuid4().hex[:8]}" if fresh else base
        )
        if existing is None and not fresh:
            existing = store.find_run(run_id)
    else:
        existing = store.find_run(run_id)
        if existing is not None:
            if fresh:
                raise RunStateError(
                    f"fresh=True asks for a new run, but run {run_id!r} already exists "
                    f"({existing.status}). Fix: choose another run_id, or leave fresh out to "
                    "continue it."
                )
            if existing.entrypoint != spec.identity:
                raise RunStateError(
                    f"run {run_id!r} belongs to entrypoint {existing.entrypoint!r}, not "
                    f"{spec.identity!r}. Fix: choose another run_id."
                )
            if existing.input_digest != input_digest:
                raise RunStateError(
                    f"run {run_id!r} of {spec.name!r} was started with other arguments. "
                    "Fix: call it with the same arguments to continue it, or choose another "
                    "run_id for these."
                )
    return run_id, existing


def _one_transaction(store: Store) -> contextlib.AbstractContextManager[Any]:
    """The store's :meth:`~durably.store.Journal.batch`: its journal writes inside commit
    as one."""
    return store.batch()


def _abandon(store: Store) -> None:
    """After leaving a ``with _one_transaction(store)`` block by an exception: roll back what
    it began if its end never ran (a KeyboardInterrupt landing as it was entered)."""
    store.abandon()


def _answer_dependent(store: Store, run_id: str, asked: set[str]) -> set[str]:
    """The steps of the run whose results depend on an answer to ``interrupt()``: the steps
    that asked, and their callers up to the entrypoint, found over every attempt (a caller
    may finish attempts after the step that asked, which it then replays)."""
    held: set[str] = set()
    frontier = set(asked)
    while frontier:
        held |= frontier
        found = store.parents_of(run_id, frontier)
        frontier = {up for up in found.values() if up is not None and up not in held}
    return held


def _restore_cache(store: Store, run_id: str, attempt: int, held: set[str]) -> None:
    """After a crash: put back the cache entries the crashed attempt had queued but not yet
    written (cheap steps batch their cache writes; the journal has every result).

    The attempt is the latest that executed steps: one that crashed again while it put
    back these entries executed none (looked back at most 8 attempts). Only cheap steps
    queue their writes (a slower one wrote its entry at once), so the last ``CACHE_BATCH``
    of those are looked at. Steps that depend on an answer to ``interrupt()`` (``held``,
    from :func:`_answer_dependent`) were never to be cached, and are not."""
    steps: list[StepRecord] = []
    for back in range(attempt, max(attempt - 8, 0), -1):
        steps = store.list_steps(run_id, attempt=back)
        if any(s.status == "ran" for s in steps):
            break
    recent = [s for s in steps
              if s.status == "ran" and s.cache_key and s.step_id not in held
              and s.ended - s.started < _WRITE_THROUGH][-_CACHE_BATCH:]
    if ADMITTING:  # (tasks with cache_if=: which of their results it refused is not known)
        recent = [s for s in recent if s.task not in ADMITTING]
    missing = []
    for step in recent:
        if store.cache_get(step.cache_key) is None:
            data = store.find_step(run_id, step.step_id)
            if data is not None:
                missing.append((step.cache_key, data, None))
    store.cache_put_many(missing)


def end_run(started: Started, result: Any = None, exc: BaseException | None = None) -> None:
    """Flush the attempt's buffered records, write the run's final status, release the
    run's lease."""
    ctx, record = started.ctx, started.record
    if ctx.pid != _pid[0]:
        # a process forked inside the run leaves the entrypoint (sys.exit, an exception):
        # the run, its lease and its buffered records are its parent's
        started.ended = True
        _leave(started)
        return
    # stopped by Ctrl-C: its end waits a few seconds at most for another process's lock
    # (then it is not journaled: the run is resumed as after a crash), and a second Ctrl-C
    # meanwhile ends the process with one short message
    ctrl_c = isinstance(exc, KeyboardInterrupt)
    try:
        started.ended = True
        _leave(started)
        with ctx.store.stopping() if ctrl_c else contextlib.nullcontext():
            _end_attempt(ctx, record, result, exc, started.wall)
    except KeyboardInterrupt as again:
        if ctrl_c and again is not exc:
            note_stopped_again(again, record, journaled=False)
        raise
    finally:
        try:
            _leave(started)  # (again, if a KeyboardInterrupt landed before it)
        finally:
            let_go(ctx.owner)  # (interrupted before its release: its lease is a leftover)
    if record.status == "stopped" and exc is not None and (
            isinstance(exc, KeyboardInterrupt) or is_cancelled(exc)):
        try:
            with ctx.store.stopping() if ctrl_c else contextlib.nullcontext():
                note_stopped(exc, record, ctx.store)  # (its two lines, if it ends the script)
        except KeyboardInterrupt as again:
            if ctrl_c and again is not exc:
                note_stopped_again(again, record, journaled=True)
            raise
    if ctx.listener is not None:
        ctx.emit(Event(
            f"run_{record.status}", record.run_id, record.updated, task=record.name,
            status=record.status, duration=record.updated - started.wall,
            output=short_repr(result) if exc is None else None,
            data=result if exc is None else exc.interrupts
            if isinstance(exc, InterruptSignal) else record.error,
            attempt=record.attempt,
        ))
    if log.isEnabledFor(logging.INFO) and record.status != "running":  # (it ended)
        from durably._runtime.run import Run

        handle: Run[Any] = Run(record, ctx.store)
        handle.resumed_from, handle.wall_time = started.resumed_from, now() - started.wall
        try:
            log.info("durably: %s", handle.summary())
        except Exception as summary_exc:  # noqa: BLE001 - a log line never fails the run
            log.warning("durably: run %r %s; its summary cannot be read: %s", record.run_id,
                        record.status, summary_exc)
    if exc is not None and isinstance(exc, Exception) and not ctx.unjournaled:
        exc.add_note(
            f"durably: run {record.run_id!r} failed; its finished steps are kept. Rerun to "
            f"retry, or inspect it with durably.get_run({record.run_id!r})."
        )


def _leave(started: Started) -> None:
    """Take this context out of the run (once)."""
    tokens = started.tokens
    if tokens is None:
        return
    run_token, step_token = tokens
    with contextlib.suppress(RuntimeError, ValueError):  # (reset once already)
        current_step.reset(step_token)
    with contextlib.suppress(RuntimeError, ValueError):
        current_run.reset(run_token)
    started.tokens = None


def run_status(exc: BaseException | None) -> str:
    """The status an attempt that ended with ``exc`` leaves its run in."""
    if exc is None:
        return "finished"
    if isinstance(exc, InterruptSignal):
        return "interrupted"
    if isinstance(exc, (StopRun, KeyboardInterrupt)) or is_cancelled(exc):
        return "stopped"  # by the user (Ctrl-C, a closed stream, a cancelled task): resumable
    return "failed"


def _end_attempt(ctx: RunContext, record: RunRecord, result: Any, exc: BaseException | None,
                 wall: float) -> None:
    """Journal the attempt's buffered records, its final status and event, and release its
    lease: one transaction, unless the result is large or that fails."""
    store = ctx.store
    ctx.ended = True  # (no renewal from here: the lease is released below)
    taken = ctx.take_pending()
    info: bytes | None = None
    failure: BaseException | None = None
    written = False
    # found by a renewal while it executed (read before the release: a renewal after it
    # finds no lease, and says nothing about this attempt)
    lost = ctx.lost
    if lost and ctx.deferred is not None:
        # its start was refused when it was to write (the run is another process's: the
        # RunStateError it raised is the attempt's end): nothing of it is journaled
        ctx.unjournaled = True
        if exc is None or isinstance(exc, StopRun) or (
                isinstance(exc, BaseExceptionGroup) and exc.split(StopRun)[0] is not None):
            # (the error was caught; or a thread or task of the user's, stopped by the
            # refusal at its next step, surfaced first, alone or in a group (asyncio's
            # TaskGroup): the call says why, not StopRun)
            raise _resumed_meanwhile(record, ctx.deferred.previous, store)
        return
    if ctx.deferred is not None and _unreadable(ctx, exc):
        # an attempt that only replayed, stopped because this process cannot read the
        # run's journal (a blob store not named here, another signing key): what it could
        # not read says nothing of the run, whose record stays as it was (finished, say)
        ctx.unjournaled = True
        assert exc is not None
        exc.add_note(
            f"durably: this process could not read the journal of run {record.run_id!r}, so "
            "this call journaled nothing: the run's record is as it was (see durably runs).")
        return
    retry = released(exc, ctx.failures)  # (its failed steps whose error ended it)
    refused: RunStateError | None = None  # (an attempt that only replayed, refused at its end)
    cache_written = False  # the queued cache writes are (a failure after: the journal's)
    unwritten = False  # its final record was not journaled (another attempt's stands)
    sealed_ahead = False  # its result was prepared by seal_ahead() (undone if unwritten)
    try:
        # (pickled outside any transaction)
        info = _final_record(record, result, exc, wall, ctx.cancelled_by)
        ctx.flush_cache()  # the cache is another database: outside the transaction below
        cache_written = True
        if sum(len(data) for _, data in taken[0] if data is not None) > _BATCHED_RESULT:
            ctx.write(taken)  # many results of cached steps: before it, on their own
            taken = [], []
        deferred = ctx.deferred  # (None once something of the attempt was journaled)
        # (a result in a file is sealed ahead whatever its size)
        large = record.result is not None and (
            len(record.result) > _BATCHED_RESULT or isinstance(record.result, _serde.Spilled))
        if large:
            # a large result sealed, and written to blobs/, before the transaction: other
            # writers do not wait for it, and it ends in one commit with the rest
            assert record.result is not None
            record.result = store.seal_ahead(record.result, "result", record.run_id,
                                             reuse=ctx.stored_result)
            sealed_ahead = True
            large = False
        if deferred is not None and not large:
            # an attempt that only replayed: its start, its replays and its end in one
            # commit, without a lease; refused (nothing written) unless the run's last
            # attempt is still the one before it
            try:
                with _one_transaction(store):
                    deferred(ctx, ending=True)
                    ctx.deferred = None  # (its start is in this transaction: joined below)
                    if not _write_final(store, record, info, checked=True,
                                        previous=deferred.previous, before=deferred.event,
                                        retry=retry):
                        raise _resumed_meanwhile(record, deferred.previous, store)
                    # (after its record: each write is fenced by the attempt it names)
                    ctx.write(taken)
            except RunStateError as error:
                # the run is another process's: nothing of this attempt is journaled
                ctx.deferred = deferred
                ctx.unjournaled = True
                refused = error
                written = unwritten = True  # (there is nothing to write)
            except BaseException:
                if not _journaled(store, record):
                    ctx.deferred = deferred  # rolled back: its start is not journaled
                    raise
                # committed, then interrupted as it returned (a Ctrl-C): the end is written
                written = True
                raise
            written = True
        elif not large:
            # the buffered records, the final status and the lease's release: one commit;
            # the status only while the run is still this attempt's (another process that
            # took it over owns its record now). In this order: a store without
            # transactions never shows the run released but still running ("crashed")
            with _one_transaction(store):
                ctx.write(taken)
                if lost or not _write_final(store, record, info, checked=True, retry=retry):
                    lost = unwritten = True
                if store.release_run(record.run_id, ctx.owner) is False:
                    lost = True
            written = True
    except BaseException as error:  # noqa: BLE001 - (a full disk, Ctrl-C): written below
        failure = error
        _abandon(store)
    # stopped by Ctrl-C, and its end could not be journaled (another process's lock, or
    # Ctrl-C again): not retried write by write, which would wait on the same lock
    given_up = isinstance(exc, KeyboardInterrupt) and isinstance(
        failure, (StoreError, KeyboardInterrupt))
    if given_up and isinstance(failure, StoreError):
        with contextlib.suppress(Exception):  # (else its lease expires by itself)
            store.release_run(record.run_id, ctx.owner)
    if not written and not given_up:
        # each write on its own (the transaction failed; or a store that cannot seal a large
        # result ahead: other processes' journal writes do not wait while it is sealed); its
        # record only while the run is still this attempt's (the statement that writes it
        # checks); after a failure, the lease is released anyway. An attempt that only
        # replayed journals its start first (with a lease): refused, it journals nothing
        # more (and ends as below)
        try:
            replayed_only = ctx.deferred is not None and (
                failure is None or isinstance(failure, StoreError))
            recovered = False  # the end journaled here after all
            raised: BaseException | None = None  # what these writes raised
            try:
                try:
                    ctx.claim()
                except RunStateError as error:
                    if not replayed_only:
                        raise
                    ctx.unjournaled = True
                    refused = error
                else:
                    ctx.write(taken)
            except BaseException as error:
                raised = error
                raise
            finally:
                try:
                    if info is None:
                        info = _final_record(record, result, exc, wall, ctx.cancelled_by)
                    if not lost and not ctx.lost and refused is None:
                        if _write_final(store, record, info, checked=True, retry=retry):
                            recovered = True
                        else:
                            lost = True
                except BaseException as error:
                    raised = raised or error
                    raise
                finally:
                    _release_after(store, record, ctx, raised or failure or (
                        exc if isinstance(exc, StoreError) else None))
            if cache_written and isinstance(failure, StoreError) and (
                    recovered or refused is not None):
                # the journal's transaction failed (its write lock held past the busy timeout
                # by another process, say), and the writes above made up for it: the attempt
                # is journaled, or another one's record stands; said, not raised
                log.warning("durably: run %r: %s (the transaction that ends it failed: %s)",
                            record.run_id, f"the end of attempt {record.attempt} was journaled "
                            "on a second try, write by write" if recovered else "another process "
                            "resumed it meanwhile: this call's attempt is not journaled",
                            failure)
                failure = None
        except StoreError as error:
            if not isinstance(exc, StoreError):
                raise
            failure = error  # (the attempt's own error goes on: see below)
    if unwritten and sealed_ahead and record.result is not None:
        store.discard_ahead(record.result)  # (a large result's file no journal refers to)
    if failure is not None and isinstance(exc, (StoreError, KeyboardInterrupt)) and \
            isinstance(failure, StoreError):
        # the attempt ended on a store error (the server gone for good, say) or Ctrl-C, and
        # its end could not be journaled: the caller sees the first, which names the cause
        # (the run is resumed from its journal once the store is back, or its lease expired)
        log.warning("durably: run %r: the end of attempt %d could not be journaled: %s",
                    record.run_id, record.attempt, failure)
        exc.add_note(f"durably: the end of this attempt of run {record.run_id!r} could not "
                     "be journaled; the run resumes from its journal once the store answers "
                     "again.")
        failure = None
    if failure is not None:
        try:
            raise failure
        finally:
            failure = None  # no reference cycle: what the error holds is freed with it
    if refused is not None:
        if isinstance(exc, (StopRun, InterruptSignal)):
            raise refused  # (a pause or a stop that is not journaled would not be seen)
        # the attempt only replayed: every step it called came from the journal, so its
        # result (or its error) is the run's as journaled, and is the call's; only its
        # attempt is not journaled (the run's record is the other process's)
        log.info("durably: run %r was resumed by another process while this call replayed "
                 "it; the call's %s comes from the journal, its attempt is not journaled",
                 record.run_id, "result" if exc is None else "error")
        if exc is not None:  # (a Ctrl-C, SystemExit or cancellation goes on as it is too)
            exc.add_note(
                f"durably: run {record.run_id!r} was resumed by another process while this "
                "call replayed it: every step came from the journal, and this attempt is not "
                "journaled (the run's record is the other attempt's).")
        return
    if lost:
        lost_error = _lost(ctx, record, exc)
        if exc is None or isinstance(exc, (Exception, StopRun, InterruptSignal)):
            raise lost_error
        # a Ctrl-C, SystemExit or cancellation goes on as it is (said in a note)
        exc.add_note(str(lost_error))


def _release_after(store: Store, record: RunRecord, ctx: RunContext,
                   cause: BaseException | None) -> None:
    """Release the attempt's lease after its end could not be journaled as one transaction.
    When that failed with ``cause`` (the server gone for good, say), a release that fails
    too is logged, not raised: the error the caller sees names the cause (could not
    reconnect), not the lease, which expires by itself."""
    try:
        store.release_run(record.run_id, ctx.owner)
    except Exception as error:
        if cause is None:
            raise
        log.warning("durably: run %r: its lease could not be released (%s); it expires by "
                    "itself %.0f s after its last renewal", record.run_id, error,
                    LEASE_SECONDS)


def _unreadable(ctx: RunContext, exc: BaseException | None) -> bool:
    """Whether ``exc`` (or each error of a group) is a store error this attempt met reading
    a replayed step's journaled value (:attr:`RunContext.unreadable`)."""
    if exc is None or not ctx.unreadable:
        return False
    if isinstance(exc, BaseExceptionGroup):
        rest = exc.split(lambda e: any(e is seen for seen in ctx.unreadable))[1]
        return rest is None
    return any(exc is seen for seen in ctx.unreadable)


def _lost(ctx: RunContext, record: RunRecord, exc: BaseException | None) -> RunStateError:
    """The error an attempt whose lease was taken over ends with (its end not journaled)."""
    holder = None
    with contextlib.suppress(Exception):  # (who holds it now is only said when known)
        holder = ctx.store.run_holder(record.run_id)
    by = f"by {holder.describe()}" if holder is not None else "by another process, or removed"
    how = "finished" if exc is None else "stopped" if ctx.stop and isinstance(exc, StopRun) \
        else f"ended ({run_status(exc)})"
    log.warning("durably: run %r: attempt %d lost its lease while it executed; its end is "
                "not journaled", record.run_id, record.attempt)
    return RunStateError(
        f"run {record.run_id!r}: attempt {record.attempt} in this process lost the run's lease "
        f"while it executed (taken over {by}: this process did not renew it for "
        f"{LEASE_SECONDS:.0f} s, was it stopped or suspended?). The attempt {how}; its "
        "finished steps are journaled, but its end is not: the run's record is the other "
        "attempt's. Fix: wait for the other process, then call the entrypoint again (or "
        f"durably.get_run({record.run_id!r})) for the run's result.")


def _final_record(record: RunRecord, result: Any, exc: BaseException | None,
                  started: float, why: str | None = None) -> bytes:
    """Set the run's final status, result (pickled) and error on its record; return the
    pickled data of its final event. ``why``: what stopped it (durably.cancel_run, its
    timeout), if that did."""
    record.updated = now()
    record.status = run_status(exc)
    if exc is None:
        try:
            record.result = _serde.dumps(result, what=f"the result of {record.name!r}")
        except SerializationError as ser:
            record.result = None
            record.error = str(ser)
            log.warning("durably: run %r finished, but its result is not stored (other "
                        "processes cannot read it): %s", record.run_id, ser)
    elif record.status == "stopped":
        record.error = f"StopRun({why!r})" if why is not None else (
            "StopRun('the consumer of stream() stopped the run')" if isinstance(
                exc, StopRun) else repr(exc)[:2000])
    elif record.status == "failed":
        record.error = repr(exc)[:2000]
    info: dict[str, Any] = {"status": record.status, "duration": record.updated - started,
                            "output": short_repr(result) if exc is None else None,
                            "error": record.error if exc is not None else None}
    if isinstance(exc, InterruptSignal):
        info["interrupts"] = [i.id for i in exc.interrupts]
    return _serde.dumps(info, what="a run event")


def _write_final(store: Store, record: RunRecord, info: bytes, checked: bool = False,
                 previous: int | None = None, before: EventRecord | None = None,
                 retry: Sequence[str] = ()) -> bool:
    """Journal the run's final record and its final event (after ``before``, the start
    event of an attempt that only replayed); ``checked``: only while the run is still this
    attempt's (``put_run_if_current``; with ``previous``, while its last attempt is that
    one). False when it is not (nothing written)."""
    if not checked:
        store.put_run(record)
    elif not store.put_run_if_current(record, previous=previous):
        return False
    final = EventRecord(record.run_id, f"run_{record.status}", record.updated, record.attempt,
                        data=info)
    # the failed steps whose exception ended the attempt: executed again by the next one
    retries = [EventRecord(record.run_id, RETRY, record.updated, record.attempt, step)
               for step in retry]
    store.append_events([*retries, final] if before is None else [before, *retries, final])
    return True
