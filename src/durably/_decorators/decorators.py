"""``@task`` and ``@entrypoint``: wrap a function without changing how it is called.

The wrappers are :class:`wrapt.FunctionWrapper` subclasses, so they bind correctly on
functions, methods, classmethods and staticmethods, keep ``__name__``, ``__doc__``,
``__wrapped__`` and the signature, and ``inspect`` sees the original function. No execution
logic lives here: calls go to :mod:`durably._runtime.runtime`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
import pickle
import queue
import sys
import threading
import types
import warnings
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, NoReturn, ParamSpec, TypeVar, overload

import wrapt

from durably._keys import serde as _serde
from durably._keys.fingerprint import nameless_callable
from durably._runtime.config import default_store
from durably._runtime.context import StopRun, live_run
from durably._runtime.explain import Explanation, explain
from durably._runtime.failures import ReplayedFailure
from durably._runtime.history import NO_UPDATE, make_fork, unused_update
from durably._runtime.interrupt import InterruptSignal, pending_interrupts, record_answers
from durably._runtime.keep import keep_finished as keep_in
from durably._runtime.retry import Retry
from durably._runtime.run import _UNSET, Run, executing
from durably._runtime.runtime import (
    _MISS,
    MAIN_MODULES,
    Spec,
    begin_run,
    begin_step,
    call_async,
    call_sync,
    end_run,
    execute_sync,
    is_cancelled,
    validate_run_id,
)
from durably._store.records import RunRecord, now
from durably._trace.tracer import Event, RunGraph
from durably.exceptions import DefinitionError, NotFoundError, RunInterrupted, RunStateError
from durably.store import Store

__all__ = ["Entrypoint", "Task", "entrypoint", "fork", "task"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures
    from collections.abc import Coroutine, Iterable

    from wrapt import FunctionWrapper as _Wrapper

    from durably._executors.fanout import Executor, Target
else:
    # wrapt < 2.5 cannot subscript FunctionWrapper at run time: add the generic parameters here
    class _Wrapper(wrapt.FunctionWrapper, Generic[P, R]):
        pass


def _clear_task(spec: Spec) -> int:
    """Remove the cache entries of the task ``spec`` describes (see :meth:`Task.clear`)."""
    from durably._runtime.context import live_run

    ctx = live_run()
    if ctx is not None:  # inside a run: its store (the task's calls use it), its queue too
        store = ctx.store
        ctx.flush_cache()  # the entries its cheap steps queued: written now, then removed
    else:
        store = spec.store or default_store()
    return int(store.clear_task(spec.identity))


def _resolve(module: str, qualname: str) -> Any:
    """Find a decorated function again by module and qualified name (for pickling)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = vars(obj)[part] if isinstance(obj, type) else getattr(obj, part)
    return obj


#: the tasks of scripts and notebooks (``__main__``) alive in this process, by identity: a
#: task of one pickled here is unpickled as itself (see _reduce)
_MAIN_TASKS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_pickling = threading.local()  # ids of the tasks this thread is pickling by value


def _reduce(wrapper: Any) -> tuple[Any, ...]:
    raw = wrapper._self_spec.raw
    nameless = nameless_callable(raw) if getattr(raw, "__qualname__", None) is None else None
    if nameless is not None:
        return _reduce_nameless(wrapper, nameless[1])
    module, qualname = getattr(raw, "__module__", None), raw.__qualname__
    if module in MAIN_MODULES and "<locals>" not in qualname:
        reduced = _reduce_main_task(wrapper)
        if reduced is not None:
            return reduced
    if module is None or "<locals>" in qualname:
        raise pickle.PicklingError(
            f"cannot pickle {qualname!r}: it is defined inside a function. Fix: define it at "
            "module level so other processes can import it."
        )
    return (_resolve, (module, qualname))


def _reduce_nameless(wrapper: Any, runs: Any) -> tuple[Any, ...]:
    """A task or entrypoint of a partial or a callable object pickles by reference when the
    module of its code has a variable named like its ``name=`` holding it (``f1 =
    durably.task(partial(f, 1), name="f1")``); else a task pickles by value: the partial or
    the object itself (pickled as usual), its options, identity and fingerprint, so its
    calls in a worker process use the caller's cache keys."""
    spec = wrapper._self_spec
    module = getattr(runs, "__module__", None)
    found: Any = None
    if module is not None:
        with contextlib.suppress(Exception):  # (not importable by that name: by value)
            found = _resolve(module, spec.name)
    if found is wrapper:
        return (_resolve, (module, spec.name))
    if spec.kind != "task":
        raise pickle.PicklingError(
            f"cannot pickle {spec.kind} {spec.name!r} (of a {type(spec.raw).__qualname__}): "
            f"other processes find it by its name= in the module of its code, and "
            f"{module}.{spec.name} is not it. Fix: assign it there to a variable of that "
            f"name, or make the entrypoint of a function.")
    return (_rebuild_task, (spec.func, spec.name, spec.version, spec.cache,
                            tuple(sorted(spec.ignore)), spec.identity, spec.code_version(),
                            spec.code_parts(), spec.retry, spec.timeout))


def _under_cloudpickle(depth: int) -> bool:
    """Whether the frame ``depth`` levels up (or one of the two above it) is cloudpickle's
    (the package, or a copy of it such as joblib's)."""
    f: Any = sys._getframe(depth + 1)
    for _ in range(3):
        if f is None:
            return False
        if "cloudpickle" in f.f_code.co_filename:
            return True
        f = f.f_back
    return False


