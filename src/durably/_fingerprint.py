"""Code fingerprints: a digest of a function's code and of the user code it depends on.

A task's fingerprint covers its bytecode and constants, nested functions and lambdas, default
arguments, closure cell values and — transitively and cycle-safe — the functions, classes and
module-level constants *of the user's own code* that it references by name. Code of the
standard library and of installed packages is recorded by name and package version instead.
Line numbers and file names are left out, so moving a function in its file changes nothing.

Fingerprints are computed once per function and process, then revalidated cheaply on each use:
every global name, closure cell and ``__code__`` the computation read is checked by identity, so
a helper redefined in a notebook cell is noticed on the next call.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import types
import warnings
import weakref
from typing import Any

import wrapt

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
        file = getattr(mod, "__file__", None) if mod is not None else None
        if mod is not None and file is None:
            result = False  # a built-in or namespace module
        elif file is None:
            result = True  # code without a module (exec'd): fingerprint it
        else:
            real = os.path.realpath(file)
            result = not (
                real.startswith(_PREFIXES)
                or f"{os.sep}site-packages{os.sep}" in real
                or f"{os.sep}dist-packages{os.sep}" in real
            )
    _USER[name] = result
    return result


def _package_version(module: str) -> str:
    top = sys.modules.get(module.partition(".")[0])
    return str(getattr(top, "__version__", ""))


class Fingerprint:
    """A function's code fingerprint with what it was computed from."""

    __slots__ = ("digest", "_globals", "_attrs", "changed_by")

    def __init__(
        self,
        digest: str,
        globals_: list[tuple[dict[str, Any], str, Any]],
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
                if getattr(obj, attr) is not value:
                    return False
            except ValueError:  # an emptied closure cell
                return False
        return True


class _Walker:
    def __init__(self) -> None:
        self.globals: list[tuple[dict[str, Any], str, Any]] = []
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
        e = Encoder(name)
        code = f.__code__
        self.attrs.append((f, "__code__", code))
        self.attrs.append((f, "__defaults__", f.__defaults__))
        self.attrs.append((f, "__kwdefaults__", f.__kwdefaults__))
        e.text(b"q", f.__qualname__)
        names: set[str] = set()
        self.code(e, code, names)
        self.constant(e, f.__defaults__)
        self.constant(e, f.__kwdefaults__)
        for cell in f.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:
                e.buf += b"0"
                continue
            self.attrs.append((cell, "cell_contents", value))
            self.value(e, value, names)
        ns = f.__globals__
        for gname in sorted(names):
            value = ns.get(gname, _MISSING)
            if value is _MISSING:
                continue  # a builtin or an attribute name
            self.globals.append((ns, gname, value))
            e.text(b"g", gname)
            self.value(e, value, names)
        result = e.hexdigest()
        self.active.discard(key)
        self.done[key] = result
        self.parts[name] = result
        return result

    def code(self, e: Encoder, code: types.CodeType, names: set[str]) -> None:
        e.raw(b"c", code.co_code)
        e.encode(
            (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
             code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)
        )
        names.update(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(e, const, names)
            else:
                self.constant(e, const)

    def constant(self, e: Encoder, value: Any) -> None:
        sub = Encoder(e.path)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sub.encode(value)
        except (SerializationError, RecursionError, TypeError, ValueError, AttributeError):
            e.typed(b"?", type(value))
            return
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
        e = Encoder(name)
        e.text(b"Q", c.__qualname__)
        names: set[str] = set()
        for base in c.__bases__:
            self.value(e, base, names)
        for attr, value in sorted(vars(c).items()):
            if attr in _SKIP_CLASS_ATTRS:
                continue
            e.text(b"g", attr)
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                for acc in (value.fget, value.fset, value.fdel):
                    self.value(e, acc, names)
            else:
                self.value(e, value, names)
        result = e.hexdigest()
        self.active.discard(key)
        self.done[key] = result
        self.parts[name] = result
        return result

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
            e.text(b"m", v.__name__)
            if is_user_module(v.__name__):
                # `module.attr` in the code: follow the attributes it names
                ns = vars(v)
                for attr in sorted(names):
                    sub = ns.get(attr, _MISSING)
                    if sub is _MISSING or isinstance(sub, types.ModuleType):
                        continue
                    self.globals.append((ns, attr, sub))
                    e.text(b"a", attr)
                    self.value(e, sub, set())
            else:
                e.text(b"v", _package_version(v.__name__))
        elif isinstance(v, (types.BuiltinFunctionType, types.MethodDescriptorType)):
            e.text(b"b", f"{getattr(v, '__module__', '')}.{v.__qualname__}")
        elif isinstance(v, types.MethodType):
            self.value(e, v.__func__, names)
            self.constant(e, v.__self__)
        else:
            self.constant(e, v)


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
    if isinstance(obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
        obj = obj.__wrapped__
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
