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
#: replay ranges buffered before they are journaled (a DiskStore's 2,048)
_RANGES = 2048


class Ahead(ReadAhead):
    """The finished steps of a run being resumed, read a page at a time in journal order (a
    page is 2,000 rows or 64 MiB): a resumed run of 10,000 steps reads its journal in a few
    queries, not one a step. A step asked for that is not in the page is looked up alone.

    Replays are kept as :class:`ReplayRange` s, which :meth:`PostgresStore.append_replays`
    copies from their records in one statement: steps replayed one after the other, at
    consecutive positions, from consecutive finished records of one attempt in a page, are
    one range (a run replayed in the order it executed: one a page), so that an attempt
    that only replays buffers few of them, and journals them with its end, without a
    lease, as on a DiskStore. A range's ``anchor`` is ``(attempt, position, True)`` of its
    first record and ``skip`` that record's ``seq``; its ``horizon`` is the greatest ``seq``
    of its page (a record journaled after the page was read, by a thread of that attempt
    that ended late, is not among its records)."""

    __slots__ = ("_after", "_buffer", "_done", "_horizon", "_last", "_next", "_open", "_page",
                 "due", "run_id", "store", "thread")

    def __init__(self, store: PostgresStore, run_id: str) -> None:
        self.store, self.run_id = store, run_id
        self.thread = threading.get_ident()
        self.due = False
        #: step id -> (value, blob, attempt, position, seq, row) of its first finished
        #: record (``row``: its index among the page's records)
        self._page: dict[str, tuple[Any, str | None, int, int, int, int]] = {}
        self._buffer: list[ReplayRange] = []  # closed ranges
        self._open: ReplayRange | None = None  # the range the next replay may extend
        self._last = -2  # the page row the open range ends with
        self._next = -1  # the position that extends it
        self._horizon = 0  # the greatest seq of the page
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
        page: dict[str, tuple[Any, str | None, int, int, int, int]] = {}
        size = 0
        self._close()  # (the rows of the next page are not consecutive with these)
        for row, (attempt, position, seq, step_id, value, blob) in enumerate(rows):
            self._after = (attempt, position, seq)
            self._horizon = max(self._horizon, seq)
            page.setdefault(step_id, (value, blob, attempt, position, seq, row))
            size += len(value or b"")
            if size > _PAGE_BYTES:
                break
        self._done = len(rows) < _PAGE_ROWS and size <= _PAGE_BYTES
        self._page = page
        return bool(page)

    def _close(self) -> None:
        if self._open is not None:
            self._buffer.append(self._open)
            self._open = None
            self.due = len(self._buffer) >= _RANGES
        self._last = -2

    @property
    def buffered(self) -> bool:
        return bool(self._buffer) or self._open is not None

    def replay(self, step_id: str, position: int, started: float) -> bytes | None:
        found = self._page.get(step_id)
        while found is None and self._next_page():
            found = self._page.get(step_id)
        if found is None:
            return self.store._find_raw(self.run_id, step_id)
        data, blob, attempt, at, seq, row = found
        ended = time.time()
        last = self._open
        if (last is not None and row == self._last + 1 and position == self._next
                and attempt == last.anchor[0]):
            self._open = last._replace(steps=last.steps + 1, last=step_id, ended=ended)
        else:
            self._close()
            self._open = ReplayRange(position, 1, (attempt, at, True), seq, step_id, step_id,
                                     started, ended, self._horizon)
        self._last, self._next = row, position + 1
        return self.store._get_value(data, blob)

    def find(self, step_id: str) -> bytes | None:
        found = self._page.get(step_id)
        return None if found is None else self.store._get_value(found[0], found[1])

    def retract(self) -> None:
        last = self._open
        if last is None:
            return
        if last.steps == 1:
            self._open = None
            self._last = -2
            return
        # (the range without its last step; ``last`` is not read back by this store)
        self._open = None
        self._buffer.append(last._replace(steps=last.steps - 1))
        self._last = -2
        self.due = len(self._buffer) >= _RANGES

    def take_ranges(self) -> list[ReplayRange]:
        self._close()
        taken, self._buffer = self._buffer, []
        self.due = False
        return taken
