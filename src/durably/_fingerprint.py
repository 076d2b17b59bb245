"""Code fingerprints: a digest of a function's code and of the user code it depends on.

A task's fingerprint covers its bytecode and constants, nested functions and lambdas, default
arguments, closure cell values and — transitively and cycle-safe — the functions, classes and
module-level constants *of the user's own code* that it references by name. Code of the
standard library and of installed packages is recorded by name and package version instead.
Line numbers and file names are left out, so moving a function in its file changes nothing.

Names are read from the bytecode: globals the code loads (``helper``), attributes it reads
from user modules (``helpers.step``, ``pkg.sub.step``) and user modules it imports inside its
body. Decorator objects that keep the function in ``__wrapped__`` (``functools.cache``) are
seen through; functions inside constants (a dict of handlers) are walked by the same cycle-safe
walk.

Fingerprints are computed once per function and process, then revalidated cheaply on each use:
every global name (also the ones not defined yet), module attribute, class attribute, closure
cell and ``__code__`` the computation read is checked by identity, so a helper redefined in a
notebook cell is noticed on the next call.
"""

from __future__ import annotations

import contextvars
import dis
import importlib
import importlib.util
import os
import sys
import sysconfig
import types
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import wrapt
import xxhash

from ._hashing import Encoder
from .exceptions import SerializationError

__all__ = ["Fingerprint", "fingerprint_function", "fingerprint_of", "is_user_module"]

_MISSING = object()
_SKIP_CLASS_ATTRS = frozenset(
    {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__annotations__",
     "__firstlineno__", "__static_attributes__", "__slots__", "__parameters__",
     "__orig_bases__", "__dataclass_fields__", "__dataclass_params__", "__match_args__"}
)


def _system_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {
        os.path.realpath(paths[k]) + os.sep
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
        if k in paths
    }
    found.add(os.path.realpath(os.path.dirname(__file__)) + os.sep)
    return tuple(sorted(found))


_PREFIXES = _system_prefixes()
_USER: dict[str, bool] = {}
# instructions that read a global (or builtin) name; what a function only writes is no input
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"})


def _is_user_path(path: str) -> bool:
    real = os.path.realpath(path)
    return not (
        real.startswith(_PREFIXES)
        or f"{os.sep}site-packages{os.sep}" in real
        or f"{os.sep}dist-packages{os.sep}" in real
    )


def is_user_module(name: str | None) -> bool:
    """Whether a module is the user's own code (fingerprinted deeply) rather than the
    standard library, an installed package or durably itself (recorded by name)."""
    if name is None:
        return True
    known = _USER.get(name)
    if known is not None:
        return known
    top = name.partition(".")[0]
    if name == "__main__":
        result = True
    elif top == "durably" or top in sys.stdlib_module_names:
        result = False
    else:
        mod = sys.modules.get(name)
        if mod is None:
            return True  # code without a module (exec'd): fingerprint it; not cached
        file = getattr(mod, "__file__", None)
        # a namespace package is the user's when one of its directories is
        paths = [file] if file else [p for p in getattr(mod, "__path__", None) or () if p]
        result = any(_is_user_path(p) for p in paths)  # no file and no path: a built-in
    _USER[name] = result
    return result


def _package_version(module: str) -> str:
    top = sys.modules.get(module.partition(".")[0])
    return str(getattr(top, "__version__", ""))


class Fingerprint:
    """A function's code fingerprint with what it was computed from."""

    __slots__ = ("_attrs", "_globals", "changed_by", "digest")

    def __init__(
        self,
        digest: str,
        globals_: list[tuple[Mapping[str, Any], str, Any]],
        attrs: list[tuple[Any, str, Any]],
        parts: dict[str, str],
    ) -> None:
        self.digest = digest
        self._globals = globals_
        self._attrs = attrs
        #: digest of each user function or class it depends on, by qualified name
        self.changed_by = parts

    def valid(self) -> bool:
        """True while every name, cell and code object it was computed from is unchanged."""
        for ns, name, value in self._globals:
            if ns.get(name, _MISSING) is not value:
                return False
        for obj, attr, value in self._attrs:
            try:
                current = getattr(obj, attr)
            except ValueError:  # an empty closure cell
                current = _MISSING
            if current is not value:
                return False
        return True


