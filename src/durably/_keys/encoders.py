"""How a value of each type is written: the table of exact types, and probes for families
of types.

Builtin scalars, containers, dates, decimals, UUIDs and paths are looked up by their exact
type (:data:`_DISPATCH`). Other values, when no digest hook or registered encoder handles
them, are tried against the probes in order (:data:`_PROBES`): Enum members, NamedTuples,
dataclasses, attrs and pydantic models, numpy and pandas objects, functions and methods,
subclasses of builtins. Each writes through the :class:`~durably._keys.canonical.Encoder` it is
given.
"""

from __future__ import annotations

import collections
import contextlib
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
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from durably._keys.recorded import recorded_module

if TYPE_CHECKING:  # the encoder calls these functions, and they write through it
    from durably._keys.canonical import Encoder

__all__ = ["type_path", "without_cached"]

_LARGE = 1 << 16  # buffers at least this big are hashed in place, not copied into the stream
_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<q").pack
_pack_Q = struct.Struct("<Q").pack
_NAN = _pack_d(float("nan"))
_TYPE_PATHS: dict[type, bytes] = {}
#: with a class of the user's code met as a value (an instance digested by its pickle recipe
#: names its class), the key it is noted under in Encoder.codes: ``(PLAIN_CLASS, cls)``
PLAIN_CLASS = "plain class"
_UNSET = object()


def type_path(t: type) -> bytes:
    """``module.qualname`` of a type, as bytes (cached)."""
    p = _TYPE_PATHS.get(t)
    if p is None:
        p = f"{recorded_module(t.__module__, t.__qualname__)}.{t.__qualname__}".encode()
        _TYPE_PATHS[t] = p
    return p


_CACHED: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()


def _cached_names(t: type) -> frozenset[str]:
    """Names of the ``functools.cached_property`` attributes of ``t`` (their values sit in
    the instance ``__dict__`` once computed, but are derived, not state)."""
    try:
        return _CACHED[t]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable
        return frozenset()
    names = frozenset(
        n for k in t.__mro__ for n, v in vars(k).items()
        if isinstance(v, functools.cached_property)
    )
    with contextlib.suppress(TypeError):
        _CACHED[t] = names
    return names


def without_cached(d: dict[Any, Any], t: type) -> dict[Any, Any]:
    """``d`` (an instance dict of a ``t``) without the values cached by cached_property."""
    names = _cached_names(t)
    if not names or not any(k in names for k in d):
        return d
    return {k: v for k, v in d.items() if k not in names}


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
    if e.collect is o:  # an argument whose elements' digests are wanted
        e.collect = None
        e.each_element(o)
        return
    if len(o) >= 8 and e.strings(o):
        return
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
    base = next((b for b in t.__mro__[1:] if b in _CONTAINERS), None)
    # a dataclass that subclasses dict or list: its content is state too
    e.fields(b"a", o, (f.name for f in dataclasses.fields(o)), None if base is None else base)
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
    e.fields(b"M", o, fields, _pydantic_more)
    return True


def _pydantic_more(o: Any) -> Any:
    """A pydantic model's extra fields (``extra="allow"``) and private attributes; None
    when it has neither (so other models' digests stay as they were)."""
    extra = getattr(o, "__pydantic_extra__", None) or None
    private = getattr(o, "__pydantic_private__", None) or None
    if extra is None and private is None:
        return None
    return (None if extra is None else dict(extra), None if private is None else dict(private))


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
        elif _padded(np, dtype):
            _significant(e, np, np.asarray(o))
        else:
            # a plain ndarray (subclasses' own view/reshape may misbehave), copied only
            # when neither C- nor Fortran-contiguous: a Fortran-ordered one is hashed in
            # place, in its memory's order (its layout tag below says which)
            if o.flags.f_contiguous and not o.flags.c_contiguous:
                data = np.asarray(o).T  # (C-contiguous: the same memory, no copy)
            else:
                data = np.ascontiguousarray(o)
            e.raw(b"b", data.reshape(-1).view(np.uint8))
        if not o.flags.c_contiguous:  # (a C-contiguous array: nothing, its digest as it was)
            layout = _layout(o)
            if layout is not None:
                e.buf += b"+"
                e.encode(("layout", layout))
        ma = sys.modules.get("numpy.ma")
        if ma is not None and isinstance(o, ma.MaskedArray):
            e.encode(np.asarray(ma.getmaskarray(o), order="C"))  # (the data's layout counted)
            e.encode(o.fill_value)
        elif t is not np.ndarray and not isinstance(o, np.memmap):
            # attributes of a subclass instance (a Quantity's unit) are state too
            extra = getattr(o, "__dict__", None)
            if extra:
                extra = without_cached(extra, t)
            if extra and e.enter(o):
                try:
                    e.buf += b"+"
                    e.encode(dict(extra))
                finally:
                    e.leave(o)
        return True
    if isinstance(o, np.generic):
        e.text(b"X", _dtype_text(o.dtype))
        if o.dtype.hasobject:
            e.encode(o.item())
        elif _padded(np, o.dtype):
            _significant(e, np, np.asarray(o))
        else:
            e.raw(b"b", o.tobytes())
        return True
    return False


