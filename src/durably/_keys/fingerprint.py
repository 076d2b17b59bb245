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
  ran before it in the process; and, for a module-level one, the source of the top-level
  statements that define it in its module's file (:func:`definition_digest`), so that
  editing ``FEATURES = ["b", "a"]`` in the file is an edit.
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
* A configuration value that can be neither digested nor pickled (a dict holding a lock, a
  hashlib object) is recorded by its type, with a warning naming it. Values that are state
  by nature (locks, iterators such as ``itertools.count()``, generators, queues, files) are
  recorded by type without one; ``os.environ`` by name only.
* Classes: dunder attributes count only when they are code (a library's data there, such as
  pydantic's schema, holds ids); the fields of dataclasses, attrs classes and pydantic models
  count by name, annotation, default and factory, and the methods those libraries generate
  from them by name.
* Installed packages are recorded by version, not walked: editing one in place (other than
  an editable install of the user's own project) is not noticed.

This module holds the walk and :func:`fingerprint_function`; its parts live apart:
:mod:`durably._keys.bytecode` reads what a code object reads, imports and changes;
:mod:`durably._keys.state` finds the state among those changes; :mod:`durably._keys.revalidate`
holds :class:`Fingerprint` and its checks; :mod:`durably._keys.origin` tells the user's modules
from installed packages and finds their versions.
"""

from __future__ import annotations

import ast
import enum
import functools
import os
import pickle
import re
import sys
import time
import tokenize
import types
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import wrapt
import xxhash

from durably._keys.bytecode import _Refs, _scan
from durably._keys.canonical import Encoder
from durably._keys.encoders import type_path
from durably._keys.files import SEEN, File
from durably._keys.origin import (
    _import_user_module,
    _package_version,
    _resolve_import,
    is_user_module,
)
from durably._keys.recorded import recorded_module
from durably._keys.revalidate import (
    _MISSING,
    _RECHECK_BYTES,
    _WALKING,
    Fingerprint,
    Unchecked,
    _Check,
    _check_of,
    registry_ids,
)
from durably._keys.state import _is_atom, _is_code, _is_stateful, _StateFinder, _wrapped_of
from durably.exceptions import SerializationError

__all__ = [
    "Fingerprint", "fingerprint_function", "fingerprint_of", "is_user_module",
    "nameless_callable",
]

#: when durably was imported: a module file modified since is not what this process loaded
#: (for a module imported before durably, or whose import was not seen)
_STARTED = time.time()
#: module name → when this process last looked for it (its import, a reload): its file
#: modified since is not what it was loaded from
_LOADED: dict[str, float] = {}


class _ImportClock:
    """A finder that finds nothing: it notes when each module is looked for (imported or
    reloaded), for :func:`definition_digest`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        _LOADED[name] = time.time()


sys.meta_path.insert(0, _ImportClock())
#: each module file's definitions (see _Definitions), by path, with the file's (mtime,
#: size) it was read at
_DEFINITIONS: dict[str, tuple[tuple[int, int], _Definitions]] = {}


def definition_digest(ns: Mapping[str, Any], name: str) -> str | None:
    """A digest of the source that makes ``name``'s value at import in the module whose
    globals are ``ns`` (``FEATURES = ["b", "a"]``; see :class:`_Definitions`): what a state
    value (one the code mutates, whose contents do not count) starts from, so that editing
    it in the file is an edit. None when the module has no source file, no module-level
    statement mentions the name, or the file was modified since the module was loaded
    (the source is then not what its values were made from)."""
    path = ns.get("__file__")
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    loaded = _LOADED.get(str(ns.get("__name__")), _STARTED)
    if loaded < st.st_mtime <= time.time():  # (a time ahead of the clock: another host's)
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    found = _DEFINITIONS.get(path)
    if found is None or found[0] != stamp:
        found = _DEFINITIONS[path] = (stamp, _Definitions(path))
    return found[1].digest(name)


class _Definitions:
    """What makes each name's value at import in one module file: the module-level
    statements that mention it (``FEATURES = [...]``, ``EXTRA.extend([...])``, ``for k in
    ...: REG[k] = ...``, inside top-level if / try / with blocks too), and, transitively,
    what those statements use of the module: its functions and classes (``BUILT =
    build()``) and the statements that assign the names they use (``SEED = "m1"``). Not
    imports or an ``if __name__ == "__main__":`` block (what a script does when run). The
    file is parsed once; a name's digest is made when first asked for."""

    def __init__(self, path: str) -> None:
        #: each piece of module source, with the names it uses: the module's functions and
        #: classes by name; the statements that mention a name; those that assign it
        self.helpers: dict[str, tuple[str, set[str]]] = {}
        self.statements: dict[str, list[tuple[str, set[str]]]] = {}
        self.binders: dict[str, list[tuple[str, set[str]]]] = {}
        self.digests: dict[str, str | None] = {}
        try:
            with tokenize.open(path) as f:
                source = f.read()
            tree = ast.parse(source)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            return
        code_defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        for node in tree.body:
            if isinstance(node, code_defs):
                self.helpers[node.name] = (ast.get_source_segment(source, node) or "",
                                           _names_in(node))
        todo: list[ast.stmt] = list(tree.body)
        while todo:
            node = todo.pop(0)
            if isinstance(node, (*code_defs, ast.Import, ast.ImportFrom)) or _is_main_block(
                    node):
                continue
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                todo[:0] = [*node.body, *getattr(node, "orelse", []),
                            *getattr(node, "finalbody", []),
                            *(s for h in getattr(node, "handlers", []) for s in h.body)]
                continue
            piece = (ast.get_source_segment(source, node) or "", _names_in(node))
            for n in piece[1]:
                self.statements.setdefault(n, []).append(piece)
            for n in {t.id for t in ast.walk(node)
                      if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}:
                self.binders.setdefault(n, []).append(piece)

    def digest(self, name: str) -> str | None:
        """The digest of what makes ``name``'s value (None: no statement mentions it)."""
        if name not in self.digests:
            self.digests[name] = (xxhash.xxh3_64_hexdigest("\n".join(self._closure(name))
                                                          .encode())
                                  if name in self.statements else None)
        return self.digests[name]

    def _closure(self, name: str) -> list[str]:
        """The statements that mention ``name``, then what they use: the module's functions
        and classes, and the statements that assign the other names they use."""
        texts: dict[str, None] = {}
        seen: set[str] = {name}
        pending = [name]
        while pending and len(texts) < 200:
            current = pending.pop(0)
            pieces = list(self.statements.get(current, ()) if current == name
                          else self.binders.get(current, ()))
            if current != name and current in self.helpers:
                pieces.append(self.helpers[current])
            for text, used in pieces:
                texts.setdefault(text)
                for n in sorted(used - seen):
                    if n in self.helpers or n in self.binders:
                        seen.add(n)
                        pending.append(n)
        return list(texts)


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_main_block(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":``."""
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _write_definition(e: Encoder, ns: Mapping[str, Any], name: str) -> None:
    """The source digest of a state value's definition, when it can be read (see
    :func:`definition_digest`). When it cannot (no file: a notebook; a file edited since
    the module was loaded), the value counts by its type only, as before: its contents as
    first seen would make a key depend on what ran before (a side effect's step executed
    again on resume once did), which matters more than an edit the process cannot see."""
    digest = definition_digest(ns, name)
    if digest is not None:
        e.text(b"Q", digest)


_SKIP_CLASS_ATTRS = frozenset(
    {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__annotations__",
     "__firstlineno__", "__static_attributes__", "__slots__", "__parameters__",
     "__orig_bases__", "__dataclass_fields__", "__dataclass_params__", "__match_args__",
     # a cache copyreg adds the first time an instance is pickled or digested
     "__slotnames__",
     # abc's registry and caches: filled as isinstance() runs
     "_abc_impl"}
)
#: code kept in a class attribute (a dunder attribute counts only when it is code)
_CODE_ATTRS = (staticmethod, classmethod, property, functools.cached_property)
#: (function, name) pairs already warned about a value whose changes are not noticed
_OPAQUE_WARNED: set[tuple[str, str]] = set()
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _recorded(obj: Any) -> str:
    """``module.qualname`` of a library's function or class as fingerprints record it (one
    of durably's by the module of its first release: see :mod:`durably._keys.recorded`)."""
    return f"{recorded_module(obj.__module__, obj.__qualname__)}.{obj.__qualname__}"


def _type_text(t: Any) -> str:
    """An annotation as text, without memory addresses (stable across processes)."""
    if isinstance(t, type):
        return f"{recorded_module(t.__module__, t.__qualname__)}.{t.__qualname__}"
    return _ADDRESS.sub("", repr(t))


def _fields_of(c: type) -> list[tuple[Any, ...]] | None:
    """The fields a record library (dataclasses, attrs, pydantic) keeps for class ``c``:
    name, annotation, default and default factory, or None for another class. Their
    generated methods are recorded by name (see :func:`durably._keys.class_code._generated`), so
    the fields stand for them."""
    ns = vars(c)
    out: list[tuple[Any, ...]] = []
    if isinstance(ns.get("__dataclass_fields__"), dict):
        for f in ns["__dataclass_fields__"].values():
            default = getattr(f, "default", None)
            factory = getattr(f, "default_factory", None)
            out.append((
                "dc", str(f.name), _type_text(f.type),
                () if type(default).__name__ == "_MISSING_TYPE" else (default,),
                None if type(factory).__name__ == "_MISSING_TYPE" else factory,
                getattr(f, "init", True), getattr(f, "kw_only", False),
            ))
        return out
    attrs_fields = ns.get("__attrs_attrs__")
    if isinstance(attrs_fields, tuple):
        for a in attrs_fields:
            default = getattr(a, "default", None)
            factory = getattr(default, "factory", None)
            if type(default).__name__ == "_Nothing":
                kept: tuple[Any, ...] = ()
            elif factory is not None:
                kept = ("factory", factory, getattr(default, "takes_self", False))
            else:
                kept = (default,)
            out.append(("attrs", str(a.name), _type_text(getattr(a, "type", None)), kept,
                        getattr(a, "converter", None), getattr(a, "init", True)))
        return out
    fields = ns.get("__pydantic_fields__")
    if isinstance(fields, dict):
        for name, info in fields.items():
            default = getattr(info, "default", None)
            kept = () if type(default).__name__ == "PydanticUndefinedType" else (default,)
            out.append(("pydantic", str(name), _type_text(getattr(info, "annotation", None)),
                        kept, getattr(info, "default_factory", None),
                        list(getattr(info, "metadata", None) or ()),
                        getattr(info, "alias", None)))
        return out
    return None


class _StateMark:
    """Stands for a state value inside default arguments: its type, never its contents."""

    __slots__ = ("path",)

    def __init__(self, v: Any) -> None:
        self.path = type_path(type(v)).decode()

    def __durably_digest__(self) -> str:
        return self.path


class _Walker(_StateFinder):
    def __init__(self, seed: _Walker | None = None) -> None:
        super().__init__(seed)  # what it keeps alive, and the state found so far
        self.globals: list[tuple[Mapping[str, Any], str, Any]] = []
        self.attrs: list[tuple[Any, str, Any]] = []
        #: each function met, with its code, defaults and keyword defaults
        self.functions: list[tuple[Any, Any, Any, Any]] = []
        self.done: dict[int, str] = {}
        self.active: set[int] = set()
        self.parts: dict[str, str] = {}
        self.seen: set[int] = set()
        self.seen_names: set[tuple[int, str]] = set()
        self.checks: dict[int, _Check] = {}  # configuration checked on revalidation
        self.large: list[tuple[str, int]] = []  # (name, bytes) of those checked by digest
        #: configuration too large or too slow to check on every call, by id: checked before
        #: a result is cached (see Fingerprint.changed_in_place)
        self.unchecked: dict[int, Unchecked] = {}
        #: while a configuration value is encoded: the digest given to each function and
        #: class met inside it, by id (its check before caching gives them the same)
        self.met: dict[int, str] | None = None
        self.hits = 0  # functions and classes digested inside values so far
        self.where = ("", "")  # (function or class, name) of the value being encoded

    def conflicted(self) -> bool:
        """Whether a value or name found to be state later was encoded as configuration."""
        return not (self.seen.isdisjoint(self.state) and self.seen_names.isdisjoint(self.rebound))

    # -- objects ------------------------------------------------------------------------
    def function(self, f: types.FunctionType) -> str:
        key = id(f)
        done = self.done.get(key)
        if done is not None:
            return done
        name = f"{_module_of(f)}.{f.__qualname__}"
        if key in self.active:
            return "recursive:" + name
        self.active.add(key)
        self.keep.append(f)
        try:
            e = Encoder(name)
            code = f.__code__
            self.functions.append((f, code, f.__defaults__, f.__kwdefaults__))
            e.text(b"q", f.__qualname__)
            refs = _Refs()
            self.code(e, code, refs, frozenset(code.co_freevars), top=True)
            self.resolve(f, refs.events)  # before its values are encoded
            self.where = (name, "a default argument")
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
                self.where = (name, "a closure variable")
                self.value(e, value, refs.names)
            own = e.hasher.copy() if e.hasher is not None else xxhash.xxh3_128()
            own.update(bytes(e.buf))  # the function itself, without what it refers to
            ns = f.__globals__
            for gname in sorted(refs.globals):
                value = self.lookup(e, b"g", ns, gname)
                if value is _MISSING:
                    continue  # state, a builtin, or a name not defined yet
                self.where = (name, f"{_module_of(f)}.{gname}")
                if _is_code(value):
                    self.value(e, value, refs.names)
                else:  # a module-level value: a part of its own, so explain can name it
                    sub = Encoder(name)
                    self.value(sub, value, refs.names)
                    if id(value) in self.state:  # its contents do not count: its source does
                        _write_definition(sub, ns, gname)
                    digest = sub.hexdigest()
                    e.text(b"k", digest)
                    self.parts.setdefault(f"{_module_of(f)}.{gname}", digest)
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
        # which instructions a try block covers: moving a statement in or out of one can
        # leave co_code as it was (3.11+)
        table = getattr(code, "co_exceptiontable", b"")
        if table:  # (only when there is one: digests of code without try blocks stay)
            e.raw(b"x", table)
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
        where = self.where
        token = _WALKING.set(self)  # functions inside the value are walked by this walk
        outer, self.met = self.met, {}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sub.encode(value)
        except (SerializationError, RecursionError, TypeError, ValueError, AttributeError):
            self.opaque(e, value, where)
            return
        finally:
            _WALKING.reset(token)
            met, self.met = self.met, outer
            if outer is not None:
                outer.update(met)
        size = sub.hashed + len(sub.buf)  # (what digesting it again costs: sizes decide)
        cheap = self.hits == hits  # (no function or class inside: its digest is the check's)
        small = sub.hasher is None and len(sub.buf) <= _RECHECK_BYTES
        digest = sub.hexdigest()
        e.raw(b"k", bytes.fromhex(digest))
        if check:
            # without functions or classes inside, the contents digest is the check digest;
            # a large value is checked by its pickle's digest when it pickles alike each time
            self.check(value, digest if cheap and small else None, where[1])
        if check and id(value) not in self.checks:
            self.uncheck(value, where[1], digest, size, met)

    def opaque(self, e: Encoder, value: Any, where: tuple[str, str]) -> None:
        """A value that cannot be digested: by its pickle, else by its type, with a warning
        (once per function and name) that its changes are not noticed."""
        e.typed(b"?", type(value))
        if _is_stateful(value):
            return  # a lock, an iterator: what it holds is no configuration
        # by its pickle (classes and functions by reference). Not cloudpickle: it pickles a
        # class of __main__ by value with a random tracker id, different in every process
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                data = pickle.dumps(value, protocol=5)
        except Exception:  # noqa: BLE001 - does not pickle either: by type, with a warning
            pass
        else:
            e.raw(b"p", xxhash.xxh3_128_digest(data))
            return
        top = type(value).__module__.partition(".")[0]
        if where in _OPAQUE_WARNED or (top in sys.stdlib_module_names and top != "builtins"):
            return  # a connection, a thread-local, an executor: resources, not configuration
        _OPAQUE_WARNED.add(where)
        owner, what = where
        warnings.warn(
            f"durably: the code fingerprint of {owner or 'a task'} records {what or 'a value'} "
            f"(a {type_path(type(value)).decode()}) by its type only: it can be neither "
            "digested nor pickled, so changes to it are not noticed. Give the task an "
            "explicit @task(version=...) and change it when that value changes.",
            stacklevel=2,
        )

    def check(self, value: Any, digest: str | None, name: str = "") -> None:
        """Check ``value``'s contents on revalidation (see :meth:`Fingerprint.valid`)."""
        if id(value) in self.checks:
            return
        found = _check_of(value, self.keep, digest)
        if found is not None:
            self.keep.append(value)
            self.checks[id(value)] = found
            if len(found) > 3:  # (a large value: its size, what each call pays)
                self.large.append((name or "a value", found[3]))

    def uncheck(self, value: Any, name: str, digest: str, size: int,
                met: dict[int, str]) -> None:
        """A configuration value too large to check by its pickle on every call: checked by
        identity, and by its full digest before each call's key and before a result is
        cached (see :meth:`Fingerprint.changed_in_place`), with the digest this walk gave it
        (its encoding: ``size`` bytes) and the digests it gave the functions and classes
        inside (``met``)."""
        if id(value) not in self.unchecked:
            self.keep.append(value)
            stamp = None  # a durably.file(): its stamp from before the walk read it
            if isinstance(value, File):
                stamp = next((s for f, s in reversed(SEEN.get() or ()) if f is value), None)
            self.unchecked[id(value)] = Unchecked(value, name or "a value", met, digest, size,
                                                  stamp)

    def klass(self, c: type) -> str:
        from durably._keys.class_code import _generated  # lazily: it imports this module

        key = id(c)
        done = self.done.get(key)
        if done is not None:
            return done
        name = f"{_module_of(c)}.{c.__qualname__}"
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
                own.text(b"B", _recorded(base))
            meta = type(c)
            if meta is not type and is_user_module(meta.__module__):
                # a metaclass of the user's: its methods are the class's (type(s).tag())
                e.text(b"M", "")
                self.value(e, meta, names)
            self.class_mutations(c)  # before its attributes are encoded
            is_enum = issubclass(c, enum.Enum)
            ns = vars(c)
            for attr, value in sorted(ns.items()):
                if attr in _SKIP_CLASS_ATTRS or (
                    # an Enum's member maps: managed by enum, and they grow as Flag values
                    # are combined; the members' values are encoded below
                    is_enum and attr[:1] == "_" == attr[-1:] and not _is_code(value)
                ) or (
                    # data a library keeps in dunders (pydantic's schema, validator and
                    # signature, attrs' fields: they hold ids); its fields are encoded below
                    attr[:2] == "__" == attr[-2:] and not isinstance(value, _CODE_ATTRS)
                    and not (_is_code(value) and not isinstance(value, (type, types.ModuleType)))
                ):
                    continue
                if (id(c), attr) in self.rebound:  # `cls.attr = v` in a classmethod: state
                    e.text(b"g", attr)
                    e.buf += b"S"
                    continue
                self.seen_names.add((id(c), attr))
                self.globals.append((ns, attr, value))  # `Cls.method = other` is noticed
                self.where = (name, f"{name}.{attr}")
                e.text(b"g", attr)
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                elif isinstance(value, functools.cached_property):
                    value = value.func
                if isinstance(value, property):
                    for acc in (value.fget, value.fset, value.fdel):
                        self.value(e, acc, names)
                elif isinstance(value, types.FunctionType) and _generated(value, attr, c):
                    # made by a library from the fields (encoded below): by name, since its
                    # bytecode changes with the library and attrs' __hash__ holds a constant
                    # that differs from process to process
                    e.text(b"f", value.__qualname__)
                elif _is_code(value):
                    self.value(e, value, names)
                else:
                    self.value(e, value, names)
                    own.text(b"g", attr)
                    self.value(own, value, names)
            fields = _fields_of(c)
            if fields is not None:
                self.where = (name, "its fields")
                for enc in (e, own):
                    enc.buf += b"R"
                    self.constant(enc, fields)
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

    def lookup(self, e: Encoder, tag: bytes, ns: Any, name: str) -> Any:
        """Look a name up in a namespace (a module's globals) and record it for revalidation,
        even when missing (a helper defined after the first call is seen). Returns _MISSING
        for a name the walked code rebinds (state: written as such) or one not defined."""
        if (id(ns), name) in self.rebound:
            e.text(tag, name)
            e.buf += b"S"
            _write_definition(e, ns, name)
            return _MISSING
        self.seen_names.add((id(ns), name))
        value = ns.get(name, _MISSING)
        self.globals.append((ns, name, value))
        if value is not _MISSING:
            e.text(tag, name)
        return value

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
                sub = self.lookup(e, b"a", ns, attr)
                if sub is _MISSING:
                    continue
                self.where = (m.__name__, f"{m.__name__}.{attr}")
                if _is_code(sub):
                    self.value(e, sub, names if isinstance(sub, types.ModuleType) else set())
                    continue
                # a module-level value read as an attribute (`cfg.MULT`): its bytes also go
                # to a tap, for a part of its own (explain names it), the fingerprint's bytes
                # unchanged
                tap = [xxhash.xxh3_128(), len(e.buf)]
                e.taps.append(tap)
                try:
                    self.value(e, sub, set())
                    if id(sub) in self.state:  # its contents do not count: its source does
                        _write_definition(e, ns, attr)
                finally:
                    e.taps.pop()
                digest = e.tapped(tap)
                if digest is not None:
                    self.parts.setdefault(f"{m.__name__}.{attr}", digest)
        finally:
            self.active.discard(key)

    def value(self, e: Encoder, v: Any, names: set[str]) -> None:
        """A name the code refers to: user code deeply, other code by name and version."""
        if isinstance(v, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
            v = v.__wrapped__
        registry = getattr(v, "registry", None) if isinstance(v, types.FunctionType) else None
        if isinstance(registry, types.MappingProxyType) and callable(getattr(v, "dispatch", None)):
            # functools.singledispatch: the code is in the registered implementations
            e.text(b"D", _recorded(v))
            for cls, impl in sorted(registry.items(), key=lambda kv: type_path(kv[0])):
                e.raw(b"t", type_path(cls))
                self.value(e, impl, names)
            if id(registry) not in self.checks:  # an overload registered later is noticed
                self.keep.extend((registry, *registry.values()))  # (ids never reused)
                self.checks[id(registry)] = (registry, registry_ids, registry_ids(registry))
            return
        if isinstance(v, types.FunctionType):
            if is_user_module(v.__module__):
                e.text(b"F", self.function(v))
            else:
                e.text(b"f", f"{_recorded(v)}@{_package_version(v.__module__)}")
        elif isinstance(v, type):
            if is_user_module(v.__module__):
                e.text(b"C", self.klass(v))
            else:
                e.text(b"t", f"{_recorded(v)}@{_package_version(v.__module__)}")
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
        if id(v) in self.state or _is_stateful(v):
            e.typed(b"S", type(v))
            self.code_in_state(e, v)
            return
        if isinstance(v, os._Environ):  # the whole environment (PWD...): by name only
            e.text(b"E", "os.environ")
            return
        if _is_atom(v) or _is_code(v):
            self.constant(e, v)
            return
        self.seen.add(id(v))
        self.keep.append(v)
        self.constant(e, v, check=check)

    def code_in_state(self, e: Encoder, v: Any) -> None:
        """The user classes and functions a state container holds (a plugin registry filled
        by ``__init_subclass__``): their code counts, the rest of the state does not."""
        if isinstance(v, dict):
            items = list(v.values()) + list(v.keys())
        elif isinstance(v, (list, tuple, set, frozenset)):
            items = list(v)
        else:
            return
        code = {}
        for item in items:
            if isinstance(item, (type, types.FunctionType)) and is_user_module(item.__module__):
                code[f"{item.__module__}.{item.__qualname__}"] = item
        for name in sorted(code):
            e.text(b"r", name)
            self.value(e, code[name], set())

    def nested(self, obj: Any) -> str | None:
        """Digest of a function or class met inside a constant (for :func:`fingerprint_of`)."""
        if not isinstance(
            obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper, types.FunctionType, type)
        ):
            return None
        self.hits += 1
        e = Encoder()
        self.value(e, obj, set())
        digest = e.hexdigest()
        if self.met is not None:
            self.met[id(obj)] = digest
        return digest


_PASSES = 3  # a second pass when state was found after it was encoded as configuration


def _module_of(obj: Any) -> str:
    """The module name of a function or class as fingerprints write it: a script's, whether
    it runs as ``__main__`` or again in a worker multiprocessing spawned (``__mp_main__``),
    so both give one fingerprint (a recursive task names itself)."""
    module = obj.__module__
    return "__main__" if module == "__mp_main__" else str(module)


def fingerprint_function(func: Any) -> Fingerprint:
    """Compute the fingerprint of a function (unwrapping decorators made with wrapt)."""
    while isinstance(func, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper)):
        func = func.__wrapped__
    if isinstance(func, (staticmethod, classmethod)):
        func = func.__func__
    w: _Walker | None = None
    seen: list[tuple[File, Any]] = []  # the durably.file() values it meets, nested too
    token = SEEN.set(seen)
    try:
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
    finally:
        SEEN.reset(token)
    assert w is not None
    fp = Fingerprint(digest, w.globals, w.attrs, w.parts, list(w.checks.values()), w.keep,
                     w.functions, list(w.unchecked.values()))
    fp.large = w.large
    first: dict[File, Any] = {}
    for f, stamp in seen:
        first.setdefault(f, stamp)  # (its stamp from before its first read)
    fp.files = list(first.items())
    return fp


def nameless_callable(obj: Any) -> tuple[str, Any] | None:
    """What a callable without a name of its own runs, for ``@task`` and ``@entrypoint``:
    ``("partial", f)`` for a :func:`functools.partial` (nested ones too: ``f`` is the
    innermost function), ``("object", type(obj).__call__)`` for an instance of a class
    with ``__call__``; None for anything else (a function, a method, a class, a callable
    with a ``__qualname__`` or ``__name__``).

    Its fingerprint (:func:`fingerprint_function` of the partial or the object itself)
    covers that code and the values it holds: a partial's bound arguments and an object's
    attributes are configuration, like a closure's cells and a function's defaults.
    """
    if isinstance(obj, functools.partial):
        while isinstance(obj, functools.partial):
            obj = obj.func
        return ("partial", obj)
    if isinstance(obj, type) or getattr(obj, "__qualname__", None) or getattr(
            obj, "__name__", None):
        return None
    return ("object", type(obj).__call__) if callable(obj) else None


_ARG_CACHE: weakref.WeakKeyDictionary[Any, Fingerprint] = weakref.WeakKeyDictionary()


def class_fingerprint_parts(cls: type) -> dict[str, str]:
    """The parts (digest of each function, class or constant of the user's code it covers,
    by qualified name) of the fingerprint :func:`fingerprint_of` last took of a class passed
    as a value; empty when it took none outside a fingerprint walk."""
    fp = _ARG_CACHE.get(cls)
    return fp.changed_by if fp is not None else {}


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
        return f"{_recorded(obj)}@{_package_version(obj.__module__)}"
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
        return f"{_recorded(obj)}@{_package_version(obj.__module__)}"
    if isinstance(obj, (types.BuiltinFunctionType, types.MethodDescriptorType)) and isinstance(
        getattr(obj, "__self__", None), (types.ModuleType, type(None))
    ):
        return f"{getattr(obj, '__module__', '')}.{obj.__qualname__}"
    return None
