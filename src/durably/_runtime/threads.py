"""Task calls from threads a run did not hand its context to.

A plain ``concurrent.futures.ThreadPoolExecutor`` (or ``joblib.Parallel`` with threads) in
an entrypoint runs its calls in threads whose context has no run (a pool's threads do not
inherit contextvars). Such a call joins the run as one of its steps when its place in the run
is unambiguous: exactly one attempt is active in this process, the thread was started after
that attempt began, and the steps of the run executing now (other than those of such threads)
form a single chain: the call joins under its innermost step, or at the root when none is
executing (the entrypoint's own body waits for the pool). A step's identity is its parent,
its cache key and its occurrence, so calls of several threads with different inputs get the
same step ids in every attempt; identical calls take their occurrences in racy order, but
they are interchangeable (the same task, the same inputs).

Otherwise (several attempts active, several steps executing at once in different threads, a
thread alive before the attempt began) nothing tells which step made the call: it stays
outside the run, and a warning says so once per run, with the fix.

A thread that joined keeps the run in its context between its calls (its task's body sets
its step there, as in the run's own thread); each call of it at that level decides again,
since the run may have gone on to another step, or ended.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from durably._runtime.context import (
    RUNS,
    Executing,
    RunContext,
    current_run,
    current_step,
    in_worker,
    joined_run,
    user_stacklevel,
)
from durably._store.lease import _LIVE, _pid

__all__ = ["thread_run"]

_AMBIGUOUS = "\0ambiguous"  # (never a step id: those are hex digests)


def thread_run(ctx: RunContext | None, spec: Any) -> RunContext | None:
    """The run a task call from this thread belongs to, given the run in its context
    (``current_run``). Called only when that is None while an attempt may be active in this
    process (:data:`~durably._runtime.context.RUNS`), or is a run a thread joined from outside
    (:attr:`RunContext.foreign`). Joins the run (sets the run and the parent in this
    thread's context) or warns, as the module says.

    Args:
        ctx: the run in this thread's context, if any.
        spec: the called task's Spec (its kind and name, for the warning).

    Returns:
        The run the call is a step of, or None for a call outside any run."""
    if ctx is not None:
        mark = joined_run.get()
        if mark is None or mark[0] is not ctx or current_step.get() != mark[1]:
            return ctx  # the run's own threads, durably's, or inside a joined thread's step
        # a joined thread between two calls: decided again
        current_run.set(None)
        current_step.set(None)
        joined_run.set(None)
    elif in_worker.get():
        return None  # a fan-out item's body in a worker process: outside the run by design
    runs = _active()
    if not runs:
        return None
    thread = threading.current_thread()
    if len(runs) > 1:
        why = (f"{len(runs)} runs are executing in this process, so nothing tells which one "
               "made the call")
    elif thread in runs[0].threads:
        why = ("the thread was alive before the run began, so nothing tells that the run "
               "made the call (a pool created outside the entrypoint: create it inside, and "
               "its threads join the run)")
    else:
        run = runs[0]
        parent = innermost(run)
        if parent != _AMBIGUOUS:
            run.foreign = True
            joined_run.set((run, parent))
            current_run.set(run)
            current_step.set(parent)
            return run
        why = ("several steps of the run are executing at once (a fan-out, or threads of "
               "its own), so nothing tells which one made the call")
    _warn(spec, runs, why)
    return None


def _active() -> list[RunContext]:
    """The attempts this process executes now; the others are forgotten."""
    for _ in range(100):
        try:
            refs = RUNS.copy()
            break
        except RuntimeError:  # (changed meanwhile by another thread)
            continue
    else:  # pragma: no cover - a set that never stops changing
        return []
    runs = []
    for ref in refs:
        ctx = ref()
        if ctx is not None and not ctx.ended and ctx.pid == _pid[0] and (
                ctx.owner.token in _LIVE):
            runs.append(ctx)
        else:
            RUNS.discard(ref)  # (an attempt that ended never becomes active again)
    return runs


def innermost(ctx: RunContext) -> str | None:
    """The innermost step of the run executing now, not counting those of threads that
    joined it from outside (see the module): None when none is executing (the entrypoint's
    body itself runs), ``_AMBIGUOUS`` when the executing steps are not one chain, or when an
    item of a fan-out (``task.map``, ``task.submit``) is executing: its items run at once,
    so however many execute when the call comes, any of them may have made it."""
    items = ctx.items
    assert isinstance(items, Executing)
    executing = items.copy()  # (the entries first: see Executing.enter)
    if not executing.keys() <= items.joined:
        return _AMBIGUOUS
    steps = ctx.open
    assert isinstance(steps, Executing)
    executing = steps.copy()
    joined = steps.joined.copy()
    parents = {step_id: call.parent for step_id, call in executing.items()
               if step_id not in joined}
    callers = set(parents.values())
    leaves = [step_id for step_id in parents if step_id not in callers]
    if not leaves:
        return None
    return leaves[0] if len(leaves) == 1 else _AMBIGUOUS


def _warn(spec: Any, runs: list[RunContext], why: str) -> None:
    """Say once per run that a call from a thread it does not know is outside it."""
    fresh = [ctx for ctx in runs if not ctx.warned]
    if not fresh:
        return
    for ctx in fresh:
        ctx.warned = True
    # (with the attempt: Python shows a warning once per message and place by default, and
    # each attempt's is news)
    named = ", ".join(f"{ctx.run_id!r} (attempt {ctx.attempt})" for ctx in fresh)
    short = spec.name.rsplit(".", 1)[-1]  # (as the caller's code names it, most likely)
    warnings.warn(
        f"durably: {spec.kind} {spec.name!r} was called from a thread that run {named} "
        f"does not know (a thread pool's worker?), and {why}: the call is not journaled, so "
        "a rerun executes it again (a cached task is served from the cache; a cache=False "
        "side effect happens again) and the run does not list it. Fix: fan out with "
        f"{short}.map(...) or {short}.submit(...), or pass the run's context to the "
        f"thread: executor.submit(contextvars.copy_context().run, {short}, ...).",
        stacklevel=user_stacklevel())


