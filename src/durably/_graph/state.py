"""A StateGraph's state schema (fields, reducers, conversions) and the fingerprint of its
structure and code (what a resumed run is compared with)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import typing
from collections.abc import Callable, Mapping
from typing import Any

from durably.exceptions import DefinitionError, DurablyError

__all__ = ["InvalidUpdateError", "Schema", "comparable", "describe_changes", "fingerprint_of",
           "parts_of"]


class InvalidUpdateError(DurablyError):
    """Nodes of one super-step wrote the same state key, which has no reducer; or a node
    returned something that is not an update."""


class Schema:
    """How a state type is read, built and merged: field names, reducers, and conversions."""

    def __init__(self, state_type: Any, namespace: Mapping[str, Any] | None = None) -> None:
        self.type = state_type
        if isinstance(state_type, type) and dataclasses.is_dataclass(state_type):
            self.kind = "dataclass"
        elif isinstance(state_type, type) and hasattr(state_type, "model_fields"):
            self.kind = "pydantic"
        elif isinstance(state_type, type) and typing.is_typeddict(state_type):
            self.kind = "typeddict"
        else:
            raise DefinitionError(
                f"StateGraph(state) takes a TypedDict, a dataclass or a pydantic model class, "
                f"not {state_type!r}. Fix: class State(TypedDict): messages: list[str]")
        try:
            # names the annotations use may live where the graph is built (a function, a
            # notebook cell, a doctest) rather than in the class's module
            hints = typing.get_type_hints(state_type, localns=dict(namespace or {}),
                                          include_extras=True)
        except Exception as exc:  # noqa: BLE001 - reported as a definition error
            raise DefinitionError(f"cannot read the fields of {state_type!r}: {exc}") from None
        self.fields = list(hints)
        self.reducers: dict[str, Callable[[Any, Any], Any]] = {}
        for name, hint in hints.items():
            if typing.get_origin(hint) is typing.Annotated:
                for meta in hint.__metadata__:
                    if callable(meta):
                        self.reducers[name] = meta
                        break

    def to_dict(self, value: Any, what: str) -> dict[str, Any]:
        if value is None:
            return {}
        if isinstance(value, Mapping):
            unknown = [k for k in value if k not in self.fields]
            if unknown:
                raise InvalidUpdateError(
                    f"{what} has keys {unknown} that are not fields of "
                    f"{self.type.__qualname__} ({self.fields}). Fix: add them to the state "
                    "type, or drop them.")
            return dict(value)
        if self.kind == "dataclass" and isinstance(value, self.type):
            return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        if self.kind == "pydantic" and isinstance(value, self.type):
            return self.fields_of(value)  # (model_construct may leave fields unset)
        raise InvalidUpdateError(
            f"{what} must be a dict of state keys (or a {self.type.__qualname__}), not "
            f"{type(value).__qualname__}: {value!r:.80}")

    def update_of(self, value: Any, state: dict[str, Any], what: str) -> dict[str, Any]:
        """What a node's return value writes. A dict (or None: nothing) is the update. An
        instance of the state type writes, for pydantic, the fields set explicitly
        (``State(notes=[...])``), and for a dataclass (or the very state object the node was
        given, changed in place) the fields whose values differ from the node's input;
        reducers apply to those values as to a dict's. To append through a reducer, return
        only the new items."""
        if value is None or isinstance(value, Mapping):
            return self.to_dict(value, what)
        if self.kind == "typeddict" or not isinstance(value, self.type):
            return self.to_dict(value, what)  # raises, naming the node
        fields = self.to_dict(value, what)
        if self.kind == "pydantic":
            # a field never set (left to its default by a new instance, or by the node's
            # copy of a state without it) is not written; one set (given, assigned, or
            # model_copy(update=...)) is, when it differs from the node's input
            explicit = getattr(value, "model_fields_set", None)
            if explicit is not None:
                fields = {k: v for k, v in fields.items() if k in explicit}
        # a field the state does not hold yet (an input without it) was shown to the node
        # as its default: returning it unchanged is no write (two parallel nodes returning
        # their state object would both write it)
        return {k: v for k, v in fields.items()
                if not _same(v, state[k] if k in state else self.default(k))}

    def complete(self, values: dict[str, Any]) -> dict[str, Any]:
        """``values`` with the default of each field it leaves out (a default factory
        called once: a super-step's nodes see one value, and its checkpoint keeps it)."""
        if self.kind == "typeddict":
            return values
        missing = [k for k in self.fields if k not in values]
        if not missing:
            return values
        out = dict(values)
        for k in missing:
            try:
                value = self.default(k)
            except Exception:  # noqa: BLE001 - a factory that needs the other fields: left out
                continue
            if value is not _NOTHING:
                out[k] = value
        return out

    def fields_of(self, instance: Any) -> dict[str, Any]:
        """The values of an instance of the state type, by field name."""
        return {k: getattr(instance, k) for k in self.fields if hasattr(instance, k)}

    def default(self, name: str) -> Any:
        """The value the state type gives field ``name`` when it is left out (a new object
        from a default factory), or a marker equal to nothing for a required field."""
        if self.kind == "dataclass":
            for f in dataclasses.fields(self.type):
                if f.name == name:
                    if f.default is not dataclasses.MISSING:
                        return f.default
                    if f.default_factory is not dataclasses.MISSING:
                        return f.default_factory()
            return _NOTHING
        if self.kind == "pydantic":
            info = self.type.model_fields.get(name)
            if info is None or info.is_required():
                return _NOTHING
            return info.get_default(call_default_factory=True)
        return _NOTHING

    def build(self, values: dict[str, Any]) -> Any:
        """The state as the node sees it: a dict for a TypedDict, else an instance (a
        dataclass's ``init=False`` fields set after it is made; a pydantic model's fields by
        name, whatever their aliases)."""
        if self.kind == "typeddict":
            return dict(values)
        if self.kind == "dataclass":
            later = {f.name for f in dataclasses.fields(self.type) if not f.init}
            if not later:
                return self.type(**values)
            made = self.type(**{k: v for k, v in values.items() if k not in later})
            for k in later & values.keys():
                object.__setattr__(made, k, values[k])  # (a frozen dataclass too)
            return made
        try:
            return self.type.model_validate(values, by_name=True)  # pydantic 2.11 and later
        except TypeError:  # earlier: the aliases, which every configuration accepts
            fields = self.type.model_fields
            return self.type(**{_alias(fields.get(k), k): v for k, v in values.items()})


def fingerprint_of(graph: Any) -> dict[str, Any]:
    """The graph's structure and the code of its nodes and routers, comparable as JSON."""
    from durably._keys.fingerprint import fingerprint_function

    def code(fn: Any) -> str:
        if hasattr(fn, "fingerprint_digest"):  # a compiled subgraph
            return "graph:" + str(fn.fingerprint_digest)
        try:
            return fingerprint_function(fn).digest
        except Exception:  # noqa: BLE001 - a callable object without code: by its type
            return f"type:{type(fn).__module__}.{type(fn).__qualname__}"

    return {
        "nodes": {n: code(fn) for n, fn in sorted(graph.nodes.items())},
        "edges": sorted([[list(s), t] for s, t in graph.edges]),
        "routers": sorted([[r.source, r.names, code(r.fn)] for r in graph.routers]),
        "reducers": {k: code(fn) for k, fn in sorted(graph.schema.reducers.items())},
        # (only when some node declares any: the fingerprints of graphs without stay as
        # they were, so their runs resume across an upgrade)
        **({"destinations": {n: sorted(o["destinations"]) for n, o in
                             sorted(graph.node_options.items()) if o.get("destinations")}}
           if any(o.get("destinations") for o in graph.node_options.values()) else {}),
    }


def comparable(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """A fingerprint (:func:`fingerprint_of`, as recorded with a run) as compared with
    another: a router's destinations are a set, END implied (always allowed), so listing them
    in another order, or END or not, is the same graph."""
    from durably._graph.structure import END

    routers = sorted([r[0], sorted(set(r[1]) - {END}), *r[2:]]
                     for r in fingerprint.get("routers", []))
    return {**fingerprint, "routers": routers}


def parts_of(graph: Any) -> dict[str, dict[str, dict[str, str]]]:
    """For each node (``"nodes"``) and router (``"routers"``, by its source and names as
    JSON), the digest of each function, class or constant of the user's code its
    fingerprint covers besides its own function, by qualified name (recorded beside the
    fingerprint, so that a changed node's or router's message names the helper or constant
    that changed in it)."""
    from durably._keys.fingerprint import fingerprint_function

    def covered(fn: Any) -> dict[str, str] | None:
        if hasattr(fn, "fingerprint_digest"):
            return None  # a compiled subgraph: its own nodes say
        try:
            found = dict(fingerprint_function(fn).changed_by)
        except Exception:  # noqa: BLE001 - a callable object without code
            return None
        found.pop(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}", None)
        return found

    nodes = {n: c for n, fn in sorted(graph.nodes.items()) if (c := covered(fn)) is not None}
    from durably._graph.structure import END

    # (keyed as describe_changes names a router: its destinations as comparable() has them)
    routers = {json.dumps([r.source, sorted(set(r.names) - {END})]): c for r in graph.routers
               if (c := covered(r.fn)) is not None}
    return {"nodes": nodes, "routers": routers}


def _what_changed(old_parts: Mapping[str, Any] | None, new_parts: Mapping[str, Any] | None,
                  kind: str, key: str) -> str:
    """`` (__main__.LIMIT)``: what differs among the parts recorded for a node or router
    (empty when a side has no record, or only its own code changed)."""
    before = (old_parts or {}).get(kind, {}).get(key)
    now = (new_parts or {}).get(kind, {}).get(key)
    if before is None or now is None:
        return ""
    what = sorted(k for k in {*before, *now} if before.get(k) != now.get(k))
    return f" ({', '.join(what)})" if what else ""


def describe_changes(old: Mapping[str, Any], new: Mapping[str, Any],
                     old_parts: Mapping[str, Any] | None = None,
                     new_parts: Mapping[str, Any] | None = None) -> list[str]:
    """What differs between two graph fingerprints (:func:`fingerprint_of`), in words; with
    the parts of both (:func:`parts_of`), a changed node or router says what changed in it."""
    changes: list[str] = []
    on, nn = old.get("nodes", {}), new.get("nodes", {})
    changes += [f"node {n!r} was removed" for n in on if n not in nn]
    changes += [f"node {n!r} was added" for n in nn if n not in on]
    changes += [f"the code of node {n!r} changed"
                + _what_changed(old_parts, new_parts, "nodes", n)
                for n in nn if n in on and on[n] != nn[n]]
    oe = {json.dumps(e) for e in old.get("edges", [])}
    ne = {json.dumps(e) for e in new.get("edges", [])}
    changes += [f"edge {e} was removed" for e in sorted(oe - ne)]
    changes += [f"edge {e} was added" for e in sorted(ne - oe)]
    orr = {json.dumps(r[:2]): r[2] for r in old.get("routers", [])}
    nr = {json.dumps(r[:2]): r[2] for r in new.get("routers", [])}
    changes += [f"router {r} was removed" for r in orr if r not in nr]
    changes += [f"router {r} was added" for r in nr if r not in orr]
    changes += [f"the code of router {r} changed"
                + _what_changed(old_parts, new_parts, "routers", r)
                for r in nr if r in orr and orr[r] != nr[r]]
    ored, nred = old.get("reducers", {}), new.get("reducers", {})
    changes += [f"the reducer of state key {k!r} changed" for k in sorted({*ored, *nred})
                if ored.get(k) != nred.get(k)]
    return changes


#: no value (a required field's default): :func:`_same` as nothing
_NOTHING: Any = object()


_IDENTITY_EQ: Any = object.__eq__  # equality by identity: a class without __eq__


def _alias(info: Any, name: str) -> str:
    """The key a pydantic field is validated from: its alias when it has a plain one."""
    alias = getattr(info, "validation_alias", None)
    if not isinstance(alias, str):
        alias = getattr(info, "alias", None)
    return alias if isinstance(alias, str) else name


def _same(a: Any, b: Any) -> bool:
    """Whether a node's value of a field is the one it was given (so not a write): equal,
    or, for values whose ``==`` gives no single answer (an array) or is identity (an object
    without ``__eq__``: the node holds a copy), of the same content."""
    if b is _NOTHING:
        return False
    if a is b:
        return True
    try:
        eq = a == b
    except Exception:  # noqa: BLE001 - compared by content below
        eq = None
    if eq is True:
        return True
    if type(eq) is bool and type(a).__eq__ is not _IDENTITY_EQ:
        return False  # the type's own equality said so
    if type(a) is not type(b):
        return False
    from durably._keys.hashing import trace_digest

    digest = trace_digest(a)
    if digest:
        return digest == trace_digest(b)
    try:
        return pickle.dumps(a, 5) == pickle.dumps(b, 5)
    except Exception:  # noqa: BLE001 - not comparable: a write
        return False
