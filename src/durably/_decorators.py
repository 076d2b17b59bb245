"""``@task`` and ``@entrypoint``: wrap a function without changing how it is called.

The wrappers are :class:`wrapt.FunctionWrapper` subclasses, so they bind correctly on
functions, methods, classmethods and staticmethods, keep ``__name__``, ``__doc__``,
``__wrapped__`` and the signature, and ``inspect`` sees the original function. No execution
logic lives here: calls go to :mod:`durably._runtime`.
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

import wrapt

from ._context import current_run
from ._explain import Explanation, explain
from ._run import Run
from ._runtime import Spec, begin_run, call_async, call_sync, end_run
from ._store import Store, now
from .exceptions import DefinitionError

__all__ = ["Entrypoint", "Task", "entrypoint", "task"]

P = ParamSpec("P")
R = TypeVar("R")

if TYPE_CHECKING:
    from wrapt import FunctionWrapper as _Wrapper
else:
    # wrapt < 2.5 cannot subscript FunctionWrapper at run time: add the generic parameters here
    class _Wrapper(wrapt.FunctionWrapper, Generic[P, R]):
        pass


def _resolve(module: str, qualname: str) -> Any:
    """Find a decorated function again by module and qualified name (for pickling)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = vars(obj)[part] if isinstance(obj, type) else getattr(obj, part)
    return obj


def _reduce(wrapper: Any) -> tuple[Any, ...]:
    raw = wrapper._self_spec.raw
    module, qualname = getattr(raw, "__module__", None), raw.__qualname__
    if module is None or "<locals>" in qualname:
        raise pickle.PicklingError(
            f"cannot pickle {qualname!r}: it is defined inside a function. Fix: define it at "
            "module level so other processes can import it."
        )
    return (_resolve, (module, qualname))


def _instance_of(bound: Any) -> Any:
    """The instance (or, for a classmethod, the class) a bound wrapper passes as ``self``."""
    instance = bound._self_instance
    if bound._self_binding == "classmethod":
        return bound._self_owner if instance is None else (
            instance if isinstance(instance, type) else type(instance))
    return instance


class _ByReference:
    """Pickled by module and name, copied as itself: like a plain function."""

    __slots__ = ()

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return _reduce(self)

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: Any) -> Any:
        return self


class BoundTask(wrapt.BoundFunctionWrapper):  # type: ignore[type-arg]
    """A task bound to an instance or class (``obj.method``); same methods as :class:`Task`."""

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """See :meth:`Task.explain`."""
        return explain(self._self_parent._self_spec, None, _instance_of(self), args, kwargs)

    def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """See :meth:`Task.cache_key`."""
        return str(self._self_parent._self_spec.key_for(_instance_of(self), args, kwargs))


class BoundEntrypoint(wrapt.BoundFunctionWrapper):  # type: ignore[type-arg]
    """An entrypoint bound to an instance or class; ``.run`` works as on
    :class:`Entrypoint`."""

    def run(self, *args: Any, run_id: str | None = None, fresh: bool = False, **kwargs: Any
            ) -> Any:
        """See :meth:`Entrypoint.run`."""
        parent = self._self_parent
        runner = parent._self_arun if parent._self_spec.is_async else parent._self_srun
        return runner(self.__wrapped__, _instance_of(self), args, kwargs, run_id, fresh, True)


