"""Code fingerprints: a digest of a function's code and of the user code it depends on.

A task's fingerprint covers its bytecode and constants, nested functions and lambdas, default
arguments, closure cell values and — transitively and cycle-safe — the functions, classes and
module-level values *of the user's own code* that it references by name. Code of the standard
library and of installed packages is recorded by name and by the version of the installed
distribution that provides it (``importlib.metadata``; ``__version__`` when no distribution is
found). Line numbers, file names and docstrings (of the function and of functions nested in it)
are left out, so moving a function in its file or rewording its docstring changes nothing.

Names are read from the bytecode: globals the code loads (``helper``), attributes it reads
from user modules (``helpers.step``, ``pkg.sub.step``) and user modules it imports inside its
body. Decorator objects that keep the function in ``__wrapped__`` (``functools.cache``) are
seen through; functions inside values (a dict of handlers) are walked by the same cycle-safe
walk.

Values: code, configuration or state
------------------------------------
Every value the walk meets in a name the code reads (a global, an attribute of a user module
or class, a closure cell, a default argument, the instance of a bound method) is one of:

* **code** — functions, classes, modules: walked as above.
* **state** — a value the walked code itself changes: a memo, a registry, a counter, a client
  created on first use. The bytecode of a walked function loads the name and then assigns or
  deletes an item or an attribute of it, at any depth (``CACHE[k] = v``, ``del CACHE[k]``,
  ``CACHE[a][b] = v``, ``SETTINGS.n = 1``, ``helpers.CACHE[k] = v``), calls a mutating method
  on it (``append``, ``extend``, ``insert``, ``update``, ``setdefault``, ``pop``, ``popitem``,
  ``clear``, ``add``, ``discard``, ``remove``, ``sort``, ... or a method of the user's own
  class whose bytecode changes ``self``, ``__call__`` included when the value is called), or
  rebinds the name (``global``, ``nonlocal``). Also state: class attributes changed through
  ``self.attr`` / ``cls.attr`` in the class's own methods, and a default argument its
  function changes (``def f(x, _memo={})``). Only the type of a state value enters the
  fingerprint — nothing at all for a rebound name — so a task's key does not depend on what
  ran before it in the process.
* **configuration** — every other value: its contents enter the fingerprint. Immutable values
  (None, bool, numbers, str, bytes, dates, enum members, tuples and frozensets of those) are
  revalidated by identity, like code. Mutable ones (dicts, lists, sets, user objects, arrays)
  are also checked for their contents on every revalidation, so ``WEIGHTS["a"] = 10`` or
  ``CONFIG["nested"]["x"] = 3`` in a notebook gives the next call a fingerprint computed from
  the current contents (never the one computed before the change).

Fingerprints are computed once per function and process, then revalidated on each use: every
global name (also the ones not defined yet), module attribute, class attribute, closure cell
and ``__code__`` the computation read is checked by identity (a helper redefined in a notebook
cell is noticed on the next call), and the contents of mutable configuration are compared with
what they were: builtin containers of scalars by their pickle, at C speed; other values by
their pickle with functions and classes by identity (their code is revalidated by the first
check); values digested by a hook (``__durably_digest__``, ``register_encoder``) by their
digest, so a ``durably.file`` held in a global follows the file's content. A few small values
cost a few microseconds per call.

Limits — where they matter, give the task an explicit ``@task(version="...")``: it replaces
the fingerprint, and only changing it invalidates the task's entries.

* A configuration value larger than 64 KiB (pickled or encoded: a big array, table or list),
  or slower than 1 ms to check, is revalidated by identity only: changing it *in place* is
  not noticed. Rebind the name (``WEIGHTS = WEIGHTS.copy()``) or pass it as an argument.
* Dynamic lookups are not seen: ``getattr(lib, "level3")(x)``, ``globals()[name]``,
  ``importlib.import_module(name)``, ``eval``/``exec``, a function chosen through a value
  computed at run time. The code and values reached only that way are not part of the
  fingerprint: editing them gives a stale result unless ``version=`` changes.
* A mutation through another name is not seen as one: an alias (``c = CACHE; c[k] = v``), a
  function that changes its argument (``fill(CACHE)``), a method of an installed package
  that changes its object (a random generator's ``normal``), a ``cached_property`` filling an
  instance. Such a value stays configuration: when it changes, the key changes (a rerun, never
  a stale result). A state value held inside a configuration value (``CONFIG = {"memo":
  MEMO}``) is part of that value's contents.
* Once the walked code mutates a value it is state: changes made to it from outside (a
  notebook cell editing a registry) are not noticed. A name the walked code rebinds with
  ``global`` is state even when it holds a function.
* Installed packages are recorded by version, not walked: editing one in place (other than
  an editable install of the user's own project) is not noticed.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import decimal
import dis
import enum
import fractions
import functools
import importlib
import importlib.metadata
import importlib.util
import io
import os
import pathlib
import pickle
import sys
import sysconfig
import time
import types
import uuid
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import wrapt
import xxhash

from ._hashing import _ENCODERS, Encoder, type_path
from .exceptions import SerializationError

__all__ = ["Fingerprint", "fingerprint_function", "fingerprint_of", "is_user_module"]

_MISSING = object()
_SKIP_CLASS_ATTRS = frozenset(
    {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__annotations__",
     "__firstlineno__", "__static_attributes__", "__slots__", "__parameters__",
     "__orig_bases__", "__dataclass_fields__", "__dataclass_params__", "__match_args__",
     # a cache copyreg adds the first time an instance is pickled or digested
     "__slotnames__"}
)
#: methods that change the object they are called on (a method of the user's own class
#: changes it when its bytecode changes ``self``)
_MUTATORS = frozenset(
    {"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "add",
     "discard", "remove", "sort", "reverse", "appendleft", "extendleft", "popleft", "rotate",
     "move_to_end", "difference_update", "intersection_update", "symmetric_difference_update",
     "__setitem__", "__delitem__", "__setattr__", "__delattr__", "__iadd__", "__ior__"}
)
#: values that cannot change in place: revalidated by identity, never digested again
_ATOMS = frozenset(
    {type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis),
     decimal.Decimal, fractions.Fraction, _dt.datetime, _dt.date, _dt.time, _dt.timedelta,
     _dt.timezone, uuid.UUID, pathlib.PurePosixPath, pathlib.PureWindowsPath,
     pathlib.PosixPath, pathlib.WindowsPath, types.MemberDescriptorType,
     types.GetSetDescriptorType}
)
#: a configuration value is checked again on each revalidation up to this encoded size ...
_RECHECK_BYTES = 1 << 16
#: ... and when pickling or digesting it takes at most this long (float seconds)
_RECHECK_SECONDS = 0.001
# plain values: containers and scalars whose pickle is exact (type and value) and C-fast
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes})
_PLAIN_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})


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


# -- versions of installed packages ----------------------------------------------------------
_VERSIONS: dict[str, str] = {}  # top-level module -> version text, once per process
_DISTRIBUTIONS: Mapping[str, list[str]] | None = None  # top-level module -> distributions


def _package_version(module: str) -> str:
    """The version of the installed distribution that provides ``module`` (all of them, named,
    when several share a namespace), else its top package's ``__version__``, else ``""``."""
    top = module.partition(".")[0]
    found = _VERSIONS.get(top)
    if found is None:
        found = _VERSIONS[top] = _find_version(top)
    return found


