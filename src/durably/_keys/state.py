"""State: the values and names that the walked code itself changes.

A value the walked code changes (an item or attribute stored or deleted, a mutating method
called, the name rebound) is *state*: only its type enters the fingerprint, so a task's key
does not depend on what ran before it in the process. The mutations are read from the
bytecode (:mod:`durably._keys.bytecode`); here they are resolved to the values they act on.
See :mod:`durably._keys.fingerprint` for the whole picture: code, configuration or state.
"""

from __future__ import annotations

import array
import collections
import collections.abc
import datetime as _dt
import decimal
import enum
import fractions
import io
import itertools
import pathlib
import queue
import sys
import threading
import types
import uuid
from typing import Any

import wrapt

from durably._keys.bytecode import _Event, _scan
from durably._keys.origin import is_user_module
from durably._keys.revalidate import _MISSING

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


def _iterator_types() -> tuple[type, ...]:
    found: set[type] = {
        types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, io.IOBase,
        type(threading.Lock()), type(threading.RLock()), threading.Condition,
        threading.Semaphore, threading.Event, threading.Thread, threading.Barrier,
        queue.Queue, queue.SimpleQueue,
    }
    found.update(v for v in vars(itertools).values() if isinstance(v, type))
    samples: tuple[Any, ...] = ([], (), {}, set(), "", b"", bytearray(), range(0), {}.keys(),
                                {}.values(), {}.items(), reversed([]))
    for sample in samples:
        found.add(type(iter(sample)))
    return tuple(found)


#: values that only ever hold state (a lock, an iterator, a generator, a queue, a file):
#: recorded by type, whether or not the walked code is seen changing them
_STATEFUL = _iterator_types()


_STDLIB = frozenset(sys.stdlib_module_names) - {"__main__"}
#: the mutable containers whose methods named in _MUTATORS change them (and their subclasses)
_MUTABLE_KINDS = (list, dict, set, bytearray, collections.deque, array.array,
                  collections.abc.MutableSequence, collections.abc.MutableMapping,
                  collections.abc.MutableSet)


def _mutable_kind(v: Any) -> bool:
    """Whether ``v`` is a mutable container of the language's kind, an object of the
    standard library (an ``xml.etree`` element, a ``TarFile``), or an object of the user's
    own classes: what a method named in :data:`_MUTATORS` changes."""
    try:
        if isinstance(v, _MUTABLE_KINDS):
            return True
        module = type(v).__module__
        return is_user_module(module) or module.partition(".")[0] in _STDLIB
    except Exception:  # noqa: BLE001 - an odd __class__ or __instancecheck__: not a container
        return False


def _holds_mutable(container: Any) -> bool:
    """Whether the items of ``container`` are what a method named in :data:`_MUTATORS`
    changes (:func:`_mutable_kind`): judged by the first 64 (an empty container is filled
    by the code that calls it: ``GROUPS[k].append(x)``); a container of another kind by
    itself (an object of the user's class holding lists)."""
    try:
        if isinstance(container, dict):
            items: Any = container.values()
        elif isinstance(container, (list, tuple, collections.deque)):
            items = container
        else:
            return _mutable_kind(container)
        sample = list(itertools.islice(items, 64))
    except Exception:  # noqa: BLE001 - changed meanwhile (another thread): as before
        return True
    return not sample or any(_mutable_kind(v) for v in sample)


def _is_stateful(v: Any) -> bool:
    """A value that is state by its nature (its contents change as it is used)."""
    return isinstance(v, _STATEFUL)


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


class _StateFinder:
    """Finds state for a walk (the base of its walker): what the events of the walked
    functions change, and which methods of the user's classes change their instance."""

    def __init__(self, seed: _StateFinder | None = None) -> None:
        self.keep: list[Any] = list(seed.keep) if seed else []  # keeps ids unique
        # state: values the walked code changes (by id), names it rebinds (owner id, name);
        # a walk that had encoded one of them as configuration is done again
        # (see _Walker.conflicted)
        self.state: dict[int, Any] = dict(seed.state) if seed else {}
        self.rebound: set[tuple[int, str]] = set(seed.rebound) if seed else set()
        self.changes_self: dict[tuple[int, int], bool] = {}

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
        if op == "call" and not self.call_changes(obj, path[-1], inside, name):
            return
        for v in path:
            self.mark(v)

    def call_changes(self, obj: Any, container: Any, inside: bool, name: str) -> bool:
        """Whether calling method ``name`` of ``obj`` (``_MISSING``: a computed attribute;
        ``inside``: of an item of ``container``, the last value reached) changes it.

        A name in :data:`_MUTATORS` changes a container of the language's kind (a list, a
        dict, a set, a deque, an object of the standard library) or an object of the
        user's own classes; called on an item, it changes the container when the items are
        such values. Any other method is judged by its bytecode (the user's classes). So an
        installed package's object is never state by a method's name alone: pandas'
        ``Series.add`` and ``Index.append`` return new objects. Taken for configuration,
        such a value is digested, and a real change in place is noticed (a rerun, or a
        warning), never served a stale result; taken for state wrongly, new data in it
        would have been."""
        if name in _MUTATORS:
            if inside:
                return _holds_mutable(container)
            return _mutable_kind(container if obj is _MISSING else obj)
        return not inside and obj is not _MISSING and self.method_changes_self(obj, name)

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
