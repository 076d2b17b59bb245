"""The executors: where the bodies of a fan-out's items run (:class:`Thread`,
:class:`Process`, :class:`Dask`), and submitting one call to one (``Executor.submit``,
``Task.submit``: a future of its result).

Separate from the fan-out (:mod:`durably._executors.fanout`), which decides what to send and
finishes what comes back in the caller's thread. Submit lives here, with the executors:
``Executor.submit`` starts a call, and a submitted call's default executor is a shared
:class:`Thread`, so either split off would import the other. :mod:`durably.executors`
re-exports :class:`Thread`, :class:`Process`, :class:`Dask` and :class:`Executor`.

Where the bodies run:

- ``Thread``: a thread pool in this process. The body runs in a copy of the caller's context
  with the item's step as the current step, so tasks it calls are child steps of the run.
- ``Process``: a pool of worker processes (start method ``forkserver``, else ``spawn``:
  forking a process that has threads can deadlock). Functions, arguments and results travel
  with cloudpickle; a task defined in ``__main__`` or a notebook travels by value, with its
  identity and code fingerprint, so the key its calls use is the one the caller computed.
  A script that maps on processes needs the usual ``if __name__ == "__main__":`` guard.
- ``Dask``: a ``distributed.Client`` (the extra ``durably[dask]``); travels like ``Process``.

A worker process has no run: a task called inside a body there is a plain cached call
against the caller's store, so the work is still cached for every later run. The store is
sent along by its URL and options (:meth:`~durably.store.Store.location`: a
:class:`~durably.DiskStore` by its directory), and the worker reopens it; a store that cannot
travel (a ``MemoryStore``), or a store the worker cannot reach (a directory it cannot see
on another machine without the shared filesystem), gives that worker an in-memory cache of
its own, and a warning is logged on the ``durably`` logger. The items'
own results always come back to the caller, which journals and caches them in its store.

A submitted call has no caller loop to come back to: its outcome is journaled and cached,
then its future settled, in the thread that saw the body finish. Its step identity is
assigned when it is submitted, in submission order.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures as cf
import contextlib
import contextvars
import logging
import os
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from durably._executors.items import (
    Done,
    Target,
    _future_outcome,
    _Item,
    _journal_failure,
    _outcomes_of,
    _run_here,
)
from durably._executors.worker import _Outcome, _pack_arguments, _run_job, _unpack_outcome
from durably._runtime.call import _acall_with_policy, begin_step
from durably._runtime.context import current_step
from durably._runtime.failures import ReplayedFailure
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.step import _MISS, Call
from durably._store.records import now
from durably.exceptions import DefinitionError

__all__ = ["Dask", "Executor", "Process", "Thread", "submit_async", "submit_sync"]

log = logging.getLogger("durably")


# -- executors ------------------------------------------------------------------------------
class Executor(abc.ABC):
    """Where the bodies of a fan-out's items run. Use :class:`Thread`, :class:`Process` or
    :class:`Dask`; an executor is a context manager that shuts down what it started."""

    kind = ""

    def __init__(self, max_workers: int | None = None) -> None:
        self.max_workers = _check_workers(max_workers)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_workers={self.max_workers!r})"

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def submit(self, task: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Start one call of ``task`` here and return a future of its result.

        Like :meth:`Task.submit <durably.Task.submit>`, on this executor: the call's step
        identity is assigned now, in submission order; a call the journal or cache has is
        served at once (an already finished future).

        Args:
            task: A durably task (``@durably.task``), or a task bound to an instance.
            *args: The call's positional arguments.
            **kwargs: The call's keyword arguments.

        Returns:
            A :class:`concurrent.futures.Future` of the result (an :class:`asyncio.Future`
            for an ``async`` task, which must be submitted inside a running event loop).

        Raises:
            DefinitionError: ``task`` is not a durably task.
            SerializationError: an argument cannot be digested.

        Example:
            >>> import durably, tempfile
            >>> from durably.executors import Thread
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> @durably.task
            ... def cube(x):
            ...     return x ** 3
            >>> with Thread(max_workers=2) as pool:
            ...     pool.submit(cube, 3).result()
            27
            >>> durably.configure()
        """
        target = _target_of(task)
        if target.spec.is_async:
            return submit_async(target, args, kwargs, self)
        return submit_sync(target, args, kwargs, self)

    def shutdown(self, wait: bool = True,  # noqa: B027 - default: nothing started
                 cancel_futures: bool | None = None) -> None:
        """Stop the workers this executor started (not a Dask client: that is yours).

        Args:
            wait: Wait for running bodies to finish.
            cancel_futures: Drop the items not started yet (default: when not waiting).
        """

    # -- the protocol the fan-out uses --------------------------------------------------
    def _window(self) -> int | None:
        """At most this many items in flight at once (None: no limit beyond the pool)."""
        return self.max_workers

    def _prepare(self) -> None:  # noqa: B027 - default: nothing to check
        """Check, before the first body is sent, that the executor can run (raises)."""

    @abc.abstractmethod
    def _start(self, item: _Item, target: Target, done: Done) -> None:
        """Send one item's body to run; call ``done(item, handle)`` when it has finished."""

    def _outcomes(self, batch: Sequence[tuple[_Item, Any]]) -> list[_Outcome]:
        return [_future_outcome(handle) for _, handle in batch]

    def _cancel(self, items: Iterable[_Item]) -> None:
        for item in items:
            if isinstance(item.handle, cf.Future):
                item.handle.cancel()

    def _running(self, unended: int) -> tuple[int, int]:
        """Of ``unended`` items sent and not cancelled (after a stop), how many bodies are
        running, and how many wait, queued where they can no longer be cancelled."""
        return unended, 0

    def _stoppable(self) -> bool:
        """Whether the bodies running now can be stopped (:meth:`_stop_running`); a
        thread's cannot: the process ends only once they have."""
        return True

    def _stop_running(self) -> None:  # noqa: B027 - default: nothing to stop
        """Stop the bodies running now (a second Ctrl-C: the fan-out no longer waits)."""


