"""The code of the user's record classes, as a part of their instances' digests.

Values digested by their fields or content (dataclasses, NamedTuples, attrs classes, pydantic
models, Enum members, subclasses of builtins and numpy arrays, objects with a digest hook)
also carry the code of their class when it is the user's own (:func:`class_code`): editing
``Params.effective_lr`` changes the digest of every ``Params`` passed to a task.
"""

from __future__ import annotations

import decimal
import enum
import fractions
import functools
import types
import weakref
from typing import Any

from durably._keys.canonical import Encoder, _callable_name
from durably._keys.encoders import _UNSET, _pack_Q, type_path
from durably._keys.fingerprint import fingerprint_function, fingerprint_of
from durably._keys.origin import is_user_module
from durably._keys.revalidate import _WALKING
from durably.exceptions import SerializationError

__all__ = ["class_code", "class_parts"]

_CONSTANT_TYPES = frozenset(
    {type(None), bool, int, float, complex, str, bytes, decimal.Decimal, fractions.Fraction}
)


class _Layout:
    """What the code of a user class is made of, computed once per class and revalidated
    (see :func:`class_code`)."""

    __slots__ = ("entries", "fingerprints", "functions", "made", "parts", "sizes", "static",
                 "values")

    def __init__(self) -> None:
        self.static = b""  # names, kinds, constants and plain member values, encoded
        self.functions: list[types.FunctionType] = []  # user functions, in order
        self.values: list[Any] = []  # member values that are not plain constants
        self.sizes: list[tuple[type, int]] = []  # each class of the MRO read, its attribute count
        self.entries: list[tuple[type, str, Any]] = []  # each attribute read, by identity
        self.fingerprints: list[Any] = []  # Fingerprint of each function, outside a walk
        # the class code and the fingerprints it was made from (kept when values is empty)
        self.made: tuple[list[Any], bytes] | None = None
        # what its functions' fingerprints cover (see class_parts), and from which ones
        self.parts: tuple[list[Any], dict[str, str]] | None = None

    def valid(self) -> bool:
        """True while no attribute of the classes was added, removed or rebound."""
        for k, n in self.sizes:
            if len(k.__dict__) != n:
                return False
        return all(k.__dict__.get(name, _UNSET) is v for k, name, v in self.entries)


_LAYOUTS: weakref.WeakKeyDictionary[type, _Layout | None] = weakref.WeakKeyDictionary()


def _layout(t: type) -> _Layout | None:
    """The layout of ``t``; None when no class of its MRO is the user's own code."""
    layout = _LAYOUTS.get(t, _UNSET)
    if layout is None:
        return None
    if isinstance(layout, _Layout) and layout.valid():
        return layout
    new = _LAYOUTS[t] = _compute_layout(t)
    return new


def _compute_layout(t: type) -> _Layout | None:
    # the user's classes of its MRO, then of its metaclass's (type(x).tag() is its code too)
    meta: type = type(t)
    own = [k for k in t.__mro__ if is_user_module(k.__module__)] + [
        m for m in meta.__mro__ if m is not type and is_user_module(m.__module__)]
    if not own:
        return None
    layout = _Layout()
    e = Encoder()
    for k in own:
        ns = k.__dict__
        layout.sizes.append((k, len(ns)))
        e.raw(b"Q", type_path(k))
        members = ns.get("_member_map_", {}) if issubclass(k, enum.Enum) else {}
        for name in sorted(ns):
            value = ns[name]
            if name in members:
                continue
            funcs = _functions_of(value)
            if funcs is not None:
                e.text(b"g", name)
                for f in funcs:
                    if not is_user_module(f.__module__):  # a library's: by name
                        e.text(b"f", _callable_name(f))
                    elif _generated(f, name, k):  # made from the fields, digested already
                        e.text(b"f", f.__qualname__)
                    else:
                        e.buf += b"F"  # its fingerprint follows the static part
                        layout.functions.append(f)
            elif name[:1] == "_" and name[-1:] == "_":
                continue  # managed by a library: pydantic's schema, an Enum's member maps
            elif isinstance(value, type):
                e.text(b"g", name)
                e.raw(b"t", type_path(value))
            elif _is_constant(value):
                e.text(b"g", name)
                e.encode(value)
            else:
                continue  # mutable (a registry, a cache): its content is not code
            layout.entries.append((k, name, value))
    if issubclass(t, enum.Enum):
        for name, member in t.__members__.items():  # definition order, aliases too
            e.text(b"s", name)
            if _is_constant(member._value_):
                e.encode(member._value_)
            else:  # encoded on each use: it may hold records and functions
                e.buf += b"V"
                layout.values.append(member._value_)
    layout.static = bytes.fromhex(e.hexdigest())
    return layout


