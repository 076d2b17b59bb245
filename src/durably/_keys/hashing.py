"""Digests built on the canonical encoding: of a value, of a call's bound arguments, and
the tracer's.

:func:`digest` is the xxh3-128 digest of a value's canonical encoding (written by the
:class:`~durably._keys.canonical.Encoder`). A call's arguments are digested in one pass, as
one hash, independent of keyword order (:func:`encode_arguments`), with short paths for
arguments that are all small scalars (the common call, written without an Encoder); the
digest of each argument (what ``explain`` compares), the tracer's data-flow digests and the
digests of the code of the user classes met are taken in that same pass where the encoding
allows. When a value cannot be digested, :func:`locate_undigestable` says where in an
argument it sits.

The encoding itself is in :mod:`durably._keys.canonical`, how each type is written in
:mod:`durably._keys.encoders`, the code of record classes in :mod:`durably._keys.class_code`.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import islice
from typing import Any

import xxhash

from durably._keys.canonical import _DISPATCH_GET, _ENTANGLED, _HEADER, Encoder, too_common
from durably._keys.encoders import (
    _LARGE,
    _NAN,
    _pack_d,
    _pack_Q,
    _pack_q,
    type_path,
)
from durably.exceptions import SerializationError

__all__ = [
    "digest",
    "digest_each",
    "encode_arguments",
    "type_path",
]

#: containers longer than this are not searched for the tracer's data-flow edges
MAX_FLOW_ELEMENTS = 10_000
#: the elements of a list, tuple or dict result whose digests the tracer keeps (the first)
MAX_RESULT_ELEMENTS = 1_000


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
    try:
        e.encode(obj)
    except RecursionError:
        raise _too_deep(e) from None
    return e.hexdigest()


def locate_undigestable(name: str, value: Any, limit: int = 10_000) -> str | None:
    """Where in an argument the value that cannot be digested sits, as Python would write it
    (``rows[1]['lock']``, ``rows[3].lock``): see :func:`locate_part`, searching for the
    first part whose digest fails. None when the argument itself is that value, or when
    nothing is found. Only for an error message: it digests the parts again."""

    def digests(v: Any) -> None:
        Encoder(quiet=True).encode(v)

    return locate_part(name, value, digests, limit)


#: keys of a dict never searched (they pickle and digest)
_PLAIN_KEYS = (str, int, float, bytes, bool, type(None))


def locate_part(name: str, value: Any, check: Callable[[Any], object],
                limit: int = 10_000) -> str | None:
    """The path, as Python would write it, from ``value`` (called ``name``) to the first part
    of it that ``check`` raises on: ``rows[1]['lock']``, ``result.client.lock``,
    ``list(tags)[0]`` (an element of a set, or a dict's key). Searched depth first through
    lists, tuples (a NamedTuple's fields by name), dicts, sets and objects' attributes
    (``__dict__`` and slots; not those of classes, modules and functions), into the first
    part that fails, checking at most ``limit`` parts. None when ``value`` itself is that
    part (none of its parts fails alone), or when nothing is found. For error messages
    only: it runs ``check`` again on the parts.

    Example:
        >>> def check(v):  # (fails on "bad" and on what holds it)
        ...     if "bad" in repr(v):
        ...         raise ValueError(v)
        >>> locate_part("rows", [{"a": 1}, {"a": "bad"}], check)
        "rows[1]['a']"
    """
    visited = 0
    inside: set[int] = set()  # (a value that holds itself is searched once)

    def fails(v: Any) -> bool:
        try:
            check(v)
        except Exception:  # noqa: BLE001 - what failed is what is searched for
            return True
        return False

    def parts(v: Any, path: str) -> Any:
        fields = getattr(v, "_fields", None) if isinstance(v, tuple) else None
        if isinstance(v, dict):
            for i, (k, x) in enumerate(list(v.items())):
                yield f"{path}[{k!r}]", x
                if not isinstance(k, _PLAIN_KEYS):
                    yield f"list({path})[{i}]", k
        elif isinstance(fields, tuple):  # a NamedTuple: its fields by name
            for i, x in enumerate(v):
                field = fields[i] if i < len(fields) else None
                yield (f"{path}.{field}" if isinstance(field, str) else f"{path}[{i}]"), x
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                yield f"{path}[{i}]", x
        elif isinstance(v, (set, frozenset)):
            for i, x in enumerate(list(v)):
                yield f"list({path})[{i}]", x
        elif not isinstance(v, (type, types.ModuleType, types.FunctionType)):
            for attribute, x in _attributes(v):
                yield f"{path}.{attribute}", x

    def search(v: Any, path: str) -> str | None:
        nonlocal visited
        inside.add(id(v))
        for where, x in parts(v, path):
            visited += 1
            if visited > limit:
                return None
            if id(x) in inside:
                continue  # the value itself again (a cycle): searched already
            if fails(x):
                return search(x, where) or where
        return None

    try:
        return search(value, name)
    except Exception:  # noqa: BLE001 - a part that cannot be read (RecursionError too)
        return None


def _attributes(v: Any) -> list[tuple[str, Any]]:
    """An object's attributes: its ``__dict__``, then its slots (``__x`` by its mangled
    name)."""
    found: list[tuple[str, Any]] = []
    state = getattr(v, "__dict__", None)
    if isinstance(state, dict):
        found.extend((k, x) for k, x in list(state.items()) if isinstance(k, str))
    names = {k for k, _ in found}
    missing = object()
    for klass in type(v).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if not isinstance(slot, str) or slot in ("__dict__", "__weakref__"):
                continue
            if slot.startswith("__") and not slot.endswith("__"):
                slot = f"_{klass.__name__.lstrip('_')}{slot}"
            if slot not in names:
                x = getattr(v, slot, missing)
                if x is not missing:
                    found.append((slot, x))
                    names.add(slot)
    return found


def trace_digest(obj: Any) -> str:
    """The digest of a value for the tracer's data-flow edges, or "" when the value cannot
    be digested or is too common to mean a flow (see ``too_common``). Never warns or
    raises."""
    if too_common(obj):
        return ""
    e = Encoder(quiet=True)
    e.buf += _HEADER
    try:
        e.encode(obj)
    except Exception:  # noqa: BLE001 - the tracer must never fail a step (RecursionError too)
        return ""
    return e.hexdigest()


def trace_digests(obj: Any) -> tuple[str, tuple[str, ...]]:
    """:func:`trace_digest` of a value, and for a list, tuple (a ``NamedTuple`` too: a
    result unpacked, ``a, b = step()``, before it is passed on) or exact dict the
    ``trace_digest`` of each of its first ``MAX_RESULT_ELEMENTS`` elements (the dict's
    values, in its order; "" for one too common to mean a flow), cut to their first 16 hex
    digits (what the tracer compares): the digests a result offers the tracer, so that a
    later step given one of its elements is drawn as receiving it (a fan-out). Taken in the
    same pass where the encoding allows (see :meth:`Encoder.element`). Never warns or
    raises."""
    if too_common(obj):
        return "", ()
    t = type(obj)
    if not (t is list or t is tuple or t is dict):
        if isinstance(obj, (tuple, list)):  # a NamedTuple, a list subclass: unpacked
            whole = trace_digest(obj)       # (a, b = step()) as a tuple is
            if not whole:
                return "", ()
            first = islice(obj, MAX_RESULT_ELEMENTS)
            return whole, tuple(trace_digest(item)[:16] for item in first)
        return trace_digest(obj), ()
    if len(obj) > MAX_RESULT_ELEMENTS:  # the first ones alone (a bounded cost and size)
        whole = trace_digest(obj)
        if not whole:
            return "", ()
        first = islice(obj.values() if t is dict else obj, MAX_RESULT_ELEMENTS)
        return whole, tuple(trace_digest(item)[:16] for item in first)
    e = Encoder(quiet=True)
    e.buf += _HEADER
    e.collect = obj
    try:
        e.encode(obj)
        whole = e.hexdigest()
    except Exception:  # noqa: BLE001 - the tracer must never fail a step (RecursionError too)
        return "", ()
    items = list(obj.values() if t is dict else obj)
    taken = e.elements if e.elements is not None and len(e.elements) == len(items) else None
    if taken is None:
        return whole, tuple(trace_digest(item)[:16] for item in items)
    return whole, tuple((trace_digest(item) if d is None else d)[:16]
                        for item, d in zip(items, taken, strict=True))


def _too_deep(e: Encoder) -> SerializationError:
    return SerializationError(
        f"cannot digest {e.where()}: it is nested too deeply (Python's recursion limit was "
        "reached). Fix: flatten the structure, give its type a __durably_digest__ method "
        "that returns a flat summary, or leave the argument out of the cache key with "
        f"ignore=({e.path or 'name'!r},)."
    )


_NAMES: dict[str, bytes] = {}  # an argument name -> its encoding (what raw(b"=", name) writes)


def encode_arguments(arguments: Mapping[str, Any], each: dict[str, str] | None = None,
                     elements: dict[str, list[str | None]] | None = None,
                     classes: dict[str, str] | None = None) -> str:
    """Digest of bound arguments (name → value), independent of keyword order: one pass,
    one hash.

    ``each``, when given, receives digests :func:`digest_each` would return, taken in the
    same pass, of the arguments whose encoding costs more than hashing it (lists, dicts,
    strings: encoding them again would double the work). It stays without the others:
    small scalars (when every argument is one, ``each`` stays empty) and arguments holding
    a buffer over 1 MiB (an array: its second hash costs what a second encoding does).
    Pass it to :func:`digest_each` as ``known``. ``elements``, given with ``each``, receives the
    tracer's digests of the elements of list, tuple and dict arguments, where taken in the
    pass (see :meth:`Encoder.element`): pass it to ``flow_digests``. ``classes``, when
    given, receives the digest of the code of each user class the arguments' values were
    digested with (:func:`class_digests`), for the key record that ``explain`` reads."""
    # arguments that are all small scalars (the common call) are written here, without an
    # Encoder: the same bytes as the Encoder writes (_general_arguments; a test pins it)
    names = sorted(arguments)
    buf = bytearray(_HEADER)
    for name in names:
        head = _NAMES.get(name)
        if head is None:
            break
        value = arguments[name]
        t = type(value)
        if t is int:
            if not -(1 << 63) <= value < (1 << 63):
                break
            buf += head
            buf += b"i"
            buf += _pack_q(value)
        elif t is str:
            raw = value.encode("utf-8", "surrogatepass")
            if len(raw) >= _LARGE:
                break
            buf += head
            buf += b"s"
            buf += _pack_Q(len(raw))
            buf += raw
        elif t is float:
            buf += head
            buf += b"f"
            buf += _NAN if value != value else _pack_d(value)
        elif value is None:
            buf += head
            buf += b"N"
        elif t is bool:
            buf += head
            buf += b"T" if value else b"F"
        elif t is tuple or t is list:
            part = _scalar_sequence(value)
            if part is None:
                break
            buf += head
            buf += part
        else:
            break
    else:
        return xxhash.xxh3_128_hexdigest(bytes(buf))
    # the rest on the general path, after what is written (the first names are not redone)
    start = names.index(name)
    if each is None:
        return _encode_from(arguments, names, start, buf, classes=classes)
    written = bytes(buf)
    try:
        return _encode_from(arguments, names, start, buf, each, elements, classes)
    except RecursionError:
        # the taps' frames took the last levels Python allows: encoded again without them
        # (the digests of each are then taken alone, as before taps)
        each.clear()
        if elements is not None:
            elements.clear()
        return _encode_from(arguments, names, start, bytearray(written), classes=classes)


def _scalar_sequence(value: tuple[Any, ...] | list[Any]) -> bytes | None:
    """The encoding of a short tuple or list whose items are all small scalars (``(64, 32)``,
    ``["a", "b"]``): what the Encoder writes for it, without one; None for anything else."""
    if len(value) > 32:
        return None
    out = bytearray(b"(" if type(value) is tuple else b"[")
    out += _pack_Q(len(value))
    for item in value:
        t = type(item)
        if t is int:
            if not -(1 << 63) <= item < (1 << 63):
                return None
            out += b"i"
            out += _pack_q(item)
        elif t is str:
            raw = item.encode("utf-8", "surrogatepass")
            if len(raw) >= _LARGE:
                return None
            out += b"s"
            out += _pack_Q(len(raw))
            out += raw
        elif t is float:
            out += b"f"
            out += _NAN if item != item else _pack_d(item)
        elif item is None:
            out += b"N"
        elif t is bool:
            out += b"T" if item else b"F"
        else:
            return None
    return bytes(out)


#: how :func:`encode_positional` writes one argument: its index in the call's arguments, its
#: name's encoding, and that followed by each scalar's type tag (int, float, str, None, True,
#: False), so that an argument is written in one concatenation
PlanEntry = tuple[int, bytes, bytes, bytes, bytes, bytes, bytes, bytes]


def positional_plan(names: Sequence[str], ignore: Collection[str] = ()
                    ) -> tuple[PlanEntry, ...] | None:
    """How :func:`encode_positional` writes the arguments of a function whose parameters
    are ``names`` (all given by position), ``ignore`` left out: a :data:`PlanEntry` for each,
    in the order :func:`encode_arguments` writes them (sorted by name). None for a name too
    long for that path."""
    plan = []
    for name in sorted(set(names) - set(ignore)):
        raw = name.encode()
        if len(raw) >= _LARGE:
            return None
        head = b"=" + len(raw).to_bytes(8, "little") + raw
        plan.append((names.index(name), head, head + b"i", head + b"f", head + b"s",
                     head + b"N", head + b"T", head + b"F"))
    return tuple(plan)


def encode_positional(plan: tuple[PlanEntry, ...], args: Sequence[Any]) -> str | None:
    """``encode_arguments(dict(zip(names, args)))`` for arguments given by position
    (``plan`` from :func:`positional_plan`) when all of them are small scalars (the same
    bytes, without building the dict); else None: the caller takes the general path.

    Its loop is encode_arguments' short path written out again, not shared: a helper call
    per argument costs the replayed step and the cache hit about 1 %. The property tests
    hold both (and _scalar_sequence) to the general Encoder's bytes. (Bytes concatenated,
    not a bytearray: a call has few arguments, and this is about 40 % faster for them.)"""
    out = _HEADER
    for index, head, as_int, as_float, as_str, as_none, as_true, as_false in plan:
        value = args[index]
        t = type(value)
        if t is int:
            if not -(1 << 63) <= value < (1 << 63):
                return None
            out += as_int + _pack_q(value)
        elif t is str:
            raw = value.encode("utf-8", "surrogatepass")
            if len(raw) >= _LARGE:
                return None
            out += as_str + _pack_Q(len(raw)) + raw
        elif t is float:
            out += as_float + (_NAN if value != value else _pack_d(value))
        elif value is None:
            out += as_none
        elif t is bool:
            out += as_true if value else as_false
        elif t is tuple or t is list:
            part = _scalar_sequence(value)
            if part is None:
                return None
            out += head + part
        else:
            return None
    return xxhash.xxh3_128_hexdigest(out)


def _general_arguments(arguments: Mapping[str, Any]) -> str:
    """:func:`encode_arguments` for arguments of any type, all on the general path."""
    return _encode_from(arguments, sorted(arguments), 0, bytearray(_HEADER))


def _encode_from(arguments: Mapping[str, Any], names: list[str], start: int,
                 buf: bytearray, each: dict[str, str] | None = None,
                 elements: dict[str, list[str | None]] | None = None,
                 classes: dict[str, str] | None = None) -> str:
    """Encode the arguments ``names[start:]`` after ``buf`` (the header and the arguments
    before them, as :func:`encode_arguments` writes them) and return the digest of it all;
    with ``each``, put in it the digests of those arguments :func:`digest_each` would
    return: each argument's bytes also go to a hasher of its own (the encoder's tap),
    after the header digest_each writes, unless it holds a buffer over 1 MiB (see
    :meth:`Encoder.raw`). With ``elements`` too, the :func:`trace_digest` of each element
    of a list, tuple or dict argument with str keys (the tracer's flow digests), the same
    way (:meth:`Encoder.element`)."""
    e = Encoder()
    e.buf = buf
    dispatch = _DISPATCH_GET
    try:
        for name in names[start:]:
            e.path = name
            head = _NAMES.get(name)
            if head is None:
                raw = name.encode()
                head = b"=" + len(raw).to_bytes(8, "little") + raw
                if len(raw) >= _LARGE:  # never a real name; kept on the general path
                    e.raw(b"=", raw)
                    head = b""
                elif len(_NAMES) < 4096:
                    _NAMES[name] = head
            buf += head
            value = arguments[name]
            if each is not None:
                tap = [xxhash.xxh3_128(_HEADER), len(buf)]
                e.taps.append(tap)
                t = type(value)
                if elements is not None and (t is list or t is tuple or t is dict) and len(
                        value) <= MAX_FLOW_ELEMENTS:
                    e.collect = value
            f = dispatch(type(value))  # Encoder.encode, inlined
            if f is not None:
                f(e, value)
            else:
                e.other(value)
            if each is not None:
                e.taps.pop()
                digest = e.tapped(tap)
                if digest is not None:
                    each[name] = digest
                if e.elements is not None and elements is not None:
                    elements[name] = e.elements
                e.collect = e.elements = None
    except RecursionError:
        if each is not None:
            raise  # (encode_arguments encodes them again without taps)
        raise _too_deep(e) from None
    if classes is not None and e.codes:
        class_digests(e.codes, classes)
    return e.hexdigest()


def digest_each(arguments: Mapping[str, Any], known: Mapping[str, str] | None = None,
                classes: dict[str, str] | None = None) -> dict[str, str]:
    """The digest of each argument by name (what ``explain`` compares); those in ``known``
    (what :func:`encode_arguments` took in its pass) are taken from it. ``classes``, when
    given, receives the code digests of the user classes met in the arguments encoded here
    (see :func:`class_digests`)."""
    each: dict[str, str] = {}
    for name in sorted(arguments):
        if known and name in known:
            each[name] = known[name]
            continue
        e = Encoder(name)
        e.buf += _HEADER
        try:
            e.encode(arguments[name])
        except RecursionError:
            raise _too_deep(e) from None
        each[name] = e.hexdigest()
        if classes is not None and e.codes:
            class_digests(e.codes, classes)
    return each


#: between a class's path and the name of something its methods use, in class_digests' keys
CLASS_USES = " uses "


def class_digests(codes: Mapping[Any, bytes], into: dict[str, str]) -> None:
    """Put in ``into`` the digest of the code of each user class in ``codes`` (an
    Encoder's: :func:`~durably._keys.class_code.class_code`), by its type path, and of what its
    methods use (``<path> uses <name>``: :func:`~durably._keys.class_code.class_parts`): what a
    key record keeps so that ``explain`` can say an argument differs because its class's
    code changed, and what in it. A class met as a value (a plain object's pickle recipe
    names its class) is there by its fingerprint, with that fingerprint's parts. Classes
    that are not the user's (no code) are left out."""
    from durably._keys.class_code import class_parts
    from durably._keys.fingerprint import class_fingerprint_parts

    plain = []
    for t, code in codes.items():
        if type(t) is tuple:  # (PLAIN_CLASS, cls): a class met as a value, by fingerprint
            plain.append((t[1], code))
        elif code and code[:1] != b"J" and isinstance(t, type) and t is not _ENTANGLED:
            path = type_path(t).decode()
            into[path] = xxhash.xxh3_64_hexdigest(code)
            # and what its methods use (a constant, a helper): named when it changed
            for name, digest in class_parts(t).items():
                into[f"{path}{CLASS_USES}{name}"] = digest
    for t, code in plain:
        path = type_path(t).decode()
        if path in into:  # its instances' record code is there: the record type's own
            continue
        into[path] = xxhash.xxh3_64_hexdigest(code)
        for name, digest in class_fingerprint_parts(t).items():
            if name != path:  # (the class itself: named as the class)
                into[f"{path}{CLASS_USES}{name}"] = digest