def _reduce_main_task(task: Any) -> tuple[Any, ...] | None:
    """A task of a script or a notebook (``__main__``), pickled by cloudpickle (Dask,
    joblib): in this process, or a worker that runs the script again, it is the task of
    that identity alive there (today's code, as a task pickled by name); anywhere else, it
    is rebuilt from its function with its identity and fingerprint, so its calls there use
    the caller's cache keys. A task met again while it is being pickled (a recursive one)
    is found by its identity when called. None for anything else (pickled by name)."""
    if type(task) is not Task or not _under_cloudpickle(3):
        return None
    spec = task._self_spec
    ids = _pickling.__dict__.setdefault("ids", set())
    if id(task) in ids:
        return (_main_task_later, (spec.identity,))
    ids.add(id(task))
    try:
        reduced = _task_by_value(task)
        if reduced is None:
            return None
        import cloudpickle

        payload = cloudpickle.dumps(reduced[1])
    except Exception:  # noqa: BLE001 - not by value: by name, as before
        return None
    finally:
        ids.discard(id(task))
    return (_main_task, (spec.identity, payload))


def _main_task(identity: str, payload: bytes) -> Any:
    """The inverse of :func:`_reduce_main_task`: the task alive here, else rebuilt."""
    live = _MAIN_TASKS.get(identity)
    if live is not None:
        return live
    import cloudpickle

    return _rebuild_task(*cloudpickle.loads(payload))


class _LaterTask:
    """A task referred to inside its own pickled function (a recursive task): the one of
    its identity alive when it is called (rebuilt by then)."""

    __slots__ = ("identity",)

    def __init__(self, identity: str) -> None:
        self.identity = identity

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _MAIN_TASKS[self.identity](*args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_main_task_later, (self.identity,))


def _main_task_later(identity: str) -> Any:
    live = _MAIN_TASKS.get(identity)
    return live if live is not None else _LaterTask(identity)


def _describe(kind: str, spec: Spec) -> str:
    """``<durably.Task 'pkg.mod.fetch'>``: the repr of a task or an entrypoint, by its
    module and name (wrapt's own showed two addresses and the wrapped object's type)."""
    module, _, name = spec.identity.partition(":")
    return f"<durably.{kind} {f'{module}.{name}'!r}>"


def _instance_of(bound: Any) -> Any:
    """The instance (or, for a classmethod, the class) a bound wrapper passes as ``self``."""
    instance = bound._self_instance
    if bound._self_binding == "classmethod":
        return bound._self_owner if instance is None else (
            instance if isinstance(instance, type) else type(instance))
    return instance


def _reduce_bound(bound: Any) -> tuple[Any, ...]:
    """A bound task or entrypoint (``obj.method``) pickles as the lookup of its name on
    what it is bound to, as a bound method does: ``getattr(obj, "method")``, with ``obj``
    pickled by value (a process pool, Dask, ``multiprocessing``)."""
    parent = bound._self_parent
    owner = bound._self_instance
    if owner is None or bound._self_binding == "classmethod":
        owner = _instance_of(bound)
        if owner is None:
            owner = bound._self_owner
    where = owner if isinstance(owner, type) else type(owner)
    for klass in where.__mro__:
        for name, value in vars(klass).items():
            if value is parent or getattr(value, "__func__", None) is parent:
                return (getattr, (owner, name))
    raise pickle.PicklingError(
        f"cannot pickle {parent.__qualname__!r} bound to {where.__qualname__}: it is not an "
        f"attribute of {where.__qualname__}. Fix: decorate the method in its class "
        "(@durably.task above its def).")


class _OwnClass:
    """A wrapper of a function that tells cloudpickle its own class: to everyone else it is
    the function it wraps (wrapt's proxy: ``inspect.isfunction`` and ``getfile`` work), but
    cloudpickle copies functions of ``__main__`` (scripts, notebooks) by value, and would
    copy the function a task wraps and drop the task: in a Dask or joblib worker, and in a
    class of ``__main__`` it rebuilds in this process (its task methods stripped)."""

    __slots__ = ()

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        wrapped = self.__wrapped__  # type: ignore[attr-defined]
        if isinstance(wrapped, types.FunctionType):
            f = sys._getframe(1)
            if f.f_code.co_name == "reducer_override" and "cloudpickle" in f.f_code.co_filename:
                return type(self)
        return wrapped.__class__  # type: ignore[no-any-return]


class _ByReference(_serde.SentByReference):
    """Pickled by module and name, copied as itself: like a plain function."""

    __slots__ = ()

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return _reduce(self)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        return self


class BoundTask(_OwnClass, wrapt.BoundFunctionWrapper):  # type: ignore[type-arg]
    """A task bound to an instance or class (``obj.method``); same methods as :class:`Task`."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return _reduce_bound(self)

    def __repr__(self) -> str:
        return _describe("Task", self._self_parent._self_spec)

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """See :meth:`Task.explain`."""
        return explain(self._self_parent._self_spec, None, _instance_of(self), args, kwargs)

    def clear(self) -> int:
        """See :meth:`Task.clear`."""
        return _clear_task(self._self_parent._self_spec)

    def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """See :meth:`Task.cache_key`."""
        return str(self._self_parent._self_spec.key_for(_instance_of(self), args, kwargs))

    def map(self, *iterables: Iterable[Any], executor: str | Executor | None = None,
            max_workers: int | None = None, progress: bool | None = None) -> Any:
        """See :meth:`Task.map`."""
        target = self._self_target()
        from durably._executors.fanout import (  # imported on first use: import time
            map_async,
            map_sync,
        )

        run = map_async if target.spec.is_async else map_sync
        return run(target, iterables, executor, max_workers, progress)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`Task.submit`."""
        target = self._self_target()
        if target.spec.is_async:
            from durably._executors.fanout import submit_async

            return submit_async(target, args, kwargs, None)
        from durably._executors.fanout import submit_sync

        return submit_sync(target, args, kwargs, None)

    def _self_target(self) -> Target:
        parent = self._self_parent
        ref = (parent, True, self._self_instance, self._self_owner)
        from durably._executors.fanout import Target

        return Target(parent._self_spec, self.__wrapped__, _instance_of(self), ref)


