"""A task's in-place changes to its arguments, as part of what it did.

A task that appends to a list it was given, fills a dict, or fits an estimator its caller
passed on changes the caller's objects. A hit or a replay that only returned the result
would leave them as they were, so the caller's next steps would see other inputs than when
the body executed (a rerun of a finished run would diverge). So, for the arguments whose
type can change (not ``str``, numbers, ``None``, paths and ``durably.File``, tuples of those,
classes, functions), the digest taken before the body is compared with one taken after it;
the arguments that changed are stored with the result (an :class:`Effects`), and a hit or a
replay puts their new state back into the caller's objects: lists, dicts, sets, bytearrays,
deques, numpy arrays (same shape and dtype), tuples of those, random generators
(``random.Random``, numpy's), and objects whose state is their ``__dict__`` /
``__getstate__`` / ``__setstate__`` (scikit-learn estimators, dataclasses, plain classes).
Where that cannot be done, a warning (once per task and argument) names them, with the fix.

The cache key is always made from the arguments as they were before the call.
"""

from __future__ import annotations

import array
import collections
import datetime
import decimal
import enum
import fractions
import pathlib
import random
import sys
import types
import uuid
import warnings
from collections.abc import Mapping
from typing import Any

from durably._keys.files import File
from durably._runtime.context import user_stacklevel

__all__ = ["Effects", "before", "changed", "mutable", "restored"]

_IMMUTABLE: frozenset[type] = frozenset({
    str, bytes, int, float, complex, bool, type(None), range, type(Ellipsis), slice,
    types.FunctionType, types.BuiltinFunctionType, types.ModuleType, types.MethodType,
    datetime.date, datetime.datetime, datetime.time, datetime.timedelta, datetime.timezone,
    decimal.Decimal, fractions.Fraction, uuid.UUID, pathlib.PurePosixPath, pathlib.PosixPath,
    pathlib.PureWindowsPath, pathlib.WindowsPath, pathlib.PurePath, pathlib.Path,
    File,  # (its content is not its state: a file written while the body ran is caught by
    # its stamps, and keeps the result out of the cache: Call.files_changed)
})
_WARNED: set[tuple[object, str]] = set()  # (the task's spec, or its name; the argument)


class Effects:
    """A result with the new state of the arguments its body changed in place (by name)."""

    __slots__ = ("changed", "result")

    def __init__(self, result: Any, changed: dict[str, Any]) -> None:
        self.result = result
        self.changed = changed

    def __reduce__(self) -> tuple[Any, ...]:
        return (Effects, (self.result, self.changed))


