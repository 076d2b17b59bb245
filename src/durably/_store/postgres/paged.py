"""A run's steps a page at a time, and counted by one aggregate, for the dashboard
(:meth:`PostgresStore.page_steps <durably.store.Journal.page_steps>` and
:meth:`~durably.store.Journal.count_steps`): kept apart from the store's write paths."""

from __future__ import annotations

from typing import TYPE_CHECKING

from durably._store.records import StepRecord

if TYPE_CHECKING:
    from durably._store.postgres.store import PostgresStore

__all__ = ["count_steps", "page_steps"]


def page_steps(store: PostgresStore, run_id: str, attempt: int, after: int,
               limit: int) -> list[StepRecord]:
    """One page of an attempt's step records in call order, read through the index on
    (run, attempt, position) and stopped at ``limit`` rows.

    Raises:
        ValueError: ``limit`` is less than 1.
    """
    from durably._store.postgres.store import _STEP_COLS, _undigests  # (it imports this)

    if limit < 1:
        raise ValueError(f"page_steps: limit must be at least 1, got {limit!r}")
    cols = ", ".join(_STEP_COLS[:-2])
    rows = store._read("list steps", store._sql(
        f"SELECT {cols} FROM {{s}}.steps WHERE run_id = %s AND attempt = %s "
        "AND position > %s ORDER BY position, seq LIMIT %s"), (run_id, attempt, after, limit))
    return [StepRecord(*row[:14], _undigests(row[14]),  # type: ignore[call-arg]
                       _undigests(row[15]), row[16] or 0.0) for row in rows]


def count_steps(store: PostgresStore, run_id: str, attempt: int) -> dict[str, dict[str, int]]:
    """An attempt's steps by task and status, each by its last record other than
    ``"started"``: one aggregate query."""
    rows = store._read("count steps", store._sql(
        "SELECT task, status, count(*) FROM (SELECT DISTINCT ON (step_id) task, status "
        "FROM {s}.steps WHERE run_id = %s AND attempt = %s AND status <> 'started' "
        "ORDER BY step_id, position DESC, seq DESC) AS last GROUP BY task, status"),
        (run_id, attempt))
    counts: dict[str, dict[str, int]] = {}
    for task, status, n in rows:
        counts.setdefault(task, {})[status] = int(n)
    return counts