def _find_version(top: str) -> str:
    if top not in sys.stdlib_module_names:
        try:
            # the common case, cheap: a distribution named like the module, that provides it
            dist = importlib.metadata.distribution(top)
            if _provides(dist, top):
                return str(dist.version)
        except Exception:  # noqa: BLE001 - not found, or unreadable metadata: the full map
            pass
        versions = []
        for name in sorted(set(_distributions().get(top, ()))):
            try:
                versions.append(f"{name}=={importlib.metadata.version(name)}")
            except Exception:  # noqa: BLE001 - metadata gone or unreadable: skip it
                continue
        if len(versions) == 1:
            return versions[0].partition("==")[2]
        if versions:
            return ",".join(versions)
    return str(getattr(sys.modules.get(top), "__version__", ""))


def _provides(dist: importlib.metadata.Distribution, top: str) -> bool:
    declared = dist.read_text("top_level.txt")
    if declared is not None:
        return top in declared.split()
    for f in dist.files or ():
        if len(f.parts) > 1 and f.parts[0] == top:  # a package
            return True
        if len(f.parts) == 1 and f.parts[0].partition(".")[0] == top:  # a module
            return True
    return False


def _distributions() -> Mapping[str, list[str]]:
    global _DISTRIBUTIONS
    if _DISTRIBUTIONS is None:
        try:
            _DISTRIBUTIONS = importlib.metadata.packages_distributions()
        except Exception:  # noqa: BLE001 - broken metadata somewhere: versions fall back
            _DISTRIBUTIONS = {}
    return _DISTRIBUTIONS


# -- the fingerprint ---------------------------------------------------------------------------
class _Nested(Protocol):
    def nested(self, obj: Any) -> str | None: ...


# what digests the functions and classes met inside a value being encoded (see fingerprint_of)
_WALKING: contextvars.ContextVar[_Nested | None] = contextvars.ContextVar(
    "durably_fingerprint_walk", default=None
)


class _ByIdentity:
    """Functions and classes inside a configuration value, by identity: revalidation only
    needs to notice that one was replaced (their code is revalidated on its own)."""

    __slots__ = ("keep",)

    def __init__(self, keep: list[Any] | None) -> None:
        self.keep = keep  # keeps them alive, so an id is never reused by a replacement

    def nested(self, obj: Any) -> str | None:
        if not isinstance(
            obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper, types.FunctionType, type)
        ):
            return None
        if self.keep is not None:
            self.keep.append(obj)
        return f"id:{id(obj):x}"


_BY_IDENTITY = _ByIdentity(None)


# -- checking configuration on revalidation --------------------------------------------------
# A check is (value, how, expected): valid while how(value) == expected. Three ways, fastest
# first: the pickle of a plain value; the pickle of any other value, with functions, classes
# and modules by identity (their code is revalidated on its own); the value's digest, for
# values digested by a hook (``__durably_digest__``, ``register_encoder``: ``durably.file``
# follows the file's content) or that do not pickle.
_Check = tuple[Any, Callable[[Any], Any], Any]
_BY_ID = (types.FunctionType, type, types.ModuleType, types.BuiltinFunctionType,
          wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)


def _plain(value: Any) -> bytes:
    return pickle.dumps(value, 5)


