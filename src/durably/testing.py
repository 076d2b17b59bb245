"""Helpers for testing code that uses durably.

:class:`MemoryStore` keeps the cache and the journals in memory: fast, isolated, gone with
the process. It passes the same conformance suite as :class:`~durably.DiskStore`.

Example:
    >>> import durably
    >>> from durably.testing import MemoryStore
    >>> store = MemoryStore()
    >>> @durably.entrypoint(store=store)
    ... def greet(name):
    ...     return "hi " + name
    >>> greet("ada"), len(store.list_runs())
    ('hi ada', 1)
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

from ._lease import Owner
from ._serde import Spilled
from ._store import FINISHED_STEP, EventRecord, KeyRecord, RunRecord, StepRecord

__all__ = ["MemoryStore"]


class MemoryStore:
    """A :class:`~durably.Store` in memory, for tests. Thread-safe; not shared between
    processes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
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

    def cache_get(self, key: str) -> bytes | None:
        return self._cache.get(key)

    def cache_put(self, key: str, value: bytes, info: KeyRecord | None = None) -> None:
        self.cache_put_many(((key, value, info),))

    def cache_put_many(self, items: Sequence[tuple[str, bytes, KeyRecord | None]]) -> None:
        with self._lock:
            for key, value, info in items:
                self._cache[key] = _kept(value)
                if info is not None:
                    self._keys[key] = info

    def clear_task(self, task: str) -> int:
        """Remove the cache entries of the task of this identity (see ``Task.clear``)."""
        with self._lock:
            keys = [k for k, info in self._keys.items() if info.task == task]
            for k in keys:
                self._keys.pop(k, None)
                self._cache.pop(k, None)
            return len(keys)

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
        # a memory store lives in one process: its owners are alive while it is
        with self._lock:
            held = self._leases.get(run_id)
        return held is not None and held.token == owner.token

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
                    self._finished.setdefault((rec.run_id, rec.step_id), _kept(data))

    def list_steps(self, run_id: str, attempt: int | None = None) -> list[StepRecord]:
        with self._lock:
            recs = [r for r, _ in self._steps.get(run_id, ())]
        if attempt is not None:
            recs = [r for r in recs if r.attempt == attempt]
        return sorted(recs, key=lambda r: (r.attempt, r.position))

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


def _kept(value: bytes) -> bytes:
    """What the store keeps of a value: a copy of its bytes, or the handle of a large value
    kept in a file (its file lives as long as the handle)."""
    return value if isinstance(value, Spilled) else bytes(value)
