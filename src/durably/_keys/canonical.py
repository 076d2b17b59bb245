"""The canonical encoding of values: the :class:`Encoder`, and :func:`register_encoder`.

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

This module is the encoder itself (how it writes, walks containers, detects cycles, falls
back to a value's pickle recipe) and the registry of users' encoders; it is apart from the
digests built on it (:mod:`durably._keys.hashing`: of a value, of a call's arguments, the
tracer's), which are the entry points of the hot path. How each type is written is in
:mod:`durably._keys.encoders`, the code of record classes in :mod:`durably._keys.class_code`.
"""

from __future__ import annotations

import array
import copyreg
import struct
import sys
import warnings
from collections.abc import Callable, Mapping
from itertools import chain, repeat
from typing import Any

import xxhash

from durably._keys.encoders import (
    _DISPATCH,
    _LARGE,
    _PROBES,
    _pack_q,
    type_path,
    without_cached,
)
from durably._keys.recorded import recorded_module
from durably.exceptions import SerializationError

__all__ = ["ENCODING_VERSION", "Encoder", "register_encoder"]

#: Version of the canonical encoding; part of every digest.
ENCODING_VERSION = 1

_ONLY_STR = {str}
_pack_sQ = struct.Struct("<cQ").pack  # a str's tag and length, as _str writes them
_ONLY_INT = {int}
_BIG_ENDIAN = sys.byteorder == "big"
_ENCODERS: dict[type, Callable[[Any], Any]] = {}
_WARNED: set[type] = set()


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
    from durably.exceptions import DefinitionError

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


