"""The task call path (journal → cache → execute): from a task's call to its replayed,
cached or computed result.

Call path of a task (DESIGN.md, "the heart"):

1. bind the arguments to the signature, apply defaults, drop ignored ones;
2. digest them canonically; cache key = (task identity, code fingerprint or ``version``,
   input digest);
3. inside a run: step identity = parent step + cache key + occurrence;
4. the journal has the step → return its recorded result (replay); else the cache has the key
   → record a cached step and return; else execute, store the result in the cache and append
   the step to the journal (committed) before returning;
5. outside a run: the cache alone;
6. exceptions propagate unchanged, are journaled as failed steps, never cached.

This runs on every task call; a run's start and end (:mod:`durably._runtime.attempt`)
run once an attempt, what a task is (:mod:`durably._runtime.spec`) is known before its
first call, and a call that executes is finished by its :class:`~durably._runtime.step.Call`
(:mod:`durably._runtime.step`, with the loading of stored results).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import xxhash

from durably._keys.canonical import too_common
from durably._keys.files import SEEN as _files_seen
from durably._keys.files import File, file_stamp
from durably._keys.hashing import (
    digest_each,
    encode_arguments,
    encode_positional,
)
from durably._keys.revalidate import Fingerprint
from durably._runtime.config import default_store
from durably._runtime.context import (
    _FLUSH_EVERY,
    RunContext,
    StopRun,
    current_run,
    current_step,
    cutoff,
)
from durably._runtime.context import RUNS as _RUNS
from durably._runtime.context import user_stacklevel as _user_stacklevel
from durably._runtime.effects import _IMMUTABLE, Effects, mutable, restored
from durably._runtime.effects import before as state_before
from durably._runtime.failures import ReplayedFailure, replayed
from durably._runtime.failures import note as note_failure
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.policy import fresh_entry
from durably._runtime.retry import (
    Retries,
    Retry,
    await_with_timeout,
    call_with_timeout,
    retrying,
)
from durably._runtime.spec import Spec
from durably._runtime.step import _MISS, Call, _load, _load_cached
from durably._runtime.threads import thread_run
from durably._store.lease import _pid
from durably._store.records import now
from durably._trace.producers import LATER as _LATER
from durably._trace.tracer import inputs_repr, short_repr
from durably.exceptions import SerializationError, StoreError
from durably.store import ReadAhead, Store

__all__ = ["begin_step", "cached_now", "call_async", "call_path", "call_sync",
           "execute_sync", "log_lookup", "serve_cached"]

log = logging.getLogger("durably")
#: whether the lookups are logged (DURABLY_LOG=debug, see log_lookup): one test a call
_debug = log.isEnabledFor
_DEBUG = logging.DEBUG
_wall_clock = time.time  # (now(), without a call: it runs twice in every replayed step)
_xxh3_64 = xxhash.xxh3_64_intdigest
_xxh3_128_hex = xxhash.xxh3_128_hexdigest
_monotonic = time.monotonic
_thread_id = threading.get_ident
#: what begin_step returns as the call of a step served from the journal (replayed): nothing
#: is left to finish, so no Call is built for it unless a listener is shown the step
_SERVED = Call.__new__(Call)


def _mark_started(ctx: RunContext, step_id: str) -> None:
    """Journal that a step with nested steps is executing (one row per such step), so the
    graph of a run that crashes inside it still shows it and nests its children. Marked
    once the row is journaled: a child on another thread of the step's waits for it here,
    so that no child's record is committed before its parent's."""
    with ctx.marking:
        if step_id in ctx.marked:
            return  # (by another thread, meanwhile)
        caller = ctx.executing(step_id)  # (a plain call, or an item of a fan-out)
        if caller is not None:
            ctx.journal([(caller.record("started"), None)])
        ctx.marked.add(step_id)


def _file_stamps(fp: Fingerprint) -> dict[File, Any]:
    """The os.stat() of the durably.file() values of a task's code fingerprint, taken
    before its key is made (which may read them: a check of their content, or the walk of
    a new fingerprint)."""
    return {f: file_stamp(f) for f, _ in fp.files}


def _file_inputs(spec: Spec, files: list[tuple[File, Any]] | None,
                 before: dict[File, Any] | None) -> list[tuple[File, Any]] | None:
    """The durably.file() inputs of a body about to run, each with an os.stat() taken before
    its content was read for the key: those its arguments' digest met (``files``), and
    those of its code fingerprint, however nested (their stamps from before the key was
    made, ``before``, else from the walk that read them). A file written or touched after
    that, even before the body started, keeps the result out of the cache
    (:meth:`Call.files_changed`). None when it has none."""
    found: dict[File, Any] = {}
    for f, stamp in files or ():
        found.setdefault(f, stamp)
    fp = spec._fingerprint
    for f, stamp in fp.files if fp is not None else ():
        if f not in found:
            found[f] = before[f] if before is not None and f in before else stamp
    return list(found.items()) or None


def call_path(ctx: RunContext, step_id: str) -> str:
    """The call path of a step executing now: a digest of the tasks, inputs and
    occurrences of it and its callers, without their code (their step ids follow their
    code). A step not found executing stands for itself (its step id)."""
    call = ctx.executing(step_id)
    if call is None or call.path_head is None:
        return step_id
    if call.path is None:
        up = call_path(ctx, call.parent) if call.parent is not None else ""
        input_digest, occurrence = call.path_head
        task_and_inputs = call.spec.side_effect_key(input_digest)  # (its code left out)
        call.path = _xxh3_128_hex(f"~{up}/{task_and_inputs}/{occurrence}".encode())
    return str(call.path)


def _occurrence_id(ctx: RunContext, head: bytes) -> str:
    """The step id ``head`` gives its next occurrence (counted apart from the step ids
    in use: a legacy identity looked up on replay)."""
    n = ctx.occurrence(_xxh3_64(b"legacy:" + head), object())
    return _xxh3_128_hex(b"%s/%d" % (head, n))


def begin_step(spec: Spec, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[Any, Call]:
    """Steps 1 to 5 of the call path up to execution: returns (value, call) where value is the
    replayed or cached result, or ``_MISS`` when the body must run."""
    ctx = current_run.get()  # (live_run, inlined: the call path)
    if ctx.foreign if ctx is not None else _RUNS:  # a thread the run may not know
        ctx = thread_run(ctx, spec)
    if ctx is not None and ctx.pid != _pid[0]:
        ctx = None  # a run of the process this one was forked from: not this process's
    abandoned = cutoff.get()
    if abandoned is not None and abandoned.cut:
        raise StopRun()  # called by a body whose try timed out: it is not part of the run
    store = ctx.store if ctx is not None else (spec.store or default_store())
    plan = spec._plan
    arguments: Any = None  # bound only when needed: a replayed step or a hit does without
    each: dict[str, str] | None = None  # argument digests taken with the key's (see below)
    taken: dict[str, list[str | None]] | None = None  # and their elements', for the tracer
    classes: dict[str, str] | None = None  # and their user classes' code, for explain
    files: list[tuple[File, Any]] | None = None  # the durably.file() values among them
    input_digest = encode_positional(plan, args) if (
        plan is not None and not kwargs and instance is None
        and len(args) == spec._npositional) else None
    if input_digest is None:
        arguments = spec.arguments(instance, args, kwargs)
        # with the digests of each argument (digest_each) and of their elements (the
        # tracer's flow digests), which would encode them again when the step executes: a
        # list or dict argument is encoded once, not three times. Not for a step that is
        # likely replayed, which needs neither (the elements' taps cost a third more)
        each = {}
        classes = {}
        taken = {} if ctx is not None and (not ctx.replaying or ctx.past_journal) else None
        files = []  # the durably.file() values among them, however nested
        token = _files_seen.set(files)
        try:
            input_digest = encode_arguments(arguments, each, taken, classes)  # (digest_inputs)
        except (SerializationError, RecursionError) as exc:
            raise spec.digest_error(exc, arguments) from None
        finally:
            _files_seen.reset(token)
    fp = spec._fingerprint  # its durably.file() values stamped before the key reads them
    before = _file_stamps(fp) if fp is not None and fp.files else None
    key, code = spec.key_and_code(input_digest)
    if ctx is None:
        outside = Call(spec, ctx, store, key, code)
        if spec.cache:
            if spec.policy is None:  # (_lookup, inlined: a hit outside a run)
                data = store.cache_get(key)
            else:
                fresh = fresh_entry(spec, store, key, None)
                data = fresh[0] if fresh is not None else None
            if data is not None:
                value = _load_cached(data, spec, store, key)
                if type(value) is Effects:
                    value = restored(spec.name, value, arguments if arguments is not None
                                     else spec.arguments(instance, args, kwargs), spec)
                if value is not _MISS:
                    if _debug(_DEBUG):
                        log_lookup(spec, store, None, key, True, instance, args, kwargs)
                    return value, outside
            if arguments is None:
                arguments = spec.arguments(instance, args, kwargs)
            outside.started = _wall_clock()
            outside.inputs = digest_each(arguments, each, classes)  # before the body runs
            outside.classes = classes
            outside_changes = mutable(arguments)
            if outside_changes:
                outside.mutable = (outside_changes, state_before(outside_changes,
                                                                  outside.inputs))
            outside.files = _file_inputs(spec, files, before)
        if _debug(_DEBUG):
            log_lookup(spec, store, None, key, False, instance, args, kwargs)
        return _MISS, outside
    if ctx.stop:
        raise StopRun()
    if _monotonic() >= ctx.renew_at:  # (keep_lease's test, without its call)
        ctx.keep_lease()
        if ctx.stop:  # the lease was found lost
            raise StopRun()
    parent = current_step.get()
    if ctx.halting and ctx.halted(parent):
        raise StopRun()  # inside an item of a map that is stopping (Ctrl-C)
    if parent is not None and parent not in ctx.marked:
        _mark_started(ctx, parent)
    journal_key = key if spec.cache else spec.side_effect_key(input_digest)
    legacy: str | None = None  # a nested side effect's id as earlier versions made it
    if parent is not None and not spec.cache:
        # a side effect inside another step is identified by its callers' tasks and inputs,
        # not by their step ids, which follow their code: an edit of a caller (a deploy
        # while the run waits for an answer, a fix) never makes a finished side effect
        # happen again in its run
        head = f"~{call_path(ctx, parent)}/{journal_key}".encode()
        if ctx.replaying:
            legacy = _occurrence_id(ctx, f"{parent}/{journal_key}".encode())
    else:
        # (RunContext.step_id, inlined: every call in a run; the same identity)
        head = f"{parent or ''}/{journal_key}".encode()
    position = next(ctx.positions)
    slot = _xxh3_64(head)
    # (RunContext.occurrence, inlined: its mark is the call's position)
    got = ctx._occurrences.setdefault(slot, position)
    if got is position:
        occurrence = 0
        step_id = _xxh3_128_hex(head + b"/0")
    else:
        occurrence = ctx.occurrence_again(slot)
        step_id = _xxh3_128_hex(b"%s/%d" % (head, occurrence))
    started = _wall_clock()
    call: Call | None = None  # built only when needed: a replayed step does without
    if ctx.listener is not None:
        call = Call(spec, ctx, store, key, code, parent, step_id, position, started)
        if arguments is None:
            arguments = spec.arguments(instance, args, kwargs)
        call.args_repr = inputs_repr(arguments)
        ctx.emit(call.event("step_started"))
    noted: ReadAhead | None = None  # the read-ahead that recorded the step as replayed
    try:
        if not ctx.replaying:
            data = None
        elif legacy is None and (ahead := ctx.ahead) is not None and \
                ahead.thread == _thread_id():
            # (the run's own thread: the steps it replays are recorded as ranges there, with
            # the parent of their record; not a nested side effect, found by its call path
            # whatever its parent's id: its record keeps the caller that called it now)
            data = ahead.replay(step_id, position, started)
            if data is not None:
                noted = ahead
        else:
            data = store.find_step(ctx.run_id, step_id)
        if data is None and legacy is not None:
            # journaled by an older durably under its caller's step id: that record, under
            # that id (its own nested steps were journaled under it)
            data = store.find_step(ctx.run_id, legacy)
            if data is not None:
                step_id = legacy
                if call is not None:
                    call.step_id = legacy
    except StoreError as exc:
        # this process cannot read the journal (a blob store not named here, another
        # signing key): an attempt that only replayed so far ends journaling nothing
        ctx.unreadable.append(exc)
        raise
    if data is None and ctx.keep is not None and spec.cache:
        # keep_finished=True: the step this run finished under older code (see _keep)
        found = ctx.keep.find(spec, parent, input_digest, occurrence, step_id, code,
                              instance, args, kwargs)
        if found is not None:
            if call is None:
                call = Call(spec, ctx, store, key, code, parent, step_id, position, started)
            return ctx.keep.serve(found, call, instance, args, kwargs), _SERVED
    if data is None and ctx.failed_before and step_id in ctx.failed_before:
        # it failed in an earlier attempt and the run went on: its failure is replayed
        if noted is not None:
            noted.retract()
        raise ReplayedFailure(_replay_failure(ctx, Call(
            spec, ctx, store, key, code, parent, step_id, position, started)
            if call is None else call, lambda: arguments if arguments is not None
            else spec.arguments(instance, args, kwargs)))
    if data is None and ctx.deferred is not None:
        # an attempt that only replayed so far: its start journaled and its lease taken
        # before this step executes (whichever thread gets here first; the others wait)
        ctx.claim()
    if data is None and not spec.cache and ctx._pending:
        # a side effect executes: the steps served from the cache before it are journaled
        # first, so that a resume replays them as they were (the cache may no longer serve
        # them: expired, pruned, cleared) and the side effect never sees other inputs
        ctx.flush()
    if data is None and ctx.replaying and not ctx.past_journal:
        ctx.past_journal = True
        if ctx._pending or ctx.replays_buffered:  # (whole records, with a listener: a stream)
            # the steps replayed so far are journaled before the first one executed: a
            # crash from here on still shows where the attempt was (one write an attempt)
            ctx.flush()
    if data is not None:
        try:
            value = pickle.loads(data)  # (_load, inlined for the common case)
        except Exception:  # noqa: BLE001 - not a plain pickle, or it fails: said by _load
            try:
                value = _load(data, spec, "journaled")
            except SerializationError as exc:
                if noted is not None:
                    noted.retract()  # (not replayed: the step raises, or executes)
                if not spec.cache:
                    raise  # (a side effect: executing it again is the user's decision)
                # cacheable (safe to compute again): a miss, as a damaged record is
                why = str(exc).partition(": ")[2].partition(". Either")[0]
                warnings.warn(
                    f"durably: run {ctx.run_id!r}: the journaled result of task "
                    f"{spec.name!r} cannot be loaded in this process ({why}); the task is "
                    "cacheable, so it is served from the cache or executed again.",
                    stacklevel=_user_stacklevel())
                data = None
                if ctx.deferred is not None:
                    ctx.claim()
            except BaseException:
                if noted is not None:
                    noted.retract()  # (not replayed: the step raises)
                raise
    if data is not None:
        if type(value) is Effects:  # (it changed its arguments in place: redone)
            value = restored(spec.name, value, arguments if arguments is not None
                             else spec.arguments(instance, args, kwargs), spec)
        if step_id in ctx.uncacheable:  # (it used an answer: spent, see interrupt())
            ctx.spent.add(step_id)
            if parent is not None:
                ctx.uncacheable.add(parent)
        # (a later step given it draws an edge: Producers.replayed, inlined: every replay)
        if type(value).__weakrefoffset__:
            ctx.producers.returned(value, step_id)
        else:
            later = ctx.producers.later
            later.append((value, step_id))
            if len(later) >= _LATER:
                ctx.producers.catch_up()
        if noted is not None:
            if noted.due:  # (as many replay ranges as an attempt buffers)
                ctx.flush()
            return value, _SERVED
        if call is None:
            replays = ctx._replays  # (RunContext.note_replayed, inlined: every replayed step)
            replays.append((position, started, _wall_clock(), step_id, parent,
                            key if spec.cache else "", spec.name))
            if len(replays) >= _FLUSH_EVERY:
                ctx.flush()
            return value, _SERVED
        # the whole record: it keeps the inputs the listener was shown
        record = call.record("replayed")
        ctx.note_replayed_record(record)
        ctx.emit(call.event("step_finished", dataclasses.replace(
            record, output=short_repr(value))))
        return value, _SERVED
    if call is None:
        call = Call(spec, ctx, store, key, code, parent, step_id, position, started)
    call.path_head = (input_digest, occurrence)
    if arguments is None:
        arguments = spec.arguments(instance, args, kwargs)
    call.arguments = arguments
    may_change: list[tuple[str, Any]] | None = None  # (what the body may change: _effects)
    for value in arguments.values():
        if type(value) not in _IMMUTABLE:  # (a plain loop: no call for the common ones)
            may_change = mutable(arguments)
            break
    if spec.slow and ctx.queued_cache:
        _write_queued(ctx)
    if spec.cache:
        found = _lookup(spec, store, key, ctx) if ctx.read_cache else None
        if found is None:
            call.files = _file_inputs(spec, files, before)
        call.inputs = digest_each(arguments, each, classes)  # before the body may mutate them
        call.classes = classes
        if may_change:
            call.mutable = (may_change, state_before(may_change, call.inputs))
        call.trace_inputs(arguments, None, taken)
        if found is not None:
            value = serve_cached(call, found[0], found[1])
            if value is not _MISS:
                if _debug(_DEBUG):
                    log_lookup(spec, store, ctx, key, True, instance, args, kwargs)
                return value, call
            call.files = _file_inputs(spec, files, before)  # (as for a miss)
    else:
        if may_change:  # (their digests before the body may change them)
            call.mutable = (may_change, state_before(may_change, each))
        # the digests of whole arguments the tracer takes: those taken with the key ("" for
        # a value too common to mean a flow, as trace_digest gives; the others, its own)
        call.trace_inputs(arguments, {n: "" if too_common(arguments[n]) else d
                                      for n, d in each.items()} if each else None, taken)
    if _debug(_DEBUG):
        log_lookup(spec, store, ctx, key, False, instance, args, kwargs)
    return _MISS, call


def log_lookup(spec: Spec, store: Store, ctx: RunContext | None, key: str, hit: bool,
               instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Log one cache lookup at DEBUG on the ``durably`` logger (``DURABLY_LOG=debug``): a
    hit, or a miss with why it missed, in a line (:attr:`Explanation.summary
    <durably.Explanation.summary>`). Steps replayed from a run's journal are not lookups of
    the cache, and are not logged. Never raises: a failure is logged instead."""
    from durably._runtime.explain import explain

    try:
        arguments = spec.arguments(instance, args, kwargs)
        if hit:
            why = "served from the cache"
        elif not spec.cache:
            why = "cache=False: never served from the cache"
        elif spec.policy is not None and spec.policy.refresh:
            why = "refresh(): executed again, its entry replaced"
        elif ctx is not None and not ctx.read_cache:
            why = "a fork's first attempt reads no cache"
        else:
            found = explain(spec, store, instance, args, kwargs)
            why = found.summary if not found.hit else (
                "its entry could not be used (see the warnings)")
        log.debug("durably: %s %s(%s)%s [key %s]: %s", "hit" if hit else "miss", spec.name,
                  inputs_repr(arguments), f" in run {ctx.run_id}" if ctx is not None else "",
                  key[:12], why)
    except Exception as exc:  # noqa: BLE001 - a log line never breaks a call
        log.debug("durably: %s %s [key %s]: (not explained: %r)", "hit" if hit else "miss",
                  spec.name, key[:12], exc)