def class_code(e: Encoder, t: type) -> bytes:
    """The code of ``t`` as a part of its instances' digest (``b""`` for classes that are not
    the user's own code: those are recorded by their type path alone).

    For every class of the MRO that is the user's: the code fingerprint of each function,
    static/class method and property accessor (so editing ``Params.effective_lr`` changes the
    digest of every ``Params``), the value of each immutable class constant (``SCALE = 2``)
    and, for an Enum, each member's name and value. Left out: names a library manages
    (``__dunder__`` and ``_sunder_``: pydantic's schema, an Enum's member maps, which grow as
    Flag values are combined) and mutable class attributes (registries, caches), whose content
    depends on what the process did and would make digests differ between processes.

    Memoized per digest in ``e.codes``; a class met again while its own code is being encoded
    (an Enum member whose value refers back to it) is written by its path alone. Inside a code
    fingerprint walk the functions are fingerprinted by that walk (cycle-safe, and recorded
    for its revalidation); outside one, each by a fingerprint of its own, cached in the layout
    and revalidated on each use.
    """
    layout = _layout(t)
    if layout is None:
        e.codes[t] = b""
        return b""
    path = type_path(t)
    e.codes[t] = b"J" + _pack_Q(len(path)) + path  # while in progress: a back-reference
    try:
        code = _encode_class_code(e, layout)
    except BaseException:
        del e.codes[t]
        raise
    e.codes[t] = code
    return code


def class_parts(t: type) -> dict[str, str]:
    """The digest of each function, class or constant of the user's code that the methods
    of ``t`` cover, by qualified name (their fingerprints' parts), as of the last time its
    code was made; empty when it has none or it was made inside a fingerprint walk. What a
    key record keeps so that ``explain`` can name what changed in an argument's class."""
    layout = _LAYOUTS.get(t)
    if not isinstance(layout, _Layout) or not layout.fingerprints:
        return {}
    kept = layout.parts
    if kept is not None and kept[0] is layout.fingerprints:
        return kept[1]
    merged: dict[str, str] = {}
    for fp in layout.fingerprints:
        merged.update(fp.changed_by)
    layout.parts = (layout.fingerprints, merged)
    return merged


def _encode_class_code(e: Encoder, layout: _Layout) -> bytes:
    walking = _WALKING.get() is not None
    current: list[Any] = []
    if not walking:  # each function's own fingerprint, revalidated (cheap when unchanged)
        current = layout.fingerprints
        functions = layout.functions
        if len(current) != len(functions):
            current = [fingerprint_function(f) for f in functions]
        elif not all(fp.valid() for fp in current):
            current = [
                fp if fp.valid() else fingerprint_function(f)
                for fp, f in zip(current, functions, strict=True)
            ]
        layout.fingerprints = current  # a new list whenever one changed: `made` sees it
        made = layout.made
        if made is not None and made[0] is current:
            return made[1]
    c = Encoder(e.path)  # its own cycle guard: a class's code does not depend on the value
    c.codes = e.codes
    c.raw(b"K", layout.static)
    if walking:  # fingerprinted by that walk: cycle-safe, and recorded for its revalidation
        for f in layout.functions:
            c.text(b"F", fingerprint_of(f) or "")
    else:
        for fp in current:
            c.text(b"F", fp.digest)
    for v in layout.values:
        try:
            c.buf += c.sub(v)
        except SerializationError:
            c.raw(b"?", type_path(type(v)))
    code = b"K" + bytes.fromhex(c.hexdigest())
    if not walking and not layout.values:
        layout.made = (current, code)
    return code


_DATACLASS_METHODS = frozenset(
    {"__init__", "__repr__", "__eq__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__",
     "__setattr__", "__delattr__", "__replace__"}
)


def _generated(f: types.FunctionType, name: str, k: type) -> bool:
    """A method a library generated from the fields (dataclasses, NamedTuple, attrs): recorded
    by name, since the fields are digested already, its bytecode changes with the Python
    version, and attrs' ``__hash__`` holds a constant that differs from process to process."""
    file = f.__code__.co_filename
    if file.startswith("<attrs generated"):
        return True
    ns = k.__dict__
    if name in _DATACLASS_METHODS and "__dataclass_fields__" in ns:
        for _ in range(10):  # __repr__ is wrapped by a recursion guard
            inner = getattr(f, "__wrapped__", None)
            if not isinstance(inner, types.FunctionType):
                break
            f = inner
        return f.__code__.co_filename == "<string>"  # written by exec, not by the user
    return name == "__new__" and "_fields" in ns and file == "<string>"  # a namedtuple's


def _functions_of(v: Any) -> list[Any] | None:
    """The functions of a class attribute that is code; None for any other value."""
    if isinstance(v, (staticmethod, classmethod)):
        v = v.__func__
    if isinstance(v, property):
        return [f for f in (v.fget, v.fset, v.fdel) if f is not None]
    if isinstance(v, functools.cached_property):
        v = v.func
    for _ in range(100):  # decorator objects (functools.cache) keep the function they wrap
        if isinstance(v, types.FunctionType) or not callable(v) or isinstance(v, type):
            break
        try:
            wrapped = getattr(v, "__wrapped__", None)
        except Exception:  # noqa: BLE001 - a proxy that fails on lookup wraps nothing we see
            wrapped = None
        if wrapped is None:
            break
        v = wrapped
    return [v] if isinstance(v, types.FunctionType) else None


def _is_constant(v: Any) -> bool:
    t = type(v)
    if t in _CONSTANT_TYPES:
        return True
    return (t is tuple or t is frozenset) and all(map(_is_constant, v))