class Encoder:
    """Writes the canonical encoding of values into an xxh3-128 hasher.

    Small parts are gathered in a bytearray; large buffers are flushed straight to the hasher.
    ``path`` names the argument being encoded, for error messages. (``trace_digest`` below is
    :func:`durably._keys.hashing.trace_digest`.)
    """

    __slots__ = ("active", "buf", "codes", "collect", "cycles", "elements", "hashed", "hasher",
                 "path", "quiet", "taps")

    def __init__(self, path: str = "", quiet: bool = False) -> None:
        self.quiet = quiet  # no warnings (the tracer digests results, not cache keys)
        self.buf: bytearray = bytearray()
        self.hasher: Any = None
        self.hashed = 0  # bytes given to ``hasher`` so far (with ``buf``'s: the encoding's size)
        #: more hashers, each fed what is written from ``buf[start]`` on: ``[hasher, start]``
        #: (an argument's bytes, and one of its elements', for their own digests in the same
        #: pass: see hashing._encode_from); a hasher is None once a buffer over 1 MiB went by
        self.taps: list[list[Any]] = []
        #: the container whose elements' digests are wanted (an argument: the tracer's flow
        #: digests), and where they go: one per element, in iteration order, "" for a
        #: value too common to mean a flow, None where none was taken (see element)
        self.collect: Any = None
        self.elements: list[str | None] | None = None
        self.cycles = 0  # back-references written (the bytes of an element then depend on
        # where it is encoded: its digest is not taken in the pass)
        self.active: dict[int, int] = {}
        #: class code of each record type met (see class_code), and the fingerprint of each
        #: class of the user's code met as a value, under ``(PLAIN_CLASS, cls)``
        self.codes: dict[Any, bytes] = {}
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
            self.flush()
            self.hasher.update(data)
            self.hashed += n
            if n > _TAP_LARGEST:
                # no tap past a very large buffer (an array): hashing it again in this pass
                # would cost what digesting its argument again does, when that is asked for
                # (never on a hit); a smaller one (a long tool output in a list of messages)
                # costs less than encoding the rest of its argument again
                for tap in self.taps:
                    tap[0] = None
            else:
                self.feed_taps(data)
        else:
            buf += data

    def flush(self) -> None:
        """Hash what ``buf`` holds and empty it (before a large part is hashed in place)."""
        buf = self.buf
        if self.hasher is None:
            self.hasher = xxhash.xxh3_128()
        if self.taps:
            with memoryview(buf) as view:
                for tap in self.taps:
                    if tap[0] is not None:
                        tap[0].update(view[tap[1]:])
                    tap[1] = 0
        self.hasher.update(bytes(buf))
        self.hashed += len(buf)
        buf.clear()

    def feed_taps(self, data: Any) -> None:
        """Give the taps a part hashed in place (after :meth:`flush`)."""
        for tap in self.taps:
            if tap[0] is not None:
                tap[0].update(data)

    def tapped(self, tap: list[Any]) -> str | None:
        """The digest of what ``tap`` was fed, with what ``buf`` holds since its start;
        None if a buffer over 1 MiB went by, or once a class's code was written while it was
        being made (see :meth:`record_type`)."""
        h = tap[0]
        if h is None or _ENTANGLED in self.codes:
            return None
        with memoryview(self.buf) as view:
            h.update(view[tap[1]:])
        return str(h.hexdigest())

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
        self.cycles += e.cycles
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
            self.cycles += 1
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
            if self.collect is obj:  # an argument whose elements' digests are wanted
                self.collect = None
                self.each_element(items)
                return
            if len(items) >= 8 and self.strings(items):
                return
            for item in items:
                self.encode(item)
        finally:
            self.leave(obj)

    def each_element(self, items: Any) -> None:
        """Encode the items of a list or tuple as :meth:`sequence` does, and put in
        ``elements`` the digest :func:`trace_digest` gives of each, taken in the pass."""
        if len(items) >= 8:
            digests = self.strings(items, True)
            if digests is not None:
                self.elements = digests
                return
        self.elements = [self.element(item) for item in items]

    def element(self, item: Any) -> str | None:
        """Encode ``item`` and return its :func:`trace_digest`, taken in the pass: its bytes
        go to a tap of their own too ("" for a value too common to mean a flow; None when
        its bytes here are not its bytes alone: a back-reference; or a buffer over 1 MiB)."""
        if too_common(item):
            self.encode(item)
            return ""
        tap = [xxhash.xxh3_128(_HEADER), len(self.buf)]
        self.taps.append(tap)
        cycles = self.cycles
        try:
            self.encode(item)
        finally:
            self.taps.pop()
        return self.tapped(tap) if self.cycles == cycles else None

    def strings(self, items: Any, digests: bool = False) -> Any:
        """Items that are all exact str, none of them large: the bytes encoding each one
        writes (``s``, length, UTF-8), produced at C speed (a list of messages or lines);
        False, and nothing written, otherwise. With ``digests``, the :func:`trace_digest` of
        each item (a list) instead of True, and None instead of False."""
        if set(map(type, items)) != _ONLY_STR:
            return None if digests else False
        encoded = [s.encode("utf-8", "surrogatepass") for s in items]
        lengths = list(map(len, encoded))
        if max(lengths) >= _LARGE:
            return None if digests else False
        prefixes = list(map(_pack_sQ, repeat(b"s"), lengths))
        block = b"".join(chain.from_iterable(zip(prefixes, encoded, strict=True)))
        if len(block) < _LARGE:
            self.buf += block
        else:
            self.flush()  # (as raw() does: hashed in place, never copied into buf)
            self.hasher.update(block)
            self.hashed += len(block)
            self.feed_taps(block)
        if not digests:
            return True
        # what trace_digest gives each: "" for a string of 0 or 1 characters
        return ["" if len(s) <= 1 else _xxh3_128_hex(b"".join((_HEADER, p, b)))
                for s, p, b in zip(items, prefixes, encoded, strict=True)]

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
                if self.collect is obj:  # an argument whose elements' digests are wanted
                    self.collect = None
                    digests = self.values(list(map(obj.__getitem__, keys)), True)
                    # (in the dict's own order, as the tracer lists its values)
                    by_key = dict(zip(keys, digests, strict=True))
                    self.elements = [by_key[k] for k in obj]
                    return
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
        """Sorted str keys in one block: count, every length, every key's UTF-8 bytes.

        The block of a few short keys is kept (``_KEY_BLOCKS``): the dicts of a list of
        records share their keys, and writing them was a third of each one's encoding."""
        short = len(keys) <= 64
        if short:
            known = (tag, *keys)
            block = _KEY_BLOCKS.get(known)
            if block is not None:
                self.buf += block
                return
        text = "".join(keys)
        if text.isascii():  # (the common case, at C speed: a key's UTF-8 is one byte a char)
            lengths = array.array("Q", map(len, keys))
            joined = text.encode("ascii")
        else:
            encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
            lengths = array.array("Q", map(len, encoded))
            joined = b"".join(encoded)
        if _BIG_ENDIAN:
            lengths.byteswap()
        head = b"".join((tag, len(keys).to_bytes(8, "little"), lengths.tobytes()))
        if short and len(joined) <= 1024:  # (what raw() writes for it: tag, length, bytes)
            block = b"".join((head, b"k", len(joined).to_bytes(8, "little"), joined))
            if len(_KEY_BLOCKS) < 4096:
                _KEY_BLOCKS[known] = block
            self.buf += block
            return
        self.buf += head
        self.raw(b"k", joined)

    def values(self, vals: list[Any], digests: bool = False) -> Any:
        """A run of values: packed at C speed when all are exact 64-bit ints. With
        ``digests``, returns the :func:`trace_digest` of each, taken in the pass (see
        :meth:`element`)."""
        if set(map(type, vals)) == _ONLY_INT:
            try:
                packed = array.array("q", vals)
            except OverflowError:
                pass
            else:
                if _BIG_ENDIAN:
                    packed.byteswap()
                self.raw(b"\xf1", packed.tobytes())
                if digests:  # what encoding each alone writes: b"i" and 8 bytes
                    return ["" if -1 <= v <= 16 else _xxh3_128_hex(_HEADER + b"i" + _pack_q(v))
                            for v in vals]
                return None
        self.buf += b"\xf2"
        if digests:
            return [self.element(v) for v in vals]
        for v in vals:
            self.encode(v)
        return None

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
        own code also its code (:func:`~durably._keys.class_code.class_code`), so editing a method
        changes the digest."""
        self.raw(tag, type_path(t))
        code = self.codes.get(t)
        if code is None:
            code = _class_code()(self, t)
        elif code[:1] == b"J":
            # a class met while its own code is being made (classes whose codes refer to
            # each other): the codes kept from now on depend on what this pass encoded
            # first, so no digest of a part of it alone is taken from it (see tapped)
            self.codes[_ENTANGLED] = b""
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

    def fields(
        self, tag: bytes, obj: Any, names: Any, more: Callable[[Any], Any] | None = None
    ) -> None:
        """A record: its type and (name, value) pairs, in declaration order; then, when
        ``more`` gives a value other than None, that value (state kept outside the fields)."""
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
            if more is not None:
                extra = more(obj)
                if extra is not None:
                    self.buf += b"+"
                    self.encode(extra)
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
                    value = self.call_hook(hook, obj, t, tag)
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

    def call_hook(self, hook: Callable[[Any], Any], obj: Any, t: type, tag: bytes) -> Any:
        """``hook(obj)``; a failure inside it becomes a SerializationError naming the type and
        the argument (the cause chained)."""
        try:
            return hook(obj)
        except SerializationError:
            raise
        except Exception as exc:
            from durably._keys.files import File

            name = type_path(t).decode()
            if isinstance(exc, FileNotFoundError) and isinstance(obj, File):
                raise SerializationError(
                    f"cannot digest {self.where()}: the file of {obj!r} is gone (it was "
                    "deleted or moved after durably.file() was called). Fix: recreate the "
                    "file, or pass durably.file() of a file that exists."
                ) from exc
            how = "__durably_digest__" if tag == b"H" else "the registered encoder"
            raise SerializationError(
                f"cannot digest {self.where()}: {how} of {name} raised "
                f"{type(exc).__name__}: {exc}. Fix: make it return the state that identifies "
                "the object, or leave the argument out of the cache key with "
                f"ignore=({self.path or 'name'!r},)."
            ) from exc

    def reduce(self, obj: Any, t: type) -> None:
        """Fallback: the object's pickle recipe (``__reduce_ex__``), encoded canonically, so
        dicts and sets inside its state are ordered and no memory address leaks in."""
        try:
            # what pickle consults first: copyreg's table (re.Pattern, types.UnionType, ufuncs)
            reducer = copyreg.dispatch_table.get(t)
            rv = reducer(obj) if reducer is not None else obj.__reduce_ex__(4)
        except Exception as exc:  # noqa: BLE001 - any failure means: cannot digest this
            raise SerializationError(
                f"cannot digest {self.where()}: an object of type {type_path(t).decode()} "
                f"({exc}). Fix: leave the argument out of the cache key with "
                f"ignore=({self.path or 'name'!r},), give the class a __durably_digest__ "
                "method, or call durably.register_encoder(type, fn)."
            ) from None
        if isinstance(rv, str):
            self.text(b"G", f"{recorded_module(getattr(obj, '__module__', ''), rv)}.{rv}")
            return
        if not self.enter(obj):
            return
        try:
            self.typed(b"~", t)
            parts = list(rv[1:])
            state = parts[1] if len(parts) > 1 else None
            args = parts[0] if parts else ()
            items = parts[2] if len(parts) > 2 else None
            items = None if items is None else list(items)
            pairs = parts[3] if len(parts) > 3 else None
            pairs = None if pairs is None else dict(pairs)
            if (
                state is None
                and not items
                and not pairs
                and not _has_content(args, t)
                and t not in _WARNED
                and not self.quiet
            ):
                _WARNED.add(t)
                where = f" (in argument {self.path!r})" if self.path else ""
                warnings.warn(
                    f"durably: instances of {type_path(t).decode()}{where} expose no state to "
                    "digest, so all of them get the same digest. If they can differ, give "
                    "the class a __durably_digest__ method or call "
                    "durably.register_encoder().",
                    stacklevel=4,
                )
            make = rv[0]
            if _is_user_code(make):  # its code counts: a user factory or class may be edited
                self.buf += b"!"
                self.encode(make)
            else:
                self.encode(_callable_name(make))
            self.encode(args)
            self.encode(_without_cached_state(state, t))
            # always written (None when absent) so the encoding stays self-delimiting
            self.encode(items)
            self.encode(pairs)
        finally:
            self.leave(obj)


def _first(p: tuple[bytes, Any]) -> bytes:
    return p[0]


_CLASS_CODE: Callable[[Encoder, type], bytes] | None = None


def _class_code() -> Callable[[Encoder, type], bytes]:
    """:func:`~durably._keys.class_code.class_code`, imported on first use: the class code is made
    of code fingerprints, and the fingerprint walk encodes values with this module."""
    global _CLASS_CODE
    if _CLASS_CODE is None:
        from durably._keys.class_code import class_code

        _CLASS_CODE = class_code
    return _CLASS_CODE


def _callable_name(f: Any) -> str:
    qualname = getattr(f, "__qualname__", repr(f))
    return f"{recorded_module(getattr(f, '__module__', ''), qualname)}.{qualname}"


def _is_user_code(f: Any) -> bool:
    """A function or class of the user's own code (fingerprinted, not named)."""
    import types

    if not isinstance(f, (types.FunctionType, type)):
        return False
    from durably._keys.origin import is_user_module

    return is_user_module(getattr(f, "__module__", None))