class _Pooled(Executor):
    """An executor over a concurrent.futures pool, started on first use, replaced after
    shutdown()."""

    def __init__(self, max_workers: int | None) -> None:
        super().__init__(max_workers)
        self._lock = threading.Lock()
        self._pool: Any = None

    @abc.abstractmethod
    def _new_pool(self) -> Any:
        """A new concurrent.futures pool for this executor."""

    def _executor(self) -> Any:
        with self._lock:
            if self._pool is None:
                self._pool = self._new_pool()
            return self._pool

    def shutdown(self, wait: bool = True, cancel_futures: bool | None = None) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait,
                          cancel_futures=not wait if cancel_futures is None else cancel_futures)


class Thread(_Pooled):
    """Run the bodies in a pool of threads of this process (the default).

    For work that waits (network, LLM calls, files) or that releases the GIL. Tasks called
    inside a body are child steps of the run, exactly as in a plain call.

    Args:
        max_workers: Threads in the pool. Default: ``min(32, os.cpu_count() + 4)``, as
            :class:`concurrent.futures.ThreadPoolExecutor`.

    Raises:
        ValueError: ``max_workers`` is not a positive int.

    Example:
        >>> import durably, tempfile
        >>> from durably.executors import Thread
        >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
        >>> @durably.task
        ... def shout(word):
        ...     return word.upper()
        >>> shout.map(["a", "b"], executor=Thread(max_workers=4))
        ['A', 'B']
        >>> durably.configure()
    """

    kind = "thread"

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__(max_workers)

    def _new_pool(self) -> cf.ThreadPoolExecutor:
        return cf.ThreadPoolExecutor(self.max_workers, thread_name_prefix="durably")

    def _stoppable(self) -> bool:
        return False

    def _start(self, item: _Item, target: Target, done: Done) -> None:
        context = contextvars.copy_context()
        future = self._executor().submit(context.run, _run_here, item.call, target.local,
                                         item.args, item.kwargs)
        item.handle = future
        future.add_done_callback(lambda f: done(item, f))


