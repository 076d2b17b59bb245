"""Fan-out of a task over many inputs: ``Task.map`` and ``Task.submit`` on threads, worker
processes or a Dask cluster, without giving up exact resume.

How a fan-out keeps exact resume (DESIGN.md, "step identity"):

1. In the caller's thread and in input order, each item goes through the call path up to
   execution (:func:`~durably._runtime.call.begin_step`). Its step identity (parent step, cache
   key, occurrence) is assigned there, before anything runs, so it never depends on
   completion order; items the journal has are replayed, items the cache has are served,
   right there.
2. Only the bodies of the missing items go to the executor.
3. Each result comes back to the caller's thread, which journals and caches it (or journals
   the failure) as it arrives, so a run killed halfway keeps every item that finished.
   (``submit`` has no caller loop to come back to: its future is settled, journal first, in
   the thread that saw the body finish.)

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
sent along: a :class:`~durably.DiskStore` by its directory (process-safe), another store by
pickle if it pickles; a store that cannot travel (``MemoryStore``), or a directory the worker
cannot see (a Dask worker on another machine without the shared filesystem), gives that worker
an in-memory cache of its own, and a warning is logged on the ``durably`` logger. The items'
own results always come back to the caller, which journals and caches them in its store.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures as cf
import contextlib
import contextvars
import logging
import os
import queue
import threading
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import TYPE_CHECKING, Any

from durably._executors.progress import _Progress, progress_enabled
from durably._executors.worker import (
    _describe_store,
    _Outcome,
    _pack,
    _pack_arguments,
    _run_job,
    _unpack_outcome,
)
from durably._runtime.call import (
    _SERVED,
    _acall_with_policy,
    _call_with_policy,
    begin_step,
    cached_now,
    serve_cached,
)
from durably._runtime.context import RunContext, StopRun, current_step, cutoff
from durably._runtime.failures import ReplayedFailure
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.retry import Seceded
from durably._runtime.spec import Spec
from durably._runtime.step import _MISS, Call
from durably._store.lease import RENEW_SECONDS
from durably._store.records import now
from durably.exceptions import DefinitionError
from durably.store import Store

if TYPE_CHECKING:
    pass

__all__ = ["Dask", "Executor", "Process", "Target", "Thread", "map_async", "map_sync",
           "submit_async", "submit_sync"]

log = logging.getLogger("durably")

_WAKE = min(5.0, RENEW_SECONDS / 2)  # seconds: the caller renews the run's lease this often
_STOP_WAKE = 0.5  # seconds: after a stop, how often the wait looks for bodies ended unseen


# -- what runs ------------------------------------------------------------------------------
class Target:
    """What a fan-out runs: the task's spec, its body for this process, the instance it is
    bound to, and a reference to the body that travels to worker processes."""

    __slots__ = ("_heads", "instance", "local", "ref", "spec")

    def __init__(self, spec: Spec, local: Callable[..., Any], instance: Any,
                 ref: tuple[Any, bool, Any, Any]) -> None:
        self.spec = spec
        self.local = local  # the body, called here (thread executor)
        self.instance = instance  # passed to begin_step, as a plain call would
        self.ref = ref  # (task, bound, instance, owner): the body in another process
        self._heads: dict[int, bytes] = {}  # by store (alive as long as the fan-out)

    def head(self, store: Store) -> bytes:
        """The pickled body reference and store description sent with every job."""
        head = self._heads.get(id(store))
        if head is None:
            where = _describe_store(store)
            head = _pack((self.ref, where), what=f"task {self.spec.name!r}")
            self._heads[id(store)] = head
        return head


class _Item:
    """One missing item of a fan-out: its position in the input, its call, its arguments."""

    __slots__ = ("args", "call", "handle", "index", "kwargs")

    def __init__(self, index: int, call: Call, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.index = index
        self.call = call
        self.args = args
        self.kwargs = kwargs
        self.handle: Any = None


class _Journaled:
    """What a thread returns for a task with ``retry=`` / ``timeout=``: the runtime's own
    policy loop ran the body and journaled every try and the result already."""

    __slots__ = ("ok", "value")

    def __init__(self, ok: bool, value: Any) -> None:
        self.ok = ok
        self.value = value


class _Failed:
    """The handle of an item that could not be dispatched at all."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


