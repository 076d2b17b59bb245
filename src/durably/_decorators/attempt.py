"""How an entrypoint's attempt ends: it waits for the steps it submitted and did not wait
for, gathers the interrupts it ended with (raised, grouped, or swallowed by the user's
code), and returns the :class:`~durably.Run` handle or raises
:class:`~durably.RunInterrupted`; and the check that a run to resume is waiting for an
answer.

Separate from :mod:`.entrypoint`, whose sync and async runs, resume and fork all end an
attempt the same way.
"""

from __future__ import annotations

import warnings
from typing import Any

from durably._runtime.attempt import is_cancelled
from durably._runtime.interrupt import InterruptSignal
from durably._runtime.run import _UNSET, Run, executing
from durably._store.records import RunRecord, now
from durably.exceptions import (
    RunCancelledError,
    RunInterrupted,
    RunStateError,
    RunTimeoutError,
)
from durably.store import Store


def _require_interrupted(rec: RunRecord, store: Store | None = None) -> None:
    if rec.status == "interrupted":
        return
    # (store None: read under the run's lease, so no other attempt executes it now)
    if rec.status == "running" and (store is None or not executing(store, rec.run_id)):
        raise RunStateError(
            f"run {rec.run_id!r} crashed (its process is gone) while running, so it is not "
            "waiting for an answer: resume() answers an interrupt(). An answer the crashed "
            "attempt was given is recorded. Fix: call the entrypoint again with the same "
            "arguments (a graph: app.invoke(None, run_id=...)) to continue it.")
    if rec.status == "running":
        raise RunStateError(
            f"run {rec.run_id!r} is being executed right now (another process or thread "
            "called the entrypoint again, or resumed it), so it is not waiting for an answer; "
            "this answer is not recorded. Fix: wait for that attempt to end: if it pauses at "
            "the question again (durably.get_run(run_id).status == 'interrupted'), call "
            "resume() again.")
    raise RunStateError(
        f"run {rec.run_id!r} is {rec.status}, not interrupted: resume() answers an "
        "interrupt(), and this run is not waiting for one"
        + (" (another process may have resumed it just now). Fix: call the entrypoint again "
           "with the same arguments to continue it." if rec.status in ("failed", "stopped",
                                                                       "running") else
           ". Fix: read its result with durably.get_run(run_id).result."
           if rec.status == "finished" else "."))


def _as_interrupt(ctx: Any, exc: BaseException | None) -> InterruptSignal | None:
    """The interrupt an attempt ended with: the signal itself, a group of signals (an
    asyncio.TaskGroup), or interrupts raised and then swallowed by the user's code
    (``gather(return_exceptions=True)``, a bare ``except:``) — never a silent finish. All
    interrupts raised in the attempt are reported, in the order they were raised."""
    raised = list(ctx.raised)
    if exc is not None and not isinstance(exc, InterruptSignal):
        if not isinstance(exc, BaseExceptionGroup):
            return None
        signals, rest = exc.split(InterruptSignal)
        if signals is None or (rest is not None and not all(
                is_cancelled(e) for e in _leaves(rest))):
            return None
    if not raised and isinstance(exc, InterruptSignal):
        return exc
    if not raised:
        return None
    first = list(exc.interrupts) if isinstance(exc, InterruptSignal) else []
    seen = {i.id for i in first}
    return InterruptSignal(first + [i for i in raised if i.id not in seen])


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    found: list[BaseException] = []
    for e in group.exceptions:
        found.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return found


def _settle_submitted(ctx: Any, finished: bool = False) -> None:
    """Wait for the steps the attempt submitted (``task.submit``) and did not wait for: a
    run ends when its steps have ended, and their interrupts are reported with it. A run
    whose body ``finished`` warns of submitted calls that failed while nobody asked their
    futures: the run finishes without them, and they execute again on every rerun."""
    import concurrent.futures

    pending = [f for f in list(ctx.inflight)
               if isinstance(f, concurrent.futures.Future) and not f.done()]
    if pending:
        concurrent.futures.wait(pending)
    if not finished or not ctx.unwaited:
        return
    unseen = [(task, error) for task, asked, error in ctx.unwaited if not asked[0]]
    if unseen:
        shown = "; ".join(f"{task}: {error}" for task, error in unseen[:3])
        warnings.warn(
            f"durably: run {ctx.run_id!r} finished, but {len(unseen)} call(s) it submitted "
            f"failed and nobody asked their futures ({shown}{'; ...' if len(unseen) > 3 else ''}"
            "): the run finished without their results, and they execute again on every "
            "rerun. Fix: wait for each future (future.result()), or catch its error.",
            stacklevel=4)


