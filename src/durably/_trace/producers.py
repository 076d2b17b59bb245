"""Which step returned an object, by the object's identity: the data-flow edges of a run's
graph, found as its steps are called instead of by digesting every result.

A step's result (and each element of a list, tuple or dict result: ``a, b = step()``, or one
row of ``rows = load()``) is noted as it returns, with the step that returned it (executed,
served from the cache or replayed). A later step given that very object as an argument, or
as an element of a list, tuple or dict argument, received it: its journal row names the
producing step (:func:`source_token`), and the run graph draws the edge from that name
(:func:`durably._trace.tracer.build_graph`). Of several steps returning one object (a step
that passes its argument through), the last one is the source. A copy of a result is
another object: no edge (the digest of a result is not taken; :func:`flow_digests
<durably._trace.tracer.flow_digests>` still matches the digests older journals recorded).

An ``id()`` is only unique among live objects, so an object is matched by ``is`` with the
object noted, never by its id alone: an id reused by a new object never draws an edge. An
object that takes weak references (numpy arrays, dataframes, instances of the user's
classes) is held by one, so it is never kept alive for its edges. The dicts, lists, tuples
and strings results are made of take none: they are held, and let go once nothing else
holds them (CPython's reference count says so): those of the step before are looked at as
each step returns (a result dropped at once, as ``process(load())`` drops it, is let go one
step later), and all of them each time the record has doubled since the last sweep. So it
holds at most about twice the results still in use, at an amortized constant cost per step,
and nothing is decided by time. (On a Python without reference counts, the oldest half of
those held goes once there are ``_BOUND``.)
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Mapping
from itertools import islice
from typing import Any

from durably._keys.canonical import too_common
from durably._keys.hashing import MAX_FLOW_ELEMENTS, MAX_RESULT_ELEMENTS

__all__ = ["LATER", "SOURCE", "Producers", "digests_only", "flow_elements", "source_token"]

#: what starts an entry of a step record's ``input_digests`` naming the step that produced
#: one of its arguments (a digest is hexadecimal: never this)
SOURCE = "@"
#: results of replayed steps held at most before they are noted (see Producers.later)
LATER = 256
_SWEEP_FIRST = 1024  # objects held before the first sweep
_BOUND = 1 << 17  # objects held at most without reference counts (then the older half goes)
_refcount = getattr(sys, "getrefcount", None)


def flow_elements(value: Any) -> Any:
    """The elements of an argument that data-flow edges look into: a list's or a tuple's
    items, a dict's values (of at most ``MAX_FLOW_ELEMENTS``); None for anything else.

    Example:
        >>> list(flow_elements({"a": 1})), flow_elements("text")
        ([1], None)
    """
    kind = type(value)
    if kind is list or kind is tuple:
        elements: Any = value
    elif kind is dict:
        elements = value.values()
    else:
        return None
    return None if len(value) > MAX_FLOW_ELEMENTS else elements


def source_token(step_id: str) -> str:
    """The entry of ``input_digests`` naming the step that produced an argument.

    Example:
        >>> source_token("0" * 32)
        '@00000000000000000000000000000000'
    """
    return SOURCE + step_id


def digests_only(input_digests: tuple[str, ...]) -> tuple[str, ...]:
    """A step record's ``input_digests`` without the entries naming producing steps: what
    its arguments were, compared as such (an interrupt's asker, a step kept from older code)
    whatever steps produced them (their ids follow their code).

    Example:
        >>> digests_only(("ab" * 16, source_token("0" * 32)))
        ('abababababababababababababababab',)
    """
    if not any(d.startswith(SOURCE) for d in input_digests):
        return input_digests
    return tuple(d for d in input_digests if not d.startswith(SOURCE))


def _held_only_here() -> int:
    """The reference count :meth:`Producers._let_go` sees for an object nothing else holds
    (measured as it measures it: the count depends on how the interpreter passes it)."""
    probe = Producers()
    probe.returned([object()], "")  # (a list: held, not weakly; by the record alone)
    by_id = probe._by_id
    assert _refcount is not None
    return int(min(_refcount(by_id[key][0]) for key in list(by_id)))


class Producers:
    """The objects a run's steps returned in this attempt, each with the step that returned
    it last (see the module's docstring).

    Example:
        >>> p = Producers()
        >>> rows = [["a", 1], ["b", 2]]
        >>> p.returned(rows, "load")
        >>> first, second = rows
        >>> p.sources({"row": second, "all": rows, "copy": list(rows)})
        ('load', 'load', 'load', 'load', 'load', 'load')
        >>> p.sources({"other": ["c", 3]})
        ()
    """

    __slots__ = ("_by_id", "_last", "_sweep_at", "later")

    def __init__(self) -> None:
        #: id -> (the object, or a weak reference to it; the step; whether weakly)
        self._by_id: dict[int, tuple[Any, str, bool]] = {}
        self._last: list[int] = []  # the ids held (not weakly) by the last returned()
        self._sweep_at = _SWEEP_FIRST
        #: results of replayed steps not noted yet, (value, step id) in order: a replay
        #: appends there (a step that executes, or the LATER-th one, notes them first), so a
        #: run that only replays (a rerun, or a resume before its first step that executes)
        #: pays an append a step; the values that take weak references are noted at once
        #: (never held), the others held LATER replayed steps at most before they are
        self.later: list[tuple[Any, str]] = []

    def returned(self, value: Any, step_id: str) -> None:
        """Note that step ``step_id`` returned ``value`` (and the first
        ``MAX_RESULT_ELEMENTS`` elements of a list or tuple, the values of a dict), except
        values too common to mean a flow (None, booleans, small numbers, empty containers:
        see ``too_common``)."""
        if self.later:
            self.catch_up()
        self._returned(value, step_id)

    def replayed(self, value: Any, step_id: str) -> None:
        """:meth:`returned`, for a step replayed from the journal: noted when a step
        executes, or :data:`LATER` replays later (see ``later``). (The runtime's replay
        path does this inline.)"""
        if type(value).__weakrefoffset__:
            self.returned(value, step_id)
            return
        later = self.later
        later.append((value, step_id))
        if len(later) >= LATER:
            self.catch_up()

    def catch_up(self) -> None:
        """Note the results of the replayed steps not noted yet, in order."""
        later, self.later = self.later, []
        for value, step_id in later:
            self._returned(value, step_id)

    def _returned(self, value: Any, step_id: str) -> None:
        if self._last:
            self._let_go(self._last)  # (the results of the step before, if dropped)
            self._last = []
        t = type(value)
        if t is int:  # (the commonest result: too_common's test for it, without its call)
            if -1 <= value <= 16:
                return
        elif too_common(value):
            return
        by_id = self._by_id
        self._note(value, step_id)
        if t is dict:
            elements: Any = value.values()
        elif t is list or t is tuple or isinstance(value, (list, tuple)):
            elements = value  # (a NamedTuple, a list subclass: unpacked as a tuple is)
        else:
            elements = ()
        for item in islice(elements, MAX_RESULT_ELEMENTS) if len(elements) > (
                MAX_RESULT_ELEMENTS) else elements:
            if not too_common(item):
                self._note(item, step_id)
        if len(by_id) >= self._sweep_at:
            self._sweep()

    def _note(self, value: Any, step_id: str) -> None:
        key = id(value)
        if type(value).__weakrefoffset__:
            try:
                self._by_id[key] = (weakref.ref(value), step_id, True)
                return
            except TypeError:  # (a type that declares them and refuses them)
                pass
        self._by_id[key] = (value, step_id, False)
        self._last.append(key)

    def sources(self, arguments: Mapping[str, Any]) -> tuple[str, ...]:
        """The steps that produced each argument, and each element of a list, tuple or dict
        argument (of at most ``MAX_FLOW_ELEMENTS``), in order, with repeats (an object given
        twice is two flows)."""
        if self.later:
            self.catch_up()
        by_id = self._by_id
        if not by_id:
            return ()
        found: list[str] = []
        for value in arguments.values():
            entry = by_id.get(id(value))
            if entry is not None and (entry[0]() if entry[2] else entry[0]) is value:
                found.append(entry[1])
            elements = flow_elements(value)
            if elements is None:
                continue
            for element in elements:
                entry = by_id.get(id(element))
                if entry is not None and (entry[0]() if entry[2] else entry[0]) is element:
                    found.append(entry[1])
        return tuple(found)

    def _let_go(self, keys: list[int]) -> None:
        """Let go of the objects of ``keys`` held by nothing but this record, and forget
        those held weakly that are gone. In order: a container let go frees its elements,
        noted after it, before they are looked at."""
        by_id = self._by_id
        if _refcount is None:
            return
        alone = _ALONE
        for key in keys:
            entry = by_id.get(key)
            if entry is None:
                continue
            if entry[0]() is None if entry[2] else _refcount(entry[0]) <= alone:
                del by_id[key]
            del entry  # (the last reference to a container let go: its elements are free)

    def _sweep(self) -> None:
        """Let go of everything held by nothing but this record (see the module)."""
        by_id = self._by_id
        if _refcount is None:
            held = [key for key, entry in by_id.items() if not entry[2]]
            for key in held[:len(held) // 2] if len(held) >= _BOUND else ():
                by_id.pop(key, None)
            for key in [key for key, entry in by_id.items() if entry[2] and entry[0]() is None]:
                del by_id[key]
        else:
            self._let_go(list(by_id))
        self._sweep_at = max(_SWEEP_FIRST, 2 * len(by_id))


_ALONE = _held_only_here() if _refcount is not None else 0
