"""The task call path (journal → cache → execute) and the run lifecycle.

Call path of a task (DESIGN.md, "the heart"):

1. bind the arguments to the signature, apply defaults, drop ignored ones;
2. digest them canonically; cache key = (task identity, code fingerprint or ``version``,
   input digest);
3. inside a run: step identity = parent step + cache key + occurrence;
4. the journal has the step → return its recorded result (replay); else the cache has the key
   → record a cached step and return; else execute, store the result in the cache and append
   the step to the journal (committed) before returning;
5. outside a run: the cache alone;
6. exceptions propagate unchanged, are journaled as failed steps, never cached.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import pickle
import re
import sys
import threading
import time
import types
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from durably._keys import serde as _serde
from durably._keys.canonical import too_common
from durably._keys.files import SEEN as _files_seen
from durably._keys.files import File, file_stamp
from durably._keys.fingerprint import fingerprint_function, nameless_callable
from durably._keys.hashing import (
    digest_each,
    encode_arguments,
    encode_positional,
    locate_undigestable,
    positional_plan,
    trace_digest,
    trace_digests,
)
from durably._keys.revalidate import LARGE_VALUE_BYTES, Fingerprint
from durably._runtime.config import default_store
from durably._runtime.context import (
    _FLUSH_EVERY,
    LARGE_ROW,
    RunContext,
    StopRun,
    current_run,
    current_step,
    cutoff,
)
from durably._runtime.context import CACHE_BATCH as _CACHE_BATCH
from durably._runtime.context import RUNS as _RUNS
from durably._runtime.context import user_stacklevel as _user_stacklevel
from durably._runtime.effects import _IMMUTABLE, Effects, changed, mutable, restored, warn_once
from durably._runtime.effects import before as state_before
from durably._runtime.failures import (
    RAISED,
    RETRY,
    ReplayedFailure,
    raised_event,
    released,
    replayable,
    replayed,
)
from durably._runtime.failures import note as note_failure
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.retry import (
    Retry,
    await_with_timeout,
    call_with_timeout,
    check_timeout,
    retrying,
    to_retry,
)
from durably._runtime.threads import thread_run
from durably._store.lease import LEASE_SECONDS, RENEW_SECONDS, Owner, _pid, beat, hold, let_go, me
from durably._store.records import EventRecord, KeyRecord, RunRecord, StepRecord, now
from durably._trace.tracer import Event, flow_digests, inputs_repr, short_repr
from durably.exceptions import DefinitionError, RunStateError, SerializationError, StoreError
from durably.store import ReadAhead, Store

__all__ = ["Call", "Spec", "begin_run", "begin_step", "end_run", "is_cancelled",
           "validate_run_id"]

log = logging.getLogger("durably")
#: the name of a key record's part that is the code digest of a user class met in the
#: arguments (after it, the class's ``module.qualname``): explain names it when it changed
CLASS_PART = "argument class "
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}")
_MAX_ARGS_BYTES = 16 << 20  # arguments bigger than this are not kept with the run
#: a run result bigger than this is written outside the transaction that ends the attempt
#: (other processes' journal writes wait for that transaction)
_BATCHED_RESULT = LARGE_ROW
_WRITE_THROUGH = 0.01  # seconds: a step slower than this writes its cache entry at once
#: (spec, name) of the large configuration values warned about (see Spec._warn_large)
_LARGE_WARNED: set[tuple[Any, str]] = set()


def is_cancelled(exc: BaseException | None) -> bool:
    """Whether ``exc`` is asyncio's ``CancelledError``, without importing asyncio (a sixth of
    ``import durably`` with wrapt 1.x, which does not import it either): none can have been
    raised in a process that never imported it."""
    aio = sys.modules.get("asyncio")
    return aio is not None and isinstance(exc, aio.CancelledError)


MAIN_MODULES = _serde.MAIN_MODULES  # (``__main__``, ``__mp_main__``: a script's module)


def module_identity(module: str | None) -> str:
    """A stable name for a function's module; ``__main__`` becomes the script's name (and so
    does ``__mp_main__``: the script again, in a worker process multiprocessing spawned)."""
    if module not in MAIN_MODULES:
        return module or "<unknown>"
    main = sys.modules.get(module)  # (__mp_main__: the script, while it is being run again)
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        return str(spec.name)
    file = getattr(main, "__file__", None)
    if file:
        stem = file.replace("\\", "/").rpartition("/")[2].rpartition(".")[0]
        return f"__main__.{stem or file}"
    return "__main__"


class Spec:
    """What a decorator knows about its function: identity, signature, options."""

    __slots__ = (
        "_defaults",
        "_fingerprint",
        "_key_head",
        "_keywords",
        "_names",
        "_nparams",
        "_npositional",
        "_plan",
        "_prepend_instance",
        "_version_code",
        "cache",
        "func",
        "identity",
        "ignore",
        "is_async",
        "kind",
        "name",
        "raw",
        "retry",
        "signature",
        "slow",
        "store",
        "timeout",
        "version",
    )

    def __init__(
        self,
        func: Any,
        *,
        kind: str,
        name: str | None,
        version: str | None = None,
        cache: bool = True,
        ignore: tuple[str, ...] = (),
        store: Store | None = None,
        retry: Any = None,
        timeout: Any = None,
    ) -> None:
        raw = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
        if isinstance(raw, type) or not callable(raw):
            what = "a class" if isinstance(raw, type) else f"{type(raw).__qualname__} {raw!r}"
            raise DefinitionError(
                f"@{kind} decorates functions, not {what}. Fix: decorate a function or method "
                f"(for a class, decorate the method that does the work)."
            )
        qualname = getattr(raw, "__qualname__", None) or getattr(raw, "__name__", None)
        # a functools.partial or a callable object: named by name=, its code is what it runs
        nameless = None if qualname is not None else nameless_callable(raw)
        if qualname is None:
            qualname = _name_of_nameless(kind, raw, name, nameless)
        runs = raw if nameless is None else nameless[1]
        bound = None if isinstance(func, staticmethod) else _bound_to_object(raw)
        if bound is not None:
            # its object is not among its arguments: it would be left out of the cache key
            # (two objects sharing results), or bound again as self (a TypeError on call)
            raise DefinitionError(
                f"{kind}() cannot take {qualname!r} bound to {bound}: that is not one of its "
                f"arguments, so it would be left out of the cache key. Fix: "
                + _unbound_fix(kind, raw, qualname))
        if inspect.isgeneratorfunction(runs) or inspect.isasyncgenfunction(runs):
            raise DefinitionError(
                f"@{kind} cannot decorate the generator function {qualname!r}: a generator "
                "cannot be stored or replayed. Fix: return a list (or make each item a task)."
            )
        if name is not None and (not isinstance(name, str) or not name):
            raise DefinitionError(f"@{kind}(name=...) must be a non-empty string, not {name!r}")
        if version is not None and (not isinstance(version, str) or not version):
            raise DefinitionError(
                f"@{kind}(version=...) of {qualname!r} must be a non-empty string, not "
                f"{version!r}. Fix: version=\"1\" (bump it when the results must change)."
            )
        if not isinstance(cache, bool):
            raise DefinitionError(f"@{kind}(cache=...) of {qualname!r} must be True or False")
        if isinstance(ignore, str) or not all(isinstance(i, str) for i in ignore):
            raise DefinitionError(
                f"@{kind}(ignore=...) of {qualname!r} must be a tuple of argument names, not "
                f"{ignore!r}. Fix: ignore=({ignore!r},)"
                if isinstance(ignore, str)
                else f"@{kind}(ignore=...) of {qualname!r} must be a tuple of argument names"
            )
        try:
            signature = inspect.signature(raw)
        except (TypeError, ValueError) as exc:
            raise DefinitionError(
                f"@{kind} cannot read the signature of {qualname!r}: {exc}"
            ) from None
        unknown = [i for i in ignore if i not in signature.parameters]
        if unknown:
            raise DefinitionError(
                f"@{kind}(ignore=...) of {qualname!r} names {unknown}, which are not among its "
                f"arguments {list(signature.parameters)}"
            )
        self.kind = kind
        self.func = func
        self.raw = raw
        self.name = name or qualname
        self.identity = f"{module_identity(getattr(runs, '__module__', None))}:{self.name}"
        self.version = version
        self.cache = cache
        self.ignore = frozenset(ignore)
        self.signature = signature
        self.is_async = inspect.iscoroutinefunction(runs)
        self.store = store
        self.retry = to_retry(retry, self.name)
        self.timeout = check_timeout(timeout, self.name)
        self._fingerprint: Fingerprint | None = None
        #: whether the body's last execution in this process wrote its cache entry at once
        #: (it took _WRITE_THROUGH or more), or it never executed here
        self.slow = True
        self._prepend_instance = not isinstance(func, staticmethod)
        # a fast binder for the common signature: no *args, **kwargs or positional-only
        params = list(signature.parameters.values())
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self._names: tuple[str, ...] | None = None
        if all(p.kind in kinds for p in params):
            self._names = tuple(p.name for p in params if p.kind is kinds[0])
        self._keywords = frozenset(signature.parameters)
        self._defaults = tuple(
            (p.name, p.default) for p in params if p.default is not inspect.Parameter.empty
        )
        self._nparams = len(params)
        self._key_head: tuple[str, bytes] = ("", b"")
        # an explicit version as one string (the key's head is kept per code version string)
        self._version_code = "" if version is None else "v:" + version
        #: the number of parameters when all of them can be given by position, else -1
        self._npositional = len(params) if self._names is not None and len(
            self._names) == len(params) else -1
        #: how the input digest of a call with all its arguments given by position is
        #: written without binding them (encode_positional), or None
        self._plan = positional_plan(self._names, self.ignore) if (
            self._names is not None and self._npositional >= 0) else None

    def arguments(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Arguments bound by name, defaults applied, ignored ones dropped (joblib's rule:
        ``f(1)``, ``f(x=1)`` and ``f(1, y=default)`` bind alike)."""
        if instance is not None and self._prepend_instance:
            args = (instance, *args)
        names = self._names
        arguments: dict[str, Any] | None = None
        if names is not None and not kwargs and len(args) == self._npositional:
            arguments = dict(zip(names, args))  # noqa: B905 - all given by position (and zip(strict=) costs a keyword parse per call)
        elif names is not None and len(args) <= len(names):
            arguments = dict(zip(names, args, strict=False))
            for key, value in kwargs.items():
                if key in arguments or key not in self._keywords:
                    arguments = None  # let inspect raise the precise TypeError
                    break
                arguments[key] = value
            if arguments is not None:
                for key, value in self._defaults:
                    if key not in arguments:
                        arguments[key] = value
                if len(arguments) != self._nparams:
                    arguments = None
        if arguments is None:
            try:
                bound = self.signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{self.name}(): {exc}") from None
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        if self.ignore:
            for name in self.ignore:
                arguments.pop(name, None)
        return arguments

    def code_version(self) -> str:
        """The explicit ``version``, else the code fingerprint (revalidated, recomputed when a
        name it depends on was rebound)."""
        if self.version is not None:
            return self._version_code
        fp = self._fingerprint
        if fp is None or not fp.valid():
            fp = self._fingerprint = fingerprint_function(self.raw)
            if fp.unchecked or fp.large:
                self._warn_large(fp)
        return fp.digest

    def _warn_large(self, fp: Any) -> None:
        """Say once per value that a configuration value over ``LARGE_VALUE_BYTES`` is
        digested before each call (how an in-place edit of it is noticed), and how to
        avoid that cost."""
        sizes = [(u.name, u.size) for u in fp.unchecked if not isinstance(u.value, File)]
        for name, size in sizes + fp.large:
            if size <= LARGE_VALUE_BYTES or (self, name) in _LARGE_WARNED:
                continue
            _LARGE_WARNED.add((self, name))
            warnings.warn(
                f"durably: {self.kind} {self.name!r} reads {name}, a value of "
                f"{size / (1 << 20):,.0f} MiB: it is digested again before each call, so "
                "that an in-place edit of it is never served a result computed before the "
                "edit. Fix, to avoid that cost: pass it as an argument (digested with the "
                "call's inputs, and ignore=(...) can leave it out), or give the task an "
                "explicit @task(version=...) that you change when the value changes.",
                stacklevel=_user_stacklevel())

    def _edited_in_place(self, fp: Any) -> bool:
        """Before a call's key is made (a hit, a replay): whether a configuration value too
        large to check by its pickle was edited in place since the fingerprint was taken
        (it is digested again: see :meth:`Fingerprint.changed_in_place
        <durably._keys.revalidate.Fingerprint.changed_in_place>`), or a :func:`durably.file`
        changed on disk. Then the fingerprint is taken again and the key follows the
        edit."""
        changed = fp.changed_in_place()
        if changed is None:
            return False
        self._in_place(changed, "its cache key is made anew")
        return True

    def _in_place(self, changed: Any, outcome: str) -> None:
        """Drop the fingerprint (taken again at the next call) after ``changed`` (an
        :class:`~durably._keys.revalidate.Unchecked`) was found edited, and log it (editing a
        value or a data file between calls is what they are for: it is noticed before
        every call)."""
        self._fingerprint = None
        log.info("durably: %s %r: %s changed%s; %s", self.kind, self.name, changed.name,
                 "" if isinstance(changed.value, File) else " in place", outcome)

    def changed_in_place(self) -> bool:
        """Whether a configuration value of the code fingerprint too large to check by its
        pickle (or a :func:`durably.file`) changed while the body executed: then a result
        just computed must not be cached under a key made with the value before the edit
        (it would be served to every later process, and after a restart), and the
        fingerprint is taken again at the next call (whatever the step's duration: whether
        a value is checked never depends on time)."""
        fp = self._fingerprint
        if fp is None or not fp.unchecked or self.version is not None:
            return False
        changed = fp.changed_in_place()
        if changed is None:
            return False
        self._in_place(changed, "this result is not cached")
        return True

    def digest_inputs(self, arguments: Any) -> str:
        """The input digest of bound arguments.

        Raises:
            SerializationError: an argument cannot be digested (names it and the fix).
        """
        try:
            return encode_arguments(arguments)
        except (SerializationError, RecursionError) as exc:
            raise self.digest_error(exc, arguments) from None

    def digest_error(self, exc: SerializationError | RecursionError,
                     arguments: dict[str, Any] | None = None) -> SerializationError:
        """The error to raise when digesting this task's arguments raised ``exc``: it names
        the task, where in ``arguments`` the value is (``rows[1]['lock']``), and the way
        out."""
        if isinstance(exc, RecursionError):
            return SerializationError(
                f"{self.kind} {self.name!r}: an argument is nested too deeply to digest. Fix: "
                "pass a flatter value" + (", or leave it out of the cache key with ignore=(...)."
                                          if self.kind == "task" else ".")
            )
        text = str(exc)
        for name, value in (arguments or {}).items():
            head = f"cannot digest argument {name!r}"
            if text.startswith(head):
                where = locate_undigestable(name, value)
                if where is not None:
                    text = f"{head} (at {where}){text[len(head):]}"
                break
        if self.kind == "entrypoint":  # an entrypoint has no ignore=: its inputs name its run
            text = text.partition(" Fix:")[0] + (
                " Fix: pass plain data (for a file, its path or durably.file(path)), or give "
                "the type a __durably_digest__ method: an entrypoint's arguments identify "
                "its run."
            )
        return SerializationError(f"{self.kind} {self.name!r}: {text}")

    def cache_key(self, input_digest: str) -> str:
        return self.key_and_code(input_digest)[0]

    def key_and_code(self, input_digest: str) -> tuple[str, str]:
        """The cache key of these inputs, and the code version it was made with."""
        fp = self._fingerprint  # (code_version, inlined: this runs on every call)
        if fp is not None and self.version is None and fp.valid() and not (
                fp.unchecked and self._edited_in_place(fp)):
            code = fp.digest
        else:
            code = self.code_version()
        head = self._key_head  # the key's encoding up to the inputs, kept per code version
        if head[0] is not code:
            head = self._key_head = (code, f"{self.identity}\x00{code}\x00".encode())
        return xxhash.xxh3_128_hexdigest(head[1] + input_digest.encode()), code

    def key_for(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The cache key of a call with these arguments."""
        return self.cache_key(self.digest_inputs(self.arguments(instance, args, kwargs)))

    def side_effect_key(self, input_digest: str) -> str:
        """The key a ``cache=False`` step is journaled under: task identity and inputs, not
        code, so editing a side effect's code (a log line, a typo) never makes a finished
        side effect happen again when its run resumes."""
        return xxhash.xxh3_128_hexdigest(
            f"{self.identity}\x00side-effect\x00{input_digest}".encode())

    def journal_key(self, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The key that, with parent and occurrence, makes a call's step identity."""
        digest = self.digest_inputs(self.arguments(instance, args, kwargs))
        return self.cache_key(digest) if self.cache else self.side_effect_key(digest)

    def code_parts(self) -> dict[str, str]:
        """Fingerprint of each user function or class the code depends on (empty with an
        explicit ``version``)."""
        self.code_version()  # revalidated
        return self._parts()

    def _parts(self) -> dict[str, str]:
        """The parts of the fingerprint :meth:`code_version` last returned."""
        fp = self._fingerprint
        return dict(fp.changed_by) if self.version is None and fp is not None else {}

    def key_record(self, key: str, inputs: dict[str, str], code: str | None = None,
                   classes: dict[str, str] | None = None) -> KeyRecord:
        """What the key was made of (``inputs``: digest of each argument, taken on a miss
        before the body ran: paid on misses only, never on a hit). ``code``: the code version
        the key was made with (:meth:`key_and_code`), else the current one. ``classes``: the
        code digest of each user class in the arguments (:func:`class_digests`), kept among
        the parts under :data:`CLASS_PART` names."""
        if code is None:
            code = self.code_version()  # revalidated once; the parts are of that fingerprint
        fp = self._fingerprint
        parts = self._parts() if fp is not None and fp.digest == code else {}
        if classes:
            parts.update((CLASS_PART + path, d) for path, d in classes.items())
        return KeyRecord(self.identity, key, code, inputs, parts, now())


def _name_of_nameless(kind: str, raw: Any, name: str | None,
                      nameless: tuple[str, Any] | None) -> str:
    """The ``name=`` of a callable without a name of its own (a partial, a callable object),
    else a :class:`DefinitionError` naming the fix."""
    if nameless is None:
        raise DefinitionError(f"@{kind} needs a named function, got {raw!r}")
    if isinstance(name, str) and name:
        return name
    what, runs = nameless
    runs_name = getattr(runs, "__qualname__", None) or type(runs).__qualname__
    if what == "partial":
        suggested = runs_name.rpartition(".")[2] + "_bound"
        raise DefinitionError(
            f"durably.{kind}() of functools.partial({runs_name}, ...) needs a name: a partial "
            "has none of its own, and two partials of one function (bound to different "
            f"values) must not be one {kind}. Fix: durably.{kind}(partial(...), "
            f"name={suggested!r}) with a name of your choosing.")
    klass = type(raw).__qualname__
    raise DefinitionError(
        f"durably.{kind}() of a callable {klass} object needs a name: an object has none "
        f"of its own, and two objects configured differently must not be one {kind}. Fix: "
        f"durably.{kind}(obj, name={klass.lower()!r}) with a name of your choosing.")


def _bound_to_object(func: Any) -> str | None:
    """What ``func`` is bound to when it is a method bound to an object or a class
    (``obj.method``, ``Class.a_classmethod``, ``"text".upper``, ``(5).__add__``), else None.

    Functions are not: a module's built-in (``len``, bound to its module), a built-in class
    method (``bytes.fromhex``: its name says its class), and a built-in method a module
    exposes as one of its functions (``random.random``: one hidden object).
    """
    if inspect.ismethod(func):
        # a Python method: its object is bound again as its first argument on every call (a
        # TypeError, or the arguments shifted by one), wherever it is exposed
        owner = func.__self__
        return (f"the class {owner.__qualname__}" if isinstance(owner, type)
                else f"an object ({type(owner).__qualname__})")
    if not (inspect.isbuiltin(func) or inspect.ismethodwrapper(func)):
        return None
    owner = getattr(func, "__self__", None)
    if owner is None or isinstance(owner, (types.ModuleType, type)):
        return None  # len, math.sqrt; a built-in class method (bytes.fromhex) names its class
    name = getattr(func, "__name__", "")
    for where in (getattr(func, "__module__", None), type(owner).__module__):
        module = sys.modules.get(where) if isinstance(where, str) else None
        if module is not None and getattr(module, name, None) is func:
            return None
    return f"an object ({type(owner).__qualname__})"


def _unbound_fix(kind: str, func: Any, qualname: str) -> str:
    """How to make a task or entrypoint of what a bound method does."""
    a_kind = "an entrypoint" if kind == "entrypoint" else "a task"
    own = (f"or call it in a function of your own and make {a_kind} of that "
           "(def f(x): return obj.method(x)).")
    if getattr(func, "_self_parent", None) is not None:  # (a task's BoundTask)
        return (f"it is {a_kind} already, decorated in its class: call it as it is "
                "(obj.method(...) or Class.method(...)).")
    if isinstance(getattr(func, "__self__", None), type):
        return (f"decorate the classmethod in its class (@durably.{kind} above "
                f"@classmethod), or make {a_kind} of its function "
                f"(durably.{kind}({qualname}.__func__), called with the class first), " + own)
    return (f"decorate the method in its class (@durably.{kind} above its def), make "
            f"{a_kind} of a function that takes the object as its first argument "
            f"(durably.{kind}(Class.method), called as t(obj, ...)), " + own)


def step_identity(parent: str | None, key: str, occurrence: int) -> str:
    """The identity of the ``occurrence``-th call with cache key ``key`` under ``parent``
    (what :meth:`RunContext.step_id <durably._runtime.context.RunContext.step_id>` gives inside a
    run, counting the occurrences itself)."""
    return xxhash.xxh3_128_hexdigest(f"{parent or ''}/{key}/{occurrence}".encode())


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


class Call:
    """One task call in progress: what :func:`begin_step` found, to finish it with."""

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
               result_digest: str = "", output_digests: tuple[str, ...] = ()) -> StepRecord:
        ctx = self.ctx
        assert ctx is not None
        return StepRecord(
            ctx.run_id, self.step_id, self.parent, self.spec.name, status, ctx.attempt,
            self.position, self.started, self.ended if self.ended is not None else now(),
            error, self.key if self.spec.cache else "",
            self.args_repr, output, result_digest, self.flow, output_digests,
        )

    def trace_inputs(self, arguments: dict[str, Any], each: dict[str, str] | None = None,
                     taken: dict[str, list[str | None]] | None = None) -> None:
        """Take the tracer's view of the arguments (before the body may mutate them);
        ``each``: their digests, when known (else ``self.inputs``, else taken here);
        ``taken``: their elements' digests taken with the key (see flow_digests)."""
        if self.args_repr is None:  # a listener may have taken it already
            self.args_repr = inputs_repr(arguments)
        self.flow = flow_digests(arguments, self.inputs or each or None, taken)

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

    def _stored(self, result: Any) -> bytes:
        """The bytes stored for ``result``: with the new state of the arguments the body
        changed in place (see _effects), when any did."""
        what = f"the result of task {self.spec.name!r}"
        if self.mutable is not None:  # (None: succeeded() pickles the result itself)
            moved = changed(self.spec.name, self.mutable[1], self.mutable[0])
            if moved:
                try:
                    return _serde.dumps(Effects(result, moved), what=what)
                except SerializationError:
                    warn_once(self.spec.name, tuple(moved), "the new state cannot be pickled",
                              self.spec)
        return _serde.dumps(result, what=what)

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
        try:
            data = self._stored(result) if self.mutable is not None else _serde.dumps(
                result, what=f"the result of task {spec.name!r}")
        except SerializationError as exc:
            self.failed(exc)  # journaled (and streamed) as the step's failure
            raise
        ctx = self.ctx
        if ctx is None or ctx.pid != _pid[0]:  # outside a run (or a process forked inside it)
            if spec.cache and (ctx is None or self.step_id not in ctx.uncacheable) and not (
                    spec.changed_in_place()) and not self.files_changed() \
                    and not (_UNLOADABLE and self.key in _UNLOADABLE
                             and not _loads_back(self.key, data)):
                self.store.cache_put(self.key, data, spec.key_record(
                    self.key, self.inputs, self.code or None, self.classes))
            return result
        record = self.record("ran", None, short_repr(result), *trace_digests(result))
        cacheable = spec.cache and not spec.changed_in_place() and not self.files_changed() \
            and not (_UNLOADABLE and self.key in _UNLOADABLE and not _loads_back(self.key, data))
        if ctx.uncacheable and self.step_id in ctx.uncacheable:
            cacheable = False  # it depends on an answer to interrupt()
            if self.parent is not None:
                ctx.uncacheable.add(self.parent)
        slow = spec.slow = record.ended - record.started >= _WRITE_THROUGH
        if cacheable:
            info = spec.key_record(self.key, self.inputs, self.code or None, self.classes)
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
        if ctx.listener is not None:
            ctx.emit(self.event("step_finished", record))
        return result


