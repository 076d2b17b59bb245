"""What travels to a worker process (or a Dask worker) for a fan-out, and what comes back:
the pickling of tasks and bodies, the store the worker uses, and the outcome of a body."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import io
import logging
import os
import pickle
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

from durably._keys import serde as _serde
from durably._runtime.call import _NEVER_RETRIED
from durably._runtime.config import body_store, configure
from durably._runtime.retry import await_with_timeout, call_with_timeout, retrying
from durably._runtime.spec import Spec
from durably._store.urls import open_store_at, redact, store_url_scheme
from durably.exceptions import SerializationError, StoreError
from durably.store import Store

log = logging.getLogger("durably")

__all__ = ["_Outcome", "_describe_store", "_pack", "_run_job", "_unpack_outcome"]


class _Outcome(NamedTuple):
    ok: bool
    value: Any  # the result, or the exception
    started: float | None  # when the body started (in the worker), if known
    journaled: bool = False  # finished by the call path itself (a task with retry/timeout)
    ended: float | None = None  # when the body ended (in the worker), if known


# -- what travels to a worker process -----------------------------------------------------
class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker (as concurrent.futures shows it)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class _JobPickler(_serde._Pickler):
    """cloudpickle (refusing open files), with tasks of ``__main__``, of a notebook or
    defined inside a function pickled by value, keeping their identity and fingerprint."""

    def __init__(self, file: io.BytesIO, what: str) -> None:
        super().__init__(file, what)
        self._by_value: set[int] = set()

    def reducer_override(self, obj: Any) -> Any:
        # cloudpickle would take a task for the function it wraps (wrapt proxies
        # __class__): tasks and entrypoints say how they travel
        if isinstance(obj, _serde.SentByReference):
            return obj._reduce_for_worker(self._by_value)
        return super().reducer_override(obj)


def _pack(obj: Any, *, what: str, back: bool = False) -> bytes:
    """Pickle for a worker (cloudpickle; tasks by reference or by value); ``back``: from a
    worker to the caller (a result, an exception)."""
    try:
        with io.BytesIO() as file:
            _JobPickler(file, what).dump(obj)
            return file.getvalue()
    except SerializationError:
        raise
    except Exception as exc:  # noqa: BLE001 - report it as ours
        if back:
            raise SerializationError(
                f"cannot send {what} back from the worker process: {type(exc).__name__}: "
                f"{exc}. Fix: return plain data (a path instead of an open file, no locks "
                "or connections); the same result could not be cached in the caller's "
                "process either.") from None
        raise SerializationError(
            f"cannot send {what} to a worker process: {type(exc).__name__}: {exc}. Fix: pass "
            "plain data (a path instead of an open file, no locks or connections), or use "
            "the thread executor. (A body that maps on Dask itself: pass executor='dask', "
            "which finds the worker's own client, not a Dask(client) from a global.)"
        ) from None


def _pack_arguments(spec: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """The arguments of one item, pickled for a worker; when they cannot be, the error
    names the argument that cannot."""
    try:
        return _pack((args, kwargs), what=f"the arguments of {spec.name!r}")
    except SerializationError as exc:
        try:  # (by the signature: the arguments left out of the key with ignore= too)
            bound = dict(inspect.signature(spec.raw).bind_partial(*args, **kwargs).arguments)
        except Exception:  # noqa: BLE001 - (named by position, then)
            bound = {**{f"#{i + 1}": a for i, a in enumerate(args)}, **kwargs}
        for name, value in bound.items():
            try:
                _pack(value, what="")
            except SerializationError:
                where = _serde.locate_unpicklable(name, value, pickles=_pack_part)
                at = "" if where is None else f" (at {where})"  # (rows[3].lock)
                raise SerializationError(
                    str(exc).replace(f"the arguments of {spec.name!r}",
                                     f"argument {name!r}{at} of {spec.name!r}", 1)) from None
        raise


def _pack_part(value: Any) -> None:
    """Pickle a part of a value for a worker, for :func:`_serde.locate_unpicklable`."""
    _pack(value, what="")


class _Unpickler(pickle.Unpickler):
    """Unpickles what travels between processes without rewriting a class this process
    already has: cloudpickle sends a class of ``__main__`` by value and, when it comes back
    (a result of that class), would set each attribute of the original class to a copy,
    changing the code digest of its instances (and so the cache keys of later calls)."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        if module.startswith("cloudpickle"):
            if name in ("_make_skeleton_class", "_make_skeleton_enum"):
                return functools.partial(_keep_existing, found, self)
            if name == "_class_setstate":
                return functools.partial(_set_new_class_state, found, self)
        return found


def _keep_existing(make: Callable[..., Any], unpickler: Any, *args: Any) -> Any:
    tracked = getattr(sys.modules.get("cloudpickle.cloudpickle"),
                      "_DYNAMIC_CLASS_TRACKER_BY_CLASS", {})
    before = {id(k) for k in list(tracked)}
    cls = make(*args)
    if id(cls) in before:
        existing = unpickler.__dict__.setdefault("existing", set())
        existing.add(id(cls))
    return cls


