"""Why would this call rerun? :class:`Explanation` compares a call's cache key, part by part,
with the nearest entry the task already has in the store."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from durably._keys.hashing import CLASS_USES, digest_each
from durably._runtime.config import default_store
from durably._runtime.spec import CLASS_PART, Spec
from durably._store.records import KeyRecord
from durably.store import Store

__all__ = ["Explanation", "explain"]


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Whether a call would be served from the cache, and if not, why.

    ``str(explanation)`` is one readable paragraph.

    Attributes:
        task: The task's name.
        cache_key: The cache key the call would use (32 hex characters).
        hit: True when the call would be served from the cache.
        reason: What decides it, in words.
        changed_arguments: Arguments whose digest differs from the nearest earlier entry.
        changed_code: Qualified names of the functions and classes of your code whose
            fingerprint differs from the nearest earlier entry (added or removed ones too),
            and of the classes of arguments whose code changed (an argument's digest covers
            the code of its user class: editing ``Params.effective_lr`` changes it).
        version_change: ``(old, new)`` explicit versions when they differ, else None.
        nearest: The key record of the nearest earlier entry, or None when there is none.
        expired: True when an entry with this key exists but is older than the task's
            ``expires_after`` (``nearest`` is then its key record).

    Example:
        >>> import durably
        >>> from durably.testing import MemoryStore
        >>> durably.configure(store=MemoryStore())
        >>> @durably.task
        ... def scale(x, factor=2):
        ...     return x * factor
        >>> _ = scale(3)
        >>> why = scale.explain(3, factor=5)
        >>> why.hit, why.changed_arguments
        (False, ('factor',))
        >>> durably.configure()
    """

    task: str
    cache_key: str
    hit: bool
    reason: str
    changed_arguments: tuple[str, ...] = ()
    changed_code: tuple[str, ...] = ()
    version_change: tuple[str | None, str | None] | None = None
    nearest: KeyRecord | None = None
    expired: bool = False

    def __str__(self) -> str:
        return self.reason

    @property
    def summary(self) -> str:
        """The decision in a few words, on one line (what ``DURABLY_LOG=debug`` logs for a
        miss): ``"hit"``, ``"expired (written ...)"``, ``"code changed: mod.helper"``,
        ``"argument 'x' differs"``, ``"no earlier entry"``..."""
        if self.hit:
            return "hit"
        if self.expired:
            return "expired: " + self.reason.partition("expired (")[2].rstrip(".)")
        if self.nearest is None:
            return "cache=False" if "has cache=False" in self.reason else "no earlier entry"
        if not (self.changed_arguments or self.changed_code or self.version_change):
            return "its entry was removed (evicted, pruned, cleared or found damaged)"
        why = []
        if self.version_change is not None:
            why.append(f"version changed from {self.version_change[0]!r} to "
                       f"{self.version_change[1]!r}")
        elif self.changed_code:
            why.append("code changed: " + ", ".join(self.changed_code))
        if self.changed_arguments:
            names = ", ".join(repr(a) for a in self.changed_arguments)
            why.append(f"argument{'s' if len(self.changed_arguments) > 1 else ''} {names} "
                       f"differ{'' if len(self.changed_arguments) > 1 else 's'}")
        return "; ".join(why)


def _short(d: str | None) -> str:
    return "absent" if d is None else d[:10] + "…"


def _differs(old: dict[str, str], new: dict[str, str]) -> tuple[str, ...]:
    return tuple(sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)))


