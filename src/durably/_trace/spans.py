"""The time a set of steps took together: the wall-clock span their executions covered."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["wall_span"]


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
