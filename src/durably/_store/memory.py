"""The memory store: everything in one process's memory, lost when it exits (tests, notebooks
that need no persistence; ``memory://NAME`` URLs). Re-exported by :mod:`durably.testing`."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from durably._store.lease import Owner
from durably.exceptions import RunStateError
from durably.store import FINISHED_STEP, EventRecord, KeyRecord, RunRecord, StepRecord, Store

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """A :class:`~durably.store.Store` in memory, for tests. Thread-safe; not shared between
    processes. Its transactions (:meth:`batch`) hold one lock that every write takes, and
    roll back what the block wrote when it raises."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._cache: dict[str, bytes] = {}
        self._runs: dict[str, RunRecord] = {}
        self._order: list[str] = []
        self._steps: dict[str, list[tuple[StepRecord, bytes | None]]] = {}
        self._finished: dict[tuple[str, str], bytes] = {}
        self._keys: dict[str, KeyRecord] = {}
        self._leases: dict[str, Owner] = {}
        self._events: dict[str, list[EventRecord]] = {}

    def __repr__(self) -> str:
        return f"<MemoryStore: {len(self._cache)} cache entries, {len(self._runs)} runs>"

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        with self._lock:
            saved = (dict(self._cache), dict(self._runs), list(self._order),
                     {r: len(v) for r, v in self._steps.items()}, dict(self._finished),
                     dict(self._keys), dict(self._leases),
                     {r: len(v) for r, v in self._events.items()})
            try:
                yield
            except BaseException:
                self._roll_back(saved)
                raise

    def _roll_back(self, saved: tuple[Any, ...]) -> None:
        (self._cache, self._runs, self._order, steps, self._finished, self._keys,
         self._leases, events) = saved
        for table, lengths in ((self._steps, steps), (self._events, events)):
            for run_id in list(table):
                if run_id not in lengths:
                    del table[run_id]
                else:
                    del table[run_id][lengths[run_id]:]

    def cache_get(self, key: str) -> bytes | None:
        return self._cache.get(key)

    def cache_get_timed(self, key: str) -> tuple[bytes, float] | None:
        with self._lock:
            data = self._cache.get(key)
            info = self._keys.get(key)
        if data is None:
            return None
        return data, info.duration if info is not None else 0.0

    def cache_delete(self, keys: Iterable[str]) -> int:
        with self._lock:
            removed = 0
            for key in keys:
                removed += self._cache.pop(key, None) is not None
            return removed

    def cache_put(self, key: str, value: bytes, info: KeyRecord | None = None) -> None:
        self.cache_put_many(((key, value, info),))

    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        with self._lock:
            for key, value, info in items:
                self._cache[key] = bytes(value)
                if info is not None:
                    self._keys[key] = info

    def clear_task(self, task: str) -> int:
        """Remove the cache entries of the task of this identity (see ``Task.clear``)."""
        with self._lock:
            keys = [k for k, info in self._keys.items() if info.task == task]
            for k in keys:
                self._keys.pop(k, None)
            return sum(self._cache.pop(k, None) is not None for k in keys)

    def task_identities(self) -> list[str]:
        with self._lock:
            return sorted({k.task for k in self._keys.values()})

    def find_key(self, task: str, key: str) -> KeyRecord | None:
        with self._lock:
            found = self._keys.get(key)
        return found if found is not None and found.task == task else None

    def list_keys(self, task: str, limit: int = 100) -> list[KeyRecord]:
        with self._lock:
            found = [k for k in self._keys.values() if k.task == task]
        found.sort(key=lambda k: k.created, reverse=True)
        return found[:limit]

    def find_run(self, run_id: str) -> RunRecord | None:
        rec = self._runs.get(run_id)
        return dataclasses.replace(rec) if rec else None

    def find_latest_run(self, entrypoint: str, input_digest: str) -> RunRecord | None:
        for rec in self.list_runs(entrypoint):
            if rec.entrypoint == entrypoint and rec.input_digest == input_digest:
                return rec
        return None

    def put_run(self, record: RunRecord) -> None:
        with self._lock:
            self._runs[record.run_id] = dataclasses.replace(record)
            if record.run_id in self._order:
                self._order.remove(record.run_id)
            self._order.append(record.run_id)

    def acquire_run(self, run_id: str, owner: Owner) -> Owner | None:
        with self._lock:
            holder = self._leases.get(run_id)
            if holder is not None and holder.token != owner.token and holder.alive(
                    time.time()):
                return holder
            self._leases[run_id] = owner
        return None

    def run_holder(self, run_id: str) -> Owner | None:
        """The owner of the run's lease if it is alive, else None (as
        :meth:`DiskStore.run_holder <durably.DiskStore.run_holder>`)."""
        with self._lock:
            holder = self._leases.get(run_id)
        return holder if holder is not None and holder.alive(time.time()) else None

    def renew_run(self, run_id: str, owner: Owner) -> bool:
        with self._lock:
            held = self._leases.get(run_id)
            if held is None or held.token != owner.token:
                return False
            self._leases[run_id] = dataclasses.replace(held, heartbeat=time.time())
            return True

    def release_run(self, run_id: str, owner: Owner) -> bool:
        with self._lock:
            if (held := self._leases.get(run_id)) is not None and held.token == owner.token:
                del self._leases[run_id]
                return True
        return False

    def list_runs(self, entrypoint: str | None = None) -> list[RunRecord]:
        with self._lock:
            recs = [self._runs[r] for r in reversed(self._order)]
        recs.sort(key=lambda r: r.updated, reverse=True)  # stable: ties keep newest first
        return [
            dataclasses.replace(r) for r in recs
            if entrypoint is None or entrypoint in (r.entrypoint, r.name)
        ]

    def find_step(self, run_id: str, step_id: str) -> bytes | None:
        return self._finished.get((run_id, step_id))

    def put_run_if_current(self, record: RunRecord, previous: int | None = None) -> bool:
        """:meth:`put_run`, only while the run is still ``record.attempt``'s (with
        ``previous``: while the stored record has that attempt)."""
        with self._lock:
            stored = self._runs.get(record.run_id)
            if stored is None or stored.attempt != (record.attempt if previous is None
                                                    else previous):
                return False
            self.put_run(record)
            return True

    def delete_runs(self, run_ids: Iterable[str], *, dry_run: bool = False,
                    skip_executing: bool = False) -> list[str]:
        with self._lock:
            doomed: list[str] = []
            for run_id in dict.fromkeys(run_ids):
                if run_id not in self._runs:
                    continue
                if self.run_holder(run_id) is not None:
                    if skip_executing:
                        continue
                    raise RunStateError(f"run {run_id!r} is executing in a live process; "
                                        "it cannot be deleted. Fix: wait for it to end.")
                doomed.append(run_id)
            if not dry_run:
                for run_id in doomed:
                    del self._runs[run_id]
                    self._order.remove(run_id)
                    self._steps.pop(run_id, None)
                    self._events.pop(run_id, None)
                    self._leases.pop(run_id, None)
                    for k in [k for k in self._finished if k[0] == run_id]:
                        del self._finished[k]
            return doomed

    def append_steps_if_current(self, steps: Sequence[tuple[StepRecord, bytes | None]]
                                ) -> bool:
        """:meth:`append_steps`, only while each step's run is still its attempt's (as
        :meth:`DiskStore.append_steps_if_current
        <durably.DiskStore.append_steps_if_current>`)."""
        with self._lock:
            mine = [(rec, data) for rec, data in steps
                    if (stored := self._runs.get(rec.run_id)) is not None
                    and stored.attempt == rec.attempt]
            self.append_steps(mine)
        return len(mine) == len(steps)

    def append_steps(self, steps: Sequence[tuple[StepRecord, bytes | None]]) -> None:
        with self._lock:
            for rec, data in steps:
                self._steps.setdefault(rec.run_id, []).append((rec, data))
                if rec.status in FINISHED_STEP and data is not None:
                    self._finished.setdefault((rec.run_id, rec.step_id), bytes(data))

    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        with self._lock:
            recs = [r for r, _ in self._steps.get(run_id, ())]
        if attempt is not None:
            recs = [r for r in recs if r.attempt == attempt]
        return sorted(recs, key=lambda r: (r.attempt, r.position))

    def finished_steps(self, run_id: str, step_ids: Iterable[str]) -> dict[str, StepRecord]:
        """The record that finished each of these steps (see
        :meth:`durably.store.Journal.finished_steps`): the run's records filtered, not
        listed whole."""
        wanted = set(step_ids)
        if not wanted:
            return {}
        with self._lock:
            recs = [r for r, _ in self._steps.get(run_id, ())
                    if r.step_id in wanted and r.status in ("ran", "cached")]
        recs.sort(key=lambda r: (r.attempt, r.position))
        found: dict[str, StepRecord] = {}
        for rec in recs:
            found.setdefault(rec.step_id, rec)
        return found

    def page_steps(self, run_id: str, attempt: int, *, after: int = -1,
                   limit: int = 100) -> list[StepRecord]:
        """One page of an attempt's step records in call order (see
        :meth:`durably.store.Journal.page_steps`)."""
        if limit < 1:
            raise ValueError(f"page_steps: limit must be at least 1, got {limit!r}")
        with self._lock:
            recs = [r for r, _ in self._steps.get(run_id, ())
                    if r.attempt == attempt and r.position > after]
        recs.sort(key=lambda r: r.position)
        return recs[:limit]

    def count_steps(self, run_id: str, attempt: int) -> dict[str, dict[str, int]]:
        """An attempt's steps by task and status, each by its last record other than
        ``"started"`` (see :meth:`durably.store.Journal.count_steps`)."""
        with self._lock:
            recs = [r for r, _ in self._steps.get(run_id, ())
                    if r.attempt == attempt and r.status != "started"]
        last = {r.step_id: r for r in sorted(recs, key=lambda r: r.position)}
        counts: dict[str, dict[str, int]] = {}
        for r in last.values():
            by_status = counts.setdefault(r.task, {})
            by_status[r.status] = by_status.get(r.status, 0) + 1
        return counts

    def append_events(self, events: Sequence[EventRecord]) -> None:
        with self._lock:
            for event in events:
                self._events.setdefault(event.run_id, []).append(event)

    def list_events(self, run_id: str, kinds: Sequence[str] | None = None) -> list[EventRecord]:
        with self._lock:
            found = list(self._events.get(run_id, ()))
        return found if kinds is None else [e for e in found if e.kind in kinds]

    def close(self) -> None:
        """Nothing to release."""
