"""A task call in progress (:class:`Call`): its step record and events, and how it ends,
journaled and cached (:meth:`~Call.succeeded`, :meth:`~Call.failed`,
:meth:`~Call.interrupted`); and the loading of journaled and cached results.

Apart from the call path (:mod:`durably._runtime.call`), which decides whether a call is
replayed, served from the cache or executed: this is what a call that executes (a plain
call, or an item of a fan-out, finished in the caller's thread) ends with, and what
keep_finished loads older results with.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

from durably._keys import layouts as _layouts
from durably._keys import serde as _serde
from durably._keys.files import File, file_stamp
from durably._keys.layouts import Storage
from durably._runtime.context import RunContext, current_step
from durably._runtime.context import user_stacklevel as _user_stacklevel
from durably._runtime.effects import Effects, changed, warn_once
from durably._runtime.failures import note as note_failure
from durably._runtime.failures import raised_event, replayable
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.spec import Spec
from durably._store.lease import _pid
from durably._store.records import StepRecord, now
from durably._trace.producers import source_token
from durably._trace.tracer import Event, flow_digests, inputs_repr, short_repr
from durably.exceptions import DefinitionError, SerializationError
from durably.store import Store, value_bytes

__all__ = ["Call"]

log = logging.getLogger("durably")
#: seconds: a step slower than this writes its cache entry at once (two transactions, about
#: 0.2 ms: under 0.2 % of such a step); quicker ones queue theirs (see RunContext.cache_later),
#: written together within a second (at 10 ms, the write of a file-sized step cost 2 % of it)
_WRITE_THROUGH = 0.1


def _load(data: bytes, spec: Spec, where: str) -> Any:
    try:
        return _serde.loads(data)
    except Exception as exc:  # noqa: BLE001 - report as ours, with the way out
        raise SerializationError(
            f"cannot load the {where} result of task {spec.name!r}: {exc!r}. Either the code "
            "that defines its type changed incompatibly since it was stored, or the value "
            "cannot be unpickled at all (its class's __reduce__ or __init__: a value must "
            "load back as it was pickled). Fix: restore the code and call again, or fix the "
            "class and start a new run (fresh=True)."
        ) from None


#: cache keys whose stored value could not be loaded, in this process: their results are
#: not cached again here (they would not load either), so a value that never loads back
#: costs one warning and one set-aside copy, not one of each per call
_UNLOADABLE: set[str] = set()
#: failures to load that may be this process's, not the value's (a module it cannot import,
#: a class it does not have, a file it cannot read, its memory): the entry is kept
_NOT_THE_VALUE = (ImportError, AttributeError, OSError, MemoryError, RecursionError)


def _loads_back(key: str, data: bytes) -> bool:
    """Whether the new value of a key whose stored value did not load back in this process
    loads back (its class's code was fixed, or changed its format): then it is cached again
    (and the key no longer held back)."""
    try:
        _serde.loads(data)
    except Exception:  # noqa: BLE001 - it does not either: not cached
        return False
    _UNLOADABLE.discard(key)
    return True


def _load_cached(data: bytes, spec: Spec, store: Store, key: str) -> Any:
    """The value of a cache entry, or ``_MISS`` when it cannot be loaded here: a cache
    entry is never worth a failure, so the task executes again.

    - When this process cannot load it (a module it cannot import, a class that moved or is
      gone, a file it cannot read, its memory: see ``_NOT_THE_VALUE``), a warning names
      the task, the key and the reason; the new result replaces the entry.
    - When the value itself does not load back (its class's ``__reduce__`` or ``__init__``
      does not take back what it pickled), the entry is set aside (a store that can:
      ``discard_cache``) with a warning naming the task; its new results are cached again
      once one loads back (a class whose code fixed or changed its format), not while they
      do not (see :func:`_loads_back`)."""
    try:
        return _serde.loads(data)
    except _NOT_THE_VALUE as exc:
        warnings.warn(
            f"durably: the cached result of task {spec.name!r} (key {key}) cannot be loaded "
            f"in this process: {exc!r}. It cannot import or find what the value is made of "
            "(a class that moved or was renamed, a package that is not installed), or lacks "
            "the memory. The task executes again and its new result replaces the entry. Fix, "
            "if this is unexpected: import or install what it needs, or restore the code.",
            stacklevel=_user_stacklevel())
        return _MISS
    except Exception as exc:  # noqa: BLE001 - the value does not load back: not served
        _UNLOADABLE.add(key)
        why = (f"the result of task {spec.name!r} cannot be loaded ({exc!r}: it does not "
               "unpickle as it was pickled: its class's code changed its format, or the "
               "value is damaged); the task executes again, and its new result is cached "
               "once it loads back")
        store.discard_cache(key, why, data)
        return _MISS


def _dump(result: Any, what: str, storage: Storage | None) -> bytes:
    if storage is None:
        return _serde.dumps(result, what=what)
    return _layouts.dumps_as(result, storage, what=what)


def _mapped_result(data: bytes, files: bool) -> Any:
    """The result a task with ``mmap=True`` returns when it executes, as its hits will
    return it, not the arrays its body made: the memory maps of the file just written, for
    a store that keeps large values in files (``files``), else read-only arrays over the
    value's bytes (what such a store's hits give)."""
    loaded = _serde.loads(data if files else value_bytes(data))
    return loaded.result if type(loaded) is Effects else loaded


class Call:
    """One task call in progress: what :func:`~durably._runtime.call.begin_step` found, to
    finish it with."""

    __slots__ = (
        "args_repr",
        "arguments",
        "classes",
        "code",
        "ctx",
        "ended",
        "files",
        "flow",
        "inputs",
        "key",
        "mutable",
        "parent",
        "path",
        "path_head",
        "position",
        "sources",
        "spec",
        "started",
        "step_id",
        "store",
        "token",
    )

    def __init__(self, spec: Spec, ctx: RunContext | None, store: Store, key: str,
                 code: str = "", parent: str | None = None, step_id: str = "",
                 position: int = 0, started: float = 0.0) -> None:
        self.spec = spec
        self.ctx = ctx
        self.store = store
        self.key = key
        self.code = code  # the code version the key was made with
        self.inputs: dict[str, str] = {}  # digest of each argument, for the key record
        self.classes: dict[str, str] | None = None  # code of their user classes (the same)
        self.step_id = step_id
        self.parent = parent
        self.position = position
        self.started = started
        self.token: Any = None
        self.args_repr: str | None = None  # tracer: short repr of the arguments
        self.flow: tuple[str, ...] = ()  # tracer: digests a producing step's result may match
        #: tracer: the steps that produced its arguments (see durably._trace.producers), as
        #: entries of its record's input_digests
        self.sources: tuple[str, ...] = ()
        self.ended: float | None = None  # when the body ended, if it ran elsewhere (a fan-out)
        #: what its call path is made of (see call_path): its input digest and its
        #: occurrence (its task's identity is its spec's); None outside a run
        self.path_head: tuple[str, int] | None = None
        self.path: str | None = None  # its call path, once a nested side effect asked
        #: the durably.file() inputs of a body about to run (see _file_inputs)
        self.files: list[tuple[File, Any]] | None = None
        #: the call's bound arguments, once bound (a hit puts back what the body changed)
        self.arguments: dict[str, Any] | None = None
        #: the arguments the body may change in place, with their digests from before it
        #: (see _effects); None when none can change
        self.mutable: tuple[list[tuple[str, Any]], dict[str, str]] | None = None

    def files_changed(self) -> bool:
        """Whether a durably.file() input (an argument, or a global checked by contents)
        changed on disk while the body ran: then what it read may be either version, and
        its result is not cached under the key of the version before."""
        if not self.files:
            return False
        changed = [f for f, stamp in self.files if file_stamp(f) != stamp]
        if changed:
            log.info("durably: %s %r: %s changed while it executed; its result is not cached",
                     self.spec.kind, self.spec.name, changed[0])
        return bool(changed)

    def record(self, status: str, error: str | None = None, output: str | None = None,
               result_digest: str = "", output_digests: tuple[str, ...] = (),
               saved: float = 0.0) -> StepRecord:
        ctx = self.ctx
        assert ctx is not None
        return StepRecord(
            ctx.run_id, self.step_id, self.parent, self.spec.name, status, ctx.attempt,
            self.position, self.started, self.ended if self.ended is not None else now(),
            error, self.key if self.spec.cache else "",
            self.args_repr, output, result_digest,
            self.flow + self.sources if self.sources else self.flow, output_digests, saved,
        )

    def trace_inputs(self, arguments: dict[str, Any], each: dict[str, str] | None = None,
                     taken: dict[str, list[str | None]] | None = None) -> None:
        """Take the tracer's view of the arguments (before the body may mutate them);
        ``each``: their digests, when known (else ``self.inputs``, else taken here);
        ``taken``: their elements' digests taken with the key (see flow_digests)."""
        if self.args_repr is None:  # a listener may have taken it already
            self.args_repr = inputs_repr(arguments)
        self.flow = flow_digests(arguments, self.inputs or each or None, taken)
        ctx = self.ctx
        if ctx is not None:
            found = ctx.producers.sources(arguments)
            if found:
                self.sources = tuple(source_token(s) for s in found)

    def event(self, kind: str, record: StepRecord | None = None, **fields: Any) -> Event:
        ctx = self.ctx
        assert ctx is not None
        if record is None:
            return Event(kind, ctx.run_id, now(), self.step_id, self.parent, self.spec.name,
                         inputs=self.args_repr, attempt=ctx.attempt, **fields)
        return Event(kind, ctx.run_id, record.ended, self.step_id, self.parent,
                     self.spec.name, record.status, record.duration, record.inputs,
                     record.output, attempt=ctx.attempt, **fields)

    def enter(self) -> None:
        """Make this step the parent of the tasks its body calls."""
        ctx = self.ctx
        if ctx is not None:
            self.token = current_step.set(self.step_id)
            if ctx.foreign:  # (a thread joined the run: see _threads)
                ctx.open.enter(ctx, self.step_id, self)
            else:
                ctx.open[self.step_id] = self

    def exit(self) -> None:
        if self.token is not None:
            current_step.reset(self.token)
            self.token = None
            if self.ctx is not None:
                self.ctx.open.pop(self.step_id, None)

    def failed(self, exc: BaseException, tries: str = "", final: bool = True) -> None:
        """Journal a failed step (never cached); the exception then propagates unchanged.
        ``tries`` ("try 1 of 3") prefixes the error of a task with ``retry=``; ``final``:
        no other try follows, so the exception leaves the call. A final failure is part of
        the run's history: its exception is journaled too (a ``step_raised`` event), and a
        later attempt raises it again instead of executing the step, unless it is the
        failure that ended the run (see :mod:`durably._runtime.failures`)."""
        ctx = self.ctx
        if ctx is None or not isinstance(exc, Exception) or ctx.pid != _pid[0]:
            return  # (a process forked inside the run, unwinding: the run is its parent's)
        if ctx.uncacheable and self.step_id in ctx.uncacheable and self.parent is not None:
            ctx.uncacheable.add(self.parent)  # a caller catching it depends on the answer too
        try:
            error = f"{tries}: {exc!r}" if tries else repr(exc)
            record = self.record("failed", error[:2000])
            ctx.journal([(record, None)])
            if final and replayable(exc) and not ctx.lost:
                # after its record, which only the run's holder can write (fenced); with the
                # arguments its body changed in place before it raised (see _effects)
                moved = changed(self.spec.name, self.mutable[1], self.mutable[0]) if (
                    self.mutable is not None) else None
                ctx.store.append_events([raised_event(
                    ctx.run_id, ctx.attempt, self.step_id, record.ended, self.spec.name, exc,
                    moved or None)])
                note_failure(ctx.failures, exc, self.step_id)
            ctx.count("failed")
            if ctx.listener is not None:
                ctx.emit(self.event("step_failed", record, data=record.error))
        except Exception as store_exc:  # noqa: BLE001 - never hide the user's exception
            exc.add_note(f"durably: could not journal this failure: {store_exc}")

    def _stored(self, result: Any, storage: Storage | None = None) -> bytes:
        """The bytes stored for ``result`` (in the layout ``storage`` asks for): with the
        new state of the arguments the body changed in place (see _effects), when any did."""
        what = f"the result of task {self.spec.name!r}"
        if self.mutable is not None:  # (None: succeeded() pickles the result itself)
            moved = changed(self.spec.name, self.mutable[1], self.mutable[0])
            if moved:
                try:
                    return _dump(Effects(result, moved), what, storage)
                except SerializationError:
                    warn_once(self.spec.name, tuple(moved), "the new state cannot be pickled",
                              self.spec)
        return _dump(result, what, storage)

    def interrupted(self, signal: InterruptSignal) -> None:
        """Journal a step that called ``interrupt()`` (it runs again from its start when the
        run resumes) and name it in the signal's interrupts."""
        signal.interrupts = [
            dataclasses.replace(i, task=self.spec.name)
            if i.step_id == self.step_id and not i.task else i
            for i in signal.interrupts
        ]
        ctx = self.ctx
        if ctx is None or ctx.pid != _pid[0]:
            return
        record = self.record("interrupted")
        ctx.journal([(record, None)])
        if ctx.listener is not None:
            ctx.emit(self.event("step_interrupted", record, data=signal.interrupts))

    def succeeded(self, result: Any) -> Any:
        """Store the result in the cache and the journal (committed), then return it."""
        spec = self.spec
        storage = spec.storage  # (mmap=, compress=: see _layouts)
        if storage is None and self.store.compress_level is not None:
            storage = _layouts.store_storage(self.store.compress_level)
        try:
            if storage is not None:
                data = self._stored(result, storage)
                if storage.mmap:  # the arrays the hits will return (joblib does too)
                    result = _mapped_result(data, "large_values" in self.store.capabilities)
            elif self.mutable is not None:
                data = self._stored(result)
            else:
                data = _serde.dumps(result, what=f"the result of task {spec.name!r}")
        except SerializationError as exc:
            self.failed(exc)  # journaled (and streamed) as the step's failure
            raise
        ctx = self.ctx
        if ctx is None or ctx.pid != _pid[0]:  # outside a run (or a process forked inside it)
            if spec.cache and (ctx is None or self.step_id not in ctx.uncacheable) and not (
                    spec.changed_in_place()) and not self.files_changed() \
                    and not (_UNLOADABLE and self.key in _UNLOADABLE
                             and not _loads_back(self.key, data)) and (
                    spec.policy is None or spec.policy.admits(
                        spec, self.store, self.key, result, now() - self.started)):
                self.store.cache_put(self.key, data, spec.key_record(
                    self.key, self.inputs, self.code or None, self.classes,
                    now() - self.started))
            return result
        record = self.record("ran", None, short_repr(result))
        cacheable = spec.cache and not spec.changed_in_place() and not self.files_changed() \
            and not (_UNLOADABLE and self.key in _UNLOADABLE and not _loads_back(self.key, data))
        if ctx.uncacheable and self.step_id in ctx.uncacheable:
            cacheable = False  # it depends on an answer to interrupt()
            if self.parent is not None:
                ctx.uncacheable.add(self.parent)
        slow = spec.slow = record.ended - record.started >= _WRITE_THROUGH
        if cacheable and spec.policy is not None:
            try:  # (cache_if=: given the duration the record shows)
                cacheable = spec.policy.admits(spec, self.store, self.key, result,
                                               record.ended - record.started)
            except DefinitionError as exc:
                self.failed(exc)  # journaled as the step's failure: the next attempt runs it
                raise
        if cacheable:
            info = spec.key_record(self.key, self.inputs, self.code or None, self.classes,
                                   record.ended - record.started)
            if slow or ctx.codes.get(spec) != self.code:
                # (a task's first entry under a code version in an attempt is written at
                # once, with its key record: what keep_finished=True finds the code versions
                # of older steps by, which a SIGKILL before the batched writes would lose)
                ctx.codes[spec] = self.code
                self.store.cache_put(self.key, data, info)
            else:  # cheap step: batch its cache write (the journal entry below is immediate)
                ctx.cache_later(self.key, data, info)
        ctx.journal([(record, data)])
        ctx.count("ran")
        ctx.producers.returned(result, self.step_id)  # (a later step given it draws an edge)
        if ctx.listener is not None:
            ctx.emit(self.event("step_finished", record))
        return result


_MISS = object()