def _layout(a: Any) -> str | tuple[int, ...] | None:
    """The memory order of an array that is not C-contiguous, as far as code can observe it:
    the order in which ``ravel(order="K")`` (and ``copy(order="K")``, ufuncs' outputs)
    visit its elements, and whether ``order="A"`` means Fortran order. ``"F"`` for a
    Fortran-contiguous array; else the axes (of length > 1) slowest first when that is not
    C order (a transposed view); None when its elements are visited in C order (a slice
    such as ``a[:, ::2]`` or ``a[::-1]``), which its C-ordered copy shares.

    The axes are sorted as numpy's iterator sorts them for ``order="K"``: by decreasing
    absolute stride, stable, an axis of stride 0 or of length 1 never moving another."""
    if a.flags.f_contiguous:
        return "F"
    shape, strides = a.shape, a.strides
    perm: list[int] = []
    for axis in range(len(shape)):  # insertion sort, as numpy's nditer does
        stride = abs(strides[axis])
        pos = len(perm)
        for i in range(len(perm) - 1, -1, -1):
            other = abs(strides[perm[i]])
            if stride == 0 or other == 0 or shape[axis] == 1 or shape[perm[i]] == 1:
                continue  # (no order between them: look further)
            if stride <= other:
                break
            pos = i
        perm.insert(pos, axis)
    order = tuple(axis for axis in perm if shape[axis] > 1)
    return None if order == tuple(sorted(order)) else order


_X87: bool | None = None


def _is_x87(np: Any, dtype: Any) -> bool:
    """A native long double (or its complex) that is x87 80-bit extended precision, stored
    with padding bytes whose content is undefined."""
    global _X87
    if _X87 is None:
        _X87 = int(np.finfo(np.longdouble).nmant) == 63 and np.dtype(np.longdouble).itemsize > 10
    return _X87 and bool(dtype == np.dtype(np.longdouble) or dtype == np.dtype(np.clongdouble))


def _padded(np: Any, dtype: Any) -> bool:
    """Whether values of ``dtype`` hold bytes that are not part of the value (alignment
    padding of a structured dtype, the unused bytes of an x87 long double)."""
    if dtype.subdtype is not None:
        return _padded(np, dtype.subdtype[0])
    if dtype.fields is None:
        return _is_x87(np, dtype)
    end = 0
    for name in dtype.names:
        sub, offset = dtype.fields[name][:2]
        if offset != end or _padded(np, sub):
            return True
        end = offset + sub.itemsize
    return bool(end != dtype.itemsize)


def _significant(e: Encoder, np: Any, a: Any) -> None:
    """The value bytes of an array whose dtype holds padding: field by field, and of an x87
    long double only its 10 significant bytes."""
    dtype = a.dtype
    if dtype.fields is not None:
        e.buf += b"{"
        for name in dtype.names:
            e.encode(np.ascontiguousarray(a[name]))
        return
    if dtype.subdtype is not None:  # a subarray dtype: its elements
        e.encode(np.ascontiguousarray(a).reshape(a.shape + dtype.shape).view(dtype.base))
        return
    width = dtype.itemsize // (2 if dtype.kind == "c" else 1)
    data = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(-1, width)[:, :10]
    e.raw(b"g", np.ascontiguousarray(data))


def _dtype_text(dtype: Any) -> str:
    """A numpy dtype as text; a structured dtype with its field names and formats."""
    return str(dtype.descr) if dtype.fields is not None else str(dtype.str)


