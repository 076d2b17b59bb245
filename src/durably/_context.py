"""The active run and step of the current thread or asyncio task (contextvars)."""

from __future__ import annotations

import itertools
import threading
from contextvars import ContextVar

from ._store import StepRecord, Store

__all__ = ["RunContext", "current_run", "current_step"]

_FLUSH_EVERY = 2048


class RunContext:
    """One execution (attempt) of a run: its store, counters and buffered replay records."""

    __slots__ = (
        "run_id", "store", "attempt", "_occurrences", "_positions", "_pending", "_lock",
        "counts",
    )

    def __init__(self, run_id: str, store: Store, attempt: int) -> None:
        self.run_id = run_id
        self.store = store
        self.attempt = attempt
        self._occurrences: dict[tuple[str | None, str], int] = {}
        self._positions = itertools.count()
        self._pending: list[tuple[StepRecord, bytes | None]] = []
        self._lock = threading.Lock()
        #: steps of this attempt by status: ran, cached, replayed, failed
        self.counts = {"ran": 0, "cached": 0, "replayed": 0, "failed": 0}

    def occurrence(self, parent: str | None, key: str) -> int:
        """The n-th identical call (same cache key) under the same parent, from 0."""
        with self._lock:
            n = self._occurrences.get((parent, key), 0)
            self._occurrences[(parent, key)] = n + 1
        return n

    def position(self) -> int:
        return next(self._positions)

    def count(self, status: str) -> None:
        with self._lock:
            self.counts[status] += 1

    def note_replayed(self, record: StepRecord) -> None:
        """Buffer a replay record; it is informational, so it is written in batches."""
        with self._lock:
            self._pending.append((record, None))
            self.counts["replayed"] += 1
            full = len(self._pending) >= _FLUSH_EVERY
        if full:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        self.store.append_steps(pending)


current_run: ContextVar[RunContext | None] = ContextVar("durably_run", default=None)
current_step: ContextVar[str | None] = ContextVar("durably_step", default=None)