_MISS = object()
_wall_clock = time.time  # (now(), without a call: it runs twice in every replayed step)
_xxh3_64 = xxhash.xxh3_64_intdigest
_xxh3_128_hex = xxhash.xxh3_128_hexdigest
_monotonic = time.monotonic
_thread_id = threading.get_ident
#: what begin_step returns as the call of a step served from the journal (replayed): nothing
#: is left to finish, so no Call is built for it unless a listener is shown the step
_SERVED = Call.__new__(Call)


def _mark_started(ctx: RunContext, step_id: str) -> None:
    """Journal that a step with nested steps is executing (one row per such step), so the
    graph of a run that crashes inside it still shows it and nests its children. Marked
    once the row is journaled: a child on another thread of the step's waits for it here,
    so that no child's record is committed before its parent's."""
    with ctx.marking:
        if step_id in ctx.marked:
            return  # (by another thread, meanwhile)
        caller = ctx.executing(step_id)  # (a plain call, or an item of a fan-out)
        if caller is not None:
            ctx.journal([(caller.record("started"), None)])
        ctx.marked.add(step_id)


def _file_stamps(fp: Fingerprint) -> dict[File, Any]:
    """The os.stat() of the durably.file() values of a task's code fingerprint, taken
    before its key is made (which may read them: a check of their content, or the walk of
    a new fingerprint)."""
    return {f: file_stamp(f) for f, _ in fp.files}