class _Refs:
    """What a function's bytecode refers to by name."""

    __slots__ = ("globals", "imports", "names")

    def __init__(self) -> None:
        self.globals: set[str] = set()  # global (or builtin) names it reads
        self.names: set[str] = set()  # every name, attributes included (`module.attr`)
        self.imports: set[tuple[str, int, tuple[str, ...]]] = set()  # (module, level, fromlist)

    def scan(self, code: types.CodeType) -> None:
        self.names.update(code.co_names)
        args: list[Any] = [None, None]
        for ins in dis.get_instructions(code):
            if ins.opname in _GLOBAL_OPS:
                self.globals.add(ins.argval)
            elif ins.opname == "IMPORT_NAME":
                level = args[0] if isinstance(args[0], int) else 0
                fromlist = tuple(args[1]) if isinstance(args[1], tuple) else ()
                self.imports.add((ins.argval, level, fromlist))
            args = [args[1], ins.argval]


def _resolve_import(name: str, level: int, package: Any) -> str | None:
    if level == 0:
        return name
    if not isinstance(package, str) or not package:
        return None
    parts = package.split(".")
    if level - 1 >= len(parts):
        return None
    base = ".".join(parts[: len(parts) - level + 1])
    return f"{base}.{name}" if name else base


def _import_user_module(name: str) -> types.ModuleType | None:
    """The module ``name`` (imported now if it is the user's own code and not yet imported:
    its code is part of the fingerprint even when a cache hit skips the task's import)."""
    mod = sys.modules.get(name)
    top = name.partition(".")[0]
    if mod is not None or top in sys.stdlib_module_names:
        return mod
    try:
        # the top package first: finding `pkg.sub` imports `pkg`, which must be the user's
        if top in sys.modules:
            if not is_user_module(top):
                return None
        elif not _spec_is_user(importlib.util.find_spec(top)):
            return None
        if name != top and not _spec_is_user(importlib.util.find_spec(name)):
            return None
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - not importable now: the task's own import will tell
        return None


def _spec_is_user(spec: Any) -> bool:
    if spec is None:
        return False
    origin = spec.origin
    if origin and os.path.isabs(origin):
        return _is_user_path(origin)
    paths = [p for p in spec.submodule_search_locations or () if p]  # a namespace package
    return any(_is_user_path(p) for p in paths)


def _is_code(v: Any) -> bool:
    """Functions, classes, modules and wrappers: fingerprinted as code, not as values."""
    return isinstance(v, (types.FunctionType, type, types.ModuleType, types.MethodType,
                          types.BuiltinFunctionType, wrapt.FunctionWrapper,
                          wrapt.BoundFunctionWrapper)) or _wrapped_of(v) is not None


def _wrapped_of(v: Any) -> Any:
    """The function a decorator object (``functools.cache``, ``functools.wraps``) wraps."""
    if not callable(v):
        return None
    try:
        return getattr(v, "__wrapped__", None)
    except Exception:  # noqa: BLE001 - a proxy that fails on lookup wraps nothing we can see
        return None


_WALKING: contextvars.ContextVar[_Walker | None] = contextvars.ContextVar(
    "durably_fingerprint_walk", default=None
)


