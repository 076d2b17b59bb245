"""The time a set of steps took together: the wall-clock span their executions covered; and
the time an attempt of a run saved, by replay and by the cache."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from durably._store.records import StepRecord

__all__ = ["time_saved", "wall_span"]


def wall_span(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``(start, end)`` intervals (seconds since the epoch):
    steps that ran at the same time (a parallel map, a step and the steps it called) count
    once, not once each.

    This is what durably calls the *time saved* by reusing steps: the wall-clock time their
    original executions covered, never more than those executions' own wall time (a sum of
    durations said 11.85 s saved on a run of 2.2 s with 8 threads).

    Args:
        intervals: ``(start, end)`` pairs; one whose end is before its start counts 0.

    Returns:
        Seconds (float, 0.0 for none).

    Example:
        >>> wall_span([(0.0, 2.0), (1.0, 3.0), (0.5, 1.5), (10.0, 11.0)])
        4.0
    """
    total = 0.0
    reach: float | None = None
    start_of = 0.0
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if reach is None or start > reach:
            if reach is not None:
                total += reach - start_of
            start_of, reach = start, end
        elif end > reach:
            reach = end
    if reach is not None:
        total += reach - start_of
    return total


def time_saved(records: Sequence[StepRecord], attempt: int) -> tuple[float, float]:
    """Seconds attempt ``attempt`` of a run saved, ``(by replay, by the cache)``, from the
    run's step records of every attempt (see :meth:`durably.Run.time_saved`): by replay, the
    :func:`wall_span` of the original executions (``ran`` records of earlier attempts) of
    the steps it replayed; by the cache, the sum of the ``saved`` seconds of the steps it
    served from the cache, and of the cached records the steps it replayed were replayed
    from (each step once).

    Example:
        >>> def step(i, status, attempt, started, ended, saved=0.0):
        ...     return StepRecord("r", f"s{i}", None, "t", status, attempt, i, started,
        ...                       ended, saved=saved)
        >>> records = [step(0, "ran", 1, 0.0, 2.0), step(1, "cached", 1, 2.0, 2.1, 5.0),
        ...            step(0, "replayed", 2, 9.0, 9.0), step(1, "replayed", 2, 9.0, 9.0),
        ...            step(2, "cached", 2, 9.0, 9.1, 1.5)]
        >>> time_saved(records, 2)
        (2.0, 6.5)
    """
    first: dict[str, StepRecord] = {}  # step id -> the record that finished it first
    for s in records:
        if s.status in ("ran", "cached"):
            first.setdefault(s.step_id, s)
    intervals: list[tuple[float, float]] = []
    cache = 0.0
    counted: set[str] = set()
    for s in records:
        if s.attempt != attempt or s.step_id in counted:
            continue
        if s.status == "cached":
            counted.add(s.step_id)
            cache += s.saved
        elif s.status == "replayed":
            origin = first.get(s.step_id)
            if origin is None:
                continue
            counted.add(s.step_id)
            if origin.status == "ran":
                intervals.append((origin.started, origin.ended))
            else:
                cache += origin.saved
    return wall_span(intervals), cache