def _replay_failure(ctx: RunContext, call: Call,
                    arguments: Callable[[], dict[str, Any]]) -> BaseException:
    """The exception a step that failed in an earlier attempt of the run raised, to raise
    again (see :mod:`durably._runtime.failures`), after putting back into the caller's objects what
    its body changed in them before it raised; its ``failed`` record is buffered like a
    replayed step's (the attempt may have only replayed so far: nothing executes)."""
    exc, moved = replayed(ctx.failed_before[call.step_id], ctx.run_id)
    if moved:
        restored(call.spec.name, Effects(None, moved), arguments(), call.spec)
    record = call.record("failed", repr(exc)[:2000])
    if ctx.deferred is None or ctx.claim(replays=True):  # (a whole record: the run's own)
        ctx.note_replayed_record(record)
    ctx.count("failed")
    note_failure(ctx.failures, exc, call.step_id)  # (an escape releases it again)
    if ctx.listener is not None:
        ctx.emit(call.event("step_failed", record, data=record.error))
    return exc


def cached_now(call: Call) -> tuple[bytes, float] | None:
    """The cached result of a call whose body was to run, if its key has one by now (a
    duplicate in a fan-out, after the first such item finished), as :func:`begin_step`
    would have found it, with the seconds its execution took; None in a fork's first
    attempt (it reads no cache)."""
    ctx = call.ctx
    if ctx is not None and not ctx.read_cache:
        return None
    return _lookup(call.spec, call.store, call.key, ctx)