class _Walker:
    def __init__(self) -> None:
        self.globals: list[tuple[Mapping[str, Any], str, Any]] = []
        self.attrs: list[tuple[Any, str, Any]] = []
        self.done: dict[int, str] = {}
        self.active: set[int] = set()
        self.parts: dict[str, str] = {}
        self.keep: list[Any] = []  # keeps walked objects alive so ids stay unique

    # -- objects ------------------------------------------------------------------------
    def function(self, f: types.FunctionType) -> str:
        key = id(f)
        done = self.done.get(key)
        if done is not None:
            return done
        name = f"{f.__module__}.{f.__qualname__}"
        if key in self.active:
            return "recursive:" + name
        self.active.add(key)
        self.keep.append(f)
        try:
            e = Encoder(name)
            code = f.__code__
            self.attrs.append((f, "__code__", code))
            self.attrs.append((f, "__defaults__", f.__defaults__))
            self.attrs.append((f, "__kwdefaults__", f.__kwdefaults__))
            e.text(b"q", f.__qualname__)
            refs = _Refs()
            self.code(e, code, refs)
            self.constant(e, f.__defaults__)
            self.constant(e, f.__kwdefaults__)
            for cell in f.__closure__ or ():
                try:
                    value = cell.cell_contents
                except ValueError:
                    self.attrs.append((cell, "cell_contents", _MISSING))
                    e.buf += b"0"
                    continue
                self.attrs.append((cell, "cell_contents", value))
                self.value(e, value, refs.names)
            own = e.hasher.copy() if e.hasher is not None else xxhash.xxh3_128()
            own.update(bytes(e.buf))  # the function itself, without what it refers to
            ns = f.__globals__
            for gname in sorted(refs.globals):
                value = ns.get(gname, _MISSING)
                # recorded even when missing: a helper defined after the first call is seen
                self.globals.append((ns, gname, value))
                if value is _MISSING:
                    continue  # a builtin, or a name not defined yet
                e.text(b"g", gname)
                if _is_code(value):
                    self.value(e, value, refs.names)
                else:  # a module-level constant: a part of its own, so explain can name it
                    sub = Encoder(name)
                    self.value(sub, value, refs.names)
                    digest = sub.hexdigest()
                    e.text(b"k", digest)
                    self.parts.setdefault(f"{f.__module__}.{gname}", digest)
            for module, level, fromlist in sorted(refs.imports):
                self.imported(e, module, level, fromlist, ns, refs.names)
            result = e.hexdigest()
        finally:
            self.active.discard(key)
        self.done[key] = result
        self.parts[name] = str(own.hexdigest())
        return result

    def code(self, e: Encoder, code: types.CodeType, refs: _Refs) -> None:
        e.raw(b"c", code.co_code)
        e.encode(
            (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
             code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)
        )
        refs.scan(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(e, const, refs)
            else:
                self.constant(e, const)

    def imported(self, e: Encoder, module: str, level: int, fromlist: tuple[str, ...],
                 ns: dict[str, Any], names: set[str]) -> None:
        """A module imported inside the function's body (``import m`` / ``from m import f``)."""
        package = ns.get("__package__")
        if package is None and isinstance(ns.get("__name__"), str):
            package = ns["__name__"] if "__path__" in ns else ns["__name__"].rpartition(".")[0]
        full = _resolve_import(module, level, package)
        if full is None:
            e.text(b"I", f"{level}:{module}")
            return
        e.text(b"I", full)
        mod = self.user_module(full)
        if mod is None:
            return  # not the user's: recorded by name, imported yet or not
        for name in fromlist:  # `from pkg import sub`: a submodule not imported yet
            if name != "*" and hasattr(mod, "__path__") and name not in vars(mod):
                self.user_module(f"{full}.{name}")
        bound = mod if fromlist else sys.modules.get(full.partition(".")[0])
        if bound is not None:
            self.value(e, bound, names)

    def user_module(self, name: str) -> types.ModuleType | None:
        if not is_user_module(name) or name.partition(".")[0] == "__main__":
            return None
        mod = _import_user_module(name)
        self.globals.append((sys.modules, name, _MISSING if mod is None else mod))
        return mod

    def constant(self, e: Encoder, value: Any) -> None:
        sub = Encoder(e.path)
        token = _WALKING.set(self)  # functions inside the value are walked by this walk
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sub.encode(value)
        except (SerializationError, RecursionError, TypeError, ValueError, AttributeError):
            e.typed(b"?", type(value))
            return
        finally:
            _WALKING.reset(token)
        e.raw(b"k", bytes.fromhex(sub.hexdigest()))

    def klass(self, c: type) -> str:
        key = id(c)
        done = self.done.get(key)
        if done is not None:
            return done
        name = f"{c.__module__}.{c.__qualname__}"
        if key in self.active:
            return "recursive:" + name
        self.active.add(key)
        self.keep.append(c)
        try:
            e = Encoder(name)
            own = Encoder(name)  # the class itself: bases and attributes that are not code
            e.text(b"Q", c.__qualname__)
            own.text(b"Q", c.__qualname__)
            names: set[str] = set()
            for base in c.__bases__:
                self.value(e, base, names)
                own.text(b"B", f"{base.__module__}.{base.__qualname__}")
            ns = vars(c)
            for attr, value in sorted(ns.items()):
                if attr in _SKIP_CLASS_ATTRS:
                    continue
                self.globals.append((ns, attr, value))  # `Cls.method = other` is noticed
                e.text(b"g", attr)
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                if isinstance(value, property):
                    for acc in (value.fget, value.fset, value.fdel):
                        self.value(e, acc, names)
                elif _is_code(value):
                    self.value(e, value, names)
                else:
                    self.value(e, value, names)
                    own.text(b"g", attr)
                    self.value(own, value, names)
            result = e.hexdigest()
        finally:
            self.active.discard(key)
        self.done[key] = result
        self.parts[name] = own.hexdigest()
        return result

    def module(self, e: Encoder, m: types.ModuleType, names: set[str]) -> None:
        """A module the code refers to: a user module by the attributes the code names
        (``helpers.step``, ``pkg.sub.step``), another module by name and version."""
        e.text(b"m", m.__name__)
        if not is_user_module(m.__name__):
            e.text(b"v", _package_version(m.__name__))
            return
        key = id(m)
        if key in self.active:
            return
        self.active.add(key)
        try:
            ns = vars(m)
            for attr in sorted(names):
                sub = ns.get(attr, _MISSING)
                self.globals.append((ns, attr, sub))
                if sub is _MISSING:
                    continue
                e.text(b"a", attr)
                self.value(e, sub, names if isinstance(sub, types.ModuleType) else set())
        finally:
            self.active.discard(key)

    def value(self, e: Encoder, v: Any, names: set[str]) -> None:
        """A name the code refers to: user code deeply, other code by name and version."""
        if isinstance(v, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
            v = v.__wrapped__
        if isinstance(v, types.FunctionType):
            if is_user_module(v.__module__):
                e.text(b"F", self.function(v))
            else:
                e.text(b"f", f"{v.__module__}.{v.__qualname__}@{_package_version(v.__module__)}")
        elif isinstance(v, type):
            if is_user_module(v.__module__):
                e.text(b"C", self.klass(v))
            else:
                e.text(b"t", f"{v.__module__}.{v.__qualname__}@{_package_version(v.__module__)}")
        elif isinstance(v, types.ModuleType):
            self.module(e, v, names)
        elif isinstance(v, (types.BuiltinFunctionType, types.MethodDescriptorType)):
            e.text(b"b", f"{getattr(v, '__module__', '')}.{v.__qualname__}")
        elif isinstance(v, types.MethodType):
            self.value(e, v.__func__, names)
            self.instance(e, v.__self__)
        else:
            wrapped = _wrapped_of(v)
            if wrapped is not None:  # a decorator object (functools.cache): what it wraps
                e.typed(b"w", type(v))
                self.value(e, wrapped, names)
            self.instance(e, v)

    def user_type(self, e: Encoder, t: type) -> None:
        if is_user_module(t.__module__):
            e.text(b"C", self.klass(t))

    def instance(self, e: Encoder, v: Any) -> None:
        """A value: its content, and the code of its class when that is the user's."""
        if not isinstance(v, type):
            self.user_type(e, type(v))
        self.constant(e, v)

    def nested(self, obj: Any) -> str | None:
        """Digest of a function or class met inside a constant (for :func:`fingerprint_of`)."""
        if not isinstance(
            obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper, types.FunctionType, type)
        ):
            return None
        e = Encoder()
        self.value(e, obj, set())
        return e.hexdigest()


def fingerprint_function(func: Any) -> Fingerprint:
    """Compute the fingerprint of a function (unwrapping decorators made with wrapt)."""
    while isinstance(func, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
        func = func.__wrapped__
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    w = _Walker()
    if isinstance(func, types.FunctionType):
        digest = w.function(func)
    else:
        e = Encoder()
        w.value(e, func, set())
        digest = e.hexdigest()
    return Fingerprint(digest, w.globals, w.attrs, w.parts)


_ARG_CACHE: weakref.WeakKeyDictionary[Any, Fingerprint] = weakref.WeakKeyDictionary()


def fingerprint_of(obj: Any) -> str | None:
    """Digest of a function, method or class passed as an argument; None for other values."""
    walker = _WALKING.get()
    if walker is not None:  # inside a walk (a dict of handlers): cycle-safe, revalidated
        digest = walker.nested(obj)
        if digest is not None:
            return digest
    if isinstance(obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
        obj = obj.__wrapped__
    if isinstance(obj, types.FunctionType) and not is_user_module(obj.__module__):
        return f"{obj.__module__}.{obj.__qualname__}@{_package_version(obj.__module__)}"
    if isinstance(obj, types.MethodType):
        inner = fingerprint_of(obj.__func__)
        e = Encoder()
        e.text(b"s", inner or "")
        e.encode(obj.__self__)
        return e.hexdigest()
    if isinstance(obj, types.FunctionType) or (
        isinstance(obj, type) and is_user_module(obj.__module__)
    ):
        fp = _ARG_CACHE.get(obj)
        if fp is None or not fp.valid():
            fp = fingerprint_function(obj)
            _ARG_CACHE[obj] = fp
        return fp.digest
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}@{_package_version(obj.__module__)}"
    if isinstance(obj, (types.BuiltinFunctionType, types.MethodDescriptorType)) and isinstance(
        getattr(obj, "__self__", None), (types.ModuleType, type(None))
    ):
        return f"{getattr(obj, '__module__', '')}.{obj.__qualname__}"
    return None
