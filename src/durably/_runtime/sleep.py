"""Durable timers: :func:`sleep` and :func:`asleep` (DBOS's ``DBOS.sleep``).

Inside a run, a sleep is a step of its own (task ``durably.sleep``, a side effect: never
cached, found again by its position): its first execution journals the wake time,
``time.time() + seconds``, and the call then waits until that time. On replay (a resume
after a crash, a rerun) the step is served from the journal like any other, so the call
waits only for what is left of the original wait, or not at all. The wake time is
wall-clock time (seconds since the epoch), since it must mean the same in the process that
resumes the run, hours later, maybe on another machine; a wall clock set back or forward
moves the wake-up with it.

Like every side effect, the step is identified by its task, its (empty) inputs, its parent
step and its occurrence: the n-th durable sleep under one step (or in the entrypoint's own
body), whatever its duration. So a duration computed from the clock
(``sleep(deadline - time.time())``) stays durable: the resumed run wakes at the time the
first attempt journaled.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from typing import Any

from durably._runtime.call import call_sync
from durably._runtime.context import RunContext, StopRun, current_step, cutoff, live_run
from durably._runtime.spec import Spec
from durably.exceptions import DefinitionError

__all__ = ["asleep", "sleep"]

log = logging.getLogger("durably")

#: the wall clock the wake time is taken from and compared with, and the waits (test seams)
_clock = time.time
_wait = time.sleep


async def _await(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


#: the longest single wait: between two, a run that was told to stop (a closed stream, a
#: lost lease) stops, rather than at the end of a long sleep
_SLICE = 1.0


def _wake_at(seconds: float) -> float:
    """The body of the sleep step: the wake time, journaled as its result."""
    return _clock() + seconds


_wake_at.__module__ = "durably"  # (its identity, "durably:durably.sleep", never moves)
_wake_at.__qualname__ = _wake_at.__name__ = "sleep"
_SPEC: list[Spec] = []  # made on first use


def _spec() -> Spec:
    if not _SPEC:
        _SPEC.append(Spec(_wake_at, kind="task", name="durably.sleep", version="1",
                          cache=False, ignore=("seconds",)))
    return _SPEC[0]


def _seconds(seconds: Any, what: str) -> float:
    """``seconds`` as a float number of seconds (a negative one is 0: the time is due)."""
    if isinstance(seconds, datetime.timedelta):
        value = seconds.total_seconds()
    elif isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
        value = float(seconds)
    else:
        raise DefinitionError(
            f"{what}(seconds) takes a number of seconds or a datetime.timedelta, not "
            f"{type(seconds).__qualname__} {seconds!r}. Fix: {what}(30) or "
            f"{what}(datetime.timedelta(hours=6)).")
    if not math.isfinite(value) or value > _LONGEST:
        raise DefinitionError(
            f"{what}(seconds) was given {value!r}, which is no time to wake at. Fix: give a "
            f"finite number of seconds, at most {_LONGEST:,.0f} (a year).")
    return max(0.0, value)


#: the longest sleep (seconds): a year (what a clock and a wait can hold, with room)
_LONGEST = 365 * 86400.0


def _begin(seconds: float) -> tuple[RunContext | None, float]:
    """The run (None outside one) and the wake time: journaled by the sleep step on its
    first execution, read from the journal on replay."""
    ctx = live_run()
    if ctx is None:
        return None, _clock() + seconds
    wake = float(call_sync(_spec(), _wake_at, None, (seconds,), {}))
    if wake > _clock():
        try:  # (the run's queued cache entries: other processes see them while it waits)
            ctx.flush()
        except Exception as exc:  # noqa: BLE001 - the journal has them; the end retries
            log.debug("durably: run %r: queued entries not written before a sleep: %s",
                      ctx.run_id, exc)
    return ctx, wake


def _stopping(ctx: RunContext) -> bool:
    """Whether the run was told to stop (a closed stream, a lost lease), the fan-out item
    the sleep is in is stopping (Ctrl-C during a ``map``), or the body it is in was
    abandoned by its ``timeout=`` (as a fan-out's ``_stopping`` asks)."""
    abandoned = cutoff.get()
    return ctx.stop or bool(ctx.halting and ctx.halted(current_step.get())) or (
        abandoned is not None and abandoned.cut)


def sleep(seconds: float | datetime.timedelta) -> None:
    """Wait ``seconds``, durably: inside a run, a resumed run wakes at the time its first
    attempt set (DBOS's ``DBOS.sleep``).

    Inside a run the sleep is a step (task ``durably.sleep``): its first execution
    journals the wake time (``time.time() + seconds``, wall-clock seconds since the epoch,
    so that it means the same in the process that resumes the run), then waits until it.
    Killed during a six-hour sleep and resumed two hours later, the run waits the four
    hours left; resumed after the wake time, it goes on at once; a replay of a finished
    run never sleeps again. The step is found again by its position (the n-th durable
    sleep under the same step), not by its duration, as DBOS does: the first attempt's
    wake time holds, also when the duration is computed from the clock
    (``sleep(deadline - time.time())``).

    Ctrl-C interrupts the wait (the run is ``stopped``, and resumable: it then waits for
    what is left). A run told to stop (its ``stream()`` closed, its lease taken over), and
    an item of a ``task.map`` on threads that is stopping (Ctrl-C), stop within a second.
    Outside a run (and in a worker process of a fan-out, which has no run) it is a plain
    ``time.sleep``. In an ``async`` entrypoint, ``await`` :func:`asleep` instead, which
    does not block the event loop.

    Args:
        seconds: How long to wait: seconds (int or float), or a ``datetime.timedelta``.
            A negative duration is due already: no wait.

    Raises:
        DefinitionError: ``seconds`` is not a number or a timedelta, or is not finite, or is
            over a year.
        KeyboardInterrupt: Ctrl-C during the wait (inside a run: the run is stopped,
            resumable).

    Example:
        >>> import durably, tempfile
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... def remind(after):
        ...     durably.sleep(after)
        ...     return "time's up"
        >>> run = remind.run(0.1)
        >>> run.result, [s.task for s in run.steps]
        ("time's up", ['durably.sleep'])
        >>> remind.run(0.1).counts()["replayed"]   # called again: replayed, its time passed
        1
    """
    ctx, wake = _begin(_seconds(seconds, "durably.sleep"))
    while True:
        left = wake - _clock()
        if left <= 0:
            return
        if ctx is not None and _stopping(ctx):
            raise StopRun()
        _wait(min(left, _SLICE) if ctx is not None else left)


async def asleep(seconds: float | datetime.timedelta) -> None:
    """:func:`sleep` for ``async`` code: ``await durably.asleep(seconds)`` waits on the
    event loop (``asyncio.sleep``), durably inside a run.

    The wake time is journaled as for :func:`sleep` (a step ``durably.sleep``: a sync and
    an async sleep at one position are the same step); cancelling the task that waits
    stops the run (``stopped``, resumable). Outside a run it is a plain ``asyncio.sleep``.

    Args:
        seconds: How long to wait: seconds (int or float), or a ``datetime.timedelta``.
            A negative duration is due already: no wait.

    Raises:
        DefinitionError: ``seconds`` is not a number or a timedelta, or is not finite, or is
            over a year.

    Example:
        >>> import asyncio, durably, tempfile
        >>> @durably.entrypoint(store=durably.DiskStore(tempfile.mkdtemp()))
        ... async def remind(after):
        ...     await durably.asleep(after)
        ...     return "time's up"
        >>> asyncio.run(remind(0.1))
        "time's up"
    """
    ctx, wake = _begin(_seconds(seconds, "durably.asleep"))
    while True:
        left = wake - _clock()
        if left <= 0:
            return
        if ctx is not None and _stopping(ctx):
            raise StopRun()
        await _await(min(left, _SLICE) if ctx is not None else left)
