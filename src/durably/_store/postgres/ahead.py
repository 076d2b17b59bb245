"""Reading a resumed run's journal ahead, in pages, for a PostgreSQL store."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from durably.store import ReadAhead, ReplayRange

if TYPE_CHECKING:
    from durably._store.postgres.store import PostgresStore

__all__ = ["Ahead"]

#: rows of a run's journal read at a time when it is resumed
_PAGE_ROWS = 2000
_PAGE_BYTES = 64 << 20


class Ahead(ReadAhead):
    """The finished steps of a run being resumed, read a page at a time in journal order (a
    page is 2,000 rows or 64 MiB): a resumed run of 10,000 steps reads its journal in a few
    queries, not one a step. A step asked for that is not in the page is looked up alone.
    Each replay is kept as a one-step :class:`ReplayRange` anchored at its record, which
    :meth:`PostgresStore.append_replays` copies in one statement."""

    __slots__ = ("_after", "_buffer", "_done", "_page", "due", "run_id", "store", "thread")

    def __init__(self, store: PostgresStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.thread = threading.get_ident()
        self.due = False
        #: step id -> (value, blob, attempt, position, seq) of its first finished record
        self._page: dict[str, tuple[Any, str | None, int, int, int]] = {}
        self._buffer: list[ReplayRange] = []
        self._after: tuple[int, int, int] = (-1, -1, -1)
        self._done = False
        self._next_page()

    def _next_page(self) -> bool:
        if self._done:
            return False
        rows = self.store._read("read a run's journal", self.store._sql(
            "SELECT attempt, position, seq, step_id, value, blob "
            "FROM {s}.steps WHERE run_id = %s AND status IN ('ran', 'cached') "
            "AND (value IS NOT NULL OR blob IS NOT NULL) AND (attempt, position, seq) > "
            "(%s, %s, %s) ORDER BY attempt, position, seq LIMIT %s"),
            (self.run_id, *self._after, _PAGE_ROWS))
        page: dict[str, tuple[Any, str | None, int, int, int]] = {}
        size = 0
        for attempt, position, seq, step_id, value, blob in rows:
            self._after = (attempt, position, seq)
            page.setdefault(step_id, (value, blob, attempt, position, seq))
            size += len(value or b"")
            if size > _PAGE_BYTES:
                break
        self._done = len(rows) < _PAGE_ROWS and size <= _PAGE_BYTES
        self._page = page
        return bool(page)

    @property
    def buffered(self) -> bool:
        return bool(self._buffer)

    def replay(self, step_id: str, position: int, started: float) -> bytes | None:
        found = self._page.get(step_id)
        while found is None and self._next_page():
            found = self._page.get(step_id)
        if found is None:
            return self.store._find_raw(self.run_id, step_id)
        data, blob, attempt, at, seq = found
        self._buffer.append(ReplayRange(position, 1, (attempt, at, True), 0, step_id, step_id,
                                        started, time.time(), seq))
        self.due = len(self._buffer) >= 500
        return self.store._get_value(data, blob)

    def find(self, step_id: str) -> bytes | None:
        found = self._page.get(step_id)
        return None if found is None else self.store._get_value(found[0], found[1])

    def retract(self) -> None:
        if self._buffer:
            self._buffer.pop()

    def take_ranges(self) -> list[ReplayRange]:
        taken, self._buffer = self._buffer, []
        self.due = False
        return taken