Done = Callable[[_Item, Any], None]


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


# -- running a body ---------------------------------------------------------------------------
def _run_here(call: Call, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
    """The body of one item in a thread, inside a copy of the caller's context: tasks it
    calls are child steps of the item's step."""
    ctx = call.ctx
    if ctx is not None:
        current_step.set(call.step_id)
        ctx.items.enter(ctx, call.step_id, call)  # (for interrupt(): the step asking)
    call.started = now()
    spec = call.spec
    try:
        if spec.retry is not None or spec.timeout is not None:
            try:
                return _Journaled(True, _call_with_policy(spec, call, fn, args, kwargs))
            except BaseException as exc:  # noqa: BLE001 - journaled already: an outcome
                return _Journaled(False, exc)
        try:
            return fn(*args, **kwargs)
        finally:
            call.ended = now()  # the step's time is the body's, not its wait to be journaled
    finally:
        if ctx is not None:
            ctx.items.pop(call.step_id, None)


async def _run_here_async(call: Call, fn: Callable[..., Any], args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
    """The body of one async item, in a task of the caller's event loop: as
    :func:`_run_here` (registered as executing, for the steps it calls and interrupt())."""
    ctx = call.ctx
    if ctx is not None:
        current_step.set(call.step_id)
        ctx.items.enter(ctx, call.step_id, call)
    call.started = now()
    spec = call.spec
    try:
        if spec.retry is not None or spec.timeout is not None:
            try:
                return _Journaled(True, await _acall_with_policy(spec, call, fn, args, kwargs))
            except BaseException as exc:  # noqa: BLE001 - journaled already: an outcome
                return _Journaled(False, exc)
        try:
            return await fn(*args, **kwargs)
        finally:
            call.ended = now()
    finally:
        if ctx is not None:
            ctx.items.pop(call.step_id, None)


def _future_outcome(future: Any) -> _Outcome:
    if isinstance(future, _Failed):
        return _Outcome(False, future.exc, None)
    exc = future.exception() if isinstance(future, asyncio.Future) else future.exception(0)
    if exc is not None:
        return _Outcome(False, exc, None)
    result = future.result()
    if isinstance(result, _Journaled):
        return _Outcome(result.ok, result.value, None, True)
    return _Outcome(True, result, None)


# -- the fan-out ----------------------------------------------------------------------------
def _items(iterables: tuple[Iterable[Any], ...], name: str) -> list[tuple[Any, ...]]:
    if not iterables:
        raise TypeError(f"{name}.map() needs at least one iterable of inputs")
    for i, it in enumerate(iterables):
        try:
            iter(it)  # (an iterator, a generator: itself, nothing read)
        except TypeError:
            shown = repr(it)[:40]
            raise DefinitionError(
                f"{name}.map() takes iterables of inputs (one per parameter, like map()); "
                f"argument {i + 1} is {shown}, of type {type(it).__name__}. Fix: "
                f"{name}.map([{shown}]) for one call, or {name}.map(range(...)).") from None
    if len(iterables) == 1:
        return [(arg,) for arg in iterables[0]]
    lengths = [len(it) if isinstance(it, Sized) else "?" for it in iterables]
    try:  # (never reads an endless one, itertools.repeat(x), past the others' end)
        return list(zip(*iterables, strict=True))
    except ValueError:
        raise DefinitionError(
            f"{name}.map() was given iterables of different lengths {lengths} ('?': an "
            "iterator): the items past the shortest would be dropped (the built-in map() "
            "and zip() do so silently). Fix: give iterables of one length (a constant "
            "argument: [value] * n rather than itertools.repeat(value), or "
            "functools.partial / a default in the task).") from None




def _scan(target: Target, items: list[tuple[Any, ...]], fan: _FanOut) -> list[_Item]:
    """Step 1 of a fan-out, in the caller's thread and in input order: step identities,
    replays and cache hits. Returns the items whose bodies must run: of several items with
    one cache key, the first; the others wait for it (see :meth:`_FanOut.settle_waiting`)."""
    spec, instance = target.spec, target.instance
    results, bar = fan.results, fan.bar
    missing = []
    first: dict[str, _Item] = {}
    for index, args in enumerate(items):
        try:
            value, call = begin_step(spec, instance, args, {})
        except ReplayedFailure as replayed_failure:  # (its failure, from the journal)
            fan.failures[index] = replayed_failure.error
            bar.counts["failed"] += 1
            continue
        if value is _MISS:
            item = _Item(index, call, args, {})
            # (a cache=False task's every call is its own side effect; a fork's first attempt
            # reads no cache: its duplicates would wait for nothing)
            if spec.cache and (call.ctx is None or call.ctx.read_cache):
                primary = first.setdefault(call.key, item)
                if primary is not item:
                    fan.waiting.setdefault(primary.index, []).append(item)
                    continue
            missing.append(item)
            continue
        results[index] = value
        replayed = call is _SERVED
        bar.counts["replayed" if replayed else "cached"] += 1
    return missing


class _FanOut:
    """The bookkeeping of one ``map``: results in input order, failures, progress."""

    __slots__ = ("abandoned", "bar", "failures", "results", "spec", "total", "waiting")

    def __init__(self, spec: Spec, total: int, progress: bool) -> None:
        #: a second Ctrl-C stopped the wait for the bodies still running
        self.abandoned = False
        #: items with the cache key of an earlier item, by that item's index: served from
        #: the cache once it finishes, as a second call of the task would be
        self.waiting: dict[int, list[_Item]] = {}
        self.spec = spec
        self.total = total
        self.results: list[Any] = [None] * total
        self.failures: dict[int, BaseException] = {}
        self.bar = _Progress(spec.name, total, progress)

    def finish(self, item: _Item, outcome: _Outcome) -> None:
        """Journal and cache one item's result (or journal its failure), as it arrives."""
        call = item.call
        if outcome.started is not None:
            call.started = outcome.started
        if outcome.ended is not None:
            call.ended = outcome.ended
        if outcome.journaled:
            if outcome.ok:
                self.results[item.index] = outcome.value
            else:
                self.failures[item.index] = outcome.value
            self.bar.count("ran" if outcome.ok else "failed")
            return
        if outcome.ok:
            try:
                self.results[item.index] = call.succeeded(outcome.value)
            except Exception as exc:  # noqa: BLE001 - the result cannot be stored: a failure
                self.failures[item.index] = exc
                self.bar.count("failed")
                return
            self.bar.count("ran")
        else:
            _journal_failure(call, outcome.value)
            self.failures[item.index] = outcome.value
            self.bar.count("failed")

    def settle_waiting(self, item: _Item) -> list[_Item]:
        """After ``item`` finished: serve the items waiting for it from the cache, as a
        second call of the task with those inputs would be. Returns those that must run
        after all (it failed, or its result was not cached): the first of them, the
        others waiting for it in turn."""
        waiting = self.waiting.pop(item.index, None)
        if not waiting:
            return []
        if item.index not in self.failures:
            for other in list(waiting):
                data = cached_now(other.call)
                if data is None:
                    continue
                try:
                    value = serve_cached(other.call, data)
                except Exception as exc:  # noqa: BLE001 - (cannot journal it): its failure
                    waiting.remove(other)
                    self.failures[other.index] = exc
                    self.bar.count("failed")
                    continue
                if value is _MISS:  # (cannot load it: set aside) it runs after all
                    continue
                waiting.remove(other)
                self.results[other.index] = value
                self.bar.count("cached")
            if not waiting:
                return []
        if len(waiting) > 1:
            self.waiting[waiting[0].index] = waiting[1:]
        return waiting[:1]

    def raise_failures(self) -> None:
        """A stop (``StopRun``, ``KeyboardInterrupt``, ``SystemExit`` in an item) propagates
        as it is. Else interrupts win: one :class:`InterruptSignal` with every item's
        interrupts, in input order (other failures are journaled and named in a note). Else
        the failures, in input order, as one exception group."""
        if not self.failures:
            return
        ordered = [self.failures[i] for i in sorted(self.failures)]
        stops = [e for e in ordered if not isinstance(e, (Exception, InterruptSignal))]
        if stops:
            raise stops[0]
        signals = [e for e in ordered if isinstance(e, InterruptSignal)]
        errors = [e for e in ordered if not isinstance(e, InterruptSignal)]
        name, total = self.spec.name, self.total
        if signals:
            signal = signals[0] if len(signals) == 1 else InterruptSignal(
                [i for s in signals for i in s.interrupts])
            if errors:
                shown = "; ".join(repr(e)[:200] for e in errors[:5])
                signal.add_note(
                    f"durably: besides the interrupts, {len(errors)} item(s) of {name!r} failed "
                    f"(journaled; a rerun retries them): {shown}"
                )
            raise signal
        kept = total - len(errors)
        raise BaseExceptionGroup(
            f"{len(errors)} of {total} items of {name!r} failed; the {kept} that finished "
            "are kept, so a rerun executes only the failed and missing items",
            errors,
        )


def _take(batch: list[tuple[_Item, Any]], ex: Executor | None, fan: _FanOut,
          inflight: dict[int, _Item], outcomes: list[_Outcome] | None = None) -> list[_Item]:
    """Finish a batch of completed items (``outcomes`` already computed, or computed here).
    Returns the items that waited for them and must run now (see
    :meth:`_FanOut.settle_waiting`)."""
    failed = [(item, h) for item, h in batch if isinstance(h, _Failed)]
    done = [(item, h) for item, h in batch if not isinstance(h, _Failed)]
    if outcomes is None:
        outcomes = _outcomes_of(ex, done)
    again: list[_Item] = []
    for (item, _), outcome in zip(done, outcomes, strict=True):
        inflight.pop(item.index, None)
        fan.finish(item, outcome)
        again += fan.settle_waiting(item)
    for item, handle in failed:
        inflight.pop(item.index, None)
        fan.finish(item, _Outcome(False, handle.exc, None))
        again += fan.settle_waiting(item)
    return again


def _outcomes_of(ex: Executor | None, done: list[tuple[_Item, Any]]) -> list[_Outcome]:
    if not done:
        return []
    if ex is None:  # asyncio tasks on this loop
        return [_future_outcome(h) for _, h in done]
    return ex._outcomes(done)


def _stopping(ctx: RunContext | None, parent: str | None) -> bool:
    """Whether a map under ``parent`` must start no more items: its run is stopping (a
    closed stream, a lost lease), it is inside an item of a map that is stopping (Ctrl-C),
    or inside a body abandoned by its timeout."""
    abandoned = cutoff.get()
    if abandoned is not None and abandoned.cut:
        return True
    return ctx is not None and (ctx.stop or (bool(ctx.halting) and ctx.halted(parent)))


def _halt(ctx: RunContext | None, inflight: dict[int, _Item]) -> list[str]:
    """Mark the items of a stopping map whose bodies still run: nothing inside them starts
    any more (see :meth:`RunContext.halted`). Returns the marks, for :func:`_unhalt`."""
    if ctx is None:
        return []
    marks = [item.call.step_id for item in inflight.values()]
    ctx.halting.update(marks)
    return marks


def _unhalt(ctx: RunContext | None, marks: list[str]) -> None:
    """The bodies of a stopping map ended: take their marks back (the run may go on, if the
    caller handles the stop)."""
    if ctx is not None:
        ctx.halting.difference_update(marks)


def _drain(inbox: queue.SimpleQueue[tuple[_Item, Any]]) -> list[tuple[_Item, Any]]:
    batch = []
    while True:
        try:
            batch.append(inbox.get_nowait())
        except queue.Empty:
            return batch


# the states of a concurrent.futures (or asyncio) future that has ended, and that was cancelled
_ENDED = frozenset({"FINISHED", "CANCELLED", "CANCELLED_AND_NOTIFIED"})
_CANCELLED = frozenset({"CANCELLED", "CANCELLED_AND_NOTIFIED"})


def _in_state(handle: Any, states: frozenset[str], ask: Callable[[], bool]) -> bool:
    """Whether a future's state is one of ``states``, read without taking its lock.

    After a Ctrl-C the wait asks this of running futures while a second Ctrl-C may land.
    ``Future.done()`` and ``cancelled()`` take the future's condition in a ``with`` block: a
    KeyboardInterrupt raised between the lock's acquire and the block's start leaves it held
    for ever, and the worker thread finishing that future then blocks in ``set_result`` (the
    interpreter's exit hangs joining it). The state is one attribute, read atomically; a
    future of another kind (Dask's) is asked (``ask``)."""
    state = getattr(handle, "_state", None)
    return state in states if type(state) is str else ask()


def _not_cancelled(batch: list[tuple[_Item, Any]]) -> list[tuple[_Item, Any]]:
    return [(i, h) for i, h in batch
            if isinstance(h, _Failed) or not _in_state(h, _CANCELLED, h.cancelled)]


def _ended_unseen(inflight: dict[int, _Item]) -> list[tuple[_Item, Any]]:
    """After a stop: items whose body ended but whose message never came (lost to a Ctrl-C,
    or a callback never attached), taken as they are."""
    return [(i, i.handle) for i in list(inflight.values())
            if i.handle is not None and _in_state(i.handle, _ENDED, i.handle.done)]


def _still_waited(batch: list[tuple[_Item, Any]], inflight: dict[int, _Item],
                  stopping: bool) -> list[tuple[_Item, Any]]:
    """The batch without items taken already (a message that came after the item was found
    done) and, after a stop, without the items it cancelled (never started: nothing to
    journal), which are no longer waited for."""
    batch = [(i, h) for i, h in batch if inflight.get(i.index) is i]
    if not stopping:
        return batch
    kept = _not_cancelled(batch)
    if len(kept) < len(batch):
        for item, handle in batch:
            if not isinstance(handle, _Failed) and _in_state(handle, _CANCELLED,
                                                             handle.cancelled):
                inflight.pop(item.index, None)
    return kept


def _put_back(batch: list[tuple[_Item, Any]], inflight: dict[int, _Item],
              put: Callable[[tuple[_Item, Any]], Any]) -> None:
    """The messages of a batch's items not taken yet go back to the inbox (else a Ctrl-C
    landing while it was taken would leave the wait for them endless)."""
    for item, handle in batch:
        if inflight.get(item.index) is item:
            put((item, handle))


def map_sync(target: Target, iterables: tuple[Iterable[Any], ...], executor: Any,
             max_workers: int | None, progress: bool | None) -> list[Any]:
    """``Task.map`` for a sync task: see :meth:`durably.Task.map`."""
    enabled = progress_enabled(progress)
    ex, owned = _resolve_executor(executor, max_workers)
    clean = False
    fan: _FanOut | None = None
    try:
        items = _items(iterables, target.spec.name)
        fan = _FanOut(target.spec, len(items), enabled)
        try:
            missing = _scan(target, items, fan)
            if missing:
                ex._prepare()
                fan.bar.start()
                window = max_workers if max_workers is not None else ex._window()
                with Seceded():  # (on a Dask worker: out of its pool while it waits)
                    _drive(ex, target, missing, fan, window)
        finally:
            fan.bar.close()
        clean = True
    finally:
        if owned:
            # after a failure or Ctrl-C too, the attempt ends only once the bodies still
            # running have ended (the items not started are dropped): else the next call of
            # the run would execute them again while they run. _drive waited for them already
            # (journaling each), unless a second Ctrl-C stopped that wait: then not again
            ex.shutdown(wait=fan is None or not fan.abandoned, cancel_futures=not clean)
    fan.raise_failures()
    return fan.results


def _drive(ex: Executor, target: Target, missing: list[_Item], fan: _FanOut,
           window: int | None) -> None:
    """Steps 2 and 3 of a fan-out: dispatch the missing bodies (at most ``window`` at once)
    and finish each as it comes back, in this thread."""
    inbox: queue.SimpleQueue[tuple[_Item, Any]] = queue.SimpleQueue()
    todo = deque(missing)
    inflight: dict[int, _Item] = {}
    ctx = missing[0].call.ctx
    parent = missing[0].call.parent
    if ctx is not None and not isinstance(ex, Thread):
        ctx.flush_cache()  # workers read the store: the run's queued results first

    def done(item: _Item, handle: Any) -> None:
        inbox.put((item, handle))

    def fill() -> None:
        if todo and _stopping(ctx, parent):
            raise StopRun()
        while todo and (window is None or len(inflight) < window):
            item = todo.popleft()
            inflight[item.index] = item
            try:
                ex._start(item, target, done)
            except Exception as exc:  # noqa: BLE001 - cannot be sent: that item's failure
                inbox.put((item, _Failed(exc)))
            except BaseException:
                # (Ctrl-C while it was sent) not sent: not waited for; sent, perhaps without
                # its callback: the stop's wait finds it done (see collect)
                if item.handle is None:
                    inflight.pop(item.index, None)
                raise

    def collect(stopping: bool = False) -> None:
        while inflight:
            batch: list[tuple[_Item, Any]] = []
            try:
                try:
                    batch.append(inbox.get(timeout=_STOP_WAKE if stopping else _WAKE))
                    empty = False
                except queue.Empty:
                    empty = True
                if empty:  # (outside the handler: a Ctrl-C here is not "during Empty")
                    if ctx is not None:
                        ctx.keep_lease()
                    if not stopping:
                        continue
                    batch = _ended_unseen(inflight)
                batch = _still_waited([*batch, *_drain(inbox)], inflight, stopping)
                again = _take(batch, ex, fan, inflight)
                if not stopping:
                    todo.extendleft(reversed(again))
            except BaseException:
                _put_back(batch, inflight, inbox.put)
                raise
            if ctx is not None:
                ctx.keep_lease()
            fill()

    try:
        fill()
        collect()
    except BaseException as stop:
        # Ctrl-C, or the store failed: start nothing more. The bodies already running end
        # before the attempt does, and each one that finishes is journaled as it ends, so a
        # rerun never executes it again. A second Ctrl-C kills worker processes; bodies on
        # threads cannot be stopped (the process ends only once they have), so not waiting
        # would only lose their results: they are waited for whatever comes
        todo.clear()
        marks = _halt(ctx, inflight)
        ex._cancel(list(inflight.values()))
        name = target.spec.name
        if isinstance(stop, KeyboardInterrupt) and inflight:
            log.warning("durably: Ctrl-C: %r starts nothing more; waiting for its %d running "
                        "bodies to finish, journaling each (%s)", name, len(inflight),
                        "Ctrl-C again to kill the worker processes" if ex._stoppable() else
                        "bodies on threads cannot be stopped")
        told = False
        while True:
            try:
                collect(stopping=True)
            except Exception as exc:  # noqa: BLE001 - the first error is the one to report
                log.warning("durably: could not journal the finished items of %r: %s",
                            name, exc)
            except BaseException:
                if not ex._stoppable() and inflight:
                    if not told:
                        told = True
                        log.warning(
                            "durably: the %d running bodies of %r are on threads, which "
                            "cannot be stopped: the process ends only once they have, so "
                            "they are waited for and journaled. To stop now, kill the "
                            "process (kill -9 %d): those items then execute again on the "
                            "next call", len(inflight), name, os.getpid())
                    continue
                fan.abandoned = True  # (its bodies run on, or are killed: their marks stay)
                ex._stop_running()  # worker processes: killed, so the process ends now
                raise
            break
        _unhalt(ctx, marks)
        raise


async def map_async(target: Target, iterables: tuple[Iterable[Any], ...], executor: Any,
                    max_workers: int | None, progress: bool | None) -> list[Any]:
    """``Task.map`` for an async task: see :meth:`durably.Task.map`."""
    enabled = progress_enabled(progress)
    ex: Executor | None
    owned = False
    if executor is None or executor == "thread" or isinstance(executor, Thread):
        ex = None  # coroutines gathered on this event loop
        window = _check_workers(max_workers)
        if window is None and isinstance(executor, Thread):
            window = executor.max_workers
    else:
        ex, owned = _resolve_executor(executor, max_workers)
        window = max_workers if max_workers is not None else ex._window()
    items = _items(iterables, target.spec.name)
    fan = _FanOut(target.spec, len(items), enabled)
    try:
        missing = _scan(target, items, fan)
        if missing:
            if ex is not None:
                ex._prepare()
            fan.bar.start()
            with contextlib.nullcontext() if ex is None else Seceded():
                await _drive_async(ex, target, missing, fan, window)
    finally:
        fan.bar.close()
        if owned and ex is not None:
            ex.shutdown(wait=not fan.abandoned)
    fan.raise_failures()
    return fan.results


async def _drive_async(ex: Executor | None, target: Target, missing: list[_Item],
                       fan: _FanOut, window: int | None) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[_Item, Any]] = asyncio.Queue()
    todo = deque(missing)
    inflight: dict[int, _Item] = {}
    ctx = missing[0].call.ctx
    parent = missing[0].call.parent
    if ctx is not None and ex is not None and not isinstance(ex, Thread):
        ctx.flush_cache()  # workers read the store: the run's queued results first

    def done(item: _Item, handle: Any) -> None:  # from a worker's thread
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(inbox.put_nowait, (item, handle))

    def start(item: _Item) -> None:
        if ex is not None:
            ex._start(item, target, done)
            return
        coro = _run_here_async(item.call, target.local, item.args, item.kwargs)
        task = loop.create_task(coro, context=contextvars.copy_context())
        item.handle = task
        task.add_done_callback(lambda t: inbox.put_nowait((item, t)))

    def fill() -> None:
        if todo and _stopping(ctx, parent):
            raise StopRun()
        while todo and (window is None or len(inflight) < window):
            item = todo.popleft()
            inflight[item.index] = item
            try:
                start(item)
            except Exception as exc:  # noqa: BLE001 - cannot be sent: that item's failure
                inbox.put_nowait((item, _Failed(exc)))
            except BaseException:  # (cancelled while it was sent) as in _drive's fill
                if item.handle is None:
                    inflight.pop(item.index, None)
                raise

    def drain() -> list[tuple[_Item, Any]]:
        batch = []
        while not inbox.empty():
            batch.append(inbox.get_nowait())
        return batch

    async def take(batch: list[tuple[_Item, Any]]) -> list[_Item]:
        done_ = [(i, h) for i, h in batch if not isinstance(h, _Failed)]
        if isinstance(ex, Dask):  # gathering results waits on the network: not on the loop
            outcomes = await loop.run_in_executor(None, _outcomes_of, ex, done_)
        else:
            outcomes = _outcomes_of(ex, done_)
        return _take(batch, ex, fan, inflight, outcomes)

    async def collect(stopping: bool = False) -> None:
        while inflight:
            batch: list[tuple[_Item, Any]] = []
            try:
                try:
                    batch.append(await asyncio.wait_for(inbox.get(),
                                                        _STOP_WAKE if stopping else _WAKE))
                except TimeoutError:
                    if ctx is not None:
                        ctx.keep_lease()
                    if not stopping:
                        continue
                    batch = _ended_unseen(inflight)
                batch = _still_waited([*batch, *drain()], inflight, stopping)
                again = await take(batch)
                if not stopping:
                    todo.extendleft(reversed(again))
            except BaseException:
                _put_back(batch, inflight, inbox.put_nowait)
                raise
            if ctx is not None:
                ctx.keep_lease()
            fill()

    try:
        fill()
        await collect()
    except BaseException as stop:
        # as in _drive: nothing more starts, and the bodies still running on workers are
        # journaled as they end; a coroutine here is cancelled, unless the run stops at a
        # step boundary (StopRun: a closed stream, a lost lease): it finishes and is
        # journaled, as a thread's body does. Cancelling again stops waiting
        todo.clear()
        marks = _halt(ctx, inflight)
        if ex is None:
            if not isinstance(stop, StopRun):
                for item in inflight.values():
                    item.handle.cancel()
        else:
            ex._cancel(list(inflight.values()))
        try:
            await collect(stopping=True)
        except Exception as exc:  # noqa: BLE001 - the first error is the one to report
            log.warning("durably: could not journal the finished items of %r: %s",
                        target.spec.name, exc)
        except BaseException:  # cancelled while the bodies finish: they are cancelled now
            if ex is None:
                for item in inflight.values():
                    item.handle.cancel()
            raise
        # (cancelled again: it stops waiting, and the marks of the bodies left running stay)
        _unhalt(ctx, marks)
        raise


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


def _journal_failure(call: Call, exc: BaseException) -> None:
    """Journal a body's failure as the plain call path does (an interrupt is not one)."""
    if isinstance(exc, InterruptSignal):
        call.interrupted(exc)
    else:
        call.failed(exc)