def _lookup(spec: Spec, store: Store, key: str, ctx: RunContext | None
            ) -> tuple[bytes, float] | None:
    """The cache entry of a call and the seconds the execution that produced it took: the
    run's queued write of it first, else the store's; with a cache policy
    (``expires_after=``, ``cache_if=``, a refresh), as it lets it be served."""
    if spec.policy is not None:
        return fresh_entry(spec, store, key, ctx)
    found = ctx.pending_cache(key) if ctx is not None else None
    return found if found is not None else store.cache_get_timed(key)


def serve_cached(call: Call, data: bytes, saved: float = 0.0) -> Any:
    """Finish ``call`` from the cross-run cache: its value, journaled as a cached step
    inside a run (``saved``: seconds the execution that produced the entry took, kept in
    its record); ``_MISS`` when the value cannot be loaded (see
    :func:`~durably._runtime.step._load_cached`): the call is not finished, its body must
    run."""
    value = _load_cached(data, call.spec, call.store, call.key)
    if value is _MISS:
        return _MISS
    if type(value) is Effects:
        value = restored(call.spec.name, value, call.arguments or {}, call.spec)
    ctx = call.ctx
    if ctx is not None:
        record = call.record("cached", None, short_repr(value), saved=saved)
        ctx.note_cached(record, data)
        ctx.producers.returned(value, call.step_id)  # (a later step given it draws an edge)
        if ctx.listener is not None:
            ctx.emit(call.event("step_finished", record))
    return value