def _identified(n: int) -> int:
    """Stands for an object pickled by identity (never called: the pickle is not loaded)."""
    return n


class _Pickler(pickle.Pickler):
    # called for every object but None, bools, numbers, str, bytes and builtin containers
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _BY_ID) and obj is not _identified:
            return (_identified, (id(obj),))
        return NotImplemented


def _pickled(value: Any) -> bytes:
    f = io.BytesIO()
    _Pickler(f, 5).dump(value)
    return f.getvalue()


class _FirstPickler(_Pickler):
    """The first pickle of a value: keeps what it names by identity alive (so an id is never
    reused by a replacement) and notices values digested by a hook."""

    def __init__(self, f: io.BytesIO, keep: list[Any]) -> None:
        super().__init__(f, 5)
        self.keep = keep
        self.hooked = False

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _BY_ID):
            self.keep.append(obj)
        else:
            t = type(obj)
            if hasattr(t, "__durably_digest__") or any(k in _ENCODERS for k in t.__mro__):
                self.hooked = True
        return super().reducer_override(obj)


def _is_plain(value: Any) -> bool:
    """Builtin containers of None, bool, numbers, str and bytes: pickled exactly (type and
    value) at C speed; a change that makes it not plain changes its pickle (classes are named
    in it). Bounded: a large value is not plain."""
    todo, seen, count = [value], set(), 0
    while todo:
        v = todo.pop()
        t = type(v)
        if t in _PLAIN:
            continue
        if t not in _PLAIN_CONTAINERS:
            return False
        if id(v) in seen:
            continue
        seen.add(id(v))
        count += len(v)
        if count > 10_000:
            return False
        if t is dict:
            todo.extend(v.keys())  # not the items: temporary tuples, whose ids are reused
            todo.extend(v.values())
        else:
            todo.extend(v)
    return True


def _quick(how: Callable[[Any], Any], value: Any) -> Any:
    """``how(value)`` when it is small and quick to compute (too slow twice: a pause of the
    machine does not decide), else None."""
    for _ in range(2):
        start = time.perf_counter()
        data = how(value)
        if data is None or len(data) > _RECHECK_BYTES:
            return None
        if time.perf_counter() - start <= _RECHECK_SECONDS:
            return data
    return None


def _check_of(value: Any, keep: list[Any], digest: str | None) -> _Check | None:
    """How to check ``value`` on revalidation, or None when it is too large or too slow to
    check on every call (by identity only). ``digest``: its digest, when that is the check
    digest (no function or class inside) and was quick to compute."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if _is_plain(value):
                data = _quick(_plain, value)
                return None if data is None else (value, _plain, data)
            f = io.BytesIO()
            first = _FirstPickler(f, keep)
            first.dump(value)
            # stable too: an unchanged value pickles alike (no clock or counter in its state)
            if not first.hooked and _quick(_pickled, value) == f.getvalue():
                return (value, _pickled, f.getvalue())
        except Exception:  # noqa: BLE001 - does not pickle: checked by its digest
            pass
        if digest is None:
            nested = _ByIdentity(keep)
            try:
                digest = _quick(lambda v: _digest_again(v, nested), value)
            except Exception:  # noqa: BLE001 - not digestible: by identity only
                return None
            if digest is None:
                return None
        return (value, _digest_again, digest)


def _digest_again(value: Any, nested: _Nested | None = None) -> str | None:
    e = Encoder()
    token = _WALKING.set(nested or _BY_IDENTITY)
    try:
        e.encode(value)
    finally:
        _WALKING.reset(token)
    if e.hasher is not None or len(e.buf) > _RECHECK_BYTES:
        return None
    return e.hexdigest()


class Fingerprint:
    """A function's code fingerprint with what it was computed from."""

    __slots__ = ("_attrs", "_checks", "_globals", "_keep", "changed_by", "digest")

    def __init__(
        self,
        digest: str,
        globals_: list[tuple[Mapping[str, Any], str, Any]],
        attrs: list[tuple[Any, str, Any]],
        parts: dict[str, str],
        checks: list[_Check] | None = None,
        keep: list[Any] | None = None,
    ) -> None:
        self.digest = digest
        self._globals = globals_
        self._attrs = attrs
        self._checks = _grouped(checks or [])  # small mutable configuration values
        self._keep = keep  # objects whose ids the checks rely on
        #: digest of each user function or class it depends on, by qualified name
        self.changed_by = parts

    def valid(self) -> bool:
        """True while every name, cell and code object it was computed from is unchanged
        (by identity) and every small mutable configuration value has the same contents."""
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
        try:
            for value, how, expected in self._checks:
                if how(value) != expected:
                    return False
        except Exception:  # noqa: BLE001 - no longer pickles or digests: changed, compute anew
            return False
        return True


def _grouped(checks: list[_Check]) -> list[_Check]:
    """The checks, with all plain values in one pickle and all other pickled ones in another:
    one pickler per revalidation instead of one per value."""
    out = [c for c in checks if c[1] is _digest_again]
    for how in (_plain, _pickled):
        values = tuple(c[0] for c in checks if c[1] is how)
        if len(values) == 1:
            out.append((values[0], how, how(values[0])))
        elif values:
            try:
                out.append((values, how, how(values)))
            except Exception:  # noqa: BLE001 - changed since it was checked: compute anew
                out.append((values, how, None))
    return out


