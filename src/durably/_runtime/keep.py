"""Keeping what a run finished under older code: ``run(..., keep_finished=True)``.

A step's identity is its parent, its cache key and its occurrence, and a cached task's key
covers its code: fixing the task that crashed a long job gives every call of it a new
identity, so an exact resume executes them all again. With ``keep_finished=True`` a resumed
attempt first looks, for a call of a cached task that its journal does not have, for the
step this run finished under an older code version of that task with the same inputs, the
same (matched) parent and the same occurrence, and replays its result (a *kept* step).

How a step is matched (:class:`Keeper`):

- the run's step records (every attempt) are read once, on the attempt's first call that
  its journal does not have; for each task, the code versions this run used are read from
  the key records of the cache keys its records name (a key is ``(task, code, inputs)``);
- for each older code version ``c`` of the task, the call's key under ``c`` is
  ``key(task, c, input digest)`` and its step id ``(parent, key, occurrence)`` under the
  parent the older attempt had: a finished record with that id is the same task called with
  the same inputs at the same place. No digest is compared loosely: a kept result is one
  the journal holds for exactly these inputs;
- a parent whose own code changed has a new id: a step that executes now and matches an
  unfinished record of older code (``started``: it was executing when the attempt ended)
  stands for that record, so its children are matched under it, however deep. Its older
  code is not known when none of its task's steps finished (no key record): it is then
  matched by task, parent, the short repr of its arguments and the tracer's digests of
  them (only to find its children: each child is matched exactly, as above). A
  ``cache=False`` step keeps its id whatever its code (see
  :meth:`~durably._runtime.spec.Spec.side_effect_key`).

A kept step is journaled under its new id as a ``cached`` record holding the older result
and a note (:data:`KEPT`, read back by :attr:`durably.StepRecord.kept_from`), with the cache
key its result was computed under; later attempts replay it exactly. It is never written to
the cross-run cache under the new key (its code was older).

Limits: the code versions of a task are read from key records. A task whose finished steps
have none left (pruned with the cache, or never written: steps that depended on an answer to
``interrupt()``, cheap steps whose batched cache writes a ``SIGKILL`` lost) executes again.
"""

from __future__ import annotations

import collections
import pickle
import threading
from collections.abc import Sequence
from typing import Any

import xxhash

from durably._keys.hashing import digest_each
from durably._runtime.spec import Spec
from durably._runtime.step import Call, _load
from durably._store.records import FINISHED_STEP, RunRecord, StepRecord
from durably._trace.producers import digests_only
from durably._trace.tracer import flow_digests, inputs_repr, short_repr
from durably.store import Store

__all__ = ["KEPT", "Keeper", "keep_finished", "kept_steps",
           "rerun_after_code_change"]

#: how the note of a kept step begins (its ``error`` field: a finished step has no error)
KEPT = "kept: "
#: the statuses of a record that was executing when its attempt ended (it may have children)
_UNFINISHED = ("started", "failed", "interrupted")
#: at most this many key records of one task are read to find its code versions
_MAX_KEY_RECORDS = 1 << 20


def _key(identity: str, code: str, input_digest: str) -> str:
    """The cache key of a call under code version ``code``: the key
    :meth:`~durably._runtime.spec.Spec.key_and_code` makes (a test pins the two equal)."""
    return xxhash.xxh3_128_hexdigest(f"{identity}\x00{code}\x00{input_digest}".encode())


def _step_id(parent: str | None, key: str, occurrence: int) -> str:
    """:func:`~durably._runtime.spec.step_identity`, for a cached task's call."""
    return xxhash.xxh3_128_hexdigest(f"{parent or ''}/{key}/{occurrence}".encode())


