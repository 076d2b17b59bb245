"""Canonical encoding of values and xxh3-128 digests.

The encoding is a byte stream of tagged, length-prefixed parts. It is *canonical*: values that
are equal give equal bytes in every process (dict and set order, ``PYTHONHASHSEED`` and memory
addresses never leak in), and values that differ in type or content give different bytes
(``1``, ``1.0``, ``True`` and ``"1"`` all differ; so do ``-0.0`` and ``0.0``, and arrays of
different dtype or shape). Large buffers (bytes, contiguous numpy arrays) are fed to the hasher
in place, without a copy.

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
import pathlib
import struct
import sys
import types
import uuid
import warnings
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


def register_encoder(cls: type, encoder: Callable[[Any], Any]) -> None:
    """Teach durably how to digest instances of ``cls`` (and its subclasses).

    Args:
        cls: The type to handle.
        encoder: A function of one instance returning a value durably already digests
            (a tuple of fields, a bytes buffer, ...). Equal instances must give equal values.

    Raises:
        DefinitionError: ``cls`` is not a type or ``encoder`` is not callable.

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

    __slots__ = ("active", "buf", "hasher", "path")

    def __init__(self, path: str = "") -> None:
        self.buf = bytearray()
        self.hasher: Any = None
        self.active: dict[int, int] = {}
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

    def fields(self, tag: bytes, obj: Any, names: Any) -> None:
        """A record: its type and (name, value) pairs, in declaration order."""
        if not self.enter(obj):
            return
        try:
            self.typed(tag, type(obj))
            names = list(names)
            self.buf += len(names).to_bytes(8, "little")
            for name in names:
                self.text(b"s", name)
                self.encode(getattr(obj, name))
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
                    self.typed(tag, t)
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
            where = f"argument {self.path!r}" if self.path else "value"
            raise SerializationError(
                f"cannot digest {where}: an object of type {type_path(t).decode()} "
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
    e.text(b"m", o.format)
    e.encode(o.shape)
    e.raw(b"b", o.cast("B") if o.c_contiguous else o.tobytes())


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
        e.encode(o.utcoffset())


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
    e.typed(b"E", t)
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
            e.typed(b"S", t)
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
        e.typed(b"p", t)
        e.encode([str(c) for c in o.dtypes])
        e.encode(o.columns)
        e.encode(o.index)
        for i in range(o.shape[1]):  # by position: column names may repeat
            _pandas_values(e, o.iloc[:, i])
        return True
    if isinstance(o, pd.Series):
        e.typed(b"p", t)
        e.text(b"s", str(o.dtype))
        e.encode(o.name)
        e.encode(o.index)
        _pandas_values(e, o)
        return True
    if isinstance(o, pd.Index):
        e.typed(b"p", t)
        e.text(b"s", str(o.dtype))
        e.encode(list(o.names))
        _pandas_values(e, o)
        return True
    if isinstance(o, (pd.Timestamp, pd.Timedelta)):
        # nanoseconds count (a datetime would drop them); the zone is part of the value
        e.typed(b"p", t)
        e.encode(int(o.value))
        e.encode(str(getattr(o, "tz", None)))
        return True
    if o is pd.NaT or o is pd.NA:
        e.typed(b"p", t)
        return True
    if isinstance(o, pd.Period):
        e.typed(b"p", t)
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
            e.typed(b"^", t)
            if isinstance(o, collections.OrderedDict):
                e.encode(list(o.items()))  # order is part of an OrderedDict's value
            elif base in _CONTAINERS:
                f(e, base(o))  # a plain copy: `o` itself is already entered
            else:
                f(e, o)
            # attributes set on the instance, and a defaultdict's factory, are state too
            extra = getattr(o, "__dict__", None)
            e.encode(dict(extra) if extra else None)
            if isinstance(o, collections.defaultdict):
                e.encode(o.default_factory)
        finally:
            e.leave(o)
        return True
    return False


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
    differ (``1``, ``1.0``, ``True`` and ``"1"`` all differ).

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
