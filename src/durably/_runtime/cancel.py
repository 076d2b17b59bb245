"""Cancellation: :func:`cancelled`, the cooperative signal a step reads; :func:`cancel_run`,
which stops a run this process executes (from another thread: a web handler's cancel
button); :func:`stop`, which a run's ``timeout=`` calls too; and :class:`Siblings`, the
nodes of one parallel super-step, cancelled together when one of them fails.

A stop is a flag read at step boundaries (the run's ``stop``: a step starting raises
``StopRun``), so a stopped run keeps every step that finished and is resumable. What a
flag cannot reach, an asyncio task waiting in an ``await``, is cancelled through the
*watchers* registered with :func:`on_cancel`: the innermost :class:`Siblings` the code runs
in, else the run. Nothing here is on a step's path: the call path already reads the flag.

Apart from the attempt (:mod:`durably._runtime.attempt`), which begins and ends runs: this
only asks a running one to stop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from durably._runtime.context import RUNS, RunContext, current_step, cutoff, live_run
from durably._store.lease import _pid

__all__ = ["Siblings", "Timeout", "cancel_run", "cancelled", "on_cancel", "stop"]


def cancelled() -> bool:
    """Whether the code calling it should stop: True inside a run that is being stopped
    (:func:`durably.cancel_run`, its ``timeout=`` passed, its ``stream()`` closed, or its
    entrypoint failed while submitted tasks still run), and inside a node of a StateGraph
    super-step in which another node failed; False otherwise, and outside any run.

    A cooperative signal, as asyncio's ``Task.cancelling()`` or a Go ``ctx.Done()``:
    Python cannot stop a thread, so a long step (a loop over pages, a polling wait) asks it
    between two pieces of work and returns early. Durably stops the same code at its next
    step boundary anyway (the next task it calls raises, so what it finished stays in the
    journal); an ``async`` node or submitted task is cancelled (``CancelledError``). Reading
    it is cheap (a few attribute reads) and never changes what a resumed run replays.

    Returns:
        True when the current run, or the super-step the caller is in, is being cancelled.

    Example:
        >>> import durably, tempfile
        >>> @durably.task
        ... def pages(n):
        ...     done = 0
        ...     for _ in range(n):
        ...         if durably.cancelled():
        ...             break
        ...         done += 1
        ...     return done
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... def crawl(n):
        ...     return pages(n)
        >>> crawl(3), durably.cancelled()
        (3, False)
    """
    ctx = live_run()
    if ctx is None:
        return False
    if ctx.stop:
        return True
    if ctx.halting and ctx.halted(current_step.get()):
        return True
    abandoned = cutoff.get()
    return abandoned is not None and abandoned.cut


def cancel_run(run_id: str) -> bool:
    """Stop a run that this process executes, from any thread (DBOS's
    ``DBOS.cancel_workflow``).

    The run stops at its next step boundary: the steps running now finish and are
    journaled (sync code reads :func:`durably.cancelled`; ``async`` entrypoints, nodes and
    submitted tasks are cancelled), no step starts after them. The call that executes the
    run then raises :class:`~durably.RunCancelledError`; the run's status is ``stopped``,
    as after Ctrl-C, and it is resumable: calling the entrypoint again with the same
    arguments (a graph: ``app.invoke(None, run_id=...)``; or ``durably resume RUN``)
    replays its finished steps and executes only the rest.

    Args:
        run_id: The run (pass ``run_id=`` when starting it to know it in advance:
            ``pipeline.run(x, run_id=request_id)``, ``app.invoke(state, run_id=thread)``).

    Returns:
        True if an attempt of the run executing in this process was asked to stop; False
        if none is (the run ended already, has not started yet, or another process
        executes it: stop that process with Ctrl-C, which leaves the run ``stopped`` too).

    Raises:
        DefinitionError: ``run_id`` is not a valid run id.

    Example:
        >>> import durably
        >>> durably.cancel_run("no-such-run-here")
        False
    """
    from durably._runtime.attempt import validate_run_id

    validate_run_id(run_id)
    found = False
    for ref in list(RUNS):
        ctx = ref()
        if ctx is not None and ctx.run_id == run_id and ctx.pid == _pid[0] and (
                stop(ctx, "cancelled by durably.cancel_run()")):
            found = True
    return found


def stop(ctx: RunContext, why: str) -> bool:
    """Tell a run's attempt to stop (``why``: said by its error and its record): its flag,
    then its watchers. False if the attempt has ended."""
    if ctx.ended:
        return False
    if ctx.cancelled_by is None:
        ctx.cancelled_by = why
    ctx.stop = True
    _call_all(list(ctx.watchers))
    return True


class Timeout:
    """The ``timeout=`` of one attempt of a run (seconds from its start): when it passes,
    the attempt is stopped as :func:`cancel_run` stops it. A timer thread for a sync run,
    ``loop.call_later`` for an async one (``loop``); one per attempt, never per step. A
    resumed run's next attempt has the whole timeout again; what it replays never depends
    on when this one fired."""

    __slots__ = ("_handle", "ctx", "seconds", "why")

    def __init__(self, ctx: RunContext, seconds: float, loop: Any = None) -> None:
        self.ctx, self.seconds = ctx, seconds
        self.why = f"timed out after {seconds:g} s (timeout={seconds:g})"
        if loop is not None:
            self._handle: Any = loop.call_later(seconds, self._fire)
        else:
            self._handle = threading.Timer(seconds, self._fire)
            self._handle.daemon = True
            self._handle.name = f"durably-timeout-{ctx.run_id}"[:60]
            self._handle.start()

    def _fire(self) -> None:
        stop(self.ctx, self.why)

    def cancel(self) -> None:
        """Disarm it (the attempt ended)."""
        self._handle.cancel()


def _call_all(watchers: list[Callable[[], object]]) -> None:
    for watcher in watchers:
        with contextlib.suppress(Exception):  # (a loop closed meanwhile: nothing to cancel)
            watcher()


class Siblings:
    """The nodes of one StateGraph super-step running in parallel (LangGraph cancels a
    super-step's other tasks when one fails). Once one fails, the others are cancelled:
    a step they start raises ``StopRun`` (their super-step's step is marked halting, as a
    map stopping on Ctrl-C marks its items), :func:`cancelled` is True in them, and the
    async ones are cancelled through their watchers. What finished is journaled: a resumed
    run replays it. Used as a context manager around the super-step's calls; it is watched
    by the run (or the super-step it is nested in), so stopping the run cancels it too."""

    __slots__ = ("_lock", "_unwatch", "cancelled", "ctx", "mark", "watchers")

    def __init__(self) -> None:
        self.ctx = live_run()
        self.mark = current_step.get()  # (the super-step's step: its nodes' parent)
        self.cancelled = False
        self.watchers: set[Callable[[], object]] = set()
        self._lock = threading.Lock()
        self._unwatch: Callable[[], None] | None = None

    def __enter__(self) -> Siblings:
        self._unwatch = on_cancel(self.cancel)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._unwatch is not None:
            self._unwatch()
        ctx, mark = self.ctx, self.mark
        if self.cancelled and ctx is not None and mark is not None:
            ctx.halting.discard(mark)  # (its nodes have ended)

    def cancel(self) -> None:
        """Cancel the siblings still running (once)."""
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            watchers = list(self.watchers)
        ctx, mark = self.ctx, self.mark
        if ctx is not None and mark is not None:
            ctx.halting.add(mark)
        _call_all(watchers)

    def failed(self, future: Any) -> None:
        """A future's done-callback: a node that failed (an ``Exception``: not an
        interrupt, a stop or a cancellation) cancels the others."""
        if not future.cancelled() and isinstance(future.exception(), Exception):
            self.cancel()


#: the innermost super-step the code runs in (its nodes' threads), if any
siblings: ContextVar[Siblings | None] = ContextVar("durably_siblings", default=None)


def on_cancel(watcher: Callable[[], object]) -> Callable[[], None]:
    """Call ``watcher`` (no arguments, from any thread) when the code running here is
    cancelled: its super-step's siblings (:class:`Siblings`), else its run; at once if
    that happened already. Returns the function that takes it back."""
    scope = siblings.get()
    if scope is not None:
        with scope._lock:
            scope.watchers.add(watcher)
            now = scope.cancelled
        ctx = scope.ctx
        if now or (ctx is not None and ctx.stop and ctx.cancelled_by is not None):
            _call_all([watcher])
        return lambda: scope.watchers.discard(watcher)
    run = live_run()
    if run is None:
        return _nothing
    run.watchers.add(watcher)
    if run.stop and run.cancelled_by is not None:
        _call_all([watcher])
    return lambda: run.watchers.discard(watcher)


def _nothing() -> None:
    return None
