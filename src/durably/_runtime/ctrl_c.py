"""What a person sees when Ctrl-C stops a run that a script started: two lines saying how
many steps the run finished and that the same command continues it, instead of a traceback
through durably's machinery.

Python prints an uncaught exception with :data:`sys.excepthook`, then a process ended by an
unhandled ``KeyboardInterrupt`` kills itself with ``SIGINT`` (the shell's exit status 130).
When a run ends stopped by Ctrl-C in the main thread, :func:`note_stopped` marks the
exception with those two lines and, if the process still has Python's own hook (no handler
of the user's, not IPython's, not an interactive session), installs :func:`_excepthook`.
That hook prints the two lines for a ``KeyboardInterrupt`` carrying the mark (or raised while
one was handled: ``asyncio.run`` raises a new one after the run's task was cancelled) and
hands everything else to Python's hook, unchanged. Nothing else changes: the exception is
the plain ``KeyboardInterrupt`` (``except KeyboardInterrupt:`` catches it, a notebook shows
it as ever, a Ctrl-C outside any run prints its traceback), and the process still ends by
``SIGINT``.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import threading
from types import TracebackType

from durably._store.records import RunRecord
from durably.store import Store

__all__ = ["note_stopped", "note_stopped_again", "stopped_message"]

_MARK = "_durably_ctrl_c"  # the attribute of the marked exception: its two lines


def note_stopped(exc: BaseException, record: RunRecord, store: Store) -> None:
    """Mark ``exc`` (the ``KeyboardInterrupt`` or cancellation that stopped the run of
    ``record``) with what to tell the person who pressed Ctrl-C, and install the hook that
    says it if the exception reaches the top of the script. Only in the main thread; never
    raises."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        setattr(exc, _MARK, stopped_message(record, store))
    except Exception:  # noqa: BLE001 - a message never replaces the stop
        return
    interactive = hasattr(sys, "ps1") or sys.flags.interactive
    if sys.excepthook is sys.__excepthook__ and not interactive:
        sys.excepthook = _excepthook


def stopped_message(record: RunRecord, store: Store) -> str:
    """The two lines: the run, how many steps it finished (ran, cached or replayed: kept in
    its journal), and the command that continues it (this process's own command line)."""
    from durably._runtime.run import Run

    try:
        c = Run(record, store).counts()
    except Exception:  # noqa: BLE001 - (the store does not answer: said without the count)
        finished = "; its finished steps are kept in its journal"
    else:
        done = c["ran"] + c["cached"] + c["replayed"]
        finished = (f" after {done:,} finished step{'' if done == 1 else 's'} (kept in its "
                    "journal)")
    return (f"durably: Ctrl-C stopped run {record.run_id!r}{finished}.\n"
            f"Run the same command again to continue it: {_command()}\n")


def _command() -> str:
    return shlex.join(sys.orig_argv) if sys.orig_argv else "the same command"


def note_stopped_again(exc: BaseException, record: RunRecord, journaled: bool) -> None:
    """Mark ``exc``, a second ``KeyboardInterrupt`` that landed while the run the first one
    stopped was ending (``journaled``: once its end was journaled), with one short message
    (as :func:`note_stopped` does: shown instead of the two tracebacks); never raises,
    reads nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    from durably._store.lease import LEASE_SECONDS

    with contextlib.suppress(Exception):
        setattr(exc, _MARK, (
            f"durably: Ctrl-C again: run {record.run_id!r} is stopped (its finished steps "
            "are kept in its journal).\n"
            f"Run the same command again to continue it: {_command()}\n") if journaled else (
            f"durably: Ctrl-C again: run {record.run_id!r} stopped before its end was "
            "journaled (its finished steps are kept in its journal).\n"
            "Run the same command again to continue it once its lease expires (within "
            f"{LEASE_SECONDS:.0f} s): {_command()}\n"))
        exc.__suppress_context__ = True
        interactive = hasattr(sys, "ps1") or sys.flags.interactive
        if sys.excepthook is sys.__excepthook__ and not interactive:
            sys.excepthook = _excepthook


def _marked(exc: BaseException | None) -> str | None:
    """The two lines of a marked exception: ``exc`` itself, or one it was raised while
    handling (``__context__``: ``asyncio.run`` raises a new ``KeyboardInterrupt`` once the
    run's cancelled task has ended)."""
    seen = 0
    while exc is not None and seen < 8:
        text = getattr(exc, _MARK, None)
        if isinstance(text, str):
            return text
        exc, seen = exc.__context__, seen + 1
    return None


def _excepthook(kind: type[BaseException], value: BaseException,
                tb: TracebackType | None) -> None:
    """:data:`sys.excepthook` while a run was stopped by Ctrl-C: the two lines for its
    ``KeyboardInterrupt``, Python's own output for anything else."""
    text = _marked(value) if issubclass(kind, KeyboardInterrupt) else None
    if text is None:
        sys.__excepthook__(kind, value, tb)
        return
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - (stderr closed): Python's own output then
        sys.__excepthook__(kind, value, tb)
