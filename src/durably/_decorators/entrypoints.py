"""``@entrypoint``: :class:`Entrypoint`, the wrapper whose every call is a durable run with
a journal, :class:`BoundEntrypoint`, the decorator :func:`entrypoint`, and :func:`fork`,
which finds a run's entrypoint by the run's id.

An entrypoint begins a run, calls its function, and ends the attempt (:mod:`.attempt`);
``run``, ``stream`` (:mod:`.stream`), ``resume`` and ``fork`` are the ways in. Separate
from :mod:`.task`: a task is a step of a run, an entrypoint is the run.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, ParamSpec, TypeVar, overload

import wrapt

from durably._decorators import threads as _threads
from durably._decorators.attempt import (
    _as_interrupt,
    _handle,
    _paused,
    _raise_if_cancelled,
    _require_interrupted,
    _settle,
    _settle_submitted,
)
from durably._decorators.pickling import _ByReference, _reduce_bound
from durably._decorators.stream import _AsyncStream, _stream_async, _stream_sync
from durably._decorators.wrapper import _check_bare, _describe, _instance_of
from durably._keys import serde as _serde
from durably._runtime.attempt import Started, begin_run, end_run, validate_run_id
from durably._runtime.cancel import Timeout, on_cancel
from durably._runtime.config import default_store
from durably._runtime.context import live_run
from durably._runtime.history import NO_UPDATE, make_fork, unused_update
from durably._runtime.interrupt import pending_interrupts, record_answers, refuse_no_answer
from durably._runtime.keep import keep_finished as keep_in
from durably._runtime.run import Run
from durably._runtime.spec import Spec
from durably._store.records import RunRecord
from durably._trace.tracer import Event, RunGraph
from durably.exceptions import (
    DefinitionError,
    DurablyError,
    NotFoundError,
    RunBusyError,
    RunStateError,
)
from durably.store import Store

__all__ = ["Entrypoint", "entrypoint", "fork"]

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from wrapt import FunctionWrapper as _Wrapper
else:
    from durably._decorators.wrapper import _Wrapper


class BoundEntrypoint(wrapt.BoundFunctionWrapper):  # type: ignore[type-arg]
    """An entrypoint bound to an instance or class; ``.run`` works as on
    :class:`Entrypoint`."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return _reduce_bound(self)

    def __repr__(self) -> str:
        return _describe("Entrypoint", self._self_parent._self_spec)

    def run(self, *args: Any, run_id: str | None = None, fresh: bool = False,
            keep_finished: bool = False, thread: str | None = None, **kwargs: Any) -> Any:
        """See :meth:`Entrypoint.run`."""
        parent = self._self_parent
        runner = parent._self_arun if parent._self_spec.is_async else parent._self_srun
        thread = _threads.thread_option(thread, run_id, fresh)
        return runner(self.__wrapped__, _instance_of(self), args, kwargs, run_id, fresh, True,
                      keep_finished=_keep_option(keep_finished), thread=thread)

    def stream(self, *args: Any, run_id: str | None = None, fresh: bool = False,
               thread: str | None = None, **kwargs: Any) -> Any:
        """See :meth:`Entrypoint.stream`."""
        return self._self_parent._self_stream(self.__wrapped__, _instance_of(self), args,
                                              kwargs, run_id, fresh,
                                              thread=_threads.thread_option(thread, run_id,
                                                                            fresh))

    def resume(self, run_id: str, value: Any = None, *, keep_finished: bool = False) -> Any:
        """See :meth:`Entrypoint.resume`."""
        return self._self_parent._self_resume(self.__wrapped__, _instance_of(self), run_id,
                                              value, keep_finished=keep_finished)

    def stream_resume(self, run_id: str, value: Any) -> Any:
        """See :meth:`Entrypoint.stream_resume`."""
        parent = self._self_parent
        args, kwargs, answer = parent._self_answering(run_id, value)
        return parent._self_stream(self.__wrapped__, _instance_of(self), args, kwargs, run_id,
                                   False, answer)

    def fork(self, run_id: str, at: str | None = None, update: Any = NO_UPDATE, *,
             cache: bool = False) -> Any:
        """See :meth:`Entrypoint.fork`."""
        return self._self_parent._self_fork(self.__wrapped__, _instance_of(self), run_id, at,
                                            update, cache)

    def graph(self, *, collapse: int | None = 20) -> RunGraph:
        """See :meth:`Entrypoint.graph`."""
        graph: RunGraph = self._self_parent.graph(collapse=collapse)
        return graph


def _waited(message: str) -> str:
    """A RunBusyError's message for a call that waited its ``wait=`` seconds: without the
    advice to pass ``wait=``, saying it waited."""
    for advice in (" (or @entrypoint(wait=seconds) to wait for it and return its result)",
                   "; @entrypoint(wait=seconds) waits for you",
                   ", or give the entrypoint @entrypoint(wait=seconds) to wait for it"):
        message = message.replace(advice, "")
    return (message + " This call waited its wait= seconds for it first: give wait= more "
            "seconds to wait longer.")