def _set_new_class_state(setstate: Callable[..., Any], unpickler: Any, cls: Any,
                         state: Any) -> Any:
    if id(cls) in unpickler.__dict__.get("existing", ()):
        return cls  # a class of this process: it is the original already
    return setstate(cls, state)


def _loads(data: bytes) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def _describe_store(store: Store) -> tuple[Any, ...]:
    """The caller's store as a worker can open it: by its URL and options
    (:meth:`Store.location <durably.store.Store.location>`), opened again with
    :func:`~durably.open_store` by the worker (which uses it only if it is found there);
    else the store pickled, if it pickles; else only its name (the worker caches in its own
    memory, with a warning)."""
    here = (socket.gethostname(), os.getpid())
    with contextlib.suppress(StoreError):
        store.check()  # the store exists before a worker looks for it
    location = store.location()
    if location is not None:
        url, options = location
        if store_url_scheme(url) == "memory":  # (another process's memory://NAME is not it)
            return ("memory", here, url)
        with contextlib.suppress(Exception):
            pickle.dumps(options)  # (the options travel with every job)
            return ("url", here, url, options)
    try:
        return ("pickled", here, pickle.dumps(store))
    except Exception:  # noqa: BLE001 - a store that cannot travel
        return ("memory", here, f"{type(store).__qualname__} at {id(store):#x}")


_worker_lock = threading.Lock()
_worker_store: tuple[Any, ...] | None = None
_worker_opened: Store | None = None  # the store _worker_store names, opened here
#: the stores of the callers seen, opened here, by their description pickled: callers whose
#: items alternate on this worker do not open their store again each time (a PostgreSQL
#: store would open a new pool of connections each time)
_worker_stores: dict[bytes, Store] = {}
#: why a worker caches in its own memory, by the id of the MemoryStore it uses instead
_worker_problem: dict[int, str] = {}
_worker_heads: dict[bytes, tuple[Callable[..., Any], tuple[Any, ...], Spec]] = {}


def _use_store(where: tuple[Any, ...]) -> Store | None:
    """Make the caller's store the default store of this worker process, and return it (the
    store of that caller's bodies); None for an in-process worker, whose bodies use this
    process's default store."""
    global _worker_store, _worker_opened
    with _worker_lock:
        if where == _worker_store:
            return _worker_opened
        try:
            seen_key = pickle.dumps(where)
        except Exception:  # noqa: BLE001 - not kept: opened again next time
            seen_key = b""
        seen = _worker_stores.get(seen_key) if seen_key else None
        if seen is not None:
            configure(store=seen)
            _worker_store, _worker_opened = where, seen
            return seen
        kind, (host, pid) = where[0], where[1]
        if (host, pid) == (socket.gethostname(), os.getpid()):
            _worker_store = where  # an in-process worker: leave this process's settings alone
            _worker_opened = None
            return None
        store: Store | None = None
        problem = ""
        if kind == "url":
            try:
                opened = open_store_at(where[2], dict(where[3]), "the caller's store")
                if not opened.found():
                    # the caller's store exists: not found here, this is another machine's
                    # place of the same name (an empty folder), not the store
                    problem = f"the store {redact(where[2])} is not reachable from here"
                else:
                    opened.check()
                    store = opened
            except Exception as exc:  # noqa: BLE001 - not usable here: cache in memory
                problem = (f"the store {redact(where[2])} cannot be used here "
                           f"({type(exc).__name__}: {exc})")
        elif kind == "pickled":
            store = pickle.loads(where[2])
        if store is None:
            from durably._store.memory import MemoryStore

            reason = problem or f"the caller's store {where[2]} cannot be shared"
            said = (f"{reason} (worker process {os.getpid()} on {socket.gethostname()}); "
                    "tasks called inside bodies there are cached in that worker's memory "
                    "only")
            log.warning("durably: %s", said)
            store = MemoryStore()
            _worker_problem[id(store)] = said
        configure(store=store)
        _worker_store = where
        _worker_opened = store
        if seen_key:
            if len(_worker_stores) >= 16:  # (dropped, not closed: a body may still use it)
                _worker_stores.clear()
            _worker_stores[seen_key] = store
        return store


def _load_head(head: bytes) -> tuple[Callable[..., Any], Spec, Store | None]:
    """The body a job's head names, its task's spec (unpickled once per worker) and the
    store of its caller, the default store of this worker process from now on."""
    found = _worker_heads.get(head)
    if found is None:
        (task, bound, instance, owner), where = _loads(head)
        fn = task.__get__(instance, owner).__wrapped__ if bound else task.__wrapped__
        if len(_worker_heads) >= 16:
            _worker_heads.clear()
        found = _worker_heads[head] = (fn, where, task._self_spec)
    fn, where, spec = found
    return fn, spec, _use_store(where)