def _may_change(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` can be changed in place (conservative: True when unsure)."""
    t = type(value)
    if t in _IMMUTABLE or isinstance(value, (type, enum.Enum)):
        return False
    if t is tuple or t is frozenset:
        if depth > 3 or len(value) > 64:
            return True
        return any(_may_change(v, depth + 1) for v in value)
    return True


def mutable(arguments: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The arguments (name, value) whose value can be changed in place by the body (the
    type test first: the common arguments cost no call)."""
    immutable = _IMMUTABLE
    return [(name, value) for name, value in arguments.items()
            if type(value) not in immutable and _may_change(value)]


def _state(value: Any) -> str | None:
    """The digest of ``value``'s pickle (C speed, its buffers hashed in place), or None when
    it does not pickle: how an argument is compared before and after the body."""
    from durably._keys.revalidate import _pickle_digest

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _pickle_digest(value)
    except Exception:  # noqa: BLE001 - compared by its digest instead
        return None


def before(values: list[tuple[str, Any]], known: Mapping[str, str] | None
           ) -> dict[str, str]:
    """What :func:`changed` compares after the body: each argument's pickle digest (taken
    now, before the body runs), else its digest (``known``: those taken with the key)."""
    from durably._keys.hashing import digest_each

    found: dict[str, str] = {}
    for name, value in values:
        state = _state(value)
        if state is not None:
            found[name] = "p" + state
        else:
            old = (known or {}).get(name)
            found[name] = "d" + (old if old is not None else
                                 digest_each({name: value})[name])
    return found


def changed(task: str, before: Mapping[str, str], values: list[tuple[str, Any]]
            ) -> dict[str, Any]:
    """The arguments among ``values`` whose pickle digest (or digest) differs from the one
    ``before`` gives (see :func:`before`): changed in place by the body."""
    from durably._keys.hashing import digest_each

    found: dict[str, Any] = {}
    for name, value in values:
        old = before.get(name)
        if old is None:
            continue
        try:
            now = ("p" + (_state(value) or "")) if old[0] == "p" else (
                "d" + digest_each({name: value})[name])
        except Exception:  # noqa: BLE001 - it digested before: something in it changed
            now = ""
        if now != old:
            found[name] = value
    return found


def warn_once(task: str, names: list[str] | tuple[str, ...], why: str,
              owner: object = None) -> None:
    """Warn once per task (``owner``: its spec) and argument that its in-place change is not
    redone."""
    who: object = task if owner is None else owner  # (kept: its id is never reused)
    fresh = [n for n in names if (who, n) not in _WARNED]
    if not fresh:
        return
    _WARNED.update((who, n) for n in fresh)
    which = ", ".join(repr(n) for n in fresh)
    warnings.warn(
        f"durably: task {task!r} changed its argument{'s' if len(fresh) > 1 else ''} {which} "
        f"in place, and {why}: a hit or a replay of this call leaves the caller's object as "
        "it was, not as the body left it. Fix: return the new value instead of changing the "
        "argument (and use the returned value).", stacklevel=user_stacklevel())


def _restore(target: Any, new: Any, seen: dict[int, Any] | None = None) -> bool:
    """Put the state of ``new`` (a copy of ``target`` as the body left it) into ``target``,
    in place and as deep as it goes: an object inside it that the caller may also hold
    (an estimator in a list, a model in a config dict) is updated, not replaced. False when
    that cannot be done in place."""
    if target is new:
        return True
    if type(new) is not type(target):
        return False
    if seen is None:
        seen = {}
    if id(new) in seen:  # (a cycle, or an object met twice: updated once)
        return seen[id(new)] is target
    seen[id(new)] = target
    if not _may_change(target):
        return bool(target == new)  # (an immutable: equal, or not this one)
    if isinstance(target, list):
        common = min(len(target), len(new))
        for i in range(common):
            if not _restore(target[i], new[i], seen):
                target[i] = new[i]
        if len(new) > common:
            target.extend(new[common:])
        else:
            del target[common:]
    elif isinstance(target, dict):
        for k in [k for k in target if k not in new]:
            del target[k]
        for k, v in new.items():
            if k not in target or not _restore(target[k], v, seen):
                target[k] = v
    elif isinstance(target, (set, collections.deque)):
        target.clear()
        target.update(new) if isinstance(target, set) else target.extend(new)
    elif isinstance(target, (bytearray, array.array)):
        target[:] = new
    elif isinstance(target, tuple):
        return len(target) == len(new) and all(
            _restore(a, b, seen) for a, b in zip(target, new, strict=True))
    elif _is_ndarray(target):
        if target.shape != new.shape or target.dtype != new.dtype or not target.flags.writeable:
            return False
        target[...] = new
        return True
    else:
        return _restore_object(target, new, seen)
    if isinstance(target, (list, dict, set)) and hasattr(new, "__dict__"):
        _restore_attributes(target, new.__dict__, seen)  # (a subclass's own attributes)
    return True


def _restore_attributes(target: Any, state: dict[str, Any], seen: dict[int, Any]) -> None:
    """``target.__dict__`` made ``state``, its values updated in place where they can be."""
    own = target.__dict__
    for k in [k for k in own if k not in state]:
        del own[k]
    for k, v in state.items():
        if k not in own or not _restore(own[k], v, seen):
            own[k] = v


def _is_ndarray(value: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.ndarray)


def _restore_object(target: Any, new: Any, seen: dict[int, Any]) -> bool:
    if isinstance(target, random.Random):  # (its state is not in its __dict__)
        target.setstate(new.getstate())
        return True
    np = sys.modules.get("numpy")
    if np is not None and isinstance(target, np.random.Generator):
        target.bit_generator.state = new.bit_generator.state
        return True
    if np is not None and isinstance(target, np.random.RandomState):
        target.set_state(new.get_state())
        return True
    try:
        state = new.__getstate__()
    except Exception:  # noqa: BLE001 - no state to take
        return False
    setstate = getattr(type(target), "__setstate__", None)
    if setstate is not None:
        if isinstance(state, dict) and isinstance(getattr(target, "__dict__", None), dict):
            # the values the caller may hold too (an estimator's steps) updated in place
            current = target.__dict__
            state = {k: current[k] if k in current and _restore(current[k], v, seen) else v
                     for k, v in state.items()}
        try:
            setstate(target, state)
        except Exception:  # noqa: BLE001 - said by the caller's warning
            return False
        return True
    slots: Any = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state is None and not slots:
        return False  # (no state it exposes: array.array's kind, a C object's)
    if state is not None and not isinstance(state, dict):
        return False
    try:
        if state is not None:
            _restore_attributes(target, state, seen)
        elif hasattr(target, "__dict__"):
            target.__dict__.clear()
        for name, value in (slots or {}).items():
            current = getattr(target, name, _ABSENT)
            if current is _ABSENT or not _restore(current, value, seen):
                setattr(target, name, value)
    except Exception:  # noqa: BLE001 - said by the caller's warning
        return False
    return True


_ABSENT = object()


def restored(task: str, value: Effects, arguments: Mapping[str, Any],
             owner: object = None) -> Any:
    """The result of a stored :class:`Effects`, after putting the new state of the
    arguments it changed into the caller's objects (``arguments``: the call's, by name).
    A result that was one of those arguments is the caller's object."""
    result = value.result
    failed = []
    for name, new in value.changed.items():
        if name not in arguments:
            continue
        target = arguments[name]
        if _restore(target, new):
            if result is new:
                result = target
        else:
            failed.append(name)
    if failed:
        warn_once(task, failed, "its new state cannot be put back into the caller's object "
                  "(another type, shape or dtype, a read-only array, or no __dict__ / "
                  "__setstate__)", owner)
    return result
