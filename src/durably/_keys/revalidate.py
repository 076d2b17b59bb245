"""A code fingerprint, and its revalidation on each use.

A :class:`Fingerprint` keeps what it was computed from: every name, attribute, closure cell
and code object the walk read (checked by identity) and the small mutable configuration
values it met (checked by their contents: by pickle, or by digest for values digested by a
hook). See :mod:`durably._keys.fingerprint` for what enters a fingerprint.
"""

from __future__ import annotations

import contextvars
import io
import pickle
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import wrapt
import xxhash

from durably._keys.canonical import _ENCODERS, Encoder
from durably._keys.files import File, file_stamp

__all__ = ["Fingerprint", "Unchecked", "file_stamp", "full_digest", "registry_ids"]

#: stands for a name, attribute or closure cell that was not there when the walk read it
_MISSING = object()
#: a configuration value is checked on each revalidation by its pickle (or its digest) up to
#: this encoded size; a larger one is digested again before each use of the fingerprint.
#: Sizes alone decide, never a clock: the same program checks the same way on every machine
_RECHECK_BYTES = 1 << 16
#: a configuration value larger than this (its encoding, in bytes) is still digested before
#: each call, with a warning (once) that says what that costs and how to avoid it
LARGE_VALUE_BYTES = 64 << 20
# plain values: containers and scalars whose pickle is exact (type and value) and C-fast
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes})
_PLAIN_CONTAINERS = frozenset({dict, list, tuple, set, frozenset})


class _Nested(Protocol):
    def nested(self, obj: Any) -> str | None: ...


# what digests the functions and classes met inside a value being encoded: the walk (see
# _fingerprint.fingerprint_of), or _BY_IDENTITY when a value is digested again to check it
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
#: (value, how, expected[, the bytes how() goes through, for a check of a large value])
_Check = tuple[Any, ...]
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


def _pickle_digest(value: Any) -> str:
    """xxh3-128 of a value's pickle, functions and classes by identity, its large buffers
    (numpy's, pandas') taken out of band and hashed in place, not copied: how a value too
    large to keep its pickle is checked on every call (C-speed: a list of 30,000 objects
    in some 15 ms, where digesting it took half a second)."""
    buffers: list[pickle.PickleBuffer] = []
    f = io.BytesIO()
    _Pickler(f, 5, buffer_callback=buffers.append).dump(value)
    h = xxhash.xxh3_128(f.getbuffer())
    for b in buffers:
        with b.raw() as view:
            h.update(view)
    return str(h.hexdigest())


class _FirstPickler(_Pickler):
    """The first pickle of a value: keeps what it names by identity alive (so an id is never
    reused by a replacement) and notices values digested by a hook. ``buffers``: where its
    large buffers go, out of band (None: in band)."""

    def __init__(self, f: io.BytesIO, keep: list[Any],
                 buffers: list[pickle.PickleBuffer] | None = None) -> None:
        super().__init__(f, 5, buffer_callback=None if buffers is None else buffers.append)
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
    """``how(value)`` when it is small (at most ``_RECHECK_BYTES``), else None: by size
    alone, so whether a value is checked this way never depends on the machine's load."""
    data = how(value)
    if data is None or len(data) > _RECHECK_BYTES:
        return None
    return data


def _check_of(value: Any, keep: list[Any], digest: str | None) -> _Check | None:
    """How to check ``value`` on revalidation, or None when it is too large to check by its
    pickle on every call (it is digested again instead: see :class:`Unchecked`).
    ``digest``: its digest, when that is the check digest (no function or class inside)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if _is_plain(value):
                data = _quick(_plain, value)
                if data is not None:
                    return (value, _plain, data)
            f = io.BytesIO()
            buffers: list[pickle.PickleBuffer] = []
            first = _FirstPickler(f, keep, buffers)
            first.dump(value)
            # stable too: an unchanged value pickles alike (no clock or counter in its state)
            if not first.hooked:
                data = f.getvalue()
                if not buffers and len(data) <= _RECHECK_BYTES:
                    if _pickled(value) == data:
                        return (value, _pickled, data)  # small: its pickle, compared
                else:
                    h = xxhash.xxh3_128(data)
                    size = len(data)
                    for b in buffers:
                        with b.raw() as view:
                            h.update(view)
                            size += view.nbytes
                    expected = str(h.hexdigest())
                    if _pickle_digest(value) == expected:  # large: its pickle's digest
                        return (value, _pickle_digest, expected, size)
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


class _AsWalked:
    """Functions and classes inside a configuration value, given the digests the walk that
    took the fingerprint gave them (by identity); one it did not meet stands for a change."""

    __slots__ = ("met",)

    def __init__(self, met: dict[int, str]) -> None:
        self.met = met

    def nested(self, obj: Any) -> str | None:
        if not isinstance(
            obj, (wrapt.FunctionWrapper, wrapt.BoundFunctionWrapper, types.FunctionType, type)
        ):
            return None
        return self.met.get(id(obj), f"new:{id(obj):x}")


def _encoded(value: Any, nested: _Nested | None) -> Encoder:
    """``value`` encoded, functions and classes inside it by ``nested`` (by identity when
    None)."""
    e = Encoder()
    token = _WALKING.set(nested or _BY_IDENTITY)
    try:
        e.encode(value)
    finally:
        _WALKING.reset(token)
    return e


class Unchecked:
    """A configuration value too large to check by its pickle on every call: checked by
    identity, and by its full digest before each key is made and before a result is cached
    (see :meth:`Fingerprint.changed_in_place`)."""

    __slots__ = ("digest", "met", "name", "size", "stamp", "value")

    def __init__(self, value: Any, name: str, met: dict[int, str], digest: str,
                 size: int, stamp: Any = None) -> None:
        self.value, self.name = value, name
        self.met = met  # the digests the walk gave the functions and classes inside, by id
        self.digest = digest  # its digest when the fingerprint was taken
        self.size = size  # bytes of its encoding (what digesting it again costs)
        #: a durably.file(): its os.stat() when digested (a stat on every call tells whether
        #: it may have changed; its contents are read again only then)
        #: (``stamp``: the one taken before the walk read it; a later write then shows)
        self.stamp = (stamp or file_stamp(value)) if isinstance(value, File) else None


def full_digest(value: Any, nested: _Nested | None = None) -> str:
    """The digest of a configuration value however large, as the encoder gives it (cached
    properties left out), functions and classes inside it by ``nested`` (by identity when
    None): compared when a value too large or too slow to check on every call is checked
    before a result is cached (see :meth:`Fingerprint.changed_in_place`)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _encoded(value, nested).hexdigest()


