"""How tasks and entrypoints travel to other processes: pickled by reference (module and
name, like a plain function), a bound one as the lookup of its name on what it is bound to,
and a task other processes cannot import by name (of ``__main__``, a notebook, a function's
body, a partial or a callable object) by value, with its identity and fingerprint so that
its calls there use the caller's cache keys.

Separate from :mod:`.task` because it is what process pools, Dask and ``multiprocessing``
see of a task, not what its calls do. :mod:`.task` builds on its bases (``_ByReference``,
``_OwnClass``); the two places that need the :class:`~durably.Task` class import it when
they run.
"""

from __future__ import annotations

import contextlib
import importlib
import pickle
import sys
import threading
import types
import weakref
from typing import TYPE_CHECKING, Any

from durably._decorators.wrapper import _instance_of
from durably._keys import serde as _serde
from durably._keys.fingerprint import nameless_callable
from durably._runtime.spec import MAIN_MODULES, Spec

if TYPE_CHECKING:
    from durably._decorators.tasks import Task


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
                            spec.code_parts(), spec.retry, spec.timeout, spec.policy))


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
    # imported here: the task module imports this one (its bases), so not at module level
    from durably._decorators.tasks import Task

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
                            spec.retry, spec.timeout, spec.storage, spec.policy))


def _rebuild_task(func: Any, name: str, version: str | None, cache: bool,
                  ignore: tuple[str, ...], identity: str, code: str, parts: dict[str, str],
                  retry: Any = None, timeout: float | None = None,
                  storage: Any = None, policy: Any = None) -> Task[Any, Any]:
    """A task sent by value, with the identity and fingerprint it had in the caller: the code
    is the caller's code, so its calls here use the caller's cache keys."""
    from durably._decorators.tasks import Task  # (here: the task module imports this one)
    from durably._keys.revalidate import Fingerprint

    spec = Spec(func, kind="task", name=name, version=version, cache=cache, ignore=ignore,
                retry=retry, timeout=timeout)
    spec.identity = identity
    spec.storage = storage  # (mmap=, compress=: checked in the caller)
    spec.policy = policy  # (expires_after=, cache_if=: as the caller's)
    if version is None:
        spec._fingerprint = Fingerprint(code, [], [], dict(parts))
    return Task(func, spec)
