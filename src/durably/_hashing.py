"""Canonical encoding of values and xxh3-128 digests.

The encoding is a byte stream of tagged, length-prefixed parts. It is *canonical*: values that
are equal give equal bytes in every process (dict and set order, ``PYTHONHASHSEED`` and memory
addresses never leak in), and values that differ in type or content give different bytes
(``1``, ``1.0``, ``True`` and ``"1"`` all differ; so do ``-0.0`` and ``0.0``, and arrays of
different dtype or shape). Large buffers (bytes, contiguous numpy arrays) are fed to the hasher
in place, without a copy.

Values digested by their fields or content (dataclasses, NamedTuples, attrs classes, pydantic
models, Enum members, subclasses of builtins and numpy arrays, objects with a digest hook)
also carry the code of their class when it is the user's own: its methods' code fingerprints,
its immutable class constants and an Enum's member values. Editing ``Params.effective_lr``
therefore changes the digest of every ``Params`` passed to a task.

The encoding is versioned by :data:`ENCODING_VERSION`; golden digests pinned in the tests make
sure an upgrade never silently changes users' cache keys.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import datetime as _dt
import decimal
import enum
import fractions
import functools
import pathlib
import struct
import sys
import types
import uuid
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import xxhash

from .exceptions import SerializationError

__all__ = [
    "ENCODING_VERSION",
    "digest",
    "digest_each",
    "encode_arguments",
    "register_encoder",
    "type_path",
]

#: Version of the canonical encoding; part of every digest.
ENCODING_VERSION = 1

_LARGE = 1 << 16  # buffers at least this big are hashed in place, not copied into the stream
_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<q").pack
_pack_Q = struct.Struct("<Q").pack
_NAN = _pack_d(float("nan"))

_ONLY_STR = {str}
_ONLY_INT = {int}
_BIG_ENDIAN = sys.byteorder == "big"
_ENCODERS: dict[type, Callable[[Any], Any]] = {}
_WARNED: set[type] = set()
_TYPE_PATHS: dict[type, bytes] = {}
_UNSET = object()


def register_encoder(cls: type, encoder: Callable[[Any], Any]) -> None:
    """Teach durably how to digest instances of ``cls`` (and its subclasses).

    Args:
        cls: The type to handle.
        encoder: A function of one instance returning a value durably already digests
            (a tuple of fields, a bytes buffer, ...). Equal instances must give equal values.

    Raises:
        DefinitionError: ``cls`` is not a type, ``encoder`` is not callable, or ``cls`` is a
            type durably already digests by its value (``str``, ``dict``, ``pathlib.Path``,
            ...): an encoder for it would never be used. Register it for a subclass instead;
            for the contents of a file, pass ``durably.file(path)``.

    Example:
        >>> import durably
        >>> class Point:
        ...     def __init__(self, x, y):
        ...         self.x, self.y = x, y
        >>> durably.register_encoder(Point, lambda p: (p.x, p.y))
        >>> durably.digest(Point(1, 2)) == durably.digest(Point(1, 2))
        True
    """
    from .exceptions import DefinitionError

    if not isinstance(cls, type):
        raise DefinitionError(f"register_encoder() needs a type, got {cls!r}")
    if not callable(encoder):
        raise DefinitionError(f"register_encoder() needs a callable encoder, got {encoder!r}")
    if cls in _DISPATCH:
        name = type_path(cls).decode()
        raise DefinitionError(
            f"register_encoder({name}): durably already digests every {name} by its value "
            "(a built-in rule), so this encoder would never be used. For the contents of a "
            "file, pass durably.file(path) instead of the path; to digest values of your own "
            "type differently, define a subclass and register the encoder for it."
        )
    _ENCODERS[cls] = encoder


def type_path(t: type) -> bytes:
    """``module.qualname`` of a type, as bytes (cached)."""
    p = _TYPE_PATHS.get(t)
    if p is None:
        p = f"{t.__module__}.{t.__qualname__}".encode()
        _TYPE_PATHS[t] = p
    return p


class _Cycle:
    __slots__ = ()


class Encoder:
    """Writes the canonical encoding of values into an xxh3-128 hasher.

    Small parts are gathered in a bytearray; large buffers are flushed straight to the hasher.
    ``path`` names the argument being encoded, for error messages.
    """

    __slots__ = ("active", "buf", "codes", "hasher", "path")

    def __init__(self, path: str = "") -> None:
        self.buf = bytearray()
        self.hasher: Any = None
        self.active: dict[int, int] = {}
        self.codes: dict[type, bytes] = {}  # class code of each record type met (see _class_code)
        self.path = path

    # -- output -------------------------------------------------------------------------
    def raw(self, tag: bytes, data: Any) -> None:
        """A tagged, length-prefixed buffer (bytes, bytearray or any C-contiguous buffer)."""
        if not isinstance(data, (bytes, bytearray)):
            # never `bytearray += ndarray`: numpy's __radd__ would add element-wise (or raise)
            data = memoryview(data)
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        buf = self.buf
        buf += tag
        buf += n.to_bytes(8, "little")
        if n >= _LARGE:
            if self.hasher is None:
                self.hasher = xxhash.xxh3_128()
            self.hasher.update(bytes(buf))
            buf.clear()
            self.hasher.update(data)
        else:
            buf += data

    def text(self, tag: bytes, s: str) -> None:
        self.raw(tag, s.encode("utf-8", "surrogatepass"))

    def hexdigest(self) -> str:
        h = self.hasher
        if h is None:
            return xxhash.xxh3_128_hexdigest(bytes(self.buf))
        h.update(bytes(self.buf))
        self.buf.clear()
        return str(h.hexdigest())

    def sub(self, obj: Any) -> bytes:
        """The encoding of ``obj`` alone, as bytes (hashed down when it is large)."""
        e = Encoder(self.path)
        e.active = self.active
        e.codes = self.codes
        e.encode(obj)
        if e.hasher is not None:
            return b"#" + bytes.fromhex(e.hexdigest())
        return bytes(e.buf)

    # -- values -------------------------------------------------------------------------
    def encode(self, obj: Any) -> None:
        f = _DISPATCH_GET(type(obj))
        if f is not None:
            f(self, obj)
        else:
            self.other(obj)

    def enter(self, obj: Any) -> bool:
        """Mark a container as being encoded; on a cycle write a back-reference instead."""
        depth = self.active.get(id(obj))
        if depth is not None:
            self.buf += b"@" + depth.to_bytes(8, "little")
            return False
        self.active[id(obj)] = len(self.active)
        return True

    def leave(self, obj: Any) -> None:
        del self.active[id(obj)]

    def sequence(self, tag: bytes, items: Any, obj: Any) -> None:
        if not self.enter(obj):
            return
        try:
            self.buf += tag + len(items).to_bytes(8, "little")
            for item in items:
                self.encode(item)
        finally:
            self.leave(obj)

    def mapping(self, tag: bytes, obj: Mapping[Any, Any]) -> None:
        if not self.enter(obj):
            return
        try:
            if obj and set(map(type, obj)) == _ONLY_STR:
                # the common case, at C speed: str keys sort by code point (the order of
                # their UTF-8 bytes); all lengths, then all keys, then the values; distinct
                # tags keep it apart from the general encoding below
                keys = sorted(obj)
                self.str_block(b"\xf0" + tag, keys)
                self.values(list(map(obj.__getitem__, keys)))
                return
            pairs = [(self.sub(k), v) for k, v in obj.items()]
            pairs.sort(key=_first)
            if any(pairs[i][0] == pairs[i + 1][0] for i in range(len(pairs) - 1)):
                # keys that encode alike (distinct objects of equal content): order by value too
                keyed = sorted((k, self.sub(v)) for k, v in pairs)
                self.buf += tag + len(keyed).to_bytes(8, "little")
                for k, vb in keyed:
                    self.buf += k
                    self.buf += vb
                return
            self.buf += tag + len(pairs).to_bytes(8, "little")
            for k, v in pairs:
                self.buf += k
                self.encode(v)
        finally:
            self.leave(obj)

    def str_block(self, tag: bytes, keys: list[str]) -> None:
        """Sorted str keys in one block: count, every length, every key's UTF-8 bytes."""
        encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
        lengths = array.array("Q", map(len, encoded))
        if _BIG_ENDIAN:
            lengths.byteswap()
        buf = self.buf
        buf += tag + len(keys).to_bytes(8, "little")
        buf += lengths.tobytes()
        self.raw(b"k", b"".join(encoded))

    def values(self, vals: list[Any]) -> None:
        """A run of values: packed at C speed when all are exact 64-bit ints."""
        if set(map(type, vals)) == _ONLY_INT:
            try:
                packed = array.array("q", vals)
            except OverflowError:
                pass
            else:
                if _BIG_ENDIAN:
                    packed.byteswap()
                self.raw(b"\xf1", packed.tobytes())
                return
        self.buf += b"\xf2"
        for v in vals:
            self.encode(v)

    def unordered(self, tag: bytes, obj: Any) -> None:
        if not self.enter(obj):
            return
        try:
            if obj and set(map(type, obj)) == _ONLY_STR:
                self.str_block(b"\xf0" + tag, sorted(obj))
                return
            items = sorted(self.sub(x) for x in obj)
            self.buf += tag + len(items).to_bytes(8, "little")
            for b in items:
                self.buf += b
        finally:
            self.leave(obj)

    def typed(self, tag: bytes, t: type) -> None:
        self.raw(tag, type_path(t))

    def record_type(self, tag: bytes, t: type) -> None:
        """The type of a value digested by its fields or content; for a class of the user's
        own code also its code (:func:`_class_code`), so editing a method changes the digest."""
        self.raw(tag, type_path(t))
        code = self.codes.get(t)
        if code is None:
            code = _class_code(self, t)
        self.buf += code

    def where(self) -> str:
        """The value being encoded, for error messages."""
        return f"argument {self.path!r}" if self.path else "value"

    def cannot(self, problem: str, fix: str) -> SerializationError:
        """The error for a value that cannot be digested; ``fix`` says what to do instead."""
        return SerializationError(
            f"cannot digest {self.where()}: {problem}. Fix: {fix}, or leave the argument out "
            f"of the cache key with ignore=({self.path or 'name'!r},)."
        )

    def fields(self, tag: bytes, obj: Any, names: Any) -> None:
        """A record: its type and (name, value) pairs, in declaration order."""
        if not self.enter(obj):
            return
        try:
            t = type(obj)
            self.record_type(tag, t)
            names = list(names)
            self.buf += len(names).to_bytes(8, "little")
            for name in names:
                self.text(b"s", name)
                try:
                    value = getattr(obj, name)
                except AttributeError:
                    raise self.cannot(
                        f"field {name!r} of {type_path(t).decode()} was never set",
                        f"set {name!r} in __init__ or __post_init__, or give the field a default",
                    ) from None
                self.encode(value)
        finally:
            self.leave(obj)

    def other(self, obj: Any) -> None:
        t = type(obj)
        hook = getattr(t, "__durably_digest__", None)
        tag = b"H"
        if hook is None:
            tag = b"R"
            hook = next((_ENCODERS[k] for k in t.__mro__ if k in _ENCODERS), None)
        if hook is not None:
            # entered, so a hook that returns its parent/children (a cycle) cannot recurse forever
            if self.enter(obj):
                try:
                    self.record_type(tag, t)
                    value = hook(obj)
                    if value is obj:  # would digest as a bare back-reference: all alike
                        how = "__durably_digest__" if tag == b"H" else "the registered encoder"
                        raise SerializationError(
                            f"{how} of {type_path(t).decode()} returned the object itself. "
                            "Fix: return the state that identifies it, e.g. a tuple of fields."
                        )
                    self.encode(value)
                finally:
                    self.leave(obj)
            return
        for probe in _PROBES:
            if probe(self, obj, t):
                return
        self.reduce(obj, t)

    def reduce(self, obj: Any, t: type) -> None:
        """Fallback: the object's pickle recipe (``__reduce_ex__``), encoded canonically, so
        dicts and sets inside its state are ordered and no memory address leaks in."""
        try:
            rv = obj.__reduce_ex__(4)
        except Exception as exc:  # noqa: BLE001 - any failure means: cannot digest this
            raise SerializationError(
                f"cannot digest {self.where()}: an object of type {type_path(t).decode()} "
                f"({exc}). Fix: leave the argument out of the cache key with "
                f"ignore=({self.path or 'name'!r},), give the class a __durably_digest__ "
                "method, or call durably.register_encoder(type, fn)."
            ) from None
        if isinstance(rv, str):
            self.text(b"G", f"{getattr(obj, '__module__', '')}.{rv}")
            return
        if not self.enter(obj):
            return
        try:
            self.typed(b"~", t)
            parts = list(rv[1:])
            state = parts[1] if len(parts) > 1 else None
            args = parts[0] if parts else ()
            if state is None and not _has_content(args, t) and t not in _WARNED:
                _WARNED.add(t)
                warnings.warn(
                    f"durably: instances of {type_path(t).decode()} expose no state to "
                    "digest, so all of them get the same digest. If they can differ, give "
                    "the class a __durably_digest__ method or call "
                    "durably.register_encoder().",
                    stacklevel=4,
                )
            self.encode(_callable_name(rv[0]))
            self.encode(args)
            self.encode(state)
            # always written (None when absent) so the encoding stays self-delimiting
            items = parts[2] if len(parts) > 2 else None
            self.encode(None if items is None else list(items))
            pairs = parts[3] if len(parts) > 3 else None
            self.encode(None if pairs is None else dict(pairs))
        finally:
            self.leave(obj)