async def _settle(ctx: Any, exc: BaseException | None = None) -> None:
    """Before an async attempt ends: stop its other branches from starting new steps and
    wait for the steps still running, so the run is not released while its steps still
    execute. When the attempt failed (``exc``, an ``Exception``) or was cancelled
    (``durably.cancel_run``, its timeout), those steps are cancelled first, as LangGraph
    cancels a failed step's siblings (an ``asyncio.gather`` does not): what finished is
    journaled, the cancelled ones execute again when the run resumes. (An interrupt, a
    closed stream, Ctrl-C: they finish.)"""
    import asyncio  # (on a running loop: imported already; not at `import durably`)

    ctx.stop = True
    me = asyncio.current_task()
    running = {t for t in ctx.inflight if t is not me and not t.done()}
    if running and (isinstance(exc, Exception) or ctx.cancelled_by is not None):
        for t in running:
            t.cancel()
    while running:
        try:
            await asyncio.wait(running)
        except asyncio.CancelledError:
            # durably.cancel_run's (or the timeout's) cancellation of this task, delivered
            # after the run stopped at a step boundary: taken back; any other goes on
            if ctx.cancelled_by is None or me is None or me.uncancel() > 0:
                raise
        running = {t for t in running if not t.done()}


def _raise_if_cancelled(started: Any, exc: BaseException, timeout: Any) -> None:
    """After an attempt stopped by ``durably.cancel_run`` or its ``timeout`` (a
    :class:`~durably._runtime.cancel.Timeout`): raise the error that says so, and how to
    continue the run, instead of the internal stop (``StopRun``, ``CancelledError``).

    Raises:
        RunTimeoutError: its timeout stopped it.
        RunCancelledError: ``durably.cancel_run`` stopped it.
    """
    ctx, record = started.ctx, started.record
    why = ctx.cancelled_by
    if why is None or record.status != "stopped":
        return
    try:
        counts = Run(record, ctx.store).counts()
        done = counts["ran"] + counts["cached"] + counts["replayed"]
    except Exception:  # noqa: BLE001 - (the store cannot be read): said without the count
        done = -1
    finished = ("" if done < 0 else
                f" after {done:,} finished step{'' if done == 1 else 's'}, kept in its journal")
    again = (f"Fix: call it again with the same arguments to continue it (a graph: "
             f"app.invoke(None, run_id={record.run_id!r}); from a shell: durably resume "
             f"{record.run_id}): its finished steps are replayed and only the rest execute")
    if timeout is not None and why == timeout.why:
        raise RunTimeoutError(
            f"run {record.run_id!r} of {record.name!r} ran past its timeout of "
            f"{timeout.seconds:g} s and was stopped{finished} (status 'stopped'). {again}, "
            "with the whole timeout again; or raise timeout= if a run needs longer.",
            record.run_id, max(done, 0), timeout.seconds) from None
    raise RunCancelledError(
        f"run {record.run_id!r} of {record.name!r} was {why} and stopped{finished} "
        f"(status 'stopped'). {again}.", record.run_id, max(done, 0)) from None


def _paused(started: Any, signal: InterruptSignal, handle: bool) -> Any:
    """An attempt that ended at ``interrupt()``: the handle, or :class:`RunInterrupted`."""
    if handle:
        run = _handle(started, None)
        run._result = _UNSET
        run._pending = list(signal.interrupts)  # in call order (a fan-out's: input order)
        return run
    raise RunInterrupted(started.record.run_id, signal.interrupts,
                         started.record.name) from None


def _handle(started: Any, result: Any) -> Run[Any]:
    run: Run[Any] = Run(started.record, started.ctx.store, result)
    run.resumed_from = started.resumed_from
    run.wall_time = now() - started.wall
    return run