def _without_cached_state(state: Any, t: type) -> Any:
    """The pickle state without values cached by ``functools.cached_property``."""
    if isinstance(state, dict):
        return without_cached(state, t)
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        return (without_cached(state[0], t), state[1])
    return state


def _has_content(args: Any, t: type) -> bool:
    if not isinstance(args, tuple):
        return True
    return any(a is not t and a is not object and not isinstance(a, type) for a in args)


_DISPATCH_GET = _DISPATCH.get

_HEADER = b"durably/" + str(ENCODING_VERSION).encode() + b"/"
_xxh3_128_hex = xxhash.xxh3_128_hexdigest
#: the bytes Encoder.str_block writes for a tag and a few short sorted keys (bounded: a new
#: key set once it is full is written as before)
_KEY_BLOCKS: dict[tuple[Any, ...], bytes] = {}
#: the largest buffer the encoder's taps hash too (see Encoder.raw)
_TAP_LARGEST = 1 << 20
#: a key of Encoder.codes: a class's code was written while it was being made (see tapped)
_ENTANGLED: Any = type("_Entangled", (), {})


def too_common(obj: Any) -> bool:
    """Values equal by coincidence far too often to mean a data flow: None, booleans, small
    numbers (-1 to 16; numpy's scalars too), strings and bytes of 0 or 1 characters, empty
    containers."""
    t = type(obj)
    if obj is None or t is bool:
        return True
    if t is int or t is float:
        return bool(-1 <= obj <= 16 and obj == int(obj))
    if t is str or t is bytes or t is list or t is tuple or t is dict or t is set:
        return len(obj) <= (1 if t is str or t is bytes else 0)
    if t.__module__ == "numpy" and getattr(obj, "shape", None) == ():  # np.int64(0), np.True_
        try:
            return too_common(obj.item())
        except Exception:  # noqa: BLE001 - not a scalar after all
            return False
    return False
