"""The active run and step of the current thread or asyncio task (contextvars)."""

from __future__ import annotations

import itertools
import threading
import time
from contextvars import ContextVar

from ._lease import RENEW_SECONDS, Owner
from ._store import KeyRecord, StepRecord, Store

__all__ = ["RunContext", "current_run", "current_step"]

_FLUSH_EVERY = 2048  # replay records buffered before a write
CACHE_BATCH = 256  # cache writes queued before a batch write
_CACHE_BYTES = 32 << 20  # ... or this many bytes of results
_CACHE_SECONDS = 1.0  # ... or when the oldest queued write is this old


class RunContext:
    """One execution (attempt) of a run: its store, counters and buffered replay records."""

    __slots__ = (
        "_cache_bytes",
        "_cache_since",
        "_cache_writes",
        "_lock",
        "_occurrences",
        "_pending",
        "_positions",
        "_renewed",
        "attempt",
        "counts",
        "owner",
        "run_id",
        "store",
    )

    def __init__(self, run_id: str, store: Store, attempt: int, owner: Owner) -> None:
        self.run_id = run_id
        self.owner = owner
        self._renewed = time.monotonic()
        self.store = store
        self.attempt = attempt
        self._occurrences: dict[tuple[str | None, str], int] = {}
        self._positions = itertools.count()
        self._pending: list[tuple[StepRecord, bytes | None]] = []
        self._lock = threading.Lock()
        #: steps of this attempt by status: ran, cached, replayed, failed
        self.counts = {"ran": 0, "cached": 0, "replayed": 0, "failed": 0}
        self._cache_writes: dict[str, tuple[bytes, KeyRecord | None]] = {}
        self._cache_bytes = 0
        self._cache_since = 0.0

    def keep_lease(self) -> None:
        """Renew the run's lease every RENEW_SECONDS (a long run keeps it from expiring)."""
        t = time.monotonic()
        if t - self._renewed >= RENEW_SECONDS:
            self._renewed = t
            self.store.renew_run(self.run_id, self.owner)

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

    def cache_later(self, key: str, data: bytes, info: KeyRecord | None) -> None:
        """Queue a cache write. Inside a run the journal already holds the result durably, so
        cache writes (shared with other runs) are batched: a crash loses only cache entries
        that the journal still has."""
        t = time.monotonic()
        with self._lock:
            if not self._cache_writes:
                self._cache_since = t
            self._cache_writes[key] = (data, info)
            self._cache_bytes += len(data)
            full = (len(self._cache_writes) >= CACHE_BATCH or self._cache_bytes >= _CACHE_BYTES
                    or t - self._cache_since >= _CACHE_SECONDS)
        if full:
            self.flush_cache()

    def pending_cache(self, key: str) -> bytes | None:
        """A queued cache write for this key, if any (so the run sees its own results)."""
        found = self._cache_writes.get(key)
        return found[0] if found is not None else None

    def flush_cache(self) -> None:
        with self._lock:
            writes, self._cache_writes, self._cache_bytes = self._cache_writes, {}, 0
        self.store.cache_put_many([(k, d, i) for k, (d, i) in writes.items()])

    def flush(self) -> None:
        """Write buffered replay records and queued cache writes."""
        with self._lock:
            pending, self._pending = self._pending, []
        try:
            self.store.append_steps(pending)
        finally:
            self.flush_cache()


current_run: ContextVar[RunContext | None] = ContextVar("durably_run", default=None)
current_step: ContextVar[str | None] = ContextVar("durably_step", default=None)