def _file_inputs(spec: Spec, files: list[tuple[File, Any]] | None,
                 before: dict[File, Any] | None) -> list[tuple[File, Any]] | None:
    """The durably.file() inputs of a body about to run, each with an os.stat() taken before
    its content was read for the key: those its arguments' digest met (``files``), and
    those of its code fingerprint, however nested (their stamps from before the key was
    made, ``before``, else from the walk that read them). A file written or touched after
    that, even before the body started, keeps the result out of the cache
    (:meth:`Call.files_changed`). None when it has none."""
    found: dict[File, Any] = {}
    for f, stamp in files or ():
        found.setdefault(f, stamp)
    fp = spec._fingerprint
    for f, stamp in fp.files if fp is not None else ():
        if f not in found:
            found[f] = before[f] if before is not None and f in before else stamp
    return list(found.items()) or None


def call_path(ctx: RunContext, step_id: str) -> str:
    """The call path of a step executing now: a digest of the tasks, inputs and
    occurrences of it and its callers, without their code (their step ids follow their
    code). A step not found executing stands for itself (its step id)."""
    call = ctx.executing(step_id)
    if call is None or call.path_head is None:
        return step_id
    if call.path is None:
        up = call_path(ctx, call.parent) if call.parent is not None else ""
        input_digest, occurrence = call.path_head
        task_and_inputs = call.spec.side_effect_key(input_digest)  # (its code left out)
        call.path = _xxh3_128_hex(f"~{up}/{task_and_inputs}/{occurrence}".encode())
    return str(call.path)


def _occurrence_id(ctx: RunContext, head: bytes) -> str:
    """The step id ``head`` gives its next occurrence (counted apart from the step ids
    in use: a legacy identity looked up on replay)."""
    n = ctx.occurrence(_xxh3_64(b"legacy:" + head), object())
    return _xxh3_128_hex(b"%s/%d" % (head, n))


