"""The smallest store: only the abstract methods of :class:`durably.store.Store`, nothing else.

Every default of the protocol is exercised through it (snapshots, ``check_run``,
``parents_of``, ``append_replays``, no read-ahead), and it declares no capability: large
values reach it as bytes. It passes :class:`durably.testing.StoreConformance` and the whole
behaviour suite (``tests/conftest.py`` runs every store-fixture test on it), which is what
proves that the runtime needs nothing but the protocol. A backend author can start from it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from durably.exceptions import RunStateError
from durably.store import (
    FINISHED_STEP,
    EventRecord,
    KeyRecord,
    Owner,
    RunRecord,
    StepRecord,
    Store,
)

#: what a transaction puts back when its block raises
_TABLES = ("_values", "_keys", "_runs", "_written", "_leases")


class MinimalStore(Store):
    """Dictionaries behind one reentrant lock; a transaction holds the lock and puts the
    dictionaries back as they were when its block raises."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._values: dict[str, bytes] = {}
        self._keys: dict[str, KeyRecord] = {}
        self._runs: dict[str, RunRecord] = {}
        self._written: dict[str, int] = {}  # run id -> write counter (ties in list_runs)
        self._clock = 0
        self._steps: dict[str, list[tuple[StepRecord, bytes | None]]] = {}
        self._events: dict[str, list[EventRecord]] = {}
        self._leases: dict[str, Owner] = {}

    # -- journal ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self._lock:
            saved = {name: copy.copy(getattr(self, name)) for name in _TABLES}
            saved["_steps"] = {r: list(v) for r, v in self._steps.items()}
            saved["_events"] = {r: list(v) for r, v in self._events.items()}
            saved["_clock"] = self._clock
            try:
                yield
            except BaseException:
                self.__dict__.update(saved)
                raise

    def find_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            rec = self._runs.get(run_id)
            return None if rec is None else rec.copy()

    def find_latest_run(self, entrypoint: str, input_digest: str) -> RunRecord | None:
        for rec in self.list_runs():
            if rec.entrypoint == entrypoint and rec.input_digest == input_digest:
                return rec
        return None

    def list_runs(self, entrypoint: str | None = None) -> list[RunRecord]:
        with self._lock:
            recs = [r.copy() for r in self._runs.values()
                    if entrypoint is None or entrypoint in (r.entrypoint, r.name)]
            written = dict(self._written)
        recs.sort(key=lambda r: (r.updated, written[r.run_id]), reverse=True)
        return recs

    def put_run(self, record: RunRecord) -> None:
        with self._lock:
            self._runs[record.run_id] = record.copy()
            self._clock += 1
            self._written[record.run_id] = self._clock

    def put_run_if_current(self, record: RunRecord, previous: int | None = None) -> bool:
        with self._lock:
            stored = self._runs.get(record.run_id)
            wanted = record.attempt if previous is None else previous
            if stored is None or stored.attempt != wanted:
                return False
            self.put_run(record)
            return True

    def delete_runs(self, run_ids: Iterable[str], *, dry_run: bool = False,
                    skip_executing: bool = False) -> list[str]:
        with self._lock:
            doomed = []
            for run_id in dict.fromkeys(run_ids):
                if run_id not in self._runs:
                    continue
                if self.run_holder(run_id) is not None:
                    if skip_executing:
                        continue
                    raise RunStateError(f"run {run_id!r} is executing; it cannot be deleted")
                doomed.append(run_id)
            if not dry_run:
                for run_id in doomed:
                    for table in (self._runs, self._written, self._steps, self._events,
                                  self._leases):
                        table.pop(run_id, None)
            return doomed

    def acquire_run(self, run_id: str, owner: Owner) -> Owner | None:
        with self._lock:
            holder = self._leases.get(run_id)
            if holder is not None and holder.token != owner.token and holder.alive(time.time()):
                return holder
            self._leases[run_id] = owner
            return None

    def run_holder(self, run_id: str) -> Owner | None:
        with self._lock:
            holder = self._leases.get(run_id)
        return holder if holder is not None and holder.alive(time.time()) else None

    def renew_run(self, run_id: str, owner: Owner) -> bool:
        with self._lock:
            holder = self._leases.get(run_id)
            if holder is None or holder.token != owner.token:
                return False
            self._leases[run_id] = dataclasses.replace(holder, heartbeat=time.time())
            return True

    def release_run(self, run_id: str, owner: Owner) -> bool:
        with self._lock:
            holder = self._leases.get(run_id)
            if holder is None or holder.token != owner.token:
                return False
            del self._leases[run_id]
            return True

    def find_step(self, run_id: str, step_id: str) -> bytes | None:
        with self._lock:
            for rec, data in self._steps.get(run_id, ()):
                if rec.step_id == step_id and rec.status in FINISHED_STEP and data is not None:
                    return data
        return None

    def append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> None:
        with self._lock:
            for rec, data in steps:
                self._steps.setdefault(rec.run_id, []).append(
                    (rec, None if data is None else bytes(data)))

    def append_steps_if_current(self, steps: Sequence[tuple[StepRecord, bytes | None]]
                                ) -> bool:
        with self._lock:
            mine = [(rec, data) for rec, data in steps
                    if (run := self._runs.get(rec.run_id)) is not None
                    and run.attempt == rec.attempt]
            self.append_steps(mine)
            return len(mine) == len(steps)

    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        with self._lock:
            recs = [rec for rec, _ in self._steps.get(run_id, ())
                    if attempt is None or rec.attempt == attempt]
        return sorted(recs, key=lambda r: (r.attempt, r.position))

    def append_events(self, events: Sequence[EventRecord]) -> None:
        with self._lock:
            for event in events:
                self._events.setdefault(event.run_id, []).append(event)

    def list_events(self, run_id: str, kinds: Sequence[str] | None = None) -> list[EventRecord]:
        with self._lock:
            found = list(self._events.get(run_id, ()))
        return found if kinds is None else [e for e in found if e.kind in kinds]

    # -- values and key records ----------------------------------------------------------
    def cache_get(self, key: str) -> bytes | None:
        with self._lock:
            return self._values.get(key)

    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        with self._lock:
            for key, value, info in items:
                self._values[key] = bytes(value)
                if info is not None:
                    self._keys[key] = info

    def cache_delete(self, keys: Iterable[str]) -> int:
        with self._lock:
            removed = 0
            for key in keys:
                removed += self._values.pop(key, None) is not None
            return removed

    def task_identities(self) -> list[str]:
        with self._lock:
            return sorted({k.task for k in self._keys.values()})

    def list_keys(self, task: str, limit: int = 100) -> list[KeyRecord]:
        with self._lock:
            found = [k for k in self._keys.values() if k.task == task]
        found.sort(key=lambda k: k.created, reverse=True)
        return found[:limit]

    def clear_task(self, task: str) -> int:
        with self._lock:
            keys = [k for k, info in self._keys.items() if info.task == task]
            for key in keys:
                del self._keys[key]
            return self.cache_delete(keys)

