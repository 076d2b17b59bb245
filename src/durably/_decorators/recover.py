"""``durably.recover()``: resume every crashed run of a store (DBOS recovers its pending
workflows at start-up).

A run is crashed when its journal says it is running and no live process holds its lease
(:attr:`Run.status <durably.Run.status>` reads the lease: a process of this machine that
died, or one of another machine that stopped renewing it for ``LEASE_SECONDS``). Runs that
wait for an answer (``interrupted``), were stopped by Ctrl-C (``stopped``) or failed are not
crashed: they are left as they are.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
from typing import Any

from durably._decorators.entrypoints import _ENTRYPOINTS, Entrypoint, _keep_option
from durably._runtime.config import StoreLike
from durably._runtime.context import live_run
from durably._runtime.run import Run, _store_of, get_run, list_runs
from durably.exceptions import NotFoundError, RunStateError
from durably.store import Store

__all__ = ["Recovered", "recover"]

log = logging.getLogger("durably")


@dataclasses.dataclass(frozen=True)
class Recovered:
    """What :func:`recover` did with one crashed run.

    Attributes:
        run_id: The run's id.
        entrypoint: Its entrypoint's identity (``module:name``).
        outcome: ``"finished"``, ``"interrupted"`` (it paused at ``interrupt()`` and waits
            for an answer), ``"failed"`` (it raised: ``error`` says what; the exception is
            journaled, as for any run) or ``"skipped"`` (not resumed: ``error`` says why —
            its entrypoint cannot be imported, its arguments were not stored, another
            process took it over meanwhile).
        run: The run's handle after the attempt (``run.summary()``, ``run.result``), or
            None when skipped.
        error: Why it failed or was skipped, else None.

    ``str()`` of it is the line ``durably recover`` prints: the run's summary, or why it
    failed or was skipped.

    Example:
        >>> import durably
        >>> print(durably.Recovered("nightly-3f2a", "jobs:nightly", "skipped",
        ...                         error="cannot import module 'jobs'"))
        run 'nightly-3f2a' (jobs:nightly) skipped: cannot import module 'jobs'
    """

    run_id: str
    entrypoint: str
    outcome: str
    run: Run[Any] | None = None
    error: str | None = None

    def __str__(self) -> str:
        """One line: the run's summary, or why it failed or was skipped."""
        if self.outcome in ("finished", "interrupted") and self.run is not None:
            return self.run.summary()
        return f"run {self.run_id!r} ({self.entrypoint}) {self.outcome}: {self.error}"


def recover(entrypoint: Any = None, *, store: StoreLike = None,
            keep_finished: bool = False) -> list[Recovered]:
    """Resume every crashed run in the store, one after the other, and say how each ended.

    A crashed run is one whose process died while executing it (:attr:`Run.status
    <durably.Run.status>` ``"crashed"``: the journal says running, and no live process
    holds its lease). Each is continued as calling its entrypoint again with its stored
    arguments would: its finished steps are replayed, the rest execute. Runs a live process
    is executing, runs waiting for an answer (``interrupted``), and stopped, failed or
    finished runs are left alone. Call it at the start of a service, after its entrypoints
    are defined, as DBOS recovers pending workflows at start-up; ``durably recover`` does
    the same from the command line.

    A run's entrypoint is the one defined in this process under the run's identity, else
    imported from its module (``module:name``); a run started as ``python job.py``
    belongs to ``__main__.job``, which only that script defines: call ``recover()`` in it,
    or start such runs with ``python -m job``. A run whose entrypoint cannot be found is
    skipped, with the reason. Each run is one attempt: an exception it raises is its
    outcome (``"failed"``), not raised here.

    Args:
        entrypoint: Only the runs of this entrypoint: the entrypoint itself, its name or
            its identity (``module:name``). Default: every crashed run in the store.
        store: The store to look in. Default: the entrypoint's store, else the configured
            store.
        keep_finished: As for :meth:`Entrypoint.run`: keep the steps the runs finished
            under older code (the task fixed after the crash).

    Returns:
        One :class:`Recovered` per crashed run, oldest first (empty when there is none).

    Raises:
        RunStateError: called inside a run.
        DefinitionError: ``keep_finished`` is not True or False.
        KeyboardInterrupt: Ctrl-C while a run executes (that run is stopped, resumable;
            the rest are not started).

    Example:
        >>> import durably, tempfile
        >>> store = durably.DiskStore(tempfile.mkdtemp())
        >>> @durably.entrypoint(store=store)
        ... def nightly(n):
        ...     return n * 2
        >>> durably.recover(nightly)   # nothing crashed
        []
    """
    if live_run() is not None:
        raise RunStateError(
            "durably.recover() was called inside a run; it resumes runs of its own. Fix: "
            "call it at the start of your program, outside any entrypoint.")
    keep_finished = _keep_option(keep_finished)
    if store is None:
        spec = getattr(entrypoint, "_self_spec", None)
        store = spec.store if spec is not None and spec.store is not None else None
    st = _store_of(store)
    crashed = sorted((r for r in list_runs(entrypoint, store=st) if r.status == "crashed"),
                     key=lambda r: (r.created, r.id))
    done = []
    for run in crashed:
        ep: Any = entrypoint if isinstance(entrypoint, Entrypoint) else None
        ep, why = (ep, None) if ep is not None else _entrypoint_of(run.entrypoint)
        outcome = (_resume(ep, run, st, keep_finished) if ep is not None else
                   Recovered(run.id, run.entrypoint, "skipped", None, why))
        log.info("durably: recover: %s", outcome)
        done.append(outcome)
    return done


