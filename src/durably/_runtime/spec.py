"""The task spec: what ``@task`` and ``@entrypoint`` know about their function (its
identity, signature and options), and how a call's arguments become its input digest,
cache key and step identity.

Apart from the call path (:mod:`durably._runtime.call`), which reads a spec on every call,
and from runs and attempts (:mod:`durably._runtime.attempt`): explain, keep_finished and
the graph read a task's identity and keys without executing anything.
"""

from __future__ import annotations

import inspect
import logging
import sys
import types
import warnings
from typing import Any

import xxhash

from durably._keys import serde as _serde
from durably._keys.files import File
from durably._keys.fingerprint import fingerprint_function, nameless_callable
from durably._keys.hashing import encode_arguments, locate_undigestable, positional_plan
from durably._keys.layouts import storage_for
from durably._keys.revalidate import LARGE_VALUE_BYTES, Fingerprint
from durably._runtime.context import user_stacklevel as _user_stacklevel
from durably._runtime.policy import CachePolicy, make_policy
from durably._runtime.retry import check_timeout, to_retry
from durably._store.records import KeyRecord, now
from durably.exceptions import DefinitionError, SerializationError
from durably.store import Store

__all__ = ["CLASS_PART", "MAIN_MODULES", "Spec", "module_identity", "step_identity"]

log = logging.getLogger("durably")
#: the name of a key record's part that is the code digest of a user class met in the
#: arguments (after it, the class's ``module.qualname``): explain names it when it changed
CLASS_PART = "argument class "
#: (spec, name) of the large configuration values warned about (see Spec._warn_large)
_LARGE_WARNED: set[tuple[Any, str]] = set()


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
        "policy",
        "raw",
        "retry",
        "signature",
        "slow",
        "storage",
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
        mmap: bool = False,
        compress: bool | int | None = None,
        expires_after: Any = None,
        cache_if: Any = None,
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
        for field, text in (("name", name or qualname), ("version", version)):
            if isinstance(text, str) and "\x00" in text:
                # (stores keep names as text: PostgreSQL's cannot hold a NUL character)
                raise DefinitionError(
                    f"the {field} of @{kind} {name or qualname!r} contains a NUL character "
                    "('\\x00'), which no store can keep as text. Fix: "
                    + (f"remove it from {field}=." if field == "version" or name else
                       "name it with name=\"...\" without one."))
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
        #: how its results are stored (mmap=, compress=); None: a pickle (or its store's
        #: compress=)
        self.storage = storage_for(mmap, compress, self.name) if (
            mmap or compress is not None) else None
        #: the cache policy of expires_after= and cache_if= (see durably._runtime.policy),
        #: else None: the call path asks it only when it is set
        self.policy = make_policy(kind, self.name, expires_after, cache_if, cache)
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

    def refreshing(self) -> Spec:
        """A copy of this spec for one :meth:`Task.refresh <durably.Task.refresh>` call: its
        policy reads no cache entry and replaces it (the same identity, keys and steps)."""
        copy = object.__new__(Spec)
        for name in Spec.__slots__:
            object.__setattr__(copy, name, getattr(self, name))
        policy = self.policy if self.policy is not None else CachePolicy(None, None)
        copy.policy = policy.refreshing()
        return copy

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
                   classes: dict[str, str] | None = None, duration: float = 0.0
                   ) -> KeyRecord:
        """What the key was made of (``inputs``: digest of each argument, taken on a miss
        before the body ran: paid on misses only, never on a hit). ``code``: the code version
        the key was made with (:meth:`key_and_code`), else the current one. ``classes``: the
        code digest of each user class in the arguments (:func:`class_digests`), kept among
        the parts under :data:`CLASS_PART` names. ``duration``: seconds the execution
        that produced the entry took (what a hit saves)."""
        if code is None:
            code = self.code_version()  # revalidated once; the parts are of that fingerprint
        fp = self._fingerprint
        parts = self._parts() if fp is not None and fp.digest == code else {}
        if classes:
            parts.update((CLASS_PART + path, d) for path, d in classes.items())
        return KeyRecord(self.identity, key, code, inputs, parts, now(), max(duration, 0.0))


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