class Task(_ByReference, _Wrapper[P, R]):
    """A function whose calls are cached by input and journaled inside runs.

    Made by :func:`task`; call it exactly like the function it wraps. It pickles by
    reference (module and name), so it travels to worker processes like a plain function.
    """

    __bound_function_wrapper__ = BoundTask

    def __init__(self, func: Callable[P, R], spec: Spec) -> None:
        super().__init__(func, self._self_call)
        self._self_spec = spec

    def _self_call(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        spec = self._self_spec
        if spec.is_async:
            return call_async(spec, wrapped, instance, args, kwargs)
        return call_sync(spec, wrapped, instance, args, kwargs)

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

    def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key (32 hex characters) a call with these arguments would use.

        Raises:
            SerializationError: an argument cannot be digested.
            TypeError: the arguments do not fit the signature.
        """
        return str(self._self_spec.key_for(None, args, kwargs))


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

    @property
    def spec(self) -> Spec:
        """The entrypoint's identity and options."""
        spec: Spec = self._self_spec
        return spec

    def _self_call(self, wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if current_run.get() is not None:
            return wrapped(*args, **kwargs)
        if self._self_spec.is_async:
            return self._self_arun(wrapped, instance, args, kwargs, None, False, False)
        return self._self_srun(wrapped, instance, args, kwargs, None, False, False)

    def run(self, *args: Any, run_id: str | None = None, fresh: bool = False, **kwargs: Any
            ) -> Run[R]:
        """Call the entrypoint as a run and return its handle.

        With the default ``run_id``, the run's id is derived from the entrypoint and a digest
        of its arguments, so calling again with the same arguments continues the same run:
        steps it finished are replayed from its journal, and only steps whose code or inputs
        changed execute. An async entrypoint returns a coroutine of the handle.

        Args:
            *args: The entrypoint's positional arguments.
            run_id: Continue or start the run with this id (1 to 200 letters, digits and
                ``. _ : @ + = -``). A run id belongs to one entrypoint and one set of
                arguments.
            fresh: Start a new run even if one with these arguments exists.
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
        if self._self_spec.is_async:
            return self._self_arun(  # type: ignore[return-value]
                wrapped, None, args, kwargs, run_id, fresh, True)
        run: Run[R] = self._self_srun(wrapped, None, args, kwargs, run_id, fresh, True)
        return run

    def _self_srun(self, wrapped: Any, instance: Any, args: Any, kwargs: Any,
                   run_id: str | None, fresh: bool, handle: bool) -> Any:
        started = begin_run(self._self_spec, instance, args, kwargs, run_id=run_id, fresh=fresh)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            end_run(started, exc=exc)
            raise
        end_run(started, result=result)
        return _handle(started, result) if handle else result

    async def _self_arun(self, wrapped: Any, instance: Any, args: Any, kwargs: Any,
                         run_id: str | None, fresh: bool, handle: bool) -> Any:
        started = begin_run(self._self_spec, instance, args, kwargs, run_id=run_id, fresh=fresh)
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as exc:
            end_run(started, exc=exc)
            raise
        end_run(started, result=result)
        return _handle(started, result) if handle else result


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
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    version: str | None = None,
    cache: bool = True,
    ignore: tuple[str, ...] = (),
) -> Any:
    """Make a function a durable task: its result is cached on disk by its code and inputs,
    and inside a run each call is a journaled step that never executes twice.

    Works on sync and ``async def`` functions, methods, classmethods and staticmethods (put
    ``@task`` above ``@classmethod`` / ``@staticmethod``). The task keeps the function's
    signature, docstring and ``__wrapped__``. Arguments are bound by name with defaults
    applied, as joblib.Memory does, so ``f(1)``, ``f(x=1)`` and ``f(1, y=<default>)`` share
    one cache entry. For a method, ``self`` is part of the inputs (ignore it with
    ``ignore=("self",)``).

    Args:
        func: The function (when used as ``@task`` without parentheses).
        name: The task's name; with its module it forms the task identity. Default: the
            function's qualified name.
        version: A string that replaces the code fingerprint in the cache key: the cache
            is then kept across code edits until you change the string.
        cache: False for a side-effect task: never served from the cross-run cache, but
            inside a run it is journaled, so it is not executed twice in that run.
        ignore: Argument names left out of the input digest (a logger, a verbose flag).

    Returns:
        A :class:`Task` (or, with options, a decorator making one).

    Raises:
        DefinitionError: ``func`` is a class, a generator function or not callable; an
            option has the wrong type; ``ignore`` names an unknown argument.

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
        >>> durably.configure()
    """
    _check_bare("task", func)

    def decorate(f: Callable[P, R]) -> Task[P, R]:
        spec = Spec(f, kind="task", name=name, version=version, cache=cache, ignore=tuple(ignore)
                    if isinstance(ignore, (list, tuple)) else ignore)
        return Task(f, spec)

    return decorate(func) if func is not None else decorate


@overload
def entrypoint(func: Callable[P, R], /) -> Entrypoint[P, R]: ...


@overload
def entrypoint(
    *, name: str | None = None, store: Store | None = None
) -> Callable[[Callable[P, R]], Entrypoint[P, R]]: ...


def entrypoint(func: Any = None, /, *, name: str | None = None, store: Store | None = None
               ) -> Any:
    """Make a function an entrypoint: each call is a durable run with a journal.

    Calling the entrypoint returns its plain result, so decorating a script's ``main``
    changes nothing else. Each step the run finishes is committed to the journal before the
    task returns; a run killed at any point and called again with the same arguments
    resumes: finished steps are replayed, and a step that finished is never executed again
    in that run. Code between tasks (the entrypoint's own body) re-executes on every
    attempt, so side effects belong in tasks. Use :meth:`Entrypoint.run` for the run handle.

    Args:
        func: The function (when used as ``@entrypoint`` without parentheses).
        name: The entrypoint's name (and the prefix of its run ids). Default: the
            function's qualified name.
        store: Where its runs and results live. Default: the configured store
            (``durably.configure``), else ``$DURABLY_DIR``, else ``./.durably``.

    Returns:
        An :class:`Entrypoint` (or, with options, a decorator making one).

    Raises:
        DefinitionError: ``func`` is a class, a generator function or not callable, or an
            option has the wrong type.

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
    from ._store import Store as _StoreProto

    if store is not None and not isinstance(store, _StoreProto):
        raise DefinitionError(
            f"@entrypoint(store=...) needs a durably store (DiskStore, MemoryStore, ...), got "
            f"{type(store).__qualname__}"
        )

    def decorate(f: Callable[P, R]) -> Entrypoint[P, R]:
        return Entrypoint(f, Spec(f, kind="entrypoint", name=name, store=store))

    return decorate(func) if func is not None else decorate