def _entrypoint_of(identity: str) -> tuple[Entrypoint[Any, Any] | None, str | None]:
    """The entrypoint with this identity, defined in this process or imported from its
    module; else None and why."""
    ep = _ENTRYPOINTS.get(identity)
    if ep is not None:
        return ep, None
    module = identity.rpartition(":")[0]
    if module.startswith("__main__"):
        script = module.partition(".")[2] or "script"
        return None, (f"its entrypoint {identity!r} was defined by a script run as `python "
                      f"{script}.py`, which cannot be imported. Fix: the command `durably "
                      f"recover` loads the script the run recorded; or call durably.recover() "
                      f"in that script.")
    try:
        importlib.import_module(module)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module: said, skipped
        return None, (f"cannot import module {module!r} of its entrypoint: {exc!r}. Fix: run "
                      "from the directory that holds it (or put it on PYTHONPATH), or "
                      "install its package.")
    ep = _ENTRYPOINTS.get(identity)
    if ep is None:
        return None, (f"module {module!r} defines no entrypoint {identity!r} (renamed or "
                      "removed?). Fix: restore it, or delete the run (durably delete).")
    return ep, None


def _resume(ep: Entrypoint[Any, Any], run: Run[Any], store: Store,
            keep_finished: bool) -> Recovered:
    """Continue one crashed run with its stored arguments (one attempt)."""
    identity = run.entrypoint
    try:
        _, _, args, kwargs = ep._self_stored_call(run.id, "recover", store)
    except (RunStateError, NotFoundError) as exc:  # (its arguments were not stored; deleted)
        return Recovered(run.id, identity, "skipped", None, str(exc))
    if ep.spec.is_async and _loop_running():
        return Recovered(run.id, identity, "skipped", None, (
            "its entrypoint is async, and recover() was called inside a running event loop, "
            "which cannot run it to its end. Fix: call durably.recover() before the loop "
            f"starts, or await {ep.spec.name}.run(..., run_id={run.id!r}) in it."))
    runner = ep._self_arun if ep.spec.is_async else ep._self_srun
    try:
        handle: Any = runner(ep.__wrapped__, None, args, kwargs, run.id, False, True,
                        store=store, keep_finished=keep_finished)
        if inspect.iscoroutine(handle):
            import asyncio

            handle = asyncio.run(handle)  # (no loop is running here: see above)
    except RunStateError as exc:
        if store.run_holder(run.id) is not None:  # another process took it over meanwhile
            return Recovered(run.id, identity, "skipped", None, str(exc))
        return Recovered(run.id, identity, "failed", _read(run.id, store), repr(exc))
    except Exception as exc:  # noqa: BLE001 - the run's failure is its outcome (journaled)
        return Recovered(run.id, identity, "failed", _read(run.id, store), repr(exc))
    return Recovered(run.id, identity, handle.status, handle, None)


def _loop_running() -> bool:
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _read(run_id: str, store: Store) -> Run[Any] | None:
    try:
        return get_run(run_id, store=store)
    except Exception:  # noqa: BLE001 - a report never fails
        return None