# -- what the bytecode reads and changes -----------------------------------------------------
# A symbolic value on the stack: (kind, root name, attributes read from it, item taken
# from it); kind "g" a global, "d" a closure cell, "f" a local (a parameter). None: unknown.
_Sym = tuple[str, str, tuple[str, ...], bool]
# A mutation: a _Sym, then the operation ("store": the name is rebound, "item": an item is
# assigned or deleted, "setattr": attribute `name` is assigned or deleted, "call": method
# `name` is loaded) and the attribute or method name.
_Event = tuple[str, str, tuple[str, ...], bool, str, str]

_ENDS = frozenset(
    {"JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP_ABSOLUTE", "JUMP",
     "JUMP_NO_INTERRUPT", "RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS", "RERAISE"}
)
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)
_CONSTS = frozenset(dis.hasconst)
# instructions that only push (what is below stays as it was)
_PUSH_ONLY = frozenset(
    {"LOAD_CONST", "PUSH_NULL", "LOAD_CLOSURE", "LOAD_ASSERTION_ERROR", "LOAD_BUILD_CLASS",
     "LOAD_LOCALS", "LOAD_FAST_AND_CLEAR", "LOAD_SMALL_INT", "LOAD_CONST_IMMORTAL",
     "LOAD_CONST_MORTAL"}
)
# instructions that only pop (push no result)
_POP_ONLY = frozenset(
    name for name in dis.opname
    if name.startswith(("POP_JUMP", "JUMP", "STORE_", "DELETE_"))
    or name in {"POP_TOP", "NOP", "RESUME", "RETURN_VALUE", "RETURN_CONST", "POP_EXCEPT",
                "RERAISE", "RAISE_VARARGS", "EXTENDED_ARG", "CACHE", "END_FOR",
                "PRINT_EXPR", "SETUP_ANNOTATIONS", "KW_NAMES", "MAKE_CELL", "COPY_FREE_VARS",
                "IMPORT_STAR", "NOT_TAKEN", "POP_ITER"}
)
_METHOD_FLAG = sys.version_info >= (3, 12)  # LOAD_ATTR's low bit marks a method load
# a call: [NULL, callable, args] up to 3.12, [callable, NULL, args] from 3.13 (for a method:
# the method and its object instead); 3.11 announces it with PRECALL
_NULL_FIRST = sys.version_info < (3, 13)
_CALLS = frozenset({"PRECALL"} if sys.version_info < (3, 12) else {"CALL", "CALL_KW"})
_NULL: tuple[str, str, tuple[str, ...], bool] = ("", "", (), False)  # the NULL of a call


class _Scan:
    """What one code object (not the ones nested in it) reads and changes."""

    __slots__ = ("docstring", "events", "globals", "imports")

    def __init__(self) -> None:
        self.globals: set[str] = set()
        self.imports: set[tuple[str, int, tuple[str, ...]]] = set()
        self.events: list[_Event] = []
        self.docstring = False  # co_consts[0] is a docstring the code never loads


_SCANS: weakref.WeakKeyDictionary[types.CodeType, _Scan] = weakref.WeakKeyDictionary()


def _scan(code: types.CodeType) -> _Scan:
    found = _SCANS.get(code)
    if found is None:
        found = _SCANS[code] = _scan_code(code)
    return found


def _scan_code(code: types.CodeType) -> _Scan:
    """Run the bytecode on symbolic values, along the straight line and forward jumps: enough
    to see which global, cell or parameter an item store, attribute store or method call
    acts on. Whatever is not followed precisely becomes unknown, so a mistake can only miss a
    mutation (a value stays configuration), never invent one."""
    scan = _Scan()
    bc = dis.Bytecode(code)
    entries = getattr(bc, "exception_entries", ())  # (not in typeshed yet)
    handlers = {x.target: x.depth + int(x.lasti) + 1 for x in entries}
    pending: dict[int, list[_Sym | None]] = {}  # stacks of forward jumps, by target offset
    stack: list[_Sym | None] | None = []
    loads_first = False
    prev: list[Any] = [None, None]
    for ins in bc:
        came = pending.pop(ins.offset, None)
        if came is not None:
            stack = came if stack is None else _merge(stack, came)
        elif stack is None:  # reached by an exception, or dead code
            stack = [None] * handlers.get(ins.offset, 0)
        op = ins.opname
        if ins.opcode in _CONSTS and ins.arg == 0:
            loads_first = True
        if op in _GLOBAL_OPS:
            scan.globals.add(ins.argval)
        elif op == "IMPORT_NAME":
            level = prev[0] if isinstance(prev[0], int) else 0
            fromlist = tuple(prev[1]) if isinstance(prev[1], tuple) else ()
            scan.imports.add((ins.argval, level, fromlist))
        prev = [prev[1], ins.argval]
        if ins.opcode in _JUMPS and isinstance(ins.argval, int) and ins.argval > ins.offset:
            jumped = _generic(list(stack), ins, jump=True)
            earlier = pending.get(ins.argval)
            pending[ins.argval] = jumped if earlier is None else _merge(earlier, jumped)
        stack = None if op in _ENDS else _step(stack, ins, scan.events)
    consts = code.co_consts
    scan.docstring = bool(consts) and isinstance(consts[0], str) and not loads_first
    return scan


