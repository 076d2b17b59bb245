"""Failed steps as part of a run's history: journaled with their exception, raised again
from the journal when the run is replayed or resumed, exactly like a result.

A step that failed inside a run is journaled twice over: its ``failed`` step record (what
:attr:`Run.steps <durably.Run.steps>` shows, as before) and a ``step_raised`` event of the run
that keeps the exception (pickled; a faithful stand-in when it cannot be). A later attempt
reads those events when it starts (with the interrupts it reads anyway: no extra query) and
raises the same exception again where the step is called, instead of executing its body: a
failure the run caught (a side effect that failed and was handled) never happens twice.

Only the failure that ended the run is executed again by the next attempt: when an attempt
fails, the steps whose exception escaped (the run's error itself, its cause and context, the
members of an exception group) are released by a ``step_retry`` event, journaled with the
attempt's end.

Only :class:`Exception` subclasses are replayed (a Ctrl-C, ``SystemExit`` or a cancellation
stops the run, it is not its history), and not durably's own :class:`~durably.StoreError` or
:class:`~durably.RunStateError` (the store or the lease failed, not the step).
"""

from __future__ import annotations

import builtins
import importlib
import pickle
import sys
import traceback
from collections.abc import Iterator
from typing import Any

from durably._keys import serde as _serde
from durably._store.records import EventRecord
from durably.exceptions import ReplayedError, RunStateError, StoreError

__all__ = ["RAISED", "RETRY", "ReplayedFailure", "escaped", "note", "raised_event", "released",
           "replayable", "replayed"]

#: the event kind that keeps a failed step's exception (its ``step_id``, ``data``)
RAISED = "step_raised"
#: the event kind that releases a failed step: the next attempt executes it again
RETRY = "step_retry"

_NOT_REPLAYED = (StoreError, RunStateError)


class ReplayedFailure(BaseException):
    """Raised by :func:`~durably._runtime.call.begin_step` for a step whose failure is replayed:
    a plain call raises :attr:`error` in its place, a fan-out or a submitted call makes it
    the item's or the future's failure. A ``BaseException``: never swallowed on the way."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def replayable(exc: BaseException) -> bool:
    """Whether a step's failure with ``exc`` is kept and replayed (see the module)."""
    return isinstance(exc, Exception) and not isinstance(exc, _NOT_REPLAYED)


def raised_event(run_id: str, attempt: int, step_id: str, time: float, task: str,
                 exc: BaseException, changed: dict[str, Any] | None = None) -> EventRecord:
    """The ``step_raised`` event of a step that failed with ``exc``: the exception pickled
    with its traceback's text (and ``changed``: the arguments its body changed in place
    before it raised, see _effects), or, when it does not pickle or does not load back as
    it was pickled (a custom ``__init__``), what rebuilds it: its class, ``args`` and the
    attributes that pickle."""
    tb = "".join(traceback.format_exception(exc))[-20_000:]
    data: bytes | None = None
    try:
        data = _serde.dumps((exc, tb, task, changed), what=f"the error of task {task!r}")
        loaded = pickle.loads(data)
        if type(loaded[0]) is not type(exc):
            data = None
    except Exception:  # noqa: BLE001 - any failure: rebuilt from its parts
        data = None
    if data is None:
        try:
            data = _serde.dumps((_parts(exc), tb, task, changed),
                                what=f"the error of task {task!r}")
        except Exception:  # noqa: BLE001 - (the arguments' new state did not pickle)
            data = pickle.dumps((_parts(exc), tb, task, None), protocol=5)
    return EventRecord(run_id, RAISED, time, attempt, step_id, "", data)


def _pickles(value: Any) -> bool:
    try:
        pickle.loads(_serde.dumps(value, what="a part of an error"))
    except Exception:  # noqa: BLE001 - left out
        return False
    return True


def _parts(exc: BaseException) -> tuple[Any, ...]:
    """What rebuilds an exception that does not pickle: ``("parts", module, qualname, the
    nearest builtin exception class it derives from, its message, its args (those that
    pickle), its attributes that pickle)``."""
    t = type(exc)
    base = next((c.__name__ for c in t.__mro__ if c.__module__ == "builtins"
                 and issubclass(c, Exception) and c is not BaseException), "Exception")
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that fails
        message = f"<{t.__qualname__}: its message cannot be shown>"
    args = tuple(a if _pickles(a) else repr(a) for a in exc.args)
    attrs = {k: v for k, v in getattr(exc, "__dict__", {}).items()
             if k != "__notes__" and _pickles(v)}
    return ("parts", t.__module__, t.__qualname__, base, message, args, attrs)


_STAND_INS: dict[tuple[str, str, str], type[ReplayedError]] = {}