def registry_ids(registry: Mapping[Any, Any]) -> tuple[tuple[int, int], ...]:
    """Which implementation each type has in a ``functools.singledispatch`` registry, by
    identity: an overload registered or redefined after the fingerprint was taken changes
    it (the implementations' code counts through the walk that read them)."""
    return tuple((id(k), id(v)) for k, v in registry.items())


def _digest_again(value: Any, nested: _Nested | None = None) -> str | None:
    e = _encoded(value, nested)
    if e.hasher is not None or len(e.buf) > _RECHECK_BYTES:
        return None
    return e.hexdigest()


class Fingerprint:
    """A function's code fingerprint with what it was computed from."""

    __slots__ = ("_attrs", "_checks", "_functions", "_functions_only", "_globals", "_keep",
                 "changed_by", "digest", "files", "large", "unchecked")

    def __init__(
        self,
        digest: str,
        globals_: list[tuple[Mapping[str, Any], str, Any]],
        attrs: list[tuple[Any, str, Any]],
        parts: dict[str, str],
        checks: list[_Check] | None = None,
        keep: list[Any] | None = None,
        functions: list[tuple[Any, Any, Any, Any]] | None = None,
        unchecked: list[Unchecked] | None = None,
    ) -> None:
        self.digest = digest
        #: configuration values too large or too slow to check on every call: checked
        #: before a result is cached (see changed_in_place)
        self.unchecked = unchecked or []
        self._globals = globals_
        # each function's code, defaults and keyword defaults, compared in one condition (the
        # test of every call of a task); other attributes (closure cells) one by one
        self._functions = functions or []
        self._attrs = attrs
        self._checks = _grouped(checks or [])  # small mutable configuration values
        # only functions to check (a task that uses no globals, cells or configuration):
        # valid() looks at nothing else
        self._functions_only = not (self._globals or self._attrs or self._checks)
        #: the durably.file() values it depends on, however nested (set by the walk): a
        #: file edited while a step runs keeps that step's result out of the cache
        self.files: list[tuple[File, Any]] = []  # (with its stamp from before the walk read it)
        self._keep = keep  # objects whose ids the checks rely on
        #: (name, bytes) of the values checked by the digest of their pickle on every call
        #: (over 64 KiB): what a call pays for them (see Spec._warn_large)
        self.large: list[tuple[str, int]] = []
        #: digest of each user function or class it depends on, by qualified name
        self.changed_by = parts

    def valid(self) -> bool:
        """True while every name, cell and code object it was computed from is unchanged
        (by identity) and every small mutable configuration value has the same contents."""
        for f, code, defaults, kwdefaults in self._functions:
            if (f.__code__ is not code or f.__defaults__ is not defaults
                    or f.__kwdefaults__ is not kwdefaults):
                return False
        if self._functions_only:
            return True
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

    def changed_in_place(self) -> Unchecked | None:
        """The record of a configuration value too large to check by its pickle on every
        call whose contents changed since the fingerprint was taken: an in-place edit
        (``DF.loc[0, "a"] = 1``, ``ITEMS[0].w = 100``) the identity checks do not show.
        Every such value is digested again, whatever its size and however long that takes
        (the decision never depends on a clock or the machine's load); a
        :func:`durably.file` only when ``os.stat`` says it changed (its size, times or
        inode). None if none changed."""
        for u in self.unchecked:
            if isinstance(u.value, File):
                stamp = file_stamp(u.value)
                if stamp is not None and stamp == u.stamp:
                    continue  # not touched since it was digested
                u.stamp = stamp
            try:
                now: str | None = full_digest(u.value, _AsWalked(u.met))
            except Exception:  # noqa: BLE001 - gone, unreadable or no longer digestible
                now = None
            if now != u.digest:
                return u
        return None


def _grouped(checks: list[_Check]) -> list[_Check]:
    """The checks, with all plain values in one pickle and all other pickled ones in another:
    one pickler per revalidation instead of one per value."""
    out = [c[:3] for c in checks if c[1] is not _plain and c[1] is not _pickled]
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