def _merge(a: list[_Sym | None], b: list[_Sym | None]) -> list[_Sym | None]:
    n = min(len(a), len(b))
    if not n:
        return []
    return [x if x == y else None for x, y in zip(a[-n:], b[-n:], strict=True)]


def _generic(stack: list[_Sym | None], ins: dis.Instruction, jump: bool) -> list[_Sym | None]:
    try:
        n = dis.stack_effect(
            ins.opcode, ins.arg if ins.opcode >= dis.HAVE_ARGUMENT else None, jump=jump
        )
    except (ValueError, TypeError):
        return []
    if n < 0:
        del stack[n:]
    else:
        stack.extend([None] * n)
    if ins.opname not in _POP_ONLY and ins.opname not in _PUSH_ONLY:
        k = min(max(n, 0) + 1, len(stack))  # its results: unknown values
        stack[len(stack) - k:] = [None] * k
    return stack


def _event(events: list[_Event], sym: _Sym | None, op: str, name: str) -> None:
    if sym is not None and sym is not _NULL:
        events.append((*sym, op, name))


def _step(stack: list[_Sym | None], ins: dis.Instruction, events: list[_Event]
          ) -> list[_Sym | None]:
    op, arg = ins.opname, ins.argval
    if op == "LOAD_GLOBAL":
        called = (ins.arg or 0) & 1  # with the NULL of a call
        if called and _NULL_FIRST:
            stack.append(_NULL)
        stack.append(("g", arg, (), False))
        if called and not _NULL_FIRST:
            stack.append(_NULL)
    elif op == "PUSH_NULL":
        stack.append(_NULL)
    elif op in _CALLS:  # calling a value runs its class's __call__
        argc = (ins.arg or 0) + (op == "CALL_KW")
        if len(stack) >= argc + 2:
            first, second = stack[-argc - 2], stack[-argc - 1]
            if _NULL_FIRST and first is _NULL:
                _event(events, second, "call", "__call__")
            elif not _NULL_FIRST and second is _NULL:
                _event(events, first, "call", "__call__")
        return _generic(stack, ins, jump=False)
    elif op == "LOAD_NAME":
        stack.append(("g", arg, (), False))
    elif op in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
        stack.append(("d", arg, (), False))
    elif op in ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"):
        stack.append(("f", arg, (), False))
    elif op in ("LOAD_FAST_LOAD_FAST", "LOAD_FAST_BORROW_LOAD_FAST_BORROW"):
        stack += [("f", arg[0], (), False), ("f", arg[1], (), False)]
    elif op == "STORE_FAST_LOAD_FAST":
        del stack[-1:]
        stack.append(("f", arg[1], (), False))
    elif op == "LOAD_METHOD" or (op == "LOAD_ATTR" and _METHOD_FLAG and (ins.arg or 0) & 1):
        _event(events, stack.pop() if stack else None, "call", arg)
        stack += [None, None]
    elif op == "LOAD_ATTR":
        sym = stack.pop() if stack else None
        if sym is _NULL:
            sym = None
        elif sym is not None and not sym[3]:
            sym = (sym[0], sym[1], (*sym[2], arg), False)
        stack.append(sym)
    elif op in ("BINARY_SUBSCR", "BINARY_SLICE"):
        keys = 1 if op == "BINARY_SUBSCR" else 2
        sym = stack[-keys - 1] if len(stack) > keys else None
        sym = None if sym is _NULL else sym
        del stack[-keys - 1:]  # the container and the key(s): an item of the container
        stack.append(None if sym is None else (sym[0], sym[1], sym[2], True))
    elif op in ("STORE_SUBSCR", "DELETE_SUBSCR", "STORE_SLICE"):
        depth, size = {"STORE_SUBSCR": (2, 3), "DELETE_SUBSCR": (2, 2), "STORE_SLICE": (3, 4)}[op]
        _event(events, stack[-depth] if len(stack) >= depth else None, "item", "")
        del stack[-size:]
    elif op in ("STORE_ATTR", "DELETE_ATTR"):
        _event(events, stack[-1] if stack else None, "setattr", arg)
        del stack[-(2 if op == "STORE_ATTR" else 1):]
    elif op in ("STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF"):
        events.append(("g" if op.endswith("GLOBAL") else "d", arg, (), False, "store", ""))
        if op.startswith("STORE"):
            del stack[-1:]
    elif op == "COPY":
        n = ins.arg or 1
        stack.append(stack[-n] if len(stack) >= n else None)
    elif op == "SWAP":
        n = ins.arg or 2
        if len(stack) >= n:
            stack[-1], stack[-n] = stack[-n], stack[-1]
        else:
            stack[-1:] = [None] * min(1, len(stack))
    else:
        return _generic(stack, ins, jump=False)
    return stack


class _Refs:
    """What a function's bytecode (nested code included) refers to and changes."""

    __slots__ = ("events", "globals", "imports", "names")

    def __init__(self) -> None:
        self.globals: set[str] = set()  # global (or builtin) names it reads
        self.names: set[str] = set()  # every name, attributes included (`module.attr`)
        self.imports: set[tuple[str, int, tuple[str, ...]]] = set()  # (module, level, fromlist)
        self.events: list[_Event] = []  # mutations of its globals, cells and parameters


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


def _is_atom(v: Any) -> bool:
    """A value that cannot change in place (its identity tells everything)."""
    t = type(v)
    if t in _ATOMS or isinstance(v, enum.Enum):
        return True
    if t is tuple or t is frozenset or (isinstance(v, tuple) and hasattr(t, "_fields")):
        try:
            return len(v) <= 4096 and all(map(_is_atom, v))
        except RecursionError:
            return False
    return False