class _Pauses:
    """The waits of a call that found its run executed by another (``wait=`` seconds in all):
    short first (a duplicate request often arrives just behind the first), then up to a
    quarter second; None once the time is up."""

    __slots__ = ("deadline", "delay", "kwargs", "target", "thread")

    def __init__(self, wait: float | None, thread: str | None = None,
                 kwargs: Any = None) -> None:
        self.deadline = None if wait is None else time.monotonic() + wait
        self.delay = 0.005
        self.thread = thread
        self.kwargs = kwargs  # the keyword arguments of the call (a thread's previous added)
        self.target: str | None = None  # the existing run a thread call continues

    def next(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            return None
        delay, self.delay = min(self.delay, left), min(self.delay * 2, 0.25)
        return delay

    def begin(self, spec: Spec, instance: Any, args: Any, kwargs: Any, run_id: str | None,
              fresh: bool, listener: Any, read_cache: bool, store: Store | None,
              on_lease: Any) -> Started | float:
        """The run begun, or the seconds to wait before trying again (another call executes
        it, and ``wait=`` has time left).

        Raises:
            RunBusyError: another call executes it, and no ``wait=`` time is left.
        """
        thread = self.thread
        try:
            if thread is not None:
                run_id, fresh = self._thread_run(spec, instance, args, kwargs, store)
                kwargs = self.kwargs
            try:
                return begin_run(spec, instance, args, kwargs, run_id=run_id, fresh=fresh,
                                 listener=listener, read_cache=read_cache, store=store,
                                 on_lease=on_lease, thread=thread)
            except RunBusyError:
                raise
            except RunStateError:
                st = store or spec.store or default_store()
                if thread is None or self.target is not None or run_id is None or not (
                        _threads.taken(spec, thread, st.find_run(run_id))):
                    raise
                # another call on the thread took this number first (with other arguments):
                # this call is the thread's next one after all, found again at once (refused
                # as busy only if that call executes still, as any call on the thread is)
                return 0.0
        except RunBusyError as exc:
            delay = self.next()
            if delay is None:
                if self.deadline is not None:  # (waited: its advice to wait= is no news)
                    raise RunBusyError(_waited(str(exc)), exc.run_id) from None
                raise
            return delay

    def _thread_run(self, spec: Spec, instance: Any, args: Any, kwargs: Any,
                    store: Store | None) -> tuple[str, bool]:
        """The run a call on :attr:`thread` begins (see :func:`.threads.resolve`); a call
        that waits for the thread's latest call, being the same call, keeps waiting for that
        one."""
        assert self.thread is not None
        if self.target is None:
            st = store or spec.store or default_store()
            run_id, self.kwargs, existing = _threads.resolve(spec, st, self.thread, instance,
                                                             args, kwargs)
            if existing:
                self.target = run_id
            return run_id, False
        return self.target, False


class Entrypoint(_ByReference, _Wrapper[P, R]):
    """A top-level function whose every call is a durable run with a journal.

    Made by :func:`entrypoint`. Calling it returns the plain result; :meth:`run` returns
    the :class:`~durably.Run` handle. Called inside another run, it runs inline as part of
    that run.
    """

    __bound_function_wrapper__ = BoundEntrypoint

    def __init__(self, func: Callable[P, R], spec: Spec) -> None:
        super().__init__(func, self._self_call)
        self._self_spec = spec
        self._self_wait: float | None = None  # (@entrypoint(wait=...))
        self._self_timeout: float | None = None  # (@entrypoint(timeout=...)): seconds
        _ENTRYPOINTS[spec.identity] = self

    def __repr__(self) -> str:
        return _describe("Entrypoint", self._self_spec)

    @property
    def spec(self) -> Spec:
        """The entrypoint's identity and options."""
        spec: Spec = self._self_spec
        return spec

    def map(self, *iterables: Any, **options: Any) -> NoReturn:
        """Not available: each call of an entrypoint is a run of its own.

        Raises:
            DefinitionError: always, saying what to do instead.
        """
        raise DefinitionError(
            f"entrypoint {self._self_spec.name!r} has no map(): each call of an entrypoint "
            "is a run of its own. Fix: make the per-item work a @durably.task and call "
            "task.map(...) inside one entrypoint (one run, one journal), or call the "
            "entrypoint in a loop (one run per item).")

    def _self_call(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if live_run() is not None:  # inside a run: a plain call
            return wrapped(*args, **kwargs)
        options = [n for n in ("thread", "run_id", "fresh") if n in kwargs]
        if options and not any(p.kind is p.VAR_KEYWORD
                               for p in self._self_spec.signature.parameters.values()):
            name = self._self_spec.name.rsplit(".", 1)[-1]
            raise DefinitionError(
                f"{self._self_spec.name}(..., {options[0]}=...): a plain call of an entrypoint "
                f"takes only its own arguments; {options[0]}= is an option of its runs. Fix: "
                f"call {name}.run(..., {options[0]}=...) (its .result is what the plain call "
                "returns), or .stream(...).")
        if self._self_spec.is_async:
            return self._self_arun(wrapped, instance, args, kwargs, None, False, False)
        return self._self_srun(wrapped, instance, args, kwargs, None, False, False)

    def run(self, *args: Any, run_id: str | None = None, fresh: bool = False,
            keep_finished: bool = False, thread: str | None = None, **kwargs: Any) -> Run[R]:
        """Call the entrypoint as a run and return its handle.

        With the default ``run_id``, the run's id is derived from the entrypoint and a digest
        of its arguments, so calling again with the same arguments continues the same run:
        steps it finished are replayed from its journal, and only steps whose code or inputs
        changed execute. (Precisely: the latest run of the entrypoint with these arguments,
        one started with ``fresh=True`` or a ``run_id`` too; not a fork.) An async
        entrypoint returns a coroutine of the handle.

        Args:
            *args: The entrypoint's positional arguments.
            run_id: Continue or start the run with this id (1 to 200 letters, digits and
                ``. _ : @ + = -``). A run id belongs to one entrypoint and one set of
                arguments.
            fresh: Start a new run even if one with these arguments exists.
            keep_finished: False (default): a resumed run replays exactly the steps whose
                task, inputs and code are unchanged. True: a step it finished under an older
                version of its task's code (the bug fixed after a crash) is kept: matched by
                task, inputs and occurrence, its result is replayed and only the rest
                executes with today's code. Kept steps are ``cached`` records whose
                ``kept_from`` names the record they kept; they are not written to the cache.
            thread: A conversation thread (1 to 100 letters, digits and ``. _ : + = -``):
                the call is the thread's next run (id ``<name>-<digest>@<thread>.<n>``), and the
                entrypoint's keyword-only ``previous`` parameter receives what the thread's
                last finished call saved (its result, or the ``save`` of the
                :class:`~durably.Final` it returned; on the first call, the parameter's
                default), as LangGraph's functional API. The same arguments as the thread's
                unfinished latest call (crashed, failed, stopped) continue that run. Not
                with ``run_id`` or ``fresh``. See the how-to "Hold a conversation on a
                thread".
            **kwargs: The entrypoint's keyword arguments.

        Returns:
            The :class:`~durably.Run` (``.id``, ``.status``, ``.result``, ``.steps``).

        Raises:
            RunStateError: ``run_id`` names a run of another entrypoint or other arguments,
                or exists while ``fresh=True``; ``thread``'s latest call waits for an
                answer to its ``interrupt()`` and this call has other arguments.
            RunBusyError: another call executes this run, or (with ``thread``) a call on the
                thread, right now, and ``@entrypoint(wait=...)`` gave no time to wait.
            DefinitionError: ``run_id`` or ``thread`` is not a valid id, ``thread`` is given
                with ``run_id`` or ``fresh``, or ``previous`` is given with ``thread``.
            SerializationError: an argument cannot be digested.

        Exceptions raised by the entrypoint or its tasks propagate unchanged (with a note
        naming the run); the run is recorded as failed and a rerun retries it.

        Example:
            >>> import durably, tempfile
            >>> store = durably.DiskStore(tempfile.mkdtemp())
            >>> @durably.task
            ... def double(x):
            ...     return 2 * x
            >>> @durably.entrypoint(store=store)
            ... def pipeline(n):
            ...     return sum(double(i) for i in range(n))
            >>> run = pipeline.run(3)
            >>> run.status, run.result, [s.status for s in run.steps]
            ('finished', 6, ['ran', 'ran', 'ran'])
            >>> [s.status for s in pipeline.run(3).steps]
            ['replayed', 'replayed', 'replayed']
        """
        wrapped = self.__wrapped__
        keep = _keep_option(keep_finished)
        thread = _threads.thread_option(thread, run_id, fresh)
        if self._self_spec.is_async:
            return self._self_arun(  # type: ignore[return-value]
                wrapped, None, args, kwargs, run_id, fresh, True, keep_finished=keep,
                thread=thread)
        run: Run[R] = self._self_srun(wrapped, None, args, kwargs, run_id, fresh, True,
                                      keep_finished=keep, thread=thread)
        return run

    def stream(self, *args: Any, run_id: str | None = None, fresh: bool = False,
               thread: str | None = None, **kwargs: Any) -> Iterator[Event]:
        """Call the entrypoint as a run and yield its events as they happen.

        Events (:class:`~durably.Event`) come in order: ``run_started``; for each step
        ``step_started`` then ``step_finished`` (status ``ran``, ``cached`` or
        ``replayed``), ``step_failed`` or ``step_interrupted``; ``custom`` events written with
        :func:`durably.get_writer`; and last ``run_finished`` (``data`` is the result),
        ``run_failed``, ``run_interrupted`` (``data`` is the list of interrupts) or
        ``run_stopped``. The run executes in a worker thread while you iterate; for an async
        entrypoint this returns an async iterator (``async for``) and the run is an asyncio
        task.

        Breaking out of the loop stops the run at its next step boundary (the step running
        at that moment finishes first) and records it as ``stopped``; calling the entrypoint
        again with the same arguments resumes it. A run that fails raises its exception from
        the loop after the ``run_failed`` event. A sync stream runs in lockstep with your
        loop (the run waits while you handle an event); an async one runs ahead until it
        awaits — close it promptly with ``contextlib.aclosing``; a cancelled run is recorded
        as ``stopped`` too.

        Args:
            *args: The entrypoint's positional arguments.
            run_id: As for :meth:`run`.
            fresh: As for :meth:`run`.
            thread: As for :meth:`run`.
            **kwargs: The entrypoint's keyword arguments.

        Returns:
            An iterator of :class:`~durably.Event` (async iterator for async entrypoints).

        Raises:
            RunStateError: as for :meth:`run`.

        Example:
            >>> import durably, tempfile
            >>> @durably.task
            ... def double(x):
            ...     return 2 * x
            >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
            ... def pipeline(n):
            ...     return double(n) + 1
            >>> for e in pipeline.stream(4):
            ...     print(e.kind, e.task, e.status or "-")
            run_started pipeline new
            step_started double -
            step_finished double ran
            run_finished pipeline finished
        """
        return self._self_stream(self.__wrapped__, None, args, kwargs, run_id,  # type: ignore[no-any-return]
                                 fresh, thread=_threads.thread_option(thread, run_id, fresh))

    def resume(self, run_id: str, value: Any = None, *, keep_finished: bool = False) -> R:
        """Answer the pending ``interrupt()`` of a run and continue it; return its result.

        The answers are journaled before the run continues. The run then executes again
        from the start of the entrypoint: finished steps are replayed from the journal, the
        task that called ``interrupt()`` runs again from its start, and the ``interrupt()``
        call returns ``value``. Works from any process that can import the entrypoint (the
        run's arguments are read from the store). An async entrypoint returns a coroutine.

        Args:
            run_id: The interrupted run (``RunInterrupted.run_id``).
            value: The answer (required: None is refused, so that an approval is never
                given by accident; unless every question of the run was answered already,
                from ``durably ui``'s form, which journals answers without resuming). When
                several interrupts are pending (parallel branches), a mapping
                ``{interrupt_id: value}``; answering only some keeps the rest pending (the
                run pauses again at them). A web handler answers by
                id, ``{interrupt_id: value}``, so that a form sent twice cannot answer the
                run's next question.
            keep_finished: As for :meth:`run`. With it, a run that is not interrupted
                (crashed, failed, stopped) is continued from its stored arguments, given
                no ``value``: ``pipeline.resume(run_id, keep_finished=True)``.

        Returns:
            The entrypoint's result.

        Raises:
            RunInterrupted: the run paused again (another or a still unanswered interrupt).
            RunStateError: the run is not interrupted (the message says its status), it
                belongs to another entrypoint, or ``value`` does not say which interrupt it
                answers.
            NotFoundError: no run with that id.
            DefinitionError: ``value`` is None (no answer).

        Example:
            >>> import durably, tempfile
            >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
            ... def approve(doc):
            ...     verdict = durably.interrupt({"review": doc})
            ...     return f"{doc}: {verdict}"
            >>> run = approve.run("draft-1")
            >>> run.status, run.interrupts[0].payload
            ('interrupted', {'review': 'draft-1'})
            >>> approve.resume(run.id, "approved")
            'draft-1: approved'
        """
        return self._self_resume(self.__wrapped__, None, run_id, value,  # type: ignore[no-any-return]
                                 keep_finished=keep_finished)

    def stream_resume(self, run_id: str, value: Any) -> Iterator[Event]:
        """Answer the pending ``interrupt()`` of a run, continue it, and yield its events as
        they happen (:meth:`resume` as :meth:`stream` runs a call: a chat answering a
        question shows what the resumed run does). An async entrypoint gives an async
        iterator.

        Args:
            run_id: The interrupted run.
            value: The answer, as for :meth:`resume`.

        Yields:
            :class:`~durably.Event` objects, as :meth:`stream` yields them.

        Raises:
            RunStateError, NotFoundError, DefinitionError: as for :meth:`resume` (at the
                call, before the first event).

        Example:
            >>> import durably, tempfile
            >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
            ... def approve(doc):
            ...     return f"{doc}: {durably.interrupt({'review': doc})}"
            >>> run = approve.run("draft-2")
            >>> [e.data for e in approve.stream_resume(run.id, "ok") if e.kind == "run_finished"]
            ['draft-2: ok']
        """
        args, kwargs, answer = self._self_answering(run_id, value)
        events: Iterator[Event] = self._self_stream(self.__wrapped__, None, args, kwargs,
                                                    run_id, False, answer)
        return events

    def fork(self, run_id: str, at: str | None = None, update: Any = NO_UPDATE, *,
             cache: bool = False) -> Run[R]:
        """Start a new run from a checkpoint of an earlier run, and execute it.

        The new run's journal holds the source run's finished steps up to the checkpoint
        (and the answers to earlier interrupts); executing it replays those and executes
        everything after the checkpoint with today's code — the way to replay from a bad
        decision with a changed prompt, router or answer. The source run is never modified.

        Args:
            run_id: The source run.
            at: A checkpoint id from ``run.history()`` (or a unique prefix of 6+
                characters); ``""`` for the run's input, before its first step (every step
                executes anew). Default: the latest checkpoint.
            update: For a step checkpoint, a new result for that step; for an interrupt
                checkpoint, the (new) answer to that interrupt. Default: none (an interrupt
                checkpoint is then pending again, and the fork pauses there). Steps are found
                by task, inputs and (cached tasks) code: a step before the checkpoint whose
                code or inputs changed since executes again in the fork, and so does the
                checkpoint step itself, in which case the update is not used.
            cache: False (default): steps after the checkpoint execute even if the
                cross-run cache has their result. True: they may be served from the cache.

        Returns:
            The fork's :class:`~durably.Run` (status ``finished``, or ``interrupted``).

        Raises:
            NotFoundError: no such run or checkpoint.
            RunStateError: the run belongs to another entrypoint, or is running right now.

        Exceptions raised by the fork's steps propagate unchanged (the fork is recorded as
        failed and can be resumed like any run).
        """
        return self._self_fork(self.__wrapped__, None, run_id, at, update, cache)  # type: ignore[no-any-return]

    def graph(self, *, collapse: int | None = 20) -> RunGraph:
        """The graph of this entrypoint's most recently updated run (its latest attempt).

        Args:
            collapse: More than this many calls of one task under one parent draw as one
                node (``parse ×1,200``); None or 0 draws every call.

        Raises:
            NotFoundError: the entrypoint has no run in its store yet.
        """
        spec = self._self_spec
        store = spec.store or default_store()
        runs = store.list_runs(spec.identity)
        if not runs:
            raise NotFoundError(
                f"entrypoint {spec.name!r} has no run in the store at "
                f"{store.where!r} yet. Fix: call it first, or pass "
                "store=... to read another store.")
        return Run(runs[0], store).graph(collapse=collapse)

    # -- machinery -----------------------------------------------------------------------
    def _self_srun(self, wrapped: Any, instance: Any, args: Any, kwargs: Any,
                   run_id: str | None, fresh: bool, handle: bool,
                   listener: Any = None, read_cache: bool = True, store: Store | None = None,
                   on_lease: Any = None, keep_finished: bool = False,
                   thread: str | None = None) -> Any:
        pause = _Pauses(self._self_wait, thread, kwargs)
        begin = (self._self_spec, instance, args, kwargs, run_id, fresh, listener, read_cache,
                 store, on_lease)
        while isinstance(started := pause.begin(*begin), float):
            time.sleep(started)  # (the run is executed by another call: wait=)
        kwargs = pause.kwargs
        if keep_finished:
            keep_in(started.ctx)
        timeout = None if self._self_timeout is None else Timeout(started.ctx,
                                                                  self._self_timeout)
        try:
            try:
                result = _threads.save_final(started.ctx, wrapped(*args, **kwargs))
            except BaseException as exc:
                if isinstance(exc, Exception):
                    started.ctx.stop = True  # (its submitted calls still running stop)
                _settle_submitted(started.ctx)
                signal = _as_interrupt(started.ctx, exc)
                if signal is not None:
                    end_run(started, exc=signal)
                    return _paused(started, signal, handle)
                end_run(started, exc=exc)
                _raise_if_cancelled(started, exc, timeout)
                raise
            _settle_submitted(started.ctx, True)  # (finished: warns of failures unseen)
            signal = _as_interrupt(started.ctx, None)
            if signal is not None:  # the user's code caught the signal: the run still waits
                end_run(started, exc=signal)
                return _paused(started, signal, handle)
            end_run(started, result=result)
            return _handle(started, result) if handle else result
        except BaseException as exc:
            if not started.ended:  # interrupted before it ended (Ctrl-C while settling)
                end_run(started, exc=exc)
            raise
        finally:
            if timeout is not None:
                timeout.cancel()

    async def _self_arun(self, wrapped: Any, instance: Any, args: Any, kwargs: Any,
                         run_id: str | None, fresh: bool, handle: bool,
                         listener: Any = None, read_cache: bool = True,
                         store: Store | None = None, on_lease: Any = None,
                         keep_finished: bool = False, thread: str | None = None) -> Any:
        pause = _Pauses(self._self_wait, thread, kwargs)
        begin = (self._self_spec, instance, args, kwargs, run_id, fresh, listener, read_cache,
                 store, on_lease)
        while isinstance(started := pause.begin(*begin), float):
            import asyncio  # (on a running loop: imported already)

            await asyncio.sleep(started)  # (the run is executed by another call: wait=)
        kwargs = pause.kwargs
        if keep_finished:
            keep_in(started.ctx)
        import asyncio  # (on a running loop: imported already)

        loop, me = asyncio.get_running_loop(), asyncio.current_task()
        # durably.cancel_run() and the timeout cancel this task (from any thread)
        unwatch = on_cancel(lambda: loop.call_soon_threadsafe(me.cancel)) if (
            me is not None) else None
        timeout = None if self._self_timeout is None else Timeout(
            started.ctx, self._self_timeout, loop)
        try:
            try:
                result = _threads.save_final(started.ctx, await wrapped(*args, **kwargs))
            except BaseException as exc:
                await _settle(started.ctx, exc)
                signal = _as_interrupt(started.ctx, exc)
                if signal is not None:
                    end_run(started, exc=signal)
                    return _paused(started, signal, handle)
                end_run(started, exc=exc)
                if started.ctx.cancelled_by is not None and me is not None and (
                        asyncio.CancelledError is type(exc) and me.uncancel() > 0):
                    raise  # (cancelled by its caller too: the cancellation goes on)
                _raise_if_cancelled(started, exc, timeout)
                raise
            signal = _as_interrupt(started.ctx, None)
            if signal is not None:
                end_run(started, exc=signal)
                return _paused(started, signal, handle)
            end_run(started, result=result)
            return _handle(started, result) if handle else result
        except BaseException as exc:
            if not started.ended:  # interrupted before it ended (Ctrl-C while settling)
                end_run(started, exc=exc)
            raise
        finally:
            if unwatch is not None:
                unwatch()
            if timeout is not None:
                timeout.cancel()

    def _self_stream(self, wrapped: Any, instance: Any, args: Any, kwargs: Any,
                     run_id: str | None, fresh: bool, on_lease: Any = None,
                     thread: str | None = None) -> Any:
        if self._self_spec.is_async:
            return _AsyncStream(self._self_spec.name.rpartition(".")[2], _stream_async(
                self, wrapped, instance, args, kwargs, run_id, fresh, on_lease, thread))
        return _stream_sync(self, wrapped, instance, args, kwargs, run_id, fresh, on_lease,
                            thread)

    def _self_stored_call(self, run_id: str, what: str, store: Store | None = None
                          ) -> tuple[Store, RunRecord, Any, Any]:
        """The store, record and stored arguments of one of this entrypoint's runs."""
        spec = self._self_spec
        store = store or spec.store or default_store()
        rec = store.find_run(validate_run_id(run_id))
        if rec is None:
            raise NotFoundError(
                f"no run {run_id!r} in the store at {store.where!r}. Fix: "
                "check the id with durably.list_runs(), or set DURABLY_DIR for the store "
                "that holds it.")
        if rec.entrypoint != spec.identity:
            raise RunStateError(
                f"run {run_id!r} belongs to entrypoint {rec.entrypoint!r}, not "
                f"{spec.identity!r}. Fix: {what} it with that entrypoint.")
        if rec.args is None:
            raise RunStateError(
                f"the arguments of run {run_id!r} were not stored (too large or not "
                f"picklable), so it cannot be continued from its id. Fix: call "
                f"{spec.name}.run(<the same arguments>, run_id={run_id!r}).")
        args, kwargs = _serde.loads(rec.args)
        return store, rec, args, kwargs

    def _self_resume(self, wrapped: Any, instance: Any, run_id: str, value: Any,
                     handle: bool = False, keep_finished: bool = False) -> Any:
        keep = _keep_option(keep_finished)
        runner = self._self_arun if self._self_spec.is_async else self._self_srun
        if keep and value is None:
            # a crashed, failed or stopped run: continued from its stored arguments
            _, rec, args, kwargs = self._self_stored_call(run_id, "resume")
            if rec.status != "interrupted":
                return runner(wrapped, instance, args, kwargs, rec.run_id, False, handle,
                              keep_finished=True)
        args, kwargs, answer = self._self_answering(run_id, value)
        return runner(wrapped, instance, args, kwargs, run_id, False, handle, on_lease=answer,
                      keep_finished=keep)

    def _self_answered(self, run_id: str) -> bool:
        """Whether the run waits at ``interrupt()`` with every question answered already
        (journaled by ``durably ui``'s form): resumed, it continues with no answer."""
        try:
            store, rec, _, _ = self._self_stored_call(run_id, "resume")
        except DurablyError:
            return False
        return rec.status == "interrupted" and not pending_interrupts(store, run_id,
                                                                      rec.attempt)

    def _self_answering(self, run_id: str, value: Any
                        ) -> tuple[Any, Any, Callable[[Store, RunRecord | None], None]]:
        """The stored arguments of an interrupted run, and the function that journals
        ``value`` as its answer once the run's lease is held (``on_lease``)."""
        if value is None and not self._self_answered(run_id):
            # an approval is never answered by accident (as the CLI says); a run whose
            # questions were all answered already (from the dashboard: durably ui) needs none
            refuse_no_answer(run_id, value)
        store, rec, args, kwargs = self._self_stored_call(run_id, "resume")
        _require_interrupted(rec, store)

        def answer(store: Store, current: RunRecord | None) -> None:
            # under the run's lease: a second resumer waits for nothing and answers nothing
            if current is None:  # (deleted since it was read: delete_runs)
                raise NotFoundError(
                    f"run {run_id!r} was deleted while this resume() started; the answer is "
                    "not recorded. Fix: start the run anew by calling the entrypoint.")
            _require_interrupted(current)
            pending = pending_interrupts(store, run_id, current.attempt)
            if pending:
                record_answers(store, run_id, current.attempt, pending, value)

        return args, kwargs, answer

    def _self_fork(self, wrapped: Any, instance: Any, run_id: str, at: str | None,
                   update: Any, cache: bool, store: Store | None = None) -> Any:
        if not isinstance(cache, bool):
            raise DefinitionError(f"fork(cache=...) must be True or False, not {cache!r}")
        store, rec, args, kwargs = self._self_stored_call(run_id, "fork", store)
        fork_id = make_fork(store, rec, at, update)
        if self._self_spec.is_async:
            coro = self._self_arun(wrapped, instance, args, kwargs, fork_id, False, True, None,
                                   cache, store)
            if update is NO_UPDATE:
                return coro

            async def checked() -> Any:
                try:
                    return await coro
                finally:
                    _warn_unused_update(store, fork_id)
            return checked()
        try:
            return self._self_srun(wrapped, instance, args, kwargs, fork_id, False, True, None,
                                   cache, store)
        finally:
            if update is not NO_UPDATE:
                _warn_unused_update(store, fork_id)


def _keep_option(keep_finished: Any) -> bool:
    """``keep_finished=`` checked (True or False)."""
    if not isinstance(keep_finished, bool):
        raise DefinitionError(f"keep_finished must be True or False, not {keep_finished!r}")
    return keep_finished


def _timeout_option(timeout: Any, where: str) -> float | None:
    """``timeout=`` checked: None, or a finite number of seconds > 0.

    Raises:
        DefinitionError: anything else, naming ``where``."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
            0 < timeout < float("inf")):
        raise DefinitionError(f"{where} is a number of seconds > 0 (or None: no limit), not "
                              f"{timeout!r}. Fix: timeout=600 for ten minutes")
    return float(timeout)


def _warn_unused_update(store: Store, fork_id: str) -> None:
    """Warn when a fork's first attempt did not use the update given for its checkpoint
    (:func:`~durably._runtime.history.unused_update`); a store that cannot be read says nothing."""
    try:
        why = unused_update(store, fork_id)
    except Exception:  # noqa: BLE001 - a diagnostic: never replaces the run's outcome
        return
    if why is not None:
        warnings.warn(why, stacklevel=4)


_ENTRYPOINTS: weakref.WeakValueDictionary[str, Entrypoint[Any, Any]] = (
    weakref.WeakValueDictionary())


def fork(run_id: str, at: str | None = None, update: Any = NO_UPDATE, *, cache: bool = False,
         store: Store | None = None) -> Run[Any]:
    """Start a new run from a checkpoint of an earlier run, and execute it with today's code.

    The same as :meth:`Entrypoint.fork`, found by the run's id: the entrypoint must be
    importable (``module:name``) or already defined in this process (a script's or a
    notebook's entrypoint is found once its definition ran). An async entrypoint returns a
    coroutine of the run.

    Args:
        run_id: The source run; it is never modified.
        at: A checkpoint id from ``run.history()`` (or a unique prefix of 6+ characters);
            ``""`` for the run's input.
            Default: the latest checkpoint.
        update: A new result for the checkpoint's step, or the answer for an interrupt
            checkpoint. Default: none.
        cache: Whether steps after the checkpoint may be served from the cross-run cache
            (default False: they execute).
        store: The store holding the run. Default: the configured store.

    Returns:
        The fork's :class:`~durably.Run`.

    Raises:
        NotFoundError: no such run or checkpoint.
        RunStateError: the run's entrypoint cannot be found in this process.

    Example:
        >>> import durably, tempfile
        >>> store = durably.DiskStore(tempfile.mkdtemp())
        >>> @durably.task
        ... def draft(topic):
        ...     return f"a draft on {topic}"
        >>> @durably.task
        ... def publish(text):
        ...     return text.upper()
        >>> @durably.entrypoint(store=store)
        ... def blog(topic):
        ...     return publish(draft(topic))
        >>> run = blog.run("owls")
        >>> first = run.history()[-1]  # oldest checkpoint: the draft
        >>> durably.fork(run.id, at=first.id, update="a better draft", store=store).result
        'A BETTER DRAFT'
    """
    st = store if store is not None else default_store()
    rec = st.find_run(validate_run_id(run_id))
    if rec is None:
        raise NotFoundError(
            f"no run {run_id!r} in the store at {st.where!r}. Fix: check "
            "the id with durably.list_runs(), or pass store=... (or set DURABLY_DIR).")
    ep = _ENTRYPOINTS.get(rec.entrypoint)
    if ep is None:
        module = rec.entrypoint.rpartition(":")[0]
        with contextlib.suppress(Exception):  # said below, with the way out
            importlib.import_module(module)
        ep = _ENTRYPOINTS.get(rec.entrypoint)
    if ep is None:
        raise RunStateError(
            f"run {run_id!r} belongs to entrypoint {rec.entrypoint!r}, which is not defined in "
            "this process and cannot be imported. Fix: import (or run) the code that defines "
            "it first, or call <entrypoint>.fork(run_id, ...) on it.")
    return ep._self_fork(ep.__wrapped__, None, run_id, at, update, cache, st)  # type: ignore[no-any-return]


@overload
def entrypoint(func: Callable[P, R], /) -> Entrypoint[P, R]: ...


@overload
def entrypoint(
    *, name: str | None = None, store: Store | str | os.PathLike[str] | None = None,
    wait: float | None = None, timeout: float | None = None,
) -> Callable[[Callable[P, R]], Entrypoint[P, R]]: ...


def entrypoint(func: Any = None, /, *, name: str | None = None,
               store: Store | str | os.PathLike[str] | None = None,
               wait: float | None = None, timeout: float | None = None) -> Any:
    """Make a function an entrypoint: each call is a durable run with a journal.

    Calling the entrypoint returns its plain result, so decorating a script's ``main``
    changes nothing else. Each step the run finishes is committed to the journal before the
    task returns; a run killed at any point and called again with the same arguments
    resumes: finished steps are replayed, and a step that finished is never executed again
    in that run. Code between tasks (the entrypoint's own body) re-executes on every
    attempt, so side effects belong in tasks. Use :meth:`Entrypoint.run` for the run handle.

    Like :func:`task`, it also takes a :func:`functools.partial` or a callable object, with
    ``name=``: ``durably.entrypoint(partial(main, config), name="main_prod")``.

    Args:
        func: The function (when used as ``@entrypoint`` without parentheses), a
            :func:`functools.partial` or a callable object.
        name: The entrypoint's name (and the prefix of its run ids). Default: the
            function's qualified name. Required for a partial and a callable object.
        store: Where its runs and results live: a store, or a URL or path that opens one
            (:func:`durably.open_store`). Default: the configured store
            (``durably.configure``), else ``$DURABLY_STORE``, ``$DURABLY_DIR``, or
            ``./.durably``.
        wait: Seconds a call waits when another call (a thread, another process)
            executes the same run right now, as a web server handling a request sent twice
            needs: it then returns that call's result (replayed from the journal; if that
            call failed, this one resumes the run). Default None: such a call raises
            :class:`~durably.RunBusyError` at once, as it does once ``wait`` has passed.
        timeout: Seconds one call of the run may take (> 0). When they pass, the run is
            stopped as :func:`durably.cancel_run` stops it (at its next step boundary;
            ``durably.cancelled()`` turns True; async code is cancelled), its status is
            ``stopped``, and the call raises :class:`~durably.RunTimeoutError`. It is
            resumable: calling again with the same arguments replays the finished steps
            and executes the rest, with the whole timeout again (the clock starts anew
            with each call, as DBOS's ``resume_workflow`` clears a workflow's deadline).
            Default None: no limit.

    Raises:
        DefinitionError: ``func`` is a class, a generator function or not callable, an
            option has the wrong type, ``func`` is a partial or a callable object and
            ``name`` is not given, it has a parameter named ``run_id``, ``fresh`` or
            ``thread`` (run options of :meth:`Entrypoint.run`), or a ``previous`` parameter
            that is not keyword-only (a thread's previous saved value, see
            :meth:`Entrypoint.run`).

    Example:
        >>> import durably, tempfile
        >>> @durably.task
        ... def add(a, b):
        ...     return a + b
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... def total(xs):
        ...     return add(add(xs[0], xs[1]), xs[2])
        >>> total([1, 2, 3])
        6
    """
    _check_bare("entrypoint", func)
    from durably._store.urls import store_from
    from durably.store import Store as _StoreProto
    from durably.store import _not_a_store

    store = store_from(store, "@entrypoint(store=...)")  # a URL or a path: its store
    if store is not None and not isinstance(store, _StoreProto):
        raise _not_a_store(store, "@entrypoint(store=...)",
                          "@entrypoint(store=\"path/to/store\")")

    if wait is not None and (isinstance(wait, bool) or not isinstance(wait, (int, float))
                             or not wait >= 0):
        raise DefinitionError(f"@entrypoint(wait=...) is a number of seconds >= 0 (or None), "
                              f"not {wait!r}. Fix: wait=30")

    limit = _timeout_option(timeout, "@entrypoint(timeout=...)")

    def decorate(f: Callable[P, R]) -> Entrypoint[P, R]:
        spec = Spec(f, kind="entrypoint", name=name, store=store)
        taken = [n for n in ("run_id", "fresh", "thread") if n in spec.signature.parameters]
        if taken:
            raise DefinitionError(
                f"@entrypoint {spec.name!r} has a parameter named {taken[0]!r}, which "
                f"{spec.name}.run(..., {taken[0]}=...) and .stream() take for themselves, so "
                f"your argument would be taken as the run option. Fix: rename the parameter "
                f"(for example {taken[0]}_ or my_{taken[0]}).")
        _threads.check_previous(spec)
        made = Entrypoint(f, spec)
        made._self_wait = None if wait is None else float(wait)
        made._self_timeout = limit
        return made

    return decorate(func) if func is not None else decorate


#: LangGraph's spelling, ``entrypoint.final(value=..., save=...)``: :class:`durably.Final`
entrypoint.final = _threads.Final  # type: ignore[attr-defined]