class Process(_Pooled):
    """Run the bodies in worker processes: for CPU-bound Python code.

    Functions, arguments and results travel with cloudpickle, so tasks defined in
    ``__main__`` or in a notebook work. Tasks called inside a body are cached in the caller's
    store (a worker has no run: they are plain cached calls there). A script needs the
    ``if __name__ == "__main__":`` guard, as with :mod:`multiprocessing`. The pool starts on
    first use and is kept for the next fan-out until :meth:`shutdown`.

    Args:
        max_workers: Worker processes. Default: ``os.cpu_count()``.
        start_method: ``"forkserver"`` (default where available), ``"spawn"`` (default
            elsewhere) or ``"fork"`` (fast to start, but forking a process that runs threads
            can deadlock). A forked worker has no run either, though it inherits the run's
            context.

    Raises:
        ValueError: ``max_workers`` is not a positive int, or the start method is unknown.

    Example:
        >>> import durably, tempfile
        >>> from durably.executors import Process
        >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
        >>> @durably.task
        ... def square(x):
        ...     return x * x
        >>> with Process(max_workers=2) as pool:
        ...     square.map(range(4), executor=pool)
        [0, 1, 4, 9]
        >>> durably.configure()
    """

    kind = "process"

    def __init__(self, max_workers: int | None = None, *, start_method: str | None = None
                 ) -> None:
        import multiprocessing

        super().__init__(max_workers)
        methods = multiprocessing.get_all_start_methods()
        if start_method is None:
            start_method = "forkserver" if "forkserver" in methods else "spawn"
        if start_method not in methods:
            raise ValueError(
                f"start_method must be one of {methods}, not {start_method!r}"
            )
        self.start_method = start_method

    def __repr__(self) -> str:
        return f"Process(max_workers={self.max_workers!r}, start_method={self.start_method!r})"

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        import multiprocessing

        from durably._executors.worker import watch_parent

        # each worker exits once this process is gone (killed, it cannot stop them itself)
        pool = cf.ProcessPoolExecutor(
            self.max_workers, mp_context=multiprocessing.get_context(self.start_method),
            initializer=watch_parent, initargs=(os.getpid(),))
        # stop the workers at exit (or when this executor is dropped), while the interpreter
        # can still run the pool's own cleanup
        weakref.finalize(self, pool.shutdown, wait=False, cancel_futures=True)
        return pool

    def _start(self, item: _Item, target: Target, done: Done) -> None:
        from concurrent.futures.process import BrokenProcessPool

        head = target.head(item.call.store)
        body = _pack_arguments(target.spec, item.args, item.kwargs)
        try:
            future = self._executor().submit(_run_job, head, body)
        except BrokenProcessPool:  # a worker died (killed, out of memory): a new pool
            self.shutdown(wait=False)
            future = self._executor().submit(_run_job, head, body)
        item.handle = future
        future.add_done_callback(lambda f: done(item, f))

    def _outcomes(self, batch: Sequence[tuple[_Item, Any]]) -> list[_Outcome]:
        out = []
        for _, handle in batch:
            outcome = _future_outcome(handle)
            out.append(_unpack_outcome(outcome.value) if outcome.ok else outcome)
        return out

    def _running(self, unended: int) -> tuple[int, int]:
        # a process pool marks an item running once it is queued for the workers (up to
        # one more than their number, besides those they execute): at most one body runs
        # per worker, the rest wait in that queue (they cannot be cancelled: they will run)
        workers = getattr(self._pool, "_max_workers", None) or self.max_workers
        if not isinstance(workers, int) or workers < 1:
            return unended, 0
        return min(unended, workers), max(unended - workers, 0)

    def _stop_running(self) -> None:
        """Kill the workers (their bodies end mid-way, as with kill -9: those items execute
        again when the run resumes); the next fan-out starts a new pool."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        for worker in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(Exception):
                worker.kill()
        with contextlib.suppress(Exception):
            pool.shutdown(wait=False, cancel_futures=True)


class Dask(Executor):
    """Run the bodies on a Dask cluster through a ``distributed.Client`` you created.

    Needs the extra: ``pip install 'durably[dask]'``. Functions, arguments and results
    travel with cloudpickle, as on :class:`Process`; durably must be installed on the
    workers. Tasks called inside a body are cached in the caller's store when the workers
    can reach its directory (a shared filesystem); a worker that cannot gets an in-memory
    cache of its own (a warning is logged). The items' own results always come back to the
    caller and are journaled and cached there. A map on Dask inside an item that runs on
    Dask (nested fan-outs) leaves the worker's thread pool while it waits, as
    ``distributed.worker_client`` does, so it never waits for a thread it holds itself.

    Args:
        client: The client. Default: the current one (``distributed.get_client()``), looked
            up at each fan-out.
        max_workers: At most this many items in flight at once. Default: no limit (the
            scheduler spreads them over the workers).

    Raises:
        ImportError: (at use) ``distributed`` is not installed.
        DefinitionError: ``client`` is not a client; (at use) none was given and none exists.

    Example:
        >>> from durably.executors import Dask
        >>> Dask()  # looks up the current distributed.Client when a fan-out starts
        Dask(client=None, max_workers=None)
    """

    kind = "dask"

    def __init__(self, client: Any = None, *, max_workers: int | None = None) -> None:
        super().__init__(max_workers)
        if client is not None and not (callable(getattr(client, "submit", None))
                                       and callable(getattr(client, "cancel", None))):
            raise DefinitionError(
                f"Dask(client=...) takes a distributed.Client (or None: the current one), "
                f"not {client!r:.80}. Fix: from distributed import Client; "
                "Dask(Client(...)) (a scheduler address goes to Client: "
                "Client('tcp://host:8786')).")
        self.client = client

    def __repr__(self) -> str:
        return f"Dask(client={self.client!r}, max_workers={self.max_workers!r})"

    def _client(self) -> Any:
        try:
            import distributed
        except ImportError:
            raise ImportError(
                "durably's Dask executor needs dask.distributed. Fix: pip install "
                "'durably[dask]'"
            ) from None
        if self.client is not None:
            return self.client
        try:
            return distributed.get_client()
        except ValueError:
            raise DefinitionError(
                "executor='dask' found no distributed.Client. Fix: create one first "
                "(client = distributed.Client(...)), or pass durably.executors.Dask(client)."
            ) from None

    def _prepare(self) -> None:
        self._client()

    def _start(self, item: _Item, target: Target, done: Done) -> None:
        client = self._client()
        head = target.head(item.call.store)
        body = _pack_arguments(target.spec, item.args, item.kwargs)
        future = client.submit(_run_job, head, body, pure=False,
                               key=f"{target.spec.name}-{uuid.uuid4().hex}")
        item.handle = future
        future.add_done_callback(lambda f: done(item, f))

    def _outcomes(self, batch: Sequence[tuple[_Item, Any]]) -> list[_Outcome]:
        finished = [handle for _, handle in batch if handle.status == "finished"]
        data = iter(self._client().gather(finished) if finished else ())
        out = []
        for item, handle in batch:
            if handle.status == "finished":
                out.append(_unpack_outcome(next(data)))
            else:  # the worker died (KilledWorker), or the future was cancelled
                try:
                    exc = handle.exception()
                except BaseException as cancelled:  # noqa: BLE001 - that is the outcome
                    exc = cancelled
                out.append(_Outcome(False, exc, None))
            # let the scheduler forget it: a future still held is recomputed when the worker
            # that kept its result dies, which would run a finished item again
            item.handle = None
            with contextlib.suppress(Exception):
                handle.release()
        return out

    def _cancel(self, items: Iterable[_Item]) -> None:
        handles = [item.handle for item in items if item.handle is not None]
        if handles:
            try:
                self._client().cancel(handles)
            except Exception as exc:  # noqa: BLE001 - cancelling is best effort
                log.warning("durably: could not cancel Dask futures: %s", exc)


class _BadWorkers(DefinitionError, ValueError):
    """``max_workers=`` out of range: a durably error, and the ValueError that
    ``concurrent.futures`` raises for it."""


def _check_workers(max_workers: Any) -> int | None:
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
    ):
        raise _BadWorkers(f"max_workers must be a positive int or None, not {max_workers!r}. "
                          "Fix: max_workers=4, or leave it out (the executor's default).")
    return max_workers


_defaults_lock = threading.Lock()
_default_thread: Thread | None = None
_default_process: dict[int | None, Process] = {}


def _shared_thread() -> Thread:
    global _default_thread
    with _defaults_lock:
        if _default_thread is None:
            _default_thread = Thread()
        return _default_thread


def _resolve_executor(executor: Any, max_workers: int | None) -> tuple[Executor, bool]:
    """The executor to use, and whether the fan-out owns it (and shuts it down after)."""
    max_workers = _check_workers(max_workers)
    if executor is None or executor == "thread":
        return Thread(max_workers), True
    if executor == "process":
        from durably._executors.worker import IN_WORKER

        if IN_WORKER[0]:
            # a fan-out nested in an item on a worker process: a pool of its own, shut down
            # after it (a pool kept in the worker would keep it from ever exiting)
            return Process(max_workers), True
        with _defaults_lock:
            found = _default_process.get(max_workers)
            if found is None:
                found = _default_process[max_workers] = Process(max_workers)
        return found, False
    if executor == "dask":
        return Dask(max_workers=max_workers), False
    if isinstance(executor, Executor):
        return executor, False
    raise DefinitionError(
        f"executor must be 'thread', 'process', 'dask' or an executor from durably.executors "
        f"(Thread, Process, Dask), not {executor!r}"
    )


def _target_of(task: Any) -> Target:
    make = getattr(type(task), "_self_target", None)
    if make is None:
        raise DefinitionError(
            f"submit() takes a durably task (@durably.task), not {type(task).__qualname__}"
        )
    target: Target = make(task)
    return target


# -- submit ---------------------------------------------------------------------------------
class _Submitted(cf.Future):  # type: ignore[type-arg]
    """The future of a submitted call: it knows whether its outcome was asked for."""

    def __init__(self) -> None:
        super().__init__()
        #: asked (result() or exception(), by the caller, as_completed, a callback...): a
        #: cell the run keeps, so a future dropped after it was asked still counts as asked
        self.asked = [False]

    def result(self, timeout: float | None = None) -> Any:
        self.asked[0] = True
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.asked[0] = True
        return super().exception(timeout)


def submit_sync(target: Target, args: tuple[Any, ...], kwargs: dict[str, Any],
                executor: Executor | None) -> cf.Future[Any]:
    """``Task.submit`` for a sync task: see :meth:`durably.Task.submit`."""
    ex = executor if executor is not None else _shared_thread()
    ex._prepare()
    future: cf.Future[Any] = _Submitted()
    try:
        value, call = begin_step(target.spec, target.instance, args, kwargs)
    except ReplayedFailure as replayed:  # (its failure, from the journal)
        future.set_running_or_notify_cancel()
        future.set_exception(replayed.error)
        return future
    future.set_running_or_notify_cancel()  # journaled work cannot be taken back
    if value is not _MISS:
        future.set_result(value)
        return future

    ctx = call.ctx

    def fail(exc: BaseException) -> None:
        # (before the future is done: the run's end waits for that); an interrupt() is no
        # failure: the run pauses for it, and reports it whether or not anybody waited
        if ctx is not None and not isinstance(exc, InterruptSignal):
            asked = getattr(future, "asked", [True])
            ctx.unwaited.append((target.spec.name, asked, repr(exc)[:200]))
        future.set_exception(exc)

    def done(item: _Item, handle: Any) -> None:
        try:
            outcome = _outcomes_of(ex, [(item, handle)])[0]
        except BaseException as exc:  # noqa: BLE001 - that is the outcome
            outcome = _Outcome(False, exc, None)
        _settle(item, outcome, future.set_result, fail)

    item = _Item(0, call, args, kwargs)
    if ctx is not None and not isinstance(ex, Thread):
        ctx.flush_cache()  # a worker reads the store: the run's queued results first
    if ctx is not None:  # the run ends only when its submitted steps have ended
        ctx.inflight.add(future)
        future.add_done_callback(ctx.inflight.discard)
    try:
        ex._start(item, target, done)
    except Exception as exc:  # noqa: BLE001 - cannot be sent: the future's failure
        _settle(item, _Outcome(False, exc, None), future.set_result, fail)
    return future


def _settle(item: _Item, outcome: _Outcome, ok: Callable[[Any], None],
            fail: Callable[[BaseException], None]) -> None:
    """Journal and cache a submitted call's outcome, then resolve its future."""
    call = item.call
    if outcome.started is not None:
        call.started = outcome.started
    if outcome.ended is not None:
        call.ended = outcome.ended
    if outcome.journaled:
        (ok if outcome.ok else fail)(outcome.value)
        return
    if not outcome.ok:
        _journal_failure(call, outcome.value)
        fail(outcome.value)
        return
    try:
        result = call.succeeded(outcome.value)
    except BaseException as exc:  # noqa: BLE001 - the result cannot be stored
        fail(exc)
        return
    ok(result)