def begin_step(spec: Spec, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> tuple[Any, Call]:
    """Steps 1 to 5 of the call path up to execution: returns (value, call) where value is the
    replayed or cached result, or ``_MISS`` when the body must run."""
    ctx = current_run.get()  # (live_run, inlined: the call path)
    if ctx.foreign if ctx is not None else _RUNS:  # a thread the run may not know
        ctx = thread_run(ctx, spec)
    if ctx is not None and ctx.pid != _pid[0]:
        ctx = None  # a run of the process this one was forked from: not this process's
    abandoned = cutoff.get()
    if abandoned is not None and abandoned.cut:
        raise StopRun()  # called by a body whose try timed out: it is not part of the run
    store = ctx.store if ctx is not None else (spec.store or default_store())
    plan = spec._plan
    arguments: Any = None  # bound only when needed: a replayed step or a hit does without
    each: dict[str, str] | None = None  # argument digests taken with the key's (see below)
    taken: dict[str, list[str | None]] | None = None  # and their elements', for the tracer
    classes: dict[str, str] | None = None  # and their user classes' code, for explain
    files: list[tuple[File, Any]] | None = None  # the durably.file() values among them
    input_digest = encode_positional(plan, args) if (
        plan is not None and not kwargs and instance is None
        and len(args) == spec._npositional) else None
    if input_digest is None:
        arguments = spec.arguments(instance, args, kwargs)
        # with the digests of each argument (digest_each) and of their elements (the
        # tracer's flow digests), which would encode them again when the step executes: a
        # list or dict argument is encoded once, not three times. Not for a step that is
        # likely replayed, which needs neither (the elements' taps cost a third more)
        each = {}
        classes = {}
        taken = {} if ctx is not None and (not ctx.replaying or ctx.past_journal) else None
        files = []  # the durably.file() values among them, however nested
        token = _files_seen.set(files)
        try:
            input_digest = encode_arguments(arguments, each, taken, classes)  # (digest_inputs)
        except (SerializationError, RecursionError) as exc:
            raise spec.digest_error(exc, arguments) from None
        finally:
            _files_seen.reset(token)
    fp = spec._fingerprint  # its durably.file() values stamped before the key reads them
    before = _file_stamps(fp) if fp is not None and fp.files else None
    key, code = spec.key_and_code(input_digest)
    if ctx is None:
        outside = Call(spec, ctx, store, key, code)
        if spec.cache:
            data = store.cache_get(key)
            if data is not None:
                value = _load_cached(data, spec, store, key)
                if type(value) is Effects:
                    value = restored(spec.name, value, arguments if arguments is not None
                                     else spec.arguments(instance, args, kwargs), spec)
                if value is not _MISS:
                    return value, outside
            if arguments is None:
                arguments = spec.arguments(instance, args, kwargs)
            outside.started = _wall_clock()
            outside.inputs = digest_each(arguments, each, classes)  # before the body runs
            outside.classes = classes
            outside_changes = mutable(arguments)
            if outside_changes:
                outside.mutable = (outside_changes, state_before(outside_changes,
                                                                  outside.inputs))
            outside.files = _file_inputs(spec, files, before)
        return _MISS, outside
    if ctx.stop:
        raise StopRun()
    if _monotonic() >= ctx.renew_at:  # (keep_lease's test, without its call)
        ctx.keep_lease()
        if ctx.stop:  # the lease was found lost
            raise StopRun()
    parent = current_step.get()
    if ctx.halting and ctx.halted(parent):
        raise StopRun()  # inside an item of a map that is stopping (Ctrl-C)
    if parent is not None and parent not in ctx.marked:
        _mark_started(ctx, parent)
    journal_key = key if spec.cache else spec.side_effect_key(input_digest)
    legacy: str | None = None  # a nested side effect's id as earlier versions made it
    if parent is not None and not spec.cache:
        # a side effect inside another step is identified by its callers' tasks and inputs,
        # not by their step ids, which follow their code: an edit of a caller (a deploy
        # while the run waits for an answer, a fix) never makes a finished side effect
        # happen again in its run
        head = f"~{call_path(ctx, parent)}/{journal_key}".encode()
        if ctx.replaying:
            legacy = _occurrence_id(ctx, f"{parent}/{journal_key}".encode())
    else:
        # (RunContext.step_id, inlined: every call in a run; the same identity)
        head = f"{parent or ''}/{journal_key}".encode()
    position = next(ctx.positions)
    slot = _xxh3_64(head)
    # (RunContext.occurrence, inlined: its mark is the call's position)
    got = ctx._occurrences.setdefault(slot, position)
    if got is position:
        occurrence = 0
        step_id = _xxh3_128_hex(head + b"/0")
    else:
        occurrence = ctx.occurrence_again(slot)
        step_id = _xxh3_128_hex(b"%s/%d" % (head, occurrence))
    started = _wall_clock()
    call: Call | None = None  # built only when needed: a replayed step does without
    if ctx.listener is not None:
        call = Call(spec, ctx, store, key, code, parent, step_id, position, started)
        if arguments is None:
            arguments = spec.arguments(instance, args, kwargs)
        call.args_repr = inputs_repr(arguments)
        ctx.emit(call.event("step_started"))
    noted: ReadAhead | None = None  # the read-ahead that recorded the step as replayed
    if not ctx.replaying:
        data = None
    elif legacy is None and (ahead := ctx.ahead) is not None and ahead.thread == _thread_id():
        # (the run's own thread: the steps it replays are recorded as ranges there, with
        # the parent of their record; not a nested side effect, found by its call path
        # whatever its parent's id: its record keeps the caller that called it now)
        data = ahead.replay(step_id, position, started)
        if data is not None:
            noted = ahead
    else:
        data = store.find_step(ctx.run_id, step_id)
    if data is None and legacy is not None:
        # journaled by an older durably under its caller's step id: that record, under
        # that id (its own nested steps were journaled under it)
        data = store.find_step(ctx.run_id, legacy)
        if data is not None:
            step_id = legacy
            if call is not None:
                call.step_id = legacy
    if data is None and ctx.keep is not None and spec.cache:
        # keep_finished=True: the step this run finished under older code (see _keep)
        found = ctx.keep.find(spec, parent, input_digest, occurrence, step_id, code,
                              instance, args, kwargs)
        if found is not None:
            if call is None:
                call = Call(spec, ctx, store, key, code, parent, step_id, position, started)
            return ctx.keep.serve(found, call, instance, args, kwargs), _SERVED
    if data is None and ctx.failed_before and step_id in ctx.failed_before:
        # it failed in an earlier attempt and the run went on: its failure is replayed
        if noted is not None:
            noted.retract()
        raise ReplayedFailure(_replay_failure(ctx, Call(
            spec, ctx, store, key, code, parent, step_id, position, started)
            if call is None else call, lambda: arguments if arguments is not None
            else spec.arguments(instance, args, kwargs)))
    if data is None and ctx.deferred is not None:
        # an attempt that only replayed so far: its start journaled and its lease taken
        # before this step executes (whichever thread gets here first; the others wait)
        ctx.claim()
    if data is None and ctx.replaying and not ctx.past_journal:
        ctx.past_journal = True
        if ctx._pending or ctx.replays_buffered:  # (whole records, with a listener: a stream)
            # the steps replayed so far are journaled before the first one executed: a
            # crash from here on still shows where the attempt was (one write an attempt)
            ctx.flush()
    if data is not None:
        try:
            value = pickle.loads(data)  # (_load, inlined for the common case)
        except Exception:  # noqa: BLE001 - not a plain pickle, or it fails: said by _load
            try:
                value = _load(data, spec, "journaled")
            except SerializationError as exc:
                if noted is not None:
                    noted.retract()  # (not replayed: the step raises, or executes)
                if not spec.cache:
                    raise  # (a side effect: executing it again is the user's decision)
                # cacheable (safe to compute again): a miss, as a damaged record is
                why = str(exc).partition(": ")[2].partition(". Either")[0]
                warnings.warn(
                    f"durably: run {ctx.run_id!r}: the journaled result of task "
                    f"{spec.name!r} cannot be loaded in this process ({why}); the task is "
                    "cacheable, so it is served from the cache or executed again.",
                    stacklevel=_user_stacklevel())
                data = None
                if ctx.deferred is not None:
                    ctx.claim()
            except BaseException:
                if noted is not None:
                    noted.retract()  # (not replayed: the step raises)
                raise
    if data is not None:
        if type(value) is Effects:  # (it changed its arguments in place: redone)
            value = restored(spec.name, value, arguments if arguments is not None
                             else spec.arguments(instance, args, kwargs), spec)
        if step_id in ctx.uncacheable:  # (it used an answer: spent, see interrupt())
            ctx.spent.add(step_id)
            if parent is not None:
                ctx.uncacheable.add(parent)
        if noted is not None:
            if noted.due:  # (as many replay ranges as an attempt buffers)
                ctx.flush()
            return value, _SERVED
        if call is None:
            replays = ctx._replays  # (RunContext.note_replayed, inlined: every replayed step)
            replays.append((position, started, _wall_clock(), step_id, parent,
                            key if spec.cache else "", spec.name))
            if len(replays) >= _FLUSH_EVERY:
                ctx.flush()
            return value, _SERVED
        # the whole record: it keeps the inputs the listener was shown
        record = call.record("replayed")
        ctx.note_replayed_record(record)
        ctx.emit(call.event("step_finished", dataclasses.replace(
            record, output=short_repr(value))))
        return value, _SERVED
    if call is None:
        call = Call(spec, ctx, store, key, code, parent, step_id, position, started)
    call.path_head = (input_digest, occurrence)
    if arguments is None:
        arguments = spec.arguments(instance, args, kwargs)
    call.arguments = arguments
    may_change: list[tuple[str, Any]] | None = None  # (what the body may change: _effects)
    for value in arguments.values():
        if type(value) not in _IMMUTABLE:  # (a plain loop: no call for the common ones)
            may_change = mutable(arguments)
            break
    if spec.slow and ctx.queued_cache:
        _write_queued(ctx)
    if spec.cache:
        data = ctx.pending_cache(key) if ctx.read_cache else None
        if data is None and ctx.read_cache:
            data = store.cache_get(key)
        if data is None:
            call.files = _file_inputs(spec, files, before)
        call.inputs = digest_each(arguments, each, classes)  # before the body may mutate them
        call.classes = classes
        if may_change:
            call.mutable = (may_change, state_before(may_change, call.inputs))
        call.trace_inputs(arguments, None, taken)
        if data is not None:
            value = serve_cached(call, data)
            if value is not _MISS:
                return value, call
            call.files = _file_inputs(spec, files, before)  # (as for a miss)
    else:
        if may_change:  # (their digests before the body may change them)
            call.mutable = (may_change, state_before(may_change, each))
        # the digests of whole arguments the tracer takes: those taken with the key ("" for
        # a value too common to mean a flow, as trace_digest gives; the others, its own)
        call.trace_inputs(arguments, {n: "" if too_common(arguments[n]) else d
                                      for n, d in each.items()} if each else None, taken)
    return _MISS, call


def _replay_failure(ctx: RunContext, call: Call,
                    arguments: Callable[[], dict[str, Any]]) -> BaseException:
    """The exception a step that failed in an earlier attempt of the run raised, to raise
    again (see :mod:`durably._runtime.failures`), after putting back into the caller's objects what
    its body changed in them before it raised; its ``failed`` record is buffered like a
    replayed step's (the attempt may have only replayed so far: nothing executes)."""
    exc, moved = replayed(ctx.failed_before[call.step_id], ctx.run_id)
    if moved:
        restored(call.spec.name, Effects(None, moved), arguments(), call.spec)
    record = call.record("failed", repr(exc)[:2000])
    if ctx.deferred is None or ctx.claim(replays=True):  # (a whole record: the run's own)
        ctx.note_replayed_record(record)
    ctx.count("failed")
    note_failure(ctx.failures, exc, call.step_id)  # (an escape releases it again)
    if ctx.listener is not None:
        ctx.emit(call.event("step_failed", record, data=record.error))
    return exc


def cached_now(call: Call) -> bytes | None:
    """The cached result of a call whose body was to run, if its key has one by now (a
    duplicate in a fan-out, after the first such item finished), as :func:`begin_step`
    would have found it; None in a fork's first attempt (it reads no cache)."""
    ctx = call.ctx
    if ctx is not None and not ctx.read_cache:
        return None
    data = ctx.pending_cache(call.key) if ctx is not None else None
    return data if data is not None else call.store.cache_get(call.key)


def serve_cached(call: Call, data: bytes) -> Any:
    """Finish ``call`` from the cross-run cache: its value, journaled as a cached step
    inside a run; ``_MISS`` when the value cannot be loaded (see :func:`_load_cached`):
    the call is not finished, its body must run."""
    value = _load_cached(data, call.spec, call.store, call.key)
    if value is _MISS:
        return _MISS
    if type(value) is Effects:
        value = restored(call.spec.name, value, call.arguments or {}, call.spec)
    ctx = call.ctx
    if ctx is not None:
        record = call.record("cached", None, short_repr(value), *trace_digests(value))
        ctx.note_cached(record, data)
        if ctx.listener is not None:
            ctx.emit(call.event("step_finished", record))
    return value


def _write_queued(ctx: RunContext) -> None:
    """Before a step that may be slow (its last execution was, or it never executed here)
    looks for its result: write the cache entries cheap steps queued, so that other
    processes see them while it executes instead of after it (the queue's time limit is
    only looked at when a cheap step queues an entry). A failure leaves them queued: the
    attempt's end writes them, or says why it cannot."""
    try:
        ctx.flush_cache()
    except Exception as exc:  # noqa: BLE001 - the journal has them; the end retries
        log.debug("durably: run %r: queued cache entries not written yet: %s", ctx.run_id,
                  exc)


def call_sync(spec: Spec, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
    try:
        value, call = begin_step(spec, instance, args, kwargs)
    except ReplayedFailure as replayed_failure:
        raise replayed_failure.error from None
    if value is not _MISS:
        return value
    return execute_sync(spec, call, wrapped, args, kwargs)


def execute_sync(spec: Spec, call: Call, wrapped: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
    """The rest of :func:`call_sync` once :func:`begin_step` found no result: execute the
    body (under ``retry=`` / ``timeout=``) and finish ``call``."""
    if spec.retry is not None or spec.timeout is not None:
        return _call_with_policy(spec, call, wrapped, args, kwargs)
    call.enter()
    try:
        result = wrapped(*args, **kwargs)
    except InterruptSignal as signal:
        call.interrupted(signal)
        raise
    except BaseException as exc:
        call.failed(exc)
        raise
    finally:
        call.exit()
    return call.succeeded(result)


async def call_async(spec: Spec, wrapped: Callable[..., Any], instance: Any,
                     args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        value, call = begin_step(spec, instance, args, kwargs)
    except ReplayedFailure as replayed_failure:
        raise replayed_failure.error from None
    if value is not _MISS:
        return value
    ctx = call.ctx
    # (asyncio is imported: this runs on its loop; not imported at `import durably`)
    me_task = sys.modules["asyncio"].current_task() if ctx is not None else None
    if me_task is not None and ctx is not None:
        ctx.inflight.add(me_task)
    try:
        if spec.retry is not None or spec.timeout is not None:
            return await _acall_with_policy(spec, call, wrapped, args, kwargs)
        return await _acall_body(call, wrapped, args, kwargs)
    finally:
        if me_task is not None and ctx is not None:
            ctx.inflight.discard(me_task)


async def _acall_body(call: Call, wrapped: Callable[..., Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
    call.enter()
    try:
        result = await wrapped(*args, **kwargs)
    except InterruptSignal as signal:
        call.interrupted(signal)
        raise
    except BaseException as exc:
        call.failed(exc)
        raise
    finally:
        call.exit()
    return call.succeeded(result)


_NEVER_RETRIED = (InterruptSignal, StopRun, KeyboardInterrupt, SystemExit)


def _last_try(policy: Retry, tries: int, exc: BaseException) -> bool:
    """Whether no other try follows a try that failed with ``exc`` (as ``retrying`` decides:
    the tries are used up, or ``exc`` is not retried)."""
    return tries >= policy.attempts or not (isinstance(exc, policy.on)
                                            and not isinstance(exc, _NEVER_RETRIED))


def _try_label(policy: Retry, tries: int, exc: BaseException) -> str:
    """What a failed try's error is prefixed with: which try it was, and, when no other
    follows though tries are left, why ("" without retries)."""
    if policy.attempts <= 1:
        return ""
    label = f"try {tries} of {policy.attempts}"
    if tries < policy.attempts and not (isinstance(exc, policy.on)
                                         and not isinstance(exc, _NEVER_RETRIED)):
        label += f", not retried ({type(exc).__name__} is not in on=)"
    return label


def _retry_asks_again(call: Call) -> None:
    """Before another try of a step: its ``interrupt()`` calls are counted from the first
    again, so a question answered before a try failed gets the same answer (the same
    interrupt id), instead of pausing the run to ask it a second time."""
    ctx = call.ctx
    if ctx is not None and call.step_id:
        with ctx._lock:
            ctx.interrupts.pop(call.step_id, None)


def _call_with_policy(spec: Spec, call: Call, wrapped: Callable[..., Any],
                      args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Execute a body under ``retry=`` / ``timeout=``: every failed try is journaled."""
    policy = spec.retry or Retry(attempts=1)
    tries = 0
    result: Any = None
    for attempt in retrying(policy, _NEVER_RETRIED, is_async=False):
        with attempt:
            tries += 1
            if tries > 1:
                call.started = now()
                _retry_asks_again(call)
            call.enter()
            try:
                if spec.timeout is not None:
                    result = call_with_timeout(spec.name, spec.timeout, wrapped, args, kwargs)
                else:
                    result = wrapped(*args, **kwargs)
            except InterruptSignal as signal:
                call.interrupted(signal)
                raise
            except BaseException as exc:
                call.failed(exc, _try_label(policy, tries, exc), _last_try(policy, tries, exc))
                raise
            finally:
                call.exit()
    return call.succeeded(result)


async def _acall_with_policy(spec: Spec, call: Call, wrapped: Callable[..., Any],
                             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    policy = spec.retry or Retry(attempts=1)
    tries = 0
    result: Any = None
    async for attempt in retrying(policy, _NEVER_RETRIED, is_async=True):
        with attempt:
            tries += 1
            if tries > 1:
                call.started = now()
                _retry_asks_again(call)
            call.enter()
            try:
                if spec.timeout is not None:
                    result = await await_with_timeout(spec.name, spec.timeout,
                                                      wrapped(*args, **kwargs))
                else:
                    result = await wrapped(*args, **kwargs)
            except InterruptSignal as signal:
                call.interrupted(signal)
                raise
            except BaseException as exc:
                call.failed(exc, _try_label(policy, tries, exc), _last_try(policy, tries, exc))
                raise
            finally:
                call.exit()
    return call.succeeded(result)


# -- runs ------------------------------------------------------------------------------------
def validate_run_id(run_id: Any) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise DefinitionError(
            f"invalid run_id {run_id!r}: use 1 to 200 letters, digits and . _ : @ + = -, starting "
            "with a letter or digit (for example run_id=\"nightly-2026-11-29\")"
        )
    return run_id


@functools.lru_cache(maxsize=1024)
def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:80] or "run"


class Started:
    """A run that :func:`begin_run` started: its record, context and context tokens."""

    __slots__ = ("ctx", "ended", "record", "resumed_from", "tokens", "wall")

    def __init__(self, record: RunRecord, ctx: RunContext, resumed_from: str | None) -> None:
        self.record = record
        self.ctx = ctx
        self.ended = False  # end_run was called
        self.tokens: tuple[Any, Any] | None = (current_run.set(ctx), current_step.set(None))
        self.resumed_from = resumed_from
        self.wall = now()


def begin_run(spec: Spec, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *,
              run_id: str | None, fresh: bool, listener: Callable[[Event], Any] | None = None,
              read_cache: bool = True, store: Store | None = None,
              on_lease: Callable[[Store, RunRecord | None], None] | None = None) -> Started:
    """Find or create the run record and make the run active in this context.

    ``listener`` receives the run's live events; ``read_cache=False`` (a fork's first
    attempt) executes steps that are not in the run's journal instead of taking them from
    the cross-run cache. ``on_lease`` runs once the lease is held, with the run's record
    read again (resume journals its answers there, so two resumers cannot both answer)."""
    if not isinstance(fresh, bool):
        raise DefinitionError(f"fresh must be True or False, not {fresh!r}")
    store = store or spec.store or default_store()
    arguments = spec.arguments(instance, args, kwargs)
    input_digest = spec.digest_inputs(arguments)
    if run_id is not None:
        validate_run_id(run_id)
    try:
        stored_args: bytes | None = _serde.dumps((args, kwargs), what="the run's arguments")
        if stored_args is not None and len(stored_args) > _MAX_ARGS_BYTES:
            stored_args = None
    except SerializationError:
        stored_args = None
    outer = current_run.get(), current_step.get()  # (restored if interrupted below)
    ctx: RunContext | None = None
    owner = me()
    hold(owner)  # from now on, a lease of this process with its token is not a leftover
    leasing: str | None = None  # the run whose lease this attempt may hold
    ahead: ReadAhead | None = None  # the run's first steps, read with its record
    existing: RunRecord | None
    # the lease, the run's record and its start event commit together: one commit, and no
    # other process sees the lease without the record (a store without batch(): one each)
    try:
        ended = _ended_run(store, spec, run_id, input_digest, owner) if (
            not fresh and listener is None and on_lease is None and read_cache) else None
        if ended is not None:
            # a run that ended (failed, stopped, finished), read without a write lock: its
            # start is journaled with its first write, or with its end (see _Deferred)
            run_id, existing, events, ahead = ended
            deferred = True
            record, resumed_from, started_event = _attempt_record(
                spec, run_id, existing, input_digest, stored_args)
        else:
            with _one_transaction(store):
                # read inside the transaction: no other process can start or end an attempt
                # of the run between this read and the lease (a store without batch(): read
                # again once the lease is held, below)
                run_id, existing = _resolve_run(store, spec, run_id, fresh, input_digest)
                leasing = run_id
                # a run that ended (failed, stopped, finished) is most often resumed to
                # replay its journal and execute what follows: its start is journaled with
                # its first write, or with its end (see _Deferred); only looked at by lease
                # now (a store without snapshot(): see _ended_run)
                deferred = (existing is not None and existing.status in _DEFERRED_FROM
                            and listener is None and on_lease is None and read_cache)
                holder = (store.check_run(run_id, owner) if deferred
                          else store.acquire_run(run_id, owner))
                if holder is not None:
                    raise _held(run_id, holder, owner)
                try:
                    if on_lease is not None:
                        on_lease(store, existing)
                    record, resumed_from, started_event = _attempt_record(
                        spec, run_id, existing, input_digest, stored_args)
                    if not deferred:
                        store.put_run(record)
                    events = [] if existing is None else store.list_events(run_id, _ASKED)
                    if not deferred:
                        store.append_events([started_event])
                except BaseException:
                    if not deferred:
                        store.release_run(run_id, owner)  # never leave a lease behind
                    raise
        t = record.updated
        answers: dict[str, bytes] = {}
        asked: set[str] = set()
        questions: dict[str, bytes | None] = {}
        codes: dict[str, str] = {}  # the code that asked each question, if known
        failed_before: dict[str, bytes] = {}  # (see _failures)
        for e in events:
            if e.kind == "answer" and e.data is not None:
                answers[e.key] = e.data
            elif e.kind == RAISED and e.step_id is not None and e.data is not None:
                failed_before[e.step_id] = e.data
            elif e.kind == RETRY and e.step_id is not None:
                failed_before.pop(e.step_id, None)
            elif e.kind == "interrupt_code" and e.data is not None:
                codes[e.key] = e.data.decode("ascii", "replace")
            elif e.kind == "interrupt":
                questions[e.key] = e.data
                if e.step_id is not None:
                    asked.add(e.step_id)
    except BaseException:
        _abandon(store)
        try:
            if leasing is not None:
                # a Ctrl-C as the transaction committed: the lease is written, and would
                # refuse other processes while this one lives (only this attempt's token is
                # deleted: nothing, if it took none)
                with contextlib.suppress(Exception):
                    store.release_run(leasing, owner)
        finally:
            let_go(owner)
        raise
    # from here until the caller's try (which ends the attempt), a KeyboardInterrupt must not
    # leave the lease held or this context inside a run that nobody will end
    try:
        # renewed while the attempt executes, even inside a step's body (until let_go)
        renewal = _Renewal(store.renew_run_apart, run_id, owner)
        if not deferred:
            beat(owner, renewal)
        held = _answer_dependent(store, run_id, asked)
        if existing is not None and existing.status == "running":
            try:  # after a crash (the cache is another database: outside the transaction)
                _restore_cache(store, run_id, existing.attempt, held)
            except Exception as exc:  # noqa: BLE001 - the journal has every result
                log.warning("durably: run %r: the cache entries its crashed attempt had "
                            "queued could not be put back (%s); its journal has their results",
                            run_id, exc)
        ctx = RunContext(run_id, store, record.attempt, owner, name=spec.name,
                         listener=listener, answers=answers, read_cache=read_cache)
        ctx.replaying = existing is not None
        ctx.failed_before = failed_before
        if existing is not None and isinstance(existing.result, _serde.Spilled):
            ctx.stored_result = existing.result  # (a large one, kept in blobs/)
        if ahead is None and ctx.replaying:
            ahead = store.read_ahead(run_id)
        if listener is None:  # (a listener is shown each replayed step's whole record)
            ctx.ahead = ahead
        ctx.uncacheable.update(held)
        renewal.ctx = ctx
        if deferred:
            assert existing is not None
            ctx.deferred = _Deferred(store, record, existing.attempt, started_event, renewal)
            ctx.renew_at = math.inf  # (no lease to renew until it is taken)
        if renewal.lost:  # (found while the attempt was being set up)
            ctx.lose_lease()
        ctx.entry = spec
        for interrupt_id, payload in questions.items():
            if interrupt_id in answers and payload is not None:
                with contextlib.suppress(Exception):  # a payload class gone: keep the answer
                    ctx.asked[interrupt_id] = trace_digest(_serde.loads(payload))
                    if interrupt_id in codes:
                        ctx.asked_code[interrupt_id] = codes[interrupt_id]
        if listener is not None and hasattr(listener, "ctx"):
            listener.ctx = ctx  # so the consumer of a stream can stop the run
        if listener is not None:
            ctx.emit(Event("run_started", run_id, t, task=spec.name,
                           status=resumed_from or "new", attempt=record.attempt))
        return Started(record, ctx, resumed_from)
    except BaseException:
        if ctx is not None and current_run.get() is ctx:
            current_run.set(outer[0])
            current_step.set(outer[1])
        try:
            store.release_run(run_id, owner)
        finally:
            let_go(owner)
        raise


#: the events an attempt reads when it starts: the questions asked and answered so far
_ASKED = ("interrupt", "answer", "interrupt_code", RAISED, RETRY)


def _ended_run(store: Store, spec: Spec, run_id: str | None, input_digest: str, owner: Owner
               ) -> tuple[str, RunRecord, list[EventRecord], ReadAhead | None] | None:
    """The run a call resumes, if it had ended (failed, stopped, finished: see _Deferred) and
    no live process holds it: its id, record, questions and answers, and its first steps,
    read in one snapshot of a store that takes them (a DiskStore), without a write lock.
    None when the run is new, or in another state, or the store cannot take such a
    snapshot: the attempt starts in a write transaction instead.

    Raises:
        RunStateError: another live process holds the run (as when the lease is taken).
    """
    with store.snapshot():
        run_id, existing = _resolve_run(store, spec, run_id, False, input_digest)
        if existing is None:
            return None
        # (a run another live process executes is refused here too, without waiting for
        # the journal's write lock; in another state, the attempt starts as said above)
        holder = store.run_holder(run_id)
        if holder is not None and holder.token != owner.token:
            raise _held(run_id, holder, owner)
        if existing.status not in _DEFERRED_FROM:
            return None
        events = store.list_events(run_id, _ASKED)
        return run_id, existing, events, store.read_ahead(run_id)


def _attempt_record(spec: Spec, run_id: str, existing: RunRecord | None, input_digest: str,
                    args: bytes | None) -> tuple[RunRecord, str | None, EventRecord]:
    """The record of the attempt that starts now (running), the status of the run it
    resumes (None: a new run; "crashed": one still running whose process died), and the
    attempt's start event."""
    t = now()
    record = RunRecord(
        run_id=run_id,
        entrypoint=spec.identity,
        name=spec.name,
        status="running",
        created=existing.created if existing else t,
        updated=t,
        attempt=(existing.attempt + 1) if existing else 1,
        input_digest=input_digest,
        args=args,
    )
    resumed_from = None if existing is None else (
        "crashed" if existing.status == "running" else existing.status)
    started_event = EventRecord(
        run_id, "run_started", t, record.attempt,
        data=_started_data(resumed_from or "new"))
    return record, resumed_from, started_event


@functools.lru_cache(maxsize=16)
def _started_data(status: str) -> bytes | None:
    """The data of a start event (the status the run is resumed from), made once each."""
    return _serde.dumps({"status": status}, what="a run event")


class _Renewal:
    """The renewal of an attempt's lease by the lease's thread (see :func:`beat`): a lease
    found taken over stops the attempt (:meth:`RunContext.lose_lease`)."""

    __slots__ = ("ctx", "lost", "owner", "renew", "run_id")

    def __init__(self, renew: Callable[[str, Owner], bool | None], run_id: str,
                 owner: Owner) -> None:
        self.renew, self.run_id, self.owner = renew, run_id, owner
        self.ctx: RunContext | None = None
        self.lost = False

    def __call__(self) -> None:
        if self.renew(self.run_id, self.owner) is False:
            self.lost = True
            if self.ctx is not None:
                self.ctx.lose_lease()


#: the statuses of a run whose next attempt journals its start with its first write (see
#: _Deferred); not "running" (a crashed attempt: its queued cache entries are put back
#: first), "interrupted" (it waits for answers) nor "forked"
_DEFERRED_FROM = frozenset({"failed", "stopped", "finished"})


def _held(run_id: str, holder: Owner, owner: Owner) -> RunStateError:
    """The error of an attempt that finds the run's lease held by ``holder``, alive."""
    if holder.pid == owner.pid and holder.host == owner.host:
        return RunStateError(
            f"run {run_id!r} is being executed in this process right now (by another "
            "thread, or a stream() that is still open: close it with .close(), or "
            "finish iterating it). Fix: wait for it, or start a separate run with "
            "fresh=True or another run_id.")
    if holder.host != owner.host:
        # another machine, or another pid namespace (a container): its process
        # cannot be looked at from here, only its lease's heartbeat
        age = max(0.0, time.time() - holder.heartbeat)
        left = max(0.0, LEASE_SECONDS - age)
        return RunStateError(
            f"run {run_id!r} is held by {holder.describe()}, which this process "
            "cannot look at (another machine, or another container's pid namespace)"
            f": its lease was renewed {age:.0f} s ago. If that process is executing "
            "the run, two processes must not. If it died, the run can be resumed "
            f"once its lease expires, in {left:.0f} s (a lease not renewed for "
            f"{LEASE_SECONDS:.0f} s). Fix: wait for it to finish or expire (then "
            "rerun), or start a separate run with fresh=True or another run_id.")
    return RunStateError(
        f"run {run_id!r} is being executed by {holder.describe()} right now; two "
        "processes must not execute one run. Fix: wait for it to finish (then rerun to "
        "get its result), or start a separate run with fresh=True or another run_id."
    )


class _Deferred:
    """The start of an attempt that has only replayed so far (of a run that ended: see
    _DEFERRED_FROM). Replaying writes nothing, so the attempt takes the run's lease, marks
    its record running and journals its start event only when it first writes: before a
    step executes, or a record, event or batch of replays is journaled
    (:meth:`RunContext.claim`). An attempt that only replays journals its start with its
    end, in the one commit that ends it, without a lease: the run is resumed with one
    commit instead of two.

    Either way the write is refused, and nothing of the attempt journaled, unless the run
    is as the attempt found it: no other process holds its lease, and its last attempt is
    still the one before this one (another process that resumed it meanwhile, and maybe
    finished it, keeps it). A crash before then leaves the journal as it was: replaying
    wrote nothing, so nothing is lost."""

    __slots__ = ("event", "previous", "record", "renewal", "store")

    def __init__(self, store: Any, record: RunRecord, previous: int, event: EventRecord,
                 renewal: _Renewal) -> None:
        # (a copy: the attempt's record becomes its final one, which the start must not be)
        self.store, self.record, self.previous = store, record.copy(), previous
        self.event, self.renewal = event, renewal

    def __call__(self, ctx: RunContext, ending: bool = False) -> None:
        """Journal the attempt's start and start renewing the lease it took; ``ending``:
        inside the transaction that ends it, only check that no other process holds the
        run (no lease taken; the start event is journaled with the end's, by
        :func:`_write_final`).

        Raises:
            RunStateError: another process holds the run, or resumed it meanwhile."""
        store: Any = self.store  # (a store with batch(), check_run(), put_run_if_current())
        record, owner = self.record, ctx.owner
        # ctx.deferred stays set until the commit: other threads wait in claim() meanwhile
        # (ending: it is cleared once the transaction that ends the attempt commits)
        try:
            with _one_transaction(store):
                holder = (store.check_run(record.run_id, owner) if ending
                          else store.acquire_run(record.run_id, owner))
                if holder is not None:
                    raise _held(record.run_id, holder, owner)
                if not ending:
                    if not store.put_run_if_current(record, previous=self.previous):
                        raise _resumed_meanwhile(record, self.previous, store)
                    store.append_events([self.event])
        except BaseException as exc:
            if ending or isinstance(exc, RunStateError) or not _journaled(store, record):
                raise  # (rolled back: its start is still to be journaled)
            # committed, then interrupted as it returned (a Ctrl-C): the lease is held
            ctx.deferred = None
            self._held(ctx)
            raise
        if not ending:
            ctx.deferred = None
            self._held(ctx)

    def _held(self, ctx: RunContext) -> None:
        """The lease is taken: renew it from now on."""
        beat(ctx.owner, self.renewal)
        ctx.renew_at = _monotonic() + RENEW_SECONDS


def _journaled(store: Any, record: RunRecord) -> bool:
    """Whether the run's stored record is ``record`` as written (same attempt, status and
    time): a transaction interrupted as it returned (a Ctrl-C landing as its COMMIT ended)
    committed after all. What this thread's connection left open is rolled back first (it
    was not committed: read inside it, it would say so). False when that cannot be read."""
    try:
        _abandon(store)
        stored = store.find_run(record.run_id)
    except Exception:  # noqa: BLE001 - unreadable: taken as not written (the safe side)
        return False
    return (stored is not None and stored.attempt == record.attempt
            and stored.status == record.status and stored.updated == record.updated)


def _resumed_meanwhile(record: RunRecord, previous: int, store: Any) -> RunStateError:
    """The error of an attempt whose run another process resumed (or deleted) while it
    replayed; ``store`` is read to tell the two apart."""
    gone = False
    with contextlib.suppress(Exception):  # (unreadable: said as a resume)
        gone = store.find_run(record.run_id) is None
    if gone:
        return RunStateError(
            f"run {record.run_id!r} was deleted (durably.delete_runs, or durably delete) "
            "while this attempt replayed its journal: this attempt stopped before it executed "
            "or journaled anything. Fix: call the entrypoint again to start the run anew.")
    return RunStateError(
        f"run {record.run_id!r} was resumed by another process while this one replayed its "
        f"journal (its last attempt is no longer {previous}): two processes must not execute "
        "one run, so this attempt stopped before it executed or journaled anything. Fix: call "
        "it again once the other attempt ended, to get the run's result.")


def _resolve_run(store: Store, spec: Spec, run_id: str | None, fresh: bool,
                 input_digest: str) -> tuple[str, RunRecord | None]:
    """The id of the run this call starts or continues, and its record if it exists.

    Raises:
        RunStateError: ``run_id`` names a run of another entrypoint or other arguments, or
            ``fresh=True`` names one that exists.
    """
    existing: RunRecord | None
    if run_id is None:
        base = f"{_slug(spec.name)}-" + xxhash.xxh3_64_hexdigest(
            f"{spec.identity}\x00{input_digest}".encode()
        )
        existing = None if fresh else store.find_latest_run(spec.identity, input_digest)
        if existing is not None and "-fork-" in existing.run_id:
            # a fork is a what-if: calling the entrypoint again continues the run it forked
            # from, not the fork (forks are continued by their id)
            existing = next((r for r in store.list_runs(spec.identity)
                             if r.input_digest == input_digest and "-fork-" not in r.run_id),
                            None)
        run_id = existing.run_id if existing else (
            f"{base}-{uuid.uuid4().hex[:8]}" if fresh else base
        )
        if existing is None and not fresh:
            existing = store.find_run(run_id)
    else:
        existing = store.find_run(run_id)
        if existing is not None:
            if fresh:
                raise RunStateError(
                    f"fresh=True asks for a new run, but run {run_id!r} already exists "
                    f"({existing.status}). Fix: choose another run_id, or leave fresh out to "
                    "continue it."
                )
            if existing.entrypoint != spec.identity:
                raise RunStateError(
                    f"run {run_id!r} belongs to entrypoint {existing.entrypoint!r}, not "
                    f"{spec.identity!r}. Fix: choose another run_id."
                )
            if existing.input_digest != input_digest:
                raise RunStateError(
                    f"run {run_id!r} of {spec.name!r} was started with other arguments. "
                    "Fix: call it with the same arguments to continue it, or choose another "
                    "run_id for these."
                )
    return run_id, existing


def _one_transaction(store: Store) -> contextlib.AbstractContextManager[Any]:
    """The store's :meth:`~durably.store.Journal.batch`: its journal writes inside commit
    as one."""
    return store.batch()


def _abandon(store: Store) -> None:
    """After leaving a ``with _one_transaction(store)`` block by an exception: roll back what
    it began if its end never ran (a KeyboardInterrupt landing as it was entered)."""
    store.abandon()


def _answer_dependent(store: Store, run_id: str, asked: set[str]) -> set[str]:
    """The steps of the run whose results depend on an answer to ``interrupt()``: the steps
    that asked, and their callers up to the entrypoint, found over every attempt (a caller
    may finish attempts after the step that asked, which it then replays)."""
    held: set[str] = set()
    frontier = set(asked)
    while frontier:
        held |= frontier
        found = store.parents_of(run_id, frontier)
        frontier = {up for up in found.values() if up is not None and up not in held}
    return held


def _restore_cache(store: Store, run_id: str, attempt: int, held: set[str]) -> None:
    """After a crash: put back the cache entries the crashed attempt had queued but not yet
    written (cheap steps batch their cache writes; the journal has every result).

    The attempt is the latest that executed steps: one that crashed again while it put
    back these entries executed none (looked back at most 8 attempts). Only cheap steps
    queue their writes (a slower one wrote its entry at once), so the last ``CACHE_BATCH``
    of those are looked at. Steps that depend on an answer to ``interrupt()`` (``held``,
    from :func:`_answer_dependent`) were never to be cached, and are not."""
    steps: list[StepRecord] = []
    for back in range(attempt, max(attempt - 8, 0), -1):
        steps = store.list_steps(run_id, attempt=back)
        if any(s.status == "ran" for s in steps):
            break
    recent = [s for s in steps
              if s.status == "ran" and s.cache_key and s.step_id not in held
              and s.ended - s.started < _WRITE_THROUGH][-_CACHE_BATCH:]
    missing = []
    for step in recent:
        if store.cache_get(step.cache_key) is None:
            data = store.find_step(run_id, step.step_id)
            if data is not None:
                missing.append((step.cache_key, data, None))
    store.cache_put_many(missing)


def end_run(started: Started, result: Any = None, exc: BaseException | None = None) -> None:
    """Flush the attempt's buffered records, write the run's final status, release the
    run's lease."""
    ctx, record = started.ctx, started.record
    if ctx.pid != _pid[0]:
        # a process forked inside the run leaves the entrypoint (sys.exit, an exception):
        # the run, its lease and its buffered records are its parent's
        started.ended = True
        _leave(started)
        return
    try:
        started.ended = True
        _leave(started)
        _end_attempt(ctx, record, result, exc, started.wall)
    finally:
        try:
            _leave(started)  # (again, if a KeyboardInterrupt landed before it)
        finally:
            let_go(ctx.owner)  # (interrupted before its release: its lease is a leftover)
    if ctx.listener is not None:
        ctx.emit(Event(
            f"run_{record.status}", record.run_id, record.updated, task=record.name,
            status=record.status, duration=record.updated - started.wall,
            output=short_repr(result) if exc is None else None,
            data=result if exc is None else exc.interrupts
            if isinstance(exc, InterruptSignal) else record.error,
            attempt=record.attempt,
        ))
    if log.isEnabledFor(logging.INFO):
        from durably._runtime.run import Run

        handle: Run[Any] = Run(record, ctx.store)
        handle.resumed_from, handle.wall_time = started.resumed_from, now() - started.wall
        try:
            log.info("durably: %s", handle.summary())
        except Exception as summary_exc:  # noqa: BLE001 - a log line never fails the run
            log.warning("durably: run %r %s; its summary cannot be read: %s", record.run_id,
                        record.status, summary_exc)
    if exc is not None and isinstance(exc, Exception) and not ctx.unjournaled:
        exc.add_note(
            f"durably: run {record.run_id!r} failed; its finished steps are kept. Rerun to "
            f"retry, or inspect it with durably.get_run({record.run_id!r})."
        )


def _leave(started: Started) -> None:
    """Take this context out of the run (once)."""
    tokens = started.tokens
    if tokens is None:
        return
    run_token, step_token = tokens
    with contextlib.suppress(RuntimeError, ValueError):  # (reset once already)
        current_step.reset(step_token)
    with contextlib.suppress(RuntimeError, ValueError):
        current_run.reset(run_token)
    started.tokens = None


def run_status(exc: BaseException | None) -> str:
    """The status an attempt that ended with ``exc`` leaves its run in."""
    if exc is None:
        return "finished"
    if isinstance(exc, InterruptSignal):
        return "interrupted"
    if isinstance(exc, (StopRun, KeyboardInterrupt)) or is_cancelled(exc):
        return "stopped"  # by the user (Ctrl-C, a closed stream, a cancelled task): resumable
    return "failed"


def _end_attempt(ctx: RunContext, record: RunRecord, result: Any, exc: BaseException | None,
                 wall: float) -> None:
    """Journal the attempt's buffered records, its final status and event, and release its
    lease: one transaction, unless the result is large or that fails."""
    store = ctx.store
    ctx.ended = True  # (no renewal from here: the lease is released below)
    taken = ctx.take_pending()
    info: bytes | None = None
    failure: BaseException | None = None
    written = False
    # found by a renewal while it executed (read before the release: a renewal after it
    # finds no lease, and says nothing about this attempt)
    lost = ctx.lost
    if lost and ctx.deferred is not None:
        # its start was refused when it was to write (the run is another process's: the
        # RunStateError it raised is the attempt's end): nothing of it is journaled
        ctx.unjournaled = True
        if exc is None or isinstance(exc, StopRun) or (
                isinstance(exc, BaseExceptionGroup) and exc.split(StopRun)[0] is not None):
            # (the error was caught; or a thread or task of the user's, stopped by the
            # refusal at its next step, surfaced first, alone or in a group (asyncio's
            # TaskGroup): the call says why, not StopRun)
            raise _resumed_meanwhile(record, ctx.deferred.previous, store)
        return
    retry = released(exc, ctx.failures)  # (its failed steps whose error ended it)
    refused: RunStateError | None = None  # (an attempt that only replayed, refused at its end)
    cache_written = False  # the queued cache writes are (a failure after: the journal's)
    unwritten = False  # its final record was not journaled (another attempt's stands)
    sealed_ahead = False  # its result was prepared by seal_ahead() (undone if unwritten)
    try:
        info = _final_record(record, result, exc, wall)  # pickled outside any transaction
        ctx.flush_cache()  # the cache is another database: outside the transaction below
        cache_written = True
        if sum(len(data) for _, data in taken[0] if data is not None) > _BATCHED_RESULT:
            ctx.write(taken)  # many results of cached steps: before it, on their own
            taken = [], []
        deferred = ctx.deferred  # (None once something of the attempt was journaled)
        # (a result in a file is sealed ahead whatever its size)
        large = record.result is not None and (
            len(record.result) > _BATCHED_RESULT or isinstance(record.result, _serde.Spilled))
        if large:
            # a large result sealed, and written to blobs/, before the transaction: other
            # writers do not wait for it, and it ends in one commit with the rest
            assert record.result is not None
            record.result = store.seal_ahead(record.result, "result", record.run_id,
                                             reuse=ctx.stored_result)
            sealed_ahead = True
            large = False
        if deferred is not None and not large:
            # an attempt that only replayed: its start, its replays and its end in one
            # commit, without a lease; refused (nothing written) unless the run's last
            # attempt is still the one before it
            try:
                with _one_transaction(store):
                    deferred(ctx, ending=True)
                    ctx.deferred = None  # (its start is in this transaction: joined below)
                    if not _write_final(store, record, info, checked=True,
                                        previous=deferred.previous, before=deferred.event,
                                        retry=retry):
                        raise _resumed_meanwhile(record, deferred.previous, store)
                    # (after its record: each write is fenced by the attempt it names)
                    ctx.write(taken)
            except RunStateError as error:
                # the run is another process's: nothing of this attempt is journaled
                ctx.deferred = deferred
                ctx.unjournaled = True
                refused = error
                written = unwritten = True  # (there is nothing to write)
            except BaseException:
                if not _journaled(store, record):
                    ctx.deferred = deferred  # rolled back: its start is not journaled
                    raise
                # committed, then interrupted as it returned (a Ctrl-C): the end is written
                written = True
                raise
            written = True
        elif not large:
            # the buffered records, the final status and the lease's release: one commit;
            # the status only while the run is still this attempt's (another process that
            # took it over owns its record now). In this order: a store without
            # transactions never shows the run released but still running ("crashed")
            with _one_transaction(store):
                ctx.write(taken)
                if lost or not _write_final(store, record, info, checked=True, retry=retry):
                    lost = unwritten = True
                if store.release_run(record.run_id, ctx.owner) is False:
                    lost = True
            written = True
    except BaseException as error:  # noqa: BLE001 - (a full disk, Ctrl-C): written below
        failure = error
        _abandon(store)
    if not written:
        # each write on its own (the transaction failed; or a store that cannot seal a large
        # result ahead: other processes' journal writes do not wait while it is sealed); its
        # record only while the run is still this attempt's (the statement that writes it
        # checks); after a failure, the lease is released anyway. An attempt that only
        # replayed journals its start first (with a lease): refused, it journals nothing
        # more (and ends as below)
        replayed_only = ctx.deferred is not None and (
            failure is None or isinstance(failure, StoreError))
        recovered = False  # the end journaled here after all
        try:
            try:
                ctx.claim()
            except RunStateError as error:
                if not replayed_only:
                    raise
                ctx.unjournaled = True
                refused = error
            else:
                ctx.write(taken)
        finally:
            try:
                if info is None:
                    info = _final_record(record, result, exc, wall)
                if not lost and not ctx.lost and refused is None:
                    if _write_final(store, record, info, checked=True, retry=retry):
                        recovered = True
                    else:
                        lost = True
            finally:
                store.release_run(record.run_id, ctx.owner)
        if cache_written and isinstance(failure, StoreError) and (
                recovered or refused is not None):
            # the journal's transaction failed (its write lock held past the busy timeout
            # by another process, say), and the writes above made up for it: the attempt
            # is journaled, or another one's record stands; said, not raised
            log.warning("durably: run %r: %s (the transaction that ends it failed: %s)",
                        record.run_id, f"the end of attempt {record.attempt} was journaled "
                        "on a second try, write by write" if recovered else "another process "
                        "resumed it meanwhile: this call's attempt is not journaled",
                        failure)
            failure = None
    if unwritten and sealed_ahead and record.result is not None:
        store.discard_ahead(record.result)  # (a large result's file no journal refers to)
    if failure is not None:
        try:
            raise failure
        finally:
            failure = None  # no reference cycle: what the error holds is freed with it
    if refused is not None:
        if isinstance(exc, (StopRun, InterruptSignal)):
            raise refused  # (a pause or a stop that is not journaled would not be seen)
        # the attempt only replayed: every step it called came from the journal, so its
        # result (or its error) is the run's as journaled, and is the call's; only its
        # attempt is not journaled (the run's record is the other process's)
        log.info("durably: run %r was resumed by another process while this call replayed "
                 "it; the call's %s comes from the journal, its attempt is not journaled",
                 record.run_id, "result" if exc is None else "error")
        if exc is not None:  # (a Ctrl-C, SystemExit or cancellation goes on as it is too)
            exc.add_note(
                f"durably: run {record.run_id!r} was resumed by another process while this "
                "call replayed it: every step came from the journal, and this attempt is not "
                "journaled (the run's record is the other attempt's).")
        return
    if lost:
        lost_error = _lost(ctx, record, exc)
        if exc is None or isinstance(exc, (Exception, StopRun, InterruptSignal)):
            raise lost_error
        # a Ctrl-C, SystemExit or cancellation goes on as it is (said in a note)
        exc.add_note(str(lost_error))


def _lost(ctx: RunContext, record: RunRecord, exc: BaseException | None) -> RunStateError:
    """The error an attempt whose lease was taken over ends with (its end not journaled)."""
    holder = None
    with contextlib.suppress(Exception):  # (who holds it now is only said when known)
        holder = ctx.store.run_holder(record.run_id)
    by = f"by {holder.describe()}" if holder is not None else "by another process, or removed"
    how = "finished" if exc is None else "stopped" if ctx.stop and isinstance(exc, StopRun) \
        else f"ended ({run_status(exc)})"
    log.warning("durably: run %r: attempt %d lost its lease while it executed; its end is "
                "not journaled", record.run_id, record.attempt)
    return RunStateError(
        f"run {record.run_id!r}: attempt {record.attempt} in this process lost the run's lease "
        f"while it executed (taken over {by}: this process did not renew it for "
        f"{LEASE_SECONDS:.0f} s, was it stopped or suspended?). The attempt {how}; its "
        "finished steps are journaled, but its end is not: the run's record is the other "
        "attempt's. Fix: wait for the other process, then call the entrypoint again (or "
        f"durably.get_run({record.run_id!r})) for the run's result.")


def _final_record(record: RunRecord, result: Any, exc: BaseException | None,
                  started: float) -> bytes:
    """Set the run's final status, result (pickled) and error on its record; return the
    pickled data of its final event."""
    record.updated = now()
    record.status = run_status(exc)
    if exc is None:
        try:
            record.result = _serde.dumps(result, what=f"the result of {record.name!r}")
        except SerializationError as ser:
            record.result = None
            record.error = str(ser)
            log.warning("durably: run %r finished, but its result is not stored (other "
                        "processes cannot read it): %s", record.run_id, ser)
    elif record.status == "stopped":
        record.error = "StopRun('the consumer of stream() stopped the run')" if isinstance(
            exc, StopRun) else repr(exc)[:2000]
    elif record.status == "failed":
        record.error = repr(exc)[:2000]
    info: dict[str, Any] = {"status": record.status, "duration": record.updated - started,
                            "output": short_repr(result) if exc is None else None,
                            "error": record.error if exc is not None else None}
    if isinstance(exc, InterruptSignal):
        info["interrupts"] = [i.id for i in exc.interrupts]
    return _serde.dumps(info, what="a run event")


def _write_final(store: Store, record: RunRecord, info: bytes, checked: bool = False,
                 previous: int | None = None, before: EventRecord | None = None,
                 retry: Sequence[str] = ()) -> bool:
    """Journal the run's final record and its final event (after ``before``, the start
    event of an attempt that only replayed); ``checked``: only while the run is still this
    attempt's (``put_run_if_current``; with ``previous``, while its last attempt is that
    one). False when it is not (nothing written)."""
    if not checked:
        store.put_run(record)
    elif not store.put_run_if_current(record, previous=previous):
        return False
    final = EventRecord(record.run_id, f"run_{record.status}", record.updated, record.attempt,
                        data=info)
    # the failed steps whose exception ended the attempt: executed again by the next one
    retries = [EventRecord(record.run_id, RETRY, record.updated, record.attempt, step)
               for step in retry]
    store.append_events([*retries, final] if before is None else [before, *retries, final])
    return True
