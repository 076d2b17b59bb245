"""``@task``: :class:`Task`, the wrapper whose calls are cached by input and journaled
inside runs, :class:`BoundTask` (a task bound to an instance or class), and :func:`task`,
the decorator that makes one.

A task keeps the call signature of the function it wraps; a call goes straight to
:mod:`durably._runtime.call` (a synchronous one does ``call_sync``'s work itself, one
Python frame fewer). Its pickling lives in :mod:`.pickling`, entrypoints in
:mod:`.entrypoint`.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

import wrapt

from durably._decorators.pickling import (
    _MAIN_TASKS,
    _ByReference,
    _OwnClass,
    _reduce_bound,
    _task_by_value,
)
from durably._decorators.wrapper import _check_bare, _describe, _instance_of
from durably._runtime.call import begin_step, call_async, call_sync, execute_sync
from durably._runtime.explain import Explanation, explain
from durably._runtime.failures import ReplayedFailure
from durably._runtime.prune import Removed, clear_task
from durably._runtime.retry import Retry
from durably._runtime.spec import MAIN_MODULES, Spec
from durably._runtime.step import _MISS

__all__ = ["Task", "task"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures
    from collections.abc import Coroutine, Iterable

    from wrapt import FunctionWrapper as _Wrapper

    from durably._executors.items import Target
    from durably._executors.pools import Executor
else:
    from durably._decorators.wrapper import _Wrapper


class BoundTask(_OwnClass, wrapt.BoundFunctionWrapper):  # type: ignore[type-arg]
    """A task bound to an instance or class (``obj.method``); same methods as :class:`Task`."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return _reduce_bound(self)

    def __repr__(self) -> str:
        return _describe("Task", self._self_parent._self_spec)

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """See :meth:`Task.explain`."""
        return explain(self._self_parent._self_spec, None, _instance_of(self), args, kwargs)

    def clear(self) -> Removed:
        """See :meth:`Task.clear`."""
        return clear_task(self._self_parent._self_spec)

    def refresh(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`Task.refresh`."""
        spec = self._self_parent._self_spec.refreshing()
        call = call_async if spec.is_async else call_sync
        return call(spec, self.__wrapped__, _instance_of(self), args, kwargs)

    def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """See :meth:`Task.cache_key`."""
        return str(self._self_parent._self_spec.key_for(_instance_of(self), args, kwargs))

    def map(self, *iterables: Iterable[Any], executor: str | Executor | None = None,
            max_workers: int | None = None, progress: bool | None = None) -> Any:
        """See :meth:`Task.map`."""
        target = self._self_target()
        from durably._executors.fanout import map_async, map_sync

        run = map_async if target.spec.is_async else map_sync
        return run(target, iterables, executor, max_workers, progress)

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        """See :meth:`Task.submit`."""
        target = self._self_target()
        if target.spec.is_async:
            from durably._executors.pools import submit_async

            return submit_async(target, args, kwargs, None)
        from durably._executors.pools import submit_sync

        return submit_sync(target, args, kwargs, None)

    def _self_target(self) -> Target:
        parent = self._self_parent
        ref = (parent, True, self._self_instance, self._self_owner)
        from durably._executors.items import Target

        return Target(parent._self_spec, self.__wrapped__, _instance_of(self), ref)


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

    def clear(self) -> Removed:
        """Remove this task's entries from the cross-run cache, whatever their code version
        and inputs (joblib's ``f.clear()``; ``durably cache clear --task NAME``); runs'
        journals are kept, so a run still replays its finished steps. The next call with
        any arguments executes. The store is the one its calls use: inside a run, the
        run's; else the task's (``store=``, or the default). Works on every store; to
        remove only some of its entries, see :func:`durably.prune` (``task=...``).

        Returns:
            A :class:`~durably.Removed`: ``.entries`` removed, and ``.bytes`` by which the
            cache shrank (None for a store without the capability ``"maintenance"``).

        Raises:
            StoreError: the store cannot be read or written.

        Example:
            >>> import durably, tempfile
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> @durably.task
            ... def square(x):
            ...     return x * x
            >>> square(2), square(3), square.clear().entries, square.explain(2).hit
            (4, 9, 2, False)
            >>> square.clear().entries
            0
            >>> durably.configure()
        """
        return clear_task(self._self_spec)

    def refresh(self, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Execute this call again, whatever the cache holds, and replace its cache entry
        with the new result (joblib's ``MemorizedFunc.call``). Nothing else changes: the
        next plain call with these arguments is served the new entry.

        Inside a run the call is a step like any other, journaled as ``ran`` (never served
        from the cache); a step the run already finished is replayed from its journal, as
        always: a run never executes a finished step twice. A result ``cache_if`` refuses is
        not cached, and the entry it was to replace is removed.

        Args:
            *args: The call's positional arguments.
            **kwargs: The call's keyword arguments.

        Returns:
            The new result (a coroutine of it for an ``async`` task).

        Raises:
            SerializationError: an argument cannot be digested, or the result cannot be
                stored.
            TypeError: the arguments do not fit the signature.

        Exceptions raised by the body propagate unchanged, and the entry is kept.

        Example:
            >>> import durably, tempfile
            >>> durably.configure(store=durably.DiskStore(tempfile.mkdtemp()))
            >>> prices = {"apple": 1.0}
            >>> @durably.task(version="1")
            ... def price(item):
            ...     return prices[item]
            >>> price("apple")
            1.0
            >>> prices["apple"] = 1.25  # a source durably cannot see
            >>> price("apple"), price.refresh("apple"), price("apple")
            (1.0, 1.25, 1.25)
            >>> durably.configure()
        """
        spec = self._self_spec.refreshing()
        call: Any = call_async if spec.is_async else call_sync
        return call(spec, self._self_func, None, args, kwargs)  # type: ignore[no-any-return]

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
        from durably._executors.fanout import map_async, map_sync

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
            from durably._executors.pools import submit_async

            return submit_async(target, args, kwargs, None)
        from durably._executors.pools import submit_sync

        return submit_sync(target, args, kwargs, None)

    def _self_target(self) -> Target:
        from durably._executors.items import Target

        return Target(self._self_spec, self.__wrapped__, None, (self, False, None, None))


@overload
def task(func: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(
    *,
    name: str | None = None,
    version: str | None = None,
    cache: bool = True,
    ignore: tuple[str, ...] = (),
    retry: int | Retry | Sequence[Retry] | None = None,
    timeout: float | None = None,
    mmap: bool = False,
    compress: bool | int | None = None,
    expires_after: datetime.timedelta | float | None = None,
    cache_if: Callable[[Any, float], bool] | None = None,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    version: str | None = None,
    cache: bool = True,
    ignore: tuple[str, ...] = (),
    retry: int | Retry | Sequence[Retry] | None = None,
    timeout: float | None = None,
    mmap: bool = False,
    compress: bool | int | None = None,
    expires_after: datetime.timedelta | float | None = None,
    cache_if: Callable[[Any, float], bool] | None = None,
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
        retry: Retry a failing body: a number of attempts (``retry=3``), a
            :class:`~durably.Retry` (attempts, backoff in seconds, which exceptions), or a
            list of them, the first whose ``on`` matches a failure applying (``retry=
            [Retry(on=(TimeoutError,), attempts=5), Retry(attempts=2)]``). Built on
            tenacity; inside a run every failed try is journaled.
        timeout: Seconds each try may take before :class:`~durably.TaskTimeoutError`
            (an async task is cancelled; a sync one is abandoned in a background thread).
        mmap: Store the numpy arrays in its results (the result itself, or arrays inside
            tuples, lists, dicts, objects) as raw ``.npy`` images in a file, and return them
            as read-only :class:`numpy.memmap` views of it (joblib's ``mmap_mode="r"``), on
            hits and on the call that executes alike: a hit on a 10 GB array costs
            milliseconds and no memory. A store that hands values back as bytes (the
            memory store; PostgreSQL below 64 MiB) gives read-only arrays in memory, with a
            one-time warning.
        compress: Compress its stored results with zstandard: True (level 3) or a level
            from 1 (fastest) to 22 (smallest). Default None: its store's ``compress=``
            (off by default); False: never. Not with ``mmap=True``. Needs
            ``pip install 'durably[compress]'``.
        expires_after: How long a cache entry is served: a :class:`datetime.timedelta` or
            seconds (Prefect's ``cache_expiration``, joblib's ``expires_after``). An entry
            written longer ago than that is a miss: the task executes and its new result
            replaces it. Only the cache expires: inside a run, a step the run already
            finished is replayed from its journal whatever its age. Default None: never.
        cache_if: ``cache_if(result, duration)`` decides whether a result is cached
            (joblib's ``cache_validation_callback``): ``duration`` is the seconds its body
            took; return False to leave it out, e.g. ``lambda result, duration: duration >
            1.0`` (only slow calls) or ``lambda result, duration: bool(result)`` (no empty
            results). A result left out is still journaled inside a run, so it never
            executes twice in that run. If it raises, the call raises
            :class:`~durably.DefinitionError` naming the task (inside a run, the step is
            journaled as failed).

    Returns:
        A :class:`Task` (or, with options, a decorator making one).

    Raises:
        DefinitionError: ``func`` is a class, a generator function or not callable; an
            option has the wrong type; ``ignore`` names an unknown argument; ``func`` is a
            partial or a callable object and ``name`` is not given; ``mmap=True`` with
            ``compress=``; ``compress=`` without zstandard installed; ``expires_after`` is
            not positive; ``expires_after`` or ``cache_if`` is given with ``cache=False``.

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
                    timeout=timeout, mmap=mmap, compress=compress,
                    expires_after=expires_after, cache_if=cache_if)
        return Task(f, spec)

    return decorate(func) if func is not None else decorate