def _unwrap(v: Any) -> Any:
    for _ in range(100):
        if isinstance(v, types.FunctionType):
            break
        wrapped = _wrapped_of(v)
        if wrapped is None:
            break
        v = wrapped
    return v


def _class_holder(cls: Any, name: str) -> type | None:
    """The class of ``cls``'s MRO whose namespace defines ``name`` (no descriptor runs)."""
    for k in getattr(cls, "__mro__", ()):
        if name in vars(k):
            return k  # type: ignore[no-any-return]
    return None


def _static_attr(obj: Any, name: str) -> Any:
    """Attribute ``name`` of an instance, read without running a property or ``__getattr__``
    (``_MISSING`` when it is computed)."""
    try:
        found = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        found = None
    if isinstance(found, dict) and name in found:
        return found[name]
    holder = _class_holder(type(obj), name)
    if holder is None:
        return _MISSING
    v = vars(holder)[name]
    if isinstance(v, types.MemberDescriptorType):  # a __slots__ field
        try:
            return v.__get__(obj, type(obj))
        except AttributeError:
            return _MISSING
    return _MISSING if hasattr(type(v), "__get__") else v


def _default_of(f: types.FunctionType, name: str) -> Any:
    """The default value of parameter ``name`` (``_MISSING`` when it has none)."""
    code = f.__code__
    positional = code.co_varnames[: code.co_argcount]
    if name in positional:
        defaults = f.__defaults__ or ()
        i = positional.index(name) - (len(positional) - len(defaults))
        return defaults[i] if i >= 0 else _MISSING
    return (f.__kwdefaults__ or {}).get(name, _MISSING)


class _StateMark:
    """Stands for a state value inside default arguments: its type, never its contents."""

    __slots__ = ("path",)

    def __init__(self, v: Any) -> None:
        self.path = type_path(type(v)).decode()

    def __durably_digest__(self) -> str:
        return self.path