def _probe_pandas(e: Encoder, o: Any, t: type) -> bool:
    pd = sys.modules.get("pandas")
    if pd is None:
        return False
    if isinstance(o, pd.DataFrame):
        e.record_type(b"p", t)
        dtypes = list(o.dtypes)
        np = sys.modules["numpy"]
        kinds = set(dtypes)
        first = dtypes[0] if len(kinds) == 1 and len(dtypes) > 1 else None
        if isinstance(first, np.dtype) and not first.hasobject:
            # one numpy dtype throughout: the block at once, column after column (no copy
            # when the frame holds a single block)
            e.encode((str(first), len(dtypes)))
            e.encode(o.columns)
            e.encode(o.index)
            # (in C order: the frame's block layout is pandas' own, not the frame's value)
            e.encode(np.asarray(np.asarray(o.to_numpy()).T, order="C"))
        else:
            e.encode([str(c) for c in dtypes])
            e.encode(o.columns)
            e.encode(o.index)
            for i in range(o.shape[1]):  # by position: column names may repeat
                _pandas_values(e, o.iloc[:, i])
        _pandas_metadata(e, o)
        return True
    if isinstance(o, pd.Series):
        e.record_type(b"p", t)
        e.text(b"s", str(o.dtype))
        e.encode(o.name)
        e.encode(o.index)
        _pandas_values(e, o)
        _pandas_metadata(e, o)
        return True
    if isinstance(o, pd.Index):
        e.record_type(b"p", t)
        e.text(b"s", str(o.dtype))
        e.encode(list(o.names))
        _pandas_values(e, o)
        if isinstance(o, pd.MultiIndex):
            # the categories (and their order) of categorical levels; None for other levels
            cats = [
                (lv.categories, bool(lv.ordered)) if isinstance(lv, pd.CategoricalIndex) else None
                for lv in o.levels
            ]
            if any(c is not None for c in cats):
                e.buf += b"+"
                e.encode(cats)
        freq = getattr(o, "freqstr", None)  # a DatetimeIndex's or TimedeltaIndex's (shift)
        if freq is not None and not isinstance(o, pd.PeriodIndex):  # (its dtype has it)
            e.buf += b"+"
            e.encode(("freq", freq))
        return True
    if isinstance(o, (pd.Timestamp, pd.Timedelta)):
        # nanoseconds count (a datetime would drop them); the zone is part of the value
        e.record_type(b"p", t)
        e.encode(int(o.value))
        e.encode(str(getattr(o, "tz", None)))
        unit = getattr(o, "unit", "ns")  # its resolution: arithmetic and .value keep it
        if unit != "ns":
            e.buf += b"+"
            e.encode(unit)
        return True
    if o is pd.NaT or o is pd.NA:
        e.record_type(b"p", t)
        return True
    if isinstance(o, pd.Period):
        e.record_type(b"p", t)
        e.encode((str(o), o.freqstr))
        return True
    return False


def _pandas_metadata(e: Encoder, o: Any) -> None:
    """What a DataFrame or Series carries besides its values, when it is not the default:
    ``attrs`` (units, a source: code may read them) and ``flags`` (duplicate labels refused).
    Nothing is written for the defaults, so such frames keep the digests they had."""
    attrs = getattr(o, "attrs", None)
    if attrs:
        e.buf += b"+"
        e.encode(("attrs", dict(attrs)))
    flags = getattr(o, "flags", None)
    if flags is not None and not getattr(flags, "allows_duplicate_labels", True):
        e.buf += b"+"
        e.encode(("flags", "no duplicate labels"))


def _pandas_values(e: Encoder, o: Any) -> None:
    """The values of a Series or Index; a categorical's categories and order count too."""
    if str(o.dtype) == "category":
        # a Series has .cat; a CategoricalIndex has the same attributes itself
        cat = getattr(o, "cat", o)
        e.encode(cat.categories)
        e.encode(bool(cat.ordered))
        e.encode(sys.modules["numpy"].asarray(cat.codes))
        return
    e.encode(o.to_numpy())


def _probe_callable(e: Encoder, o: Any, t: type) -> bool:
    from durably._keys.fingerprint import fingerprint_of

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
    if isinstance(o, type) and "@" not in fp:  # (a library's class: "module.name@version")
        # a class of the user's code (an instance digested by its pickle recipe names it):
        # noted for explain, which names it when its code changed (see class_digests)
        e.codes[(PLAIN_CLASS, o)] = fp.encode()
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
            if extra:
                extra = without_cached(extra, t)
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