def submit_async(target: Target, args: tuple[Any, ...], kwargs: dict[str, Any],
                 executor: Executor | None) -> asyncio.Future[Any]:
    """``Task.submit`` for an async task: an :class:`asyncio.Future` on the running loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            f"{target.spec.name}.submit() of an async task needs a running event loop. Fix: "
            "call it inside an async function (or await the task directly)."
        ) from None
    if executor is not None:
        executor._prepare()
    try:
        value, call = begin_step(target.spec, target.instance, args, kwargs)
    except ReplayedFailure as replayed:  # (its failure, from the journal)
        failed = loop.create_future()
        failed.set_exception(replayed.error)
        return failed
    if value is not _MISS:
        hit = loop.create_future()
        hit.set_result(value)
        return hit
    if executor is None or isinstance(executor, Thread):
        coro = _submitted_async(call, target.local, args, kwargs)
        return loop.create_task(coro, context=contextvars.copy_context())
    ex = executor
    future = loop.create_future()

    def resolve(method: Callable[[Any], None]) -> Callable[[Any], None]:
        def apply(value: Any) -> None:
            if not future.cancelled():
                method(value)
        return apply

    def settle(item: _Item, outcome: _Outcome) -> None:  # on the loop
        _settle(item, outcome, resolve(future.set_result), resolve(future.set_exception))

    def done(item: _Item, handle: Any) -> None:  # in a worker's thread
        try:
            outcome = _outcomes_of(ex, [(item, handle)])[0]
        except BaseException as exc:  # noqa: BLE001 - that is the outcome
            outcome = _Outcome(False, exc, None)
        try:
            loop.call_soon_threadsafe(settle, item, outcome)
        except RuntimeError:  # the loop is closed: journal it from here
            _settle(item, outcome, lambda _: None, lambda _: None)

    item = _Item(0, call, args, kwargs)
    try:
        ex._start(item, target, done)
    except Exception as exc:  # noqa: BLE001 - cannot be sent: the future's failure
        settle(item, _Outcome(False, exc, None))
    return future


async def _submitted_async(call: Call, fn: Callable[..., Any], args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> Any:
    """The body of an async task's submit(), in a task of the caller's event loop:
    registered as executing (for the steps it calls and interrupt()), as a map's items."""
    ctx = call.ctx
    if ctx is not None:
        current_step.set(call.step_id)
        ctx.items.enter(ctx, call.step_id, call)
    call.started = now()
    spec = call.spec
    try:
        if spec.retry is not None or spec.timeout is not None:
            return await _acall_with_policy(spec, call, fn, args, kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            _journal_failure(call, exc)
            raise
        return call.succeeded(result)
    finally:
        if ctx is not None:
            ctx.items.pop(call.step_id, None)