def _write_queued(ctx: RunContext) -> None:
    """Before a step that may be slow (its last execution was, or it never executed here)
    looks for its result: write the cache entries cheap steps queued, so that other
    processes see them while it executes instead of after it (the queue's time limit is
    only looked at when a cheap step queues an entry). A failure leaves them queued: the
    attempt's end writes them, or says why it cannot."""
    try:
        ctx.flush_cache()
    except Exception as exc:  # noqa: BLE001 - the journal has them; the end retries
        log.debug("durably: run %r: queued cache entries not written yet: %s", ctx.run_id,
                  exc)


def call_sync(spec: Spec, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
    try:
        value, call = begin_step(spec, instance, args, kwargs)
    except ReplayedFailure as replayed_failure:
        raise replayed_failure.error from None
    if value is not _MISS:
        return value
    return execute_sync(spec, call, wrapped, args, kwargs)


def execute_sync(spec: Spec, call: Call, wrapped: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    """The rest of :func:`call_sync` once :func:`begin_step` found no result: execute the
    body (under ``retry=`` / ``timeout=``) and finish ``call``."""
    if spec.retry is not None or spec.timeout is not None:
        return _call_with_policy(spec, call, wrapped, args, kwargs)
    call.enter()
    try:
        result = wrapped(*args, **kwargs)
    except InterruptSignal as signal:
        call.interrupted(signal)
        raise
    except BaseException as exc:
        call.failed(exc)
        raise
    finally:
        call.exit()
    return call.succeeded(result)


async def call_async(spec: Spec, wrapped: Callable[..., Any], instance: Any,
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        value, call = begin_step(spec, instance, args, kwargs)
    except ReplayedFailure as replayed_failure:
        raise replayed_failure.error from None
    if value is not _MISS:
        return value
    ctx = call.ctx
    # (asyncio is imported: this runs on its loop; not imported at `import durably`)
    me_task = sys.modules["asyncio"].current_task() if ctx is not None else None
    if me_task is not None and ctx is not None:
        ctx.inflight.add(me_task)
    try:
        if spec.retry is not None or spec.timeout is not None:
            return await _acall_with_policy(spec, call, wrapped, args, kwargs)
        return await _acall_body(call, wrapped, args, kwargs)
    finally:
        if me_task is not None and ctx is not None:
            ctx.inflight.discard(me_task)


async def _acall_body(call: Call, wrapped: Callable[..., Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
    call.enter()
    try:
        result = await wrapped(*args, **kwargs)
    except InterruptSignal as signal:
        call.interrupted(signal)
        raise
    except BaseException as exc:
        call.failed(exc)
        raise
    finally:
        call.exit()
    return call.succeeded(result)


_NEVER_RETRIED = (InterruptSignal, StopRun, KeyboardInterrupt, SystemExit)


def _last_try(policy: Retry | Retries, tries: int, exc: BaseException) -> bool:
    """Whether no other try follows a try that failed with ``exc`` (as ``retrying`` decides:
    the tries are used up, or ``exc`` is not retried)."""
    found = None if isinstance(exc, _NEVER_RETRIED) else policy.for_error(exc)
    return found is None or tries >= found.attempts


def _try_label(policy: Retry | Retries, tries: int, exc: BaseException) -> str:
    """What a failed try's error is prefixed with: which try it was, and, when no other
    follows though tries are left, why ("" without retries)."""
    if policy.attempts <= 1:
        return ""
    found = None if isinstance(exc, _NEVER_RETRIED) else policy.for_error(exc)
    if found is not None and tries > found.attempts:
        # several policies (retry=[...]): the tries so far are more than this error's
        # policy allows ("try 3 of 2" said nothing)
        return (f"try {tries}, not retried ({type(exc).__name__}'s policy allows "
                f"{found.attempts} tries in all)")
    label = f"try {tries} of {(found or policy).attempts}"
    if tries < policy.attempts and found is None:
        label += f", not retried ({type(exc).__name__} is not in on=)"
    return label


def _retry_asks_again(call: Call) -> None:
    """Before another try of a step: its ``interrupt()`` calls are counted from the first
    again, so a question answered before a try failed gets the same answer (the same
    interrupt id), instead of pausing the run to ask it a second time."""
    ctx = call.ctx
    if ctx is not None and call.step_id:
        with ctx._lock:
            ctx.interrupts.pop(call.step_id, None)


def _call_with_policy(spec: Spec, call: Call, wrapped: Callable[..., Any],
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Execute a body under ``retry=`` / ``timeout=``: every failed try is journaled."""
    policy = spec.retry or Retry(attempts=1)
    tries = 0
    result: Any = None
    for attempt in retrying(policy, _NEVER_RETRIED, is_async=False):
        with attempt:
            tries += 1
            if tries > 1:
                call.started = now()
                _retry_asks_again(call)
            call.enter()
            try:
                if spec.timeout is not None:
                    result = call_with_timeout(spec.name, spec.timeout, wrapped, args, kwargs)
                else:
                    result = wrapped(*args, **kwargs)
            except InterruptSignal as signal:
                call.interrupted(signal)
                raise
            except BaseException as exc:
                call.failed(exc, _try_label(policy, tries, exc), _last_try(policy, tries, exc))
                raise
            finally:
                call.exit()
    return call.succeeded(result)


async def _acall_with_policy(spec: Spec, call: Call, wrapped: Callable[..., Any],
                             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    policy = spec.retry or Retry(attempts=1)
    tries = 0
    result: Any = None
    async for attempt in retrying(policy, _NEVER_RETRIED, is_async=True):
        with attempt:
            tries += 1
            if tries > 1:
                call.started = now()
                _retry_asks_again(call)
            call.enter()
            try:
                if spec.timeout is not None:
                    result = await await_with_timeout(spec.name, spec.timeout,
                                                      wrapped(*args, **kwargs))
                else:
                    result = await wrapped(*args, **kwargs)
            except InterruptSignal as signal:
                call.interrupted(signal)
                raise
            except BaseException as exc:
                call.failed(exc, _try_label(policy, tries, exc), _last_try(policy, tries, exc))
                raise
            finally:
                call.exit()
    return call.succeeded(result)