def _first(p: tuple[bytes, Any]) -> bytes:
    return p[0]


# -- the code of the user's record classes ---------------------------------------------------
_CONSTANT_TYPES = frozenset(
    {type(None), bool, int, float, complex, str, bytes, decimal.Decimal, fractions.Fraction}
)


class _Layout:
    """What the code of a user class is made of, computed once per class and revalidated
    (see :func:`_class_code`)."""

    __slots__ = ("entries", "fingerprints", "functions", "made", "sizes", "static", "values")

    def __init__(self) -> None:
        self.static = b""  # names, kinds, constants and plain member values, encoded
        self.functions: list[types.FunctionType] = []  # user functions, in order
        self.values: list[Any] = []  # member values that are not plain constants
        self.sizes: list[tuple[type, int]] = []  # each class of the MRO read, its attribute count
        self.entries: list[tuple[type, str, Any]] = []  # each attribute read, by identity
        self.fingerprints: list[Any] = []  # Fingerprint of each function, outside a walk
        # the class code and the fingerprints it was made from (kept when values is empty)
        self.made: tuple[list[Any], bytes] | None = None

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
    is_user_module = _fingerprints().is_user_module
    own = [k for k in t.__mro__ if is_user_module(k.__module__)]
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


def _class_code(e: Encoder, t: type) -> bytes:
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