class _Walker:
    def __init__(self, seed: _Walker | None = None) -> None:
        self.globals: list[tuple[Mapping[str, Any], str, Any]] = []
        self.attrs: list[tuple[Any, str, Any]] = []
        self.done: dict[int, str] = {}
        self.active: set[int] = set()
        self.parts: dict[str, str] = {}
        self.keep: list[Any] = list(seed.keep) if seed else []  # keeps ids unique
        # state: values the walked code changes (by id), names it rebinds (owner id, name);
        # a walk that had encoded one of them as configuration is done again (see conflicted)
        self.state: dict[int, Any] = dict(seed.state) if seed else {}
        self.rebound: set[tuple[int, str]] = set(seed.rebound) if seed else set()
        self.seen: set[int] = set()
        self.seen_names: set[tuple[int, str]] = set()
        self.checks: dict[int, _Check] = {}  # configuration checked on revalidation
        self.hits = 0  # functions and classes digested inside values so far
        self.changes_self: dict[tuple[int, int], bool] = {}

    def conflicted(self) -> bool:
        """Whether a value or name found to be state later was encoded as configuration."""
        return not (self.seen.isdisjoint(self.state) and self.seen_names.isdisjoint(self.rebound))

    # -- state ----------------------------------------------------------------------------
    def mark(self, v: Any) -> None:
        if not (_is_atom(v) or _is_code(v)):
            self.state[id(v)] = v

    def mark_name(self, owner: Any, name: str) -> None:
        self.rebound.add((id(owner), name))
        self.keep.append(owner)

    def resolve(self, f: types.FunctionType, events: list[_Event]) -> None:
        """Mark what the events of function ``f`` change: globals, cells, default arguments."""
        ns = f.__globals__
        freevars = f.__code__.co_freevars
        for kind, root, attrs, inside, op, name in events:
            owner: Any
            if kind == "g":
                owner, value = ns, ns.get(root, _MISSING)
                slot: tuple[Any, str] | None = (ns, root)
            elif kind == "d":
                if root not in freevars or not f.__closure__:
                    continue
                owner = f.__closure__[freevars.index(root)]
                slot = (owner, "")
                try:
                    value = owner.cell_contents
                except ValueError:
                    value = _MISSING
            else:
                slot, value = None, _default_of(f, root)
            self.mutated(slot, value, attrs, inside, op, name)

    def mutated(self, slot: tuple[Any, str] | None, value: Any, attrs: tuple[str, ...],
                inside: bool, op: str, name: str) -> None:
        """Mark what a mutation changes: ``value`` (found in ``slot``), reached through
        ``attrs`` and, when ``inside``, an item; ``op`` and ``name`` as in :data:`_Event`."""
        if op == "store":
            if slot is not None:
                self.mark_name(*slot)
            return
        obj, rest = value, attrs
        while rest and isinstance(obj, (types.ModuleType, type)):  # through namespaces
            holder = obj if isinstance(obj, types.ModuleType) else _class_holder(obj, rest[0])
            if holder is None:
                return
            obj, rest = vars(holder).get(rest[0], _MISSING), rest[1:]
        if obj is _MISSING:
            return
        if isinstance(obj, (types.ModuleType, type)):  # `module.X = v`, `Class.X = v`
            if op == "setattr" and not inside:
                self.mark_name(obj.__dict__ if isinstance(obj, types.ModuleType) else obj, name)
            return
        # the first value on the path, and the ones in it down to what the operation acts on
        # (`REGISTRY.items.append(x)` changes a class attribute through an instance)
        path = [obj]
        for attr in rest:
            obj = _static_attr(obj, attr)
            if obj is _MISSING:
                break
            path.append(obj)
        if op == "call" and name not in _MUTATORS and (
            inside or obj is _MISSING or not self.method_changes_self(obj, name)
        ):
            return
        for v in path:
            self.mark(v)

    def method_changes_self(self, obj: Any, name: str) -> bool:
        cls = type(obj)
        holder = _class_holder(cls, name)
        if holder is None or not is_user_module(holder.__module__):
            return False
        return self.changes_first(cls, vars(holder)[name])

    def changes_first(self, cls: type, raw: Any) -> bool:
        """Whether function ``raw``, a method of ``cls``, changes its first parameter (an
        attribute or item of it, or a method of ``cls`` that does)."""
        if isinstance(raw, (staticmethod, classmethod)):
            return False
        func = _unwrap(raw)
        if not isinstance(func, types.FunctionType) or not func.__code__.co_argcount:
            return False
        key = (id(cls), id(func))
        known = self.changes_self.get(key)
        if known is not None:
            return known
        self.changes_self[key] = False  # a cycle of methods: what the others find decides
        self.keep.append(func)
        me = func.__code__.co_varnames[0]
        result = False
        for kind, root, attrs, inside, op, name in _scan(func.__code__).events:
            if kind != "f" or root != me:
                continue
            if op != "call" or name in _MUTATORS:
                result = True
            elif not (attrs or inside):
                holder = _class_holder(cls, name)
                result = holder is not None and is_user_module(holder.__module__) and (
                    self.changes_first(cls, vars(holder)[name]))
            if result:
                break
        self.changes_self[key] = result
        return result

    def class_mutations(self, c: type) -> None:
        """Mark the class attributes that the class's own methods change through their first
        parameter (``self.registry[k] = v``, ``cls.count = n``)."""
        for raw in list(vars(c).values()):
            if isinstance(raw, staticmethod):
                continue
            is_cls = isinstance(raw, classmethod)
            if isinstance(raw, property):
                funcs = [raw.fget, raw.fset, raw.fdel]
            else:
                funcs = [_unwrap(raw.__func__ if is_cls else raw)]
            for func in funcs:
                if not isinstance(func, types.FunctionType) or not func.__code__.co_argcount:
                    continue
                me = func.__code__.co_varnames[0]
                for kind, root, attrs, inside, op, name in _scan(func.__code__).events:
                    if kind != "f" or root != me:
                        continue
                    if not attrs:  # the instance itself, or `cls.name = v`
                        if is_cls and op == "setattr" and not inside:
                            self.mark_name(c, name)
                        continue
                    holder = _class_holder(c, attrs[0])
                    if holder is not None:
                        self.mutated((holder, attrs[0]), vars(holder)[attrs[0]], attrs[1:],
                                     inside, op, name)

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
            self.code(e, code, refs, frozenset(code.co_freevars), top=True)
            self.resolve(f, refs.events)  # before its values are encoded
            self.defaults(e, f.__defaults__)
            self.defaults(e, f.__kwdefaults__)
            for cell in f.__closure__ or ():
                if (id(cell), "") in self.rebound:  # `nonlocal` rebinds it: state
                    e.buf += b"S"
                    continue
                self.seen_names.add((id(cell), ""))
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
                if (id(ns), gname) in self.rebound:  # `global` rebinds it: state
                    e.text(b"g", gname)
                    e.buf += b"S"
                    continue
                self.seen_names.add((id(ns), gname))
                value = ns.get(gname, _MISSING)
                # recorded even when missing: a helper defined after the first call is seen
                self.globals.append((ns, gname, value))
                if value is _MISSING:
                    continue  # a builtin, or a name not defined yet
                e.text(b"g", gname)
                if _is_code(value):
                    self.value(e, value, refs.names)
                else:  # a module-level value: a part of its own, so explain can name it
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

    def code(self, e: Encoder, code: types.CodeType, refs: _Refs, visible: frozenset[str],
             top: bool) -> None:
        """A code object and the ones nested in it; ``visible``: the names of the walked
        function's closure cells that ``code`` sees."""
        scan = _scan(code)
        e.raw(b"c", code.co_code)
        e.encode(
            (code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
             code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)
        )
        refs.names.update(code.co_names)
        refs.globals.update(scan.globals)
        refs.imports.update(scan.imports)
        local = frozenset(code.co_cellvars)  # its own cells hide the outer ones
        for ev in scan.events:
            if ev[0] == "g" or (ev[0] == "f" and top) or (
                ev[0] == "d" and ev[1] in visible and ev[1] not in local
            ):
                refs.events.append(ev)
        for i, const in enumerate(code.co_consts):
            if isinstance(const, types.CodeType):
                self.code(e, const, refs, visible - local, top=False)
            else:  # the docstring counts as no docstring: rewording it changes nothing
                self.constant(e, None if i == 0 and scan.docstring else const)

    def defaults(self, e: Encoder, values: tuple[Any, ...] | dict[str, Any] | None) -> None:
        items = list(values.values() if isinstance(values, dict) else values or ())
        mutable = [v for v in items if not (_is_atom(v) or _is_code(v))]
        for v in mutable:
            self.seen.add(id(v))
            self.keep.append(v)
        if not any(id(v) in self.state for v in mutable):
            self.constant(e, values, check=bool(mutable))
            return
        if isinstance(values, dict):
            self.constant(e, {k: _StateMark(v) if id(v) in self.state else v
                              for k, v in values.items()})
        else:
            self.constant(e, tuple(_StateMark(v) if id(v) in self.state else v for v in items))
        for v in mutable:
            if id(v) not in self.state:
                self.check(v, None)

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

    def constant(self, e: Encoder, value: Any, check: bool = False) -> None:
        """The contents of a value; with ``check``, also checked on revalidation."""
        sub = Encoder(e.path)
        hits = self.hits
        start = time.perf_counter()
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
        cheap = time.perf_counter() - start <= _RECHECK_SECONDS and self.hits == hits
        small = sub.hasher is None and len(sub.buf) <= _RECHECK_BYTES
        digest = sub.hexdigest()
        e.raw(b"k", bytes.fromhex(digest))
        if check and small:
            # without functions or classes inside, the contents digest is the check digest
            self.check(value, digest if cheap else None)

    def check(self, value: Any, digest: str | None) -> None:
        """Check ``value``'s contents on revalidation (see :meth:`Fingerprint.valid`)."""
        if id(value) in self.checks:
            return
        found = _check_of(value, self.keep, digest)
        if found is not None:
            self.keep.append(value)
            self.checks[id(value)] = found

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
            self.class_mutations(c)  # before its attributes are encoded
            is_enum = issubclass(c, enum.Enum)
            ns = vars(c)
            for attr, value in sorted(ns.items()):
                if attr in _SKIP_CLASS_ATTRS or (
                    # an Enum's member maps: managed by enum, and they grow as Flag values
                    # are combined; the members' values are encoded below
                    is_enum and attr[:1] == "_" == attr[-1:] and not _is_code(value)
                ):
                    continue
                if (id(c), attr) in self.rebound:  # `cls.attr = v` in a classmethod: state
                    e.text(b"g", attr)
                    e.buf += b"S"
                    continue
                self.seen_names.add((id(c), attr))
                self.globals.append((ns, attr, value))  # `Cls.method = other` is noticed
                e.text(b"g", attr)
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                elif isinstance(value, functools.cached_property):
                    value = value.func
                if isinstance(value, property):
                    for acc in (value.fget, value.fset, value.fdel):
                        self.value(e, acc, names)
                elif _is_code(value):
                    self.value(e, value, names)
                else:
                    self.value(e, value, names)
                    own.text(b"g", attr)
                    self.value(own, value, names)
            if issubclass(c, enum.Enum):
                for member_name, member in c.__members__.items():
                    for enc in (e, own):
                        enc.text(b"M", member_name)
                        self.constant(enc, member._value_)
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
                if (id(ns), attr) in self.rebound:  # rebound by the walked code: state
                    e.text(b"a", attr)
                    e.buf += b"S"
                    continue
                self.seen_names.add((id(ns), attr))
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
            func = v.__func__
            if isinstance(func, types.FunctionType) and is_user_module(func.__module__) and (
                self.changes_first(type(v.__self__), func)
            ):
                self.mark(v.__self__)  # a bound method that changes its instance: state
            self.instance(e, v.__self__)
        else:
            wrapped = _wrapped_of(v)
            if wrapped is not None:  # a decorator object (functools.cache): what it wraps
                e.typed(b"w", type(v))
                self.value(e, wrapped, names)
            self.instance(e, v, check=wrapped is None)

    def user_type(self, e: Encoder, t: type) -> None:
        if is_user_module(t.__module__):
            e.text(b"C", self.klass(t))

    def instance(self, e: Encoder, v: Any, check: bool = True) -> None:
        """A value: its content (its type only when it is state), and the code of its class
        when that is the user's."""
        if not isinstance(v, type):
            self.user_type(e, type(v))
        if id(v) in self.state:
            e.typed(b"S", type(v))
            return
        if _is_atom(v) or _is_code(v):
            self.constant(e, v)
            return
        self.seen.add(id(v))
        self.keep.append(v)
        self.constant(e, v, check=check)

    def nested(self, obj: Any) -> str | None:
        """Digest of a function or class met inside a constant (for :func:`fingerprint_of`)."""
        if not isinstance(
            obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper, types.FunctionType, type)
        ):
            return None
        self.hits += 1
        e = Encoder()
        self.value(e, obj, set())
        return e.hexdigest()


_PASSES = 3  # a second pass when state was found after it was encoded as configuration


def fingerprint_function(func: Any) -> Fingerprint:
    """Compute the fingerprint of a function (unwrapping decorators made with wrapt)."""
    while isinstance(func, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
        func = func.__wrapped__
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    w: _Walker | None = None
    for _ in range(_PASSES):
        w = _Walker(w)
        if isinstance(func, types.FunctionType):
            digest = w.function(func)
        else:
            e = Encoder()
            w.value(e, func, set())
            digest = e.hexdigest()
        if not w.conflicted():
            break
    assert w is not None
    return Fingerprint(digest, w.globals, w.attrs, w.parts, list(w.checks.values()), w.keep)


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