class BoundEntrypoint(wrapt.BoundFunctionWrapper):  # type: ignore[type-arg]
    """An entrypoint bound to an instance or class; ``.run`` works as on
    :class:`Entrypoint`."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return _reduce_bound(self)

    def __repr__(self) -> str:
        return _describe("Entrypoint", self._self_parent._self_spec)

    def run(self, *args: Any, run_id: str | None = None, fresh: bool = False,
            keep_finished: bool = False, **kwargs: Any) -> Any:
        """See :meth:`Entrypoint.run`."""
        parent = self._self_parent
        runner = parent._self_arun if parent._self_spec.is_async else parent._self_srun
        return runner(self.__wrapped__, _instance_of(self), args, kwargs, run_id, fresh, True,
                      keep_finished=_keep_option(keep_finished))

    def stream(self, *args: Any, run_id: str | None = None, fresh: bool = False,
               **kwargs: Any) -> Any:
        """See :meth:`Entrypoint.stream`."""
        return self._self_parent._self_stream(self.__wrapped__, _instance_of(self), args,
                                              kwargs, run_id, fresh)

    def resume(self, run_id: str, value: Any = None, *, keep_finished: bool = False) -> Any:
        """See :meth:`Entrypoint.resume`."""
        return self._self_parent._self_resume(self.__wrapped__, _instance_of(self), run_id,
                                              value, keep_finished=keep_finished)

    def fork(self, run_id: str, at: str | None = None, update: Any = NO_UPDATE, *,
             cache: bool = False) -> Any:
        """See :meth:`Entrypoint.fork`."""
        return self._self_parent._self_fork(self.__wrapped__, _instance_of(self), run_id, at,
                                            update, cache)

    def graph(self, *, collapse: int | None = 20) -> RunGraph:
        """See :meth:`Entrypoint.graph`."""
        graph: RunGraph = self._self_parent.graph(collapse=collapse)
        return graph


class Task(_OwnClass, _ByReference, _Wrapper[P, R]):
    """A function whose calls are cached by input and journaled inside runs.

    Made by :func:`task`; call it exactly like the function it wraps. It pickles by
    reference (module and name), so it travels to worker processes like a plain function.
    """

    __bound_function_wrapper__ = BoundTask

    def __init__(self, func: Callable[P, R], spec: Spec) -> None:
        # wrapt calls the partial with (wrapped, instance, args, kwargs): no method of ours
        # in between (every call of a task pays for each Python frame on its way)
        call: Any = functools.partial(call_async if spec.is_async else call_sync, spec)
        super().__init__(func, call)
        self._self_spec = spec
        # a call of the task itself goes straight to the call path: wrapt's own __call__
        # first looks for a bound method's __self__ on the function, and a plain function
        # has none, so every call raised and cleared an AttributeError (0.6 us, a tenth of
        # a cache hit)
        self._self_direct: Any = functools.partial(call, func, None) if (
            self._self_binding in ("function", "callable")  # (callable: a partial, an object)
            and not hasattr(func, "__self__")) else None
        # a synchronous one does call_sync's work itself: a replayed step or a cache hit
        # returns from here, one Python frame fewer
        self._self_sync: Spec | None = spec if (
            self._self_direct is not None and not spec.is_async) else None
        self._self_func = func
        if getattr(spec.raw, "__module__", None) in MAIN_MODULES:
            _MAIN_TASKS[spec.identity] = self

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        spec = self._self_sync
        if spec is not None:
            try:
                value, call = begin_step(spec, None, args, kwargs)
            except ReplayedFailure as replayed_failure:
                raise replayed_failure.error from None
            if value is not _MISS:
                return value  # type: ignore[no-any-return]
            return execute_sync(  # type: ignore[no-any-return]
                spec, call, self._self_func, args, kwargs)
        direct = self._self_direct
        if direct is not None:
            return direct(args, kwargs)  # type: ignore[no-any-return]
        return super().__call__(*args, **kwargs)

    def _reduce_for_worker(self, by_value: set[int]) -> Any:
        # a task of __main__, of a notebook or defined inside a function travels by value,
        # with its identity and fingerprint; any other by name
        if type(self) is Task and id(self) not in by_value:
            reduced = _task_by_value(self)
            if reduced is not None:
                by_value.add(id(self))  # (a recursive task refers to itself by name)
                return reduced
        return self.__reduce_ex__(5)

    def __repr__(self) -> str:
        return _describe("Task", self._self_spec)

    @property
    def spec(self) -> Spec:
        """The task's identity and options (name, identity, version, cache, ignore)."""
        spec: Spec = self._self_spec
        return spec

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """Say whether a call with these arguments would be served from the cache, and if
        not, why: which argument, which function of your code, or which version differs from
        the nearest earlier entry of this task. Nothing is executed or written.

        Args:
            *args: The call's positional arguments.
            **kwargs: The call's keyword arguments.

        Returns:
            An :class:`~durably.Explanation` (``.hit``, ``.changed_arguments``,
            ``.changed_code``, ``.version_change``; ``str()`` reads as a sentence).

        Raises:
            SerializationError: an argument cannot be digested.
            TypeError: the arguments do not fit the signature.

        Example:
            >>> import durably, tempfile
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> @durably.task
            ... def area(width, height):
            ...     return width * height
            >>> area(2, 3)
            6
            >>> area.explain(2, 3).hit
            True
            >>> area.explain(2, 4).changed_arguments
            ('height',)
            >>> durably.configure()
        """
        return explain(self._self_spec, None, None, args, kwargs)

    def clear(self) -> int:
        """Remove this task's entries from the cross-run cache, whatever their code version
        and inputs (joblib's ``f.clear()``); runs' journals are kept, so a run still replays
        its finished steps. The next call with any arguments executes. The store is the one
        its calls use: inside a run, the run's; else the task's (``store=``, or the
        default).

        Returns:
            How many entries were removed.

        Raises:
            StoreError: the store cannot be read or written.

        Example:
            >>> import durably, tempfile
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> @durably.task
            ... def square(x):
            ...     return x * x
            >>> square(2), square(3), square.clear(), square.explain(2).hit, square.clear()
            (4, 9, 2, False, 0)
            >>> durably.configure()
        """
        return _clear_task(self._self_spec)

    def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key (32 hex characters) a call with these arguments would use.

        Raises:
            SerializationError: an argument cannot be digested.
            TypeError: the arguments do not fit the signature.
        """
        return str(self._self_spec.key_for(None, args, kwargs))

    @overload
    def map(  # type: ignore[overload-overlap]
        self: Task[..., Coroutine[Any, Any, T]], *iterables: Iterable[Any],
        executor: str | Executor | None = None, max_workers: int | None = None,
        progress: bool | None = None,
    ) -> Coroutine[Any, Any, list[T]]: ...

    @overload
    def map(self: Task[..., T], *iterables: Iterable[Any], executor: str | Executor | None = None,
            max_workers: int | None = None, progress: bool | None = None) -> list[T]: ...

    def map(self, *iterables: Iterable[Any], executor: str | Executor | None = None,
            max_workers: int | None = None, progress: bool | None = None) -> Any:
        """Call the task on every item of ``iterables`` in parallel; the results in input
        order. Several iterables are zipped, item by item; they must have the same length
        (the built-in :func:`map` would drop the rest of the longer ones silently: a sweep
        missing points).

        Each item is a step of the run (or, outside a run, a cached call), and its identity
        is assigned before anything runs, in input order, so it never depends on which item
        finishes first: a fan-out killed halfway and run again executes exactly the items
        that had not finished, on any executor. Items the journal or the cache has are
        served at once; only the others are sent to the executor, and each result is
        journaled and cached the moment it comes back. Items with the same inputs (one
        cache key) execute once: the others wait for it and are served from the cache, as
        a second call would be (they execute after all if it failed; a ``cache=False``
        task's every item executes). An ``async`` task returns a coroutine
        (``await task.map(...)``); its items are gathered on the running event loop.

        On Ctrl-C (or any error of the map itself) nothing more starts, and the map waits for
        the bodies already running on threads or worker processes, which cannot be stopped,
        journaling each as it ends: a rerun executes only the items that never finished. A
        second Ctrl-C stops waiting. (An async task's coroutines on the loop, and Dask
        tasks, are cancelled instead; a terminal's Ctrl-C also reaches worker processes,
        whose bodies then stop with it and execute again on the rerun.) Maps and task
        calls inside the bodies it waits for start nothing more. A run asked to stop (the
        consumer of :meth:`Entrypoint.stream` left its loop) ends its map the same way.

        A progress bar (tqdm) with counts of ran and cached items shows in a terminal or a
        notebook when the fan-out takes more than half a second; it is off when output is
        not interactive, with ``progress=False``, or with ``DURABLY_PROGRESS=0``.

        Args:
            *iterables: One iterable per positional argument of the task.
            executor: Where the bodies run: ``"thread"`` (default; threads of this process,
                and tasks they call are child steps of the run), ``"process"`` (worker
                processes; functions and results travel with cloudpickle), ``"dask"`` (the
                current ``distributed.Client``), or an executor from
                :mod:`durably.executors` (``Thread``, ``Process``, ``Dask(client)``).
            max_workers: At most this many items run at once. Default: the executor's
                size (threads: ``min(32, os.cpu_count() + 4)``; processes:
                ``os.cpu_count()``; Dask: no limit).
            progress: Show the progress bar: None (default) when output is interactive.

        Returns:
            The results, one per item, in input order (a coroutine of them for an async
            task).

        Raises:
            ExceptionGroup: some items failed: their exceptions, in input order. The
                items that finished are journaled and cached, so a rerun executes only the
                failed and missing ones.
            DefinitionError: ``executor`` is not one of the above, or the iterables have
                different lengths.
            SerializationError: an argument cannot be digested (raised before anything
                runs), or cannot be sent to a worker process (that item's failure).

        Items that call ``interrupt()`` all pause: once the other items have finished, one
        interrupt carries every item's question, in input order (failures of other items
        are then journaled, and retried on resume).

        Example:
            >>> import durably, tempfile
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> @durably.task
            ... def power(base, exponent):
            ...     return base ** exponent
            >>> power.map([2, 3, 4], [1, 2, 3])
            [2, 9, 64]
            >>> power.map([2, 3, 4], [1, 2, 3], executor="thread", max_workers=2)
            [2, 9, 64]
            >>> durably.configure()
        """
        target = self._self_target()
        from durably._executors.fanout import (  # imported on first use: import time
            map_async,
            map_sync,
        )

        run = map_async if target.spec.is_async else map_sync
        return run(target, iterables, executor, max_workers, progress)

    @overload
    def submit(  # type: ignore[overload-overlap]
        self: Task[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> asyncio.Future[T]: ...

    @overload
    def submit(self: Task[P, T], *args: P.args, **kwargs: P.kwargs
               ) -> concurrent.futures.Future[T]: ...

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        """Start one call of the task on a thread and return a future of its result.

        The call's step identity is assigned now, in submission order, so it does not
        depend on which future finishes first; a call the journal or the cache has returns
        an already finished future. The result is journaled and cached before the future
        resolves. Wait for the futures inside the entrypoint. For another executor, use its
        ``submit``: ``durably.executors.Process().submit(task, *args)``.

        Args:
            *args: The call's positional arguments.
            **kwargs: The call's keyword arguments.

        Returns:
            A :class:`concurrent.futures.Future` (``.result()``, ``.done()``; works with
            ``concurrent.futures.wait`` and ``as_completed``). For an ``async`` task, an
            :class:`asyncio.Future` on the running loop (await it, or use
            ``asyncio.gather``).

        Raises:
            SerializationError: an argument cannot be digested.
            TypeError: the arguments do not fit the signature.
            RuntimeError: an async task was submitted outside a running event loop.

        Exceptions raised by the body propagate unchanged from ``.result()``.

        Example:
            >>> import concurrent.futures, durably, tempfile
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> @durably.task
            ... def half(x):
            ...     return x / 2
            >>> futures = [half.submit(x) for x in (2, 4, 6)]
            >>> sorted(f.result() for f in concurrent.futures.as_completed(futures))
            [1.0, 2.0, 3.0]
            >>> durably.configure()
        """
        target = self._self_target()
        if target.spec.is_async:
            from durably._executors.fanout import submit_async

            return submit_async(target, args, kwargs, None)
        from durably._executors.fanout import submit_sync

        return submit_sync(target, args, kwargs, None)

    def _self_target(self) -> Target:
        from durably._executors.fanout import Target

        return Target(self._self_spec, self.__wrapped__, None, (self, False, None, None))


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
        if self._self_spec.is_async:
            return self._self_arun(wrapped, instance, args, kwargs, None, False, False)
        return self._self_srun(wrapped, instance, args, kwargs, None, False, False)

    def run(self, *args: Any, run_id: str | None = None, fresh: bool = False,
            keep_finished: bool = False, **kwargs: Any) -> Run[R]:
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
            **kwargs: The entrypoint's keyword arguments.

        Returns:
            The :class:`~durably.Run` (``.id``, ``.status``, ``.result``, ``.steps``).

        Raises:
            RunStateError: ``run_id`` names a run of another entrypoint or other arguments,
                or exists while ``fresh=True``.
            DefinitionError: ``run_id`` is not a valid run id.
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
        if self._self_spec.is_async:
            return self._self_arun(  # type: ignore[return-value]
                wrapped, None, args, kwargs, run_id, fresh, True, keep_finished=keep)
        run: Run[R] = self._self_srun(wrapped, None, args, kwargs, run_id, fresh, True,
                                      keep_finished=keep)
        return run

    def stream(self, *args: Any, run_id: str | None = None, fresh: bool = False,
               **kwargs: Any) -> Iterator[Event]:
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
                                 fresh)

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
                given by accident). When several interrupts are pending (parallel
                branches), a mapping ``{interrupt_id: value}``; answering only some keeps
                the rest pending (the run pauses again at them). A web handler answers by
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
                   on_lease: Any = None, keep_finished: bool = False) -> Any:
        started = begin_run(self._self_spec, instance, args, kwargs, run_id=run_id,
                            fresh=fresh, listener=listener, read_cache=read_cache, store=store,
                            on_lease=on_lease)
        if keep_finished:
            keep_in(started.ctx)
        try:
            try:
                result = wrapped(*args, **kwargs)
            except BaseException as exc:
                _settle_submitted(started.ctx)
                signal = _as_interrupt(started.ctx, exc)
                if signal is not None:
                    end_run(started, exc=signal)
                    return _paused(started, signal, handle)
                end_run(started, exc=exc)
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

    async def _self_arun(self, wrapped: Any, instance: Any, args: Any, kwargs: Any,
                         run_id: str | None, fresh: bool, handle: bool,
                         listener: Any = None, read_cache: bool = True,
                         store: Store | None = None, on_lease: Any = None,
                         keep_finished: bool = False) -> Any:
        started = begin_run(self._self_spec, instance, args, kwargs, run_id=run_id,
                            fresh=fresh, listener=listener, read_cache=read_cache, store=store,
                            on_lease=on_lease)
        if keep_finished:
            keep_in(started.ctx)
        try:
            try:
                result = await wrapped(*args, **kwargs)
            except BaseException as exc:
                await _settle(started.ctx)
                signal = _as_interrupt(started.ctx, exc)
                if signal is not None:
                    end_run(started, exc=signal)
                    return _paused(started, signal, handle)
                end_run(started, exc=exc)
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

    def _self_stream(self, wrapped: Any, instance: Any, args: Any, kwargs: Any,
                     run_id: str | None, fresh: bool, on_lease: Any = None) -> Any:
        if self._self_spec.is_async:
            return _AsyncStream(self._self_spec.name.rpartition(".")[2], _stream_async(
                self, wrapped, instance, args, kwargs, run_id, fresh, on_lease))
        return _stream_sync(self, wrapped, instance, args, kwargs, run_id, fresh, on_lease)

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

    def _self_answering(self, run_id: str, value: Any
                        ) -> tuple[Any, Any, Callable[[Store, RunRecord | None], None]]:
        """The stored arguments of an interrupted run, and the function that journals
        ``value`` as its answer once the run's lease is held (``on_lease``)."""
        if value is None:  # an approval is never answered by accident (as the CLI says)
            raise DefinitionError(
                f"resume({run_id!r}) was given no answer (None is not one: an approval must "
                "never be answered by accident). Fix: resume(run_id, answer), for example "
                "resume(run_id, \"yes\") or resume(run_id, True).")
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


def _require_interrupted(rec: RunRecord, store: Store | None = None) -> None:
    if rec.status == "interrupted":
        return
    # (store None: read under the run's lease, so no other attempt executes it now)
    if rec.status == "running" and (store is None or not executing(store, rec.run_id)):
        raise RunStateError(
            f"run {rec.run_id!r} crashed (its process is gone) while running, so it is not "
            "waiting for an answer: resume() answers an interrupt(). An answer the crashed "
            "attempt was given is recorded. Fix: call the entrypoint again with the same "
            "arguments (a graph: app.invoke(None, run_id=...)) to continue it.")
    if rec.status == "running":
        raise RunStateError(
            f"run {rec.run_id!r} is being executed right now (another process or thread "
            "called the entrypoint again, or resumed it), so it is not waiting for an answer; "
            "this answer is not recorded. Fix: wait for that attempt to end: if it pauses at "
            "the question again (durably.get_run(run_id).status == 'interrupted'), call "
            "resume() again.")
    raise RunStateError(
        f"run {rec.run_id!r} is {rec.status}, not interrupted: resume() answers an "
        "interrupt(), and this run is not waiting for one"
        + (" (another process may have resumed it just now). Fix: call the entrypoint again "
           "with the same arguments to continue it." if rec.status in ("failed", "stopped",
                                                                       "running") else
           ". Fix: read its result with durably.get_run(run_id).result."
           if rec.status == "finished" else "."))


def _as_interrupt(ctx: Any, exc: BaseException | None) -> InterruptSignal | None:
    """The interrupt an attempt ended with: the signal itself, a group of signals (an
    asyncio.TaskGroup), or interrupts raised and then swallowed by the user's code
    (``gather(return_exceptions=True)``, a bare ``except:``) — never a silent finish. All
    interrupts raised in the attempt are reported, in the order they were raised."""
    raised = list(ctx.raised)
    if exc is not None and not isinstance(exc, InterruptSignal):
        if not isinstance(exc, BaseExceptionGroup):
            return None
        signals, rest = exc.split(InterruptSignal)
        if signals is None or (rest is not None and not all(
                is_cancelled(e) for e in _leaves(rest))):
            return None
    if not raised and isinstance(exc, InterruptSignal):
        return exc
    if not raised:
        return None
    first = list(exc.interrupts) if isinstance(exc, InterruptSignal) else []
    seen = {i.id for i in first}
    return InterruptSignal(first + [i for i in raised if i.id not in seen])


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    found: list[BaseException] = []
    for e in group.exceptions:
        found.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return found


def _settle_submitted(ctx: Any, finished: bool = False) -> None:
    """Wait for the steps the attempt submitted (``task.submit``) and did not wait for: a
    run ends when its steps have ended, and their interrupts are reported with it. A run
    whose body ``finished`` warns of submitted calls that failed while nobody asked their
    futures: the run finishes without them, and they execute again on every rerun."""
    import concurrent.futures

    pending = [f for f in list(ctx.inflight)
               if isinstance(f, concurrent.futures.Future) and not f.done()]
    if pending:
        concurrent.futures.wait(pending)
    if not finished or not ctx.unwaited:
        return
    unseen = [(task, error) for task, asked, error in ctx.unwaited if not asked[0]]
    if unseen:
        shown = "; ".join(f"{task}: {error}" for task, error in unseen[:3])
        warnings.warn(
            f"durably: run {ctx.run_id!r} finished, but {len(unseen)} call(s) it submitted "
            f"failed and nobody asked their futures ({shown}{'; ...' if len(unseen) > 3 else ''}"
            "): the run finished without their results, and they execute again on every "
            "rerun. Fix: wait for each future (future.result()), or catch its error.",
            stacklevel=4)


async def _settle(ctx: Any) -> None:
    """Before an async attempt ends: stop its other branches from starting new steps and
    wait for the steps still running (an ``asyncio.gather`` does not cancel siblings), so
    the run is not released while its steps still execute."""
    import asyncio  # (on a running loop: imported already; not at `import durably`)

    ctx.stop = True
    me = asyncio.current_task()
    running = {t for t in ctx.inflight if t is not me and not t.done()}
    if running:
        await asyncio.wait(running)


def _paused(started: Any, signal: InterruptSignal, handle: bool) -> Any:
    """An attempt that ended at ``interrupt()``: the handle, or :class:`RunInterrupted`."""
    if handle:
        run = _handle(started, None)
        run._result = _UNSET
        run._pending = list(signal.interrupts)  # in call order (a fan-out's: input order)
        return run
    raise RunInterrupted(started.record.run_id, signal.interrupts,
                         started.record.name) from None


class _Listener:
    """Passes a run's live events on, and can ask the run to stop.

    With ``lockstep``, the thread that emits an event waits until the consumer asks for the
    next one, so the run never gets ahead of the loop that reads it (a ``break`` stops the
    run right after the event the consumer saw)."""

    __slots__ = ("_ack", "closed", "ctx", "put")

    def __init__(self, put: Callable[[Event], Any], lockstep: bool = False) -> None:
        self.put = put
        self.ctx: Any = None
        self.closed = False
        self._ack = threading.Semaphore(0) if lockstep else None

    def __call__(self, event: Event) -> None:
        if self.closed:
            return
        self.put(event)
        if self._ack is not None:
            self._ack.acquire()

    def next(self) -> None:
        """The consumer wants the next event."""
        if self._ack is not None:
            self._ack.release()

    def stop(self) -> None:
        self.closed = True
        ctx = self.ctx
        if ctx is not None:
            ctx.stop = True
        if self._ack is not None:
            # wake every emitting thread (a fan-out, parallel nodes: each may be waiting)
            self._ack.release(max(64, threading.active_count()))


_DONE: Any = object()


def _stream_sync(ep: Entrypoint[Any, Any], wrapped: Any, instance: Any, args: Any,
                 kwargs: Any, run_id: str | None, fresh: bool, on_lease: Any = None
                 ) -> Iterator[Event]:
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    listener = _Listener(events.put, lockstep=True)
    failure: list[BaseException] = []

    def work() -> None:
        try:
            ep._self_srun(wrapped, instance, args, kwargs, run_id, fresh, True, listener,
                          on_lease=on_lease)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            failure.append(exc)
        finally:
            listener.closed = True
            events.put(_DONE)

    context = contextvars.copy_context()  # the caller's context vars, as .run() would see them
    worker = threading.Thread(target=context.run, args=(work,), name="durably-stream",
                              daemon=True)
    worker.start()
    try:
        while True:
            event = events.get()
            if event is _DONE:
                break
            yield event
            listener.next()
    finally:
        listener.stop()
        worker.join()
    if failure and not isinstance(failure[0], StopRun):
        raise failure[0]


class _AsyncStream:
    """What ``stream()`` of an async entrypoint returns: its async generator of events (``async
    for``, ``contextlib.aclosing``, ``aclose``), which a plain ``for`` refuses naming the fix
    (Python's own error said only that an async generator is not iterable)."""

    __slots__ = ("agen", "name")

    def __init__(self, name: str, agen: Any) -> None:
        self.name, self.agen = name, agen

    def __aiter__(self) -> Any:
        return self.agen.__aiter__()

    def __anext__(self) -> Any:
        return self.agen.__anext__()

    def asend(self, value: Any) -> Any:
        return self.agen.asend(value)

    def athrow(self, *exc: Any) -> Any:
        return self.agen.athrow(*exc)

    def aclose(self) -> Any:
        return self.agen.aclose()

    def __iter__(self) -> NoReturn:
        raise DefinitionError(
            f"{self.name}.stream() of an async entrypoint is an async iterator. Fix: "
            f"`async for event in {self.name}.stream(...)` inside a coroutine (close it "
            "with contextlib.aclosing), or make the entrypoint a plain def.")


async def _stream_async(ep: Entrypoint[Any, Any], wrapped: Any, instance: Any, args: Any,
                        kwargs: Any, run_id: str | None, fresh: bool, on_lease: Any = None
                        ) -> AsyncIterator[Event]:
    import asyncio  # (on a running loop: imported already; not at `import durably`)

    loop = asyncio.get_running_loop()
    events: asyncio.Queue[Any] = asyncio.Queue()
    listener = _Listener(lambda event: loop.call_soon_threadsafe(events.put_nowait, event))

    async def work() -> None:
        try:
            await ep._self_arun(wrapped, instance, args, kwargs, run_id, fresh, True, listener,
                                on_lease=on_lease)
        finally:
            loop.call_soon_threadsafe(events.put_nowait, _DONE)

    job = asyncio.ensure_future(work())
    try:
        while True:
            event = await events.get()
            if event is _DONE:
                break
            yield event
    finally:
        listener.stop()
        await asyncio.wait([job])
        if not job.cancelled():
            job.exception()  # retrieved: a StopRun after a break is expected, not an error
    exc = None if job.cancelled() else job.exception()
    if exc is not None and not isinstance(exc, StopRun):
        raise exc


def _handle(started: Any, result: Any) -> Run[Any]:
    run: Run[Any] = Run(started.record, started.ctx.store, result)
    run.resumed_from = started.resumed_from
    run.wall_time = now() - started.wall
    return run


def _check_bare(kind: str, func: Any) -> None:
    if isinstance(func, str):
        raise DefinitionError(
            f"@{kind}({func!r}): options are keywords. Fix: @{kind}(name={func!r})"
        )


@overload
def task(func: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(
    *,
    name: str | None = None,
    version: str | None = None,
    cache: bool = True,
    ignore: tuple[str, ...] = (),
    retry: int | Retry | None = None,
    timeout: float | None = None,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    version: str | None = None,
    cache: bool = True,
    ignore: tuple[str, ...] = (),
    retry: int | Retry | None = None,
    timeout: float | None = None,
) -> Any:
    """Make a function a durable task: its result is cached on disk by its code and inputs,
    and inside a run each call is a journaled step that never executes twice.

    Works on sync and ``async def`` functions, methods, classmethods and staticmethods (put
    ``@task`` above ``@classmethod`` / ``@staticmethod``). The task keeps the function's
    signature, docstring and ``__wrapped__``. Arguments are bound by name with defaults
    applied, as joblib.Memory does, so ``f(1)``, ``f(x=1)`` and ``f(1, y=<default>)`` share
    one cache entry. For a method, ``self`` is part of the inputs (ignore it with
    ``ignore=("self",)``).

    It also takes what joblib.Memory and LangGraph take besides functions: a
    :func:`functools.partial` (``durably.task(partial(fetch, url), name="fetch_home")``,
    nested ones too) and a callable object (an instance of a class with ``__call__``, sync or
    ``async def``), called as themselves. Their calls bind by the partial's or the object's
    signature (``t(2)`` and ``t(x=2)`` share an entry). Their code fingerprint is that of
    the function they run (the partial's function; the class's ``__call__`` and the rest of
    the class's code) and of the values they hold, taken as configuration like a closure's
    values: the partial's bound arguments and the object's attributes. So two partials bound
    to different values, or two objects configured differently, never share an entry, and an
    object changed in place is noticed on its next call (a value over 64 KiB, such as a
    model's weights, only by identity and from time to time: rebind it, pass it as an
    argument, or give ``version=``).

    Args:
        func: The function (when used as ``@task`` without parentheses), a
            :func:`functools.partial` or a callable object.
        name: The task's name; with its module (the module of the code it runs) it forms
            the task identity. Default: the function's qualified name. Required for a
            partial and a callable object, which have none: ``durably.task(partial(f, 1),
            name="f_1")``.
        version: A string that replaces the code fingerprint in the cache key: the cache
            is then kept across code edits until you change the string.
        cache: False for a side-effect task: never served from the cross-run cache, but
            inside a run it is journaled, so it is not executed twice in that run.
        ignore: Argument names left out of the input digest (a logger, a verbose flag).
        retry: Retry a failing body: a number of attempts (``retry=3``) or a
            :class:`~durably.Retry` (attempts, backoff in seconds, which exceptions). Built
            on tenacity; inside a run every failed try is journaled.
        timeout: Seconds each try may take before :class:`~durably.TaskTimeoutError`
            (an async task is cancelled; a sync one is abandoned in a background thread).

    Returns:
        A :class:`Task` (or, with options, a decorator making one).

    Raises:
        DefinitionError: ``func`` is a class, a generator function or not callable; an
            option has the wrong type; ``ignore`` names an unknown argument; ``func`` is a
            partial or a callable object and ``name`` is not given.

    Calling the task raises :class:`~durably.SerializationError` when an argument cannot be
    digested or the result cannot be stored (before anything is written); exceptions raised
    by the body propagate unchanged and are never cached.

    Example:
        >>> import durably, tempfile
        >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
        >>> calls = []
        >>> @durably.task
        ... def slow_square(x: int) -> int:
        ...     calls.append(x)
        ...     return x * x
        >>> slow_square(4), slow_square(x=4), calls
        (16, 16, [4])

        A partial, named with ``name=``:

        >>> import functools
        >>> def power(base, exponent):
        ...     calls.append((base, exponent))
        ...     return base ** exponent
        >>> cube = durably.task(functools.partial(power, exponent=3), name="cube")
        >>> cube(2), cube(base=2), calls[-1]
        (8, 8, (2, 3))
        >>> durably.configure()
    """
    _check_bare("task", func)

    def decorate(f: Callable[P, R]) -> Task[P, R]:
        spec = Spec(f, kind="task", name=name, version=version, cache=cache, ignore=tuple(ignore)
                    if isinstance(ignore, (list, tuple)) else ignore, retry=retry,
                    timeout=timeout)
        return Task(f, spec)

    return decorate(func) if func is not None else decorate


@overload
def entrypoint(func: Callable[P, R], /) -> Entrypoint[P, R]: ...


@overload
def entrypoint(
    *, name: str | None = None, store: Store | str | os.PathLike[str] | None = None
) -> Callable[[Callable[P, R]], Entrypoint[P, R]]: ...


def entrypoint(func: Any = None, /, *, name: str | None = None,
               store: Store | str | os.PathLike[str] | None = None) -> Any:
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

    Returns:
        An :class:`Entrypoint` (or, with options, a decorator making one).

    Raises:
        DefinitionError: ``func`` is a class, a generator function or not callable, an
            option has the wrong type, or ``func`` is a partial or a callable object and
            ``name`` is not given.

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

    store = store_from(store, "@entrypoint(store=...)")  # a URL or a path: its store
    if store is not None and not isinstance(store, _StoreProto):
        raise DefinitionError(
            f"@entrypoint(store=...) needs a durably store (DiskStore, MemoryStore, or a "
            f"subclass of durably.store.Store) or its URL, got {type(store).__qualname__}. "
            "Fix: @entrypoint(store=\"path/to/store\")."
        )

    def decorate(f: Callable[P, R]) -> Entrypoint[P, R]:
        spec = Spec(f, kind="entrypoint", name=name, store=store)
        taken = [n for n in ("run_id", "fresh") if n in spec.signature.parameters]
        if taken:
            raise DefinitionError(
                f"@entrypoint {spec.name!r} has a parameter named {taken[0]!r}, which "
                f"{spec.name}.run(..., {taken[0]}=...) and .stream() take for themselves, so "
                f"your argument would be taken as the run option. Fix: rename the parameter "
                f"(for example {taken[0]}_ or my_{taken[0]}).")
        return Entrypoint(f, spec)

    return decorate(func) if func is not None else decorate


def _task_by_value(task: Task[Any, Any]) -> tuple[Any, ...] | None:
    """How to rebuild a task that another process cannot import by name, else None."""
    spec: Spec = task._self_spec
    module = getattr(spec.raw, "__module__", None)
    qualname = getattr(spec.raw, "__qualname__", None)  # (None: a partial, a callable object)
    if module not in (None, "__main__") and qualname and "<locals>" not in qualname:
        try:
            if _resolve(module, qualname) is task:
                return None
        except Exception:  # noqa: BLE001 - not importable by name: send it by value
            pass
    code = spec.code_version()
    parts = spec.code_parts()
    return (_rebuild_task, (spec.func, spec.name, spec.version, spec.cache,
                            tuple(sorted(spec.ignore)), spec.identity, code, parts,
                            spec.retry, spec.timeout))


def _rebuild_task(func: Any, name: str, version: str | None, cache: bool,
                  ignore: tuple[str, ...], identity: str, code: str, parts: dict[str, str],
                  retry: Any = None, timeout: float | None = None) -> Task[Any, Any]:
    """A task sent by value, with the identity and fingerprint it had in the caller: the code
    is the caller's code, so its calls here use the caller's cache keys."""
    from durably._keys.revalidate import Fingerprint

    spec = Spec(func, kind="task", name=name, version=version, cache=cache, ignore=ignore,
                retry=retry, timeout=timeout)
    spec.identity = identity
    if version is None:
        spec._fingerprint = Fingerprint(code, [], [], dict(parts))
    return Task(func, spec)