class Keeper:
    """The steps one resumed attempt may keep from older code (``keep_finished=True``);
    built on its first call that the journal does not have, then read by every thread of
    the attempt."""

    def __init__(self, run_id: str, store: Store, attempt: int) -> None:
        self.run_id = run_id
        self.store = store
        self.attempt = attempt
        self._lock = threading.Lock()
        self._records: dict[str, str] | None = None  # step id -> status, earlier attempts
        self._keys: dict[str, set[str]] = {}  # task name -> cache keys its records name
        self._codes: dict[str, list[str]] = {}  # task identity -> code versions, newest first
        #: a step executing now -> the unfinished record of older code it stands for
        self.alias: dict[str, str] = {}
        #: unfinished records by (task, parent, inputs repr, flow digests), in call order
        self._unfinished: dict[tuple[Any, ...], list[str]] = {}
        self._parents: set[tuple[str, str | None]] = set()  # (task, parent) of those
        self.kept = 0

    def _index(self) -> dict[str, str]:
        records = self._records
        if records is not None:
            return records
        with self._lock:
            if self._records is None:
                found: dict[str, str] = {}
                for s in self.store.list_steps(self.run_id):
                    if s.attempt >= self.attempt:
                        continue
                    if found.get(s.step_id) not in FINISHED_STEP:
                        found[s.step_id] = s.status
                    if s.status == "started" and s.cache_key:
                        what = (s.task, s.parent_id, s.inputs, digests_only(s.input_digests))
                        self._unfinished.setdefault(what, []).append(s.step_id)
                        self._parents.add((s.task, s.parent_id))
                    if s.cache_key:
                        self._keys.setdefault(s.task, set()).add(s.cache_key)
                self._records = found
            return self._records

    def _codes_of(self, spec: Spec) -> list[str]:
        """The code versions of ``spec``'s task that this run's records were made with,
        newest first (from the key records of their cache keys: an attempt writes a task's
        first entry under each code version at once, so a SIGKILL that loses the batched
        writes of quick steps never loses the code version)."""
        codes = self._codes.get(spec.identity)
        if codes is not None:
            return codes
        with self._lock:
            codes = self._codes.get(spec.identity)
            if codes is not None:
                return codes
            wanted = set(self._keys.get(spec.name, ()))
            found: dict[str, float] = {}
            limit = max(256, 2 * len(wanted))
            while wanted:
                rows = self.store.list_keys(spec.identity, limit)
                for r in rows:
                    if r.cache_key in wanted:
                        wanted.discard(r.cache_key)
                        found[r.code] = max(found.get(r.code, 0.0), r.created)
                if len(rows) < limit or limit >= _MAX_KEY_RECORDS:
                    break
                limit *= 4
            codes = self._codes[spec.identity] = sorted(found, key=found.__getitem__,
                                                        reverse=True)
        return codes

    def find(self, spec: Spec, parent: str | None, input_digest: str, occurrence: int,
             step_id: str, code: str, instance: Any = None, args: tuple[Any, ...] = (),
             kwargs: dict[str, Any] | None = None) -> tuple[str, str, bytes] | None:
        """The record of older code this call may keep: ``(old step id, its cache key, its
        result)``, or None (the call executes). A call that matches an unfinished record
        of older code is noted to stand for it (its children are matched under it)."""
        records = self._index()
        if spec.name not in self._keys:
            return None
        before = self.alias.get(parent, parent) if parent is not None else None
        for old_code in self._codes_of(spec):
            if old_code == code:
                continue
            old_key = _key(spec.identity, old_code, input_digest)
            old_id = _step_id(before, old_key, occurrence)
            status = records.get(old_id)
            if status is None:
                continue
            if status in FINISHED_STEP or status == "replayed":
                data = self.store.find_step(self.run_id, old_id)
                if data is not None:
                    return old_id, old_key, data
            if status in _UNFINISHED:
                self.alias.setdefault(step_id, old_id)
        if step_id not in self.alias and (spec.name, before) in self._parents:
            self._stand_for(spec, before, step_id, instance, args, kwargs or {})
        return None

    def _stand_for(self, spec: Spec, before: str | None, step_id: str, instance: Any,
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A step about to execute whose older code is not known (a step that never
        finished has no key record): it stands for the next unfinished record of its task
        under the same parent that was called with arguments of the same short repr and
        tracer digests. Only its children's parent is taken from it: each of them is still
        matched by its own task, inputs and occurrence."""
        arguments = spec.arguments(instance, args, kwargs)
        # (the digests its record holds: those of a call of a cached task, see begin_step)
        flow = flow_digests(arguments, digest_each(arguments))
        what = (spec.name, before, inputs_repr(arguments), flow)
        with self._lock:
            waiting = self._unfinished.get(what)
            if waiting:
                self.alias[step_id] = waiting.pop(0)

    def serve(self, found: tuple[str, str, bytes], call: Call, instance: Any,
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The kept result of ``call``, journaled as a kept step (see the module)."""
        old_id, old_key, data = found
        spec, ctx = call.spec, call.ctx
        assert ctx is not None
        try:
            value = pickle.loads(data)
        except Exception:  # noqa: BLE001 - not a plain pickle, or it fails: said by _load
            value = _load(data, spec, "journaled")
        arguments = spec.arguments(instance, args, kwargs)
        if call.args_repr is None:
            call.args_repr = inputs_repr(arguments)
        call.trace_inputs(arguments)
        call.key = old_key  # (the record names the key its result was computed under)
        note = (f"{KEPT}finished under older code (step {old_id}); replayed with "
                "keep_finished=True")
        record = call.record("cached", note, short_repr(value))
        ctx.note_cached(record, data)
        ctx.producers.returned(value, call.step_id)  # (a later step given it draws an edge)
        with self._lock:
            self.kept += 1
        if ctx.listener is not None:
            ctx.emit(call.event("step_finished", record))
        return value


def keep_finished(ctx: Any) -> None:
    """Make a resumed attempt keep the steps its run finished under older code."""
    if ctx.replaying:
        ctx.keep = Keeper(ctx.run_id, ctx.store, ctx.attempt)


def kept_steps(steps: Sequence[StepRecord]) -> int:
    """How many of these records (one attempt's, the last record of each step) are kept
    steps."""
    last = {s.step_id: s for s in steps}
    return sum(1 for s in last.values() if s.kept_from is not None)


def rerun_after_code_change(store: Store, record: RunRecord) -> int:
    """How many steps of the run's latest attempt executed although an earlier attempt had
    finished them: a step of the same task with the same inputs (their short repr and the
    digests the tracer keeps), under another id — its code changed (a cached task's id
    follows its code). A count for the summary, never a reason to reuse anything."""
    attempt = record.attempt
    if attempt < 2:
        return 0
    before: collections.Counter[tuple[Any, ...]] = collections.Counter()
    finished: set[str] = set()
    ran: list[StepRecord] = []
    for s in store.list_steps(record.run_id):
        if s.attempt < attempt and s.status in FINISHED_STEP:
            if s.step_id not in finished:
                finished.add(s.step_id)
                before[(s.task, s.inputs, digests_only(s.input_digests))] += 1
        elif s.attempt == attempt and s.status == "ran" and s.cache_key:
            ran.append(s)
    count = 0
    for s in ran:
        what = (s.task, s.inputs, digests_only(s.input_digests))
        if s.step_id not in finished and s.inputs is not None and before[what] > 0:
            before[what] -= 1
            count += 1
    return count