def _moved_classes(arguments: dict[str, Any], name: str, before: dict[str, str]
                   ) -> list[tuple[str, list[str]]]:
    """The user classes met in argument ``name`` whose code digest differs from the one
    recorded with the earlier entry (``before``; classes it has no record of are left
    out: an entry written by an older durably records none), each with what changed among
    the functions, classes and constants its methods use (when the record has them)."""
    if name not in arguments or not before:
        return []
    now: dict[str, str] = {}
    digest_each({name: arguments[name]}, classes=now)
    moved = []
    for path, digest in sorted(now.items()):
        if CLASS_USES in path or before.get(path, digest) == digest:
            continue
        prefix = path + CLASS_USES
        had = {k for k in before if k.startswith(prefix)}
        used = sorted({k[len(prefix):] for k in had | {k for k in now if k.startswith(prefix)}
                       if before.get(k) != now.get(k)}) if had else []
        moved.append((path, used))
    return moved


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def explain(spec: Spec, store: Store | None, instance: Any, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Explanation:
    """Explain one call of a task (see :meth:`durably.Task.explain`)."""
    st = store if store is not None else (spec.store or default_store())
    arguments = spec.arguments(instance, args, kwargs)
    key = spec.cache_key(spec.digest_inputs(arguments))
    inputs = digest_each(arguments)
    code = spec.code_version()
    parts = spec.code_parts()
    name = spec.name
    if not spec.cache:
        return Explanation(name, key, False, f"task {name!r} has cache=False: it is never "
                           "served from the cache (inside a run, its journal still replays it).")
    if st.cache_get(key) is not None:
        policy = spec.policy
        if policy is not None and policy.expires_after is not None:
            record = st.find_key(spec.identity, key)
            if policy.expired(record.created if record is not None else None):
                written = (f"written {_when(record.created)}" if record is not None
                           else "written at a time it has no record of")
                return Explanation(name, key, False, (
                    f"{name}(...) would execute: its entry expired ({written}, more than "
                    f"expires_after={policy.expires_after:g} s ago)."), nearest=record,
                    expired=True)
        return Explanation(name, key, True, f"{name}(...) would be served from the cache: an "
                           "entry exists for this code and these inputs.")
    records = st.list_keys(spec.identity)
    if not records:
        return Explanation(name, key, False, f"{name}(...) would execute: the store has no "
                           f"earlier entry of task {spec.identity!r}.")

    def closeness(r: KeyRecord) -> tuple[int, int, int, float]:
        # the same code first, then the most arguments alike, then the fewest parts of the
        # code changed (an edit reverted since is not named), then the newest
        same_args = sum(1 for k, v in inputs.items() if r.inputs.get(k) == v)
        differing = sum(1 for k in r.parts.keys() | parts.keys()
                        if not k.startswith(CLASS_PART) and r.parts.get(k) != parts.get(k))
        return (r.code == code, same_args, -differing, r.created)

    nearest = max(records, key=closeness)
    changed_args = _differs(nearest.inputs, inputs)
    old_parts = {k: v for k, v in nearest.parts.items() if not k.startswith(CLASS_PART)}
    old_classes = {k[len(CLASS_PART):]: v for k, v in nearest.parts.items()
                   if k.startswith(CLASS_PART)}
    version_change = None
    changed_code: tuple[str, ...] = ()
    why: list[str] = []
    if nearest.code != code:
        old_v = nearest.code[2:] if nearest.code.startswith("v:") else None
        new_v = spec.version
        if old_v is not None or new_v is not None:
            version_change = (old_v, new_v)
            why.append(f"the version changed from {old_v!r} to {new_v!r}")
        else:
            changed_code = _differs(old_parts, parts)
            named = ", ".join(changed_code) if changed_code else "its fingerprint"
            why.append(f"the code changed: {named} (inside a run resumed with "
                       "keep_finished=True, a step that finished under the older code is "
                       "kept: run.steps names it by kept_from)")
    moved_classes: list[str] = []
    for arg in changed_args:
        moved = _moved_classes(arguments, arg, old_classes)
        for path, used in moved:
            moved_classes += [c for c in (path, *used) if c not in moved_classes]
        named = ", ".join(f"{path} ({', '.join(used)})" if used else path
                          for path, used in moved)
        # (the class's code is part of the argument's digest: whether its data changed
        # too cannot be told apart, so this says both, not which caused the miss)
        because = (f", and the code of its class {named} changed" if len(moved) == 1
                   else f", and the code of its classes {named} changed" if moved else "")
        why.append(f"argument {arg!r} differs ({_short(nearest.inputs.get(arg))} before, "
                   f"{_short(inputs.get(arg))} now){because}")
    changed_code += tuple(c for c in moved_classes if c not in changed_code)
    if not why:
        why.append("an entry with exactly this key was written, but it is no longer in the "
                   "cache (evicted under the size limit, found damaged, or cleared)")
    reason = (f"{name}(...) would execute. Compared with the nearest earlier entry "
              f"(written {_when(nearest.created)}): " + "; ".join(why) + ".")
    return Explanation(name, key, False, reason, changed_args, changed_code, version_change,
                       nearest)