def _encode_class_code(e: Encoder, layout: _Layout) -> bytes:
    fps = _fingerprints()
    walking = fps._WALKING.get() is not None
    current: list[Any] = []
    if not walking:  # each function's own fingerprint, revalidated (cheap when unchanged)
        current = layout.fingerprints
        functions = layout.functions
        if len(current) != len(functions):
            current = [fps.fingerprint_function(f) for f in functions]
        elif not all(fp.valid() for fp in current):
            current = [
                fp if fp.valid() else fps.fingerprint_function(f)
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
            c.text(b"F", fps.fingerprint_of(f) or "")
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


_FINGERPRINTS: Any = None


def _fingerprints() -> Any:
    """The ``_fingerprint`` module (it imports this one: imported on first use)."""
    global _FINGERPRINTS
    if _FINGERPRINTS is None:
        from . import _fingerprint

        _FINGERPRINTS = _fingerprint
    return _FINGERPRINTS


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


def _callable_name(f: Any) -> str:
    return f"{getattr(f, '__module__', '')}.{getattr(f, '__qualname__', repr(f))}"


def _has_content(args: Any, t: type) -> bool:
    if not isinstance(args, tuple):
        return True
    return any(a is not t and a is not object and not isinstance(a, type) for a in args)


# -- encoders of exact types -----------------------------------------------------------------
def _none(e: Encoder, o: Any) -> None:
    e.buf += b"N"


def _bool(e: Encoder, o: bool) -> None:
    e.buf += b"T" if o else b"F"


def _int(e: Encoder, o: int) -> None:
    if -(1 << 63) <= o < (1 << 63):
        e.buf += b"i" + _pack_q(o)
    else:
        e.raw(b"I", o.to_bytes((o.bit_length() + 8) // 8, "little", signed=True))


def _float(e: Encoder, o: float) -> None:
    e.buf += b"f" + (_NAN if o != o else _pack_d(o))


def _complex(e: Encoder, o: complex) -> None:
    e.buf += b"c"
    _float(e, o.real)
    _float(e, o.imag)


def _str(e: Encoder, o: str) -> None:
    b = o.encode("utf-8", "surrogatepass")
    if len(b) < _LARGE:
        e.buf += b"s" + _pack_Q(len(b)) + b  # raw(), inlined: strings are the common case
    else:
        e.raw(b"s", b)


def _bytes(e: Encoder, o: bytes) -> None:
    e.raw(b"b", o)


def _bytearray(e: Encoder, o: bytearray) -> None:
    e.raw(b"y", o)


def _memoryview(e: Encoder, o: memoryview) -> None:
    try:
        fmt, shape, contiguous = o.format, o.shape, o.c_contiguous
    except ValueError:  # every access to a released view raises
        raise e.cannot(
            "the memoryview was released, so its data is gone",
            "pass the data itself (bytes(view)) or release the view after the call",
        ) from None
    e.text(b"m", fmt)
    e.encode(shape)
    e.raw(b"b", o.cast("B") if contiguous else o.tobytes())


def _tuple(e: Encoder, o: tuple[Any, ...]) -> None:
    # no cycle guard needed: a cycle through a tuple passes a mutable container, which has one
    e.buf += b"(" + _pack_Q(len(o))
    for item in o:
        e.encode(item)


def _list(e: Encoder, o: list[Any]) -> None:
    e.sequence(b"[", o, o)


def _dict(e: Encoder, o: dict[Any, Any]) -> None:
    e.mapping(b"{", o)


def _set(e: Encoder, o: set[Any]) -> None:
    e.unordered(b"<", o)


def _frozenset(e: Encoder, o: frozenset[Any]) -> None:
    e.unordered(b">", o)


def _range(e: Encoder, o: range) -> None:
    e.buf += b"r"
    _int(e, o.start)
    _int(e, o.stop)
    _int(e, o.step)


def _slice(e: Encoder, o: slice) -> None:
    e.buf += b":"
    e.encode((o.start, o.stop, o.step))


def _decimal(e: Encoder, o: decimal.Decimal) -> None:
    e.text(b"D", str(o))


def _fraction(e: Encoder, o: fractions.Fraction) -> None:
    e.buf += b"Q"
    _int(e, o.numerator)
    _int(e, o.denominator)


def _uuid(e: Encoder, o: uuid.UUID) -> None:
    e.raw(b"U", o.bytes)


def _tz(e: Encoder, o: _dt.datetime | _dt.time) -> None:
    tz = o.tzinfo
    if tz is None:
        e.buf += b"N"
    elif isinstance(tz, _dt.timezone):
        e.buf += b"z"
        off = tz.utcoffset(None)
        e.encode((off.days, off.seconds, off.microseconds, tz.tzname(None)))
    else:
        key = getattr(tz, "key", None)
        e.typed(b"Z", type(tz))
        t = type(tz)
        if key is None and t.__str__ is object.__str__ and t.__repr__ is object.__repr__:
            # the default str() holds a memory address: digest the tzinfo's attributes
            state = getattr(tz, "__dict__", None)
            e.encode(dict(state) if state else None)
        else:
            e.encode(key if key is not None else str(tz))
        # the offset in force: pytz-style zones keep one tzinfo object per offset
        # (LMT, EST, EDT, ...) that all print the same zone name
        try:
            offset = o.utcoffset()
        except (NotImplementedError, TypeError, ValueError) as exc:
            raise e.cannot(
                f"its tzinfo, an object of type {type_path(t).decode()}, gives no valid "
                f"utcoffset() ({type(exc).__name__}: {exc})",
                "use zoneinfo.ZoneInfo(name) or datetime.timezone(offset), or implement "
                "utcoffset() in the tzinfo class",
            ) from exc
        e.encode(offset)


def _datetime(e: Encoder, o: _dt.datetime) -> None:
    e.buf += b"W"
    e.encode((o.year, o.month, o.day, o.hour, o.minute, o.second, o.microsecond, o.fold))
    _tz(e, o)


def _date(e: Encoder, o: _dt.date) -> None:
    e.buf += b"d"
    e.encode((o.year, o.month, o.day))


def _time(e: Encoder, o: _dt.time) -> None:
    e.buf += b"t"
    e.encode((o.hour, o.minute, o.second, o.microsecond, o.fold))
    _tz(e, o)


def _timedelta(e: Encoder, o: _dt.timedelta) -> None:
    e.buf += b"e"
    e.encode((o.days, o.seconds, o.microseconds))


def _path(e: Encoder, o: pathlib.PurePath) -> None:
    e.typed(b"P", type(o))
    e.text(b"s", str(o))


_DISPATCH: dict[type, Callable[[Encoder, Any], None]] = {
    type(None): _none,
    bool: _bool,
    int: _int,
    float: _float,
    complex: _complex,
    str: _str,
    bytes: _bytes,
    bytearray: _bytearray,
    memoryview: _memoryview,
    tuple: _tuple,
    list: _list,
    dict: _dict,
    set: _set,
    frozenset: _frozenset,
    range: _range,
    slice: _slice,
    decimal.Decimal: _decimal,
    fractions.Fraction: _fraction,
    uuid.UUID: _uuid,
    _dt.datetime: _datetime,
    _dt.date: _date,
    _dt.time: _time,
    _dt.timedelta: _timedelta,
    pathlib.Path: _path,
    pathlib.PosixPath: _path,
    pathlib.WindowsPath: _path,
    pathlib.PurePath: _path,
    pathlib.PurePosixPath: _path,
    pathlib.PureWindowsPath: _path,
    type(Ellipsis): lambda e, o: e.buf.extend(b"."),
}


# -- probes for families of types (tried in order for types not in _DISPATCH) ------------------
def _probe_enum(e: Encoder, o: Any, t: type) -> bool:
    if not isinstance(o, enum.Enum):
        return False
    e.record_type(b"E", t)
    name = o.name
    if name is None:  # a Flag value without a name (Flag(0), bits outside the members)
        e.buf += b"N"
        e.encode(o.value)
    else:
        e.text(b"s", name)
    return True


def _probe_namedtuple(e: Encoder, o: Any, t: type) -> bool:
    if not (isinstance(o, tuple) and hasattr(t, "_fields")):
        return False
    e.fields(b"n", o, t._fields)
    return True


def _probe_dataclass(e: Encoder, o: Any, t: type) -> bool:
    if not dataclasses.is_dataclass(t):
        return False
    e.fields(b"a", o, (f.name for f in dataclasses.fields(o)))
    return True


def _probe_attrs(e: Encoder, o: Any, t: type) -> bool:
    attrs = getattr(t, "__attrs_attrs__", None)
    if attrs is None:
        return False
    e.fields(b"A", o, (a.name for a in attrs))
    return True


def _probe_pydantic(e: Encoder, o: Any, t: type) -> bool:
    fields = getattr(t, "model_fields", None)
    if not isinstance(fields, dict) or not hasattr(o, "model_dump"):
        return False
    e.fields(b"M", o, fields)
    return True


def _probe_numpy(e: Encoder, o: Any, t: type) -> bool:
    np = sys.modules.get("numpy")
    if np is None:
        return False
    if isinstance(o, np.ndarray):
        if t is not np.ndarray:
            e.record_type(b"S", t)
        dtype = o.dtype
        e.text(b"x", _dtype_text(dtype))
        e.encode(o.shape)
        if dtype.hasobject:
            if e.enter(o):  # an object array may hold itself
                try:
                    e.encode(o.tolist())
                finally:
                    e.leave(o)
        else:
            # a plain ndarray (subclasses' own view/reshape may misbehave), copied only
            # when not C-contiguous
            data = np.ascontiguousarray(o)
            e.raw(b"b", data.reshape(-1).view(np.uint8))
        ma = sys.modules.get("numpy.ma")
        if ma is not None and isinstance(o, ma.MaskedArray):
            e.encode(ma.getmaskarray(o))
            e.encode(o.fill_value)
        return True
    if isinstance(o, np.generic):
        e.text(b"X", _dtype_text(o.dtype))
        if o.dtype.hasobject:
            e.encode(o.item())
        else:
            e.raw(b"b", o.tobytes())
        return True
    return False


def _dtype_text(dtype: Any) -> str:
    """A numpy dtype as text; a structured dtype with its field names and formats."""
    return str(dtype.descr) if dtype.fields is not None else str(dtype.str)


def _probe_pandas(e: Encoder, o: Any, t: type) -> bool:
    pd = sys.modules.get("pandas")
    if pd is None:
        return False
    if isinstance(o, pd.DataFrame):
        e.record_type(b"p", t)
        e.encode([str(c) for c in o.dtypes])
        e.encode(o.columns)
        e.encode(o.index)
        for i in range(o.shape[1]):  # by position: column names may repeat
            _pandas_values(e, o.iloc[:, i])
        return True
    if isinstance(o, pd.Series):
        e.record_type(b"p", t)
        e.text(b"s", str(o.dtype))
        e.encode(o.name)
        e.encode(o.index)
        _pandas_values(e, o)
        return True
    if isinstance(o, pd.Index):
        e.record_type(b"p", t)
        e.text(b"s", str(o.dtype))
        e.encode(list(o.names))
        _pandas_values(e, o)
        return True
    if isinstance(o, (pd.Timestamp, pd.Timedelta)):
        # nanoseconds count (a datetime would drop them); the zone is part of the value
        e.record_type(b"p", t)
        e.encode(int(o.value))
        e.encode(str(getattr(o, "tz", None)))
        return True
    if o is pd.NaT or o is pd.NA:
        e.record_type(b"p", t)
        return True
    if isinstance(o, pd.Period):
        e.record_type(b"p", t)
        e.encode((str(o), o.freqstr))
        return True
    return False


def _pandas_values(e: Encoder, o: Any) -> None:
    """The values of a Series or Index; a categorical's categories and order count too."""
    cat = getattr(o, "cat", None) if str(o.dtype) == "category" else None
    if cat is not None:
        e.encode(cat.categories)
        e.encode(bool(cat.ordered))
        e.encode(cat.codes.to_numpy())
        return
    e.encode(o.to_numpy())


def _probe_callable(e: Encoder, o: Any, t: type) -> bool:
    from ._fingerprint import fingerprint_of

    if isinstance(o, types.MethodType):
        # function and instance encoded here, under the cycle guard: an instance may hold
        # its own bound method (self.callback = self.run)
        if e.enter(o):
            try:
                e.typed(b"B", t)
                e.encode(o.__func__)
                e.encode(o.__self__)
            finally:
                e.leave(o)
        return True
    fp = fingerprint_of(o)
    if fp is None:
        return False
    e.text(b"L", fp)
    return True


_CONTAINERS = (tuple, list, dict, set, frozenset)


def _probe_builtin_subclass(e: Encoder, o: Any, t: type) -> bool:
    for base in t.__mro__[1:]:
        f = _DISPATCH.get(base)
        if f is None:
            continue
        if not e.enter(o):
            return True
        try:
            e.record_type(b"^", t)
            if isinstance(o, collections.OrderedDict):
                e.encode(list(o.items()))  # order is part of an OrderedDict's value
            elif base in _CONTAINERS:
                f(e, base(o))  # a plain copy: `o` itself is already entered
            else:
                f(e, o)
            # attributes set on the instance, and a defaultdict's factory, are state too
            extra = getattr(o, "__dict__", None)
            e.encode(dict(extra) if extra else None)
            slots = _slot_names(t)
            if slots:  # written only for classes with slots: other digests stay as they were
                e.buf += b"/"
                e.encode({n: v for n in slots if (v := getattr(o, n, _UNSET)) is not _UNSET})
            if isinstance(o, collections.defaultdict):
                e.encode(o.default_factory)
        finally:
            e.leave(o)
        return True
    return False


_SLOTS: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _slot_names(t: type) -> tuple[str, ...]:
    """The instance attributes ``t`` keeps in ``__slots__`` (mangled as Python stores them)."""
    names = _SLOTS.get(t)
    if names is None:
        found: dict[str, None] = {}
        for k in t.__mro__:
            slots = k.__dict__.get("__slots__", ())
            for n in (slots,) if isinstance(slots, str) else slots:
                if n in ("__dict__", "__weakref__"):
                    continue
                if n.startswith("__") and not n.endswith("__"):
                    n = f"_{k.__name__.lstrip('_')}{n}"
                found[n] = None
        names = _SLOTS[t] = tuple(found)
    return names


_DISPATCH_GET = _DISPATCH.get

_PROBES: tuple[Callable[[Encoder, Any, type], bool], ...] = (
    _probe_enum,
    _probe_namedtuple,
    _probe_dataclass,
    _probe_attrs,
    _probe_pydantic,
    _probe_numpy,
    _probe_pandas,
    _probe_callable,
    _probe_builtin_subclass,
)

_HEADER = b"durably/" + str(ENCODING_VERSION).encode() + b"/"


def digest(obj: Any) -> str:
    """The canonical xxh3-128 digest of a value, as 32 hex characters.

    Equal values give equal digests in every process; values that differ in type or content
    differ (``1``, ``1.0``, ``True`` and ``"1"`` all differ). A dataclass, NamedTuple, Enum
    member, attrs or pydantic instance of the user's own class also carries the code of its
    class, so editing one of its methods changes the digest.

    Args:
        obj: Any value durably can digest: builtins, containers, dataclasses, enums, dates,
            paths, numpy arrays, pandas objects, functions, or objects with a
            ``__durably_digest__`` method or a registered encoder.

    Returns:
        32 lowercase hex characters.

    Raises:
        SerializationError: the value (or a part of it) cannot be digested.

    Example:
        >>> import durably
        >>> durably.digest({"a": 1, "b": 2}) == durably.digest({"b": 2, "a": 1})
        True
        >>> durably.digest(1) == durably.digest(1.0)
        False
    """
    e = Encoder()
    e.buf += _HEADER
    e.encode(obj)
    return e.hexdigest()


def encode_arguments(arguments: Mapping[str, Any]) -> str:
    """Digest of bound arguments (name → value), independent of keyword order: one pass,
    one hash."""
    e = Encoder()
    e.buf += _HEADER
    for name in sorted(arguments):
        e.path = name
        e.raw(b"=", name.encode())
        e.encode(arguments[name])
    return e.hexdigest()


def digest_each(arguments: Mapping[str, Any]) -> dict[str, str]:
    """The digest of each argument by name (what ``explain`` compares)."""
    each: dict[str, str] = {}
    for name in sorted(arguments):
        e = Encoder(name)
        e.buf += _HEADER
        e.encode(arguments[name])
        each[name] = e.hexdigest()
    return each