def _call_remote(spec: Spec, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    """One item's body in a worker process, under the task's ``retry=`` / ``timeout=`` (the
    tries are not journaled one by one there: the item's outcome is, by the caller)."""
    def once() -> Any:
        if spec.is_async:
            coro = fn(*args, **kwargs)
            if spec.timeout is not None:
                coro = await_with_timeout(spec.name, spec.timeout, coro)
            return asyncio.run(coro)
        if spec.timeout is not None:
            return call_with_timeout(spec.name, spec.timeout, fn, args, kwargs)
        return fn(*args, **kwargs)

    from durably._runtime.context import in_worker

    token = in_worker.set(True)
    try:
        if spec.retry is None:
            return once()
        result: Any = None
        for attempt in retrying(spec.retry, _NEVER_RETRIED, is_async=False):
            with attempt:
                result = once()
        return result
    finally:
        in_worker.reset(token)


#: this process is a worker of a durably Process pool (set by its initializer)
IN_WORKER = [False]


def watch_parent(pid: int, every: float = 1.0) -> None:
    """A pool worker's initializer: exit once the process that made the pool (``pid``) is
    gone. A pool's workers hold both ends of its queue, so a parent killed with SIGKILL
    (or out of memory) would leave them waiting for work forever; the item a worker runs
    then is the dead parent's, whose run executes it again when resumed.

    The parent is looked at by its pid, and by its state where the system tells it
    (``/proc``): a killed caller that nobody has reaped yet (a supervisor reading its
    output to the end first) still answers to its pid, as a zombie, and its workers kept
    that output open for ever. This process's own parent changing (the caller, with the
    fork or spawn start methods) says it too.

    A worker ignores SIGINT: a terminal's Ctrl-C goes to the whole process group, and the
    caller decides what it means (the first waits for the running bodies and journals them,
    a second kills the workers); a worker stopped by it lost its item's body half-way."""
    import signal

    IN_WORKER[0] = True
    with contextlib.suppress(ValueError, OSError):  # (not the main thread: left as it is)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(every)
            if os.getppid() != parent or _gone(pid):
                os._exit(1)

    threading.Thread(target=watch, name="durably-watch-parent", daemon=True).start()


def _gone(pid: int) -> bool:
    """Whether process ``pid`` has ended: no such process (or another user's by now), or
    a zombie (ended, not reaped yet) where ``/proc`` says so."""
    try:
        os.kill(pid, 0)
    except OSError:  # (ProcessLookupError; PermissionError: another user's process by now)
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[:1]
    except OSError:  # no /proc (macOS): the pid answered
        return False
    return state in ([b"Z"], [b"X"])


def _run_job(head: bytes, body: bytes) -> bytes:
    """Run one item's body in a worker; return its outcome, pickled (never raises)."""
    started = time.time()
    try:
        fn, spec, store = _load_head(head)
        args, kwargs = _loads(body)
        started = time.time()
        # the body's store is its caller's, whatever the bodies of other callers (other
        # stores) running at once on other threads of this worker make the default
        token = body_store.set(store)
        try:
            result = _call_remote(spec, fn, args, kwargs)
        finally:
            body_store.reset(token)
    except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the caller
        return _pack_failure(started, exc)
    ended = time.time()
    try:
        return _pack((True, result, started, _fallback_note(store), ended),
                     what=f"the result of task {spec.name!r}", back=True)
    except SerializationError as exc:
        where = _serde.locate_unpicklable("result", result, pickles=_pack_part)
        if where is not None:  # (result['conn'])
            exc = SerializationError(str(exc).replace(" back from", f" (at {where}) back from", 1))
        return _pack_failure(started, exc)


def _pack_failure(started: float, exc: BaseException) -> bytes:
    tb = "".join(traceback.format_exception(exc))
    ended = time.time()
    try:
        packed = _pack((False, exc, started, tb, ended), what="the exception")
        _loads(packed)  # an exception that pickles but cannot be rebuilt fails here, not
        return packed   # in the caller (where it would abandon the whole fan-out)
    except Exception:  # noqa: BLE001 - an exception that cannot travel: send its text
        stand_in = RuntimeError(f"{type(exc).__qualname__}: {exc} (the exception itself "
                                "could not be sent back from the worker)")
        return _pack((False, stand_in, started, tb, ended), what="the exception")


#: the warnings of workers that could not use their caller's store, said once each
_noted: set[str] = set()


def _fallback_note(store: Store | None) -> str | None:
    """For a successful outcome: why this worker caches in its own memory, when it could
    not use its caller's store (said in the caller too, not only in the worker's log)."""
    return _worker_problem.get(id(store)) if store is not None else None


def _unpack_outcome(data: bytes) -> _Outcome:
    try:
        ok, value, started, tb, ended = _loads(data)
    except Exception as exc:  # noqa: BLE001 - one item's outcome, never the whole fan-out
        return _Outcome(False, RuntimeError(
            f"the outcome of this item could not be read back from the worker: {exc!r}"),
            None)
    if ok and tb and tb not in _noted:  # (a success's fourth field: a worker's warning)
        _noted.add(tb)
        log.warning("durably: %s", tb)
        tb = None
    if not ok and tb and isinstance(value, BaseException) and value.__cause__ is None:
        value.__cause__ = _RemoteTraceback(tb)
    return _Outcome(ok, value, started, False, ended)