def _find_class(module: str, qualname: str) -> type | None:
    """The exception class ``module.qualname`` in this process, or None."""
    owner: Any = sys.modules.get(module)
    if owner is None:
        try:
            owner = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - not importable here
            return None
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    return owner if isinstance(owner, type) and issubclass(owner, BaseException) else None


def _rebuilt(parts: tuple[Any, ...]) -> tuple[BaseException, bool]:
    """The exception ``parts`` (see :func:`_parts`) describe: an instance of its own class
    when this process has it (made without calling its ``__init__``, as pickle would for a
    class that pickles: its ``args`` and its attributes set), else a stand-in; and whether
    it is a stand-in."""
    _, module, qualname, base, message, args, attrs = parts
    cls = _find_class(module, qualname)
    if cls is not None:
        try:
            exc = cls.__new__(cls, *args)
            exc.args = args
            exc.__dict__.update(attrs)
        except Exception:  # noqa: BLE001 - a class that cannot be made so: a stand-in
            pass
        else:
            return exc, False
    return _stand_in(module, qualname, base, message), True


def _stand_in(module: str, qualname: str, base: str, message: str) -> ReplayedError:
    """A :class:`~durably.ReplayedError` that is also an instance of ``base`` (a builtin
    exception: an ``except ValueError:`` that caught the original catches it too)."""
    key = (module, qualname, base)
    cls = _STAND_INS.get(key)
    if cls is None:
        builtin = getattr(builtins, base, Exception)
        if not (isinstance(builtin, type) and issubclass(builtin, Exception)):
            builtin = Exception
        bases: tuple[type, ...] = (ReplayedError,) if builtin is Exception else (
            ReplayedError, builtin)
        try:
            cls = type(qualname.rpartition(".")[2], bases, {"__module__": module})
        except TypeError:  # (a builtin whose layout cannot be combined)
            cls = type(qualname.rpartition(".")[2], (ReplayedError,), {"__module__": module})
        _STAND_INS[key] = cls
    error = cls(f"{qualname}: {message}" if message else qualname)
    error.original_type = f"{module}.{qualname}"
    return error


def replayed(data: bytes, run_id: str) -> tuple[BaseException, dict[str, Any] | None]:
    """The exception a ``step_raised`` event keeps, ready to raise again, with a note that
    says it was replayed from the journal (and the original traceback's text); and the new
    state of the arguments the step changed in place before it raised (or None)."""
    changed: dict[str, Any] | None = None
    try:
        exc, tb, task, *rest = _serde.loads(data)
        changed = rest[0] if rest else None
    except Exception as error:  # noqa: BLE001 - its class is gone from the code: a stand-in
        exc, tb, task = _stand_in("builtins", "Exception", "Exception",
                                  f"the recorded error cannot be loaded ({error!r})"), "", "?"
    how = ""
    if isinstance(exc, tuple):
        exc, stand_in = _rebuilt(exc)
        how = (" (the original exception could not be pickled: this is a stand-in of its "
               "type and message)" if stand_in else " (the original exception did not "
               "pickle as it was: this one is rebuilt from its class, its args and the "
               "attributes that pickle, without calling its __init__)")
    elif isinstance(exc, ReplayedError):
        how = " (the original exception could not be loaded: this is a stand-in)"
    exc.add_note(
        f"durably: replayed from the journal of run {run_id!r}: task {task!r} raised this "
        "when the run first executed it, and the run went on (it caught the error), so the "
        f"step is not executed again in this run{how}"
        + (f". The original traceback:\n{tb.rstrip()}" if tb else "."))
    return exc, changed


def escaped(exc: BaseException | None) -> Iterator[BaseException]:
    """The exceptions that ended an attempt: ``exc``, its cause and context, and the members
    of exception groups among them (bounded)."""
    todo = [exc] if exc is not None else []
    seen: set[int] = set()
    while todo and len(seen) < 10_000:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)


def note(failures: dict[int, tuple[BaseException, list[str]]], exc: BaseException,
         step_id: str) -> None:
    """Note that ``step_id`` failed with ``exc`` in this attempt (the same exception may
    leave several nested steps)."""
    hit = failures.get(id(exc))
    if hit is None or hit[0] is not exc:
        failures[id(exc)] = (exc, [step_id])
    else:
        hit[1].append(step_id)


def released(exc: BaseException | None,
             failures: dict[int, tuple[BaseException, list[str]]]) -> list[str]:
    """The steps of ``failures`` (this attempt's, by the id of their exception) whose
    exception is among those that ended the attempt (see :func:`escaped`)."""
    if not failures or exc is None:
        return []
    found: list[str] = []
    for e in escaped(exc):
        hit = failures.get(id(e))
        if hit is not None and hit[0] is e:
            found.extend(hit[1])
    return found
